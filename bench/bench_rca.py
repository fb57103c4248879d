"""Root-cause localisation speed: 5 dimensions, 50k leaves, against one pandas groupby.

    python -m bench.bench_rca

A ratio measure (hit rate) with a planted two-dimensional anomaly, and an additive
measure with the same plant. Target < 0.3 s per case (wall; CPU shown beside it).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pandas as pd

from warmscope.analysis.rootcause import localize


def main() -> None:
    rng = np.random.default_rng(0)
    sizes = {"tenant": 20, "layer": 5, "family": 25, "replica": 10, "bucket": 8}  # 200k combos; sample 50k
    grid = pd.DataFrame(list(itertools.product(*[[f"{k}{i}" for i in range(n)] for k, n in sizes.items()])),
                        columns=list(sizes)).sample(50_000, random_state=0).reset_index(drop=True)
    den = rng.poisson(100, len(grid)) + 1
    p = rng.beta(8, 3, len(grid))
    m = (grid.tenant == "tenant3") & (grid.layer == "layer1")
    leaves = grid.assign(vn=rng.binomial(den, np.where(m, p * 0.3, p)), vd=den, fn=p * den, fd=den)
    t = time.perf_counter()
    leaves.groupby(["tenant", "layer"])[["vn", "vd"]].sum()
    base = time.perf_counter() - t
    print(f"{len(leaves):,} leaves, {len(sizes)} dimensions")
    print(f"one pandas groupby     : {base * 1000:8.1f} ms  (1.00)")
    f = p * den
    additive = leaves.assign(v=np.where(m, f * 0.3, f * np.exp(rng.normal(0, 0.05, len(grid)))), f=f)
    for label, kw, df in (("ratio", dict(v_num="vn", v_den="vd", f_num="fn", f_den="fd"), leaves),
                          ("additive", dict(v="v", f="f"), additive)):
        t, c = time.perf_counter(), time.process_time()
        loc = localize(df, list(sizes), **kw)
        took, cpu = time.perf_counter() - t, time.process_time() - c
        print(f"localize, {label:<9}: {took * 1000:8.1f} ms  ({took / base:.1f} x groupby; CPU {cpu * 1000:.0f} ms; "
              f"target < 300 ms) found {[c.element for c in loc.causes]}")


if __name__ == "__main__":
    main()
