"""Warm-up effect per run: warm-set precision and recall, wasted GPU time,
and before/after hit rate, TTFT P50/P95 and GPU time.

Definitions (exact, from the collectors' per-key records):

* **precision** — of the keys a run warmed, the share *read while still the
  warmed entry*: a hit at ``first_hit_at`` that came before the entry's TTL ran
  out (``warmed_at + ttl_s``) and before the key was first missed
  (``first_miss_at``: evicted or expired, so a later hit read a refilled entry,
  not the warmed one).
* **recall(T)** — of the distinct keys requested in the first ``T`` seconds
  after the run ended (in its layer and tenant scope), the share the run had
  warmed. ``T`` is at most the collectors' ``early_window_s``.
* **wasted GPU-seconds** — the warm-up cost (``gpu_s`` per key) of keys never
  read; ``overhead_gpu_s`` is run cost not attributed to any key.

Example::

    cov = warm_set_coverage(runs, warmed_keys, early_keys, recall_window_s=600)
    eff = run_effect(run, lookups, histograms, requests, window_s=900)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .hitrate import hit_table, time_slice
from .latency import TTFT, all_bounds, quantile_from_buckets

__all__ = ["warm_set_coverage", "read_in_time", "run_effect", "WarmupSpend", "warmup_spend"]


def read_in_time(warmed: pd.DataFrame) -> pd.Series:
    """Per warmed key: was the warmed entry itself read? (see module doc)."""
    hit = warmed["first_hit_at"].to_numpy(dtype=float)
    miss = warmed["first_miss_at"].to_numpy(dtype=float)
    ttl = warmed["ttl_s"].to_numpy(dtype=float)
    at = warmed["warmed_at"].to_numpy(dtype=float)
    ok = np.isfinite(hit)
    ok &= ~np.isfinite(miss) | (hit < miss)
    ok &= ~(np.isfinite(ttl) & (ttl > 0)) | (hit <= at + np.where(np.isfinite(ttl), ttl, np.inf))
    return pd.Series(ok, index=warmed.index)


@dataclass(frozen=True)
class WarmupSpend:
    """What the warm-up runs of a range spent and wasted: ``gpu_s`` the runs' own GPU-seconds
    (``warmup_runs.gpu_s``, overhead included), ``wasted_gpu_s`` the warm-up cost of their keys
    never read while warm (:func:`read_in_time`), ``keys_warmed`` and ``keys_unread`` their
    warmed keys. The one definition every page shows."""

    runs: int
    gpu_s: float
    keys_warmed: int
    keys_unread: int
    wasted_gpu_s: float

    @property
    def unread_share(self) -> float:
        return self.keys_unread / self.keys_warmed if self.keys_warmed else float("nan")

    def sentence(self) -> str:
        """One line: "W of S GPU-s wasted on U of K warmed keys never read while warm (x %),
        N runs"."""
        if not self.runs:
            return "No warm-up runs started in this range."
        keys = (
            f"on {self.keys_unread:,} of {self.keys_warmed:,} warmed keys never read while warm "
            f"({self.unread_share:.0%})"
            if self.keys_warmed
            else "(no warmed keys recorded)"
        )
        return (
            f"{self.wasted_gpu_s:,.2f} of {self.gpu_s:,.2f} warm-up GPU-s wasted {keys}; "
            f"{self.runs:,} run{'s' if self.runs != 1 else ''} started in the range"
        )


def warmup_spend(runs: pd.DataFrame, warmed: pd.DataFrame) -> WarmupSpend:
    """The spend and waste of ``runs`` (the runs that started in a range) and of their keys:
    ``warmed`` rows of other runs are left out, so a window's keys belong to its runs."""
    if runs.empty:
        return WarmupSpend(0, 0.0, 0, 0, 0.0)
    mine = warmed[warmed["run_id"].isin(runs["run_id"])] if len(warmed) else warmed
    unread = mine[~read_in_time(mine)] if len(mine) else mine
    return WarmupSpend(
        runs=len(runs),
        gpu_s=float(runs["gpu_s"].fillna(0).sum()),
        keys_warmed=len(mine),
        keys_unread=len(unread),
        wasted_gpu_s=float(unread["gpu_s"].fillna(0).sum()) if len(unread) else 0.0,
    )


def warm_set_coverage(
    runs: pd.DataFrame, warmed: pd.DataFrame, early: pd.DataFrame, recall_window_s: float = 900.0
) -> pd.DataFrame:
    """One row per run: keys, read, precision, early keys, recall, wasted GPU-s."""
    cols = [
        "run_id",
        "strategy",
        "layer",
        "tenant",
        "replica",
        "trigger",
        "started",
        "ended",
        "keys_warmed",
        "keys_read",
        "precision",
        "early_keys",
        "early_warmed",
        "recall",
        "gpu_s",
        "wasted_gpu_s",
        "overhead_gpu_s",
    ]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    w = (
        warmed.assign(read=read_in_time(warmed))
        if len(warmed)
        else warmed.assign(read=pd.Series(dtype=bool))
    )
    per = (
        w.groupby("run_id").agg(
            keys_warmed=("key_hash", "size"), keys_read=("read", "sum"), key_gpu_s=("gpu_s", "sum")
        )
        if len(w)
        # float: runs without warmed-key records read as 0 keys, a NaN precision (not a crash)
        else pd.DataFrame(columns=["keys_warmed", "keys_read", "key_gpu_s"], dtype=float)
    )
    wasted = w[~w["read"]].groupby("run_id")["gpu_s"].sum() if len(w) else pd.Series(dtype=float)
    out = runs[
        ["run_id", "strategy", "layer", "tenant", "replica", "trigger", "started", "ended", "gpu_s"]
    ].merge(per, left_on="run_id", right_index=True, how="left")
    out["wasted_gpu_s"] = out["run_id"].map(wasted).fillna(0.0)
    out[["keys_warmed", "keys_read", "key_gpu_s"]] = out[
        ["keys_warmed", "keys_read", "key_gpu_s"]
    ].fillna(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["precision"] = np.where(
            out["keys_warmed"] > 0, out["keys_read"] / out["keys_warmed"], np.nan
        )
    out["overhead_gpu_s"] = (out["gpu_s"] - out["key_gpu_s"]).clip(lower=0)
    # Recall: early keys seen within T of the run's end, warmed by that run.
    if len(early):
        e = early.merge(runs[["run_id", "ended"]], on="run_id")
        e = e[e["first_seen"] <= e["ended"] + recall_window_s]
        warmed_pairs = set(zip(w["run_id"], w["key_hash"], strict=True)) if len(w) else set()
        e = e.assign(
            was_warmed=[
                (r, k) in warmed_pairs for r, k in zip(e["run_id"], e["key_hash"], strict=True)
            ]
        )
        rc = e.groupby("run_id").agg(
            early_keys=("key_hash", "size"), early_warmed=("was_warmed", "sum")
        )
        out = out.merge(rc, left_on="run_id", right_index=True, how="left")
    else:
        out["early_keys"] = np.nan
        out["early_warmed"] = np.nan
    out[["early_keys", "early_warmed"]] = out[["early_keys", "early_warmed"]].fillna(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["recall"] = np.where(
            out["early_keys"] > 0, out["early_warmed"] / out["early_keys"], np.nan
        )
    return out[cols].reset_index(drop=True)


def _scope(df: pd.DataFrame, run: Any, layer: bool) -> pd.DataFrame:
    # Vectorised string compares (Arrow-backed in pandas 3): never .to_numpy() on strings.
    if df.empty:
        return df
    m = pd.Series(True, index=df.index)
    # mypy infers getattr's default from the bool context
    if "replica" in df.columns and getattr(run, "replica", ""):  # type: ignore[arg-type]
        m &= df["replica"] == run.replica
    if getattr(run, "tenant", "") and "tenant" in df.columns:
        m &= df["tenant"] == run.tenant
    if layer and "layer" in df.columns:  # a warm-up of several layers ("prefix_kv+response")
        m &= df["layer"].isin(str(run.layer).split("+"))
    return df[m.to_numpy(dtype=bool)]


def run_effect(
    run: Any,
    lookups: pd.DataFrame,
    histograms: pd.DataFrame,
    requests: pd.DataFrame,
    window_s: float = 900.0,
) -> pd.DataFrame:
    """Before (``window_s`` before the run started) vs after (``window_s`` after
    it ended) on the run's replica and scope: hit rate of its layer, TTFT P50
    and P95, GPU-seconds per request. Rows: metric; columns: before, after,
    change. A side with no data is NaN."""
    b0, b1 = run.started - window_s, run.started
    a0, a1 = run.ended, run.ended + window_s
    lk = _scope(time_slice(lookups, b0, a1), run, layer=True)
    hist = _scope(time_slice(histograms, b0, a1), run, layer=False)
    req = _scope(time_slice(requests, b0, a1), run, layer=False)

    def hr(s: float, e: float) -> float:
        t = hit_table(lk[(lk.ts > s) & (lk.ts <= e)])
        return float(t["hit_rate"].iloc[0]) if len(t) else np.nan

    ttft = hist[hist["metric"] == TTFT] if len(hist) else hist

    def q(
        qs: Sequence[float], s: float, e: float
    ) -> list[float]:  # both quantiles from one bucket sum
        w = time_slice(ttft, s, e)
        if w.empty:
            return [np.nan] * len(qs)
        c = w.groupby("le")["count"].sum()
        les = all_bounds(TTFT, c.index)
        c = c.reindex(les, fill_value=0)
        return [float(quantile_from_buckets(les[np.isfinite(les)], c.to_numpy(), x)[0]) for x in qs]

    def gpu(s: float, e: float) -> float:
        r = req[(req.ts > s) & (req.ts <= e)]
        n = r["requests"].sum()
        return float(r["gpu_s"].sum() / n) if n else np.nan

    qb, qa = q((0.5, 0.95), b0, b1), q((0.5, 0.95), a0, a1)
    rows = {
        "hit_rate": (hr(b0, b1), hr(a0, a1)),
        "ttft_p50_s": (qb[0], qa[0]),
        "ttft_p95_s": (qb[1], qa[1]),
        "gpu_s_per_request": (gpu(b0, b1), gpu(a0, a1)),
    }
    out = pd.DataFrame(rows, index=["before", "after"]).T
    out["change"] = out["after"] - out["before"]
    return out
