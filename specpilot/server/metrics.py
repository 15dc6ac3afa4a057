"""ServerMetrics: the Prometheus metrics of one server, in a registry of its own (several servers can live in one
process), named as vLLM names them with the `specpilot:` prefix so that vLLM dashboards port by a prefix change.
Every series carries a `model_name` label. docs/server.md lists each with its vLLM counterpart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specpilot.engine.stats import SpecStats

PREFIX = "specpilot:"
# vLLM's buckets for the same histograms
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")  # vLLM's finished_reason values


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        reg, labels = self.registry, ["model_name"]

        def counter(name, doc, extra=()):
            return Counter(PREFIX + name, doc, labels + list(extra), registry=reg)

        def gauge(name, doc):
            return Gauge(PREFIX + name, doc, labels, registry=reg).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        self.running = gauge("num_requests_running", "Number of requests holding an engine slot.")
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting for an engine slot.")
        self.cache_usage = gauge("kv_cache_usage_perc", "Fraction of the engine's cache slots held (1 = all).")
        self.drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.").labels(model_name)
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.").labels(model_name)
        self.accepted = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(model_name)
        self._per_pos = counter("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                                ["position"])
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.").labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.").labels(
            model_name)
        self._success = counter("request_success", "Count of finished requests, by finished_reason.",
                                ["finished_reason"])
        for reason in FINISH_REASONS:
            self._success.labels(model_name, reason)
        self.preemptions = counter("num_preemptions", "Cumulative number of preemptions.").labels(model_name)
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request: (last token - first token) / "
                              "(tokens - 1).", TPOT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds: one observation per token after the "
                             "first, the wait for its step shared by the tokens the step brought.", TPOT_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             LATENCY_BUCKETS)

    def step(self, stats: SpecStats, steps_seen: int, per_pos_seen: list[int]) -> tuple[int, list[int]]:
        """Counts a request's speculation since the last call (its steps from steps_seen on); returns the new
        (steps_seen, per_pos_seen)."""
        nodes = stats.nodes[steps_seen:]
        self.drafts.inc(sum(1 for n in nodes if n > 0))
        self.draft_tokens.inc(sum(nodes))
        self.accepted.inc(sum(stats.accepted[steps_seen:]))
        per_pos = list(stats.accepted_per_depth)
        for pos, n in enumerate(per_pos):
            seen = per_pos_seen[pos] if pos < len(per_pos_seen) else 0
            if n > seen:
                self._per_pos.labels(self.model_name, str(pos)).inc(n - seen)
        return len(stats.nodes), per_pos

    def emitted(self, gap: float, tokens: int) -> None:
        """A step brought `tokens` tokens of a request `gap` seconds after its previous ones."""
        for _ in range(tokens):
            self.itl.observe(gap / tokens)

    def finished(self, reason: str, prompt_tokens: int, tokens: int, e2e: float, ttft: float | None,
                 decode_s: float | None, preempted: int) -> None:
        self._success.labels(self.model_name, reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.preemptions.inc(preempted)
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
        if decode_s is not None and tokens > 1:
            self.tpot.observe(decode_s / (tokens - 1))

    def scheduler(self, running: int, waiting: int, slots: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.cache_usage.set(running / slots if slots else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
