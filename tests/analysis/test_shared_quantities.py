"""The quantities several dashboard pages show, each defined once in analysis/: warm-up spend and
waste, the latest warm-up (its layers' runs merged), the decay of a warm-up's benefit and how many
warm-ups measurably decay, ROI that cannot be estimated and why, the score card's status and
weights, the grey-release reading, and the trap verdicts the Root cause page and the alerts share.
Figures are checked against hand-computed literals."""

import math

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis import dimensions as D
from warmscope.analysis import scores as S
from warmscope.analysis.alerts import trap_verdicts
from warmscope.analysis.config import AnalysisConfig
from warmscope.analysis.coverage import run_effect, warmup_spend
from warmscope.analysis.roi import (
    Decay,
    benefit_series,
    decay_summary,
    decay_text,
    latest_warmup,
    roi_text,
    roi_windows,
    significant_decay,
    warmups,
)
from warmscope.analysis.scores import DimensionScore, ScoreCard, status, weight_text, weights_note

INF = math.inf


def _runs(rows):
    return pd.DataFrame(rows, columns=["run_id", "replica", "layer", "strategy", "trigger", "tenant", "started",
                                       "ended", "keys", "gpu_s", "status"])


def _keys(rows):
    # run_id, key, first_hit_at, first_miss_at, gpu_s; warmed at 0 with a 100 s TTL
    return pd.DataFrame([{"run_id": r, "key_hash": k, "family": "f", "tenant": "t", "layer": "kv", "warmed_at": 0.0,
                          "ttl_s": 100.0, "gpu_s": g, "first_hit_at": h, "first_miss_at": m, "hits": 0}
                         for r, k, h, m, g in rows])


def test_warmup_spend_counts_the_runs_of_the_range_and_their_keys_only():
    runs = _runs([("r1", "a", "kv", "s", "scheduled", "", 0.0, 10.0, 3, 5.0, "ok"),
                  ("r2", "a", "resp", "s", "scheduled", "", 0.0, 10.0, 1, 2.5, "ok")])
    keys = _keys([("r1", "k1", 50.0, INF, 1.0),     # read while warm
                  ("r1", "k2", 150.0, INF, 1.5),    # read after its 100 s TTL: unread
                  ("r1", "k3", 60.0, 40.0, 0.5),    # missed (evicted) before the hit: unread
                  ("r2", "k4", INF, INF, 2.0),      # never read
                  ("r9", "k5", INF, INF, 9.0)])     # another range's run: left out
    sp = warmup_spend(runs, keys)
    # spent: 5.0 + 2.5 = 7.5 (the runs' own GPU-s); wasted: k2 1.5 + k3 0.5 + k4 2.0 = 4.0
    assert (sp.runs, sp.gpu_s, sp.keys_warmed, sp.keys_unread, sp.wasted_gpu_s) == (2, 7.5, 4, 3, 4.0)
    assert sp.sentence().startswith("4.00 of 7.50 warm-up GPU-s wasted on 3 of 4 warmed keys never read while "
                                    "warm (75%); 2 runs")
    assert warmup_spend(runs.iloc[:0], keys).sentence() == "No warm-up runs started in this range."


def test_the_latest_warmup_merges_its_layers_runs():
    runs = _runs([("r1", "a", "kv", "s", "scheduled", "", 100.0, 110.0, 3, 5.0, "ok"),
                  ("r2", "a", "resp", "s", "scheduled", "", 100.0, 120.0, 1, 2.5, "ok"),
                  ("r3", "b", "kv", "s", "scheduled", "", 50.0, 60.0, 7, 1.0, "ok")])
    w = latest_warmup(runs)
    # one warm-up of replica a: 5.0 + 2.5 GPU-s, 3 + 1 keys, ended at the later run's end
    assert (w.run_id, w.layer, w.gpu_s, w["keys"], w.ended, w.runs) == ("r1", "kv+resp", 7.5, 4, 120.0, 2)
    assert list(warmups(runs).run_id) == ["r1", "r3"]
    assert latest_warmup(runs.iloc[:0]) is None


def test_run_effect_reads_every_layer_of_a_merged_warmup():
    lk = pd.DataFrame({"ts": [50.0, 50.0, 150.0, 150.0], "replica": "a", "tenant": "t",
                       "layer": ["kv", "resp", "kv", "other"], "result": "hit",
                       "count": [1, 3, 2, 100]})
    lk = pd.concat([lk, lk.assign(result="miss", count=[3, 1, 2, 0])])
    run = pd.Series({"replica": "a", "tenant": "", "layer": "kv+resp", "started": 100.0, "ended": 100.0})
    empty = pd.DataFrame(columns=["ts", "metric", "le", "count", "replica", "tenant"])
    req = pd.DataFrame(columns=["ts", "replica", "tenant", "requests", "gpu_s"])
    eff = run_effect(run, lk, empty, req, window_s=100.0)
    # before: kv 1/4 + resp 3/4 = 4 hits of 8; after: kv 2 of 4 (the layer "other" is not the warm-up's)
    assert eff.loc["hit_rate", "before"] == pytest.approx(0.5)
    assert eff.loc["hit_rate", "after"] == pytest.approx(0.5)


def _decay(k, lo, hi):
    return Decay(k, lo, hi, math.log(2) / k if k > 0 else INF, 1.0, 30)


def test_decay_is_reported_only_where_its_interval_excludes_no_decay_on_every_page():
    noisy, real = _decay(2.17, -1.0, 5.3), _decay(0.5, 0.2, 0.8)
    assert not significant_decay(noisy) and significant_decay(real)
    assert decay_text(noisy).startswith("no decay measured")
    # the score card's note: the median of the warm-ups that measurably decay, not of every fit
    assert decay_summary([noisy, noisy]) == ("benefit decay: none measured (the rate's 95 % CI includes no decay "
                                              "on all 2 warm-ups fitted)")
    # significant: 0.5 and 1.5 → median 1.0 /h, half-life ln 2 / 1.0 = 0.69 h
    s = decay_summary([noisy, real, _decay(1.5, 1.0, 2.0)])
    assert s.startswith("benefit decay k = 1/h (median over the 2 of 3 warm-ups") and "half-life 0.69 h" in s


def _requests():
    """Replica a: 10 requests a minute; before the run (t < 0) 1.0 GPU-s each, after it 0.9;
    conversions alternate 0 and 40 a minute (noise far above a cost of cents)."""
    rows = []
    for m in range(-10, 10):
        t = 60.0 * m + 30
        rows.append({"ts": t, "replica": "a", "tenant": "t", "experiment": "", "variant": "", "requests": 10,
                     "gpu_s": 10.0 if m < 0 else 9.0, "conversions": 40.0 * (m % 2)})
    return pd.DataFrame(rows)


def test_roi_too_small_to_estimate_says_by_how_much_and_the_benefit_splits_into_its_parts():
    run = pd.Series({"replica": "a", "tenant": "", "started": 0.0, "ended": 0.0, "gpu_s": 10.0})
    roi = roi_windows(run, _requests(), price_per_gpu_s=0.001, value_per_conversion=1.0, windows=(600.0,))
    r = roi.iloc[0]
    assert r.cost == pytest.approx(0.01)  # 10 GPU-s × 0.001
    assert r.state == "cost too small to estimate" and np.isfinite(r.revenue_se)
    cell = roi_text(roi).iloc[0]["roi_business"]
    assert cell.startswith("not estimable: conversions vary by ±") and "× the run's cost of 0.0100" in cell
    # compute: 1 GPU-s saved a minute × 0.001 = 0.001 a minute, every minute (no noise)
    s = benefit_series(run, _requests(), 0.001, 1.0, horizon_s=600.0, part="compute")
    assert s.compute.to_numpy() == pytest.approx([0.001] * 10)
    both = benefit_series(run, _requests(), 0.001, 1.0, horizon_s=600.0)
    assert both.benefit.to_numpy() == pytest.approx((both.compute + both.business).to_numpy())
    with pytest.raises(ValueError, match="part must be one of"):
        benefit_series(run, _requests(), 0.001, 1.0, part="revenue")


def _dim(name, value, score, target, weight=0.1, ew=0.1, breached=False, ci=(None, None)):
    return DimensionScore(name, name, value, "ratio", "", score, target, weight, ew, breached, "", *ci)


def test_status_is_never_ok_while_the_value_misses_its_target():
    cfg = AnalysisConfig()
    # resource_cost_share: lower is better, target 0.05, worst 0.3 → 6 % scores 1 − 0.01/0.25 = 0.96
    d = _dim("resource_cost_share", 0.06, 0.96, 0.05)
    assert S.normalise(next(s for s in cfg.dimensions if s.name == d.name), 0.06) == pytest.approx(0.96)
    assert status(d, cfg) == "fair"
    assert status(_dim("resource_cost_share", 0.04, 1.0, 0.05), cfg) == "good"
    assert status(_dim("resource_cost_share", 0.06, 0.96, 0.05, ci=(0.045, 0.07)), cfg) == "good"  # CI reaches it
    assert status(_dim("cache_hit_rate", None, None, 0.8), cfg) == "none"


def test_weight_text_explains_the_base_the_boost_and_the_sharing():
    cfg = AnalysisConfig.load(dynamic_boost=1.0)
    # breached at score 0.1 below breach_below 0.5: × (1 + 1 × (0.5 − 0.1) / 0.5) = × 1.80
    roi = _dim("warmup_roi", -0.6, 0.1, 1.0, weight=0.25, ew=0.414, breached=True)
    other = _dim("cache_hit_rate", 0.7, 0.9, 0.8)
    card = ScoreCard((roi, other, _dim("x", None, None, 0.5)), 0.5)
    assert weight_text(roi, card, cfg) == "base 25.0% × 1.80 (breached) → 41.4%"
    assert weight_text(other, card, cfg) == "base 10.0% → 10.0%"
    assert "shared out over the 2 dimensions with data" in weights_note(card)


def _req(rows):
    return pd.DataFrame(rows, columns=["ts", "tenant", "experiment", "variant", "model", "replica", "sla_met",
                                       "requests", "gpu_s", "conversions", "value"])


def test_a_fixed_three_way_split_with_a_million_requests_is_no_grey_release():
    # B's hourly share wanders 33.0–35.0 % around a fixed third: with 60,000 requests an hour the chi-square
    # test calls that a change (p < 0.001), but no ramp moves it by RAMP_MIN_SHIFT (10 points)
    rows = []
    for h, share in enumerate((0.330, 0.345, 0.324, 0.350, 0.338)):
        n = 60_000
        b = int(n * share)
        rest = n - b
        for v, k in (("A", rest // 2), ("B", b), ("C", rest - rest // 2)):
            rows.append((3600.0 * h + 60, "t", "e", v, "m", "r", "true", k, 1.0, 0, 0.0))
    m = D._penetration({"requests": _req(rows)}, AnalysisConfig())
    assert m.value is None and "no grey release" in m.note


def test_trap_verdicts_leave_a_restarts_warmup_to_warm_set_precision():
    cfg_runs = _runs([("restart", "a", "kv", "s", "replica_restart", "", 100.0, 110.0, 20, 2.0, "ok"),
                      ("sched", "b", "kv", "s", "scheduled", "", 100.0, 110.0, 20, 2.0, "ok"),
                      ("good", "c", "kv", "s", "scheduled", "", 10.0, 20.0, 20, 2.0, "ok")])
    keys = _keys([(r, f"{r}{i}", 50.0 if (r == "good" or i < 1) else INF, INF, 0.1)
                  for r in ("restart", "sched", "good") for i in range(20)])
    frames = {"warmup_runs": cfg_runs, "warmed_keys": keys}
    v = {x.trap: x for x in trap_verdicts(frames, (90.0, 200.0), (0.0, 90.0))}["warmup_timing"]
    # the scheduled run read 1 of 20 (5 %) against the other runs' median: detected, named
    assert v.detected and "sched" in v.evidence and "5%" in v.evidence
    only_restart = {"warmup_runs": cfg_runs[cfg_runs.run_id != "sched"], "warmed_keys": keys}
    v = {x.trap: x for x in trap_verdicts(only_restart, (90.0, 200.0), (0.0, 90.0))}["warmup_timing"]
    assert not v.detected and "timed by the restart" in v.evidence


def test_a_warmups_layers_started_one_after_the_other_are_one_warmup():
    # the demo's restart warm-up: lora at 0 s, prefix_kv 1.6 s, embedding 5.3 s, response 25.3 s, all ending at 45.3 s;
    # the replica's next warm-up starts 600 s later
    runs = _runs([("l", "b-0", "lora", "s", "replica_restart", "", 0.0, 45.3, 100, 0.32, "ok"),
                  ("p", "b-0", "prefix_kv", "s", "replica_restart", "", 1.6, 45.3, 100, 1.5, "ok"),
                  ("e", "b-0", "embedding", "s", "replica_restart", "", 5.3, 45.3, 100, 6.0, "ok"),
                  ("r", "b-0", "response", "s", "replica_restart", "", 25.3, 45.3, 100, 57.6, "ok"),
                  ("n", "b-0", "lora", "s", "replica_restart", "", 645.3, 690.0, 100, 0.3, "ok")])
    w = warmups(runs)
    assert list(w.run_id) == ["n", "l"]
    first = w.set_index("run_id").loc["l"]
    # 0.32 + 1.5 + 6.0 + 57.6 = 65.42 GPU-s, 400 keys, started at the first layer's start
    assert (first.gpu_s, first["keys"], first.started, first.ended, first.runs) == (pytest.approx(65.42), 400, 0.0,
                                                                                    45.3, 4)
    assert first.layer == "embedding+lora+prefix_kv+response"


def test_the_roi_dimension_on_hourly_rollups_says_it_needs_minutes():
    """The same warm-up and traffic read per minute give an ROI; read as hourly rollups (ranges over a
    day) the T+300 s window cannot be cut out of them, and the score says so instead of "no finished
    warm-up" (the overview's score lost its ROI on "everything" with that wrong reason)."""
    runs = _runs([("w", "b-0", "prefix_kv", "s", "scheduled", "", 0.0, 100.0, 10, 10.0, "ok")])
    rows = []
    for k, g in enumerate([2.0, 4.0, 6.0, 4.0, 4.0, 5.0, 5.0], start=1):  # treated GPU-s per minute
        rows.append((100 + 60 * k, "t", "e", "B", "m", "b-0", "true", 10, g, 0, 0.0))
        rows.append((100 + 60 * k, "t", "e", "A", "m", "a-0", "true", 10, 10.0, 0, 0.0))
    minute = _req(rows)
    cfg = AnalysisConfig.load(price_per_gpu_s=0.5)
    m = D._roi({"warmup_runs": runs, "requests": minute}, cfg)
    # saved in (100, 400]: 10·1 − g = [8, 6, 4, 6, 6] = 30 GPU-s = $15 against the run's $5: (15 − 5) / 5
    assert m.value == pytest.approx(2.0)
    hourly = minute.copy()
    hourly.attrs["step_s"] = 3600.0
    m = D._roi({"warmup_runs": runs, "requests": hourly}, cfg)
    assert m.value is None and "needs per-minute requests for its T+300 s windows" in m.note
    assert "hourly rollups" in m.note
