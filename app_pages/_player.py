"""The live pool's player: a Streamlit custom component (v2) whose JavaScript is player.js.

Layout only: the frames come from kvsim.dashboard (comparison.live_payload); the script plays
them in the browser and reports the frame it stops on as its state ``frame``.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

_HERE = Path(__file__).resolve().parent
_CSS = """
.kv-player { font-family: inherit; color: var(--st-text-color, #31333f); }
.kv-bar { display: flex; gap: .5rem; align-items: center; margin-bottom: .25rem; }
.kv-btn { border: 1px solid #ccc; border-radius: .5rem; background: #fff; padding: .3rem .9rem;
          cursor: pointer; font-size: .95rem; }
.kv-primary { background: var(--st-primary-color, #ff4b4b); color: #fff; border-color: transparent; }
.kv-scrub { flex: 1; }
.kv-speed { font-size: .85rem; white-space: nowrap; }
.kv-clock { font-weight: 600; margin: .2rem 0 .4rem; }
.kv-note { font-size: .8rem; color: #8a6d00; margin-bottom: .4rem; }
.kv-legend { display: flex; flex-wrap: wrap; gap: .2rem 1rem; font-size: .8rem; margin-bottom: .5rem; }
.kv-swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: 1px;
             vertical-align: -1px; border: 1px solid #bbb; }
.kv-sides { display: grid; grid-template-columns: 1fr 1fr; gap: 1.5rem; }
.kv-title { font-weight: 600; margin-bottom: .2rem; }
.kv-metrics { display: grid; grid-template-columns: repeat(4, 1fr); gap: .3rem; }
.kv-metric-label { font-size: .8rem; color: #666; }
.kv-metric-value { font-size: 1.6rem; }
.kv-done { font-size: .85rem; color: #2a7b2a; min-height: 1.1em; }
.kv-pool { width: 100%; aspect-ratio: 1 / 1; image-rendering: pixelated; border: 1px solid #ddd;
           display: block; }
.kv-tip { font-size: .8rem; color: #555; min-height: 1.1em; }
.kv-strip { width: 100%; height: auto; display: block; margin-top: .3rem; border: 1px solid #eee; }
"""
_player = st.components.v2.component("kvsim_live_player", js=(_HERE / "player.js").read_text(),
                                     css=_CSS)


def live_player(payload: bytes, key: str):
    """Mount the player on ``payload`` (playback.with_start_frame); its result's ``frame`` is the
    frame it stopped on (None before the first pause)."""
    return _player(data=payload, key=key, on_frame_change=lambda: None)
