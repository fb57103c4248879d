"""Why prefix-KV prompt tokens missed: the ``misses`` and ``kv_blocks`` frames as tables.

Every request's missed prompt tokens (prompt − cached) are split into classes
(``records.MISS_CLASSES``) that add up exactly to them; these functions only sum.

* :func:`class_table` — tokens and share per class;
* :func:`by_dimension` — one row per tenant, engine or family, a column per class;
* :func:`over_time` — tokens per class per time bucket (the page's stacked area);
* :func:`addressable` — the *warm-up-addressable* share beside what warm-up prevented;
* :func:`warmed_lost_before_read` — per warm-up run, the warmed keys gone before their first reader;
* :func:`block_rates` — an engine's blocks stored, reused, evicted per second, resident, per salt.

Warm-up-addressable tokens: the ``cold`` and ``evicted`` tokens of the (tenant, key family)
pairs of which a warm-up run in the range warmed at least one ``prefix_kv`` key. They are the
misses a warm-up of the families it already targets, run at the right time, could have
prevented: ``cold`` because the family's prefix was never stored before the request, ``evicted``
because it was stored and gone when the request came. ``elsewhere``, ``isolated`` and ``drifted``
are routing, isolation and key problems that warming does not fix, and ``partial`` tails are never
cacheable. What warm-up prevented is read from ``warmed_keys``: the hits on warmed ``prefix_kv``
keys (``hits``, in the unit the layer's lookups count: blocks in the simulator, tokens for an
engine's client).

Example::

    t = class_table(misses)                 # miss_class, tokens, share
    a = addressable(misses, warmed_keys)    # a dict: tokens, addressable, share, warm_hits
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from warmscope.model.records import MISS_CLASSES

__all__ = [
    "MISS_CLASSES",
    "ADDRESSABLE_CLASSES",
    "class_table",
    "by_dimension",
    "over_time",
    "addressable",
    "warmed_lost_before_read",
    "block_rates",
    "class_shares",
]

ADDRESSABLE_CLASSES = ("cold", "evicted")


def _present(misses: pd.DataFrame) -> list[str]:
    """The classes in declaration order: the six always, ``unknown`` only when it has tokens."""
    have = set(misses["miss_class"]) if len(misses) else set()
    return [c for c in MISS_CLASSES if c != "unknown" or c in have]


def class_table(misses: pd.DataFrame) -> pd.DataFrame:
    """miss_class, tokens, requests, share (of all missed tokens); every class, zero included."""
    classes = _present(misses)
    if misses.empty:
        return pd.DataFrame({"miss_class": classes, "tokens": 0, "requests": 0, "share": np.nan})
    g = misses.groupby("miss_class")[["tokens", "requests"]].sum().reindex(classes, fill_value=0)
    total = float(g["tokens"].sum())
    out = g.reset_index()
    out["share"] = out["tokens"] / total if total else np.nan
    return out


def class_shares(misses: pd.DataFrame) -> dict[str, float]:
    """Share of the missed tokens per class (empty dict without tokens)."""
    t = class_table(misses)
    total = float(t["tokens"].sum())
    if not total:
        return {}
    return {
        str(c): float(n) / total
        for c, n in zip(t["miss_class"], t["tokens"].to_numpy(float), strict=True)
    }


def by_dimension(misses: pd.DataFrame, dim: str) -> pd.DataFrame:
    """One row per value of ``dim`` (tenant, engine or family): tokens per class, the total,
    and the shares of ``evicted`` and of the warm-up-addressable classes; largest total first."""
    classes = _present(misses)
    cols = [dim, *classes, "total", "evicted_share", "addressable_share"]
    if misses.empty:
        return pd.DataFrame(columns=cols)
    p = misses.pivot_table(
        index=dim, columns="miss_class", values="tokens", aggfunc="sum", fill_value=0
    )
    p = p.reindex(columns=classes, fill_value=0)
    p["total"] = p[classes].sum(axis=1)
    tot = p["total"].where(p["total"] > 0)
    p["evicted_share"] = p["evicted"] / tot
    p["addressable_share"] = p[list(ADDRESSABLE_CLASSES)].sum(axis=1) / tot
    out = p.reset_index().sort_values("total", ascending=False, ignore_index=True)
    return out[cols]


def _bucket_ending(ts: np.ndarray, freq: float) -> np.ndarray:
    """The start ``b`` of the bucket (b, b + freq] holding each ``ts`` (a stamp on a bucket's
    edge ends the bucket before it; exact for epoch seconds, where a subtracted epsilon is lost)."""
    return np.asarray((np.ceil(ts / freq) - 1.0) * freq, dtype=float)


def over_time(misses: pd.DataFrame, freq: float = 600.0) -> pd.DataFrame:
    """ts (bucket start), miss_class, tokens, covered_s, per_min: per ``freq`` seconds, every
    class on every bucket. A row stamped ``ts`` counts the flush interval ending at ``ts`` (back
    to the flush before it; the first one as long as the median interval), so bucket ``b`` holds
    the rows of (b, b + freq]; ``covered_s`` is how long the intervals of its flushes are (a row
    read counts its whole interval, even one that began before the range) and ``per_min`` the
    tokens per minute over it: a bucket cut short by the range's edges or by a short last flush
    reads as a rate, not as a drop or a spike."""
    classes = _present(misses)
    if misses.empty:
        return pd.DataFrame(columns=["ts", "miss_class", "tokens", "covered_s", "per_min"])
    ts = misses["ts"].to_numpy(float)
    b = _bucket_ending(ts, freq)
    g = misses.assign(ts=b).groupby(["ts", "miss_class"])["tokens"].sum()
    idx = pd.MultiIndex.from_product([np.unique(b), classes], names=["ts", "miss_class"])
    out = g.reindex(idx, fill_value=0).reset_index()
    flushes = np.unique(ts)
    gaps = np.diff(flushes)
    first = float(np.median(gaps)) if len(gaps) else freq
    lo = np.concatenate([[flushes[0] - first], flushes[:-1]])  # each flush's interval start
    # a flush's whole interval counts in its bucket, as its tokens do
    covered = pd.Series(np.maximum(flushes - lo, 0.0)).groupby(_bucket_ending(flushes, freq)).sum()
    out["covered_s"] = np.maximum(out["ts"].map(covered).to_numpy(float), 1.0)
    out["per_min"] = out["tokens"] / out["covered_s"] * 60.0
    return out


def _warmed_kv(warmed_keys: pd.DataFrame) -> pd.DataFrame:
    if warmed_keys.empty or "layer" not in warmed_keys:
        return warmed_keys.iloc[0:0]
    return warmed_keys[warmed_keys["layer"] == "prefix_kv"]


def addressable(misses: pd.DataFrame, warmed_keys: pd.DataFrame) -> dict[str, Any]:
    """The warm-up-addressable tokens (module docstring) and what warm-up prevented.

    Returns ``tokens`` (all missed tokens), ``addressable`` (cold + evicted tokens of warmed
    (tenant, family) pairs), ``share`` (addressable / tokens, NaN without tokens),
    ``cold_evicted`` (cold + evicted tokens of any family), ``families`` (warmed pairs),
    ``warmed_keys`` and ``warm_hits`` (prefix_kv keys warmed, and hits on them)."""
    total = float(misses["tokens"].sum()) if len(misses) else 0.0
    wk = _warmed_kv(warmed_keys)
    pairs = set(zip(wk["tenant"], wk["family"], strict=True)) if len(wk) else set()
    ce = misses[misses["miss_class"].isin(ADDRESSABLE_CLASSES)] if len(misses) else misses
    if len(ce) and pairs:
        hit = [(t, f) in pairs for t, f in zip(ce["tenant"], ce["family"], strict=True)]
        addr = float(ce.loc[hit, "tokens"].sum())
    else:
        addr = 0.0
    return {
        "tokens": total,
        "addressable": addr,
        "share": addr / total if total else float("nan"),
        "cold_evicted": float(ce["tokens"].sum()) if len(ce) else 0.0,
        "families": len(pairs),
        "warmed_keys": len(wk),
        "warm_hits": float(wk["hits"].sum()) if len(wk) else 0.0,
    }


def warmed_lost_before_read(warmed_keys: pd.DataFrame) -> pd.DataFrame:
    """Per warm-up run (prefix_kv keys): keys warmed, keys whose first read after warming missed
    (evicted or expired before their first reader), their share, and the median and largest time
    from warming to that first miss (the key was gone by then). One row per run, most lost first."""
    cols = ["run_id", "keys", "lost", "lost_share", "median_s", "max_s"]
    wk = _warmed_kv(warmed_keys)
    if wk.empty:
        return pd.DataFrame(columns=cols)
    miss, hit = wk["first_miss_at"].to_numpy(float), wk["first_hit_at"].to_numpy(float)
    lost = np.isfinite(miss) & ~(np.isfinite(hit) & (hit <= miss))
    d = wk.assign(lost=lost, gone_s=np.where(lost, miss - wk["warmed_at"].to_numpy(float), np.nan))
    g = (
        d.groupby("run_id")
        .agg(
            keys=("lost", "size"),
            lost=("lost", "sum"),
            median_s=("gone_s", "median"),
            max_s=("gone_s", "max"),
        )
        .reset_index()
    )
    g["lost_share"] = g["lost"] / g["keys"]
    return g.sort_values(["lost_share", "keys"], ascending=False, ignore_index=True)[cols]


def block_rates(kv_blocks: pd.DataFrame) -> pd.DataFrame:
    """Per engine × salt: blocks stored, reused and evicted per second over the frame's span,
    the reuse ratio (reused / (stored + reused)) and the last resident count."""
    cols = [
        "engine",
        "salt",
        "stored_per_s",
        "reused_per_s",
        "evicted_per_s",
        "reuse_ratio",
        "resident",
    ]
    if kv_blocks.empty:
        return pd.DataFrame(columns=cols)
    ts = kv_blocks["ts"].to_numpy(float)
    uts = np.unique(ts)
    step = float(np.median(np.diff(uts))) if len(uts) > 1 else 0.0
    span = max(float(uts[-1] - uts[0]) + step, 1.0)  # a flush stamps the end of its interval
    g = kv_blocks.groupby(["engine", "salt"])
    out = g[["stored", "reused", "evicted"]].sum()
    last = kv_blocks.sort_values("ts").groupby(["engine", "salt"])["resident"].last()
    res = pd.DataFrame({f"{c}_per_s": out[c] / span for c in ("stored", "reused", "evicted")})
    both = (out["stored"] + out["reused"]).where(lambda s: s > 0)
    res["reuse_ratio"] = out["reused"] / both
    res["resident"] = last
    return res.reset_index()[cols]
