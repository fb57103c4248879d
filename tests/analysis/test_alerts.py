"""The alert evaluator: cross-tenant reads are a critical alert anywhere in the range."""

import pandas as pd
from warmscope.analysis.alerts import cross_tenant_reads, evaluate, hot_keys_since

COLS = ["window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"]


def _hot(rows):
    return pd.DataFrame(rows, columns=COLS)


def test_a_leak_early_in_the_range_is_a_critical_alert():
    day = 86400.0
    hk = _hot([
        (3600.0, "acme", "response", "k1", "resp:*", 5, 0, 0),    # 01:00: k1 read by acme and globex
        (3600.0, "globex", "response", "k1", "resp:*", 2, 0, 0),
        (3600.0, "acme", "weights", "w", "weights:*", 9, 0, 0),   # weights are shared by design
        (3600.0, "globex", "weights", "w", "weights:*", 9, 0, 0),
        (80000.0, "acme", "response", "k2", "resp:*", 1, 0, 0),   # late, one tenant only
    ])
    a = evaluate({"hot_keys": hk}, 0.0, day)
    leak = a[a.alert == "CrossTenantCacheRead"]
    assert len(leak) == 1 and leak.severity.iloc[0] == "critical"
    assert "1 response keys" in leak.summary.iloc[0] and "acme, globex" in leak.summary.iloc[0]
    # no lookups to date it by: the end of the hourly window that shows it (3600 + 3600), not its start
    assert leak.since.iloc[0] == 7200.0
    assert a.severity.iloc[0] == "critical"  # critical first
    assert hot_keys_since(0.0, day) <= 0.0  # pages load every window the check reads


def test_no_shared_key_no_alert_and_windows_outside_the_range_do_not_count():
    hk = _hot([(100.0, "acme", "response", "k1", "resp:*", 1, 0, 0),
               (100.0, "globex", "response", "k9", "resp:*", 1, 0, 0),
               (5000.0, "acme", "embedding", "e", "emb:*", 1, 0, 0),
               (5000.0, "globex", "embedding", "e", "emb:*", 1, 0, 0)])  # shared, but after the range
    assert cross_tenant_reads(hk, 0.0, 4000.0) is None
    assert evaluate({"hot_keys": hk}, 0.0, 4000.0).empty
    assert cross_tenant_reads(hk, 0.0, 6000.0)["layers"] == ["embedding"]


def test_a_key_shared_in_several_windows_is_one_key_on_every_page():
    """The alert, the root-cause verdict and the overview count distinct keys: k1 shared in three hourly
    windows and k2 in one are 2 keys in 3 windows (the root-cause page said 4 "keys": key × window pairs)."""
    import numpy as np
    from warmscope.analysis.traps import detect_all

    rows = []
    for w in (0.0, 3600.0, 7200.0):
        rows += [(w, "acme", "response", "k1", "resp:*", 1, 0, 0), (w, "globex", "response", "k1", "resp:*", 1, 0, 0)]
    rows += [(7200.0, "acme", "response", "k2", "resp:*", 1, 0, 0),
             (7200.0, "initech", "response", "k2", "resp:*", 1, 0, 0)]
    hk = _hot(rows)
    leak = cross_tenant_reads(hk, 0.0, 10800.0)
    assert (leak["shared_keys"], leak["shared_windows"]) == (2, 3)
    assert "SECURITY: 2 response keys were read by two" in evaluate({"hot_keys": hk}, 0.0, 10800.0).summary.iloc[0]
    lk = pd.DataFrame({"ts": np.arange(60.0, 10800.0, 60.0), "layer": "response", "result": "hit", "count": 1,
                       "tenant": "acme"})
    v = {x.trap: x for x in detect_all({"hot_keys": hk, "lookups": lk}, (3600.0, 10800.0), (0.0, 3600.0))}
    assert v["tenant_isolation"].numbers["shared_keys"] == 2
    assert v["tenant_isolation"].evidence.startswith("SECURITY: 2 response keys were read by two or more tenants")


def test_a_restarts_warm_up_is_not_a_timing_alert_and_precision_is_judged_per_strategy():
    # Two restart warm-ups of one strategy and layer: 5 % and 45 % of 20 keys read → 25 % over both runs: one
    # WarmSetPrecisionLow for the strategy × layer, no per-run alert, no "out of step with traffic".
    runs = pd.DataFrame([("r1", "static_topk", "embedding", "", "b-0", "replica_restart", 100.0, 110.0, 1.0),
                         ("r2", "static_topk", "embedding", "", "b-1", "replica_restart", 200.0, 210.0, 1.0)],
                        columns=["run_id", "strategy", "layer", "tenant", "replica", "trigger", "started", "ended",
                                 "gpu_s"])
    wk = []
    for run, read in (("r1", 1), ("r2", 9)):
        for i in range(20):
            wk.append((run, f"{run}k{i}", 0.05, 110.0, 150.0 if i < read else float("nan"), float("nan"),
                       float("nan")))
    warmed = pd.DataFrame(wk, columns=["run_id", "key_hash", "gpu_s", "warmed_at", "first_hit_at", "first_miss_at",
                                       "ttl_s"])
    a = evaluate({"warmup_runs": runs, "warmed_keys": warmed,
                  "lookups": pd.DataFrame(columns=["ts", "layer", "result", "count"])}, 0.0, 3600.0)
    prec = a[a.alert == "WarmSetPrecisionLow"]
    assert len(prec) == 1 and "static_topk on embedding: 25% of 40" in prec.summary.iloc[0]  # (1 + 9) / 40
    assert "WarmupOutOfStepWithTraffic" not in set(a.alert)
