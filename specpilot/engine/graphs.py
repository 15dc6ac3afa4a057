"""CUDA graphs of the two hot steps, each captured once per shape and replayed.

DecodeGraph: the AR decode step of a fixed batch. It reads static device buffers (token ids, positions, slots)
and writes static logits; positions advance inside the graph, so a replay needs no host-to-device copy and the
step has no host sync.
VerifyGraph: the verify forward of a fixed (batch, tree width, chain or tree) shape. Its static metadata views one
packed int64 buffer (BatchMetadata.unpack), so a replay copies the step's packed metadata in one copy, then
returns static greedy tokens (and captured features); it needs the tree-attention op, whose grid and reads do not
depend on the committed lengths.
"""

from __future__ import annotations

import torch

from specpilot.layers.metadata import BatchMetadata


class DecodeGraph:
    def __init__(self, model, cache, batch_size: int, warmup: int = 3):
        device = cache.k.device
        self.input_ids = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.slots = torch.arange(batch_size, dtype=torch.long, device=device)
        self.model, self.cache = model, cache
        # warm-up and capture write K/V at the last cache position, which no request reads before writing it
        last = cache.max_seq_len - 1
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.positions.fill_(last)
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.positions.fill_(last)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        # warm-up also ran the recurrent update on the slots' state: the caller snapshots and restores it

    def _step(self) -> torch.Tensor:
        meta = decode_metadata(self.input_ids, self.positions, self.slots)
        logits = self.model.logits(self.model(meta, self.cache))[:, 0].float()
        self.positions.add_(1)
        return logits

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Copies inputs only if they are not already the static buffers; returns the static logits [B, vocab]."""
        if input_ids.data_ptr() != self.input_ids.data_ptr():
            self.input_ids.copy_(input_ids)
        if positions.data_ptr() != self.positions.data_ptr():
            self.positions.copy_(positions)
        self.graph.replay()
        return self.logits


def decode_metadata(input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> BatchMetadata:
    """One causal token per request at its current length (no prefix gather needed: the decode kernel reads the cache)."""
    pos = positions[:, None]
    return BatchMetadata(input_ids[:, None], pos, pos, slots, positions, max_prefix_len=0, kv_len=positions + 1)


class VerifyGraph:
    def __init__(self, run, meta: BatchMetadata, cache, warmup: int = 2):
        """run(meta) -> (greedy tokens [B, T], features [B, T, F] or None), traced on static copies of meta."""
        self.packed = _packed(meta).clone()
        B, T = meta.input_ids.shape
        self.meta = BatchMetadata.unpack(self.packed, B, T, meta.block_mask is not None, cache.max_seq_len)
        self.cache = cache
        self.graph, (self.tokens, self.features) = capture(run, self.meta, warmup=warmup)
        # the tree pass stashes its fold terms by assignment, which a replay does not redo: keep this graph's
        self.stash = dict(cache.tree_stash)

    def replay(self, meta: BatchMetadata):
        self.packed.copy_(_packed(meta))
        self.graph.replay()
        self.cache.tree_stash.clear()
        self.cache.tree_stash.update(self.stash)
        return self.tokens, self.features


def capture(run, *args, warmup: int = 2):
    """Runs run(*args) `warmup` times on a side stream (compiles and autotuning must not happen inside a
    capture), then captures one call: (graph, that call's outputs, which every replay rewrites in place)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            run(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*args)
    return graph, out


def _packed(meta: BatchMetadata) -> torch.Tensor:
    """The step's index fields as one buffer: tree_metadata hands it over; other metadata is packed here."""
    return meta.packed if meta.packed is not None else meta.pack()
