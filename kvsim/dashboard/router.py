"""The dashboard's router: page configuration, widget state kept across pages, navigation.

The pages are the files of ``kvsim.app_pages``, registered by their path inside the package, so
they resolve in a checkout and in site-packages alike (and AppTest can switch between them).
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvsim import app_pages
from kvsim.app_pages._state import keep_widget_state

PAGES_DIR = Path(app_pages.__file__).resolve().parent
# (file in app_pages/, title, icon); the first is the default page
PAGES = (
    ("live_pool.py", "Live pool", ":material/grid_view:"),
    ("block_table.py", "Block table inspector", ":material/table_rows:"),
    ("metrics.py", "Metrics", ":material/monitoring:"),
    ("planner.py", "Capacity planner", ":material/calculate:"),
    ("kernels.py", "Kernel validation", ":material/memory:"),
)


def main() -> None:
    """Route one Streamlit run to the selected page."""
    st.set_page_config(page_title="kvsim · KV-cache memory", page_icon=":material/grid_view:",
                       layout="wide")
    keep_widget_state()
    page = st.navigation([st.Page(PAGES_DIR / name, title=title, icon=icon, default=i == 0)
                          for i, (name, title, icon) in enumerate(PAGES)])
    page.run()
