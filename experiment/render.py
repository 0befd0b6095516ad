"""A Comparison as text (rich) or JSON (docs/compare.schema.json). Reads only the Comparison (or its
dict, as `try --format json` wrote it)."""

from __future__ import annotations

import json
import math

from tailtrace.semantics.catalog import format_ms, quantile_label

__all__ = ["comparison_lines", "render_json", "render_text", "verdict_text"]


def render_json(doc: dict) -> str:
    """The comparison's JSON document (`Comparison.to_dict()`, or `try`'s with its blocks)."""
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _pct(r: float | None) -> str:
    return "—" if r is None else f"{(r - 1) * 100:+.1f}%".replace("-", "−")


def _level(doc: dict) -> str:
    return f"{doc.get('confidence', 0.95) * 100:g}%"


def _signed(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    return ("+" if ms >= 0 else "−") + format_ms(abs(ms))


def comparison_lines(doc: dict) -> list[str]:
    """The headline lines: per objective the verdict of B against A with its interval, the shift of
    each phase in that tail (largest first), goodput, and the smallest change the blocks could see."""
    a, b = doc["arms"]["A"], doc["arms"]["B"]
    only = f", {doc['priority']} requests only" if doc.get("priority") else ""
    mode = {"embedded": "on the embedded stack, ", "urls": "between two URLs (nothing changed), "}.get(doc.get("mode"), "")
    out = [(f"B against A {mode}over {doc['blocks']['pairs']} block pair(s) ({doc['blocks']['unit']}s, at least "
           f"{doc['blocks']['requests_min']} requests each{only}); objectives {doc['slo']}")]
    seq = doc.get("sequential") or {}
    if seq.get("k_max", 0) > seq.get("k_min", 0):
        out.append(f"  pairs added until decided: looks after every pair from {seq['k_min']} to {seq['k_max']}, "
                   f"each interval a Pocock repeated interval (critical value {seq['crit']}); "
                   + ("decided" if seq.get("decided") else f"stopped undecided ({seq.get('stopped', 'budget spent')})"))
    rows = {(m["metric"], m["quantile"]): m for m in doc["metrics"]}
    for o in doc["objectives"]:
        m = rows.get((o["metric"], o["quantile"]))
        if m is None:
            out.append(f"  {o['objective']}: {o.get('why') or 'not compared'}")
            continue
        met = (f"; objective {format_ms(o['target_ms'])}: A {_met(o['a_met'])}, B {_met(o['b_met'])}")
        head = f"  {m['metric'].upper()} {m['label']} {format_ms(m['a_ms'])} → {format_ms(m['b_ms'])}"
        if m["ratio_low"] is None:
            out.append(f"{head}: {m['verdict']} ({m['why']}){met}")
            continue
        seen = "" if not m["mde"] else f"; could detect {_pct(math.exp(-m['mde']))} or {_pct(math.exp(m['mde']))}"
        out.append(f"{head} ({_signed(m['diff_ms'])}; {_level(doc)} interval {_pct(m['ratio_low'])} .. "
                   f"{_pct(m['ratio_high'])}{seen}): {verdict_text(m, doc)}{met}")
    for o in doc["objectives"]:
        if o.get("crossed") == "missed by B":
            out.append(f"  !! B moves {o['metric'].upper()} {quantile_label(o['quantile'])} over its objective: "
                       f"{format_ms(o['a_ms'])} → {format_ms(o['b_ms'])} against {format_ms(o['target_ms'])} "
                       f"(A met it, B misses it; the change reads {o['change']})")
        elif o.get("crossed") == "met by B":
            out.append(f"  B brings {o['metric'].upper()} {quantile_label(o['quantile'])} within its objective: "
                       f"{format_ms(o['a_ms'])} → {format_ms(o['b_ms'])} against {format_ms(o['target_ms'])}")
    for t in doc["tail_phases"]:
        moved = sorted((p for p in t["phases"] if p["shift_ms"] is not None), key=lambda p: -abs(p["shift_ms"]))[:4]
        absent = [p["phase"] for p in t["phases"] if p["shift_ms"] is None]
        text = ", ".join(f"{p['phase'].lower()} {_signed(p['shift_ms'])}" for p in moved) or "no phase measured"
        out.append(f"  in the {t['metric'].upper()} {t['label']} tail: {text}"
                   + (f" (not measured: {', '.join(absent)})" if absent else ""))
    gp = [(x["goodput_rps"], x["goodput_share"]) for x in (a, b)]
    if all(g is not None and share is not None for g, share in gp):
        out.append(f"  goodput at the SLO: A {gp[0][0]:.2f} req/s ({gp[0][1]:.0%} of requests), "
                   f"B {gp[1][0]:.2f} req/s ({gp[1][1]:.0%})")
    out.append(f"  failed: A {a['failed']} of {a['requests']}, B {b['failed']} of {b['requests']}")
    return out


def _met(v) -> str:
    return "n/a" if v is None else "met" if v else "missed"


def verdict_text(m: dict, doc: dict | None = None) -> str:
    """A metric row's verdict as the report shows it: BETTER / WORSE, "same (within ±10%)",
    "inconclusive: add 4 pairs (at the spread seen so far)", or why there is none ("P999 needs
    500+ requests per block (has 60)")."""
    v = m["verdict"]
    if m["ratio_low"] is None:
        return m["why"] or v
    if v in ("better", "worse"):
        return v.upper()
    if v == "same":
        margin = (doc or {}).get("sequential", {}).get("margin", 0.1)
        return f"same (within ±{margin:.0%})"
    return f"{v}: {m['why']}" if m.get("why") else v


def render_text(doc: dict, console) -> None:
    """The headline, then the table of every metric and quantile: A, B, B−A, the 95% interval of the
    difference (ms and relative), pairs, verdict; then the notes."""
    from rich.table import Table

    for line in comparison_lines(doc):
        console.print(line, highlight=False)
    table = Table(title=None, show_lines=False)
    for col in ("metric", "A", "B", "B−A", f"{_level(doc)} interval", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right", no_wrap=col != "verdict")
    for m in doc["metrics"]:
        if m["ratio_low"] is not None:
            ci = f"{_pct(m['ratio_low'])} .. {_pct(m['ratio_high'])}"
        else:
            ci = "—"
        verdict = verdict_text(m, doc)
        table.add_row(f"{m['metric'].upper()} {m['label']}", format_ms(m["a_ms"]), format_ms(m["b_ms"]),
                      _signed(m["diff_ms"]), ci, verdict)
    console.print(table)
    for note in doc.get("notes") or []:
        console.print(f"note: {note}", highlight=False)
