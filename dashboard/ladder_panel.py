"""The degradation ladder's panel (the Overview, beside the latency over time): the gateway's ladder
level per bucket of arrival time under the TTFT the requests measured (P99) and were predicted (P50),
the objective's bound, and what the ladder did (capped, deferred, shed) per bucket. Its query is
dashboard/queries/ladder.py; a store without a ladder says so ("not measured"), never a level 0."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from tailtrace.dashboard import data, ui

__all__ = ["ladder_figure", "show"]

_ACTIONS = (("capped", "#fdae6b"), ("deferred", "#9e9ac8"), ("shed", "#de2d26"))


def ladder_figure(tl: pd.DataFrame, ttft_bound_ms: float | None) -> go.Figure:
    """Two rows on one time axis: TTFT P99 measured (solid) and P50 predicted (dotted), ms, with the
    objective's bound (dashed) where given; below, the ladder's highest level per bucket (a step
    line, left axis) and the requests capped, deferred and shed (stacked bars, right axis)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.55, 0.45], vertical_spacing=0.06,
                        specs=[[{}], [{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["ttft_p99_ms"], name="TTFT P99 (measured)", mode="lines+markers",
                             marker={"size": 3}, line={"color": "#e6550d"}, connectgaps=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["predicted_ttft_p50_ms"], name="TTFT P50 (predicted at arrival)",
                             mode="lines", line={"color": "#e6550d", "dash": "dot"}, connectgaps=False), row=1, col=1)
    if ttft_bound_ms:
        fig.add_hline(y=ttft_bound_ms, line={"color": "#636363", "dash": "dash"}, row=1, col=1,
                      annotation_text=f"objective {ui.fmt_ms(ttft_bound_ms)}")
    for name, color in _ACTIONS:
        fig.add_trace(go.Bar(x=tl["bucket"], y=tl[name], name=name, marker_color=color, opacity=0.7),
                      row=2, col=1, secondary_y=True)
    fig.add_trace(go.Scatter(x=tl["bucket"], y=tl["level_max"], name="ladder level", mode="lines",
                             line={"color": "#252525", "shape": "hv"}), row=2, col=1, secondary_y=False)
    fig.update_layout(title="Degradation ladder: level and what it did, under the TTFT it holds", barmode="stack",
                      margin={"l": 10, "r": 10, "t": 40, "b": 10}, legend={"orientation": "h", "y": -0.15})
    fig.update_yaxes(title_text="TTFT ms", row=1, col=1)
    fig.update_yaxes(title_text="level", row=2, col=1, secondary_y=False, rangemode="tozero", dtick=1)
    fig.update_yaxes(title_text="requests", row=2, col=1, secondary_y=True, showgrid=False, rangemode="tozero")
    return fig


def show(ctx, width_ms: int) -> None:
    """The panel on a page of context `ctx` (ui.Context) with time buckets of `width_ms`: a side
    panel (n/a with its reason when its query fails)."""
    side = ctx.side(data.ladder_timeline, ctx.filters, ctx.schema, width_ms)
    if not side.ok:
        ui.na_caption("Degradation ladder", side)
        return
    tl = side.value
    if tl is None:
        st.caption("Degradation ladder: not measured (the store predates the ladder's columns, schema v8)")
        return
    if not len(tl):
        st.caption("Degradation ladder: not measured (no request in this window passed a gateway with --ladder: "
                   "requests.degradation is NULL)")
        return
    st.subheader("Degradation ladder")
    n = int(tl["requests"].sum())
    ui.metric_row([
        ("Requests under the ladder", f"{n:,}", None),
        ("Highest level", f"{int(tl['level_max'].max())}", "the ladder's level at an arrival (0: no step taken)"),
        *[(f"{name.capitalize()}", f"{int(tl[name].sum()):,}", f"{tl[name].sum() / n:.1%} of them")
          for name, _ in _ACTIONS],
    ])
    st.plotly_chart(ladder_figure(tl, ctx.slo.ttft_ms), key="ov_ladder")
