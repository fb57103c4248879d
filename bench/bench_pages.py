"""Dashboard page render times on simulated data, against an empty page.

    python -m bench.bench_pages [--store var/warmscope.sqlite] [--hours 24] [--range "last 6 hours"]

Without --store, simulates ``--hours`` into a temporary store first. Each page is rendered with Streamlit's
AppTest, in two passes over every page:

* cold — caches empty, no prewarm: the first render reads and analyses the store (pages later in the list
  reuse what earlier ones cached, as in one server);
* first view — caches emptied again, then the server's start-up prewarm (``prewarm._warm_steps``: the
  cached calls of each page's first view for the default and the 24-hour range, and the alert history's and
  the Advisor's child processes started) run to its end, as a server does in the background after it starts;
  then each page's first view, and the median of three repeats.

Every time is also printed as a ratio to an empty Streamlit page's. Targets: a first view within 5 s and a
repeat within 1.5 s on two idle cores (the ratios carry over to a loaded machine; the seconds do not). The
machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest
from warmscope.app.dashboard.pages import PAGES as REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PAGES = [p.name for p in REGISTRY]  # every page of app/dashboard/pages.py
TITLES = {p.name: p.heading for p in REGISTRY}


def render(page: str, range_: str) -> float:
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "main.py"), default_timeout=600)
    at.session_state["range"] = range_
    if page != "overview":
        at.switch_page(f"entries/{page}.py")  # the first run renders this page only
    t = time.perf_counter()
    at.run()
    took = time.perf_counter() - t
    assert at.title and at.title[0].value == TITLES[page], (page, [x.value for x in at.title])
    assert not at.exception, (page, at.exception)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--range", default="last 6 hours", help="sidebar time range (default: the dashboard's)")
    args = ap.parse_args()
    if args.store:
        store = args.store
    else:
        from warmscope.simulator import SimConfig, simulate

        store = str(Path(tempfile.mkdtemp()) / "bench.sqlite")
        simulate(SimConfig.load(hours=args.hours), store)
    os.environ["WARMSCOPE_STORE"] = store
    empty = Path(tempfile.mkdtemp()) / "empty.py"
    empty.write_text("import streamlit as st\nst.title('empty')\n")
    base = statistics.median(_time_empty(empty) for _ in range(3))
    print(f"store {store}, range {args.range!r}, load average {os.getloadavg()[0]:.1f}")
    import streamlit as st

    cold = {}
    for p in PAGES:
        cold[p] = render(p, args.range)
    st.cache_data.clear()
    st.cache_resource.clear()
    t = time.perf_counter()
    _prewarm()
    warmed = time.perf_counter() - t
    print(f"prewarm (the server's start-up steps, in the background there): {warmed:.1f} s")
    print(f"{'page':10s} {'cold s':>8s} {'x empty':>8s} {'first s':>8s} {'x empty':>8s} {'repeat s':>9s} "
          f"{'x empty':>8s}")
    print(f"{'(empty)':10s} {base:8.3f} {1:8.1f} {base:8.3f} {1:8.1f} {base:9.3f} {1:8.1f}")
    for p in PAGES:
        first = render(p, args.range)
        again = statistics.median(render(p, args.range) for _ in range(3))
        print(f"{p:10s} {cold[p]:8.2f} {cold[p] / base:8.1f} {first:8.2f} {first / base:8.1f} {again:9.2f} "
              f"{again / base:8.1f}")
    print(f"load average {os.getloadavg()[0]:.1f}")


def _prewarm() -> None:
    """The server's start-up prewarm, run here to its end (the server runs it in a background thread)."""
    from warmscope.app.dashboard import data, prewarm

    for fn, args in prewarm._warm_steps(data.version()):
        fn(*args)


def _time_empty(path: Path) -> float:
    t = time.perf_counter()
    AppTest.from_file(str(path)).run()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
