"""ModelRunner: owns a model, its cache and its decode graphs; runs prefill and batched decode steps.

Prefill runs one request at a time in chunks (exact for ragged prompts and recurrent layers); decode runs
the whole batch, replaying a captured CUDA graph on GPU; `mixed` runs a verify block and other requests' prefill
chunks in one forward. The runner never sees requests or sampling. Each step
method puts its step kind's KernelPaths from the Runtime (runtime/settings.py) on the step's metadata: decode
steps runtime.decode, verify blocks runtime.verify, prefill chunks and logits runtime.prefill.
HostStaging: the host buffers of a verify step's two copies (metadata in, greedy tokens out), kept across steps.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from specpilot.config import EngineConfig
from specpilot.layers import linear
from specpilot.layers.metadata import BatchMetadata, HostMetadata, MixedMetadata
from specpilot.models.causal_lm import CausalLM
from specpilot.runtime.cache import ModelCache
from specpilot.runtime.graphs import DecodeGraph, VerifyGraph, decode_metadata
from specpilot.runtime.settings import Runtime


def inference(fn):
    """torch.inference_mode() as a decorator, entered only where it is not on yet: a step calls several decorated
    methods, and each nested entry costs the host ~1.5 us."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return call


def _host_buffer(shape, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A kept host buffer, made outside inference mode whatever the caller's mode: a buffer first taken inside a
    benchmark's probe (inference mode) is written again by a step's accept outside it, and an inference tensor
    refuses that."""
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype, pin_memory=pin)


class HostStaging:
    """Host buffers kept across steps (pinned on a GPU) for the verify step's two copies: the packed metadata is
    filled in take(words), the greedy tokens come back through read_tokens, the step's one sync. A fresh pinned
    buffer per step costs the host an allocation and an event query of the caching host allocator."""

    def __init__(self, device: torch.device, depth: int = 1):
        self.pin = device.type == "cuda"
        self.depth = depth
        self.inputs: dict[int, list[torch.Tensor]] = {}  # words -> buffers of that size
        self.taken: dict[int, int] = {}  # words -> buffers of that size handed out since the last read_tokens
        self.outputs: dict[tuple, torch.Tensor] = {}  # (shape, dtype) -> pinned greedy tokens

    def take(self, words: int) -> torch.Tensor:
        """An int64 host buffer to fill and copy to the device before the next read_tokens.

        Why reuse is safe: a buffer taken before a read_tokens is handed out again only after it. read_tokens
        waits for everything queued on the stream, which includes the non-blocking copy out of the buffer (queued
        before the verify whose tokens it reads), so the host never refills a buffer under a pending copy. Up to
        `depth` buffers of a size are kept; a caller that takes more between two syncs gets fresh ones, which the
        caching host allocator guards itself."""
        n = self.taken.get(words, 0)
        self.taken[words] = n + 1
        kept = self.inputs.setdefault(words, [])
        if n < len(kept):
            return kept[n]
        buf = _host_buffer((words,), torch.long, self.pin)
        if n < self.depth:
            kept.append(buf)
        return buf

    def read_tokens(self, tokens: torch.Tensor) -> list[list[int]]:
        """tokens (device) as host lists: a non-blocking copy into a pinned buffer and a sync on it (a pageable
        copy goes through the driver's own staging); frees every buffer taken before it."""
        if tokens.is_cuda:
            key = (tuple(tokens.shape), tokens.dtype)
            host = self.outputs.get(key)
            if host is None:
                host = self.outputs[key] = _host_buffer(tokens.shape, tokens.dtype, True)
            host.copy_(tokens, non_blocking=True)
            torch.cuda.current_stream(tokens.device).synchronize()
            tokens = host
        self.taken.clear()
        return tokens.tolist()


class ModelRunner:
    def __init__(self, model: CausalLM, runtime: Runtime | None = None, prefill_chunk: int = 2048):
        """runtime: Runtime.build(EngineConfig(), the model's device) when not given."""
        self.model, self.config = model, model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if runtime is None:
            runtime = Runtime.build(EngineConfig(), self.device)
        if not isinstance(runtime, Runtime):
            raise TypeError(f"ModelRunner takes a Runtime, got {type(runtime).__name__}; build it with "
                            f"Runtime.build(engine_config, {str(self.device)!r})")
        if runtime.device != self.device.type:
            raise ValueError(f"the runtime was built for {runtime.device} but the model is on {self.device}; build "
                             f"it with Runtime.build(engine, {str(self.device)!r})")
        self.runtime = runtime
        self.verify_graphs: dict[tuple, VerifyGraph] = {}
        if runtime.weight_format in ("w12n", "w12n_only"):
            if self.dtype != torch.bfloat16:
                raise ValueError(f"weight_format {runtime.weight_format} needs a bf16 model (got {self.dtype}); use "
                                 f"--dtype bfloat16")
            drop = runtime.weight_format == "w12n_only"
            if not any(getattr(m, "w12n", None) is not None for m in model.modules()):
                linear.attach_w12n(model, drop_bf16=drop)
            elif drop:  # planes attached by an earlier runner: release the bf16 copies they replace
                for m in model.modules():
                    if isinstance(m, linear.Linear) and m.w12n is not None:
                        m.weight = None
        self.prefill_chunk = prefill_chunk
        self.cache: ModelCache | None = None
        self.graphs: dict[int, DecodeGraph] = {}
        self.staging = HostStaging(self.device)

    def allocate(self, num_slots: int, max_seq_len: int) -> None:
        """Make sure the cache holds num_slots requests of max_seq_len tokens (reallocates only to grow)."""
        c = self.cache
        if c is None or c.num_slots < num_slots or c.max_seq_len < max_seq_len:
            self.graphs.clear()
            self.verify_graphs.clear()
            self.cache = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.cache = ModelCache(self.config, num_slots, max_seq_len, self.device, self.dtype)

    @inference
    def forward(self, meta: BatchMetadata, layers: tuple[int, ...] = ()):
        """One multi-token block through the model under meta.paths (a teacher-forced pass gives it
        runtime.prefill): hidden states (and captured layers)."""
        return self.model(meta, self.cache, layers)

    @inference
    def verify(self, meta: BatchMetadata, layers: tuple[int, ...] = (), logits: bool = False):
        """One verify block, under runtime.verify's paths whatever meta carries -> (greedy tokens [B, T] on device,
        captured features [B, T, F] or None); replayed from a CUDA graph per (batch, width, chain, logits) when
        runtime.verify_graphs is on. logits: the logits [B, T, vocab] instead of the greedy tokens (what a sampling
        request's acceptance reads); a graph's are its static output, which its next replay overwrites."""
        if meta.paths is not self.runtime.verify:
            meta = dataclasses.replace(meta, paths=self.runtime.verify)
        if not self.runtime.verify_graphs:
            return self._verify_eager(meta, layers, logits)
        B, T = meta.input_ids.shape
        key = (B, T, meta.block_mask is not None, layers, logits)
        graph = self.verify_graphs.get(key)
        if graph is None:
            # capture runs the step for real: put back recurrent state a chain pass advanced in place
            saved = self.cache.snapshot(meta.slots) if self.config.is_hybrid else None
            graph = self.verify_graphs[key] = VerifyGraph(lambda m: self._verify_eager(m, layers, logits), meta,
                                                          self.cache, model=self.model,
                                                          layers_per_graph=self.runtime.verify_layers_per_graph)
            if saved is not None:
                self.cache.restore(saved)
        return graph.replay(meta)

    @inference
    def verify_inputs(self, host: HostMetadata, layers: tuple[int, ...] = (), logits: bool = False) -> BatchMetadata:
        """The step's verify metadata on the device, for verify(): where a graph of this shape was captured, its
        static inputs after one copy from the host buffer (no device staging buffer, no unpack); else a fresh
        device copy (eager, or the capture)."""
        graph = None
        if self.runtime.verify_graphs:
            graph = self.verify_graphs.get((host.batch, host.width, host.tree, layers, logits))
        return graph.load(host) if graph is not None else host.to(self.device, self.runtime.verify)

    @inference
    def mixed(self, verify: BatchMetadata | None, chunks: list[BatchMetadata], layers: tuple[int, ...] = (),
              logits: bool = False):
        """One eager forward over a verify block (under runtime.verify's paths) and prefill chunks (runtime.prefill's;
        each a causal block of one request): the token-wise layers read their weights once for all of them.
        Returns (tokens, features): tokens [B * T + len(chunks)] on device, the verify block's greedy tokens
        row-major then each chunk's greedy token after its last position; features (layers given) per block,
        [B, T, F] for the verify block (when there is one) then [1, T_i, F] per chunk, else None. logits: the
        logits [B * T + len(chunks), vocab] at those positions instead of the greedy tokens."""
        # eager pointwise helpers: a mixed step's token count changes every step, and each new shape would
        # recompile the compiled ones
        verify_paths = dataclasses.replace(self.runtime.verify, compiled=False)
        prefill_paths = dataclasses.replace(self.runtime.prefill, compiled=False)
        parts = [dataclasses.replace(c, paths=prefill_paths) for c in chunks]
        if verify is not None:
            parts.insert(0, dataclasses.replace(verify, paths=verify_paths))
        meta = MixedMetadata.of(parts, verify_paths)
        hidden, features = self.model(meta, self.cache, layers), None
        if layers:
            hidden, captured = hidden
            features = meta.split(torch.cat(captured, dim=-1))
        blocks = meta.split(hidden)
        rows = [b[:, -1] for b in blocks[len(parts) - len(chunks):]]
        if verify is not None:
            rows.insert(0, blocks[0].flatten(0, 1))
        out = self.model.logits(torch.cat(rows), verify_paths)
        return (out if logits else out.argmax(-1)), features

    def _verify_eager(self, meta: BatchMetadata, layers: tuple[int, ...], logits: bool = False):
        hidden, features = self.model(meta, self.cache, layers), None
        if layers:
            hidden, captured = hidden
            features = torch.cat(captured, dim=-1)
        out = self.model.logits(hidden, meta.paths)
        return (out if logits else out.argmax(-1)), features

    @inference
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over hidden states outside a step (a prefill's last positions), under runtime.prefill."""
        return self.model.logits(hidden, self.runtime.prefill)

    @inference
    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """Runs the prompt through the model into `slot` (state cleared first); returns last-token logits [vocab]."""
        self.cache.reset(torch.tensor([slot], device=self.device))
        return self.extend(slot, token_ids, 0)

    @inference
    def prefill_many(self, token_ids: list[list[int]], layers: tuple[int, ...] = ()):
        """prefill of slots 0 .. B-1 together: one forward per chunk instead of B (drafter training's rollouts
        prefill thousands of prompts this way). Prompts of different lengths are padded at the end, which only an
        attention-only model allows: a position never sees the ones after it, and cache rows past a request's
        prompt are never read before they are written again.
        Returns last-token logits [B, vocab] (and, if `layers` is given, each prompt's features [P_i, F])."""
        B, lengths = len(token_ids), [len(t) for t in token_ids]
        P = max(lengths)
        if min(lengths) != P and self.config.is_hybrid:
            raise ValueError("prefill_many takes prompts of one length on a hybrid model (padding would enter its "
                             "recurrent state)")
        assert P <= self.cache.max_seq_len and B <= self.cache.num_slots
        slots = torch.arange(B, device=self.device)
        self.cache.reset(slots)
        ids = torch.tensor([t + [0] * (P - len(t)) for t in token_ids], dtype=torch.long, device=self.device)
        last = torch.tensor(lengths, device=self.device) - 1
        hidden_last, features = torch.empty(0), []
        for offset in range(0, P, self.prefill_chunk):
            chunk = ids[:, offset:offset + self.prefill_chunk]
            prefix = torch.full((B,), offset, dtype=torch.long, device=self.device)
            meta = BatchMetadata.contiguous(chunk, prefix, slots, offset, self.runtime.prefill, equal_prefix=True)
            hidden = self.forward(meta, layers)
            if layers:
                hidden, captured = hidden
                features.append(torch.cat(captured, dim=-1))
            # each request's last prompt position, where it falls in this chunk
            here = (last >= offset) & (last < offset + chunk.shape[1])
            at = (last - offset).clamp(0, chunk.shape[1] - 1)
            picked = hidden[torch.arange(B, device=self.device), at]
            hidden_last = picked if offset == 0 else torch.where(here[:, None], picked, hidden_last)
        logits = self.logits(hidden_last).float()
        if not layers:
            return logits
        full = torch.cat(features, dim=1)
        return logits, [full[i, :n] for i, n in enumerate(lengths)]

    @inference
    def prefill_features(self, slot: int, token_ids: list[int], layers: tuple[int, ...]):
        """prefill that also returns the outputs of the given decoder layers for every prompt position:
        (logits [vocab], features [P, len(layers) * hidden])."""
        self.cache.reset(torch.tensor([slot], device=self.device))
        return self.extend(slot, token_ids, 0, layers)

    @inference
    def extend(self, slot: int, token_ids: list[int], start: int, layers: tuple[int, ...] = ()):
        """Runs tokens as a causal block after the first `start` committed tokens of `slot`, in chunks; returns
        the last token's logits [vocab] (and, if `layers` is given, their features as in prefill_features)."""
        assert self.cache is not None and start + len(token_ids) <= self.cache.max_seq_len
        slots = torch.tensor([slot], device=self.device)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        features = []
        for offset in range(0, len(token_ids), self.prefill_chunk):
            chunk = ids[offset:offset + self.prefill_chunk][None]
            prefix = torch.tensor([start + offset], device=self.device)
            meta = BatchMetadata.contiguous(chunk, prefix, slots, start + offset, self.runtime.prefill)
            hidden = self.forward(meta, layers)
            if layers:
                hidden, captured = hidden
                features.append(torch.cat(captured, dim=-1)[0])
        logits = self.logits(hidden[0, -1]).float()
        return (logits, torch.cat(features)) if layers else logits

    @inference
    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of the first B slots at the given positions; advances positions in place.

        input_ids [B], positions [B] (device) -> logits [B, vocab] fp32, under runtime.decode. No host sync.
        """
        B = input_ids.shape[0]
        if self.runtime.cuda_graphs:
            graph = self.graphs.get(B)
            if graph is None:
                graph = self.graphs[B] = self._capture(B)
            logits = graph.replay(input_ids, positions)
            if positions.data_ptr() != graph.positions.data_ptr():
                positions.add_(1)
            return logits
        slots = torch.arange(B, device=self.device)
        meta = decode_metadata(input_ids, positions, slots, self.runtime.decode)
        logits = self.model.logits(self.model(meta, self.cache), meta.paths)[:, 0].float()
        positions.add_(1)
        return logits

    def _capture(self, batch_size: int) -> DecodeGraph:
        # capture runs warm-up steps that write slot state, so it happens before any prefill of this batch
        saved = self.cache.snapshot(torch.arange(batch_size, device=self.device))
        graph = DecodeGraph(self.model, self.cache, batch_size, self.runtime.decode)
        self.cache.restore(saved)
        return graph
