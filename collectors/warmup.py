"""Warm-up run tracker: what a warm-up cost, and which keys it wrote.

A run is a context manager. It records start, end, status (``ok``, ``error``
when the block raised, ``cancelled`` on ``KeyboardInterrupt``/``CancelledError``),
strategy, trigger, layer, tenant, keys warmed, bytes, GPU-seconds and memory.
Each key passed to :meth:`WarmupRun.warmed` is remembered (in process, raw;
exported only as a keyed hash) so that analysis can compute:

* **precision** — warmed keys that were *hit* at least once before their TTL
  ran out or they were first missed (evicted): the aggregator notes the first
  hit and first miss of every warmed key;
* **recall** — of the distinct keys requested in the ``early_window_s`` after
  the run ended, the share that the run had warmed: the aggregator notes those
  keys for that window.

Example::

    with tel.warmup("static_topk", layer="prefix_kv", tenant="acme",
                    trigger="replica_start") as run:
        for key, blob in top_keys:
            kv_cache[key] = blob
            run.warmed(key, nbytes=len(blob), ttl_s=3600)
        run.add_gpu_seconds(12.5)
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

from warmscope.model import schema

from .warm_tracking import WarmedKey

__all__ = ["WarmupRun"]


class WarmupRun:
    def __init__(
        self,
        telemetry: Any,
        strategy: str,
        layer: str,
        tenant: str | None = None,
        trigger: str = "manual",
        early_window_s: float | None = None,
        run_id: str | None = None,
    ) -> None:
        self.tel = telemetry
        self.agg = telemetry.aggregator
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.strategy = self.agg.cap_label("strategy", str(strategy))
        self.layer = self.agg.bind_layer(str(layer)).layer  # capped like every layer
        self.tenant_scope = None if tenant is None else self.agg.tenants.label(tenant)
        self.trigger = self.agg.cap_label("trigger", str(trigger))
        self.early_window_s = (
            telemetry.config.early_window_s if early_window_s is None else early_window_s
        )
        self.keys = 0
        self.bytes = 0
        self.gpu_s = 0.0
        self.memory_bytes = 0
        self.status = "running"
        self.started: float | None = None
        self.ended: float | None = None
        self.error: str | None = None
        self._binding = None
        self._labels = (
            self.tenant_scope or schema.UNKNOWN,
            self.layer,
            self.strategy,
            self.trigger,
            self.agg.replica,
        )

    def _record(self) -> dict[Any, Any]:
        return {
            "run_id": self.run_id,
            "replica": self.agg.replica,
            "tenant": self.tenant_scope or "",
            "layer": self.layer,
            "strategy": self.strategy,
            "trigger": self.trigger,
            "started": self.started,
            "ended": self.ended,
            "status": self.status,
            "keys": self.keys,
            "bytes": self.bytes,
            "gpu_s": self.gpu_s,
            "memory_bytes": self.memory_bytes,
            "error": self.error,
        }

    def __enter__(self) -> WarmupRun:
        try:
            self._binding = self.agg.bind_layer(self.layer)
            self.started = self.tel.clock()
            self.agg.warmup_event("start", self._labels, self._record())
        except Exception as e:
            self.agg.count_error("record", "warm-up start", e)
        return self

    def warmed(
        self,
        key: object,
        nbytes: int = 0,
        gpu_s: float = 0.0,
        ttl_s: float | None = None,
        tenant: str | None = None,
    ) -> None:
        """Note one key this run wrote to the cache."""
        try:
            self.keys += 1
            self.bytes += int(nbytes)
            self.gpu_s += float(gpu_s)
            b = self._binding or self.agg.bind_layer(self.layer)
            t = (
                self.agg.tenants.label(tenant)
                if tenant is not None
                else (self.tenant_scope or schema.UNKNOWN)
            )
            self.agg.add_warmed(
                WarmedKey(
                    self.run_id,
                    key,
                    b.families.family(key),
                    t,
                    self.layer,
                    self.tel.clock(),
                    ttl_s,
                    float(gpu_s),
                    self._labels,
                )
            )
        except Exception as e:
            self.agg.count_error("record", "warmed key", e)

    def add_gpu_seconds(self, s: float) -> None:
        self.gpu_s += float(s)

    def set_memory(self, nbytes: int) -> None:
        self.memory_bytes = int(nbytes)

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        try:
            self.ended = self.tel.clock()
            if et is None:
                self.status = "ok"
            elif issubclass(et, (KeyboardInterrupt, asyncio.CancelledError)):
                self.status = "cancelled"
            else:
                self.status = "error"
                self.error = f"{et.__name__}"  # the type only: messages may carry key text
            self.agg.warmup_event("end", self._labels, self._record(), self.status)
            self.agg.open_early_window(
                self.run_id, self.layer, self.tenant_scope, self.early_window_s
            )
        except Exception as e:
            self.agg.count_error("record", "warm-up end", e)
        return False  # the caller's exception is the caller's
