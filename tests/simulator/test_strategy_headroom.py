"""The headroom bench's true-rate model (bench/strategy_headroom.py) against the traffic generator."""

from __future__ import annotations

import numpy as np
import pytest
from warmscope.simulator import SimConfig
from warmscope.simulator.traffic import (
    EVERGREEN,
    FILL_CATALOG,
    FILL_DRIFT_STEP,
    draw_arrivals,
)

from bench.strategy_headroom import fill_probs, rank_probs


def test_rank_probabilities_by_hand():
    p = rank_probs()
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    # rank 0: Σₖ (1 + 4000k)^−1.25 / ζ(1.25); ζ(1.25) = 4.595112, so 1/4.595112 = 0.217623 plus
    # wrapped terms 4001^−1.25/ζ ≈ 3.2e-5/4.6 ≈ 7e-6 (and smaller): 0.21763 to 4 places
    assert p[0] == pytest.approx(0.21763, abs=5e-5)
    # rank 1 / rank 0 ≈ 2^−1.25 = 0.420448 (the wrapped tails are negligible)
    assert p[1] / p[0] == pytest.approx(0.420448, abs=1e-3)


def test_fill_probabilities_match_the_generators_draws_after_a_drift():
    cfg = SimConfig(content_drift_h=1.0)
    rng = np.random.default_rng(5)
    hour = 3  # the fourth drift period: ranks ≥ EVERGREEN rotated by 3 × 977
    a = draw_arrivals(rng, cfg, hour * 3600.0, 600.0, 400.0, np.array([1.0]))
    n = len(a.fill)
    assert n > 200_000
    seen = np.bincount(np.asarray(a.fill), minlength=FILL_CATALOG) / n
    p = fill_probs(cfg, hour * 3600.0, rank_probs())
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    # the evergreen head keeps its fills, and fill 0 also takes the rotated rank
    # (0 − 2931) mod 4000 = 1069; rank 20 (p ≈ 0.0048) sits at fill 20 + 2931 = 2951
    assert p[0] == pytest.approx(rank_probs()[0] + rank_probs()[1069])
    assert p[EVERGREEN + 3 * FILL_DRIFT_STEP] == pytest.approx(rank_probs()[EVERGREEN])
    # the 60 likeliest fills, within 4 binomial standard errors of the drawn frequencies
    top = np.argsort(-p)[:60]
    se = np.sqrt(p[top] * (1 - p[top]) / n)
    assert np.all(np.abs(seen[top] - p[top]) < 4 * se)
    # and a fill the rotation emptied (rank 20's old place) is almost never drawn
    assert seen[EVERGREEN] < 0.2 * rank_probs()[EVERGREEN]
