"""KernelPaths on the step's metadata choose each layer's kernel: a forward with every path on (on CPU tensors each
op runs its reference) takes the chosen ops and gives the tokens of the plain forward (PLAIN)."""

import pytest
import torch

import specpilot.layers.attention as attention
import specpilot.layers.gated_deltanet as gated_deltanet
import specpilot.layers.linear as linear
from specpilot.layers.metadata import BatchMetadata
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.models.loader import load_model
from specpilot.ops import pdl
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.graphs import decode_metadata

ALL = KernelPaths(gemv=True, gated_down=True, fused_qk_rope_store=True, block_kernel=True, decode_splits=2, pdl=True,
                  compiled=True, gdn_prefill_kernel=True)


def greedy(model, paths: KernelPaths, prompt: list[int], steps: int):
    """A prefill of the prompt, then `steps` greedy decode steps, then the last two tokens again as a causal block
    -> (tokens, logits [steps + 2, vocab])."""
    cache = ModelCache(model.config, 1, 64, torch.device("cpu"), torch.float32)
    slot, rows = torch.tensor([0]), []
    with torch.inference_mode():
        meta = BatchMetadata.contiguous(torch.tensor([prompt]), torch.tensor([0]), slot, 0, paths)
        rows.append(model.logits(model(meta, cache), paths)[0, -1])
        tokens, pos = [int(rows[-1].argmax())], len(prompt)
        for _ in range(steps):
            meta = decode_metadata(torch.tensor(tokens[-1:]), torch.tensor([pos]), slot, paths)
            rows.append(model.logits(model(meta, cache), paths)[0, 0])
            tokens.append(int(rows[-1].argmax()))
            pos += 1
        block = torch.tensor([tokens[-2:]])
        meta = BatchMetadata.contiguous(block, torch.tensor([pos - 1]), slot, pos - 1, paths)
        rows.append(model.logits(model(meta, cache), paths)[0, -1])
    return tokens, torch.stack(rows)


def _count(monkeypatch, module, name: str, seen: list, key=lambda a, k: 1):
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: seen.append(key(a, k)) or real(*a, **k))


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_every_path_on_gives_the_plain_tokens_through_the_chosen_ops(name, checkpoint_factory, monkeypatch):
    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", "float32")
    prompt = torch.randint(0, 300, (21,)).tolist()  # past 16 tokens: the GDN layers' chunked form
    want, want_logits = greedy(model, PLAIN, prompt, 5)
    gemv, gated, fused, tree, chunk, pdl_asked = [], [], [], [], [], []
    _count(monkeypatch, linear, "gemv", gemv, lambda a, k: k["pdl"])
    _count(monkeypatch, linear, "gated_gemv", gated)
    _count(monkeypatch, attention, "qk_norm_rope_store", fused)
    _count(monkeypatch, attention, "tree_attention", tree)
    _count(monkeypatch, gated_deltanet, "chunk_gated_delta_rule", chunk, lambda a, k: k["kernel"])
    _count(monkeypatch, pdl, "usable", pdl_asked, lambda a, k: a[1])
    got, got_logits = greedy(model, ALL, prompt, 5)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    assert gemv and all(gemv) and gated and fused and tree and pdl_asked and all(pdl_asked)
    assert chunk == [True] * model.config.num_linear_layers


def test_linear_takes_a_non_contiguous_block_as_one_matrix(monkeypatch):
    """A slice of a block's rows ([B, T, K], not contiguous) reaches F.linear as one 2-D matrix: a 3-D input goes
    to a batched matmul that reads the whole weight once per B."""
    import torch.nn.functional as F

    from specpilot.layers import linear

    layer = linear.Linear(24, 40, bias=False)
    torch.nn.init.normal_(layer.weight)
    seen = []
    real = F.linear
    monkeypatch.setattr(linear.F, "linear", lambda x, w, b=None: seen.append(x.dim()) or real(x, w, b))
    block = torch.randn(3, 9, 24)[:, 1:8]
    out = layer(block)
    assert seen == [2] and out.shape == (3, 7, 40)
    torch.testing.assert_close(out, block @ layer.weight.T)
