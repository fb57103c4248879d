"""The cache prewarm: once per store version, a background thread makes the cached calls a first
view of each page with ``prewarm=True`` makes (``_warm_<name>``, checked against ``pages.PAGES`` at
import), for the default and the 24-hour range, each step waiting while a page runs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import streamlit as st
from warmscope.app.dashboard import data
from warmscope.app.dashboard.cached import (
    Version,
    _alerts,
    _card,
    _change_point,
    _coverage,
    _drill,
    _latency,
    _leak,
    _rates,
    _run_detail,
    _traps,
    _warmup_spend,
    latest_warmup,
    start_advice,
    start_history,
)
from warmscope.app.dashboard.charts import EXPLORER_FREQ_S, overview_freq
from warmscope.app.dashboard.pages import PAGES, Page
from warmscope.app.dashboard.state import DEFAULT_RANGE, range_bounds, step
from warmscope.model.registry import require

# Page runs in progress in this server process. The background warm-up below waits while there is
# one: it shares the interpreter (and its lock) with the page runs, and a viewer's page comes first.
_running = [0]


_running_lock = threading.Lock()
# The prewarm steps that failed in this process (by function name): swallowed, and counted here.
failed: list[str] = []


@contextlib.contextmanager
def foreground() -> Iterator[None]:
    """Mark a page run (the app's entry point wraps every run in it)."""
    with _running_lock:
        _running[0] += 1
    try:
        yield
    finally:
        with _running_lock:
            _running[0] -= 1


def _quiet(max_wait_s: float = 30.0) -> None:
    """Until no page is running (at most ``max_wait_s``: a page that waits on the warm-up must not
    stall it)."""
    deadline = time.monotonic() + max_wait_s
    while _running[0] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)


# What a first view of each page (pages.PAGES with prewarm=True) reads, as cached calls (function,
# arguments) for one range; ``fine`` is the range's step (None: per-minute rows).
WarmSteps = Iterator[tuple[Callable[..., object], tuple[object, ...]]]


TTFT_METRIC = "gen_ai.server.time_to_first_token"


def _warm_overview(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    yield _rates, (version, start, end, ("layer",), overview_freq(start, end), (), False, False)
    yield _rates, (version, start, end, (), None, (), True, False)
    yield data.time_marks, (start, end)
    yield _alerts, (version, end)
    yield _card, (version, start, end)
    yield _drill, (version, start, end, None, None, True)
    yield _leak, (version, start, end)
    yield from _warm_latest(version, start, end)


def _warm_latest(version: Version, start: float, end: float) -> WarmSteps:
    """The latest warm-up's detail (the overview's "latest run", the Warm-up runs page's
    default)."""
    latest = latest_warmup(start, end)
    if latest is not None:
        yield _run_detail, (version, start, end, latest)


def _warm_hitrate(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    for by in ((), ("tenant",), ("tenant", "layer")):
        yield _rates, (version, start, end, by, None, (), False, False)
    freq = EXPLORER_FREQ_S if not fine else 3600
    yield _rates, (version, start, end, ("tenant",), freq, (), False, False)


def _warm_latency(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    freq = EXPLORER_FREQ_S if not fine else 3600
    yield _latency, (version, start, end, TTFT_METRIC, (), (0.5, 0.95, 0.99), freq)


def _warm_warmup(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    yield from _warm_latest(version, start, end)
    yield _coverage, (version, start, end)
    yield _warmup_spend, (version, start, end)


def _warm_hotkeys(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    yield data.frames, (["hot_keys"], start - 3600, end, step(start - 3600, end))
    yield _warmup_spend, (version, start, end)


def _warm_rootcause(version: Version, start: float, end: float, fine: float | None) -> WarmSteps:
    yield _rates, (version, start, end, (), max(300, fine or 0), (), False, False)
    _quiet()
    cp = _change_point(version, start, end)
    if cp is not None:  # the default window
        an, base = (cp, end), (max(start, cp - (end - cp)), cp)
        yield _drill, (version, start, end, an, base, False)
        yield _traps, (version, start, end, an, base)


_WARM = {
    "overview": _warm_overview,
    "hitrate": _warm_hitrate,
    "latency": _warm_latency,
    "warmup": _warm_warmup,
    "hotkeys": _warm_hotkeys,
    "rootcause": _warm_rootcause,
}


def check_prewarm(pages: tuple[Page, ...], warm: Mapping[str, object]) -> None:
    """Raise ``RegistryError`` unless the pages with ``prewarm=True`` are those with steps."""
    for p in pages:
        require(
            not p.prewarm or p.name in warm,
            "dashboard page",
            p.name,
            f"prewarm=True needs prewarm._warm_{p.name}, the cached calls of its first view",
        )
        require(
            p.prewarm or p.name not in warm,
            "dashboard page",
            p.name,
            f"has prewarm._warm_{p.name} but prewarm=False",
        )
    known = {p.name for p in pages}
    for name in warm:
        require(
            name in known, "dashboard page", name, "has prewarm steps but is not in pages.PAGES"
        )


check_prewarm(PAGES, _WARM)


def _warm_steps(version: Version) -> WarmSteps:
    """The cached calls a first view of each prewarmed page makes: default range first, then the
    24-hour range."""
    b = data.time_bounds()
    if b is None:
        return
    for name in (DEFAULT_RANGE, "last 24 hours"):
        start, end = range_bounds(name, b)
        fine = step(start, end)
        # the Alerts page's history and the Advisor's tuning (default inputs): each in a child
        # process, one job at a time, so a first view finds them done or under way
        yield start_history, (start, end)
        yield start_advice, (start, end)
        for p in PAGES:
            if p.prewarm:
                yield from _WARM[p.name](version, start, end, fine)


@st.cache_resource(show_spinner=False)
def _prewarmer(version: Version) -> threading.Thread:
    """Once per store version: read the default and the 24-hour range's frames and analysis in the
    background, so the first viewer and a switch to 24 h find them cached. Each step waits until no
    page is running; a step that fails is skipped (its page computes it on a first view)."""

    def work() -> None:
        steps = _warm_steps(version)
        while True:
            try:
                fn, args = next(steps)
            except StopIteration:
                return
            except Exception:  # the steps' own reads failed: the first viewer waits
                return
            _quiet()
            try:
                fn(*args)
            except Exception:  # a warm-up of caches: a failure only means the first viewer waits
                failed.append(getattr(fn, "__name__", str(fn)))

    t = threading.Thread(target=work, name="warmscope-prewarm", daemon=True)
    t.start()
    return t


def prewarm() -> None:
    """Start the background prewarm of this store version (once)."""
    try:
        _prewarmer(data.version())
    except Exception:
        pass
