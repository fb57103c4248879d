"""Forecasts: target windows, smoothing against statsmodels, model selection against baselines, intervals."""

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.forecast import (
    _ses_levels,
    _targets,
    evaluate,
    forecast_table,
    next_peak,
    prediction_error,
    series,
)


def _lookups(counts: np.ndarray, step: float = 60.0, t0: float = 1_795_824_000.0, family: str = "resp:a:*"):
    n = len(counts)
    return pd.DataFrame({"ts": t0 + step * np.arange(1, n + 1), "tenant": "acme", "layer": "response",
                         "family": family, "result": "hit", "experiment": "", "variant": "A", "model": "m",
                         "replica": "a-0", "length_bucket": "", "count": counts.astype(float)})


def test_targets_are_the_mean_rate_of_the_next_m_buckets():
    y = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    t = _targets(y, 2)
    # row 0: mean(2, 3) = 2.5; row 2: mean(4, 5) = 4.5; rows 3, 4: past the end
    assert t[0, 0] == 2.5 and t[2, 0] == 4.5
    assert np.isnan(t[3, 0]) and np.isnan(t[4, 0])


def test_series_reads_counts_as_rates_per_second():
    lk = _lookups(np.array([60, 120, 0, 30]))
    s = series(lk)
    assert s.attrs["step_s"] == 60.0
    np.testing.assert_allclose(s["resp:a:*"].to_numpy(), [1.0, 2.0, 0.0, 0.5])  # 60/60, 120/60, 0, 30/60


def test_ses_levels_equal_statsmodels():
    from statsmodels.tsa.holtwinters import SimpleExpSmoothing

    rng = np.random.default_rng(3)
    y = rng.poisson(20, 200).astype(float)
    ours = _ses_levels(y[:, None], 0.3)[:, 0]
    fit = SimpleExpSmoothing(y, initialization_method="known", initial_level=y[0]).fit(smoothing_level=0.3,
                                                                                     optimized=False)
    # statsmodels' fittedvalues[t] is the level after t-1; ours[t] the level after t
    np.testing.assert_allclose(ours[:-1], fit.fittedvalues[1:], rtol=1e-10)


def test_regression_is_kept_only_when_it_beats_the_baselines():
    rng = np.random.default_rng(1)
    # a flat Poisson rate: nothing to learn beyond the mean; a daily sine: the time of day helps the 1-h forecast
    flat = rng.poisson(30, 1440)
    ev = evaluate(series(_lookups(flat)), (180.0,))[0]
    assert ev.chosen in ("ses", "seasonal_naive", "regression")
    if ev.chosen == "regression":
        assert ev.selection_mape["regression"] < min(ev.selection_mape["ses"], ev.selection_mape["seasonal_naive"])
    else:
        assert ev.selection_mape[ev.chosen] <= ev.selection_mape["regression"]
    t = np.arange(1440)
    wave = rng.poisson(40 * (1 + 0.8 * np.sin(2 * np.pi * t / 1440)))
    ev = evaluate(series(_lookups(wave)), (3600.0,))[0]
    # the naive last bucket is a noisy estimate of the next hour's mean: smoothing beats it
    assert ev.mape["ses"] < ev.mape["seasonal_naive"]


def test_interval_coverage_is_near_nominal_on_stationary_noise():
    rng = np.random.default_rng(7)
    lk = pd.concat([_lookups(rng.poisson(50, 1440), family=f"f{i}") for i in range(6)])
    tab = forecast_table(lk, horizons=(180.0,))
    kept = tab[tab.kept].iloc[0]
    # 90 % intervals calibrated on the selection part; on the held-back part of the same process
    assert 0.8 <= kept.coverage_90 <= 0.97


def test_short_horizon_on_coarse_flushes_is_flagged_and_prediction_error_says_why():
    lk = _lookups(np.random.default_rng(0).poisson(10, 600))
    tab = forecast_table(lk, horizons=(5.0,))
    assert tab.resolution_limited.all()
    pe = prediction_error(lk, 15.0)  # per-minute flushes: one bucket ahead, flagged
    assert pe.resolution_limited and "scored as the next 60-s bucket" in pe.note and 0 < pe.value < 1
    hourly = _lookups(np.random.default_rng(0).poisson(600, 200), step=3600.0)
    v, why = prediction_error(hourly, 15.0)
    assert np.isnan(v) and "per 3600 s" in why
    fine = _lookups(np.random.default_rng(0).poisson(10, 2000), step=5.0)
    pe = prediction_error(fine, 15.0)
    assert 0 < pe.value < 1 and "15 s ahead" in pe.note and not pe.resolution_limited
    assert pe.ci[0] < pe.value < pe.ci[1]


def test_block_ci_by_hand():
    from warmscope.analysis.forecast import _block_ci

    # four blocks of two rows; actual 1 everywhere, forecasts give block MAPEs 0.1, 0.2, 0.3, 0.4
    a = np.ones((8, 1))
    p = np.array([[1.1], [0.9], [1.2], [0.8], [1.3], [0.7], [1.4], [0.6]])
    lo, hi = _block_ci(a, p, blocks=4)
    # mean 0.25, sd 0.129099, t(0.975, 3) = 3.182446: half-width 3.182446 × 0.129099 / 2 = 0.205426
    assert lo == pytest.approx(0.25 - 0.205426, abs=1e-6) and hi == pytest.approx(0.25 + 0.205426, abs=1e-6)


def test_block_ci_covers_the_true_mape_about_95_percent_of_the_time_on_autocorrelated_errors():
    from warmscope.analysis.forecast import _block_ci

    # forecast = actual × (1 + e), e an AR(1) (phi 0.8) with sd 0.1: true MAPE = E|e| = 0.1·√(2/π) = 0.0797885
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(400):
        e = np.empty(600)
        e[0] = rng.normal(0, 0.1)
        for t in range(1, 600):
            e[t] = 0.8 * e[t - 1] + rng.normal(0, 0.1 * np.sqrt(1 - 0.64))
        lo, hi = _block_ci(np.ones((600, 1)), (1 + e)[:, None])
        hits += lo <= 0.0797885 <= hi
    assert 0.90 <= hits / 400 <= 0.99


def test_next_peak_finds_the_time_of_day_of_the_highest_rate():
    t = np.arange(1440)
    rate = 30 * (1 + 0.5 * np.sin(2 * np.pi * (t / 60 - 9) / 24))  # peak at 15:00, as in the simulator
    lk = _lookups(np.round(rate).astype(int))
    pk = next_peak(lk)
    assert abs((pk.at % 86400) / 3600 - 15.0) < 0.5
    assert pk.at > lk.ts.max()
    assert pk.lo <= pk.rate <= pk.hi  # the smoothed peak rate lies within the bucket rates around it
