"""Analysis speed: everything the dashboard computes, over 7 days at 1-minute
resolution × 8 tenants × 5 layers, against one plain pandas groupby.

    python -m bench.bench_analysis

"Everything": hit rate by tenant × layer per 5 min with Wilson CIs and the
change against yesterday; warm-set coverage of every run; before/after effect
and ROI windows of every run; heat scores and request-prediction MAPE; the
12-dimension score (which fits the ROI decay of every run). Target < 1 s.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from warmscope.analysis import (
    AnalysisConfig,
    heat_scores,
    hit_rate_change,
    hit_table,
    prediction_mape,
    roi_windows,
    run_effect,
    score_card,
    slo_lambda,
    warm_set_coverage,
)

T0 = 1_795_824_000.0


def frames(days: int = 7, tenants: int = 8, layers: int = 5, runs: int = 20, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    minutes = days * 1440
    ts = T0 + 60.0 * np.arange(1, minutes + 1)
    tn = [f"tenant{chr(97 + i)}" for i in range(tenants)]
    ly = ["weights", "lora", "prefix_kv", "embedding", "response"][:layers]
    grid = pd.MultiIndex.from_product([ts, tn, ly], names=["ts", "tenant", "layer"]).to_frame(index=False)
    n = rng.poisson(40, len(grid))
    h = rng.binomial(n, 0.7)
    base = grid.assign(family=grid.layer + ":*", experiment="exp", variant=np.where(rng.random(len(grid)) < .5,
                       "A", "B"), model="m", replica=np.where(rng.random(len(grid)) < .5, "a-0", "b-0"),
                       length_bucket="")
    lookups = pd.concat([base.assign(result="hit", count=h), base.assign(result="miss", count=n - h)],
                        ignore_index=True).sort_values("ts", kind="stable", ignore_index=True)  # as sources give it
    rq = pd.MultiIndex.from_product([ts, tn, ["A", "B"]], names=["ts", "tenant", "variant"]).to_frame(index=False)
    nreq = rng.poisson(20, len(rq))
    requests = rq.assign(experiment="exp", model="m", replica=np.where(rq.variant == "A", "a-0", "b-0"),
                         sla_met="true", requests=nreq, gpu_s=nreq * rng.uniform(0.05, 0.2, len(rq)),
                         conversions=rng.binomial(nreq, 0.05), value=0.0)
    les = np.array([0.01, 0.04, 0.1, 0.25, 0.5, 1.0, np.inf])
    hist = rq.loc[rq.index.repeat(len(les))].reset_index(drop=True)
    hist = hist.assign(metric="gen_ai.server.time_to_first_token", experiment="exp", model="m",
                       replica=np.where(hist.variant == "A", "a-0", "b-0"), layer="",
                       le=np.tile(les, len(rq)), count=rng.poisson(3, len(hist)), sum=1.0, total=20)
    starts = T0 + np.sort(rng.uniform(0, days * 86400, runs))
    wr = pd.DataFrame({"run_id": [f"r{i}" for i in range(runs)], "strategy": "static_topk", "layer": "prefix_kv",
                       "tenant": "", "replica": "b-0", "trigger": "replica_start", "started": starts,
                       "ended": starts + 20, "gpu_s": 5.0, "status": "ok", "keys": 400})
    wk = pd.DataFrame({"run_id": np.repeat(wr.run_id, 400), "key_hash": [f"k{i}" for i in range(runs * 400)],
                       "warmed_at": np.repeat(wr.ended, 400), "ttl_s": np.nan, "gpu_s": 0.01,
                       "first_hit_at": np.where(rng.random(runs * 400) < .8, np.repeat(wr.ended, 400) + 30, np.nan),
                       "first_miss_at": np.nan, "hits": 1})
    ek = pd.DataFrame({"run_id": np.repeat(wr.run_id, 300), "key_hash": [f"k{i}" for i in range(runs * 300)],
                       "first_seen": np.repeat(wr.ended, 300) + 60, "lookups": 1})
    gauges = pd.DataFrame({"ts": np.tile(ts, 2), "metric": "warmscope.gpu.memory.usage_ratio",
                           "replica": np.repeat(["a-0", "b-0"], minutes), "value": rng.uniform(.5, .9, 2 * minutes)})
    return {"lookups": lookups, "requests": requests, "histograms": hist, "warmup_runs": wr, "warmed_keys": wk,
            "early_keys": ek, "gauges": gauges}


def everything(fr: dict, cfg: AnalysisConfig) -> dict:
    lk = fr["lookups"]
    end = lk.ts.max()
    out = {"hit_table": hit_table(lk, by=["tenant", "layer"], freq=300),
           "change": hit_rate_change(lk, ["tenant", "layer"], (end - 3600, end), "yesterday"),
           "coverage": warm_set_coverage(fr["warmup_runs"], fr["warmed_keys"], fr["early_keys"])}
    for run in fr["warmup_runs"].itertuples():
        run_effect(run, lk, fr["histograms"], fr["requests"])
        roi_windows(run, fr["requests"], cfg.price_per_gpu_s, cfg.value_per_conversion, cfg.roi_windows_s)
    out["heat"] = heat_scores(lk, end, slo_lambda(1000))
    out["mape"] = prediction_mape(lk)
    out["card"] = score_card(fr, cfg)
    return out


def main() -> None:
    fr = frames()
    cfg = AnalysisConfig()
    lk = fr["lookups"]
    print(f"lookups {len(lk):,} rows, requests {len(fr['requests']):,}, histograms {len(fr['histograms']):,}, "
          f"{len(fr['warmup_runs'])} warm-up runs")
    t = time.perf_counter()
    lk.groupby(["tenant", "layer"])["count"].sum()
    base = time.perf_counter() - t
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        out = everything(fr, cfg)
        best = min(best, time.perf_counter() - t)
    print(f"plain pandas groupby-sum   : {base * 1000:8.1f} ms  (1.00)")
    print(f"everything (best of 3)     : {best * 1000:8.1f} ms  ({best / base:.1f} x groupby; target < 1000 ms)")
    print(f"composite score {out['card'].composite:.3f}; dimensions with data: "
          f"{sum(d.score is not None for d in out['card'].dimensions)}/12")


if __name__ == "__main__":
    main()
