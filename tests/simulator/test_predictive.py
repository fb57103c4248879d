"""The predictive strategy's formulas, against hand-computed values."""

from __future__ import annotations

import math

import pytest
from warmscope.simulator import SimConfig
from warmscope.simulator.strategies import (
    HeatTracker,
    KeyStats,
    _adapter_miss,
    _forecast,
    _response_miss_ttft,
)
from warmscope.simulator.traffic import TEMPLATES, Tenant

TAU = 3600.0
SEARCH = next(i for i, t in enumerate(TEMPLATES) if t.name == "search")
CHAT = next(i for i, t in enumerate(TEMPLATES) if t.name == "chat")


def test_observed_seconds_is_what_a_steady_rate_leaves_in_the_decayed_count():
    h = HeatTracker(0.01, count_tau_s=TAU)
    h.touch("response", "k", "acme", SEARCH, 0.0)
    # τ·(1 − e^(−T/τ)): at T = τ, 3600 × (1 − 1/e) = 3600 × 0.632121 = 2275.64
    assert h.observed_s(TAU) == pytest.approx(2275.64, abs=0.01)
    assert h.observed_s(0.5) == pytest.approx(TAU * (1 - math.exp(-1 / TAU)))  # at least a second observed


def test_adapter_miss_by_ches_approximation():
    cfg = SimConfig(lora_slots=1)
    # two tenants at 1/2 each, one slot: 2·(1 − e^(−T/2)) = 1 → e^(−T/2) = 1/2, each misses half the time
    m = _adapter_miss(cfg, {"a": 5.0, "b": 5.0})
    assert m["a"] == pytest.approx(0.5, abs=1e-9) and m["b"] == pytest.approx(0.5, abs=1e-9)
    # no more tenants than slots: every adapter stays resident
    assert _adapter_miss(SimConfig(lora_slots=4), {"a": 3.0, "b": 1.0}) == {"a": 0.0, "b": 0.0}
    # a busier tenant misses less
    m = _adapter_miss(cfg, {"a": 9.0, "b": 1.0, "c": 1.0})
    assert m["a"] < m["b"] == pytest.approx(m["c"])


def test_response_miss_ttft_adds_the_likely_adapter_load():
    cfg = SimConfig()
    # search: RAG with three chunks, query 10–60 tokens (mean 35):
    # 0.5 × 0.4 + 3 × 0.015 + 35 × 0.00004 + 0.03 = 0.2 + 0.045 + 0.0014 + 0.03 = 0.2764 s
    assert _response_miss_ttft(cfg, SEARCH, 0.5) == pytest.approx(0.2764)
    # chat: no retrieval, query 30–300 (mean 165): 0 + 0 + 0.0066 + 0.03 = 0.0366 s with the adapter resident
    assert _response_miss_ttft(cfg, CHAT, 0.0) == pytest.approx(0.0366)


def _tenant() -> dict[str, Tenant]:
    return {"acme": Tenant(0, "acme", "m", 5, 1.0, [SEARCH], [1.0])}


def test_forecast_warms_keys_likely_to_prevent_a_miss_and_skips_fresh_entries():
    cfg = SimConfig(warm_horizon_s=1800.0, warm_min_prob=0.25, replicas=2, strategy_c="")
    h = HeatTracker(0.01, count_tau_s=TAU)
    t = 0.0
    for i in range(36):  # "hot": every 100 s for an hour
        h.touch("response", "hot", "acme", SEARCH, t + 100 * i)
    h.touch("response", "cold", "acme", SEARCH, 10.0)  # once
    now = 3600.0
    obs = h.observed_s(now)
    hot = sum(math.exp(-(now - 100 * i) / TAU) for i in range(36)) / (3600 + obs)  # no prior: PRIOR_WEIGHT_S 3600
    cold = math.exp(-(now - 10) / TAU) / (3600 + obs)
    # rates: hot 22.44 / 5875.6 = 0.00382 /s, cold 0.3688 / 5875.6 = 6.28e-5 /s; the chance of a request
    # within 30 min, 1 − e^(−r·1800): hot 0.9990, cold 0.1069 (< 0.25: not warmed)
    assert -math.expm1(-hot * 1800) == pytest.approx(0.9990, abs=1e-4)
    assert -math.expm1(-cold * 1800) == pytest.approx(0.1069, abs=1e-4)
    empty = KeyStats()
    keys = _forecast(cfg, "response", now, empty, h, _tenant(), None, lambda layer, k: 0.0, None)
    assert keys == ["hot"]
    # an entry still valid for the whole horizon needs no warming
    assert _forecast(cfg, "response", now, empty, h, _tenant(), None, lambda layer, k: 1800.0, None) == []


def test_forecast_is_per_replica_for_a_replicas_own_cache():
    cfg = SimConfig(warm_min_prob=0.25, replicas=2)
    h = HeatTracker(0.01, count_tau_s=TAU)
    for i in range(36):
        h.touch("prefix_kv", "hist", "acme", CHAT, 100.0 * i, "c-0")  # a session served by c-0 only
        h.touch("prefix_kv", "sys", "acme", CHAT, 100.0 * i, "c-0" if i % 2 else "c-1")  # by both
    no = lambda layer, k: 0.0  # noqa: E731
    assert set(_forecast(cfg, "prefix_kv", 3600.0, KeyStats(), h, _tenant(), "c-0", no, None)) == {"hist", "sys"}
    assert _forecast(cfg, "prefix_kv", 3600.0, KeyStats(), h, _tenant(), "c-1", no, None) == ["sys"]
