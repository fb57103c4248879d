"""The Advisor page and the warm-up page's link to it, in Chromium against `streamlit run` on a free loopback
port; the `warmscope advise` command on the same store. Screenshots go to test-output/."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig

from tests.conftest import simulated_store

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("advisor-page") / "demo.sqlite"
    simulated_store(path, SimConfig.load(None, hours=3.0, rps=3.0, tenants=4, seed=5, strategy_b="predictive"),
                    workers=1)
    return path


def _settle(page):
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=180_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)
    page.wait_for_timeout(1000)


@pytest.mark.browser
def test_advisor_page_shows_forecast_and_no_recommendation_on_an_untrusted_replay(streamlit_server):
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
        # forecasting, then the replay-fidelity check: on this short store (3 h at 3 req/s, a cold first hour)
        # the response replay is within ±5 points in 9 of 12 buckets (75 % < 90 %), so the page shows the
        # fidelity table and one sentence instead of a recommendation
        page.get_by_text("No recommendation").wait_for(timeout=600_000)
        _settle(page)
        page.screenshot(path=str(OUT / "advisor-untrusted.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        body = page.locator('[data-testid="stMainBlockContainer"]').inner_text()
        for text in ("Advisor", "Forecast", "Recommendation", "does not reproduce the recorded traffic",
                     "response 75% of 12 buckets"):
            assert text in body, text
        # the fidelity table follows the sentence (a data grid drawn on a canvas: its cells are not text)
        grids = page.locator('[data-testid="stDataFrame"]')
        assert grids.count() >= 1 and grids.last.is_visible()
        assert grids.last.bounding_box()["y"] > page.get_by_text("No recommendation").bounding_box()["y"]
        assert "Trigger the warm-up at" not in body  # no recommendation built on an untrusted replay
        assert page.locator(".js-plotly-plot").count() >= 1  # the forecast with its intervals
        browser.close()


@pytest.mark.slow
def test_advise_cli_prints_table_and_json_and_rejects_bad_input(store, tmp_path):
    exe = [sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "advise"]
    out = tmp_path / "advice.json"
    r = subprocess.run(exe + ["--budget-gpu-s", "500", "--iterations", "4", "--objective", "net_gpu_s",
                              "--json", str(out), "--quiet"], capture_output=True, text=True, timeout=600)
    # the replay-fidelity gate: response within ±5 points in 9 of 12 buckets (75 %), embedding 12 of 12
    assert r.returncode == 2, r.stderr
    assert "Replay fidelity" in r.stdout and "75%" in r.stdout and "100%" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == (
        "warmscope advise: The replay does not reproduce the recorded traffic (response 75% of 12 buckets within "
        "±5 points; 90% needed), so it makes no recommendation.")
    assert (r.stdout + r.stderr).count("does not reproduce") == 1  # said once, as the error
    assert not out.exists()  # no recommendation written
    r = subprocess.run(exe + ["--objective", "slo"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "No SLO price" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(exe + ["--objective", "hit_rate"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice: 'hit_rate'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(exe + ["--budget-gpu-s", "-3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--budget-gpu-s must be a positive" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp_path / "nope.sqlite"),
                        "advise"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_runs_cli_prints_precision_recall_roi_per_window_and_verdict(store):
    exe = [sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "runs"]
    r = subprocess.run(exe + ["--json", "--limit", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["runs"]
    from warmscope.analysis.roi import warmups

    # one row per warm-up: a replica's layers' runs, started one after the other, together
    n = len(warmups(EmbeddedStore(store, readonly=True).frame("warmup_runs")))
    assert len(rows) == min(3, n) >= 2 and rows[0]["started"] >= rows[-1]["started"]  # newest first
    for row in rows:
        assert [w["window"].split(" (")[0] for w in row["roi"]] == ["T+5 min", "T+1 h", "T+24 h"]
        assert 0 <= row["precision"] <= 1 and row["verdict"]
        for w in row["roi"]:  # a number with its interval, or why there is none: never None or nan
            for v in (w["compute"], w["business"]):
                assert v and "nan" not in v.lower() and "none" not in v.lower(), w
    r = subprocess.run(exe + ["--limit", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "precision" in r.stdout and "verdict" in r.stdout and "compute ROI T+5 min" in r.stdout
    assert "nan" not in r.stdout.lower() and "None" not in r.stdout
    # the experiment's whole-run ROI beside the newest run's T+5 min ROI, with the sentence on why they differ
    assert [e["variant"] for e in doc["experiments"]] == ["B"] and doc["experiments"][0]["control"] == "A"
    assert "arm B vs A: compute ROI" in r.stdout and "T+5 min ROI counts the five minutes" in r.stdout
