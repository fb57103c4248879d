"""The replay against the simulator, and the proof: a simulator A/B on a fresh seed where pool B runs the
advisor's recommendation and pool A the defaults."""

import json

import numpy as np
import pytest
from warmscope.analysis.advisor import advise
from warmscope.analysis.replay import TOLERANCE, calibrate, replay
from warmscope.simulator import SimConfig
from warmscope.simulator.advisor_proof import prove
from warmscope.sources import EmbeddedSource

from tests.conftest import simulated_store

pytestmark = pytest.mark.slow  # simulates or builds first: tens of seconds on two cores

HOURS, RPS = 3.0, 6.0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three simulated hours, both pools on the predictive strategy; pool B keeps responses 4 h instead of 1 h."""
    path = tmp_path_factory.mktemp("advisor") / "recorded.sqlite"
    simulated_store(path, SimConfig.load(None, hours=HOURS, rps=RPS, seed=3, strategy_a="predictive",
                                         strategy_b="predictive", b_response_ttl_s=14400),
                    workers=1)  # one process: one run-id sequence
    return path, EmbeddedSource(path).frames(["lookups", "warmup_runs", "warmed_keys", "hot_keys"])


def _hit_rate(lk, variant, layer):
    x = lk[(lk.variant == variant) & (lk.layer == layer) & lk.result.isin(["hit", "miss"])]
    return x.loc[x.result == "hit", "count"].sum() / x["count"].sum()


def test_replay_calibrated_on_one_pool_predicts_the_other_pools_simulated_hit_rate(recorded):
    _, fr = recorded
    lk = fr["lookups"]
    m = calibrate(fr, variant="A")
    assert m.base.response_ttl_s == 3600  # read from pool A's warmed keys
    assert replay(m, m.base).hit_rate["response"] == pytest.approx(_hit_rate(lk, "A", "response"), abs=0.005)
    # what-if: pool B's TTL; the simulator ran it in pool B on the same traffic
    from dataclasses import replace

    what_if = replay(m, replace(m.base, response_ttl_s=14400)).hit_rate
    sim_b = _hit_rate(lk, "B", "response")
    assert sim_b - _hit_rate(lk, "A", "response") > 0.03  # the TTL matters here
    assert abs(what_if["response"] - sim_b) <= TOLERANCE
    assert abs(what_if["embedding"] - _hit_rate(lk, "B", "embedding")) <= TOLERANCE


def test_recommendation_beats_the_defaults_in_a_simulator_ab_on_a_fresh_seed(recorded, tmp_path):
    _, fr = recorded
    rec = advise(fr, variant="A", n_init=8, n_iter=8, seed=0)
    assert rec.gain > 0 and rec.outcome.net_gpu_s > rec.base_outcome.net_gpu_s
    json.dumps(rec.as_dict(), default=str)  # the CLI's JSON
    proof = prove(rec.params, str(tmp_path / "proof.sqlite"), hours=HOURS, rps=RPS, seed=4,
                  peak_at=rec.model.peak_at)
    print(json.dumps({"recommended": rec.params.as_dict(), "gain_gpu_s": rec.gain, "gain_sd": rec.gain_sd,
                      "proof": proof.as_dict()}, indent=1, default=str))
    assert proof.wins, proof.results
    lo, hi = proof.net_gpu_s[1], proof.net_gpu_s[2]
    kv = proof.results["hit rate (prefix_kv)"]
    # a win is a 95 % CI above zero on one of the two
    assert lo > 0 or kv["abs_low"] > 0
    assert np.isfinite(hi)
