"""explain over rows another engine's own tracing filled: a phase that engine does not emit reads
"not measured (engine X does not emit it)", never 0 ms, and a phase it does emit is measured."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.diagnose.explain import explain
from tailtrace.diagnose.source import Scope, db_query
from tailtrace.diagnose.tail import not_measured_why
from tests.collector.test_engines import bodies


def _explain(tmp_path, fixture: str):
    path = tmp_path / "s.duckdb"
    st = DuckDBStore(path).start()
    for b in bodies(fixture):
        st.submit(traces_to_batch(ExportTraceServiceRequest.FromString(b))).result(30)
    st.stop()
    query, close = db_query(path)
    try:
        return {p.column: (p.measured, p.why) for p in explain(query, Scope(metric="e2e", all_runs=True)).phases}
    finally:
        close()


def test_tgi_rows_say_which_phases_tgi_does_not_emit(tmp_path):
    ph = _explain(tmp_path, "tgi-3.x.otlp.bin")
    for col in ("prefill_ms", "decode_ms", "preempted_ms"):
        assert ph[col] == (False, "engine TGI does not emit it"), col
    assert ph["queue_ms"] == (True, None) and ph["frontend_ms"] == (True, None)
    assert ph["gateway_ms"][0] is False and "TGI" not in ph["gateway_ms"][1]   # not the engine's to emit


def test_sglang_rows_measure_its_phases_and_name_only_its_missing_one(tmp_path):
    ph = _explain(tmp_path, "sglang-0.5.23.otlp.bin")
    for col in ("frontend_ms", "queue_ms", "prefill_ms", "decode_ms"):
        assert ph[col] == (True, None), col
    assert ph["preempted_ms"] == (False, "engine SGLang does not emit it")


def test_a_mixed_scope_names_every_engine_and_a_plugin_row_keeps_the_layers_reason():
    assert not_measured_why("prefill_ms", None, ("tgi-native", "trtllm-native")) == \
        "engines TGI, TensorRT-LLM do not emit it"
    # one source that does emit it: the phase's own reason, not an engine's
    assert "engine" not in not_measured_why("prefill_ms", None, ("tgi-native", "sglang-native")).split(" ")[0]
