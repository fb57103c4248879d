import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from warmscope.analysis import config as C
from warmscope.analysis import dimensions as D
from warmscope.analysis.config import AnalysisConfig, DimensionSpec
from warmscope.analysis.dimensions import Measurement as M
from warmscope.analysis.heat import (
    ewma_forecast,
    heat_scores,
    mape,
    prediction_mape,
    rank_to_warm,
    slo_lambda,
)
from warmscope.analysis.scores import normalise, score_card
from warmscope.model.registry import RegistryError


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
    df = lk([(400, "t", "kv", "a:*", "hit", 10), (1000, "t", "kv", "b:*", "miss", 5),
             (900, "u", "kv", "c:*", "hit", 10)])
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


def _spec(better="lower", target=1.0, worst=5.0, **kw):
    fields = dict(name="x", label="x", unit="", better=better, target=target, worst=worst, weight=1,
                  compute=lambda fr, cfg: M(None, ""), frames=("lookups",))
    return DimensionSpec(**{**fields, **kw})


def test_normalise_each_direction():
    low = _spec("lower", 1.0, 5.0)
    assert [normalise(low, v) for v in (0.5, 1, 3, 5, 9)] == [1, 1, 0.5, 0, 0]
    high = _spec("higher", 0.8, 0.3)
    assert normalise(high, 0.55) == pytest.approx(0.5)
    tgt = _spec("target", 0.5, 0.0)
    assert normalise(tgt, 0.25) == 0.5 and normalise(tgt, 0.5) == 1


def test_empty_frames_give_no_data_everywhere():
    card = score_card({})
    assert card.composite is None
    assert all(d.value is None and d.score is None and d.note for d in card.dimensions)
    assert [d.name for d in card.dimensions] == [d.name for d in D.DIMENSIONS]
    assert len(card.dimensions) == 12


def test_composite_and_dynamic_weighting(monkeypatch):
    values = {"cache_hit_rate": 0.8, "sla_deviation": 0.1, "prediction_mape": 0.15}  # scores 1, 0, 1
    _computes(monkeypatch,
              lambda n: lambda fr, cfg: M(values.get(n), "test", "" if n in values else "no data"))
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
@example(rows=[(60 * i, "t", "kv", "f:*", "hit", 0) for i in range(30)])  # all-zero traffic: no finite forecast error
def test_score_card_never_crashes_and_stays_in_range(rows):
    frames = {"lookups": lk(rows).assign(replica="r", experiment="", variant="", model="m", length_bucket="")}
    card = score_card(frames)
    for d in card.dimensions:
        assert d.score is None or 0 <= d.score <= 1
        assert d.value is None or np.isfinite(d.value)
    if card.composite is not None:
        assert 0 <= card.composite <= 1
        assert sum(d.effective_weight for d in card.dimensions) == pytest.approx(1.0)


# --------------------------------------------------- CIs, breaches, evidence
def _computes(monkeypatch, compute):
    """Every registered dimension computed by ``compute(name)`` instead (in the configurations
    loaded after)."""
    dims = tuple(dataclasses.replace(d, compute=compute(d.name)) for d in D.DIMENSIONS)
    monkeypatch.setattr(C, "DEFAULT_DIMENSIONS", dims)


def _fixed(values):
    """Computations replaced by constants: name -> (value, ci) or absent (no data)."""
    return lambda n: (lambda fr, cfg: M(values[n][0], "test", "", values[n][1]) if n in values else
                      M(None, "test", "no data"))


def test_breach_needs_the_ci_to_exclude_the_target(monkeypatch):
    # sla_deviation: target 0.01, worst 0.1 → value 0.1 scores 0 either way
    _computes(monkeypatch, _fixed({"sla_deviation": (0.1, (0.005, 0.2)),
                                   "cache_hit_rate": (0.8, None)}))
    card = {d.name: d for d in score_card({}, AnalysisConfig.load(dynamic_boost=1.0)).dimensions}
    d = card["sla_deviation"]
    assert not d.breached and d.note.startswith("within noise")
    assert d.effective_weight == pytest.approx(0.5)  # base weights 0.057 : 0.057
    _computes(monkeypatch, _fixed({"sla_deviation": (0.1, (0.05, 0.2)),
                                   "cache_hit_rate": (0.8, None)}))
    d = {d.name: d for d in score_card({}, AnalysisConfig.load(dynamic_boost=1.0)).dimensions}["sla_deviation"]
    # CI (0.05, 0.2) lies above the 0.01 target: breached, weight 0.057 × (1 + 1 × (0.5 − 0)/0.5) = 0.114
    assert d.breached and d.effective_weight == pytest.approx(0.114 / (0.114 + 0.057))
    assert (d.ci_low, d.ci_high) == (0.05, 0.2)


def _req(rows):
    return pd.DataFrame(rows, columns=["ts", "tenant", "experiment", "variant", "model", "replica", "sla_met",
                                       "requests", "gpu_s", "conversions", "value"])


def test_a_fixed_split_is_not_a_grey_release_and_a_ramp_is():
    fixed = _req([(3600.0 * h + 60, "t", "e", v, "m", "r", "true", 500, 1.0, 0, 0.0)
                  for h in range(6) for v in ("A", "B")])
    m = D._penetration({"requests": fixed}, AnalysisConfig())
    v, note = m.value, m.note
    assert v is None and "fixed at 50%" in note
    ramp = _req([(3600.0 * h + 60, "t", "e", v, "m", "r", "true", n, 1.0, 0, 0.0)
                 for h, share in enumerate((0.05, 0.1, 0.25, 0.5)) for v, n in
                 (("B", int(1000 * share)), ("A", int(1000 * (1 - share))))])
    m = D._penetration({"requests": ramp}, AnalysisConfig())
    v, src = m.value, m.source
    assert v == pytest.approx(0.5) and "last hour" in src  # 500 of 1000 in the last hour


def test_cold_start_needs_a_replica_start_in_the_range():
    lkp = lk([(60.0 * m, "t", "kv", "f:*", r, 5) for m in range(1, 120) for r in ("hit", "miss")]).assign(
        replica="a-0")
    m = D._cold_start({"lookups": lkp, "warmup_runs": pd.DataFrame(
        columns=["replica", "trigger", "started"])}, AnalysisConfig())
    v, note = m.value, m.note
    assert v is None and "no replica started" in note
    # started at 0 s; hit rate 0 for 10 minutes, then 0.5: the first minute at 90% of the median (0.5) ends 660 s
    lkp = lk([(60.0 * m, "t", "kv", "f:*", r, 5 if (r == "miss" or m > 10) else 0)
              for m in range(1, 120) for r in ("hit", "miss")]).assign(replica="a-0")
    runs = pd.DataFrame([("a-0", "replica_start", 0.0)], columns=["replica", "trigger", "started"])
    v = D._cold_start({"lookups": lkp, "warmup_runs": runs}, AnalysisConfig()).value
    assert v == 660.0


def test_mape_dimension_is_the_forecast_modules_15_s_prediction_error():
    from warmscope.analysis.forecast import prediction_error

    # per-minute data: a 15-s horizon is scored one 60-s bucket ahead, and the source says so
    lkp = lk([(60.0 * m, "t", "kv", "f:*", "hit", 10) for m in range(1, 30)])
    m = D._mape({"lookups": lkp}, AnalysisConfig())
    v, src, note, ci = m.value, m.source, m.note, m.ci
    assert v == pytest.approx(0.0, abs=1e-9)  # a flat series is forecast exactly by every model
    assert "15 s ahead, scored as the next 60-s bucket" in src and note == ""
    # 15-s data, two families with noise: the same number as analysis.forecast gives, with its CI
    rng = np.random.default_rng(5)
    lkp15 = lk([(15.0 * m, "t", "kv", f, "hit", int(rng.poisson(20))) for m in range(1, 400) for f in ("f:*", "g:*")])
    m = D._mape({"lookups": lkp15}, AnalysisConfig())
    v, src, ci = m.value, m.source, m.ci
    pe = prediction_error(lkp15, horizon_s=15.0)
    assert v == pe.value and ci == pe.ci and "scored as" not in src
    assert 0 < ci[0] < v < ci[1]
    # Poisson(20) counts against a smoothed level: MAPE about E|X − 20| / X ≈ 0.18; nowhere near 0 or 1
    assert 0.1 < v < 0.3
    # hourly rollups: no data, and why
    hourly = lk([(3600.0 * h, "t", "kv", "f:*", "hit", 10) for h in range(1, 30)])
    m = D._mape({"lookups": hourly}, AnalysisConfig())
    v, note = m.value, m.note
    assert v is None and "per 3600 s" in note


def test_warmup_roi_dimension_by_hand():
    # one warm-up on b-0 (two layers, counted once): cost (6 + 4) × 0.5 = $5
    runs = pd.DataFrame([("r1", "b-0", "", "prefix_kv", "static_topk", "replica_start", 0.0, 100.0, "ok", 6.0),
                         ("r2", "b-0", "", "response", "static_topk", "replica_start", 0.0, 100.0, "ok", 4.0)],
                        columns=["run_id", "replica", "tenant", "layer", "strategy", "trigger", "started", "ended",
                                 "status", "gpu_s"])
    rows = []
    for k, g in enumerate([2.0, 4.0, 6.0, 4.0, 4.0, 4.0], start=1):
        rows += [(100 + 60 * k, "t", "e", "B", "m", "b-0", "true", 10, g, 0, 0.0),
                 (100 + 60 * k, "t", "e", "A", "m", "a-0", "true", 10, 10.0, 0, 0.0)]
    cfg = AnalysisConfig.load(price_per_gpu_s=0.5)
    m = D._roi({"warmup_runs": runs, "requests": _req(rows)}, cfg)
    v, src, ci = m.value, m.source, m.ci
    # T+300 s: saved 8 + 6 + 4 + 6 + 6 = 30 GPU-s = $15 → (15 − 5) / 5 = 2
    assert v == pytest.approx(2.0) and "1 warm-up(s)" in src
    assert ci[0] < 2.0 < ci[1]


# ------------------------------------------------------------ the registry
@pytest.mark.parametrize("missing, words", [
    (dict(label=""), "needs a label"),
    (dict(frames=()), "needs the frames it reads"),
    (dict(frames=("lookups", "no_such_frame")), "no_such_frame"),
    (dict(compute=None), "needs compute"),
    (dict(better="up"), "better must be one of lower, higher, target"),
    (dict(worst=1.0), "target and worst must differ"),
    (dict(weight=-1), "weight must be >= 0"),
])
def test_an_incomplete_dimension_fails_with_a_clear_message(missing, words):
    with pytest.raises(RegistryError, match="score dimension entry 'x'") as e:
        _spec(**missing)
    assert words in str(e.value)


def test_the_registry_is_checked_as_a_whole():
    def decl(name, weight=None):
        return (dict(name=name, label=name, unit="", better="lower", target=1.0, worst=2.0,
                     weight=weight, frames=("requests",)), lambda fr, cfg: M(None, ""))

    with pytest.raises(RegistryError, match="'a': declared twice"):
        D.build([decl("a"), decl("a")])
    with pytest.raises(RegistryError, match="no weight left to share"):
        D.build([decl("a", 0.7), decl("b", 0.6), decl("c")])
    # dimensions without a weight share what the others leave, whatever their count
    built = D.build([decl("a", 0.4), decl("b"), decl("c"), decl("d")])
    assert [d.weight for d in built] == [0.4, 0.2, 0.2, 0.2]
    assert sum(d.weight for d in D.DIMENSIONS) == pytest.approx(1.0)


def test_a_dimension_reads_only_the_frames_it_declares(monkeypatch):
    seen = {}
    _computes(monkeypatch,
              lambda n: lambda fr, cfg: (seen.setdefault(n, sorted(fr)), M(None, "t", "x"))[1])
    names = ("lookups", "requests", "histograms", "gauges", "warmup_runs", "writes", "hot_keys")
    frames = {name: pd.DataFrame() for name in names}
    score_card(frames, AnalysisConfig.load())
    assert seen == {d.name: sorted(d.frames) for d in D.DIMENSIONS}
    assert seen["cold_start_time"] == ["lookups", "warmup_runs"]
