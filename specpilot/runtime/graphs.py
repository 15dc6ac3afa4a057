"""CUDA graphs of the two hot steps, each captured once per shape and replayed.

DecodeGraph: the AR decode step of a fixed batch. It reads static device buffers (token ids, positions, slots)
and writes static logits; positions advance inside the graph, so a replay needs no host-to-device copy and the
step has no host sync.
VerifyGraph: the verify forward of a fixed (batch, tree width, chain or tree) shape. Its static metadata views one
packed int64 buffer (BatchMetadata.unpack), so the step's packed metadata refreshes every input in one copy:
straight from the host buffer it was filled in (load), or from a device copy (replay of other metadata); a
replay returns static greedy tokens (and captured features). It needs the tree-attention op, whose grid and reads
do not depend on the committed lengths. Its forward may be captured as a GraphChain cut between decoder layers
(EngineConfig.verify_layers_per_graph): the verify step ends in a host sync, so nothing queued hides the next
launch, and with the graph cut the GPU starts on the first layers while the host launches the rest (figures:
docs/decisions/2026-12-01-engine-config-defaults.md).
"""

from __future__ import annotations

import contextlib

import torch

from specpilot.layers.metadata import BatchMetadata, HostMetadata
from specpilot.layers.paths import PLAIN, KernelPaths


class DecodeGraph:
    def __init__(self, model, cache, batch_size: int, paths: KernelPaths, warmup: int = 3):
        device = cache.k.device
        self.input_ids = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.slots = torch.arange(batch_size, dtype=torch.long, device=device)
        self.model, self.cache, self.paths = model, cache, paths
        # warm-up and capture write K/V at the last cache position, which no request reads before writing it
        last = cache.max_seq_len - 1
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.positions.fill_(last)
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.positions.fill_(last)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        # warm-up also ran the recurrent update on the slots' state: the caller snapshots and restores it

    def _step(self) -> torch.Tensor:
        meta = decode_metadata(self.input_ids, self.positions, self.slots, self.paths)
        logits = self.model.logits(self.model(meta, self.cache), self.paths)[:, 0].float()
        self.positions.add_(1)
        return logits

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Copies inputs only if they are not already the static buffers; returns the static logits [B, vocab]."""
        if input_ids.data_ptr() != self.input_ids.data_ptr():
            self.input_ids.copy_(input_ids)
        if positions.data_ptr() != self.positions.data_ptr():
            self.positions.copy_(positions)
        self.graph.replay()
        return self.logits


def decode_metadata(input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                    paths: KernelPaths = PLAIN) -> BatchMetadata:
    """One causal token per request at its current length (no prefix gather needed: the decode kernel reads the
    cache)."""
    pos = positions[:, None]
    return BatchMetadata(input_ids[:, None], pos, pos, slots, positions, max_prefix_len=0, kv_len=positions + 1,
                         paths=paths)


class VerifyGraph:
    def __init__(self, run, meta: BatchMetadata, cache, warmup: int = 2, model=None, layers_per_graph: int = 0):
        """run(meta) -> (greedy tokens [B, T], features [B, T, F] or None), traced on static copies of meta; with
        `model` and layers_per_graph > 0, captured as a chain of graphs cut after model layer 0 and then every
        layers_per_graph layers. The graph holds the kernels of meta.paths."""
        self.packed = _packed(meta).clone()
        B, T = meta.input_ids.shape
        self.meta = BatchMetadata.unpack(self.packed, B, T, meta.block_mask is not None, cache.max_seq_len,
                                         meta.paths)
        self.cache = cache
        cuts = layer_cuts(model.config.num_hidden_layers, layers_per_graph) if model is not None else ()
        self.graph, (self.tokens, self.features) = capture(run, self.meta, warmup=warmup, model=model, cuts=cuts)
        # the tree pass stashes its fold terms by assignment, which a replay does not redo: keep this graph's
        self.stash = dict(cache.tree_stash)

    def load(self, host: HostMetadata) -> BatchMetadata:
        """Copies the step's host-packed metadata into the static inputs (one non-blocking copy, no unpack);
        returns them, for replay."""
        self.packed.copy_(host.packed, non_blocking=True)
        return self.meta

    def replay(self, meta: BatchMetadata):
        """Runs the graph on `meta` (copied into the static inputs unless it is them, as load returns)."""
        if meta is not self.meta:
            self.packed.copy_(_packed(meta))
        self.graph.replay()
        self.cache.tree_stash.clear()
        self.cache.tree_stash.update(self.stash)
        return self.tokens, self.features


class GraphChain:
    """CUDA graphs captured one after another from one call, sharing one memory pool; replay launches them in
    capture order (the order their shared pool's reuse assumes)."""

    def __init__(self, graphs: list):
        self.graphs = graphs

    def replay(self) -> None:
        for g in self.graphs:
            g.replay()


def layer_cuts(num_layers: int, layers_per_graph: int) -> tuple[int, ...]:
    """Layers after which a capture starts a new graph: layer 0 (a first graph the host launches in a few
    microseconds), then every layers_per_graph layers; none after the last layer, none if layers_per_graph <= 0."""
    if layers_per_graph <= 0:
        return ()
    return tuple(i for i in range(num_layers - 1) if i % layers_per_graph == 0)


def capture(run, *args, warmup: int = 2, model=None, cuts: tuple[int, ...] = ()):
    """Runs run(*args) `warmup` times on a side stream (compiles and autotuning must not happen inside a
    capture), then captures one call: (GraphChain, that call's outputs, which every replay rewrites in place).
    With `model` and `cuts`, the capture starts a new graph after each of those decoder layers."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            run(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs = [torch.cuda.CUDAGraph()]

    def cut(layer: int) -> None:
        if layer in cuts:
            graphs[-1].capture_end()
            graphs.append(torch.cuda.CUDAGraph())
            graphs[-1].capture_begin(pool=pool)

    with torch.cuda.stream(stream):
        graphs[0].capture_begin(pool=pool)
        if model is not None:
            model.after_layer = cut
        try:
            out = run(*args)
        except BaseException:
            with contextlib.suppress(Exception):  # the capture is broken anyway: keep the original error
                graphs[-1].capture_end()
            raise
        finally:
            if model is not None:
                model.after_layer = None
        graphs[-1].capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return GraphChain(graphs), out


def _packed(meta: BatchMetadata) -> torch.Tensor:
    """The step's index fields as one buffer: tree_metadata hands it over; other metadata is packed here."""
    return meta.packed if meta.packed is not None else meta.pack()
