"""Miss-ratio curves: the one-pass LRU curve against a block-LRU simulated request by request
(an OrderedDict), SHARDS sampling's error against the exact curve, the vLLM curve against
single replays, and the named capacities (half, 95 %, knee) on a curve worked by hand."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from warmscope.analysis.whatif.curves import Curve, block_tokens, lru_curve, vllm_curve
from warmscope.analysis.whatif.replay import replay
from warmscope.model.blocktrace import TraceError

from tests.analysis.whatif.test_pool import _random_trace

B = 4


def _lru_tokens(trace, cap: int) -> float:
    """Block LRU of ``cap`` blocks, prefix hits, blocks touched in request order."""
    c: OrderedDict[int, None] = OrderedDict()
    w = block_tokens(trace)
    hit = 0.0
    for i in range(len(trace)):
        lo, hi = trace.offsets[i], trace.offsets[i + 1]
        ok = True
        for j in range(lo, hi):
            k = int(trace.h[j])
            if ok and k in c:
                hit += w[j]
            else:
                ok = False
        for j in range(lo, hi):
            k = int(trace.h[j])
            c[k] = None
            c.move_to_end(k)
            if len(c) > cap:
                c.popitem(last=False)
    return hit / trace.prompt.sum()


def test_one_pass_lru_equals_a_simulated_lru_at_every_capacity():
    for seed in (1, 2, 3):
        tr = _random_trace(seed, n=400, engines=1)
        curve = lru_curve(tr)
        for cap in (1, 2, 3, 5, 8, 13, 21, 40, 100, 1000):
            assert curve.at(cap) == pytest.approx(_lru_tokens(tr, cap), abs=1e-12), (seed, cap)
        assert curve.max_hit == pytest.approx(_lru_tokens(tr, 10**6), abs=1e-12)


def test_per_engine_distances_follow_the_routing():
    tr = _random_trace(5, n=300, engines=2)
    curve = lru_curve(tr)  # two engines: each its own LRU of `cap` blocks
    for cap in (4, 16, 64):
        want = 0.0
        for e in (0, 1):
            sub = tr.subset(tr.engine == e)
            want += _lru_tokens(sub, cap) * sub.prompt.sum()
        assert curve.at(cap) == pytest.approx(want / tr.prompt.sum(), abs=1e-12)


def test_vllm_curve_points_are_replays():
    tr = _random_trace(7, n=200, engines=1)
    v = vllm_curve(tr, sizes=[20, 40, 80])
    for s, h in zip(v.capacity, v.hit_rate, strict=True):
        assert h == replay(tr, int(s)).token_hit_rate()
    assert v.hit_rate[0] <= v.hit_rate[1] <= v.hit_rate[2]


def test_named_capacities_on_a_hand_built_curve():
    # hit rate 0.1, 0.3, 0.35, 0.4 at 10, 100, 1000, 10000 blocks (max 0.4)
    c = Curve("vllm", 16, np.array([10, 100, 1000, 10000]), np.array([0.1, 0.3, 0.35, 0.4]), 0.4)
    assert c.capacity_for(0.5) == 100  # half of 0.4 = 0.2: first reached at 100
    assert c.capacity_for(0.95) == 10000  # 0.38: only the last point
    # knee (Kneedle): x = 0, 1/3, 2/3, 1; y = 0, 2/3, 5/6, 1; y - x largest at 100 (1/3)
    assert c.knee == 100
    assert c.at(100) == pytest.approx(0.3)
    # between points, linear in log capacity: halfway between 100 and 1000 (316.2) -> 0.325
    assert c.at(10**2.5) == pytest.approx(0.325)


def test_bad_curve_input():
    with pytest.raises(TraceError, match="sampling rate"):
        lru_curve(_random_trace(1, n=5), rate=0)
    with pytest.raises(TraceError, match="no requests"):
        lru_curve(_random_trace(1, n=5).subset(np.zeros(5, bool)))
