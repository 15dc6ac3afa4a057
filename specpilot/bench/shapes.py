"""Real-shape random-weight models for benchmarks: the exact shapes of public checkpoints, weights drawn like
trained ones (normal, std 0.02, bf16; norms at identity), built on the device in seconds. Acceptance on such
weights means nothing, so they are always paired with synthetic acceptance.

Two kinds (RandomTarget): "flat", every weight random, whose logits are nearly flat (in bf16 two valid kernels
flip near-ties, so exact greedy equality cannot be asked of them); and "margin", the same shapes, kernels and
random matrices plus a small planted circuit (margin_model) whose greedy next token wins by MARGIN logits, so
that speculative output must equal AR output token for token in bf16 too.

Also the matching DFlash drafters (Qwen3-8B: 5 layers; Qwen3.5-27B: 5 layers, about the size of the public
DFlash2 drafter, 3.7 GB vs 3.85 GB in bf16) and a byte tokenizer for prompts (ids are bytes: any text
works, and token content does not matter under synthetic acceptance).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import transformers

from specpilot.config import ModelConfig
from specpilot.models.loader import build_empty

SHAPES = {
    "tiny-dense": (transformers.Qwen3Config, dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "tiny-hybrid": (transformers.Qwen3_5TextConfig, dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2)),
    "Qwen3-8B": (transformers.Qwen3Config, dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False)),
    "Qwen3.5-27B": (transformers.Qwen3_5TextConfig, dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        full_attention_interval=4, max_position_embeddings=262144)),
}
DFLASH_LAYERS = {"Qwen3-8B": 5, "Qwen3.5-27B": 5, "tiny-dense": 1, "tiny-hybrid": 1}


def hf_config(shape: str, **overrides):
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: use one of {', '.join(SHAPES)}")
    config_cls, kw = SHAPES[shape]
    return config_cls(**{**kw, **overrides})


def clean(w: torch.Tensor, floor: float = 1e-4) -> torch.Tensor:
    """w with magnitudes below floor raised to floor, signs kept: no weight escapes the W12N exponent window, so
    the encoding has no escapes and no verbatim segments."""
    return torch.where(w.abs() < floor, torch.where(w < 0, -floor, floor).to(w.dtype), w)


def random_model(hf_cfg, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 clean_weights: bool = False):
    """N(0, 0.02) matrices, identity norms. clean_weights: matrix magnitudes below 1e-4 raised to 1e-4, so that
    no weight escapes the W12N exponent window (random weights otherwise have verbatim segments, which trained
    checkpoints mostly lack, and the W12N GEMV then runs its fix-up path)."""
    cfg = ModelConfig.from_dict(hf_cfg.to_dict())
    model = build_empty(cfg, torch.device(device), dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=device).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif p.ndim == 1:
                # plain norms scale by w (=1), zero-centred ones by 1 + w (w=0): both the identity
                zero_centered = cfg.family == "qwen3_5" and "linear_attn.norm" not in name
                p.fill_(0.0 if zero_centered else 1.0)
            else:
                p.normal_(0, 0.02, generator=gen)
                if clean_weights:
                    p.copy_(clean(p))
    return model


def random_dflash(target, shape: str, block: int = 8, seed: int = 1, layers: int | None = None, runtime=None):
    """A DFlash drafter of the shape's size (or `layers` layers) with random weights, for timing under synthetic
    acceptance; runtime: the target runner's (DFlashDrafter's default without one)."""
    from specpilot.models.dflash import DFlashModel, default_target_layers
    from specpilot.spec_decode.drafters.dflash import DFlashDrafter
    from specpilot.train.dflash import draft_config

    layers = layers or DFLASH_LAYERS.get(shape, 5)
    depth = target.config.num_hidden_layers
    taps = default_target_layers(depth, layers) if depth >= 5 else tuple(range(depth))
    param = next(target.parameters())
    with torch.device("meta"):
        model = DFlashModel(draft_config(target.config, layers), len(taps))
    model = model.to(dtype=param.dtype).to_empty(device=param.device)
    model.reset_buffers()
    gen = torch.Generator(device=param.device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0) if p.ndim == 1 else p.normal_(0, 0.02, generator=gen)
    return DFlashDrafter(model.eval().requires_grad_(False), target, taps, block, mask_token_id=0, runtime=runtime)


class ByteTokenizer:
    """UTF-8 bytes as token ids (no model vocabulary needed): prompts for random-weight targets."""

    eos_token_id = None
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8")) or [0]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ random targets
KINDS = ("margin", "flat")


@dataclass(frozen=True)
class RandomTarget:
    """A random-weight target: a SHAPES entry, its kind (margin or flat) and an optional depth cut."""

    shape: str
    kind: str = "margin"
    layers: int | None = None

    @staticmethod
    def parse(text: str, default_kind: str = "margin") -> RandomTarget | None:
        """`random:SHAPE[:layers=N]` (the default kind), `margin:SHAPE[...]` or `flat:SHAPE[...]`; None for anything
        else (a checkpoint directory or Hub id)."""
        prefix, sep, rest = text.partition(":")
        if not sep or prefix not in ("random", *KINDS):
            return None
        if default_kind not in KINDS:
            raise ValueError(f"target kind {default_kind!r}: use one of {', '.join(KINDS)}")
        shape, *opts = rest.split(":")
        if shape not in SHAPES:
            raise ValueError(f"target {text!r}: unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
        layers = None
        for opt in opts:
            key, _, value = opt.partition("=")
            if key != "layers" or not value.isdigit() or int(value) < 1:
                raise ValueError(f"target {text!r}: options are layers=N with N >= 1, got {opt!r}")
            layers = int(value)
        target = RandomTarget(shape, default_kind if prefix == "random" else prefix, layers)
        if target.kind == "margin":
            target.check(text)
        return target

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.shape}" + (f":layers={self.layers}" if self.layers else "")

    def hf_config(self):
        return hf_config(self.shape, **({"num_hidden_layers": self.layers} if self.layers else {}))

    def check(self, text: str | None = None) -> None:
        """A margin target needs a full-attention layer within its depth (its circuit's copy lives there)."""
        cfg = ModelConfig.from_dict(self.hf_config().to_dict())
        if "full_attention" not in cfg.layer_types:
            first = ModelConfig.from_dict(hf_config(self.shape).to_dict()).layer_types.index("full_attention")
            raise ValueError(f"target {text or self.label!r}: a margin target needs a full-attention layer; use "
                             f"layers >= {first + 1} (or a flat target)")

    def build(self, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0):
        if self.kind == "flat":
            return random_model(self.hf_config(), device, dtype, seed)
        return margin_model(self.hf_config(), device, dtype, seed)


# -------------------------------------------------------------------------------------------- margin targets
# A trained model's greedy token leads the runner-up by many logits at almost every position; random weights give
# nearly flat logits, whose top-2 gap has a density at zero that no amount of scaling removes (any map from random
# hidden states to a vocabulary has boundaries). A margin target therefore computes its next token from discrete
# quantities, token identities, through a small circuit planted in the random weights:
#
#   every token t carries codes (alpha, beta; on hybrids also gamma, kappa), each one coordinate of its embedding
#   (coordinate-aligned, so that an input norm's gains can pass a code to a layer and hold the rest back);
#   one full-attention layer attends to the previous position only (q and k read a coordinate every embedding has,
#   so their scores depend on the relative position through RoPE alone) and copies its beta code (a random
#   column of v_proj per code, read by the random o_proj);
#   on hybrids, the first Gated DeltaNet layer is an associative memory: each token writes its gamma code under
#   its kappa key (orthogonal key blocks, write strength 1, no decay: the delta rule overwrites), and reads under
#   the previous token's key (the conv takes q from the previous input), i.e. the value the previous token wrote,
#   which the recurrent state carried across the step (the value of the current token when both keys are equal);
#   every other layer, and every coordinate outside a layer's codes, gets an input gain of QUIET: the layers run
#   their random weights on small inputs.
#
# The LM head row of token t reads one code triple (alpha', beta', gamma'): it gets MARGIN logits for each code the
# final hidden state carries (alpha of the current token, beta copied by attention, gamma recalled by the
# recurrent state), so the next token is the one row matching all of them, MARGIN above any row matching one
# fewer. The output is a deterministic second-order Markov chain over tokens that a wrong K/V entry (the beta
# copy) or a wrong recurrent state (the gamma recall) changes. The random matrices keep their N(0, 0.02) draws
# except the few rows and columns the circuit sets, the LM head (structured rows, its random part 0.001) and the
# norm gains: same shapes, same kernels, same timing.
MARGIN = 16.0  # logits per code an LM head row matches: the top-1 - top-2 gap
QUIET = 0.02  # input gain of the layers and coordinates outside the circuit
SCORE_GAP = 40.0  # nats between the previous position's attention score and any other position's (contexts <= 8192)
SWITCH = 24.0  # pre-activation of the code switches (q/k/v blocks of the memory, its gates): silu(-24) ~ 1e-9
HEAD_NOISE = 1e-3  # std of the LM head's random part


@dataclass(frozen=True)
class Codebook:
    """Per token its codes, and the code triple each LM head row reads (-1: a row that reads nothing)."""

    alpha: torch.Tensor  # [vocab] int64, CPU
    beta: torch.Tensor
    gamma: torch.Tensor
    kappa: torch.Tensor
    reads: torch.Tensor  # [vocab, 3] int64
    groups: int  # codes of alpha and of beta
    gammas: int  # codes of gamma (1: none)
    kappas: int  # keys of the recurrent memory (1: none)

    @staticmethod
    def build(vocab: int, gammas: int, kappas: int, hidden: int, copy_dims: int, seed: int = 0) -> Codebook:
        """Codes for a vocabulary: as many alpha x beta (x gamma) combinations as the vocabulary allows, and as the
        hidden size (every code vector of _Circuit._duals must fit) and the attention's value dimensions
        (`copy_dims`: the beta copies and the constant's) allow; each combination is one token's row, the other
        tokens' rows read nothing."""
        g, k = (gammas if gammas > 1 else 0), (kappas if kappas > 1 else 0)
        groups = min(math.isqrt(vocab // gammas), (hidden - 2 - k - 2 * g) // 3, copy_dims - 1 - g)
        if groups < 2:
            raise ValueError(f"a margin target needs room for its codes: vocab {vocab}, hidden size {hidden}")
        gen = torch.Generator().manual_seed(seed)
        draw = lambda n: torch.randint(0, n, (vocab,), generator=gen)  # noqa: E731
        combos = groups * groups * gammas
        reads = torch.full((vocab, 3), -1, dtype=torch.long)
        rows = torch.randperm(vocab, generator=gen)[:combos]
        idx = torch.arange(combos)
        reads[rows] = torch.stack((idx // (groups * gammas), idx // gammas % groups, idx % gammas), dim=1)
        return Codebook(draw(groups), draw(groups), draw(gammas), draw(kappas), reads, groups, gammas, kappas)

    def drifted(self, fraction: float, seed: int = 1) -> Codebook:
        """The same codes with the reads of `fraction` of the reading rows shuffled among them: a model that
        predicts the same chain except where it reaches one of those rows (a drafter that is sometimes wrong)."""
        gen = torch.Generator().manual_seed(seed)
        rows = torch.nonzero(self.reads[:, 0] >= 0).flatten()
        moved = rows[torch.randperm(len(rows), generator=gen)[:int(fraction * len(rows))]]
        reads = self.reads.clone()
        reads[moved] = self.reads[moved[torch.randperm(len(moved), generator=gen)]]
        return dataclasses.replace(self, reads=reads)

    def next_token(self, prev: int, cur: int, memory: bool) -> int:
        """The chain's next token after (prev, cur): the row reading (alpha(cur), beta(prev), gamma), gamma the
        previous token's, except on a model with the recurrent memory when both tokens have one key (the current
        token's write replaced it before the read)."""
        gamma = self.gamma[cur] if memory and self.kappa[cur] == self.kappa[prev] else self.gamma[prev]
        combo = (int(self.alpha[cur]) * self.groups + int(self.beta[prev])) * self.gammas + int(gamma)
        return int(self.rows_by_combo[combo])

    @functools.cached_property
    def rows_by_combo(self) -> torch.Tensor:
        """[combos]: the row reading each code combination ((alpha * groups + beta) * gammas + gamma)."""
        live = torch.nonzero(self.reads[:, 0] >= 0).flatten()
        r = self.reads[live]
        out = torch.empty(len(live), dtype=torch.long)
        out[(r[:, 0] * self.groups + r[:, 1]) * self.gammas + r[:, 2]] = live
        return out

    def chain(self, prompt: list[int], n: int, memory: bool) -> list[int]:
        """The n tokens a margin model generates greedily after `prompt` (at least 2 tokens)."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(self.next_token(seq[-2], seq[-1], memory))
        return seq[len(prompt):]


def margin_model(hf_cfg, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 codes: Codebook | None = None, margin: float = MARGIN):
    """random_model(hf_cfg) with the margin circuit planted (see above). `codes`: another model's codebook (a
    drafter that predicts that model's chain); a dense model given codes with gammas > 1 copies gamma by attention
    too. The model's `margin_codes` attribute holds its codebook."""
    model = random_model(hf_cfg, device, dtype, seed)
    cfg = model.config
    if cfg.tie_word_embeddings:
        raise ValueError("a margin target needs an LM head of its own (tie_word_embeddings is set)")
    if "full_attention" not in cfg.layer_types:
        raise ValueError("a margin target needs a full-attention layer")
    if model.model.layers[cfg.layer_types.index("full_attention")].self_attn.q_norm is None:
        raise ValueError("a margin target needs q/k norms (Qwen3 / Qwen3.5 attention)")
    hybrid = cfg.is_hybrid
    if codes is None:
        gammas = min(8, cfg.linear_value_head_dim) if hybrid else 1
        kappas = min(8, cfg.linear_key_head_dim) if hybrid else 1
        codes = Codebook.build(cfg.vocab_size, gammas, kappas, cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim,
                               seed)
    if len(codes.alpha) != cfg.vocab_size:
        raise ValueError(f"codebook of {len(codes.alpha)} tokens for a vocabulary of {cfg.vocab_size}")
    with torch.no_grad():
        circuit = _Circuit(model, codes, seed)
        circuit.plant()
        circuit.readout(margin)
    model.margin_codes = codes
    return model


class _Circuit:
    """The planted weights of one margin model (see the section comment)."""

    def __init__(self, model, codes: Codebook, seed: int):
        self.model, self.codes, self.cfg = model, codes, model.config
        cfg, D = model.config, model.config.hidden_size
        self.hybrid = cfg.is_hybrid
        self.memory = self.hybrid and codes.gammas > 1  # gamma recalled by the recurrent state ...
        self.copy_gamma = not self.hybrid and codes.gammas > 1  # ... or copied by attention (a dense drafter)
        self.attn_index = cfg.layer_types.index("full_attention")
        self.gdn_index = cfg.layer_types.index("linear_attention") if self.memory else None
        if self.memory and self.gdn_index > self.attn_index:
            raise ValueError("a hybrid margin target needs a linear-attention layer before its first attention one")
        sizes = {"c": 1, "alpha": codes.groups, "beta": codes.groups}
        if self.memory:
            sizes["kappa"] = codes.kappas
        if codes.gammas > 1:
            sizes["nu"] = codes.gammas
        gen = torch.Generator().manual_seed(seed + 7)
        picked = torch.randperm(D, generator=gen)[:sum(sizes.values())].tolist()
        self.coords, at = {}, 0
        for name, n in sizes.items():
            self.coords[name] = torch.tensor(picked[at:at + n])
            at += n
        self.amp = (D / len(sizes)) ** 0.5  # each code's coordinate: the embedding's rms stays about 1
        self.device = next(model.parameters()).device

    def plant(self) -> None:
        self._embedding()
        # the copied codes' gains make the attention output about one code amplitude (the input's rms is about 1)
        copied = ["beta"] + (["nu"] if self.copy_gamma else [])
        gains = {name: 1 / self._copy_outputs(name).norm(dim=1).mean().item() for name in copied}
        for i, layer in enumerate(self.model.model.layers):
            keep = {self.attn_index: {"c": 1.0, **gains}, self.gdn_index: {"c": 1.0, "kappa": 1.0, "nu": 1.0}}
            self._gain(layer.input_layernorm, keep.get(i, {}))
            self._gain(layer.post_attention_layernorm, {})
        self._attention(self.model.model.layers[self.attn_index].self_attn)
        if self.memory:
            self._memory(self.model.model.layers[self.gdn_index].linear_attn)

    def _embedding(self) -> None:
        E, codes, rows = self.model.model.embed_tokens.weight, self.codes, torch.arange(len(self.codes.alpha))
        E[:, self.coords["c"][0].item()] += self.amp
        for name, code in (("alpha", codes.alpha), ("beta", codes.beta), ("kappa", codes.kappa), ("nu", codes.gamma)):
            if name in self.coords:
                E.index_put_((rows.to(E.device), self.coords[name][code].to(E.device)),
                             torch.tensor(self.amp, dtype=E.dtype, device=E.device), accumulate=True)

    def _gain(self, norm, keep: dict[str, float]) -> None:
        """The norm's gains: keep[name] on the coordinates of those codes, QUIET elsewhere."""
        w = torch.full_like(norm.weight, QUIET, dtype=torch.float32)
        for name, gain in keep.items():
            w[self.coords[name].to(w.device)] = gain
        norm.weight.copy_(w - 1 if norm.zero_centered else w)

    def _code_cols(self) -> torch.Tensor:
        return torch.cat(list(self.coords.values())).to(self.device)

    def _set_rows(self, weight, rows, reads: dict[int, float | torch.Tensor]) -> None:
        """Rows `rows` of `weight` read only the given coordinates among the code coordinates (value per unit of
        code amplitude: a number, or one per row); their random entries elsewhere stay."""
        block = weight[rows].float()
        block[:, self._code_cols()] = 0
        for coord, value in reads.items():
            block[:, coord] = value / self.amp
        weight[rows] = block.to(weight.dtype)

    def _switches(self, coords: torch.Tensor, rows: int, block: int) -> dict[int, torch.Tensor]:
        """Per code coordinate, the value of each of `rows` rows: +SWITCH on the rows of its block (row r is in
        block r // block), -SWITCH on the others (rows past the last block read -SWITCH everywhere)."""
        code = torch.arange(rows, device=self.device) // block
        return {int(x): torch.where(code == i, SWITCH, -SWITCH) for i, x in enumerate(coords.tolist())}

    def _attention(self, attn) -> None:
        """q and k from the constant coordinate alone, on the RoPE pairs that make the previous position's score
        SCORE_GAP above any other; the output gate (Qwen3.5) fully open; v_proj and o_proj stay random."""
        cfg, hd, H, KVH = self.cfg, attn.head_dim, attn.num_heads, attn.num_kv_heads
        inv_freq = self.model.rotary.inv_freq.double().cpu()
        half = len(inv_freq)  # RoPE pairs (d, d + half) of the rotary dims
        pairs, worst = _previous_position_pairs(inv_freq, min(cfg.max_position_embeddings, 8192))
        gain = (SCORE_GAP / (hd**0.5 * worst)) ** 0.5
        W, c = attn.qkv_proj.weight, self.coords["c"][0].item()
        q_rows = H * hd * (2 if attn.output_gate else 1)
        stride = 2 * hd if attn.output_gate else hd
        q_idx = torch.tensor([h * stride + j for h in range(H) for j in range(pairs)])
        self._set_rows(W, q_idx.to(self.device), {c: 256.0})
        if attn.output_gate:
            gates = torch.tensor([h * stride + hd + d for h in range(H) for d in range(hd)])
            self._set_rows(W, gates.to(self.device), {c: 16.0})
        for j in range(pairs):
            theta = float(inv_freq[j])
            for which, value in ((j, math.cos(theta)), (j + half, math.sin(theta))):
                rows = torch.tensor([q_rows + h * hd + which for h in range(KVH)])
                self._set_rows(W, rows.to(self.device), {c: 256.0 * value})
        qw = torch.zeros(hd, device=self.device)
        qw[:pairs] = gain
        kw = qw.clone()
        kw[half:half + pairs] = gain
        for norm, w in ((attn.q_norm, qw), (attn.k_norm, kw)):
            norm.weight.copy_(w - 1 if norm.zero_centered else w)

    def _memory(self, gdn) -> None:
        """The associative memory: k (current input) and q (previous input, through the conv) switch on the key
        block of the token's kappa code, v on the value block of its gamma code; write strength 1, no decay; the
        output gate silu(z) open; the output norm's gain sets the output to about one code amplitude."""
        H, HV, K, V, W = gdn.H, gdn.HV, gdn.K, gdn.V, gdn.in_proj.weight
        kb, vb = K // self.codes.kappas, V // self.codes.gammas
        kap, nu, c = self.coords["kappa"], self.coords["nu"], self.coords["c"][0].item()
        start_z, _ = gdn.in_proj.shard_rows("in_proj_z")
        start_b, n_b = gdn.in_proj.shard_rows("in_proj_b")
        for base in (0, H * K):  # q, then k: each head's dims in kappa blocks
            rows = torch.arange(base, base + H * K, device=self.device)
            self._set_rows(W, rows, {x: v.repeat(H) for x, v in self._switches(kap, K, kb).items()})
        rows = torch.arange(2 * H * K, 2 * H * K + HV * V, device=self.device)
        self._set_rows(W, rows, {x: v.repeat(HV) for x, v in self._switches(nu, V, vb).items()})
        self._set_rows(W, torch.arange(start_z, start_z + HV * V, device=self.device), {c: 32.0})
        self._set_rows(W, torch.arange(start_b, start_b + n_b, device=self.device), {c: SWITCH})
        conv = torch.zeros_like(gdn.conv1d.weight)
        width = conv.shape[-1]
        conv[:H * K, 0, width - 2] = 1  # q: the previous input
        conv[H * K:, 0, width - 1] = 1  # k, v: the current input
        gdn.conv1d.weight.copy_(conv)
        gdn.A_log.fill_(-20.0)  # decay exp(-exp(-20) * softplus(...)): none
        gdn.norm.weight.fill_(1.0)
        gdn.norm.weight.fill_(self.amp / self._recall_outputs(gdn).norm(dim=1).mean().item())

    def _recall_outputs(self, gdn) -> torch.Tensor:
        """[gammas, hidden]: the memory layer's output when it recalls each gamma code."""
        HV, V, vb = gdn.HV, gdn.V, gdn.V // self.codes.gammas
        y = torch.zeros(self.codes.gammas, HV, V, device=self.device)
        for g in range(self.codes.gammas):
            y[g, :, g * vb:(g + 1) * vb] = (V / vb) ** 0.5 * torch.nn.functional.silu(torch.tensor(32.0))
        y = y * gdn.norm.weight.float()
        return y.reshape(self.codes.gammas, HV * V) @ gdn.out_proj.weight.float().T

    def _copy_outputs(self, name: str) -> torch.Tensor:
        """[codes, hidden]: the attention layer's output per unit of each copied code coordinate at its input."""
        attn = self.model.model.layers[self.attn_index].self_attn
        start, _ = attn.qkv_proj.shard_rows("v_proj")
        wv = attn.qkv_proj.weight[start:start + attn.num_kv_heads * attn.head_dim].float()
        v = wv[:, self.coords[name].to(self.device)].T  # [codes, KVH * hd]
        v = v.reshape(len(v), attn.num_kv_heads, 1, attn.head_dim)
        rep = v.expand(-1, -1, attn.num_heads // attn.num_kv_heads, -1).reshape(len(v), -1)
        return rep @ attn.o_proj.weight.float().T

    def _duals(self) -> dict[str, torch.Tensor]:
        """Readout vectors of the codes the last hidden state carries: the final state is a sum of known vectors
        (each code coordinate of the embedding, each attention copy, each memory recall, the copy of the constant
        coordinate) plus small rests; the rows of the pseudo-inverse of all of them read each one with no crosstalk
        from the others."""
        D = self.cfg.hidden_size
        known = {f"coord.{name}": torch.eye(D, device=self.device)[idx.to(self.device)]
                 for name, idx in self.coords.items()}
        known["copy.c"] = self._copy_outputs("c")
        known["copy.beta"] = self._copy_outputs("beta")
        if self.copy_gamma:
            known["copy.nu"] = self._copy_outputs("nu")
        if self.memory:
            known["recall"] = self._recall_outputs(self.model.model.layers[self.gdn_index].linear_attn)
        Z = torch.cat(list(known.values())).double()
        if Z.shape[0] > D:
            raise ValueError(f"a margin target's {Z.shape[0]} code vectors do not fit in {D} hidden dimensions")
        R = torch.linalg.pinv(Z).T.float()  # [known, D]: R @ Z.T = identity
        out, at = {}, 0
        for name, vecs in known.items():
            out[name] = R[at:at + len(vecs)]
            at += len(vecs)
        dirs = {"c": out["coord.c"], "alpha": out["coord.alpha"], "beta": out["copy.beta"]}
        if self.memory or self.copy_gamma:
            dirs["gamma"] = out["recall" if self.memory else "copy.nu"]
        return dirs

    def readout(self, margin: float) -> None:
        """The LM head: each reading row sums the readout vectors of its codes, each scaled so that a carried code
        adds `margin` logits, minus `margin` x (codes / 2) read off the constant coordinate, which centres the
        logits (the winner at + codes/2, rows reading nothing at - codes/2)."""
        codes, D = self.codes, self.cfg.hidden_size
        dirs = self._duals()
        heard = self._carried(dirs)
        names = [n for n in ("alpha", "beta", "gamma") if n in dirs]
        head = self.model.lm_head.weight
        gen = torch.Generator(device=self.device).manual_seed(11)
        for lo in range(0, head.shape[0], 16384):
            reads = codes.reads[lo:lo + 16384].to(self.device)
            rows = torch.randn(len(reads), D, device=self.device, generator=gen) * HEAD_NOISE
            live = reads[:, 0] >= 0
            for i, name in enumerate(names):
                rows[live] += margin / heard[name] * dirs[name][reads[live, i]]
            rows -= len(names) * margin / 2 / heard["c"] * dirs["c"][0]
            head[lo:lo + len(reads)] = rows.to(head.dtype)

    def _carried(self, dirs: dict[str, torch.Tensor]) -> dict[str, float]:
        """How strongly the final hidden state carries each code along its readout vector: medians over a prefill
        of random tokens (positions after the first; for the memory, positions whose two keys differ)."""
        from specpilot.runtime.runner import ModelRunner
        from specpilot.layers.metadata import BatchMetadata

        codes, T = self.codes, 96
        gen = torch.Generator().manual_seed(5)
        ids = torch.randint(0, len(codes.alpha), (T,), generator=gen)
        runner = ModelRunner(self.model)
        runner.allocate(1, T + 1)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        # GDN layers in the torch chunk form: the built weights do not depend on the triton_gdn_prefill switch
        paths = dataclasses.replace(runner.runtime.prefill, gdn_prefill_kernel=False)
        h = runner.forward(BatchMetadata.contiguous(ids[None].to(self.device), zero, zero, 0, paths))[0, 1:].float()
        runner.cache = None
        cur, prev = ids[1:], ids[:-1]
        seen = {"c": torch.zeros_like(cur), "alpha": codes.alpha[cur], "beta": codes.beta[prev],
                "gamma": codes.gamma[prev]}
        ok = codes.kappa[cur] != codes.kappa[prev] if self.memory else torch.ones(len(cur), dtype=torch.bool)
        heard = {}
        for name, d in dirs.items():
            proj = (h * d[seen[name].to(self.device)]).sum(1)
            heard[name] = proj[ok.to(self.device) if name == "gamma" else slice(None)].median().item()
        weak = {k: v for k, v in heard.items() if not v > 0.05}
        if weak:
            raise RuntimeError(f"margin circuit: codes not carried to the last layer: {weak}")
        return heard


def _previous_position_pairs(inv_freq: torch.Tensor, context: int) -> tuple[int, float]:
    """How many of the fastest RoPE pairs to use so that the score at relative position 1 leads every other
    relative position in [0, context) by the most: (pairs, that lead per unit score, mean over pairs of 1 - cos)."""
    delta = torch.arange(context, dtype=torch.float64)
    delta = delta[delta != 1] - 1
    best = (1, 0.0)
    for pairs in range(1, len(inv_freq) + 1):
        lead = (1 - torch.cos(inv_freq[None, :pairs] * delta[:, None])).mean(1).min().item()
        if lead > best[1]:
            best = (pairs, lead)
    return best


# ------------------------------------------------------------------------------ published drafter shapes
# The drafters users bring for a Qwen3.5 / Qwen3.8-27B target, in their published shapes (random weights: timing
# only). DFlash2: z-lab/Qwen3.8-27B-DFlash2 as described publicly (5 layers, 32 / 8 heads of 128, block 8, 2 taps,
# groups of 16, selector rank 256, top 16; the MLP width is the target's, as z-lab's drafters take it). DSpark:
# DeepSpec's Qwen3 recipe (5 layers, block 7, Markov rank 256, confidence head on [h ; W1 x]) at the DFlash2
# drafter's widths: no 27B DSpark's config is public beyond a community checkpoint; its own embedding and LM head
# (DeepSpec saves copies of the target's) are shared with the target here, which reads the same bytes. MTP: the
# target's own layer (models/mtp.py), exact by construction. The tiny shapes are for CPU smoke runs.
DRAFTER_SHAPES = {
    "Qwen3.5-27B": {"layers": 5, "heads": 32, "kv_heads": 8, "head_dim": 128, "dflash2_block": 8, "dspark_block": 7,
                    "taps": 2, "group": 16, "rank": 256, "top_k": 16, "markov_rank": 256},
    "tiny-dense": {"layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "dflash2_block": 6, "dspark_block": 5,
                   "taps": 2, "group": 16, "rank": 8, "top_k": 4, "markov_rank": 8},
    "tiny-hybrid": {"layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "dflash2_block": 6, "dspark_block": 5,
                    "taps": 2, "group": 16, "rank": 8, "top_k": 4, "markov_rank": 8},
}


def _drafter_shape(shape: str) -> dict:
    if shape not in DRAFTER_SHAPES:
        raise ValueError(f"no published drafter shapes for {shape!r}; use one of {', '.join(DRAFTER_SHAPES)}")
    return DRAFTER_SHAPES[shape]


def _block_config(target, shape: str):
    """The DFlash-family backbone config of the shape: Qwen3 layers with the drafter's own head counts."""
    from specpilot.train.dflash import draft_config

    s = _drafter_shape(shape)
    return dataclasses.replace(draft_config(target.config, s["layers"]), num_attention_heads=s["heads"],
                               num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"])


def _taps(target, count: int = 5) -> tuple[int, ...]:
    """`count` target layers (the published drafters read 5): the reference spread, or on a target cut too shallow
    for it, its layers in turn (the features' width, and so the drafter's shape, stays the published one)."""
    from specpilot.models.dflash import default_target_layers

    depth = target.config.num_hidden_layers
    return default_target_layers(depth, count) if depth >= count + 3 else tuple(i % depth for i in range(count))


def _randomize(model, target, seed: int, zero_centred: bool = False):
    """On the target's device and dtype: N(0, 0.02) matrices, identity norms (1, or 0 for zero-centred ones)."""
    param = next(target.parameters())
    model = model.to(dtype=param.dtype).to_empty(device=param.device)
    gen = torch.Generator(device=param.device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.0 if zero_centred else 1.0) if p.ndim == 1 else p.normal_(0, 0.02, generator=gen)
    return model


def random_dflash2(target, shape: str, seed: int = 2, runtime=None):
    """A DFlash2 drafter in the shape's published layout with random weights (timing under synthetic acceptance)."""
    from specpilot.models.dflash2 import DFlash2Model, DFlash2Options
    from specpilot.spec_decode.drafters.dflash2 import DFlash2Drafter

    s, taps = _drafter_shape(shape), _taps(target)
    opts = DFlash2Options(s["dflash2_block"], 0, taps, s["taps"], s["group"], s["rank"], s["top_k"])
    with torch.device("meta"):
        model = DFlash2Model(_block_config(target, shape), len(taps), opts)
    model = _randomize(model, target, seed)
    model.reset_buffers()
    with torch.no_grad():  # the base kernels pass the input through (tap 0 = 1), as a trained drafter's are near
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.zero_()[:, 0] = 1.0
    return DFlash2Drafter(model.eval().requires_grad_(False), target, taps, runtime=runtime)


def random_dspark(target, shape: str, seed: int = 3, runtime=None):
    """A DSpark drafter (Markov and confidence heads, the target's embedding and LM head) with random weights."""
    from specpilot.models.dspark import DSparkModel, DSparkOptions
    from specpilot.spec_decode.drafters.dspark import DSparkDrafter

    s, taps = _drafter_shape(shape), _taps(target)
    opts = DSparkOptions(s["dspark_block"], 0, taps, s["markov_rank"], True, True, False, False)
    with torch.device("meta"):
        model = DSparkModel(_block_config(target, shape), opts)
    model = _randomize(model, target, seed)
    model.reset_buffers()
    return DSparkDrafter(model.eval().requires_grad_(False), target, runtime=runtime)


def random_mtp(target, seed: int = 4, runtime=None, vocab=None, head_format: str = "bf16"):
    """The target's MTP layer (a Qwen3.5 target) with random weights; runtime as MTPDrafter takes it; vocab: a
    DraftVocab it drafts over (None: the target's whole vocabulary); head_format: "bf16" or "fp8" (MTPDrafter's)."""
    from specpilot.models.mtp import MTPModel, head_config
    from specpilot.spec_decode.drafters.mtp import MTPDrafter

    with torch.device("meta"):
        model = MTPModel(head_config(target.config))
    model = _randomize(model, target, seed, zero_centred=True)
    model.rotary.reset_buffers()
    return MTPDrafter(model.eval().requires_grad_(False), target, runtime, vocab=vocab, head_format=head_format)


# `--drafter` names of the random drafters above, for benchmarks on random:SHAPE targets: name -> (target, shape,
# runtime) -> Drafter
RANDOM_DRAFTERS = {
    "random-dflash": lambda target, shape, runtime: random_dflash(target, shape, runtime=runtime),
    "random-dflash2": lambda target, shape, runtime: random_dflash2(target, shape, runtime=runtime),
    "random-dspark": lambda target, shape, runtime: random_dspark(target, shape, runtime=runtime),
    "random-mtp": lambda target, shape, runtime: random_mtp(target, runtime=runtime),
}


def random_drafter(name: str):
    """The maker (target, shape, runtime) -> Drafter of a random drafter's `--drafter` name, None for any other
    name: RANDOM_DRAFTERS, and `random-mtp:N`, the MTP layer over a draft vocabulary of the first N ids; either MTP
    form with the `+fp8` suffix takes an FP8 copy of the head rows."""
    from specpilot.spec_decode.drafters.registry import split_head_format

    if name in RANDOM_DRAFTERS:
        return RANDOM_DRAFTERS[name]
    base, head_format = split_head_format(name)
    if base == "random-mtp":
        return lambda target, shape, runtime: random_mtp(target, runtime=runtime, head_format=head_format)
    if base.startswith("random-mtp:"):
        from specpilot.spec_decode.drafters.draft_vocab import DraftVocab

        n = base[len("random-mtp:"):]
        if not n.isdigit():
            raise ValueError(f"--drafter {name}: give random-mtp:N, N the number of token ids it drafts over")
        vocab = DraftVocab.first(int(n), f"--drafter {name}")
        return lambda target, shape, runtime: random_mtp(target, runtime=runtime, vocab=vocab, head_format=head_format)
    return None
