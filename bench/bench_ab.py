"""A/B engine speed: 1M units × the report's metrics, against a plain pandas
groupby-mean over the same unit frame.

    python -m bench.bench_ab [--units 1000000]

Measures build_report (sufficient statistics, 14 metrics incl. two quantiles
over per-unit histograms, SRM, Holm/BH, mSPRT, power; the effect-over-time
curve included). Target: < 3 s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from warmscope.analysis.ab_report import build_report
from warmscope.model.schema import DURATION_BUCKETS


def units(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    req = rng.integers(1, 6, n)
    lat = rng.lognormal(0, 0.5, n) * req
    df = pd.DataFrame({
        "experiment": "exp", "variant": np.where(rng.random(n) < 0.5, "A", "B"),
        "unit_hash": np.arange(n).astype(str), "first_ts": rng.uniform(0, 86400, n), "requests": req,
        "latency_sum": lat, "latency_sq": lat * lat, "ttft_sum": lat / 5, "conversions": rng.binomial(req, 0.1),
        "value": rng.binomial(req, 0.1) * 4.0, "gpu_s": req * rng.uniform(0.05, 0.15, n),
        "sla_met": rng.binomial(req, 0.95)})
    df["last_ts"] = df["first_ts"] + 600
    for layer in ("prefix_kv", "response", "embedding"):
        lk = rng.poisson(3, n) * req
        df[f"lookups_{layer}"] = lk
        df[f"hits_{layer}"] = rng.binomial(lk, 0.6)
    b = len(DURATION_BUCKETS) + 1
    probs = np.ones(b) / b
    h = rng.multinomial(1, probs, n) * req[:, None]
    for i in range(b):
        df[f"h{i}"] = h[:, i]
    return df


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1_000_000)
    args = ap.parse_args()
    df = units(args.units)
    num = [c for c in df.columns if c not in ("experiment", "variant", "unit_hash")]
    t = time.perf_counter()
    df.groupby("variant")[num].mean()
    base = time.perf_counter() - t
    t = time.perf_counter()
    rep = build_report(df, "exp")
    took = time.perf_counter() - t
    print(f"{args.units:,} units, {len(rep.results)} metrics")
    print(f"plain pandas groupby-mean : {base * 1000:8.1f} ms  (1.00)")
    print(f"build_report              : {took * 1000:8.1f} ms  ({took / base:.1f} x groupby; target < 3000 ms)")
    print("verdict:", rep.verdict)


if __name__ == "__main__":
    main()
