"""Compare: B against A over runs of the store, with an interval by block (the code of `tailtrace
compare` and `tailtrace try`: experiment/compare.py). Picks a `try` experiment (its A and B blocks)
or any runs; the sidebar's run selector does not apply here (the page chooses its own two arms)."""

import streamlit as st

from tailtrace.dashboard import charts, ui
from tailtrace.dashboard.queries import compare, why
from tailtrace.experiment.render import comparison_lines
from tailtrace.semantics.slo import RUN_KIND_PROBE

ctx = ui.require()
ui.header("Compare", "B against A",
          "What a change bought: per metric and quantile A, B, B − A and its interval by block pair, the shift of "
          "each phase in the tail, goodput at the SLO (the same numbers as `tailtrace compare` and `tailtrace try`).")
runs = [r.run_id for r in ctx.runs.runs if r.run_id] if ctx.runs is not None else []
# by default the two latest traffic runs: never a capacity probe (a measurement of the engine, not traffic)
traffic = [r.run_id for r in ctx.runs.runs if r.run_id and r.kind != RUN_KIND_PROBE] if ctx.runs is not None else []
if not runs:
    ui.show_empty("No run in this store: compare needs runs (`tailtrace try`, or two `tailtrace replay` runs).")
    st.stop()
exps = compare.experiments(runs)
choices = [*exps, "choose runs"]
pick = st.selectbox("Experiment", choices, index=0, key="cmp_exp",
                    format_func=lambda e: e if e == "choose runs" else f"{e} ({len(exps[e][0])} block pairs)")
if pick == "choose runs":
    c1, c2 = st.columns(2)
    a_runs = c1.multiselect("A (baseline)", runs, default=traffic[-2:-1], key="cmp_a")
    b_runs = c2.multiselect("B (candidate)", runs, default=traffic[-1:], key="cmp_b")
else:
    a_runs, b_runs = exps[pick]
c1, c2, c3, c4 = st.columns(4)
priority = c1.selectbox("Requests", [None, "interactive", "batch"], format_func=lambda p: p or "every class",
                        key="cmp_priority")
level = c2.selectbox("Confidence", [0.95, 0.99, 0.999], format_func=lambda x: f"{x:.1%}", key="cmp_level")
margin = c3.selectbox("Same within", [0.05, 0.10, 0.20], index=1, format_func=lambda x: f"±{x:.0%}", key="cmp_margin")
# a `try --budget` looked after every pair up to what its budget held: its repeated interval is wider
looks_to = c4.number_input("Looks up to (pairs; 0: one look)", min_value=0, max_value=200, value=0, step=1,
                           key="cmp_looks")
if not a_runs or not b_runs:
    ui.show_empty("Choose at least one run for each arm.")
    st.stop()
doc = compare.comparison(ctx.src, list(a_runs), list(b_runs), why.slo_spec(ctx.slo), priority, level, margin,
                         int(looks_to) or None)
for line in comparison_lines(doc):
    st.markdown(f"- {line.strip()}" if line.startswith("  ") else f"**{line}**")
table = ui.ms_table(compare.metrics_frame(doc)).format(  # durations by the one formatter; n/a, never "None"
    {c: (lambda v: "n/a" if ui.safe_float(v) is None else f"{v:+.1f}%") for c in ("low_pct", "high_pct")})
st.dataframe(table, hide_index=True, column_config={
    "A_ms": st.column_config.Column("A"), "B_ms": st.column_config.Column("B"),
    "diff_ms": st.column_config.Column("B − A"),
    "low_pct": st.column_config.Column(f"{level:.1%} interval from"), "high_pct": st.column_config.Column("to")})
shifts = compare.shift_frame(doc)
if len(shifts):
    st.plotly_chart(charts.phase_shifts(shifts), key="cmp_shifts")
    missing = sorted(set(shifts.loc[shifts["shift_ms"].isna(), "phase"]))
    if missing:
        st.caption("Not measured in the tails (no request of them has the phase): " + ", ".join(missing))
for note in doc["notes"]:
    st.caption(f"Note: {note}")
