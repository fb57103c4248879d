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
import itertools
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from warmscope.model import records, schema
from warmscope.model.records import R_REQUESTS, RUN_COLUMNS

from .aggregator import H_COUNT, H_SUM, HISTOGRAMS, Aggregator
from .config import CollectorConfig, ConfigError
from .context import INTERNAL, RequestContext, _current, set_installed_telemetry
from .hotkeys import E_ERR, E_FAMILY, E_HITS, E_MISSES
from .keys import KeyHasher, TenantBucketer
from .store import EmbeddedStore, histogram_row

if TYPE_CHECKING:
    from .otel import OTelBridge
    from .redis_sink import RedisSink
    from .warmup import WarmupRun

__all__ = ["Telemetry", "setup", "current_telemetry", "shutdown", "flush_together"]

log = logging.getLogger("warmscope.collectors")

_CHUNK_ROWS = 20_000  # rows per backlog chunk: one sink write, retried with its batch id
_STORE_TXN_ROWS = 100_000  # backlog rows carried by the flush's own store transaction
_UNIT_FRAMES = ("ab_units", "ab_lookups")  # a unit's rows: queued, written and dropped together
_STARTUP_LOCK_WAIT_S = 0.25  # a store locked at start-up is retried by the flusher, not waited for
_DECIDED_S = 10.0  # a unit's rows kept or dropped: its rows of the next flushes follow suit
_CLOSE_GRACE_S = 5.0  # close(): for a write in flight at the deadline to end (it starts no other)
_POLL_S = 1.0  # the background flusher polls the hooks that ask for it this often (run followers)


class Backlog:
    """Rows kept for a sink: bounded on the way in, in chunks with stable ids.

    ``add`` keeps at most ``limit`` rows and returns how many it had to drop
    (the caller counts them). An A/B unit's rows (its request row and its
    per-layer lookups) go into one chunk, and are kept or dropped together.
    Each chunk gets a batch id when it is formed and keeps it across retries,
    so a sink that records applied ids (Redis) can skip a chunk it already
    applied before a timeout.
    """

    def __init__(self, limit: int, chunk: int = _CHUNK_ROWS) -> None:
        self.limit = int(limit)
        self.chunk = max(1, int(chunk))
        self.chunks: deque[list[Any]] = deque()  # [batch id, {frame: rows}, n]
        self.tried: set[str] = set()  # batch ids sent to a sink that may apply part of them
        # units whose rows were kept or dropped lately, oldest first: (kept, monotonic time)
        self._recent: dict[tuple[Any, ...], tuple[bool, float]] = {}
        self._refused_until = 0.0  # a unit was dropped lately: look for its later rows
        self.n = 0
        self._prefix = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._seq = 0

    def add(self, batches: dict[str, list[Any]]) -> int:
        now = time.monotonic()
        dropped = self._drop_refused(batches, now) if self._refused_until > now else 0
        room = max(0, self.limit - self.n)
        total = sum(len(v) for v in batches.values())
        if total <= min(room, self.chunk):  # the usual flush: one chunk, nothing to split
            rows = {k: list(v) for k, v in batches.items() if v}
            if rows:
                self._push(rows, total)
                self._note(rows, now)
            return dropped
        gone: set[tuple[Any, ...]] = set()  # units dropped whole
        spare = max(1024, self.limit // 100)  # over the bound: a unit kept just before
        for chunk in self._split(batches, -(-total // self.chunk)):
            n = sum(len(v) for v in chunk.values())
            if n <= room:
                self._push(chunk, n)
                self._note(chunk, now)
                room -= n
                continue
            # the backlog is full: whole units (and other rows) while they fit, the rest dropped;
            # a unit whose rows of the flush before were kept gets a little room over the bound
            kept: dict[str, list[Any]] = {}
            kept_n = 0
            for k, rows, m in self._groups(chunk):
                unit = rows[0][1][0][:3] if k is None else None
                if m > room:
                    d = self._recent.get(unit) if unit is not None else None
                    if d is not None and d[0] and now - d[1] <= _DECIDED_S and m <= spare:
                        spare -= m
                    else:
                        dropped += m
                        if unit is not None:
                            gone.add(unit)
                        continue
                else:
                    room -= m
                kept_n += m
                for f, r in rows if k is None else ((k, rows),):
                    kept.setdefault(f, []).extend(r)
            if kept_n:
                self._push(kept, kept_n)
                self._note(kept, now)
        if gone:
            dropped += self._purge(gone)
            for unit in gone:
                self._remember(unit, False, now)
            self._refused_until = now + _DECIDED_S
        return dropped

    def _note(self, rows: dict[str, list[Any]], now: float) -> None:
        """Remember the units whose rows were just kept (see ``add``): each unit once (a unit has
        a row per cache layer it read, and its unit row)."""
        units = dict.fromkeys(r[:3] for f in _UNIT_FRAMES for r in rows.get(f, ()))
        for unit in units:
            self._remember(unit, True, now)

    def _remember(self, unit: tuple[Any, ...], kept: bool, now: float) -> None:
        rec = self._recent
        rec.pop(unit, None)
        rec[unit] = (kept, now)
        if len(rec) > 2 * self.limit + 1024:  # the oldest half goes
            for k in list(itertools.islice(rec, len(rec) // 2)):
                del rec[k]

    def _drop_refused(self, batches: dict[str, list[Any]], now: float) -> int:
        """Take out (in place) the rows of units dropped in the last ``_DECIDED_S``: a request
        that spanned a flush loses its later rows with its earlier ones; returns how many."""
        out = 0
        for f in _UNIT_FRAMES:
            rows = batches.get(f)
            if not rows:
                continue
            keep = []
            for r in rows:
                d = self._recent.get(r[:3])
                if d is not None and not d[0] and now - d[1] <= _DECIDED_S:
                    out += 1
                else:
                    keep.append(r)
            batches[f] = keep
        return out

    def _purge(self, gone: set[tuple[Any, ...]]) -> int:
        """Rows of the units in ``gone`` (just dropped) taken out of the chunks no sink has
        tried yet, so that a unit's earlier rows (a request that spanned a flush) do not reach
        the sink without its later ones; returns how many."""
        out = 0
        for c in self.chunks:
            if c[0] in self.tried:  # sent once: it may have been applied, it stays as it is
                continue
            for f in _UNIT_FRAMES:
                rows = c[1].get(f)
                if rows:
                    keep = [r for r in rows if r[:3] not in gone]
                    if len(keep) < len(rows):
                        c[1][f] = keep
                        c[2] -= len(rows) - len(keep)
                        out += len(rows) - len(keep)
        self.n -= out
        return out

    @staticmethod
    def _split(batches: dict[str, list[Any]], parts: int) -> list[dict[str, list[Any]]]:
        """``batches`` in ``parts`` chunks of about equal size; an A/B unit's rows (its request
        row and its lookups: ``ab_units`` and ``ab_lookups``, whose third value is the unit's
        hash) all go to the chunk its hash picks."""
        out: list[dict[str, list[Any]]] = [{} for _ in range(parts)]
        for f, rows in batches.items():
            if not rows:
                continue
            if f in _UNIT_FRAMES:
                lists: list[list[Any]] = [[] for _ in range(parts)]
                for r in rows:
                    lists[hash(r[2]) % parts].append(r)
            else:
                per = -(-len(rows) // parts)
                lists = [rows[i * per : (i + 1) * per] for i in range(parts)]
            for c, lst in zip(out, lists, strict=True):
                if lst:
                    c[f] = lst
        return [c for c in out if c]

    @staticmethod
    def _groups(batches: dict[str, list[Any]]) -> Iterator[tuple[str | None, Any, int]]:
        """Rows that are kept or dropped together: (frame, [row], 1) for a row of a frame
        outside the A/B units, (None, [(frame, rows), ...], n) for one A/B unit's rows."""
        units: dict[tuple[Any, ...], list[list[Any]]] = {}
        for f, rows in batches.items():
            if f not in _UNIT_FRAMES:
                for r in rows:
                    yield f, [r], 1
                continue
            j = _UNIT_FRAMES.index(f)
            for r in rows:
                g = units.get(r[:3])
                if g is None:
                    g = units[r[:3]] = [[], []]
                g[j].append(r)
        for u, lk in units.values():
            rows = [(f, r) for f, r in zip(_UNIT_FRAMES, (u, lk), strict=True) if r]
            yield None, rows, len(u) + len(lk)

    def _push(self, rows: dict[Any, Any], n: int) -> None:
        self._seq += 1
        self.chunks.append([f"{self._prefix}-{self._seq}", rows, n])
        self.n += n

    def pop(self) -> None:
        bid, _, n = self.chunks.popleft()
        self.tried.discard(bid)
        self.n -= n

    def clear(self) -> int:
        n, self.n = self.n, 0
        self.chunks.clear()
        self.tried.clear()
        return n

    def merged(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = defaultdict(list)
        for _, rows, _ in self.chunks:
            for k, v in rows.items():
                out[k].extend(v)
        return out

    def __len__(self) -> int:
        return self.n


def make_aggregator(cfg: CollectorConfig, clock: Callable[[], float]) -> Aggregator:
    """The in-process counters a :class:`Telemetry` records into, sized by ``cfg``."""
    return Aggregator(
        replica=cfg.replica,
        tenants=TenantBucketer(cfg.tenants, cfg.max_tenants),
        family_rules=cfg.family_rules,
        max_families=cfg.max_families,
        hot_keys_k=cfg.hot_keys_k,
        clock=clock,
        warmed_key_limit=cfg.warmed_key_limit,
        early_key_limit=cfg.early_key_limit,
        max_buffered_units=cfg.max_buffered_units,
        max_label_values=cfg.max_label_values,
        max_layers=cfg.max_layers,
        family_vocabulary=cfg.family_vocabulary,
    )


def open_redis_sink(cfg: CollectorConfig, client: Any, aggregator: Aggregator) -> RedisSink:
    """The Redis sink for hot keys, A/B units and warm-up runs (``client`` or ``cfg.redis_url``);
    raises what redis-py raises for a bad URL, or ImportError without redis-py."""
    from .redis_sink import RedisSink

    return RedisSink(client, cfg.redis_url, cfg.hot_key_ttl_s, aggregator)


def start_exporter(cfg: CollectorConfig, aggregator: Aggregator, meter_provider: Any) -> OTelBridge:
    """The OpenTelemetry bridge (otlp / prometheus exporters, or the given meter provider)."""
    from .otel import OTelBridge

    return OTelBridge(aggregator, cfg, meter_provider)


class Telemetry:
    """The pipeline one process records into: an :class:`Aggregator`, the sinks it flushes to
    (the embedded store, Redis) and the OpenTelemetry exporter. Each collaborator can be given
    (``aggregator``, ``store``, ``redis_sink``, ``exporter``); the ones not given are built from
    the configuration by :func:`make_aggregator`, :func:`open_redis_sink` and
    :func:`start_exporter`, and one that cannot be built is counted and logged, never raised."""

    def __init__(
        self,
        config: CollectorConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        meter_provider: Any = None,
        store: EmbeddedStore | None = None,
        redis_client: Any = None,
        background: bool = True,
        aggregator: Aggregator | None = None,
        redis_sink: RedisSink | None = None,
        exporter: OTelBridge | None = None,
    ) -> None:
        self.config = cfg = config or CollectorConfig.load()
        self.clock = clock
        self.aggregator = aggregator if aggregator is not None else make_aggregator(cfg, clock)
        self.default_context = RequestContext(self.aggregator)
        self._identity()
        self.background = background
        self.store = store
        self._open_sinks(cfg, redis_client, redis_sink, background)
        self._start_export(cfg, meter_provider, exporter)
        self._flush_state(cfg)
        # Called with the flush time before each flush (on the flusher's thread,
        # never a request's): e.g. collectors.run_follow's reader of runs recorded elsewhere.
        self.flush_hooks: list[Callable[[float], Any]] = []
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, name="warmscope-flush", daemon=True)
            self._thread.start()

    def _identity(self) -> None:
        """This process among those that write as cfg.replica: in the OTel resource
        (service.instance.id) and in Redis (the replica collision check)."""
        self.instance_id = f"{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(3)}"
        self.aggregator.instance_id = self.instance_id
        self.replica_collisions: set[str] = set()
        # False for a process that only records warm-up runs for a replica it does not serve
        # (`warmscope warmup --replica`): it neither counts as that replica's writer nor looks.
        self.serves_replica = True
        self._last_beat = -float("inf")
        self._secret: bytes | None = None
        self._hasher: KeyHasher | None = None

    def _open_sinks(
        self,
        cfg: CollectorConfig,
        redis_client: Any,
        redis_sink: RedisSink | None,
        background: bool,
    ) -> None:
        """The store and Redis. Metric points go to the store with the embedded exporter; hot
        keys, A/B units and warm-up runs go to Redis when configured, else the store. A sink
        that cannot be opened is counted and logged, never raised."""
        has_redis = bool(cfg.redis_url) or redis_client is not None or redis_sink is not None
        self._store_path = None
        if self.store is None and (
            cfg.exporter == "embedded" or (cfg.exporter != "none" and not has_redis)
        ):
            self._store_path = cfg.resolved_store_path()
            self._open_store(_STARTUP_LOCK_WAIT_S if background else None)
        self.points_to_store = (
            self.store is not None or self._store_path is not None
        ) and cfg.exporter in ("embedded", "none")
        self.aggregator.miss_bucket_s = float(cfg.flush_interval_s)
        self.aggregator.miss_to_store = self.points_to_store
        self.redis_sink = redis_sink
        if has_redis and redis_sink is None:
            try:
                self.redis_sink = open_redis_sink(cfg, redis_client, self.aggregator)
            except Exception as e:  # garbage URL, redis-py missing: keep serving, rows in memory
                self._setup_failed(
                    "redis",
                    f"cannot use Redis at {_redact(cfg.redis_url)!r} ({e}); hot keys, "
                    "A/B units and warm-up runs are dropped (counted) until the URL is fixed",
                )

    def _start_export(
        self, cfg: CollectorConfig, meter_provider: Any, exporter: OTelBridge | None
    ) -> None:
        """The OpenTelemetry bridge for the otlp and prometheus exporters (or a given meter
        provider, or a given bridge); a failure to start it is counted and logged, never
        raised."""
        self.otel = exporter
        if exporter is None and (
            meter_provider is not None or cfg.exporter in ("otlp", "prometheus")
        ):
            try:
                self.otel = start_exporter(cfg, self.aggregator, meter_provider)
            except Exception as e:
                self._setup_failed(
                    "export",
                    f"cannot start the {cfg.exporter} exporter ({e}); metrics are "
                    "kept in memory only",
                )

    def _flush_state(self, cfg: CollectorConfig) -> None:
        """What the flusher keeps between flushes: the last exported values, the backlogs of
        rows kept for retry, the side flush's clock and the hot keys read once so far."""
        self._last: dict[str, dict[Any, Any]] = {
            "lookups": {},
            "writes": {},
            "requests": {},
            "hist": {},
            "misses": {},
        }
        self._store_backlog = Backlog(cfg.max_pending_rows)
        self._redis_backlog = Backlog(cfg.max_pending_rows)
        self._flush_lock = threading.Lock()
        self._last_side = -float("inf")  # hot keys / units flush less often than points
        self._final = False
        # This hot-key window's keys, (scope, key) -> (window, entry): read once so far (the
        # entry), or exported (None); bounded to a few sketches' worth (_export_hot).
        self._singles: dict[tuple[int, str], tuple[float, list[Any] | None]] = {}
        self._singles_cap = 16 * self.aggregator.hot_cap  # sixteen sketches' worth
        self._deadline = float("inf")  # monotonic; set by close()
        self._abandoned = False  # set by close() once it counted what is left
        self._in_hand = 0  # side rows a flush took from the aggregator, not in a backlog yet
        self._stop = threading.Event()
        # Set by close() and by the aggregator when a quarter of max_buffered_units is buffered.
        self._wake = threading.Event()
        self.aggregator.on_units_filling = self._wake.set

    def _setup_failed(self, stage: str, message: str) -> None:
        self.aggregator.bump_error(stage)
        self.aggregator.first_time(stage)  # logged here: a later count_error stays quiet
        log.error("warmscope: %s", message)

    def _open_store(self, wait_s: float | None = None) -> bool:
        """Open the embedded store; on failure count it, keep rows in memory
        (bounded) and retry at the next flush. Never raises."""
        try:
            st = EmbeddedStore(
                self._store_path,  # type: ignore[arg-type]  # set when a store is configured
                timeout=wait_s if wait_s is not None else 5.0,
            )
            st.timeout = 5.0
            self.store = st
            return True
        except Exception as e:
            self.aggregator.bump_error("store")
            if self.aggregator.first_time("store"):
                log.error(
                    "warmscope: cannot open the embedded store: %s; rows are kept in memory (up to "
                    "max_pending_rows) and the store is retried at every flush",
                    e,
                )
            return False

    def pending_rows(self, stage: str) -> int:
        """Rows kept for retry for ``stage`` ("store" or "redis")."""
        return len(self._store_backlog if stage == "store" else self._redis_backlog)

    # ------------------------------------------------------------ helpers
    @property
    def hasher(self) -> KeyHasher:
        if self._hasher is None:
            self._hasher = KeyHasher(self.config.resolved_secret())
        return self._hasher

    def _secret_ready(self) -> bool:
        """Whether keys can be hashed now; if not, say why once, count it,
        and leave hot keys and unit records buffered (bounded) for the next flush."""
        if self._hasher is not None:
            return True
        try:
            _ = self.hasher  # the property builds the hasher, or raises ConfigError
            return True
        except ConfigError as e:
            self.aggregator.bump_error("config")
            if self.aggregator.first_time("secret"):
                log.error("warmscope: %s", e)
            return False

    def context(self) -> RequestContext:
        """The active request context, re-bound to this pipeline if needed."""
        ctx = _current.get()
        if ctx is None:
            return self.default_context
        if ctx._agg is not self.aggregator:
            return RequestContext(
                self.aggregator,
                ctx.tenant,
                ctx.unit,
                ctx.experiment,
                ctx.variant,
                ctx.model,
                ctx.prompt_tokens,
            )
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
                self.context(),
                ttft_s,
                latency_s,
                prompt_tokens,
                cached_tokens,
                float(gpu_s),
                sla_met,
                conversion,
                float(value),
            )
        except Exception as e:  # never break the host
            self.aggregator.count_error("record", "record_request", e)

    def record_misses(
        self,
        *,
        tenant: str,
        engine: str,
        family: str,
        classes: Mapping[str, int],
        ts: float | None = None,
    ) -> None:
        """One request's missed prompt tokens (prompt - cached) by why they missed.

        ``classes`` maps class names (``records.MISS_CLASSES``: elsewhere, evicted,
        isolated, drifted, cold, partial, unknown) to tokens; a name outside them
        counts as ``unknown``. ``engine`` is the replica that served the request,
        ``family`` the prompt's key family (never raw text). ``ts``: when the
        request was served (default: the flush that carries it). Cheap (one deque
        append), never raises; bad values are counted in
        ``warmscope.telemetry.errors{stage=record}`` when drained."""
        try:
            self.aggregator.record_misses(tenant, engine, family, classes, ts)
        except Exception as e:  # never break the host
            self.aggregator.count_error("record", "record_misses", e)

    def record_trace(self, row: Any) -> None:
        """One request's block chain for the block trace (a
        :class:`collectors.kv.attribution.TraceRow`, which the KV gateway hook hands on);
        written to the embedded store with the next flush. Same cost and guarantees as
        :meth:`record_misses`."""
        try:
            self.aggregator.record_trace(row)
        except Exception as e:  # never break the host
            self.aggregator.count_error("record", "record_trace", e)

    def record_kv_stats(
        self,
        *,
        engine: str,
        salt: str,
        stored: int,
        reused: int,
        evicted: int,
        resident: int,
        ts: float | None = None,
    ) -> None:
        """An engine's KV blocks for one (already hashed) cache salt: ``stored``,
        ``reused`` and ``evicted`` blocks since the previous call for this engine
        and salt (increments), ``resident`` blocks now. Same cost and guarantees
        as :meth:`record_misses`."""
        try:
            self.aggregator.record_kv_stats(engine, salt, stored, reused, evicted, resident, ts)
        except Exception as e:  # never break the host
            self.aggregator.count_error("record", "record_kv_stats", e)

    def record_gpu_memory(self, used_share: float) -> None:
        """The share (0-1) of GPU cache memory in use on this replica, now."""
        try:
            self.aggregator.set_gauge(schema.GPU_MEMORY.name, used_share)
        except Exception as e:
            self.aggregator.count_error("record", "gpu memory", e)

    def warmup(self, strategy: str, layer: str, **kw: Any) -> WarmupRun:
        """A :class:`collectors.warmup.WarmupRun` context manager bound to this pipeline."""
        from .warmup import WarmupRun

        return WarmupRun(self, strategy=strategy, layer=layer, **kw)

    # ------------------------------------------------------------- flushing
    def _loop(self) -> None:
        interval = self.config.flush_interval_s
        last = time.monotonic()
        # A high rate of new A/B units is handed to the sink at a quarter of
        # max_buffered_units, not dropped at the bound: the recording thread that
        # reaches the quarter wakes this one, which also looks every 0.1 s.
        polled = last
        while True:
            self._wake.wait(min(interval, 0.1))
            self._wake.clear()
            if self._stop.is_set():
                break
            if time.monotonic() - last >= interval or self._units_filling():
                last = polled = time.monotonic()
                self.flush(side=False)
            elif self.flush_hooks and time.monotonic() - polled >= _POLL_S:
                polled = time.monotonic()
                self._poll_hooks()

    def _poll_hooks(self) -> None:
        """Between flushes, every ``_POLL_S``: the flush hooks that ask to be polled (``poll``
        true: the followers of warm-up runs recorded elsewhere, so a run is followed within
        about a second of its end, not at the next flush). Skipped while a flush runs."""
        if not self._flush_lock.acquire(blocking=False):
            return
        token = INTERNAL.set(True)
        try:
            now = self.clock()
            for hook in list(self.flush_hooks):
                if getattr(hook, "poll", False):
                    try:
                        hook(now)
                    except Exception as e:
                        self.aggregator.count_error("flush", "flush hook", e)
        finally:
            INTERNAL.reset(token)
            self._flush_lock.release()

    def _units_filling(self) -> bool:
        return self.aggregator.units_buffered >= self.config.max_buffered_units // 4 > 0

    def flush(
        self, now: float | None = None, settle: bool | None = None, side: bool = True
    ) -> dict[str, int]:
        """Move what the aggregator holds to the sinks. Never raises.

        ``settle=True`` when no other thread is recording (virtual-time callers
        and shutdown); default: True without a background thread. Hot keys and
        A/B unit records go out on every explicit flush, and every
        ``side_flush_s`` from the periodic flusher (``side=False``).
        Redis commands issued here are warmscope's own: never counted as lookups.
        """
        token = INTERNAL.set(True)
        try:
            return self._flush_locked(now, settle, side)
        finally:
            INTERNAL.reset(token)

    def _flush_locked(self, now: float | None, settle: bool | None, side: bool) -> dict[str, int]:
        with self._flush_lock:
            try:
                return self._flush(
                    now, self.background is False if settle is None else settle, side
                )
            except Exception as e:
                self.aggregator.count_error("flush", "flush", e)
                return {}

    def _flush(self, now: float | None, settle: bool, side: bool = True) -> dict[str, int]:
        now = self.clock() if now is None else now
        for hook in [] if self._final else list(self.flush_hooks):
            try:
                hook(now)
            except Exception as e:
                self.aggregator.count_error("flush", "flush hook", e)
        self.aggregator.log_record_drops()
        store_b, redis_b, new_last = self._collect(now, settle, side)
        if self._abandoned:  # close() counted these rows as dropped while they were collected
            return {}
        written = {k: len(v) for k, v in store_b.items()}
        written.update({f"redis:{k}": len(v) for k, v in redis_b.items()})
        has_store = self.points_to_store or self._store_path is not None or self.store is not None
        points: dict[str, list[Any]] = {}
        if has_store:
            points = self._keep("store", self._store_backlog, store_b)
        elif any(store_b.get(k) for k in store_b if k not in _POINT_FRAMES):
            self.aggregator.count_dropped(
                "store", sum(len(v) for k, v in store_b.items() if k not in _POINT_FRAMES)
            )
        if self.redis_sink is not None:
            self._keep("redis", self._redis_backlog, redis_b)
        elif redis_b:
            self.aggregator.count_dropped("redis", sum(len(v) for v in redis_b.values()))
        self._in_hand = 0  # every row taken is in a backlog now, or counted
        if has_store:
            if self.store is None and self._store_path is not None:
                self._open_store()
            if self.store is not None and self._drain_store(points):
                self._last.update(new_last)
                if (
                    self.redis_sink is None
                ):  # (after a write that worked: a locked store counts once)
                    self._check_replica(now)
        if self.redis_sink is not None:
            self._drain_redis()
            self._check_replica(now)
        return written

    def _keep(self, stage: str, backlog: Backlog, batches: dict[Any, Any]) -> dict[str, list[Any]]:
        """Queue this flush's side rows behind the backlog (bounded, drops
        counted per row); return its metric points. Points are recomputed
        from cumulative totals, so they are never queued: an unwritten delta
        simply grows until it lands."""
        side = {k: v for k, v in batches.items() if k not in _POINT_FRAMES and v}
        dropped = backlog.add(side) if side else 0
        if dropped:
            self.aggregator.count_dropped(stage, dropped)
        return {k: batches[k] for k in _POINT_FRAMES if batches.get(k)}

    def _drain_store(self, points: dict[str, list[Any]]) -> bool:
        """Points plus queued chunks, oldest first; each transaction all or nothing."""
        bl = self._store_backlog
        points_done = False
        try:
            first: dict[str, list[Any]] = defaultdict(list, {k: list(v) for k, v in points.items()})
            taken = rows_in = 0
            for (
                _,
                rows,
                n,
            ) in bl.chunks:  # the first transaction carries a bounded share of the backlog
                if rows_in and rows_in + n > _STORE_TXN_ROWS:
                    break
                rows_in += n
                for k, v in rows.items():
                    first[k].extend(v)
                taken += 1
            if first:
                self.store.write(first)  # type: ignore[union-attr]  # called with a store open
            points_done = True
            for _ in range(taken):
                bl.pop()
            while bl.chunks and time.monotonic() < self._deadline and not self._abandoned:
                # the rest in transactions of up to _STORE_TXN_ROWS rows (a
                # transaction's fixed cost is large: A/B reads, rollups)
                batch: dict[str, list[Any]] = defaultdict(list)
                taken = rows_in = 0
                for _, rows, n in bl.chunks:
                    if rows_in and rows_in + n > _STORE_TXN_ROWS:
                        break
                    rows_in += n
                    taken += 1
                    for k, v in rows.items():
                        batch[k].extend(v)
                self.store.write(batch)  # type: ignore[union-attr]  # called with a store open
                for _ in range(taken):
                    bl.pop()
        except Exception as e:
            self._failed("store", e)
            return points_done
        return True

    def _check_replica(self, now: float) -> None:
        """Two live processes with one replica label (a misconfigured deployment, two
        workers of a pod) would overwrite each other's per-replica records (warm-up
        attribution): each process notes its instance id under its replica in Redis
        (else in the store it writes) at each flush, and one that sees another
        counts it (``config``) and says so."""
        if (
            self._final
            or not self.serves_replica
            or now - self._last_beat < self.config.flush_interval_s * 0.9
        ):
            return
        self._last_beat = now
        agg = self.aggregator
        try:
            alive = max(60.0, 3 * self.config.flush_interval_s)
            sink: Any = self.redis_sink if self.redis_sink is not None else self.store
            others = sink.heartbeat(agg.replica, self.instance_id, now, alive)
        except Exception as e:
            self._failed("redis" if self.redis_sink is not None else "store", e)
            return
        new = [o for o in others if o not in self.replica_collisions]
        if new:
            self.replica_collisions.update(new)
            agg.count_error(
                "config",
                f"replica {agg.replica!r} is also written by process(es) {', '.join(new)} "
                f"(this one is {self.instance_id}): per-replica warm-up attribution will be "
                "wrong; give each process its own WARMSCOPE_REPLICA",
            )

    def _drain_redis(self) -> None:
        bl = self._redis_backlog
        try:
            while bl.chunks:
                if time.monotonic() >= self._deadline or self._abandoned:
                    return
                bid, rows, _ = bl.chunks[0]
                bl.tried.add(bid)
                self.redis_sink.write(rows, batch_id=bid)  # type: ignore[union-attr]  # called with a sink
                if self._abandoned:  # close() counted this chunk already
                    return
                bl.pop()
        except Exception as e:
            if not self._abandoned:
                self._failed("redis", e)

    def _point_rows(
        self, now: float, store_b: dict[str, list[Any]], new_last: dict[str, dict[Any, Any]]
    ) -> None:
        """Metric points since the last written snapshot (deltas of cumulative totals)."""
        agg = self.aggregator
        for name, kind in (("lookups", "counts"), ("writes", "writes")):
            deltas, new_last[name] = agg.deltas(kind, self._last[name])
            store_b[name].extend((now, *k, d) for k, d in deltas.items() if d)
        cur = agg.request_totals()
        last = self._last["requests"]
        for k, v in cur.items():
            p = last.get(k, records.REQUEST_ZERO)
            if v[R_REQUESTS] != p[R_REQUESTS]:
                store_b["requests"].append((now, *k, *(a - b for a, b in zip(v, p, strict=True))))
        new_last["requests"] = {k: tuple(v) for k, v in cur.items()}
        hcur = agg.histogram_totals()
        last = self._last["hist"]
        for (i, labels), h in hcur.items():
            p = last.get((i, labels))
            if p is not None and p[H_COUNT] == h[H_COUNT]:
                continue
            dh = h if p is None else [a - b for a, b in zip(h, p, strict=True)]
            inst, bounds = HISTOGRAMS[i]
            store_b["histograms"].append(
                histogram_row(now, inst.name, labels, bounds, dh[:H_SUM], dh[H_SUM], dh[H_COUNT])
            )
        new_last["hist"] = {k: tuple(v) for k, v in hcur.items()}
        for name, gv in list(agg.gauges.items()):
            store_b["gauges"].append((now, name, agg.replica, gv))
        mrows, krows, new_last["misses"] = agg.miss_rows(now, self._last["misses"])
        store_b["misses"].extend(mrows)
        store_b["kv_blocks"].extend(krows)

    def _collect(
        self, now: float, settle: bool, take_side: bool = False
    ) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
        """Rows for the store and Redis since the last flush, and the new
        cumulative snapshot to remember once the store write succeeded."""
        agg = self.aggregator
        store_b: dict[str, list[Any]] = defaultdict(list)
        redis_b: dict[str, list[Any]] = defaultdict(list)
        side = redis_b if self.redis_sink is not None else store_b
        new_last: dict[str, dict[Any, Any]] = {}
        if self.points_to_store and self.store is not None:
            self._point_rows(now, store_b, new_last)
        trace = agg.take_trace_rows()
        if trace:  # the block trace goes to the embedded store only (a side frame: retried)
            store_b["block_trace"].extend(trace)

        hot: dict[int, dict[Any, Any]]
        units: dict[tuple[Any, ...], list[Any]]
        hot, units = {}, {}
        side_now = (
            take_side
            or self._final
            or now - self._last_side >= self.config.side_flush_s
            or self._units_filling()
        )
        if self.redis_sink is None and self.store is None and self._store_path is None:
            # No sink for hot keys, unit records or runs (exporter "none", or an
            # unusable configuration): nothing to hash; what was buffered is counted.
            if side_now:
                self._last_side = now
                hot, units = agg.take_buffers(settle or self._final)
                n = len(units) + sum(len(sk) for sk in hot.values()) + len(agg.events)
                agg.events.clear()
                agg.count_dropped("unsent", n)
            return store_b, redis_b, new_last
        if not self._secret_ready():  # nothing hashed leaves without the secret: buffered, retried
            if self._final:  # last chance: what cannot be hashed is dropped, and counted
                hot, units = agg.take_buffers(True)
                n = len(units) + sum(len(sk) for sk in hot.values()) + len(agg.warmed)
                n += sum(len(w.seen) for w in agg.early)
                agg.count_dropped("redis" if self.redis_sink is not None else "store", n)
            while agg.events:
                kind, rec = agg.events.popleft()
                side["warmup_runs"].append(tuple(rec.get(c) for c in RUN_COLUMNS))
            return store_b, redis_b, new_last
        if side_now:
            self._last_side = now
            hot, units = agg.take_buffers(settle or self._final)
            self._in_hand = len(units) + sum(len(sk) for sk in hot.values())
        if hot:
            self._export_hot(now, hot, side)
        if units:
            unit_hash, per_layer, per_unit = self.hasher.hash, side["ab_lookups"], side["ab_units"]
            for (exp, var, unit, layer), u in units.items():
                if layer:  # records.AB_LOOKUPS: keys, layer, lookups, hits
                    per_layer.append((exp, var, unit_hash(unit), layer, *u))
                else:  # records.AB_UNITS: keys, first_ts, last_ts, sums, histogram
                    per_unit.append((exp, var, unit_hash(unit), now, now, *u))
        while agg.events:
            kind, rec = agg.events.popleft()
            side["warmup_runs"].append(tuple(rec.get(c) for c in RUN_COLUMNS))
        if side_now:
            self._export_warmed(now, side)
        self._export_early(now, side)
        return store_b, redis_b, new_last

    def _export_hot(self, now: float, hot: dict[Any, Any], side: dict[Any, Any]) -> None:
        """Hot-key rows of one side flush. A key read once in a hot-key window is not hot, but a
        window spans many flushes (an hour, flushed every five minutes): a key read once in this
        flush waits in ``_singles`` for a second read in a later flush of the same window and is
        exported with both then; once exported, its later reads in the window are exported as
        they come (the store adds them to its row). A past window's singles are dropped."""
        agg = self.aggregator
        win = float(int(now // self.config.hot_key_window_s) * self.config.hot_key_window_s)
        singles = self._singles
        if any(w != win for w, _ in singles.values()):
            singles = self._singles = {k: v for k, v in singles.items() if v[0] == win}
        h = self.hasher.hash
        for hk, sk in hot.items():
            tenant, layer = agg.hot_scope(hk)
            for key, e in sk.items():
                first = singles.get((hk, key))
                if first is not None and first[1] is not None:  # read once before: add it
                    e = [*e]
                    for i in (E_HITS, E_MISSES, E_ERR):
                        e[i] += first[1][i]
                if first is None and e[E_HITS] + e[E_MISSES] < 2:
                    if len(singles) < self._singles_cap:
                        singles[(hk, key)] = (win, e)
                    continue
                if first is None or first[1] is not None:  # exported from now on in this window
                    if first is not None or len(singles) < self._singles_cap:
                        singles[(hk, key)] = (win, None)
                side["hot_keys"].append(
                    (win, tenant, layer, h(key), e[E_FAMILY], e[E_HITS], e[E_MISSES], e[E_ERR])
                )

    def _failed(self, stage: str, e: BaseException) -> None:
        if self._final:  # no next flush: close() counts what is left
            what = f"{stage} write failed at close; its rows are counted as dropped"
        else:
            what = f"{stage} write failed; rows kept for the next flush"
        self.aggregator.count_error(stage, what, e)

    def _export_warmed(self, now: float, side: dict[Any, Any]) -> None:
        agg = self.aggregator
        if not agg.warmed:
            return
        h = self.hasher.hash
        done = []
        for w in list(agg.warmed.values()):
            state = (w.first_hit_at, w.first_miss_at, w.hits)
            if state != w.exported:
                side["warmed_keys"].append(
                    (
                        w.run_id,
                        h(w.key_hash_src),
                        w.family,
                        w.tenant,
                        w.layer,
                        w.warmed_at,
                        w.ttl_s,
                        w.gpu_s,
                        w.first_hit_at,
                        w.first_miss_at,
                        w.hits,
                    )
                )
                w.exported = state
            horizon = w.warmed_at + (w.ttl_s if w.ttl_s else 86400.0)
            if now > horizon:
                done.append(w.key_hash_src)
        for k in done:
            agg.warmed.pop(k, None)

    def _export_early(self, now: float, side: dict[Any, Any]) -> None:
        agg = self.aggregator
        # At close every window goes (final() cut them at the clock, which a simulated clock
        # does not move past: ``now > until`` alone would leave them unexported, counted dropped)
        closed = [w for w in agg.early if now > w.until or self._final]
        if not closed:
            return
        with agg._lock:
            gone = {id(w) for w in closed}
            agg.early = [w for w in agg.early if id(w) not in gone]
        h = self.hasher.hash
        for win in closed:
            for key, (first, n, fam) in list(win.seen.items()):
                side["early_keys"].append((win.run_id, h(key), fam, first, n))
            if win.overflow:
                agg.count_error(
                    "record",
                    f"recall window of run {win.run_id} overflowed ({win.overflow} lookups)",
                )

    # ------------------------------------------------------------ lifecycle
    def close(self, timeout: float | None = None) -> None:
        """Stop the flusher and flush what is left (everything settled).

        Returns within about ``timeout`` (default ``close_timeout_s``) whatever the sinks do,
        plus the time a write already in flight takes to end (bounded by the sinks' own
        timeouts): no write starts after the deadline. Every row not written by then is counted
        as dropped (``warmscope.telemetry.dropped``) and the count is logged. A second call (at
        exit, after an explicit one) does nothing."""
        if self._stop.is_set():
            return
        budget = self.config.close_timeout_s if timeout is None else timeout
        end = time.monotonic() + budget
        self._deadline = end
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(0.0, end - time.monotonic()))

        def final() -> None:
            # Close recall windows that are still open so nothing is lost.
            for w in self.aggregator.early:
                w.until = min(w.until, self.clock())
            self._final = True
            self.flush(settle=True)

        t = threading.Thread(target=final, name="warmscope-close", daemon=True)
        t.start()
        t.join(timeout=max(0.0, end - time.monotonic()))
        late = t.is_alive()
        if late:  # past the deadline no write starts: the one in flight ends, then the flush
            t.join(timeout=_CLOSE_GRACE_S)
        stuck = t.is_alive()
        locked = self._flush_lock.acquire(timeout=0.0 if stuck else _CLOSE_GRACE_S)
        try:
            self._abandoned = True  # a flush still running writes nothing more
            left = self._count_unwritten(stuck)
        finally:
            if locked:
                self._flush_lock.release()
        n = sum(left.values())
        if late or n:
            what = ", ".join(f"{k} {v}" for k, v in left.items() if v) or "none"
            log.error(
                "warmscope: close() %s: %d rows not written, counted as dropped in "
                "warmscope.telemetry.dropped (%s)%s",
                f"stopped writing after {budget:.1f} s" if late else "could not write everything",
                n,
                what,
                "; a write that had not returned is counted too (if it still lands, those rows "
                "are delivered as well)"
                if stuck
                else "",
            )
        if self.otel is not None:
            self.otel.shutdown(max(0.1, end - time.monotonic()))
        if not stuck:  # a write still in flight keeps its connection and store
            if self.redis_sink is not None:
                self.redis_sink.close()
            if self.store is not None:
                try:
                    self.store.close()
                except Exception:
                    pass

    def _count_unwritten(self, in_flight: bool) -> dict[str, int]:
        """At close: count as dropped every row not written — what the backlogs keep, what a
        flush still running had taken (``in_flight``), and what the aggregator still holds —
        per stage; returns the counts."""
        agg = self.aggregator
        side = "redis" if self.redis_sink is not None else "store"
        left = {"store": self._store_backlog.clear(), "redis": self._redis_backlog.clear()}
        if in_flight:
            left[side] += self._in_hand
        self._in_hand = 0
        try:
            hot, units = agg.take_buffers(True)
            held = len(units) + sum(len(sk) for sk in hot.values()) + len(agg.events)
            held += sum(1 for w in list(agg.warmed.values()) if w.exported is None)
            held += sum(len(w.seen) for w in list(agg.early))
            agg.events.clear()
            agg.early = []
            left[side] += held
        except Exception as e:  # pragma: no cover - never raise from close
            agg.count_error("flush", "close", e)
        for stage, n in left.items():
            agg.count_dropped(stage, n)
        return left


_POINT_FRAMES = ("lookups", "writes", "requests", "histograms", "gauges", "misses", "kv_blocks")


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
        merged: dict[str, list[Any]] = defaultdict(list)
        staged: list[tuple[Telemetry, dict[Any, Any]]] = []
        for t in group:
            try:
                with t._flush_lock:
                    sb, rb, new_last = t._collect(
                        t.clock() if now is None else now, not t.background
                    )
                    if t.redis_sink is not None:
                        t._keep("redis", t._redis_backlog, rb)
                        t._drain_redis()
                    for k, v in t._keep("store", t._store_backlog, sb).items():
                        merged[k].extend(v)
                    for k, v in t._store_backlog.merged().items():
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
                t._failed("store", e)
            continue
        for t, new_last in staged:
            t._last.update(new_last)
            t._store_backlog.clear()


_installed: Telemetry | None = None
_install_lock = threading.Lock()


def _fallback(reason: str, clock: Callable[[], float] = time.time) -> Telemetry:
    """A pipeline that counts in memory and exports nothing: what the host
    gets when the configuration is unusable (the reason is logged once)."""
    log.error(
        "warmscope: %s; instrumentation keeps counting in memory but exports nothing until this is "
        "fixed (your service is not affected)",
        reason,
    )
    tel = Telemetry(
        CollectorConfig(exporter="none", key_secret="unconfigured"), clock=clock, background=False
    )
    tel.aggregator.bump_error("config")
    tel.aggregator.first_time("config")  # logged above
    return tel


def _build(config: CollectorConfig | None, overrides: dict[str, Any]) -> Telemetry:
    """setup() without the install; never raises."""
    clock = overrides.pop("clock", time.time)
    background = overrides.pop("background", True)
    meter_provider = overrides.pop("meter_provider", None)
    redis_client = overrides.pop("redis_client", None)
    store = overrides.pop("store", None)
    try:
        if config is None:
            cfg = CollectorConfig.load(**overrides)
        else:
            cfg = (
                CollectorConfig._from_raw({**config.as_dict(), **overrides})
                if overrides
                else config
            )
    except Exception as e:  # ConfigError names the key; anything else is a bug not to raise
        return _fallback(f"configuration error: {e}", clock)
    try:
        return Telemetry(
            cfg,
            clock=clock,
            meter_provider=meter_provider,
            redis_client=redis_client,
            store=store,
            background=background,
        )
    except Exception as e:  # pragma: no cover - every sink guards itself; last line of defence
        return _fallback(f"cannot start the pipeline: {type(e).__name__}: {e}", clock)


def setup(config: CollectorConfig | None = None, **overrides: Any) -> Telemetry:
    """Build the process-wide pipeline and return it. Never raises.

    Idempotent: called again with the same configuration (and no injected
    objects) it returns the installed pipeline; with a different one it closes
    the old pipeline first (so a scrape port is free again) and builds anew.
    A bad configuration gives a pipeline that counts in memory and exports
    nothing, and one clear log line."""
    global _installed
    injected = any(
        overrides.get(k) is not None for k in ("clock", "meter_provider", "redis_client", "store")
    )
    with _install_lock:
        old = _installed
        if old is not None and not injected:
            try:
                if config is None:
                    plain = {k: v for k, v in overrides.items() if k != "background"}
                    want = CollectorConfig.load(**plain)
                else:
                    want = (
                        CollectorConfig._from_raw({**config.as_dict(), **overrides})
                        if overrides
                        else config
                    )
                if want == old.config and overrides.get("background", True) == old.background:
                    return old
            except Exception:
                pass
        _installed = None
    if old is not None:
        try:
            old.close()
        except Exception as e:  # pragma: no cover
            log.error("warmscope: closing the previous pipeline failed: %s", e)
    tel = _build(config, dict(overrides))
    with _install_lock:
        _installed = tel
    return tel


def current_telemetry() -> Telemetry:
    """The installed pipeline; built from the environment on first use. Never raises."""
    global _installed
    if _installed is None:
        with _install_lock:
            if _installed is None:
                _installed = _build(None, {})
    return _installed


set_installed_telemetry(current_telemetry)


def shutdown() -> None:
    global _installed
    with _install_lock:
        tel, _installed = _installed, None
    if tel is not None:
        try:
            tel.close()
        except Exception as e:  # pragma: no cover - never raise at exit
            log.error("warmscope: shutdown failed: %s", e)


def _redact(url: str) -> str:
    """A URL without its password, for messages."""
    import re

    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url or "")


atexit.register(shutdown)
