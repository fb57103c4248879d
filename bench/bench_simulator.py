"""Simulator throughput: seconds per million requests with the store, against two references.

    python -m bench.bench_simulator [--hours 24] [--tenants 8] [--per-worker-writes]
    python -m bench.bench_simulator --reference DIR [--repeat 3] [--hours 24]

Runs the default traffic (12 rps mean, 8 tenants: ~1.07M requests a day) with
the default parallel layout (one worker process per pool; the workers queue
their flushes and this process merges and writes them, A/B moments included)
three times in one run:

* **baseline, no store**: the same workers, the same rows queued, but the
  writer drops them — what simulating and recording cost without the store;
* **bare inserts**: the same rows inserted with a bare ``sqlite3`` executemany
  into key-less, index-less copies of the tables in one transaction per merged
  write (no upserts, rollups, A/B moments or warmscope code): the least the
  store could cost with these rows, so baseline + bare inserts is a floor for
  any write path that keeps them;
* **with the store**: the same, written.

For each: wall seconds and CPU seconds per million requests, split into the
workers' (simulation, instrumentation, flush collection) and the writer's
(merge, ``EmbeddedStore.write``). On a shared machine the wall time swings with
the neighbours (the load average is printed); the CPU a run needs swings less
(the workers' by 10-20 % between runs here). On an idle machine wall ≈
max(total CPU / cores, the busiest process's CPU): the writer's, or a worker's
taken as the workers' mean (their CPU is read as one sum).
``--per-worker-writes`` adds the older layout (each worker writes to the store
itself). Target: 1M simulated requests in <= 45 s with A/B moments on.

That target was set as 45 s against 34.1 s per million requests (36.6 s for
the default day) for the simulator before A/B moments were kept at write time:
a ratio of 1.32, measured on a machine state these figures do not reproduce.
``--reference DIR`` measures the ratio itself: DIR is a checkout of that
earlier simulator (``git worktree add DIR 4f2502a``: a checkout with top-level
``simulator/`` and ``collectors/`` packages, from before the ``warmscope``
namespace). Its day and this one run alternately, ``--repeat`` pairs, each run
in a fresh process; the bench prints each pair's wall and CPU ratio and the
median against 1.32.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from warmscope.collectors.store.layout import TABLES
from warmscope.simulator import SimConfig, simulate
from warmscope.simulator import run as sim_run

TARGET_S = 45.0  # seconds per million simulated requests, A/B moments on
# The same target against the simulator before A/B moments, when it was set: that one took 36.6 s for the
# default day of 1,073,471 requests, 34.1 s per million.
TARGET_RATIO = 45.0 / (36.6 / 1.073471)

# One simulated day in a fresh process; prints its figures as JSON. argv: hours, tenants, store path,
# and the reference checkout (empty: this warmscope).
_CHILD = """
import json, resource, sys, time
hours, tenants, path, ref = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if ref:
    sys.path.insert(0, ref)
    from simulator import SimConfig, simulate
else:
    from warmscope.simulator import SimConfig, simulate
def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime
t = time.perf_counter()
day = simulate(SimConfig.load(hours=hours, tenants=tenants), path, workers=2)
print(json.dumps({"requests": day.requests, "wall": time.perf_counter() - t,
                  "cpu": cpu(resource.RUSAGE_SELF) + cpu(resource.RUSAGE_CHILDREN)}))
"""


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _timed(cfg: SimConfig, path: Path, **kw: Any) -> tuple[Any, float, float]:
    """(summary, this process's CPU s, the finished workers' CPU s)."""
    s0, c0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    out = simulate(cfg, path, workers=2, **kw)
    return out, _cpu(resource.RUSAGE_SELF) - s0, _cpu(resource.RUSAGE_CHILDREN) - c0


class _BareWriter:
    """A stand-in for the run's writer: each merged write's rows, table by table, with a bare
    executemany into tables of the same columns without keys or indexes, one transaction."""

    def __init__(self, path: Path) -> None:
        self.con = con = sqlite3.connect(path)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("PRAGMA cache_size=-65536")
        for name, cols in TABLES.items():
            con.execute(f"CREATE TABLE {name}({', '.join(f'c{i}' for i in range(len(cols)))})")
        self.sql = {name: f"INSERT INTO {name} VALUES({', '.join('?' * len(cols))})" for name, cols in TABLES.items()}

    def __call__(self, st: Any, batches: list[dict[str, Any]]) -> None:
        with self.con:
            for b in batches:
                for table, rows in b.items():
                    self.con.executemany(self.sql[table], rows)


def _child_day(hours: float, tenants: int, path: Path, ref: str) -> dict[str, float]:
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(hours), str(tenants), str(path), ref],
                             capture_output=True, text=True, cwd=ref or None)
    finally:
        for f in path.parent.glob(path.name + "*"):  # a day's store is hundreds of MB
            f.unlink()
    if out.returncode != 0:
        sys.exit(f"bench_simulator: the {'reference' if ref else 'current'} run failed: "
                 f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def versus_reference(ref: Path, hours: float, tenants: int, repeat: int, tmp: Path) -> None:
    """Alternate the reference simulator's day and this one's; print the ratios and the verdict."""
    run_py = ref / "simulator" / "run.py"
    if not run_py.is_file():
        sys.exit(f"bench_simulator: {ref} is not a warmscope checkout with a simulator/ folder; "
                 "make one with `git worktree add DIR 4f2502a`")
    if re.search(r"^\s*(from|import) warmscope\b", run_py.read_text(), re.M):
        sys.exit(f"bench_simulator: {ref} imports the installed warmscope namespace, so its simulator would run "
                 "this checkout's collectors; compare with a checkout from before the namespace (e.g. 4f2502a)")
    walls, cpus = [], []
    for i in range(repeat):
        r = _child_day(hours, tenants, tmp / f"ref{i}.sqlite", str(ref.resolve()))
        c = _child_day(hours, tenants, tmp / f"cur{i}.sqlite", "")
        if r["requests"] != c["requests"]:
            print(f"note: the reference simulated {r['requests']:,} requests and this one {c['requests']:,}; "
                  "figures are per million requests")
        per_r, per_c = 1e6 / r["requests"], 1e6 / c["requests"]
        walls.append(c["wall"] * per_c / (r["wall"] * per_r))
        cpus.append(c["cpu"] * per_c / (r["cpu"] * per_r))
        print(f"pair {i + 1}: reference wall {r['wall'] * per_r:5.1f} s, CPU {r['cpu'] * per_r:6.1f} s | this one "
              f"wall {c['wall'] * per_c:5.1f} s, CPU {c['cpu'] * per_c:6.1f} s per 1M requests | ratio wall "
              f"{walls[-1]:.2f}, CPU {cpus[-1]:.2f}; load {os.getloadavg()[0]:.1f}", flush=True)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    met = "MET" if wall <= TARGET_RATIO else "NOT MET"
    print(f"verdict: with A/B moments on, the simulator takes {wall:.2f} x the reference's wall time per 1M requests "
          f"(median of {repeat}; CPU {cpu:.2f} x). Target <= {TARGET_RATIO:.2f} x (45 s against 34.1 s): {met}")


def main() -> None:
    ap = argparse.ArgumentParser(description="Simulator throughput: seconds per million requests with the "
                                             "store, against a no-store baseline and bare inserts of the same rows.")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours of each run")
    ap.add_argument("--tenants", type=int, default=8, help="tenants in the simulated traffic")
    ap.add_argument("--per-worker-writes", action="store_true",
                    help="also time the older layout: each worker writes to the store itself")
    ap.add_argument("--reference", type=Path, metavar="DIR",
                    help="instead, alternate this simulator with the one checked out in DIR (e.g. `git worktree add "
                         "DIR 4f2502a`, before A/B moments) and print the ratio")
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs with --reference (default 3)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory() as d:
        run(args, Path(d))


def run(args: argparse.Namespace, tmp: Path) -> None:
    if args.reference is not None:
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count() or 1} cores", flush=True)
        versus_reference(args.reference, args.hours, args.tenants, args.repeat, tmp)
        return
    cores = os.cpu_count() or 1
    print(f"load average before: {os.getloadavg()[0]:.1f} on {cores} cores", flush=True)
    cfg = SimConfig.load(hours=args.hours, tenants=args.tenants)
    write = sim_run._write_merged
    runs: list[tuple[str, dict[str, Any]]] = [("baseline, no store", {"drop": True}),
                                              ("bare inserts", {"bare": True}), ("with the store", {})]
    if args.per_worker_writes:
        runs.append(("each worker writes", {"single_writer": False}))
    base_wall = None
    store_run: tuple[float, float, float] | None = None  # (wall, CPU total, idle floor) per 1M, with the store
    cpu: dict[str, tuple[float, float]] = {}  # label -> (workers, writer) CPU s per 1M
    for i, (label, kw) in enumerate(runs):
        drop, bare = kw.pop("drop", False), kw.pop("bare", False)
        bare_writer = _BareWriter(tmp / f"bare{i}.sqlite") if bare else None
        sim_run._write_merged = (lambda st, batches: None) if drop else bare_writer or write
        try:
            day, parent, workers = _timed(cfg, tmp / f"run{i}.sqlite", **kw)
        finally:
            sim_run._write_merged = write
            if bare_writer is not None:
                bare_writer.con.close()
            for f in tmp.glob("*.sqlite*"):  # a day's store is hundreds of MB
                f.unlink()
        per = 1e6 / day.requests
        wall = day.wall_s * per
        base_wall = base_wall or wall
        total = (parent + workers) * per
        floor = max(total / cores, workers * per / len(cfg.arms), parent * per)
        print(f"{label:<20} {args.hours:>4g} h: {day.requests:>9,} requests; per 1M requests: wall {wall:6.1f} s "
              f"({wall / base_wall:.2f} x baseline), CPU {total:6.1f} s = workers {workers * per:6.1f} + writer "
              f"{parent * per:5.1f}; on an idle {cores}-core machine >= {floor:.0f} s "
              f"(target <= {TARGET_S:.0f} s); load {os.getloadavg()[0]:.1f}", flush=True)
        cpu[label] = (workers * per, parent * per)
        if label == "with the store":
            store_run = (wall, total, floor)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if store_run is not None:
        wall, total, floor = store_run
        met = "MET" if floor <= TARGET_S else "NOT MET"
        print(f"verdict: with the store, 1M requests take {total:.1f} s of CPU; on an idle {cores}-core machine that "
              f"is >= {floor:.1f} s of wall (measured here: {wall:.1f} s under load). Target <= {TARGET_S:.0f} s "
              f"per 1M requests: {met}" + ("" if floor <= TARGET_S else f" ({floor / TARGET_S:.2f} x the target)."))
    if "bare inserts" in cpu:
        # The workers' CPU swings by 10-20 % between runs on a shared machine; the writers' CPU is
        # compared here, each added to the baseline run's workers.
        base_w = cpu["baseline, no store"][0]
        bare_wr, store_wr = cpu["bare inserts"][1], cpu["with the store"][1]
        bare_floor = (base_w + bare_wr) / cores
        print(f"writer CPU per 1M requests: bare inserts {bare_wr:.1f} s, the store {store_wr:.1f} s "
              f"({store_wr / bare_wr:.2f} x bare). The baseline's workers plus bare inserts of the same rows: "
              f"{base_w + bare_wr:.1f} s of CPU, >= {bare_floor:.1f} s on an idle {cores}-core machine "
              f"({bare_floor / TARGET_S:.2f} x the target): a floor for any writer that keeps these rows.")


if __name__ == "__main__":
    main()
