import math
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.coverage import read_in_time, run_effect, warm_set_coverage
from warmscope.analysis.roi import (
    benefit_series,
    business_roi,
    compute_roi,
    fit_decay,
    replica_runs,
    roi_windows,
    warmup_members,
)
from warmscope.collectors import EmbeddedStore
from warmscope.simulator import SimConfig, parse_fault

from tests.conftest import simulated_store

NAN = float("nan")
RUN_COLS = ["run_id", "strategy", "layer", "tenant", "replica", "trigger", "started", "ended", "gpu_s", "status"]


def runs(*rows):
    return pd.DataFrame(rows, columns=RUN_COLS)


def warmed(*rows):
    return pd.DataFrame(rows, columns=["run_id", "key_hash", "warmed_at", "ttl_s", "gpu_s", "first_hit_at",
                                       "first_miss_at", "hits"])


def test_read_in_time_rules():
    w = warmed(
        ("r", "a", 100, 60, 1, 150, NAN, 2),  # hit within TTL: read
        ("r", "b", 100, 60, 1, 170, NAN, 1),  # hit after TTL: a refilled entry
        ("r", "c", 100, NAN, 1, 300, 200, 1),  # missed (evicted) before the hit
        ("r", "d", 100, NAN, 1, NAN, 120, 0),  # never hit
        ("r", "e", 100, NAN, 1, 110, 400, 3),  # hit, then evicted later: read
    )
    assert read_in_time(w).tolist() == [True, False, False, False, True]


def test_precision_recall_and_wasted_gpu_by_hand():
    r = runs(("r1", "static", "kv", "t", "x", "replica_start", 0, 100, 5.0, "ok"),
             ("r2", "none", "kv", "t", "x", "manual", 0, 100, 1.0, "ok"))
    w = warmed(("r1", "a", 100, NAN, 1.0, 110, NAN, 1), ("r1", "b", 100, NAN, 1.5, NAN, NAN, 0),
               ("r1", "c", 100, NAN, 0.5, 120, NAN, 4), ("r1", "d", 100, NAN, 1.0, NAN, 150, 0))
    early = pd.DataFrame([("r1", "a", 150, 3), ("r1", "z", 160, 1), ("r1", "c", 900, 1), ("r1", "y", 2000, 1)],
                         columns=["run_id", "key_hash", "first_seen", "lookups"])
    cov = warm_set_coverage(r, w, early, recall_window_s=900).set_index("run_id")
    one = cov.loc["r1"]
    assert (one.keys_warmed, one.keys_read, one.precision) == (4, 2, 0.5)
    assert one.wasted_gpu_s == pytest.approx(2.5)  # b and d
    assert one.overhead_gpu_s == pytest.approx(1.0)  # 5.0 run cost − 4.0 attributed to keys
    assert (one.early_keys, one.early_warmed) == (3, 2)  # y is after 100 + 900
    assert one.recall == pytest.approx(2 / 3)
    two = cov.loc["r2"]
    assert two.keys_warmed == 0 and np.isnan(two.precision) and np.isnan(two.recall)


def test_coverage_of_nothing_is_an_empty_frame():
    out = warm_set_coverage(runs(), warmed(), pd.DataFrame(columns=["run_id", "key_hash", "first_seen"]))
    assert out.empty and "precision" in out.columns


def test_runs_without_warmed_key_records_have_no_precision():
    # a runner that records its runs but not their keys: 0 keys warmed, precision unknown (NaN)
    r = runs(("r1", "static_topk", "prefix_kv", "", "b-0", "replica_start", 0.0, 20.0, 1.0, "ok"))
    out = warm_set_coverage(r, warmed(), pd.DataFrame(columns=["run_id", "key_hash", "first_seen"]))
    assert out.loc[0, "keys_warmed"] == 0 and np.isnan(out.loc[0, "precision"])


@pytest.mark.slow
def test_warmup_too_early_has_lower_precision_than_a_clean_run(tmp_path):
    cfg = SimConfig.load(hours=1, rps=3.0, tenants=4, replicas=1, seed=3, peak_warmup_at_h=-1)
    clean, early = tmp_path / "clean.sqlite", tmp_path / "early.sqlite"
    simulated_store(clean, cfg, workers=1)
    early_fault = parse_fault("warmup_timing:replica=b-0,layer=response@00:20-00:40;ttl_s=60")
    simulated_store(early, cfg, [early_fault], workers=1)

    def precision(path, trigger):
        st = EmbeddedStore(path, readonly=True)
        cov = warm_set_coverage(st.frame("warmup_runs"), st.frame("warmed_keys"), st.frame("early_keys"))
        c = cov[(cov.layer == "response") & (cov.trigger == trigger)]
        return c.keys_read.sum() / c.keys_warmed.sum()

    assert precision(early, "scheduled") < 0.5 * precision(clean, "replica_start")


REQ_COLS = ["ts", "tenant", "experiment", "variant", "model", "replica", "sla_met", "requests", "gpu_s",
            "conversions", "value"]


def test_roi_both_forms_by_hand():
    assert business_roi(10, 5, 4.0, 5.0) == pytest.approx(3.0)
    assert compute_roi(50, 0.5, 5.0) == pytest.approx(4.0)
    assert math.isnan(business_roi(1, 0, 1.0, 0.0))
    run = SimpleNamespace(replica="b-0", tenant="", started=0.0, ended=100.0, gpu_s=10.0)
    req = pd.DataFrame([
        (160, "t", "e", "B", "m", "b-0", "true", 100, 50.0, 10, 40.0),   # treated, within 5 min
        (160, "t", "e", "A", "m", "a-0", "true", 200, 200.0, 10, 40.0),  # control
        (5000, "t", "e", "B", "m", "b-0", "true", 100, 100.0, 5, 20.0),  # treated, later
        (5000, "t", "e", "A", "m", "a-0", "true", 100, 100.0, 5, 20.0),
    ], columns=REQ_COLS)
    t = roi_windows(run, req, price_per_gpu_s=0.5, value_per_conversion=4.0, windows=(300, 86400)).set_index(
        "window_s")
    w5 = t.loc[300]
    assert w5.baseline == "control variant"
    assert (w5.requests, w5.conversions, w5.baseline_conversions) == (100, 10, 5)
    assert (w5.gpu_s_saved, w5.cost) == (50, 5)
    assert (w5.roi_business, w5.roi_compute) == (pytest.approx(3.0), pytest.approx(4.0))
    day = t.loc[86400]
    # control: 300 req, 300 gpu, 15 conv; treated: 200 req, 150 gpu, 15 conv
    assert day.gpu_s_saved == pytest.approx((300 / 300 - 150 / 200) * 200)
    assert day.baseline_conversions == pytest.approx(15 / 300 * 200)


def test_roi_without_experiment_uses_the_time_before_the_run():
    run = SimpleNamespace(replica="r", tenant="", started=1000.0, ended=1100.0, gpu_s=2.0)
    req = pd.DataFrame([(900, "t", "", "", "m", "r", "", 10, 20.0, 1, 0.0),
                        (1200, "t", "", "", "m", "r", "", 10, 10.0, 2, 0.0)], columns=REQ_COLS)
    w = roi_windows(run, req, 1.0, 1.0, windows=(300,)).iloc[0]
    assert w.baseline == "before run" and w.gpu_s_saved == pytest.approx(10.0)
    assert w.roi_compute == pytest.approx((10 - 2) / 2)


def test_decay_fit_recovers_a_known_rate():
    t = np.arange(0, 6 * 3600, 60.0)
    s = pd.DataFrame({"t_s": t, "benefit": 3.0 * np.exp(-0.8 * t / 3600)})
    d = fit_decay(s)
    assert d.error is None and d.k_per_hour == pytest.approx(0.8, rel=1e-6)
    assert d.ci_low <= 0.8 <= d.ci_high and d.half_life_h == pytest.approx(math.log(2) / 0.8, rel=1e-6)
    rng = np.random.default_rng(0)
    noisy = s.assign(benefit=s.benefit + rng.normal(0, 0.2, len(s)))
    dn = fit_decay(noisy)
    assert dn.ci_low < 0.8 < dn.ci_high


def test_decay_fit_says_when_there_is_too_little_data():
    d = fit_decay(pd.DataFrame({"t_s": [0.0, 60.0], "benefit": [1.0, 0.5]}))
    assert "not enough points" in d.error and math.isnan(d.k_per_hour)


def test_benefit_series_against_control():
    run = SimpleNamespace(replica="b-0", tenant="", started=0.0, ended=0.0, gpu_s=1.0)
    req = pd.DataFrame([(60, "t", "e", "B", "m", "b-0", "", 10, 5.0, 1, 0.0),
                        (60, "t", "e", "A", "m", "a-0", "", 10, 10.0, 1, 0.0),
                        (120, "t", "e", "B", "m", "b-0", "", 10, 8.0, 1, 0.0),
                        (120, "t", "e", "A", "m", "a-0", "", 10, 10.0, 1, 0.0)], columns=REQ_COLS)
    s = benefit_series(run, req, price_per_gpu_s=1.0, value_per_conversion=0.0)
    assert s.benefit.tolist() == pytest.approx([5.0, 2.0])


def test_run_effect_before_after():
    run = SimpleNamespace(replica="r", tenant="", layer="kv", started=1000.0, ended=1100.0)
    lk = pd.DataFrame([(900, "r", "t", "kv", "hit", 1), (900, "r", "t", "kv", "miss", 3),
                       (1200, "r", "t", "kv", "hit", 3), (1200, "r", "t", "kv", "miss", 1),
                       (1200, "r", "t", "emb", "miss", 9)],
                      columns=["ts", "replica", "tenant", "layer", "result", "count"])
    hist = pd.DataFrame([(900, "gen_ai.server.time_to_first_token", "r", "t", 2.0, 4),
                         (1200, "gen_ai.server.time_to_first_token", "r", "t", 0.5, 4)],
                        columns=["ts", "metric", "replica", "tenant", "le", "count"])
    req = pd.DataFrame([(900, "t", "r", 4, 8.0), (1200, "t", "r", 4, 2.0)],
                       columns=["ts", "tenant", "replica", "requests", "gpu_s"])
    e = run_effect(run, lk, hist, req, window_s=300)
    assert e.loc["hit_rate", "before"] == 0.25 and e.loc["hit_rate", "after"] == 0.75
    assert e.loc["ttft_p50_s", "after"] < e.loc["ttft_p50_s", "before"]
    assert e.loc["gpu_s_per_request", "change"] == pytest.approx(-1.5)


def test_analysis_config_validation(tmp_path):
    from warmscope.analysis.config import ConfigError

    p = tmp_path / "a.toml"
    p.write_text('[analysis]\nprice_per_gpu_s = 0.001\n[analysis.dimensions.cache_hit_rate]\ntarget = 0.9\n'
                 'weight = 0.1\n')
    c = AnalysisConfig.load(p)
    assert c.price_per_gpu_s == 0.001 and c.dimension("cache_hit_rate").target == 0.9
    with pytest.raises(ConfigError, match="analysis.prediction_alpha must be in"):
        AnalysisConfig.load(prediction_alpha=2)
    with pytest.raises(ConfigError, match="analysis.dimensions.hit_rate is not a dimension"):
        AnalysisConfig.load(dimensions={"hit_rate": {"target": 1}})
    with pytest.raises(ConfigError, match="weight must be >= 0"):
        AnalysisConfig.load(dimensions={"cache_hit_rate": {"weight": -1}})
    with pytest.raises(ConfigError, match="target and worst must differ"):
        AnalysisConfig.load(dimensions={"sla_deviation": {"target": 0.1, "worst": 0.1}})
    with pytest.raises(ConfigError, match="roi_windows_s must be positive"):
        AnalysisConfig.load(roi_windows_s=[0])
    d = AnalysisConfig().dimensions
    assert sum(x.weight for x in d) == pytest.approx(1.0, abs=1e-4)
    assert AnalysisConfig().dimension("prediction_mape").weight == 0.18
    assert AnalysisConfig().dimension("warmup_roi").weight == 0.25


# ---------------------------------------------------------------- ROI CIs
def _roi_case(run_gpu_s=10.0):
    run = SimpleNamespace(replica="b-0", tenant="", started=0.0, ended=100.0, gpu_s=run_gpu_s)
    rows = []
    for k, g in enumerate([2.0, 4.0, 6.0, 4.0, 4.0], start=1):  # treated GPU-s per minute
        rows.append((100 + 60 * k, "t", "e", "B", "m", "b-0", "true", 10, g, 0, 0.0))
        rows.append((100 + 60 * k, "t", "e", "A", "m", "a-0", "true", 10, 10.0, 0, 0.0))  # control: 1 GPU-s/req
    return run, pd.DataFrame(rows, columns=REQ_COLS)


def test_roi_interval_by_hand():
    run, req = _roi_case()
    w = roi_windows(run, req, price_per_gpu_s=0.5, value_per_conversion=4.0, windows=(300,)).iloc[0]
    # saved per minute = 10·1 − g = [8, 6, 4, 6, 6], total 30 GPU-s = $15; cost 10 × 0.5 = $5
    assert w.gpu_s_saved == pytest.approx(30) and w.roi_compute == pytest.approx((15 - 5) / 5)
    # per-minute $ [4, 3, 2, 3, 3]: sd = sqrt(2/4) = 0.7071; SE of the sum = 0.7071 × √5 = 1.5811
    half = stats.t.ppf(0.975, 4) * math.sqrt(0.5) * math.sqrt(5)  # 2.7764 × 1.5811 = 4.3899
    assert (w.roi_compute_low, w.roi_compute_high) == pytest.approx((2 - half / 5, 2 + half / 5))
    assert w.state == "ok" and bool(w.complete)
    assert w.roi_business == pytest.approx(-1.0)  # no conversions either side: (0 − 5) / 5


def test_roi_says_cost_too_small_and_flags_unfinished_windows():
    run, req = _roi_case(run_gpu_s=0.001)  # cost $0.0005 against a benefit SE of $1.58
    w = roi_windows(run, req, 0.5, 4.0, windows=(300,)).iloc[0]
    assert w.state == "cost too small to estimate" and math.isnan(w.roi_compute)
    assert w.gpu_s_saved == pytest.approx(30)  # the parts stay
    run, req = _roi_case()
    t = roi_windows(run, req, 0.5, 4.0, windows=(300, 3600)).set_index("window_s")
    assert bool(t.loc[300, "complete"]) and t.loc[3600, "state"] == "unfinished"  # data end 400 < 100 + 3600


def test_decay_fit_does_not_overflow():
    # A simulated run's per-minute benefit: noise around zero (SD ≈ 23) that sent the fit's trial k
    # far enough for exp() to overflow.
    from pathlib import Path

    s = pd.read_csv(Path(__file__).parent / "data" / "noisy_benefit.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = fit_decay(s)
    assert d.n_points == 360


def test_replica_runs_count_a_warm_up_once():
    runs = pd.DataFrame([
        ("r1", "b-0", "", "prefix_kv", "static_topk", "replica_start", 0.0, 20.0, "ok", 5, 10, 1.0, 0, None),
        ("r2", "b-0", "", "response", "static_topk", "replica_start", 0.0, 28.0, "ok", 3, 10, 0.5, 0, None),
        ("r3", "b-1", "", "prefix_kv", "static_topk", "replica_start", 0.0, 20.0, "ok", 5, 10, 1.0, 0, None),
    ], columns=["run_id", "replica", "tenant", "layer", "strategy", "trigger", "started", "ended", "status", "keys",
                "bytes", "gpu_s", "memory_bytes", "error"])
    m = replica_runs(runs).set_index("replica")
    assert len(m) == 2 and m.loc["b-0", "gpu_s"] == 1.5 and m.loc["b-0", "keys"] == 8
    assert m.loc["b-0", "layer"] == "prefix_kv+response" and m.loc["b-0", "ended"] == 28.0
    assert m.loc["b-0", "runs"] == 2 and m.loc["b-0", "run_id"] == "r1"
    # every run id, keyed by its warm-up's (the first run's): r2 is b-0's response run
    assert warmup_members(runs) == {"r1": ["r1", "r2"], "r3": ["r3"]}
    assert warmup_members(runs.iloc[:0]) == {}
