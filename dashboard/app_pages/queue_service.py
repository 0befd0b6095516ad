"""Queue vs service: per-phase latency stacked over time; for requests above P99, which phase holds
the time."""

import streamlit as st

from tailtrace.dashboard import charts, data, ui
from tailtrace.semantics import catalog

ctx = ui.require()
ui.header("Queue vs service", "gateway and infrastructure · engine scheduling · compute",
          "Queue time = gateway queue + engine queue + preempted; service time = prefill + decode. "
          "Unattributed = outermost E2E minus every phase (shown, never hidden).")

phases = data.engine_phases(ctx.src, ctx.filters, data.phase_columns(ctx.schema))  # labels name the engines
first, last = data.bounds(ctx.src, ctx.filters)
tl = data.phases_timeline(ctx.src, ctx.filters, phases, data.bucket_ms(first, last))
st.plotly_chart(charts.stacked_phases(tl, phases), key="qs_stack")

side = ctx.side(data.percentiles, ctx.filters, ctx.schema, include_itl=False)
pct = side.value if side.ok else None
if pct is None:
    ui.na_caption("Queue and service time percentiles", side)
elif len(qs := pct[pct["metric"].isin(["queue_time_ms", "service_time_ms"])]):
    st.dataframe(ui.ms_table(qs.drop(columns=["metric"]).rename(columns={"label": "metric"}),
                             ("mean", "P50", "P90", "P99", "P999", "max")), hide_index=True)

st.subheader("The tail: requests above P99")
have = set(ctx.schema.get("requests", ()))
metrics = [m for m in data.METRIC_CHOICES if m in have and m not in ("queue_time_ms", "service_time_ms")]  # outer E2E first
present = [m for m in metrics if pct is not None and (pct["metric"] == m).any()]
choices = present or metrics
# the worst missed objective's metric first (as explain orders them), else outer E2E
missed = [o["column"] for o in (data.objectives(pct, ctx.slo) if pct is not None else []) if o["met"] is False]
first = next((c for c in missed if c in choices), None)
metric = st.selectbox("Tail of", choices, index=choices.index(first) if first else 0,
                      format_func=lambda m: data.REQUEST_METRICS[m] + (" (missed objective)" if m in missed else ""),
                      key="qs_metric")
tb = data.tail_breakdown(ctx.src, ctx.filters, phases, metric)
if tb["threshold_ms"] is None:
    ui.show_empty(f"No request has {data.REQUEST_METRICS[metric]}.")
    st.stop()
tail_n = int(tb["shares"].set_index("grp").loc["tail", "requests"]) if "tail" in set(tb["shares"]["grp"]) else 0
dom = tb["dominant"]
held = tb["holding"]
top = held.iloc[0] if len(held) and tail_n else None
ui.metric_row([
    (f"P99 of {data.REQUEST_METRICS[metric]}", ui.fmt_ms(tb["threshold_ms"]), "exact, quantile_cont"),
    ("Requests above P99", f"{tail_n:,}", None),
    ("Phase holding the tail", f"{top['label']}" if top is not None else "n/a",
     (f"largest excess over the median's phase profile, as explain ({catalog.TAIL_RULE}): "
      f"{ui.fmt_ms(top['excess_ms'])} summed; it holds {int(top['requests'])} of {tail_n} tail requests")
     if top is not None else None),
])
if len(tb["shares"]):
    st.plotly_chart(charts.tail_shares(tb["shares"], phases, data.REQUEST_METRICS[metric]), key="qs_tail")
c1, c2 = st.columns([1, 2])
c1.caption("Tail requests by the phase holding them (largest excess over the median, as explain)")
c1.dataframe(held[["label", "requests"]].rename(columns={"label": "phase"}), hide_index=True)
c1.caption("Raw: tail requests by their largest phase (no median subtracted)")
c1.dataframe(dom[["label", "requests"]].rename(columns={"label": "raw largest phase"}), hide_index=True)
c2.caption("Slowest tail requests (ms)")
c2.dataframe(ui.ms_table(tb["slowest"]), hide_index=True)
