"""The advisor's named steps on hand-made inputs: the default objective and its note, the refusal of
an objective without its prices, a prefix's worth of warming, and the warm-set size taking a rank
shared by equal request counts whole."""

import math

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.advisor import (
    NoRecommendation,
    _check_objective,
    _pick_objective,
    _prefix_worth,
    _size_note,
    _value_model,
    _warm_set_size,
)
from warmscope.analysis.value import ValueModel

SLO = ValueModel("slo", 0.001, 0.0005, (0.00025, 0.00075), "a test SLO")


def test_the_default_objective_follows_the_prices_and_says_so():
    vm = _value_model(None)
    assert (vm.kind, vm.price_per_gpu_s, vm.per_ttft_s) == ("gpu_s", 0.0008, 0.0)
    assert _pick_objective(vm, None) == (
        "net_gpu_s",
        ["the default: latency not priced (no value model given)"],
    )
    assert _pick_objective(SLO, None) == (
        "slo",
        ["the default: latency priced from the configured SLO"],
    )
    conv = ValueModel("conversion", 0.001, 0.0005, (0.0, 0.001), "conversions")
    assert _pick_objective(conv, None)[0] == "value"
    assert _pick_objective(conv, "roi") == ("roi", [])  # asked for: no note


def test_an_objective_without_its_prices_is_refused():
    _check_objective(SLO, "slo")  # priced: passes
    with pytest.raises(NoRecommendation, match=r"^No SLO price \(no value model given\)"):
        _check_objective(_value_model(None), "slo")
    with pytest.raises(NoRecommendation, match=r"^No conversion data to price latency"):
        _check_objective(SLO, "value")
    with pytest.raises(ValueError, match="got 'hit_rate'"):
        _check_objective(SLO, "hit_rate")


def test_a_prefix_is_worth_its_prefill_times_the_chance_of_a_read_less_its_cost():
    keys = pd.DataFrame({"tokens": [1000.0, 500.0]})
    p = -np.expm1(-np.array([1.0, 2.0]))  # 1 − e^−1 = 0.63212, 1 − e^−2 = 0.86466
    # s = 1e-4 s per token × 1000 = 0.1 s and × 500 = 0.05 s
    # net GPU-s: s·(p − 1) = 0.1 × −0.36788 = −0.036788 and 0.05 × −0.13534 = −0.0067668
    net = _prefix_worth(keys, p, "net_gpu_s", 0.001, 1e-4, 0.0005)
    assert net == pytest.approx([-0.036788, -0.0067668], rel=1e-4)
    # slo, g = 0.001, v = 0.0005: s·(p·0.0015 − 0.001) = 0.1 × −5.182e-5 and 0.05 × 2.9699e-4
    slo = _prefix_worth(keys, p, "slo", 0.001, 1e-4, 0.0005)
    assert slo == pytest.approx([-5.182e-6, 1.48499e-5], rel=1e-3)


def test_the_warm_set_takes_a_shared_rank_whole_or_not_at_all():
    # requests 3, 2, 2, 1 with worth 1.0, 0.5, −0.6, −0.2: the prefix sums are 0, 1, 1.5, 0.9, 0.7;
    # sizes 2 splits the rank of 2 requests, so the sizes allowed are 0, 1, 3, 4 -> best is 1 (1.0)
    keys = pd.DataFrame({"requests": [3, 2, 2, 1], "worth": [1.0, 0.5, -0.6, -0.2]})
    k, cum = _warm_set_size(keys)
    assert k == 1 and cum[k] == pytest.approx(1.0)
    # with the last worth +0.5 the full set sums to 1.4 > 1.0: all four
    k, cum = _warm_set_size(keys.assign(worth=[1.0, 0.5, -0.6, 0.5]))
    assert k == 4 and cum[k] == pytest.approx(1.4)


def test_the_size_note_says_why():
    keys = pd.DataFrame({"requests": [3, 1], "worth": [0.01, -0.002]})
    assert _size_note(keys, 1, "slo") == (
        "warm the 1 prefixes read at least 3 times: a prefix read fewer times is read again too "
        "rarely to pay for its prefill (net -0.002 in value each)"
    )
    assert _size_note(keys, 0, "net_gpu_s").startswith("warm-set size 0: no prefix pays in GPU-s")
    assert _size_note(keys, 0, "slo") == "warm-set size 0: no prefix pays"
    assert f"probability {1 - math.exp(-1):.2f}" in _size_note(keys, 2, "slo")  # 0.63
