"""Dashboard page render times on simulated data, against an empty page.

    python -m bench.bench_pages [--store var/warmscope.sqlite] [--hours 24] [--range "last 6 hours"]

Without --store, simulates ``--hours`` into a temporary store first. Each page
is rendered with Streamlit's AppTest: once cold (loaders read the store) and
three more times warm (loaders cached); prints the cold time and the warm
median against an empty Streamlit page. Target: median < 2 s.
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
    print(f"store {store}, range {args.range!r}")
    print(f"{'page':10s} {'cold s':>8s} {'warm median s':>14s} {'x empty':>8s}")
    print(f"{'(empty)':10s} {base:8.3f} {base:14.3f} {1:8.1f}")
    for p in PAGES:
        cold = render(p, args.range)
        warm = statistics.median(render(p, args.range) for _ in range(3))
        print(f"{p:10s} {cold:8.2f} {warm:14.2f} {warm / base:8.1f}")


def _time_empty(path: Path) -> float:
    t = time.perf_counter()
    AppTest.from_file(str(path)).run()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
