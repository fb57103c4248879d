"""Every page in a real browser: Playwright driving Debian's chromium against
`streamlit run` on a free loopback port. Screenshots go to test-output/."""

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from warmscope.simulator import SimConfig, parse_fault, simulate
from tests.conftest import free_port, need_binary, wait_until

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output" / "screenshots"
PAGES = {"overview": "", "hitrate": "hitrate", "warmup": "warmup", "hotkeys": "hotkeys", "rootcause": "rootcause",
         "ab": "ab", "alerts": "alerts"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    chromium = need_binary("chromium")
    store = tmp_path_factory.mktemp("browser") / "demo.sqlite"
    simulate(SimConfig.load(hours=1.0, rps=4.0, tenants=4, seed=5), store,
             [parse_fault("bypass:tenant=acme,layer=prefix_kv@00:40-01:00")], workers=1)
    port = free_port()
    env = dict(os.environ, WARMSCOPE_STORE=str(store))
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address",
                             "127.0.0.1", "--browser.gatherUsageStats", "false"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200, 60,
                   "streamlit")
        yield url, chromium
    finally:
        proc.terminate()
        proc.wait(10)


def test_every_page_loads_in_chromium_without_errors(server):
    from playwright.sync_api import sync_playwright

    url, chromium = server
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for name, path in PAGES.items():
            page.goto(f"{url}/{path}", wait_until="networkidle")
            page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=60_000)
            # Wait for the script run to finish (the status widget disappears).
            page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')",
                                   timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
            assert page.locator('[data-testid="stException"]').count() == 0, name
            assert page.locator('[data-testid="stAlertContentError"]').count() == 0, name
            assert page.locator("h1").first.inner_text().strip(), name
        browser.close()
    assert len(list(OUT.glob("*.png"))) >= len(PAGES)
