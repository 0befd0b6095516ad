"""explain's report over another engine's rows names that engine, never vLLM: the frontend phase
("SGLang frontend", not "vLLM frontend"), the rest of TTFT, the queue finding ("in SGLang's
scheduler"), a request's cause, the note on the engine's configuration. A mixed fleet (vLLM and
SGLang in one store) names both and keeps each engine's phases apart by `source` and `service`.
The engine names live once, in semantics/engines.py."""

from __future__ import annotations

import os

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.engine_fixtures import ENGINES, bodies
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.diagnose.explain import explain
from tailtrace.diagnose.render import render_json, render_markdown
from tailtrace.diagnose.source import Scope, db_query
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.engines import engine_words, for_engines


def _vllm_native_body() -> bytes:
    """One request of vLLM's own tracing (its `llm_request` span, scope vllm.llm_engine)."""
    tb = TraceBuilder()
    tb.span("vllm-a", sc.SPAN_VLLM_REQUEST, T0, T0 + 900 * MS, trace_id=os.urandom(16), attrs={
        sc.GEN_AI_LATENCY_TTFT: 0.12, sc.GEN_AI_LATENCY_E2E: 0.9, sc.GEN_AI_LATENCY_QUEUE: 0.02,
        sc.GEN_AI_LATENCY_PREFILL: 0.095, sc.GEN_AI_LATENCY_DECODE: 0.78, sc.GEN_AI_REQUEST_ID: "cmpl-1"})
    tb.req.resource_spans[0].scope_spans[0].scope.name = "vllm.llm_engine"
    return tb.bytes()


def _store(tmp_path, *bodies_):
    path = tmp_path / "s.duckdb"
    st = DuckDBStore(path).start()
    for b in bodies_:
        st.submit(traces_to_batch(ExportTraceServiceRequest.FromString(b))).result(30)
    st.stop()
    return path


def _texts(path, metric: str, **kw) -> tuple[str, list[str]]:
    """The rendered report (Markdown + JSON) of `metric`'s P99 tail over every run, and the phase labels."""
    query, close = db_query(path)
    try:
        tid = query("SELECT trace_id FROM requests ORDER BY e2e_ms DESC LIMIT 1", [])[0][0]
        rep = explain(query, Scope(metric=metric, all_runs=True, trace_id=tid if metric == "e2e" else None, **kw))
        return render_markdown(rep) + render_json(rep), [p.label for p in rep.phases]
    finally:
        close()


@pytest.mark.parametrize(("engine", "metrics", "frontend"), [
    ("sglang", ("e2e", "ttft"), "SGLang frontend"),
    ("tgi", ("e2e",), "TGI frontend"),          # TGI sends no first-token time: no TTFT report
    ("trtllm", ("e2e", "ttft"), "TensorRT-LLM frontend"),
])
def test_a_non_vllm_stores_report_never_says_vllm(tmp_path, engine, metrics, frontend):
    path = _store(tmp_path, *bodies(ENGINES[engine]))
    for metric in metrics:
        text, labels = _texts(path, metric)
        assert "vLLM" not in text, [line for line in text.splitlines() if "vLLM" in line][:5]
        if metric == "e2e":
            assert frontend in labels
        else:
            assert any(lab.startswith("Rest of TTFT (" + frontend) for lab in labels), labels


def test_the_queue_finding_and_a_requests_cause_name_the_engine(tmp_path):
    """SGLang's fixture: the tail request queued 20 ms more than the median (its only excess of
    note): the finding says whose scheduler, and so does the request's cause."""
    text, _ = _texts(_store(tmp_path, *bodies(ENGINES["sglang"])), "e2e")
    assert "in SGLang's scheduler" in text
    assert "SGLang's own spans do not carry it" in text


def test_a_vllm_store_still_says_vllm(tmp_path):
    text, labels = _texts(_store(tmp_path, _vllm_native_body()), "e2e")
    assert "vLLM frontend" in labels and "SGLang" not in text


def test_a_mixed_fleet_names_both_engines_and_keeps_their_phases_apart(tmp_path):
    """vLLM's own span and SGLang's two requests in one store: the report's labels name both engines;
    each engine's rows keep their own source, service and phases (SGLang measures its frontend, vLLM's
    own span does not), so a phase one engine does not emit is NULL on its rows only."""
    path = _store(tmp_path, *bodies(ENGINES["sglang"]), _vllm_native_body())
    _text, labels = _texts(path, "e2e")
    assert "vLLM/SGLang frontend" in labels
    query, close = db_query(path)
    try:
        got = query("SELECT source, service_name, count(*), count(frontend_ms), count(queue_ms), "
                    "round(avg(queue_ms), 3) FROM requests GROUP BY ALL ORDER BY 1", [])
    finally:
        close()
    assert [tuple(r) for r in got] == [("sglang-native", "sglang", 2, 2, 2, 20.0), ("vllm-native", "vllm-a", 1, 0, 1, 20.0)]


def test_the_names_are_said_once():
    assert engine_words(["TGI", "vLLM", None, "SGLang", "vLLM"]) == "vLLM/SGLang/TGI"
    assert for_engines("vLLM frontend", ["TGI"]) == "TGI frontend"
    assert for_engines("vLLM frontend", []) == "vLLM frontend"   # no engine spans: tailtrace's own stack


def test_the_run_summarys_phase_table_names_the_engine(tmp_path):
    """collector.query.summary.phase_percentiles (the demo's and the report's phase table) over TGI rows."""
    from tailtrace.collector.query import summary

    query, close = db_query(_store(tmp_path, *bodies(ENGINES["tgi"])))
    try:
        phases = [r["phase"] for r in summary.phase_percentiles(query)]
    finally:
        close()
    assert "TGI frontend" in phases and not any("vLLM" in p for p in phases)


def test_a_ttft_objective_over_tgi_rows_says_tgi_does_not_emit_it(tmp_path):
    """TGI's spans carry no first-token time: the TTFT objective is not measured, and says whose."""
    from tailtrace.diagnose.objectives import evaluate
    from tailtrace.semantics.slo import parse_slo

    query, close = db_query(_store(tmp_path, *bodies(ENGINES["tgi"])))
    try:
        got = {v.metric: v for v in evaluate(query, parse_slo("ttft_p99=2s,tpot_p99=100ms,e2e_p99=10s"), "1=1", [])}
    finally:
        close()
    assert got["ttft"].value_ms is None and got["ttft"].why.endswith("; engine TGI does not emit it)")
    assert got["tpot"].value_ms is None and "engine TGI does not emit it" in got["tpot"].why
    assert got["e2e"].value_ms is not None and got["e2e"].why is None
