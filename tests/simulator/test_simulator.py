"""The simulator: determinism, trap signatures, warm-up effect, A/B balance,
and that the collectors saw exactly what the simulator did."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from warmscope.collectors import EmbeddedStore
from warmscope.collectors.config import CollectorConfig
from warmscope.simulator import SimConfig, Simulation, parse_fault, simulate

T0 = SimConfig().start
SMALL = dict(hours=1.0, rps=6.0, tenants=6, replicas=2, seed=5, peak_warmup_at_h=-1)


def _run(tmp_path, name, faults=(), workers=1, collector_config=None, **over):
    cfg = SimConfig.load(**{**SMALL, **over})
    path = tmp_path / f"{name}.sqlite"
    kw = {"collector_config": collector_config} if collector_config else {}
    summary = simulate(cfg, path, [parse_fault(f) for f in faults], workers=workers, **kw)
    return summary, EmbeddedStore(path, readonly=True)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


FRAMES = ("lookups", "requests", "histograms", "hot_keys", "ab_units", "ab_lookups", "warmup_runs", "warmed_keys",
          "early_keys", "writes", "misses")


@pytest.mark.slow
def test_same_seed_gives_identical_store_and_two_workers_match_one(tmp_path):
    _, a = _run(tmp_path, "a", hours=0.5)
    _, b = _run(tmp_path, "b", hours=0.5)
    _, c = _run(tmp_path, "c", hours=0.5, workers=2)
    _, d = _run(tmp_path, "d", hours=0.5, seed=6)
    for f in FRAMES:
        fa = _sorted(a.frame(f))
        pd.testing.assert_frame_equal(fa, _sorted(b.frame(f)), obj=f)
        pd.testing.assert_frame_equal(fa, _sorted(c.frame(f)), obj=f)
    assert not a.frame("lookups")["count"].equals(d.frame("lookups")["count"])


@pytest.mark.slow
def test_collector_totals_equal_the_simulators_own_counts(tmp_path):
    summary, st = _run(tmp_path, "own", hours=0.5)
    df = st.frame("lookups").groupby(["replica", "layer", "result"])["count"].sum()
    own = pd.Series(summary.lookups)
    own.index.names = ["replica", "layer", "result"]
    pd.testing.assert_series_equal(df.sort_index(), own.sort_index().astype(df.dtype), check_names=False)
    assert st.frame("requests")["requests"].sum() == summary.requests
    assert summary.requests > 5000


@pytest.mark.slow
def test_ab_assignment_is_balanced(tmp_path):
    summary, st = _run(tmp_path, "srm", hours=1.0)
    units = st.units("warmup-strategy")
    n = units.groupby("variant").size()
    assert n["A"] == summary.units["A"] and n["B"] == summary.units["B"]
    p = stats.chisquare([n["A"], n["B"]]).pvalue
    assert p > 0.01, (n.to_dict(), p)


def _hit_rate(df):
    hm = df[df.result.isin(["hit", "miss"])]
    return hm.loc[hm.result == "hit", "count"].sum() / hm["count"].sum()


def test_warmup_raises_early_traffic_hit_rate(tmp_path):
    _, st = _run(tmp_path, "warm", hours=0.5, strategy_a="none", strategy_b="static_topk")
    df = st.frame("lookups")
    # The first 5 minutes after weights load; the prefix-KV layer is left out:
    # shared system-prompt blocks fill themselves within seconds either way.
    early = df[(df.ts > T0 + 120) & (df.ts <= T0 + 420) & df.layer.isin(["response", "embedding"])]
    a = _hit_rate(early[early.variant == "A"])
    b = _hit_rate(early[early.variant == "B"])
    assert b > a + 0.1, (a, b)
    runs = st.frame("warmup_runs")
    assert set(runs.strategy) == {"static_topk"} and set(runs.replica) == {"b-0", "b-1"}
    assert (runs.status == "ok").all() and runs.gpu_s.gt(0).all()


def _in_window(ts, start_min, end_min, tick=60):
    # Rows are stamped at the end of their tick.
    return (ts > T0 + start_min * 60) & (ts <= T0 + end_min * 60 + tick)


@pytest.mark.slow
def test_bypass_trap_only_in_scope_and_window(tmp_path):
    _, st = _run(tmp_path, "bypass", ["bypass:tenant=acme,layer=response@00:20-00:40"])
    df = st.frame("lookups")
    bp = df[df.result == "bypass"]
    assert bp["count"].sum() > 50
    assert set(bp.tenant) == {"acme"} and set(bp.layer) == {"response"}
    assert _in_window(bp.ts, 20, 40).all()
    truth = st.frame("faults")
    assert truth.trap.tolist() == ["bypass"] and truth.scope[0] == {"tenant": "acme", "layer": "response"}
    assert truth.start[0] == T0 + 1200 and truth.end[0] == T0 + 2400


@pytest.mark.slow
def test_tenant_isolation_trap_produces_cross_tenant_reads(tmp_path):
    cc = CollectorConfig.load(env={}, key_secret="warmscope-sim", hot_key_window_s=600, side_flush_s=120)
    _, st = _run(tmp_path, "iso", ["tenant_isolation:layer=response@00:20-00:40"], collector_config=cc)
    hk = st.frame("hot_keys")
    hk = hk[hk.layer != "weights"]  # model weights are shared by design
    shared = hk.groupby(["window", "layer", "key_hash"]).tenant.nunique()
    shared = shared[shared > 1].reset_index()
    assert len(shared) > 0
    assert set(shared.layer) == {"response"}
    assert shared.window.between(T0 + 1200 - 600, T0 + 2400).all()


@pytest.mark.slow
def test_kv_fixed_len_trap_makes_short_prompts_miss_in_scope(tmp_path):
    _, st = _run(tmp_path, "kvlen", ["kv_fixed_len:replica=a-0@00:20-00:40;min_tokens=2048"])
    df = st.frame("lookups")
    kv = df[(df.layer == "prefix_kv") & df.length_bucket.isin(["512", "1024"])]
    inside = kv[_in_window(kv.ts, 21, 39)]
    assert _hit_rate(inside[inside.replica == "a-0"]) == 0
    assert _hit_rate(inside[inside.replica == "a-1"]) > 0.2
    after = kv[kv.ts > T0 + 45 * 60]
    assert _hit_rate(after[after.replica == "a-0"]) > 0.2


@pytest.mark.slow
def test_key_explosion_trap_creates_new_families_only_in_scope(tmp_path):
    _, st = _run(tmp_path, "explode", ["key_explosion:tenant=globex@00:20-00:40"])
    df = st.frame("lookups")
    new = df[df.family.str.count(r"\*") >= 3]
    assert new["count"].sum() > 20
    assert set(new.tenant) == {"globex"} and set(new.layer) == {"response"}
    assert _in_window(new.ts, 20, 40).all()


@pytest.mark.slow
def test_dynamic_tokenisation_trap_drops_hit_rate_of_its_template(tmp_path):
    probe = Simulation(SimConfig.load(**SMALL), tmp_path / "probe.sqlite")
    counts: dict[str, int] = {}
    for t in probe.tenants:
        for i in t.templates:
            counts[i] = counts.get(i, 0) + 1
    from warmscope.simulator.traffic import TEMPLATES

    tpl = TEMPLATES[max(counts, key=counts.get)].name
    _, st = _run(tmp_path, "tok", [f"dynamic_tokenisation:template={tpl}@00:20-00:40"])
    df = st.frame("lookups")
    fam = df[df.family == f"kv:{tpl}:sys:*"]
    inside = _hit_rate(fam[_in_window(fam.ts, 22, 39)])
    before = _hit_rate(fam[(fam.ts > T0 + 10 * 60) & (fam.ts <= T0 + 20 * 60)])
    assert inside < 0.5 * before, (inside, before)
    other = df[(df.layer == "prefix_kv") & df.family.str.endswith(":sys:*") & (df.family != f"kv:{tpl}:sys:*")]
    assert _hit_rate(other[_in_window(other.ts, 22, 39)]) > 0.5 * before


@pytest.mark.slow
def test_warmup_out_of_step_trap_makes_one_replica_cold(tmp_path):
    _, st = _run(tmp_path, "oos", ["warmup_out_of_step:replica=b-1@00:20-00:40"])
    df = st.frame("lookups")
    late = df[(df.layer == "weights") & (df.result == "miss") & (df.ts > T0 + 300)]
    assert late["count"].sum() > 0
    assert set(late.replica) == {"b-1"} and _in_window(late.ts, 20, 40).all()
    runs = st.frame("warmup_runs")
    restart = runs[runs.trigger == "replica_restart"]
    # the forced finish stretches the layers: the last one ends at the window end
    assert set(restart.replica) == {"b-1"} and restart.ended.max() == T0 + 2400


@pytest.mark.slow
def test_warmup_timing_trap_collapses_precision(tmp_path):
    _, st = _run(tmp_path, "timing", ["warmup_timing:replica=b-0,layer=response@00:20-00:40;ttl_s=60"],
                 rps=3.0)
    runs = st.frame("warmup_runs")
    w = st.frame("warmed_keys").merge(runs[["run_id", "trigger", "layer"]], on=["run_id", "layer"])
    w = w[w.layer == "response"]
    precision = w.assign(hit=w.hits > 0).groupby("trigger").hit.mean()
    assert set(runs[runs.trigger == "scheduled"].replica) == {"b-0"}
    assert precision["scheduled"] < 0.5 * precision["replica_start"], precision.to_dict()


def test_fault_specs_are_validated_with_clear_messages():
    with pytest.raises(ValueError, match="unknown trap 'bypas'"):
        parse_fault("bypas:tenant=a")
    with pytest.raises(ValueError, match="unknown scope dimension 'tennant'"):
        parse_fault("bypass:tennant=a")
    with pytest.raises(ValueError, match="must end after it starts"):
        parse_fault("bypass@10:00-09:00")
    f = parse_fault("kv_fixed_len:replica=a-0@01:30-02:00;min_tokens=4096")
    assert (f.start, f.end, f.params) == (5400, 7200, {"min_tokens": 4096.0})
    for bad, why in (("@1.5-2", "not HH:MM"), ("@25:00-26:00", "time of day"), ("@9:99-10:00", "minute 99"),
                     (";min_tokens=abc", "positive integer")):
        with pytest.raises(ValueError, match=why):
            parse_fault("kv_fixed_len:replica=a-0" + (bad if bad.startswith("@") else "@01:00-02:00" + bad))


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="simulator.strategy_b must be one of"):
        SimConfig.load(strategy_b="magic")
    with pytest.raises(ValueError, match="simulator.hours must be > 0"):
        SimConfig.load(hours=0)


def test_realtime_mode_paces_to_the_wall_clock(tmp_path):
    import time

    cfg = SimConfig.load(hours=20 / 3600, rps=5.0, tenants=2, replicas=1, tick_s=5.0, peak_warmup_at_h=-1)
    t = time.time()
    s = Simulation(cfg, tmp_path / "rt.sqlite", realtime=True, speed=10.0).run()
    # 20 virtual s at 10x take at least 2 s (one 5 s tick of slack: 1.5 s); flat out it is ~0.4 s
    assert time.time() - t >= 1.5
    ts = EmbeddedStore(tmp_path / "rt.sqlite").frame("lookups").ts
    assert ts.min() >= t - 1 and ts.max() <= t + 25  # wall-clock start, virtual time: 20 s of it (+ a tick)
    assert s.requests > 0
    assert np.isfinite(ts).all()


@pytest.mark.slow
def test_pools_can_differ_in_cache_capacity(tmp_path):
    _, st = _run(tmp_path, "cap", hours=0.5, strategy_b="none", b_kv_capacity_tokens=4096)
    df = st.frame("lookups")
    kv = df[(df.layer == "prefix_kv") & (df.ts > T0 + 300)]
    assert _hit_rate(kv[kv.variant == "B"]) < _hit_rate(kv[kv.variant == "A"]) - 0.1


# ------------------------------------------- readiness, layered warm-up, demo world
def test_replicas_are_ready_before_traffic_and_warm_up_in_layers(tmp_path):
    _, st = _run(tmp_path, "ready", hours=0.25, strategy_a="none", strategy_b="static_topk")
    lk = st.frame("lookups")
    # Behind the readiness gate no request meets unloaded weights (before: every request of the first 120 s).
    assert lk[(lk.layer == "weights") & (lk.result == "miss")]["count"].sum() == 0
    runs = st.frame("warmup_runs")
    b0 = runs[(runs.replica == "b-0") & (runs.trigger == "replica_start")].sort_values("started")
    # weights, then LoRA → prefix KV → embeddings → responses, each layer starting when the previous ends
    assert b0.layer.tolist() == ["lora", "prefix_kv", "embedding", "response"]
    assert np.allclose(b0.started.to_numpy()[1:], b0.ended.to_numpy()[:-1])
    assert b0.ended.max() <= T0  # done before the day's first request
    # 4 adapters × 0.4 s load = 1.6 s for the LoRA layer
    assert b0.ended.iloc[0] - b0.started.iloc[0] == pytest.approx(1.6)


@pytest.mark.slow
def test_rolling_restarts_cut_over_to_a_warmed_instance(tmp_path):
    _, st = _run(tmp_path, "roll", hours=1.0, strategy_a="none", strategy_b="static_topk", restart_every_h=0.5)
    runs = st.frame("warmup_runs")
    r = runs[runs.trigger == "replica_restart"]
    # period 1800 s, staggered by i/n: b-0 at 900 s and 2700 s, b-1 at 1800 s; warm-up after the 120-s load
    first = r.groupby("replica").started.min()
    assert first["b-0"] == pytest.approx(T0 + 900 + 120) and first["b-1"] == pytest.approx(T0 + 1800 + 120)
    assert set(r.replica) == {"b-0", "b-1"}  # pool A (none) restarts too, with nothing to warm
    lk = st.frame("lookups")
    assert lk[(lk.layer == "weights") & (lk.result == "miss")]["count"].sum() == 0  # the old instance served
    # ... while the surge instance warmed (1020 s to about 1082 s): b-0 is not taken out of rotation then.
    # (Taken out, it served 56 of pool B's 464 lookups in that minute; in rotation, 244.)
    minute = lk[lk.replica.str.startswith("b-") & (lk.ts == T0 + 1080)].groupby("replica")["count"].sum()
    assert minute["b-0"] / minute.sum() > 0.35, minute.to_dict()


def test_content_drift_moves_popularity_beyond_the_head_only():
    from warmscope.simulator.traffic import EVERGREEN, drift

    cfg = SimConfig.load(content_drift_h=1.0)
    ranks = np.arange(30)
    assert (drift(ranks, 4000, cfg, 1800.0, 977) == ranks).all()  # first hour: shift 0
    moved = drift(ranks, 4000, cfg, 3600.0 * 2, 977)  # third hour: shift 2 × 977 = 1954
    assert (moved[:EVERGREEN] == ranks[:EVERGREEN]).all() and (moved[EVERGREEN:] == ranks[EVERGREEN:] + 1954).all()
    assert (drift(ranks, 4000, SimConfig.load(), 7200.0, 977) == ranks).all()  # off by default


@pytest.mark.slow
def test_a_third_pool_splits_sessions_three_ways(tmp_path):
    summary, st = _run(tmp_path, "abc", hours=0.25, strategy_b="static_topk", strategy_c="predictive")
    n = st.units("warmup-strategy").groupby("variant").size()
    assert set(n.index) == {"A", "B", "C"} and n.to_dict() == summary.units
    assert stats.chisquare(n.to_numpy()).pvalue > 0.01, n.to_dict()
    runs = st.frame("warmup_runs")
    # Pool C's replicas (c-0, c-1) run the third strategy; pool A (none) warms nothing.
    assert set(runs[runs.replica.str.startswith("c-")].strategy) == {"predictive"}
    assert set(runs[runs.replica.str.startswith("b-")].strategy) == {"static_topk"}
    assert not runs.replica.str.startswith("a-").any()
    with pytest.raises(ValueError, match="simulator.strategy_c must be one of"):
        SimConfig.load(strategy_c="magic")
    assert SimConfig.load().arms == ("A", "B")



@pytest.mark.parametrize("arms", [{}, {"strategy_c": "predictive"}])
def test_every_session_is_in_the_variant_its_id_hashes_to(tmp_path, arms):
    """The serving loop hashes a new session's variant itself (the CRC-32 of "<experiment>:" carried on over
    the id): every session it kept is in traffic.variant_of's variant, with two arms and with three, and the
    loop's request count is every arrival's."""
    from warmscope.simulator.traffic import variant_of

    cfg = SimConfig.load(**{**SMALL, "hours": 0.25, "experiment": "ünïcode-expt 7", **arms})
    sim = Simulation(cfg, EmbeddedStore(tmp_path / "s.sqlite"))
    summary = sim.run()
    sessions = [s for lst in sim.sessions.values() for s in lst]
    assert len(sessions) > 100
    assert all(s[2] == variant_of(cfg.experiment, s[0], len(cfg.arms)) for s in sessions)
    assert {s[2] for s in sessions} == set(cfg.arms)
    assert sim._req_id == summary.requests  # one process serves every pool: every arrival is a request


def test_fewer_workers_than_pools_share_them_out_by_cost(tmp_path):
    """Three pools on two workers: the predictive pool (the costliest) alone, the other two together; the
    store is the one three workers write, one per pool (three 15-minute pools, every frame equal; a single
    process numbers warm-up runs across its pools instead, so its run ids differ)."""
    from warmscope.simulator.run import _groups

    three = {"strategy_b": "static_topk", "strategy_c": "predictive"}
    cfg = SimConfig.load(**{**SMALL, **three})
    assert _groups(cfg, 2) == [("C",), ("A", "B")]
    assert _groups(cfg, 3) == _groups(cfg, 5) == [("A",), ("B",), ("C",)]
    assert _groups(cfg, 1) == [("A", "B", "C")]
    assert _groups(SimConfig.load(**SMALL), 2) == [("A",), ("B",)]
    three_w, a = _run(tmp_path, "three", hours=0.25, workers=3, **three)
    two, b = _run(tmp_path, "two", hours=0.25, workers=2, **three)
    assert three_w.units == two.units and set(two.units) == {"A", "B", "C"}
    assert not b.frame("warmup_runs").empty
    for f in FRAMES:
        pd.testing.assert_frame_equal(_sorted(a.frame(f)), _sorted(b.frame(f)), obj=f)
