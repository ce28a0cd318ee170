"""The dashboard in a real browser: `streamlit run app.py` driven by Playwright on Debian chromium.

Skips (with the reason) when /usr/bin/chromium is absent; never downloads a browser. Saves one
screenshot per page into pytest's temporary folder, or into $KVSIM_SCREENSHOT_DIR when set
(`KVSIM_SCREENSHOT_DIR=docs/screenshots pytest -m browser tests/test_browser.py` refreshes the
README's pictures).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit_server import free_port, stop, wait_until_serving

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ERROR_TEXTS = ("Traceback", "StreamlitAPIException")


@pytest.fixture(scope="module")
def app_url():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url, timeout_s=30)
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def page(app_url):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking"])
        pg = browser.new_page(viewport={"width": 1500, "height": 2000})
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
            "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000)


def _no_exception(pg) -> None:
    assert pg.locator('[data-testid="stException"]').count() == 0, \
        pg.locator('[data-testid="stException"]').first.inner_text()
    body = pg.locator("body").inner_text()
    for text in ERROR_TEXTS:
        assert text not in body, f"{text!r} on the page"


def test_live_pool_plays_and_every_page_renders(app_url, page, tmp_path):
    shots = Path(os.environ.get("KVSIM_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.goto(app_url)
    page.get_by_role("heading", name="Live KV-cache pool").wait_for()
    _settle(page)
    # two pool heatmaps and the strip charts are drawn by plotly in the browser
    page.locator(".js-plotly-plot .heatmaplayer").nth(1).wait_for()
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 6
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Simulated time")
    before = slider.get_attribute("aria-valuenow") or slider.inner_text()
    page.get_by_role("button", name="Play").click()
    page.get_by_role("button", name="Pause").wait_for()
    # the fragment timer ticks every 0.5 s; a loaded machine may take a while to draw a tick
    for _ in range(60):
        page.wait_for_timeout(500)
        if slider.inner_text() != before:
            break
    assert slider.inner_text() != before, "the time scrubber did not move while playing"
    page.get_by_role("button", name="Pause").click()
    _settle(page)
    _no_exception(page)
    page.screenshot(path=str(shots / "1_live_pool.png"), full_page=True)
    assert (shots / "1_live_pool.png").stat().st_size > 10_000

    for title, heading, shot in [
            ("Block table inspector", "Block table inspector", "2_block_table.png"),
            ("Metrics", "Metrics", "3_metrics.png"),
            ("Capacity planner", "Capacity planner", "4_capacity_planner.png"),
            ("Kernel validation", "Kernel validation", "5_kernel_validation.png")]:
        page.locator('[data-testid="stSidebarNav"]').get_by_text(title).click()
        page.get_by_role("heading", name=heading).wait_for()
        _settle(page)
        if title == "Kernel validation":  # CPU interpreter: give the kernels time
            page.get_by_text("Sequences checked").wait_for(timeout=90_000)
            _settle(page)
        page.locator(".js-plotly-plot").first.wait_for()
        _no_exception(page)
        page.screenshot(path=str(shots / shot), full_page=True)
