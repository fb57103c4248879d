"""warmscope sources: each backend read as the same canonical pandas frames.

``base`` holds the contract (:class:`Source`, :class:`SourceBase`, :class:`SourceError`); the
backends (embedded store, Redis, Prometheus or VictoriaMetrics, Alertmanager) import only it, and
``composite`` puts them together (:func:`from_env`). The names below are imported on first use, so
``from warmscope.sources import EmbeddedSource`` loads neither Prometheus' nor Redis' client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .alertmanager import AlertmanagerSource
    from .base import (
        ALERT_COLUMNS,
        ENGINE_FRAMES,
        EXPERIMENT_COLUMNS,
        FRAMES,
        Source,
        SourceBase,
        SourceError,
        columns,
        empty_frame,
    )
    from .composite import CompositeSource, from_env
    from .embedded import EmbeddedSource, RedisRecords
    from .prometheus import PrometheusSource
    from .redis_source import RedisSource

_WHERE = {
    "Source": "base",
    "SourceError": "base",
    "SourceBase": "base",
    "columns": "base",
    "empty_frame": "base",
    "FRAMES": "base",
    "ENGINE_FRAMES": "base",
    "ALERT_COLUMNS": "base",
    "EXPERIMENT_COLUMNS": "base",
    "EmbeddedSource": "embedded",
    "RedisRecords": "embedded",
    "CompositeSource": "composite",
    "from_env": "composite",
    "PrometheusSource": "prometheus",
    "RedisSource": "redis_source",
    "AlertmanagerSource": "alertmanager",
}
__all__ = [
    "ALERT_COLUMNS",
    "AlertmanagerSource",
    "CompositeSource",
    "ENGINE_FRAMES",
    "EXPERIMENT_COLUMNS",
    "EmbeddedSource",
    "FRAMES",
    "PrometheusSource",
    "RedisRecords",
    "RedisSource",
    "Source",
    "SourceBase",
    "SourceError",
    "columns",
    "empty_frame",
    "from_env",
]
assert sorted(__all__) == sorted(_WHERE)


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
