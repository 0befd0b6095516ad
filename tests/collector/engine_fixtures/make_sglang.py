"""Drive SGLang's own tracing code (PyPI sglang==0.5.23, `sglang/srt/observability/trace.py` and
`req_time_stats.py`) with a stand-in scheduler and write the OTLP/HTTP protobuf bodies its exporter
sends: tests/collector/engine_fixtures/sglang-0.5.23.otlp.bin (length-prefixed bodies), and the
`/metrics` text its SchedulerMetricsCollector (`metrics_collector.py`, prometheus_client) exposes after
the same run: sglang-0.5.23.metrics.txt.

Not part of the test suite (tests read the committed .bin). To regenerate:

    python3 -m venv /tmp/sglvenv && /tmp/sglvenv/bin/pip install --no-deps sglang==0.5.23
    .venv/bin/python tests/collector/engine_fixtures/make_sglang.py /tmp/sglvenv/lib/python3.11/site-packages

Only the two tracing modules are loaded (by path); the modules they import that pull in torch
(ForwardMode, DisaggregationMode, metrics collectors, envs) are replaced by the few names they use.
The scheduler's and the tokenizer manager's calls are made in the order SGLang makes them
(scheduler.py: set_wait_queue_entry_time, set_schedule_time_batch, set_forward_entry_time, ...),
with explicit perf_counter timestamps so that every phase has a known length:

request A (rid a1b2c3d4e5f6...): tokenize 2 ms, dispatch 1 ms, request_process 1 ms, prefill_waiting
  20 ms, prefill_forward 35 ms, decode_waiting 2 ms, 4 decode_loop steps of 10 ms; first token 1 ms
  after prefill; finished 1 ms after the last step. Joined to a client trace by `traceparent`.
request B (rid 0f0e0d0c...): as A but retracted once after its second decode step (queue again
  15 ms, prefill again 30 ms), then 2 more decode steps.
"""

from __future__ import annotations

import enum
import http.server
import importlib.util
import os
import pickle
import struct
import sys
import threading
import time
import types
from pathlib import Path

SITE = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sglvenv/lib/python3.11/site-packages")
OUT = Path(__file__).with_name("sglang-0.5.23.otlp.bin")
METRICS_OUT = Path(__file__).with_name("sglang-0.5.23.metrics.txt")
BODIES: list[bytes] = []
SGLANG_METRICS_HEADER = """# source: SGLANG'S OWN OUTPUT. prometheus_client's text of SGLang 0.5.23's own SchedulerMetricsCollector
#   (PyPI sglang==0.5.23, sglang/srt/observability/metrics_collector.py) in the run that sent sglang-0.5.23.otlp.bin, driven by
#   a stand-in scheduler (make_sglang.py): only these comment lines were added.
"""


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        BODIES.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def _stub(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class _Env:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


class ForwardMode(enum.IntEnum):  # sglang/srt/model_executor/forward_batch_info.py (the three tests used)
    EXTEND = 1
    DECODE = 2

    def is_decode(self):
        return self == ForwardMode.DECODE

    def is_prefill(self):
        return self == ForwardMode.EXTEND

    def is_prebuilt(self):
        return False


class DisaggregationMode(enum.Enum):  # sglang/srt/disaggregation/utils.py
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, SITE / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    for pkg in ("sglang", "sglang.srt", "sglang.srt.observability", "sglang.srt.disaggregation",
                "sglang.srt.model_executor", "sglang.srt.managers"):
        _stub(pkg)
    res = types.SimpleNamespace(trace_level=None)
    _stub("sglang.srt.environ", envs=types.SimpleNamespace(
        SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS=_Env(50), SGLANG_OTLP_EXPORTER_MAX_EXPORT_BATCH_SIZE=_Env(512),
        SGLANG_TRACE_ASYNC=_Env(False)))
    _stub("sglang.srt.utils", get_int_env_var=lambda k, d: int(os.environ.get(k, d)),
          get_bool_env_var=lambda k, d="false": os.environ.get(k, d).lower() in ("1", "true"))
    _stub("sglang.srt.utils.poll_timer", PollTimer=object)
    _stub("sglang.srt.disaggregation.utils", DisaggregationMode=DisaggregationMode)
    _stub("sglang.srt.model_executor.forward_batch_info", ForwardMode=ForwardMode)
    _stub("sglang.srt.utils.nvtx_utils", NVTX_SCHEDULER_ENABLED=False, profile_range=None,
          scheduler_nvtx_method=None)
    ns = types.SimpleNamespace
    _stub("sglang.srt.server_args", ServerArgs=object)
    _stub("sglang.srt.runtime_context", get_resources=lambda: res,
          exports_expert_balancedness_to_prometheus=lambda: False, get_context=None, get_disagg=None,
          get_observability=None, get_parallel=None, get_serving=None,
          get_schedule=lambda: ns(prefill_delayer_max_delay_passes=30, prefill_delayer_forward_passes_buckets=None,
                                  prefill_delayer_wait_seconds_buckets=None))
    _load("sglang.srt.utils.gauge_histogram", "sglang/srt/utils/gauge_histogram.py")
    _load("sglang.srt.observability.utils", "sglang/srt/observability/utils.py")
    _load("sglang.srt.observability.scheduler_stage_metrics", "sglang/srt/observability/scheduler_stage_metrics.py")
    mc = _load("sglang.srt.observability.metrics_collector", "sglang/srt/observability/metrics_collector.py")
    _stub("sglang.srt.observability.trace_async", TraceReqContextAsync=None,
          is_async_tracing_available=lambda: False)
    trace = _load("sglang.srt.observability.trace", "sglang/srt/observability/trace.py")
    rts = _load("sglang.srt.observability.req_time_stats", "sglang/srt/observability/req_time_stats.py")
    trace.process_tracing_init(f"http://127.0.0.1:{srv.server_port}/v1/traces", "sglang")
    trace.trace_set_thread_info("Tokenizer")
    SA = trace.SpanAttributes
    # the scheduler's labels as SchedulerMetricsCollector.init_new builds them (tp 0, no PD disaggregation)
    metrics = mc.SchedulerMetricsCollector(
        labels={"model_name": "tiny", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0},
        server_args=None)
    ms = 1e-3
    t0 = time.perf_counter() + 0.05

    def at(ts):  # wait until perf_counter reaches ts: SGLang stamps the spans it ends itself with the clock
        while time.perf_counter() < ts:
            time.sleep(min(0.002, ts - time.perf_counter()))
        return ts
    reqs = [("a1b2c3d4e5f60718293a4b5c6d7e8f90", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
            ("0f0e0d0c0b0a09080706050403020100", None, 2)]
    for k, (rid, tp, retract_after) in enumerate(reqs):
        b = t0 + k * 0.5
        at(b)
        api = rts.APIServerReqTimeStats(disagg_mode=DisaggregationMode.NULL)
        api.init_trace_ctx(rid, None, {"traceparent": tp} if tp else None)
        api.set_created_time(b)
        api.set_tokenize_finish_time(b + 2 * ms)
        api.set_api_server_dispatch_time(b + 2 * ms)
        api.set_api_server_dispatch_finish_time(b + 3 * ms)
        wire = pickle.dumps(api.trace_ctx)        # tokenizer -> scheduler over ZMQ (pickled)

        out: dict = {}

        def scheduler(wire=wire, b=b, retract_after=retract_after, out=out):
            trace.trace_set_thread_info("Scheduler", 0, None, None)
            sch = rts.SchedulerReqTimeStats(disagg_mode=DisaggregationMode.NULL)
            sch.set_metrics_collector(metrics)
            at(b + 4 * ms)                        # the scheduler receives it
            sch.trace_ctx = pickle.loads(wire)
            sch.trace_ctx.rebuild_thread_context()
            sch.set_scheduler_recv_time(b + 4 * ms)
            sch.set_wait_queue_entry_time(b + 5 * ms)
            t = b + 25 * ms
            sch.set_last_scheduled_time(ForwardMode.EXTEND, t, {"bid": "p1", "batch_size": 1, "forward_mode": "prefill"})
            sch.set_forward_entry_time(t)
            t += 35 * ms
            sch.set_prefill_finished_time(t)
            out["first_token"] = t + 1 * ms
            t += 2 * ms
            steps = 4 if retract_after is None else retract_after
            for i in range(steps):
                sch.set_last_scheduled_time(ForwardMode.DECODE, t,
                                            {"bid": f"d{i}", "batch_size": 2 + i, "forward_mode": "decode"})
                t += 10 * ms
                sch.set_last_decode_finish_time(t)
            if retract_after is not None:
                at(t)
                sch.set_wait_queue_entry_time(t)                 # retracted: back to the waiting queue
                metrics.increment_retracted_reqs(1, 101, retract_after + 1)  # scheduler.py, on retraction
                t += 15 * ms
                sch.set_last_scheduled_time(ForwardMode.EXTEND, t, {"bid": "p2", "batch_size": 1, "forward_mode": "prefill"})
                sch.set_forward_entry_time(t)
                t += 30 * ms
                sch.set_prefill_finished_time(t)
                for i in range(2):
                    sch.set_last_scheduled_time(ForwardMode.DECODE, t, {"bid": f"e{i}", "batch_size": 3, "forward_mode": "decode"})
                    t += 10 * ms
                    sch.set_last_decode_finish_time(t)
            at(t)
            sch.set_completion_time(t)
            out["done"] = t

        th = threading.Thread(target=scheduler)
        th.start()
        th.join()
        at(out["done"] + 1 * ms)
        api.set_first_token_time(out["first_token"])
        n_out = 5 if retract_after is None else 1 + retract_after + 2
        attrs = {SA.GEN_AI_USAGE_COMPLETION_TOKENS: n_out, SA.GEN_AI_USAGE_PROMPT_TOKENS: 100 + k,
                 SA.GEN_AI_USAGE_CACHED_TOKENS: 64, SA.GEN_AI_REQUEST_ID: rid, SA.GEN_AI_REQUEST_MAX_TOKENS: n_out,
                 SA.GEN_AI_RESPONSE_MODEL: "tiny", SA.GEN_AI_RESPONSE_FINISH_REASONS: '["length"]'}
        api.set_finished_time(out["done"] + 1 * ms, span_attrs=attrs)
    from opentelemetry import trace as ot

    ot.get_tracer_provider().force_flush()
    srv.shutdown()
    OUT.write_bytes(b"".join(struct.pack(">I", len(x)) + x for x in BODIES))
    print(f"{OUT}: {len(BODIES)} bodies, {sum(map(len, BODIES))} bytes")
    from prometheus_client import generate_latest

    METRICS_OUT.write_bytes(SGLANG_METRICS_HEADER.encode() + generate_latest())
    print(f"{METRICS_OUT}: {METRICS_OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
