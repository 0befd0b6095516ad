"""Distributions: histograms and CDFs with P99/P999 marked; batch size per engine step and per decode
step; input and output lengths; latency against input length."""

import streamlit as st

from tailtrace.dashboard import charts, data, ui

ctx = ui.require()
ui.header("Distributions", "engine scheduling · request shape",
          "Exact quantiles from every ok request (ITL: every decode step). Histograms use log-spaced bins (20 per decade).")

have = set(ctx.schema.get("requests", ())) | ({data.ITL} if "itl_ms" in ctx.schema.get("decode_steps", ()) else set())
choices = list(data.METRIC_CHOICES)
choices.insert(choices.index("tpot_ms") + 1, data.ITL)
options = [m for m in choices if m in have]  # outer E2E first
metric = st.selectbox("Latency", options, format_func=lambda m: data.ALL_METRICS[m], key="dist_metric")
d = data.latency_distribution(ctx.src, ctx.filters, metric)
if d["count"] == 0:
    ui.show_empty(f"No value of {data.ALL_METRICS[metric]} in the selection.")
else:
    q = d["quantiles"]
    ui.metric_row([(lab, ui.fmt_ms(q.get(lab)), None) for lab in data.QUANTILE_LABELS] +
                  [("values", f"{d['count']:,}", None)])
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.histogram(d["hist"], q, data.ALL_METRICS[metric]), key="dist_hist")
    c2.plotly_chart(charts.cdf(d["cdf"], q, data.ALL_METRICS[metric]), key="dist_cdf")

st.subheader("Batch size")
side = ctx.side(data.batch_size_distribution, ctx.filters, ctx.schema)  # the step histogram: a side panel
b = side.value
if not side.ok:
    ui.na_caption("Batch size", side)
elif len(b):
    st.plotly_chart(charts.batch_sizes(b), key="dist_batch")
    mean = b.assign(w=b["batch_size"] * b["count"]).groupby("view")[["w", "count"]].sum()
    st.caption(" · ".join(f"mean batch size per {v}: {r.w / r['count']:.2f}" for v, r in mean.iterrows())
               + ". A decode step sees the batch it ran in, so large batches weigh more there.")
else:
    st.info("No engine or decode steps recorded in the selection.")

st.subheader("Input and output lengths")
lengths = ctx.side(data.length_distribution, ctx.filters)
if lengths.ok and not len(lengths.value):
    st.info("No token counts in the selection: they come from the engine's spans (llm.request), or the "
            "load generator's; not measured here.")
elif lengths.ok:
    st.plotly_chart(charts.lengths(lengths.value), key="dist_len")
else:
    ui.na_caption("Input and output lengths", lengths)
st.subheader("Latency against input length")
st.caption("Outer TTFT and E2E, percentiles over each bin's ok requests; `requests` counts all of the bin.")
li = ctx.side(data.latency_by_input_length, ctx.filters)
if li.ok and not len(li.value):
    st.info("No request of the selection has both its input length and its latency measured.")
elif li.ok:
    st.plotly_chart(charts.latency_vs_input(li.value), key="dist_li")
    st.dataframe(ui.ms_table(li.value), hide_index=True)
else:
    ui.na_caption("Latency against input length", li)
