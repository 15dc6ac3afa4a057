"""The cost model of a speculative step: each component's time against its ceiling, and the tok/s a configuration
is predicted to reach from its acceptance statistics.

A step verifies, for B requests (padded to the engine's batch bucket), one row of `width` tokens each (the tree's
nodes, padded as the verify graph pads them) after `context` committed tokens. What bounds each component (the
device's Ceilings, ceilings.py; "roofline" = max(bytes / bandwidth, FLOPs / peak)):

- verify.weights: every decoder-layer parameter once (W12N planes where products of <= 16 rows take them) and an
  embedding row per token; 2 FLOPs per parameter per token;
- verify.lm_head: the LM head once; 2 FLOPs per parameter per token;
- verify.attention: each request's committed K/V read, the block's K/V written; 4 * heads * head_dim FLOPs per
  visible position per token per layer;
- verify.recurrent: each request's recurrent state read; 6 FLOPs per state element per token per layer;
- verify.launch: KERNELS_PER_LAYER kernels per layer, + 4, at the per-kernel floor;
- draft: the drafter's weights (and the target's LM head, for drafters that draft through it) and its own K/V of
  each request's context; 2 FLOPs per parameter per drafted position; KERNELS_PER_LAYER kernels per drafter layer;
- accept: one round trip (sync_s);
- commit: on hybrid trees each request's state read and written (the fold), the kept K/V read and written; 3 kernels;
- other, host_gap: host work (emit; schedule and budget between steps): no device ceiling (0);
- prefill: weights once, the prompt's K/V written; 2 FLOPs per parameter per token, attention quadratic.

Prediction at a step: each component's ceiling there times its efficiency (measured / ceiling) at the calibration's
points, interpolated in batch size (Calibration, calibration.py); verify from the calibration's measured verify curve
(engine/cost_curve.py), carried to another weight format by the ratio of the two formats' ceilings, times the
engine's verify over the curve's at the points (interpolated in batch size); other and
host_gap as measured seconds interpolated in batch size. Without calibration points each component is predicted at
its ceiling. Tok/s = B * E[tokens per request per step] / predicted step seconds; E from per-depth acceptance with
sibling decay, and under a two-state variation (bench/variation.py) the mixture of the easy and hard states' tables
at the run's share of easy steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from specpilot.bench.synthetic import AcceptanceProfile, shape
from specpilot.bench.variation import VariationModel
from specpilot.spec_decode.tree import DraftTree, TreeSpec

# kernels a decoder layer launches in a verify forward (norms, projections, rope/store, attention or the delta rule,
# gates, MLP): an estimate used only for the launch floor, which is a small part of any ceiling but batch 1's
KERNELS_PER_LAYER = 10
COMMIT_KERNELS = 3
W12N_MAX_ROWS = 16  # products of up to this many rows run the W12N GEMV (ops/w12n_gemv); larger ones read bf16
W12N_BITS = 12.05  # bits per weight of a W12N plane set where no planes are attached to measure (docs: ~12.05)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # the engine's verify graph buckets
VERIFY_PARTS = ("weights", "lm_head", "attention", "recurrent", "launch")
COMPONENTS = ("draft", "verify", "accept", "commit", "other", "host_gap")
SECONDS_ONLY = ("other", "host_gap")  # no device ceiling: predicted from measured seconds


# ----------------------------------------------------------------------------------------------- what a model moves
@dataclass(frozen=True)
class ModelShape:
    """What a forward of a target moves and computes, read from its parameters and config."""

    layer_bytes: float  # decoder layers and final norm, in the model's dtype
    layer_params: float
    w12n_layer_bytes: float  # the same parameters with every W12N-encodable linear as W12N planes
    head_bytes: float
    head_params: float
    w12n_head_bytes: float
    embed_row_bytes: float  # one embedding row (read per token)
    kv_bytes_per_token: float  # K + V of one token over all attention layers
    attention_layers: int
    q_heads: int
    head_dim: int
    state_bytes: float  # one request's recurrent state over all linear-attention layers (conv windows + fp32 state)
    linear_layers: int
    state_elems: float  # delta-rule state elements per linear-attention layer (HV * K * V)
    layers: int

    @property
    def hybrid(self) -> bool:
        return self.linear_layers > 0

    @staticmethod
    def from_model(model: torch.nn.Module) -> ModelShape:
        """From a CausalLM: parameters split into the LM head, the embedding and the rest; W12N bytes from the
        planes attached (ModelRunner with weight_format w12n), else at W12N_BITS for every bf16 Linear without a
        bias that is not tied to the embedding (what layers/linear.attach_w12n encodes)."""
        from specpilot.layers.linear import Linear

        cfg = model.config
        emb = model.model.embed_tokens.weight
        head = model.lm_head
        tied = head.weight is not None and head.weight is emb
        head_w = head.weight if head.weight is not None else None
        seen = {id(emb)} | ({id(head_w)} if head_w is not None else set())
        layer_bytes = layer_params = 0.0
        for p in model.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            layer_bytes += p.numel() * p.element_size()
            layer_params += p.numel()
        elt = emb.element_size()
        # planes attached: exactly the encoded layers read them (attach_w12n skips what does not pay)
        estimate = not any(getattr(m, "w12n", None) is not None for m in model.modules())
        w12n_saved = 0.0
        for m in model.modules():
            if not isinstance(m, Linear) or m is head:
                continue
            if m.weight is None:  # weight_format w12n_only: only the planes remain; count the bf16 they stand for
                layer_bytes += 2.0 * m.in_features * m.out_features
                layer_params += float(m.in_features * m.out_features)
            w12n_saved += _w12n_saving(m, estimate)
        head_params = float(head.out_features * head.in_features)
        head_bytes = head_params * elt
        w12n_head = head_bytes if tied else head_bytes - _w12n_saving(head, estimate)
        kv = 2 * cfg.num_key_value_heads * cfg.head_dim * elt * cfg.num_attention_layers
        state = elems = 0.0
        if cfg.num_linear_layers:
            elems = float(cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim)
            conv = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                    + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * (cfg.linear_conv_kernel_dim - 1) * elt
            state = cfg.num_linear_layers * (elems * 4 + conv)
        return ModelShape(layer_bytes, layer_params, layer_bytes - w12n_saved, head_bytes, head_params, w12n_head,
                          float(emb.shape[1] * elt), float(kv), cfg.num_attention_layers, cfg.num_attention_heads,
                          cfg.head_dim, float(state), cfg.num_linear_layers, elems, cfg.num_hidden_layers)


def _w12n_saving(m, estimate: bool = True) -> float:
    """bf16 bytes minus W12N bytes of one Linear: its attached planes; without planes, W12N_BITS per weight if
    `estimate` (no planes attached anywhere) and it would be encoded, else 0."""
    planes = getattr(m, "w12n", None)
    if planes is not None:
        from specpilot.weights.w12n import bits_per_weight

        return planes.n * planes.k * (16 - bits_per_weight(planes)) / 8
    w = m.weight
    if not estimate or w is None or w.dtype != torch.bfloat16 or m.bias is not None or w.ndim != 2:
        return 0.0
    return w.numel() * (16 - W12N_BITS) / 8


@dataclass(frozen=True)
class DrafterShape:
    """What one proposal of a drafter moves and computes."""

    weight_bytes: float  # its own parameters, plus the target's LM head when it drafts through it
    params: float  # parameters applied per drafted token (its own and the head's)
    tokens: int  # positions it computes per request per proposal (a block drafter's block)
    layers: int
    kv_bytes_per_token: float = 0.0  # its own K/V per token of a request's context (read every proposal)

    @staticmethod
    def from_drafter(drafter, target_shape: ModelShape, depth: int) -> DrafterShape | None:
        """From a drafter (a SyntheticDrafter's inner one): its torch module's parameters; a drafter that holds its
        target (DFlash and its kin) also reads the target's LM head. None for a drafter without a network (n-gram)."""
        inner = getattr(drafter, "inner", drafter)
        net = getattr(inner, "model", None)
        if not isinstance(net, torch.nn.Module):
            return None
        params = {id(p): p for p in net.parameters()}.values()
        nbytes = float(sum(p.numel() * p.element_size() for p in params))
        count = float(sum(p.numel() for p in params))
        if getattr(inner, "target", None) is not None:
            nbytes += target_shape.head_bytes
            count += target_shape.head_params
        tokens = int(getattr(inner, "block_size", None) or depth + 1)
        layers = len(getattr(net, "layers", ())) or 1
        cfg = getattr(net, "config", None)
        kv = 0.0
        if cfg is not None and hasattr(cfg, "num_attention_layers"):
            elt = next(iter(params)).element_size()
            kv = 2.0 * cfg.num_key_value_heads * cfg.head_dim * elt * cfg.num_attention_layers
        return DrafterShape(nbytes, count, tokens, layers, kv)


# -------------------------------------------------------------------------------------------- one step's shape
@dataclass(frozen=True)
class Step:
    batch: int  # decoding requests
    width: int  # verify tokens per request (the tree's nodes, root included, as padded)
    context: float  # mean committed tokens per request
    accepted: float = 0.0  # mean accepted drafts per request (commit's K/V moves)
    weight_format: str = "bf16"
    tree_commit: bool = True  # hybrid targets fold the kept path (chains too, hybrid_chain_commit="fold")

    def __post_init__(self):
        if self.batch < 1 or self.width < 1 or self.context < 0:
            raise ValueError(f"Step(batch={self.batch}, width={self.width}, context={self.context}): batch and "
                             f"width must be >= 1, context >= 0")

    @property
    def bucket(self) -> int:
        """The batch as the verify graph pads it."""
        return next((b for b in BATCH_BUCKETS if b >= self.batch), self.batch)

    @property
    def tokens(self) -> int:
        return self.bucket * self.width

    def to_dict(self) -> dict:
        return {"batch": self.batch, "width": self.width, "context": self.context, "accepted": self.accepted,
                "weight_format": self.weight_format, "tree_commit": self.tree_commit}

    @staticmethod
    def from_dict(raw: dict) -> Step:
        return Step(int(raw["batch"]), int(raw["width"]), float(raw["context"]), float(raw.get("accepted", 0.0)),
                    str(raw.get("weight_format", "bf16")), bool(raw.get("tree_commit", True)))


def verify_width(nodes: int, full: int, graphs: bool = True) -> int:
    """Verify tokens per row when the largest tree of the step has `nodes` nodes (root included) and the spec's
    full tree `full`: under verify graphs a power of two, at most the full tree (engine._host_block), else the
    nodes."""
    return min(1 << (nodes - 1).bit_length(), full) if graphs else nodes


@dataclass(frozen=True)
class Part:
    """One component's ceiling: its bytes, FLOPs and kernels, and the seconds they take at best."""

    name: str
    bytes: float
    flops: float
    kernels: float
    seconds: float

    def to_dict(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "flops": self.flops, "kernels": self.kernels,
                "ceiling_s": self.seconds}


def _part(name: str, nbytes: float, flops: float, kernels: float, ceilings, floor: float = 0.0) -> Part:
    return Part(name, nbytes, flops, kernels, ceilings.roofline(nbytes, flops) + kernels * ceilings.kernel_s + floor)


# -------------------------------------------------------------------------------------------- calibration points
@dataclass(frozen=True)
class Measured:
    """Component seconds measured at one step shape (a calibration point)."""

    step: Step
    seconds: tuple[tuple[str, float], ...]  # component -> median seconds

    def get(self, component: str) -> float | None:
        return dict(self.seconds).get(component)

    def to_dict(self) -> dict:
        return {"step": self.step.to_dict(), "seconds": dict(self.seconds)}

    @staticmethod
    def from_dict(raw: dict) -> Measured:
        return Measured(Step.from_dict(raw["step"]), tuple((str(k), float(v)) for k, v in raw["seconds"].items()))


# ---------------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class CostModel:
    shape: ModelShape
    ceilings: object  # ceilings.Ceilings
    drafter: DrafterShape | None = None
    points: tuple[Measured, ...] = ()  # calibration points (any batch sizes)
    verify_curve: object | None = None  # engine.cost_curve.VerifyCostCurve measured in `curve_format`
    curve_format: str = "bf16"

    # ---- ceilings
    def verify_parts(self, step: Step) -> dict[str, Part]:
        s, c, n, B = self.shape, self.ceilings, step.tokens, step.bucket
        w12n = step.weight_format in ("w12n", "w12n_only") and n <= W12N_MAX_ROWS
        if step.weight_format == "w12n_only":
            w12n = True  # every product reads the planes
        layer_bytes = s.w12n_layer_bytes if w12n else s.layer_bytes
        head_bytes = s.w12n_head_bytes if w12n else s.head_bytes
        visible = step.context + step.width
        attn_flops = 4.0 * s.attention_layers * s.q_heads * s.head_dim * n * visible
        return {
            "weights": _part("verify.weights", layer_bytes + n * s.embed_row_bytes, 2.0 * s.layer_params * n, 0, c),
            "lm_head": _part("verify.lm_head", head_bytes, 2.0 * s.head_params * n, 0, c),
            "attention": _part("verify.attention", s.kv_bytes_per_token * (B * step.context + n), attn_flops, 0, c),
            "recurrent": _part("verify.recurrent", B * s.state_bytes, 6.0 * s.linear_layers * s.state_elems * n, 0, c),
            "launch": Part("verify.launch", 0.0, 0.0, KERNELS_PER_LAYER * s.layers + 4,
                           (KERNELS_PER_LAYER * s.layers + 4) * c.kernel_s),
        }

    def parts(self, step: Step) -> dict[str, Part]:
        """Every component's ceiling at the step (verify as the sum of its parts)."""
        c, s = self.ceilings, self.shape
        verify = self.verify_parts(step)
        out = {"verify": Part("verify", sum(p.bytes for p in verify.values()), sum(p.flops for p in verify.values()),
                              sum(p.kernels for p in verify.values()), sum(p.seconds for p in verify.values()))}
        if self.drafter is not None:
            d = self.drafter
            out["draft"] = _part("draft", d.weight_bytes + step.batch * step.context * d.kv_bytes_per_token,
                                 2.0 * d.params * step.batch * d.tokens, KERNELS_PER_LAYER * d.layers, c)
        else:
            out["draft"] = Part("draft", 0.0, 0.0, 0.0, 0.0)
        out["accept"] = Part("accept", 0.0, 0.0, 0.0, c.sync_s)
        fold = 2.0 * step.batch * s.state_bytes if (s.hybrid and step.tree_commit) else 0.0
        moved = 2.0 * step.batch * step.accepted * s.kv_bytes_per_token
        out["commit"] = _part("commit", fold + moved, 0.0, COMMIT_KERNELS, c)
        for name in SECONDS_ONLY:
            out[name] = Part(name, 0.0, 0.0, 0.0, 0.0)
        return out

    def prefill_part(self, tokens: int, context: float = 0.0) -> Part:
        """A chunk of `tokens` prompt tokens after `context` ones (its LM head over the last token only)."""
        s, c = self.shape, self.ceilings
        nbytes = s.layer_bytes + s.head_bytes + tokens * (s.embed_row_bytes + s.kv_bytes_per_token) \
            + context * s.kv_bytes_per_token + s.state_bytes
        attn = 4.0 * s.attention_layers * s.q_heads * s.head_dim * tokens * (context + (tokens + 1) / 2)
        flops = 2.0 * s.layer_params * tokens + 2.0 * s.head_params + attn \
            + 6.0 * s.linear_layers * s.state_elems * tokens
        return _part("prefill", nbytes, flops, KERNELS_PER_LAYER * s.layers + 4, c)

    # ---- predictions
    def component_seconds(self, step: Step) -> dict[str, float]:
        """Predicted seconds of every component at the step (see the module docstring)."""
        parts = self.parts(step)
        out = {}
        for name in COMPONENTS:
            if name == "verify":
                out[name] = self._verify_seconds(step, parts["verify"].seconds)
            elif name == "draft" and self.drafter is None:
                out[name] = self._interp_seconds(name, step.batch) or 0.0
            elif name in SECONDS_ONLY:
                out[name] = self._interp_seconds(name, step.batch) or 0.0
            else:
                out[name] = parts[name].seconds * self._efficiency(name, step.batch)
        return out

    def _verify_seconds(self, step: Step, ceiling: float) -> float:
        if self.verify_curve is None:
            return ceiling * self._efficiency("verify", step.batch)
        # the engine's verify over the curve's (its host-side preparation, the feature outputs) at the points
        pts = [(m.step.batch, m.get("verify") / self._from_curve(m.step, self.parts(m.step)["verify"].seconds))
               for m in self.points if m.get("verify")]
        return self._from_curve(step, ceiling) * (_interp(pts, step.batch) if pts else 1.0)

    def _from_curve(self, step: Step, ceiling: float) -> float:
        """The measured curve at the step, carried to its weight format by the ratio of the two formats' ceilings."""
        at = replace(step, weight_format=self.curve_format)
        measured = float(self.verify_curve.seconds(at.tokens, at.bucket, at.context))
        return measured * ceiling / self.parts(at)["verify"].seconds

    def efficiency(self, component: str, batch: int) -> float:
        """Measured over ceiling for the component at this batch size (interpolated; 1 without points)."""
        return self._efficiency(component, batch)

    def _efficiency(self, component: str, batch: int) -> float:
        pts = []
        for m in self.points:
            got = m.get(component)
            ceiling = self.parts(m.step)[component].seconds
            if got is not None and ceiling > 0:
                pts.append((m.step.batch, got / ceiling))
        return _interp(pts, batch) if pts else 1.0

    def _interp_seconds(self, component: str, batch: int) -> float | None:
        pts = [(m.step.batch, m.get(component)) for m in self.points if m.get(component) is not None]
        return _interp(pts, batch) if pts else None

    def predict(self, config: Configuration) -> Prediction:
        tree = config.tree()
        tau, tau_std = config.acceptance.tokens_per_step(tree)
        step = config.step(tau - 1.0)
        comps = self.component_seconds(step)
        seconds = sum(comps.values())
        return Prediction(config, step, comps, seconds, tau, tau_std, config.batch * tau / seconds)


def _interp(points: list[tuple[int, float]], x: float) -> float:
    """Piecewise linear through (x, y) points (averaged where an x repeats), flat outside them."""
    by_x: dict[int, list[float]] = {}
    for px, py in points:
        by_x.setdefault(px, []).append(py)
    xs = sorted(by_x)
    ys = [sum(by_x[k]) / len(by_x[k]) for k in xs]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


# ------------------------------------------------------------------------------------------------- acceptance
@dataclass(frozen=True)
class AcceptanceStats:
    """Per-depth acceptance (p_d: the draft at depth d accepted given its parent was; a sibling of rank r at
    p_d * sibling_decay**r given the earlier ranks missed), optionally with its two-state variation."""

    per_depth: tuple[float, ...]
    sibling_decay: float = 0.5
    variation: VariationModel | None = None

    def __post_init__(self):
        if not self.per_depth or not all(0.0 <= p <= 1.0 for p in self.per_depth):
            raise ValueError(f"acceptance per_depth={self.per_depth}: needs at least one probability in [0, 1]")

    @staticmethod
    def from_profile(profile: AcceptanceProfile) -> AcceptanceStats:
        return AcceptanceStats(tuple(profile.per_depth), profile.sibling_decay, profile.variation)

    @staticmethod
    def from_counts(drafted: list[int], accepted: list[int], rows: int, sibling_decay: float = 0.5,
                    variation: VariationModel | None = None,
                    children: tuple[int, ...] | None = None) -> AcceptanceStats:
        """From a run's per-depth counts (SpecStats.drafted_per_depth / accepted_per_depth summed over requests) over
        `rows` request-steps. The parents able to grow depth d: the rows at depth 1, the drafts accepted at d - 1
        below it (at most the drafted nodes there); the rate at which one of their children is accepted, with
        children[d - 1] children each (a static tree's branching; 1: a chain), is 1 - prod_r (1 - p sd**r), solved
        for p. Depths not reached end the table."""
        per_depth, parents = [], rows
        for d, (n, a) in enumerate(zip(drafted, accepted)):
            k = children[d] if children and d < len(children) else 1
            reached = min(parents, n / k)
            if reached <= 0:
                break
            per_depth.append(_solve_rank0(min(1.0, a / reached), k, sibling_decay))
            parents = a
        return AcceptanceStats(tuple(per_depth) or (0.0,), sibling_decay, variation)

    def tables(self) -> list[tuple[float, tuple[float, ...]]]:
        """(share of steps, per-depth table) per state: one state without variation."""
        if self.variation is None:
            return [(1.0, self.per_depth)]
        easy, hard = self.variation.tables(self.per_depth)
        e1, h1, p1 = easy[0], hard[0], self.per_depth[0]
        share = (p1 - h1) / (e1 - h1) if abs(e1 - h1) > 1e-12 else self.variation.mix_mean
        share = min(max(share, 0.0), 1.0)
        return [(share, easy), (1.0 - share, hard)]

    def tokens_per_step(self, tree: DraftTree) -> tuple[float, float]:
        """(mean, standard deviation) of the tokens one request emits per step with this tree (bonus included)."""
        mean = second = 0.0
        for share, table in self.tables():
            reach = _reach(tree, table, self.sibling_decay)
            at_least = {}
            for node, r in enumerate(reach):
                if node:
                    d = tree.depths[node]
                    at_least[d] = at_least.get(d, 0.0) + r  # at most one node per depth is on the accepted path
            m = 1.0 + sum(at_least.values())
            # E[L^2] for L = 1 + accepted depth: sum over d of (2d + 1) P(depth >= d), plus 1
            s2 = 1.0 + sum((2 * d + 1) * p for d, p in at_least.items())
            mean += share * m
            second += share * s2
        return mean, math.sqrt(max(second - mean * mean, 0.0))


def _solve_rank0(rate: float, children: int, decay: float) -> float:
    """The rank-0 acceptance p whose `children` siblings (rank r at p * decay**r) accept one of them at `rate`."""
    if children <= 1:
        return rate
    def any_rate(p: float) -> float:
        miss = 1.0
        for r in range(children):
            miss *= 1.0 - p * decay ** r
        return 1.0 - miss

    lo, hi = 0.0, 1.0
    if any_rate(hi) <= rate:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if any_rate(mid) < rate else (lo, mid)
    return (lo + hi) / 2


def _reach(tree: DraftTree, table: tuple[float, ...], decay: float) -> list[float]:
    """Per node, the chance that it is accepted (with its whole path)."""
    reach, depths = [1.0] * tree.num_nodes, tree.depths
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        rank = tree.children(parent).index(node)
        p = table[min(depths[node], len(table)) - 1]
        m = p * decay ** rank
        for earlier in range(rank):
            m *= 1.0 - p * decay ** earlier
        reach[node] = reach[parent] * m
    return reach


# ------------------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class Configuration:
    """What a prediction is for: batch size, tree spec (every request its full tree), mean context, weight format,
    and the acceptance the drafter reaches."""

    batch: int
    tree_spec: str
    context: float
    acceptance: AcceptanceStats
    weight_format: str = "bf16"
    graphs: bool = True  # verify CUDA graphs (the width padded to a power of two)
    label: str = field(default="", compare=False)

    def __post_init__(self):
        if self.batch < 1:
            raise ValueError(f"batch {self.batch}: must be >= 1")
        TreeSpec.parse(self.tree_spec)

    def tree(self) -> DraftTree:
        profile = AcceptanceProfile("pilot", self.acceptance.per_depth, self.acceptance.sibling_decay)
        return shape(TreeSpec.parse(self.tree_spec), 0, profile)

    def step(self, accepted: float) -> Step:
        nodes = self.tree().num_nodes  # every request verifies its full tree
        return Step(self.batch, verify_width(nodes, nodes, self.graphs), self.context, accepted, self.weight_format)


@dataclass(frozen=True)
class Prediction:
    config: Configuration
    step: Step
    components: dict[str, float]  # predicted seconds per component
    step_seconds: float
    tau: float  # expected tokens per request per step
    tau_std: float
    tok_s: float

    def to_dict(self) -> dict:
        return {"batch": self.config.batch, "tree": self.config.tree_spec, "weight_format": self.config.weight_format,
                "context": self.config.context, "width": self.step.width, "tau": self.tau, "tau_std": self.tau_std,
                "step_ms": self.step_seconds * 1e3,
                "components_ms": {k: v * 1e3 for k, v in self.components.items()}, "tok_s": self.tok_s}
