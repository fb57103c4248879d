"""Alert history: episodes fire at the first evaluation where a condition holds and resolve at the first
where it no longer does; times checked by hand."""

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.alert_history import alert_history, evaluation_times, subject_of

HK = ["window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"]
LK = ["ts", "tenant", "layer", "family", "result", "experiment", "variant", "model", "replica", "length_bucket",
      "count"]


def test_evaluation_times_and_subjects():
    assert evaluation_times(0.0, 3000.0, 600.0).tolist() == [600.0, 1200.0, 1800.0, 2400.0, 3000.0]
    # anchored at the end: the last evaluation is what holds now
    assert evaluation_times(0.0, 2999.0, 600.0).tolist() == [599.0, 1199.0, 1799.0, 2399.0, 2999.0]
    with pytest.raises(ValueError, match="every must be positive"):
        evaluation_times(0.0, 10.0, 0.0)
    assert subject_of("layer prefix_kv: hit rate 40.0% vs 70.0% before") == "layer prefix_kv"
    assert subject_of("run run-1-00009 (static_topk, response, b-0): precision 12%") == "run run-1-00009"
    assert subject_of("SECURITY: 3 response keys were read by two tenants") == ""
    assert subject_of("strategy predictive on embedding: 25% of 800 warmed keys") == "strategy predictive on embedding"


def test_a_cross_tenant_read_fires_then_resolves_when_it_leaves_the_lookback():
    # One shared response key in the hourly hot-key window stamped 5000 s, no lookups to date it by: it shows at
    # the window's end, 8600 s. With a 3600 s lookback, the evaluator reads hot-key windows w with
    # lo − 3600 < w ≤ t (lo = t − 3600): the read is seen for 8600 ≤ t < 5000 + 7200 = 12200.
    hk = pd.DataFrame([(5000.0, "acme", "response", "k1", "resp:*", 3, 0, 0),
                       (5000.0, "globex", "response", "k1", "resp:*", 1, 0, 0)], columns=HK)
    h = alert_history({"hot_keys": hk}, 0.0, 14400.0, every=600.0, lookback=3600.0)
    assert len(h) == 1
    r = h.iloc[0]
    assert r.alert == "CrossTenantCacheRead" and r.severity == "critical" and r.subject == ""
    assert r.fired == 9000.0      # first evaluation (multiples of 600) at or after 8600
    assert r.resolved == 12600.0  # first evaluation at or after 12200
    assert r.since == 8600.0 and r.evaluations == 6  # 9000, 9600, …, 12000


def _lookups(rates):
    """One response-layer flush a minute; ``rates``: (from_ts, to_ts, hit share) spans, 1000 lookups a flush."""
    rows = []
    for a, b, p in rates:
        for ts in np.arange(a + 60, b + 1, 60.0):
            hits = int(round(1000 * p))
            rows.append((ts, "acme", "response", "resp:*", "hit", "", "", "m", "r0", "short", hits))
            rows.append((ts, "acme", "response", "resp:*", "miss", "", "", "m", "r0", "short", 1000 - hits))
    return pd.DataFrame(rows, columns=LK)


def test_a_hit_rate_drop_fires_for_its_layer_and_resolves_once_both_thirds_are_low():
    # 90% hits until 7200 s, 50% after. At an evaluation t (lookback 3600 s, thirds of 1200 s) the regression
    # holds while the latest third (t − 1200, t] is low and the one before (t − 2400, t − 1200] still mostly high:
    # t = 7800 (third before all 90%, latest half 50%) … until t = 9600, when both thirds are all 50%.
    lk = _lookups([(0.0, 7200.0, 0.9), (7200.0, 12000.0, 0.5)])
    h = alert_history({"lookups": lk}, 3600.0, 12000.0, every=600.0, lookback=3600.0)
    reg = h[h.alert == "HitRateRegression"]
    assert len(reg) == 1
    r = reg.iloc[0]
    # 0.9 -> 0.5 at most: a 44 % relative fall, past the 20 % that fires, short of the 50 % that makes it critical
    assert r.subject == "layer response" and r.severity == "warning"
    # the summary names its windows: the evaluation's last third against the third before (1200 s each)
    assert " in the last 20 min vs " in r.summary and "% in the 20 min before (" in r.summary
    assert r.fired == 7800.0
    assert r.resolved == 9600.0
    assert h.columns.tolist() == ["alert", "subject", "severity", "fired", "resolved", "since", "summary",
                                  "evaluations"]


def test_nothing_fires_on_steady_traffic():
    lk = _lookups([(0.0, 10800.0, 0.8)])
    assert alert_history({"lookups": lk}, 3600.0, 10800.0).empty


def test_a_fall_past_half_the_baseline_is_critical():
    # 0.9 -> 0.3: a 67 % relative fall once the latest third is all low, past the 50 % that makes it critical
    lk = _lookups([(0.0, 7200.0, 0.9), (7200.0, 12000.0, 0.3)])
    reg = alert_history({"lookups": lk}, 3600.0, 12000.0, every=600.0, lookback=3600.0)
    reg = reg[reg.alert == "HitRateRegression"]
    assert len(reg) == 1 and reg.iloc[0].severity == "critical"
