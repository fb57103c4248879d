"""warmscope collectors: cache and warm-up instrumentation for inference stacks.

Set the pipeline up once per process, label each request, wrap the caches::

    from warmscope import collectors
    tel = collectors.setup()                       # config from env / TOML
    kv = collectors.InstrumentedCache(lru, layer="prefix_kv")
    r = collectors.instrument_redis(redis.Redis(), layer="response")

    with collectors.request_context(tenant="acme", unit=session_id,
                                    experiment="warmup-2026-11", variant="B",
                                    model="llama-3-8b", prompt_tokens=1800):
        ...                                        # lookups are labelled
        tel.record_request(ttft_s=0.21, latency_s=1.9, prompt_tokens=1800,
                           cached_tokens=1024, gpu_s=0.4, sla_met=True)

    with tel.warmup("static_topk", layer="prefix_kv", trigger="replica_start") as run:
        run.warmed(key, nbytes=n)

A lookup costs a dict increment; OpenTelemetry, the embedded store and Redis
read the aggregator later. Nothing here raises into the cache path.
"""

from __future__ import annotations

from .cache import InstrumentedCache, cached, observe
from .config import CollectorConfig, ConfigError
from .context import current_context, propagate, request_context
from .keys import FamilyNormaliser, KeyHasher
from .pipeline import Telemetry, current_telemetry, setup, shutdown
from .redis import instrument as instrument_redis
from .redis import uninstrument as uninstrument_redis
from .store import EmbeddedStore, StoreError
from .warmup import WarmupRun

__all__ = [
    "CollectorConfig",
    "ConfigError",
    "EmbeddedStore",
    "FamilyNormaliser",
    "InstrumentedCache",
    "KeyHasher",
    "StoreError",
    "Telemetry",
    "WarmupRun",
    "cached",
    "current_context",
    "current_telemetry",
    "instrument_redis",
    "observe",
    "propagate",
    "request_context",
    "setup",
    "shutdown",
    "uninstrument_redis",
]
