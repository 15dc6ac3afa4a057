"""The Drafter protocol the engine talks to.

Per request slot: `start` sees the prompt; each step `propose` gets the root (the token emitted last, not yet
seen by the target) and returns a DraftTree rooted at it; `commit` gets the draft tokens the target accepted
(the bonus token arrives as the next root). A drafter keeps whatever state it needs in step with that.
"""

from __future__ import annotations

from typing import Protocol

from specpilot.spec.tree import DraftTree, TreeSpec


class Drafter(Protocol):
    name: str

    def start(self, slot: int, prompt_ids: list[int]) -> None: ...

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]: ...

    def commit(self, slot: int, accepted: list[int]) -> None: ...

    def allocate(self, num_slots: int, max_seq_len: int) -> None: ...
