"""The per-process telemetry pipeline: aggregator -> exporters and sinks.

:func:`setup` builds one :class:`Telemetry` from the config: the aggregator the
wrappers write into; OpenTelemetry observable instruments (OTLP/HTTP or a
Prometheus scrape endpoint) when ``exporter`` says so; the embedded store; and a
Redis sink for hot keys, A/B unit records and warm-up runs when ``redis_url``
is set. A daemon thread flushes every ``flush_interval_s``; the simulator calls
:meth:`Telemetry.flush` itself with virtual timestamps (``background=False``).

Failures in export or flush are counted in ``warmscope.telemetry.errors`` and
logged once per stage; rows that could not be written are kept (bounded) and
written at the next flush.

Example::

    from warmscope import collectors
    tel = collectors.setup(exporter="embedded", store_path="var/warmscope.sqlite")
    cache = collectors.InstrumentedCache({}, layer="response")
    ...
    tel.close()          # final flush
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

from . import schema
from .aggregator import HISTOGRAMS, Aggregator
from .config import CollectorConfig
from .context import RequestContext, _current
from .keys import KeyHasher, TenantBucketer
from .store import EmbeddedStore, histogram_row

__all__ = ["Telemetry", "setup", "current_telemetry", "shutdown", "flush_together"]

log = logging.getLogger("warmscope.collectors")

_PENDING_LIMIT = 2_000_000  # rows kept for retry when a sink is down


class Telemetry:
    def __init__(
        self,
        config: CollectorConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        meter_provider: Any = None,
        store: EmbeddedStore | None = None,
        redis_client: Any = None,
        background: bool = True,
    ) -> None:
        self.config = cfg = config or CollectorConfig.load()
        self.clock = clock
        self.aggregator = Aggregator(
            replica=cfg.replica,
            tenants=TenantBucketer(cfg.tenants, cfg.max_tenants),
            family_rules=cfg.family_rules,
            max_families=cfg.max_families,
            hot_keys_k=cfg.hot_keys_k,
            clock=clock,
            warmed_key_limit=cfg.warmed_key_limit,
            early_key_limit=cfg.early_key_limit,
        )
        self.default_context = RequestContext(self.aggregator)
        self._secret: bytes | None = None
        self._hasher: KeyHasher | None = None
        self.store = store
        has_redis = bool(cfg.redis_url) or redis_client is not None
        # Metric points go to the store with the embedded exporter; hot keys,
        # A/B units and warm-up runs go to Redis when configured, else the store.
        if store is None and (cfg.exporter == "embedded" or (cfg.exporter != "none" and not has_redis)):
            self.store = EmbeddedStore(cfg.resolved_store_path())
        self.points_to_store = self.store is not None and cfg.exporter in ("embedded", "none")
        self.redis_sink = None
        if cfg.redis_url or redis_client is not None:
            from .redis_sink import RedisSink

            self.redis_sink = RedisSink(redis_client, cfg.redis_url, cfg.hot_key_ttl_s, self.aggregator)
        self.otel = None
        if meter_provider is not None or cfg.exporter in ("otlp", "prometheus"):
            from .otel import OTelBridge

            self.otel = OTelBridge(self.aggregator, cfg, meter_provider)
        self._last: dict[str, dict] = {"lookups": {}, "writes": {}, "requests": {}, "hist": {}}
        self._pending_store: dict[str, list] = defaultdict(list)
        self._pending_redis: dict[str, list] = defaultdict(list)
        self._flush_lock = threading.Lock()
        self._last_side = -float("inf")  # hot keys / units flush less often than points
        self._final = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.background = background
        if background:
            self._thread = threading.Thread(target=self._loop, name="warmscope-flush", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ helpers
    @property
    def hasher(self) -> KeyHasher:
        if self._hasher is None:
            self._hasher = KeyHasher(self.config.resolved_secret())
        return self._hasher

    def context(self) -> RequestContext:
        """The active request context, re-bound to this pipeline if needed."""
        ctx = _current.get()
        if ctx is None:
            return self.default_context
        if ctx._agg is not self.aggregator:
            return RequestContext(self.aggregator, ctx.tenant, ctx.unit, ctx.experiment,
                                  ctx.variant, ctx.model, ctx.prompt_tokens)
        return ctx

    def record_request(
        self,
        *,
        ttft_s: float | None = None,
        latency_s: float | None = None,
        prompt_tokens: int | None = None,
        cached_tokens: int | None = None,
        gpu_s: float = 0.0,
        sla_met: bool | None = None,
        conversion: bool | None = None,
        value: float = 0.0,
    ) -> None:
        """One call at the end of each request; labels come from the request context."""
        try:
            self.aggregator.record_request(
                self.context(), ttft_s, latency_s, prompt_tokens, cached_tokens,
                float(gpu_s), sla_met, conversion, float(value),
            )
        except Exception as e:  # never break the host
            self.aggregator.count_error("record", "record_request", e)

    def record_gpu_memory(self, used_share: float) -> None:
        """The share (0-1) of GPU cache memory in use on this replica, now."""
        try:
            self.aggregator.set_gauge(schema.GPU_MEMORY.name, used_share)
        except Exception as e:
            self.aggregator.count_error("record", "gpu memory", e)

    def warmup(self, strategy: str, layer: str, **kw: Any):
        """A :class:`collectors.warmup.WarmupRun` context manager bound to this pipeline."""
        from .warmup import WarmupRun

        return WarmupRun(self, strategy=strategy, layer=layer, **kw)

    # ------------------------------------------------------------- flushing
    def _loop(self) -> None:
        while not self._stop.wait(self.config.flush_interval_s):
            self.flush(side=False)

    def flush(self, now: float | None = None, settle: bool | None = None, side: bool = True) -> dict[str, int]:
        """Move what the aggregator holds to the sinks. Never raises.

        ``settle=True`` when no other thread is recording (virtual-time callers
        and shutdown); default: True without a background thread. Hot keys and
        A/B unit records go out on every explicit flush, and every
        ``side_flush_s`` from the periodic flusher (``side=False``).
        """
        with self._flush_lock:
            try:
                return self._flush(now, self.background is False if settle is None else settle, side)
            except Exception as e:
                self.aggregator.count_error("flush", "flush", e)
                return {}

    def _flush(self, now: float | None, settle: bool, side: bool = True) -> dict[str, int]:
        store_b, redis_b, new_last = self._collect(self.clock() if now is None else now, settle, side)
        written = {k: len(v) for k, v in store_b.items()}
        written.update({f"redis:{k}": len(v) for k, v in redis_b.items()})
        if self.store is not None:
            if self._write_sink("store", self.store.write, store_b, self._pending_store):
                self._last.update(new_last)
        if self.redis_sink is not None:
            self._write_sink("redis", self.redis_sink.write, redis_b, self._pending_redis)
        return written

    def _collect(self, now: float, settle: bool, take_side: bool = False) -> tuple[dict, dict, dict]:
        """Rows for the store and Redis since the last flush, and the new
        cumulative snapshot to remember once the store write succeeded."""
        agg = self.aggregator
        store_b: dict[str, list] = defaultdict(list)
        redis_b: dict[str, list] = defaultdict(list)
        side = redis_b if self.redis_sink is not None else store_b
        new_last: dict[str, dict] = {}
        if self.points_to_store and self.store is not None:
            for name, kind in (("lookups", "counts"), ("writes", "writes")):
                deltas, new_last[name] = agg.deltas(kind, self._last[name])
                store_b[name].extend((now, *k, d) for k, d in deltas.items() if d)
            cur = agg.request_totals()
            last = self._last["requests"]
            for k, v in cur.items():
                p = last.get(k, (0, 0.0, 0, 0.0))
                if v[0] != p[0]:
                    store_b["requests"].append((now, *k, v[0] - p[0], v[1] - p[1], v[2] - p[2], v[3] - p[3]))
            new_last["requests"] = {k: tuple(v) for k, v in cur.items()}
            cur = agg.histogram_totals()
            last = self._last["hist"]
            for (i, labels), h in cur.items():
                p = last.get((i, labels))
                if p is not None and p[-1] == h[-1]:
                    continue
                dh = h if p is None else [a - b for a, b in zip(h, p)]
                inst, bounds = HISTOGRAMS[i]
                store_b["histograms"].append(
                    histogram_row(now, inst.name, labels, bounds, dh[:-2], dh[-2], dh[-1])
                )
            new_last["hist"] = {k: tuple(v) for k, v in cur.items()}
            for name, v in list(agg.gauges.items()):
                store_b["gauges"].append((now, name, agg.replica, v))

        hot, units = {}, {}
        side_now = take_side or self._final or now - self._last_side >= self.config.side_flush_s
        if side_now:
            self._last_side = now
            hot, units = agg.take_buffers(settle or self._final)
        if hot:
            win = float(int(now // self.config.hot_key_window_s) * self.config.hot_key_window_s)
            h = self.hasher.hash
            for hk, sk in hot.items():
                tenant, layer = agg.hot_scope(hk)
                for key, e in sk.items():
                    if e[1] + e[2] >= 2:  # a key read once in a flush window is not hot
                        side["hot_keys"].append((win, tenant, layer, h(key), e[4], e[1], e[2], e[3]))
        for (exp, var, unit, layer), u in units.items():
            if layer:
                side["ab_lookups"].append((exp, var, self.hasher.hash(unit), layer, u[0], u[1]))
            else:
                side["ab_units"].append((exp, var, self.hasher.hash(unit), now, now, *u[2:]))
        while agg.events:
            kind, rec = agg.events.popleft()
            side["warmup_runs"].append(tuple(rec.get(c) for c in _RUN_COLS))
        if side_now:
            self._export_warmed(now, side)
        self._export_early(now, side)
        return store_b, redis_b, new_last

    @staticmethod
    def _stage(batches: dict, pending: dict) -> dict[str, list]:
        """What to write now: kept side rows plus this flush's rows. Metric
        points are recomputed from cumulative totals, so they are not kept in
        ``pending``: an unwritten delta simply grows until it lands."""
        for k, rows in batches.items():
            if k not in _POINT_FRAMES:
                pending[k].extend(rows)
        merged = {k: list(v) for k, v in pending.items() if v}
        for k in _POINT_FRAMES:
            if batches.get(k):
                merged[k] = batches[k]
        return merged

    def _failed(self, stage: str, e: BaseException, pending: dict) -> None:
        self.aggregator.count_error(stage, f"{stage} write failed; rows kept for the next flush", e)
        if sum(len(v) for v in pending.values()) > _PENDING_LIMIT:
            self.aggregator.count_error(stage, "retry backlog full; oldest rows dropped")
            for k in list(pending):
                del pending[k][: len(pending[k]) // 2]

    def _write_sink(self, stage: str, write: Callable, batches: dict, pending: dict) -> bool:
        merged = self._stage(batches, pending)
        if not merged:
            return True
        try:
            write(merged)
        except Exception as e:
            self._failed(stage, e, pending)
            return False
        pending.clear()
        return True

    def _export_warmed(self, now: float, side: dict) -> None:
        agg = self.aggregator
        if not agg.warmed:
            return
        h = self.hasher.hash
        done = []
        for w in list(agg.warmed.values()):
            state = (w.first_hit_at, w.first_miss_at, w.hits)
            if state != w.exported:
                side["warmed_keys"].append((
                    w.run_id, h(w.key_hash_src), w.family, w.tenant, w.layer, w.warmed_at,
                    w.ttl_s, w.gpu_s, w.first_hit_at, w.first_miss_at, w.hits,
                ))
                w.exported = state
            horizon = w.warmed_at + (w.ttl_s if w.ttl_s else 86400.0)
            if now > horizon:
                done.append(w.key_hash_src)
        for k in done:
            agg.warmed.pop(k, None)

    def _export_early(self, now: float, side: dict) -> None:
        agg = self.aggregator
        closed = [w for w in agg.early if now > w.until]
        if not closed:
            return
        with agg._lock:
            agg.early = [w for w in agg.early if now <= w.until]
        h = self.hasher.hash
        for win in closed:
            for key, (first, n, fam) in list(win.seen.items()):
                side["early_keys"].append((win.run_id, h(key), fam, first, n))
            if win.overflow:
                agg.count_error("record", f"recall window of run {win.run_id} overflowed ({win.overflow} lookups)")

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the flusher and flush what is left (everything settled)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        # Close recall windows that are still open so nothing is lost.
        for w in self.aggregator.early:
            w.until = min(w.until, self.clock())
        self._final = True
        self.flush(settle=True)
        if self.otel is not None:
            self.otel.shutdown()
        if self.redis_sink is not None:
            self.redis_sink.close()


_POINT_FRAMES = ("lookups", "writes", "requests", "histograms", "gauges")
_RUN_COLS = ("run_id", "replica", "tenant", "layer", "strategy", "trigger", "started", "ended",
             "status", "keys", "bytes", "gpu_s", "memory_bytes", "error")

def flush_together(telemetries: list[Telemetry], now: float | None = None) -> None:
    """Flush pipelines that share one store in one transaction each store.

    For many pipelines in one process (the simulator's replicas): one commit
    per flush instead of one per pipeline. Never raises.
    """
    groups: dict[int, list[Telemetry]] = defaultdict(list)
    for t in telemetries:
        groups[id(t.store)].append(t)
    for group in groups.values():
        store = group[0].store
        merged: dict[str, list] = defaultdict(list)
        staged: list[tuple[Telemetry, dict]] = []
        for t in group:
            try:
                with t._flush_lock:
                    sb, rb, new_last = t._collect(t.clock() if now is None else now, not t.background)
                    if t.redis_sink is not None:
                        t._write_sink("redis", t.redis_sink.write, rb, t._pending_redis)
                    for k, v in t._stage(sb, t._pending_store).items():
                        merged[k].extend(v)
                    staged.append((t, new_last))
            except Exception as e:
                t.aggregator.count_error("flush", "flush", e)
        if store is None or not merged:
            continue
        try:
            store.write(merged)
        except Exception as e:
            for t, _ in staged:
                t._failed("store", e, t._pending_store)
            continue
        for t, new_last in staged:
            t._last.update(new_last)
            t._pending_store.clear()


_installed: Telemetry | None = None
_install_lock = threading.Lock()


def setup(config: CollectorConfig | None = None, **overrides: Any) -> Telemetry:
    """Build the process-wide pipeline (replacing an earlier one) and return it."""
    global _installed
    clock = overrides.pop("clock", time.time)
    background = overrides.pop("background", True)
    meter_provider = overrides.pop("meter_provider", None)
    redis_client = overrides.pop("redis_client", None)
    store = overrides.pop("store", None)
    if config is None:
        cfg = CollectorConfig.load(**overrides)
    else:
        cfg = CollectorConfig._from_raw({**config.as_dict(), **overrides}) if overrides else config
    tel = Telemetry(cfg, clock=clock, meter_provider=meter_provider, redis_client=redis_client,
                    store=store, background=background)
    with _install_lock:
        old, _installed = _installed, tel
    if old is not None:
        old.close()
    return tel


def current_telemetry() -> Telemetry:
    """The installed pipeline; built from the environment on first use."""
    global _installed
    if _installed is None:
        with _install_lock:
            if _installed is None:
                _installed = Telemetry(CollectorConfig.load())
    return _installed


def shutdown() -> None:
    global _installed
    with _install_lock:
        tel, _installed = _installed, None
    if tel is not None:
        tel.close()


atexit.register(shutdown)
