"""Cached loaders over the active sources: the only place pages get data from.

* ``WARMSCOPE_PROMETHEUS_URL`` set: lookups and requests come from Prometheus;
* ``WARMSCOPE_REDIS_URL`` set: hot keys, A/B units and warm-up runs come from Redis;
* everything else from the embedded store named by ``WARMSCOPE_STORE``
  (default ``var/warmscope.sqlite``) — the only source when neither is set.

Loaders take the time range chosen in the sidebar and return canonical
frames, or raise :class:`SourceError` with a message a page can show as is.
Results are cached for ``TTL`` seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.store import EmbeddedStore, StoreError

__all__ = ["SourceError", "store_path", "source_label", "frame", "frames", "ab_report", "time_bounds",
           "last_run_start", "annotations", "experiment_list",
           "experiments", "TTL"]

TTL = 30
STORE_TTL = 3600


class SourceError(RuntimeError):
    pass


def store_path() -> str:
    if os.environ.get("WARMSCOPE_STORE"):
        return os.environ["WARMSCOPE_STORE"]
    try:
        return str(CollectorConfig.load().resolved_store_path())
    except ValueError:  # a bad [collectors] section: config_problem() tells the page
        return str(CollectorConfig().resolved_store_path())


def config_problem() -> str | None:
    """The first configuration problem that would break every page, as one
    message to show with ``st.error`` (None when all is well)."""
    try:
        CollectorConfig.load()
    except ValueError as e:
        return f"Configuration error: {e}"
    try:
        from warmscope.analysis.config import AnalysisConfig

        AnalysisConfig.load()
    except ValueError as e:
        return f"Configuration error in [analysis]: {e}"
    url = redis_url()
    if url:
        try:
            import redis

            redis.ConnectionPool.from_url(url)
        except Exception as e:
            return (f"WARMSCOPE_REDIS_URL={url!r} is not a Redis URL ({e}); use redis://HOST:PORT/DB, or unset it "
                    "to read the embedded store")
    return None


_PROM_FRAMES = ("lookups", "requests")
_REDIS_FRAMES = ("hot_keys", "warmup_runs", "warmed_keys", "early_keys")


def prometheus_url() -> str:
    return os.environ.get("WARMSCOPE_PROMETHEUS_URL", "")


def redis_url() -> str:
    return os.environ.get("WARMSCOPE_REDIS_URL", "")


def source_label() -> str:
    parts = []
    if prometheus_url():
        parts.append(f"Prometheus · {prometheus_url()}")
    if redis_url():
        parts.append(f"Redis · {redis_url()}")
    if not parts or Path(store_path()).exists():  # name the store only where it is read
        parts.append(f"embedded store · {store_path()}")
    return " + ".join(parts)


@st.cache_resource(show_spinner=False)
def _prom(url: str):
    from warmscope.analysis.prometheus import PrometheusSource

    return PrometheusSource(url)


@st.cache_resource(show_spinner=False)
def _redis(url: str):
    from warmscope.analysis.redis_source import RedisSource

    return RedisSource(url)


@st.cache_data(ttl=TTL, show_spinner=False)
def _remote_frame(kind: str, url: str, name: str, start: float | None, end: float | None) -> pd.DataFrame:
    from warmscope.analysis.sources import SourceError as AnalysisSourceError

    try:
        src = _prom(url) if kind == "prometheus" else _redis(url)
        return src.frame(name, start, end)
    except AnalysisSourceError as e:
        raise SourceError(str(e)) from None


def _store(path: str) -> EmbeddedStore:
    try:
        return EmbeddedStore(path, readonly=True)
    except StoreError as e:
        raise SourceError(str(e)) from None


# The store's modification time is part of the key (a store that changed is re-read), so entries can live long:
# a range switch back and forth, or another viewer of the same range, reads nothing.
@st.cache_data(ttl=STORE_TTL, max_entries=96, show_spinner=False)
def _frame(path: str, name: str, start: float | None, end: float | None, mtime: float,
           step: float | None = None) -> pd.DataFrame:
    try:
        return _store(path).frame(name, start, end, step=step)
    except StoreError as e:
        raise SourceError(str(e)) from None


def _mtime(path: str) -> float:
    # Part of the cache key: a store that changed (live simulator) is re-read.
    p = Path(path)
    wal = p.with_name(p.name + "-wal")
    return max((x.stat().st_mtime for x in (p, wal) if x.exists()), default=0.0)


def frame(name: str, start: float | None = None, end: float | None = None, step: float | None = None) -> pd.DataFrame:
    """``step=3600``: hourly rollups where the embedded store keeps them (long ranges)."""
    if prometheus_url() and name in _PROM_FRAMES:
        return _remote_frame("prometheus", prometheus_url(), name, start, end)
    if redis_url() and name in _REDIS_FRAMES:
        return _remote_frame("redis", redis_url(), name, start, end)
    path = store_path()
    if (prometheus_url() or redis_url()) and not Path(path).exists():
        from warmscope.collectors.store import _TABLES

        return pd.DataFrame(columns=list(_TABLES.get(name, ())))  # not collected in this deployment
    return _frame(path, name, start, end, _mtime(path), step)


def frames(names, start: float | None = None, end: float | None = None,
           step: float | None = None) -> dict[str, pd.DataFrame]:
    return {n: frame(n, start, end, step) for n in names}


@st.cache_data(ttl=TTL, show_spinner=False)
def _ab_report(kind: str, where: str, experiment: str, control: str, treatment: str, primary: str, mtime: float):
    from warmscope.analysis.ab_report import build_report, report_for
    from warmscope.analysis.sources import EmbeddedSource
    from warmscope.analysis.sources import SourceError as AnalysisSourceError

    try:
        if kind == "redis":  # unit rows from Redis; request totals from wherever requests come from
            return build_report(_redis(where).units(experiment), experiment, control, treatment, primary=primary,
                                requests=frame("requests"))
        return report_for(EmbeddedSource(where), experiment, control, treatment, primary=primary)
    except AnalysisSourceError as e:
        raise SourceError(str(e)) from None


def ab_report(experiment: str, control: str, treatment: str, primary: str):
    """The A/B report (:class:`analysis.ab_report.ABReport`): from the store's
    A/B moments (milliseconds at any number of units), or from Redis unit rows."""
    if redis_url():
        return _ab_report("redis", redis_url(), experiment, control, treatment, primary, 0.0)
    path = store_path()
    return _ab_report("embedded", path, experiment, control, treatment, primary, _mtime(path))


@st.cache_data(ttl=TTL, show_spinner=False)
def _bounds(path: str, mtime: float) -> tuple[float, float] | None:
    con = _store(path)._con()
    row = con.execute("SELECT min(ts), max(ts) FROM lookups").fetchone()
    if row is None or row[0] is None:
        return None
    # Replicas warm up before they take traffic: "everything" starts at the first warm-up run.
    run = con.execute("SELECT min(started) FROM warmup_runs").fetchone()
    first = min(float(row[0]), float(run[0])) if run and run[0] is not None else float(row[0])
    return first, float(row[1])


def time_bounds() -> tuple[float, float] | None:
    """(first lookup or warm-up run, last lookup) timestamps, or None when there is no data. With
    Prometheus: the last week up to now (its retention decides what is there)."""
    if prometheus_url():
        import time

        now = time.time()
        return now - 7 * 86400, now
    path = store_path()
    return _bounds(path, _mtime(path))


@st.cache_data(ttl=TTL, show_spinner=False)
def _experiments(path: str, mtime: float) -> list[str]:
    con = _store(path)._con()
    # ab_moments: a few rows per variant and 15 minutes, where ab_units has one per unit
    return [r[0] for r in con.execute("SELECT DISTINCT experiment FROM ab_moments WHERE experiment != '' "
                                      "ORDER BY experiment")]


def experiments() -> list[str]:
    if redis_url():
        try:
            return sorted(_redis(redis_url()).r.smembers("ws:ab:experiments"))
        except Exception as e:  # redis errors: say it, don't crash the page
            raise SourceError(f"Redis at {redis_url()} cannot list experiments: {e}") from None
    path = store_path()
    return _experiments(path, _mtime(path))


@st.cache_data(ttl=TTL, show_spinner=False)
def _last_run(path: str, mtime: float) -> float | None:
    row = _store(path)._con().execute("SELECT max(started) FROM warmup_runs").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def last_run_start() -> float | None:
    """Start of the newest warm-up run (for the "since the last warm-up run" range)."""
    if redis_url():
        runs = frame("warmup_runs")
        return float(runs.started.max()) if len(runs) else None
    path = store_path()
    if not Path(path).exists():
        return None
    return _last_run(path, _mtime(path))


def annotations(start: float, end: float) -> dict[str, pd.DataFrame]:
    """Warm-up runs starting in [start, end) and known fault windows overlapping it (the simulator's ground
    truth, or faults recorded in the store) — drawn on every time series."""
    runs = frame("warmup_runs", start, end)
    path = store_path()
    faults = _frame(path, "faults", None, None, _mtime(path)) if Path(path).exists() else pd.DataFrame()
    if len(faults):
        faults = faults[(faults.start < end) & (faults.end > start)]
    return {"runs": runs, "faults": faults}


@st.cache_data(ttl=TTL, show_spinner=False)
def _experiment_list(path: str, mtime: float) -> pd.DataFrame:
    con = _store(path)._con()
    rows = con.execute("SELECT experiment, variant, min(min_first), max(max_last), sum(n) FROM ab_moments "
                       "WHERE experiment != '' GROUP BY experiment, variant ORDER BY experiment, variant").fetchall()
    return pd.DataFrame(rows, columns=["experiment", "variant", "first", "last", "units"])


def experiment_list() -> pd.DataFrame:
    """One row per experiment × variant: first and last unit activity, units (embedded store; empty elsewhere)."""
    if redis_url():
        return pd.DataFrame(columns=["experiment", "variant", "first", "last", "units"])
    path = store_path()
    if not Path(path).exists():
        return pd.DataFrame(columns=["experiment", "variant", "first", "last", "units"])
    return _experiment_list(path, _mtime(path))


def version() -> tuple:
    """What cached results depend on: the sources and the store's modification time."""
    path = store_path()
    return (path, _mtime(path), prometheus_url(), redis_url())
