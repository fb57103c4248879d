"""Forecasts: target windows, smoothing against statsmodels, model selection against baselines, intervals."""

import numpy as np
import pandas as pd
import pytest

from warmscope.analysis.forecast import (_ses_levels, _targets, evaluate, forecast_table, next_peak,
                                         prediction_error, series)


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
    v, why = prediction_error(lk, 15.0)
    assert np.isnan(v) and "per 60 s" in why
    fine = _lookups(np.random.default_rng(0).poisson(10, 2000), step=5.0)
    v, why = prediction_error(fine, 15.0)
    assert 0 < v < 1 and "15 s ahead" in why


def test_next_peak_finds_the_time_of_day_of_the_highest_rate():
    t = np.arange(1440)
    rate = 30 * (1 + 0.5 * np.sin(2 * np.pi * (t / 60 - 9) / 24))  # peak at 15:00, as in the simulator
    lk = _lookups(np.round(rate).astype(int))
    pk = next_peak(lk)
    assert abs((pk.at % 86400) / 3600 - 15.0) < 0.5
    assert pk.at > lk.ts.max()
    assert pk.lo <= pk.rate <= pk.hi  # the smoothed peak rate lies within the bucket rates around it
