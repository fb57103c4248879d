"""Shared page furniture: the time range, guards for empty data, formatting."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from warmscope.app import data

RANGES = {"last hour": 3600, "last 6 hours": 6 * 3600, "last 24 hours": 86400, "last 7 days": 7 * 86400,
          "everything": None}


def time_range() -> tuple[float, float]:
    """The sidebar's range, relative to the newest data; stops the page when there is none."""
    try:
        b = data.time_bounds()
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    if b is None:
        st.info("The store has no lookups yet. Run `warmscope demo` (or `warmscope simulate`) for demo data, or "
                "instrument a cache with `collectors.InstrumentedCache` and let it flush.")
        st.stop()
    span = RANGES[st.session_state.get("range", "last 6 hours")]
    start = b[0] - 1 if span is None else max(b[0] - 1, b[1] - span)
    return start, b[1] + 1e-6  # the store's end is exclusive: keep the newest tick


def when(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%Y-%m-%d %H:%M")


HOURLY_ABOVE_S = 86400 + 60  # ranges longer than a day read hourly rollups


def step(start: float | None, end: float | None) -> float | None:
    """The resolution a page reads: per flush up to a day, hourly beyond."""
    if start is None or end is None or end - start <= HOURLY_ABOVE_S:
        return None
    return 3600.0


def resolution_note(start: float, end: float) -> None:
    if step(start, end):
        st.caption("Hourly resolution (range over 24 h): minute-level figures — cold-start time, prediction "
                   "error — need a range of 24 hours or less.")


def load(names, start=None, end=None, fine: bool = False) -> dict:
    """Frames for the range; ``fine=True`` keeps per-flush rows at any range."""
    try:
        return data.frames(names, start, end, None if fine else step(start, end))
    except data.SourceError as e:
        st.error(str(e))
        st.stop()


def light(score: float | None) -> str:
    if score is None:
        return "⚪"
    return "🟢" if score >= 0.8 else ("🟡" if score >= 0.5 else "🔴")
