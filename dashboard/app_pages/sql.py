"""SQL: a read-only console over the store, with example queries."""

import streamlit as st

from tailtrace.dashboard import data, ui

st.title("SQL")
ctx = ui.context()
st.caption("Read-only: the store is opened with enable_external_access = false and locked configuration "
           "(or queried through the collector's read-only /api/sql). At most 10,000 rows; 15 s per "
           "statement. Tables: requests, spans, decode_steps, engine_steps, device_samples, metric_points "
           "(docs/schema.md).")
if ctx is None:
    st.stop()
example = st.selectbox("Example", list(data.SQL_EXAMPLES), key="sql_example")
if st.session_state.get("_sql_last_example") != example:
    st.session_state["sql_text"] = data.SQL_EXAMPLES[example]
    st.session_state["_sql_last_example"] = example
sql = st.text_area("SQL", key="sql_text", height=160)
st.button("Run", type="primary", key="sql_run")  # any rerun runs the text (results are cached)
if sql.strip():
    try:
        res = data.run_user_sql(ctx.src, sql)
    except data.DataError as exc:
        st.error(str(exc))
    else:
        st.dataframe(res.df, hide_index=True)
        st.caption(f"{len(res.df):,} rows" + (" (truncated at the row cap)" if res.truncated else ""))
