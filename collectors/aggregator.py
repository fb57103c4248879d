"""The per-process aggregator: the only thing the cache hot path touches.

A lookup costs a few dict operations on the calling thread's own state — no
lock, no I/O, no OpenTelemetry call. Exporters read the aggregator later:
OpenTelemetry observable instruments in their callbacks, the embedded store
and Redis sinks in the periodic flush.

Why per-thread state: ``d[k] += 1`` on a shared dict can lose counts between
threads, and a lock costs about as much as the rest of the lookup. Each thread
owns its dicts, so its increments are exact; readers copy them (``dict.copy``
runs without releasing the GIL) and sum. Cumulative counters are never reset,
so they are exact; the hot-key sketches and A/B unit records are swapped out at
flush by the owning thread itself (the flusher raises a flag that the next
record on that thread answers), so no increment is in flight on a buffer being
read.

Label sets are interned to small ints when a request context is set or a
wrapper is bound, so the per-lookup key is ``(ctx_id, layer_id, family,
result)`` and all label work is paid at export.

The aggregator is split along its steps: this module holds the counters
(lookups, writes, requests, histograms, A/B unit records) and the hand-off of
per-thread buffers; :mod:`collectors.hotkeys` the hot-key sketch;
:mod:`collectors.warm_tracking` warm-up precision and recall. Record layouts
(label order, unit record fields) come from :mod:`collectors.records`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from warmscope.collectors import hotkeys
from warmscope.model import records, schema
from warmscope.model.records import (
    L_LOOKUPS,
    R_CONVERSIONS,
    R_GPU_S,
    R_REQUESTS,
    R_UNMEASURED,
    R_VALUE,
    U_CONVERSIONS,
    U_GPU_S,
    U_HIST,
    U_LATENCY_SQ,
    U_LATENCY_SUM,
    U_REQUESTS,
    U_SLA_MET,
    U_TTFT_SUM,
    U_VALUE,
)

from .hotkeys import BATCH as _BATCH
from .hotkeys import MAX_LAYER_ID as _MAX_LAYER_ID
from .hotkeys import HotKeySketch
from .keys import DEFAULT_VOCABULARY, FamilyNormaliser, LabelCap, TenantBucketer
from .labels import WARMUP_VOCABULARY
from .miss_counts import MissTracking
from .warm_tracking import EarlyWindow, WarmedKey, WarmupTracking

__all__ = [
    "Aggregator",
    "LayerBinding",
    "WarmedKey",
    "EarlyWindow",
    "HIT",
    "MISS",
    "BYPASS",
    "ERROR",
]

log = logging.getLogger("warmscope.collectors")

HIT, MISS, BYPASS, ERROR = 0, 1, 2, 3
RESULT_NAMES = schema.RESULTS

HISTOGRAMS = schema.HISTOGRAMS  # request histograms, in the order of the per-(labels) list
LOAD_HIST = 4
_TTFT_BOUNDS, _DURATION_BOUNDS, _TOKEN_BOUNDS, _CACHED_BOUNDS = (b for _, b in HISTOGRAMS[:4])
# An in-memory histogram is [bucket counts..., +Inf count, sum, count]: its last two slots.
H_SUM, H_COUNT = -2, -1
# Per-unit latency histogram (A/B quantiles) uses the request-duration buckets.
UNIT_BUCKETS = records.UNIT_BUCKETS
# The request-level A/B unit record is records.UNIT_SUMS then the histogram
# (indices records.U_*); per layer, a unit keeps (lookups, hits) packed in
# one int. UNIT_FIELDS: the per-layer fields then the request-level ones.
UNIT_FIELDS = records.UNIT_FIELDS
_NU = U_HIST


class _ThreadState:
    """One thread's counters for one layer (or, layer -1, its request records)."""

    __slots__ = (
        "layer_id",
        "counts",
        "writes",
        "hot",
        "hbuf",
        "units",
        "req",
        "hist",
        "hrow",
        "swap",
        "unanswered",
        "outbox",
        "lock",
        "dropped",
    )

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id
        self.swap = False  # set by the flusher: hand the swappable buffers over
        self.unanswered = 0.0  # monotonic time of the request, for idle threads
        self.outbox: list[tuple[dict[Any, Any], dict[Any, Any]]] = []
        self.lock = threading.Lock()  # hand-off vs. forced take; never on the lookup path
        self.counts: dict[tuple[Any, ...], int] = {}  # (ctx id, family, result) -> n
        self.writes: dict[tuple[Any, ...], int] = {}  # (ctx id, family) -> n
        self.hot: dict[
            int, dict[Any, Any]
        ] = {}  # tenant id -> sketch {key: [est, hits, misses, err, family, key]}
        self.hbuf: dict[
            int, tuple[list[Any], list[Any]]
        ] = {}  # tenant id -> (hit keys, miss keys) not yet sketched
        # an int per layer unit (pack_layer_unit), a bytearray per request unit
        self.units: dict[tuple[Any, ...], Any] = {}
        self.req: dict[tuple[Any, ...], list[Any]] = {}
        self.hist: dict[tuple[Any, ...], list[Any]] = {}
        self.hrow: dict[
            int, list[Any]
        ] = {}  # ctx id -> its request histograms of hist (record_request)
        self.dropped = 0  # unit records not kept (max_buffered_units reached)


class LayerBinding:
    """Set up once per layer: its id, family normaliser and per-thread state."""

    __slots__ = ("layer", "layer_id", "families", "memo", "length_buckets", "tls")

    def __init__(
        self, layer: str, layer_id: int, families: FamilyNormaliser, length_buckets: bool
    ) -> None:
        self.layer = layer
        self.layer_id = layer_id
        self.families = families
        self.memo = families._memo  # read directly on the hot path
        self.length_buckets = length_buckets
        self.tls = threading.local()


class Aggregator(HotKeySketch, WarmupTracking, MissTracking):
    def __init__(
        self,
        replica: str = "replica-0",
        tenants: TenantBucketer | None = None,
        family_rules: Iterable[tuple[str, str]] = (),
        max_families: int = 256,
        hot_keys_k: int = 100,
        clock: Callable[[], float] = time.time,
        warmed_key_limit: int = 200_000,
        early_key_limit: int = 50_000,
        max_buffered_units: int = 200_000,
        max_label_values: int = 64,
        max_layers: int = 256,
        family_vocabulary: Iterable[str] = (),
    ) -> None:
        self.replica = replica
        self.instance_id = ""  # this process among those writing as replica (set by the pipeline)
        self.tenants = tenants or TenantBucketer()
        self.clock = clock
        self._family_rules = tuple(family_rules)
        self._family_vocab = tuple(family_vocabulary)
        self._max_families = max_families
        self.hot_k = hot_keys_k
        # Slack above K makes compaction rare: amortised O(1) per new key.
        self._hot_cap = hot_keys_k + max(hot_keys_k, 1024)
        self.warmed_key_limit = warmed_key_limit
        self.early_key_limit = early_key_limit
        # Hard bounds enforced on the way in; what does not fit is counted per row.
        self.max_buffered_units = max_buffered_units
        # Called (once per take, by the recording thread that reaches a quarter of the bound)
        # to wake the flusher, so a burst of new units is handed off without waiting for its
        # next look; set by the pipeline. Must be cheap and never raise (an Event's set).
        self.on_units_filling: Callable[[], object] | None = None
        self._fill_mark = max_buffered_units // 4
        self._units_n = (
            0  # unit records buffered since the last take (approximate under races: a bound)
        )
        # A unit's records of one request stay together: the recent decision per unit (kept,
        # dropped; monotonic time), oldest first, bounded (see _admit).
        self._decided: dict[tuple[Any, ...], tuple[bool, float]] = {}
        self.dropped: dict[
            str, int
        ] = {}  # stage -> rows dropped by the flusher (see dropped_counts)
        self.max_layers = min(int(max_layers), _MAX_LAYER_ID)
        words = WARMUP_VOCABULARY | DEFAULT_VOCABULARY | frozenset(self._family_vocab)
        self._caps = {
            k: LabelCap(max_label_values, vocabulary=words if k in _VOCAB else None)
            for k in _CAPPED
        }
        self._lock = threading.Lock()
        self._req_tls = threading.local()
        self._states: list[_ThreadState] = []
        # Recorders that buffer observations (each adds them here when called):
        # run before any per-thread state is read, so every read sees them.
        self.drains: list[Callable[[], None]] = []
        # taken from idle threads
        self._retired: list[tuple[float, int, dict[Any, Any], dict[Any, Any], dict[Any, Any]]] = []
        # Interned label sets.
        self._ctx_ids: dict[tuple[Any, ...], int] = {}
        self._ctx_labels: list[tuple[Any, ...]] = []
        self._layers: dict[str, LayerBinding] = {}
        self._layer_names: list[str] = []
        self._bindings: list[LayerBinding] = []
        # raw series key -> label tuple (bounded by series)
        self._label_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._tenant_ids: dict[str, int] = {}
        self._tenant_names: list[str] = []
        self._hot_floor: dict[int, int] = {}
        self._init_tracking()  # warm-up precision and recall (warm_tracking)
        self._init_misses(max_label_values)  # prefix-KV miss classes and block counts (miss_counts)
        self.errors: dict[str, int] = {s: 0 for s in schema.TELEMETRY_STAGES}
        self.gauges: dict[str, float] = {}  # last value per gauge name
        self.cross_tenant: dict[str, int] = {}  # layer -> (key, extra tenant) pairs seen
        self._logged: set[str] = set()

    # ---------------------------------------------------------------- setup
    def bind_layer(self, layer: str, length_buckets: bool | None = None) -> LayerBinding:
        with self._lock:
            b = self._layers.get(layer)
            if b is None and len(self._layer_names) >= self.max_layers:
                layer = (
                    schema.OTHER
                )  # ids stay below 4096: hot-key scopes pack the layer id in 12 bits
                self._caps["layer"].overflow += 1
                b = self._layers.get(layer)
            if b is None:
                if length_buckets is None:
                    length_buckets = records.layer(layer).length_buckets
                b = LayerBinding(
                    layer,
                    len(self._layer_names),
                    FamilyNormaliser(
                        self._family_rules, self._max_families, vocabulary=self._family_vocab
                    ),
                    bool(length_buckets),
                )
                self._layers[layer] = b
                self._layer_names.append(layer)
                self._bindings.append(b)
            return b

    def intern_context(
        self, tenant: str, experiment: str, variant: str, model: str, length_bucket: str
    ) -> tuple[int, int, int]:
        """Ids for a request's label set: (with length bucket, without, tenant id)."""
        out = []
        for lb in (length_bucket, ""):
            labels = (tenant, experiment, variant, model, lb)  # _CTX order
            cid = self._ctx_ids.get(labels)
            if cid is None:
                with self._lock:
                    cid = self._ctx_ids.get(labels)
                    if cid is None:
                        cid = len(self._ctx_labels)
                        self._ctx_labels.append(labels)
                        self._ctx_ids[labels] = cid
            out.append(cid)
        tid = self._tenant_ids.get(tenant)
        if tid is None:
            with self._lock:
                tid = self._tenant_ids.setdefault(tenant, len(self._tenant_names))
                if tid == len(self._tenant_names):
                    self._tenant_names.append(tenant)
        return out[0], out[1], tid

    def _state(self, tls: threading.local, layer_id: int) -> _ThreadState:
        st = _ThreadState(layer_id)
        tls.s = st
        with self._lock:
            self._states.append(st)
        return st

    # ------------------------------------------------------------ hot path
    def record_lookup(self, b: LayerBinding, key: object, result: int, ctx: Any) -> None:
        """Count one lookup. ``ctx`` is the active RequestContext (or the default)."""
        try:
            st = b.tls.s
        except AttributeError:
            st = self._state(b.tls, b.layer_id)
        if st.swap:
            self._hand_off(st)
        if result > MISS:  # bypass / error: counted, not tracked per key
            fam = b.memo.get(key) or b.families.family(key)
            k = (ctx.cid if b.length_buckets else ctx.cid0, fam, result)
            st.counts[k] = st.counts.get(k, 0) + 1
            return
        fam = b.memo.get(key) or b.families.family(key)
        k = (ctx.cid if b.length_buckets else ctx.cid0, fam, result)
        c = st.counts
        c[k] = c.get(k, 0) + 1
        # Hot keys: append now, sketch in batches (collections.Counter runs in
        # C, and the per-key sketch work is paid once per distinct key).
        hb = st.hbuf.get(ctx.tid)
        if hb is None:
            hb = st.hbuf[ctx.tid] = ([], [])
        lst = hb[result]
        lst.append(key)
        if len(lst) >= _BATCH:
            self._sketch(b.layer_id, st.hot, st.hbuf)
        if ctx.ukey is not None:
            self._add_unit(st, ctx, _HIT_INC if result == HIT else 1)
        if self.warmed:
            w = self.warmed.get(key)
            if w is not None:
                self._warmed_read(w, result)
        if self.early:
            self._early_read(b, key, fam, ctx)

    def record_tokens(self, b: LayerBinding, key: object, hits: int, misses: int, ctx: Any) -> None:
        """One request's prefix-cache use measured in tokens (an engine reports
        ``cached_tokens`` of ``prompt_tokens``): ``hits`` hit and ``misses``
        missed lookups of ``key``'s family, one hot-key read and one warmed/early
        read (a hit when any token hit), the unit's lookups and hits in tokens."""
        try:
            st = b.tls.s
        except AttributeError:
            st = self._state(b.tls, b.layer_id)
        if st.swap:
            self._hand_off(st)
        fam = b.memo.get(key) or b.families.family(key)
        cid = ctx.cid if b.length_buckets else ctx.cid0
        c = st.counts
        if hits > 0:
            k = (cid, fam, HIT)
            c[k] = c.get(k, 0) + hits
            result = HIT
        else:
            result = MISS
        if misses > 0:
            k = (cid, fam, MISS)
            c[k] = c.get(k, 0) + misses
        hb = st.hbuf.get(ctx.tid)
        if hb is None:
            hb = st.hbuf[ctx.tid] = ([], [])
        lst = hb[result]
        lst.append(key)
        if len(lst) >= _BATCH:
            self._sketch(b.layer_id, st.hot, st.hbuf)
        if ctx.ukey is not None:  # here in tokens
            self._add_unit(st, ctx, pack_layer_unit(hits + misses, hits))
        if self.warmed:
            w = self.warmed.get(key)
            if w is not None:
                self._warmed_read(w, result)
        if self.early:
            self._early_read(b, key, fam, ctx)

    def _add_unit(self, st: _ThreadState, ctx: Any, inc: int) -> None:
        """Add ``inc`` (see :func:`pack_layer_unit`) to a unit's lookups and
        hits in this layer: one int per unit, no container for the GC to walk."""
        ukey = ctx.ukey
        u = st.units.get(ukey)
        if u is None:
            if self._admit(ctx):
                st.units[ukey] = inc
            else:
                st.dropped += 1
        else:
            st.units[ukey] = u + inc

    def _admit(self, ctx: Any) -> bool:
        """Whether the new record of a request's unit (``ctx.ukey``; its first in this thread's
        buffer since the take) is kept. Below ``max_buffered_units`` it is, unless the unit's
        records were dropped in the last ``_DECIDED_S``; at the bound it is only if the unit had
        records kept then. So the lookups and the request record of one request are kept or
        dropped together, even when a take (a flush) falls between them: the request's context
        holds its decision (the decisions kept for units across requests are bounded, and a flood
        of new units can push one out between a request's lookup and its request record)."""
        now = time.monotonic()
        d = ctx.decided
        if d is None or now - d[1] > _DECIDED_S:
            d = self._decided.get(ctx.ukey)
            if d is not None and now - d[1] > _DECIDED_S:
                d = None
        if d is not None and not d[0]:
            return False
        if d is None and self._units_n >= self.max_buffered_units:
            self._decide(ctx, False, now)
            return False
        self._units_n += 1
        if self._units_n == self._fill_mark and self.on_units_filling is not None:
            self.on_units_filling()
        if d is None:
            self._decide(ctx, True, now)
        return True

    def _decide(self, ctx: Any, kept: bool, now: float) -> None:
        ctx.decided = (kept, now)
        ukey = ctx.ukey
        dec = self._decided
        dec.pop(ukey, None)
        dec[ukey] = (kept, now)
        if len(dec) > 2 * self.max_buffered_units + 1024:  # the oldest half goes
            try:
                for k in list(itertools.islice(dec, len(dec) // 2)):
                    dec.pop(k, None)
            except RuntimeError:  # another thread changed it meanwhile: pruned next time
                pass

    def record_write(self, b: LayerBinding, key: object, ctx: Any, n: int = 1) -> None:
        try:
            st = b.tls.s
        except AttributeError:
            st = self._state(b.tls, b.layer_id)
        k = (ctx.cid0, b.families.family(key))
        st.writes[k] = st.writes.get(k, 0) + n

    def _hand_off(self, st: _ThreadState) -> None:
        """Run by the owning thread: sketch what is buffered, move it to the outbox."""
        with st.lock:
            if not st.swap:  # the flusher took the buffers meanwhile
                return
            if st.layer_id >= 0 and st.hbuf:
                self._sketch(st.layer_id, st.hot, st.hbuf)
            st.outbox.append((st.hot, st.units))
            st.hot, st.units = {}, {}
            st.swap = False

    def record_load(self, b: LayerBinding, seconds: float, ctx: Any) -> None:
        """Time to load a value after a miss, per layer (feature load latency)."""
        try:
            st = b.tls.s
        except AttributeError:
            st = self._state(b.tls, b.layer_id)
        hk = (LOAD_HIST, ctx.cid0)
        h = st.hist.get(hk)
        if h is None:
            h = st.hist[hk] = [0] * (len(UNIT_BUCKETS) + 3)
        h[bisect.bisect_left(UNIT_BUCKETS, seconds)] += 1
        h[H_SUM] += seconds
        h[H_COUNT] += 1

    def set_gauge(self, name: str, value: float) -> None:
        self.gauges[name] = float(value)

    # ------------------------------------------------------- request records
    def record_request(
        self,
        ctx: Any,
        ttft_s: float | None,
        latency_s: float | None,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        gpu_s: float,
        sla_met: bool | None,
        conversion: bool | None,
        value: float,
        unmeasured: bool = False,
    ) -> None:
        """One request. ``unmeasured``: an LLM request whose token usage was not
        reported (counted apart: token hit rates leave it out)."""
        try:
            st = self._req_tls.s
        except AttributeError:
            st = self._state(self._req_tls, -1)
        if st.swap:
            self._hand_off(st)
        rk = (ctx.cid0, "" if sla_met is None else ("true" if sla_met else "false"))
        r = st.req.get(rk)
        if r is None:
            r = st.req[rk] = list(records.REQUEST_ZERO)
        r[R_REQUESTS] += 1
        r[R_GPU_S] += gpu_s
        if unmeasured:
            r[R_UNMEASURED] += 1
        if conversion:
            r[R_CONVERSIONS] += 1
            r[R_VALUE] += value
        # The four request histograms of this label set, found with one dict
        # probe (the lists are st.hist's own; a slot is None until first used).
        # Written out rather than looped: a loop over the four measured 0.3-0.4 µs
        # more per request (2.3 -> 2.7 µs for this method).
        hs = st.hrow.get(ctx.cid0)
        if hs is None:
            hs = st.hrow[ctx.cid0] = [None] * 4
        if ttft_s is not None:
            h = hs[0] or self._request_hist(st, hs, 0, ctx.cid0)
            h[bisect.bisect_left(_TTFT_BOUNDS, ttft_s)] += 1
            h[H_SUM] += ttft_s
            h[H_COUNT] += 1
        if latency_s is not None:
            h = hs[1] or self._request_hist(st, hs, 1, ctx.cid0)
            h[bisect.bisect_left(_DURATION_BOUNDS, latency_s)] += 1
            h[H_SUM] += latency_s
            h[H_COUNT] += 1
        if prompt_tokens is not None:
            h = hs[2] or self._request_hist(st, hs, 2, ctx.cid0)
            h[bisect.bisect_left(_TOKEN_BOUNDS, prompt_tokens)] += 1
            h[H_SUM] += prompt_tokens
            h[H_COUNT] += 1
        if cached_tokens is not None:
            h = hs[3] or self._request_hist(st, hs, 3, ctx.cid0)
            h[bisect.bisect_left(_CACHED_BOUNDS, cached_tokens)] += 1
            h[H_SUM] += cached_tokens
            h[H_COUNT] += 1
        if ctx.ukey is not None:
            self._unit_request(st, ctx, ttft_s, latency_s, gpu_s, sla_met, conversion, value)

    def record_llm(
        self,
        b: LayerBinding,
        key: object,
        hits: int,
        misses: int,
        ctx: Any,
        ttft_s: float | None,
        latency_s: float,
    ) -> None:
        """One OpenAI-compatible request, in one call: ``record_tokens(b, key,
        hits, misses, ctx)`` and ``record_request(ctx, ttft_s, latency_s,
        hits + misses, hits, 0.0, None, None, 0.0)``, the same counts."""
        self.record_tokens(b, key, hits, misses, ctx)
        self.record_request(ctx, ttft_s, latency_s, hits + misses, hits, 0.0, None, None, 0.0)

    def _unit_request(
        self,
        st: _ThreadState,
        ctx: Any,
        ttft_s: float | None,
        latency_s: float | None,
        gpu_s: float,
        sla_met: bool | None,
        conversion: bool | None,
        value: float,
    ) -> None:
        """Add one request to its A/B unit's request-level record."""
        ukey = ctx.ukey
        ub = st.units.get(ukey)
        if ub is None:
            if not self._admit(ctx):
                st.dropped += 1
                return  # counted as dropped, not kept
            ub = st.units[ukey] = _new_unit()  # a bytearray: not tracked by the GC
        u = memoryview(ub).cast("d")
        lat = latency_s if latency_s is not None else 0.0
        u[U_REQUESTS] += 1
        u[U_LATENCY_SUM] += lat
        u[U_LATENCY_SQ] += lat * lat
        u[U_TTFT_SUM] += ttft_s or 0.0
        if conversion:
            u[U_CONVERSIONS] += 1
            u[U_VALUE] += value
        u[U_GPU_S] += gpu_s
        if sla_met:
            u[U_SLA_MET] += 1
        if latency_s is not None:
            u[U_HIST + bisect.bisect_left(UNIT_BUCKETS, latency_s)] += 1
        u.release()

    @staticmethod
    def _request_hist(st: _ThreadState, hs: list[Any], i: int, cid0: int) -> list[Any]:
        """Request histogram ``i`` (``HISTOGRAMS`` order) of a label set, made on first use."""
        h = st.hist.get((i, cid0))
        if h is None:
            h = st.hist[(i, cid0)] = [0] * (len(HISTOGRAMS[i][1]) + 3)  # buckets, +Inf, sum, count
        hs[i] = h
        return h

    def cap_label(self, kind: str, value: str) -> str:
        """``value``, or ``other`` once ``max_label_values`` distinct values of
        this label were seen (model, experiment, variant, strategy, trigger)."""
        return self._caps[kind].label(value)

    def label_overflow(self) -> dict[str, int]:
        """Values mapped to ``other`` per label (layer, model, experiment, ...)."""
        out = {k: c.overflow for k, c in self._caps.items() if c.overflow}
        fam = sum(getattr(b.families, "overflow", 0) for b in list(self._bindings))
        if fam:
            out["family"] = fam
        return out

    def label_bounded(self) -> dict[str, int]:
        """Values a length, character or vocabulary bound changed, per label
        (tenant, model, experiment, variant, strategy, trigger, layer)."""
        out = {k: c.bounded for k, c in self._caps.items() if c.bounded}
        if self.tenants.bounded:
            out["tenant"] = self.tenants.bounded
        return out

    def dropped_counts(self) -> dict[str, int]:
        """Rows dropped per stage: ``record`` (unit records over
        ``max_buffered_units``, counted by each recording thread), ``store``
        and ``redis`` (backlog over ``max_pending_rows``, or left at close)."""
        out = dict(self.dropped)
        rec = sum(st.dropped for st in self._all_states())
        if rec:
            out["record"] = out.get("record", 0) + rec
        return out

    # -------------------------------------------------------------- errors
    def count_dropped(self, stage: str, rows: int) -> None:
        """Rows that could not be kept (a bound was reached); never raises."""
        try:
            if rows > 0:
                self.dropped[stage] = self.dropped.get(stage, 0) + int(rows)
                key = "dropped:" + stage
                if key not in self._logged:
                    self._logged.add(key)
                    log.warning(
                        "warmscope: %s: %d rows dropped (a bound was reached or the sink stayed "
                        "down; counted in warmscope.telemetry.dropped)",
                        stage,
                        rows,
                    )
        except Exception:  # pragma: no cover
            pass

    def log_record_drops(self) -> None:
        """Log once, when it starts, that unit records are dropped at
        ``max_buffered_units`` (the recording threads only count them)."""
        if "dropped:record" in self._logged:
            return
        n = sum(st.dropped for st in self._all_states())
        if n:
            self._logged.add("dropped:record")
            log.warning(
                "warmscope: record: %d A/B unit records dropped: more than %d new units "
                "arrived between two flushes (max_buffered_units); counted in "
                "warmscope.telemetry.dropped{stage=record}; raise max_buffered_units or check "
                "the sink's write time",
                n,
                self.max_buffered_units,
            )

    @property
    def hot_cap(self) -> int:
        """Keys a hot-key sketch holds before it compacts to its K (K plus slack)."""
        return self._hot_cap

    @property
    def units_buffered(self) -> int:
        """Unit records buffered since the last take (approximate under races: a bound)."""
        return self._units_n

    def first_time(self, what: str) -> bool:
        """True the first time ``what`` is asked about (a failure to log once), then False."""
        if what in self._logged:
            return False
        self._logged.add(what)
        return True

    def bump_error(self, stage: str) -> None:
        """Count a failure the caller has already explained (no log line)."""
        self.errors[stage] = self.errors.get(stage, 0) + 1

    def count_error(self, stage: str, message: str = "", exc: BaseException | None = None) -> None:
        """Swallowed instrumentation failure: count it, log the first per stage."""
        try:
            self.errors[stage] = self.errors.get(stage, 0) + 1
            if stage not in self._logged:
                self._logged.add(stage)
                log.warning(
                    "warmscope %s failure (counted, not raised): %s %s", stage, message, exc or ""
                )
        except Exception:  # pragma: no cover - never raise from here
            pass

    # -------------------------------------------------------------- readers
    def _all_states(self) -> list[_ThreadState]:
        for drain in list(
            self.drains
        ):  # buffered observations first (recorded in this thread's state)
            try:
                drain()
            except Exception as e:
                self.count_error("record", "buffered observations", e)
        with self._lock:
            return list(self._states)

    def _labels(self, cid: int, **more: str) -> dict[str, str]:
        """A series' label values by column name: the interned request labels plus ``more``."""
        v = dict(zip(_CTX, self._ctx_labels[cid], strict=True))
        v["replica"] = self.replica
        v.update(more)
        return v

    def _lookup_label(self, layer_id: int, k: tuple[Any, ...]) -> tuple[Any, ...]:
        cid, fam, res = k
        v = self._labels(
            cid, layer=self._layer_names[layer_id], family=fam, result=RESULT_NAMES[res]
        )
        return tuple(v[c] for c in records.LOOKUP_LABELS)

    def _write_label(self, layer_id: int, k: tuple[Any, ...]) -> tuple[Any, ...]:
        cid, fam = k
        v = self._labels(cid, layer=self._layer_names[layer_id], family=fam)
        return tuple(v[c] for c in records.WRITE_LABELS)

    def _label(self, kind: str, layer_id: int, k: tuple[Any, ...]) -> tuple[Any, ...]:
        """The full label tuple of a raw series key, built once per series."""
        ck = (kind, layer_id, k)
        lab = self._label_cache.get(ck)
        if lab is None:
            build = {
                "counts": self._lookup_label,
                "writes": self._write_label,
                "req": self._request_label,
                "hist": self._histogram_label,
            }[kind]
            lab = self._label_cache[ck] = build(layer_id, k)
        return lab

    def _request_label(self, layer_id: int, k: tuple[Any, ...]) -> tuple[Any, ...]:
        cid, sla = k
        v = self._labels(cid, sla_met=sla)
        return tuple(v[c] for c in records.REQUEST_LABELS)

    def _histogram_label(self, layer_id: int, k: tuple[Any, ...]) -> tuple[Any, ...]:
        _, cid = k
        v = self._labels(cid, layer=self._layer_names[layer_id] if layer_id >= 0 else "")
        return tuple(v[c] for c in HISTOGRAM_LABELS)

    def _totals(self, kind: str) -> dict[tuple[Any, ...], int]:
        out: dict[tuple[Any, ...], int] = {}
        for st in self._all_states():
            if st.layer_id < 0:
                continue
            for k, n in getattr(st, kind).copy().items():
                lab = self._label(kind, st.layer_id, k)
                out[lab] = out.get(lab, 0) + n
        return out

    def lookup_totals(self) -> dict[tuple[Any, ...], int]:
        """Cumulative lookups keyed by the full label tuple (``records.LOOKUP_LABELS`` order)."""
        return self._totals("counts")

    def write_totals(self) -> dict[tuple[Any, ...], int]:
        """Cumulative writes keyed by the full label tuple (``records.WRITE_LABELS`` order)."""
        return self._totals("writes")

    def deltas(
        self, kind: str, last: dict[Any, Any]
    ) -> tuple[dict[tuple[Any, ...], int], dict[Any, Any]]:
        """Lookups (``kind="counts"``) or writes (``"writes"``) since ``last``.

        ``last`` is the snapshot this returned before (per thread state, raw
        keys); only series that changed are turned into labels, so a flush
        costs a dict comparison per series, not a label build. Returns
        (deltas by full label tuple, the new snapshot).
        """
        out: dict[tuple[Any, ...], int] = {}
        snap: dict[int, dict[Any, Any]] = {}
        for st in self._all_states():
            if st.layer_id < 0:
                continue
            cur = getattr(st, kind).copy()
            prev = last.get(id(st), {})
            for k, n in cur.items():
                p = prev.get(k, 0)
                if n != p:
                    lab = self._label(kind, st.layer_id, k)
                    out[lab] = out.get(lab, 0) + n - p
            snap[id(st)] = cur
        return out, snap

    def request_totals(self) -> dict[tuple[Any, ...], list[Any]]:
        """``records.REQUEST_LABELS`` values (sla_met last) -> the request sums
        (``records.REQUESTS.measures``: requests, gpu_s, conversions, value)."""
        out: dict[tuple[Any, ...], list[Any]] = {}
        nm = len(records.REQUEST_ZERO)
        for st in self._all_states():
            for k, r in st.req.copy().items():
                acc = out.setdefault(self._label("req", -1, k), list(records.REQUEST_ZERO))
                for i in range(nm):
                    acc[i] += r[i]
        return out

    def histogram_totals(self) -> dict[tuple[int, tuple[Any, ...]], list[Any]]:
        """(histogram index, ``HISTOGRAM_LABELS`` values) -> [bucket counts..., +Inf, sum, count].

        The layer is "" for request histograms and the cache layer for load durations."""
        out: dict[tuple[Any, ...], list[Any]] = {}
        for st in self._all_states():
            for hk, h in st.hist.copy().items():
                k = (hk[0], self._label("hist", st.layer_id, hk))
                acc = out.get(k)
                if acc is None:
                    out[k] = list(h)
                else:
                    for j, v in enumerate(h):
                        acc[j] += v
        return out

    def take_buffers(
        self, settle: bool
    ) -> tuple[dict[int, dict[Any, Any]], dict[tuple[Any, ...], list[Any]]]:
        """Swap out hot-key sketches and unit records, merged across threads.

        Hot keys come keyed by sketch scope (:meth:`hot_scope`). Unit records
        come keyed ``(experiment, variant, unit, layer)``: per layer
        ``[lookups, hits]`` (``records.AB_LOOKUPS`` measures), and with layer
        ``""`` the request-level record (``records.UNIT_SUMS``, then the
        latency histogram).

        With ``settle=False`` (other threads may be recording) each thread is
        asked to hand its buffers over at its next record, so no increment is
        in flight on a buffer being read; a thread that has not answered for
        ``_IDLE_S`` has its buffers taken, and they are read ``_IDLE_S`` later.
        ``settle=True`` takes everything now (single-threaded callers, shutdown).
        """
        ready = self._ready_buffers(settle)
        hot_out: dict[int, dict[Any, Any]] = {}
        units_out: dict[tuple[Any, ...], list[Any]] = {}
        merged: set[int] = set()  # layers with records in units_out (keys hold the layer)
        for layer_id, hot, units in ready:
            hotkeys.merge(hot_out, layer_id, hot)
            self._merge_units(units_out, layer_id, units, layer_id in merged)
            merged.add(layer_id)
        for layer, n in hotkeys.cross_tenant_reads(hot_out, self._layer_names.__getitem__).items():
            self.cross_tenant[layer] = self.cross_tenant.get(layer, 0) + n
        hotkeys.top_k(hot_out, self.hot_k)
        return hot_out, units_out

    def _ready_buffers(self, settle: bool) -> list[tuple[int, dict[Any, Any], dict[Any, Any]]]:
        """(layer id, hot-key sketches, unit records) handed over by the threads,
        or taken from idle ones (read ``_IDLE_S`` after they were taken)."""
        now = time.monotonic()
        self._units_n = 0
        ready: list[tuple[int, dict[Any, Any], dict[Any, Any]]] = []
        forced: list[tuple[float, int, dict[Any, Any], dict[Any, Any], dict[Any, Any]]] = []
        for st in self._all_states():
            while st.outbox:
                ready.append((st.layer_id, *st.outbox.pop()))
            if settle:
                forced.append(self._take(st, now))
            elif st.swap:
                if now - st.unanswered > _IDLE_S:  # the thread is idle: take its buffers ourselves
                    with st.lock:
                        if st.swap:
                            forced.append(self._take(st, now))
            else:
                st.unanswered = now
                st.swap = True
        with self._lock:
            pool = self._retired + forced
            if settle:
                taken, self._retired = pool, []
            else:
                taken = [t for t in pool if now - t[0] > _IDLE_S]
                self._retired = [t for t in pool if now - t[0] <= _IDLE_S]
        for _, layer_id, hot, units, hbuf in taken:
            if layer_id >= 0 and hbuf:
                self._sketch(layer_id, hot, hbuf)
            ready.append((layer_id, hot, units))
        return ready

    @staticmethod
    def _take(
        st: _ThreadState, now: float
    ) -> tuple[float, int, dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
        out = (now, st.layer_id, st.hot, st.units, st.hbuf)
        st.hot, st.units, st.hbuf, st.swap = {}, {}, {}, False
        return out

    def _merge_units(
        self,
        out: dict[tuple[Any, ...], list[Any]],
        layer_id: int,
        units: dict[Any, Any],
        overlap: bool = True,
    ) -> None:
        """Add one thread's unit records to ``out``: per layer unpacked to
        [lookups, hits]; request-level records to numbers (counts as ints). ``overlap``: whether
        ``out`` may hold records of this layer already (another thread's)."""
        if not units:
            return
        if layer_id >= 0:  # packed ints: lookups + hits << 32
            layer = (self._layer_names[layer_id],)
            low, shift = _LOW, _SHIFT
            if L_LOOKUPS == 0:  # records.AB_LOOKUPS measure order
                new = {uk + layer: [u & low, u >> shift] for uk, u in units.items()}
            else:  # pragma: no cover - the order records declare today is lookups, hits
                new = {uk + layer: [u >> shift, u & low] for uk, u in units.items()}
        else:
            # all records at once: one array, a column at a time (counts as ints), rows zipped
            arr = np.frombuffer(b"".join(units.values()), dtype=np.float64).reshape(len(units), -1)
            cols = [
                arr[:, j].astype(np.int64).tolist() if j in _UNIT_INT_SET else arr[:, j].tolist()
                for j in range(arr.shape[1])
            ]
            new = {
                uk + ("",): vals
                for uk, vals in zip(units, map(list, zip(*cols, strict=True)), strict=True)
            }
        if overlap and out:  # another thread's buffer had some of these units: add them up
            for k in new.keys() & out.keys():
                a = out[k]
                for j, v in enumerate(new.pop(k)):
                    a[j] += v
        out.update(new)

    def hot_scope(self, hk: int) -> tuple[str, str]:
        """(tenant, layer) of a hot-key sketch scope."""
        tid, lid = hotkeys.scope_ids(hk)
        return self._tenant_names[tid], self._layer_names[lid]


# The interned request label set, in this order (intern_context).
_CTX = ("tenant", "experiment", "variant", "model", "length_bucket")
# Histogram series labels: the ``histograms`` record's labels between metric and bounds.
HISTOGRAM_LABELS = tuple(c for c in records.HISTOGRAMS.labels if c not in ("metric", "bounds"))
_CAPPED = ("model", "experiment", "variant", "strategy", "trigger", "layer")
_VOCAB = ("strategy", "trigger")  # free text naming a mechanism: the family vocabulary rule
# A unit's lookups and hits in one layer, packed in one int: lookups + hits << 32.
_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
_HIT_INC = 1 + (1 << _SHIFT)  # one lookup that hit


def pack_layer_unit(lookups: int, hits: int) -> int:
    return lookups + (hits << _SHIFT)


# Integer fields of the request-level unit record (counts, histogram buckets).
_UNIT_INT = tuple(
    i
    for i, c in enumerate(records.UNIT_SUMS + records.UNIT_HIST)
    if records.AB_UNITS.columns[records.AB_UNITS.index(c)].type == records.INTEGER
)
_UNIT_INT_SET = frozenset(_UNIT_INT)
# How long a unit's keep-or-drop decision holds for its later records (a request's lookups and its
# request record come well within it).
_DECIDED_S = 10.0
# A thread that has not answered a hand-off request for this long is idle; no
# thread stays preempted this long between two bytecodes of one lookup.
_IDLE_S = 2.0


_UNIT_BYTES = 8 * (_NU + len(UNIT_BUCKETS) + 1)


def _new_unit() -> bytearray:
    """A request-level unit record: records.UNIT_SUMS then the latency histogram,
    as doubles in a bytearray (not tracked by the GC, so a million buffered
    units add nothing to a collection's pause; counts become ints at take)."""
    return bytearray(_UNIT_BYTES)
