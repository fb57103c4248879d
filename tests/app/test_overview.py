"""Every dashboard page under AppTest: no exception, headline numbers equal the
analysis functions' on the same data, drill-down changes the selection, and
the empty/missing-store states say what to do."""

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.hitrate import hit_table
from warmscope.analysis.scores import score_card
from warmscope.app.dashboard.pages import PAGES as REGISTRY
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig, parse_fault

from tests.conftest import simulated_store
from tests.helpers import wrapped_table

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
# every page of the registry main.py builds the navigation from, the default (overview) apart
PAGES = [p.name for p in REGISTRY if not p.default]


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("app") / "demo.sqlite"
    simulated_store(path, SimConfig.load(hours=1.0, rps=4.0, tenants=4, seed=3),
                    [parse_fault("bypass:tenant=acme,layer=prefix_kv@00:40-01:00")], workers=1)
    return path


@pytest.fixture
def app(demo_store, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_STORE", str(demo_store))
    return AppTest.from_file(MAIN, default_timeout=120)


def test_overview_headline_equals_the_analysis(app, demo_store):
    at = app.run()
    assert not at.exception
    st = EmbeddedStore(demo_store, readonly=True)
    # the page's range starts at the first lookup, or at the first warm-up run when replicas warmed up before
    start = min(float(st.frame("lookups").ts.min()), float(st.frame("warmup_runs").started.min())) - 1
    fr = {n: st.frame(n, start) for n in ("lookups", "requests", "histograms", "warmup_runs", "warmed_keys",
                                          "gauges", "writes", "hot_keys", "early_keys")}
    # One hit-rate definition on the page, the score card's: every layer except model weights.
    overall = hit_table(fr["lookups"][fr["lookups"].layer != "weights"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Hit rate"] == f"{overall.hit_rate.iloc[0]:.1%}"
    assert metrics["Lookups"] == f"{int(overall.lookups.iloc[0]):,}"
    assert metrics["Warm-up score"] == f"{score_card(fr, AnalysisConfig.load()).composite:.2f}"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_exception(app, page):
    at = app.run()
    at.switch_page(f"entries/{page}.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_hit_rate_drill_down_changes_the_selection(app):
    at = app.run()
    at.switch_page("entries/hitrate.py").run()
    at.selectbox(key="groupby").set_value("tenant").run()
    first = drill_picker(at).key
    drill_picker(at).set_value("acme").run()
    assert at.session_state["drill"] == [("tenant", "acme")]
    assert any("tenant = acme" in b.label for b in at.button)
    # the next level's picker is a new widget starting at "—" (a browser keeps a known key's choice)
    assert drill_picker(at).key != first and drill_picker(at).value == "—"
    at.selectbox(key="groupby").set_value("layer").run()
    drill_picker(at).set_value("prefix_kv").run()
    assert at.session_state["drill"] == [("tenant", "acme"), ("layer", "prefix_kv")]
    at.button(key="crumb-0").click().run()  # back to tenant = acme
    assert at.session_state["drill"] == [("tenant", "acme")]
    at.button(key="crumb-root").click().run()
    assert at.session_state["drill"] == []
    assert not at.exception


def test_a_bypass_shows_on_the_hit_rate_page_though_not_in_the_rate(app, demo_store):
    # the store's bypass fault (acme, prefix_kv, 00:40-01:00) skips the cache: no hit, no miss
    at = app.run()
    at.switch_page("entries/hitrate.py").run()
    at.selectbox(key="groupby").set_value("tenant").run()
    lk = EmbeddedStore(demo_store, readonly=True).frame("lookups")
    by_tenant = lk[lk.result == "bypass"].groupby("tenant")["count"].sum()
    assert by_tenant.index.tolist() == ["acme"] and by_tenant["acme"] > 0
    groups = at.dataframe[0].value
    shown = groups.data if hasattr(groups, "data") else groups
    assert dict(zip(shown["tenant"], shown["bypassed"], strict=True)).get("acme") == by_tenant["acme"]
    assert {t: v for t, v in zip(shown["tenant"], shown["bypassed"], strict=True) if t != "acme"} == \
        dict.fromkeys(set(shown["tenant"]) - {"acme"}, 0)
    said = " ".join(c.value for c in at.caption)
    assert f"{int(by_tenant.sum()):,} lookups bypassed the cache" in said


def test_ab_page_verdict_matches_the_report(app, demo_store):
    from warmscope.analysis.ab_report import build_report

    at = app.run()
    at.switch_page("entries/ab.py").run()
    st = EmbeddedStore(demo_store, readonly=True)
    rep = build_report(st.units("warmup-strategy"), "warmup-strategy", requests=st.frame("requests"))
    assert any(rep.verdict in m.value for m in [*at.markdown, *at.caption])  # the verdict under the headline


def test_missing_store_shows_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "none.sqlite"))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not at.exception
    assert "warmscope simulate" in at.error[0].value


@pytest.mark.parametrize("page", [p.name for p in REGISTRY])
def test_empty_store_says_no_data(tmp_path, monkeypatch, page):
    path = tmp_path / "empty.sqlite"
    EmbeddedStore(path).close()
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    if page != "overview":
        at.switch_page(f"entries/{page}.py").run()
    assert not at.exception
    assert at.info and ("warmscope demo" in at.info[0].value or "No experiment" in at.info[0].value)


@pytest.mark.slow
def test_cli_demo_fills_an_empty_store_once(tmp_path):
    from warmscope.app.cli.main import main as cli_main

    path = tmp_path / "cli.sqlite"
    assert cli_main(["--store", str(path), "demo", "--no-dashboard", "--hours", "0.25"]) == 0
    n = EmbeddedStore(path).counts()["lookups"]
    assert n > 0
    assert cli_main(["--store", str(path), "demo", "--no-dashboard", "--hours", "0.25"]) == 0
    assert EmbeddedStore(path).counts()["lookups"] == n


@pytest.mark.parametrize("page", ["overview", "hitrate", "alerts"])
def test_prometheus_down_is_a_clear_message(tmp_path, monkeypatch, page):
    from tests.conftest import free_port

    monkeypatch.setenv("WARMSCOPE_PROMETHEUS_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("WARMSCOPE_ALERTMANAGER_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "none.sqlite"))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    if page != "overview":
        at.switch_page(f"entries/{page}.py").run()
    assert not at.exception
    assert "is unreachable; start it or set WARMSCOPE_PROMETHEUS_URL" in at.error[0].value


def test_ab_breakdown_by_tenant_and_model(app):
    at = app.run()
    at.switch_page("entries/ab.py").run()
    at.toggle(key="ab-breakdown").set_value(True).run()
    assert not at.exception, at.exception
    assert any("Holm- and BH-adjusted across every tenant" in c.value for c in at.caption)
    # the breakdown's p columns say which decides the colour, as the metric tables do
    from html import escape

    from warmscope.app.dashboard.views.ab import SEGMENT_P_HELP
    segments = [m.value for m in at.markdown if "ws-wrapped" in m.value and "Buckets (ctrl / trt)" in m.value]
    assert len(segments) == 1 and all(f'title="{escape(t)}">' in segments[0] for t in SEGMENT_P_HELP.values())
    at.radio(key="ab-dim").set_value("model").run()
    assert not at.exception, at.exception
    assert any("across every model" in c.value for c in at.caption)


@pytest.mark.slow
def test_alerts_page_history_equals_the_analysis(app, demo_store):
    """The Alerts page's history (computed in the background, shown when done) lists the same episodes, with the
    same fired and resolved times, as ``alert_history`` over the page's range."""
    import time

    from warmscope.analysis.alert_history import alert_history
    from warmscope.app.dashboard.cached import HISTORY_LOOKBACK_S, history_every
    from warmscope.app.dashboard.fmt import when
    from warmscope.app.dashboard.state import range_bounds

    at = app.run()
    at.switch_page("entries/alerts.py").run()
    assert not at.exception
    deadline = time.monotonic() + 300
    while "Alert history" not in [s.value for s in at.subheader] or any("Re-evaluating" in i.value for i in at.info):
        assert time.monotonic() < deadline, "the alert history never appeared"
        time.sleep(1)
        at.run()
    assert not at.exception
    st = EmbeddedStore(demo_store, readonly=True)
    lk = st.frame("lookups")
    b = (min(float(lk.ts.min()), float(st.frame("warmup_runs").started.min())), float(lk.ts.max()))
    start, end = range_bounds("last 6 hours", b)
    fr = {n: st.frame(n, start - HISTORY_LOOKBACK_S, end) for n in
          ("lookups", "requests", "histograms", "warmup_runs", "warmed_keys", "gauges", "writes", "early_keys")}
    fr["hot_keys"] = st.frame("hot_keys", start - HISTORY_LOOKBACK_S, end)  # as the page reads them
    ref = alert_history(fr, start, end, history_every(start, end), HISTORY_LOOKBACK_S)
    shown = wrapped_table(next(m.value for m in at.markdown if "Fired (UTC)" in m.value))
    assert len(ref) >= 1  # the demo's bypass fault fires at least one alert
    assert len(shown) == len(ref)
    assert sorted(zip(shown["Alert"], shown["Fired (UTC)"], strict=True)) == \
        sorted(zip(ref.alert, ref.fired.map(when), strict=True))
    resolved = ["still firing" if r != r else when(r) for r in ref.resolved]
    assert sorted(shown["Resolved (UTC)"]) == sorted(resolved)
    # each episode's onset, the same at any range (the evaluations' spacing is not)
    began = ["–" if t != t else when(t) for t in ref.since]
    assert sorted(shown["Began (UTC)"]) == sorted(began)
    assert all(b <= f for b, f in zip(ref.since.fillna(ref.fired), ref.fired, strict=True))


def test_start_up_warm_up_covers_each_pages_first_view(demo_store, monkeypatch):
    """What the server computes when it starts (``prewarm._warm_steps``, run by
    ``warmscope.app.dashboard.serve``) is what each page's first view asks for: after it, opening
    the pages reads and analyses nothing again. A cache key that differed (another bucket, another
    argument order) would recompute and be counted here."""
    import threading

    import streamlit
    from warmscope import sources
    from warmscope.analysis import alerts, coverage, drilldown, hitrate, latency, scores, traps
    from warmscope.app.dashboard import data, prewarm

    monkeypatch.setenv("WARMSCOPE_STORE", str(demo_store))
    streamlit.cache_data.clear()
    streamlit.cache_resource.clear()
    steps = list(prewarm._warm_steps(data.version()))
    assert len(steps) >= 2 * 14  # the default range's and the 24-hour range's first views
    for fn, args in steps:
        fn(*args)
    calls: list[str] = []

    def count(module, name):
        real = getattr(module, name)

        def counted(*a, **k):
            if not threading.current_thread().name.startswith("warmscope-"):  # not the page-side warm-up
                calls.append(name)
            return real(*a, **k)

        monkeypatch.setattr(module, name, counted)

    for module, name in [(alerts, "evaluate"), (scores, "score_card"), (drilldown, "drill_down"),
                         (drilldown, "change_point"), (hitrate, "hit_table"), (latency, "quantiles_over_time"),
                         (coverage, "warm_set_coverage"), (traps, "detect_all"), (sources.CompositeSource, "frame")]:
        count(module, name)
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    assert not at.exception, at.exception
    for page in [p.name for p in REGISTRY if p.prewarm and not p.default]:  # the prewarm covers
        at.switch_page(f"entries/{page}.py").run()
        assert not at.exception, (page, at.exception)
    assert calls == []


def test_serve_command_carries_the_dashboard_settings_and_lets_options_override_them():
    import sys

    from warmscope.app.dashboard.serve import SETTINGS, command

    cmd = command("--server.port", "8600", "--client.toolbarMode", "minimal")
    assert cmd[:3] == [sys.executable, "-m", "warmscope.app.dashboard.serve"]
    opts = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert opts["--server.port"] == "8600"
    assert opts["--server.fileWatcherType"] == "none" == SETTINGS["server.fileWatcherType"]
    assert opts["--client.toolbarMode"] == "minimal"  # the caller's, given once
    assert cmd.count("--client.toolbarMode") == 1


def test_percentages_read_as_people_write_them():
    from warmscope.app.dashboard.fmt import pct

    assert pct(0.1234) == "12.3%" and pct(0.1234, 2) == "12.34%"
    assert pct(-0.0004) == "0.0%"          # -0.04 % rounds to zero at one digit: no "-0.0%"
    assert pct(-0.0004, 2) == "-0.04%"     # at two digits it does not
    assert pct(-0.0006) == "-0.1%"         # -0.06 % rounds to -0.1 %
    assert pct(float("nan")) == "–" and pct(None) == "–"


def test_token_counts_read_at_their_size():
    from warmscope.app.dashboard.fmt import tokens

    # 80 blocks x 512 tokens = 40,960: it read "0.0 M tokens" on the What if page
    assert tokens(80 * 512) == "41.0 k tokens"
    assert tokens(812) == "812 tokens" and tokens(1_580_000) == "1.58 M tokens"
    assert tokens(999_999) == "1.00 M tokens"  # rounds up into the next unit, not "1e+03 k"
    assert tokens(19_300_000) == "19.3 M tokens" and tokens(-2_500) == "-2.50 k tokens"
    assert tokens(float("nan")) == "–"
    # without the word, for a metric tile whose label names the unit (4,070,000: "4.07 M tokens"
    # was cut to "4.07 M tok…" in a quarter of the What if page)
    assert tokens(4_070_000, unit=False) == "4.07 M" and tokens(812, unit=False) == "812"
    assert tokens(float("nan"), unit=False) == "–"


def test_a_share_that_is_there_never_reads_as_none():
    from warmscope.app.dashboard.fmt import pct

    # Why misses: 2,048 addressable of 51,200,000 missed tokens = 0.004 % (read "0.0%" beside "2,048")
    assert pct(2048 / 51_200_000) == "< 0.1%" and pct(2048 / 51_200_000, 3) == "0.004%"
    assert pct(0.0) == "0.0%" and pct(-0.0004) == "0.0%"


def test_a_security_finding_that_no_longer_holds_stays_red(tmp_path, monkeypatch):
    """A cross-tenant read 01:10-01:40 on a 4-hour store (after an hour to compare its flushes with): at the
    range's end it no longer holds (no open alert names it), and the overview still shows it as a red security
    finding, dated at its first flush."""
    path = tmp_path / "old-leak.sqlite"
    simulated_store(path, SimConfig.load(hours=4.0, rps=3.0, tenants=4, seed=5),
                    [parse_fault("tenant_isolation:layer=response@01:10-01:40")], workers=1)
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    at = AppTest.from_file(MAIN, default_timeout=300).run()
    assert not at.exception, at.exception
    body = "\n".join(m.value for m in at.markdown)
    assert "open alert" in body and "CrossTenantCacheRead" not in body
    red = [e.value for e in at.error]
    assert len(red) == 1 and "CrossTenantCacheRead in this range, no longer holding" in red[0], red
    start = float(EmbeddedStore(path, readonly=True).frame("faults").start.iloc[0])
    assert f"from {time.strftime('%H:%M', time.gmtime(start + 60))}" in red[0], red


def test_ab_page_says_which_adjusted_p_decides(app):
    """Each p column's name carries its help (hover), the p that decides a row's colour is bold (p (Holm), or p
    for a one-arm primary metric) and the BH p grey, and the caption says so: a BH p under 0.05 beside a Holm p
    over it read as a missing colour before."""
    import re
    from html import escape

    from warmscope.analysis.ab_report import HEADERS, P_HELP, p_reading

    at = app.run()
    at.switch_page("entries/ab.py").run()
    assert not at.exception, at.exception
    tables = [m.value for m in at.markdown if "ws-wrapped" in m.value and "p (BH)" in m.value]
    assert len(tables) == 2  # metrics and guardrails
    assert any(p_reading() in c.value for c in at.caption)
    col = {h: HEADERS.index(h) + 1 for h in HEADERS}  # "Outcome" is column 0
    for table in tables:
        for h, tip in P_HELP.items():
            assert re.search(rf'class="col_heading level0 col{col[h]}" title="{re.escape(escape(tip))}">', table)
        props: dict[tuple[int, int], str] = {}
        for sel, body in re.findall(r"([^{}<>]+)\{([^}]*)\}", table.split("</style>")[-2]):
            for rc in re.findall(r"_row(\d+)_col(\d+)", sel):
                props[(int(rc[0]), int(rc[1]))] = props.get((int(rc[0]), int(rc[1])), "") + body
        rows = sorted({r for r, _ in props})
        cell = {(int(r), int(c)): v for r, c, v in re.findall(r'_row(\d+)_col(\d+)" class="data[^"]*" >([^<]*)</td>',
                                                                 table)}
        one_arm = len({cell[(r, col["Arm"])] for r in rows}) == 1
        for r in rows:
            bold = [h for h in ("p", "p (Holm)", "p (BH)") if "font-weight: 700" in props.get((r, col[h]), "")]
            assert bold == (["p"] if cell[(r, col["Metric"])].startswith("★") and one_arm else ["p (Holm)"]), r
            assert "color: #6e7781" in props[(r, col["p (BH)"])]


def test_breakdown_cells_read_in_plain_notation():
    from warmscope.app.dashboard.views.ab import _segment_cell, _segment_diff

    # a GPU-s difference of 4.05e-06 read "+4.05e-06 [...]" before
    assert _segment_diff(4.05e-06, -1.2e-06, 9.3e-06, False) == "+0.0000041 [-0.0000012, +0.0000093]"
    assert _segment_diff(0.0123, 0.0046, 0.0201, True) == "+1.2 pts [+0.5 pts, +2.0 pts]"  # x 100, 1 decimal
    assert _segment_cell(0.000123456, False) == "0.00012" and _segment_cell(0.25, True) == "25.0%"
    assert _segment_diff(float("nan"), 0.0, 0.0, False) == "–"


def drill_picker(at):
    """The hit rate explorer's "Drill into a ..." picker (its key changes with each level)."""
    return next(s for s in at.selectbox if s.label.startswith("Drill into"))
