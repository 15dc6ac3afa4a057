"""N-gram / prompt-lookup drafter: proposes what followed earlier occurrences of the context's last n-gram.

No weights. A chain takes the continuation of the most recent match of the longest n-gram (n = max_n..1);
a tree takes continuations of several matches with distinct next tokens as branches.
"""

from __future__ import annotations

from specpilot.spec_decode.tree import DraftTree, TreeSpec


class NgramDrafter:
    name = "ngram"
    sequential = False  # one proposal costs the same at every depth (the engine then asks for its full tree)
    target_layers: tuple[int, ...] = ()
    max_depth = None

    def __init__(self, max_n: int = 3):
        self.max_n = max_n
        self.context: dict[int, list[int]] = {}

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        pass

    def start(self, slot: int, prompt_ids: list[int], features=None) -> None:
        self.context[slot] = list(prompt_ids)

    def commit(self, slot: int, accepted: list[int], features=None) -> None:
        self.context[slot].extend(accepted)

    def propose(self, slots: list[int], roots: list[int], spec: TreeSpec) -> list[DraftTree]:
        trees = []
        for slot, root in zip(slots, roots):
            self.context[slot].append(root)
            width = spec.top_k if spec.kind == "dynamic" else spec.branching[0]
            branches = self._continuations(self.context[slot], spec.depth, width)
            trees.append(_tree_of_branches(root, branches, spec))
        return trees

    def _continuations(self, ctx: list[int], depth: int, width: int) -> list[list[int]]:
        """Up to `width` continuations with distinct first tokens, most recent match of the longest n first."""
        found: list[list[int]] = []
        firsts: set[int] = set()
        for n in range(min(self.max_n, len(ctx) - 1), 0, -1):
            tail = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start:start + n] == tail:
                    cont = ctx[start + n:start + n + depth]
                    if cont and cont[0] not in firsts:
                        firsts.add(cont[0])
                        found.append(cont)
                        if len(found) == width:
                            return found
        return found


def _tree_of_branches(root: int, branches: list[list[int]], spec: TreeSpec) -> DraftTree:
    """Root plus one chain per branch, cut to the spec's node budget (dynamic) or its depth."""
    tokens, parents = [root], [-1]
    budget = spec.max_nodes if spec.kind == "dynamic" else None
    for branch in branches:
        parent = 0
        for tok in branch[:spec.depth]:
            if budget is not None and len(tokens) > budget:
                break
            tokens.append(tok)
            parents.append(parent)
            parent = len(tokens) - 1
    return DraftTree(tuple(tokens), tuple(parents))
