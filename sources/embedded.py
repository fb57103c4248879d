"""The embedded SQLite store and the collectors' Redis records, as sources."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from warmscope.collectors.store import FRAMES, EmbeddedStore, StoreError

from .base import EXPERIMENT_COLUMNS, SourceBase, SourceError

_T = TypeVar("_T")

__all__ = ["EmbeddedSource", "RedisRecords"]


class EmbeddedSource(SourceBase):
    label = "embedded store"
    kind = "embedded"
    FRAMES_HELD = frozenset(FRAMES)

    def __init__(self, path: str | Path, lazy: bool = False) -> None:
        """``lazy=True``: open the store at the first read (and again at the next one if it is
        missing), so a long-lived composite picks up a store written after it was built."""
        self.path = Path(path)
        self._opened: EmbeddedStore | None = None
        self._lazy = lazy
        self._ino: int | None = None
        if not lazy:
            self._open()

    def _open(self) -> EmbeddedStore:
        if (
            self._opened is not None and self._lazy
        ):  # a store replaced by a new file is opened again
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

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
        return self._call(self._store.frame, name, start, end, step)

    def units(self, experiment: str | None = None) -> pd.DataFrame:
        return self._call(self._store.units, experiment)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-variant A/B moments (see :mod:`model.ab_metrics`)."""
        return self._call(self._store.moments, experiment)

    def request_totals(self, experiment: str) -> dict[str, float]:
        return self._call(self._store.request_totals, experiment)

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._call(self._store.query, sql, params)

    def time_bounds(self) -> tuple[float, float] | None:
        # two scalar subqueries: each is one index seek, where min() and max() in one SELECT scan
        # the table
        row = self._rows("SELECT (SELECT min(ts) FROM lookups), (SELECT max(ts) FROM lookups)")[0]
        if row[0] is None:
            return None
        # Replicas warm up before they take traffic: the data start at the first warm-up run.
        run = self._rows("SELECT min(started) FROM warmup_runs")[0]
        first = min(float(row[0]), float(run[0])) if run[0] is not None else float(row[0])
        return first, float(row[1])

    def experiments(self) -> list[str]:
        # ab_moments: a few rows per variant and 15 minutes, where ab_units has one per unit
        return [
            r[0]
            for r in self._rows(
                "SELECT DISTINCT experiment FROM ab_moments WHERE experiment != '' "
                "ORDER BY experiment"
            )
        ]

    def experiment_list(self) -> pd.DataFrame:
        rows = self._rows(
            "SELECT experiment, variant, min(min_first), max(max_last), sum(n) FROM ab_moments "
            "WHERE experiment != '' GROUP BY experiment, variant ORDER BY experiment, variant"
        )
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
    collectors' Redis sink, read through :class:`~warmscope.sources.redis_source.RedisSource`."""

    label = "Redis"
    kind = "redis"
    FRAMES_HELD = frozenset({"hot_keys", "warmup_runs", "warmed_keys", "early_keys"})

    def __init__(self, url: str, client: Any = None) -> None:
        from warmscope.sources.redis_source import RedisSource

        self.url = url
        try:
            if (
                client is None
            ):  # the connection is lazy: check the URL now, so a bad one is one clear error
                from redis.connection import parse_url

                parse_url(url)  # type: ignore[no-untyped-call,unused-ignore]  # unannotated in older redis-py
            self.inner = RedisSource(url, client)
        except Exception as e:  # a URL redis-py cannot parse
            raise SourceError(
                f"WARMSCOPE_REDIS_URL={url!r} is not a Redis URL ({e}); use redis://HOST:PORT/DB, "
                "or unset it to read the embedded store"
            ) from None

    @property
    def r(self) -> Any:
        """The Redis client, connected at first use (a server that is down is reported by
        ``health``)."""
        return self.inner.r

    def describe(self) -> str:
        return self.inner.describe()

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
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

        # RedisSource (sources/redis_source.py) is not yet annotated
        return sorted(self.inner._call(self.r.smembers, f"{PREFIX}:ab:experiments"))

    def _runs_range(self) -> tuple[float, float] | None:
        from warmscope.collectors.redis_sink import PREFIX

        # RedisSource (sources/redis_source.py) is not yet annotated
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
            # RedisSource (sources/redis_source.py) is not yet annotated
            self.inner._call(self.r.ping)
        except SourceError as e:
            return str(e)
        return None


# ---------------------------------------------------------------- composite
