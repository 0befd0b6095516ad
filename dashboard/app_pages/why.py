"""Why is it slow? The four-layer diagnosis of the tail (diagnose/, the code of `tailtrace
explain`): the tail's excess split by phase, the ranked causes with their evidence and the SQL
that gave it, each linking to its example requests and the time window it speaks of."""

import streamlit as st

from tailtrace.dashboard import charts, ui
from tailtrace.dashboard.queries import why
from tailtrace.semantics.catalog import format_share

ctx = ui.require()
ui.header("Why is it slow?", "all four, ranked",
          "The requests above the exact P99 of the metric, their latency beyond the median split by phase, "
          "and the causes that explain it, with the numbers and the SQL behind each (the same diagnosis as "
          "`tailtrace explain`).")

if ctx.filters.has_request_attrs():
    st.caption("The diagnosis reads every request of the time range: the model, service, priority and replica "
               "filters do not apply (its load-imbalance finding compares the upstreams and names their replicas).")
linked = why.metric_from_link(st.query_params)
if linked and st.session_state.get("why_linked") != linked:  # a link (an alert's) picks the metric, once
    st.session_state["why_metric"], st.session_state["why_linked"] = linked, linked
choices = [why.OBJECTIVES_FIRST, *why.METRICS]
labels = {why.OBJECTIVES_FIRST: "Missed objectives first", **why.METRICS}
metric = st.segmented_control("Tail of", choices, default=linked or why.OBJECTIVES_FIRST, format_func=labels.get,
                              key="why_metric") or why.OBJECTIVES_FIRST
report = why.diagnose(ctx.src, ctx.filters, metric, ctx.objectives)  # any quantile, as explain judges
if report is None:
    st.stop()
if report.objectives:
    st.subheader("Objectives")
    st.dataframe(ui.ms_table(why.objectives_frame(report)).format({"ratio": "{:.2f}x"}, na_rep="n/a"),
                 hide_index=True, column_config={"value_ms": st.column_config.Column("value"),
                                                 "target_ms": st.column_config.Column("target")})
    for other in report.also:
        top = other.findings[0] if other.findings else None
        if top is not None:
            st.caption(f"Also missed: {other.tail.metric.upper()} {other.tail.label}: #{top.rank} {top.title} "
                       f"({format_share(top.share)} of its excess)" + (" — expected behaviour" if top.expected_behaviour
                                                                      else ""))
    st.subheader(f"The {report.tail.metric.upper() if report.tail else ''} tail")
tail = report.tail
if tail is None or tail.n_tail == 0:
    for note in report.notes:
        st.info(note)
    ui.show_empty("No request lies above the P99 in this selection: nothing to explain.")
    st.stop()
ui.metric_row([
    ("Requests", f"{tail.n:,}", "ok requests of the selection with this metric"),
    ("Median", ui.fmt_ms(tail.median_ms), "exact (quantile_cont)"),
    (tail.label, ui.fmt_ms(tail.threshold_ms), "exact; the tail is strictly above it"),
    ("Tail excess", ui.fmt_ms(tail.excess_ms), f"sum over the {tail.n_tail} tail requests of their latency minus the median"),
])
st.plotly_chart(charts.excess_by_phase(why.phase_frame(report)), key="why_phases")
for line in why.not_measured(report):
    st.caption(line)
for note in report.notes:
    st.caption(f"Note: {note}")

st.subheader("Causes, ranked")
if not report.findings:
    st.info("No detector found a cause beyond the phase split above.")
for f in report.findings:
    head = (f"#{f.rank} · {f.layer_label} · {f.title} — explains {format_share(f.share)} of the excess "
            f"({f.confidence} confidence){' · dominant' if f.dominant else ''}")
    with st.expander(head, expanded=f.rank == 1):
        st.markdown(f.summary)
        for a in f.actions:
            st.markdown(f"- **`{why.action_line(a)}`** — {a.rationale}")
        for m in f.mitigations:
            st.markdown(f"- *Suggestion:* {m}")
        for i, ev in enumerate(f.evidence):
            st.markdown(f"**Evidence:** {ev.what}")
            st.dataframe(why.numbers_frame(ev.numbers), hide_index=True)
            st.code(why.runnable_sql(ev), language="sql")
        cols = st.columns(min(4, max(1, len(f.example_trace_ids) + 1)))
        for c, tid in zip(cols, f.example_trace_ids[:3]):
            c.page_link("app_pages/explorer.py", label=f"request {tid[:12]}…", icon=":material/search:",
                        query_params={"trace_id": tid})
        if f.window.get("start"):
            cols[-1].page_link("app_pages/queue_service.py", label="its window", icon=":material/schedule:",
                               query_params=why.window_params(f.window))
if report.capacity is not None:
    st.subheader("Capacity")
    st.markdown(report.capacity.text)
    st.caption("The rate that holds the objectives, predicted by a simulator fitted to this run's own engine steps:")
    st.markdown(f"`{ui.simulate_command(ctx, (report.scope or {}).get('slo'))}`")
