"""Heat decay: which key families to warm next, and how well request counts
are predicted.

* seed 2's coupled decay: ``score = similarity × exp(−λ·Δt) × priority / 10``
  per family, with Δt the seconds since the family was last requested,
  similarity its share of the most recent ``recent_s`` of traffic relative to
  the busiest family (or given), and priority the tenant's 1–10 priority;
* seed 1's SLO-aware rate: ``λ = 1 / max(slo_ms × 0.1, 10)`` per *second*
  of idle time (:func:`slo_lambda`): a 1 s SLO gives λ = 0.01/s, a time
  constant of 100 s; the floor of 10 keeps a tight SLO (below 100 ms) from
  forgetting a key within a few seconds (at most λ = 0.1/s);
* prediction: an exponentially weighted forecast of each family's requests per
  bucket (smoothing ``alpha``), one bucket ahead, scored by MAPE against what
  happened (buckets with zero actual requests are left out of MAPE).

Example::

    lam = slo_lambda(500)                       # 500 ms SLO
    s = heat_scores(lookups, now=t, lam_per_s=lam)
    nxt = rank_to_warm(s, k=20)
    err = prediction_mape(lookups, freq=300)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd

from .buckets import bucket_start

__all__ = [
    "slo_lambda",
    "heat_scores",
    "rank_to_warm",
    "family_series",
    "ewma_forecast",
    "mape",
    "prediction_mape",
]


def slo_lambda(slo_ms: float) -> float:
    """SLO-aware decay rate per second of elapsed time: ``1 / max(slo_ms × 0.1, 10)``.

    ``slo_ms`` is the TTFT SLO in milliseconds; the result multiplies Δt in
    seconds (``exp(−λ·Δt)``)."""
    if not np.isfinite(slo_ms) or slo_ms <= 0:
        raise ValueError(f"slo_ms must be a positive number of milliseconds, got {slo_ms}")
    return 1.0 / max(slo_ms * 0.1, 10.0)


def heat_scores(
    lookups: pd.DataFrame,
    now: float,
    lam_per_s: float,
    recent_s: float = 3600.0,
    priority: Mapping[str, float] | None = None,
    similarity: Mapping[str, float] | None = None,
    default_priority: float = 5.0,
) -> pd.DataFrame:
    """Score per (tenant, layer, family): columns last_seen, dt_s, requests,
    similarity, priority, score."""
    cols = [
        "tenant",
        "layer",
        "family",
        "last_seen",
        "dt_s",
        "requests",
        "similarity",
        "priority",
        "score",
    ]
    lk = lookups[(lookups["ts"] <= now) & lookups["result"].isin(["hit", "miss"])]
    if lk.empty:
        return pd.DataFrame(columns=cols)
    keys = ["tenant", "layer", "family"]
    g = lk.groupby(keys, observed=True).agg(last_seen=("ts", "max"), requests=("count", "sum"))
    rec = lk[lk["ts"] > now - recent_s].groupby(keys, observed=True)["count"].sum()
    g["recent"] = rec.reindex(g.index).fillna(0)
    g = g.reset_index()
    top = g["recent"].max()
    if similarity is not None:
        g["similarity"] = g["family"].map(similarity).fillna(0.0)
    else:
        g["similarity"] = g["recent"] / top if top > 0 else 0.0
    pr = priority or {}
    g["priority"] = g["tenant"].map(lambda t: pr.get(t, default_priority)).astype(float)
    g["dt_s"] = now - g["last_seen"]
    g["score"] = g["similarity"] * np.exp(-lam_per_s * g["dt_s"]) * g["priority"] / 10.0
    return g[cols].sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


def rank_to_warm(scores: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    return scores.head(k).assign(rank=np.arange(1, min(k, len(scores)) + 1))


def family_series(lookups: pd.DataFrame, freq: float = 300.0) -> pd.DataFrame:
    """Requests (hit + miss lookups) per family per bucket: wide, buckets × families."""
    lk = lookups[lookups["result"].isin(["hit", "miss"])]
    if lk.empty:
        return pd.DataFrame()
    b = bucket_start(lk["ts"], freq)
    s = (
        lk.assign(bucket=b)
        .groupby(["bucket", "family"], observed=True)["count"]
        .sum()
        .unstack(fill_value=0)
    )
    full = np.arange(s.index.min(), s.index.max() + freq, freq)
    return s.reindex(full, fill_value=0)


def ewma_forecast(series: pd.DataFrame, alpha: float = 0.3) -> pd.DataFrame:
    """One-step-ahead forecast per column: row i predicts row i from rows < i."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    return series.ewm(alpha=alpha, adjust=False).mean().shift(1)


def mape(actual: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    a = np.asarray(actual, dtype=float).ravel()
    p = np.asarray(predicted, dtype=float).ravel()
    m = np.isfinite(a) & np.isfinite(p) & (a != 0)
    if not m.any():
        return float("nan")
    return float(np.mean(np.abs((a[m] - p[m]) / a[m])))


def prediction_mape(lookups: pd.DataFrame, freq: float = 300.0, alpha: float = 0.3) -> float:
    s = family_series(lookups, freq)
    if s.empty or len(s) < 2:
        return float("nan")
    return mape(s.iloc[1:].to_numpy(), ewma_forecast(s, alpha).iloc[1:].to_numpy())
