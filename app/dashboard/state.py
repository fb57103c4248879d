"""View state every page shares: the sidebar's time range (relative or absolute) and the rest
of a page's view kept in the URL, state deferred to the next run (drag-to-zoom), and the range's
resolution and frames (``load``, which shows a source error as one message)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pandas as pd
import streamlit as st
from warmscope.app.dashboard import data

RANGES = {
    "last hour": 3600,
    "last 6 hours": 6 * 3600,
    "last 24 hours": 86400,
    "last 7 days": 7 * 86400,
    "everything": None,
    "since the last warm-up run": -1,
    "custom": -2,
}
DEFAULT_RANGE = "last 6 hours"
# Timestamps are float seconds, so pandas gives them sub-microsecond digits that plotly
# (microseconds) drops with a warning per chart in the server's log; a chart cannot show that
# difference.
warnings.filterwarnings(
    "ignore", message="Discarding nonzero nanoseconds in conversion", category=UserWarning
)
# Query-parameter names shared by every page: a link reproduces the view.
URL_KEYS = ("range", "from", "to")


def url_get(key: str, default: str | None = None) -> str | None:
    v = st.query_params.get(key)
    return v if v not in (None, "") else default


def url_set(**kw: object) -> None:
    """Write view state to the URL; ``None`` removes a key."""
    for k, v in kw.items():
        if v is None or v == "":
            if k in st.query_params:
                del st.query_params[k]
        elif st.query_params.get(k) != str(v):
            st.query_params[k] = str(v)


def init_from_url(
    key: str,
    param: str | None = None,
    cast: Callable[[str], object] = str,
    default: object = None,
) -> object:
    """Seed a widget's session state from the URL on the first run of a session (widget keys survive
    reruns)."""
    param = param or key
    seeded = st.session_state.setdefault("_url_seeded", set())
    if key not in seeded:
        seeded.add(key)
        v = url_get(param)
        if v is not None:
            try:
                st.session_state[key] = cast(v)
            except (TypeError, ValueError):
                pass
    return st.session_state.get(key, default)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M")


def _parse_iso(s: str) -> float:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC).timestamp()


def sidebar_range() -> None:
    """The sidebar's range picker (called once per run by the app's entry point)."""
    init_from_url("range", cast=lambda v: v if v in RANGES else DEFAULT_RANGE)
    if st.session_state.get("range") not in RANGES:
        st.session_state["range"] = DEFAULT_RANGE
    st.selectbox(
        "Time range",
        list(RANGES),
        key="range",
        help=(
            "Relative ranges end at the newest data. 'custom' picks absolute times; dragging a box "
            "on the overview's hit-rate chart zooms to that span."
        ),
    )
    if st.session_state["range"] != "custom":
        url_set(range=st.session_state["range"], **{"from": None, "to": None})
    else:
        url_set(range="custom")
        try:
            b = data.time_bounds()
        except data.SourceError:
            b = None
        if b is None:
            return
        lo, hi = _minute(b[0]), _minute(b[1]) + 60
        if "custom-win" not in st.session_state:
            try:
                f, t = _parse_iso(url_get("from") or ""), _parse_iso(url_get("to") or "")
            except ValueError:
                f, t = hi - 6 * 3600, hi
            st.session_state["custom-win"] = (_dt(max(lo, min(f, hi))), _dt(max(lo, min(t, hi))))
        st.slider(
            "From – to (UTC)",
            min_value=_dt(lo),
            max_value=_dt(hi),
            step=pd.Timedelta(minutes=5).to_pytimedelta(),
            format="MM-DD HH:mm",
            key="custom-win",
        )


def _minute(ts: float) -> float:
    return math.floor(ts / 60) * 60


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def _ts(d: datetime) -> float:
    return d.replace(tzinfo=UTC).timestamp()


def defer(**state: object) -> None:
    """Set widget state on the next run, before the widgets exist (Streamlit refuses it after)."""
    st.session_state.setdefault("_deferred", {}).update(state)


def apply_deferred() -> None:
    """Called first thing in every run."""
    for k, v in st.session_state.pop("_deferred", {}).items():
        st.session_state[k] = v


def zoom_to(start: float, end: float) -> None:
    """Switch the range to an absolute window on the next run (drag-to-zoom)."""
    defer(**{"range": "custom", "custom-win": (_dt(_minute(start)), _dt(_minute(end) + 60))})


def time_range() -> tuple[float, float]:
    """The sidebar's range; relative ranges end at the newest data. Stops the page when there is
    none."""
    try:
        b = data.time_bounds()
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    if b is None:
        st.info(
            "The store has no lookups yet. Run `warmscope demo` (or `warmscope simulate`) for demo "
            "data, or instrument a cache with `collectors.InstrumentedCache` and let it flush."
        )
        st.stop()
    name = st.session_state.get("range", DEFAULT_RANGE)
    span = RANGES.get(name, RANGES[DEFAULT_RANGE])
    start, end = range_bounds(name, b, st.session_state.get("custom-win"))
    url_set(
        range=name,
        **({"from": _iso(start), "to": _iso(end)} if span == -2 else {"from": None, "to": None}),
    )
    return start, end


def range_or_whole_trace() -> tuple[float | None, float | None]:
    """:func:`time_range`, or (None, None) for a store with no lookups: the pages that read the
    block trace (What if, the Advisor's judgement of warm-up strategies) then read all of it; a
    store that holds only an imported trace has no other data to set a range by."""
    try:
        b = data.time_bounds()
    except data.SourceError:
        b = None
    if b is None:
        st.caption("The whole block trace (the store has no other data to set a range by).")
        return None, None
    return time_range()


def range_bounds(
    name: str, b: tuple[float, float], custom: tuple[datetime, datetime] | None = None
) -> tuple[float, float]:
    """[start, end) of a named range over data spanning ``b`` (the same floats everywhere: cache
    keys)."""
    span = RANGES.get(name, RANGES[DEFAULT_RANGE])
    end = b[1] + 1e-6  # the store's end is exclusive: keep the newest tick
    if span == -2 and custom:
        f, t = (_ts(x) for x in custom)
        return max(b[0] - 1, f), min(end, max(t, f + 60))
    if span == -1:
        last = data.last_run_start()
        return (b[0] - 1 if last is None else max(b[0] - 1, last - 60)), end
    if span is None:  # no data before b[0]: from its hour on, so hourly rollups hold all of it
        return math.floor((b[0] - 1) / 3600) * 3600, end
    return (b[0] - 1 if span < 0 else max(b[0] - 1, b[1] - span)), end


HOURLY_ABOVE_S = 86400 + 60  # ranges longer than a day read hourly rollups


def step(start: float | None, end: float | None) -> float | None:
    """The resolution a page reads: per flush up to a day, hourly beyond."""
    if start is None or end is None or end - start <= HOURLY_ABOVE_S:
        return None
    return 3600.0


def resolution_note(start: float, end: float) -> None:
    if step(start, end):
        st.caption(
            "Hourly resolution (range over 24 h): minute-level figures — cold-start time, "
            "prediction error — need a range of 24 hours or less."
        )


def load(
    names: Iterable[str],
    start: float | None = None,
    end: float | None = None,
    fine: bool = False,
) -> dict[str, pd.DataFrame]:
    """Frames for the range; ``fine=True`` keeps per-flush rows at any range."""
    try:
        return data.frames(names, start, end, None if fine else step(start, end))
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
