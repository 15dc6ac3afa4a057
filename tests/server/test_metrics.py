"""ServerMetrics: vLLM's names under specpilot:, a registry per server, speculative counters from SpecStats
deltas (each step counted once, per-position acceptance by position label)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from specpilot.engine.stats import SpecStats
from specpilot.server.metrics import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_speculative_counters_count_each_step_once():
    m = ServerMetrics("m")
    stats = SpecStats(nodes=[3, 0, 3], accepted=[2, 0, 1], accepted_per_depth=[2, 1])
    seen, per_pos = m.step(stats, 0, [])
    assert (seen, per_pos) == (3, [2, 1])
    stats.nodes.append(4), stats.accepted.append(3)
    stats.accepted_per_depth[:] = [3, 2, 1]
    m.step(stats, seen, per_pos)
    s = _samples(m)
    assert s[("specpilot:spec_decode_num_drafts_total", (("model_name", "m"),))] == 3  # steps with draft nodes
    assert s[("specpilot:spec_decode_num_draft_tokens_total", (("model_name", "m"),))] == 10
    assert s[("specpilot:spec_decode_num_accepted_tokens_total", (("model_name", "m"),))] == 6
    per_pos = {dict(k[1])["position"]: v for k, v in s.items()
               if k[0] == "specpilot:spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_pos == {"0": 3, "1": 2, "2": 1}


def test_finished_requests_fill_the_histograms_and_reasons():
    m = ServerMetrics("m")
    m.finished("length", prompt_tokens=5, tokens=11, e2e=1.5, ttft=0.5, decode_s=1.0, preempted=1)
    m.finished("abort", prompt_tokens=3, tokens=0, e2e=0.2, ttft=None, decode_s=None, preempted=0)
    m.scheduler(running=3, waiting=2, slots=4)
    s = _samples(m)
    label = (("model_name", "m"),)
    assert s[("specpilot:request_success_total", (("finished_reason", "length"), ("model_name", "m")))] == 1
    assert s[("specpilot:request_success_total", (("finished_reason", "abort"), ("model_name", "m")))] == 1
    assert s[("specpilot:e2e_request_latency_seconds_count", label)] == 2
    assert s[("specpilot:time_to_first_token_seconds_count", label)] == 1
    assert s[("specpilot:request_time_per_output_token_seconds_sum", label)] == 0.1  # 1 s over the 10 after the first
    assert s[("specpilot:prompt_tokens_total", label)] == 8 and s[("specpilot:num_preemptions_total", label)] == 1
    assert s[("specpilot:num_requests_running", label)] == 3 and s[("specpilot:kv_cache_usage_perc", label)] == 0.75


def test_inter_token_latency_is_one_observation_per_token():
    m = ServerMetrics("m")
    m.emitted(0.3, 3)  # three tokens from one step 0.3 s after the previous ones
    m.emitted(0.1, 1)
    s = _samples(m)
    label = (("model_name", "m"),)
    assert s[("specpilot:inter_token_latency_seconds_count", label)] == 4
    assert abs(s[("specpilot:inter_token_latency_seconds_sum", label)] - 0.4) < 1e-9


def test_each_server_has_its_own_registry():
    a, b = ServerMetrics("a"), ServerMetrics("b")
    a.generation_tokens.inc(5)
    assert _samples(b)[("specpilot:generation_tokens_total", (("model_name", "b"),))] == 0
