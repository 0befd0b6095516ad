"""The report as text (rich), Markdown or JSON. Each renderer reads only the Report."""

from __future__ import annotations

import json

from tailtrace.diagnose.actions import Action, render_action
from tailtrace.diagnose.report import Evidence, Report, TraceReport
from tailtrace.semantics.catalog import format_ms, format_share

__all__ = ["render_json", "render_markdown", "render_text", "waterfall_lines"]

_BAR = 48


def render_json(report: Report) -> str:
    """The report as JSON (docs/explain.schema.json), one document."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False)


def _try(a) -> str:
    """An action (an Action, or its dict in a report read back) as its `try:` line."""
    return render_action(a if isinstance(a, Action) else Action(**a))


def objective_lines(report: Report) -> list[str]:
    """The objectives' verdicts, worst first, one line each (`TTFT P99 8.0 s against 2,000 ms: MISSED
    (4.00x)`), then the scope they were judged over."""
    if not report.objectives:
        return []
    runs = report.scope.get("runs") or {}
    out = [f"objectives ({report.scope.get('slo')}) over {runs.get('label', 'the scope')}:"]
    out += [f"  {v.text()}" for v in report.objectives]
    return out


def _reports(report: Report) -> list[Report]:
    return [report, *report.also]


def _head(report: Report) -> str:
    ts = report.tail
    return (f"{ts.metric.upper()} tail ({ts.column}): {ts.n_tail} of {ts.n} ok requests above the {ts.label} "
            f"{format_ms(ts.threshold_ms)} (median {format_ms(ts.median_ms)}); excess over the median "
            f"{format_ms(ts.excess_ms)} in all, window {ts.window['start']} .. {ts.window['end']}")


def _numbers(ev: Evidence) -> str:
    parts = []
    for k, v in ev.numbers.items():
        if isinstance(v, list):
            parts.append(f"{k}: " + "; ".join(", ".join(f"{a}={b}" for a, b in x.items()) if isinstance(x, dict)
                                             else str(x) for x in v))
        elif isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def waterfall_lines(tr: TraceReport) -> list[str]:
    """The request's phases as text bars laid end to end, scaled to its E2E."""
    total = sum(max(0.0, p["ms"]) for p in tr.phases) or 1.0
    out = []
    for p in tr.phases:
        a = round(p["start_ms"] / total * _BAR)
        w = max(1, round(max(0.0, p["ms"]) / total * _BAR)) if p["ms"] > 0 else 0
        out.append(f"{p['label']:<16} {' ' * a}{'█' * w}{' ' * max(0, _BAR - a - w)} {format_ms(p['ms']):>10}")
    return out


def _trace_text(tr: TraceReport) -> list[str]:
    r, s, c = tr.request, tr.steps, tr.cause
    head = (f"request {tr.trace_id} ({r.get('request_id') or 'no engine span'}): E2E {format_ms(r['outer_e2e_ms'])}, "
            f"TTFT {format_ms(r['outer_ttft_ms'])}, {r.get('prompt_tokens')} prompt / {r.get('output_tokens')} "
            f"output tokens, status {r.get('status')}, upstream {r.get('upstream') or 'n/a'}")
    lines = [head,
             *waterfall_lines(tr)]
    if s.get("steps"):
        lines.append(f"decode steps: {s['steps']}, batch {s['mean_batch_size']:.1f} sequences on average (max "
                     f"{s['max_batch_size']}); {s['steps_with_prefill']} shared the batch with "
                     f"{s['prefill_tokens_shared']} prefill tokens in all; ITL {format_ms(s['itl_with_prefill_ms'])} "
                     f"with prefill, {format_ms(s['itl_pure_decode_ms'])} pure decode")
    else:
        lines.append("decode steps: none stored for this request")
    lines.append(f"cause: [{c['layer_label']}] {c['why']} (excess {format_ms(c['excess_ms'])} over the median, "
                 f"{format_ms(c['phase_excess_ms'])} of it in {c['phase']})")
    return lines


def render_text(report: Report, console=None) -> None:
    """Print the report with rich on `console` (default: stdout, full width when piped): the
    objectives' verdicts, then the tail of each missed objective explained, worst first."""
    from rich.console import Console
    from rich.markup import escape

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
    for line in objective_lines(report):
        console.print(escape(line), style="bold" if line.startswith("objectives") else None)
    for i, r in enumerate(_reports(report)):
        if i or report.objectives:
            console.print()
        _render_one(r, console)


def _render_one(report: Report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    if report.trace:
        for line in _trace_text(report.trace):
            console.print(escape(line))
        console.print()
    if report.tail is None:
        return
    console.print(f"[bold]{escape(_head(report))}[/]")
    t = Table("phase", "layer", "median's", "tail mean", "share of excess", "holds most", title="excess by phase "
              "(adds up to 100 %)", title_justify="left")
    for p in report.phases:
        if p.measured:
            t.add_row(p.label, p.layer, format_ms(p.median_ms), format_ms(p.tail_mean_ms), format_share(p.share),
                      str(p.holds_most))
        else:
            t.add_row(p.label, p.layer, "not measured", "not measured", "—", "—")
    console.print(t)
    for p in report.phases:
        if not p.measured:
            console.print(f"   [dim]{escape(p.label)}: not measured ({escape(p.why or '')})[/]")
    if not report.findings:
        console.print("no finding: no detector found a cause in this tail")
    for f in report.findings:
        dom = ", [bold red]dominant[/]" if f.dominant else ""
        console.print(f"\n[bold]{f.rank}. \\[{escape(f.layer_label)}] {escape(f.title)}[/] — explains "
                      f"{format_share(f.share)} of the excess ({format_ms(f.explained_ms)}), confidence {f.confidence}{dom}")
        console.print(f"   {escape(f.summary)}")
        for ev in f.evidence:
            console.print(f"   [dim]evidence:[/] {escape(ev.what)}: {escape(_numbers(ev))}")
            console.print(f"   [dim]SQL ({escape(json.dumps(ev.params))}):[/] [dim]{escape(' '.join(ev.sql.split()))}[/]")
        for a in f.actions:
            console.print(f"   [bold]{escape(_try(a))}[/]  [dim]{escape(a.rationale if isinstance(a, Action) else a['rationale'])}[/]")
        for m in f.mitigations:
            console.print(f"   suggestion: {escape(m)}")
        console.print(f"   examples: {', '.join(f.example_trace_ids) or 'none'}; window "
                      f"{f.window['start']} .. {f.window['end']}")
    if report.capacity:
        console.print(f"\n[bold]capacity:[/] {escape(report.capacity.text)}")
    for n in report.notes:
        console.print(f"[yellow]note:[/] {escape(n)}")


def render_brief(report: Report, console, limit: int = 3, head: bool = True, body: bool = True) -> None:
    """The diagnosis in a few lines (`tailtrace demo`'s report): `head`, the objectives and their
    verdicts and for each missed objective its top cause with its share and first action; `body`,
    for the first, the tail's excess by layer and its first `limit` findings that explain at least
    5% of it."""
    from rich.markup import escape

    if not head:
        _brief_one(report, console, limit)
        return

    for line in objective_lines(report):
        console.print(escape(line), style="bold" if line.startswith("objectives") else None, soft_wrap=True)
    missed = [v for v in report.objectives if v.met is False]
    for r in _reports(report):
        if not missed or r.tail is None or not r.findings:
            continue
        f = r.findings[0]
        what = "expected behaviour" if f.expected_behaviour else f"top cause, {format_share(f.share)} of the excess"
        line = rf"{r.tail.metric.upper()} {r.tail.label}: {what}: \[{escape(f.layer_label)}] {escape(f.title)}"
        console.print(f"  [bold]{line}[/]", soft_wrap=True)
        if f.actions and not f.expected_behaviour:
            console.print(f"     {escape(_try(f.actions[0]))}", soft_wrap=True)
    if body:
        if report.objectives:
            console.print()
        _brief_one(report, console, limit)


def _brief_one(report: Report, console, limit: int) -> None:
    from rich.markup import escape

    if report.tail is None or report.tail.n_tail == 0:
        for n in report.notes:
            console.print(f"[yellow]note:[/] {escape(n)}")
        return
    layers = ", ".join(f"{la['label']} {format_share(la['share'])}" for la in sorted(report.layers, key=lambda la: -la["share"]))
    console.print(f"[bold]Why the tail is slow[/] ({escape(_head(report))}): excess by the layer of its phase: {escape(layers)}",
                  soft_wrap=True)
    if not report.findings:
        console.print("  no detector found a cause in this tail")
    shown = [f for i, f in enumerate(report.findings) if i == 0 or max(f.share, f.score or 0.0) >= 0.05]
    for f in shown[:limit]:
        dom = ", [bold red]dominant[/]" if f.dominant else ""
        console.print(f"  {f.rank}. \\[{escape(f.layer_label)}] [bold]{escape(f.title)}[/]: explains {format_share(f.share)} "
                      f"of the excess, confidence {f.confidence}{dom}. {escape(f.summary)}", soft_wrap=True)
        if f.actions:
            console.print(f"     {escape(_try(f.actions[0]))}", soft_wrap=True)
        elif f.mitigations:
            console.print(f"     suggestion: {escape(f.mitigations[0])}", soft_wrap=True)


def render_markdown(report: Report) -> str:
    """The report as Markdown (a phase table, one section per finding with its SQL in code blocks)."""
    out = ["# Why is it slow?", ""]
    if report.objectives:
        out += ["| objective | value | target | ratio | verdict |", "|---|---|---|---|---|"]
        out += [f"| {v.metric.upper()} {v.label} | {format_ms(v.value_ms) if v.value_ms is not None else 'not measured'} | "
                f"{format_ms(v.target_ms)} | {f'{v.ratio:.2f}x' if v.ratio is not None else '—'} | "
                f"{'met' if v.met else 'missed' if v.met is False else 'not measured (' + str(v.why) + ')'} |"
                for v in report.objectives]
        out.append("")
    for i, r in enumerate(_reports(report)):
        out += _markdown_one(r, level=2 if i == 0 and not report.also else 3, head=bool(report.also))
    return "\n".join(out).rstrip() + "\n"


def _markdown_one(report: Report, level: int, head: bool) -> list[str]:
    h = "#" * level
    out = [f"{'#' * (level - 1)} {report.tail.metric.upper()} {report.tail.label}", ""] if head and report.tail else []
    if report.trace:
        out += [f"{h} One request", "", "```", *_trace_text(report.trace), "```", ""]
    if report.tail is not None:
        out += [_head(report), "", "| phase | layer | median's | tail mean | share of excess |", "|---|---|---|---|---|"]
        out += [f"| {p.label} | {p.layer} | {format_ms(p.median_ms)} | {format_ms(p.tail_mean_ms)} | {format_share(p.share)} |"
                if p.measured else f"| {p.label} | {p.layer} | not measured ({p.why}) | — | — |"
                for p in report.phases]
        out.append("")
        for f in report.findings:
            what = (f"Explains **{format_share(f.share)}** of the excess ({format_ms(f.explained_ms)}); confidence "
                    f"{f.confidence}{'; dominant' if f.dominant else ''}. {f.summary}.")
            out += [f"{h} {f.rank}. {f.title} ({f.layer_label})", "", what, ""]
            for ev in f.evidence:
                out += [f"- {ev.what}: {_numbers(ev)}", "", "  ```sql", *("  " + line for line in ev.sql.splitlines()),
                        "  ```", f"  params: `{json.dumps(ev.params)}`", ""]
            out += [f"- **{_try(a)}** — {a.rationale if isinstance(a, Action) else a['rationale']}" for a in f.actions]
            out += [f"- suggestion: {m}" for m in f.mitigations]
            ids = ", ".join(f"`{t}`" for t in f.example_trace_ids) or "none"
            out += [f"- examples: {ids}; window {f.window['start']} .. {f.window['end']}", ""]
    if report.capacity:
        out += [f"**Capacity:** {report.capacity.text}", ""]
    out += [f"> note: {n}" for n in report.notes]
    out.append("")
    return out
