"""Acceptance that varies like real traffic: a two-state (easy/hard) Markov chain per request, its simulation,
the statistics of accepted-count traces and the model's fit to such traces.

Each request draws its own mix (its stationary share of easy steps) from Beta(mix_a, mix_b) and starts in a state
drawn from that mix; after every step, with probability `redraw`, its state is drawn afresh from the mix (so the
state's autocorrelation at lag k is (1 - redraw)**k). In a state, per-depth acceptance is the profile's shifted in
logit space: easy by +contrast/2, hard by -contrast/2, around a per-depth centre solved so that the pooled per-depth
acceptance of a run (over all its steps, steps that reached depth d - 1 and went on to d; what a run's per-depth
stats, the zoo's profiles and a published tau measure) is the profile's per_depth. A run's requests each emit about
the same number of tokens, so a hard request takes more steps: the run's share of easy steps is the requests' mixes
weighted by their steps (1 / their tau), below the Beta's mean, and the tables are solved at that share. A chain's
pooled tau is then the profile's (the published figure), whatever the variation.

A trace is one request's accepted drafts per step of a chain of `depth` drafts. The fit matches simulated traces'
moments (the per-request tau spread, the within-request autocorrelation and its decay, the pool's) to measured ones.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import asdict, dataclass, fields

import numpy as np

Tables = tuple[tuple[float, ...], tuple[float, ...]]  # per-depth acceptance of the (easy, hard) state
MIX_NODES = 32  # a request's mix integrated over this many equal-width bins of the Beta
LAGS = (1, 2, 4, 8)  # the within-request autocorrelations trace_stats reports


@dataclass(frozen=True)
class VariationModel:
    mix_a: float  # Beta(mix_a, mix_b): a request's stationary share of easy steps
    mix_b: float
    redraw: float  # per step, the chance that the state is drawn afresh from the request's mix
    contrast: float  # logit gap between the easy and the hard state's per-depth acceptance

    def __post_init__(self):
        if not (self.mix_a > 0 and self.mix_b > 0 and 0 <= self.redraw <= 1 and self.contrast >= 0):
            raise ValueError(f"variation {self}: needs mix_a > 0, mix_b > 0, 0 <= redraw <= 1, contrast >= 0")

    @property
    def mix_mean(self) -> float:
        return self.mix_a / (self.mix_a + self.mix_b)

    def tables(self, per_depth: tuple[float, ...]) -> Tables:
        return state_tables(tuple(per_depth), self.mix_a, self.mix_b, self.contrast)

    def request(self, per_depth: tuple[float, ...], rng: random.Random) -> RequestAcceptance:
        """A new request's state: its mix drawn from the Beta, its first state from the mix."""
        mix = rng.betavariate(self.mix_a, self.mix_b)
        return RequestAcceptance(mix, rng.random() < mix, self.tables(per_depth), self.redraw)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> VariationModel:
        names = [f.name for f in fields(VariationModel)]
        if not isinstance(raw, dict) or set(raw) != set(names):
            raise ValueError(f"variation: needs exactly the keys {', '.join(names)}")
        bad = [n for n in names if isinstance(raw[n], bool) or not isinstance(raw[n], (int, float))]
        if bad:
            raise ValueError(f"variation: {bad[0]} must be a number, got {raw[bad[0]]!r}")
        return VariationModel(*(float(raw[n]) for n in names))


class RequestAcceptance:
    """One request's acceptance: its mix, whether the current step is easy, and the two states' per-depth tables."""

    __slots__ = ("mix", "easy", "tables", "redraw")

    def __init__(self, mix: float, easy: bool, tables: Tables, redraw: float):
        self.mix, self.easy, self.tables, self.redraw = mix, easy, tables, redraw

    def per_depth(self) -> tuple[float, ...]:
        """This step's per-depth acceptance."""
        return self.tables[0] if self.easy else self.tables[1]

    def advance(self, rng: random.Random) -> None:
        """After a step: with probability redraw, the state is drawn afresh from the mix."""
        if rng.random() < self.redraw:
            self.easy = rng.random() < self.mix


@functools.cache
def state_tables(per_depth: tuple[float, ...], mix_a: float, mix_b: float, contrast: float) -> Tables:
    """Per depth, the easy and hard states' acceptance (logit gap `contrast`) such that a run whose share of easy
    steps is s reaches each depth as often as the profile: s * E_d + (1 - s) * H_d = prod(per_depth[:d]), with E_d,
    H_d each state's product of acceptances to depth d; s is the mixes' mean weighted by steps per token (a fixed
    point: the weights depend on the tables)."""
    mix, mass = _mix_bins(mix_a, mix_b)
    share = mix_a / (mix_a + mix_b)
    for _ in range(100):
        easy, hard = _tables_at(per_depth, share, contrast)
        steps = mass / (mix * _chain_tau(easy) + (1 - mix) * _chain_tau(hard))  # per token emitted
        new = float((steps * mix).sum() / steps.sum())
        if abs(new - share) < 1e-12:
            break
        share = new
    return easy, hard


def _tables_at(per_depth: tuple[float, ...], share: float, contrast: float) -> Tables:
    easy, hard = [], []
    reach_e = reach_h = 1.0
    for q in per_depth:
        # survivors to this depth are easy in this share: the target is their weighted mean acceptance
        both = share * reach_e + (1 - share) * reach_h
        w = share * reach_e / both if both > 0 else share
        e, h = _centred(q, w, contrast)
        easy.append(e)
        hard.append(h)
        reach_e, reach_h = reach_e * e, reach_h * h
    return tuple(easy), tuple(hard)


def _chain_tau(p: tuple[float, ...]) -> float:
    """Expected tokens per step of a chain as deep as the table."""
    tau, reach = 1.0, 1.0
    for x in p:
        reach *= x
        tau += reach
    return tau


def _mix_bins(mix_a: float, mix_b: float) -> tuple[np.ndarray, np.ndarray]:
    """The Beta on MIX_NODES equal-width bins of the mix: their midpoints and masses."""
    edges = np.linspace(0.0, 1.0, MIX_NODES + 1)
    return (edges[:-1] + edges[1:]) / 2, np.diff([_beta_cdf(x, mix_a, mix_b) for x in edges])


def _centred(q: float, w: float, contrast: float) -> tuple[float, float]:
    """(e, h) with logit(e) - logit(h) = contrast and w * e + (1 - w) * h = q, by bisection on the centre."""
    if q <= 0 or q >= 1:
        return q, q
    lo, hi = -60.0, 60.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if w * _sigmoid(mid + contrast / 2) + (1 - w) * _sigmoid(mid - contrast / 2) < q:
            lo = mid
        else:
            hi = mid
    return _sigmoid(lo + contrast / 2), _sigmoid(lo - contrast / 2)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def simulate(model: VariationModel | None, per_depth: tuple[float, ...], depth: int, requests: int, tokens: int,
             rng: random.Random) -> list[list[int]]:
    """Traces of `requests` requests on a chain of `depth` drafts, each run until its steps have emitted `tokens`
    tokens (accepted drafts + the bonus per step); model None: every step draws from per_depth (i.i.d.)."""
    traces = []
    for _ in range(requests):
        state = model.request(per_depth, rng) if model is not None else None
        trace, emitted = [], 0
        while emitted < tokens:
            p = state.per_depth() if state is not None else per_depth
            k = 0
            while k < depth and rng.random() < p[min(k, len(p) - 1)]:
                k += 1
            trace.append(k)
            emitted += k + 1
            if state is not None:
                state.advance(rng)
        traces.append(trace)
    return traces


def pooled_per_depth(traces: list[list[int]], depth: int) -> tuple[float, ...]:
    """Per depth d, the steps that accepted d or more drafts over those that accepted d - 1 or more."""
    counts = [k for t in traces for k in t]
    reached = [sum(k >= d for k in counts) for d in range(depth + 1)]
    return tuple(reached[d] / reached[d - 1] if reached[d - 1] else 0.0 for d in range(1, depth + 1))


def trace_stats(traces: list[list[int]], depth: int) -> dict:
    """Summary of traces: tau (tokens per step), the spread of the per-request tau, the within-request
    autocorrelation of accepted counts at lags 1, 2, 4, 8 (around each request's own mean), the lag-1
    autocorrelation across the pool (around the pooled mean: the requests' differences count too), and the
    per-step distribution's spread and ends."""
    return _stats(*_padded(traces), depth)


def _padded(traces: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    counts = np.zeros((len(traces), max(map(len, traces))))
    mask = np.zeros(counts.shape, dtype=bool)
    for i, t in enumerate(traces):
        counts[i, :len(t)], mask[i, :len(t)] = t, True
    return counts, mask


def _stats(counts: np.ndarray, mask: np.ndarray, depth: int) -> dict:
    """trace_stats of traces as a [requests, steps] array of counts and the mask of real steps."""
    steps = mask.sum(axis=1)
    request_mean = np.where(mask, counts, 0).sum(axis=1) / steps
    mean = float(np.where(mask, counts, 0).sum() / steps.sum())
    tau = 1 + request_mean
    out = {"requests": len(counts), "steps": int(steps.sum()), "tau": 1 + mean, "request_tau_std": float(tau.std()),
           "request_tau_p10": float(np.quantile(tau, 0.1)), "request_tau_p90": float(np.quantile(tau, 0.9))}
    within = np.where(mask, counts - request_mean[:, None], 0.0)
    for lag in LAGS:
        out[f"lag{lag}_within"] = _autocorrelation(within, lag)
    pooled = np.where(mask, counts - mean, 0.0)
    out["lag1_pooled"] = _autocorrelation(pooled, 1)
    real = counts[mask]
    out.update(step_std=float(real.std()), zero_share=float((real == 0).mean()),
               full_share=float((real == depth).mean()))
    return out


def _autocorrelation(dev: np.ndarray, lag: int) -> float:
    """Pooled over requests: sum of dev[t] * dev[t + lag] over sum of dev[t]**2 (padding is 0)."""
    den = float((dev * dev).sum())
    return float((dev[:, :-lag] * dev[:, lag:]).sum()) / den if den and dev.shape[1] > lag else 0.0


def simulate_arrays(model: VariationModel | None, per_depth: tuple[float, ...], depth: int, requests: int,
                    tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """simulate for many requests at once (the fit's simulation): the traces as a [requests, steps] array and the
    mask of real steps. A request's mix comes from the Beta's inverse CDF on a fine grid; the same seed gives the
    same uniforms whatever the model, so a fit compares models on common draws."""
    rng = np.random.default_rng(seed)
    u_mix, u_first = rng.random(requests), rng.random(requests)
    if model is None:
        tables, mix, redraw = (tuple(per_depth), tuple(per_depth)), np.ones(requests), 0.0
    else:
        tables, redraw = model.tables(per_depth), model.redraw
        grid = np.linspace(0.0, 1.0, 257)
        mix = np.interp(u_mix, [_beta_cdf(x, model.mix_a, model.mix_b) for x in grid], grid)
    cdf_easy, cdf_hard = (np.cumsum(_count_probs(t, depth))[:-1] for t in tables)
    easy = u_first < mix
    counts = np.zeros((requests, tokens), dtype=np.int64)
    mask = np.zeros((requests, tokens), dtype=bool)
    emitted = np.zeros(requests, dtype=np.int64)
    used = 0
    for t in range(tokens):
        live = emitted < tokens
        if not live.any():
            break
        u_count, u_redraw, u_state = rng.random(requests), rng.random(requests), rng.random(requests)
        k = np.where(easy, (u_count[:, None] >= cdf_easy).sum(axis=1), (u_count[:, None] >= cdf_hard).sum(axis=1))
        counts[:, t], mask[:, t] = k, live
        emitted += (k + 1) * live
        easy = np.where(u_redraw < redraw, u_state < mix, easy)
        used = t + 1
    return counts[:, :used], mask[:, :used]


def _count_probs(p: tuple[float, ...], depth: int) -> np.ndarray:
    """P(k drafts accepted) for k = 0..depth on a chain, given per-depth acceptance p."""
    out, reach = [], 1.0
    for k in range(depth):
        q = p[min(k, len(p) - 1)]
        out.append(reach * (1 - q))
        reach *= q
    return np.array(out + [reach])


def _beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta I_x(a, b): its continued fraction (modified Lentz), on the side where it
    converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _beta_cdf(1 - x, b, a)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            frac *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * frac


# --- the fit: simulated moments ---

# what the fit matches: between-request spread, within-request persistence and its decay, the pool's correlation.
# The per-step distribution of counts needs no matching: the tables keep the profile's pooled per-depth acceptance,
# which fixes it
MOMENTS = ("request_tau_std", *(f"lag{lag}_within" for lag in LAGS), "lag1_pooled")
# the search runs on unbounded coordinates: logit(mix mean), log(mix_a + mix_b), logit(redraw), log(contrast)
_GRID = ((-1.4, -0.6, 0.0, 0.6, 1.4), (-0.7, 0.7, 2.1, 3.5), (-3.5, -2.2, -0.85, 1.5), (0.0, 0.7, 1.25, 1.6))


def _model(u: tuple[float, ...]) -> VariationModel:
    mean = 1 / (1 + math.exp(-min(max(u[0], -6), 6)))
    size = math.exp(min(max(u[1], -2.5), 7))
    redraw = 1 / (1 + math.exp(-min(max(u[2], -7), 9)))
    return VariationModel(mean * size, (1 - mean) * size, redraw, math.exp(min(max(u[3], -5), 2.5)))


def moment_errors(traces: list[list[int]], depth: int, resamples: int = 200, seed: int = 0) -> dict:
    """Each matched moment's standard error, by resampling the requests (the fit's weights)."""
    counts, mask = _padded(traces)
    rng = np.random.default_rng(seed)
    draws = [_stats(counts[i], mask[i], depth) for i in
             (rng.integers(0, len(traces), len(traces)) for _ in range(resamples))]
    return {m: max(float(np.std([d[m] for d in draws])), 0.01) for m in MOMENTS}


def fit(groups: list[tuple[list[list[int]], tuple[float, ...]]], tokens: int, depth: int = 7,
        requests: int = 1000, seed: int = 0) -> tuple[VariationModel, float]:
    """The model whose simulated traces (`requests` requests of `tokens` tokens each, common draws) best match
    the traces' moments (MOMENTS), each difference in units of its standard error, summed in squares over the
    groups ((traces, per_depth) pairs sharing the model's shape). The best point of a coarse grid, then a compass
    search that halves its step until it is small. Returns the model and its loss."""
    targets = [(trace_stats(traces, depth), moment_errors(traces, depth, seed=seed), per_depth)
               for traces, per_depth in groups]

    def loss(u: tuple[float, ...]) -> float:
        model, total = _model(u), 0.0
        for measured, error, per_depth in targets:
            sim = _stats(*simulate_arrays(model, per_depth, depth, requests, tokens, seed), depth)
            total += sum(((sim[m] - measured[m]) / error[m]) ** 2 for m in MOMENTS)
        return total

    cost = functools.cache(loss)
    grid = [(a, b, c, d) for a in _GRID[0] for b in _GRID[1] for c in _GRID[2] for d in _GRID[3]]
    best = min(grid, key=cost)
    step = 0.5
    while step > 0.01:
        moved = False
        for axis in range(4):
            for sign in (1, -1):
                trial = tuple(round(x + sign * step * (i == axis), 6) for i, x in enumerate(best))
                if cost(trial) < cost(best) - 1e-9:
                    best, moved = trial, True
        if not moved:
            step /= 2
    return _model(best), cost(best)
