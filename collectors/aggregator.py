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

Hot keys use a batched Space-Saving sketch per (tenant, layer) and thread: a
dict of up to K + max(K, 1024) entries; when full, it keeps the top K by
estimated count, and new keys enter with the largest evicted estimate as both
their starting estimate and error bound, so ``hits + misses <= true count <=
hits + misses + err`` for every key reported.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import operator
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import schema
from .keys import FamilyNormaliser, LabelCap, TenantBucketer

__all__ = ["Aggregator", "LayerBinding", "HIT", "MISS", "BYPASS", "ERROR"]

log = logging.getLogger("warmscope.collectors")

HIT, MISS, BYPASS, ERROR = 0, 1, 2, 3
RESULT_NAMES = schema.RESULTS

# Request histograms, in the order of the per-(labels) histogram list.
HISTOGRAMS = (
    (schema.TTFT, schema.TTFT_BUCKETS),
    (schema.REQUEST_DURATION, schema.DURATION_BUCKETS),
    (schema.TOKEN_USAGE, schema.TOKEN_BUCKETS),
    (schema.CACHE_READ_TOKENS, schema.TOKEN_BUCKETS),
    (schema.LOAD_DURATION, schema.DURATION_BUCKETS),  # per layer: kept in the layer's state
)
LOAD_HIST = 4
# Per-unit latency histogram (A/B quantiles) uses the request-duration buckets.
UNIT_BUCKETS = schema.DURATION_BUCKETS
# A/B unit record fields, in list order (the histogram follows them). Lookups
# and hits are kept per layer; the request-level record has them at zero.
UNIT_FIELDS = (
    "lookups", "hits", "requests", "latency_sum", "latency_sq", "ttft_sum",
    "conversions", "value", "gpu_s", "sla_met",
)
_NU = len(UNIT_FIELDS)


class _ThreadState:
    """One thread's counters for one layer (or, layer -1, its request records)."""

    __slots__ = ("layer_id", "counts", "writes", "hot", "hbuf", "units", "req", "hist", "swap", "unanswered",
                 "outbox", "lock", "dropped")

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id
        self.swap = False  # set by the flusher: hand the swappable buffers over
        self.unanswered = 0.0  # monotonic time of the request, for idle threads
        self.outbox: list[tuple[dict, dict]] = []
        self.lock = threading.Lock()  # hand-off vs. forced take; never on the lookup path
        self.counts: dict[tuple, int] = {}  # (ctx id, family, result) -> n
        self.writes: dict[tuple, int] = {}  # (ctx id, family) -> n
        self.hot: dict[int, dict] = {}  # tenant id -> sketch {key: [est, hits, misses, err, family, key]}
        self.hbuf: dict[int, tuple[list, list]] = {}  # tenant id -> (hit keys, miss keys) not yet sketched
        self.units: dict[tuple, list] = {}
        self.req: dict[tuple, list] = {}
        self.hist: dict[tuple, list] = {}
        self.dropped = 0  # unit records not kept (max_buffered_units reached)


class LayerBinding:
    """Set up once per layer: its id, family normaliser and per-thread state."""

    __slots__ = ("layer", "layer_id", "families", "memo", "length_buckets", "tls")

    def __init__(self, layer: str, layer_id: int, families: FamilyNormaliser, length_buckets: bool) -> None:
        self.layer = layer
        self.layer_id = layer_id
        self.families = families
        self.memo = families._memo  # read directly on the hot path
        self.length_buckets = length_buckets
        self.tls = threading.local()


@dataclass(slots=True)
class WarmedKey:
    run_id: str
    key_hash_src: object  # the raw key; hashed only when exported
    family: str
    tenant: str
    layer: str
    warmed_at: float
    ttl_s: float | None
    gpu_s: float = 0.0  # what warming this key cost
    labels: tuple = ()  # the run's WARMUP_LABELS values
    first_hit_at: float | None = None
    first_miss_at: float | None = None
    hits: int = 0
    exported: tuple | None = None  # state at the last export


@dataclass(slots=True)
class EarlyWindow:
    """Keys requested right after a warm-up run (for warm-set recall)."""

    run_id: str
    layer: str
    tenant: str | None  # None: all tenants
    until: float
    limit: int
    seen: dict = field(default_factory=dict)  # raw key -> [first_seen, lookups, family]
    overflow: int = 0


class Aggregator:
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
        self._units_n = 0  # unit records buffered since the last take (approximate under races: a bound)
        self.dropped: dict[str, int] = {}  # stage -> rows dropped by the flusher (see dropped_counts)
        self.max_layers = min(int(max_layers), _MAX_LAYER_ID)
        self._caps = {k: LabelCap(max_label_values) for k in _CAPPED}
        self._lock = threading.Lock()
        self._req_tls = threading.local()
        self._states: list[_ThreadState] = []
        self._retired: list[tuple[float, int, dict, dict, dict]] = []  # taken from idle threads
        # Interned label sets.
        self._ctx_ids: dict[tuple, int] = {}
        self._ctx_labels: list[tuple] = []
        self._layers: dict[str, LayerBinding] = {}
        self._layer_names: list[str] = []
        self._bindings: list[LayerBinding] = []
        self._label_cache: dict[tuple, tuple] = {}  # raw series key -> label tuple (bounded by series)
        self._tenant_ids: dict[str, int] = {}
        self._tenant_names: list[str] = []
        self._hot_floor: dict[int, int] = {}
        # Warm-up bookkeeping (touched on the hot path only by dict.get).
        self.warmed: dict[object, WarmedKey] = {}
        self.early: list[EarlyWindow] = []
        self.events: deque = deque()  # warm-up run records for the sinks
        self.warmup_counts: dict[tuple, list] = {}  # WARMUP_LABELS(+status) -> sums
        self.warmup_active: dict[tuple, int] = {}
        self.errors: dict[str, int] = {s: 0 for s in schema.TELEMETRY_STAGES}
        self.gauges: dict[str, float] = {}  # last value per gauge name
        self.warm_read: dict[tuple, int] = {}  # WARMUP_LABELS -> warmed keys read
        self.cross_tenant: dict[str, int] = {}  # layer -> (key, extra tenant) pairs seen
        self._logged: set[str] = set()

    # ---------------------------------------------------------------- setup
    def bind_layer(self, layer: str, length_buckets: bool | None = None) -> LayerBinding:
        with self._lock:
            b = self._layers.get(layer)
            if b is None and len(self._layer_names) >= self.max_layers:
                layer = schema.OTHER  # ids stay below 4096: hot-key scopes pack the layer id in 12 bits
                self._caps["layer"].overflow += 1
                b = self._layers.get(layer)
            if b is None:
                if length_buckets is None:
                    length_buckets = layer == "prefix_kv"
                b = LayerBinding(
                    layer, len(self._layer_names),
                    FamilyNormaliser(self._family_rules, self._max_families, vocabulary=self._family_vocab),
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
            labels = (tenant, experiment, variant, model, lb)
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
            # This layer's lookups and hits for the unit, packed in one int
            # (lookups + hits << 32): no per-unit container for the GC to walk.
            units = st.units
            u = units.get(ctx.ukey)
            if u is None:
                if self._units_n >= self.max_buffered_units:
                    st.dropped += 1
                else:
                    self._units_n += 1
                    units[ctx.ukey] = _HIT_INC if result == HIT else 1
            else:
                units[ctx.ukey] = u + (_HIT_INC if result == HIT else 1)
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
        for result, n in ((HIT, hits), (MISS, misses)):
            if n > 0:
                k = (cid, fam, result)
                c[k] = c.get(k, 0) + n
        result = HIT if hits > 0 else MISS
        hb = st.hbuf.get(ctx.tid)
        if hb is None:
            hb = st.hbuf[ctx.tid] = ([], [])
        lst = hb[result]
        lst.append(key)
        if len(lst) >= _BATCH:
            self._sketch(b.layer_id, st.hot, st.hbuf)
        if ctx.ukey is not None:  # packed as in record(): lookups + hits << 32, here in tokens
            units = st.units
            inc = hits + misses + (hits << 32)
            u = units.get(ctx.ukey)
            if u is None:
                if self._units_n >= self.max_buffered_units:
                    st.dropped += 1
                else:
                    self._units_n += 1
                    units[ctx.ukey] = inc
            else:
                units[ctx.ukey] = u + inc
        if self.warmed:
            w = self.warmed.get(key)
            if w is not None:
                self._warmed_read(w, result)
        if self.early:
            self._early_read(b, key, fam, ctx)

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

    def _sketch(self, layer_id: int, hot: dict, hbuf: dict) -> None:
        """Fold buffered keys into the Space-Saving sketches (owner thread, or
        the flusher once no thread can touch these dicts)."""
        fams = self._bindings[layer_id].families
        for tid, pair in list(hbuf.items()):
            sk = hot.get(tid)
            if sk is None:
                sk = hot[tid] = {}
            for r, lst in enumerate(pair):
                if not lst:
                    continue
                counted = Counter(lst)
                lst.clear()
                hk = (tid << 12) | layer_id
                for key, n in counted.items():
                    e = sk.get(key)
                    if e is None:
                        if len(sk) >= self._hot_cap:
                            self._compact(hk, sk)
                        floor = self._hot_floor.get(hk, 0)
                        e = sk[key] = [floor, 0, 0, floor, fams.family(key), key]
                    e[0] += n
                    e[r + 1] += n

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
        h[-2] += seconds
        h[-1] += 1

    def set_gauge(self, name: str, value: float) -> None:
        self.gauges[name] = float(value)

    def _compact(self, hk: int, sk: dict) -> None:
        # Entries are [estimate, hits, misses, err, family, key]; keep the top K.
        top = heapq.nlargest(self.hot_k + 1, sk.values(), key=_est)
        if len(top) > self.hot_k:
            self._hot_floor[hk] = max(self._hot_floor.get(hk, 0), top[-1][0])
            top.pop()
        sk.clear()
        sk.update((e[5], e) for e in top)

    def _warmed_read(self, w: WarmedKey, result: int) -> None:
        if result == HIT:
            w.hits += 1
            if w.first_hit_at is None:
                w.first_hit_at = self.clock()
                if w.first_miss_at is None:  # read while still the warmed entry
                    self.warm_read[w.labels] = self.warm_read.get(w.labels, 0) + 1
        elif w.first_miss_at is None:
            w.first_miss_at = self.clock()

    def _early_read(self, b: LayerBinding, key: object, fam: str, ctx: Any) -> None:
        # Windows are closed by the flusher; the clock is read only for new keys.
        for win in self.early:
            if win.layer != b.layer or (win.tenant is not None and win.tenant != ctx.tenant):
                continue
            e = win.seen.get(key)
            if e is not None:
                e[1] += 1
            elif len(win.seen) < win.limit:
                now = self.clock()
                if now <= win.until:
                    win.seen[key] = [now, 1, fam]
            else:
                win.overflow += 1

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
    ) -> None:
        try:
            st = self._req_tls.s
        except AttributeError:
            st = self._state(self._req_tls, -1)
        if st.swap:
            self._hand_off(st)
        rk = (ctx.cid0, "" if sla_met is None else ("true" if sla_met else "false"))
        r = st.req.get(rk)
        if r is None:
            r = st.req[rk] = [0, 0.0, 0, 0.0]
        r[0] += 1
        r[1] += gpu_s
        if conversion:
            r[2] += 1
            r[3] += value
        for i, v in enumerate((ttft_s, latency_s, prompt_tokens, cached_tokens)):
            if v is None:
                continue
            hk = (i, ctx.cid0)
            h = st.hist.get(hk)
            bounds = HISTOGRAMS[i][1]
            if h is None:
                h = st.hist[hk] = [0] * (len(bounds) + 3)  # buckets, +Inf, sum, count
            h[bisect.bisect_left(bounds, v)] += 1
            h[-2] += v
            h[-1] += 1
        if ctx.ukey is not None:
            ub = st.units.get(ctx.ukey)
            if ub is None:
                if self._units_n >= self.max_buffered_units:
                    st.dropped += 1
                    return  # counted as dropped, not kept
                self._units_n += 1
                ub = st.units[ctx.ukey] = _new_unit()  # a bytearray: not tracked by the GC
            u = memoryview(ub).cast("d")
            lat = latency_s if latency_s is not None else 0.0
            u[2] += 1
            u[3] += lat
            u[4] += lat * lat
            u[5] += ttft_s or 0.0
            if conversion:
                u[6] += 1
                u[7] += value
            u[8] += gpu_s
            if sla_met:
                u[9] += 1
            if latency_s is not None:
                u[_NU + bisect.bisect_left(UNIT_BUCKETS, latency_s)] += 1
            u.release()

    # ------------------------------------------------------------- warm-up
    def warmup_event(self, kind: str, labels: tuple, record: dict, status: str = "") -> None:
        """Book a warm-up start/end (called by WarmupRun; not on the lookup path)."""
        with self._lock:
            if kind == "start":
                self.warmup_active[labels] = self.warmup_active.get(labels, 0) + 1
            else:
                self.warmup_active[labels] = self.warmup_active.get(labels, 1) - 1
                sums = self.warmup_counts.setdefault(labels + (status,), [0, 0, 0, 0.0])
                sums[0] += 1
                sums[1] += record.get("keys", 0)
                sums[2] += record.get("bytes", 0)
                sums[3] += record.get("gpu_s", 0.0)
            self.events.append(("run", dict(record)))

    def add_warmed(self, w: WarmedKey) -> bool:
        if len(self.warmed) >= self.warmed_key_limit:
            self.count_error("record", "warmed-key limit reached; key not tracked for precision")
            return False
        self.warmed[w.key_hash_src] = w
        return True

    def open_early_window(self, run_id: str, layer: str, tenant: str | None, seconds: float) -> None:
        if seconds <= 0 or self.early_key_limit <= 0:
            return
        win = EarlyWindow(run_id, layer, tenant, self.clock() + seconds, self.early_key_limit)
        with self._lock:
            self.early = self.early + [win]  # copy-on-write: the hot path iterates it

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
                    log.warning("warmscope: %s: %d rows dropped (a bound was reached or the sink stayed down; counted in "
                                "warmscope.telemetry.dropped)", stage, rows)
        except Exception:  # pragma: no cover
            pass

    def bump_error(self, stage: str) -> None:
        """Count a failure the caller has already explained (no log line)."""
        self.errors[stage] = self.errors.get(stage, 0) + 1

    def count_error(self, stage: str, message: str = "", exc: BaseException | None = None) -> None:
        """Swallowed instrumentation failure: count it, log the first per stage."""
        try:
            self.errors[stage] = self.errors.get(stage, 0) + 1
            if stage not in self._logged:
                self._logged.add(stage)
                log.warning("warmscope %s failure (counted, not raised): %s %s", stage, message, exc or "")
        except Exception:  # pragma: no cover - never raise from here
            pass

    # -------------------------------------------------------------- readers
    def _all_states(self) -> list[_ThreadState]:
        with self._lock:
            return list(self._states)

    def layer_name(self, layer_id: int) -> str:
        return self._layer_names[layer_id]

    def ctx_labels(self, cid: int) -> tuple:
        return self._ctx_labels[cid]

    def lookup_totals(self) -> dict[tuple, int]:
        """Cumulative lookups keyed by the full LOOKUP_LABELS value tuple."""
        out: dict[tuple, int] = {}
        for st in self._all_states():
            if st.layer_id < 0:
                continue
            layer = self._layer_names[st.layer_id]
            for (cid, fam, res), n in st.counts.copy().items():
                t, exp, var, model, lb = self._ctx_labels[cid]
                k = (t, layer, fam, RESULT_NAMES[res], exp, var, model, self.replica, lb)
                out[k] = out.get(k, 0) + n
        return out

    def _lookup_label(self, layer_id: int, k: tuple) -> tuple:
        cid, fam, res = k
        t, exp, var, model, lb = self._ctx_labels[cid]
        return (t, self._layer_names[layer_id], fam, RESULT_NAMES[res], exp, var, model, self.replica, lb)

    def _write_label(self, layer_id: int, k: tuple) -> tuple:
        cid, fam = k
        return (self._ctx_labels[cid][0], self._layer_names[layer_id], fam, self.replica)

    def deltas(self, kind: str, last: dict) -> tuple[dict[tuple, int], dict]:
        """Lookups (``kind="counts"``) or writes (``"writes"``) since ``last``.

        ``last`` is the snapshot this returned before (per thread state, raw
        keys); only series that changed are turned into labels, so a flush
        costs a dict comparison per series, not a label build. Returns
        (deltas by full label tuple, the new snapshot).
        """
        label = self._lookup_label if kind == "counts" else self._write_label
        cache = self._label_cache
        out: dict[tuple, int] = {}
        snap: dict[int, dict] = {}
        for st in self._all_states():
            if st.layer_id < 0:
                continue
            cur = getattr(st, kind).copy()
            prev = last.get(id(st), {})
            for k, n in cur.items():
                p = prev.get(k, 0)
                if n != p:
                    ck = (kind, st.layer_id, k)
                    lab = cache.get(ck)
                    if lab is None:
                        lab = cache[ck] = label(st.layer_id, k)
                    out[lab] = out.get(lab, 0) + n - p
            snap[id(st)] = cur
        return out, snap

    def write_totals(self) -> dict[tuple, int]:
        out: dict[tuple, int] = {}
        for st in self._all_states():
            if st.layer_id < 0:
                continue
            for (cid, fam), n in st.writes.copy().items():
                t = self._ctx_labels[cid][0]
                k = (t, self._layer_names[st.layer_id], fam, self.replica)
                out[k] = out.get(k, 0) + n
        return out

    def request_totals(self) -> dict[tuple, list]:
        """(tenant, exp, variant, model, replica, sla) -> [requests, gpu_s, conversions, value]."""
        out: dict[tuple, list] = {}
        for st in self._all_states():
            for (cid, sla), r in st.req.copy().items():
                t, exp, var, model, _ = self._ctx_labels[cid]
                k = (t, exp, var, model, self.replica, sla)
                acc = out.setdefault(k, [0, 0.0, 0, 0.0])
                for i in range(4):
                    acc[i] += r[i]
        return out

    def histogram_totals(self) -> dict[tuple[int, tuple], list]:
        """(histogram index, REQUEST_LABELS values + (layer,)) -> [bucket counts..., +Inf, sum, count].

        The layer is "" for request histograms and the cache layer for load durations."""
        out: dict[tuple, list] = {}
        for st in self._all_states():
            layer = self._layer_names[st.layer_id] if st.layer_id >= 0 else ""
            for (i, cid), h in st.hist.copy().items():
                t, exp, var, model, _ = self._ctx_labels[cid]
                k = (i, (t, exp, var, model, self.replica, layer))
                acc = out.get(k)
                if acc is None:
                    out[k] = list(h)
                else:
                    for j, v in enumerate(h):
                        acc[j] += v
        return out

    def take_buffers(self, settle: bool) -> tuple[dict[int, dict], dict[tuple, list]]:
        """Swap out hot-key sketches and unit records, merged across threads.

        Unit records come keyed ``(experiment, variant, unit, layer)``: per
        layer ``[lookups, hits]``, and with layer ``""`` the request-level
        record (``UNIT_FIELDS`` order, then the latency histogram).

        With ``settle=False`` (other threads may be recording) each thread is
        asked to hand its buffers over at its next record, so no increment is
        in flight on a buffer being read; a thread that has not answered for
        ``_IDLE_S`` has its buffers taken, and they are read ``_IDLE_S`` later.
        ``settle=True`` takes everything now (single-threaded callers, shutdown).
        """
        now = time.monotonic()
        self._units_n = 0
        ready: list[tuple[int, dict, dict]] = []
        forced: list[tuple[float, int, dict, dict, dict]] = []
        for st in self._all_states():
            while st.outbox:
                ready.append((st.layer_id, *st.outbox.pop()))
            if settle:
                forced.append((now, st.layer_id, st.hot, st.units, st.hbuf))
                st.hot, st.units, st.hbuf, st.swap = {}, {}, {}, False
            elif st.swap:
                if now - st.unanswered > _IDLE_S:  # the thread is idle: take its buffers ourselves
                    with st.lock:
                        if st.swap:
                            forced.append((now, st.layer_id, st.hot, st.units, st.hbuf))
                            st.hot, st.units, st.hbuf, st.swap = {}, {}, {}, False
            else:
                st.unanswered = now
                st.swap = True
        with self._lock:
            # Buffers taken from under an idle thread are read _IDLE_S later.
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
        hot_out: dict[int, dict] = {}
        units_out: dict[tuple, list] = {}
        for layer_id, hot, units in ready:
            for tid, sk in hot.items():
                hk = (tid << 12) | layer_id
                acc = hot_out.setdefault(hk, {})
                for key, e in sk.items():
                    a = acc.get(key)
                    if a is None:
                        acc[key] = list(e)
                    else:  # the same key seen by two threads
                        a[1] += e[1]
                        a[2] += e[2]
                        a[3] = max(a[3], e[3])
                        a[0] = a[1] + a[2] + a[3]
            layer = self._layer_names[layer_id] if layer_id >= 0 else ""
            packed = layer_id >= 0
            for uk, u in units.items():
                k = uk + (layer,)
                if packed:
                    u = (u & _LOW, u >> 32)
                else:
                    u = memoryview(u).cast("d").tolist()
                a = units_out.get(k)
                if a is None:
                    units_out[k] = list(u)
                else:
                    for j, v in enumerate(u):
                        a[j] += v
        # Cross-tenant reads: one key in several tenants' sketches of a layer.
        owners: dict[tuple, int] = {}
        for hk, acc in hot_out.items():
            layer = self._layer_names[hk & 0xFFF]
            if layer in schema.SHARED_LAYERS:
                continue
            for key in acc:
                owners[(layer, key)] = owners.get((layer, key), 0) + 1
        for (layer, _), n in owners.items():
            if n > 1:
                self.cross_tenant[layer] = self.cross_tenant.get(layer, 0) + n - 1
        # Keep the top K per sketch.
        for hk, acc in hot_out.items():
            if len(acc) > self.hot_k:
                hot_out[hk] = {e[5]: e for e in heapq.nlargest(self.hot_k, acc.values(), key=_est)}
        for k, u in units_out.items():
            if not k[3]:  # request-level record: counts back to ints
                for j in _INT_FIELDS:
                    u[j] = int(u[j])
                for j in range(_NU, len(u)):
                    u[j] = int(u[j])
        return hot_out, units_out

    def hot_scope(self, hk: int) -> tuple[str, str]:
        return self._tenant_names[hk >> 12], self._layer_names[hk & 0xFFF]


_est = operator.itemgetter(0)
_MAX_LAYER_ID = 4000  # hot-key scope ids pack the layer id in 12 bits
_CAPPED = ("model", "experiment", "variant", "strategy", "trigger", "layer")
_HIT_INC = 1 + (1 << 32)  # one lookup that hit, in a packed per-layer unit count
_LOW = (1 << 32) - 1
_INT_FIELDS = (0, 1, 2, 6, 9)  # lookups, hits, requests, conversions, sla_met
_BATCH = 2048  # buffered hot-key reads per (thread, layer, tenant, result)
# A thread that has not answered a hand-off request for this long is idle; no
# thread stays preempted this long between two bytecodes of one lookup.
_IDLE_S = 2.0





_UNIT_BYTES = 8 * (_NU + len(UNIT_BUCKETS) + 1)


def _new_unit() -> bytearray:
    """A request-level unit record: UNIT_FIELDS then the latency histogram,
    as doubles in a bytearray (not tracked by the GC, so a million buffered
    units add nothing to a collection's pause; counts become ints at take)."""
    return bytearray(_UNIT_BYTES)
