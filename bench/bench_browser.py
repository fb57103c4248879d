"""Dashboard speed in a real browser (Playwright + Chromium), against an empty Streamlit page.

    python -m bench.bench_browser --store var/warmscope.sqlite [--loads 5]

Starts the dashboard the way ``warmscope dashboard`` does
(``python -m warmscope.app.dashboard.serve``: Streamlit with the
dashboard's server settings and a warm-up of the caches at start) over ``--store``, and ``streamlit run`` of a
one-line page as the baseline, on free loopback ports; then measures in fresh browser sessions (medians of
``--loads`` repeats; "cold" is the first visit after the server started, when loaders read the store):

* first paint — navigation start until the page's title is on screen (cold: the server's first visit of the
  page; warm: later visits, taken after ``--settle`` seconds in which the server pre-computes the default and
  the 24-hour views in the background, as it does after its first visit);
* complete ("done") — until the script run has finished and the browser has drawn it: no element placeholder
  left, every chart rendered and the page's main thread idle (a fresh browser session fetches and compiles
  plotly.js for its first chart, which can keep the page busy for seconds after the server is done);
* page switch — from a drawn, idle overview, a click on the page's sidebar link until its title shows (paint)
  and it is complete;
* overview after start — a first visit to a second server ``--warm-up`` seconds after it started (its warm-up
  of the caches has had that long), beside the first visit right after start;
* range switch — on the overview and the hit-rate explorer, picking "last 24 hours" in the sidebar until the
  rerun is complete;
* drill-down — on the hit-rate explorer, a click on a tenant × layer cell until the drilled view is complete.

Targets (the dashboard's): first paint < 2 s on every page, a range switch to 24 h < 3 s; a page switch and a
drill-down are held to the first-paint target. Every time is also printed as a ratio to the empty page's.
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

from warmscope.app.dashboard.pages import PAGES as REGISTRY

ROOT = Path(__file__).resolve().parents[1]
# path in the URL, sidebar link text, page title: every page of app/dashboard/pages.py
PAGES = {p.name: (p.url_path, p.title, p.heading) for p in REGISTRY}
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
IDLE = "!document.querySelector('[data-testid=\"stStatusWidget\"]')"
TITLE = "document.querySelector('[data-testid=\"stMainBlockContainer\"] h1')?.innerText?.trim() === {!r}"
PAINT_TARGET, RANGE_TARGET = 2.0, 3.0
T_OUT = 300_000


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(script: Path | None, store: str) -> tuple[subprocess.Popen, str]:
    """``script`` under ``streamlit run``, or (None) the dashboard as ``warmscope dashboard`` serves it."""
    port = _free_port()
    where = ["--server.port", str(port), "--server.address", "127.0.0.1"]
    if script is None:
        from warmscope.app.dashboard.serve import command

        cmd = command(*where)
    else:
        cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true", *where,
               "--browser.gatherUsageStats", "false"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, WARMSCOPE_STORE=store), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("streamlit did not start")


# Every element drawn: no placeholder left (Streamlit shows a skeleton while an element's code loads — plotly.js,
# the data grid — which a fresh browser session fetches and compiles on first use), every plotly chart rendered.
DRAWN = ("!document.querySelector('[data-testid=\"stSkeleton\"]') && "
         "[...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')].every(c => c.querySelector('.main-svg'))")
# One frame and a task later, in ms: small when the page's main thread is free.
FRAME = ("() => new Promise(r => { const t = performance.now(); "
         "requestAnimationFrame(() => setTimeout(() => r(performance.now() - t), 0)); })")


def _settle(page) -> None:
    """Until the run has finished and is drawn: no running indicator, twice across a short pause (a rerun may
    follow); every chart rendered; then the main thread free (a frame within 50 ms, twice running)."""
    page.wait_for_function(IDLE, timeout=T_OUT)
    page.wait_for_timeout(150)
    page.wait_for_function(IDLE, timeout=T_OUT)
    page.wait_for_function(DRAWN, timeout=T_OUT)
    free = 0
    deadline = time.perf_counter() + T_OUT / 1000
    while free < 2 and time.perf_counter() < deadline:
        free = free + 1 if page.evaluate(FRAME) < 50 else 0


def _open(browser, url: str, title: str | None = None):
    """A fresh session on ``url``: (context, page, first paint s, complete s)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    if title:
        page.wait_for_function(TITLE.format(title), timeout=T_OUT)
    else:
        page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=T_OUT)
    paint = time.perf_counter() - t0
    _settle(page)
    return ctx, page, paint, time.perf_counter() - t0 - 0.15  # less the settle pause


def _visit(browser, url: str, title: str | None = None) -> tuple[float, float]:
    ctx, _, paint, done = _open(browser, url, title)
    ctx.close()
    return paint, done


def _page_switch(browser, base: str, link: str, title: str) -> tuple[float, float]:
    ctx, page, _, _ = _open(browser, base, PAGES["overview"][2])  # drawn and idle
    page.wait_for_timeout(300)
    t0 = time.perf_counter()
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=link).first.click()
    page.wait_for_function(TITLE.format(title), timeout=T_OUT)
    paint = time.perf_counter() - t0
    _settle(page)
    done = time.perf_counter() - t0 - 0.15
    ctx.close()
    return paint, done


def _range_switch(browser, url: str, title: str, to: str = "last 24 hours") -> float:
    ctx, page, _, _ = _open(browser, url, title)
    page.wait_for_timeout(300)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    t0 = time.perf_counter()
    page.get_by_role("option", name=to).click()
    page.wait_for_function("!!document.querySelector('[data-testid=\"stStatusWidget\"]') || "
                           f"location.search.includes({'range=' + to.replace(' ', '+')!r})", timeout=10_000)
    _settle(page)
    took = time.perf_counter() - t0 - 0.15
    ctx.close()
    return took


def _drill(browser, base: str) -> float:
    ctx, page, _, _ = _open(browser, f"{base}/hitrate", PAGES["hitrate"][2])
    heat = page.locator('[data-testid="stPlotlyChart"]').nth(1)
    heat.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    b = heat.locator(".scatterlayer .points path").first.bounding_box()
    x, y = b["x"] + b["width"] / 2, b["y"] + b["height"] / 2
    page.mouse.move(x, y)  # plotly hit-tests the hovered point
    page.wait_for_timeout(300)
    t0 = time.perf_counter()
    page.mouse.click(x, y)
    page.wait_for_function("location.search.includes('drill=')", timeout=T_OUT)
    _settle(page)
    took = time.perf_counter() - t0 - 0.15
    ctx.close()
    return took


def _ok(v: float, target: float) -> str:
    return "ok" if v < target else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="embedded store to serve (e.g. one `warmscope demo` filled)")
    ap.add_argument("--loads", type=int, default=5, help="repeats per measurement, median taken (default 5)")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium binary (default /usr/bin/chromium)")
    ap.add_argument("--warm-up", type=float, default=30.0,
                    help="seconds after a server's start before the 'overview after start' visit (default 30)")
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds to wait after the server's first visit, while it pre-computes the default and "
                         "24-hour views in the background, before the warm figures (default 60)")
    args = ap.parse_args()
    import signal

    from playwright.sync_api import sync_playwright

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers below on a kill too
    empty = Path(tempfile.mkdtemp()) / "empty.py"
    empty.write_text("import streamlit as st\nst.title('empty')\n")
    procs = []
    n = max(args.loads, 1)
    med = statistics.median
    try:
        p_empty, u_empty = _serve(empty, args.store)
        procs.append(p_empty)
        # the dashboard as `warmscope dashboard` serves it
        # (plain `streamlit run` for a tree without app/dashboard/serve.py)
        dash = ROOT / "app" / "dashboard"
        app_script = None if (dash / "serve.py").exists() else dash / "main.py"
        p_app, u_app = _serve(app_script, args.store)
        procs.append(p_app)
        started = time.perf_counter()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            _visit(browser, u_empty)  # the empty page's own first visit
            base = [_visit(browser, u_empty) for _ in range(n)]
            bp, bd = med(x[0] for x in base), med(x[1] for x in base)
            print(f"store {args.store}; medians of {n}; times in s, x = ratio to the empty page's time; "
                  f"load average {os.getloadavg()[0]:.1f} at the start on {os.cpu_count()} cores; warm figures "
                  f"after a {args.settle:g} s settle; dashboard served by "
                  f"{'streamlit run app/dashboard/main.py' if app_script else 'warmscope.app.dashboard.serve'}")
            print(f"\nfirst visit (target: paint < {PAINT_TARGET:g} s)")
            print(f"{'page':12s} {'cold paint':>10s} {'cold done':>10s} {'paint':>7s} {'done':>7s} {'x paint':>8s} "
                  f"{'x done':>7s}  target")
            print(f"{'(empty)':12s} {'':>10s} {'':>10s} {bp:7.2f} {bd:7.2f} {1:8.1f} {1:7.1f}")
            cold_at = time.perf_counter() - started
            for name, (path, _, title) in PAGES.items():
                cold = _visit(browser, f"{u_app}/{path}", title)
                if name == "overview":
                    first = cold
                if name == "overview" and args.settle > 0:
                    time.sleep(args.settle)  # the server's background pre-computation after its first visit
                warm = [_visit(browser, f"{u_app}/{path}", title) for _ in range(n)]
                wp, wd = med(x[0] for x in warm), med(x[1] for x in warm)
                print(f"{name:12s} {cold[0]:10.2f} {cold[1]:10.2f} {wp:7.2f} {wd:7.2f} {wp / bp:8.1f} "
                      f"{wd / bd:7.1f}  {_ok(max(cold[0], wp), PAINT_TARGET)}", flush=True)
            print(f"\npage switch from the overview (sidebar link; target: paint < {PAINT_TARGET:g} s)")
            print(f"{'page':12s} {'paint':>7s} {'done':>7s} {'x paint':>8s} {'x done':>7s}  target")
            for name, (_, link, title) in PAGES.items():
                if name == "overview":
                    continue
                sw = [_page_switch(browser, u_app, link, title) for _ in range(n)]
                sp, sd = med(x[0] for x in sw), med(x[1] for x in sw)
                print(f"{name:12s} {sp:7.2f} {sd:7.2f} {sp / bp:8.1f} {sd / bd:7.1f}  {_ok(sp, PAINT_TARGET)}",
                      flush=True)
            print(f"\ninteractions until the rerun has finished (range switch target < {RANGE_TARGET:g} s; "
                  f"drill-down < {PAINT_TARGET:g} s)")
            print(f"{'interaction':28s} {'cold':>7s} {'warm':>7s} {'x warm':>7s}  target")
            for name in ("overview", "hitrate"):
                path, _, title = PAGES[name]
                cold = _range_switch(browser, f"{u_app}/{path}", title)
                warm = med(_range_switch(browser, f"{u_app}/{path}", title) for _ in range(n))
                print(f"{'range -> 24 h, ' + name:28s} {cold:7.2f} {warm:7.2f} {warm / bd:7.1f}  "
                      f"{_ok(max(cold, warm), RANGE_TARGET)}", flush=True)
            dr = [_drill(browser, u_app) for _ in range(n)]
            print(f"{'drill-down (heatmap click)':28s} {dr[0]:7.2f} {med(dr[1:] or dr):7.2f} "
                  f"{med(dr[1:] or dr) / bd:7.1f}  {_ok(med(dr), PAINT_TARGET)}")
            # A second server, left alone for --warm-up seconds, then its first visit.
            p_new, u_new = _serve(app_script, args.store)
            procs.append(p_new)
            time.sleep(args.warm_up)
            load = os.getloadavg()[0]
            after = _visit(browser, u_new, PAGES["overview"][2])
            print(f"\noverview, the server's first visit: {cold_at:.0f} s after start paint {first[0]:.2f} done "
                  f"{first[1]:.2f}; {args.warm_up:g} s after start paint {after[0]:.2f} done {after[1]:.2f} "
                  f"(load {load:.1f}); load average at the end {os.getloadavg()[0]:.1f}")
            browser.close()
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(10)


if __name__ == "__main__":
    main()
