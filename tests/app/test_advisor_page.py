"""The Advisor page and the warm-up page's link to it, in Chromium against `streamlit run` on a free loopback
port; the `warmscope advise` command on the same store. Screenshots go to test-output/."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from warmscope.simulator import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("advisor-page") / "demo.sqlite"
    simulate(SimConfig.load(None, hours=3.0, rps=3.0, tenants=4, seed=5, strategy_b="predictive"), path, workers=1)
    return path


def _settle(page):
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=180_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)
    page.wait_for_timeout(1000)


@pytest.mark.browser
def test_advisor_page_shows_forecast_peak_and_recommendation(streamlit_server):
    from playwright.sync_api import sync_playwright

    url, chromium = streamlit_server
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                    "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/warmup", wait_until="networkidle")
        _settle(page)
        link = page.get_by_text("What to warm and when")
        assert link.count() == 1
        link.click()
        page.wait_for_url(re.compile(r"/advisor(\?.*)?$"), timeout=60_000)  # the URL also carries the range
        # forecasting, then tuning: wait for the last section's figures, then for the run to end
        page.get_by_text("Trigger the warm-up at").wait_for(timeout=600_000)
        _settle(page)
        page.screenshot(path=str(OUT / "advisor.png"), full_page=True)
        page.get_by_text("Replayed hit rate per 15 min").scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        page.screenshot(path=str(OUT / "advisor-recommendation.png"))
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        body = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
        for text in ("Advisor", "Forecast", "Next peak", "Trigger the warm-up at", "Recommendation", "recommended",
                     "Warm-up ROI (compute)", "Staleness", "hot keys"):
            assert text in body, text
        assert page.locator(".js-plotly-plot").count() >= 2  # forecast with intervals, before/after
        browser.close()


@pytest.mark.slow
def test_advise_cli_prints_table_and_json_and_rejects_bad_input(store, tmp_path):
    exe = [sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "advise"]
    out = tmp_path / "advice.json"
    r = subprocess.run(exe + ["--budget-gpu-s", "500", "--iterations", "4", "--json", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "MAPE" in r.stdout and "recommended" in r.stdout and "Next peak" in r.stdout
    assert "warm-up ROI (compute)" in r.stdout and "staleness" in r.stdout and "hot keys" in r.stdout
    d = json.loads(out.read_text())
    assert d["budget_gpu_s_per_day"] == 500 and d["evaluations"] == 1 + 8 + 4
    assert d["objective"] == "net_gpu_s" and d["gain"] == d["gain_gpu_s"]
    span_days = 3.0 * 3600 / 86400
    assert d["outcome"]["warm_gpu_s"] / span_days <= 500  # the recommendation stays within the budget
    assert {row["horizon_s"] for row in d["forecast"]} == {5.0, 180.0, 3600.0}
    r = subprocess.run(exe + ["--objective", "hit_rate"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice: 'hit_rate'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(exe + ["--budget-gpu-s", "-3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--budget-gpu-s must be a positive" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp_path / "nope.sqlite"),
                        "advise"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
