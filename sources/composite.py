"""All of a deployment's sources as one: :class:`CompositeSource` and :func:`from_env`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .base import ALERT_COLUMNS, SourceBase, SourceError, empty_frame
from .embedded import EmbeddedSource, RedisRecords

__all__ = ["CompositeSource", "from_env"]


class CompositeSource(SourceBase):
    """Several backends as one: each frame comes from the first backend that holds it (in the order
    given), A/B data and experiments from ``ab``, time bounds from the backend holding ``lookups``,
    alerts from every backend that evaluates them. A frame no backend holds comes back empty."""

    label = "composite"

    def __init__(
        self, sources: Iterable[Any], ab: Any = None, store: EmbeddedSource | None = None
    ) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise SourceError(
                "no source configured: set WARMSCOPE_STORE, WARMSCOPE_PROMETHEUS_URL or "
                "WARMSCOPE_REDIS_URL"
            )
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

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> pd.DataFrame:
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
        """The backend of one kind (``"prometheus"``, ``"redis"``, ``"alertmanager"``,
        ``"embedded"``), or None."""
        for s in self.sources:
            if getattr(s, "kind", None) == kind:
                return s
        return None

    def health(self) -> str | None:
        problems = [p for p in (s.health() for s in self.sources) if p]
        return "; ".join(problems) or None

    def version(self) -> float | None:
        return None if self.store is None else self.store.version()


def from_env(
    env: Mapping[str, str] | None = None, store_path: str | Path | None = None
) -> CompositeSource:
    """The sources a deployment's settings name, as one :class:`CompositeSource`:

    * ``WARMSCOPE_PROMETHEUS_URL``: lookups, requests and engine frames from Prometheus (and its
      alerts);
    * ``WARMSCOPE_REDIS_URL``: hot keys, warm-up runs and A/B units from Redis;
    * ``WARMSCOPE_ALERTMANAGER_URL``: active alerts from Alertmanager;
    * everything else from the embedded store at ``store_path`` (default ``WARMSCOPE_STORE``, else
      the collectors' default) — the only source when none of the above is set. With a remote
      source, a store that does not exist is left out (its frames come back empty).
    """
    env = os.environ if env is None else env
    if store_path is None:
        store_path = env.get("WARMSCOPE_STORE") or _default_store_path()
    prom, redis_url, am = (
        env.get(k, "")
        for k in ("WARMSCOPE_PROMETHEUS_URL", "WARMSCOPE_REDIS_URL", "WARMSCOPE_ALERTMANAGER_URL")
    )
    sources: list[Any] = []
    if prom:
        from warmscope.sources.prometheus import PrometheusSource

        sources.append(PrometheusSource(prom))
    redis_src = RedisRecords(redis_url) if redis_url else None
    if redis_src is not None:
        sources.append(redis_src)
    store = None
    if not (prom or redis_url) or Path(store_path).exists():
        store = EmbeddedSource(store_path, lazy=True)
        sources.append(store)
    if am:
        from warmscope.sources.alertmanager import AlertmanagerSource

        sources.append(AlertmanagerSource(am))
    return CompositeSource(sources, ab=redis_src or store, store=store)


def _default_store_path() -> str:
    from warmscope.collectors.config import CollectorConfig

    try:
        return str(CollectorConfig.load().resolved_store_path())
    except ValueError:  # a bad [collectors] section is reported elsewhere; read the default store
        return str(CollectorConfig().resolved_store_path())
