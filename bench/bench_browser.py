"""Dashboard speed in a real browser (Playwright + Chromium), against an empty Streamlit page.

    python -m bench.bench_browser --store /tmp/demo.sqlite [--loads 5]

Starts `streamlit run` on free loopback ports (the dashboard over ``--store``, and a one-line page as the
baseline), then for every page measures in fresh browser sessions:

* first paint — navigation start until the page's title is on screen;
* complete — until the script run has finished (every chart and table drawn);

once cold (first visit after the server started: loaders read the store) and the median of ``--loads`` warm
visits (loaders cached). Then on the overview it switches the sidebar range to "last 24 hours" and times the
rerun until complete (cold: first switch; warm: median of repeats). Targets: first paint < 2 s, a range
switch to 24 h < 3 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"overview": "", "hitrate": "hitrate", "warmup": "warmup", "hotkeys": "hotkeys", "rootcause": "rootcause",
         "ab": "ab", "alerts": "alerts"}
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
IDLE = "!document.querySelector('[data-testid=\"stStatusWidget\"]')"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(script: Path, store: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"], env=dict(os.environ, WARMSCOPE_STORE=store),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("streamlit did not start")


def _visit(browser, url: str) -> tuple[float, float]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=300_000)
    paint = time.perf_counter() - t0
    page.wait_for_timeout(100)
    page.wait_for_function(IDLE, timeout=300_000)
    done = time.perf_counter() - t0
    ctx.close()
    return paint, done


def _switch(browser, url: str, to: str = "last 24 hours") -> float:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.goto(url, wait_until="commit")
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=300_000)
    page.wait_for_timeout(100)
    page.wait_for_function(IDLE, timeout=300_000)
    page.wait_for_timeout(500)
    sel = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first
    sel.click()
    t0 = time.perf_counter()
    page.get_by_role("option", name=to).click()
    page.wait_for_function("!!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=10_000)
    page.wait_for_function(IDLE, timeout=300_000)
    took = time.perf_counter() - t0
    ctx.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="embedded store to serve (e.g. one `warmscope demo` filled)")
    ap.add_argument("--loads", type=int, default=5, help="warm visits per page (default 5)")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium binary (default /usr/bin/chromium)")
    args = ap.parse_args()
    import signal

    from playwright.sync_api import sync_playwright

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers below on a kill too
    empty = Path(tempfile.mkdtemp()) / "empty.py"
    empty.write_text("import streamlit as st\nst.title('empty')\n")
    procs = []
    try:
        p_empty, u_empty = _serve(empty, args.store)
        procs.append(p_empty)
        p_app, u_app = _serve(ROOT / "app" / "main.py", args.store)
        procs.append(p_app)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            _visit(browser, u_empty)  # the empty page's own first visit
            base = [_visit(browser, u_empty) for _ in range(args.loads)]
            bp, bd = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
            print(f"store {args.store}; {args.loads} warm loads per page; times in s (x = ratio to the empty page)")
            print(f"{'page':16s} {'cold paint':>10s} {'cold done':>10s} {'paint':>7s} {'done':>7s} {'x paint':>8s} "
                  f"{'x done':>7s}")
            print(f"{'(empty page)':16s} {'':>10s} {'':>10s} {bp:7.2f} {bd:7.2f} {1:8.1f} {1:7.1f}")
            for name, path in PAGES.items():
                cold = _visit(browser, f"{u_app}/{path}")
                warm = [_visit(browser, f"{u_app}/{path}") for _ in range(args.loads)]
                wp, wd = statistics.median(x[0] for x in warm), statistics.median(x[1] for x in warm)
                print(f"{name:16s} {cold[0]:10.2f} {cold[1]:10.2f} {wp:7.2f} {wd:7.2f} {wp / bp:8.1f} "
                      f"{wd / bd:7.1f}", flush=True)
            cold = _switch(browser, u_app)
            warm = [_switch(browser, u_app) for _ in range(max(args.loads // 2, 2))]
            wm = statistics.median(warm)
            print(f"{'range -> 24 h':16s} {'':>10s} {cold:10.2f} {'':>7s} {wm:7.2f} {'':>8s} {wm / bd:7.1f}")
            browser.close()
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(10)


if __name__ == "__main__":
    main()
