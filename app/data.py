"""Cached loaders over the active source: the only place pages get data from.

The source is the embedded store named by ``WARMSCOPE_STORE`` (default
``var/warmscope.sqlite``). Loaders take the time range chosen in the sidebar
and return canonical frames, or raise :class:`SourceError` with a message a
page can show as is. Results are cached for ``TTL`` seconds (short in live mode).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from collectors.config import CollectorConfig
from collectors.store import EmbeddedStore, StoreError

__all__ = ["SourceError", "store_path", "source_label", "frame", "frames", "units", "time_bounds", "experiments",
           "TTL"]

TTL = 30


class SourceError(RuntimeError):
    pass


def store_path() -> str:
    return os.environ.get("WARMSCOPE_STORE") or str(CollectorConfig.load().resolved_store_path())


def source_label() -> str:
    return f"embedded store · {store_path()}"


def _store(path: str) -> EmbeddedStore:
    try:
        return EmbeddedStore(path, readonly=True)
    except StoreError as e:
        raise SourceError(str(e)) from None


@st.cache_data(ttl=TTL, show_spinner=False)
def _frame(path: str, name: str, start: float | None, end: float | None, mtime: float) -> pd.DataFrame:
    try:
        return _store(path).frame(name, start, end)
    except StoreError as e:
        raise SourceError(str(e)) from None


def _mtime(path: str) -> float:
    # Part of the cache key: a store that changed (live simulator) is re-read.
    p = Path(path)
    wal = p.with_name(p.name + "-wal")
    return max((x.stat().st_mtime for x in (p, wal) if x.exists()), default=0.0)


def frame(name: str, start: float | None = None, end: float | None = None) -> pd.DataFrame:
    path = store_path()
    return _frame(path, name, start, end, _mtime(path))


def frames(names, start: float | None = None, end: float | None = None) -> dict[str, pd.DataFrame]:
    return {n: frame(n, start, end) for n in names}


@st.cache_data(ttl=TTL, show_spinner=False)
def _units(path: str, experiment: str, mtime: float) -> pd.DataFrame:
    try:
        return _store(path).units(experiment)
    except StoreError as e:
        raise SourceError(str(e)) from None


def units(experiment: str) -> pd.DataFrame:
    path = store_path()
    return _units(path, experiment, _mtime(path))


@st.cache_data(ttl=TTL, show_spinner=False)
def _bounds(path: str, mtime: float) -> tuple[float, float] | None:
    con = _store(path)._con()
    row = con.execute("SELECT min(ts), max(ts) FROM lookups").fetchone()
    return None if row is None or row[0] is None else (float(row[0]), float(row[1]))


def time_bounds() -> tuple[float, float] | None:
    """(first, last) lookup timestamp in the store, or None when it is empty."""
    path = store_path()
    return _bounds(path, _mtime(path))


@st.cache_data(ttl=TTL, show_spinner=False)
def _experiments(path: str, mtime: float) -> list[str]:
    con = _store(path)._con()
    return [r[0] for r in con.execute("SELECT DISTINCT experiment FROM ab_units WHERE experiment != ''")]


def experiments() -> list[str]:
    path = store_path()
    return _experiments(path, _mtime(path))
