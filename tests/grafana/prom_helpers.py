"""Helpers of the alerting tests: a real Prometheus (Debian's package) on a free port, and OTLP
request traces with chosen phase durations, shaped per instrument/semconv.py."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tailtrace.instrument import semconv as sc
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http


class Prometheus:
    """A real `prometheus` scraping `targets` (host:port, path /metrics) every 3 s (a scrape of the
    collector takes up to ~1 s on 2 busy cores) and
    evaluating `rule_files` every second. `query(expr)` runs an instant query via the HTTP API."""

    def __init__(self, tmp: Path, targets: list[str], rule_files: list[Path]):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: `make sysdeps` (apt-get install prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "tailtrace", "scrape_interval": "3s", "scrape_timeout": "3s",
                                 "static_configs": [{"targets": targets}]}],
        }
        self.config = tmp / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.log = tmp / "prometheus.log"
        self.proc = start_process([
            binary, f"--config.file={self.config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
        ], log_path=self.log)
        try:
            wait_http(f"{self.url}/-/ready", 60, self.proc, "prometheus")
        except Exception:
            self.stop()
            raise

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query; the result vector: [{"metric": {...}, "value": [ts, "v"]}]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def wait_for(self, expr: str, until, timeout_s: float = 30.0) -> list[dict]:
        """Re-run `expr` until `until(result)` holds (a scrape arrives every 3 s); returns the last
        result either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            res = self.query(expr)
            if until(res) or time.monotonic() > deadline:
                return res
            time.sleep(0.5)

    def stop(self) -> None:
        stop_process(self.proc, 10)


@dataclass(frozen=True)
class Shape:
    """Durations (ms) of one synthetic request's phases and its output length.

    The trace: gateway server span G (phase gateway) > gateway.admission A + gateway.upstream U >
    llm.request R > llm.queue, llm.prefill, llm.decode; G - A - U = gateway_ms, U - R = network_ms.
    With `steps`, R carries the per-token time array (decode_steps, ITL = decode / (output - 1)).
    """

    queue: float = 5.0
    prefill: float = 20.0
    decode: float = 80.0
    output_tokens: int = 9
    gateway: float = 2.0
    admission: float = 0.5
    network: float = 1.0
    steps: bool = True


def send_requests(otlp_url: str, model: str, shape: Shape, n: int, end_ns: int, service: str = "alert-test") -> None:
    """Export `n` request traces of `model` with `shape`, all ending at `end_ns`, through the
    OpenTelemetry SDK's OTLP/HTTP exporter to the collector at `otlp_url`; flushes before return."""
    from opentelemetry import trace

    from tailtrace.instrument.otel import make_tracer_provider

    provider = make_tracer_provider(service, otlp_url, max_queue_size=1 << 20, max_export_batch_size=2048,
                                    schedule_delay_ms=200)
    tracer = provider.get_tracer("tailtrace.tests.grafana")
    ms = 1_000_000
    s = shape
    r_dur = s.queue + s.prefill + s.decode
    u_dur = r_dur + s.network
    g_dur = s.gateway + s.admission + u_dur
    itl = s.decode / max(s.output_tokens - 1, 1)
    for i in range(n):
        g1 = end_ns - i * 1000  # 1 us apart: distinct, all "now"
        g0 = g1 - int(g_dur * ms)
        a0 = g0 + int(s.gateway * ms / 2)
        a1 = a0 + int(s.admission * ms)
        u0 = a1
        u1 = u0 + int(u_dur * ms)
        r0 = u0 + int(s.network * ms / 2)
        r1 = r0 + int(r_dur * ms)
        q1 = r0 + int(s.queue * ms)
        p1 = q1 + int(s.prefill * ms)
        rid = f"{model}-{i}"
        g = tracer.start_span("POST /v1/completions", start_time=g0, kind=trace.SpanKind.SERVER,
                              attributes={sc.PHASE: sc.PHASE_GATEWAY})
        gctx = trace.set_span_in_context(g)
        tracer.start_span(sc.SPAN_GATEWAY_ADMISSION, context=gctx, start_time=a0,
                          attributes={sc.PHASE: sc.PHASE_GATEWAY_QUEUE}).end(a1)
        u = tracer.start_span(sc.SPAN_GATEWAY_UPSTREAM, context=gctx, start_time=u0, kind=trace.SpanKind.CLIENT,
                              attributes={sc.PHASE: sc.PHASE_UPSTREAM})
        attrs = {
            sc.PHASE: sc.PHASE_ENGINE, sc.GEN_AI_REQUEST_MODEL: model, sc.REQUEST_ID: rid,
            sc.GEN_AI_USAGE_INPUT_TOKENS: 64, sc.GEN_AI_USAGE_OUTPUT_TOKENS: s.output_tokens,
            sc.GEN_AI_LATENCY_TTFT: (s.queue + s.prefill) / 1000, sc.STATUS: "ok",
        }
        if s.steps:
            attrs[sc.STEPS_TIME] = [p1 + int(k * itl * ms) for k in range(s.output_tokens)]
            attrs[sc.STEPS_BATCH_SIZE] = [4] * s.output_tokens
        r = tracer.start_span(sc.SPAN_LLM_REQUEST, context=trace.set_span_in_context(u), start_time=r0,
                              attributes=attrs)
        rctx = trace.set_span_in_context(r)
        tracer.start_span(sc.SPAN_LLM_QUEUE, context=rctx, start_time=r0,
                          attributes={sc.PHASE: sc.PHASE_QUEUE}).end(q1)
        tracer.start_span(sc.SPAN_LLM_PREFILL, context=rctx, start_time=q1,
                          attributes={sc.PHASE: sc.PHASE_PREFILL}).end(p1)
        tracer.start_span(sc.SPAN_LLM_DECODE, context=rctx, start_time=p1,
                          attributes={sc.PHASE: sc.PHASE_DECODE}).end(r1)
        r.end(r1)
        u.end(u1)
        g.end(g1)
    assert provider.force_flush(60_000), "the OTLP exporter did not flush"
    provider.shutdown()
