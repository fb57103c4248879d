"""Cached loaders over the deployment's sources: the only place pages get data from.

The sources are one :class:`~warmscope.sources.CompositeSource` built from the environment by
:func:`~warmscope.sources.from_env`:

* ``WARMSCOPE_PROMETHEUS_URL`` set: lookups, requests and engine frames come from Prometheus;
* ``WARMSCOPE_REDIS_URL`` set: hot keys, A/B units and warm-up runs come from Redis;
* ``WARMSCOPE_ALERTMANAGER_URL`` set: the Alerts page lists Alertmanager's active alerts;
* everything else from the embedded store named by ``WARMSCOPE_STORE``
  (default ``var/warmscope.sqlite``) — the only source when neither is set.

This module only composes and caches: loaders take the time range chosen in the sidebar and return
canonical frames, or raise :class:`SourceError` with a message a page can show as is. Answers from a
file-backed source are cached for ``STORE_TTL`` seconds under the file's modification time (a store
that changed is re-read); answers from remote sources for ``TTL`` seconds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pandas as pd
import streamlit as st
from warmscope.collectors.config import CollectorConfig
from warmscope.sources import CompositeSource, SourceError, empty_frame, from_env

if TYPE_CHECKING:
    from warmscope.analysis.ab_report import ABReport

# What the sources are built from: (store path, whether it exists, the remote sources' URLs)
Config = tuple[str, bool, tuple[tuple[str, str], ...]]

__all__ = [
    "SourceError",
    "source",
    "config",
    "store_path",
    "source_label",
    "frame",
    "frames",
    "ab_report",
    "time_bounds",
    "last_run_start",
    "time_marks",
    "experiment_list",
    "experiments",
    "external_alerts",
    "TTL",
    "STORE_TTL",
]

TTL = 30
STORE_TTL = 3600


def store_path() -> str:
    if os.environ.get("WARMSCOPE_STORE"):
        return os.environ["WARMSCOPE_STORE"]
    try:
        return str(CollectorConfig.load().resolved_store_path())
    except ValueError:  # a bad [collectors] section: config_problem() tells the page
        return str(CollectorConfig().resolved_store_path())


def prometheus_url() -> str:
    return os.environ.get("WARMSCOPE_PROMETHEUS_URL", "")


def redis_url() -> str:
    return os.environ.get("WARMSCOPE_REDIS_URL", "")


def alertmanager_url() -> str:
    return os.environ.get("WARMSCOPE_ALERTMANAGER_URL", "")


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
    try:
        source()  # builds every configured source: a URL a client cannot use is named here
    except SourceError as e:
        return str(e)
    return None


def config() -> Config:
    """What the sources are built from (store path, whether it exists, the remote sources' URLs): a
    child process given it builds the same sources."""
    return _config()


def _config() -> Config:
    """What the composite depends on (part of every cache key): the store, whether it exists, and
    every ``WARMSCOPE_*_URL`` variable (the remote sources)."""
    path = store_path()
    urls = tuple(
        sorted(
            (k, v)
            for k, v in os.environ.items()
            if k.startswith("WARMSCOPE_") and k.endswith("_URL")
        )
    )
    return path, os.path.exists(path), urls


@st.cache_resource(show_spinner=False)
def _source(cfg: Config) -> CompositeSource:
    path, _, urls = cfg
    return from_env(dict(urls), store_path=path)


def source() -> CompositeSource:
    """The deployment's sources as one (built once per configuration)."""
    return _source(_config())


def source_label() -> str:
    try:
        return source().describe()
    except SourceError as e:
        return str(e)


# One cached call per question. Keys: the configuration, the method, its arguments and the answering
# backend's version (a store's modification time: entries can live long — a range switch back and
# forth, or another viewer of the same range, reads nothing).
@st.cache_data(ttl=STORE_TTL, max_entries=128, show_spinner=False)
def _stored(cfg: Config, method: str, args: tuple[object, ...], version: float) -> Any:
    return getattr(_source(cfg), method)(*args)


@st.cache_data(ttl=TTL, max_entries=96, show_spinner=False)
def _live(cfg: Config, method: str, args: tuple[object, ...]) -> Any:
    return getattr(_source(cfg), method)(*args)


def _ask(what: str, method: str, *args: object, cfg: Config | None = None) -> Any:
    cfg = cfg or _config()
    owner = _source(cfg).owner(what)
    version = None if owner is None else owner.version()
    if version is None:
        return _live(cfg, method, args)
    return _stored(cfg, method, args, version)


def frame(
    name: str, start: float | None = None, end: float | None = None, step: float | None = None
) -> pd.DataFrame:
    """``step=3600``: hourly rollups where the embedded store keeps them (long ranges). A frame no
    configured source holds comes back empty, with its canonical columns.

    The store stamps an hourly rollup with its hour's end, so an hourly read runs to the end of
    the hour that holds ``end``: the hour in progress is kept (without it, "everything" showed
    fewer lookups than "last 24 hours" read per flush)."""
    cfg = _config()
    src = _source(cfg)
    owner = src.owner(name)
    if owner is None:
        return empty_frame(name)
    if step and end is not None and owner is src.store:
        end = max(end, math.ceil(end / step) * step + 1e-6)
    out: pd.DataFrame = _ask(name, "frame", name, start, end, step, cfg=cfg)
    return out


def frames(
    names: Iterable[str],
    start: float | None = None,
    end: float | None = None,
    step: float | None = None,
) -> dict[str, pd.DataFrame]:
    return {n: frame(n, start, end, step) for n in names}


@st.cache_data(ttl=TTL, show_spinner=False)
def _ab_report(
    cfg: Config,
    experiment: str,
    control: str,
    treatment: str | tuple[str, ...],
    primary: str,
    version: float | None,
) -> ABReport:
    from warmscope.analysis.ab_report import report_for

    return report_for(_source(cfg), experiment, control, treatment, primary=primary)


@st.cache_data(ttl=STORE_TTL, max_entries=32, show_spinner=False)
def _ab_report_stored(
    cfg: Config,
    experiment: str,
    control: str,
    treatment: str | tuple[str, ...],
    primary: str,
    version: float | None,
) -> ABReport:
    """A report over a stored backend, keyed by its version: kept as long as any stored answer
    (a remote backend's is read again after ``TTL`` seconds)."""
    from warmscope.analysis.ab_report import report_for

    return report_for(_source(cfg), experiment, control, treatment, primary=primary)


def ab_report(
    experiment: str, control: str, treatment: str | tuple[str, ...], primary: str
) -> ABReport:
    """The A/B report (:class:`analysis.ab_report.ABReport`): from the A/B moments the embedded
    store or Redis keeps (independent of the number of units), else from unit rows."""
    cfg = _config()
    owner = _source(cfg).owner("ab")
    version = None if owner is None else owner.version()
    ask = _ab_report if version is None else _ab_report_stored
    return ask(cfg, experiment, control, treatment, primary, version)


def time_bounds() -> tuple[float, float] | None:
    """(first lookup or warm-up run, last lookup) timestamps, or None when there is no data. With
    Prometheus: the last week up to now (its retention decides what is there)."""
    cfg = _config()
    owner = _source(cfg).owner("time_bounds")
    if (
        owner.version() is None
    ):  # a remote source: its bounds move with the clock, read them every time
        live: tuple[float, float] | None = owner.time_bounds()
        return live
    b: tuple[float, float] | None = _ask("time_bounds", "time_bounds", cfg=cfg)
    return b


def experiments() -> list[str]:
    names: list[str] = _ask("ab", "experiments")
    return names


def experiment_list() -> pd.DataFrame:
    """One row per experiment × variant: first and last unit activity, units (embedded store; empty
    elsewhere)."""
    out: pd.DataFrame = _ask("ab", "experiment_list")
    return out


def last_run_start() -> float | None:
    """Start of the newest warm-up run (for the "since the last warm-up run" range)."""
    cfg = _config()
    if _source(cfg).owner("last_run_start") is None:
        return None
    t: float | None = _ask("last_run_start", "last_run_start", cfg=cfg)
    return t


def time_marks(start: float, end: float) -> dict[str, pd.DataFrame]:
    """Warm-up runs starting in [start, end) and known fault windows overlapping it (the simulator's
    ground truth, or faults recorded in the store) — drawn on every time series."""
    runs = frame("warmup_runs", start, end)
    faults = frame("faults")
    if len(faults):
        faults = faults[(faults.start < end) & (faults.end > start)]
    return {"runs": runs, "faults": faults}


def external_alerts(origin: str) -> pd.DataFrame:
    """Alerts another system evaluates — ``"alertmanager"`` (active alerts) or ``"prometheus"`` (its
    rules' pending and firing alerts) — as :data:`~warmscope.sources.ALERT_COLUMNS` rows; empty when
    that system is not configured. Raises :class:`SourceError` when it cannot be read."""
    cfg = _config()
    return (
        pd.DataFrame()
        if _source(cfg).origin(origin) is None
        else _live(cfg, "alerts_of", (origin,))
    )


def version() -> tuple[object, ...]:
    """What cached results depend on: the sources and the store's modification time."""
    cfg = _config()
    store = _source(cfg).store
    return (*cfg, None if store is None else store.version())
