"""The value model: the conversion response to latency (WLS over A/B units, HC1 interval), the SLO
price, and the advisor's input checks and objective choice. Statistics checked by simulation."""

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.advisor import NoRecommendation, advise, check_input
from warmscope.analysis.value import ValueModel, conversion_response, slo_price, value_model


def _units(rng, n=600, slope=-0.08, base=0.6):
    """Units of 1–20 requests; latency 0.5–4 s; each request converts with probability
    (base + slope·latency) / 5 and a conversion is worth 5, so revenue per request has mean
    base + slope·latency: the slope is the one to recover."""
    req = rng.integers(1, 21, n)
    lat = rng.uniform(0.5, 4.0, n)
    p = (base + slope * lat) / 5.0
    conv = rng.binomial(req, p)
    return pd.DataFrame(
        {
            "requests": req,
            "latency_sum": lat * req,
            "ttft_sum": 0.1 * lat * req,
            "conversions": conv,
            "value": 5.0 * conv,
        }
    )


def test_the_conversion_response_recovers_a_known_slope_and_its_interval_covers_95_percent():
    rng = np.random.default_rng(7)
    hits, widths = 0, []
    for _ in range(400):
        el = conversion_response(_units(rng))
        hits += el.ci_low <= -0.08 <= el.ci_high
        widths.append(el.ci_high - el.ci_low)
    # 400 simulated data sets: a 95 % interval covers the true slope in 380 ± 2·√(400·0.95·0.05) ≈ 380 ± 9
    assert 366 <= hits <= 394
    el = conversion_response(_units(np.random.default_rng(1), n=5000))
    assert el.slope == pytest.approx(-0.08, abs=0.02) and el.significant
    # revenue per request at the mean latency 2.25 s: 0.6 − 0.08 · 2.25 = 0.42
    assert el.revenue_per_request == pytest.approx(0.42, abs=0.02)


def test_the_conversion_response_says_what_is_missing():
    rng = np.random.default_rng(2)
    assert (
        conversion_response(pd.DataFrame())
        == "no conversion data: no A/B unit records in the range"
    )
    u = _units(rng)
    assert conversion_response(u.assign(conversions=0, value=0.0)).startswith("no conversion data")
    assert conversion_response(u.head(10)).startswith("not enough points: 10 A/B units")
    vm = value_model(0.001, u.assign(conversions=0, value=0.0))
    assert vm.kind == "gpu_s" and vm.per_ttft_s == 0 and "latency not priced" in vm.prices()


def test_the_slo_price_is_penalty_times_the_ttft_density_at_the_target():
    # 1,000 requests: 600 under 0.5 s, 200 in (0.5, 1.0], 150 in (1.0, 2.0], 50 above
    h = pd.DataFrame(
        {
            "metric": "gen_ai.server.time_to_first_token",
            "le": [0.5, 1.0, 2.0, np.inf],
            "count": [600, 200, 150, 50],
        }
    )
    v, lo, hi = slo_price(h, target_s=1.0, penalty=2.0)
    # the bucket holding 1.0 s is (0.5, 1.0] and the next (1.0, 2.0]: (200 + 150) / 1000 over 1.5 s
    # = 0.2333 per s; × 2.0 = 0.4667 per request-second
    assert v == pytest.approx(0.35 / 1.5 * 2.0)
    # binomial: se = √(0.35 · 0.65 / 1000) = 0.01508; ± 1.96 se over 1.5 s, × 2
    assert hi - v == pytest.approx(1.959964 * 0.015083 / 1.5 * 2.0, rel=1e-3) and lo < v < hi
    vm = value_model(0.001, None, h, 1.0, 2.0, prefer="slo")
    assert vm.kind == "slo" and vm.per_hit(0.1)[0] == pytest.approx(0.1 * 0.001 + 0.1 * v)
    assert slo_price(pd.DataFrame(), 1.0, 2.0) == "no TTFT histogram in the range"


def _frames(hours=3.0, layers=("response", "embedding"), runs=True):
    ts = np.arange(0.0, hours * 3600, 60.0) + 1_795_824_000.0
    lk = pd.concat(
        [
            pd.DataFrame(
                {
                    "ts": ts,
                    "layer": ly,
                    "result": r,
                    "variant": "A",
                    "replica": "a-0",
                    "family": "f",
                    "count": 5,
                }
            )
            for ly in layers
            for r in ("hit", "miss")
        ],
        ignore_index=True,
    )
    wr = pd.DataFrame(
        {
            "run_id": ["r1"],
            "replica": ["a-0"],
            "layer": ["response"],
            "trigger": ["replica_start"],
            "started": [ts[0]],
            "ended": [ts[0] + 10],
            "keys": [10],
            "bytes": [1],
            "gpu_s": [1.0],
        }
    )
    return {"lookups": lk, "warmup_runs": wr if runs else wr.iloc[:0]}


def test_bad_input_gives_one_sentence_and_no_recommendation():
    assert check_input(_frames()) is None
    short = check_input(_frames(hours=1.0))
    assert (
        short.startswith("Too little data: 1.0 h of lookups") and short.count(".") == 2
    )  # "1.0" and the end
    one = check_input(_frames(layers=("embedding",)))
    assert one.startswith("Only embedding replayable lookups") and "response layer too" in one
    assert check_input(_frames(runs=False)).startswith("No warm-up runs in the range")
    assert check_input({"lookups": pd.DataFrame()}).startswith("No lookups")
    for fr in (_frames(hours=1.0), _frames(layers=("response",)), _frames(runs=False)):
        with pytest.raises(NoRecommendation) as e:
            advise(fr, values=ValueModel("conversion", 0.001, 0.05, (0.04, 0.06), "test"))
        assert e.value.fidelity is None and str(e.value) == check_input(fr)
    # asking for value without conversion data, or slo without an SLO: one sentence, before any replay
    with pytest.raises(NoRecommendation, match="No conversion data to price latency"):
        advise(_frames(), objective="value")
    with pytest.raises(NoRecommendation, match="No SLO price"):
        advise(_frames(), objective="slo")


def test_experiment_roi_by_hand_and_its_interval_by_simulation():
    from warmscope.analysis.roi import experiment_roi

    units = pd.DataFrame(
        {
            "variant": ["A", "A", "B", "B"],
            "requests": [10, 30, 20, 20],
            "gpu_s": [2.0, 6.0, 3.0, 3.0],
        }
    )
    runs = pd.DataFrame({"replica": ["b-0", "b-1", "a-0"], "gpu_s": [1.0, 1.0, 9.0]})
    t = experiment_roi(units, runs, {"a-0": "A", "b-0": "B", "b-1": "B"}, "A")
    r = t.iloc[0]
    # A: 8 GPU-s / 40 requests = 0.2; B: 6 / 40 = 0.15; saved (0.2 − 0.15) × 40 = 2.0 GPU-s for the
    # 2.0 GPU-s of B's two runs (a-0's run is A's, not counted): ROI (2 − 2) / 2 = 0
    assert (r.variant, r.gpu_s_saved, r.warm_gpu_s, r.runs, r.roi) == (
        "B",
        pytest.approx(2.0),
        2.0,
        2,
        pytest.approx(0.0),
    )
    # every unit sits on its arm's ratio, so the interval has zero width
    assert r.roi_low == pytest.approx(0.0) and r.roi_high == pytest.approx(0.0)
    # coverage by simulation: units of 1–10 requests, GPU-s per request ~ Gamma with mean 0.2 (A) and
    # 0.19 (B); true saved = 0.01 × B's requests
    rng = np.random.default_rng(3)
    cover = 0
    for _ in range(300):
        n = rng.integers(1, 11, 800)
        arm = np.where(np.arange(800) < 400, "A", "B")
        mean = np.where(arm == "A", 0.2, 0.19)
        g = rng.gamma(2.0 * n, mean / 2.0)
        u = pd.DataFrame({"variant": arm, "requests": n, "gpu_s": g})
        t = experiment_roi(u, runs, {"b-0": "B"}, "A").iloc[0]
        truth = 0.01 * n[arm == "B"].sum()
        half = (t.saved_high - t.saved_low) / 2
        cover += abs(t.gpu_s_saved - truth) <= half
    # 300 runs: 95 % ± 2·√(300·0.95·0.05)/300 ≈ 95 % ± 2.5 %
    assert 0.92 * 300 <= cover <= 0.98 * 300
