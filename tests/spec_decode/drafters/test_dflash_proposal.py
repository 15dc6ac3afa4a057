"""The DFlash proposal as a step runs it (context extension inside the forward, packed new rows, captured
graphs, the tree-attention op, the model-dtype argmax) equals the plain reference token for token: eager
extension, SDPA with a host bound, fp32 logits. Odd shapes (head dim 24, 6 query heads on 2 KV heads, block 5),
batches of 1, 3 and 8 in scrambled slots, ragged contexts, chains and trees, several steps of ragged commits."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import specpilot.ops.tree_attention as tree_attention_op
import specpilot.ops.tree_attention.triton as tree_triton
from specpilot.models.loader import load_model
from specpilot.spec_decode.drafters import dflash
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow
from tests.cuda_graph_fakes import fake_cuda_graphs
from tests.spec_decode.test_dflash_batched import ReplayedProposalGraph

H, I, NH, NKV, HD, LAYERS, BLOCK, VOCAB, MASK = 64, 80, 6, 2, 24, 2, 5, 320, 311
TAPS = [0, 2]
F = len(TAPS) * H  # context feature width
SLOTS = [5, 0, 7, 2, 1, 6, 3, 4]  # a batch of n takes the first n: rows index slots out of order
CONTEXTS = [13, 1, 9, 4, 22, 7, 3, 16]  # ragged, some shorter than a block


def write_odd_dflash(path, seed: int = 7):
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    t = {"fc.weight": w(H, F), "hidden_norm.weight": 1 + w(H, scale=0.2), "norm.weight": 1 + w(H, scale=0.2)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + w(H, scale=0.2),
              p + "post_attention_layernorm.weight": 1 + w(H, scale=0.2),
              p + "self_attn.q_proj.weight": w(NH * HD, H), p + "self_attn.k_proj.weight": w(NKV * HD, H),
              p + "self_attn.v_proj.weight": w(NKV * HD, H), p + "self_attn.o_proj.weight": w(H, NH * HD),
              p + "self_attn.q_norm.weight": 1 + w(HD, scale=0.2), p + "self_attn.k_norm.weight": 1 + w(HD, scale=0.2),
              p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H), p + "mlp.down_proj.weight": w(H, I)}
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 512, "block_size": BLOCK, "num_target_layers": 3,
           "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS}}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from tests.checkpoints import write_checkpoint

    path = tmp_path_factory.mktemp("qwen3")
    write_checkpoint("qwen3", path)
    return path


def _pair(qwen3, tmp_path, n: int, dtype: str = "float32"):
    """Two drafters of one checkpoint holding the same n requests (ragged contexts): the plain reference and the
    one under test."""
    target = load_model(str(qwen3), "cpu", dtype)
    path = write_odd_dflash(tmp_path / "d")
    pair = [load_dflash(path, target) for _ in range(2)]
    gen = torch.Generator().manual_seed(n)
    for d in pair:
        d.allocate(8, 64)
    for slot, length in zip(SLOTS[:n], CONTEXTS[:n]):
        features = torch.randn(length, F, generator=gen).to(target.lm_head.weight.dtype)
        for d in pair:
            d.start(slot, [0] * length, features)
    return pair


def reference_proposal(drafter, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
    """The plain proposal: eager context extension, the eager block (SDPA, host bound), fp32 logits, then the
    argmax (chain) or the top-k of the log-softmax per depth grown into the spec's tree."""
    logits = drafter.block_logits(slots, roots)  # [n, B-1, vocab] fp32
    capped = spec.capped(drafter.max_depth)
    logits = logits[:, :capped.depth]
    if spec.kind == "chain":
        return [DraftTree.chain([root] + row) for root, row in zip(roots, logits.argmax(-1).tolist())]
    width = min(max(max(spec.branching, default=1), spec.top_k), logits.shape[-1])
    top = torch.log_softmax(logits, dim=-1).topk(width, dim=-1)
    return [grow(capped, root, lambda tree, frontier, t=t, lp=lp: [(t[tree.depths[f]], lp[tree.depths[f]])
                                                                    for f in frontier])
            for root, t, lp in zip(roots, top.indices.tolist(), top.values.tolist())]


def _steps(pair, n: int, spec: TreeSpec, steps: int = 3) -> None:
    """Proposes with both, then commits the same ragged accepted rows (1..B) to both, `steps` times."""
    ref, new = pair
    slots, gen = SLOTS[:n], torch.Generator().manual_seed(100 + n)
    for step in range(steps):
        roots = torch.randint(0, VOCAB, (n,), generator=gen).tolist()
        expected = reference_proposal(ref, slots, roots, spec)
        assert new.propose(slots, roots, spec) == expected, f"step {step}"
        for slot in slots:
            k = int(torch.randint(1, BLOCK + 1, (1,), generator=gen))
            rows = torch.randn(k, F, generator=gen).to(new.model.fc.weight.dtype)
            for d in pair:
                d.commit(slot, [1] * (k - 1), rows)


SPECS = ["chain:4", "static:2,2,1", "dynamic:3,4,8"]


@pytest.fixture
def replayed_graphs(monkeypatch):
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(dflash, "ProposalGraph", ReplayedProposalGraph)


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("tree", SPECS)
def test_eager_proposal_equals_the_reference(n, tree, qwen3, tmp_path):
    _steps(_pair(qwen3, tmp_path, n), n, TreeSpec.parse(tree))


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("tree", SPECS)
def test_replayed_proposal_equals_the_reference(n, tree, qwen3, tmp_path, replayed_graphs):
    """Fixed shapes as on a GPU: one graph per (batch, depth, width) captured with the whole cache as the SDPA
    bound, replayed from its static inputs and packed features buffer."""
    pair = _pair(qwen3, tmp_path, n)
    pair[1].use_graphs = True
    _steps(pair, n, TreeSpec.parse(tree))
    assert pair[1].graphs and all(isinstance(g, ReplayedProposalGraph) for g in pair[1].graphs.values())


@pytest.mark.parametrize("n, tree", [(8, "chain:4"), (3, "dynamic:3,4,8")])  # the interpreter is slow
def test_replayed_tree_attention_op_equals_the_reference(n, tree, qwen3, tmp_path, replayed_graphs, monkeypatch):
    """The GPU's draft paths: the tree-attention op (the interpreted Triton kernel on CPU tensors) reads each
    request's context by its device length inside the replayed graph."""
    monkeypatch.setattr(tree_attention_op, "use_triton", lambda x: True)
    calls = []
    kernel = tree_triton.tree_attention  # 16-row query tiles: the same kernel, a quarter of the interpreter's work
    monkeypatch.setattr(tree_triton, "tree_attention", lambda *a: calls.append(1) or kernel(*a, block_m=16))
    pair = _pair(qwen3, tmp_path, n)
    pair[1].use_graphs = True
    pair[1].paths = dataclasses.replace(pair[1].paths, block_kernel=True)
    _steps(pair, n, TreeSpec.parse(tree), steps=2)
    assert calls, "the proposal took the tree-attention op"


class _Outputs(TorchDispatchMode):
    """Records (op, dtype, shape) of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen += [(func, t.dtype, tuple(t.shape)) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_a_chain_makes_no_fp32_copy_of_the_logits(qwen3, tmp_path):
    """bf16 drafter: the chain's argmax reads the LM head's bf16 output; nothing of the vocabulary's width is
    made in fp32 (it was a [n, depth, vocab] fp32 copy, 4 bytes per logit written and read again)."""
    ref, new = _pair(qwen3, tmp_path, 3, "bfloat16")
    spec = TreeSpec.parse("chain:4")
    new.propose(SLOTS[:3], [1, 2, 3], spec)  # flushes the prompts
    expected = reference_proposal(ref, SLOTS[:3], [4, 5, 6], spec)
    with _Outputs() as outputs:
        assert new.propose(SLOTS[:3], [4, 5, 6], spec) == expected
    wide = [(f, s) for f, dtype, s in outputs.seen if dtype == torch.float32 and s and s[-1] == VOCAB]
    assert not wide, f"fp32 tensors of vocabulary width: {wide}"


def test_new_context_rows_take_one_copy_per_step(qwen3, tmp_path, monkeypatch):
    """Eight requests' accepted rows go into the replayed graph's features buffer by one copy, not one per
    request (each a launch on the host's path between the verify's sync and the proposal)."""
    fake_cuda_graphs(monkeypatch)  # replays run nothing: what is left is the host's work
    _, new = _pair(qwen3, tmp_path, 8)
    new.use_graphs = True
    spec = TreeSpec.parse("chain:4")
    new.propose(SLOTS, list(range(8)), spec)  # flush and capture
    for slot, k in zip(SLOTS, (1, 5, 3, 2, 4, 5, 1, 3)):
        new.commit(slot, [1] * (k - 1), torch.randn(k, F))
    with _Outputs() as outputs:
        new.propose(SLOTS, list(range(8)), spec)
    copies = [f for f, _, s in outputs.seen if s and s[-1] == F and f.__name__.split(".")[0] in ("copy_", "cat")]
    assert len(copies) == 1, copies


def test_the_chain_argmax_is_the_argmax_of_the_fp32_widening(qwen3, tmp_path):
    """Ties (first maximum wins), NaN (it wins), signed zeros, all in bf16."""
    _, drafter = _pair(qwen3, tmp_path, 1, "bfloat16")
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 4, (5, 4, 37), generator=gen).to(torch.bfloat16) / 4  # many exact ties
    logits[0, 0, 11] = math.nan
    logits[1, 2] = -0.0
    logits[1, 2, 20] = 0.0
    assert drafter._pick(logits, 0).equal(logits.float().argmax(-1))
