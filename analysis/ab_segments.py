"""An A/B comparison per segment (tenant, model, layer, prompt length, or a pair of them), from
metric series.

A/B unit records carry no tenant or model, so a per-segment comparison reads the labelled metric
series (``lookups``, ``requests``, ``histograms``) of the experiment instead: per segment, arm and
``freq``-second time bucket a value (hit rate, GPU-s per request, TTFT P95), then batch means — each
bucket's value a sample, Welch's t between the arms (:func:`analysis.ab.batch_means`) — with the
difference's 95% CI and Holm and Benjamini–Hochberg adjusted p-values across every segment × metric
row of the table.

Batch means are rougher than the unit-level report: buckets are not independent units
(autocorrelation makes the p-values optimistic). Segments with fewer than ``min_buckets`` buckets in
an arm are not tested.

Example::

    t = segment_table(lookups, requests, histograms, "warmup-strategy", "A", "B", by=["tenant"])
    # columns: tenant, metric, control, treatment, difference, ci_low, ci_high, relative, p,
    #          p_holm, p_bh, buckets_control, buckets_treatment,
    #          outcome ("win" | "lose" | "neutral" | "not tested")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from warmscope.model.records import not_in_hit_rate

from .ab import adjust, batch_means
from .buckets import bucket_start
from .hitrate import hit_table
from .latency import TTFT, quantiles_over_time

__all__ = ["segment_table", "DIMENSIONS", "METRICS"]

# Dimensions a segment can be cut by, and the frames that carry each.
DIMENSIONS = ("tenant", "model", "layer", "length_bucket")
METRICS = ("hit rate", "GPU-s per request", "TTFT P95 (s)")
_LOWER_IS_BETTER = {"GPU-s per request", "TTFT P95 (s)"}


def _arm(df: pd.DataFrame, experiment: str, arms: Sequence[str]) -> pd.DataFrame:
    if df is None or df.empty or "experiment" not in df:
        return pd.DataFrame()
    return df[(df["experiment"] == experiment) & df["variant"].isin(arms)]


def _samples(
    values: pd.DataFrame,
    by: list[str],
    control: str,
    treatment: str,
    metric: str,
    rows: list[dict[str, Any]],
    min_buckets: int,
) -> None:
    """values: by + [variant, bucket, v] → one row per segment."""
    values = values[np.isfinite(values["v"].to_numpy(dtype=float))]
    for seg, g in values.groupby(by, sort=True) if by else [((), values)]:
        seg = seg if isinstance(seg, tuple) else (seg,)
        a = g.loc[g["variant"] == control, "v"].to_numpy(dtype=float)
        b = g.loc[g["variant"] == treatment, "v"].to_numpy(dtype=float)
        row = dict(
            zip(by, map(str, seg), strict=False),
            metric=metric,
            buckets_control=len(a),
            buckets_treatment=len(b),
        )
        if min(len(a), len(b)) < min_buckets:
            row.update(
                control=a.mean() if len(a) else np.nan,
                treatment=b.mean() if len(b) else np.nan,
                difference=np.nan,
                ci_low=np.nan,
                ci_high=np.nan,
                relative=np.nan,
                p=np.nan,
            )
        else:
            r = batch_means(a, b, metric)
            row.update(
                control=r.control,
                treatment=r.treatment,
                difference=r.abs_effect,
                ci_low=r.abs_low,
                ci_high=r.abs_high,
                relative=r.rel_effect,
                p=r.p_value,
            )
        rows.append(row)


def segment_table(
    lookups: pd.DataFrame,
    requests: pd.DataFrame,
    histograms: pd.DataFrame,
    experiment: str,
    control: str,
    treatment: str,
    by: Sequence[str],
    freq: float = 600.0,
    min_buckets: int = 3,
) -> pd.DataFrame:
    """Per segment of ``by`` (a subset of :data:`DIMENSIONS`) and metric: each arm's mean of its
    per-bucket values, the difference treatment − control with its 95% CI, the relative difference,
    p, Holm and BH p-values (across all rows), and the outcome at Holm p < 0.05. Hit rate leaves the
    model-weights layer out. A metric whose frame lacks a dimension of ``by`` is skipped (requests
    and TTFT carry no layer or prompt length)."""
    by = list(by)
    bad = [d for d in by if d not in DIMENSIONS]
    if bad or not by:
        raise ValueError(f"segments are cut by one or two of {', '.join(DIMENSIONS)}; got {by!r}")
    arms = [control, treatment]
    rows: list[dict[str, Any]] = []
    lk = _arm(lookups, experiment, arms)
    if len(lk):
        lk = lk[~lk["layer"].isin(not_in_hit_rate())]  # e.g. model weights: not a warm-up cache
        t = hit_table(lk, by=[*by, "variant"], freq=freq)
        t = t[t["lookups"] > 0]
        _samples(
            t.rename(columns={"hit_rate": "v"}),
            by,
            control,
            treatment,
            "hit rate",
            rows,
            min_buckets,
        )
    rq = _arm(requests, experiment, arms)
    if len(rq) and all(d in rq.columns for d in by):
        b = bucket_start(rq["ts"].to_numpy(dtype=float), freq)
        g = (
            rq.assign(bucket=b)
            .groupby([*by, "variant", "bucket"], observed=True)[["requests", "gpu_s"]]
            .sum()
        )
        g = g[g["requests"] > 0].reset_index()
        g["v"] = g["gpu_s"] / g["requests"]
        _samples(g, by, control, treatment, "GPU-s per request", rows, min_buckets)
    hs = _arm(histograms, experiment, arms)
    if len(hs) and all(d in hs.columns for d in by) and "layer" not in by:
        q = quantiles_over_time(hs, TTFT, qs=(0.95,), freq=freq, by=[*by, "variant"])
        # a bucket whose P95 is past the last edge has no value
        q = q[~q["overflow_p95"].astype(bool)]
        _samples(
            q.rename(columns={"p95": "v"}),
            by,
            control,
            treatment,
            "TTFT P95 (s)",
            rows,
            min_buckets,
        )
    cols = [
        *by,
        "metric",
        "control",
        "treatment",
        "difference",
        "ci_low",
        "ci_high",
        "relative",
        "p",
        "p_holm",
        "p_bh",
        "buckets_control",
        "buckets_treatment",
        "outcome",
    ]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame(rows)
    out["p_holm"], out["p_bh"] = np.nan, np.nan
    tested = out["p"].notna().to_numpy()
    if tested.any():
        holm, bh = adjust(out.loc[tested, "p"].to_numpy(dtype=float))
        out.loc[tested, "p_holm"], out.loc[tested, "p_bh"] = holm, bh

    def outcome(r: Any) -> str:
        if not np.isfinite(r.p):
            return "not tested"
        if not r.p_holm < 0.05 or r.difference == 0:
            return "neutral"
        better = r.difference < 0 if r.metric in _LOWER_IS_BETTER else r.difference > 0
        return "win" if better else "lose"

    out["outcome"] = [outcome(r) for r in out.itertuples()]
    out["metric"] = pd.Categorical(out["metric"], categories=list(METRICS), ordered=True)
    out = out.sort_values(["metric", *by], kind="stable").reset_index(drop=True)
    out["metric"] = out["metric"].astype(str)
    return out[cols]
