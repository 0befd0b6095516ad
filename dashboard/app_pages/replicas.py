"""Replicas: the replicas of a fleet side by side (requests, failures, share, exact P50/P99 of E2E,
TTFT and TPOT, queue time), the slowest first, so that the one out of line stands out."""

import streamlit as st

from tailtrace.dashboard import charts, data, ui

ctx = ui.require()
ui.header("Replicas", "gateway and infrastructure · engine scheduling",
          "One row per replica (its engine's service.instance.id, else its service name: the replicas of a "
          "fleet share one service name). Exact quantiles over each replica's ok requests, as on every page.")

if ctx.replicas_why is not None:
    st.warning(f"The store's list of replicas: n/a ({ctx.replicas_why}; a side query, within the side budget).")
    st.stop()
if len(ctx.replicas) < 2:
    which = (f"one replica only ({ctx.replicas[0]})" if ctx.replicas else
             "no replica (no request with an engine span of the tailtrace plugin)")
    st.info(f"This store knows {which}: there is nothing to compare. This page compares the replicas of a "
            "fleet behind one gateway (docs/fleet.md, \"Replicas\"); give each a name with "
            "`OTEL_RESOURCE_ATTRIBUTES=service.instance.id=NAME`.")
    st.stop()

t = data.replica_table(ctx.src, ctx.filters)
served = t[t["replica"] != data.NO_REPLICA]
if not len(served):
    ui.show_empty("No request of the selection reached a replica (none has an engine span).")
    st.stop()
e2e = data.REQUEST_METRICS["outer_e2e_ms"]
slow, by_queue, by_failed = (served.loc[served[c].fillna(-1).idxmax()] for c in ("e2e_p99_ms", "queue_mean_ms", "failed"))
ui.metric_row([
    ("Replicas", f"{len(served)}", f"replicas that served selected requests, of {len(ctx.replicas)} in the store"),
    (f"Slowest replica (P99 {e2e})", str(slow["replica"]),
     f"P99 {ui.fmt_ms(slow['e2e_p99_ms'])}" + (f", {slow['e2e_p99_x']:.2f}× the median replica's"
                                                if ui.safe_float(slow["e2e_p99_x"]) else "")),
    ("Longest queue (mean)", str(by_queue["replica"]),
     f"mean queue time {ui.fmt_ms(by_queue['queue_mean_ms'])} (gateway queue + engine queue + preempted)"),
    ("Most failed", str(by_failed["replica"]) if by_failed["failed"] else "none",
     f"{int(by_failed['failed']):,} of {int(by_failed['requests']):,} requests failed (a client's cancel is none)"
     if by_failed["failed"] else
     "no replica has a failed request in the selection"),
])

labels = data.replica_labels()
st.dataframe(t.rename(columns=labels), hide_index=True, column_config={
    **{labels[c]: st.column_config.NumberColumn(format="%.3f") for c in t.columns if c.endswith("_ms")},
    labels["share"]: st.column_config.NumberColumn(format="percent"),
    labels["e2e_p99_x"]: st.column_config.NumberColumn(format="%.2f×")})
if (t["replica"] == data.NO_REPLICA).any():
    st.caption(f"{data.NO_REPLICA}: selected requests without an engine span of the tailtrace plugin (a gateway-"
               "only 429, vLLM's own tracing only, a request that never reached a replica); their share counts "
               "in the total.")
st.plotly_chart(charts.replica_latency(served, e2e), key="rep_e2e")
