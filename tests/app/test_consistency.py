"""One number, one meaning, on every page: each quantity shown on more than one page is equal wherever it is shown,
for several ranges (last 6 h, 24 h, everything, a custom window). The pages are rendered with AppTest over a
simulated store (``WARMSCOPE_CONSISTENCY_STORE`` names another, e.g. the 24 h demo store) and the table of
quantity × page × range is printed."""

import os
import re
from datetime import UTC, datetime

import pytest
from streamlit.testing.v1 import AppTest
from warmscope.app.dashboard.pages import page
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig
from warmscope.simulator.faults import parse_fault

from tests.conftest import simulated_store

MAIN = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
RANGES = ("last 6 hours", "last 24 hours", "everything", "custom")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if os.environ.get("WARMSCOPE_CONSISTENCY_STORE"):
        return os.environ["WARMSCOPE_CONSISTENCY_STORE"]
    path = tmp_path_factory.mktemp("consistency") / "demo.sqlite"
    simulated_store(path, SimConfig.load(hours=2.5, rps=4.0, tenants=4, seed=3),
                    [parse_fault("bypass:tenant=globex,layer=response@00:38-01:10"),
                     parse_fault("tenant_isolation:layer=response@01:35-02:20")], workers=1)
    return str(path)


def _run(store, name, range_):
    os.environ["WARMSCOPE_STORE"] = store
    at = AppTest.from_file(MAIN, default_timeout=900)
    at.session_state["range"] = range_
    if range_ == "custom":
        lk = EmbeddedStore(store, readonly=True).frame("lookups")
        t0 = float(lk.ts.min()) + 1800
        at.session_state["custom-win"] = tuple(datetime.fromtimestamp(t, UTC).replace(tzinfo=None)
                                               for t in (t0, t0 + 3600))
    if not page(name).default:
        at.switch_page(page(name).script)
    at.run()
    assert not at.exception, (name, range_, at.exception)
    return at


def _metrics(at):
    return {m.label: m.value for m in at.metric}


def _open_alerts_overview(at):
    text = " ".join(m.value for m in at.markdown)
    m = re.search(r"\*\*(\d+) open alerts?\*\*", text)
    return int(m.group(1)) if m else (0 if "No open alerts" in text else None)


def _open_alerts_page(at):
    m = _metrics(at)
    if not any(k in m for k in ("Critical", "Warning", "Info")):
        return 0 if any("No alert conditions hold" in s.value for s in at.success) else None
    return sum(int(m[k]) for k in ("Critical", "Warning", "Info"))


def _text(at):
    return " ".join(m.value for m in at.markdown)


def _latest_overview(ov):
    """The overview's latest warm-up: (start HH:MM and replica, GPU-s, compute ROI cell, decay text)."""
    m = re.search(r"\*\*Latest warm-up run\*\* (\d\d:\d\d) on (\S+) \(.*?, ([\d,.]+) GPU-s\); compute ROI at "
                  r"T\+[\d.]+ min: \*\*(.*?)\*\*; benefit decay: (.*?)\. See \*Warm-up runs\*", _text(ov))
    return None if m is None else (f"{m.group(1)} {m.group(2)}", m.group(3), m.group(4), m.group(5))


def _latest_warmup_page(wu):
    """The Warm-up runs page's default warm-up (the newest), read from its selector and its ROI and decay lines."""
    try:
        box = wu.selectbox(key="run")
    except KeyError:  # no warm-up in the range: the page says so
        return None
    # "2026-12-03 22:55 · run-1-b00201 · b-0 · embedding+lora · static_topk · trigger replica_restart"
    parts = str(box.format_func(box.value)).split(" · ")
    assert parts[1].startswith("run-"), parts  # the warm-up's run id, findable on the page
    started = parts[0][-5:] + " " + parts[2]
    text = _text(wu)
    roi = re.search(r"\*\*Compute ROI at T\+[\d.]+ min:\*\* (.*?) · cost ([\d,.]+) GPU-s", text)
    decay = re.search(r"\*\*Benefit decay rate k:\*\* (.*)$", text)
    if roi is None or decay is None:
        return None
    return (started, roi.group(2), roi.group(1), decay.group(1).strip())


def _onsets(at):
    """The alert onsets (orange lines) the page's first time series marks."""
    import json

    charts = at.get("plotly_chart")
    if not charts:
        return None
    shapes = json.loads(charts[0].proto.spec).get("layout", {}).get("shapes", [])
    return tuple(sorted(str(s["x0"])[:16] for s in shapes if s.get("line", {}).get("color") == "#b35900"))


def _spend(at):
    m = _metrics(at)
    keys = ("Warm-up GPU-s spent", "Warm-up GPU-s wasted", "Warmed keys never read")
    return tuple(m.get(k) for k in keys)


@pytest.mark.slow
def test_each_shared_quantity_is_equal_on_every_page_that_shows_it(store, capsys):
    table = []
    for r in RANGES:
        ov, hr, al, wu, hk, la = (_run(store, n, r) for n in ("overview", "hitrate", "alerts", "warmup", "hotkeys",
                                                               "latency"))
        mo, mh = _metrics(ov), _metrics(hr)
        ov_run, wu_run = _latest_overview(ov), _latest_warmup_page(wu)
        rows = [
            ("hit rate (weights excluded)",
             {"Overview": mo["Hit rate"], "Hit rate explorer": mh["Hit rate (weights excluded)"]}),
            ("lookups (weights excluded)",
             {"Overview": mo["Lookups"], "Hit rate explorer": mh["Lookups (weights excluded)"]}),
            ("open alerts", {"Overview": _open_alerts_overview(ov), "Alerts (Holding now)": _open_alerts_page(al)}),
            ("alert onsets marked", {"Overview": _onsets(ov), "Latency": _onsets(la), "Warm-up runs": _onsets(wu)}),
            ("warm-up spend, waste, unread", {"Warm-up runs": _spend(wu), "Hot keys": _spend(hk)}),
        ]
        if ov_run is not None or wu_run is not None:
            for i, q in enumerate(("latest warm-up (start, replica)", "latest warm-up GPU-s",
                                   "latest warm-up compute ROI", "latest warm-up decay")):
                rows.append((q, {"Overview": ov_run and ov_run[i], "Warm-up runs": wu_run and wu_run[i]}))
        for q, by_page in rows:
            table.append((q, r, by_page))
    # a page that does not show a quantity in a range (no warm-up run in it: the Warm-up runs page says so and
    # stops) leaves the comparison; hit rate, lookups and open alerts are on every page in every range
    shown = [(q, r, {p: v for p, v in by.items() if v is not None and v != (None,) * 3}) for q, r, by in table]
    with capsys.disabled():
        print("\nquantity                        | range          | values by page | equal")
        for q, r, by_page in shown:
            vals = "; ".join(f"{p} {v}" for p, v in by_page.items()) or "(no page shows it: no warm-up run)"
            print(f"{q:31s} | {r:14s} | {vals} | {len(set(by_page.values())) <= 1}")
    for (q, r, by_page), (_, _, every) in zip(shown, table, strict=True):
        if q in ("hit rate (weights excluded)", "lookups (weights excluded)", "open alerts"):
            assert by_page == every, (q, r, every)
        assert len(set(by_page.values())) <= 1, (q, r, by_page)
    assert sum(len(by) >= 2 for q, r, by in shown if q.startswith("latest warm-up")) >= 4 * 3  # 3 ranges with runs
    # "everything" holds every lookup of "last 24 hours" (the hourly rollups' first hour is not cut)
    lk = {r: int(by["Overview"].replace(",", "")) for q, r, by in table if q.startswith("lookups")}
    assert lk["everything"] >= lk["last 24 hours"] >= lk["last 6 hours"]
