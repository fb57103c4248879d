"""Miss classes as evidence: the drill-down localises on miss_class, and the trap detectors read
the drifted / evicted shares (numbers by hand in the comments)."""

import pandas as pd
import pytest
from warmscope.analysis.drilldown import FRAME_DIMS, drill_down_misses, miss_leaf_table
from warmscope.analysis.traps import detect_all, miss_class_shift

COLS = ["ts", "tenant", "engine", "family", "miss_class", "tokens", "requests"]


def _misses(after: dict) -> pd.DataFrame:
    """Two hours of minutes: per minute, tenant x engine, cold 300, evicted 50, partial 200;
    from minute 61 on, the cells in ``after`` ((tenant, class) -> tokens) change."""
    rows = []
    for m in range(1, 121):
        for t in ("acme", "globex", "hooli"):
            for e in ("a-0", "a-1"):
                for c, n in (("cold", 300), ("evicted", 50), ("partial", 200)):
                    n = after.get((t, c), n) if m > 60 else n
                    rows.append((m * 60.0, t, e, "kv:chat:sys:*", c, n, 1))
    return pd.DataFrame(rows, columns=COLS)


AN, BASE = (3600.0, 7200.0), (0.0, 3600.0)


def test_the_drill_down_names_tenant_and_class():
    assert "miss_class" in FRAME_DIMS["misses"]
    m = _misses({("acme", "evicted"): 600})
    leaves = miss_leaf_table(m, AN, BASE)
    # a flush stamps its interval's end, so the window (3600, 7200] holds minutes 61..120:
    # per engine 60 x 600 = 36,000; the baseline (0, 3600], minutes 1..60: 60 x 50 = 3,000
    row = leaves[
        (leaves.tenant == "acme") & (leaves.engine == "a-0") & (leaves.miss_class == "evicted")
    ]
    assert row[["tokens", "tokens_exp"]].iloc[0].tolist() == [36_000, 3_000]
    dd = drill_down_misses(m, AN, BASE)
    top = dd.localization.causes[0]
    assert top.element == {"tenant": "acme", "miss_class": "evicted"}
    assert top.change == pytest.approx(2 * (36_000 - 3_000))  # both engines
    assert top.explanatory_power > 0.99  # nothing else moved


def test_a_drifted_rise_detects_key_drift_without_lookups():
    m = _misses({("acme", "drifted"): 0})
    drift = pd.DataFrame(
        [(60.0 * k, "acme", "a-0", "kv:chat:sys:*", "drifted", 400, 1) for k in range(61, 121)],
        columns=COLS,
    )
    fr = {"misses": pd.concat([m, drift], ignore_index=True)}
    shift = miss_class_shift(fr, AN, BASE).set_index("miss_class")
    # window (minutes 61..120): cold 300, evicted 50, partial 200 per cell: 550 x 6 cells x 60
    # minutes = 198,000, plus drifted 400 x 60 = 24,000 -> drifted share 24,000 / 222,000 = 10.8%;
    # baseline 0%.
    assert shift.loc["drifted", "share"] == pytest.approx(24_000 / 222_000)
    assert shift.loc["drifted", "share_base"] == 0
    v = {x.trap: x for x in detect_all(fr, AN, BASE)}
    assert v["dynamic_tokenisation"].detected
    assert v["dynamic_tokenisation"].scope == {"family": "kv:chat:sys:*"}
    assert "drifted 11% of missed tokens vs 0% before" in v["dynamic_tokenisation"].evidence
    assert not v["warmup_timing"].detected  # evicted did not move (no run either)


def test_without_the_class_the_verdicts_are_unchanged():
    m = _misses({})  # no drifted tokens at all: the drifted share is 0 in both windows
    with_m = {x.trap: x for x in detect_all({"misses": m}, AN, BASE)}
    without = {x.trap: x for x in detect_all({}, AN, BASE)}
    assert with_m["dynamic_tokenisation"] == without["dynamic_tokenisation"]
    # evicted was 50 / 550 = 9.1% in both windows: the timing verdict names it, still not detected
    assert not with_m["warmup_timing"].detected
    assert "evicted 9% of missed tokens vs 9% before" in with_m["warmup_timing"].evidence


def _cross_tenant_reads(layer: str = "response") -> pd.DataFrame:
    """One ``layer`` key read by acme and globex in a hot-key window of the anomaly window: the
    tenant_isolation (security) verdict on that layer."""
    rows = [(3600.0, layer, "h1", "acme"), (3600.0, layer, "h1", "globex")]
    return pd.DataFrame(rows, columns=["window", "layer", "key_hash", "tenant"])


def _with_isolated(minutes: range) -> pd.DataFrame:
    """The misses of :func:`_misses` plus 110 isolated tokens per minute on each of acme's
    two engines in ``minutes``."""
    iso = pd.DataFrame(
        [(60.0 * k, "acme", e, "kv:chat:sys:*", "isolated", 110, 1)
         for k in minutes for e in ("a-0", "a-1")],
        columns=COLS,
    )
    return pd.concat([_misses({}), iso], ignore_index=True)


def _isolation(minutes: range, layer: str):
    fr = {"misses": _with_isolated(minutes), "hot_keys": _cross_tenant_reads(layer)}
    return {x.trap: x for x in detect_all(fr, AN, BASE)}["tenant_isolation"]


def test_the_isolated_share_is_evidence_only_when_it_fell_under_a_prefix_kv_verdict():
    # isolated only in the baseline (minutes 1..60): per minute 6 cells x 550 = 3,300 plus
    # 2 x 110 = 220 isolated -> 220 / 3,520 = 6.25% before, 0% in the window: it fell
    before, during = range(1, 61), range(61, 121)
    v = _isolation(before, "prefix_kv")
    assert v.detected and v.scope == {"layer": "prefix_kv"}
    assert v.evidence.startswith("SECURITY: 1 prefix_kv keys were read by two or more tenants")
    # the blocks tenants' scopes kept apart are now reused across them: shown
    assert v.evidence.endswith("; prefix-KV misses: isolated 0% of missed tokens vs 6% before")
    assert v.numbers["isolated_share"] == 0 and v.numbers["isolated_share_base"] == 0.0625
    # isolated only in the window: 6.25% now vs 0% before, a rise is isolation working
    v = _isolation(during, "prefix_kv")
    assert v.detected and "isolated" not in v.evidence
    assert v.numbers["isolated_share"] == 0.0625 and v.numbers["isolated_share_base"] == 0
    # a response-cache verdict is not about these blocks, whichever way the share moved
    for minutes in (before, during):
        v = _isolation(minutes, "response")
        assert v.detected and v.scope == {"layer": "response"}
        assert "isolated" not in v.evidence and "prefix-KV" not in v.evidence
        assert v.evidence.startswith("SECURITY: 1 response keys were read by two or more tenants")
