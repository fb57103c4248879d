"""Staleness in the what-if replay: warmed keys expire, are evicted unread, or stop being popular before they are
used, so warming too early (or ranking by stale heat) is penalised. Synthetic models, no simulation."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.replay import (
    STABLE,
    Model,
    Params,
    _persist_integrals,
    _warm_extra,
    persistence,
)

DAY0 = 1_795_824_000.0  # a midnight (UTC)


def _model(capacity: float = 150.0, persist=STABLE, catalog: int = 1000) -> Model:
    """One response cache, one family of 1,000 Zipf(1) keys: 0.002 req/s, then 2 req/s from 12:00 to 18:00."""
    idx = DAY0 + 900.0 * np.arange(96)
    hour = (idx - DAY0) / 3600
    rate = np.where((hour >= 12) & (hour < 18), 2.0, 0.002)
    rates = pd.DataFrame({("A", "f"): rate}, index=idx)
    rates.columns = pd.MultiIndex.from_tuples(rates.columns)
    m = Model(rates={"response": rates}, instances={"response": ["A"]}, s={"response": 1.0},
              catalog={"response": catalog}, capacity={"response": capacity}, cost_per_key={"response": 0.1},
              bytes_per_key={"response": 1.0}, recorded_hit_rate={"response": 0.5},
              starts={"A": [DAY0 - 86400.0]}, peak_at=12 * 3600.0, weights_load_s=0.0, t0=DAY0, t1=DAY0 + 86400.0,
              base=Params(warm_keys=100, response_ttl_s=3600.0, lambda_per_s=1e-3, lead_s=900.0))
    m.persist["response"] = persist
    return m


def _extra(m: Model, **kw) -> float:
    # the replica started a day earlier, so the only warm-up in the day is the pre-peak one
    return _warm_extra(m, "response", 1.0, replace(m.base, **kw), np.random.default_rng(0))[0]


def test_warming_hours_before_the_peak_is_worth_less_than_just_before_it():
    m = _model(capacity=500.0, catalog=20000)
    just_before = _extra(m, lead_s=900.0)  # 11:45: the keys are read within minutes of the rise
    early = _extra(m, lead_s=6 * 3600.0)  # 06:00: a 1-h TTL runs out long before 12:00
    assert just_before > 10 * early > 0
    # a 4-h TTL keeps entries warmed at 09:00 until the peak, but not those warmed at 06:00
    roomy = _model(capacity=5000.0, catalog=20000)
    assert _extra(roomy, lead_s=3 * 3600.0, response_ttl_s=14400.0) > 10 * _extra(roomy, lead_s=3 * 3600.0)
    assert _extra(roomy, lead_s=6 * 3600.0, response_ttl_s=14400.0) < 0.2 * _extra(roomy, lead_s=900.0,
                                                                                      response_ttl_s=14400.0)


def test_an_lru_evicts_entries_warmed_early_before_the_peak_reads_them():
    def ratio(capacity):  # an hour early against 15 min early, 0.2 req/s before the peak, 4-h TTL
        m = _model(capacity=capacity, catalog=20000)
        m.rates["response"].iloc[:, 0] = np.where(m.rates["response"].iloc[:, 0] > 1, 2.0, 0.2)
        return _extra(m, lead_s=3600.0, response_ttl_s=14400.0) / _extra(m, lead_s=900.0, response_ttl_s=14400.0)

    # a small cache turns over in the hour before the peak: a quarter of the early warm-up's value is lost
    assert ratio(200.0) < 0.85 and ratio(5000.0) > 0.9


def test_moving_popularity_penalises_early_warm_ups_and_stale_heat():
    moving = (np.array([0.0, 3600.0, 7200.0]), np.array([1.0, 0.2, 0.2]))  # 80 % of the hot set gone in an hour
    stable = _model(capacity=5000.0, catalog=20000)
    drift = _model(capacity=5000.0, catalog=20000, persist=moving)
    kw = dict(response_ttl_s=14400.0)
    # warmed at 09:00, read from 12:00: under drift most warmed keys are no longer popular by then
    assert _extra(drift, lead_s=3 * 3600.0, **kw) < 0.6 * _extra(stable, lead_s=3 * 3600.0, **kw)
    # warmed at 11:45 they are read at once: drift costs little
    assert _extra(drift, lead_s=900.0, **kw) > 0.95 * _extra(stable, lead_s=900.0, **kw)
    # heat with a long memory (small λ) ranks by popularity that has moved on
    assert _extra(drift, lead_s=900.0, lambda_per_s=1e-5, **kw) < 0.8 * _extra(stable, lead_s=900.0,
                                                                                 lambda_per_s=1e-5, **kw)
    assert _extra(drift, lead_s=900.0, lambda_per_s=1e-5, **kw) < 0.8 * _extra(drift, lead_s=900.0,
                                                                                 lambda_per_s=1e-3, **kw)


def test_persistence_integrals_by_hand():
    lags, rho = np.array([0.0, 3600.0]), np.array([1.0, 0.5])
    A, G = _persist_integrals(lags, rho, 1e-3, np.array([1800.0, 3600.0, 7200.0]))
    # G(1800) = 1800 × (1 + 0.75) / 2 = 1575; G(3600) = 3600 × 0.75 = 2700; G(7200) = 2700 + 0.5 × 3600 = 4500
    np.testing.assert_allclose(G, [1575.0, 2700.0, 4500.0], rtol=1e-9)
    # A = ∫_0^3600 e^{−a/1000}(1 − a/7200) da + 0.5·e^{−3.6}/1e-3, integrated in closed form
    k, T = 1e-3, 3600.0
    closed = (1 - np.exp(-k * T)) / k - (1 / 7200) * (1 - np.exp(-k * T) * (1 + k * T)) / k ** 2 \
        + 0.5 * np.exp(-k * T) / k
    assert A == pytest.approx(closed, rel=1e-4)
    # stable popularity: A = 1/λ
    assert _persist_integrals(*STABLE, 1e-3, np.zeros(1))[0] == pytest.approx(1000.0)


def test_persistence_from_hot_keys_by_hand():
    W = 3600.0
    rows = [  # window, tenant, layer, key, family, hits, misses, err
        (0.0, "t", "response", "a", "f", 60, 0, 0), (0.0, "t", "response", "b", "f", 30, 0, 0),
        (W, "t", "response", "a", "f", 50, 0, 0), (W, "t", "response", "c", "f", 50, 0, 0),
        (2 * W, "t", "response", "c", "f", 10, 0, 0), (2 * W, "t", "response", "d", "f", 90, 0, 0),
    ]
    hk = pd.DataFrame(rows, columns=["window", "tenant", "layer", "key_hash", "family", "hits", "misses", "err"])
    lags, rho, note = persistence(hk, "response", top=2)
    # lag 1 h: windows 0→1: a (50) of 100 caught; 1→2: c (10) of 100 → (50 + 10) / 200 = 0.3
    # lag 2 h: window 0→2: a, b not there → 0 / 100 = 0
    np.testing.assert_allclose(lags, [0.0, W, 2 * W])
    np.testing.assert_allclose(rho, [1.0, 0.3, 0.0])
    assert "ρ(1 h) = 0.30" in note
    lags, rho, note = persistence(hk.iloc[:0], "response")
    assert (rho == 1).all() and "taken as stable" in note


def tunable_model() -> tuple[Model, pd.DataFrame]:
    """A response-layer model with room to tune (500 entries, 20,000 keys), its recorded hits from its
    own base parameters, and the lookups that record them (15-minute points)."""
    from warmscope.analysis.replay import _layer_hits, replay_cost

    m = _model(capacity=500.0, catalog=20000)
    m.base_hits = {"response": _layer_hits(m, "response", 1.0, m.base)[0].sum()
                   + _warm_extra(m, "response", 1.0, m.base, np.random.default_rng(0))[0]}
    m.base_hits.update({f"_cost_{k}": v for k, v in replay_cost(m, m.base).items()})
    r = m.rates["response"]
    lk = pd.DataFrame({"ts": r.index + 900.0, "layer": "response", "family": "f", "result": "hit",
                       "count": r.iloc[:, 0].to_numpy() * 900.0})
    return m, lk


@pytest.mark.slow
def test_the_roi_ratio_and_net_gpu_s_objectives_each_win_on_their_own_terms():
    from warmscope.analysis.advisor import advise

    m, lk = tunable_model()
    net = advise({"lookups": lk}, model=m, n_init=5, n_iter=3, seed=1)
    roi = advise({"lookups": lk}, model=m, n_init=5, n_iter=3, seed=1, objective="roi")
    assert net.objective == "net_gpu_s" and roi.objective == "roi"
    assert roi.gain == pytest.approx(roi.outcome.roi - roi.base_outcome.roi)
    assert net.gain == pytest.approx(net.outcome.net_gpu_s - net.base_outcome.net_gpu_s)
    # each wins on its own objective (same seed, same start points)
    assert roi.outcome.roi >= net.outcome.roi and net.outcome.net_gpu_s >= roi.outcome.net_gpu_s
    assert (roi.outcome.roi, roi.outcome.net_gpu_s) != (net.outcome.roi, net.outcome.net_gpu_s)
    with pytest.raises(ValueError, match="objective must be one of"):
        advise({"lookups": lk}, model=m, objective="hit_rate")
