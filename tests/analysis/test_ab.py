"""A/B engine: reference values, A/A and coverage simulations, degenerate data."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportions_ztest
from warmscope.analysis.ab import (
    Mean,
    Proportion,
    Quantile,
    Ratio,
    adjust,
    batch_means,
    compare,
    compare_arms,
    cuped,
    group_sequential_bounds,
    mde_sentence,
    msprt,
    power,
    srm,
)

RNG = np.random.default_rng(20261129)


def test_welch_matches_scipy():
    a, b = RNG.normal(10, 2, 300), RNG.normal(10.4, 3, 250)
    r = compare("m", Mean.from_units(a), Mean.from_units(b))
    ref = stats.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert round(r.p_value, 10) == round(ref.pvalue, 10)
    assert (round(r.abs_low, 10), round(r.abs_high, 10)) == (round(ci.low, 10), round(ci.high, 10))
    assert r.test == "Welch t"


def test_two_proportions_match_statsmodels():
    r = compare("c", Proportion(1000, 120), Proportion(1100, 160))
    z, p = proportions_ztest([160, 120], [1100, 1000])
    assert round(r.p_value, 10) == round(p, 10)
    d = 160 / 1100 - 0.12
    se = math.sqrt(0.12 * 0.88 / 1000 + (160 / 1100) * (1 - 160 / 1100) / 1100)
    assert (r.abs_low, r.abs_high) == pytest.approx((d - 1.959963984540054 * se, d + 1.959963984540054 * se))


def test_delta_method_ratio_matches_linearisation():
    x = RNG.poisson(5, 400).astype(float)
    y = x + RNG.poisson(3, 400) + 1
    r = Ratio.from_units(x, y)
    R = x.sum() / y.sum()
    lin = (x - R * y) / y.mean()
    assert r.estimate == pytest.approx(R)
    assert r.var_of_estimate() == pytest.approx(lin.var(ddof=1) / len(x), rel=1e-9)


def test_stats_add_like_concatenation():
    x, y = RNG.random(50), RNG.random(50) + 1
    assert (Ratio.from_units(x[:20], y[:20]) + Ratio.from_units(x[20:], y[20:])).var_of_estimate() == \
        pytest.approx(Ratio.from_units(x, y).var_of_estimate())
    assert (Mean.from_units(x[:10]) + Mean.from_units(x[10:])).unit_var == pytest.approx(x.var(ddof=1))


def test_srm_matches_scipy_and_flags_1000_vs_1200():
    s = srm([1000, 1200])
    ref = stats.chisquare([1000, 1200])
    assert s.chi2 == pytest.approx(ref.statistic) and s.p_value == pytest.approx(ref.pvalue)
    assert s.flagged and s.p_value < 0.001
    assert not srm([1000, 1010]).flagged
    uneven = srm([900, 100], planned=[0.9, 0.1])
    assert uneven.chi2 == pytest.approx(0.0) and not uneven.flagged


def test_holm_and_bh_match_statsmodels():
    p = [0.01, 0.04, 0.03, 0.2, float("nan"), 0.001]
    holm, bh = adjust(p)
    ok = [0, 1, 2, 3, 5]
    q = [p[i] for i in ok]
    assert np.allclose(holm[ok], multipletests(q, method="holm")[1])
    assert np.allclose(bh[ok], multipletests(q, method="fdr_bh")[1])
    assert np.isnan(holm[4]) and np.isnan(bh[4])


def test_msprt_by_hand_and_interval_inverts_the_test():
    d, v, tau = 0.3, 0.01, 0.2
    lam = math.sqrt(v / (v + tau * tau)) * math.exp(tau * tau * d * d / (2 * v * (v + tau * tau)))
    p, lo, hi = msprt(d, v, tau)
    assert p == pytest.approx(min(1, 1 / lam))
    for edge in (lo, hi):  # at the interval's edges Λ(d - edge) = 1/α exactly
        p_edge, _, _ = msprt(d - edge, v, tau)
        assert p_edge == pytest.approx(0.05)
    assert math.isnan(msprt(0.1, 0.0, 1.0)[0])


def test_cuped_theta_and_variance_reduction():
    # its own generator: the module's RNG state depends on which tests ran before on a worker
    rng = np.random.default_rng(20261203)
    n = 4000
    x = rng.normal(0, 1, n)
    arm = np.repeat(["A", "B"], n // 2)
    y = 2.0 * x + rng.normal(0, 1, n) + (arm == "B") * 0.1
    adj, theta, vr = cuped(y, x, arm)
    assert theta == pytest.approx(2.0, abs=0.05)
    assert vr == pytest.approx(0.8, abs=0.03)  # corr^2 = 4/5
    assert adj[arm == "B"].mean() - adj[arm == "A"].mean() == pytest.approx(0.1, abs=0.06)
    assert np.var(adj) < 0.3 * np.var(y)


def test_power_mde_and_time_to_target():
    a = Mean.from_units(RNG.normal(100, 10, 1000))
    b = Mean.from_units(RNG.normal(100, 10, 1000))
    pw = power(a, b, days_observed=2.0, target_rel=0.005)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert pw.mde_abs == pytest.approx(z * math.sqrt(a.var_of_estimate() + b.var_of_estimate()))
    assert pw.units_needed == pytest.approx(2000 * (pw.mde_rel / 0.005) ** 2)
    assert pw.days_to_target == pytest.approx((pw.units_needed - 2000) / 1000)


@pytest.mark.parametrize("a, b, needle", [
    (Mean.from_units([1.0]), Mean.from_units([1.0, 2.0]), "not enough units"),
    (Ratio.from_units([0, 0, 0], [0, 0, 0]), Ratio.from_units([1, 2, 3], [3, 3, 3]), "zero lookups"),
    (Mean.from_units([2.0] * 5), Mean.from_units([2.0] * 5), "zero variance"),
    (Mean.from_units([1.0]), Proportion(5, 1), "different metric types"),
])
def test_degenerate_inputs_give_a_clear_message(a, b, needle):
    r = compare("m", a, b)
    assert r.error is not None and needle in r.error and not r.significant


def test_zero_variance_with_a_difference_warns():
    r = compare("m", Mean.from_units([2.0] * 5), Mean.from_units([3.0] * 5))
    assert r.error is None and "zero variance" in r.warning and r.abs_effect == 1.0
    # a mean is named by its own test even when both arms are constant (no quantile's outer CI)
    assert r.test == "Welch t" and r.p_value == 0.0 and (r.abs_low, r.abs_high) == (1.0, 1.0)


def test_batch_means_fallback_warns():
    r = batch_means([0.5, 0.6, 0.55], [0.7, 0.65, 0.72], "hit rate")
    assert "unit records" in r.warning and r.test.startswith("batch means")


# ------------------------------------------------------------ simulations
def _clustered_hit_units(n, shift=0.0, rng=RNG):
    """Heavy per-unit clustering: lookups ~ lognormal, hit prob ~ Beta(2, 2) per unit."""
    lookups = np.maximum(1, rng.lognormal(2.5, 1.0, n)).astype(int)
    p = np.clip(rng.beta(2, 2, n) + shift, 0, 1)
    return rng.binomial(lookups, p), lookups


def _aa_rate(make_stats, runs=1000, seed=7):
    rng = np.random.default_rng(seed)
    rej = 0
    for _ in range(runs):
        a, b = make_stats(rng)
        rej += compare("m", a, b).p_value < 0.05
    return rej / runs


@pytest.mark.slow
def test_aa_rejects_at_alpha_for_every_metric_type():
    def prop(r):
        return Proportion.from_units(r.random(400) < 0.1), Proportion.from_units(r.random(400) < 0.1)

    def mean(r):
        return Mean.from_units(r.lognormal(0, 1, 300)), Mean.from_units(r.lognormal(0, 1, 300))

    def ratio(r):
        return Ratio.from_units(*_clustered_hit_units(300, rng=r)), Ratio.from_units(*_clustered_hit_units(300, rng=r))

    def quant(r):
        def arm():
            lat = r.lognormal(-0.5, 0.8, (300, 12)) * r.lognormal(0, 0.5, (300, 1))  # clustered latencies
            bounds = np.array([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4])
            idx = np.searchsorted(bounds, lat)
            counts = np.zeros((300, len(bounds) + 1))
            for j in range(lat.shape[1]):
                np.add.at(counts, (np.arange(300), idx[:, j]), 1)
            return Quantile.from_units(0.95, tuple(bounds), counts)
        return arm(), arm()

    for name, make in (("proportion", prop), ("mean", mean), ("ratio", ratio), ("quantile", quant)):
        rate = _aa_rate(make)
        assert 0.03 <= rate <= 0.07, (name, rate)


def test_naive_per_lookup_test_would_over_reject_under_clustering():
    rng = np.random.default_rng(3)
    rej = 0
    for _ in range(400):
        ha, la = _clustered_hit_units(300, rng=rng)
        hb, lb = _clustered_hit_units(300, rng=rng)
        rej += proportions_ztest([hb.sum(), ha.sum()], [lb.sum(), la.sum()])[1] < 0.05
    assert rej / 400 > 0.2  # why the delta method at the unit level matters


def test_ci_covers_a_known_injected_effect():
    rng = np.random.default_rng(11)
    shift = 0.05
    cover = 0
    runs = 1000
    for _ in range(runs):
        a = Ratio.from_units(*_clustered_hit_units(400, 0.0, rng))
        b = Ratio.from_units(*_clustered_hit_units(400, shift, rng))
        r = compare("hr", a, b)
        cover += r.abs_low <= shift <= r.abs_high
    # Beta(2,2)+0.05 clipped at 1 barely moves the mean: the true shift is 0.05 - E[clip excess]
    assert 0.93 <= cover / runs <= 0.97, cover / runs


def test_quantile_estimate_and_outer_ci():
    bounds = (1.0, 2.0, 4.0)
    counts = np.array([[2, 6, 2, 0], [1, 5, 4, 0], [3, 3, 3, 1]], dtype=float)
    q = Quantile.from_units(0.5, bounds, counts)
    from warmscope.analysis.latency import quantile_from_buckets

    assert q.estimate == pytest.approx(quantile_from_buckets(np.array(bounds), counts.sum(axis=0), 0.5)[0])
    est, lo, hi = q.outer_ci()
    assert lo < est < hi
    assert q.n == 3 and (q + q).n == 6


# ------------------------------------------------------------ edge cases
def _overflow_quantile(slow_share, n=200, rng=None):
    """Units with 10 latencies each; a share of them beyond the last bound (overflow)."""
    rng = rng or np.random.default_rng(1)
    bounds = (1.0, 2.0, 4.0)
    counts = np.zeros((n, 4))
    slow = rng.random((n, 10)) < slow_share
    counts[:, 3] = slow.sum(axis=1)
    counts[:, 1] = 10 - counts[:, 3]
    return Quantile.from_units(0.95, bounds, counts)


def test_quantile_beyond_the_last_edge_is_reported_as_above_and_not_tested():
    # 10% of observations over the last edge: P95 is in the overflow bucket in both arms
    a, b = _overflow_quantile(0.10), _overflow_quantile(0.12, rng=np.random.default_rng(2))
    assert a.above_last_edge and b.above_last_edge
    r = compare("P95", a, b)
    assert r.error is not None and "beyond the last bucket edge (4)" in r.error
    assert not np.isfinite(r.p_value) and not r.significant
    assert r.control_above and r.treatment_above and r.control == 4.0


def test_unknown_variance_is_never_treated_as_zero():
    class NoVariance(Mean):  # an estimate whose variance cannot be computed
        def var_of_estimate(self):
            return float("nan")

    r = compare("m", NoVariance(10, 10.0, 20.0), NoVariance(10, 20.0, 50.0))
    assert r.error is not None and "variance" in r.error and not np.isfinite(r.p_value)
    assert r.abs_effect == 1.0  # 20/10 − 10/10, still shown


def test_mismatched_quantiles_raise():
    a = Quantile.from_units(0.95, (1.0, 2.0), np.ones((3, 3)))
    with pytest.raises(ValueError, match="different q"):
        compare("p", a, Quantile.from_units(0.99, (1.0, 2.0), np.ones((3, 3))))
    with pytest.raises(ValueError, match="bounds differ"):
        a + Quantile.from_units(0.95, (1.0, 3.0), np.ones((3, 3)))


@pytest.mark.parametrize("make, needle", [
    (lambda: Proportion(10, 20), "cannot exceed n"),
    (lambda: Proportion(-5, 0), "n must be >= 0"),
    (lambda: Mean(3, 6.0, 1.0), "below sum²/n"),  # 6²/3 = 12 > 1
    (lambda: Mean(2, float("nan"), 1.0), "finite"),
    (lambda: Ratio(2, 1.0, 1.0, -1.0, 1.0, 0.0), "sum_x2 must be >= 0"),
    (lambda: Ratio(2, 1.0, 1.0, 1.0, 1.0, 5.0), "Cauchy"),  # 5² > 1·1
    (lambda: Quantile.from_units(1.5, (1.0,), np.ones((2, 2))), "strictly between 0 and 1"),
    (lambda: Quantile.from_units(0.5, (2.0, 1.0), np.ones((2, 3))), "increasing"),
])
def test_invalid_sufficient_statistics_raise_a_clear_error(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


@pytest.mark.parametrize("alpha", [0, 1, 1.5, -0.1, float("nan")])
def test_alpha_is_validated(alpha):
    with pytest.raises(ValueError, match="alpha must be strictly between 0 and 1"):
        compare("m", Proportion(100, 10), Proportion(100, 12), alpha=alpha)


def test_srm_and_adjust_validate_their_inputs():
    with pytest.raises(ValueError, match="finite and >= 0"):
        srm([1000, float("nan")])
    with pytest.raises(ValueError, match="finite and >= 0"):
        srm([1000, -3])
    with pytest.raises(ValueError, match="2 counts but 3 planned"):
        srm([10, 10], planned=[1, 1, 1])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        adjust([1.5, -0.1])
    holm, _ = adjust([0.01, float("nan"), 0.04])  # NaN still means "not tested"
    assert np.isnan(holm[1]) and holm[0] == pytest.approx(0.02) and holm[2] == pytest.approx(0.04)


def test_k_arm_srm_matches_scipy():
    s = srm([1000, 1000, 1150])
    ref = stats.chisquare([1000, 1000, 1150])
    # expected 1050 each: χ² = (50² + 50² + 100²) / 1050 = 15000 / 1050 = 14.2857
    assert s.chi2 == pytest.approx(15000 / 1050) and s.p_value == pytest.approx(ref.pvalue)
    assert s.flagged  # p = exp(−14.2857/2) = 7.9e-4 < 0.001
    looser = srm([1000, 1000, 1150], threshold=1e-4)   # the report states the threshold it used
    assert not looser.flagged and looser.threshold == 1e-4 and s.threshold == 0.001


def test_relative_lift_p_value_and_ci_by_hand():
    a, b = Proportion(1000, 100), Proportion(1000, 130)
    r = compare("c", a, b)
    # rel = 0.13/0.10 − 1 = 0.3; Var(b)/a² + b²·Var(a)/a⁴ with Var = p(1−p)/1000
    va, vb = 0.1 * 0.9 / 1000, 0.13 * 0.87 / 1000
    rse = math.sqrt(vb / 0.01 + 0.0169 * va / 0.0001)
    assert r.rel_effect == pytest.approx(0.3)
    assert (r.rel_low, r.rel_high) == pytest.approx((0.3 - Z * rse, 0.3 + Z * rse))
    assert r.rel_p_value == pytest.approx(2 * stats.norm.sf(0.3 / rse))


Z = 1.959963984540054


def test_a_b_n_each_arm_against_control_with_holm():
    rng = np.random.default_rng(4)
    arms = {"A": Mean.from_units(rng.normal(10, 2, 500)), "B": Mean.from_units(rng.normal(10, 2, 500)),
            "C": Mean.from_units(rng.normal(10.6, 2, 500))}
    res = compare_arms("v", arms, control="A")
    assert [r.metric for r in res] == ["v (B vs A)", "v (C vs A)"]
    holm = multipletests([r.p_value for r in res], method="holm")[1]
    assert [r.p_holm for r in res] == pytest.approx(list(holm))
    assert res[1].significant and res[1].abs_effect > 0
    with pytest.raises(ValueError, match="control arm 'Z'"):
        compare_arms("v", arms, control="Z")


@pytest.mark.parametrize("kind, ref", [
    # Lan–DeMets spending, 5 equally spaced looks, two-sided α = 0.05 (Jennison & Turnbull; gsDesign)
    ("obrien_fleming", [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
    ("pocock", [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]),
])
def test_group_sequential_bounds_match_published_values(kind, ref):
    assert group_sequential_bounds(5, 0.05, kind) == pytest.approx(ref, abs=2e-3)


def test_group_sequential_bounds_keep_alpha_by_simulation():
    rng = np.random.default_rng(9)
    c = group_sequential_bounds(4, 0.05, "obrien_fleming")
    incr = rng.normal(size=(20000, 4)) * math.sqrt(0.25)  # score increments, info 1/4 per look
    zk = np.cumsum(incr, axis=1) / np.sqrt(np.arange(1, 5) * 0.25)
    assert abs((np.abs(zk) >= c).any(axis=1).mean() - 0.05) < 0.007
    # a single look spends everything at the end: the fixed-horizon z
    assert group_sequential_bounds(1)[0] == pytest.approx(Z)


def test_mde_sentence_never_contradicts_itself():
    assert mde_sentence(0.0026, 0.02, 0.0).endswith("a 2% effect is already detectable.")
    assert "takes about 3.0 more days" in mde_sentence(0.05, 0.02, 3.0)
    assert "hours" in mde_sentence(0.021, 0.02, 0.1)  # 0.1 day = 2.4 h


def _pareto_ratio(n, rng):
    """Sessions with Pareto(α = 1.5) sizes (infinite variance) and per-session hit rates."""
    y = np.ceil((rng.pareto(1.5, n) + 1) * 2).astype(int)
    return Ratio.from_units(rng.binomial(y, rng.beta(2, 2, n)), y)


def test_skewed_small_samples_are_refused_and_the_rest_reject_at_alpha(monkeypatch):
    import warmscope.analysis.ab as ab

    rng = np.random.default_rng(5)
    pairs = [(_pareto_ratio(200, rng), _pareto_ratio(200, rng)) for _ in range(1500)]
    guarded = [compare("hr", a, b) for a, b in pairs]
    tested = [r for r in guarded if r.error is None]
    refused = [r for r in guarded if r.error is not None]
    assert refused and all("too few units" in r.error for r in refused)
    rate = np.mean([r.p_value < 0.05 for r in tested])
    assert len(tested) > 300 and 0.03 <= rate <= 0.075, (len(tested), rate)
    monkeypatch.setattr(ab, "MIN_EFFECTIVE_UNITS", 0.0)  # without the guard the A/A test over-rejects
    naive = np.mean([compare("hr", a, b).p_value < 0.05 for a, b in pairs])
    assert naive > 0.08, naive
