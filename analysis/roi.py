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

Uncertainty: the benefit (GPU-s saved × price, or extra conversions × value)
is also computed per ``freq``-second bucket of the window against the
baseline's rates; the buckets serve as batch means, so the benefit's standard
error is ``sd(bucket benefits) × √k`` over k buckets and its 95% interval uses
Student's t with k − 1 degrees of freedom. ROI's interval is the benefit's
interval minus the cost, over the cost. When that standard error is more than
``COST_TOO_SMALL`` times the cost, the ratio says nothing (a cost of $0.003
against ±$100 of conversion noise): ``state`` reads "cost too small to
estimate" and the ROI is NaN (its parts — revenue, GPU-s saved, cost — stay).
A window that runs past the last data point is flagged (``complete`` False,
``state`` "unfinished"): its ROI is over the part observed so far.

Several runs of one warm-up (one per cache layer on the same replica) share
one benefit: :func:`replica_runs` merges them into one run per replica so the
benefit is not claimed once per layer.

Decay: the per-minute benefit ``b(t)`` after the run is fitted to
``b0·exp(−k·t)`` by non-linear least squares; ``k`` (per hour) comes with a
95% interval from the fit's covariance, and the half-life ``ln 2 / k``.

Example::

    table = roi_windows(run, requests, price_per_gpu_s=0.0008, value_per_conversion=4.0)
    decay = fit_decay(
        benefit_series(run, requests, price_per_gpu_s=0.0008, value_per_conversion=4.0)
    )
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import OptimizeWarning, curve_fit

from .buckets import bucket_start
from .hitrate import Z95, time_slice

__all__ = [
    "business_roi",
    "compute_roi",
    "roi_windows",
    "benefit_series",
    "fit_decay",
    "Decay",
    "DEFAULT_WINDOWS",
    "replica_runs",
    "warmup_members",
    "COST_TOO_SMALL",
    "WARMUP_GAP_S",
    "roi_text",
    "decay_text",
    "experiment_roi",
    "SEED_VS_EXPERIMENT",
    "warmups",
    "latest_warmup",
    "significant_decay",
    "decay_summary",
]

DEFAULT_WINDOWS = (300.0, 3600.0, 86400.0)
COST_TOO_SMALL = 10.0  # benefit SE / cost beyond which ROI is "cost too small to estimate"


WARMUP_GAP_S = 60.0  # a run starting this long after a replica's warm-up has ended is another


def _warmup_groups(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``runs`` (sorted) with ``_warmup``, the number of the warm-up each run belongs to (see
    :func:`replica_runs`), and the columns a warm-up shares."""
    keys = ["replica", "strategy", "trigger"]
    r = runs.copy()
    for k in keys:
        if k not in r.columns:
            r[k] = ""
    r = r.sort_values([*keys, "started", "run_id"], kind="stable")
    end = r["ended"].astype(float).fillna(r["started"].astype(float))
    reach = end.groupby([r[k] for k in keys], dropna=False, sort=False).cummax()
    before = reach.groupby([r[k] for k in keys], dropna=False, sort=False).shift()
    new = before.isna() | (r["started"].astype(float) > before + WARMUP_GAP_S)
    r["_warmup"] = new.cumsum()
    return r, keys


def replica_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per warm-up of a replica: the runs a warm-up opened per cache layer (same replica,
    strategy and trigger, each starting before the warm-up's runs so far have ended, or within
    ``WARMUP_GAP_S`` of it: a warm-up's layers start one after the other) merged, GPU-seconds,
    keys and bytes summed, ``started`` the first run's, ``ended`` the last end, ``layer`` listing
    the layers ("prefix_kv+response"), ``run_id`` the first run's, ``runs`` how many were
    merged."""
    if runs.empty:
        return runs.assign(runs=pd.Series(dtype=int))
    r, keys = _warmup_groups(runs)
    agg: dict[str, Any] = {
        c: "sum" for c in ("gpu_s", "keys", "bytes", "memory_bytes") if c in r.columns
    }
    agg.update(
        {
            "run_id": "first",
            "started": "min",
            "layer": lambda s: "+".join(sorted(set(map(str, s)))),
            "ended": "max",
        }
    )
    for c in r.columns:
        if c not in agg and c not in keys and c != "_warmup":
            agg[c] = "first"
    g = r.groupby([*keys, "_warmup"], dropna=False, sort=False)
    out = g.agg(agg)
    out["runs"] = g.size()
    merged: pd.DataFrame = out.reset_index()[list(runs.columns) + ["runs"]]
    return merged


def warmup_members(runs: pd.DataFrame) -> dict[str, list[str]]:
    """The run ids of each warm-up of ``runs`` (:func:`replica_runs`), keyed by the warm-up's
    ``run_id`` (its first run's), in the order its layers started."""
    if runs.empty:
        return {}
    r, _ = _warmup_groups(runs)
    ids = r["run_id"].astype(str)
    return {str(g.iloc[0]): list(g) for _, g in ids.groupby(r["_warmup"], sort=False)}


def business_roi(
    warmed_conv: float, baseline_conv: float, value_per_conversion: float, cost: float
) -> float:
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
    m: pd.Series = req["replica"] == run.replica
    if getattr(run, "tenant", ""):
        m &= req["tenant"] == run.tenant
    return req[m.to_numpy(dtype=bool)]


def _control(req: pd.DataFrame, treated: pd.DataFrame, run: Any) -> pd.DataFrame | None:
    exp: Any = treated["experiment"].dropna().unique() if len(treated) else []
    var: Any = treated["variant"].dropna().unique() if len(treated) else []
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


def _bucket_benefit(
    tr: pd.DataFrame,
    base: pd.DataFrame | None,
    b_rates: tuple[float, float],
    w0: float,
    freq: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bucket (GPU-s saved, extra conversions) of the treated rows against
    the baseline's per-bucket rates (control variant) or fixed rates (before run)."""
    if tr.empty:
        return np.array([]), np.array([])
    t = (
        tr.assign(b=bucket_start(tr.ts - w0, freq))
        .groupby("b")[["requests", "gpu_s", "conversions"]]
        .sum()
    )
    n = t["requests"].to_numpy(float)
    if base is not None:
        c = (
            base.assign(b=bucket_start(base.ts - w0, freq))
            .groupby("b")[["requests", "gpu_s", "conversions"]]
            .sum()
        )
        c = c.reindex(t.index)
        with np.errstate(invalid="ignore", divide="ignore"):
            c_gpu = (c["gpu_s"] / c["requests"]).to_numpy(float)
            c_conv = (c["conversions"] / c["requests"]).to_numpy(float)
    else:
        c_conv, c_gpu = np.full(len(t), b_rates[0]), np.full(len(t), b_rates[1])
    saved = c_gpu * n - t["gpu_s"].to_numpy(float)
    conv = t["conversions"].to_numpy(float) - c_conv * n
    ok = np.isfinite(saved) & np.isfinite(conv) & (n > 0)
    return saved[ok], conv[ok]


def _sum_ci(
    per_bucket: np.ndarray, total: float, level_z: float = Z95
) -> tuple[float, float, float]:
    """(se, low, high) of a total from its per-bucket parts (batch means, t with k − 1 df)."""
    k = len(per_bucket)
    if k < 2 or not np.isfinite(total):
        return float("nan"), float("nan"), float("nan")
    se = float(np.std(per_bucket, ddof=1) * math.sqrt(k))
    tq = float(stats.t.ppf(stats.norm.cdf(level_z), k - 1))
    return se, total - tq * se, total + tq * se


def roi_windows(
    run: Any,
    requests: pd.DataFrame,
    price_per_gpu_s: float,
    value_per_conversion: float,
    windows: Sequence[float] = DEFAULT_WINDOWS,
    freq: float = 60.0,
    data_end: float | None = None,
) -> pd.DataFrame:
    """One row per window: requests, conversions, GPU-s saved, revenue, cost,
    both ROIs with 95% intervals (``roi_business_low/high``,
    ``roi_compute_low/high``), baseline kind, ``complete`` and ``state``
    ("ok", "unfinished", "cost too small to estimate", "no cost", "no
    requests"). ``data_end``: the last time with data (default: the latest
    request row)."""
    rows = []
    cost = float(run.gpu_s) * price_per_gpu_s if np.isfinite(float(run.gpu_s)) else float("nan")
    if data_end is None:
        data_end = float(requests["ts"].max()) if len(requests) else float("-inf")
    longest = max(windows) if len(windows) else 0.0
    requests = time_slice(requests, run.started - longest, run.ended + longest)
    mine = _scope(requests, run)
    nan = float("nan")
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
        base_conv = b_conv * n if n and np.isfinite(b_conv) else nan
        saved = (b_gpu - gpu_rate) * n if n and np.isfinite(b_gpu) else nan
        revenue = (conv - base_conv) * value_per_conversion
        s_b, c_b = _bucket_benefit(
            treated, base if ctrl is not None else None, (b_conv, b_gpu), w0, freq
        )
        se_c, lo_c, hi_c = _sum_ci(s_b * price_per_gpu_s, saved * price_per_gpu_s)
        se_r, lo_r, hi_r = _sum_ci(c_b * value_per_conversion, revenue)
        roi_b = business_roi(conv, base_conv, value_per_conversion, cost)
        roi_c = compute_roi(saved, price_per_gpu_s, cost)
        complete = bool(w1 <= data_end)
        state = "ok" if complete else "unfinished"
        if not n:
            state = "no requests"
        elif not (cost > 0):
            state = "no cost"
        elif (np.isfinite(se_r) and se_r > COST_TOO_SMALL * cost) or (
            np.isfinite(se_c) and se_c > COST_TOO_SMALL * cost
        ):
            state = "cost too small to estimate"
        bad_b = (
            state == "cost too small to estimate"
            and np.isfinite(se_r)
            and se_r > COST_TOO_SMALL * cost
        )
        bad_c = (
            state == "cost too small to estimate"
            and np.isfinite(se_c)
            and se_c > COST_TOO_SMALL * cost
        )
        rows.append(
            {
                "window_s": T,
                "requests": n,
                "conversions": conv,
                "baseline_conversions": base_conv,
                "gpu_s_saved": saved,
                "revenue": revenue,
                "revenue_low": lo_r,
                "revenue_high": hi_r,
                "revenue_se": se_r,
                "saved_se": se_c,
                "cost": cost,
                "roi_business": nan if bad_b else roi_b,
                "roi_business_low": nan if bad_b or not cost > 0 else (lo_r - cost) / cost,
                "roi_business_high": nan if bad_b or not cost > 0 else (hi_r - cost) / cost,
                "roi_compute": nan if bad_c else roi_c,
                "roi_compute_low": nan if bad_c or not cost > 0 else (lo_c - cost) / cost,
                "roi_compute_high": nan if bad_c or not cost > 0 else (hi_c - cost) / cost,
                "baseline": kind,
                "complete": complete,
                "state": state,
            }
        )
    return pd.DataFrame(rows)


def benefit_series(
    run: Any,
    requests: pd.DataFrame,
    price_per_gpu_s: float,
    value_per_conversion: float,
    horizon_s: float = 6 * 3600.0,
    freq: float = 60.0,
    part: str = "both",
) -> pd.DataFrame:
    """Per-bucket benefit after the run against the control variant, or the pre-run rates.
    Columns: t_s (seconds after the run), compute (GPU-s saved × price), business (extra
    conversions × value) and benefit: their sum (``part="both"``) or one of them (``"compute"``,
    ``"business"``). The compute part is in the units of the run's cost; the business part
    carries the conversions' noise (± tens of currency units a minute against a cost of
    cents), so the decay the pages show is the compute part's."""
    parts = ("both", "compute", "business")
    if part not in parts:
        raise ValueError(f"part must be one of {parts}, got {part!r}")
    requests = time_slice(requests, run.started - horizon_s, run.ended + horizon_s)
    mine = _scope(requests, run)
    after = mine[(mine.ts > run.ended) & (mine.ts <= run.ended + horizon_s)]
    if after.empty:
        return pd.DataFrame(columns=["t_s", "compute", "business", "benefit"])
    ctrl = _control(requests, after, run)
    bucket: Callable[[pd.DataFrame], pd.Series] = lambda df: bucket_start(df.ts - run.ended, freq)  # noqa: E731
    t = after.assign(t_s=bucket(after)).groupby("t_s")[["requests", "gpu_s", "conversions"]].sum()
    if ctrl is not None:
        c = ctrl[(ctrl.ts > run.ended) & (ctrl.ts <= run.ended + horizon_s)]
        c = c.assign(t_s=bucket(c)).groupby("t_s")[["requests", "gpu_s", "conversions"]].sum()
        c = c.reindex(t.index)
        c_gpu = (c["gpu_s"] / c["requests"]).to_numpy()
        c_conv = (c["conversions"] / c["requests"]).to_numpy()
    else:
        _, c_conv1, c_gpu1 = _rates(
            mine[(mine.ts > run.started - horizon_s) & (mine.ts <= run.started)]
        )
        c_gpu = np.full(len(t), c_gpu1)
        c_conv = np.full(len(t), c_conv1)
    n = t["requests"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        gpu_saved = (c_gpu - t["gpu_s"].to_numpy() / n) * n
        conv_gain = (t["conversions"].to_numpy() / n - c_conv) * n
    compute, business = gpu_saved * price_per_gpu_s, conv_gain * value_per_conversion
    benefit = {"both": compute + business, "compute": compute, "business": business}[part]
    out = pd.DataFrame(
        {
            "t_s": t.index.to_numpy(dtype=float),
            "compute": compute,
            "business": business,
            "benefit": benefit,
        }
    )
    finite: pd.DataFrame = out[np.isfinite(out["benefit"])].reset_index(drop=True)
    return finite


@dataclass(frozen=True)
class Decay:
    k_per_hour: float
    ci_low: float
    ci_high: float
    half_life_h: float
    b0: float
    n_points: int
    error: str | None = None
    # minutes after the run by which the benefit is gone, when it fades faster than the points
    # measure (then no rate: ``error`` says so)
    gone_min: float = float("nan")


def fit_decay(series: pd.DataFrame) -> Decay:
    """Fit benefit(t) = b0·exp(−k·t); k per hour with a 95% interval."""
    nan = float("nan")
    if len(series) < 4:
        return Decay(
            nan, nan, nan, nan, nan, len(series), "not enough points after the run (need 4)"
        )
    t = series["t_s"].to_numpy(dtype=float) / 3600.0
    y = series["benefit"].to_numpy(dtype=float)
    b0_guess = float(np.mean(y[: max(1, len(y) // 10)]))
    if not np.isfinite(b0_guess) or b0_guess == 0:
        b0_guess = float(np.max(np.abs(y))) or 1.0

    def f(tt: np.ndarray, b0: float, k: float) -> np.ndarray:
        # exp's argument clipped: a trial k far from the answer must not overflow (inf·0 = NaN)
        return b0 * np.exp(np.clip(-k * tt, -700.0, 700.0))

    try:
        with (
            warnings.catch_warnings()
        ):  # a flat series has no covariance: se is NaN, said by the CI
            warnings.simplefilter("ignore", OptimizeWarning)
            with np.errstate(over="ignore", invalid="ignore"):
                (b0, k), cov = curve_fit(f, t, y, p0=(b0_guess, 1.0), maxfev=5000)
        se = float(np.sqrt(cov[1, 1])) if np.isfinite(cov[1, 1]) else nan
    except (RuntimeError, ValueError) as e:
        return Decay(nan, nan, nan, nan, nan, len(series), f"decay fit did not converge: {e}")
    if k > 0:
        # A benefit the fit leaves under 1/1000 of its start from the third point on is gone
        # between two points: its rate is bounded below, not measured (the fit runs off to any
        # larger k, its interval with it)
        if np.count_nonzero(t * k < _GONE) < 3:
            later = t[t * k >= _GONE]
            gone_min = float(later.min()) * 60 if len(later) else float("nan")
            return Decay(
                nan,
                nan,
                nan,
                nan,
                float(b0),
                len(series),
                f"the benefit is gone by {gone_min:.0f} min after the run (the fitted curve "
                f"keeps under 1/1000 of it from there): it fades faster than these points measure",
                gone_min,
            )
    half = float(np.log(2) / k) if k > 0 else float("inf")
    return Decay(float(k), float(k - Z95 * se), float(k + Z95 * se), half, float(b0), len(series))


_GONE = float(np.log(1000.0))  # k·t beyond which the fitted benefit is under 1/1000 of b0


def _cell(v: float, lo: float, hi: float, why: str) -> str:
    if not np.isfinite(v):
        return why
    ci = f" (95 % CI {lo:+.2f} to {hi:+.2f})" if np.isfinite(lo) and np.isfinite(hi) else ""
    return f"{v:+.2f}{ci}"


def _too_small(se: float, cost: float, what: str) -> str:
    return (
        f"not estimable: {what} vary by ±{se:,.2f} over the window (standard error), "
        f"{se / cost:,.0f}× the run's cost of {cost:.4f}"
    )


def roi_text(roi: pd.DataFrame) -> pd.DataFrame:
    """``roi_windows`` as text, one row per window, with no empty cell: a missing figure says why
    ("no conversion data", "not enough points", "cost too small to estimate", …)."""
    rows = []
    for rec in roi.to_dict("records"):
        r: dict[str, Any] = {str(k): v for k, v in rec.items()}
        f = {
            k: float(r[k]) if r.get(k) is not None else float("nan")
            for k in (
                "window_s",
                "requests",
                "conversions",
                "baseline_conversions",
                "gpu_s_saved",
                "cost",
                "roi_compute",
                "roi_compute_low",
                "roi_compute_high",
                "roi_business",
                "roi_business_low",
                "roi_business_high",
            )
        }
        se = {k: float(r.get(k, float("nan"))) for k in ("revenue_se", "saved_se")}
        T = f["window_s"]
        win = f"T+{T / 3600:g} h" if T >= 3600 else f"T+{T / 60:g} min"
        state = str(r["state"])
        why = state if state not in ("ok", "unfinished") else "not enough points"
        compute_why, conv_why = why, why
        if state == "cost too small to estimate":  # say by how much: the noise against the cost
            compute_why, conv_why = (
                _too_small(se[k], f["cost"], what) if np.isfinite(se[k]) else why
                for k, what in (("saved_se", "GPU-s saved × price"), ("revenue_se", "conversions"))
            )
        if not (f["conversions"] > 0 or float(np.nan_to_num(f["baseline_conversions"])) > 0):
            conv_why = "no conversion data"
        rows.append(
            {
                "window": win + ("" if bool(r["complete"]) else " (unfinished)"),
                "requests": f"{int(f['requests']):,}",
                "gpu_s_saved": f"{f['gpu_s_saved']:+,.2f}"
                if np.isfinite(f["gpu_s_saved"])
                else why,
                "cost": f"{f['cost']:.4f}" if np.isfinite(f["cost"]) else "no cost recorded",
                "roi_compute": _cell(
                    f["roi_compute"], f["roi_compute_low"], f["roi_compute_high"], compute_why
                ),
                "roi_business": _cell(
                    f["roi_business"], f["roi_business_low"], f["roi_business_high"], conv_why
                ),
                "baseline": str(r["baseline"]),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "window",
            "requests",
            "gpu_s_saved",
            "cost",
            "roi_compute",
            "roi_business",
            "baseline",
        ],
    )


def decay_text(d: Decay) -> str:
    """The decay rate only when the benefit is significantly decaying (its 95 % interval above
    zero); "too fast to measure" when the benefit is gone between two points; otherwise "no
    decay measured" and why."""
    if np.isfinite(d.gone_min):
        return f"too fast to measure: {d.error}"
    if d.error:
        return f"no decay measured: {d.error}"
    if not (np.isfinite(d.ci_low) and np.isfinite(d.ci_high)):
        return "no decay measured: the rate's interval is not estimable (too few distinct points)"
    if d.ci_low <= 0:
        return (
            f"no decay measured: the benefit's fitted rate {d.k_per_hour:+.2f} /h has a 95 % CI "
            f"({d.ci_low:+.2f} to {d.ci_high:+.2f}) that includes no decay"
        )
    return (
        f"{d.k_per_hour:.2f} /h (95 % CI {d.ci_low:.2f} to {d.ci_high:.2f}; half-life "
        f"{d.half_life_h:.2f} h)"
    )


def experiment_roi(
    units: pd.DataFrame, runs: pd.DataFrame, replica_variant: dict[str, str], control: str
) -> pd.DataFrame:
    """The compute ROI of a whole experiment, per treatment arm against ``control``: GPU-s saved =
    (control GPU-s per request − the arm's) × the arm's requests, against the GPU-s of every warm-up
    run on the arm's replicas (``replica_variant`` maps a replica to its arm); ROI = (saved − cost)
    / cost (the price per GPU-s cancels). The 95 % interval comes from the per-request ratio's
    linearised variance over units: var(r) = Σ (g_u − r·n_u)² / (Σ n)² · k / (k − 1)."""
    cols = [
        "variant",
        "requests",
        "gpu_per_request",
        "control_gpu_per_request",
        "gpu_s_saved",
        "saved_low",
        "saved_high",
        "warm_gpu_s",
        "runs",
        "roi",
        "roi_low",
        "roi_high",
    ]

    def ratio(u: pd.DataFrame) -> tuple[float, float, float]:
        n, g = u["requests"].to_numpy(float), u["gpu_s"].to_numpy(float)
        r = g.sum() / n.sum()
        k = len(u)
        var = float(np.sum((g - r * n) ** 2) / n.sum() ** 2 * k / max(k - 1, 1))
        return float(r), var, float(n.sum())

    c = units[units["variant"] == control]
    if c.empty or c["requests"].sum() <= 0:
        return pd.DataFrame(columns=cols)
    rc, vc, _ = ratio(c)
    rows = []
    for v, u in units[units["variant"] != control].groupby("variant"):
        if u["requests"].sum() <= 0:
            continue
        rt, vt, nt = ratio(u)
        saved = (rc - rt) * nt
        half = 1.959963984540054 * math.sqrt(vc + vt) * nt
        reps = [r for r, a in replica_variant.items() if a == v]
        mine = runs[runs["replica"].isin(reps)] if len(runs) else runs
        cost = float(mine["gpu_s"].sum()) if len(mine) else 0.0
        roi = (saved - cost) / cost if cost > 0 else float("nan")
        rows.append(
            [
                v,
                nt,
                rt,
                rc,
                saved,
                saved - half,
                saved + half,
                cost,
                len(mine),
                roi,
                (saved - half - cost) / cost if cost > 0 else float("nan"),
                (saved + half - cost) / cost if cost > 0 else float("nan"),
            ]
        )
    return pd.DataFrame(rows, columns=cols)


SEED_VS_EXPERIMENT = (
    "The T+5 min ROI counts the five minutes after one run against that run's whole cost, "
    "while the experiment ROI counts every request the warmed arm served against every "
    "run's cost, so a run whose benefit arrives after its first minutes reads poor at T+5 "
    "min and can still pay off over the experiment."
)


def warmups(runs: pd.DataFrame) -> pd.DataFrame:
    """The warm-ups of ``runs`` (one per replica and start: :func:`replica_runs`, its layers'
    runs merged), newest first: what the pages call a warm-up, its cost the sum of its layers'."""
    merged = replica_runs(runs)
    if merged.empty:
        return merged
    return merged.sort_values(
        ["started", "replica"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)


def latest_warmup(runs: pd.DataFrame) -> pd.Series | None:
    """The newest warm-up of ``runs`` (its layers' runs merged), or None: the "latest run" every
    page shows."""
    w = warmups(runs)
    return None if w.empty else w.iloc[0]


def significant_decay(d: Decay) -> bool:
    """Whether the benefit measurably decays: a fit whose rate's 95 % interval lies above zero
    (what :func:`decay_text` reports as a rate)."""
    return d.error is None and bool(np.isfinite(d.ci_low) and d.ci_low > 0)


def decay_summary(decays: Sequence[Decay]) -> str:
    """The decay over several warm-ups, by :func:`significant_decay`: the median rate of those
    that measurably decay, and how many of the fitted ones that is."""
    fitted = [d for d in decays if d.error is None and np.isfinite(d.k_per_hour)]
    sig = [d for d in fitted if significant_decay(d)]
    fast = sum(1 for d in decays if np.isfinite(d.gone_min))  # gone between two points
    more = f"; {fast} more gone between two points, faster than measured" if fast else ""
    if not fitted:
        if fast:
            return (
                f"benefit decay: faster than measured (after {fast} warm-up(s) the benefit is "
                "gone between two points)"
            )
        return "benefit decay: no warm-up with enough points after it"
    if not sig:
        return (
            f"benefit decay: none measured (the rate's 95 % CI includes no decay on all "
            f"{len(fitted)} warm-ups fitted{more})"
        )
    k = float(np.median([d.k_per_hour for d in sig]))
    half = math.log(2) / k if k > 0 else float("inf")
    return (
        f"benefit decay k = {k:.3g}/h (median over the {len(sig)} of {len(fitted)} warm-ups "
        f"whose benefit measurably decays; half-life {half:.2f} h{more})"
    )
