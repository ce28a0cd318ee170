"""The dashboard's router: page configuration, widget state kept across pages, navigation.

The pages are the files of ``kvsim.app_pages``, registered by their path inside the package, so
they resolve in a checkout and in site-packages alike (and AppTest can switch between them).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import streamlit as st

from kvsim import app_pages
from kvsim.app_pages._state import keep_widget_state
from kvsim.viz.style import CLASS_COLORS, OWNER_PALETTE

PAGES_DIR = Path(app_pages.__file__).resolve().parent
# (file in app_pages/, title, icon); the first is the default page
PAGES = (
    ("live_pool.py", "Live pool", ":material/grid_view:"),
    ("block_table.py", "Block table inspector", ":material/table_rows:"),
    ("kv_groups.py", "KV-cache groups", ":material/view_column:"),
    ("metrics.py", "Metrics", ":material/monitoring:"),
    ("planner.py", "Capacity planner", ":material/calculate:"),
    ("kernels.py", "Kernel validation", ":material/memory:"),
)


def page_icon():
    """The favicon: a 4 x 4 grid of pool blocks, drawn here (a material icon would be fetched
    from a font CDN, which fails offline)."""
    colors = [OWNER_PALETTE[0], OWNER_PALETTE[1], CLASS_COLORS["cached"], CLASS_COLORS["reservation"]]
    rgb = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in colors], dtype=np.uint8)
    icon = np.full((32, 32, 3), 255, dtype=np.uint8)
    for k in range(16):
        r, c = divmod(k, 4)
        icon[r * 8 + 1:r * 8 + 7, c * 8 + 1:c * 8 + 7] = rgb[(r + 2 * c) % len(rgb)]
    from PIL import Image  # Streamlit's own dependency

    return Image.fromarray(icon)


def main() -> None:
    """Route one Streamlit run to the selected page."""
    st.set_page_config(page_title="kvsim · KV-cache memory", page_icon=page_icon(), layout="wide")
    keep_widget_state()
    page = st.navigation([st.Page(PAGES_DIR / name, title=title, icon=icon, default=i == 0)
                          for i, (name, title, icon) in enumerate(PAGES)])
    page.run()
