"""The Triton kernels against their torch references on the device, on small problems at the real head sizes of
Qwen3-8B and Qwen3.5-27B: the fused decode prologue (qk_norm_rope_store), tree attention, the GDN tree kernel and
conv, the prefill's GDN chunk kernel, the tree commit, the W12N, FP8-view and bf16 GEMVs, decode attention and the
decode RMSNorm. tests/gpu/test_kernels.py runs each as a test; `checks(device)` lists them, `status(result)` judges
one (ok, or mismatch: NaN, an error above its tolerance, or a bitwise property that does not hold).

Every check takes the device first: checks("cpu") lists tiny problems that run under TRITON_INTERPRET=1. The
specpilot imports sit inside the checks: importing a kernel module decorates its kernels, and tests/gpu/conftest.py
must see none decorated before it picks compiled kernels (TRITON_INTERPRET=0).
"""

from __future__ import annotations

import random

from bench.common import rel_err


def _parents(n: int, kind: str, rng: random.Random) -> list[int]:
    if kind in ("chain", "causal"):
        return [-1] + list(range(n - 1))
    return [-1] + [rng.randrange(max(0, i - 6), i) for i in range(1, n)]


def check_tree_attention(dev, dtype, B, H, KVH, D, prefixes, lens, kind):
    """Triton tree attention (default, shape-derived config) vs tree_attention_ref; K/V past each request's
    prefix and block (and the unused slot) hold NaN: a read of them shows as NaN."""
    import torch

    from specpilot.ops.tree_attention.reference import tree_attention_ref
    from specpilot.ops.tree_attention.triton import tree_attention

    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    T = max(lens)
    S, N = max(prefixes) + T + 16, B + 1
    q = torch.randn(B, T, H, D, generator=gen)
    k_cache, v_cache = torch.randn(N, KVH, S, D, generator=gen), torch.randn(N, KVH, S, D, generator=gen)
    slots = torch.randperm(N, generator=gen)[:B]
    prefix_len = torch.tensor(prefixes)
    cache_loc = prefix_len[:, None] + torch.arange(T)[None, :]
    live = torch.zeros(N, S, dtype=torch.bool)
    masks = []
    for b, n in enumerate(lens):
        live[slots[b], :prefixes[b] + T] = True
        par = _parents(n, kind, rng)
        m = torch.eye(T, dtype=torch.bool)
        for i in range(1, n):
            m[i] |= m[par[i]]
        masks.append(m)
    for cache in (k_cache, v_cache):
        cache.masked_fill_(~live[:, None, :, None], float("nan"))
    block_mask = None if kind == "causal" else torch.stack(masks).to(dev)
    args = [t.to(dev) for t in (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), slots, prefix_len, cache_loc)]
    ref = tree_attention_ref(*args, block_mask, D**-0.5)
    out = tree_attention(*args, block_mask, D**-0.5)
    return {**rel_err(out, ref), "tol": 1e-2 if dtype != torch.float32 else 1e-4}


def check_gdn_tree(dev, dtype, B, T, H, HV, K, V):
    """Triton tree delta rule vs the torch tree form (chunk.py, itself tested against the per-path recurrence),
    the latter in fp32 on the same rounded inputs: the output and the fold stash (k, u, G)."""
    import torch

    from specpilot.ops.gated_delta_rule import gdn_gating
    from specpilot.ops.gdn_tree import ancestor_mask, chunk
    from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule

    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g, beta = gdn_gating(torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen),
                         torch.rand(HV, generator=gen).log(), torch.randn(HV, generator=gen))
    S0 = torch.randn(B, HV, K, V, generator=gen) * 0.3
    parents = torch.tensor([_parents(T, "tree", rng) for _ in range(B)])
    q, k, v = (t.to(dtype).to(dev) for t in (q, k, v))
    g, beta, S0, mask = g.to(dev), beta.to(dev), S0.to(dev), ancestor_mask(parents.to(dev))
    out, stash = tree_gated_delta_rule(q, k, v, g, beta, mask, S0)
    ref, ref_stash = chunk.tree_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, mask, S0)
    res = {"o": rel_err(out, ref)}
    for name, a, b in zip(("k", "u", "G"), stash, ref_stash):
        res[name] = rel_err(a, b)
    worst = max(r["rel_rms_err"] for r in res.values())
    return {**res, "rel_rms_err": worst, "nan": sum(r["nan"] for r in res.values()),
            "tol": 1e-2 if dtype != torch.float32 else 1e-3}


def check_gdn_chunk(dev, dtype, B, T, H, HV, K, V):
    """The prefill's Triton chunk kernel (EngineConfig.ablations.triton_gdn_prefill) vs the torch chunk form in fp32
    on the same rounded inputs: the output and the final state."""
    import torch

    from specpilot.ops.gated_delta_rule import chunk_gated_delta_rule, gdn_gating
    from specpilot.ops.gated_delta_rule.triton import chunk_gated_delta_rule as kernel

    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g, beta = gdn_gating(torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen),
                         torch.rand(HV, generator=gen).log(), torch.randn(HV, generator=gen))
    S0 = torch.randn(B, HV, K, V, generator=gen) * 0.3
    q, k, v = (t.to(dtype).to(dev) for t in (q, k, v))
    g, beta, S0 = g.to(dev), beta.to(dev), S0.to(dev)
    out, final = kernel(q, k, v, g, beta, initial_state=S0)
    ref, ref_final = chunk_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, initial_state=S0)
    res = {"o": rel_err(out, ref), "state": rel_err(final, ref_final)}
    return {**res, "rel_rms_err": max(r["rel_rms_err"] for r in res.values()),
            "nan": sum(r["nan"] for r in res.values()), "tol": 1e-2 if dtype != torch.float32 else 1e-3}


def check_tree_conv(dev, dtype, B, T, C, W):
    """The Triton tree conv (parent-pointer walk into the committed window) vs the per-path reference, in fp32
    on the same rounded inputs."""
    import torch

    from specpilot.ops.gdn_tree import tree_causal_conv1d_ref
    from specpilot.ops.gdn_tree.triton import tree_causal_conv1d

    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    x, state = torch.randn(B, T, C, generator=gen), torch.randn(B, C, W - 1, generator=gen)
    weight = torch.randn(C, W, generator=gen) * 0.5
    parents = torch.tensor([_parents(T, "tree", rng) for _ in range(B)])
    x, state, weight = (t.to(dtype) for t in (x, state, weight))
    ref = tree_causal_conv1d_ref(x.float(), parents, state.float(), weight.float())
    x_out = torch.empty(B, T, C, dtype=dtype, device=dev)
    out = tree_causal_conv1d(x.to(dev), parents.to(dev), state.to(dev), weight.to(dev), x_out)
    copied = bool(torch.equal(x_out.cpu(), x))
    # status(): batch_invariant False marks a mismatch (here: the stash copy)
    return {**rel_err(out.float().cpu(), ref), "tol": 1e-2 if dtype != torch.float32 else 1e-5,
            "x_out_equal": copied, "batch_invariant": copied}


def check_commit(dev, L_attn, L_lin, KVH, D, H, HV, K, C, B, T):
    """A tree commit's two kernels vs their references on the same kept paths (ragged, one empty, one in place):
    the K/V compaction (bitwise) and the recurrent fold + conv windows (fp32 state)."""
    import torch

    from specpilot.ops.gdn_tree import commit_paths_ref
    from specpilot.ops.gdn_tree.triton import commit_paths
    from specpilot.ops.keep_kv import keep_kv_ref
    from specpilot.ops.keep_kv.triton import keep_kv
    from specpilot.ops.path_index import PathIndex

    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    paths = []
    for b in range(B):
        parents = _parents(T, "tree", rng)
        node, path = rng.randrange(T), []
        while node >= 0:
            path.append(node)
            node = parents[node]
        paths.append([] if b == 1 else list(range(3)) if b == 2 else path[::-1])
    slots, bases = list(range(1, B + 1)), [rng.randrange(1, 40) for _ in range(B)]
    k = torch.randn(L_attn, B + 2, KVH, 48 + T, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(L_attn, B + 2, KVH, 48 + T, D, generator=gen).to(torch.bfloat16)
    ssm = torch.randn(L_lin, B + 2, HV, K, K, generator=gen)
    conv = torch.randn(L_lin, B + 2, C, 3, generator=gen).to(torch.bfloat16)
    stash = (torch.randn(L_lin, B, T, C, generator=gen).to(torch.bfloat16), torch.randn(L_lin, B, T, H, K, generator=gen) * 0.1,
             torch.randn(L_lin, B, T, HV, K, generator=gen), -torch.rand(L_lin, B, T, HV, generator=gen).cumsum(2))
    index = PathIndex.build(list(range(B)), slots, paths, "cpu", bases=bases)
    k_ref, v_ref, ssm_ref, conv_ref = k.clone(), v.clone(), ssm.clone(), conv.clone()
    keep_kv_ref(k_ref, v_ref, index)
    commit_paths_ref(ssm_ref, conv_ref, *stash, list(range(B)), slots, paths)
    k, v, ssm, conv = k.to(dev), v.to(dev), ssm.to(dev), conv.to(dev)
    index = PathIndex.build(list(range(B)), slots, paths, dev, bases=bases)
    keep_kv(k, v, index)
    commit_paths(ssm, conv, *(t.to(dev) for t in stash), index)
    exact = bool(torch.equal(k.cpu(), k_ref) and torch.equal(v.cpu(), v_ref) and torch.equal(conv.cpu(), conv_ref))
    # status(): batch_invariant False marks a mismatch (here: the bitwise K/V and conv moves)
    return {**rel_err(ssm.cpu(), ssm_ref), "tol": 1e-5, "kv_and_conv_exact": exact, "batch_invariant": exact}


def check_qk_norm_rope_store(dev, dtype, B, H, KVH, D, R, zero_centered, gate):
    """The fused decode prologue (q/k RMSNorm + RoPE + K/V store, on by default in every GPU decode step) vs its
    reference: the rotated q and both caches (NaN-poisoned: only the stored positions may change)."""
    import torch

    from specpilot.config import RopeConfig
    from specpilot.layers.rotary import RotaryEmbedding
    from specpilot.ops.qk_norm_rope_store.reference import qk_norm_rope_store_ref
    from specpilot.ops.qk_norm_rope_store.triton import qk_norm_rope_store

    gen = torch.Generator().manual_seed(3)
    q_cols = H * D * (2 if gate else 1)
    packed = torch.randn(B, 1, q_cols + 2 * KVH * D, generator=gen).to(dtype).to(dev)
    q, k, v = packed.split([q_cols, KVH * D, KVH * D], dim=-1)
    q = q.view(B, 1, H, 2 * D)[..., :D] if gate else q.view(B, 1, H, D)  # a strided view, as in the model
    k, v = k.view(B, 1, KVH, D), v.view(B, 1, KVH, D)
    cos, sin = RotaryEmbedding(RopeConfig(theta=1e6, partial_rotary_factor=R / D), D)(
        torch.randint(0, 5000, (B, 1), generator=gen))
    cos, sin = cos.to(dev), sin.to(dev)
    w = (0.3 * torch.randn(2, D, generator=gen) + (0.0 if zero_centered else 1.0)).to(dtype).to(dev)
    N, S = B + 2, 64
    slots = torch.randperm(N, generator=gen)[:B].to(dev)
    loc = torch.randint(0, S, (B, 1), generator=gen).to(dev)
    outs = []
    for fn in (qk_norm_rope_store, qk_norm_rope_store_ref):
        caches = [torch.full((N, KVH, S, D), float("nan"), dtype=dtype, device=dev) for _ in range(2)]
        outs.append((fn(q, k, v, w[0], w[1], cos, sin, 1e-6, zero_centered, *caches, slots, loc), *caches))
    res = {name: rel_err(a.nan_to_num(), b.nan_to_num()) for name, a, b in zip(("q", "k_cache", "v_cache"), *outs)}
    res["nan_pattern_equal"] = all(torch.equal(a.isnan(), b.isnan()) for a, b in zip(outs[0][1:], outs[1][1:]))
    return {**res, "rel_rms_err": max(r["rel_rms_err"] for r in res.values() if isinstance(r, dict)),
            "nan": int(outs[0][0].isnan().sum()) + (0 if res["nan_pattern_equal"] else 1),
            "tol": 1e-2 if dtype != torch.float32 else 1e-5}


def _w12n_problem(dev, M, N, K):
    import torch

    from specpilot.weights import w12n

    gen = torch.Generator().manual_seed(2)
    w = torch.randn(N, K, generator=gen) * 0.02
    # every decode branch: inline escapes at exponent 0 (zeros, bf16 subnormals) and at a tiny normal exponent,
    # and verbatim segments (two escape exponents in one segment)
    w[::7, ::13] = 0.0
    w[1::7, 3::29] = 3e-39
    w[2::5, 5::31] = 1.1e-9
    w[3::11, 1::37], w[3::11, 2::37] = 1e-12, -0.0
    w = w.to(torch.bfloat16).to(dev)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(dev)
    t = w12n.encode_best(w)
    assert (t.xe == w12n.VERBATIM).any() and ((t.xe > 0) & (t.xe != w12n.VERBATIM)).any()
    return x, t


def _variants_agree(fn, x, t) -> dict:
    """The PTX decode (asm=True, CUDA only) against the pure-tl decode, bitwise, and batch invariance of each:
    row m of the M-row call equals the M = 1 call on that row."""
    import torch

    asm = [True, False] if x.is_cuda else [False]
    ys = {a: fn(x, t, asm=a) for a in asm}
    res = {"asm_equals_tl": all(torch.equal(ys[a], ys[False]) for a in asm)}
    res["batch_invariant"] = all(torch.equal(fn(x[m:m + 1], t, asm=a), ys[a][m:m + 1])
                                 for a in asm for m in range(min(x.shape[0], 4)))
    return res


def check_w12n_gemv(dev, M, N, K):
    """Fused W12N GEMV vs the fp32 GEMV of the decoded weights; the PTX and pure-tl decodes agree bitwise; each is
    batch invariant; one-hot rows of x return decoded weight columns bit for bit (fp32 subnormals included)."""
    import torch

    from specpilot.ops.w12n_gemv.reference import fp8_gemv_ref, w12n_gemv_ref
    from specpilot.ops.w12n_gemv.triton import fp8_gemv, w12n_gemv
    from specpilot.weights.w12n import decode

    x, t = _w12n_problem(dev, M, N, K)
    res = {**rel_err(w12n_gemv(x, t).float(), w12n_gemv_ref(x, t).float()), "tol": 1e-2, **_variants_agree(w12n_gemv, x, t)}
    cols = torch.tensor([0, 1, 2, 3, 5, 13, 26, 36, 39, K // 2, K - 1], device=dev)  # escapes, verbatim, clean
    onehot = torch.zeros(len(cols), K, device=dev)
    onehot[torch.arange(len(cols)), cols] = 1
    res["exact_decode"] = bool(torch.equal(w12n_gemv(onehot, t), decode(t).to(dev).float()[:, cols].T))
    # the FP8 view at its default launch (rows per program change with M, the tile width does not)
    xb = x.bfloat16()
    fp8 = fp8_gemv(xb, t)
    res["fp8_rel_rms_err"] = rel_err(fp8.float(), fp8_gemv_ref(xb, t).float())["rel_rms_err"]
    res["fp8_batch_invariant"] = all(torch.equal(fp8_gemv(xb[m:m + 1], t), fp8[m:m + 1]) for m in range(M))
    if not (res["fp8_batch_invariant"] and res["fp8_rel_rms_err"] < 1e-2):
        res["batch_invariant"] = False
    if dev == "cuda":  # the tensor-core kernel (Gluon): exact decode through one-hot rows, batch invariance
        from specpilot.ops.w12n_gemv.mma import supports, w12n_mma_gemv

        assert supports(x, t), "the check's problem must be one the tensor-core kernel takes"
        mma = w12n_mma_gemv(x, t)
        res["mma_rel_rms_err"] = rel_err(mma.float(), w12n_gemv_ref(x, t).float())["rel_rms_err"]
        res["mma_batch_invariant"] = all(torch.equal(w12n_mma_gemv(x[m:m + 1], t), mma[m:m + 1])
                                         for m in range(x.shape[0]))
        res["mma_exact_decode"] = bool(torch.equal(w12n_mma_gemv(onehot.bfloat16(), t),
                                                   decode(t).to(dev)[:, cols].T.contiguous()))
        res["mma_warps_agree"] = {ks: rel_err(w12n_mma_gemv(x, t, warps=ks).float(), mma.float())["rel_rms_err"]
                                  for ks in (1, 2, 4) if (t.padded_k // 64) % ks == 0}
        res.update(_swiglu_agrees(x, t, mma))
        if not (res["mma_batch_invariant"] and res["mma_exact_decode"] and res["mma_rel_rms_err"] < 1e-2
                and res.get("swiglu_ok", True)):
            res["batch_invariant"] = False  # status(): any of these marks a mismatch
    if not (res["asm_equals_tl"] and res["exact_decode"]):
        res["batch_invariant"] = False
    return res


def _swiglu_agrees(x, t, mma) -> dict:
    """The SwiGLU epilogue (the matrix read as [gate; up]) against torch's silu(gate) * up of the plain kernel's
    bf16 output, formed in fp32 and rounded once: equal but for the odd last bit (its exp is the fast ex2), and
    batch invariant bitwise."""
    import torch

    from specpilot.ops.w12n_gemv.mma import glu_supported, prepare, w12n_swiglu_gemv

    if not glu_supported(t):
        return {}
    prepare(t, swiglu=True)
    fused = w12n_swiglu_gemv(x, t)
    gate, up = mma.float().chunk(2, dim=1)
    want = (gate * torch.sigmoid(gate) * up).bfloat16()
    rel = ((fused.float() - want.float()).abs() / want.float().abs().clamp_min(1e-30)).max().item()
    res = {"swiglu_mismatch_fraction": (fused != want).float().mean().item(), "swiglu_max_rel_diff": rel,
           "swiglu_batch_invariant": all(torch.equal(w12n_swiglu_gemv(x[m:m + 1], t), fused[m:m + 1])
                                         for m in range(x.shape[0]))}
    res["swiglu_ok"] = res["swiglu_batch_invariant"] and rel <= 2 ** -7 and res["swiglu_mismatch_fraction"] < 0.01
    return res


def check_w12n_decode(dev, M, N, K):
    """The decode-to-bf16 kernel (products of more than 16 rows): PTX and pure-tl decodes equal decode(t) bitwise,
    also replayed from a CUDA graph; w12n_linear of M rows (decode kernel + cuBLAS) vs the fp32 reference."""
    import torch

    from specpilot.ops.w12n_gemv import w12n_gemv_ref, w12n_linear
    from specpilot.ops.w12n_gemv.triton import w12n_decode
    from specpilot.weights.w12n import decode


    x, t = _w12n_problem(dev, M, N, K)
    want = decode(t).view(torch.int16)
    asm = [True, False] if x.is_cuda else [False]
    exact = all(torch.equal(w12n_decode(t, asm=a).view(torch.int16), want) for a in asm)
    if x.is_cuda:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = w12n_decode(t)
        out.zero_()
        graph.replay()
        exact = exact and torch.equal(out.view(torch.int16), want)
    res = {**rel_err(w12n_linear(x, t).float(), w12n_gemv_ref(x.float(), t)), "tol": 1e-2, "exact_decode": exact}
    res["batch_invariant"] = exact  # status(): False marks a mismatch
    return res


def check_fp8_gemv(dev, M, N, K):
    """FP8-view GEMV vs its reference; the hardware (cvt) and pure-tl view decodes agree bitwise; batch invariance."""
    from specpilot.ops.w12n_gemv.reference import fp8_gemv_ref
    from specpilot.ops.w12n_gemv.triton import fp8_gemv

    x, t = _w12n_problem(dev, M, N, K)
    res = {**rel_err(fp8_gemv(x, t).float(), fp8_gemv_ref(x, t).float()), "tol": 1e-2, **_variants_agree(fp8_gemv, x, t)}
    if not res["asm_equals_tl"]:
        res["batch_invariant"] = False
    return res


def check_conv_prefill(dev, B, T, C, W):
    """The causal conv1d prefill kernel vs its fp32 reference, from a state; the final states equal bitwise."""
    import torch

    from specpilot.ops.causal_conv1d import causal_conv1d_prefill_ref
    from specpilot.ops.causal_conv1d.triton import causal_conv1d_prefill

    gen = torch.Generator(device=dev).manual_seed(T)
    x = torch.randn(B, T, C + 64, device=dev, generator=gen).to(torch.bfloat16)[..., 32:32 + C]
    weight = torch.randn(C, W, device=dev, generator=gen).to(torch.bfloat16)
    s0 = torch.randn(B, C, W - 1, device=dev, generator=gen).to(torch.bfloat16)
    y, state = causal_conv1d_prefill(x, weight, s0)
    y_ref, state_ref = causal_conv1d_prefill_ref(x, weight, s0)
    return {**rel_err(y.float(), y_ref.float()), "tol": 1e-2, "batch_invariant": torch.equal(state, state_ref)}


def check_silu_mul(dev, rows, N):
    """The SwiGLU activation kernel vs its fp32 reference."""
    import torch

    from specpilot.ops.silu_mul import silu_mul_ref
    from specpilot.ops.silu_mul.triton import silu_mul

    x = (torch.randn(rows, 2 * N, device=dev, generator=torch.Generator(device=dev).manual_seed(rows)) * 3)
    x = x.to(torch.bfloat16)
    return {**rel_err(silu_mul(x).float(), silu_mul_ref(x).float()), "tol": 1e-2}


def check_fp8_linear(dev, M, N, K):
    """The FP8 linear (cuBLASLt FP8 GEMM on a GPU with FP8 tensor cores, the reference for shapes it does not take) vs
    its fp32 reference of the same quantized operands."""
    import torch

    from specpilot.ops.fp8_linear import fp8_linear, fp8_linear_ref, quantize_weight

    gen = torch.Generator(device=dev).manual_seed(M * 7 + N)
    x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
    w, scale = quantize_weight(torch.randn(N, K, device=dev, generator=gen) * 0.02)
    return {**rel_err(fp8_linear(x, w, scale).float(), fp8_linear_ref(x, w, scale).float()), "tol": 1e-2}


def check_decode_attention(dev, dtype, B, H, KVH, D, S, kv_lens, repeats):
    """The split-K decode attention vs the reference, and deterministic: `repeats` calls give the same bits."""
    import torch

    from specpilot.ops.decode_attention.reference import decode_attention_ref
    from specpilot.ops.decode_attention.triton import decode_attention

    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, H, D, generator=g).to(dev, dtype)
    k = torch.randn(B + 1, KVH, S, D, generator=g).to(dev, dtype)
    v = torch.randn(B + 1, KVH, S, D, generator=g).to(dev, dtype)
    slot = torch.arange(1, B + 1, device=dev)
    kv_len = torch.tensor(kv_lens, device=dev)
    scale = D ** -0.5
    ref = decode_attention_ref(q.float(), k.float(), v.float(), slot, kv_len, scale)
    out = decode_attention(q, k, v, slot, kv_len, scale)
    equal = sum(bool(torch.equal(decode_attention(q, k, v, slot, kv_len, scale), out)) for _ in range(repeats))
    res = _err(ref, out.float(), 1e-2)
    res.update(bitwise_equal_runs=equal, runs=repeats, batch_invariant=equal == repeats)
    return res


def check_gemv_paths(dev, M, N, K, gated):
    """The skinny tensor-core GEMV (M > 1) or the gated down-projection GEMV (M = 1, the FMA kernel), vs the fp32
    reference."""
    import torch

    from specpilot.ops.gemv import configs, triton
    from specpilot.ops.gemv.reference import gated_gemv_ref, gemv_ref

    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(N, K, generator=g) * 0.02).to(dev, torch.bfloat16)
    x = torch.randn(M, 2 * K if gated else K, generator=g).to(dev, torch.bfloat16)
    if gated:
        bn, bk, nw, pre = configs.gemv_config(N, K)
        return _err(gated_gemv_ref(x, w).float(), triton.gemv(x, w, block_n=bn, block_k=bk, num_warps=nw,
                                                              pre_tiles=pre, gated=True).float(), 1e-2)
    bn, bk, nw, st = configs.skinny_config(N, K)
    return _err(gemv_ref(x, w).float(), triton.skinny(x, w, block_n=bn, block_k=bk, num_warps=nw,
                                                      num_stages=st).float(), 1e-2)


def check_gemv_pre_tiles(dev, N, K):
    """The M = 1 GEMV under PDL with 0, 1 and 2 weight tiles loaded before the wait: the same sums in the same
    order, so the outputs must be equal bitwise; and vs the fp32 reference."""
    import torch

    from specpilot.ops.gemv import configs, triton
    from specpilot.ops.gemv.reference import gemv_ref

    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(N, K, generator=g) * 0.02).to(dev, torch.bfloat16)
    x = torch.randn(1, K, generator=g).to(dev, torch.bfloat16)
    bn, bk, nw, _ = configs.gemv_config(N, K)
    outs = [triton.gemv(x, w, block_n=bn, block_k=bk, num_warps=nw, pre_tiles=p, pdl=True) for p in (0, 1, 2)]
    res = _err(gemv_ref(x, w).float(), outs[2].float(), 1e-2)
    res["equal_across_pre_tiles"] = all(bool(torch.equal(o, outs[0])) for o in outs)
    res["batch_invariant"] = res["equal_across_pre_tiles"]  # status(): False marks a mismatch
    return res


def check_rms_norm(dev, rows, H, zero_centered):
    """The decode RMSNorm (+ residual) kernel vs its reference, bf16."""
    import torch

    from specpilot.ops.rms_norm.reference import add_rms_norm_ref
    from specpilot.ops.rms_norm.triton import add_rms_norm

    g = torch.Generator(device="cpu").manual_seed(0)
    x, r = (torch.randn(rows, 1, H, generator=g).to(dev, torch.bfloat16) for _ in range(2))
    w = (torch.randn(H, generator=g) * 0.1 + (0 if zero_centered else 1)).to(dev, torch.bfloat16)
    (want, want_s), (got, got_s) = add_rms_norm_ref(x, r, w, 1e-6, zero_centered), add_rms_norm(x, r, w, 1e-6,
                                                                                                zero_centered)
    res = _err(want.float(), got.float(), 1e-2)
    res["sum_equal"] = bool(torch.equal(want_s, got_s))
    res["batch_invariant"] = res["sum_equal"]  # status(): False marks a mismatch
    return res


def _err(ref, out, tol) -> dict:

    return {**rel_err(out, ref), "tol": tol}


def checks(device: str):
    """[(name, kernel family, fn, kwargs)] in run order: real head sizes on a GPU, tiny ones on the CPU (under
    TRITON_INTERPRET=1)."""
    import torch

    out = []
    if device == "cuda":
        bf = torch.bfloat16
        attn = [("qwen3-8b.tree", dict(B=2, H=32, KVH=8, D=128, prefixes=[517, 3], lens=[9, 5], kind="tree")),
                ("qwen3-8b.causal-ctx4096", dict(B=2, H=32, KVH=8, D=128, prefixes=[4096, 31], lens=[8, 8],
                                                 kind="causal")),
                ("qwen3-8b.tree256-ctx4096", dict(B=1, H=32, KVH=8, D=128, prefixes=[4096], lens=[256], kind="tree")),
                ("qwen3.5-27b.tree", dict(B=2, H=24, KVH=4, D=256, prefixes=[512, 7], lens=[33, 12], kind="tree")),
                ("qwen3.5-27b.causal", dict(B=1, H=24, KVH=4, D=256, prefixes=[600], lens=[8], kind="causal")),
                # a prompt's prefill through the op (runners with block_attention=tree prefill with it too)
                ("qwen3-8b.prefill300", dict(B=1, H=32, KVH=8, D=128, prefixes=[0], lens=[300], kind="causal")),
                ("qwen3.5-27b.prefill200", dict(B=1, H=24, KVH=4, D=256, prefixes=[0], lens=[200], kind="causal"))]
        gdn = [(f"qwen3.5-27b.T{T}", dict(B=2, T=T, H=16, HV=48, K=128, V=128)) for T in (1, 8, 33, 64)]
        rope = [("qwen3-8b.b8", dict(B=8, H=32, KVH=8, D=128, R=128, zero_centered=False, gate=False)),
                ("qwen3.5-27b.b1-gated", dict(B=1, H=24, KVH=4, D=256, R=64, zero_centered=True, gate=True))]
        gemv = [(f"M{m}", dict(M=m, N=2053, K=5120)) for m in (1, 8, 16)]
        gemv.append(("M11-8b.o_proj", dict(M=11, N=4096, K=4096)))
        # a few-warp launch: 8 warps under the 80-register cap (mma.default_launch)
        gemv.append(("M8-27b.o_proj", dict(M=8, N=5120, K=6144)))
    else:
        bf = torch.float32
        attn = [("tiny.tree", dict(B=2, H=4, KVH=2, D=16, prefixes=[19, 0], lens=[7, 3], kind="tree")),
                ("tiny.causal", dict(B=1, H=6, KVH=2, D=32, prefixes=[21], lens=[5], kind="causal"))]
        gdn = [(f"tiny.T{T}", dict(B=2, T=T, H=2, HV=4, K=16, V=16)) for T in (1, 9)]
        rope = [("tiny.b3", dict(B=3, H=4, KVH=2, D=16, R=16, zero_centered=False, gate=False)),
                ("tiny.b1-gated", dict(B=1, H=4, KVH=2, D=32, R=8, zero_centered=True, gate=True))]
        gemv = [(f"M{m}", dict(M=m, N=24, K=1000)) for m in (1, 3)]
    if device == "cuda":
        dec = [("qwen3-8b.b1-ctx512", dict(B=1, H=32, KVH=8, D=128, S=700, kv_lens=[512])),
               ("qwen3-8b.b8-ragged", dict(B=8, H=32, KVH=8, D=128, S=4200, kv_lens=[1, 17, 512, 4096, 64, 300,
                                                                                       2000, 129])),
               ("qwen3.5-27b.b1-ctx4096", dict(B=1, H=24, KVH=4, D=256, S=4200, kv_lens=[4096]))]
        gm = [("8b.down-gated.M1", dict(M=1, N=4096, K=12288, gated=True)),
              ("8b.qkv.M8", dict(M=8, N=6144, K=4096, gated=False)),
              ("27b.down.M16", dict(M=16, N=5120, K=17408, gated=False)),
              ("27b.gate_up.M29", dict(M=29, N=34816, K=5120, gated=False)),
              ("odd.M5", dict(M=5, N=2053, K=5000, gated=False))]
        for name, kw in dec:
            out.append((f"decode_attention.{name}", "decode_attention", check_decode_attention,
                        dict(dtype=bf, repeats=10, **kw)))
        for name, kw in gm:
            out.append((f"gemv.{name}", "gemv", check_gemv_paths, kw))
        for name, kw in (("8b.o_proj", dict(N=4096, K=4096)), ("odd", dict(N=2053, K=5000))):
            out.append((f"gemv_pre_tiles.{name}", "gemv_pre_tiles", check_gemv_pre_tiles, kw))
        for name, kw in (("qwen3.5-27b.T2048", dict(B=1, T=2048, C=10240, W=4)),
                         ("qwen3.5-27b.B2-T333", dict(B=2, T=333, C=10240, W=4))):
            out.append((f"conv_prefill.{name}", "conv_prefill", check_conv_prefill, kw))
        for name, kw in (("qwen3.5-27b.T2048", dict(rows=2048, N=17408)), ("odd", dict(rows=37, N=1000))):
            out.append((f"silu_mul.{name}", "silu_mul", check_silu_mul, kw))
        for name, kw in (("lm_head.M1", dict(M=1, N=32848, K=5120)), ("lm_head.M8", dict(M=8, N=32848, K=5120)),
                         ("M33", dict(M=33, N=4096, K=4096)), ("odd-N", dict(M=3, N=2053, K=5120))):
            out.append((f"fp8_linear.{name}", "fp8_linear", check_fp8_linear, kw))
        for name, kw in (("8b", dict(rows=1, H=4096, zero_centered=False)),
                         ("27b", dict(rows=8, H=5120, zero_centered=True))):
            out.append((f"rms_norm.{name}", "rms_norm", check_rms_norm, kw))
    for name, kw in rope:  # first: every AR baseline's decode step runs it
        out.append((f"qk_norm_rope_store.{name}", "qk_norm_rope_store", check_qk_norm_rope_store, dict(dtype=bf, **kw)))
    for name, kw in attn:
        out.append((f"tree_attention.{name}", "tree_attention", check_tree_attention, dict(dtype=bf, **kw)))
    for name, kw in gdn:
        out.append((f"gdn_tree.{name}", "gdn_tree", check_gdn_tree, dict(dtype=bf, **kw)))
    chunks = ([(f"qwen3.5-27b.T{T}", dict(B=2, T=T, H=16, HV=48, K=128, V=128)) for T in (17, 64, 300)]
              if device == "cuda" else [("tiny.T70", dict(B=2, T=70, H=2, HV=4, K=16, V=16))])
    for name, kw in chunks:
        out.append((f"gdn_chunk.{name}", "gdn_chunk", check_gdn_chunk, dict(dtype=bf, **kw)))
    conv = ([("qwen3.5-27b.T64", dict(B=2, T=64, C=10240, W=4)), ("qwen3.5-27b.T1", dict(B=8, T=1, C=10240, W=4))]
            if device == "cuda" else [("tiny.T9", dict(B=2, T=9, C=40, W=4))])
    for name, kw in conv:
        out.append((f"tree_conv.{name}", "gdn_tree", check_tree_conv, dict(dtype=bf, **kw)))
    commit = (dict(L_attn=16, L_lin=48, KVH=4, D=256, H=16, HV=48, K=128, C=10240, B=8, T=29) if device == "cuda"
              else dict(L_attn=2, L_lin=3, KVH=2, D=24, H=2, HV=6, K=16, C=40, B=4, T=9))
    out.append(("commit.qwen3.5-27b" if device == "cuda" else "commit.tiny", "commit", check_commit, commit))
    for name, kw in gemv:
        out.append((f"w12n_gemv.{name}", "w12n_gemv", check_w12n_gemv, kw))
        if kw["M"] in (1, 8, 16, 3):
            out.append((f"fp8_gemv.{name}", "fp8_gemv", check_fp8_gemv, kw))
    decode_shapes = ([("8b.o_proj", dict(M=40, N=4096, K=4096)), ("ragged", dict(M=33, N=2053, K=1000))]
                     if device == "cuda" else [("tiny", dict(M=20, N=13, K=300))])
    for name, kw in decode_shapes:
        out.append((f"w12n_decode.{name}", "w12n_decode", check_w12n_decode, kw))
    return out


def status(res: dict) -> str:
    """A finished check's status: mismatch on NaN, an error above its tolerance, or a property it reports False
    (batch_invariant: bitwise equalities); else ok."""
    bad = res["nan"] or not res["rel_rms_err"] <= res["tol"] or res.get("batch_invariant") is False
    return "mismatch" if bad else "ok"
