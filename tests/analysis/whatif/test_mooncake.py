"""The Mooncake conversation trace (data/traces, a real production hour): the facts published
with it, its miss-ratio curve from 10^4 to 10^9 tokens, SHARDS sampling's error on it, and the
vLLM policy beside block LRU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from warmscope.analysis.whatif.curves import lru_curve, vllm_curve
from warmscope.sources.trace_file import read_trace

TRACE = Path(__file__).resolve().parents[3] / "data" / "traces" / "mooncake_conversation.jsonl"


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


@pytest.fixture(scope="module")
def curve(trace):
    return lru_curve(trace)


def test_the_published_facts(trace, curve):
    assert len(trace) == 12_031 and trace.block_size == 512
    assert trace.n_blocks == 288_500
    assert round(trace.span_s) == 3_537
    # infinite cache: 36.6 % of block references, 37.4 % of input tokens are prefix hits
    from warmscope.analysis.whatif.kernels import lru_distances

    d = lru_distances(trace.h, trace.offsets, np.arange(len(trace), dtype=np.int64))
    assert np.mean(d < (1 << 62)) == pytest.approx(0.366, abs=0.0005)
    assert curve.max_hit == pytest.approx(0.374, abs=0.0005)


def test_the_curve_and_its_named_capacities(curve):
    tokens = {t: curve.at(t / 512) for t in (1e4, 1e5, 1e6, 3e6, 1e7, 5e7, 1e8, 1e9)}
    half, p95, knee = (curve.capacity_for(0.5) * 512, curve.capacity_for(0.95) * 512,
                       curve.knee * 512)
    print("\ntokens   hit rate (block LRU)")
    for t, h in tokens.items():
        print(f"{t:>8.0e}  {h:.4f}")
    print(f"max {curve.max_hit:.4f}; half {half:,.0f} tokens; 95 % {p95:,.0f}; knee {knee:,.0f}")
    # the paper's reading: 3 M tokens reach less than half of the maximum, 50 M nearly all
    assert tokens[3e6] < 0.5 * curve.max_hit and tokens[5e7] > 0.95 * curve.max_hit
    assert 3e6 < half < 5e7 and half < p95 <= 5e7
    # a plain block LRU: about 14 % at 3 M tokens, about 36-37 % at 50 M
    assert 0.13 < tokens[3e6] < 0.15 and 0.36 < tokens[5e7] < 0.375
    assert tokens[1e9] == pytest.approx(curve.max_hit)
    vals = list(tokens.values())
    assert all(a <= b for a, b in zip(vals, vals[1:], strict=False))


def test_sampling_error_against_the_exact_curve(trace, curve):
    for rate in (0.1, 0.03, 0.01):
        # distances counted in sampled blocks resolve capacities from about 10 / rate blocks
        caps = np.geomspace(10 / rate, 3e5, 40)
        s = lru_curve(trace, rate=rate)
        err = np.abs(np.array([s.at(c) for c in caps]) - np.array([curve.at(c) for c in caps]))
        print(f"SHARDS rate {rate}: mean abs error {err.mean():.4f}, max {err.max():.4f}")
        assert err.mean() < 0.015 and err.max() < 0.05


def test_vllm_policy_beside_block_lru(trace, curve):
    v = vllm_curve(trace, sizes=[2_000, 6_000, 20_000, 60_000, 300_000])
    print("\nblocks   vLLM    LRU")
    for s, h in zip(v.capacity, v.hit_rate, strict=True):
        print(f"{s:>7}  {h:.4f}  {curve.at(s):.4f}")
    # vLLM holds each request's partial and output blocks too, and never hits a prompt's last
    # token; but it frees a request's tail first, so a chain's head outlives its tail, which
    # suits prefixes better than textbook LRU: within a point or two of it at every size,
    # and the same once nothing is evicted
    for s, h in zip(v.capacity, v.hit_rate, strict=True):
        assert abs(h - curve.at(s)) < 0.02, s
    assert v.hit_rate[-1] == pytest.approx(curve.max_hit, abs=0.002)
