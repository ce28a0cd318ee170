"""kvsim dashboard entry point: routes only; pages live in app_pages/, logic in viz/ and _state."""
import streamlit as st

from kvsim.app_pages._state import keep_widget_state

st.set_page_config(page_title="kvsim · KV-cache memory", page_icon=":material/grid_view:",
                   layout="wide")
keep_widget_state()
page = st.navigation([
    st.Page("app_pages/live_pool.py", title="Live pool", icon=":material/grid_view:", default=True),
    st.Page("app_pages/block_table.py", title="Block table inspector",
            icon=":material/table_rows:"),
    st.Page("app_pages/metrics.py", title="Metrics", icon=":material/monitoring:"),
    st.Page("app_pages/planner.py", title="Capacity planner", icon=":material/calculate:"),
    st.Page("app_pages/kernels.py", title="Kernel validation", icon=":material/memory:"),
])
page.run()
