"""Run a simulation, in parallel when there are cores to spare.

The variant pools (A, B and an optional C) share nothing but the traffic, and
the traffic (arrivals, sessions) is drawn from the seed identically in every
process. So with ``workers >= 2`` each process simulates one or more pools — drawing all
traffic, serving its own pools' sessions. Their flushes go through a queue to one writer (this
process), which merges what has arrived into one store transaction: the workers never wait for
the store's write lock, and hourly rollups and A/B moments are read once per merged write rather
than once per flush. The store's contents are the same as a single-process run's, up to row order
and the numbering of warm-up runs (each process numbers its own pools' runs).
(``single_writer=False``: each worker writes to the store itself, as before.)

With fewer workers than pools, the pools are shared out by what they cost (``_groups``): on two
cores the demo's three pools run as two workers, {A, B} and {C}, and the traffic is drawn twice
instead of three times (12 hours of the demo: 87.2 s per million requests against 91.8 s, the
median of five runs each). Pools cost different amounts (the predictive strategy's forecasts): a
worker that runs ahead of the slowest yields its core, one scheduling-priority step at a time
(``_Balance``), so that they finish together rather than leave the slowest alone on a core at the
end (a day of the demo: 112.6 s → 108.0 s).

Several runs may append to one store at once (``warmscope simulate --append`` twice): each
write waits for the store's write lock as long as another run holds it (up to
``LOCK_WAIT_S``) instead of failing after SQLite's usual 5 s, so both runs' rows are kept.
Workers leave interrupts to this process: Ctrl-C or SIGTERM stops the run here, and the
workers end without a traceback of their own.

Example::

    summary = simulate(SimConfig.load(hours=24), "var/warmscope.sqlite", workers=2)
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from warmscope.collectors.store import EmbeddedStore

from .config import SimConfig
from .engine import Simulation, Summary, write_run_info
from .faults import Fault

__all__ = ["simulate", "LOCK_WAIT_S"]

LOCK_WAIT_S = 3600.0  # a write waits this long for another writer's transaction (a concurrent run)


def _store(path: str | Path) -> EmbeddedStore:
    return EmbeddedStore(path, durable=False, timeout=LOCK_WAIT_S)


Row = Sequence[object]  # one row of a store table


class _QueueStore:
    """The store as a worker sees it: each flush's rows go to the writer."""

    def __init__(self, q: Any) -> None:
        self.q = q

    def write(self, batches: Mapping[str, Sequence[Row]]) -> int:
        rows = {k: list(v) for k, v in batches.items() if v}
        if rows:
            self.q.put(("rows", rows))
        return sum(len(v) for v in rows.values())

    def close(self) -> None:
        pass


def _worker(
    cfg: SimConfig,
    path: str,
    faults: list[Fault],
    pools: tuple[str, ...],
    ticks: Any,
    out: Any,
    kw: dict[str, Any],
    single_writer: bool,
) -> None:
    def progress(done: int, total: int) -> None:
        ticks.value = done

    gc.set_threshold(*_GC_THRESHOLD)  # this process only; it exits after the run
    # The parent handles Ctrl-C and SIGTERM (and stops the workers): a worker ignores the one and
    # dies quietly of the other, whatever handlers it inherited.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        # the pipelines call only the store's write() and close(): the queue stands in for it
        store = cast(EmbeddedStore, _QueueStore(out)) if single_writer else _store(path)
        sim = Simulation(cfg, store, faults=faults, variants=pools, progress=progress, **kw)
        out.put(("done", "+".join(pools), sim.run(finish=False), None))
    except BaseException as e:  # report, don't hang the parent
        out.put(("done", "+".join(pools), None, f"{type(e).__name__}: {e}"))


# The simulation allocates millions of short-lived tuples and almost no reference cycles: the
# collector's default young-generation threshold (700) makes it scan them hundreds of thousands
# of times for nothing. Raised in the workers, and in the writer until the run ends (then restored).
_GC_THRESHOLD = (100_000, 50, 1000)
_MERGE_ROWS = 250_000  # rows gathered into one store write (bounds the writer's memory)


def _write_merged(st: EmbeddedStore, batches: list[dict[str, list[Row]]]) -> None:
    merged: dict[str, list[Row]] = {}
    for b in batches:
        for k, v in b.items():
            merged.setdefault(k, []).extend(v)
    st.write(merged)


# What a pool's worker costs per request on the demo's settings, by strategy (measured: no
# warm-up 0.95, static top-K 1, predictive 1.3 for its forecasts; the others taken as 1).
_POOL_COST = {"none": 0.95, "predictive": 1.3}


def _groups(cfg: SimConfig, workers: int) -> list[tuple[str, ...]]:
    """The pools each of ``workers`` processes simulates: one each when there are workers enough,
    otherwise the costliest first, each to the least loaded worker (the demo's three pools on two
    workers: {C} and {A, B})."""
    arms = list(cfg.arms)
    if workers >= len(arms):
        return [(a,) for a in arms]
    cost = {a: _POOL_COST.get(cfg.strategies[a], 1.0) for a in arms}
    groups: list[list[str]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for a in sorted(arms, key=lambda a: (-cost[a], a)):
        i = min(range(workers), key=lambda i: (load[i], i))
        groups[i].append(a)
        load[i] += cost[a]
    return [tuple(sorted(g)) for g in groups if g]


def _cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity on this system
        return os.cpu_count() or 1


class _Balance:
    """Keeps the pools' workers abreast. Pools cost different amounts per request (the predictive
    strategy's forecasts), and the operating system shares the cores out evenly: a cheap pool
    would finish first and leave a core to the expensive one alone. A worker that runs ahead of
    the slowest by more than ``_AHEAD`` of the run is given a lower scheduling priority, one
    ``nice`` step at a time from where it is (at most ``_MAX_NICE`` steps; a process may always
    lower its children's priority, never raise it back), so the slowest gets the larger share.
    Where the system has no ``setpriority``, nothing changes."""

    def __init__(self, procs: list[Any], ticks: list[Any], total: int) -> None:
        self.procs, self.ticks = procs, ticks
        self.ahead = max(2, int(total * _AHEAD))
        self.nice = [0] * len(procs)
        self.next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.next or not hasattr(os, "setpriority"):
            return
        self.next = now + 1.0
        done = [t.value for t in self.ticks]
        lo = min(done)
        for i, p in enumerate(self.procs):
            if done[i] - lo > self.ahead and self.nice[i] < _MAX_NICE and p.pid is not None:
                try:  # one step from where it is (a run started under `nice` starts higher)
                    now_at = os.getpriority(os.PRIO_PROCESS, p.pid)
                    os.setpriority(os.PRIO_PROCESS, p.pid, now_at + 1)
                    self.nice[i] += 1
                except OSError:  # gone already, or not allowed: it runs on as it is
                    self.nice[i] = _MAX_NICE


_AHEAD = 0.01  # of the run's ticks: how far a worker may run ahead before it yields
_MAX_NICE = 5


def simulate(
    cfg: SimConfig,
    store: str | Path,
    faults: list[Fault] | tuple[Fault, ...] = (),
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    single_writer: bool = True,
    **kw: Any,
) -> Summary:
    """Simulate into ``store``; ``workers``: processes simulating the pools (default: one per
    pool, at most one per core; 1: this process alone)."""
    workers = workers if workers is not None else min(len(cfg.arms), _cores())
    if workers <= 1 or kw.get("realtime") or kw.get("meter_provider") is not None:
        sim = Simulation(cfg, _store(store), faults=list(faults), progress=progress, **kw)
        return sim.run()
    path = str(store)
    st = _store(path)  # schema before the workers race to create it
    ctx = (
        mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    )
    groups = _groups(cfg, workers)
    ticks = [ctx.Value("i", 0) for _ in groups]
    results = ctx.Queue(
        maxsize=256
    )  # a writer that falls behind slows the workers down, memory stays bounded
    total = int(-(-cfg.hours * 3600 // cfg.tick_s))
    t0 = time.perf_counter()
    procs = [
        ctx.Process(
            target=_worker,
            args=(cfg, path, list(faults), g, ticks[i], results, kw, single_writer),
            daemon=True,
        )
        for i, g in enumerate(groups)
    ]
    for p in procs:
        p.start()
    balance = _Balance(procs, ticks, total)
    parts: list[Summary] = []
    errors: list[str] = []
    gc_before = gc.get_threshold()
    gc.set_threshold(*_GC_THRESHOLD)
    try:
        while len(parts) + len(errors) < len(procs):
            balance()
            if progress:
                progress(min(t.value for t in ticks), total)
            try:
                msg = results.get(timeout=0.2)
            except Exception:  # queue.Empty: still running
                if not any(p.is_alive() for p in procs) and results.empty():
                    errors.append("a simulation worker died without a result")
                continue
            # Rows: gather flushes until _MERGE_ROWS rows (or a worker's end), one transaction.
            # Fewer, larger writes: a unit or rollup row seen in several flushes is folded
            # once, and each write's fixed cost (rollup reads, commit) is paid less often.
            batch, n = [], 0
            while msg is not None and msg[0] == "rows":
                batch.append(msg[1])
                n += sum(len(v) for v in msg[1].values())
                msg = None
                while n < _MERGE_ROWS and msg is None:
                    balance()
                    if progress:
                        progress(min(t.value for t in ticks), total)
                    try:
                        msg = results.get(timeout=0.2)
                    except Exception:  # queue.Empty: a worker is busy, or they are all gone
                        if not any(p.is_alive() for p in procs) and results.empty():
                            break
            if batch:
                _write_merged(st, batch)
            if (
                msg is not None
            ):  # ("done", pools, summary, error): that worker's rows came before it
                _, pools, summ, err = msg
                (errors.append(f"pool {pools}: {err}") if err else parts.append(summ))
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    finally:
        gc.set_threshold(*gc_before)
        st.close()
    for p in procs:
        p.join()
    if errors:
        raise RuntimeError("simulation failed: " + "; ".join(errors))
    if progress:
        progress(total, total)
    st = _store(path)
    write_run_info(st, cfg, cfg.start, [f.ground_truth(cfg.start, cfg.hours) for f in faults])
    st.close()
    out = Summary()
    for part in parts:
        out.requests += part.requests
        out.lookups = out.lookups + part.lookups if out.lookups else Counter(part.lookups)
        out.warmups += part.warmups
        out.units.update(part.units)
        out.kv_missed += part.kv_missed
        out.miss_classes.update(part.miss_classes)
    out.wall_s = time.perf_counter() - t0
    return out
