"""Simulator throughput: requests per second, and time for a simulated day.

    python -m bench.bench_simulator [--hours 24] [--tenants 8]

Runs the default day (12 rps mean, 8 tenants: ~1.07M requests) with two
worker processes (the default on a 2-core machine) and, as the baseline, the
same traffic for the first ``--baseline-hours`` in one process. Target: 1M
simulated requests in <= 60 s.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from warmscope.simulator import SimConfig, simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--baseline-hours", type=float, default=2.0)
    ap.add_argument("--tenants", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    base = simulate(SimConfig.load(hours=args.baseline_hours, tenants=args.tenants), tmp / "base.sqlite", workers=1)
    day = simulate(SimConfig.load(hours=args.hours, tenants=args.tenants), tmp / "day.sqlite", workers=2)
    print(f"baseline  1 worker  {args.baseline_hours:>5.1f} h: {base.requests:>9,} requests in {base.wall_s:6.1f} s"
          f" = {base.rps:>8,.0f} req/s  (1.00)")
    print(f"target    2 workers {args.hours:>5.1f} h: {day.requests:>9,} requests in {day.wall_s:6.1f} s"
          f" = {day.rps:>8,.0f} req/s  ({day.rps / base.rps:.2f} x baseline)")
    print(f"1M requests would take {1e6 / day.rps:.1f} s (target <= 60 s)")


if __name__ == "__main__":
    main()
