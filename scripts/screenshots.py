"""Take the documentation site's dashboard screenshots in Chromium, from a demo store.

    python scripts/screenshots.py                        # simulate the demo's day, shoot every page
    python scripts/screenshots.py --store var/warmscope.sqlite   # shoot an existing store
    python scripts/screenshots.py --hours 6 --pages overview,alerts

Every page of the dashboard's registry (``app/dashboard/pages.py: PAGES``) is served by the same
command `warmscope dashboard` runs, opened at its default range in headless Chromium
(``/usr/bin/chromium`` through Playwright), and its first screen is written to
``docs/assets/screenshots/<page>.png`` (palette PNG, to keep the committed files small). Without
``--store`` the store is the demo's world (``warmscope demo``'s traps and pools) simulated into a
temporary folder. ``tests/docs/test_screenshots.py`` runs it on a small store.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "assets" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SIZE = (1280, 900)
# Text a page shows while it computes part of itself in the background (the alert history): the
# screenshot waits until it is gone.
PENDING = ("appears here when it is done",)


def demo_store(path: Path, hours: float = 24.0, **overrides: float) -> Path:
    """The demo's world (``warmscope demo``: three pools, a warm-up run and both traps in the
    last six hours, and the block trace it imports) simulated into ``path``; ``overrides``
    change SimConfig fields (rps, ...)."""
    from warmscope.app.cli.main import demo_world
    from warmscope.app.cli.whatif import import_demo_trace
    from warmscope.simulator import simulate

    cfg, faults = demo_world(hours)
    simulate(dataclasses.replace(cfg, **overrides), path, faults)
    import_demo_trace(path)  # as `warmscope demo` does: the What if page's production hour
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def dashboard(store: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """The dashboard over ``store`` on a free loopback port (served as `warmscope dashboard`
    serves it); yields its URL and stops it afterwards. The store is linked as
    ``var/warmscope.sqlite`` in a scratch folder the server runs in, so the sidebar names the
    demo's default path rather than wherever the store was made."""
    from warmscope.app.dashboard.serve import command

    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="warmscope-shots-"))
    (work / "var").mkdir()
    try:
        os.link(store, work / "var" / "warmscope.sqlite")
    except OSError:  # another file system
        (work / "var" / "warmscope.sqlite").symlink_to(store.resolve())
    env = dict(os.environ, WARMSCOPE_STORE="var/warmscope.sqlite")
    proc = subprocess.Popen(
        command("--server.port", str(port), "--server.address", "127.0.0.1"),
        env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dashboard did not start on {url}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _settle(page) -> None:  # type: ignore[no-untyped-def]
    """Wait until the page's script run has finished and every chart is drawn."""
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=300_000)
    idle = "!document.querySelector('[data-testid=\"stStatusWidget\"]')"
    page.wait_for_function(idle, timeout=300_000)
    page.wait_for_timeout(800)
    page.wait_for_function(idle, timeout=300_000)
    page.wait_for_function(
        "!document.querySelector('[data-testid=\"stSkeleton\"]') && "
        "[...document.querySelectorAll('[data-testid=\"stPlotlyChart\"]')]"
        ".every(c => c.querySelector('.main-svg'))",
        timeout=300_000,
    )


def save_png(png: bytes, path: Path) -> None:
    """Write a screenshot as a 256-colour palette PNG (a third of the size, the same to read)."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def take(store: Path, out: Path = OUT, pages: list[str] | None = None,
         size: tuple[int, int] = SIZE) -> list[Path]:
    """Screenshot each dashboard page (all of them by default) over ``store`` into ``out``."""
    from playwright.sync_api import sync_playwright
    from warmscope.app.dashboard.pages import PAGES

    chosen = [p for p in PAGES if pages is None or p.name in pages]
    unknown = set(pages or ()) - {p.name for p in PAGES}
    if unknown:
        raise SystemExit(f"no such page: {', '.join(sorted(unknown))}; pages: "
                         + ", ".join(p.name for p in PAGES))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with dashboard(store) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for p in chosen:
                page = browser.new_page(viewport={"width": size[0], "height": size[1]})
                page.goto(f"{url}/{p.url_path}", wait_until="networkidle")
                _settle(page)
                page.wait_for_function(
                    "texts => !texts.some(t => document.body.innerText.includes(t))",
                    arg=list(PENDING), timeout=600_000,
                )
                _settle(page)
                if page.locator('[data-testid="stException"]').count():
                    raise RuntimeError(f"the {p.name} page shows an exception")
                path = out / f"{p.name}.png"
                save_png(page.screenshot(), path)
                written.append(path)
                print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
                      file=sys.stderr)
                page.close()
        finally:
            browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, help="an existing store (default: simulate the demo)")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs")
    ap.add_argument("--pages", help="comma-separated page names (default: every page)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 2
    pages = args.pages.split(",") if args.pages else None
    if args.store is not None:
        if not args.store.is_file():
            print(f"no store at {args.store}; run `warmscope demo --no-dashboard` first",
                  file=sys.stderr)
            return 2
        take(args.store, args.out, pages)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"simulating {args.hours:g} h of the demo's world…", file=sys.stderr)
        take(demo_store(Path(tmp) / "demo.sqlite", args.hours), args.out, pages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
