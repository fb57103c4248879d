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
    assert leak.since.iloc[0] == 3600.0
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
