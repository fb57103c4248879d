"""Replay fidelity: restarts read from warm-up runs and the KV-usage gauge, the fidelity check per
15-minute bucket, and the spreading of a warm-up's extra hits over the buckets of their first reads.
Synthetic models and frames, no simulation (tests/simulator/test_replay_fidelity_sim.py replays a
simulated store)."""

import numpy as np
import pandas as pd
from warmscope.analysis.replay import (
    BUCKET_S,
    Model,
    Params,
    _warm_extra,
    curves,
    fidelity,
    restarts,
)

DAY0 = 1_795_824_000.0


def test_one_restart_per_cluster_of_layer_runs_and_one_per_gauge_drop():
    # a restart's warm-up opens one run per layer (4 here), 10 s apart, each 5 s long: one restart, at the
    # cluster's last end (1030 + 5 = 1035), not four (the old replay warmed four times per restart)
    runs = pd.DataFrame(
        {
            "replica": ["b-0"] * 5,
            "trigger": ["replica_restart"] * 4 + ["forecast_peak"],
            "started": [1000.0, 1010.0, 1020.0, 1030.0, 2000.0],
            "ended": [1005.0, 1015.0, 1025.0, 1035.0, 2005.0],
        }
    )
    # pool A records no runs; its KV usage falls from 0.9 to 0 at ts 3000 (a restart), and b-0's falls at
    # 1100, within RESTART_GAP_S (600 s) of its run cluster: the same restart
    gauges = pd.DataFrame(
        {
            "metric": "warmscope.gpu.memory.usage_ratio",
            "replica": ["a-0"] * 4 + ["b-0"] * 3,
            "ts": [2880.0, 2940.0, 3000.0, 3060.0, 1040.0, 1100.0, 1160.0],
            "value": [0.9, 0.95, 0.0, 0.1, 0.8, 0.0, 0.05],
        }
    )
    rs = restarts(runs, gauges, t0=0.0)
    assert rs == {"b-0": [0.0, 1035.0], "a-0": [0.0, 3000.0]}
    # a restart within RESTART_GAP_S of t0 is the start itself
    assert restarts(runs, gauges, t0=500.0)["b-0"] == [500.0]
    # no signal: no entry (the replay then takes t0 only); a forecast_peak run is not a restart
    assert restarts(runs[runs.trigger == "forecast_peak"], None, t0=0.0) == {}
    # a restart before t0 counts as t0
    assert restarts(runs, None, t0=1100.0) == {"b-0": [1100.0]}


def _model() -> Model:
    """One embedding cache (LRU, capacity 300) of 1,000 Zipf(1) keys at 0.5 req/s, a day, no restarts."""
    idx = DAY0 + BUCKET_S * np.arange(96)
    rates = pd.DataFrame({("E/e-0", "f"): np.full(96, 0.5)}, index=idx)
    rates.columns = pd.MultiIndex.from_tuples(rates.columns)
    m = Model(
        rates={"embedding": rates},
        instances={"embedding": ["E/e-0"]},
        s={"embedding": 1.0},
        catalog={"embedding": 1000},
        capacity={"embedding": 300.0},
        cost_per_key={"embedding": 0.015},
        bytes_per_key={"embedding": 1.0},
        recorded_hit_rate={"embedding": 0.5},
        starts={"E/e-0": [DAY0]},
        peak_at=12 * 3600.0,
        weights_load_s=0.0,
        t0=DAY0,
        t1=DAY0 + 86400.0,
        base=Params(warm_keys=200, lambda_per_s=1e-3, lead_s=900.0),
    )
    return m


def _record_as_replayed(m: Model) -> pd.DataFrame:
    cv = curves(m, m.base)
    req = cv["requests"].to_numpy()
    m.recorded["embedding"] = pd.DataFrame(
        {"hits": cv["hit_rate"].to_numpy() * req, "requests": req}, index=m.rates["embedding"].index
    )
    return cv


def test_fidelity_passes_on_its_own_replay_and_fails_when_a_fifth_of_buckets_are_off():
    m = _model()
    _record_as_replayed(m)
    f = fidelity(m)
    # 96 buckets of 0.5 req/s × 900 s = 450 lookups each (≥ 100: all scored), all within 0 points
    assert f.ok and f.table.loc[0, "buckets"] == 96 and f.table.loc[0, "share"] == 1.0
    assert "reproduces the recorded traffic" in f.sentence()
    # move the recorded hit rate of every 5th bucket (20 of 96) by 10 points: 76/96 = 79 % within, < 90 %
    rec = m.recorded["embedding"]
    off = np.arange(96) % 5 == 0
    rec.loc[off, "hits"] = np.minimum(
        rec.loc[off, "hits"] + 0.10 * rec.loc[off, "requests"], rec.loc[off, "requests"]
    )
    f = fidelity(m)
    assert not f.ok and f.table.loc[0, "within"] == 96 - off.sum() == 76
    assert f.sentence().startswith(
        "The replay does not reproduce the recorded traffic (embedding 79% of 96 buckets"
    )
    # a known fault window over those buckets takes them out of the score: 76 of 76 within
    m.faults = [(float(t), float(t) + 1.0) for t in m.rates["embedding"].index[off]]
    f = fidelity(m)
    assert f.ok and f.table.loc[0, "buckets"] == 76 and f.table.loc[0, "faulted"] == 20
    # buckets with fewer than 100 lookups are not scored
    f = fidelity(m, min_requests=500.0)
    assert not f.ok and f.table.loc[0, "buckets"] == 0 and "has no bucket" in f.sentence()


def test_a_warm_up_s_extra_hits_land_in_the_buckets_of_their_first_reads():
    """The old replay put all of a warm-up's extra hits in the bucket it ran in, which gave the 0 %/100 %
    swing; now they follow the first reads: their sum is still the warm-up's extra hits."""
    m = _model()
    ev: list = []
    e, runs = _warm_extra(m, "embedding", 1.0, m.base, np.random.default_rng(0), ev)
    assert runs == 2  # the start at DAY0 and the pre-peak trigger at 11:45
    spread = sum(float(v.sum()) for _, v in ev)
    assert abs(spread - e) < 1e-6 * e
    first = ev[0][1]
    # the warmed keys are read at 0.5 × p_k req/s each (p_1 = 1/H(1000) ≈ 0.134: within a minute; rank
    # 200, p ≈ 0.00067: once per ~50 min) until the LRU evicts them unread after its characteristic time
    # (a few hundred seconds here), so the extra hits fall in the warm-up's bucket and the next, not all
    # in the first as before
    assert first[0] > 0 and first[1] > 0.1 * first.sum() and first[2:].sum() < 1e-9


def test_the_wait_behind_a_gated_warm_up_grows_with_the_square_of_its_length():
    from dataclasses import replace

    from warmscope.analysis.replay import gate_wait

    m = _model()
    m.warmed = frozenset({"E/e-0"})
    m.gated = {"e-0": [DAY0, DAY0 + 3600.0], "x-9": [DAY0]}  # x-9 does not warm up: not counted
    m.sec_per_key = {"embedding": 0.5}
    m.req_rate = {"e-0": 2.0, "x-9": 100.0}
    # 200 keys × 0.5 s = a 100-s gate; 2 req/s arrive and wait 50 s on average: 2 · 100² / 2 = 10,000
    # request-seconds per start, two starts
    assert gate_wait(m, m.base, "embedding") == 20_000.0
    # twice the keys, four times the wait
    assert gate_wait(m, replace(m.base, warm_keys=400), "embedding") == 80_000.0
    assert gate_wait(m, m.base, "response") == 0.0  # no recorded duration for that layer
