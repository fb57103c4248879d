"""Bayesian optimisation: expected improvement against hand-computed values, the optimiser on a known function,
parameter mapping."""

import numpy as np
import pytest
from warmscope.analysis.advisor import (
    expected_improvement,
    optimise,
    sim_overrides,
    to_params,
    to_unit,
)
from warmscope.analysis.replay import SLO_LAMBDA, Params


def test_expected_improvement_hand_computed():
    # mu=1, sd=1, best=0, xi=0: z = 1, EI = 1·Φ(1) + 1·φ(1) = 0.841345 + 0.241971 = 1.083316
    assert expected_improvement([1.0], [1.0], 0.0, xi=0.0)[0] == pytest.approx(1.083316, abs=1e-6)
    # mu=0, sd=2, best=1, xi=0: z = -0.5, EI = -1·Φ(-0.5) + 2·φ(-0.5) = -0.308538 + 0.704131 = 0.395593
    assert expected_improvement([0.0], [2.0], 1.0, xi=0.0)[0] == pytest.approx(0.395593, abs=1e-6)
    # no uncertainty: the plain improvement, never negative
    np.testing.assert_allclose(expected_improvement([0.5, -1.0], [0.0, 0.0], 0.0, xi=0.0), [0.5, 0.0])


def test_expected_improvement_equals_the_integral_by_simulation():
    rng = np.random.default_rng(0)
    draws = rng.normal(0.3, 0.8, 500_000)
    mc = np.maximum(draws - 0.5, 0).mean()  # E[max(f − best, 0)], f ~ N(0.3, 0.8²)
    assert expected_improvement([0.3], [0.8], 0.5, xi=0.0)[0] == pytest.approx(mc, rel=1e-2)


@pytest.mark.slow
def test_optimise_finds_the_maximum_of_a_known_function_better_than_random_search():
    c = np.array([0.3, 0.7])
    f = lambda x: -float(np.sum((x - c) ** 2))  # noqa: E731
    X, y, _ = optimise(f, 2, n_init=8, n_iter=12, seed=1)
    assert len(y) == 20
    assert y.max() > -2e-3  # within ~0.045 of the optimum
    rnd = np.random.default_rng(1).random((20, 2))
    assert y.max() > max(f(x) for x in rnd)  # the same budget spent at random does worse


def test_parameter_mapping_round_trips_and_names_the_simulator_settings():
    p = Params(warm_keys=800, response_ttl_s=7200, lambda_per_s=1e-4, lead_s=3600)
    q = to_params(to_unit(p))
    assert q.warm_keys == 800 and q.response_ttl_s == 7200 and q.lead_s == 3600
    assert q.lambda_per_s == pytest.approx(1e-4)
    o = sim_overrides(p)
    assert o["lambda_mode"] == "fixed" and o["lambda_fixed"] == 1e-4 and o["warm_keys"] == 800
    assert sim_overrides(Params(lambda_per_s=SLO_LAMBDA))["lambda_mode"] == "slo"
