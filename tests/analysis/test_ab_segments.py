"""A/B per segment: batch means per time bucket checked against scipy's Welch test, statsmodels' Holm and BH,
and hand-computed arm means; bad dimensions are refused."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from warmscope.analysis.ab_segments import segment_table

LK = ["ts", "tenant", "layer", "family", "result", "experiment", "variant", "model", "replica", "length_bucket",
      "count"]
RQ = ["ts", "tenant", "experiment", "variant", "model", "replica", "sla_met", "requests", "gpu_s", "conversions",
      "value"]


def _world(seed=1):
    """Two tenants, six 10-minute buckets per arm. acme: B hits 80% vs A 60%; globex: both about 70%."""
    rng = np.random.default_rng(seed)
    rows, req, truth = [], [], {}
    for tenant, pa, pb in (("acme", 0.6, 0.8), ("globex", 0.7, 0.7)):
        for variant, p in (("A", pa), ("B", pb)):
            vals = []
            for k in range(6):
                ts = 600.0 * k + 300.0  # one flush inside bucket k: (600k, 600k + 600]
                n = 1000
                hits = int(rng.binomial(n, p))
                vals.append(hits / n)
                for res, c in (("hit", hits), ("miss", n - hits)):
                    rows.append((ts, tenant, "response", "resp:*", res, "exp", variant, "m", "r0", "short", c))
                rows.append((ts, tenant, "weights", "w:*", "hit", "exp", variant, "m", "r0", "short", 50))  # left out
                req.append((ts, tenant, "exp", variant, "m", "r0", "true", 10, 10 * (0.2 if variant == "A" else 0.1)
                            + rng.normal(0, 0.05), 0, 0.0))
            truth[(tenant, variant)] = vals
    other = (30.0, "acme", "response", "resp:*", "hit", "other-exp", "A", "m", "r0", "short", 999)  # another experiment
    return pd.DataFrame(rows + [other], columns=LK), pd.DataFrame(req, columns=RQ), truth


def test_hit_rate_per_tenant_equals_welch_on_the_bucket_values():
    lk, rq, truth = _world()
    t = segment_table(lk, rq, pd.DataFrame(), "exp", "A", "B", by=["tenant"], freq=600.0)
    hr = t[t.metric == "hit rate"].set_index("tenant")
    for tenant in ("acme", "globex"):
        a, b = truth[(tenant, "A")], truth[(tenant, "B")]
        r = hr.loc[tenant]
        assert r.control == pytest.approx(np.mean(a)) and r.treatment == pytest.approx(np.mean(b))
        assert r.difference == pytest.approx(np.mean(b) - np.mean(a))
        ref = stats.ttest_ind(b, a, equal_var=False)
        assert r.p == pytest.approx(ref.pvalue, rel=1e-6)
        ci = ref.confidence_interval(0.95)
        assert (r.ci_low, r.ci_high) == (pytest.approx(ci.low, rel=1e-6), pytest.approx(ci.high, rel=1e-6))
        assert r.buckets_control == 6 and r.buckets_treatment == 6
    assert hr.loc["acme", "outcome"] == "win"  # +20 points over six buckets of 1,000 lookups
    assert hr.loc["globex", "outcome"] == "neutral"  # the same 70% in both arms
    # Holm and BH across every row of the table (hit rate and GPU-s per request, two tenants each)
    holm = multipletests(t.p.to_numpy(), method="holm")[1]
    bh = multipletests(t.p.to_numpy(), method="fdr_bh")[1]
    assert t.p_holm.to_numpy() == pytest.approx(holm) and t.p_bh.to_numpy() == pytest.approx(bh)
    gpu = t[t.metric == "GPU-s per request"].set_index("tenant")
    # 10 requests a bucket costing 10 × 0.2 (A) or 10 × 0.1 (B) GPU-s, ± N(0, 0.05): per request 0.1 − 0.2 = −0.1
    assert gpu.loc["acme", "difference"] == pytest.approx(-0.1, abs=0.01)
    assert gpu.loc["acme", "outcome"] == "win"  # lower is better


def test_layer_segments_have_hit_rate_only_and_leave_weights_out():
    lk, rq, _ = _world()
    t = segment_table(lk, rq, pd.DataFrame(), "exp", "A", "B", by=["layer"])
    assert set(t.metric) == {"hit rate"} and set(t.layer) == {"response"}  # requests carry no layer
    t2 = segment_table(lk, rq, pd.DataFrame(), "exp", "A", "B", by=["tenant", "layer"])
    assert list(zip(t2.tenant, t2.layer, strict=True)) == [("acme", "response"), ("globex", "response")]


def test_too_few_buckets_are_not_tested_and_bad_dimensions_are_refused():
    lk, rq, _ = _world()
    t = segment_table(lk[lk.ts < 1200], rq.iloc[0:0], pd.DataFrame(), "exp", "A", "B", by=["tenant"])
    assert (t.outcome == "not tested").all() and t.p.isna().all()  # 2 buckets per arm, 3 needed
    with pytest.raises(ValueError, match="segments are cut by"):
        segment_table(lk, rq, pd.DataFrame(), "exp", "A", "B", by=["family"])
    assert segment_table(lk, rq, pd.DataFrame(), "nope", "A", "B", by=["tenant"]).empty
