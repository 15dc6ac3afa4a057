"""PathIndex packs rows, slots, bases and ragged paths into one int64 tensor, padded with each path's last node."""

from specpilot.ops.path_index import NODES, PathIndex


def test_path_index_pads_ragged_paths():
    index = PathIndex.build([2, 0, 1], [7, 3, 5], [[0, 2, 4], [], [0]], "cpu", bases=[10, 20, 30])
    assert index.packed.tolist() == [[2, 7, 10, 3, 0, 2, 4], [0, 3, 20, 0, 0, 0, 0], [1, 5, 30, 1, 0, 0, 0]]
    assert index.nodes.shape == (3, index.packed.shape[1] - NODES) and index.lens.tolist() == [3, 0, 1]
    assert index.bases.tolist() == [10, 20, 30] and index.slots.tolist() == [7, 3, 5]


def test_path_index_without_bases_and_requests():
    assert PathIndex.build([0], [4], [[0, 1]], "cpu").bases.tolist() == [0]
    assert PathIndex.build([], [], [], "cpu").packed.shape == (0, NODES + 1)
