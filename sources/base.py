"""The source contract: where frames come from (the only I/O on the reading side).

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

* :class:`warmscope.sources.embedded.EmbeddedSource` — the embedded SQLite store (every frame);
* :class:`warmscope.sources.prometheus.PrometheusSource` — ``lookups``,
  ``requests`` and the engines' own frames (``engine_*``), plus the alerts
  Prometheus evaluates;
* :class:`warmscope.sources.embedded.RedisRecords` — hot keys, warm-up runs and A/B unit rows
  written by the collectors' Redis sink (over :class:`warmscope.sources.redis_source.RedisSource`);
* :class:`warmscope.sources.alertmanager.AlertmanagerSource` — active alerts;
* :class:`warmscope.sources.composite.CompositeSource` — routes each question to the backend that
  holds it; :func:`warmscope.sources.composite.from_env` builds the one a deployment's
  ``WARMSCOPE_*`` variables describe.

Example::

    src = from_env()                       # or EmbeddedSource("var/warmscope.sqlite")
    lookups = src.frame("lookups", t0, t1)
    first, last = src.time_bounds() or (None, None)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar, runtime_checkable

import pandas as pd
from warmscope.collectors.store import _TABLES, FRAMES

__all__ = [
    "Source",
    "SourceError",
    "SourceBase",
    "columns",
    "empty_frame",
    "FRAMES",
    "ENGINE_FRAMES",
    "ALERT_COLUMNS",
    "EXPERIMENT_COLUMNS",
]

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

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
        """A canonical frame for [start, end); ``step=3600`` lets a backend answer from hourly
        rollups."""
        ...

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(per-variant, per-layer) A/B moments; empty frames where the backend keeps unit rows
        instead."""
        ...

    def units(self, experiment: str) -> pd.DataFrame:
        """One row per A/B unit (see ``EmbeddedStore.units``); empty where there are none."""
        ...

    def request_totals(self, experiment: str) -> dict[str, float]:
        """Requests per variant of an experiment."""
        ...

    def experiments(self) -> list[str]: ...

    def experiment_list(self) -> pd.DataFrame:
        """One row per experiment × variant: ``EXPERIMENT_COLUMNS`` (first/last unit activity,
        units)."""
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
        """A token that changes when the data changes (a file's modification time), or None when
        only a time-to-live can tell (remote backends)."""
        ...


class SourceBase:
    """Defaults for a backend that holds only some of the data: empty results of the right shape."""

    label = "source"
    # "embedded", "prometheus", "redis", "alertmanager", ...: CompositeSource.origin(kind) finds it
    kind = ""
    FRAMES_HELD: frozenset[str] = frozenset()

    def describe(self) -> str:
        return self.label

    def provides(self) -> frozenset[str]:
        return self.FRAMES_HELD

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
        raise SourceError(f"{self.describe()} holds no {name!r} frame")

    def frames(
        self,
        names: Iterable[str] = FRAMES,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> dict[str, pd.DataFrame]:
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
