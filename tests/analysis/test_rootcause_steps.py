"""The named steps of the root-cause localiser, each on a small hand-built table,
and the properties the whole method must keep: the same answer whatever the order
of the dimensions or the spelling of their values, and any categorical column
(a miss class, say) as a dimension."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.rootcause import (
    Localization,
    Measure,
    Options,
    RootCause,
    Search,
    absorb,
    additive_move,
    candidates,
    climb,
    cover,
    explain,
    localize,
    rank,
    residuals,
    significant,
    split,
    votes_additive,
    votes_ratio,
)

ADDITIVE = Measure(v="v", f="f")
RATIO = Measure(v_num="vn", v_den="vd", f_num="fn", f_den="fd")


def elements(loc):
    return {frozenset(c.element.items()) for c in loc.causes}


def grid(**sizes):
    """Every combination of the dimensions' values (a0, a1, ...), one row each."""
    return pd.DataFrame(
        list(itertools.product(*[[f"{k}{i}" for i in range(n)] for k, n in sizes.items()])),
        columns=list(sizes),
    )


def search_of(g, measure, cols):
    """The search state over a table, as localize builds it (no noise ceiling)."""
    opts = Options()
    dims = list(g.columns)
    res = residuals(measure, cols, opts, [])
    codes = [g[d].factorize()[0] for d in dims]
    return Search.over(
        res,
        codes,
        [int(c.max()) + 1 for c in codes],
        candidates(dims, opts, []),
        None,
        None,
        0.0,
        opts,
    )


# -- 1. residuals ----------------------------------------------------------------------------------


def test_additive_residuals_are_log_ratios_in_units_of_the_robust_noise():
    f = np.array([10.0, 10.0, 10.0, 10.0, 0.0])
    v = np.array([11.0, 9.0, 10.0, 20.0, 0.0])
    res = residuals(ADDITIVE, {"v": v, "f": f}, Options(), [])
    # floor = 5th percentile of the positive expected values = 10.
    # log ratios log((v+10)/(f+10)): log(21/20) = 0.048790, log(19/20) = -0.051293, 0,
    # log(30/20) = 0.405465.
    # Fewer than 10 leaves on either side: σ = 1.4826 · median(0.048790, 0.051293, 0, 0.405465)
    # = 1.4826 · (0.048790 + 0.051293) / 2 = 0.074192; the last leaf's z = 0.405465 / 0.074192
    # = 5.465.
    assert res is not None
    assert res.floor == 10.0
    assert res.sigma == pytest.approx(0.074192, abs=1e-5)
    assert res.z[3] == pytest.approx(5.465, abs=1e-3)
    # A leaf zero in both columns carries no evidence.
    assert res.ok.tolist() == [True, True, True, True, False]


def test_ratio_residuals_are_binomial_at_the_observed_traffic():
    cols = {
        "vn": np.array([30.0, 50.0]),
        "vd": np.array([100.0, 100.0]),
        "fn": np.array([50.0, 50.0]),
        "fd": np.array([100.0, 100.0]),
    }
    res = residuals(RATIO, cols, Options(), [])
    # Overall rate 0.5; a leaf's rate shrunk by one pseudo-event: (50 + 0.5) / (100 + 1) = 0.5.
    # Variance 100 · 0.5 · 0.5 = 25; z = (30 − 50) / 5 = −4 and (50 − 50) / 5 = 0; two leaves
    # are too few
    # to estimate over-dispersion (10 needed), so none is assumed.
    assert res is not None
    assert res.z.tolist() == pytest.approx([-4.0, 0.0])


def test_no_change_has_no_residuals():
    f = np.array([3.0, 4.0])
    assert residuals(ADDITIVE, {"v": f.copy(), "f": f}, Options(), []) is None


# -- 2. candidates ---------------------------------------------------------------------------------


def test_candidates_are_all_subsets_within_the_budget_and_always_single_leaves():
    assert len(candidates(["a", "b", "c"], Options(), [])) == 7  # 3 + 3 + 1 subsets
    notes: list[str] = []
    # Budget 4: the 3 one-dimension subsets fit, 3 + C(3, 2) = 6 > 4 does not; the leaves are added.
    assert candidates(["a", "b", "c"], Options(max_subsets=4), notes) == [
        (0,),
        (1,),
        (2,),
        (0, 1, 2),
    ]
    assert notes == ["elements of up to 1 dimensions (and single leaves) were searched"]


# -- 3. significance and the votes -----------------------------------------------------------------


def test_significance_is_bonferroni_with_a_noise_ceiling_for_single_leaves():
    dev, var, n = np.array([10.0, 3.0, 8.0]), np.array([4.0, 4.0, 1.0]), np.array([5, 5, 1])
    # z = 10/2 = 5, 3/2 = 1.5, 8/1 = 8 against z_crit 3; the single leaf must also beat the ceiling.
    assert significant(dev, var, n, 1.0, 3.0, 9.0).tolist() == [True, False, False]
    assert significant(dev, var, n, 1.0, 3.0, 7.0).tolist() == [True, False, True]
    # Without its largest leaf (7) the first: (10 − 7) / sqrt(4 · 4/5) = 3 / 1.789 = 1.68 < 3.
    assert significant(dev, var, n, 1.0, 3.0, 7.0, np.array([7.0, 0.0, 8.0])).tolist() == [
        False,
        False,
        True,
    ]
    # ... with a largest leaf of 1: 9 / 1.789 = 5.03 ≥ 3.
    assert significant(dev, var, n, 1.0, 3.0, 7.0, np.array([1.0, 0.0, 8.0])).tolist() == [
        True,
        False,
        True,
    ]


def test_additive_move_scales_every_leaf_and_stops_at_zero():
    # An element whose three leaves (expected 100, 1 and 0) all went to zero; floor 1.
    # k = (0 + 3·1) / (101 + 3·1) = 3/104 = 0.028846.
    # Leaf 100: max(0.028846 · 101, 1) = 2.913 → log(2.913/101) = log(0.028846) = −3.5458.
    # Leaf 1: max(0.028846 · 2, 1) = 1 → log(1/2) = −0.6931, exactly its own log ratio
    # log((0+1)/(1+1)):
    # it moved as far as it could and votes for the move. Leaf 0: log(1/1) = 0 (no weight).
    ph = additive_move(np.array([100.0, 1.0, 0.0]), 0.0, 101.0, 3, 1.0)
    assert ph.tolist() == pytest.approx([math.log(3 / 104), math.log(1 / 2), 0.0])


def test_tiny_leaves_that_went_to_zero_do_not_vote_against_their_element():
    g = grid(a=2, b=8)
    # a0: every leaf to zero; its leaves are 1000 (b0..b3) and 1 (b4..b7) expected. a1: ±1 % noise.
    f = np.where(g.b.isin(["b0", "b1", "b2", "b3"]), 1000.0, 1.0)
    v = np.where(g.a == "a0", 0.0, f * np.where(np.arange(len(g)) % 2 == 0, 1.01, 0.99))
    s = search_of(g, ADDITIVE, {"v": v, "f": f})
    z, purity, _ = s.assess((g.a == "a0").to_numpy())
    # Every leaf of a0 fell as far as it could (a 1-leaf to the floor exactly): all vote for
    # the move.
    assert purity == 1.0 and z < 0


def test_a_leaf_votes_with_its_element_down_to_a_tenth_of_the_move_as_split_counts_it():
    # Expected rate 0.02 in 10,000 trials (200 events); the element moves ×6 (rate 0.12,
    # log 1.792). Leaves with 1,200, 400 (×2, log 0.693 = 39 % of the move), 260 (log 0.262,
    # 15 %), 212 (log 0.058, 3 %) and 200 events (unchanged).
    n, p = np.full(5, 10_000.0), np.full(5, 0.02)
    h = np.array([1200.0, 400.0, 260.0, 212.0, 200.0])
    rm = np.full(5, 0.12)
    # A leaf fits its own fraction f of the move (clipped to [0.1, 1]): ×6, ×2 and log 0.262
    # fit themselves (f = 1, 0.39, 0.15), better than unchanged. 212 events: f clipped up to
    # 0.1, rate 0.02 · e^0.179 = 0.0239 (239 expected) — 212 is nearer 200 than 239 (the
    # binomial log-likelihood at 0.0239 is below that at 0.02): no. 200: no.
    assert votes_ratio(h, n, p, rm, 0.1).tolist() == [True, True, True, False, False]
    # The midpoint rule votes ×2 against a ×6 element: nearer unchanged (0.693 < 1.792 / 2).
    assert votes_ratio(h, n, p, rm, 1.0).tolist() == [True, False, False, False, False]
    # Additive, standardised log ratios against an element's move of −8 noise units: −8, −3
    # (37 %), −1.2 (15 %) fit their own fraction; −0.3 (f clipped to 0.1: −0.8, and |−0.3 + 0.8|
    # = 0.5 > 0.3) is nearer zero; +2 moved the other way.
    hs = np.array([-8.0, -3.0, -1.2, -0.3, 2.0])
    ph = np.full(5, -8.0)
    assert votes_additive(hs, ph, 0.1).tolist() == [True, True, True, False, False]


def test_a_rate_cause_whose_children_moved_unevenly_climbs_whole():
    # Element a0 (rate 0.02 → 0.12 in b0: ×6) and its sibling (a0, b1) at ×2; a1 unchanged. The
    # winner (a0, b0) climbs to a0: (a0, b1)'s 400 events against 200 expected (z = 200 /
    # sqrt(10,000 · 0.02 · 0.98) = 14.3) moved on their own, and with votes to a tenth of the
    # move a0 is pure (both leaves vote for it); by the midpoint rule (a0, b1) would vote
    # "unchanged" and hold 10,000 · KL of a0's weight.
    g = grid(a=2, b=2)
    vn = np.select([(g.a == "a0") & (g.b == "b0"), (g.a == "a0")], [1200.0, 400.0], 200.0)
    cols = {"vn": vn, "vd": np.full(4, 10_000.0), "fn": np.full(4, 200.0), "fd": np.full(4, 10_000.0)}
    s = search_of(g, RATIO, cols)
    child = ((g.a == "a0") & (g.b == "b0")).to_numpy()
    sub, member = climb(s, (0, 1), child, 1)
    assert sub == (0,) and member.tolist() == (g.a == "a0").tolist()


def test_rank_is_the_fit_less_the_residue_the_move_leaves():
    # Two elements of equal fit: the one whose leaves would gain more each at its own value
    # leaves that much unexplained by its one move and ranks lower.
    fit, saturated = np.array([100.0, 100.0, 60.0]), np.array([100.0, 160.0, 60.0])
    assert rank(fit, saturated).tolist() == [100.0, 40.0, 60.0]


def test_a_mix_of_a_cause_and_a_partly_moved_bucket_does_not_outrank_the_cause():
    # Hit rate 0.65 everywhere; the cause: replica r0's short buckets b0 and b1 lose every hit,
    # on both models. Next to them (r0, m0, b2) drops a little, 0.65 → 0.58, and (r0, m0, b3)
    # is unchanged. (r0, m0) gathers 3000 zeroed lookups with 800 that hardly moved: its one
    # move (common rate 471 / 3800 = 0.12) fits by ≈ 2270, more than (r0, b0)'s 1800 zeroed
    # lookups (≈ 1890), and 79 % of its weighted votes agree, so ranked by fit it was named.
    # Its residue — its zeroed leaves would gain ≈ 3150 at rate 0 — ranks it ≈ 1390, below
    # (r0, b0), whose move explains its leaves fully.
    lookups = {
        ("m0", "b0"): 1500,
        ("m0", "b1"): 1500,
        ("m0", "b2"): 700,
        ("m0", "b3"): 100,
        ("m1", "b0"): 300,
        ("m1", "b1"): 300,
        ("m1", "b2"): 700,
        ("m1", "b3"): 100,
    }
    rows = []
    for r, (m, b), c in itertools.product(["r0", "r1"], lookups, ["c0", "c1"]):
        n = lookups[m, b] / 2
        vn = 0.65 * n
        if r == "r0" and b in ("b0", "b1"):
            vn = 0.0
        elif r == "r0" and (m, b) == ("m0", "b2"):
            vn = 0.58 * n
        rows.append((r, m, b, c, vn, n, 0.65 * n, n))
    g = pd.DataFrame(rows, columns=["r", "m", "b", "c", "vn", "vd", "fn", "fd"])
    loc = localize(g, ["r", "m", "b", "c"], v_num="vn", v_den="vd", f_num="fn", f_den="fd")
    assert [c.element for c in loc.causes] == [{"r": "r0", "b": "b0"}, {"r": "r0", "b": "b1"}]


# -- 4. climb and split ----------------------------------------------------------------------------


def test_a_rate_cause_climbs_to_the_parent_whose_other_leaves_moved_too():
    g = grid(a=2, b=2)
    vn = np.where(g.a == "a0", 300.0, 500.0)  # a0's two leaves: rate 0.5 → 0.3; a1 unchanged
    cols = {"vn": vn, "vd": np.full(4, 1000.0), "fn": np.full(4, 500.0), "fd": np.full(4, 1000.0)}
    s = search_of(g, RATIO, cols)
    child = ((g.a == "a0") & (g.b == "b0")).to_numpy()
    sub, member = climb(s, (0, 1), child, -1)
    # Parent a0: its other leaf (a0, b1) moved on its own, z = (300 − 500) / sqrt(1000 · 0.25)
    # = −12.6
    # (beyond −2.33, one test at α = 0.01), and both its leaves vote for the move. Parent b0's
    # other leaf
    # (a1, b0) did not move (z = 0).
    assert sub == (0,) and member.tolist() == (g.a == "a0").tolist()


def test_an_element_splits_when_a_large_part_did_not_move_but_not_for_a_tiny_part():
    g = grid(a=2, b=2, c=4)
    noise = np.where(np.arange(len(g)) % 2 == 0, 1.01, 0.99)
    a0, a0b0 = (g.a == "a0").to_numpy(), ((g.a == "a0") & (g.b == "b0")).to_numpy()
    f = np.full(len(g), 100.0)
    s = search_of(g, ADDITIVE, {"v": np.where(a0b0, 50.0, f * noise), "f": f})
    # (a0, b1) did not move and holds 4 · (100 + 100) = 800 of a0's 1600 of expected size: 50
    # % ≥ 10 %.
    parts = split(s, (0,), a0, -1)
    assert (
        parts is not None
        and [p[0] for p in parts] == [(0, 1)]
        and parts[0][1].tolist() == a0b0.tolist()
    )
    # The same with (a0, b1)'s four leaves expected at 1 (floor 1): 4 · (1 + 1) = 8 of 8 + 4 ·
    # 101 = 412,
    # 1.9 % < 10 % — not a reason to split (by leaf count it would be 4 of 8, 50 %).
    f = np.where((g.a == "a0") & (g.b == "b1"), 1.0, 100.0)
    s = search_of(g, ADDITIVE, {"v": np.where(a0b0, 50.0, f * noise), "f": f})
    assert split(s, (0,), a0, -1) is None


def _buckets(b3_rate):
    """Replica r0's buckets b0–b2 (1000 lookups each) lose every hit, rate 0.6 → 0; its
    bucket b3 (2000 lookups) goes 0.6 → ``b3_rate``; replica r1 is unchanged."""
    g = grid(r=2, b=4)
    vd = np.where(g.b == "b3", 2000.0, 1000.0)
    rate = np.where(g.r == "r0", np.where(g.b == "b3", b3_rate, 0.0), 0.6)
    return g, {"vn": rate * vd, "vd": vd, "fn": 0.6 * vd, "fd": vd}


def test_an_element_splits_off_a_child_that_kept_nearly_all_it_had():
    g, cols = _buckets(0.56)
    s = search_of(g, RATIO, cols)
    r0 = (g.r == "r0").to_numpy()
    # b3 moved on its own: z = (1120 − 1200) / sqrt(2000 · 0.6 · 0.4) = −3.7, beyond |z| < 2.
    # But as log factors it moved log(1120 / 1200) = −0.069, under 10 % of r0's
    # log(1120 / 3000) = −0.985 (7 %), and it holds 1200 of r0's 3000 expected hits (40 %):
    # r0 splits into the three buckets that lost everything.
    parts = split(s, (0,), r0, -1)
    assert parts is not None and [p[0] for p in parts] == [(0, 1)] * 3
    assert sorted(g.b[p[1]].item() for p in parts) == ["b0", "b1", "b2"]


def test_an_element_whose_children_moved_unevenly_is_not_split():
    g, cols = _buckets(0.45)
    s = search_of(g, RATIO, cols)
    # b3 moved log(900 / 1200) = −0.29, 24 % of r0's log(900 / 3000) = −1.20: unevenly, but
    # with the element — r0 stays whole (as a rate cause often moves its children unevenly).
    assert split(s, (0,), (g.r == "r0").to_numpy(), -1) is None


# -- 5. cover --------------------------------------------------------------------------------------


def test_cover_names_the_moved_element_and_takes_its_leaves():
    g = grid(a=2, b=2, c=4)
    a0b0 = ((g.a == "a0") & (g.b == "b0")).to_numpy()
    f = np.full(len(g), 100.0)
    v = np.where(a0b0, 50.0, f * np.where(np.arange(len(g)) % 2 == 0, 1.01, 0.99))
    s = search_of(g, ADDITIVE, {"v": v, "f": f})
    names = [(d, np.asarray(g[d].factorize()[1], dtype=object)) for d in g.columns]
    codes = [g[d].factorize()[0] for d in g.columns]
    causes, taken = cover(s, v - f, codes, names, np.ones(len(g), bool), 10, 0.0, True)
    # One cause, (a0, b0): its 4 leaves each lost 50 → change −200 of a total |change| of 200
    # + 12 · 1 = 212.
    assert [c.element for c in causes] == [{"a": "a0", "b": "b0"}]
    assert taken.tolist() == a0b0.tolist()
    assert causes[0].change == -200.0 and causes[0].score == pytest.approx(200 / 212)


# -- 6. absorb -------------------------------------------------------------------------------------


def test_a_parent_found_later_absorbs_its_child_moving_the_same_way():
    child = RootCause({"a": "a1", "b": "b1"}, 0.3, float("nan"), 4, 4, -1, -10.0)
    other = RootCause({"c": "c2"}, 0.1, float("nan"), 5, 5, -1, -3.0)
    up = RootCause({"a": "a1", "b": "b2"}, 0.05, float("nan"), 2, 2, +1, 1.0)
    parent = RootCause({"a": "a1"}, 0.2, float("nan"), 6, 5, -1, -5.0)
    out = absorb([child, other, up], parent)
    # The child (same direction, below a1) merges: score 0.2 + 0.3 = 0.5, leaves 6 + 4 = 10,
    # abnormal 5 + 4 = 9,
    # change −5 − 10 = −15, in the child's place; (a1, b2) moved up and stays.
    assert [c.element for c in out] == [{"a": "a1"}, {"c": "c2"}, {"a": "a1", "b": "b2"}]
    assert (out[0].score, out[0].leaves, out[0].abnormal_leaves, out[0].change) == (
        0.5,
        10,
        9,
        -15.0,
    )


# -- 7. explain ------------------------------------------------------------------------------------


def test_explanatory_power_splits_the_change_into_causes_rest_and_mix():
    loc = Localization(
        [
            RootCause({"a": "a1"}, 0.5, float("nan"), 4, 4, -1, -15.0),
            RootCause({"b": "b2"}, 0.1, float("nan"), 2, 2, +1, 3.0),
        ],
        "v",
        80.0,
        100.0,
        6,
        20,
    )
    explain(loc, -20.0, 0.0, -20.0)
    # rest = −20 − (−15 + 3) = −8; gross = 15 + 3 + 8 = 26; the total fell, so a part falling
    # is positive:
    # a1: −1 · −15/26 = 0.5769, b2: −1 · 3/26 = −0.1154.
    assert loc.rest == -8.0 and loc.change == -20.0
    assert [c.explanatory_power for c in loc.causes] == pytest.approx([15 / 26, -3 / 26])


# -- properties of the whole method ----------------------------------------------------------------


def _planted(measure: str, seed: int = 7) -> tuple[pd.DataFrame, list[str], dict]:
    """A sparse table (a third of the leaves zero in both columns) with two planted causes."""
    rng = np.random.default_rng(seed)
    g = grid(a=6, b=8, c=5, d=4)
    dims = list(g.columns)
    m = ((g.a == "a2") & (g.c == "c1")).to_numpy() | ((g.b == "b5") & (g.d == "d3")).to_numpy()
    if measure == "additive":
        f = rng.lognormal(3, 1.5, len(g)) * (rng.random(len(g)) > 0.33)
        v = np.where(m, f * 0.4, f * (1 + rng.normal(0, 0.02, len(g))))
        return g.assign(v=v, f=f), dims, {"v": "v", "f": "f"}
    den = rng.poisson(200, len(g)) + 1
    p = rng.beta(8, 3, len(g))
    num = rng.binomial(den, np.where(m, p * 0.5, p))
    return (
        g.assign(vn=num, vd=den, fn=p * den, fd=den),
        dims,
        dict(v_num="vn", v_den="vd", f_num="fn", f_den="fd"),
    )


@pytest.mark.parametrize("measure", ["additive", "ratio"])
def test_permuted_dimensions_and_renamed_values_give_the_same_elements(measure):
    df, dims, cols = _planted(measure)
    plain = localize(df, dims, **cols)
    assert elements(plain) == {
        frozenset({("a", "a2"), ("c", "c1")}),
        frozenset({("b", "b5"), ("d", "d3")}),
    }
    rng = np.random.default_rng(1)
    # New names for the dimensions (in another order) and their values (opaque tokens), rows
    # shuffled.
    order = [dims[i] for i in rng.permutation(len(dims))]
    rename = {d: f"x{i}" for i, d in enumerate(order)}
    tokens = {d: {v: f"q{rng.integers(10**9)}" for v in df[d].unique()} for d in dims}
    other = df.assign(**{d: df[d].map(tokens[d]) for d in dims}).rename(columns=rename)
    other = other[[rename[d] for d in order] + list(cols.values())].sample(frac=1.0, random_state=3)
    renamed = localize(other.reset_index(drop=True), [rename[d] for d in order], **cols)
    back = {x: d for d, x in rename.items()}
    untoken = {d: {t: v for v, t in tokens[d].items()} for d in dims}
    got = {
        frozenset((back[k], untoken[back[k]][v]) for k, v in c.element.items())
        for c in renamed.causes
    }
    assert got == elements(plain)
    assert [c.score for c in renamed.causes] == pytest.approx([c.score for c in plain.causes])


def test_a_miss_class_column_is_a_dimension_like_any_other():
    classes = ["cold", "drifted", "isolated", "evicted", "elsewhere", "partial"]
    rng = np.random.default_rng(5)
    g = pd.DataFrame(
        list(
            itertools.product(
                ["acme", "globex", "initech", "hooli"], ["prefix_kv", "response"], classes
            )
        ),
        columns=["tenant", "layer", "miss_class"],
    )
    expected = rng.lognormal(4, 0.5, len(g))
    hit = ((g.tenant == "globex") & (g.miss_class == "evicted")).to_numpy()
    misses = np.where(hit, expected * 3.0, expected * (1 + rng.normal(0, 0.02, len(g))))
    loc = localize(
        g.assign(misses=misses, misses_exp=expected),
        ["tenant", "layer", "miss_class"],
        v="misses",
        f="misses_exp",
    )
    assert [c.element for c in loc.causes] == [{"tenant": "globex", "miss_class": "evicted"}]
    assert loc.causes[0].direction == 1
