import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmscope.analysis import scores as S
from warmscope.analysis.config import AnalysisConfig, DimensionSpec
from warmscope.analysis.heat import ewma_forecast, heat_scores, mape, prediction_mape, rank_to_warm, slo_lambda
from warmscope.analysis.scores import normalise, score_card


def lk(rows):
    return pd.DataFrame(rows, columns=["ts", "tenant", "layer", "family", "result", "count"])


def test_slo_lambda_is_seed_one():
    # decay_rate = 1 / max(slo_ms × 0.1, 10), per second of elapsed time
    assert slo_lambda(1000) == pytest.approx(1 / 100)  # max(100, 10) = 100
    assert slo_lambda(50) == pytest.approx(1 / 10)  # max(5, 10) = 10: the floor
    assert slo_lambda(100) == pytest.approx(1 / 10)  # max(10, 10)
    # a key idle for 100 s under a 1 s SLO keeps exp(−1) = 0.3679 of its score
    assert math.exp(-slo_lambda(1000) * 100) == pytest.approx(0.36787944)
    for bad in (0, -5, float("nan")):
        with pytest.raises(ValueError, match="milliseconds"):
            slo_lambda(bad)


def test_heat_score_by_hand():
    df = lk([(400, "t", "kv", "a:*", "hit", 10), (1000, "t", "kv", "b:*", "miss", 5), (900, "u", "kv", "c:*", "hit", 10)])
    lam = 1 / 6000  # per second: a 100-minute time constant
    s = heat_scores(df, now=1000, lam_per_s=lam, recent_s=700, priority={"t": 8}).set_index("family")
    # a: similarity 10/10 (recent >= 300), dt 600 s, priority 8
    assert s.loc["a:*", "score"] == pytest.approx(1.0 * math.exp(-lam * 600) * 0.8)
    assert s.loc["b:*", "score"] == pytest.approx(0.5 * 1.0 * 0.8)
    assert s.loc["c:*", "score"] == pytest.approx(1.0 * math.exp(-lam * 100) * 0.5)  # default priority 5
    top = rank_to_warm(heat_scores(df, 1000, lam, recent_s=700, priority={"t": 8}), k=2)
    assert top["rank"].tolist() == [1, 2] and top.family.tolist() == ["a:*", "c:*"]  # 0.724 > 0.492 > 0.4


def test_mape_and_forecast():
    assert mape([10, 20, 0], [12, 15, 3]) == pytest.approx(0.225)
    assert math.isnan(mape([0, 0], [1, 1]))
    s = pd.DataFrame({"f": [10.0, 20.0, 30.0]})
    f = ewma_forecast(s, alpha=0.5)
    assert np.isnan(f.f.iloc[0]) and f.f.iloc[1] == 10 and f.f.iloc[2] == 15
    rows = [(t, "t", "kv", "f", "hit", 10) for t in range(300, 3000, 300)]
    assert prediction_mape(lk(rows), freq=300) == 0.0  # a flat series is predicted exactly


def test_normalise_each_direction():
    low = DimensionSpec("x", "x", "s", "lower", 1.0, 5.0, 1)
    assert [normalise(low, v) for v in (0.5, 1, 3, 5, 9)] == [1, 1, 0.5, 0, 0]
    high = DimensionSpec("x", "x", "", "higher", 0.8, 0.3, 1)
    assert normalise(high, 0.55) == pytest.approx(0.5)
    tgt = DimensionSpec("x", "x", "", "target", 0.5, 0.0, 1)
    assert normalise(tgt, 0.25) == 0.5 and normalise(tgt, 0.5) == 1


def test_empty_frames_give_no_data_everywhere():
    card = score_card({})
    assert card.composite is None
    assert all(d.value is None and d.score is None and d.note for d in card.dimensions)
    assert len(card.dimensions) == 12


def test_composite_and_dynamic_weighting(monkeypatch):
    values = {"cache_hit_rate": 0.8, "sla_deviation": 0.1, "prediction_mape": 0.15}  # scores 1, 0, 1
    monkeypatch.setattr(S, "_COMPUTE", {n: (lambda fr, cfg, n=n: (values.get(n), "test", "" if n in values else
                                                                  "no data")) for n in S._COMPUTE})
    cfg = AnalysisConfig.load(dynamic_boost=1.0, breach_below=0.5)
    card = {d.name: d for d in score_card({}, cfg).dimensions}
    w_hit, w_sla, w_mape = 0.057, 0.057 * 2, 0.18  # sla breached with score 0: weight × (1 + 1)
    tot = w_hit + w_sla + w_mape
    assert card["sla_deviation"].breached and card["sla_deviation"].effective_weight == pytest.approx(w_sla / tot)
    assert score_card({}, cfg).composite == pytest.approx((w_hit + w_mape) / tot)
    assert card["cold_start_time"].note == "no data" and card["cold_start_time"].effective_weight == 0
    no_boost = score_card({}, AnalysisConfig.load(dynamic_boost=0.0)).composite
    assert no_boost == pytest.approx((w_hit + w_mape) / (w_hit + 0.057 + w_mape))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3600), st.sampled_from(["t", "u"]), st.sampled_from(["kv", "weights"]),
                          st.sampled_from(["f:*", "g:*"]), st.sampled_from(["hit", "miss", "bypass"]),
                          st.integers(0, 20)), max_size=30))
def test_score_card_never_crashes_and_stays_in_range(rows):
    frames = {"lookups": lk(rows).assign(replica="r", experiment="", variant="", model="m", length_bucket="")}
    card = score_card(frames)
    for d in card.dimensions:
        assert d.score is None or 0 <= d.score <= 1
        assert d.value is None or np.isfinite(d.value)
    if card.composite is not None:
        assert 0 <= card.composite <= 1
        assert sum(d.effective_weight for d in card.dimensions) == pytest.approx(1.0)
