"""Overview: request rate, token throughput, goodput and SLO attainment, exact P50/P90/P99/P999 of
TTFT, TPOT, ITL and E2E."""

import streamlit as st

from dashboard import charts, data, ui

ctx = ui.require()
ui.header("Overview", "all four", "Throughput, goodput against the SLOs in the sidebar, and exact latency "
          "percentiles (quantile_cont over every ok request / every decode step in DuckDB).")

s = data.summary(ctx.src, ctx.filters, ctx.slo, ctx.schema)
ui.metric_row([
    ("Requests", f"{s['requests']:,}", "requests that completed in the window (completion time = arrival + outer E2E)"),
    ("OK requests", f"{s['completed']:,}",
     (f"ended ok as the outermost traced layer saw them; {s['requests'] - s['completed']:,} failed. Latency "
      "percentiles are over these")),
    ("Arrival rate (req/s)", ui.fmt_rate(s["request_rate_rps"], ""),
     "the offered load: requests / (last − first arrival)"),
    ("Throughput (req/s)", ui.fmt_rate(s["throughput_rps"], ""),
     (f"requests completed OK / serving time ({s['serving_s']:,.1f} s, first arrival → last completion), "
      "as vLLM's benchmark_serving")),
    ("Output tokens/s", ui.fmt_rate(s["output_tps"], ""), f"{s['output_tokens']:,} output tokens / serving time"),
    ("Input tokens/s", ui.fmt_rate(s["input_tps"], ""), f"{s['input_tokens']:,} prompt tokens / serving time"),
    ("Goodput (req/s)", ui.fmt_rate(s["goodput_rps"], ""),
     "requests that finished OK and met every SLO / serving time (vLLM benchmark_serving --goodput; DistServe)"),
    ("SLO attainment", ui.fmt_pct(s["slo_attainment"]), f"{s['good']:,} of {s['requests']:,} requests met every SLO"),
])

pct = data.percentiles(ctx.src, ctx.filters, ctx.schema, include_itl=False)
# ITL (from the step histogram) is a side figure: within the side budget, else "n/a"
itl = ctx.side(data.itl_percentile_row, ctx.filters, ctx.schema) if "itl_ms" in ctx.schema.get(
    "decode_steps", ()) else None
if itl is not None and itl.ok:
    pct = data.add_percentile_rows(pct, [itl.value])
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

st.subheader("Latency percentiles (ms, exact)")
st.dataframe(pct.drop(columns=["metric"]).rename(columns={"label": "metric"}), hide_index=True,
             column_config={c: st.column_config.NumberColumn(format="%.3f") for c in
                            ("mean", "P50", "P90", "P99", "P999", "max")})

tl = ctx.side(lambda src: data.throughput_timeline(src, ctx.filters, ctx.slo,
                                                  data.bucket_ms(*data.bounds(src, ctx.filters))))
if not tl.ok:
    ui.na_caption("Throughput over time", tl)
elif len(tl.value) > 1:
    st.plotly_chart(charts.throughput(tl.value), key="ov_tp")
