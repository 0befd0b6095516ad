"""Engine truth on the real vLLM CPU build, with three settings production deployments use at once:
`--disable-log-stats` (stats off), `--max-num-queued-reqs 2` (vLLM's own admission limit) and
`--stream-interval 4` (several tokens per SSE chunk). One server for the three (one start: CI time).

- stats off: the plugin says at start what it did, and the engine phases are measured anyway;
- admission: a burst past the limit gives rows with status `rejected` and the limit's name, none an
  error, and the load generator counts them as overload answers (http_503), not stream errors;
- stream_interval 4: the client's TPOT (per token, from its chunks) equals the engine's per-token
  figure within 1 ms, and the engine's per-token times stay one per token.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import module_vllm, poll_sql, sql

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def truth_server(tiny_model_dir, session_collector, tmp_path_factory):
    with module_vllm(tiny_model_dir, session_collector, tmp_path_factory, "vllm-truth", decode_spans="off",
                     extra_args=["--disable-log-stats", "--max-num-queued-reqs", "2", "--stream-interval", "4"]) as s:
        yield s


def _replay(tmp_path, url, otlp, rows: list[tuple[int, int, int]], run_id: str):
    from tailtrace.loadgen.replay import ReplayConfig, run_replay

    trace = tmp_path / f"{run_id}.csv"
    trace.write_text("timestamp,input_length,output_length,hash_ids\n"
                     + "".join(f"{t},{i},{o},{k}\n" for k, (t, i, o) in enumerate(rows)))
    return run_replay(ReplayConfig(trace=str(trace), target=url, model="tiny", otlp_endpoint=otlp, jitter="none",
                                   run_id=run_id, slo=None, timeout_s=300))


def test_stats_off_is_said_at_start_and_the_phases_are_measured_anyway(truth_server, session_collector, tmp_path):
    url, log = truth_server
    text = log.read_text(errors="replace")
    assert "tailtrace: vLLM runs with --disable-log-stats; tailtrace registered a stat logger" in text, text[-3000:]
    # one request at a time: none rejected, each timed by the engine's own events
    res = _replay(tmp_path, url, session_collector.otlp_url, [(i * 1500, 64, 48) for i in range(3)], "truth-stats")
    assert not any(r.error for r in res.records), [r.error_message for r in res.records]
    api = session_collector.api_url
    rows = poll_sql(api, "SELECT queue_ms, prefill_ms, decode_ms, frontend_ms, e2e_ms, output_tokens FROM requests "
                         "WHERE run_id = ?", ["truth-stats"],
                    until=lambda r: len(r) == 3 and all(x[2] is not None for x in r), timeout_s=90)
    for queue, prefill, decode, frontend, e2e, out in rows:
        assert out == 48
        assert queue is not None and prefill is not None and prefill > 0 and decode > 0, rows
        assert frontend < e2e - decode, rows  # not the whole request filed under "vLLM frontend"
    cfg = sql(api, "SELECT any_value(resource) FROM spans WHERE name = 'llm.request' AND "
                   "trace_id IN (SELECT trace_id FROM requests WHERE run_id = ?)", ["truth-stats"])[0][0]
    vcfg = json.loads(json.loads(cfg)["tailtrace.vllm.config"])
    assert vcfg["disable_log_stats"] is True and vcfg["engine_stats"] == "forced_on"
    assert vcfg["max_num_queued_reqs"] == 2 and vcfg["stream_interval"] == 4
    steps = sql(api, "SELECT count(*), min(batch_size) FROM decode_steps WHERE request_id IN "
                     "(SELECT request_id FROM requests WHERE run_id = ?)", ["truth-stats"])[0]
    assert steps[0] == 3 * 48 and steps[1] >= 1  # one row per token, each with its measured batch


def test_a_burst_past_max_num_queued_reqs_is_rejections_with_the_reason(truth_server, session_collector, tmp_path):
    url, _ = truth_server
    n = 10
    res = _replay(tmp_path, url, session_collector.otlp_url, [(0, 32, 64)] * n, "truth-burst")
    errors = [r.error for r in res.records]
    rejected = [e for e in errors if e]
    assert len(rejected) >= n - 4, errors  # the limit holds 2 at a time (vLLM's count is approximate)
    assert set(rejected) == {"http_503"}, [r.error_message for r in res.records if r.error]
    api = session_collector.api_url
    rows = poll_sql(api, "SELECT status, rejection, count(*) FROM requests WHERE run_id = ? GROUP BY ALL ORDER BY 1",
                    # the engine's spans may come after the client's (each exporter batches on its own clock)
                    ["truth-burst"], until=lambda r: sum(x[2] for x in r if x[0] != "error") == n, timeout_s=90)
    by = {(s, rj): c for s, rj, c in rows}
    assert by.get(("rejected", "vllm.max_num_queued_reqs")) == len(rejected), rows
    assert by.get(("ok", None)) == n - len(rejected), rows
    assert not any(s == "error" for s, _, _ in rows), rows


def test_stream_interval_keeps_tpot_per_token(truth_server, session_collector, tmp_path):
    url, _ = truth_server
    res = _replay(tmp_path, url, session_collector.otlp_url, [(i * 2500, 48, 96) for i in range(2)], "truth-interval")
    recs = [r for r in res.records if not r.error]
    assert len(recs) == 2, [r.error_message for r in res.records]
    for r in recs:
        assert r.output_tokens == 96
        assert len(r.chunk_unix_nano) <= 96 // 4 + 2, len(r.chunk_unix_nano)  # several tokens per chunk
    api = session_collector.api_url
    rows = poll_sql(api, "SELECT trace_id, tpot_ms, client_ttft_ms, client_e2e_ms, output_tokens FROM requests "
                         "WHERE run_id = ?", ["truth-interval"],
                    until=lambda r: len(r) == 2 and all(x[1] is not None and x[2] is not None for x in r),
                    timeout_s=90)
    for trace_id, engine_tpot, c_ttft, c_e2e, out in rows:
        client_tpot = (c_e2e - c_ttft) / (out - 1)  # the load generator's per-token TPOT
        assert abs(client_tpot - engine_tpot) < 1.0, (client_tpot, engine_tpot)
        toks = sql(api, "SELECT count(*), count(DISTINCT time) FROM decode_steps d JOIN requests r USING "
                        "(request_id) WHERE r.trace_id = ?", [trace_id])[0]
        assert toks[0] == 96 and toks[1] >= 90, toks  # per token, not per chunk
