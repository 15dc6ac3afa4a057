"""A workload's sampling settings (temperature, top-k, top-p) and each prompt's seed: what `specpilot tune` and
`specpilot profile` decode with, and what a recipe records it was tuned at.

Temperature 0 is greedy decoding. Above it every prompt samples with its own seed, a hash of the workload's seed and
the prompt's tokens: the same prompt draws the same noise in every run, whichever side of the tuning / held-out split
and whichever group of the batch it lands in, so plain (AR) sampling with that seed is the output every speculative
run of it must equal, token for token (docs/sampling.md: the raced rule).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

from specpilot.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0  # the workload's: each prompt's seed derives from it

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"--temperature {_show(t)}: must be a finite number >= 0 (0: greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"--top-k {self.top_k}: must be an integer >= 0 (0: off)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"--top-p {_show(p)}: must be in (0, 1] (1: off)")
        if t == 0:
            for flag, value, off in (("--top-k", self.top_k, 0), ("--top-p", self.top_p, 1.0)):
                if value != off:
                    raise ValueError(f"{flag} {_show(value)}: filters sampling; it needs --temperature > 0 (0 is "
                                     f"greedy)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"--seed {self.seed}: must be an integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def seed_for(self, prompt) -> int:
        """The prompt's own seed: 63 bits of sha256 over the workload's seed and the prompt's token ids."""
        text = f"{self.seed}:{','.join(map(str, prompt))}".encode()
        return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1

    def apply(self, params: SamplingParams, prompt) -> SamplingParams:
        """params (max_new_tokens, ignore_eos, ...) sampling as this workload samples `prompt`; unchanged if greedy."""
        if self.greedy:
            return params
        return dataclasses.replace(params, temperature=float(self.temperature), top_k=self.top_k, top_p=self.top_p,
                                   seed=self.seed_for(prompt))

    def describe(self) -> str:
        if self.greedy:
            return "temperature 0 (greedy)"
        extra = ([f"top-k {self.top_k}"] if self.top_k else []) + ([f"top-p {self.top_p:g}"] if self.top_p < 1 else [])
        return ", ".join([f"temperature {self.temperature:g}"] + extra)

    def same_distribution(self, other: Sampling) -> bool:
        """Whether the two decode from the same distribution (the seeds aside)."""
        return (float(self.temperature), self.top_k, float(self.top_p)) == (
            float(other.temperature), other.top_k, float(other.top_p))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> Sampling:
        """A recipe's `sampling` object (absent: greedy, as every recipe before it was tuned)."""
        if not isinstance(raw, dict):
            raise ValueError("the recipe's 'sampling' is not an object")
        return Sampling(raw.get("temperature", 0.0), raw.get("top_k", 0), raw.get("top_p", 1.0), raw.get("seed", 0))


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
