"""Warm-up ROI in business and compute form, over windows after a run, and
the exponential time decay of its benefit.

For a run ending at ``t_end`` and a window ``T`` (5 min, 1 h, 24 h, ...):

* treated — requests on the run's replica (and tenant scope) in (t_end, t_end+T];
* baseline — per-request rates of the experiment's *other* variant in the same
  window when the run belongs to an A/B pool (a true counterfactual), else the
  run replica's own rates in the ``T`` before the run started;
* business: ``ΔRevenue = (warmed_conv − baseline_conv) × value_per_conversion``
  with ``baseline_conv = baseline conversion rate × treated requests``;
  ``ROI = (ΔRevenue − ΔCost) / ΔCost``;
* compute: ``ROI = (prefill GPU-seconds saved × price − ΔCost) / ΔCost`` with
  GPU-seconds saved ``= (baseline GPU-s/request − treated GPU-s/request) ×
  treated requests``;
* ``ΔCost = run GPU-seconds × price`` (the warm-up's own cost).

Decay: the per-minute benefit ``b(t)`` after the run is fitted to
``b0·exp(−k·t)`` by non-linear least squares; ``k`` (per hour) comes with a
95% interval from the fit's covariance, and the half-life ``ln 2 / k``.

Example::

    table = roi_windows(run, requests, price_per_gpu_s=0.0008, value_per_conversion=4.0)
    decay = fit_decay(benefit_series(run, requests, price_per_gpu_s=0.0008, value_per_conversion=4.0))
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeWarning, curve_fit

from .buckets import bucket_start
from .hitrate import Z95, time_slice

__all__ = ["business_roi", "compute_roi", "roi_windows", "benefit_series", "fit_decay", "Decay",
           "DEFAULT_WINDOWS"]

DEFAULT_WINDOWS = (300.0, 3600.0, 86400.0)


def business_roi(warmed_conv: float, baseline_conv: float, value_per_conversion: float, cost: float) -> float:
    """(ΔRevenue − ΔCost) / ΔCost; NaN when the cost is not positive."""
    if not cost or cost <= 0 or not np.isfinite(cost):
        return float("nan")
    return ((warmed_conv - baseline_conv) * value_per_conversion - cost) / cost


def compute_roi(gpu_s_saved: float, price_per_gpu_s: float, cost: float) -> float:
    if not cost or cost <= 0 or not np.isfinite(cost):
        return float("nan")
    return (gpu_s_saved * price_per_gpu_s - cost) / cost


def _scope(req: pd.DataFrame, run: Any) -> pd.DataFrame:
    if req.empty:
        return req
    m = req["replica"] == run.replica
    if getattr(run, "tenant", ""):
        m &= req["tenant"] == run.tenant
    return req[m.to_numpy(dtype=bool)]


def _control(req: pd.DataFrame, treated: pd.DataFrame, run: Any) -> pd.DataFrame | None:
    exp = treated["experiment"].dropna().unique() if len(treated) else []
    var = treated["variant"].dropna().unique() if len(treated) else []
    if len(exp) == 1 and exp[0] and len(var) == 1:
        c = req[(req["experiment"] == exp[0]) & (req["variant"] != var[0])]
        if getattr(run, "tenant", ""):
            c = c[c["tenant"] == run.tenant]
        return c if len(c) else None
    return None


def _rates(df: pd.DataFrame) -> tuple[float, float, float]:
    n = float(df["requests"].sum())
    if n <= 0:
        return 0.0, float("nan"), float("nan")
    return n, float(df["conversions"].sum()) / n, float(df["gpu_s"].sum()) / n


def roi_windows(run: Any, requests: pd.DataFrame, price_per_gpu_s: float, value_per_conversion: float,
                windows: Sequence[float] = DEFAULT_WINDOWS) -> pd.DataFrame:
    """One row per window: requests, conversions, GPU-s saved, revenue, cost, both ROIs, baseline kind."""
    rows = []
    cost = float(run.gpu_s) * price_per_gpu_s
    longest = max(windows) if len(windows) else 0.0
    requests = time_slice(requests, run.started - longest, run.ended + longest)
    mine = _scope(requests, run)
    for T in windows:
        w0, w1 = run.ended, run.ended + T
        treated = mine[(mine.ts > w0) & (mine.ts <= w1)]
        n, conv_rate, gpu_rate = _rates(treated)
        ctrl = _control(requests, treated, run)
        if ctrl is not None:
            base = ctrl[(ctrl.ts > w0) & (ctrl.ts <= w1)]
            kind = "control variant"
        else:
            base = mine[(mine.ts > run.started - T) & (mine.ts <= run.started)]
            kind = "before run"
        _, b_conv, b_gpu = _rates(base)
        conv = conv_rate * n if n else 0.0
        base_conv = b_conv * n if n and np.isfinite(b_conv) else float("nan")
        saved = (b_gpu - gpu_rate) * n if n and np.isfinite(b_gpu) else float("nan")
        rows.append({
            "window_s": T, "requests": n, "conversions": conv, "baseline_conversions": base_conv,
            "gpu_s_saved": saved, "revenue": (conv - base_conv) * value_per_conversion, "cost": cost,
            "roi_business": business_roi(conv, base_conv, value_per_conversion, cost),
            "roi_compute": compute_roi(saved, price_per_gpu_s, cost), "baseline": kind,
        })
    return pd.DataFrame(rows)


def benefit_series(run: Any, requests: pd.DataFrame, price_per_gpu_s: float, value_per_conversion: float,
                   horizon_s: float = 6 * 3600.0, freq: float = 60.0) -> pd.DataFrame:
    """Per-bucket benefit after the run (GPU-s saved × price + extra conversions ×
    value) against the control variant, or the pre-run rates. Columns: t_s
    (seconds after the run), benefit."""
    requests = time_slice(requests, run.started - horizon_s, run.ended + horizon_s)
    mine = _scope(requests, run)
    after = mine[(mine.ts > run.ended) & (mine.ts <= run.ended + horizon_s)]
    if after.empty:
        return pd.DataFrame(columns=["t_s", "benefit"])
    ctrl = _control(requests, after, run)
    bucket = lambda df: bucket_start(df.ts - run.ended, freq)  # noqa: E731
    t = after.assign(t_s=bucket(after)).groupby("t_s")[["requests", "gpu_s", "conversions"]].sum()
    if ctrl is not None:
        c = ctrl[(ctrl.ts > run.ended) & (ctrl.ts <= run.ended + horizon_s)]
        c = c.assign(t_s=bucket(c)).groupby("t_s")[["requests", "gpu_s", "conversions"]].sum()
        c = c.reindex(t.index)
        c_gpu = (c["gpu_s"] / c["requests"]).to_numpy()
        c_conv = (c["conversions"] / c["requests"]).to_numpy()
    else:
        _, c_conv1, c_gpu1 = _rates(mine[(mine.ts > run.started - horizon_s) & (mine.ts <= run.started)])
        c_gpu = np.full(len(t), c_gpu1)
        c_conv = np.full(len(t), c_conv1)
    n = t["requests"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        gpu_saved = (c_gpu - t["gpu_s"].to_numpy() / n) * n
        conv_gain = (t["conversions"].to_numpy() / n - c_conv) * n
    benefit = gpu_saved * price_per_gpu_s + conv_gain * value_per_conversion
    out = pd.DataFrame({"t_s": t.index.to_numpy(dtype=float), "benefit": benefit})
    return out[np.isfinite(out["benefit"])].reset_index(drop=True)


@dataclass(frozen=True)
class Decay:
    k_per_hour: float
    ci_low: float
    ci_high: float
    half_life_h: float
    b0: float
    n_points: int
    error: str | None = None


def fit_decay(series: pd.DataFrame) -> Decay:
    """Fit benefit(t) = b0·exp(−k·t); k per hour with a 95% interval."""
    nan = float("nan")
    if len(series) < 4:
        return Decay(nan, nan, nan, nan, nan, len(series), "not enough points after the run (need 4)")
    t = series["t_s"].to_numpy(dtype=float) / 3600.0
    y = series["benefit"].to_numpy(dtype=float)
    b0_guess = float(np.mean(y[: max(1, len(y) // 10)]))
    if not np.isfinite(b0_guess) or b0_guess == 0:
        b0_guess = float(np.max(np.abs(y))) or 1.0

    def f(tt, b0, k):
        return b0 * np.exp(-k * tt)

    try:
        with warnings.catch_warnings():  # a flat series has no covariance: se is NaN, said by the CI
            warnings.simplefilter("ignore", OptimizeWarning)
            (b0, k), cov = curve_fit(f, t, y, p0=(b0_guess, 1.0), maxfev=5000)
        se = float(np.sqrt(cov[1, 1])) if np.isfinite(cov[1, 1]) else nan
    except (RuntimeError, ValueError) as e:
        return Decay(nan, nan, nan, nan, nan, len(series), f"decay fit did not converge: {e}")
    half = float(np.log(2) / k) if k > 0 else float("inf")
    return Decay(float(k), float(k - Z95 * se), float(k + Z95 * se), half, float(b0), len(series))
