"""Root-cause localisation speed: 5 dimensions, 50k leaves, against one pandas groupby.

    python -m bench.bench_rca

A ratio measure (hit rate) with a planted two-dimensional anomaly. Target < 1 s.
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
    t = time.perf_counter()
    loc = localize(leaves, list(sizes), v_num="vn", v_den="vd", f_num="fn", f_den="fd")
    took = time.perf_counter() - t
    print(f"{len(leaves):,} leaves, {len(sizes)} dimensions; found {[c.element for c in loc.causes]}")
    print(f"one pandas groupby : {base * 1000:8.1f} ms  (1.00)")
    print(f"localize           : {took * 1000:8.1f} ms  ({took / base:.1f} x groupby; target < 1000 ms)")


if __name__ == "__main__":
    main()
