"""Warm-up tracking: which warmed keys were read, and which keys were asked
for right after a run (warm-set precision and recall).

The lookup path touches this only through a ``dict.get`` on the warmed keys
and a loop over the (usually empty) list of open recall windows; the
bookkeeping of runs (:meth:`WarmupTracking.warmup_event`) happens off the
lookup path, called by :class:`collectors.warmup.WarmupRun`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WarmedKey", "EarlyWindow", "WarmupTracking", "RUN_SUMS"]

HIT = 0  # as aggregator.HIT (a leaf module: no import of the aggregator)
# Per finished-run label set (WARMUP_LABELS + status): these sums, in this order.
RUN_SUMS = ("runs", "keys", "bytes", "gpu_s")
S_RUNS, S_KEYS, S_BYTES, S_GPU_S = range(len(RUN_SUMS))


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
    labels: tuple[Any, ...] = ()  # the run's WARMUP_LABELS values
    first_hit_at: float | None = None
    first_miss_at: float | None = None
    hits: int = 0
    exported: tuple[Any, ...] | None = None  # state at the last export


@dataclass(slots=True)
class EarlyWindow:
    """Keys requested right after a warm-up run (for warm-set recall)."""

    run_id: str
    layer: str
    tenant: str | None  # None: all tenants
    until: float
    limit: int
    seen: dict[Any, Any] = field(default_factory=dict)  # raw key -> [first_seen, lookups, family]
    overflow: int = 0


class WarmupTracking:
    """The warm-up half of the aggregator."""

    clock: Callable[[], float]
    warmed_key_limit: int
    early_key_limit: int
    _lock: threading.Lock

    def _init_tracking(self) -> None:
        # Touched on the hot path only by dict.get / an empty-list check.
        self.warmed: dict[object, WarmedKey] = {}
        self.early: list[EarlyWindow] = []
        self.events: deque[Any] = deque()  # warm-up run records for the sinks
        self.warmup_counts: dict[
            tuple[Any, ...], list[Any]
        ] = {}  # WARMUP_LABELS + (status,) -> RUN_SUMS
        self.warmup_active: dict[tuple[Any, ...], int] = {}
        self.warm_read: dict[tuple[Any, ...], int] = {}  # WARMUP_LABELS -> warmed keys read
        # Runs recorded by another process for this replica (collectors.run_follow): their
        # warmed keys by hash until a request brings the raw key, and the ids made here.
        self.remote_warmed: dict[str, WarmedKey] = {}
        self.local_runs: set[str] = set()

    def count_error(self, stage: str, message: str = "", exc: BaseException | None = None) -> None:
        raise NotImplementedError  # pragma: no cover - provided by the aggregator

    def warmup_event(
        self, kind: str, labels: tuple[Any, ...], record: dict[Any, Any], status: str = ""
    ) -> None:
        """Book a warm-up start/end (called by WarmupRun; not on the lookup path)."""
        with self._lock:
            if kind == "start":
                self.local_runs.add(record.get("run_id", ""))
                self.warmup_active[labels] = self.warmup_active.get(labels, 0) + 1
            else:
                self.warmup_active[labels] = self.warmup_active.get(labels, 1) - 1
                sums = self.warmup_counts.setdefault(labels + (status,), [0, 0, 0, 0.0])
                sums[S_RUNS] += 1
                sums[S_KEYS] += record.get("keys", 0)
                sums[S_BYTES] += record.get("bytes", 0)
                sums[S_GPU_S] += record.get("gpu_s", 0.0)
            self.events.append(("run", dict(record)))

    def add_warmed(self, w: WarmedKey) -> bool:
        if len(self.warmed) >= self.warmed_key_limit:
            self.count_error("record", "warmed-key limit reached; key not tracked for precision")
            return False
        self.warmed[w.key_hash_src] = w
        return True

    def follow_run(
        self,
        run_id: str,
        layer: str,
        tenant: str | None,
        labels: tuple[Any, ...],
        ended: float,
        early_window_s: float,
        keys: list[tuple[str, WarmedKey]],
        now: float,
    ) -> None:
        """A run recorded by another process (not on the lookup path): its
        warmed keys wait by hash for :meth:`adopt_warmed`, and its recall
        window is opened for what is left of it."""
        for key_hash, w in keys:
            if len(self.remote_warmed) + len(self.warmed) >= self.warmed_key_limit:
                self.count_error(
                    "record", "warmed-key limit reached; key not tracked for precision"
                )
                break
            w.labels = labels
            self.remote_warmed[key_hash] = w
        until = ended + early_window_s
        if until > now and self.early_key_limit > 0:
            win = EarlyWindow(run_id, layer, tenant, until, self.early_key_limit)
            with self._lock:
                self.early = self.early + [win]

    def adopt_warmed(self, key: object, key_hash: str) -> None:
        """The first request for a key warmed by a followed run: from now on
        it is tracked like a key warmed here (called before its lookup is recorded)."""
        w = self.remote_warmed.pop(key_hash, None)
        if w is not None:
            w.key_hash_src = key
            self.warmed[key] = w

    def forget_remote(self, now: float) -> None:
        """Drop followed keys never requested whose entry has expired (as the
        exporter drops warmed keys past their horizon)."""
        for kh, w in list(self.remote_warmed.items()):
            if now > w.warmed_at + (w.ttl_s if w.ttl_s else 86400.0):
                self.remote_warmed.pop(kh, None)

    def open_early_window(
        self, run_id: str, layer: str, tenant: str | None, seconds: float
    ) -> None:
        if seconds <= 0 or self.early_key_limit <= 0:
            return
        win = EarlyWindow(run_id, layer, tenant, self.clock() + seconds, self.early_key_limit)
        with self._lock:
            self.early = self.early + [win]  # copy-on-write: the hot path iterates it

    def _warmed_read(self, w: WarmedKey, result: int) -> None:
        if result == HIT:
            w.hits += 1
            if w.first_hit_at is None:
                w.first_hit_at = self.clock()
                if w.first_miss_at is None:  # read while still the warmed entry
                    self.warm_read[w.labels] = self.warm_read.get(w.labels, 0) + 1
        elif w.first_miss_at is None:
            w.first_miss_at = self.clock()

    def _early_read(self, b: Any, key: object, fam: str, ctx: Any) -> None:
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
