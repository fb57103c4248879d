"""The `warmscope` command line.

    warmscope demo [--port 8501] [--fresh]   fill the embedded store if empty, open the dashboard
    warmscope dashboard [--port 8501]        open the dashboard on the configured source
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from collectors.config import CollectorConfig, ConfigError

APP_MAIN = Path(__file__).with_name("main.py")


def _progress(label: str):
    """A terminal progress bar; redraws only when the percentage changes."""
    last = [-1]
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct == last[0] or (not tty and done < total):
            return
        last[0] = pct
        width = 30
        filled = width * pct // 100
        end = "\n" if done >= total else ""
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {pct:3d}%", end=end, file=sys.stderr,
              flush=True)
    return show


def _store_path(args: argparse.Namespace) -> Path:
    return Path(args.store) if args.store else CollectorConfig.load().resolved_store_path()


def cmd_dashboard(args: argparse.Namespace) -> int:
    env = dict(os.environ, WARMSCOPE_STORE=str(_store_path(args)))
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.headless", "true",
           "--server.port", str(args.port), "--server.address", args.address,
           "--browser.gatherUsageStats", "false"]
    print(f"warmscope dashboard on http://{args.address}:{args.port}  (store: {env['WARMSCOPE_STORE']})",
          file=sys.stderr)
    return subprocess.call(cmd, env=env)


def cmd_demo(args: argparse.Namespace) -> int:
    from collectors.store import EmbeddedStore

    path = _store_path(args)
    if args.fresh and path.exists():
        for p in path.parent.glob(path.name + "*"):
            p.unlink()
    store = EmbeddedStore(path)
    if store.counts()["lookups"] == 0:
        from app.demo import fill_demo

        print(f"filling {path} with demo data", file=sys.stderr)
        n = fill_demo(str(path), progress=_progress("demo traffic"))
        print(f"wrote {n:,} simulated requests", file=sys.stderr)
    store.close()
    if args.no_dashboard:
        return 0
    return cmd_dashboard(args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="warmscope", description="Cache warm-up observability and A/B analysis")
    ap.add_argument("--store", help="embedded store path (default: $WARMSCOPE_STORE or var/warmscope.sqlite)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, helptext in (("demo", cmd_demo, "fill the embedded store with demo data if empty, open the "
                                "dashboard"), ("dashboard", cmd_dashboard, "open the dashboard")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--port", type=int, default=8501)
        p.add_argument("--address", default="127.0.0.1")
        p.set_defaults(fn=fn)
        if name == "demo":
            p.add_argument("--fresh", action="store_true", help="delete the store first")
            p.add_argument("--no-dashboard", action="store_true", help="only fill the store")
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"warmscope: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
