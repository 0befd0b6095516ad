"""explain over rows another engine's own tracing filled: a phase that engine does not emit reads
"not measured (engine X does not emit it)", never 0 ms, and a phase it does emit is measured; TGI's
unsplit prefill + decode (its `inference_time`) is a phase of the E2E split, not unattributed."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.engine_fixtures import bodies
from tailtrace.diagnose.explain import explain
from tailtrace.diagnose.source import Scope, db_query
from tailtrace.diagnose.tail import not_measured_why


def _report(tmp_path, fixture: str, trace_id: str | None = None):
    path = tmp_path / "s.duckdb"
    st = DuckDBStore(path).start()
    for b in bodies(fixture):
        st.submit(traces_to_batch(ExportTraceServiceRequest.FromString(b))).result(30)
    st.stop()
    query, close = db_query(path)
    try:
        return explain(query, Scope(metric="e2e", all_runs=True, trace_id=trace_id))
    finally:
        close()


def _explain(tmp_path, fixture: str):
    return {p.column: (p.measured, p.why) for p in _report(tmp_path, fixture).phases}


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


def test_tgi_inference_time_is_a_phase_of_the_split_not_unattributed(tmp_path):
    """The fixture's three TGI requests: E2E 91.25 (no inference_time), 612.004 (inference 610.5) and
    1243.1534 ms (inference 1240.3), the tail above the P99. The median's profile is the middle
    request's; the tail's excess (631.1494 ms) is its inference's 629.8 ms, frontend's 1.5, queue's 0.35
    and unattributed's 0.0034 - 0.503999. Before, the inference was in no phase: the shares did not
    add up to 1 and the frontend's 1.5 ms held the tail."""
    tail_tid = "4bf92f3577b34da6a3ce929d0e0e4738"
    rep = _report(tmp_path, "tgi-3.x.otlp.bin", trace_id=tail_tid)
    ph = {p.column: p for p in rep.phases}
    inf = ph["inference_ms"]
    assert (inf.measured, inf.layer, inf.label) == (True, "compute_hardware",
                                                     "Inference (prefill + decode, not split by the engine)")
    assert inf.excess_ms == pytest.approx(1240.3 - 610.5, abs=1e-6) and inf.holds_most == 1
    assert inf.median_ms == pytest.approx(610.5, abs=1e-6)
    assert ph["unattributed_ms"].excess_ms == pytest.approx(0.0034 - 0.503999, abs=1e-6)
    assert sum(p.share for p in rep.phases) == pytest.approx(1.0, abs=1e-9)
    assert max(rep.phases, key=lambda p: p.excess_ms).column == "inference_ms"
    # the one request: its waterfall has the bar after the frontend and queue, and it holds the request
    bars = {b["column"]: b["ms"] for b in rep.trace.phases}
    assert bars["inference_ms"] == pytest.approx(1240.3) and "prefill_ms" not in bars
    assert (rep.trace.cause["phase"], rep.trace.cause["layer"]) == ("inference_ms", "compute_hardware")


def test_a_scope_no_engine_of_which_times_inference_unsplit_has_no_such_phase(tmp_path):
    ph = _explain(tmp_path, "sglang-0.5.23.otlp.bin")
    assert "inference_ms" not in ph and "prefill_ms" in ph
