"""Synthetic acceptance: the drafter runs at full cost, but an oracle that knows the stock continuation rewrites
its proposals to follow a stated acceptance profile. For random-weight targets in real shapes, where real
acceptance means nothing; every number produced this way is labelled synthetic.

A profile gives, per depth d, the probability that the rank-0 child of a node on the true path is the true
next token (conditional on its parent being right); a sibling of rank r is right with per_depth[d] *
sibling_decay**r when the earlier ranks missed. At most one child of a node is right. Without a variation model
every step of every request draws from per_depth (i.i.d.); with one (bench/variation.py: a two-state Markov chain
per request, fitted to the zoo's traces) each request draws from its own state's per-depth table, step by step,
and the run's pooled per-depth acceptance is still per_depth. Every row says which (AcceptanceProfile.label).

Requests are told apart by their prompts: `truth` maps a prompt (tuple of token ids) to its stock continuation,
and start(slot, prompt) takes it for the slot, with a fresh acceptance state, so a slot reused by a new request
(continuous batching) follows the new request; a request resumed after a preemption (started again with its
prompt and what it emitted) keeps its truth and state. A request's state path comes from a generator seeded by
the seed and its prompt alone: the same whatever requests share its steps, and in whatever order. A static batch
may key `truth` by slot instead.

The probe: in bf16 a random target's logits are nearly flat, so the AR decode path and the verify block (two
equally valid kernels) round a near-tie differently on ~20% of tokens, and a truth taken from the stock AR
continuation would cut the accepted run there (27B: tau 3.65 against the profile's 5.45). With a `probe` (a
verify pass over the step's trees that commits nothing: ProbingEngine.probe in bench/probing.py, which hands it
over through set_probe) the oracle learns what this verify will answer: the profile's draws decide which nodes
are right, then the right nodes take the target's own greedy token at their parent and the wrong ones anything
else, probe after probe until the trees agree with the answers (one more probe per depth whose guess was
wrong). The stock continuation is then only a guess that saves probes: on a margin target (bench/shapes.py),
whose greedy token leads by many logits, the verify answers what AR decode did and the first probe of a step
confirms the guess.
Without a probe (CPU runs in fp32, where the two paths agree) the stock continuation is the truth.

At temperature > 0 the truth is AR's sampled output with the request's seed: the engine's raced rule emits, for
any proposal, the tokens plain sampling draws with that seed (spec_decode/rejection.py). The probe answers the
target's raced token at every node (the noise row of its output position) where it answers the argmax when
greedy, and the oracle works as above. The rates are still the profile's, which are greedy acceptance rates: a
sampled row measures what sampled speculation costs (the verify with logits, the race, the coupled draft)
at an assumed acceptance, not the acceptance a drafter reaches at that temperature, and its label says so
(AcceptanceProfile.label_at).

The oracle cannot reveal a verify or commit bug: it follows whatever the verify answers, and the accepted
tokens are then what a faulty verify emitted. Exact forcing on margin targets is the check that can fail.

The oracle's own work (drawing, probing, fixing: host Python and verify passes between which the GPU idles) is
no part of the engine's step: it runs inside `untimed`, a clock the benchmark passes in (bench/harness.py's
OracleClock) that takes its seconds out of the run. Only the inner drafter's proposal is the step's draft cost.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from specpilot.bench.variation import RequestAcceptance, VariationModel
from specpilot.spec_decode.tree import DraftTree, TreeSpec, grow

PROFILES_DIR = Path(__file__).parent / "profiles"
Probe = Callable[[list[int], list[DraftTree]], list[list[int]]]


@dataclass(frozen=True)
class AcceptanceProfile:
    name: str
    per_depth: tuple[float, ...]
    sibling_decay: float = 0.5
    source: str = ""
    # the variation model's fields as (name, value) pairs (the profile stays plain JSON data); see `variation`
    variation_params: tuple[tuple[str, float], ...] = ()
    variation_source: str = ""

    @property
    def variation(self) -> VariationModel | None:
        return VariationModel.from_dict(dict(self.variation_params)) if self.variation_params else None

    def with_variation(self, model: VariationModel | None, source: str = "") -> AcceptanceProfile:
        return replace(self, variation_params=tuple(model.to_dict().items()) if model else (), variation_source=source)

    @property
    def label(self) -> str:
        """What a benchmark row says about its acceptance."""
        how = (self.variation_source or "2-state Markov variation") if self.variation_params else "i.i.d. per step"
        return f"{self.name} (synthetic, {how})"

    def label_at(self, temperature: float) -> str:
        """A row's label at this temperature: `label`, and at temperature > 0 what the row's acceptance is."""
        if temperature == 0:
            return self.label
        return (f"{self.label}; sampled at T={temperature:g}: the oracle proposes AR's sampled output (same seed) at "
                f"the profile's greedy per-depth rates, so the row measures the cost of sampled speculation (the "
                f"verify with logits, the race, the coupled draft) at an assumed acceptance, not a drafter's "
                f"acceptance at this temperature")

    def to_dict(self) -> dict:
        raw = {"name": self.name, "per_depth": list(self.per_depth), "sibling_decay": self.sibling_decay,
               "source": self.source}
        if self.variation_params:
            raw.update(variation=dict(self.variation_params), variation_source=self.variation_source)
        return raw

    @staticmethod
    def load(name_or_path: str) -> AcceptanceProfile:
        path = Path(name_or_path)
        if not path.exists():
            path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
            raise ValueError(f"acceptance profile {name_or_path!r}: no such file; shipped profiles: {shipped}")
        raw = json.loads(path.read_text())
        per_depth = tuple(float(p) for p in raw.get("per_depth", ()))
        if not per_depth or not all(0 <= p <= 1 for p in per_depth):
            raise ValueError(f"{path}: per_depth must be a non-empty list of probabilities")
        profile = AcceptanceProfile(raw.get("name", path.stem), per_depth, float(raw.get("sibling_decay", 0.5)),
                                    raw.get("source", ""))
        if "variation" not in raw:
            return profile
        try:
            model = VariationModel.from_dict(raw["variation"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None
        return profile.with_variation(model, str(raw.get("variation_source", "")))

    def p(self, depth: int, rank: int) -> float:
        base = self.per_depth[min(depth, len(self.per_depth)) - 1]
        return base * self.sibling_decay**rank

    def marginal(self, depth: int, rank: int) -> float:
        """The chance that the sibling of this rank is the right child (every earlier rank missed, this one hits)."""
        m = self.p(depth, rank)
        for earlier in range(rank):
            m *= 1 - self.p(depth, earlier)
        return m

    def expected_tau(self, tree: DraftTree) -> float:
        """Expected tokens per step (accepted drafts + the bonus) of a tree whose siblings are in rank order."""
        depths, reach = tree.depths, [1.0] * tree.num_nodes
        for node in range(1, tree.num_nodes):
            parent = tree.parents[node]
            reach[node] = reach[parent] * self.marginal(depths[node], tree.children(parent).index(node))
        return 1.0 + sum(reach[1:])

    def expected_chain_tau(self, depth: int) -> float:
        return self.expected_tau(DraftTree.chain([0] * (depth + 1)))


class SyntheticDrafter:
    """Wraps a drafter: the drafter still runs (its cost is real), but the tree has the spec's full shape and its
    tokens come from the oracle."""

    def __init__(self, inner, truth: dict[tuple[int, ...] | int, list[int]], profile: AcceptanceProfile,
                 vocab_size: int, seed: int = 0, probe: Probe | None = None, untimed: Callable | None = None):
        """truth: the stock continuation (the guess) per request's prompt (tuple of token ids), or per slot (an
        int; a static batch), which the probes correct in place; probe: see set_probe; untimed(fn, *args): runs the
        oracle's work, a benchmark's clock that excludes it (default: a plain call)."""
        self.inner, self.truth, self.profile, self.vocab = inner, truth, profile, vocab_size
        self.name = f"synthetic({getattr(inner, 'name', 'drafter')})"
        self.target_layers = tuple(getattr(inner, "target_layers", ()))
        self.sequential = getattr(inner, "sequential", True)
        # coupled as the drafter it wraps is: a sampled step then pays for the coupled draft (its noise rows, the
        # coupled proposal) as a real step does
        self.coupled = getattr(inner, "coupled", False)
        if hasattr(inner, "skip"):  # skippable as the drafter it wraps is
            self.skip = self._skip
        block = getattr(inner, "block_size", None)  # a DFlash block of B drafts B - 1 tokens deep
        self.max_depth = getattr(inner, "max_depth", None) or (block - 1 if block else None)
        self.seed, self.rng = seed, random.Random(seed)
        self.variation = profile.variation
        self.probe = probe
        self.probes = 0  # probe passes so far (each one a verify forward)
        self.untimed = untimed or (lambda fn, *args: fn(*args))
        self.out: dict[int, list[int]] = {}  # per slot: the tokens emitted so far, the current root last
        self.key: dict[int, tuple[int, ...] | int] = {}  # per slot: its request's key into truth
        # per slot, and per request key (kept for a resumption): the acceptance state and the generator moving it
        self.state: dict[int, tuple[RequestAcceptance, random.Random]] = {}
        self.requests: dict[tuple[int, ...] | int, tuple[RequestAcceptance, random.Random]] = {}

    def set_probe(self, probe: Probe) -> None:
        """probe(slots, trees): the target's greedy token after every node of the trees, from a verify that commits
        nothing; the engine that runs this drafter provides it once built (ProbingEngine)."""
        self.probe = probe

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        self.inner.allocate(num_slots, max_seq_len)

    def start(self, slot: int, prompt_ids: list[int], features=None) -> None:
        """A request takes the slot: its truth (by prompt, else by slot) and a fresh acceptance state. A request
        resumed after a preemption starts with its prompt and every token it emitted but the last (the next root):
        it keeps its truth and its state."""
        self.inner.start(slot, prompt_ids, features)
        key, emitted = self._request_of(tuple(prompt_ids), slot)
        self.key[slot] = key
        self.out[slot] = list(emitted)  # the last emitted token (the prefill's, at first) arrives as the next root
        if self.variation is None:
            self.state.pop(slot, None)
        elif emitted and key in self.requests:
            self.state[slot] = self.requests[key]
        else:
            rng = random.Random(repr((self.seed, key)))
            self.state[slot] = self.requests[key] = (self.variation.request(self.profile.per_depth, rng), rng)

    def _request_of(self, sequence: tuple[int, ...], slot: int) -> tuple[tuple[int, ...] | int, tuple[int, ...]]:
        """The request's key into truth and the tokens it emitted before: its prompt if truth has it, else the
        longest prompt in truth that the sequence extends (a resumed request), else the slot (a static batch)."""
        if sequence in self.truth:
            return sequence, ()
        prompts = [k for k in self.truth if isinstance(k, tuple) and len(k) < len(sequence) and
                   sequence[:len(k)] == k]
        if prompts:
            prompt = max(prompts, key=len)
            return prompt, sequence[len(prompt):]
        return (slot, ()) if slot in self.truth else (sequence, ())

    def commit(self, slot: int, accepted: list[int], features=None) -> None:
        self.inner.commit(slot, accepted, features)
        self.out.setdefault(slot, []).extend(accepted)

    def _skip(self, slots: list[int], roots: list[int]) -> None:
        for s, root in zip(slots, roots):
            self.out.setdefault(s, []).append(root)  # the root is the last emitted token
        self.inner.skip(slots, roots)

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec, noise=None) -> list[DraftTree]:
        """noise: the sampling requests' race noise, handed on to a coupled inner drafter (its cost is the step's);
        the oracle's trees do not read it (the probe answers with the target's raced tokens)."""
        spec = self._capped(spec)
        # the oracle first: the drafter's work then queues after the oracle's last sync, as in a real step
        trees = self.untimed(self._oracle, slots, roots, spec)
        if noise is None:
            self.inner.propose(slots, roots, spec)
        else:
            self.inner.propose(slots, roots, spec, noise=noise)
        return trees

    def _oracle(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        trees, right = [], []
        for s, root in zip(slots, roots):
            self.out.setdefault(s, []).append(root)  # the root is the last emitted token
            tree = shape(spec, root, self.profile)
            future = self._future(s)
            on_path = self._draw(tree, None if self.probe is not None else len(future), self._per_depth(s))
            trees.append(self._fill(tree, on_path, future))
            right.append(on_path)
            if s in self.state:
                state, rng = self.state[s]
                state.advance(rng)
        return self._settle(slots, trees, right) if self.probe is not None else trees

    def _per_depth(self, slot: int) -> tuple[float, ...]:
        """This step's per-depth acceptance for the slot's request: its state's, or the profile's."""
        return self.state[slot][0].per_depth() if slot in self.state else self.profile.per_depth

    def _truth(self, slot: int) -> list[int]:
        return self.truth.get(self.key.get(slot, slot), [])

    def _future(self, slot: int) -> list[int]:
        """The guessed tokens after the root: the truth's, while the emitted prefix still follows it."""
        out, truth = self.out[slot], self._truth(slot)
        return truth[len(out):] if truth[:len(out)] == out else []

    def _capped(self, spec: TreeSpec) -> TreeSpec:
        """The spec no deeper than the inner drafter drafts (as DFlashDrafter caps it): the oracle must not credit
        depths the real drafter never proposes."""
        return spec.capped(self.max_depth) if self.max_depth else spec

    def _draw(self, tree: DraftTree, known: int | None, per_depth: tuple[float, ...]) -> list[bool]:
        """Which nodes are right, from draws alone: a path from the root (at most one right child per node), a
        rank-r child of depth d right with per_depth[d] * sibling_decay**r. `known`: the depth up to which the
        truth is known (None: any, the probe finds it)."""
        depths, decay = tree.depths, self.profile.sibling_decay
        on_path = [True] + [False] * (tree.num_nodes - 1)
        for parent in range(tree.num_nodes):
            if not on_path[parent]:
                continue
            for rank, child in enumerate(tree.children(parent)):
                d = depths[child]
                chance = per_depth[min(d, len(per_depth)) - 1] * decay**rank
                if (known is None or d <= known) and self.rng.random() < chance:
                    on_path[child] = True
                    break
        return on_path

    def _fill(self, tree: DraftTree, on_path: list[bool], future: list[int]) -> DraftTree:
        depths, tokens = tree.depths, list(tree.tokens)
        for node in range(1, tree.num_nodes):
            d = depths[node]
            truth = future[d - 1] if d - 1 < len(future) else None
            right = on_path[node] and truth is not None
            tokens[node] = truth if right else self._wrong(truth)
        return DraftTree(tuple(tokens), tree.parents)

    def _settle(self, slots: list[int], trees: list[DraftTree], right: list[list[bool]]) -> list[DraftTree]:
        """Probes until every right node carries the target's greedy token at its parent and no wrong node does.
        Each round fixes the shallowest disagreeing nodes (a fix changes the answers below it): at most one
        round per depth, plus the one that finds nothing to fix."""
        for _ in range(max(max(t.depths) for t in trees) + 2):
            greedy = self.probe(slots, trees)
            self.probes += 1
            fixed = [self._fix(t, r, g) for t, r, g in zip(trees, right, greedy)]
            if all(f is None for f in fixed):
                for s, t, r, g in zip(slots, trees, right, greedy):
                    self._learn(s, t, r, g)
                return trees
            trees = [t if f is None else f for t, f in zip(trees, fixed)]
        raise RuntimeError("synthetic oracle: the probe's answers did not settle (is the verify deterministic?)")

    def _fix(self, tree: DraftTree, right: list[bool], greedy: list[int]) -> DraftTree | None:
        """The tree with its shallowest disagreements fixed, or None if it agrees with the answers. Only the
        children of right nodes matter: acceptance never reaches below a wrong node."""
        tokens, parents = list(tree.tokens), tree.parents
        below_fix = [False] * tree.num_nodes  # a node under a fix this round: its answer is stale
        for node in range(1, tree.num_nodes):
            p = parents[node]
            if below_fix[p]:
                below_fix[node] = True
            elif right[p] and (tokens[node] == greedy[p]) != right[node]:
                tokens[node] = greedy[p] if right[node] else self._wrong(greedy[p])
                below_fix[node] = True
        return DraftTree(tuple(tokens), parents) if any(below_fix) else None

    def _learn(self, slot: int, tree: DraftTree, right: list[bool], greedy: list[int]) -> None:
        """The step's emitted tokens are known now (the right path and the bonus): the truth keeps its guesses
        past them only if it agrees."""
        path = [n for n in range(1, tree.num_nodes) if right[n]]
        known = self.out[slot] + [tree.tokens[n] for n in path] + [greedy[path[-1] if path else 0]]
        truth = self._truth(slot)
        self.truth[self.key.get(slot, slot)] = truth if truth[:len(known)] == known else known

    def _wrong(self, truth: int | None) -> int:
        tok = self.rng.randrange(self.vocab)
        return tok if tok != truth else (tok + 1) % self.vocab


def shape(spec: TreeSpec, root: int, profile: AcceptanceProfile) -> DraftTree:
    """The spec's full tree; tokens are placeholders. A dynamic tree is grown as if the drafter's log-probs were
    the profile's own chances (a calibrated drafter): its kept nodes are then those most likely to be accepted,
    which is what a real drafter's scores aim at. Scores by rank alone would keep wide shallow trees that the
    profile mostly rejects (dynamic:4,7,15: 4.38 expected tau against 5.79 profile-scored)."""
    width = max(max(spec.branching, default=1), spec.top_k)

    def score(tree: DraftTree, frontier: list[int]):
        depths = tree.depths
        return [(list(range(width)), [math.log(max(profile.marginal(depths[f] + 1, r), 1e-30)) for r in range(width)])
                for f in frontier]

    return grow(spec, root, score)
