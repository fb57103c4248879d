"""The paired warm-up evaluation: a trace worked by hand (one hot prefix), warm sets that are
prefix-closed and nested, the read-chance formula by hand, the recommendation's notes, and bad
input refused with one sentence."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from warmscope.analysis.whatif.warmup import (
    _flat,
    _history,
    advise,
    evaluate,
    read_chance,
    recommend,
    warm_order,
    warmed_cached_tokens,
)
from warmscope.model.blocktrace import TraceBuilder, TraceError, chain_ids

B = 16
P = chain_ids([1, 2, 3])  # the hot prefix: three blocks


def _hot_trace(minutes: float = 40, seed: int = 0):
    """Every 10 s a request of the hot prefix plus a block of its own (4 blocks, 64 tokens);
    every 2 s a request of two blocks nobody reads again."""
    rng = np.random.default_rng(seed)
    tb = TraceBuilder(B, "hand")
    t = 0.0
    n = 0
    while t < minutes * 60:
        if round(t) % 10 == 0:
            tb.add(t, 4 * B, 1, P + chain_ids([1, 2, 3, 10_000 + n])[3:])
        else:
            u = 50_000 + 4 * n + int(rng.integers(1 << 20)) * 4
            tb.add(t, 2 * B, 1, chain_ids([u, u + 1]))
        t += 2.0
        n += 1
    return tb.build()


def test_one_hot_prefix_worked_by_hand():
    """An emptied cache misses the hot prefix once (the first request after the restart, within
    10 s), then holds it. Warming its three blocks turns that miss into a hit: cap (64-1)//16 = 3
    blocks = 48 tokens saved per restart, within any horizon from 1 min, by every strategy that
    warms it and by the oracle."""
    tr = _hot_trace()
    ev = evaluate(tr, 1000, [3], restarts=30, horizons=(60.0, 300.0))
    for s in ("static_topk", "heat", "predictive", "oracle"):
        for h in (60.0, 300.0):
            c = ev.cell(s, 3, h)
            assert c.gain_tokens == 48.0 and c.gain_ci == (48.0, 48.0), (s, h, c)
            assert c.oracle_share == 1.0 and c.precision == 1.0
            assert c.warm_blocks == 3
    none = ev.cell("none", 3, 60.0)
    assert none.gain_tokens == 0 and none.warm_blocks == 0
    # recency warms the last blocks read: a unique request's, read by nobody again
    rec = ev.cell("recency", 3, 300.0)
    assert rec.gain_tokens < 48.0


def test_warm_sets_are_prefix_closed_nested_and_within_budget():
    rng = np.random.default_rng(3)
    tb = TraceBuilder(B)
    for t in range(2000):
        head = int(rng.zipf(1.4)) % 30
        ids = [head] + [1000 + head * 10 + k for k in range(int(rng.integers(1, 5)))]
        tb.add(float(t), len(ids) * B, 1, chain_ids(ids))
    f = _flat(tb.build())
    hist = _history(f, 0, len(f.keys))
    for strategy in ("static_topk", "recency", "heat", "predictive"):
        order, _ = warm_order(hist, 2000.0, strategy, 40, min_chance=0.0)
        assert len(order) <= 40 and len(set(order)) == len(order)
        for i in range(1, len(order) + 1):  # every prefix of the order is prefix-closed
            chosen = set(order[:i])
            assert all(hist.parents.get(b, 0) in chosen or hist.parents.get(b, 0) == 0
                       for b in chosen), strategy


def test_read_chance_by_hand():
    # no end of demand: 1 - e^(-0.01 * 100) = 0.63212
    assert read_chance(np.array([0.01]), np.array([0.0]), 100, 0.0)[0] == pytest.approx(0.63212, 1e-4)
    # rate 0.01, death 0.01, just read: 0.5 * (1 - e^(-0.02 * 100)) = 0.43233
    assert read_chance(np.array([0.01]), np.array([0.0]), 100, 0.01)[0] == pytest.approx(0.43233, 1e-4)
    # idle 300 s: alive = 1 / (1 + 0.5 (e^6 - 1)) = 1 / (1 + 0.5 x 402.4288) = 1 / 202.2144
    # = 0.0049452; x 0.43233 = 0.0021380
    got = read_chance(np.array([0.01]), np.array([300.0]), 100, 0.01)[0]
    assert got == pytest.approx(0.0049452 * 0.43233, rel=1e-3)
    # no end of demand and idle so long that e^(-rate x idle) underflows: still 1 - e^(-1)
    # (it was 0 / 0 = nan)
    with np.errstate(divide="raise", invalid="raise"):
        far = read_chance(np.array([1.0, 0.01]), np.array([1e9, 1e9]), 1, 0.0)
    assert far == pytest.approx([0.63212, 1 - math.exp(-0.01)], rel=1e-4)


def test_the_recommendation_and_its_notes():
    tr = _hot_trace()
    ev = evaluate(tr, 1000, [3, 30], restarts=30, horizons=(300.0,))
    r = recommend(ev, "ttft")
    assert r.strategy in ("static_topk", "heat", "predictive") and r.gain_tokens == 48.0
    # the warm-up computes its 3 blocks (48 tokens): net 0 for K = 3
    assert r.warm_tokens >= 48.0
    # ties between strategies are said to be ties
    assert any("does as well" in n for n in r.notes)
    net = recommend(ev, "net_gpu")
    assert net.net_tokens <= 0 or net.strategy != "none"


def test_advise_searches_smaller_sizes_once(monkeypatch):
    tr = _hot_trace()
    ev, rec = advise(tr, 1000, ks=[3, 12, 48], restarts=30)
    assert rec.k == 3 and "searched again down to 1" in rec.widened


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"restarts": 10}, "10 restart points: at least 30"),
        ({"ks": [5000]}, "K = 5,000 blocks is more than the cache holds (999 usable"),
        ({"ks": [0]}, "at least one block"),
    ],
)
def test_bad_requests_are_refused(kwargs, message):
    tr = _hot_trace()
    args = {"ks": [3], "restarts": 30} | kwargs
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        evaluate(tr, 1000, args["ks"], restarts=args["restarts"])


def test_traces_that_cannot_be_judged():
    short = _hot_trace(minutes=10)
    with pytest.raises(TraceError, match="too short for 5 min of history"):
        evaluate(short, 1000, [3])
    tb = TraceBuilder(B)
    for _ in range(50):
        tb.add(0.0, 4 * B, 1, P)
    with pytest.raises(TraceError, match="no time span"):
        evaluate(tb.build(), 1000, [3])
    with pytest.raises(TraceError, match="warm-up strategy 'magic'"):
        evaluate(_hot_trace(), 1000, [3], strategies=("magic",))
    assert math.isfinite(read_chance(np.array([0.0]), np.array([1.0]), 10, 0.1)[0])


def test_one_restart_with_a_given_warm_set_by_hand():
    """Three requests on an engine restarted just before them: the hot prefix P (3 blocks) and a
    block of its own (64 tokens), then an unrelated prompt Q (2 blocks and one of its own, 48
    tokens), then P again with another own block."""
    tb = TraceBuilder(B)
    tb.add(0.0, 4 * B, 1, P + chain_ids([1, 2, 3, 900])[3:])
    q = chain_ids([7, 8, 901])
    tb.add(1.0, 3 * B, 1, q)
    tb.add(2.0, 4 * B, 1, P + chain_ids([1, 2, 3, 902])[3:])
    tr = tb.build()
    # cold: only the third request reads P, which the first computed: 3 blocks x 16 = 48 tokens
    assert warmed_cached_tokens(tr, [], 1000).tolist() == [0, 0, 48]
    # P warmed: the first read hits it too (3 blocks, within (64 - 1) // 16 = 3)
    assert warmed_cached_tokens(tr, [P], 1000).tolist() == [48, 0, 48]
    # both warmed; Q's first two blocks hit, its own block cannot: min(2, (48 - 1) // 16 = 2) = 2
    assert warmed_cached_tokens(tr, [P, q[:2]], 1000).tolist() == [48, 32, 48]
    with pytest.raises(TraceError, match="capacity 1"):
        warmed_cached_tokens(tr, [P], 1)


def test_the_cli_prints_the_paired_table_and_the_recommendation(tmp_path, capsys):
    """`warmscope advise --block-trace` on the hand-worked trace (in a store): each K x strategy row with its
    gain per horizon (the hot prefix: +48 tokens, CI +48 to +48, at both sizes for static top-K), the seen
    oracle's share (100 %; the two oracles are the bounds, not shares of one), and a recommendation in named
    units."""
    from warmscope.app.cli.main import main
    from warmscope.sources.trace_store import write_store_trace

    store = tmp_path / "s.sqlite"
    write_store_trace(_hot_trace(), store)
    assert main(["--store", str(store), "advise", "--block-trace", "--capacity", "1000", "--k", "3,30",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line for line in out.splitlines() if line[:7].strip().isdigit()}
    assert sorted({s for _, s in rows}) == sorted(["static_topk", "recency", "heat", "predictive", "oracle_seen",
                                                   "oracle"])
    for k in ("3", "30"):
        assert rows[(k, "static_topk")].count("+48 (+48 to +48)") == 3, rows[(k, "static_topk")]
        assert "100% (100%-100%)" in rows[(k, "static_topk")]
        assert "(a bound)" in rows[(k, "oracle")] and "(a bound)" in rows[(k, "oracle_seen")]
    assert "prefill tokens saved per restart" in out and "Recommendation (objective ttft" in out


def test_a_cache_that_turned_over_is_said_to_have_settled():
    """Gains equal at 5 and 15 min for every strategy and budget (the demo's hour: a 5,859-block cache turns
    over within minutes): the evaluation names the 5-min horizon and the CLI prints why; a gain that still
    moves at the longest horizon settles nowhere."""
    import numpy as np
    from warmscope.analysis.whatif.warmup import Cell, Evaluation
    from warmscope.app.cli.whatif import render_advice

    def cell(s, k, h, g):
        return Cell(s, k, h, g, (g - 1, g + 1), 0.5, (0.4, 0.6), 0.5, (0.4, 0.6), 0.5, 0.5, k, 10.0)

    def ev(late):
        e = Evaluation("t", 512, 100, np.array([0.0]), (10, 50), (60.0, 300.0, 900.0), lam=0.01)
        for s in ("static_topk", "predictive"):
            for k in (10, 50):
                e.cells += [cell(s, k, 60.0, 1.0 * k), cell(s, k, 300.0, 2.0 * k), cell(s, k, 900.0, late * k)]
        return e

    settled = ev(2.0)
    assert settled.settled_by() == 300.0
    assert settled.settled_note(300.0).startswith("Every strategy saves the same within 5 min as within 15 min")
    assert ev(2.5).settled_by() is None
    rec = types.SimpleNamespace(objective="ttft", strategy="none", widened="", notes=[])
    assert "Every strategy saves the same within 5 min" in render_advice(settled, rec)
    assert "saves the same" not in render_advice(ev(2.5), rec)


def _hand_evaluation(per_restart: dict[str, list[float]]):
    """An evaluation of one budget (K = 4) at 300 s whose paired per-restart gains are given."""
    from warmscope.analysis.whatif.warmup import Cell, Evaluation

    ev = Evaluation("hand", 16, 100, np.arange(4.0), (4,), (300.0,))
    for s, d in {"none": [0.0] * 4, **per_restart}.items():
        m = float(np.mean(d))
        ev.cells.append(Cell(s, 4, 300.0, m, (m, m), 0.5, (0.5, 0.5), 0.5, (0.5, 0.5), 0.5, 0.5, 4.0, 10.0))
        ev.per_restart[(s, 4, 300.0)] = np.array(d)
    return ev


def test_a_simpler_strategy_within_the_noise_is_recommended():
    # predictive - static_topk per restart: +10, -6, +8, -4: mean +2, sd = sqrt((64 + 64 + 36 + 36) / 3)
    # = 8.165; half-width t(0.975, 3) = 3.1824 x 8.165 / 2 = 12.99: CI -10.99 to +14.99 holds 0
    ev = _hand_evaluation({"static_topk": [100.0, 110.0, 90.0, 100.0],
                           "predictive": [110.0, 104.0, 98.0, 96.0]})
    r = recommend(ev, "ttft")
    assert (r.strategy, r.gain_tokens) == ("static_topk", 100.0)
    assert any("predictive (K = 4) scores +2 tokens per restart more" in n and "-11 to +15" in n
               and "the simpler static_topk is recommended" in n for n in r.notes), r.notes
    # predictive ahead on every restart by 20 +- 1: no tie, predictive is recommended
    ev = _hand_evaluation({"static_topk": [100.0, 110.0, 90.0, 100.0],
                           "predictive": [120.0, 131.0, 109.0, 120.0]})
    r = recommend(ev, "ttft")
    assert r.strategy == "predictive" and any(n.startswith("Ahead of the next best, static_topk") for n in r.notes)
    # the simpler of two that tie is named as the simpler one when it is also the best
    ev = _hand_evaluation({"static_topk": [104.0, 110.0, 90.0, 100.0],
                           "predictive": [100.0, 104.0, 98.0, 96.0]})
    r = recommend(ev, "ttft")
    assert r.strategy == "static_topk"
    assert any("predictive (K = 4) does as well" in n and "static_topk is the simpler of the two" in n
               for n in r.notes), r.notes
    # a tie that does not beat no warm-up on the objective is not recommended over the best
    ev = _hand_evaluation({"static_topk": [-3.0, 2.0, -2.0, 1.0], "heat": [6.0, 1.0, 2.0, 3.0]})
    r = recommend(ev, "ttft")
    assert r.strategy == "heat"
    # ... and its note gives that reason, not its warm-up's size (the same 4 blocks as heat's): heat - static
    # per restart 9, -1, 4, 2: mean 3.5, sd sqrt(53 / 3) = 4.203, half-width 3.1824 x 4.203 / 2 = 6.69: CI -3 to +10;
    # static top-K's own mean (-3 + 2 - 2 + 1) / 4 = -0.5 against no warm-up's 0
    assert any("static_topk (K = 4) does as well" in n and "(95 % CI -3 to +10)" in n
               and "it does not beat no warm-up on this objective (-0.5 tokens per restart against +0.0)" in n
               for n in r.notes), r.notes
    assert not any("times the blocks" in n for n in r.notes), r.notes
    # a simpler tie whose warm-up computes more blocks is not recommended over the best, and says why
    ev = _hand_evaluation({"static_topk": [100.0, 110.0, 90.0, 100.0],
                           "predictive": [110.0, 104.0, 98.0, 96.0]})
    ev.cell("predictive", 4, 300.0).warm_blocks = 2.0  # half the blocks static top-K warms (4)
    r = recommend(ev, "ttft")
    assert r.strategy == "predictive"
    assert any("static_topk (K = 4) does as well" in n and "it is simpler, but its warm-up computes 2.0 times the "
               "blocks (4 against 2)" in n for n in r.notes), r.notes
    # the page's names in the notes (the dashboard's table says "static top-K", not static_topk)
    r = recommend(ev, "ttft", names={"static_topk": "static top-K", "predictive": "predictive"})
    assert any(n.startswith("static top-K (K = 4) does as well") for n in r.notes), r.notes
