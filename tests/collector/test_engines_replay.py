"""The engine fixtures replayed (collector/testing/engine_fixtures.py): copies keep every span's
shape with new ids and moved times, and the replay command stores them through the real collector
(what docs/engines.md shows a user without SGLang, TensorRT-LLM or TGI)."""

from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.testing.engine_fixtures import copies, main, request

MS = 1_000_000


def _spans(req):
    return [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]


def test_copies_keep_the_fixture_with_new_ids_and_moved_times():
    src = _spans(request("sglang"))
    end = 1_900_000_000 * 10**9
    got = [_spans(ExportTraceServiceRequest.FromString(b)) for b in copies("sglang", 3, 500.0, end_ns=end)]
    first = min(sp.start_time_unix_nano for sp in src)
    seen_traces = set()
    for k, spans in enumerate(got):
        assert Counter((sp.name, sp.end_time_unix_nano - sp.start_time_unix_nano) for sp in spans) == Counter(
            (sp.name, sp.end_time_unix_nano - sp.start_time_unix_nano) for sp in src)
        ids = {sp.span_id for sp in spans}
        assert not ids & {sp.span_id for sp in src}
        # parents follow their spans: every parent the fixture had inside it is a span of the copy
        assert sum(sp.parent_span_id in ids for sp in spans) == sum(sp.parent_span_id in {s.span_id for s in src}
                                                                    for sp in src) > 0
        traces = {sp.trace_id for sp in spans}
        assert len(traces) == len({sp.trace_id for sp in src}) and not traces & seen_traces
        seen_traces |= traces
        shift = min(sp.start_time_unix_nano for sp in spans) - first
        assert shift - (min(sp.start_time_unix_nano for sp in got[0]) - first) == k * 500 * MS
    assert max(sp.end_time_unix_nano for sp in got[-1]) == end


def test_the_replay_command_stores_the_copies_through_the_real_collector(session_collector, capsys):
    c = session_collector
    q = "SELECT count(*) FROM requests WHERE source = 'tgi-native'"
    before = c.sql(q)[0][0]
    steps = c.sql("SELECT count(*) FROM engine_steps")[0][0]
    assert main(["--engine", "tgi", "--copies", "4", "--gap-ms", "50", "--to", c.otlp_url]) == 0
    assert "sent 4 copies of the tgi fixture" in capsys.readouterr().out
    assert c.sql(q)[0][0] - before == 12                        # 3 requests a copy
    assert c.sql("SELECT count(*) FROM engine_steps")[0][0] - steps == 24   # 6 batch spans a copy
    assert {r[0] for r in c.sql("SELECT DISTINCT e2e_ms FROM requests WHERE source = 'tgi-native'")} >= {
        1243.1534, 612.004, 91.25}


def test_bad_replay_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--engine", "tgi", "--copies", "0"])
    assert e.value.code == 2
    assert main(["--engine", "trtllm", "--copies", "1", "--to", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: http://127.0.0.1:9:") and "tailtrace collect" in err[-1]
