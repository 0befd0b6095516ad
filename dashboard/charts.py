"""Plotly figures of the dashboard, built from the DataFrames of dashboard/data.py (no queries here).

Every time axis is UTC; every latency axis is milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tailtrace.semantics import catalog
from tailtrace.semantics.catalog import format_ms

__all__ = [
    "PHASE_COLORS",
    "batch_sizes",
    "cdf",
    "engine_device",
    "excess_by_phase",
    "histogram",
    "itl_timeline",
    "latency_heatmap",
    "latency_over_time",
    "latency_vs_input",
    "lengths",
    "replica_latency",
    "stacked_phases",
    "tail_shares",
    "throughput",
    "waterfall",
]

# One colour per phase of the catalog, grouped by layer (blues: gateway/infra, oranges: scheduling,
# greens: compute); a phase without a colour of its own here takes its layer's.
_LAYER_COLORS = {catalog.LAYER_GATEWAY.key: "#4292c6", catalog.LAYER_SCHEDULING.key: "#fd8d3c",
                 catalog.LAYER_COMPUTE.key: "#41ab5d", catalog.LAYER_SHAPE.key: "#756bb1",
                 catalog.LAYER_NONE.key: "#bdbdbd"}
_OWN_COLORS = {
    "client_queue_ms": "#c6dbef", "network_ms": "#9ecae1", "gateway_ms": "#6baed6", "gateway_queue_ms": "#2171b5",
    "frontend_ms": "#fdae6b", "queue_ms": "#e6550d", "preempted_ms": "#a63603",
    "prefill_ms": "#74c476", "decode_ms": "#238b45", "unattributed_ms": "#bdbdbd",
}
PHASE_COLORS = {p.column: _OWN_COLORS.get(p.column, _LAYER_COLORS[p.layer.key])
                for p in (*catalog.PHASES, catalog.UNATTRIBUTED)}
SPAN_PHASE_COLORS = {
    "client": "#636363", "gateway": "#6baed6", "gateway_queue": "#2171b5", "upstream": "#4292c6",
    "network": "#9ecae1", "http": "#c6dbef", "engine": "#fd8d3c", "frontend": "#fdae6b", "queue": "#e6550d",
    "prefill": "#74c476", "preempted": "#a63603", "decode": "#238b45", "decode_step": "#a1d99b",
}

_LAYOUT = {"margin": {"l": 10, "r": 10, "t": 40, "b": 10}, "legend": {"orientation": "h", "y": -0.15}}


def _fig(title: str, **kw) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, **_LAYOUT, **kw)
    return fig


def throughput(tl: pd.DataFrame) -> go.Figure:
    """Request rate and goodput (req/s, left) and output tokens/s (right) per bucket."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["request_rate_rps"], name="requests/s", mode="lines"))
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["goodput_rps"], name="goodput (req/s meeting SLOs)",
                             mode="lines"))
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["output_tps"], name="output tokens/s", mode="lines",
                             line={"dash": "dot"}), secondary_y=True)
    fig.update_layout(title="Throughput and goodput", **_LAYOUT)
    fig.update_yaxes(title_text="req/s", secondary_y=False)
    fig.update_yaxes(title_text="tokens/s", secondary_y=True)
    return fig


def latency_over_time(tl: pd.DataFrame) -> go.Figure:
    """P50 (dotted) and P99 (solid) of TTFT, TPOT and E2E per bucket of arrival time (ms, log axis,
    left) and the arrival rate (req/s, right, grey bars): since when the tail is high, and whether a
    burst of arrivals came with it. A bucket without a measured request leaves a gap, never a 0."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=tl["bucket"], y=tl["arrival_rps"], name="arrivals/s", marker_color="#d9d9d9",
                         opacity=0.6), secondary_y=True)
    for name, color in (("TTFT", "#e6550d"), ("TPOT", "#238b45"), ("E2E", "#2171b5")):
        for q, dash in (("99", "solid"), ("50", "dot")):
            col = f"{name.lower()}_p{q}_ms"
            if col in tl and tl[col].notna().any():
                fig.add_trace(go.Scatter(x=tl["bucket"], y=tl[col], name=f"{name} P{q}", mode="lines+markers",
                                         marker={"size": 3}, line={"color": color, "dash": dash},
                                         connectgaps=False, hovertemplate=f"{name} P{q}: %{{y:,.0f}} ms<extra></extra>"),
                              secondary_y=False)
    fig.update_layout(title="Latency over time (by arrival): P99 solid, P50 dotted", **_LAYOUT)
    fig.update_yaxes(title_text="ms", type="log", secondary_y=False)
    fig.update_yaxes(title_text="arrivals/s", secondary_y=True, showgrid=False, rangemode="tozero", nticks=5)
    return fig


def latency_heatmap(hm: pd.DataFrame, label: str) -> go.Figure:
    """Requests per (arrival-time bucket, latency bin) as colour on a log scale (log10 of the count;
    the hover shows the count), latency on a log axis: a burst and the tail it made seen together."""
    import numpy as np

    piv = hm.pivot_table(index="low_ms", columns="bucket", values="n", aggfunc="sum")
    z = np.log10(piv.to_numpy(dtype=float))  # NaN where no request: left blank, never a count of 0
    top = int(np.nanmax(z)) if np.isfinite(z).any() else 0
    fig = _fig(f"{label}: requests per time bucket and latency (colour: count, log scale)",
               yaxis={"type": "log", "title": "ms"})
    fig.add_trace(go.Heatmap(x=list(piv.columns), y=list(piv.index), z=z, customdata=piv.to_numpy(dtype=float),
                             colorscale="Viridis", hoverongaps=False,
                             hovertemplate="%{x}<br>≥ %{y:,.1f} ms: %{customdata:,.0f} requests<extra></extra>",
                             colorbar={"title": "requests", "tickvals": list(range(top + 1)),
                                       "ticktext": [f"{10 ** k:,}" for k in range(top + 1)]}))
    return fig


def stacked_phases(tl: pd.DataFrame, phases: Sequence[tuple[str, str, str]]) -> go.Figure:
    """Mean ms per request of each phase, stacked per time bucket (they add up to the mean E2E)."""
    fig = _fig("Where the time goes: mean ms per request, by phase", yaxis_title="ms per request")
    for col, label, layer in phases:
        if col in tl:
            fig.add_trace(go.Scatter(x=tl["bucket"], y=tl[col].fillna(0), name=label, stackgroup="phases",
                                     mode="lines", line={"width": 0.5, "color": PHASE_COLORS.get(col)},
                                     hovertemplate=f"{label} ({layer}): %{{y:.1f}} ms<extra></extra>"))
    return fig


def tail_shares(shares: pd.DataFrame, phases: Sequence[tuple[str, str, str]], metric_label: str) -> go.Figure:
    """Mean ms per phase: all requests vs the tail (above P99), as stacked horizontal bars."""
    fig = _fig(f"All requests vs the tail (above P99 of {metric_label}): raw mean ms per phase",
               barmode="stack", xaxis_title="ms per request")
    names = {"all": "all requests", "tail": "above P99"}
    for col, label, _ in phases:
        if col in shares:
            fig.add_trace(go.Bar(y=[names.get(g, g) for g in shares["grp"]], x=shares[col].fillna(0),
                                 name=label, orientation="h", marker_color=PHASE_COLORS.get(col)))
    return fig


def excess_by_phase(phases: pd.DataFrame) -> go.Figure:
    """The tail's excess over the median, per phase (diagnose's split: the shares add up to 100%),
    as horizontal bars in the order a request lives its phases; a phase the tail spends less in
    than the median has a negative share."""
    fig = _fig("Where the tail's excess over the median went (share per phase)", xaxis_title="share of the excess",
               xaxis_tickformat=".0%", showlegend=False)
    if len(phases):
        colors = [PHASE_COLORS.get(c, PHASE_COLORS.get("network_ms" if "network" in str(c) else "", "#888"))
                  for c in phases["column"]]
        fig.add_trace(go.Bar(y=phases["phase"], x=phases["share"], orientation="h", marker_color=colors,
                             customdata=phases[["excess_ms", "median_ms", "tail_mean_ms"]].to_numpy(),
                             hovertemplate="%{y}: %{x:.1%} of the excess<br>%{customdata[0]:,.0f} ms in all; "
                                           "median %{customdata[1]:,.1f} ms, tail mean %{customdata[2]:,.1f} ms"
                                           "<extra></extra>"))
        fig.update_yaxes(autorange="reversed")
    return fig


def _mark_quantiles(fig: go.Figure, quantiles: dict, which=("P99", "P999"), row=None, col=None) -> None:
    for lab, dash in zip(which, ("dash", "dot")):
        v = quantiles.get(lab)
        if v is not None:
            kw = {"row": row, "col": col} if row else {}
            fig.add_vline(x=v, line_dash=dash, line_color="#d62728", annotation_text=f"{lab} {format_ms(v)}",
                          annotation_position="top", **kw)


def histogram(hist: pd.DataFrame, quantiles: dict, label: str) -> go.Figure:
    """Counts on log-spaced bins (x: ms, log scale) with P99 and P999 marked."""
    fig = _fig(f"Histogram of {label}", xaxis_title="ms (log scale)", yaxis_title="count", xaxis_type="log",
               bargap=0)
    mid = (hist["lo_ms"] * hist["hi_ms"]) ** 0.5
    fig.add_trace(go.Bar(x=mid, y=hist["count"], width=hist["hi_ms"] - hist["lo_ms"], name=label,
                         customdata=hist[["lo_ms", "hi_ms"]],
                         hovertemplate="%{customdata[0]:.2f}–%{customdata[1]:.2f} ms: %{y}<extra></extra>"))
    _mark_quantiles(fig, quantiles)
    return fig


def cdf(c: pd.DataFrame, quantiles: dict, label: str) -> go.Figure:
    """Exact CDF (left) and the tail as 1 - CDF on a log axis (right), P99/P999 marked."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"CDF of {label} (exact quantiles)",
                                                        "Tail: 1 − CDF (log scale)"))
    fig.add_trace(go.Scatter(x=c["value_ms"], y=c["prob"], mode="lines", name="CDF"), row=1, col=1)
    t = c[c["prob"] < 1.0]
    fig.add_trace(go.Scatter(x=t["value_ms"], y=1 - t["prob"], mode="lines+markers", name="1 − CDF"),
                  row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=2, tickvals=[1, 0.1, 0.01, 0.001, 0.0001, 0.00001],
                     ticktext=["100%", "10% (P90)", "1% (P99)", "0.1% (P999)", "0.01%", "0.001%"],
                     title_text="share of requests above")
    fig.update_xaxes(title_text=f"{label} (ms)")
    for lab, dash in (("P99", "dash"), ("P999", "dot")):
        v = quantiles.get(lab)
        if v is not None:
            for k in (1, 2):
                # a label on the CDF only: an annotation_position without text makes Plotly show "new text"
                label_kw = ({"annotation_text": f"{lab} {format_ms(v)}",
                             "annotation_position": "bottom left" if lab == "P99" else "top right"} if k == 2 else {})
                fig.add_vline(x=v, line_dash=dash, line_color="#d62728", row=1, col=k, **label_kw)
    fig.update_layout(margin={"l": 10, "r": 10, "t": 60, "b": 10}, showlegend=False)
    return fig


def batch_sizes(b: pd.DataFrame) -> go.Figure:
    """Share of engine steps and of decode steps at each batch size."""
    fig = _fig("Batch size: per engine step vs as seen by each decode step", barmode="group",
               xaxis_title="batch size (requests in the step)", yaxis_title="share")
    for view, g in b.groupby("view", sort=False):
        fig.add_trace(go.Bar(x=g["batch_size"], y=g["share"], name=str(view)))
    return fig


def replica_latency(table: pd.DataFrame, metric_label: str) -> go.Figure:
    """P50 and P99 of a latency per replica (ms), grouped bars in the table's order (the slowest
    first); `table` has replica, e2e_p50_ms, e2e_p99_ms (dashboard.queries.replicas.replica_table)."""
    fig = _fig(f"{metric_label} per replica: P50 and P99", barmode="group", yaxis_title="ms")
    for col, name, color in (("e2e_p50_ms", "P50", "#9ecae1"), ("e2e_p99_ms", "P99", "#e6550d")):
        fig.add_trace(go.Bar(x=table["replica"], y=table[col], name=name, marker_color=color,
                             hovertemplate=f"%{{x}}: {name} %{{y:,.1f}} ms<extra></extra>"))
    fig.update_xaxes(type="category")
    return fig


def lengths(ld: pd.DataFrame) -> go.Figure:
    """Input and output length histograms side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Input (prompt) tokens", "Output tokens"))
    for k, kind in enumerate(("input", "output"), start=1):
        g = ld[ld["kind"] == kind].astype({"lo_tokens": float, "hi_tokens": float, "count": float})
        if not len(g):  # no request of the selection has this count: an empty panel, never bars of nothing
            continue
        fig.add_trace(go.Bar(x=(g["lo_tokens"] + g["hi_tokens"]) / 2, y=g["count"], width=g["hi_tokens"] - g["lo_tokens"],
                             name=kind, showlegend=False), row=1, col=k)
    fig.update_layout(title="Request shape", bargap=0, **_LAYOUT)
    return fig


def latency_vs_input(li: pd.DataFrame) -> go.Figure:
    """Exact P50/P99 TTFT and E2E per input-length bin (log2 bins)."""
    fig = _fig("Latency against input length", xaxis_title="input tokens (bin lower edge, log2 bins)",
               yaxis_title="ms", xaxis_type="log", yaxis_type="log")
    for col, name, dash in (("ttft_p50_ms", "TTFT P50", "solid"), ("ttft_p99_ms", "TTFT P99", "dash"),
                            ("e2e_p50_ms", "E2E P50", "solid"), ("e2e_p99_ms", "E2E P99", "dash")):
        fig.add_trace(go.Scatter(x=li["lo_tokens"], y=li[col], name=name, mode="lines+markers",
                                 line={"dash": dash}, customdata=li["requests"],
                                 hovertemplate="%{x}+ tokens: %{y:.1f} ms (%{customdata} requests)<extra></extra>"))
    return fig


def waterfall(tree: pd.DataFrame) -> go.Figure:
    """Spans of one trace as a waterfall: one bar per span from its start offset, indented by depth."""
    fig = _fig("Span waterfall (client → gateway → engine)", xaxis_title="ms since the first span",
               height=max(250, 28 * len(tree) + 80), barmode="overlay")
    fig.add_trace(go.Bar(
        y=tree["label"], x=tree["duration_ms"].fillna(0), base=tree["offset_ms"], orientation="h",
        marker_color=[SPAN_PHASE_COLORS.get(str(p), "#888") for p in tree["phase"]],
        customdata=tree[["phase", "service_name", "duration_ms"]],
        hovertemplate="%{y}<br>phase %{customdata[0]} · %{customdata[1]}<br>%{customdata[2]:.2f} ms<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed")
    return fig


def itl_timeline(steps: pd.DataFrame) -> go.Figure:
    """ITL per output token (colour: batch size of that step; diamonds: steps that also ran prefill),
    above the prefill tokens co-scheduled in each step."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.05)
    has_pf = "batch_prefill_tokens" in steps
    pf = steps["batch_prefill_tokens"].fillna(0) if has_pf else pd.Series(0, index=steps.index)
    fig.add_trace(go.Scatter(
        x=steps["token_index"], y=steps["itl_ms"], mode="markers", name="ITL",
        marker={"color": steps.get("batch_size"), "colorscale": "Viridis", "showscale": True,
                    "colorbar": {"title": "batch", "len": 0.7, "y": 0.65}, "size": [9 if v > 0 else 5 for v in pf],
                    "symbol": ["diamond" if v > 0 else "circle" for v in pf]},
        customdata=pd.DataFrame({"b": steps.get("batch_size"), "p": pf}),
        hovertemplate="token %{x}: %{y:.2f} ms<br>batch %{customdata[0]} · prefill tokens %{customdata[1]}"
                      "<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=steps["token_index"], y=pf, name="co-scheduled prefill tokens",
                         marker_color="#e6550d"), row=2, col=1)
    fig.update_yaxes(title_text="ITL (ms)", row=1, col=1)
    fig.update_yaxes(title_text="prefill tok", row=2, col=1)
    fig.update_xaxes(title_text="output token index", row=2, col=1)
    fig.update_layout(title="Per-token ITL (colour: batch size; ◆ steps with prefill)", height=520, **_LAYOUT)
    return fig


def engine_device(lat: pd.DataFrame, eng: pd.DataFrame, dev: pd.DataFrame) -> go.Figure:
    """Latency, scheduler state, step time, KV usage and the device on one shared time axis."""
    rows = [("Latency P99 (ms)", "lat"), ("Running / waiting", "eng"), ("Batch size", "eng"),
            ("Step time (ms)", "eng"), ("KV-cache usage", "eng")]
    def has(col):
        return bool(len(dev)) and col in dev and bool(dev[col].notna().any())

    # a CPU host (the CPU sampler, source 'cpu': its clock is the cores', it has no throttle reasons)
    # gets no SM clock or throttle rows: its utilisation and memory only
    sources = ({x for v in dev["source"].dropna() for x in str(v).split(", ")} if len(dev) and "source" in dev
               else None)
    gpu = has("sm_clock_mhz") and (sources is None or "nvml" in sources)
    dev_rows = [(title, col) for title, col, shown in (("Device util (%)", "util_pct", has("util_pct")),
                                                        ("Memory used (%)", "mem_used_pct", has("mem_used_pct")),
                                                        ("SM clock (MHz)", "sm_clock_mhz", gpu),
                                                        ("Throttled (share)", "throttle_reasons", gpu)) if shown]
    rows += [(title, "dev") for title, _ in dev_rows]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.02,
                        subplot_titles=[r[0] for r in rows])
    r = 1
    fig.add_trace(go.Scatter(x=lat["bucket"], y=lat["ttft_p99_ms"], name="TTFT P99", mode="lines"), row=r, col=1)
    fig.add_trace(go.Scatter(x=lat["bucket"], y=lat["e2e_p99_ms"], name="E2E P99", mode="lines"), row=r, col=1)
    for svc, g in (eng.groupby("service_name") if len(eng) else []):
        for k, (col, name) in enumerate((("running", "running"), ("waiting", "waiting"))):
            if col in g:
                fig.add_trace(go.Scatter(x=g["bucket"], y=g[col], name=f"{svc} {name}", mode="lines"), row=2, col=1)
        if "batch_size" in g:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["batch_size"], name=f"{svc} batch", mode="lines"),
                          row=3, col=1)
        if "step_ms" in g:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["step_ms"], name=f"{svc} step mean", mode="lines"),
                          row=4, col=1)
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["step_p99_ms"], name=f"{svc} step P99", mode="lines",
                                     line={"dash": "dot"}), row=4, col=1)
        if "kv_cache_usage" in g:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["kv_cache_usage"], name=f"{svc} KV", mode="lines"),
                          row=5, col=1)
    row_of = {col: 6 + i for i, (_, col) in enumerate(dev_rows)}
    for d, g in (dev.groupby("device") if dev_rows else []):
        if "util_pct" in row_of:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["util_pct"], name=f"{d} util", mode="lines"),
                          row=row_of["util_pct"], col=1)
        if "mem_used_pct" in row_of:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["mem_used_pct"], name=f"{d} memory", mode="lines"),
                          row=row_of["mem_used_pct"], col=1)
        if "sm_clock_mhz" in row_of:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["sm_clock_mhz"], name=f"{d} SM clock", mode="lines"),
                          row=row_of["sm_clock_mhz"], col=1)
        if "throttle_reasons" in row_of:
            fig.add_trace(go.Scatter(x=g["bucket"], y=g["throttled"], name=f"{d} throttled", mode="lines",
                                     customdata=g["throttle_reasons"],
                                     hovertemplate="%{y:.0%} throttled: %{customdata}<extra></extra>"),
                          row=row_of["throttle_reasons"], col=1)
    fig.update_layout(height=190 * len(rows), title="Engine and device on the latency time axis (UTC)",
                      margin={"l": 10, "r": 10, "t": 60, "b": 10}, showlegend=True)
    return fig


def phase_shifts(shifts: pd.DataFrame) -> go.Figure:
    """B − A of each phase's mean ms in each arm's own tail, one group of bars per objective's tail
    (phases not measured are left out, never drawn as 0)."""
    fig = _fig("What moved in the tail: B − A of each phase's mean (ms per tail request)", barmode="group",
               xaxis_title="B − A (ms)")
    measured = shifts.dropna(subset=["shift_ms"])
    for tail, g in measured.groupby("tail", sort=False):
        fig.add_trace(go.Bar(y=g["phase"], x=g["shift_ms"], name=f"{tail} tail", orientation="h",
                             customdata=g[["A_ms", "B_ms"]].to_numpy(),
                             hovertemplate="%{y}: %{x:+,.1f} ms (A %{customdata[0]:,.1f}, B %{customdata[1]:,.1f})"
                                           "<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return fig
