"""Where frames come from: the only I/O in ``analysis``.

Every backend implements :class:`Source`: the canonical frames documented in
:mod:`collectors.store` for a time window (and, where it keeps rollups, a
step), A/B data (moments, or unit rows), the experiments it knows, its time
bounds, the newest warm-up run, alerts it evaluates, and a health check.
``provides()`` names the frames a backend holds; asking it for another frame
is a :class:`SourceError` that says where that frame lives. Everything else a
backend does not keep (A/B moments in Redis, experiments in Prometheus)
answers with an empty result of the right shape. Errors (unreachable,
unreadable, refusing) are one :class:`SourceError` whose message names the
backend and what to do.

Implementations:

* :class:`EmbeddedSource` — the embedded SQLite store (every frame);
* :class:`warmscope.analysis.prometheus.PrometheusSource` — ``lookups``,
  ``requests`` and the engines' own frames (``engine_*``), plus the alerts
  Prometheus evaluates;
* :class:`RedisRecords` — hot keys, warm-up runs and A/B unit rows written by
  the collectors' Redis sink (over :class:`warmscope.analysis.redis_source.RedisSource`);
* :class:`warmscope.analysis.alertmanager.AlertmanagerSource` — active alerts;
* :class:`CompositeSource` — routes each question to the backend that holds
  it; :func:`from_env` builds the one a deployment's ``WARMSCOPE_*``
  variables describe.

Example::

    src = from_env()                       # or EmbeddedSource("var/warmscope.sqlite")
    lookups = src.frame("lookups", t0, t1)
    first, last = src.time_bounds() or (None, None)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import pandas as pd
from warmscope.collectors.store import _TABLES, FRAMES, EmbeddedStore, StoreError

__all__ = ["Source", "SourceError", "SourceBase", "EmbeddedSource", "RedisRecords", "CompositeSource", "from_env",
           "columns", "empty_frame", "FRAMES", "ENGINE_FRAMES", "ALERT_COLUMNS", "EXPERIMENT_COLUMNS"]

_T = TypeVar("_T")

ENGINE_FRAMES = ("engine_prefix", "engine_cached_by_source", "engine_ttft", "engine_kv_usage")
ALERT_COLUMNS = ["origin", "alertname", "state", "severity", "summary", "runbook_url", "since"]
EXPERIMENT_COLUMNS = ["experiment", "variant", "first", "last", "units"]


class SourceError(RuntimeError):
    """A backend cannot give the data; the message names it and what to do."""


def columns(name: str) -> list[str]:
    """The canonical columns of a frame (empty for frames without a fixed layout)."""
    return list(_TABLES.get(name, ()))


def empty_frame(name: str) -> pd.DataFrame:
    return pd.DataFrame(columns=columns(name))


@runtime_checkable
class Source(Protocol):
    """What every backend answers. Times are Unix seconds; windows are [start, end)."""

    label: str

    def describe(self) -> str:
        """One line naming the backend and where it is (shown in the sidebar)."""
        ...

    def provides(self) -> frozenset[str]:
        """Names of the frames this backend holds (asking for another is a :class:`SourceError`)."""
        ...

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              step: float | None = None) -> pd.DataFrame:
        """A canonical frame for [start, end); ``step=3600`` lets a backend answer from hourly rollups."""
        ...

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(per-variant, per-layer) A/B moments; empty frames where the backend keeps unit rows instead."""
        ...

    def units(self, experiment: str) -> pd.DataFrame:
        """One row per A/B unit (see ``EmbeddedStore.units``); empty where there are none."""
        ...

    def request_totals(self, experiment: str) -> dict[str, float]:
        """Requests per variant of an experiment."""
        ...

    def experiments(self) -> list[str]:
        ...

    def experiment_list(self) -> pd.DataFrame:
        """One row per experiment × variant: ``EXPERIMENT_COLUMNS`` (first/last unit activity, units)."""
        ...

    def time_bounds(self) -> tuple[float, float] | None:
        """(first, last) timestamps of the data, or None when there is none."""
        ...

    def last_run_start(self) -> float | None:
        """Start of the newest warm-up run."""
        ...

    def alerts(self) -> pd.DataFrame:
        """Alerts the backend itself evaluates (``ALERT_COLUMNS``); empty for stores."""
        ...

    def health(self) -> str | None:
        """None when the backend answers, else the problem as one message."""
        ...

    def version(self) -> float | None:
        """A token that changes when the data changes (a file's modification time), or None when only a
        time-to-live can tell (remote backends)."""
        ...


class SourceBase:
    """Defaults for a backend that holds only some of the data: empty results of the right shape."""

    label = "source"
    kind = ""  # "embedded", "prometheus", "redis", "alertmanager", ...: CompositeSource.origin(kind) finds it
    FRAMES_HELD: frozenset[str] = frozenset()

    def describe(self) -> str:
        return self.label

    def provides(self) -> frozenset[str]:
        return self.FRAMES_HELD

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              step: float | None = None) -> pd.DataFrame:
        raise SourceError(f"{self.describe()} holds no {name!r} frame")

    def frames(self, names: Iterable[str] = FRAMES, start: float | None = None, end: float | None = None,
               step: float | None = None) -> dict[str, pd.DataFrame]:
        return {n: self.frame(n, start, end, step) for n in names}

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        return pd.DataFrame(), pd.DataFrame()

    def units(self, experiment: str) -> pd.DataFrame:
        return empty_frame("ab_units")

    def request_totals(self, experiment: str) -> dict[str, float]:
        return {}

    def experiments(self) -> list[str]:
        return []

    def experiment_list(self) -> pd.DataFrame:
        return pd.DataFrame(columns=EXPERIMENT_COLUMNS)

    def time_bounds(self) -> tuple[float, float] | None:
        return None

    def last_run_start(self) -> float | None:
        return None

    def alerts(self) -> pd.DataFrame:
        return pd.DataFrame(columns=ALERT_COLUMNS)

    def health(self) -> str | None:
        return None

    def version(self) -> float | None:
        return None


# ---------------------------------------------------------------- embedded store
class EmbeddedSource(SourceBase):
    label = "embedded store"
    kind = "embedded"
    FRAMES_HELD = frozenset(FRAMES)

    def __init__(self, path: str | Path, lazy: bool = False) -> None:
        """``lazy=True``: open the store at the first read (and again at the next one if it is missing), so a
        long-lived composite picks up a store written after it was built."""
        self.path = Path(path)
        self._opened: EmbeddedStore | None = None
        self._lazy = lazy
        self._ino: int | None = None
        if not lazy:
            self._open()

    def _open(self) -> EmbeddedStore:
        if self._opened is not None and self._lazy:  # a store replaced by a new file is opened again
            try:
                ino = self.path.stat().st_ino
            except OSError:
                ino = None
            if ino != self._ino:
                self._opened.close()
                self._opened = None
        if self._opened is None:
            try:
                self._opened = EmbeddedStore(self.path, readonly=True)
            except StoreError as e:
                raise SourceError(str(e)) from None
            self._ino = self.path.stat().st_ino
        return self._opened

    @property
    def _store(self) -> EmbeddedStore:
        return self._open()

    def describe(self) -> str:
        return f"{self.label} · {self.path}"

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except StoreError as e:
            raise SourceError(str(e)) from None

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              step: float | None = None) -> pd.DataFrame:
        return self._call(self._store.frame, name, start, end, step)

    def units(self, experiment: str | None = None) -> pd.DataFrame:
        return self._call(self._store.units, experiment)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-variant A/B moments (see :mod:`collectors.ab_moments`)."""
        return self._call(self._store.moments, experiment)

    def request_totals(self, experiment: str) -> dict[str, float]:
        return self._call(self._store.request_totals, experiment)

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._call(self._store.query, sql, params)

    def time_bounds(self) -> tuple[float, float] | None:
        # two scalar subqueries: each is one index seek, where min() and max() in one SELECT scan the table
        row = self._rows("SELECT (SELECT min(ts) FROM lookups), (SELECT max(ts) FROM lookups)")[0]
        if row[0] is None:
            return None
        # Replicas warm up before they take traffic: the data start at the first warm-up run.
        run = self._rows("SELECT min(started) FROM warmup_runs")[0]
        first = min(float(row[0]), float(run[0])) if run[0] is not None else float(row[0])
        return first, float(row[1])

    def experiments(self) -> list[str]:
        # ab_moments: a few rows per variant and 15 minutes, where ab_units has one per unit
        return [r[0] for r in self._rows("SELECT DISTINCT experiment FROM ab_moments WHERE experiment != '' "
                                         "ORDER BY experiment")]

    def experiment_list(self) -> pd.DataFrame:
        rows = self._rows("SELECT experiment, variant, min(min_first), max(max_last), sum(n) FROM ab_moments "
                          "WHERE experiment != '' GROUP BY experiment, variant ORDER BY experiment, variant")
        return pd.DataFrame(rows, columns=EXPERIMENT_COLUMNS)

    def last_run_start(self) -> float | None:
        row = self._rows("SELECT max(started) FROM warmup_runs")[0]
        return None if row[0] is None else float(row[0])

    def health(self) -> str | None:
        try:
            self._rows("SELECT 1")
        except SourceError as e:
            return str(e)
        return None

    def version(self) -> float:
        """The newest modification time of the store file and its write-ahead log."""
        wal = self.path.with_name(self.path.name + "-wal")
        return max((x.stat().st_mtime for x in (self.path, wal) if x.exists()), default=0.0)


# ---------------------------------------------------------------- Redis records
class RedisRecords(SourceBase):
    """Hot keys, warm-up runs (with their warmed and early keys), A/B moments and unit rows from the
    collectors' Redis sink, read through :class:`~warmscope.analysis.redis_source.RedisSource`."""

    label = "Redis"
    kind = "redis"
    FRAMES_HELD = frozenset({"hot_keys", "warmup_runs", "warmed_keys", "early_keys"})

    def __init__(self, url: str, client: Any = None) -> None:
        from .redis_source import RedisSource

        self.url = url
        try:
            if client is None:  # the connection is lazy: check the URL now, so a bad one is one clear error
                from redis.connection import parse_url

                parse_url(url)  # type: ignore[no-untyped-call,unused-ignore]  # unannotated in older redis-py
            self.inner = RedisSource(url, client)
        except Exception as e:  # a URL redis-py cannot parse
            raise SourceError(f"WARMSCOPE_REDIS_URL={url!r} is not a Redis URL ({e}); use redis://HOST:PORT/DB, or "
                              "unset it to read the embedded store") from None

    @property
    def r(self) -> Any:
        """The Redis client, connected at first use (a server that is down is reported by ``health``)."""
        return self.inner.r

    def describe(self) -> str:
        return self.inner.describe()

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              step: float | None = None) -> pd.DataFrame:
        return self.inner.frame(name, start, end)

    def units(self, experiment: str) -> pd.DataFrame:
        return self.inner.units(experiment)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The experiment's A/B moments, kept by the sink as units arrive: a report reads these
        (a few thousand small hashes), not the unit rows."""
        out: tuple[pd.DataFrame, pd.DataFrame] = self.inner._call(self.inner.moments, experiment)
        return out

    def request_totals(self, experiment: str) -> dict[str, float]:
        out: dict[str, float] = self.inner._call(self.inner.request_totals, experiment)
        return out

    def experiments(self) -> list[str]:
        from warmscope.collectors.redis_sink import PREFIX

        # RedisSource (analysis/redis_source.py) is not yet annotated
        return sorted(self.inner._call(self.r.smembers, f"{PREFIX}:ab:experiments"))

    def _runs_range(self) -> tuple[float, float] | None:
        from warmscope.collectors.redis_sink import PREFIX

        # RedisSource (analysis/redis_source.py) is not yet annotated
        first = self.inner._call(self.r.zrange, f"{PREFIX}:runs", 0, 0, False, True)
        last = self.inner._call(self.r.zrange, f"{PREFIX}:runs", -1, -1, False, True)
        return (float(first[0][1]), float(last[0][1])) if first and last else None

    def time_bounds(self) -> tuple[float, float] | None:
        return self._runs_range()

    def last_run_start(self) -> float | None:
        b = self._runs_range()
        return None if b is None else b[1]

    def health(self) -> str | None:
        try:
            # RedisSource (analysis/redis_source.py) is not yet annotated
            self.inner._call(self.r.ping)
        except SourceError as e:
            return str(e)
        return None


# ---------------------------------------------------------------- composite
class CompositeSource(SourceBase):
    """Several backends as one: each frame comes from the first backend that holds it (in the order given),
    A/B data and experiments from ``ab``, time bounds from the backend holding ``lookups``, alerts from
    every backend that evaluates them. A frame no backend holds comes back empty."""

    label = "composite"

    def __init__(self, sources: Iterable[Any], ab: Any = None, store: EmbeddedSource | None = None) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise SourceError("no source configured: set WARMSCOPE_STORE, WARMSCOPE_PROMETHEUS_URL or "
                              "WARMSCOPE_REDIS_URL")
        self.store = store
        self.ab = ab if ab is not None else (store if store is not None else self.sources[0])

    def describe(self) -> str:
        return " + ".join(s.describe() for s in self.sources)

    def provides(self) -> frozenset[str]:
        return frozenset().union(*(s.provides() for s in self.sources))

    def route(self, name: str) -> Any:
        """The backend a frame comes from (None when none holds it)."""
        for s in self.sources:
            if name in s.provides():
                return s
        return None

    def owner(self, what: str) -> Any:
        """The backend that answers ``what``: a frame name, ``"ab"`` (moments, units, experiments),
        ``"time_bounds"`` or ``"last_run_start"``; None when no backend does."""
        if what == "ab":
            return self.ab
        if what == "time_bounds":
            return self.route("lookups") or self.sources[0]
        if what == "last_run_start":
            return self.route("warmup_runs")
        return self.route(what)

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              step: float | None = None) -> pd.DataFrame:
        src = self.route(name)
        return empty_frame(name) if src is None else src.frame(name, start, end, step)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.ab.moments(experiment)

    def units(self, experiment: str) -> pd.DataFrame:
        return self.ab.units(experiment)

    def request_totals(self, experiment: str) -> dict[str, float]:
        return self.ab.request_totals(experiment)

    def experiments(self) -> list[str]:
        return self.ab.experiments()

    def experiment_list(self) -> pd.DataFrame:
        return self.ab.experiment_list()

    def time_bounds(self) -> tuple[float, float] | None:
        # owner() returns one of several backends (Any)
        return self.owner("time_bounds").time_bounds()  # type: ignore[no-any-return]

    def last_run_start(self) -> float | None:
        src = self.owner("last_run_start")
        return None if src is None else src.last_run_start()

    def alerts(self) -> pd.DataFrame:
        """Every backend's alerts, one frame (``origin`` says whose)."""
        parts = [a for a in (s.alerts() for s in self.sources) if len(a)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ALERT_COLUMNS)

    def alerts_of(self, kind: str) -> pd.DataFrame:
        """The alerts of one backend kind (empty when it is not configured)."""
        src = self.origin(kind)
        return pd.DataFrame(columns=ALERT_COLUMNS) if src is None else src.alerts()

    def origin(self, kind: str) -> Any:
        """The backend of one kind (``"prometheus"``, ``"redis"``, ``"alertmanager"``, ``"embedded"``), or None."""
        for s in self.sources:
            if getattr(s, "kind", None) == kind:
                return s
        return None

    def health(self) -> str | None:
        problems = [p for p in (s.health() for s in self.sources) if p]
        return "; ".join(problems) or None

    def version(self) -> float | None:
        return None if self.store is None else self.store.version()


def from_env(env: Mapping[str, str] | None = None, store_path: str | Path | None = None) -> CompositeSource:
    """The sources a deployment's settings name, as one :class:`CompositeSource`:

    * ``WARMSCOPE_PROMETHEUS_URL``: lookups, requests and engine frames from Prometheus (and its alerts);
    * ``WARMSCOPE_REDIS_URL``: hot keys, warm-up runs and A/B units from Redis;
    * ``WARMSCOPE_ALERTMANAGER_URL``: active alerts from Alertmanager;
    * everything else from the embedded store at ``store_path`` (default ``WARMSCOPE_STORE``, else the
      collectors' default) — the only source when none of the above is set. With a remote source, a store
      that does not exist is left out (its frames come back empty).
    """
    env = os.environ if env is None else env
    if store_path is None:
        store_path = env.get("WARMSCOPE_STORE") or _default_store_path()
    prom, redis_url, am = (env.get(k, "") for k in ("WARMSCOPE_PROMETHEUS_URL", "WARMSCOPE_REDIS_URL",
                                                     "WARMSCOPE_ALERTMANAGER_URL"))
    sources: list[Any] = []
    if prom:
        from .prometheus import PrometheusSource

        sources.append(PrometheusSource(prom))
    redis_src = RedisRecords(redis_url) if redis_url else None
    if redis_src is not None:
        sources.append(redis_src)
    store = None
    if not (prom or redis_url) or Path(store_path).exists():
        store = EmbeddedSource(store_path, lazy=True)
        sources.append(store)
    if am:
        from .alertmanager import AlertmanagerSource

        sources.append(AlertmanagerSource(am))
    return CompositeSource(sources, ab=redis_src or store, store=store)


def _default_store_path() -> str:
    from warmscope.collectors.config import CollectorConfig

    try:
        return str(CollectorConfig.load().resolved_store_path())
    except ValueError:  # a bad [collectors] section is reported elsewhere; read the default store
        return str(CollectorConfig().resolved_store_path())
