"""Quantiles from bucketed histograms (the ``histograms`` frame).

Same estimate as Prometheus' ``histogram_quantile``: find the bucket holding
the rank and interpolate linearly inside it (the first bucket starts at 0); a
rank in the overflow bucket returns the largest finite bound.

Example::

    p95 = hist_quantile(
        histograms, 0.95, metric="gen_ai.server.time_to_first_token", by=["variant"]
    )
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "hist_quantile",
    "quantile_from_buckets",
    "quantiles_over_time",
    "all_bounds",
    "TTFT",
    "DURATION",
]

TTFT = "gen_ai.server.time_to_first_token"
DURATION = "gen_ai.server.request.duration"


def all_bounds(metric: str, present: Iterable[float]) -> np.ndarray:
    """Every bucket bound of ``metric``: the schema's (the store keeps only
    non-empty buckets, but interpolation needs each bucket's lower edge) plus
    any others present, and +Inf last."""
    from warmscope.model.schema import HISTOGRAMS

    known = {inst.name: b for inst, b in HISTOGRAMS}
    les = {float(x) for x in present} | {float(x) for x in known.get(metric, ())}
    les.discard(float("inf"))
    return np.array(sorted(les) + [np.inf])


def quantile_from_buckets(bounds: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Quantile per row of ``counts`` (rows × buckets, last bucket = +Inf)."""
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    bounds = np.asarray(bounds, dtype=float)  # finite upper bounds, len = buckets - 1
    if len(bounds) == 0:
        return np.full(len(counts), np.nan)
    total = counts.sum(axis=1)
    cum = np.cumsum(counts, axis=1)
    rank = q * total
    idx = np.argmax(cum >= rank[:, None] - 1e-12, axis=1)
    out = np.full(len(counts), np.nan)
    ok = total > 0
    fin = ok & (idx < len(bounds))
    hi = bounds[np.minimum(idx, len(bounds) - 1)]
    lo = np.where(idx > 0, bounds[np.maximum(idx - 1, 0)], 0.0)
    prev = np.where(idx > 0, cum[np.arange(len(counts)), np.maximum(idx - 1, 0)], 0.0)
    inb = counts[np.arange(len(counts)), idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(inb > 0, (rank - prev) / inb, 1.0)
    out[fin] = (lo + (hi - lo) * frac)[fin]
    out[ok & ~fin] = bounds[-1] if len(bounds) else np.nan
    return out


def hist_quantile(
    hist: pd.DataFrame,
    q: float,
    metric: str = TTFT,
    by: Sequence[str] = (),
    start: float | None = None,
    end: float | None = None,
) -> pd.DataFrame:
    """Quantile ``q`` of ``metric`` per group over (start, end]; columns: by + [value, count]."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    by = list(by)
    h = hist[hist["metric"] == metric] if len(hist) else hist
    if start is not None:
        h = h[h["ts"] > start]
    if end is not None:
        h = h[h["ts"] <= end]
    if h.empty:
        return pd.DataFrame(columns=by + ["value", "count"])
    wide = (
        h.pivot_table(index=by or None, columns="le", values="count", aggfunc="sum", fill_value=0)
        if by
        else h.groupby("le")["count"].sum().to_frame().T
    )
    les = all_bounds(metric, wide.columns.astype(float))
    wide = wide.reindex(columns=les, fill_value=0)
    vals = quantile_from_buckets(les[np.isfinite(les)], wide.to_numpy(), q)
    out = pd.DataFrame({"value": vals, "count": wide.to_numpy().sum(axis=1)}, index=wide.index)
    return out.reset_index() if by else out.reset_index(drop=True)


def quantiles_over_time(
    hist: pd.DataFrame,
    metric: str,
    qs: Sequence[float] = (0.5, 0.95, 0.99),
    freq: float = 600.0,
    by: Sequence[str] = (),
) -> pd.DataFrame:
    """Quantiles of ``metric`` per ``freq``-second time bucket (and group): what a latency-over-time
    chart draws.

    Each bucket pools the histogram rows stamped in it (``bucket_start``: a flush closing a bucket
    belongs to it) and takes the same estimate as :func:`hist_quantile`. Columns: ``bucket`` (start,
    Unix s), ``by``…, ``count`` and one column per quantile named ``p50``, ``p95``, ``p99`` (``q`` ×
    100, ``g`` format), plus ``overflow_<name>`` — True where that quantile fell in the overflow
    bucket (its value is then the largest finite bound, a lower limit rather than an estimate)."""
    from .buckets import bucket_start

    by = list(by)
    names = [f"p{q * 100:g}" for q in qs]
    cols = ["bucket", *by, "count", *names, *(f"overflow_{n}" for n in names)]
    h = hist[hist["metric"] == metric] if len(hist) else hist
    if h.empty:
        return pd.DataFrame(columns=cols)
    h = h.assign(bucket=bucket_start(h["ts"].to_numpy(dtype=float), freq))
    wide = h.pivot_table(
        index=["bucket", *by], columns="le", values="count", aggfunc="sum", fill_value=0
    )
    les = all_bounds(metric, wide.columns.astype(float))
    wide = wide.reindex(columns=les, fill_value=0)
    counts = wide.to_numpy(dtype=float)
    finite = les[np.isfinite(les)]
    out = wide.index.to_frame(index=False)
    out["count"] = counts.sum(axis=1)
    cum = np.cumsum(counts, axis=1)
    for q, n in zip(qs, names, strict=False):
        out[n] = quantile_from_buckets(finite, counts, q)
        # the rank lies beyond the last finite bound: only "at least the largest bound" is known
        out[f"overflow_{n}"] = (
            (cum[:, len(finite) - 1] < q * out["count"].to_numpy() - 1e-12) if len(finite) else True
        )
    out = out[out["count"] > 0]
    return out[cols].sort_values(["bucket", *by], kind="stable").reset_index(drop=True)
