"""Overview, objectives first: each objective's P50/P99/P999 against its target (met or missed, the
ratio) and goodput at the SLO; the capacity line; latency P50/P99 over time beside the arrival rate
and a latency heatmap ("since when?"); then throughput and the exact percentile table."""

import streamlit as st

from tailtrace.dashboard import charts, data, ladder_panel, ui
from tailtrace.dashboard.queries import why
from tailtrace.diagnose.capacity import MIN_RATE_REQUESTS, MIN_RATE_SPAN_S

ctx = ui.require()
ui.header("Overview", "all four", "The objectives first, then since when: exact percentiles (quantile_cont over "
          "every ok request / every decode step), latency over time and throughput.")

s = data.summary(ctx.src, ctx.filters, ctx.slo, ctx.schema)
pct = data.percentiles(ctx.src, ctx.filters, ctx.schema, include_itl=False)
# ITL (from the step histogram) is a side figure: within the side budget, else "n/a"
itl = ctx.side(data.itl_percentile_row, ctx.filters, ctx.schema) if "itl_ms" in ctx.schema.get(
    "decode_steps", ()) else None
if itl is not None and itl.ok:
    pct = data.add_percentile_rows(pct, [itl.value])

# ------------------------------------------------------------------------------------------ objectives
objectives = data.objectives(pct, ctx.slo)
run = ctx.runs.run if ctx.runs is not None else None
judged = (f"run {run.run_id}'s recorded spec" if run is not None and run.slo else "the sidebar's SLOs")
st.subheader("Objectives")
if not objectives:
    st.info("No objective is set: give TTFT, TPOT or E2E bounds in the sidebar.")
else:
    cards = []
    for o in objectives:
        if o["met"] is None:
            verdict = "not measured (no request of the selection has it)"
        else:
            verdict = f"{'met' if o['met'] else 'MISSED'} · {o['ratio']:.2f}× the target"
        cards.append((f"{o['name']} P99 ≤ {ui.fmt_ms(o['target_ms'])}", ui.fmt_ms(o["P99"]),
                      f"{verdict}. P50 {ui.fmt_ms(o['P50'])} · P999 {ui.fmt_ms(o['P999'])}"))
    cards.append(("Goodput at the SLO", ui.fmt_rate(s["goodput_rps"], "req/s"),
                  (f"{s['good']:,} of {s['requests']:,} requests ({ui.fmt_pct(s['slo_attainment'])}) finished OK "
                   "within every objective, per second of serving (vLLM benchmark_serving --goodput; DistServe)")))
    ui.metric_row(cards)
    missed = [o for o in objectives if o["met"] is False]
    lines = [f"**{o['name']} P99 {ui.fmt_ms(o['P99'])}** against {ui.fmt_ms(o['target_ms'])}: "
             f"{'missed' if o['met'] is False else 'met' if o['met'] else 'not measured'}"
             + (f" ({o['ratio']:.2f}×)" if o["ratio"] is not None else "") for o in objectives]
    (st.warning if missed else st.success)(" · ".join(lines) + f" — judged by {judged}, worst first"
                                         + (". The Why page explains the worst." if missed else "."))

cap = ctx.side(why.capacity, ctx.filters)
if cap.ok and cap.value is not None:
    st.markdown(f"**Capacity:** {cap.value.text}")
    spec = why.slo_spec(ctx.slo)
    st.caption("The rate that holds the objectives, predicted by a simulator fitted to this run's own engine steps:")
    st.markdown(f"`{ui.simulate_command(ctx, spec)}`")
elif not cap.ok:
    ui.na_caption("Capacity", cap)

# ------------------------------------------------------------------------------------------ what was lost
loss = ctx.side(data.data_loss, ctx.filters)
if loss.ok and (loss.value["dropped"] or loss.value["engine_missing"]):
    parts = []
    if loss.value["dropped"]:
        parts.append("the exporters reported " + ", ".join(
            f"{n:,} spans dropped by {svc or '?'}'s {exp or '?'} exporter ({reason or '?'})"
            for svc, exp, reason, n in loss.value["dropped"]))
    if loss.value["engine_missing"]:
        parts.append(f"{loss.value['engine_missing']:,} of {loss.value['requests']:,} requests ended ok with no "
                     "engine span (their engine's spans never arrived: a killed process or a dropped batch): "
                     "their engine phases are not measured")
    st.warning("Spans lost: " + "; ".join(parts) + ".")
elif not loss.ok:
    ui.na_caption("Spans lost", loss)

# ------------------------------------------------------------------------------------------ since when?
first, last = s["first_time"], s["last_time"]
width = data.bucket_ms(first, last)
lt = ctx.side(data.latency_timeline, ctx.filters, width)
if not lt.ok:
    ui.na_caption("Latency over time", lt)
elif len(lt.value) > 1:
    st.plotly_chart(charts.latency_over_time(lt.value), key="ov_latency")
ladder_panel.show(ctx, width)  # the gateway's degradation ladder beside the latency (a caption where none ran)
heat_col = objectives[0]["column"] if objectives and objectives[0]["met"] is False else "outer_e2e_ms"
hm = ctx.side(data.latency_heatmap, ctx.filters, heat_col, width)
if not hm.ok:
    ui.na_caption("Latency heatmap", hm)
elif len(hm.value) > 1:
    st.plotly_chart(charts.latency_heatmap(hm.value, data.REQUEST_METRICS[heat_col]), key="ov_heatmap")

# ------------------------------------------------------------------------------------------ throughput
st.subheader("Throughput")
# a burst of a probe's requests sent at once is not "8,000 req/s offered": no rate from a handful of
# requests or a few seconds (diagnose/capacity.py's rule, as explain says it)
rate_ok = s["requests"] >= MIN_RATE_REQUESTS and s["arrival_span_s"] >= MIN_RATE_SPAN_S
ui.metric_row([
    ("Requests", f"{s['requests']:,}", "requests that completed in the window (completion time = arrival + outer E2E)"),
    ("OK requests", f"{s['completed']:,}",
     (f"ended ok as the outermost traced layer saw them; {s['failed']:,} failed, {s['client_left']:,} left by "
      "their client (cancelled or aborted: no failure). Latency percentiles are over these")),
    ("Arrival rate (req/s)", ui.fmt_rate(s["request_rate_rps"], "") if rate_ok else "n/a",
     "the offered load: requests / (last − first arrival)" if rate_ok else
     (f"not measured: {s['requests']:,} requests over {s['arrival_span_s']:.1f} s of arrivals, too few (under "
      f"{MIN_RATE_REQUESTS}) or too short (under {MIN_RATE_SPAN_S:g} s) to give a rate (explain's rule)")),
    ("Throughput (req/s)", ui.fmt_rate(s["throughput_rps"], ""),
     (f"requests completed OK / serving time ({s['serving_s']:,.1f} s, first arrival → last completion), "
      "as vLLM's benchmark_serving")),
    ("Output tokens/s", ui.fmt_rate(s["output_tps"], ""), f"{s['output_tokens']:,} output tokens / serving time"),
    ("Input tokens/s", ui.fmt_rate(s["input_tps"], ""), f"{s['input_tokens']:,} prompt tokens / serving time"),
])

by_metric = {m: r for m, r in zip(pct["metric"], pct.to_dict("records"))}
cards = []
# TTFT and E2E: the catalog's outer ones (the store's outer_ttft_ms / outer_e2e_ms: the client's when
# traced, else the gateway's (E2E), else the engine's); the table below has the engine's and client's.
for m, name, who in (("outer_ttft_ms", "TTFT", " (outer)"), ("tpot_ms", "TPOT", ""), (data.ITL, "ITL", ""),
                     ("outer_e2e_ms", "E2E", " (outer)")):
    r = by_metric.get(m)
    missing = itl.why if m == data.ITL and itl is not None and not itl.ok else "no data"
    cards.append((f"{name} P99{who}", ui.fmt_ms(r["P99"]) if r else "n/a",
                  f"P999 {ui.fmt_ms(r['P999'])} · P50 {ui.fmt_ms(r['P50'])} · n = {r['count']:,}" if r else
                  missing))
ui.metric_row(cards)
if itl is not None and not itl.ok:
    ui.na_caption("ITL", itl)

tl = ctx.side(lambda src: data.throughput_timeline(src, ctx.filters, ctx.slo, width))
if not tl.ok:
    ui.na_caption("Throughput over time", tl)
elif len(tl.value) > 1:
    st.plotly_chart(charts.throughput(tl.value), key="ov_tp")

st.subheader("Latency percentiles (exact)")
table = data.distinct_percentile_rows(pct)
st.dataframe(ui.ms_table(table.drop(columns=["metric"]).rename(columns={"label": "metric"}),
                         ("mean", "P50", "P90", "P99", "P999", "max")), hide_index=True)
if len(table) < len(pct):
    st.caption("Rows equal to another are shown once: " + ", ".join(
        f"{r['label']} = {r['same_as']}" for r in data.same_percentile_rows(pct)) + ".")
