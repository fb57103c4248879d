"""Root-cause localisation speed: 5 dimensions, 50k leaves, against one pandas groupby.

    python -m bench.bench_rca [--repeat 5]

A ratio measure (hit rate) with a planted two-dimensional anomaly, and an additive
measure with the same plant. Target < 0.3 s per case. On a shared machine wall
time grows with the load, so each figure is the best of ``--repeat`` runs (wall
and CPU), printed beside the same run's baseline — one pandas groupby of the 50k
leaves by two dimensions — and the load average.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np
import pandas as pd
from warmscope.analysis.rootcause import localize


def best_of(fn, repeat: int) -> tuple[float, float, object]:
    """The smallest wall and CPU seconds of ``repeat`` calls, and the last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--repeat", type=int, default=5, help="runs per figure; the best is shown (default 5)"
    )
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sizes = {
        "tenant": 20,
        "layer": 5,
        "family": 25,
        "replica": 10,
        "bucket": 8,
    }  # 200k combos; sample 50k
    grid = (
        pd.DataFrame(
            list(itertools.product(*[[f"{k}{i}" for i in range(n)] for k, n in sizes.items()])),
            columns=list(sizes),
        )
        .sample(50_000, random_state=0)
        .reset_index(drop=True)
    )
    den = rng.poisson(100, len(grid)) + 1
    p = rng.beta(8, 3, len(grid))
    m = (grid.tenant == "tenant3") & (grid.layer == "layer1")
    leaves = grid.assign(vn=rng.binomial(den, np.where(m, p * 0.3, p)), vd=den, fn=p * den, fd=den)
    f = p * den
    additive = leaves.assign(
        v=np.where(m, f * 0.3, f * np.exp(rng.normal(0, 0.05, len(grid)))), f=f
    )
    print(
        f"{len(leaves):,} leaves, {len(sizes)} dimensions; best of {args.repeat} runs; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    base, base_cpu, _ = best_of(
        lambda: leaves.groupby(["tenant", "layer"])[["vn", "vd"]].sum(), args.repeat
    )
    print(f"one pandas groupby  : {base * 1000:7.1f} ms wall {base_cpu * 1000:7.1f} ms CPU  (1.00)")
    for label, kw, df in (
        ("ratio", dict(v_num="vn", v_den="vd", f_num="fn", f_den="fd"), leaves),
        ("additive", dict(v="v", f="f"), additive),
    ):
        took, cpu, loc = best_of(lambda df=df, kw=kw: localize(df, list(sizes), **kw), args.repeat)
        print(
            f"localize, {label:<9} : {took * 1000:7.1f} ms wall {cpu * 1000:7.1f} ms CPU  "
            f"({took / base:.1f} x groupby wall, {cpu / max(base_cpu, 1e-9):.1f} x CPU; "
            "target < 300 ms) "
            f"found {[c.element for c in loc.causes]}"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
