import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint
from warmscope.analysis.hitrate import (
    hit_rate_change,
    hit_table,
    newcombe_diff,
    result_shares,
    wilson,
)


def lk(rows):
    return pd.DataFrame(rows, columns=["ts", "tenant", "layer", "result", "count"])


def test_wilson_matches_hand_computation_and_statsmodels():
    lo, hi = wilson(8, 10, z=1.96)  # hand-computed with z = 1.96
    assert (round(float(lo), 4), round(float(hi), 4)) == (0.4902, 0.9433)
    for h, n in [(0, 5), (5, 5), (37, 120), (1, 1000)]:
        ref = proportion_confint(h, n, method="wilson")
        got = wilson(h, n)
        assert np.allclose([float(got[0]), float(got[1])], ref, atol=1e-10)


def test_wilson_is_nan_for_no_lookups():
    lo, hi = wilson(0, 0)
    assert np.isnan(lo) and np.isnan(hi)


def test_hit_table_groups_and_buckets():
    df = lk([
        (60, "a", "kv", "hit", 3), (60, "a", "kv", "miss", 1), (60, "a", "kv", "bypass", 5),
        (120, "a", "kv", "hit", 1), (120, "b", "kv", "miss", 4), (180, "a", "resp", "hit", 2),
    ])
    t = hit_table(df, by=["tenant"])
    a = t[t.tenant == "a"].iloc[0]
    assert (a.hits, a.lookups, a.hit_rate) == (6, 7, 6 / 7)  # bypass is not a lookup of the cache
    b = t[t.tenant == "b"].iloc[0]
    assert b.hit_rate == 0 and b.ci_low == 0
    tb = hit_table(df, by=["layer"], freq=120)
    kv = tb[tb.layer == "kv"].set_index("bucket")
    # ts 60 and 120 are stamped at the end of intervals inside [0, 120): a's 3+1, a's 1 hit, b's 4 misses
    assert kv.loc[0.0, "lookups"] == 9 and kv.loc[0.0, "hits"] == 4
    assert 120.0 not in kv.index
    overall = hit_table(df)
    assert overall.hits.item() == 6 and overall.lookups.item() == 11


def test_missing_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['replica'\]"):
        hit_table(lk([(1, "a", "kv", "hit", 1)]), by=["replica"])


def test_change_against_previous_window_with_newcombe_ci():
    df = lk([(50, "a", "kv", "hit", 80), (50, "a", "kv", "miss", 20),
             (150, "a", "kv", "hit", 60), (150, "a", "kv", "miss", 40)])
    c = hit_rate_change(df, by=["layer"], window=(100, 200), baseline="previous").iloc[0]
    assert (c.rate, c.baseline_rate) == (0.6, 0.8)
    assert c.delta == pytest.approx(-0.2)
    ref = confint_proportions_2indep(60, 100, 80, 100, method="newcomb", compare="diff")
    assert (c.delta_low, c.delta_high) == pytest.approx(ref, abs=1e-9)
    # two-proportion z test, pooled: p=0.7, se=sqrt(.7*.3*(2/100))
    z = -0.2 / np.sqrt(0.7 * 0.3 * 0.02)
    from scipy.stats import norm
    assert c.p_value == pytest.approx(2 * norm.sf(abs(z)))
    assert (c.baseline_start, c.baseline_end) == (0, 100)


def test_change_yesterday_and_bad_baseline():
    df = lk([(86400 + 10, "a", "kv", "hit", 1), (10, "a", "kv", "miss", 1)])
    c = hit_rate_change(df, by=[], window=(86400, 86400 + 60), baseline="yesterday").iloc[0]
    assert c.rate == 1 and c.baseline_rate == 0
    with pytest.raises(ValueError, match="baseline must be"):
        hit_rate_change(df, [], (0, 1), baseline="last week")
    with pytest.raises(ValueError, match="is not after its start"):
        hit_rate_change(df, [], (5, 5))


def test_newcombe_matches_statsmodels_on_several_cases():
    for h1, n1, h0, n0 in [(5, 50, 12, 60), (0, 10, 3, 10), (99, 100, 50, 100)]:
        d, lo, hi = newcombe_diff(np.array([h1]), np.array([n1]), np.array([h0]), np.array([n0]))
        ref = confint_proportions_2indep(h1, n1, h0, n0, method="newcomb", compare="diff")
        assert (lo[0], hi[0]) == pytest.approx(ref, abs=1e-9)


def test_result_shares():
    df = lk([(1, "a", "kv", "hit", 6), (1, "a", "kv", "bypass", 2), (1, "a", "kv", "error", 2)])
    r = result_shares(df, by=["tenant"]).iloc[0]
    assert (r.hit, r.miss, r.bypass, r.error, r.total) == (0.6, 0, 0.2, 0.2, 10)


rows = st.lists(st.tuples(st.integers(0, 600), st.sampled_from(["a", "b"]), st.sampled_from(["kv", "emb"]),
                          st.sampled_from(["hit", "miss", "bypass", "error"]), st.integers(0, 50)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(rows, st.sampled_from([None, 60, 300]))
def test_hit_table_properties(rs, freq):
    t = hit_table(lk(rs), by=["tenant", "layer"], freq=freq)
    if not rs:
        assert t.empty
        return
    ok = t[t.lookups > 0]
    assert ((ok.hit_rate >= 0) & (ok.hit_rate <= 1)).all()
    assert ((ok.ci_low <= ok.hit_rate + 1e-12) & (ok.hit_rate <= ok.ci_high + 1e-12)).all()
    assert t[t.lookups == 0].hit_rate.isna().all()
    assert t.hits.sum() == sum(r[4] for r in rs if r[3] == "hit")


def test_change_with_an_empty_baseline_window_is_nan_not_a_crash():
    df = lk([(150, "a", "kv", "hit", 5)])
    c = hit_rate_change(df, by=["layer"], window=(100, 200)).iloc[0]
    assert c.rate == 1 and np.isnan(c.baseline_rate) and np.isnan(c.p_value)
