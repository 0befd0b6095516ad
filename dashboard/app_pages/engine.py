"""Engine and device: running/waiting, KV usage, step time, device utilisation, clocks and throttle
reasons on the same time axis as latency."""

import pandas as pd
import streamlit as st

from tailtrace.dashboard import charts, data, ui

ctx = ui.require()
ui.header("Engine and device", "engine scheduling · compute and hardware",
          "Scheduler state and the device (the GPU, or the CPU on vLLM's CPU build) per time bucket, under "
          "the request latency of the same buckets.")
if ctx.filters.replicas:
    st.caption("The replica filter selects the latency rows only: engine steps and device samples are kept per "
               "service, not per replica.")
first, last = data.bounds(ctx.src, ctx.filters)
width = data.bucket_ms(first, last)
eng = data.engine_timeline(ctx.src, ctx.filters, ctx.schema, width)
# the engines' own counters (vLLM, SGLang, TensorRT-LLM, TGI /metrics) beside tailtrace's counts from their spans
checks = ctx.side(data.engine_crosscheck, ctx.filters)
if checks.ok and len(checks.value):
    st.subheader("The engines' own counters")
    st.caption("Each engine's /metrics (`tailtrace collect --scrape URL`) against the counts tailtrace assembled "
               "from the same engine's spans; a disagreement names spans that lacked a value (stored NULL, never 0). "
               "docs/engines.md lists what each engine emits.")
    st.dataframe(checks.value, hide_index=True)
if not len(eng):
    ui.show_empty("No engine steps in the selection: the vLLM plugin emits them (`tailtrace serve`); of the other "
                  "engines, TGI's batch spans are engine steps, SGLang's and TensorRT-LLM's spans give none "
                  "(docs/engines.md).")
    st.stop()
# the device samples and the latency above the engine are side panels: "n/a" rather than no page
dev_side = ctx.side(data.device_timeline, ctx.filters, ctx.schema, width)
lat_side = ctx.side(data.throughput_timeline, ctx.filters, ctx.slo, width)
dev = dev_side.value if dev_side.ok else pd.DataFrame()
lat = lat_side.value if lat_side.ok else pd.DataFrame(columns=["bucket", "ttft_p99_ms", "e2e_p99_ms"])
st.caption(f"Bucket width {width / 1000:g} s · {int(eng['steps'].sum()):,} engine steps"
           + (f" · {dev['device'].nunique()} device(s)" if len(dev) else ""))
st.plotly_chart(charts.engine_device(lat, eng, dev), key="eng_fig")
if not lat_side.ok:
    ui.na_caption("Latency P99", lat_side)
if not dev_side.ok:
    ui.na_caption("Device", dev_side)
elif not len(dev):
    st.info("No device samples in the selection. Run the device sampler (`tailtrace sample`) next to the "
            "engine to see utilisation, clocks and throttle reasons here.")
else:
    sources = sorted({x for v in dev.get("source", pd.Series(dtype=object)).dropna() for x in str(v).split(", ")})
    if sources and "nvml" not in sources:
        st.caption("No GPU was sampled on this host: the device rows are its CPU and memory (device samples from "
                   f"{', '.join(sources)}); GPU clocks and throttle reasons are not measured here.")
    reasons = dev[dev["throttled"] > 0]
    if len(reasons):
        st.warning("Throttling seen: " + ", ".join(sorted({r for x in reasons["throttle_reasons"].dropna()
                                                           for r in str(x).split(", ") if r})))
with st.expander("Engine steps per bucket"):
    st.dataframe(eng, hide_index=True)
