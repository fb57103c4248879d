"""Simulator throughput: requests per second, and time for a simulated day.

    python -m bench.bench_simulator [--hours 24] [--tenants 8]

Runs the default day (12 rps mean, 8 tenants: ~1.07M requests) with two
worker processes (the default on a 2-core machine) twice, in one run: as
before (each worker writes its flushes to the store itself, so the two
serialise on its write lock) and with one writer (the workers queue their
flushes; the parent merges and writes them). The baseline is the same traffic
for the first ``--baseline-hours`` in one process. Target: 1M simulated
requests in <= 45 s with A/B moments on.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
from pathlib import Path

from warmscope.simulator import SimConfig, simulate


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the workers): on a shared, loaded
    machine the wall time swings with the neighbours; the CPU time a run needs does not."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description="Simulator throughput: requests per second, and time for a day.")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours of the timed runs")
    ap.add_argument("--baseline-hours", type=float, default=2.0, help="simulated hours of the 1-worker baseline")
    ap.add_argument("--tenants", type=int, default=8, help="tenants in the simulated traffic")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    c = _cpu()
    base = simulate(SimConfig.load(hours=args.baseline_hours, tenants=args.tenants), tmp / "base.sqlite", workers=1)
    base_cpu = (_cpu() - c) / base.requests * 1e6
    print(f"baseline   1 worker  {args.baseline_hours:>5.1f} h: {base.requests:>9,} requests in {base.wall_s:6.1f} s"
          f" = {base.rps:>8,.0f} req/s  (1.00); CPU {base_cpu:.1f} s per 1M requests", flush=True)
    for label, single in (("before", False), ("after", True)):
        c = _cpu()
        day = simulate(SimConfig.load(hours=args.hours, tenants=args.tenants), tmp / f"{label}.sqlite", workers=2,
                       single_writer=single)
        cpu = (_cpu() - c) / day.requests * 1e6
        how = "one writer fed by a queue" if single else "each worker writes to the store"
        print(f"{label:<6}  2 workers {args.hours:>5.1f} h: {day.requests:>9,} requests in {day.wall_s:6.1f} s"
              f" = {day.rps:>8,.0f} req/s  ({day.rps / base.rps:.2f} x baseline; {how}); "
              f"1M requests: {1e6 / day.rps:.1f} s (target <= 45 s); CPU {cpu:.1f} s per 1M requests "
              f"({cpu / base_cpu:.2f} x baseline's)", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
