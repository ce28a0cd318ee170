"""The dashboard in a real browser: `streamlit run app.py` driven by Playwright on Debian chromium.

Skips (with the reason) when /usr/bin/chromium is absent; never downloads a browser. Saves one
screenshot per page into pytest's temporary folder, or into $KVSIM_SCREENSHOT_DIR when set
(`KVSIM_SCREENSHOT_DIR=docs/screenshots pytest -m browser tests/test_browser.py` refreshes the
README's pictures). The live pool plays in the browser: these tests measure its time to first
render, its frames per second (the default pool, and 131k blocks beside a 2M-token contiguous
pool), that pause stops on the frame it was pressed on, and the last frame's numbers. The
figures are printed, and written as JSON to $KVSIM_PLAYBACK_REPORT when set
(bench/dashboard_playback.py).
"""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit_server import free_port, stop, wait_until_serving

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ERROR_TEXTS = ("Traceback", "StreamlitAPIException")
MIN_FPS = 5.0   # the target at 100k blocks
FIGURES: dict = {}


@pytest.fixture(scope="module")
def app_url():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url, timeout_s=30)
    yield url
    stop(proc)
    report = os.environ.get("KVSIM_PLAYBACK_REPORT")
    if report:
        Path(report).write_text(json.dumps(FIGURES, indent=1) + "\n")


@pytest.fixture(scope="module")
def page(app_url):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking"])
        pg = browser.new_page(viewport={"width": 1500, "height": 1900})
        pg.set_default_timeout(40_000)
        yield pg
        browser.close()


def _settle(pg) -> None:
    """Wait until Streamlit has finished the run and charts are drawn.

    The running indicator appears a moment after a run starts, so absence is checked twice
    with a pause in between.
    """
    for _ in range(2):
        pg.wait_for_timeout(700)
        pg.wait_for_function(
            "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)


def _no_exception(pg) -> None:
    assert pg.locator('[data-testid="stException"]').count() == 0, \
        pg.locator('[data-testid="stException"]').first.inner_text()
    body = pg.locator("body").inner_text()
    for text in ERROR_TEXTS:
        assert text not in body, f"{text!r} on the page"


def _player(pg):
    return pg.locator(".kv-player")


def _frame(pg) -> int:
    return int(_player(pg).get_attribute("data-frame"))


def _play_fps(pg, speed: str, seconds: float) -> float:
    """From the first frame, play at ``speed`` frames/s for ``seconds`` (less if the end would
    come first), count the frames drawn, press Pause; returns frames/s and checks that pause
    stops on the frame it was pressed on."""
    frames = int(_player(pg).get_attribute("data-frames"))
    seconds = min(seconds, 0.7 * (frames - 1) / float(speed))
    pg.locator(".kv-scrub").fill("0")
    _settle(pg)   # the scrubber reports the frame: the rerun mounts the player there
    pg.select_option(".kv-speed select", speed)
    start = _frame(pg)
    pg.locator("[data-testid=kv-play]").click()
    t0 = time.perf_counter()
    pg.wait_for_timeout(seconds * 1000)
    frame = _frame(pg)
    fps = (frame - start) / (time.perf_counter() - t0)
    assert _player(pg).get_attribute("data-playing") == "1"
    pg.locator("[data-testid=kv-play]").click()   # pause
    stopped = _frame(pg)
    pg.wait_for_timeout(1000)
    assert _frame(pg) == stopped, "playback went on after pause"
    assert _player(pg).get_attribute("data-playing") == "0"
    return fps


def _metric(pg, side: int, name: str) -> str:
    return pg.locator(".kv-side").nth(side).locator(f"[data-metric={name}]").inner_text()


def test_live_pool_plays_and_every_page_renders(app_url, page, tmp_path):
    shots = Path(os.environ.get("KVSIM_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    page.goto(app_url)
    page.get_by_role("heading", name="Live KV-cache pool").wait_for()
    _player(page).wait_for(timeout=120_000)
    FIGURES["default_first_render_s"] = round(time.perf_counter() - t0, 2)
    _settle(page)
    frames = int(_player(page).get_attribute("data-frames"))
    assert frames >= 100 and page.locator("canvas.kv-pool").count() == 2
    FIGURES["default_fps_at_10"] = round(_play_fps(page, "10", 3), 1)
    assert FIGURES["default_fps_at_10"] > 5
    before = _frame(page)
    page.locator("[data-testid=kv-step]").click()
    assert _frame(page) == before + 1
    # the server learns where playback stopped: the inspector opens on that moment
    _settle(page)
    _no_exception(page)
    page.screenshot(path=str(shots / "1_live_pool.png"), full_page=True)
    assert (shots / "1_live_pool.png").stat().st_size > 10_000
    # to the end: every request finished, nothing runs or waits, no KV is used
    page.select_option(".kv-speed select", "60")
    page.locator("[data-testid=kv-play]").click()
    deadline = time.perf_counter() + 120
    while (_frame(page) < frames - 1 or _player(page).get_attribute("data-playing") != "0") \
            and time.perf_counter() < deadline:
        page.wait_for_timeout(200)
    # the player reports the frame it stopped on: the server's rerun must end before scrubbing
    _settle(page)
    for side in (0, 1):
        assert _metric(page, side, "running") == "0" and _metric(page, side, "waiting") == "0"
        assert _metric(page, side, "kv_usage") == "0%"
        assert page.locator(".kv-done").nth(side).inner_text() == "(all requests done)"
    # back to a busy moment with the scrubber: the other pages open on it
    page.locator(".kv-scrub").fill(str(frames // 10))
    # the input event is handled on the page's own loop: under load it can lag the fill
    deadline = time.perf_counter() + 10
    while _frame(page) != frames // 10 and time.perf_counter() < deadline:
        page.wait_for_timeout(100)
    assert _frame(page) == frames // 10
    _settle(page)

    for title, heading, shot in [
            ("Block table inspector", "Block table inspector", "2_block_table.png"),
            ("Metrics", "Metrics", "3_metrics.png"),
            ("Capacity planner", "Capacity planner", "4_capacity_planner.png"),
            ("Kernel validation", "Kernel validation", "5_kernel_validation.png"),
            ("KV-cache groups", "KV-cache groups (hybrid models)", "6_kv_groups.png")]:
        page.locator('[data-testid="stSidebarNav"]').get_by_text(title).click()
        page.get_by_role("heading", name=heading).wait_for()
        _settle(page)
        if title == "Kernel validation":  # CPU interpreter: give the kernels time
            page.get_by_text("Sequences checked").wait_for(timeout=90_000)
            _settle(page)
        if title == "Block table inspector":   # opened on the moment the scrubber left
            page.get_by_text("Block table of request").wait_for()
        page.locator(".js-plotly-plot").first.wait_for()
        _no_exception(page)
        page.screenshot(path=str(shots / shot), full_page=True)
    print("\nplayback:", FIGURES)


def test_playback_at_100k_blocks(app_url, page):
    """131,072 blocks (2M tokens at block size 16) on the paged side, the same tokens contiguous."""
    page.goto(app_url)
    page.get_by_role("heading", name="Live KV-cache pool").wait_for()
    _settle(page)
    spec = page.get_by_label("Synthetic spec")
    spec.fill("sharegpt:rate=40,n=3000,seed=0")
    spec.press("Enter")
    _settle(page)
    requests = page.get_by_label("Requests (at most)")
    requests.fill("3000")
    requests.press("Enter")
    _settle(page)
    slider = page.get_by_role("slider", name="KV pool (tokens)")
    slider.focus()
    t0 = time.perf_counter()
    slider.press("End")
    # the player is mounted on the new pools when its canvas has one pixel per block
    cols = str(math.ceil(math.sqrt(131_072)))
    deadline = time.perf_counter() + 300
    while page.locator("canvas.kv-pool").first.get_attribute("width") != cols:
        assert time.perf_counter() < deadline, "the 131k-block pools never rendered"
        page.wait_for_timeout(250)
    FIGURES["100k_blocks_first_render_s"] = round(time.perf_counter() - t0, 1)
    FIGURES["100k_blocks_frames"] = int(_player(page).get_attribute("data-frames"))
    _settle(page)
    for speed in ("10", "30", "60"):
        FIGURES[f"100k_blocks_fps_at_{speed}"] = round(_play_fps(page, speed, 4), 1)
    _no_exception(page)
    best = max(v for k, v in FIGURES.items() if k.startswith("100k_blocks_fps"))
    print("\nplayback:", FIGURES)
    assert best >= MIN_FPS, FIGURES


def test_the_cache_curve_figure_spans_its_sizes_in_a_browser(page, tmp_path):
    """kvsim cache-curve --html, drawn by chromium: the x axis spans the curve's sizes (it ran to
    1e56-1e64 GiB when the pool's label was placed at its value on the log axis, issue 29 item 6)
    and the CPU tier's curve is drawn. $KVSIM_SCREENSHOT_DIR keeps the picture."""
    import pandas as pd

    from kvsim.cli import main

    html, csv = tmp_path / "curve.html", tmp_path / "curve.csv"
    assert main(["cache-curve", "sharegpt:rate=4,n=400,seed=0,system=512,turns=uniform(1,6),think_s=5",
                 "--block-size", "16", "--model", "Llama-3.1-8B", "--gpu", "h100",
                 "--cpu-offload-gib", "64", "--html", str(html), "--csv", str(csv)]) == 0
    sizes = pd.read_csv(csv)["cache_gib"]
    sizes = sizes[sizes > 0]
    pg = page.context.browser.new_page(viewport={"width": 1100, "height": 460})   # the module's chromium
    try:
        pg.goto(f"file://{html}")
        pg.wait_for_function("() => document.querySelector('.js-plotly-plot')?._fullLayout?.xaxis")
        lo, hi = pg.evaluate("() => document.querySelector('.js-plotly-plot')._fullLayout.xaxis.range")
        names = pg.evaluate("() => document.querySelector('.js-plotly-plot')._fullData.map(t => t.name)")
        shots = os.environ.get("KVSIM_SCREENSHOT_DIR")
        pg.screenshot(path=str(Path(shots) / "cache_curve.png") if shots else str(tmp_path / "curve.png"))
    finally:
        pg.close()
    assert math.log10(sizes.min()) - 1 <= lo <= math.log10(sizes.min())
    assert math.log10(sizes.max()) <= hi <= math.log10(sizes.max()) + 1
    assert any(n.startswith("CPU tier") for n in names)
