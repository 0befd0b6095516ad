"""Request explorer: the slowest requests; for one, the waterfall of its spans from client to engine
and its per-token ITL timeline coloured by batch size and co-scheduled prefill tokens."""

import streamlit as st

from tailtrace.dashboard import charts, data, ui
from tailtrace.semantics.catalog import SOURCE_PLUGIN, SOURCES

ctx = ui.require()
ui.header("Request explorer", "all four, for one request",
          "Pick one of the slowest requests (or paste a request id) to see its spans and every decode step.")

cols = set(ctx.schema.get("requests", ()))
options = [m for m in data.METRIC_CHOICES if m in cols]  # outer E2E first
c1, c2 = st.columns([1, 1])
metric = c1.selectbox("Slowest by", options, format_func=lambda m: data.REQUEST_METRICS[m], key="ex_metric")
if "trace_id" in st.query_params and "ex_typed" not in st.session_state:  # a link (Why is it slow?)
    st.session_state["ex_typed"] = st.query_params["trace_id"]
typed = c2.text_input("…or request id / trace id", key="ex_typed").strip()
slow = data.slowest_requests(ctx.src, ctx.filters, metric, ctx.schema)
st.dataframe(ui.ms_table(slow), hide_index=True, height=260)
if not len(slow) and not typed:
    ui.show_empty(f"No request with {data.REQUEST_METRICS[metric]} in the selection.")
    st.stop()
# a request whose engine span never came has no request id: it is picked by its trace id (never "nan")
keys = [rid if isinstance(rid, str) and rid else str(tid) for rid, tid in
        zip(slow["request_id"] if "request_id" in slow else [None] * len(slow), slow["trace_id"])]
ids = list(dict.fromkeys(keys))
fmt = {k: f"{k} · {ui.fmt_ms(ui.safe_float(v))}" for k, v in zip(keys, slow[metric])}
picked = st.selectbox("Request", ids, format_func=lambda r: fmt.get(r, r), key="ex_pick") if ids else None
rid = typed or picked
det = data.request_detail(ctx.src, rid, ctx.schema)
req = det["request"]
if req is None:
    st.warning(f"No request with request id or trace id {rid!r} in the store.")
    st.stop()
# what filled the engine columns (`requests.source`): the engine's E2E and TTFT differ by source
source = req.get("source") if isinstance(req.get("source"), str) else None
engine = {s.key: s for s in SOURCES}.get(source, SOURCE_PLUGIN)
ui.metric_row([
    # one source: the store's outer figures, with the engine's own beside them
    ("E2E", ui.fmt_ms(ui.safe_float(req.get("outer_e2e_ms"))), "outer: the client's, else the gateway's, else the engine's"),
    ("E2E (engine)", ui.fmt_ms(ui.safe_float(req.get("e2e_ms"))), f"{engine.label}: {engine.e2e}"),
    ("TTFT", ui.fmt_ms(ui.safe_float(req.get("outer_ttft_ms"))), "outer: the client's, else the engine's"),
    ("TTFT (engine)", ui.fmt_ms(ui.safe_float(req.get("ttft_ms"))), f"{engine.label}: {engine.ttft}"),
    ("Queue time", ui.fmt_ms(ui.safe_float(req.get("queue_time_ms"))), "gateway queue + engine queue + preempted"),
    ("Service time", ui.fmt_ms(ui.safe_float(req.get("service_time_ms"))), "prefill + decode"),
    ("Tokens in → out", " → ".join("n/a" if ui.safe_float(req.get(k)) is None else f"{int(req.get(k)):,}"
                                   for k in ("prompt_tokens", "output_tokens")), None),
])
st.caption(f"trace {req.get('trace_id')} · model {req.get('model')} · service {req.get('service_name', 'n/a')} · "
           f"arrived {req.get('arrival_time')} UTC · status {req.get('status')} · engine columns from "
           f"{source or 'n/a'}")
tree = data.span_tree(det["spans"])
if len(tree):
    st.plotly_chart(charts.waterfall(tree), key="ex_waterfall")
    if det["decode_step_spans"]:
        st.caption(f"{det['decode_step_spans']} per-token spans (llm.decode.step) are left out of the waterfall; "
                   "their timings are below.")
else:
    st.info("No spans of this trace in the store.")
steps = det["steps"]
if len(steps):
    st.plotly_chart(charts.itl_timeline(steps), key="ex_itl")
    with st.expander("Decode steps"):
        st.dataframe(ui.ms_table(steps), hide_index=True)
else:
    st.info("No decode steps recorded for this request.")
