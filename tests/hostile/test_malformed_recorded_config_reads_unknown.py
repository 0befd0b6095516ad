"""A recorded configuration (`tailtrace.vllm.config`, `tailtrace.gateway.config`) is data from a
process, not a fact: text where a count belongs, NaN, infinity, a negative size or a list crashed
`explain` and the dashboard's Why page (`int('lots')` reading the gateway's upstream count) for the
next hour of windows. Each field is now checked where the store is read
(collector/query/deployment.py): a malformed one reads '?' with a note naming it and its value, and
the rest of the diagnosis stands."""

from __future__ import annotations

import json
import os

import pytest

from tailtrace.cli import main
from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc

N = 300  # requests; every 20th waits 800 ms or more in vLLM's queue: a tail whose cause is the engine queue

BAD = {"text": "lots", "nan": float("nan"), "inf": float("inf"), "negative": -5, "list": [3], "fraction": 2.5}


def _request(b: TraceBuilder, i: int) -> None:
    """One request, gateway -> vLLM, arriving i x 50 ms after T0: 1 ms admission, 100 ms prefill, ten
    20 ms decode steps; vLLM queue: 800 + i ms for every 20th request, else 2 ms."""
    at = lambda ms: T0 + i * 50 * MS + int(ms * MS)
    tid = os.urandom(16)
    q = 800.0 + i if i % 20 == 7 else 2.0
    g = b.span("gateway", "POST /v1/completions", at(0), at(q + 310), trace_id=tid,
               attrs={sc.PHASE: sc.PHASE_GATEWAY}).span_id
    b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, at(1), at(2), trace_id=tid, parent=g,
           attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE, sc.PRIORITY: "interactive"})
    u = b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, at(3), at(q + 308), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: "http://u1"}).span_id
    steps = [at(q + 105 + 20 * k) for k in range(10)]
    r = b.span("vllm", sc.SPAN_LLM_REQUEST, at(4), at(q + 306), trace_id=tid, parent=u, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"cmpl-{i}", sc.GEN_AI_REQUEST_MODEL: "tiny",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 100, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 10,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.STEPS_TIME: steps, sc.STEPS_BATCH_SIZE: [4] * 10,
        sc.STEPS_PREFILL_TOKENS: [0] * 10, sc.STEPS_DECODE_TOKENS: [4] * 10, sc.STEPS_KV_USAGE: [0.5] * 10}).span_id
    for s, e, name, phase in ((4, 5, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND),
                              (5, 5 + q, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE),
                              (5 + q, 105 + q, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL),
                              (105 + q, 305 + q, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE),
                              (305 + q, 306 + q, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND)):
        b.span("vllm", name, at(s), at(e), trace_id=tid, parent=r, attrs={sc.PHASE: phase})


def _store(path, value) -> str:
    """A store written by the collector's own writer (DuckDBStore): N requests whose vLLM and gateway
    resources record `value` for every count, flag and choice of their configuration."""
    vllm = {k: value for k in ("max_num_seqs", "max_num_batched_tokens", "max_num_queued_reqs", "kv_cache_tokens",
                               "block_size", "max_model_len", "enable_prefix_caching", "engine_stats",
                               "long_prefill_token_threshold", "scheduling_policy")}
    gateway = {k: value for k in ("max_concurrency", "queue_interactive", "queue_batch", "upstreams",
                                  "priority_classes", "max_input_tokens", "max_output_tokens", "truncate")}
    b = TraceBuilder(resources={"vllm": {sc.VLLM_CONFIG: json.dumps({**vllm, "version": "0.32.0"})},
                                "gateway": {sc.GATEWAY_CONFIG: json.dumps(gateway)}})
    for i in range(N):
        _request(b, i)
    store = DuckDBStore(path).start()
    try:
        store.submit(traces_to_batch(b.req)).result(60)
    finally:
        store.stop()
    return str(path)


@pytest.fixture(scope="module", params=sorted(BAD))
def bad_store(request, tmp_path_factory):
    return request.param, _store(tmp_path_factory.mktemp("cfg") / "s.duckdb", BAD[request.param])


def test_explain_reads_each_malformed_field_as_unknown_and_names_it(bad_store, capsys):
    kind, path = bad_store
    rc = main(["explain", "--db", path, "--metric", "e2e", "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)  # strict JSON: no NaN reached the output
    dep = doc["deployment"]
    assert dep["vllm"]["max_num_seqs"] is None and dep["gateway"]["upstreams"] is None
    assert dep["vllm"]["version"] == "0.32.0"  # the fields that passed are kept
    shown = repr(BAD[kind])
    assert {"where": "gateway", "key": "upstreams", "value": shown} in dep["invalid"]
    assert {"where": "vllm", "key": "max_num_seqs", "value": shown} in dep["invalid"]
    notes = [n for n in doc["notes"] if "malformed" in n]
    assert any(n.startswith("vLLM's recorded configuration") and f"max_num_seqs = {shown}" in n for n in notes), notes
    assert any(n.startswith("the gateway's recorded configuration") and f"upstreams = {shown}" in n for n in notes)
    # the diagnosis itself stands: the engine queue's tail is found, its actions read '?' not the bad value
    causes = {f["cause"]: f for f in doc["findings"]}
    assert "engine_queue" in causes, list(causes)
    for f in doc["findings"]:
        for a in f["actions"]:
            assert a["current"] is None or a["knob"] in ("replicas", "colocate", "isolate_engine"), a
    rc = main(["explain", "--db", path, "--metric", "e2e"])
    out, err = capsys.readouterr()
    assert rc == 0 and f"max_num_seqs = {shown}" in out, err


def test_the_dashboard_why_page_data_shows_the_note(bad_store):
    import datetime as dt

    from tailtrace.collector.query.reader import DuckDBSource
    from tailtrace.dashboard.queries import why
    from tailtrace.dashboard.queries.common import Filters

    kind, path = bad_store
    src = DuckDBSource(path)
    t0 = dt.datetime.fromtimestamp(T0 / 1e9, dt.UTC).replace(tzinfo=None)
    f = Filters(start=t0 - dt.timedelta(minutes=1), end=t0 + dt.timedelta(minutes=5))
    try:
        report = why.diagnose(src, f, "e2e")
    finally:
        src.close()
    assert any("malformed" in n and f"upstreams = {BAD[kind]!r}" in n for n in report.notes), report.notes
    assert report.findings and report.deployment["gateway"]["upstreams"] is None


def test_every_key_the_plugin_and_gateway_record_is_checked_and_a_sound_config_passes_unchanged():
    from types import SimpleNamespace

    from tailtrace.collector.query.deployment import GATEWAY_FIELDS, VLLM_FIELDS, validate_config
    from tailtrace.instrument.deployment import GATEWAY_KEYS, VLLM_KEYS, gateway_config, vllm_config

    sections = {}
    for key, (section, attr) in VLLM_KEYS.items():
        sections.setdefault(section, {})[attr] = {"scheduling_policy": "fcfs"}.get(key, 64)
    for key in ("enable_chunked_prefill", "async_scheduling", "enable_prefix_caching"):
        section, attr = VLLM_KEYS[key]
        sections[section][attr] = True
    written = json.loads(vllm_config(SimpleNamespace(**{s: SimpleNamespace(**a) for s, a in sections.items()}),
                                     "0.32.0", False, "on")[sc.VLLM_CONFIG])
    assert set(written) <= set(VLLM_FIELDS)
    assert validate_config("vllm", written) == (written, [])
    gw = json.loads(gateway_config(SimpleNamespace(**{k: {"priority_classes": "on", "truncate": "off", "slo": "ttft_p99=2s",
                                                       "ladder": "shed", "queue_order": "sjf"}.get(k, 8)
                                                      for k in GATEWAY_KEYS}, upstreams=("a", "b")))[sc.GATEWAY_CONFIG])
    assert set(gw) <= set(GATEWAY_FIELDS) and set(GATEWAY_KEYS) <= set(GATEWAY_FIELDS)
    assert validate_config("gateway", gw) == (gw, [])
    # a whole float is a count; a bool is not one (True == 1 in Python)
    assert validate_config("vllm", {"max_num_seqs": 256.0}) == ({"max_num_seqs": 256}, [])
    assert validate_config("vllm", {"max_num_seqs": True}) == ({"max_num_seqs": None}, [("vllm", "max_num_seqs", "True")])
