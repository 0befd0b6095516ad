"""What an exporter dropped, told to the store: one OTLP metric, sent once the collector answers again.

tailtrace's exporters never block the process they run in: a batch the collector does not take (down,
overloaded past the retry budget, a permanent error) is dropped, and a bounded queue drops what does not
fit. Each exporter counts both (`DirectOTLPSpanExporter.failed`, `DecodeStepWriter.dropped` / `failed`);
`DropReport` sends those counts to the collector as a cumulative OTLP Sum, `tailtrace.exporter.dropped_spans`
(attributes `tailtrace.exporter`: which exporter, `tailtrace.drop.reason`: `export_failed` | `queue_full` |
`bad_value`; the exporter's resource, so `service.name` says which process), after the next export that
succeeded: the collector is up then, and the count reaches `metric_points`. The dashboard's Overview
shows it. What it cannot count: spans held in a process's memory when that process is killed (kill -9);
the store shows them as the layers a request lacks: their columns are NULL (docs/schema.md).
"""

from __future__ import annotations

import logging
import time

from tailtrace.instrument import semconv as sc
from tailtrace.plumbing.otlp_values import fill_attributes

__all__ = ["DropReport"]

log = logging.getLogger("tailtrace.otlp")


class DropReport:
    """Cumulative drop counts of one exporter (`name`), sent to `{endpoint}/v1/metrics` when they
    changed. `report(resource, counts)` is called by the exporter's own thread after a successful
    export; it sends at most once per `min_interval_s` and never raises."""

    def __init__(self, endpoint: str, name: str, timeout_s: float = 2.0, min_interval_s: float = 1.0) -> None:
        self.url = endpoint.rstrip("/") + "/v1/metrics"
        self.name = name
        self.timeout_s = timeout_s
        self.min_interval_s = min_interval_s
        self.start_ns = time.time_ns()
        self._sent: dict[str, int] = {}
        self._last = float("-inf")
        self._sender = None

    def report(self, resource: dict, counts: dict[str, int]) -> bool:
        """Send `counts` (reason -> spans dropped since start) unless none changed since the last
        send or the last send was under `min_interval_s` ago. Returns whether a send succeeded."""
        changed = {k: v for k, v in counts.items() if v and v != self._sent.get(k)}
        now = time.monotonic()
        if not changed or now - self._last < self.min_interval_s:
            return False
        self._last = now
        try:
            if self._sender is None:
                from tailtrace.instrument.otlp_http import OtlpHttpSender

                self._sender = OtlpHttpSender(self.url, self.timeout_s, signal="metrics")
            ok = bool(self._sender.send(self._body(resource, counts)))
        except Exception:
            log.debug("drop count not sent", exc_info=True)
            return False
        if ok:
            self._sent.update({k: v for k, v in counts.items() if v})
        return ok

    def _body(self, resource: dict, counts: dict[str, int]) -> bytes:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        fill_attributes(rm.resource.attributes, resource)
        sm = rm.scope_metrics.add()
        sm.scope.name = "tailtrace.exporter"
        m = sm.metrics.add()
        m.name, m.unit = sc.DROPPED_SPANS_METRIC, "{span}"
        m.description = "spans an exporter dropped (the collector did not take them, or its queue was full)"
        m.sum.is_monotonic, m.sum.aggregation_temporality = True, AGGREGATION_TEMPORALITY_CUMULATIVE
        now = time.time_ns()
        for reason, n in sorted(counts.items()):
            if not n:
                continue
            dp = m.sum.data_points.add()
            dp.start_time_unix_nano, dp.time_unix_nano, dp.as_int = self.start_ns, now, int(n)
            fill_attributes(dp.attributes, {sc.EXPORTER: self.name, sc.DROP_REASON: reason})
        return req.SerializeToString()
