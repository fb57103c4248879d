"""Alert conditions evaluated over canonical frames — the embedded-mode
counterpart of the Prometheus alerting rules.

* ``HitRateRegression`` — a layer's hit rate in the latest third of the range
  is more than 10 points below the third before it (p < 0.01); critical past
  25 points;
* ``WarmSetPrecisionLow`` — a warm-up run whose warmed entries were read less
  than 30% of the time;
* one alert per detected cold-start trap (``CrossTenantCacheRead`` is critical:
  a data leak).

Example::

    alerts = evaluate(frames, start, end)    # columns: severity, alert, summary, since
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from .coverage import warm_set_coverage
from .hitrate import hit_rate_change
from .traps import detect_all

__all__ = ["evaluate", "TRAP_ALERTS"]

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


def hot_keys_since(start: float, end: float) -> float:
    """The earliest hot-key window :func:`evaluate` reads (load no more)."""
    from .traps import HOT_KEY_LOOKBACK_S

    return end - (end - start) / 3 - HOT_KEY_LOOKBACK_S


def evaluate(frames: Mapping[str, pd.DataFrame], start: float, end: float) -> pd.DataFrame:
    rows = []
    lk = frames.get("lookups", pd.DataFrame())
    third = (end - start) / 3
    if len(lk) and third > 0:
        ch = hit_rate_change(lk, ["layer"], (end - third, end), (end - 2 * third, end - third))
        for r in ch.itertuples():
            if r.delta < -0.10 and r.p_value < 0.01:
                rows.append(("critical" if r.delta < -0.25 else "warning", "HitRateRegression",
                             f"layer {r.layer}: hit rate {r.rate:.1%} vs {r.baseline_rate:.1%} before "
                             f"({r.delta:+.1%}, p = {r.p_value:.1g})", end - third))
        for v in detect_all(frames, (end - third, end), (end - 2 * third, end - third)):
            if v.detected:
                name, sev = TRAP_ALERTS[v.trap]
                rows.append((sev, name, v.evidence, end - third))
    runs = frames.get("warmup_runs", pd.DataFrame())
    if len(runs) and len(frames.get("warmed_keys", pd.DataFrame())):
        cov = warm_set_coverage(runs, frames["warmed_keys"], frames.get("early_keys", pd.DataFrame()))
        for r in cov[(cov.precision < 0.3) & (cov.keys_warmed >= 10)].itertuples():
            rows.append(("warning", "WarmSetPrecisionLow",
                         f"run {r.run_id} ({r.strategy}, {r.layer}, {r.replica}): precision {r.precision:.0%}, "
                         f"{r.wasted_gpu_s:.1f} GPU-s wasted", r.started))
    out = pd.DataFrame(rows, columns=["severity", "alert", "summary", "since"])
    return out.sort_values("severity", key=lambda s: s.map(_ORDER), kind="stable").reset_index(drop=True)
