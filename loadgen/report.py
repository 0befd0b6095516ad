"""Render replay and sweep results as rich tables (stderr-free: printed to the given console)."""

from __future__ import annotations

import math

from tailtrace.loadgen.stats import METRICS, Summary

__all__ = ["print_summary", "print_sweep"]


def _ms(v) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "inf"
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def print_summary(summary: Summary, console=None, title: str = "replay") -> None:
    """Print the summary: latency percentiles (TTFT, TPOT, ITL, E2E, schedule lag, client
    queue), throughput, goodput, SLO checks, errors by kind, clipping and notes."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = summary
    t = Table(title=f"{title}: client-side latency (ms)", title_justify="left")
    t.add_column("metric")
    for q in ("p50", "p90", "p99", "p999"):
        t.add_column(q.upper(), justify="right")
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL per SSE chunk", "e2e": "E2E"}
    for m in METRICS:
        t.add_row(names[m], *(_ms(s.latency[m][q]) for q in ("p50", "p90", "p99", "p999")))
    t.add_row("schedule lag", *(_ms(s.schedule_lag_ms[q]) for q in ("p50", "p90", "p99", "p999")))
    t.add_row("client queue", *(_ms(s.client_queue_ms[q]) for q in ("p50", "p90", "p99", "p999")))
    console.print(t)
    lines = [
        (f"requests {s.requests}: {s.completed} ok, {s.failed} failed"
         + (f", {s.cancelled} cancelled (interrupted)" if s.cancelled else "") + f", in {s.duration_s:.1f} s"
         + (f" (offered {s.offered_rate:.2f} req/s)" if math.isfinite(s.offered_rate) else "")),
        f"throughput {s.throughput_rps:.2f} req/s, {s.output_tok_per_s:.0f} output tok/s"
        + (f"; goodput {s.goodput_rps:.2f} req/s" if s.goodput_rps is not None else ""),
    ]
    if s.slo:
        checks = ", ".join(f"{r['slo']} ({_ms(r['value_ms'])} ms) {'met' if r['met'] else 'MISSED'}"
                           for r in s.slo)
        lines.append(f"SLO: {checks}")
    if s.errors:
        lines.append("errors: " + ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())))
    if s.token_mismatch:
        lines.append(f"{s.token_mismatch} completed requests returned a different token count than asked")
    if s.cached_tokens is not None and s.prompt_tokens:
        lines.append(f"prefix cache: {s.cached_tokens} of {s.prompt_tokens} prompt tokens cached "
                     f"({100 * s.cached_tokens / s.prompt_tokens:.1f} %)")
    lines.extend(f"note: {n}" for n in s.notes)
    for line in lines:
        console.print(line, highlight=False)


def print_sweep(rows: list[dict], capacity: dict, console=None) -> None:
    """Print one row per rate (throughput, P50/P99/P999 TTFT, TPOT, E2E, errors, SLO) and the
    capacity line."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title="sweep (latencies in ms)", title_justify="left")
    for c in ("rate", "req/s", "tok/s"):
        t.add_column(c, justify="right")
    for m in ("TTFT", "TPOT", "E2E"):
        for q in ("P50", "P99", "P999"):
            t.add_column(f"{m} {q}", justify="right")
    t.add_column("errors", justify="right")
    t.add_column("SLO")
    for r in rows:
        s = r["summary"]
        lat = s["latency"]
        cells = [f"{r['rate']:g}", f"{s['throughput_rps']:.2f}", f"{s['output_tok_per_s']:.0f}"]
        for m in ("ttft", "tpot", "e2e"):
            cells += [_ms(lat[m][q]) for q in ("p50", "p99", "p999")]
        cells.append(str(s["failed"]))
        cells.append("-" if s["slo_met"] is None else ("met" if s["slo_met"] else "missed"))
        t.add_row(*cells)
    console.print(t)
    console.print(capacity["text"], highlight=False)
