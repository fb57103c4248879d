"""Every page and interaction in a real browser: Playwright driving Debian's chromium against
the dashboard server on a free loopback port, over the demo world (runs, traps and alerts in the default range).
Screenshots go to test-output/screenshots/."""

import dataclasses
import hashlib
import time
import urllib.parse
from pathlib import Path

import pytest
from warmscope.app.cli.main import demo_world
from warmscope.app.dashboard.pages import PAGES
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import simulate

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-output" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser") / "demo.sqlite"
    # The span ends at minute 45 of the last full hour: the leak (2.5 h to 1.5 h before the end) then
    # reaches the hourly hot-key window that the alerts' last evaluation reads, so it is open at the
    # range's end. Ending at the current minute, it was open only in the second half of each hour.
    now = (time.time() // 3600 - 1) * 3600 + 45 * 60
    cfg, faults = demo_world(6.0, now=now)
    simulate(dataclasses.replace(cfg, rps=3.0, tenants=4, seed=5), path, faults, workers=1)
    return path


@pytest.fixture(scope="module")
def browser(streamlit_server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=streamlit_server[1], args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    yield pg
    pg.close()


def settle(page) -> None:
    """Wait until the script run has finished (the running indicator is gone) and charts are drawn."""
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=300_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)
    page.wait_for_timeout(800)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)
    # every chart drawn, no element placeholder left (a screenshot taken earlier shows grey placeholders)
    page.wait_for_function("!document.querySelector('[data-testid=\"stSkeleton\"]') && "
                           "[...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')]"
                           ".every(c => c.querySelector('.main-svg'))", timeout=300_000)


def query(page) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(page.url).query))


def no_errors(page, name: str) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, name


def selected(page, label: str) -> str:
    """The value a selectbox shows (its text is an input's value, not inner text)."""
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first
    return box.locator("input").first.input_value() or box.inner_text()


def drag(page, chart, fx0: float, fx1: float) -> None:
    """Drag a box across a plotly chart's plot area, from fraction fx0 to fx1 of its width."""
    area = chart.locator(".nsewdrag").first
    b = area.bounding_box()
    y = b["y"] + b["height"] * 0.5
    page.mouse.move(b["x"] + b["width"] * fx0, b["y"] + 5)
    page.mouse.down()
    page.mouse.move(b["x"] + b["width"] * (fx0 + fx1) / 2, y, steps=5)
    page.mouse.move(b["x"] + b["width"] * fx1, b["y"] + b["height"] - 5, steps=5)
    page.mouse.up()


def test_a_link_reproduces_the_view(streamlit_server, page):
    """First in the module: the server's first visitor opens a deep link (no folder-based navigation)."""
    url, _ = streamlit_server
    page.goto(f"{url}/hitrate?range=last+hour&drill=tenant:acme&groupby=layer", wait_until="networkidle")
    settle(page)
    buttons = page.locator('[data-testid="stMain"] button').all_inner_texts()
    assert any("tenant = acme" in b for b in buttons), buttons
    assert selected(page, "Time range") == "last hour"
    assert selected(page, "Group by") == "layer"
    assert "By layer" in page.locator('[data-testid="stMain"]').inner_text()
    page.reload(wait_until="networkidle")  # a reload keeps the view
    settle(page)
    assert query(page).get("range") == "last hour"
    assert any("tenant = acme" in b for b in page.locator('[data-testid="stMain"] button').all_inner_texts())


def test_every_page_at_the_default_range(streamlit_server, page):
    url, _ = streamlit_server
    OUT.mkdir(parents=True, exist_ok=True)
    shots = {}
    for p in PAGES:  # every page of the registry main.py builds the navigation from
        name = p.name
        (OUT / f"{name}.png").unlink(missing_ok=True)  # earlier runs' screenshots prove nothing
        page.goto(f"{url}/{p.url_path}", wait_until="networkidle")
        settle(page)
        shots[name] = page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
        no_errors(page, name)
        h1 = page.locator('[data-testid="stMainBlockContainer"] h1').first.inner_text().strip()
        assert h1 == p.heading, name
        assert query(page).get("range") == "last 6 hours", (name, page.url)  # the range is in every link
        body = page.locator('[data-testid="stMain"]').inner_text()
        for glyph in ("🟢", "🟡", "🔴", "⚪", "🔒"):  # no emoji dependency
            assert glyph not in body, (name, glyph)
    # one screenshot of each page, written by this run: a PNG the size of a drawn page
    assert sorted(shots) == sorted(p.name for p in PAGES)
    for name, png in shots.items():
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, (name, len(png))
        # compared by digest: a failing bytes comparison makes pytest diff megabytes for minutes
        on_disk = hashlib.sha256((OUT / f"{name}.png").read_bytes()).hexdigest()
        assert on_disk == hashlib.sha256(png).hexdigest(), f"{name}.png overwritten: screenshot names must be unique"


def test_first_screen_tells_the_story(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(url, wait_until="networkidle")
    settle(page)
    body = page.locator('[data-testid="stMain"]').inner_text()
    assert "What happened" in body
    assert "Latest warm-up run" in body  # the demo's runs are in the default range
    assert "No warm-up runs in this range" not in body
    # The cross-tenant read (a security finding) is shown in red: an error-styled alert naming it.
    red = page.locator('[data-testid="stAlertContentError"]')
    assert red.count() >= 1
    assert "SECURITY" in red.first.inner_text() and "CrossTenantCacheRead" in red.first.inner_text()


def test_security_finding_is_red_on_alerts_and_root_cause(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(f"{url}/alerts", wait_until="networkidle")
    settle(page)
    assert "CrossTenantCacheRead" in page.locator('[data-testid="stAlertContentError"]').first.inner_text()
    # Root cause at the default range: the detected window holds the cross-tenant read, shown in red.
    page.goto(f"{url}/rootcause?range=last+6+hours", wait_until="networkidle")
    settle(page)
    errs = page.locator('[data-testid="stAlertContentError"]')
    assert errs.count() >= 1 and "SECURITY" in errs.first.inner_text()
    page.screenshot(path=str(OUT / "rootcause-security.png"), full_page=True)


def test_heatmap_click_drills_down_and_breadcrumbs_reset(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(f"{url}/hitrate", wait_until="networkidle")
    settle(page)
    charts = page.locator('[data-testid="stPlotlyChart"]')
    heat = charts.nth(1)
    heat.scroll_into_view_if_needed()
    b = heat.locator(".scatterlayer .points path").first.bounding_box()
    x, y = b["x"] + b["width"] / 2, b["y"] + b["height"] / 2
    page.mouse.move(x, y)  # plotly hit-tests the hovered point
    page.wait_for_timeout(300)
    page.mouse.click(x, y)
    page.wait_for_function("location.search.includes('drill=')", timeout=300_000)  # two reruns: poll
    settle(page)
    crumbs = page.locator('[data-testid="stMain"] button').all_inner_texts()
    assert any("tenant =" in c for c in crumbs), crumbs
    assert any("layer =" in c for c in crumbs), crumbs
    q = query(page)
    assert q.get("drill", "").startswith("tenant:") and ",layer:" in q["drill"], page.url
    page.screenshot(path=str(OUT / "hitrate-drilled.png"), full_page=True)
    # Back to all traffic: the path and the URL's drill go, the pickers start over.
    page.get_by_role("button", name="All traffic").click()
    page.wait_for_function("!location.search.includes('drill=')", timeout=300_000)  # the rerun began
    settle(page)
    assert "drill" not in query(page)
    assert not any("tenant =" in c for c in page.locator('[data-testid="stMain"] button').all_inner_texts())
    no_errors(page, "hitrate")


def test_runs_are_picked_from_a_labelled_list_kept_in_the_url(streamlit_server, store, page):
    url, _ = streamlit_server
    from warmscope.analysis.roi import warmups

    # a warm-up: its layers' runs together, named by its first run's id
    first = warmups(EmbeddedStore(store, readonly=True).frame("warmup_runs")).iloc[-1]
    page.goto(f"{url}/warmup?range=everything&run={first.run_id}", wait_until="networkidle")
    settle(page)
    assert selected(page, "Warm-up (newest first").endswith(
        f"{first.run_id} · {first.replica} · {first.layer} · {first.strategy} · trigger {first.trigger}")
    assert query(page).get("run") == first.run_id
    no_errors(page, "warmup")


def test_overview_drag_zooms_to_an_absolute_range(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(url, wait_until="networkidle")
    settle(page)
    drag(page, page.locator('[data-testid="stPlotlyChart"]').first, 0.4, 0.7)
    page.wait_for_function("location.search.includes('range=custom')", timeout=300_000)  # two reruns: poll
    settle(page)
    q = query(page)
    assert q.get("range") == "custom" and q.get("from") and q.get("to"), page.url
    assert selected(page, "Time range") == "custom"
    assert "From – to (UTC)" in page.locator('[data-testid="stSidebar"]').inner_text()
    no_errors(page, "overview zoomed")
    page.screenshot(path=str(OUT / "overview-zoomed.png"), full_page=True)


def test_root_cause_window_by_brushing(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(f"{url}/rootcause", wait_until="networkidle")
    settle(page)
    drag(page, page.locator('[data-testid="stPlotlyChart"]').first, 0.55, 0.8)
    page.wait_for_function("location.search.includes('window=')", timeout=300_000)
    settle(page)
    q = query(page)
    assert "~" in q.get("window", ""), page.url
    assert page.get_by_label("choose").is_checked()
    no_errors(page, "rootcause brushed")
    page.screenshot(path=str(OUT / "rootcause-brushed.png"), full_page=True)


def test_alert_history_shows_when_each_alert_fired_and_resolved(streamlit_server, page):
    """The history is computed in the background: the page shows it when done, without a reload (its values are
    checked against the analysis in tests/app/test_overview.py)."""
    url, _ = streamlit_server
    page.goto(f"{url}/alerts", wait_until="networkidle")
    page.get_by_text("When each alert was firing").wait_for(timeout=600_000)  # the timeline's title
    settle(page)
    page.get_by_text("When each alert was firing").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(OUT / "alerts-history.png"))
    no_errors(page, "alerts history")
    body = page.locator('[data-testid="stMain"]').inner_text()
    assert "Alert history" in body and "Re-evaluating" not in body
    assert "CrossTenantCacheRead" in page.locator('[data-testid="stPlotlyChart"]').last.inner_text()


def test_latency_page_percentiles_follow_the_url(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(f"{url}/latency?metric=load&by=layer&q=P99", wait_until="networkidle")
    settle(page)
    no_errors(page, "latency")
    assert selected(page, "Group by") == "layer" and selected(page, "Percentile") == "P99"
    chart = page.locator('[data-testid="stPlotlyChart"]').first.inner_text()
    assert "Cache load time (per layer): P99 by layer" in chart
    page.screenshot(path=str(OUT / "latency-load-by-layer.png"), full_page=True)
    q = query(page)
    assert (q.get("metric"), q.get("by"), q.get("q")) == ("load", "layer", "P99")


def test_ab_breakdown_per_tenant_and_layer_with_intervals(streamlit_server, page):
    url, _ = streamlit_server
    page.goto(f"{url}/ab?segment=tenant+%C3%97+layer", wait_until="networkidle")
    settle(page)
    page.get_by_text("Compute the breakdown").click()
    page.get_by_text("treatment − control").first.wait_for(timeout=600_000)  # the forest plots' titles
    settle(page)
    no_errors(page, "ab breakdown")
    body = page.locator('[data-testid="stMain"]').inner_text()
    assert "Holm- and BH-adjusted across every tenant × layer" in body
    assert query(page).get("segment") == "tenant × layer"
    page.locator('[data-testid="stPlotlyChart"]').last.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "ab-breakdown.png"), full_page=True)


def test_ab_page_compares_every_arm_and_offers_every_declared_metric(streamlit_server, page):
    from warmscope.model.ab_metrics import metric_names

    url, _ = streamlit_server
    page.goto(f"{url}/ab", wait_until="networkidle")
    settle(page)
    no_errors(page, "ab")
    main = page.locator('[data-testid="stMain"]')
    # The demo runs three pools: none (A, the control), static_topk (B) and predictive (C).
    arms = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Treatment arms").first.inner_text()
    assert "B" in arms and "C" in arms
    body = main.inner_text()
    assert "B vs A" in body and "C vs A" in body
    assert "each arm against A (Holm over 2 arms)" in body  # the verdict covers both arms
    # The primary-metric picker lists every declared metric (per-layer ones for the demo's layers).
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Primary metric").first.click()
    options = page.locator('[role="option"]').all_inner_texts()
    page.keyboard.press("Escape")
    layers = ["embedding", "lora", "prefix_kv", "response", "weights"]
    assert [o.strip() for o in options] == metric_names(layers), options
    page.screenshot(path=str(OUT / "ab-three-arms.png"), full_page=True)
