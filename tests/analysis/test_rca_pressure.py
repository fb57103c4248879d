"""Downstream pressure in hit-rate localisation, and the leaf grouping.

When one cache misses, the requests it no longer serves reach the caches behind
it: their traffic grows and, as more traffic reuses more keys, their hit rate
rises. That is an effect, not a cause. A cache whose traffic grew *and* whose
hit rate fell (its own keys changed) is a cause; a key family that did not
exist before is judged within a parent that did."""

import itertools

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.rootcause import _group, localize

DIMS = ["tenant", "layer", "family", "replica"]


def world(seed: int) -> pd.DataFrame:
    """Leaves of a calm hit-rate world: observed hits drawn at the expected rates."""
    rng = np.random.default_rng(seed)
    g = pd.DataFrame(list(itertools.product([f"t{i}" for i in range(6)], ["response", "prefix_kv", "lora"],
                                            [f"f{i}" for i in range(4)], [f"r{i}" for i in range(4)])),
                     columns=DIMS)
    g["family"] = g["layer"] + ":" + g["family"]
    n = rng.poisson(400, len(g)).astype(float) + 1
    p = rng.beta(6, 3, len(g))
    return g.assign(lookups=n, rate=p, volume_exp=n)


def finish(g: pd.DataFrame, rng) -> pd.DataFrame:
    return g.assign(hits=rng.binomial(g["lookups"].astype(int), g["rate"]).astype(float),
                    hits_exp=g["p0"] * g["lookups"], lookups_exp=g["lookups"])


def run(df: pd.DataFrame, volumes: bool = True):
    kw = dict(v_vol="lookups", f_vol="volume_exp") if volumes else {}
    loc = localize(df, DIMS, v_num="hits", v_den="lookups", f_num="hits_exp", f_den="lookups_exp", **kw)
    return {frozenset(c.element.items()) for c in loc.causes}


def test_grown_traffic_with_a_rising_hit_rate_is_not_a_cause():
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        g = world(seed)
        g["p0"] = g["rate"]
        cause = (g.tenant == "t1") & (g.layer == "response")
        g.loc[cause, "rate"] = 0.0                              # t1's response cache is bypassed ...
        knock = (g.tenant == "t1") & (g.layer == "lora")
        g.loc[knock, "lookups"] *= 2                            # ... so twice the requests reach its adapters,
        g.loc[knock, "rate"] = np.minimum(g.loc[knock, "p0"] + 0.15, 0.99)  # which stay warmer
        df = finish(g, rng)
        assert run(df) == {frozenset({("tenant", "t1"), ("layer", "response")})}, seed
        # Without traffic volumes the knock-on is indistinguishable from a cause: the rule is what drops it.
        assert frozenset({("tenant", "t1"), ("layer", "lora")}) in run(df, volumes=False), seed


def test_grown_traffic_with_a_falling_hit_rate_stays_a_cause():
    for seed in range(3):
        rng = np.random.default_rng(200 + seed)
        g = world(seed)
        g["p0"] = g["rate"]
        fam = g.family == "prefix_kv:f2"
        g.loc[fam, "lookups"] *= 2.3                            # more traffic, and its own keys changed:
        g.loc[fam, "rate"] = g.loc[fam, "p0"] * 0.4             # a rate far below the old one
        assert run(finish(g, rng)) == {frozenset({("family", "prefix_kv:f2")})}, seed


def test_a_family_without_expected_traffic_is_judged_within_its_parent():
    for seed in range(3):
        rng = np.random.default_rng(300 + seed)
        g = world(seed)
        g["p0"] = g["rate"]
        old = (g.tenant == "t4") & (g.layer == "response")
        # t4's response keys move to a new family: the old leaves lose their traffic and the
        # new leaves (no expected traffic; expected at the tenant's old rate) all miss.
        new = g[old].assign(family="response:new", volume_exp=0.0, rate=0.0)
        new["p0"] = np.average(g.loc[old, "p0"], weights=g.loc[old, "lookups"])
        g.loc[old, ["lookups", "rate"]] = [0.0, 0.0]
        df = finish(pd.concat([g, new], ignore_index=True), rng)
        assert run(df) == {frozenset({("tenant", "t4"), ("layer", "response")})}, seed


def test_grouping_numbers_each_combination_once_small_or_huge_key_space():
    rng = np.random.default_rng(0)
    for sizes in ([3, 5, 7], [5000, 4000, 3000, 2000, 1000, 900]):  # 105 keys; ~1e20, beyond int64
        codes = [rng.integers(0, s, 20_000) for s in sizes]
        inv, ng = _group(codes, sizes, tuple(range(len(sizes))))
        ref = pd.DataFrame(np.column_stack(codes)).groupby(list(range(len(sizes))), sort=True).ngroup().to_numpy()
        assert ng == ref.max() + 1
        np.testing.assert_array_equal(inv, ref)                  # same groups, numbered in key order


def test_a_parent_found_after_its_child_names_both():
    """A failure rate: one child of the cause jumps far more than its siblings, so it is found
    first and the siblings then move on their own as the parent: one cause, the parent."""
    from warmscope.analysis.rootcause import RootCause, absorb

    child = RootCause({"b": "b1", "d": "d0"}, 0.6, float("nan"), 4, 4, 1, 0.02)
    parent = RootCause({"b": "b1"}, 0.3, float("nan"), 12, 12, 1, 0.01)
    other = RootCause({"a": "a2"}, 0.05, float("nan"), 3, 3, 1, 0.002)
    merged = absorb([child, other], parent)
    assert [c.element for c in merged] == [{"b": "b1"}, {"a": "a2"}]        # in the child's place
    assert merged[0].leaves == 16 and merged[0].change == pytest.approx(0.03) and merged[0].score == pytest.approx(0.9)
    # A child that moved the other way is a cause of its own.
    assert len(absorb([RootCause({"b": "b1", "d": "d0"}, 0.6, 0, 4, 4, -1, -0.02)], parent)) == 2

    # On data: the child has 5x its siblings' traffic and 18x its rate; the siblings 2.5x.
    rng = np.random.default_rng(7)
    g = pd.DataFrame(list(itertools.product([f"a{i}" for i in range(6)], [f"b{i}" for i in range(5)],
                                            [f"d{i}" for i in range(6)])), columns=["a", "b", "d"])
    den = rng.poisson(np.where(g.d == "d0", 15000, 3000), len(g)) + 1
    p = rng.uniform(0.01, 0.03, len(g))
    jump = np.where((g.b == "b1") & (g.d == "d0"), 18.0, np.where(g.b == "b1", 2.5, 1.0))
    df = g.assign(vn=rng.binomial(den, np.minimum(p * jump, 0.9)), vd=den, fn=p * den, fd=den)
    loc = localize(df, ["a", "b", "d"], v_num="vn", v_den="vd", f_num="fn", f_den="fd")
    assert [c.element for c in loc.causes] == [{"b": "b1"}]
