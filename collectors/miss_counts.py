"""Prefix-KV miss classes and engine block counts: the aggregator's part.

``Telemetry.record_misses`` and ``Telemetry.record_kv_stats`` append one tuple
to a bounded deque (``deque.append`` is atomic: no lock on the caller's path;
what does not fit is counted in ``warmscope.telemetry.dropped{stage=record}``).
Label work — the tenant allow-list, the caps on engines, families and salts,
the class names — happens when the queue is drained, on the flusher's or the
exporter's thread, under a lock that no caller takes.

Drained observations become two cumulative tables:

* per (time bucket, labels), for the store: the flusher writes their deltas
  as ``misses`` / ``kv_blocks`` rows (``records.MISSES``, ``records.KV_BLOCKS``).
  A call without ``ts`` lands in the bucket of the flush that carries it (the
  flush time, like every other metric point); a call with ``ts`` lands in the
  flush interval holding ``ts`` (its end). Written buckets older than three
  flush intervals are forgotten.
* per label set, for OpenTelemetry: ``warmscope.kv.missed_tokens`` by tenant,
  engine and class (no family: see ``schema.MISS_LABELS``) and the block
  counters and gauge by engine and salt.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from warmscope.model import records

from .keys import LabelCap

__all__ = ["MissTracking", "MISS_QUEUE_LIMIT", "TRACE_QUEUE_LIMIT", "trace_record"]

MISS_QUEUE_LIMIT = 100_000  # observations waiting for the next drain (per queue)
TRACE_QUEUE_LIMIT = 50_000  # block-trace requests waiting for the next flush
_CLASSES = frozenset(records.MISS_CLASSES)
_KV_ZERO = (0, 0, 0, 0)  # stored, reused, evicted, resident


class MissTracking:
    """Mixin of :class:`collectors.aggregator.Aggregator` (needs ``tenants``, ``clock``,
    ``count_error``, ``count_dropped`` and ``_max_families``)."""

    tenants: Any
    clock: Any
    _max_families: int

    def count_error(self, stage: str, message: str = "", exc: BaseException | None = None) -> None:
        raise NotImplementedError  # pragma: no cover - provided by Aggregator

    def count_dropped(self, stage: str, rows: int) -> None:
        raise NotImplementedError  # pragma: no cover - provided by Aggregator

    def _init_misses(self, max_label_values: int) -> None:
        self.miss_bucket_s = 10.0  # set by the pipeline to its flush interval
        self.miss_to_store = False  # the pipeline sets it when metric points go to the store
        self._miss_q: deque[tuple[Any, ...]] = deque()
        self._kv_q: deque[tuple[Any, ...]] = deque()
        self._trace_q: deque[Any] = deque()
        self._miss_lock = threading.Lock()
        self._miss_dropped = 0  # observations not queued (bound reached), counted by callers
        self._engine_cap = LabelCap(max_label_values)
        self._family_cap = LabelCap(self._max_families)
        self._salt_cap = LabelCap(max_label_values)
        # (tenant, engine, family) as called -> their capped labels (drain side only)
        self._miss_labels: dict[tuple[Any, Any, Any], tuple[str, str, str]] = {}
        # (bucket or None, tenant, engine, family, class) -> [tokens, requests]
        self.miss_cum: dict[tuple[Any, ...], list[int]] = {}
        # (tenant, engine, class) -> tokens, for export
        self.miss_export: dict[tuple[str, str, str], int] = {}
        # (bucket or None, engine, salt) -> [stored, reused, evicted, resident]
        self.kv_cum: dict[tuple[Any, ...], list[int]] = {}
        # (engine, salt) -> [stored, reused, evicted, resident], for export
        self.kv_export: dict[tuple[str, str], list[int]] = {}

    # ------------------------------------------------------------ hot path
    def record_misses(
        self, tenant: str, engine: str, family: str, classes: Mapping[str, int], ts: float | None
    ) -> None:
        q = self._miss_q
        if len(q) >= MISS_QUEUE_LIMIT:
            self._miss_dropped += 1
            return
        q.append((ts, tenant, engine, family, tuple(classes.items())))

    def record_kv_stats(
        self,
        engine: str,
        salt: str,
        stored: int,
        reused: int,
        evicted: int,
        resident: int,
        ts: float | None,
    ) -> None:
        q = self._kv_q
        if len(q) >= MISS_QUEUE_LIMIT:
            self._miss_dropped += 1
            return
        q.append((ts, engine, salt, stored, reused, evicted, resident))

    def record_trace(self, row: Any) -> None:
        q = self._trace_q
        if len(q) >= TRACE_QUEUE_LIMIT:
            self._miss_dropped += 1
            return
        q.append(row)

    def take_trace_rows(self) -> list[tuple[Any, ...]]:
        """The block-trace rows queued since the last call (``records.BLOCK_TRACE``), tenants
        under the same label caps as every other record."""
        rows = []
        q = self._trace_q
        while q:
            r = q.popleft()
            try:
                rows.append(trace_record(r, self.tenants.label(r.tenant)))
            except Exception as e:
                self.count_error("record", "record_trace", e)
        return rows

    # --------------------------------------------------------------- drain
    def _bucket(self, ts: Any) -> float | None:
        if ts is None:
            return None
        t = float(ts)
        if not math.isfinite(t):
            raise ValueError(f"ts {ts!r} is not a finite time")
        w = self.miss_bucket_s
        return float(math.ceil(t / w) * w)

    def drain_misses(self) -> None:
        """Move queued observations into the cumulative tables (flusher and exporter threads)."""
        with self._miss_lock:
            if self._miss_dropped:
                n, self._miss_dropped = self._miss_dropped, 0
                self.count_dropped("record", n)
            q = self._miss_q
            while q:
                obs = q.popleft()
                try:
                    self._add_misses(*obs)
                except Exception as e:  # a bad call is counted, the others go on
                    self.count_error("record", "record_misses", e)
            kq = self._kv_q
            while kq:
                obs = kq.popleft()
                try:
                    self._add_kv(*obs)
                except Exception as e:
                    self.count_error("record", "record_kv_stats", e)

    def _add_misses(
        self, ts: Any, tenant: Any, engine: Any, family: Any, classes: tuple[Any, ...]
    ) -> None:
        bucket = self._bucket(ts) if self.miss_to_store else None
        lab = self._miss_labels.get((tenant, engine, family))
        if lab is None:
            if len(self._miss_labels) >= MISS_QUEUE_LIMIT:
                self._miss_labels.clear()  # a bound: the caps below decide the same labels again
            lab = self._miss_labels[(tenant, engine, family)] = (
                self.tenants.label(tenant),
                self._engine_cap.label(str(engine) if engine else "unknown"),
                self._family_cap.label(str(family) if family else "unknown"),
            )
        t, e, f = lab
        counts: dict[str, int] = {}
        for name, n in classes:
            k = int(n)
            if k < 0:
                raise ValueError(f"class {name!r} has {k} tokens")
            if k:
                c = name if name in _CLASSES else "unknown"  # an unknown name keeps the sum exact
                counts[c] = counts.get(c, 0) + k
        for c, k in counts.items():
            if self.miss_to_store:
                key = (bucket, t, e, f, c)
                acc = self.miss_cum.get(key)
                if acc is None:
                    self.miss_cum[key] = [k, 1]
                else:
                    acc[0] += k
                    acc[1] += 1
            xk = (t, e, c)
            self.miss_export[xk] = self.miss_export.get(xk, 0) + k

    def _add_kv(
        self, ts: Any, engine: Any, salt: Any, stored: Any, reused: Any, evicted: Any, resident: Any
    ) -> None:
        vals = (int(stored), int(reused), int(evicted), int(resident))
        if min(vals) < 0:
            raise ValueError(f"negative block counts {vals}")
        e = self._engine_cap.label(str(engine) if engine else "unknown")
        s = self._salt_cap.label(str(salt))
        if self.miss_to_store:
            key = (self._bucket(ts), e, s)
            acc = self.kv_cum.get(key)
            if acc is None:
                self.kv_cum[key] = list(vals)
            else:
                acc[0] += vals[0]
                acc[1] += vals[1]
                acc[2] += vals[2]
                acc[3] = vals[3]
        x = self.kv_export.get((e, s))
        if x is None:
            self.kv_export[(e, s)] = list(vals)
        else:
            x[0] += vals[0]
            x[1] += vals[1]
            x[2] += vals[2]
            x[3] = vals[3]

    # ---------------------------------------------------------- flush rows
    def miss_rows(
        self, now: float, last: dict[Any, Any]
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[Any, Any]]:
        """(``misses`` rows, ``kv_blocks`` rows, new snapshot) since the snapshot ``last``.

        A row's ts is its bucket, or ``now`` for calls without ``ts``. Buckets
        older than three flush intervals whose counts are in ``last`` (written)
        are forgotten here."""
        self.drain_misses()
        with self._miss_lock:
            old = now - 3 * self.miss_bucket_s
            for cum, kind in ((self.miss_cum, "m"), (self.kv_cum, "k")):
                for key in [k for k in cum if k[0] is not None and k[0] < old]:
                    if last.get((kind, key)) == tuple(cum[key]):
                        del cum[key]
            mrows: list[tuple[Any, ...]] = []
            krows: list[tuple[Any, ...]] = []
            snap: dict[Any, Any] = {}
            for key, v in self.miss_cum.items():
                cur = tuple(v)
                snap[("m", key)] = cur
                p = last.get(("m", key), (0, 0))
                if cur != p:
                    mrows.append(
                        (now if key[0] is None else key[0], *key[1:], cur[0] - p[0], cur[1] - p[1])
                    )
            for key, v in self.kv_cum.items():
                cur = tuple(v)
                snap[("k", key)] = cur
                p = last.get(("k", key), _KV_ZERO)
                if cur != p:
                    krows.append(
                        (
                            now if key[0] is None else key[0],
                            *key[1:],
                            cur[0] - p[0],
                            cur[1] - p[1],
                            cur[2] - p[2],
                            cur[3],
                        )
                    )
        return mrows, krows, snap

    def miss_totals(self) -> dict[tuple[str, str, str], int]:
        """Cumulative missed tokens by (tenant, engine, class): ``schema.MISS_LABELS`` order."""
        self.drain_misses()
        with self._miss_lock:
            return dict(self.miss_export)

    def kv_totals(self) -> dict[tuple[str, str], tuple[int, ...]]:
        """(engine, salt) -> (stored, reused, evicted, resident): cumulative counts, last gauge."""
        self.drain_misses()
        with self._miss_lock:
            return {k: tuple(v) for k, v in self.kv_export.items()}


def _blob(values: list[int]) -> bytes:
    return b"".join(int(v).to_bytes(8, "little") for v in values)


def trace_record(r: Any, tenant: str) -> tuple[Any, ...]:
    """A :class:`collectors.kv.attribution.TraceRow` as a ``block_trace`` row."""
    h = list(r.h)
    return (
        float(r.ts),
        float(r.t_end),
        tenant,
        str(r.engine),
        str(r.salt),
        int(r.prompt),
        int(r.output),
        int(r.cached),
        float(r.ttft),
        int(r.block_size),
        int(getattr(r, "capacity", 0) or 0),
        (h[0] & 0xFF) if h else 0,
        _blob(h),
        _blob(list(r.c)),
        _blob(list(r.s)),
        bytes(r.cls),
    )
