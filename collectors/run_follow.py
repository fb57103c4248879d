"""Follow warm-up runs that another process recorded for this replica.

``warmscope warmup`` (or any process calling the warm-up runner) warms an
engine and records the run — its keys as keyed hashes only — in the shared
store (the embedded SQLite store, or Redis). The serving process in front of
that engine sees the requests that follow. A :class:`RunFollower` joins the
two: at every flush (the pipeline's background thread, never a request), it
reads the finished runs of its layer recorded for its own replica label in
the last ``lookback_s`` seconds that it did not make itself, and for each new
one

* registers the run's warmed keys by hash (with what the store already knows
  of them: first hit and miss, hits), so that the first request whose prefix
  key has that hash adopts the warmed entry and from then on it is counted
  like a key this process warmed (warm-set precision);
* opens the run's recall window (``early_window_s`` after the run ended), so
  the keys requested in it are recorded against the run (recall).

The rows it then writes replace the store's rows of those keys (same run id
and key hash), so precision and recall of a run started elsewhere come out of
:func:`warmscope.analysis.coverage.warm_set_coverage` exactly like those of a
run made in process. Runs are matched by replica label: start the warm-up with
the serving process's replica (``warmscope warmup --replica NAME`` or
``WARMSCOPE_REPLICA``). With the background flusher the follower is also polled
between flushes, about every second (``poll``; one query of the run index), so a run
is followed within about a second of its end. Requests served before it is followed
are not in its recall window and their reads of its warmed keys are not credited to
it (a warmed key read again later is); a pipeline flushed by hand
(``background=False``) follows runs at its flushes.

The client instrumentation follows runs of the ``prefix_kv`` layer by default
(:class:`~warmscope.collectors.llm.LLMRecorder`, ``follow_runs``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .warm_tracking import WarmedKey

__all__ = ["RunFollower", "follow_runs"]

log = logging.getLogger("warmscope.collectors")

_RUN_SQL = (
    "SELECT run_id, tenant, strategy, trigger, ended FROM warmup_runs WHERE replica = ? AND layer "
    "= ? AND ended IS NOT NULL AND status != 'running' AND started >= ?"
)
_KEYS_SQL = (
    "SELECT key_hash, family, tenant, warmed_at, ttl_s, gpu_s, first_hit_at, first_miss_at, hits "
    "FROM warmed_keys WHERE run_id = ?"
)


class RunFollower:
    """Reads runs recorded elsewhere for this replica and ``layer`` and hands
    them to the aggregator (see the module doc). ``refresh`` runs at every
    flush; it never raises (failures are counted)."""

    poll = True  # polled between flushes too (Telemetry._poll_hooks)

    def __init__(
        self, telemetry: Any, layer: str = "prefix_kv", lookback_s: float = 86400.0
    ) -> None:
        self.tel = telemetry
        self.agg = telemetry.aggregator
        self.layer = layer
        self.lookback_s = float(lookback_s)
        self.followed: set[str] = set()
        self._other: set[str] = set()  # runs (in Redis) of another replica or layer: not read again

    def __call__(self, now: float) -> None:
        self.refresh(now)

    def refresh(self, now: float | None = None) -> int:
        """Follow the runs not seen before; returns how many. Never raises."""
        try:
            now = self.tel.clock() if now is None else now
            agg = self.agg
            new = 0
            for run_id, tenant, strategy, trigger, ended, keys in self._runs(
                now - self.lookback_s
            ):  # new runs only
                self.followed.add(run_id)
                labels = (
                    tenant or "unknown",
                    self.layer,
                    strategy,
                    trigger,
                    agg.replica,
                )  # WARMUP_LABELS
                agg.follow_run(
                    run_id,
                    self.layer,
                    tenant or None,
                    labels,
                    float(ended),
                    float(self.tel.config.early_window_s),
                    keys,
                    now,
                )
                new += 1
            agg.forget_remote(now)
            return new
        except Exception as e:
            self.agg.count_error("record", "following warm-up runs recorded elsewhere", e)
            return 0

    def _runs(self, since: float) -> list[tuple[Any, ...]]:
        """(run id, tenant, strategy, trigger, ended, warmed keys) of finished
        runs of this replica and layer started after ``since``; keys only for
        runs not followed yet."""
        if self.tel.redis_sink is not None:
            return self._redis_runs(since)
        store = self.tel.store
        if store is None:
            return []
        out = []
        for run_id, tenant, strategy, trigger, ended in store.query(
            _RUN_SQL, (self.agg.replica, self.layer, since)
        ):
            if run_id in self.followed or run_id in self.agg.local_runs:
                continue
            keys = [self._key(run_id, tenant, *row) for row in store.query(_KEYS_SQL, (run_id,))]
            out.append((run_id, tenant, strategy, trigger, ended, keys))
        return out

    def _redis_runs(self, since: float) -> list[tuple[Any, ...]]:
        from .redis_sink import PREFIX, key, run_tag

        c = self.tel.redis_sink._client()
        out = []
        for raw in c.zrangebyscore(f"{PREFIX}:runs", since, "+inf"):
            run_id = raw.decode() if isinstance(raw, bytes) else raw
            if run_id in self.followed or run_id in self.agg.local_runs or run_id in self._other:
                continue
            rec = {_s(k): _s(v) for k, v in c.hgetall(key(run_tag(run_id))).items()}
            if rec and (rec.get("replica") != self.agg.replica or rec.get("layer") != self.layer):
                self._other.add(run_id)
                continue
            if not rec.get("ended") or rec.get("status") in (
                None,
                "",
                "running",
            ):  # not finished yet
                continue
            keys = []
            for kh, js in c.hgetall(key(run_tag(run_id), "warmed")).items():
                fam, tenant, _layer, *rest = json.loads(js)
                keys.append(self._key(run_id, rec.get("tenant", ""), _s(kh), fam, tenant, *rest))
            out.append(
                (
                    run_id,
                    rec.get("tenant", ""),
                    rec.get("strategy", ""),
                    rec.get("trigger", ""),
                    float(rec["ended"]),
                    keys,
                )
            )
        return out

    def _key(
        self,
        run_id: str,
        run_tenant: str,
        key_hash: str,
        family: str,
        tenant: str,
        warmed_at: float,
        ttl_s: float | None,
        gpu_s: float | None,
        first_hit: float | None,
        first_miss: float | None,
        hits: int | None,
    ) -> tuple[str, WarmedKey]:
        """(key hash, the warmed key as the store has it); the raw key comes
        with the first request that has this hash."""
        w = WarmedKey(
            run_id,
            None,
            family,
            tenant or run_tenant or "unknown",
            self.layer,
            float(warmed_at),
            _num(ttl_s),
            float(gpu_s or 0.0),
            first_hit_at=_num(first_hit),
            first_miss_at=_num(first_miss),
            hits=int(hits or 0),
        )
        w.exported = (w.first_hit_at, w.first_miss_at, w.hits)  # the store has this state already
        return key_hash, w


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _num(v: Any) -> float | None:
    if v is None or v == "":
        return None
    f = float(v)
    return None if f != f else f  # NaN -> None


def follow_runs(telemetry: Any, layer: str = "prefix_kv") -> RunFollower:
    """The pipeline's follower of ``layer`` (made and hooked to its flush once)."""
    for hook in telemetry.flush_hooks:
        if isinstance(hook, RunFollower) and hook.layer == layer:
            return hook
    f = RunFollower(telemetry, layer)
    telemetry.flush_hooks.append(f)
    return f
