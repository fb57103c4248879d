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
from warmscope.simulator import SimConfig, simulate
from warmscope.simulator.faults import parse_fault

MAIN = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
RANGES = ("last 6 hours", "last 24 hours", "everything", "custom")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if os.environ.get("WARMSCOPE_CONSISTENCY_STORE"):
        return os.environ["WARMSCOPE_CONSISTENCY_STORE"]
    path = tmp_path_factory.mktemp("consistency") / "demo.sqlite"
    simulate(SimConfig.load(hours=2.5, rps=4.0, tenants=4, seed=3), path,
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


@pytest.mark.slow
def test_each_shared_quantity_is_equal_on_every_page_that_shows_it(store, capsys):
    table = []
    for r in RANGES:
        ov, hr, al = (_run(store, n, r) for n in ("overview", "hitrate", "alerts"))
        mo, mh = _metrics(ov), _metrics(hr)
        rows = [
            ("hit rate (weights excluded)",
             {"Overview": mo["Hit rate"], "Hit rate explorer": mh["Hit rate (weights excluded)"]}),
            ("lookups (weights excluded)",
             {"Overview": mo["Lookups"], "Hit rate explorer": mh["Lookups (weights excluded)"]}),
            ("open alerts", {"Overview": _open_alerts_overview(ov), "Alerts (Holding now)": _open_alerts_page(al)}),
        ]
        for q, by_page in rows:
            table.append((q, r, by_page))
    with capsys.disabled():
        print("\nquantity                       | range          | values by page | equal")
        for q, r, by_page in table:
            vals = "; ".join(f"{p} {v}" for p, v in by_page.items())
            print(f"{q:30s} | {r:14s} | {vals} | {len(set(by_page.values())) == 1}")
    for q, r, by_page in table:
        assert None not in by_page.values(), (q, r, by_page)
        assert len(set(by_page.values())) == 1, (q, r, by_page)
    # "everything" holds every lookup of "last 24 hours" (the hourly rollups' first hour is not cut)
    lk = {r: int(by["Overview"].replace(",", "")) for q, r, by in table if q.startswith("lookups")}
    assert lk["everything"] >= lk["last 24 hours"] >= lk["last 6 hours"]
