"""Hit rates by any dimensions, over time, with Wilson intervals, and change.

Hit rate = hits / (hits + misses). ``bypass`` and ``error`` lookups are not in
the denominator: a bypassed request never asked the cache, and errors are
reported on their own (:func:`result_shares`); :func:`hit_table` counts the
bypassed lookups beside the rate (``bypassed``), so a bypass spike shows where
the rate cannot.

Example::

    t = hit_table(lookups, by=["tenant", "layer"], freq=300)     # 5-minute buckets
    c = hit_rate_change(lookups, by=["layer"], window=(t1, t2), baseline="previous")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .buckets import bucket_start

__all__ = [
    "Z95",
    "time_slice",
    "wilson",
    "hit_table",
    "hit_rate_change",
    "result_shares",
    "DIMENSIONS",
    "newcombe_diff",
    "unmeasured_share",
]

Z95 = 1.959963984540054  # norm.ppf(0.975)
DIMENSIONS = (
    "tenant",
    "layer",
    "family",
    "experiment",
    "variant",
    "model",
    "replica",
    "length_bucket",
)


def wilson(hits: Any, n: Any, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for hits/n (vectorised); NaN where n == 0."""
    hits = np.asarray(hits, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = hits / n
        z2 = z * z
        den = 1 + z2 / n
        centre = (p + z2 / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / den
        lo, hi = centre - half, centre + half
    bad = n <= 0
    lo = np.where(bad, np.nan, np.clip(lo, 0, 1))
    hi = np.where(bad, np.nan, np.clip(hi, 0, 1))
    return lo, hi


def _check(lookups: pd.DataFrame, by: Sequence[str]) -> None:
    missing = [c for c in list(by) + ["result", "count"] if c not in lookups.columns]
    if missing:
        raise ValueError(
            f"lookups frame lacks column(s) {missing}; dimensions: {', '.join(DIMENSIONS)}"
        )


def _hits_n(lookups: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    res = lookups["result"].to_numpy()
    cnt = lookups["count"].to_numpy(dtype=float)
    is_hit = res == "hit"
    return np.where(is_hit, cnt, 0.0), np.where(is_hit | (res == "miss"), cnt, 0.0)


def _bypassed(lookups: pd.DataFrame) -> np.ndarray:
    return np.where(
        lookups["result"].to_numpy() == "bypass", lookups["count"].to_numpy(dtype=float), 0.0
    )


def hit_table(
    lookups: pd.DataFrame,
    by: Sequence[str] = (),
    freq: float | None = None,
    z: float = Z95,
    mask: np.ndarray | None = None,
) -> pd.DataFrame:
    """Hits, lookups, hit rate and Wilson CI per group (and per ``freq``-second
    time bucket when given: column ``bucket``, the bucket's start), and the
    lookups that bypassed the cache (``bypassed``: in neither hits nor lookups).

    ``mask`` (boolean per row) leaves rows out without copying the frame."""
    by = list(by)
    _check(lookups, by)
    keys = by + (["bucket"] if freq else [])
    cols = keys + ["hits", "lookups", "hit_rate", "ci_low", "ci_high", "bypassed"]
    if lookups.empty:
        return pd.DataFrame(columns=cols)
    h, n = _hits_n(lookups)
    b = _bypassed(lookups)
    if mask is not None:
        h, n, b = h * mask, n * mask, b * mask
    vals = pd.DataFrame({"hits": h, "lookups": n, "bypassed": b}, index=lookups.index)
    groupers = [lookups[c] for c in by]
    if freq:
        # Points are stamped at the end of their interval: put them in the bucket they cover.
        groupers.append(
            pd.Series(
                bucket_start(lookups["ts"].to_numpy(dtype=float), freq),
                index=lookups.index,
                name="bucket",
            )
        )
    g = (
        vals.groupby(groupers, sort=True, observed=True).sum().reset_index()
        if groupers
        else pd.DataFrame({"hits": [h.sum()], "lookups": [n.sum()], "bypassed": [b.sum()]})
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        g["hit_rate"] = np.where(g["lookups"] > 0, g["hits"] / g["lookups"], np.nan)
    g["ci_low"], g["ci_high"] = wilson(g["hits"], g["lookups"], z)
    return g[cols]


def newcombe_diff(h1: Any, n1: Any, h0: Any, n0: Any, z: float = Z95) -> tuple[Any, Any, Any]:
    """Difference p1 - p0 with Newcombe's hybrid Wilson interval (method 10)."""
    p1 = np.divide(h1, n1, out=np.full(np.shape(h1), np.nan, dtype=float), where=np.asarray(n1) > 0)
    p0 = np.divide(h0, n0, out=np.full(np.shape(h0), np.nan, dtype=float), where=np.asarray(n0) > 0)
    l1, u1 = wilson(h1, n1, z)
    l0, u0 = wilson(h0, n0, z)
    d = p1 - p0
    lo = d - np.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2)
    hi = d + np.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)
    return d, lo, hi


def time_slice(df: pd.DataFrame, start: float, end: float, col: str = "ts") -> pd.DataFrame:
    """Rows with start < ts <= end. Frames sorted by time (as sources return
    them) are cut with a binary search — a view, no copy; others are masked."""
    if df.empty:
        return df
    ts = df[col].to_numpy(dtype=float)
    if len(ts) < 2 or (ts[1:] >= ts[:-1]).all():
        return df.iloc[np.searchsorted(ts, start, "right") : np.searchsorted(ts, end, "right")]
    return df[(ts > start) & (ts <= end)]


_window = time_slice


def hit_rate_change(
    lookups: pd.DataFrame,
    by: Sequence[str],
    window: tuple[float, float],
    baseline: str | tuple[float, float] = "previous",
    z: float = Z95,
) -> pd.DataFrame:
    """Hit rate in ``window`` against a baseline window, per group.

    ``baseline``: ``"previous"`` (the same length just before), ``"yesterday"``
    (the same window one day earlier), or an explicit ``(start, end)`` (e.g.
    before a warm-up run). Columns: rate, baseline_rate, delta with Newcombe
    CI (delta_low, delta_high), p_value (two-proportion z-test), and counts.
    """
    start, end = window
    if end <= start:
        raise ValueError(f"window end {end} is not after its start {start}")
    if baseline == "previous":
        b = (start - (end - start), start)
    elif baseline == "yesterday":
        b = (start - 86400, end - 86400)
    elif isinstance(baseline, tuple) and len(baseline) == 2:
        b = baseline
    else:
        raise ValueError(
            f"baseline must be 'previous', 'yesterday' or (start, end); got {baseline!r}"
        )
    cur = hit_table(_window(lookups, start, end), by)
    base = hit_table(_window(lookups, *b), by)
    by = list(by)
    if by:
        m = cur.merge(base, on=by, how="outer", suffixes=("", "_base"))
    else:
        m = pd.concat([cur.add_suffix(""), base.add_suffix("_base")], axis=1)
    for c in ("hits", "lookups", "hits_base", "lookups_base"):
        m[c] = pd.to_numeric(m[c], errors="coerce").fillna(
            0.0
        )  # an empty side merges as object dtype
    for c in ("hit_rate", "hit_rate_base"):
        m[c] = pd.to_numeric(m[c], errors="coerce")
    d, lo, hi = newcombe_diff(
        m["hits"].to_numpy(float),
        m["lookups"].to_numpy(float),
        m["hits_base"].to_numpy(float),
        m["lookups_base"].to_numpy(float),
        z,
    )
    pooled = (m["hits"] + m["hits_base"]) / (m["lookups"] + m["lookups_base"]).replace(0, np.nan)
    se = np.sqrt(
        pooled
        * (1 - pooled)
        * (1 / m["lookups"].replace(0, np.nan) + 1 / m["lookups_base"].replace(0, np.nan))
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        zstat = d / se.to_numpy()
    out = pd.DataFrame(
        {
            **{c: m[c] for c in by},
            "rate": m["hit_rate"],
            "baseline_rate": m["hit_rate_base"],
            "delta": d,
            "delta_low": lo,
            "delta_high": hi,
            "p_value": np.where(np.isfinite(zstat), 2 * stats.norm.sf(np.abs(zstat)), np.nan),
            "lookups": m["lookups"],
            "baseline_lookups": m["lookups_base"],
            "baseline_start": b[0],
            "baseline_end": b[1],
        }
    )
    return out.sort_values("delta", kind="stable").reset_index(drop=True)


def unmeasured_share(requests: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Requests whose token usage was not reported (``unmeasured``: left out of
    token hit rates) per group: ``requests``, ``unmeasured`` and their ratio
    ``share`` (NaN without requests)."""
    by = list(by)
    cols = ["requests", "unmeasured"]
    if requests.empty or "unmeasured" not in requests.columns:
        return pd.DataFrame(columns=[*by, *cols, "share"])
    g = requests.groupby(by)[cols].sum().reset_index() if by else requests[cols].sum().to_frame().T
    g["share"] = g["unmeasured"] / g["requests"].where(g["requests"] > 0)
    return g.reset_index(drop=True)


def result_shares(lookups: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Share of each result (hit, miss, bypass, error) per group."""
    by = list(by)
    _check(lookups, by)
    p = (
        lookups.pivot_table(
            index=by or None, columns="result", values="count", aggfunc="sum", fill_value=0
        )
        if by
        else lookups.groupby("result")["count"].sum().to_frame().T
    )
    for r in ("hit", "miss", "bypass", "error"):
        if r not in p.columns:
            p[r] = 0
    tot = p[["hit", "miss", "bypass", "error"]].sum(axis=1).replace(0, np.nan)
    out = p[["hit", "miss", "bypass", "error"]].div(tot, axis=0)
    out["total"] = tot.fillna(0)
    return out.reset_index() if by else out.reset_index(drop=True)
