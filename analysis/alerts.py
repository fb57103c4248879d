"""Alert conditions evaluated over canonical frames — the embedded-mode
counterpart of the Prometheus alerting rules.

Thresholds come from :mod:`analysis.alert_defs`, which also writes the
Prometheus rules, so both sides raise the same alerts on the same data:

* ``HitRateRegression`` — a layer's hit rate in the latest third of the range
  is at least 20 % (relative) below the third before it, and the fall is
  significant (p < 0.01); critical past 50 %;
* ``WarmSetPrecisionLow`` — a warm-up strategy whose warmed entries in a layer
  were read less than 30% of the time over the range's runs (one alert per
  strategy × layer, as the rule);
* ``CrossTenantCacheRead`` (critical: a data leak) — any key of a
  tenant-scoped layer read by two or more tenants in the same hot-key window,
  anywhere in the range (not only its latest third: a leak does not stop
  mattering because it is old). Its onset is dated by the first data that
  shows it (:func:`leak_onset`), never by the start of the hot-key window,
  which may begin long before the leak;
* ``CacheBypassSpike`` — more than 5 % of a layer's lookups bypass the cache,
  held 10 minutes, where they did not an hour before, anywhere in the range;
* one alert per other detected cold-start trap (a warm-up timed against
  traffic that traffic did not use, counting scheduled and pre-peak runs:
  a restart's warm-up is timed by the restart).

``newest`` is the time of the newest data there is. A hot-key window still
open at ``end < newest`` holds reads made after ``end`` (its counts are the
whole window's), so re-evaluating recorded data at a past instant believes a
leak only from the first per-flush lookup that shows it.

Example::

    alerts = evaluate(frames, start, end)    # columns: severity, alert, summary, since
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import pandas as pd
from warmscope.collectors.config import CollectorConfig
from warmscope.model.schema import SHARED_LAYERS

from .ab_report import p_eq
from .alert_defs import (
    BYPASS_FOR_S,
    BYPASS_SHARE,
    HIT_RATE_CRITICAL_DROP,
    HIT_RATE_DROP,
    HIT_RATE_P,
    WARM_MIN_KEYS,
    WARM_PRECISION_MIN,
)
from .coverage import warm_set_coverage
from .hitrate import hit_rate_change
from .traps import TrapVerdict, detect_all, timing

__all__ = [
    "evaluate",
    "TRAP_ALERTS",
    "trap_verdicts",
    "cross_tenant_reads",
    "hot_keys_since",
    "bypass_spikes",
    "leak_onset",
    "hot_key_window_s",
    "HOT_KEY_WINDOW_S",
]

RESTART_TRIGGERS = ("replica_start", "replica_restart")

TRAP_ALERTS = {
    "warmup_out_of_step": ("TrafficBeforeWarmupComplete", "warning"),
    "dynamic_tokenisation": ("KeyFamilyCardinalityExplosion", "warning"),
    "kv_fixed_len": ("PrefixCacheMissesShortPrompts", "warning"),
    "tenant_isolation": ("CrossTenantCacheRead", "critical"),
    "bypass": ("CacheBypassSpike", "warning"),
    "key_explosion": ("KeyDimensionExplosion", "warning"),
    "warmup_timing": ("WarmupOutOfStepWithTraffic", "warning"),
}
_ORDER = {"critical": 0, "warning": 1, "info": 2}


# The collectors' hot-key window (``[collectors] hot_key_window_s``, an hour by default): a window
# is stamped with its start, so one starting up to this long before the range covers part of it.
HOT_KEY_WINDOW_S = float(CollectorConfig().hot_key_window_s)
# A flush's hit rate on the leaking layer dips below the hour before by more than this many
# robust standard deviations (1.4826 × MAD), and by at least LEAK_MIN_SHIFT: the leak shows. Or
# the mean of LEAK_RUN flushes dips by LEAK_RUN_SDS standard deviations of such a mean (and by
# LEAK_MIN_SHIFT), the first of them by LEAK_FIRST_SDS (and LEAK_MIN_SHIFT / 2): a leak's dip on
# a layer with few lookups per flush, where one flush's noise hides the step.
LEAK_SDS = 6.0
LEAK_MIN_SHIFT = 0.1
LEAK_RUN = 3
LEAK_RUN_SDS = 5.0
LEAK_FIRST_SDS = 2.5
# A leak that begins shortly before a window's end leaves too few reads there for its keys to be
# hot: the first flush that shows it is searched this share of a window before the first window
# with shared keys too.
LEAK_LEAD = 0.5


def hot_keys_since(start: float, end: float) -> float:
    """The earliest hot-key window :func:`evaluate` reads (load no more): the
    cross-tenant check covers the whole range."""
    return start - HOT_KEY_WINDOW_S


def hot_key_window_s(hot_keys: pd.DataFrame) -> float:
    """The length of the recorded hot-key windows: the smallest spacing of their stamps, at most
    the configured default (windows far apart are not one window long)."""
    w = np.unique(hot_keys["window"].to_numpy(float)) if len(hot_keys) else np.zeros(0)
    d = np.diff(w)
    d = d[d > 0]
    return float(min(d.min(), HOT_KEY_WINDOW_S)) if len(d) else HOT_KEY_WINDOW_S


def _first_departure(rate: pd.Series, lo: float, hi: float) -> float | None:
    """The stamp of the first flush in (lo, hi] whose rate dips below the hour up to ``lo`` (see
    LEAK_SDS and LEAK_RUN); None without one, or with under ten flushes to compare to. Only a dip:
    a rise (an engine warming up after a cold start) is no leak's onset."""
    ts = rate.index.to_numpy(float)
    vals = rate.to_numpy(float)
    before = vals[(ts > lo - 3600.0) & (ts <= lo)]
    inside = (ts > lo) & (ts <= hi)
    if len(before) < 10 or not inside.any():
        return None
    med = float(np.median(before))
    spread = 1.4826 * float(np.median(np.abs(before - med)))
    drop = med - vals[inside]  # a dip: keys that lose their tenant scope are new keys, and miss
    stamps = ts[inside]
    big = drop > max(LEAK_SDS * spread, LEAK_MIN_SHIFT)
    run = np.zeros(len(drop), bool)  # the LEAK_RUN flushes from flush i dip together
    if len(drop) >= LEAK_RUN:
        mean = np.convolve(drop, np.ones(LEAK_RUN) / LEAK_RUN, mode="valid")
        run[: len(mean)] = (
            drop[: len(mean)] > max(LEAK_FIRST_SDS * spread, LEAK_MIN_SHIFT / 2)
        ) & (mean > max(LEAK_RUN_SDS * spread / np.sqrt(LEAK_RUN), LEAK_MIN_SHIFT))
    hit = np.flatnonzero(big | run)
    return float(stamps[hit[0]]) if len(hit) else None


def leak_onset(
    lookups: pd.DataFrame | None,
    layers: list[str],
    window: float,
    window_s: float,
    newest: float,
    lead: float = 0.0,
) -> float:
    """When a cross-tenant read first shows in per-flush data: the stamp of the first flush in
    hot-key window [window, window + window_s) — or up to ``lead`` seconds before it — whose hit
    rate on ``layers`` dips below the hour before (keys that lose their tenant scope are new keys:
    they miss; see LEAK_SDS and LEAK_RUN).
    Without such a flush, the window's end, the first time its complete counts exist — or
    ``newest`` while the window is still open. Never the window's start: an hourly window
    stamped 16:00 holds a leak that began at 16:35.

    ``lead``: a leak that began near the previous window's end left too few reads there for its
    keys to be hot, and its first dip lies before ``window`` (searched first, against the hour
    before it; the leak's end, inside the window, dips too, so the window alone would date the
    end). Flushes are stamped at the end of their interval, so the onset is no earlier than the
    first data that shows the leak."""
    fallback = min(window + window_s, newest)
    if lookups is None or lookups.empty:
        return fallback
    lk = lookups[lookups["layer"].isin(layers) & lookups["result"].isin(("hit", "miss"))]
    if lk.empty:
        return fallback
    n = lk.groupby("ts")["count"].sum()
    hits = lk[lk["result"] == "hit"].groupby("ts")["count"].sum().reindex(n.index, fill_value=0)
    rate = (hits / n[n > 0]).dropna()
    if lead > 0:
        early = _first_departure(rate, window - lead, min(window, newest))
        if early is not None:
            return early
    found = _first_departure(rate, window, fallback)
    return fallback if found is None else found


def cross_tenant_reads(
    hot_keys: pd.DataFrame,
    start: float,
    end: float,
    lookups: pd.DataFrame | None = None,
    newest: float | None = None,
) -> dict[str, Any] | None:
    """Keys of tenant-scoped layers read by two or more tenants in one hot-key
    window overlapping (start, end]: {shared_keys, layers, tenants, first,
    last, window}, or None when there are none. ``first`` is the onset
    (:func:`leak_onset` over ``lookups``: the first flush that shows it), ``last``
    the start of the last window with a shared key, ``window`` the first one's
    start. A leak whose onset is after ``end`` (possible when re-evaluating at a
    past instant: the window's counts reach past it) is not there yet: None.
    ``newest``: the newest data there is (default ``end``)."""
    if hot_keys is None or hot_keys.empty:
        return None
    ws = hot_key_window_s(hot_keys)
    hk = hot_keys[
        (hot_keys["window"] > start - ws)
        & (hot_keys["window"] <= end)
        & ~hot_keys["layer"].isin(SHARED_LAYERS)
    ]
    keys = ["window", "layer", "key_hash"]
    d = hk.drop_duplicates(keys + ["tenant"])
    sh = d[d.duplicated(keys, keep=False)]
    if sh.empty:
        return None
    first_w = float(sh["window"].min())
    layers = sorted(set(sh["layer"]))
    # A leak that began in an earlier window and carried on is dated from that window (the
    # frames may hold windows before the range: a leak is as old as its first shared window).
    every = hot_keys[~hot_keys["layer"].isin(SHARED_LAYERS) & (hot_keys["window"] <= end)]
    e = every.drop_duplicates(keys + ["tenant"])
    shared_w = set(e[e.duplicated(keys, keep=False)]["window"].astype(float))
    w0 = first_w
    while w0 - ws in shared_w:
        w0 -= ws
    if lookups is not None and len(lookups):
        lookups = lookups[lookups["ts"] <= end]  # nothing after the evaluation instant
    onset = leak_onset(lookups, layers, w0, ws, newest or end, lead=LEAK_LEAD * ws)
    if onset > end:  # shows only after end (a later window starts after the onset)
        return None
    return {
        # distinct keys (a key shared in three hourly windows is one key), and the windows
        "shared_keys": int(len(sh.drop_duplicates(["layer", "key_hash"]))),
        "shared_windows": int(sh["window"].nunique()),
        "layers": layers,
        "tenants": sorted(set(sh["tenant"])),
        "first": onset,
        "last": float(sh["window"].max()),
        "window": w0,
    }


def _hhmm(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%H:%M")


def bypass_spikes(lookups: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The bypass-spike rule over the range: per layer and minute, the share of
    the last 5 minutes' lookups that bypassed the cache; it fires where the
    share is above ``BYPASS_SHARE`` and was not an hour before, held for
    ``BYPASS_FOR_S``. Columns: layer, since, until, share (the peak)."""
    cols = ["layer", "since", "until", "share"]
    if lookups is None or lookups.empty:
        return pd.DataFrame(columns=cols)
    lk = lookups[(lookups["ts"] > start - 3900) & (lookups["ts"] <= end)]
    if lk.empty:
        return pd.DataFrame(columns=cols)
    minute = (lk["ts"].to_numpy(float) // 60).astype("int64")
    d = pd.DataFrame(
        {
            "layer": lk["layer"].to_numpy(),
            "m": minute,
            "all": lk["count"].to_numpy(float),
            "bypass": lk["count"].to_numpy(float) * (lk["result"].to_numpy() == "bypass"),
        }
    )
    out = []
    for layer, g in d.groupby("layer"):
        per = g.groupby("m")[["all", "bypass"]].sum()
        idx = range(int(per.index.min()), int(per.index.max()) + 1)
        per = per.reindex(idx, fill_value=0.0)
        w = per.rolling(5, min_periods=1).sum()
        share = (w["bypass"] / w["all"].where(w["all"] > 0)).fillna(0.0)
        before = share.shift(60)
        cond = (share > BYPASS_SHARE) & ~(before > BYPASS_SHARE)
        run_id = (cond != cond.shift()).cumsum()
        own = (per["bypass"] / per["all"].where(per["all"] > 0)).fillna(0.0)
        for _, seg in share[cond].groupby(run_id[cond]):
            t0, t1 = seg.index.min() * 60.0, seg.index.max() * 60.0 + 60.0
            # The 5-minute share crosses the line a minute or two after the flushes that show the
            # bypass: date it from the first of them (their own share over the line).
            m = int(seg.index.min())
            while m - 1 in own.index and own[m - 1] > BYPASS_SHARE:
                m -= 1
            if t1 - t0 >= BYPASS_FOR_S and t1 > start:
                out.append((layer, max(m * 60.0, start), t1, float(seg.max())))
    return pd.DataFrame(out, columns=cols)


def trap_verdicts(
    frames: Mapping[str, pd.DataFrame], anomaly: tuple[float, float], baseline: tuple[float, float]
) -> list[TrapVerdict]:
    """The cold-start trap verdicts for a window as the alert rules read them (the Root cause
    page shows these, so a trap it reports is one the alerts can fire): every detector of
    ``traps.detect_all``, with warm-up timing judged on warm-ups timed against traffic
    (scheduled, before a forecast peak) only. A restart's warm-up is timed by the restart: its
    unread keys are ``WarmSetPrecisionLow``'s, per strategy, not a timing fault."""
    out = []
    runs = frames.get("warmup_runs", pd.DataFrame())
    for v in detect_all(frames, anomaly, baseline):
        if v.trap == "warmup_timing":
            timed = runs[~runs["trigger"].isin(RESTART_TRIGGERS)] if len(runs) else runs
            v = timing({**frames, "warmup_runs": timed}, anomaly, baseline)
            if not v.detected and len(runs) and len(timed) < len(runs):
                said = v.evidence if len(timed) else "no warm-up timed against traffic"
                v = dataclasses.replace(
                    v,
                    evidence=f"{said}; warm-ups after a replica (re)start are left out: they are "
                    "timed by the restart (their unread keys: WarmSetPrecisionLow)",
                )
        out.append(v)
    return out


def evaluate(
    frames: Mapping[str, pd.DataFrame], start: float, end: float, newest: float | None = None
) -> pd.DataFrame:
    """The alerts that hold over (start, end] (columns severity, alert, summary, since).
    ``newest``: the newest data there is (default ``end``; see the module's note)."""
    rows: list[tuple[str, str, str, float]] = []
    r: Any  # a row of itertuples / iterrows: pandas types its fields as any scalar
    lk = frames.get("lookups", pd.DataFrame())
    third = (end - start) / 3
    if len(lk) and third > 0:
        ch = hit_rate_change(lk, ["layer"], (end - third, end), (end - 2 * third, end - third))
        for r in ch.itertuples():
            fall = 1 - r.rate / r.baseline_rate if r.baseline_rate > 0 else 0.0
            if fall >= HIT_RATE_DROP and r.p_value < HIT_RATE_P:
                rows.append(
                    (
                        "critical" if fall >= HIT_RATE_CRITICAL_DROP else "warning",
                        "HitRateRegression",
                        f"layer {r.layer}: hit rate {r.rate:.1%} in the last {third / 60:.0f} min "
                        f"vs {r.baseline_rate:.1%} in the {third / 60:.0f} min before "
                        f"({-fall:+.0%}, p {p_eq(r.p_value)})",
                        end - third,
                    )
                )
        # Cross-tenant reads and bypass spikes are checked over the whole range below (as the rules
        # do).
        for v in trap_verdicts(frames, (end - third, end), (end - 2 * third, end - third)):
            if not v.detected or v.trap in ("tenant_isolation", "bypass"):
                continue
            name, sev = TRAP_ALERTS[v.trap]
            rows.append((sev, name, v.evidence, end - third))
        for r in bypass_spikes(lk, start, end).itertuples():
            name, sev = TRAP_ALERTS["bypass"]
            rows.append(
                (
                    sev,
                    name,
                    f"layer {r.layer}: {r.share:.0%} of lookups bypassed the cache from "
                    f"{_hhmm(r.since)} to {_hhmm(r.until)} (at most {BYPASS_SHARE:.0%} an hour "
                    "before) — a path started skipping the cache",
                    r.since,
                )
            )
    leak = cross_tenant_reads(
        frames.get("hot_keys", pd.DataFrame()), start, end, frames.get("lookups_before", lk), newest
    )
    if leak is not None:
        name, sev = TRAP_ALERTS["tenant_isolation"]
        t = ", ".join(leak["tenants"][:5]) + (" …" if len(leak["tenants"]) > 5 else "")
        rows.append(
            (
                sev,
                name,
                f"SECURITY: {leak['shared_keys']} {'/'.join(leak['layers'])} keys were read by two "
                f"or more tenants ({t}) — cache keys lack a tenant scope (data leak)",
                leak["first"],
            )
        )
    runs = frames.get("warmup_runs", pd.DataFrame())
    if len(runs) and len(frames.get("warmed_keys", pd.DataFrame())):
        cov = warm_set_coverage(
            runs, frames["warmed_keys"], frames.get("early_keys", pd.DataFrame())
        )
        # One alert per strategy × layer (the rule's labels), over every run in the range: a
        # strategy that wastes its warm sets, not each of its runs.
        g = cov.groupby(["strategy", "layer"]).agg(
            warmed=("keys_warmed", "sum"),
            read=("keys_read", "sum"),
            runs=("run_id", "size"),
            wasted=("wasted_gpu_s", "sum"),
            since=("started", "min"),
        )
        g = g[g.warmed >= WARM_MIN_KEYS]
        for key, r in g[g.read / g.warmed < WARM_PRECISION_MIN].iterrows():
            strategy, layer = cast(tuple[str, str], key)
            rows.append(
                (
                    "warning",
                    "WarmSetPrecisionLow",
                    f"strategy {strategy} on {layer}: {r.read / r.warmed:.0%} of {int(r.warmed):,} "
                    f"warmed keys were read ({int(r.runs)} runs, {r.wasted:.1f} GPU-s wasted)",
                    float(r.since),
                )
            )
    out = pd.DataFrame(rows, columns=["severity", "alert", "summary", "since"])
    return out.sort_values("severity", key=lambda s: s.map(_ORDER), kind="stable").reset_index(
        drop=True
    )
