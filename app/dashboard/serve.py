"""Serve the dashboard: ``python -m warmscope.app.dashboard.serve [STREAMLIT OPTIONS...]`` (what
``warmscope dashboard`` and ``warmscope demo`` run).

Streamlit runs the app's script only when a viewer opens a page, so the first viewer of a freshly
started dashboard would wait while the default range is read and analysed (about 14 s for the demo's
day). This entry point starts Streamlit with the dashboard's server settings and, as soon as its
runtime exists, loads what the pages import and fills the shared caches for the default and the
24-hour range in a background thread — the same warm-up a first visit starts after it has drawn its
page. A viewer arriving meanwhile sees the page title and sidebar at once; each figure still being
computed is waited for (not computed twice), and the page fills in when it is there.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

APP_MAIN = Path(__file__).with_name("main.py")

# Server settings for a deployed dashboard (any of them can be overridden by passing the option
# again):
# * no file watcher — it re-scans every loaded module after each session's first run and reloads
#   pages on edits, which only matters while developing the dashboard itself;
# * no usage statistics, no browser window, the viewer's toolbar (no "rerun"/"clear cache" menu).
SETTINGS = {
    "server.headless": "true",
    "server.fileWatcherType": "none",
    "server.runOnSave": "false",
    "browser.gatherUsageStats": "false",
    "client.toolbarMode": "viewer",
}


def command(*options: str) -> list[str]:
    """The command line serving the dashboard with ``options`` (``--server.port``, ...) added to
    SETTINGS."""
    given = {o.split("=", 1)[0] for o in options if o.startswith("--")}
    base = [x for k, v in SETTINGS.items() if f"--{k}" not in given for x in (f"--{k}", v)]
    return [sys.executable, "-m", "warmscope.app.dashboard.serve", *base, *options]


def warm_up(wait_s: float = 60.0) -> None:
    """Once Streamlit's runtime exists (its caches are the ones pages read): fill the caches
    (:func:`warmscope.app.dashboard.prewarm.prewarm`), then import the pages' modules. Never raises:
    a failure only means the first viewer computes what it needs itself."""
    import importlib

    try:
        from streamlit.runtime import Runtime

        deadline = time.monotonic() + wait_s
        while not Runtime.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        from warmscope.app.dashboard import data, prewarm
        from warmscope.app.dashboard.pages import page_imports

        if data.config_problem():  # every page shows the problem; nothing to warm
            return
        prewarm.prewarm()
        for name in page_imports():
            importlib.import_module(name)
    except Exception:
        pass


PARENT_ENV = "WARMSCOPE_DASHBOARD_PARENT"  # set by `warmscope dashboard`: its process id
STOP_GRACE_S = 3.0  # from Streamlit's stop (a SIGTERM) to the process's end, at most


def die_with_parent() -> int | None:
    """When started by `warmscope dashboard` (``PARENT_ENV``): end with it, even when it is
    killed with SIGKILL (as ``subprocess.run(timeout=...)`` does), instead of listening on as an
    orphan. On Linux the kernel sends SIGKILL at the parent's death (``PR_SET_PDEATHSIG``); the
    watchdog of :func:`watch` covers the rest. Returns the parent's process id, or None."""
    try:
        parent = int(os.environ.get(PARENT_ENV, ""))
    except ValueError:
        return None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except Exception:
            pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)
    return parent


def watch(parent: int | None) -> None:
    """A daemon thread's loop: end the process when its parent is gone, or when Streamlit was
    asked to stop (SIGTERM, Ctrl-C) and has not ended ``STOP_GRACE_S`` later (a page still
    computing, output that cannot be written: the main thread then never gets to exit)."""
    stopping_since: float | None = None
    while True:
        time.sleep(0.25)
        if parent is not None and os.getppid() != parent:
            os._exit(0)
        try:
            from streamlit.runtime import Runtime, RuntimeState

            stopping = Runtime.exists() and Runtime.instance().state in (
                RuntimeState.STOPPING,
                RuntimeState.STOPPED,
            )
        except Exception:
            stopping = False
        if stopping and stopping_since is None:
            stopping_since = time.monotonic()
        if stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_S:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parent = die_with_parent()
    threading.Thread(target=watch, args=(parent,), name="warmscope-watchdog", daemon=True).start()
    threading.Thread(target=warm_up, name="warmscope-startup-warm-up", daemon=True).start()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP_MAIN), *(sys.argv[1:] if argv is None else argv)]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
