"""What the gateway (collectors/gateway.py) calls: two methods, both never raising.

``before(ex, path, body)`` gives a chat request a ``session_id`` (so that its KV
events can be matched; a request that has one is left alone and not attributed)
and, with ``salt_tenants``, a ``cache_salt`` derived from its tenant.
``after(ex)`` reads the response's usage and hands the request to the watcher,
which judges its missed tokens once its events are in and calls
``telemetry.record_misses(tenant=, engine=, family=, classes=, ts=)`` when the
telemetry has it; with ``trace`` (the default when the telemetry has ``record_trace``)
the request's block chain follows as ``telemetry.record_trace(row)`` (the block trace the
what-if replay reads).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from typing import Any

from .attribution import Attribution
from .watcher import KVWatcher

__all__ = ["KVGatewayHook"]


class KVGatewayHook:
    def __init__(
        self,
        watcher: KVWatcher,
        telemetry: Any = None,
        engine: str | None = None,
        salt_tenants: bool = False,
        salt_secret: str | None = None,
        wait_s: float = 2.0,
        trace: bool | None = None,
    ) -> None:
        self.watcher = watcher
        self.telemetry = telemetry
        self.engine = engine or (watcher.specs[0].name if watcher.specs else "engine")
        self.salt_tenants = salt_tenants
        self.salt_secret = salt_secret
        self.wait_s = wait_s
        self._prefix = "ws-" + os.urandom(4).hex() + "-"
        self._ids = itertools.count()
        self.stats = {
            "tagged": 0,
            "salted": 0,
            "not_tagged": 0,
            "submitted": 0,
            "no_usage": 0,
            "recorded": 0,
            "errors": 0,
        }
        self.last: Attribution | None = None
        self.trace = callable(getattr(telemetry, "record_trace", None)) if trace is None else trace
        if self.trace:
            watcher.state.trace_sink = self._record_trace

    def salt_for(self, tenant: str) -> str:
        if self.salt_secret is None:
            return tenant
        return hashlib.sha256((self.salt_secret + "\0" + tenant).encode()).hexdigest()[:32]

    def before(self, ex: Any, path: str, body: bytes) -> bytes:
        try:
            if ex is None or not path.endswith("/chat/completions") or body[:1] != b"{":
                return body
            add = b""
            if b'"session_id"' in body:
                self.stats["not_tagged"] += 1
            else:
                sid = self._prefix + str(next(self._ids))
                ex.kv_session = sid
                add += b'"session_id":' + json.dumps(sid).encode() + b","
                self.stats["tagged"] += 1
            if self.trace and b'"vllm_xargs"' not in body:
                # the engine reports the blocks each request reused (the trace's hit prefix,
                # also for a request that stores nothing)
                add += b'"vllm_xargs":{"kv_cache_report_mode":"full"},'
            tenant = ex.labels[0] if getattr(ex, "labels", None) else None
            if self.salt_tenants and isinstance(tenant, str) and b'"cache_salt"' not in body:
                salt = self.salt_for(tenant)
                self.watcher.state.salts.name(tenant, salt)
                add += b'"cache_salt":' + json.dumps(salt).encode() + b","
                self.stats["salted"] += 1
            return b"{" + add + body[1:] if add else body
        except Exception:
            self.stats["errors"] += 1
            return body

    def after(self, ex: Any) -> None:
        try:
            sid = getattr(ex, "kv_session", None)
            if ex is None or sid is None or getattr(ex, "status", 0) >= 400:
                return
            usage = ex.usage
            if usage is None and not ex.stream and ex.buf:
                try:
                    usage = json.loads(b"".join(ex.buf)).get("usage")
                except (ValueError, AttributeError):
                    usage = None
            if not isinstance(usage, dict):
                self.stats["no_usage"] += 1
                return
            tenant = ex.labels[0] if ex.labels else None
            family = getattr(ex, "kind", None)
            self.stats["submitted"] += 1
            trace = None
            if self.trace:
                now = time.time()
                took = time.perf_counter() - ex.t0
                out = usage.get("completion_tokens")
                ttft = getattr(ex, "ttft", None)
                trace = {
                    "ts": now - took,
                    "t_end": now,
                    "tenant": tenant,
                    "output": out if isinstance(out, int) else 0,
                    "ttft": float(ttft) if ttft is not None else float("nan"),
                }
            self.watcher.submit(
                {"session_id": sid, "usage": usage},
                lambda a: self._record(a, tenant, family),
                self.wait_s,
                trace,
            )
        except Exception:
            self.stats["errors"] += 1

    def _record(self, a: Attribution, tenant: str | None, family: str | None) -> None:
        self.last = a
        rec = getattr(self.telemetry, "record_misses", None)
        if rec is None:
            return
        rec(
            tenant=tenant,
            engine=a.engine or self.engine,
            family=family,
            classes=a.classes,
            ts=time.time(),
        )
        self.stats["recorded"] += 1

    def _record_trace(self, row: Any) -> None:
        self.telemetry.record_trace(row)
        self.stats["traced"] = self.stats.get("traced", 0) + 1

    def close(self) -> None:
        self.watcher.stop()
