"""The compiled block-pool replay: a hand-worked example, the plain-Python model of vLLM's pool
(tests/analysis/whatif/reference.py) on random traces, the routing policies, restarts and the
identities a what-if swaps in."""

from __future__ import annotations

import numpy as np
import pytest
from warmscope.analysis.whatif.replay import effective_keys, events, replay
from warmscope.model.blocktrace import TraceBuilder, TraceError, chain_ids

from tests.analysis.whatif.reference import Engine

B = 4


def test_a_hand_worked_pool_of_five_blocks():
    """num_gpu_blocks 5 (block 0 is the null block: b1..b4 usable), 4 tokens a block, output 1.

    R1 [A0 A1] 8 tokens: hit cap (8-1)//4 = 1, nothing cached; b1=A0 b2=A1; freed tail first:
       queue [b3 b4 b2:A1 b1:A0]                                              cached 0
    R2 [A0 A1] 8 tokens: hits A0 (b1 touched); one new block: b3 (hashless) becomes a second
       copy of A1; queue [b4 b2:A1 b3:A1 b1:A0]                                cached 4
    R3 [C0 C1 C2] 12 tokens: no hit; b4, b2, b3 taken from the head (both copies of A1
       evicted): b4=C0 b2=C1 b3=C2; queue [b1:A0 b3:C2 b2:C1 b4:C0]           cached 0
    R4 [A0 A1] 9 tokens: cap 2; A0 hits, A1 is gone; 3 blocks - 1 hit = 2 new: b3 (C2
       evicted), b2 (C1 evicted); b3=A1, b2 stays partial (hashless, to the head when freed)
       queue [b2 b4:C0 b3:A1 b1:A0]                                            cached 4
    R5 [C0 C1 C2] 13 tokens: cap 3; C0 hits, C1 does not                       cached 4
    A block LRU of 4 blocks would have kept C1 and C2 at R4 (it evicts A1 and A0 first)."""
    A, C = chain_ids([1, 2]), chain_ids([7, 8, 9])
    tb = TraceBuilder(B)
    for t, (chain, prompt) in enumerate([(A, 8), (A, 8), (C, 12), (A, 9), (C, 13)]):
        tb.add(float(t), prompt, 1, chain)
    r = replay(tb.build(), 5)
    assert r.cached.tolist() == [0, 4, 0, 4, 4]
    assert r.fit.tolist() == [1] * 5
    # the reference model agrees
    assert _reference(tb.build(), 5, concurrent=False).tolist() == [0, 1, 0, 1, 1]


def _random_trace(seed: int, n: int = 300, engines: int = 2, concurrent: bool = False):
    rng = np.random.default_rng(seed)
    tb = TraceBuilder(B)
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(1.0))
        head = int(rng.integers(0, 5))
        ids = [head * 100 + k for k in range(int(rng.integers(0, 6)))]
        ids += [int(x) for x in rng.integers(10_000, 10_040, size=int(rng.integers(0, 5)))]
        prompt = max(1, len(ids) * B + int(rng.integers(0, B + 1)))
        out = int(rng.integers(1, 3 * B))
        pf = prompt // B
        full = (prompt + out - 1) // B
        h = chain_ids(ids)[:pf] + [(1 << 61) + i * 1000 + j for j in range(min(pf, len(ids)), full)]
        end = t + float(rng.exponential(3.0)) if concurrent else float("nan")
        tb.add(t, prompt, out, h, t_end=end, engine=f"e{int(rng.integers(0, engines))}")
    return tb.build()


def _reference(trace, cap: int, concurrent: bool) -> np.ndarray:
    engs = {e: Engine(cap, trace.block_size) for e in range(max(1, len(trace.engines)))}
    hits = np.full(len(trace), -1)
    for kind, i in events(trace, concurrent):
        e = max(0, int(trace.engine[i]))
        if kind == 1:
            got = engs[e].admit(int(i), [int(x) for x in trace.chain(i)], int(trace.prompt[i]),
                                int(trace.output[i]))
            hits[i] = -1 if got is None else got
        elif kind == 0 and i in engs[e].running:
            engs[e].finish(int(i))
    return hits


@pytest.mark.parametrize("concurrent", [False, True])
def test_equals_the_reference_model_on_random_traces(concurrent):
    mismatches = []
    for seed in range(25):
        trace = _random_trace(seed, concurrent=concurrent)
        for cap in (6, 12, 30, 200):
            r = replay(trace, cap, concurrent=concurrent)
            mine = np.where(r.fit == 1, r.hits, -1)
            ref = _reference(trace, cap, concurrent)
            if not np.array_equal(mine, ref):
                mismatches.append((seed, cap))
    assert not mismatches
    # the traces exercise evictions and requests that do not fit: not a test of a big cache
    r = replay(_random_trace(3, concurrent=concurrent), 6, concurrent=concurrent)
    assert (r.fit == 0).any() and r.hits.sum() > 0


def _two_prefix_trace():
    """Tenant x sends prefix P twice, y sends Q twice, alternating: x y x y."""
    P, Q = chain_ids([1, 2, 3]), chain_ids([5, 6, 7])
    tb = TraceBuilder(B)
    for t, (ten, ch) in enumerate([("x", P), ("y", Q), ("x", P), ("y", Q)]):
        tb.add(float(t), 13, 1, ch, tenant=ten, engine=f"e{t % 2}")
    return tb.build()


def test_routing_policies():
    tr = _two_prefix_trace()
    # round robin sends x to e0, y to e1, x to e0 again: every second request hits 3 blocks
    rr = replay(tr, 50, engines=2, policy="round_robin")
    assert rr.engine.tolist() == [0, 1, 0, 1] and rr.cached.tolist() == [0, 0, 12, 12]
    # recorded routing here is x->e0, y->e1, x->e0, y->e1 as well
    assert replay(tr, 50, policy="recorded").cached.tolist() == [0, 0, 12, 12]
    # prefix-aware: the first two have no match anywhere (ties: least load, then the engine idle
    # longest: e0, e1); the second x goes where P is (e0), the second y where Q is (e1)
    pa = replay(tr, 50, engines=2, policy="prefix_aware")
    assert pa.engine.tolist() == [0, 1, 0, 1] and pa.cached.tolist() == [0, 0, 12, 12]
    # three engines round robin: x e0, y e1, x e2 (miss), y e0 (miss)
    assert replay(tr, 50, engines=3, policy="round_robin").cached.tolist() == [0, 0, 0, 0]
    # prefix-aware with three engines still finds both prefixes
    assert replay(tr, 50, engines=3, policy="prefix_aware").cached.tolist() == [0, 0, 12, 12]
    # tenant affinity: one engine per tenant, whatever the engine count
    ta = replay(tr, 50, engines=3, policy="tenant_affinity")
    assert ta.engine[0] == ta.engine[2] and ta.engine[1] == ta.engine[3]
    assert ta.cached.tolist() == [0, 0, 12, 12]
    # random: reproducible by its seed
    a = replay(tr, 50, engines=3, policy="random", seed=4).engine
    assert np.array_equal(a, replay(tr, 50, engines=3, policy="random", seed=4).engine)


def test_least_loaded_counts_in_flight_tokens():
    # r0 (long, still running) on e0; r1 arrives while r0 runs -> e1; r2 after both ended -> e0
    # (both idle: the engine idle longest, e0, picked first at t=0)
    tb = TraceBuilder(B)
    tb.add(0.0, 40, 10, chain_ids(range(10)), t_end=5.0)
    tb.add(1.0, 8, 1, chain_ids([50, 51]), t_end=2.0)
    tb.add(6.0, 8, 1, chain_ids([60, 61]), t_end=7.0)
    r = replay(tb.build(), 50, engines=2, policy="least_loaded", concurrent=True)
    assert r.engine.tolist() == [0, 1, 0]


def test_a_restart_empties_the_engine():
    P = chain_ids([1, 2, 3])
    tb = TraceBuilder(B)
    for t in range(3):
        tb.add(float(t), 13, 1, P, engine="e0")
    tb.restart(1.5, "e0")
    assert replay(tb.build(), 50).cached.tolist() == [0, 12, 0]


def test_in_flight_requests_hold_their_blocks():
    # num_gpu_blocks 7: 6 usable. r0 holds 4 blocks until t=10; r1 (4 blocks) does not fit
    # beside it while it runs; run one after the other, both fit
    tb = TraceBuilder(B)
    tb.add(0.0, 16, 1, chain_ids([1, 2, 3, 4]), t_end=10.0)
    tb.add(1.0, 16, 1, chain_ids([5, 6, 7, 8]), t_end=2.0)
    tr = tb.build()
    assert replay(tr, 7, concurrent=True).fit.tolist() == [1, 0]
    assert replay(tr, 7, concurrent=False).fit.tolist() == [1, 1]


def test_unsalting_shares_content_and_stable_keys_undo_drift():
    # tenants a and b send the same prompt under their own salts: different hashes, same content
    content = chain_ids([1, 2, 3])
    tb = TraceBuilder(B)
    tb.add(0.0, 13, 1, chain_ids([1, 2, 3], salt=11), c=content, tenant="a", salt="sa")
    tb.add(1.0, 13, 1, chain_ids([1, 2, 3], salt=22), c=content, tenant="b", salt="sb")
    tr = tb.build()
    assert replay(tr, 50).cached.tolist() == [0, 0]
    assert replay(tr, 50, keys=effective_keys(tr, unsalt={"a", "b"})).cached.tolist() == [0, 12]
    assert replay(tr, 50, keys=effective_keys(tr, unsalt={"a"})).cached.tolist() == [0, 0]
    with pytest.raises(TraceError, match="not in the trace"):
        effective_keys(tr, unsalt={"zed"})
    # a drifting first block: hashes differ, the stable chain is shared from the second request
    stable = chain_ids([0, 2, 3])
    tb = TraceBuilder(B)
    tb.add(0.0, 13, 1, chain_ids([100, 2, 3]))
    tb.add(1.0, 13, 1, chain_ids([101, 2, 3]), s=stable)
    tb.add(2.0, 13, 1, chain_ids([102, 2, 3]), s=stable)
    tr = tb.build()
    assert replay(tr, 50).cached.tolist() == [0, 0, 0]
    assert replay(tr, 50, keys=effective_keys(tr, stable=True)).cached.tolist() == [0, 0, 12]


def test_bad_parameters_are_named():
    tr = _two_prefix_trace()
    with pytest.raises(TraceError, match="at least 2"):
        replay(tr, 1)
    with pytest.raises(TraceError, match="routing policy 'fastest'"):
        replay(tr, 10, policy="fastest")
    with pytest.raises(TraceError, match="more than one replay holds"):
        replay(tr, 10**9)
    with pytest.raises(TraceError, match="capacities for"):
        replay(tr, [10, 10, 10], engines=2)
