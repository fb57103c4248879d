"""Advisor speed and quality on a simulated day: forecasts + tuning, against baselines in the same run.

    python -m bench.bench_advisor [--store var/warmscope.sqlite] [--hours 24] [--iterations 16]

Without --store, simulates ``--hours`` into a temporary store first (not timed). Times reading the frames,
the forecasts (every horizon, every model, per key family) and the tuning (calibration + 8 start points +
``--iterations`` Bayesian-optimisation steps); the baselines measured in the same run are one pandas
groupby-sum of the lookups (the cheapest pass over the same data) and random search with the same number
of replays (for the objective reached). Target: forecasts + tuning < 60 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="a recorded store (default: simulate one)")
    ap.add_argument("--hours", type=float, default=24.0, help="hours to simulate without --store")
    ap.add_argument("--iterations", type=int, default=16, help="Bayesian-optimisation steps after 8 start points")
    args = ap.parse_args(argv)
    from warmscope.analysis.advisor import advise, to_params
    from warmscope.analysis.forecast import forecast_table
    from warmscope.analysis.replay import calibrate, replay
    from warmscope.sources import EmbeddedSource

    store = args.store
    if store is None:
        from warmscope.simulator import SimConfig, simulate

        store = str(Path(tempfile.mkdtemp()) / "day.sqlite")
        print(f"simulating {args.hours:g} h into {store} …")
        simulate(SimConfig.load(None, hours=args.hours, strategy_a="none", strategy_b="static_topk"), store)
    t = time.perf_counter()
    fr = EmbeddedSource(store).frames(["lookups", "warmup_runs", "warmed_keys", "hot_keys"])
    t_read = time.perf_counter() - t
    lk = fr["lookups"]
    t = time.perf_counter()
    lk.groupby(["ts", "family"], observed=True)["count"].sum()
    t_groupby = time.perf_counter() - t
    t = time.perf_counter()
    tab = forecast_table(lk)
    t_fc = time.perf_counter() - t
    t = time.perf_counter()
    m = calibrate(fr)
    t_cal = time.perf_counter() - t
    t = time.perf_counter()
    rec = advise(fr, n_iter=args.iterations, model=m)
    t_bo = time.perf_counter() - t
    n = rec.evaluations
    t = time.perf_counter()
    rng = np.random.default_rng(0)
    rnd = max(replay(m, to_params(u)).net_gpu_s for u in rng.random((n, 4)))
    t_rnd = time.perf_counter() - t
    total = t_fc + t_cal + t_bo
    print(f"\n{len(lk):,} lookup rows, {lk.family.nunique()} families, "
          f"{(lk.ts.max() - lk.ts.min()) / 3600:.1f} h")
    print("\nforecast, held-back MAPE / 90 % coverage (per key family):")
    for h, g in tab.groupby("horizon_s"):
        cells = "  ".join(f"{r.model}{'*' if r.kept else ''} {r.mape:.3f}/{r.coverage_90:.2f}" for r in g.itertuples())
        print(f"  {h:>6g} s  {cells}")
    print("  (* = kept)")
    print("\ntuning, net GPU-s vs the recorded parameters over the span:")
    print(f"  Bayesian optimisation ({n} replays): {rec.outcome.net_gpu_s - rec.base_outcome.net_gpu_s:+.1f}")
    print(f"  random search        ({n} replays): {rnd - rec.base_outcome.net_gpu_s:+.1f}")
    print(f"  recommended: {rec.params}")
    print(f"  warm-up ROI (compute): recorded {rec.base_outcome.roi:+.2f}, recommended {rec.outcome.roi:+.2f}")
    for note in m.persist_note.values():
        print(f"  staleness: {note}")
    rows = [("groupby-sum (baseline)", t_groupby), ("read frames", t_read), ("forecasts", t_fc),
            ("calibration", t_cal), ("tuning (BO)", t_bo), ("random search, same replays", t_rnd),
            ("forecasts + tuning", total)]
    print(f"\n{'case':<30} {'s':>8} {'x groupby':>10}")
    for name, v in rows:
        print(f"{name:<30} {v:>8.2f} {v / max(t_groupby, 1e-9):>10.1f}")
    print(f"\nforecasts + tuning: {total:.1f} s (target < 60 s): {'OK' if total < 60 else 'OVER'}")
    from warmscope.analysis.forecast import prediction_error

    t = time.perf_counter()
    pe = prediction_error(lk, horizon_s=15.0)
    print(f"score card's prediction error (15 s): {pe.value:.3f} [{pe.ci[0]:.3f}, {pe.ci[1]:.3f}] in "
          f"{time.perf_counter() - t:.2f} s; {pe.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
