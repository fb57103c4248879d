"""The predictive strategy's formulas, against hand-computed values."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from warmscope.simulator import SimConfig
from warmscope.simulator.strategies import (
    MIN_OBSERVED_S,
    PRIOR_WEIGHT_S,
    HeatTracker,
    KeyStats,
    _adapter_miss,
    _chain,
    _forecast,
    _rate,
    _response_miss_ttft,
    lora_chances,
    read_chance,
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
    assert h.observed_s(0.5) == pytest.approx(
        TAU * (1 - math.exp(-1 / TAU))
    )  # at least a second observed


def test_adapter_miss_by_ches_approximation():
    cfg = SimConfig(lora_slots=1)
    # two tenants at 1/2 each, one slot: 2·(1 − e^(−T/2)) = 1 → e^(−T/2) = 1/2, each misses half
    # the time
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
    # chat: no retrieval, query 30–300 (mean 165): 0 + 0 + 0.0066 + 0.03 = 0.0366 s with the
    # adapter resident
    assert _response_miss_ttft(cfg, CHAT, 0.0) == pytest.approx(0.0366)


def _tenant() -> dict[str, Tenant]:
    return {"acme": Tenant(0, "acme", "m", 5, 1.0, [SEARCH], [1.0])}


def test_read_chance_stationary_with_death_and_after_a_long_idle_time():
    # no death (μ = 0): 1 − e^(−λh); λ = 1/1800, h = 1800: 1 − e^(−1) = 0.632121
    assert read_chance(1 / 1800, 0.0, 1800.0, 0.0) == pytest.approx(0.632121, abs=1e-6)
    # μ = 1/3600, just requested (d = 0): alive = 1; λ + μ = 3/3600 = 1/1200;
    # λ/(λ+μ) = 2/3; 1 − e^(−1800/1200) = 1 − e^(−1.5) = 0.776870; 2/3 × 0.776870 = 0.517913
    assert read_chance(1 / 1800, 0.0, 1800.0, 1 / 3600) == pytest.approx(0.517913, abs=1e-6)
    # idle an hour: e^(−(λ+μ)d) = e^(−3) = 0.049787, μ/(λ+μ) = 1/3:
    # alive = 0.049787 / (0.049787 + 0.950213/3) = 0.049787 / 0.366525 = 0.135836;
    # 0.135836 × 0.517913 = 0.070351
    assert read_chance(1 / 1800, 3600.0, 1800.0, 1 / 3600) == pytest.approx(0.070351, abs=1e-6)
    # no rate or no horizon: no chance; a very long idle time stays finite (no overflow)
    assert read_chance(0.0, 0.0, 1800.0, 1 / 3600) == 0.0
    assert read_chance(1 / 1800, 0.0, 0.0, 1 / 3600) == 0.0
    assert read_chance(1.0, 1e9, 1800.0, 1 / 3600) == 0.0
    # no death and a long idle time: still stationary (it divided 0 by 0 once e^(−λd) underflowed):
    # λ = 1, h = 1 s: 1 − e^(−1) = 0.632121
    assert read_chance(1.0, 1e9, 1.0, 0.0) == pytest.approx(0.632121, abs=1e-6)


def test_read_chance_is_at_most_rate_times_horizon():
    # The forecast skips a key whose rate × horizon is under half the floor without computing its
    # chance: sound only if read_chance <= λ·h (1 − e^(−x) <= x, alive <= 1), checked over a grid
    # of rates, idle times, horizons and death rates, including where λ·h is tiny and near 1.
    import itertools

    rates = [1e-9, 1e-6, 1e-4, 1 / 3600, 1 / 600, 0.01, 0.1, 1.0]
    for lam, idle, h, mu in itertools.product(rates, [0.0, 60.0, 3600.0, 86400.0],
                                              [1.0, 60.0, 1800.0, 3600.0], [0.0, 1 / 86400, 1 / 3600, 0.01]):
        assert read_chance(lam, idle, h, mu) <= lam * h * (1 + 1e-12), (lam, idle, h, mu)
    # and the bound is tight for a stationary key just requested: λ = 1e-6, h = 60: λh = 6e-5,
    # 1 − e^(−6e-5) = 5.99982e-5
    assert read_chance(1e-6, 0.0, 60.0, 0.0) == pytest.approx(5.99982e-5, rel=1e-5)


def test_rate_caps_yesterday_by_today_once_observed():
    assert MIN_OBSERVED_S == 600 and PRIOR_WEIGHT_S == 3600
    # observed long enough: min(yesterday 0.001 /s, today 0.9 / 1800 = 0.0005 /s) = 0.0005
    assert _rate(0.001, 0.9, 1800.0) == pytest.approx(0.0005)
    # today busier than yesterday: yesterday's 0.001 /s
    assert _rate(0.001, 9.0, 1800.0) == pytest.approx(0.001)
    # yesterday's key not asked for today: 0
    assert _rate(0.001, 0.0, 1800.0) == 0.0
    # too little observed (300 s < 600 s): (0.001 × 3600 + 0.9) / (3600 + 300) = 4.5 / 3900
    # = 0.00115385
    assert _rate(0.001, 0.9, 300.0) == pytest.approx(0.00115385, abs=1e-8)
    # a key yesterday never saw: as if 3600 s had seen nothing, 0.9 / (3600 + 1800) = 1/6000
    assert _rate(0.0, 0.9, 1800.0) == pytest.approx(1 / 6000)


def test_chain_caps_blocks_by_their_predecessors_and_drops_gaps():
    # chat: 768 system tokens = two 512-token blocks; its history is read after them
    pair = lambda k: ("acme", CHAT)  # noqa: E731
    chance = {
        "kv:chat:sys:acme.0": 0.9,
        "kv:chat:sys:acme.1": 0.95,  # capped by block 0: 0.9
        "kv:chat:hist:7.0": 0.8,
        "kv:chat:hist:7.1": 0.85,  # capped by the history's block 0: 0.8
        "kv:chat:hist:7.3": 0.7,  # block 2 is not warmed: a gap, dropped
        "kv:chat:hist:8.1": 0.9,  # no block 0: dropped
    }
    _chain(chance, pair, 512)
    assert chance == {
        "kv:chat:sys:acme.0": 0.9,
        "kv:chat:sys:acme.1": 0.9,
        "kv:chat:hist:7.0": 0.8,
        "kv:chat:hist:7.1": 0.8,
    }
    # a history capped by a less likely system prompt: min(0.8, 0.6) = 0.6
    chance = {"kv:chat:sys:acme.0": 0.6, "kv:chat:sys:acme.1": 0.7, "kv:chat:hist:7.0": 0.8}
    _chain(chance, pair, 512)
    assert chance["kv:chat:hist:7.0"] == 0.6
    # a history whose system prompt is not wholly warmed would miss: dropped
    chance = {"kv:chat:sys:acme.0": 0.9, "kv:chat:hist:7.0": 0.8}
    _chain(chance, pair, 512)
    assert chance == {"kv:chat:sys:acme.0": 0.9}


def test_lora_chances_are_one_minus_ches_miss_chance():
    # two tenants at 1/2 each, one slot: each misses half the time, so each is read with 1/2
    c = lora_chances(SimConfig(lora_slots=1), Counter({"a": 5.0, "b": 5.0}))
    assert c["a"] == pytest.approx(0.5, abs=1e-9) and c["b"] == pytest.approx(0.5, abs=1e-9)
    # no more tenants than slots: always read
    assert lora_chances(SimConfig(lora_slots=4), Counter({"a": 3.0})) == {"a": 1.0}


def test_forecast_warms_keys_likely_to_prevent_a_miss_and_skips_fresh_entries():
    cfg = SimConfig(warm_horizon_s=1800.0, warm_min_prob=0.25, replicas=2, strategy_c="")
    h = HeatTracker(0.01, count_tau_s=TAU)
    for i in range(36):  # "hot": every 100 s for an hour
        h.touch("response", "hot", "acme", SEARCH, 100.0 * i)
    h.touch("response", "cold", "acme", SEARCH, 10.0)  # once
    now = 3600.0
    obs = h.observed_s(now)
    # no prior (yesterday never saw them): seen / (PRIOR_WEIGHT_S + obs)
    hot = sum(math.exp(-(now - 100 * i) / TAU) for i in range(36)) / (3600 + obs)
    cold = math.exp(-(now - 10) / TAU) / (3600 + obs)
    # rates: hot 22.44 / 5875.6 = 0.00382 /s, cold 0.3688 / 5875.6 = 6.28e-5 /s; demand ends at
    # μ = 1/τ = 0.000278 /s. hot, idle 100 s: λ+μ = 0.004097, e^(−0.4097) = 0.6639,
    # alive = 0.6639 / (0.6639 + 0.0678 × 0.3361) = 0.9668; read = 0.9668 × 0.932 ×
    # (1 − e^(−7.375)) = 0.9006. cold, idle 3590 s: λ+μ = 3.406e-4, e^(−1.2229) = 0.2944,
    # alive = 0.2944 / (0.2944 + 0.8156 × 0.7056) = 0.3384; read = 0.3384 × 0.1844 ×
    # (1 − e^(−0.6131)) = 0.0285 (< 0.25: not warmed)
    assert read_chance(hot, 100.0, 1800.0, 1 / TAU) == pytest.approx(0.9006, abs=1e-3)
    assert read_chance(cold, 3590.0, 1800.0, 1 / TAU) == pytest.approx(0.0285, abs=1e-3)
    empty = KeyStats()
    no = lambda layer, k: 0.0  # noqa: E731
    assert _forecast(cfg, "response", now, empty, h, _tenant(), None, no, None) == ["hot"]
    # an entry still valid for the whole horizon needs no warming
    fresh = lambda layer, k: 1800.0  # noqa: E731
    assert _forecast(cfg, "response", now, empty, h, _tenant(), None, fresh, None) == []
    # a cache that keeps an unread entry only 60 s: read within 60 s with
    # 0.9668 × 0.932 × (1 − e^(−0.2458)) = 0.196 < 0.25: not worth warming
    res = lambda layer: 60.0  # noqa: E731
    assert _forecast(cfg, "response", now, empty, h, _tenant(), None, no, None, res) == []


def test_forecast_caps_yesterdays_rate_by_todays_traffic():
    cfg = SimConfig(warm_horizon_s=1800.0, warm_min_prob=0.25, replicas=2, strategy_c="")
    y = KeyStats()
    y.span_s = 3600.0
    y.add("response", "gone", "acme", SEARCH, 3600.0)  # yesterday: 1 /s over both pools
    y.add("response", "kept", "acme", SEARCH, 3600.0)
    h = HeatTracker(0.01, count_tau_s=TAU)
    for i in range(36):
        h.touch("response", "kept", "acme", SEARCH, 100.0 * i)
    # "gone": yesterday 0.5 /s in one of two pools, not asked for in today's hour: rate 0
    # "kept": min(0.5, 22.44 / 2275.6 = 0.00986) /s, idle 100 s: read within 30 min ≈ 1
    no = lambda layer, k: 0.0  # noqa: E731
    assert _forecast(cfg, "response", 3600.0, y, h, _tenant(), None, no, None) == ["kept"]


def test_forecast_is_per_replica_for_a_replicas_own_cache():
    cfg = SimConfig(warm_min_prob=0.25, replicas=2)
    h = HeatTracker(0.01, count_tau_s=TAU)
    for i in range(36):
        h.touch("prefix_kv", "hist", "acme", CHAT, 100.0 * i, "c-0")  # a session served by c-0 only
        h.touch("prefix_kv", "sys", "acme", CHAT, 100.0 * i, "c-0" if i % 2 else "c-1")  # by both
    no = lambda layer, k: 0.0  # noqa: E731
    assert set(_forecast(cfg, "prefix_kv", 3600.0, KeyStats(), h, _tenant(), "c-0", no, None)) == {
        "hist",
        "sys",
    }
    assert _forecast(cfg, "prefix_kv", 3600.0, KeyStats(), h, _tenant(), "c-1", no, None) == ["sys"]
