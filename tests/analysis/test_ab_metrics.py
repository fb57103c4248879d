"""The A/B metric list: one entry drives the stored sums, the report, the
picker's choices and the verdict's direction; A/B/n reports."""

import random
import sqlite3

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.ab import Result, adjust, compare
from warmscope.analysis.ab_report import (
    better,
    build_report,
    build_report_from_moments,
    metric_stats,
    moment_stats,
    render_markdown,
)
from warmscope.collectors import EmbeddedStore
from warmscope.collectors.store import _TABLES
from warmscope.model import ab_metrics as AM
from warmscope.model.ab_metrics import METRICS, Metric

EXTRA = Metric("value per request", "ratio", "value", "requests", "higher")


def _units(n=600, arms="ABC", seed=3, lift=None):
    """Synthetic unit rows (the store's ``units()`` shape) with two cache layers."""
    rnd = np.random.default_rng(seed)
    lift = lift or {}
    rows = []
    for i in range(n):
        v = arms[i % len(arms)]
        req = int(rnd.integers(1, 8))
        lat = float(rnd.gamma(2.0, 0.5, req).sum()) * (1 - lift.get(v, 0.0))
        hist = np.bincount(rnd.integers(0, AM.NB, req), minlength=AM.NB)
        lk = int(rnd.integers(1, 20))
        rows.append({"experiment": "e", "variant": v, "unit_hash": f"u{i}", "first_ts": 1000.0 + i,
                     "last_ts": 1010.0 + i, "requests": req, "latency_sum": lat, "latency_sq": lat * lat / req,
                     "ttft_sum": lat / 5, "conversions": int(rnd.random() < 0.3), "value": float(rnd.random() * 4),
                     "gpu_s": lat / 10, "sla_met": req - int(rnd.integers(0, 2)) if req > 1 else 1,
                     **{f"h{k}": int(hist[k]) for k in range(AM.NB)},
                     "lookups_kv": lk, "hits_kv": int(rnd.binomial(lk, 0.6 + lift.get(v, 0.0))),
                     "lookups_resp": lk, "hits_resp": int(rnd.binomial(lk, 0.3))})
    return pd.DataFrame(rows)


def _moments_of(u: pd.DataFrame, metrics):
    """Per-arm ab_moments / ab_layer_moments rows from the encoding (numpy), as the store keeps them."""
    vals = u[["first_ts", "last_ts", *AM.FIELDS, *[f"h{k}" for k in range(AM.NB)]]].to_numpy(float)
    c = AM.contributions(vals, np.ones(len(u)), metrics)
    cols = AM.columns_for(metrics)
    m = pd.concat([pd.DataFrame({"variant": u["variant"].to_numpy(), "bucket": AM.bucket_of(u["first_ts"])}),
                   pd.DataFrame(c, columns=list(cols))], axis=1)
    gb = m.groupby(["variant", "bucket"])
    mm = gb.sum()
    mm["min_first"], mm["max_last"] = gb["min_first"].min(), gb["max_last"].max()
    mm = mm.reset_index()
    lrows = []
    for layer in ("kv", "resp"):
        lc = AM.layer_contributions(u[f"lookups_{layer}"], u[f"hits_{layer}"], np.ones(len(u)))
        d = pd.DataFrame(lc, columns=list(AM.LAYER_COLUMNS))
        d.insert(0, "variant", u["variant"].to_numpy())
        d.insert(1, "bucket", AM.bucket_of(u["first_ts"]))
        d.insert(2, "layer", layer)
        lrows.append(d)
    lm = pd.concat(lrows).groupby(["variant", "bucket", "layer"], as_index=False).sum()
    return mm, lm


def test_a_metric_added_to_the_list_appears_in_the_stored_sums_the_report_and_the_picker():
    metrics = METRICS + (EXTRA,)
    assert "x_value" in AM.columns_for(metrics) and "x_value" not in AM.COLUMNS  # one new sum: Σ value·requests
    u = _units()
    rep = build_report(u, "e", "A", None, metrics=metrics)
    names = [r.metric for r in rep.results]
    reported = [r.metric for r in build_report(u, "e", "A", None).results]
    assert "value per request" in names and "value per request" not in reported
    # The dashboard's primary-metric picker lists the report's metric names.
    assert set(names) == set(AM.metric_names(["kv", "resp"], metrics))
    assert "| value per request | B vs A |" in render_markdown(rep)
    # Its value: Σ value / Σ requests per arm (hand check on the rows).
    row = next(r for r in rep.results if r.metric == "value per request" and r.arm == "C")
    a, c = u[u.variant == "A"], u[u.variant == "C"]
    assert row.control == pytest.approx(a.value.sum() / a.requests.sum())
    assert row.treatment == pytest.approx(c.value.sum() / c.requests.sum())
    # The same report from the stored sums.
    mm, lm = _moments_of(u, metrics)
    rm = build_report_from_moments(mm, lm, "e", "A", None, metrics=metrics)
    for r1, r2 in zip(rep.results, rm.results, strict=True):
        assert (r1.metric, r1.arm) == (r2.metric, r2.arm)
        assert r1.treatment == pytest.approx(r2.treatment, nan_ok=True)
        assert r1.p_value == pytest.approx(r2.p_value, rel=1e-9, nan_ok=True)
    assert rep.verdict == rm.verdict


def test_moment_stats_equal_unit_stats_for_every_declared_metric():
    u = _units(seed=8)
    a = u[u.variant == "A"]
    mm, lm = _moments_of(a, METRICS)
    layers = {ly: g.drop(columns=["variant", "bucket", "layer"]).sum() for ly, g in lm.groupby("layer")}
    s_units = metric_stats(a)
    s_moms = moment_stats(mm.drop(columns=["variant", "bucket"]).sum(), layers)
    assert list(s_units) == list(s_moms) == AM.metric_names(["kv", "resp"])
    for k in s_units:
        assert s_units[k].estimate == pytest.approx(s_moms[k].estimate), k
        assert s_units[k].var_of_estimate() == pytest.approx(s_moms[k].var_of_estimate(), rel=1e-9), k


def test_direction_comes_from_the_definition_not_the_name():
    # A metric named after latency whose definition says higher is better.
    sla = Metric("latency budget met per request", "ratio", "sla_met", "requests", "higher")
    u = _units(arms="AB", seed=5)
    rep = build_report(u, "e", "A", "B", primary="latency budget met per request", metrics=METRICS + (sla,))
    r = next(r for r in rep.results if r.metric == sla.name)
    assert r.direction == "higher" and better(r) is (r.abs_effect > 0)
    lat = next(r for r in rep.results if r.metric == "latency per request (s)")
    assert lat.direction == "lower" and better(lat) is (lat.abs_effect < 0)
    assert AM.lower_is_better("P95 latency (s)") and not AM.lower_is_better("hit rate (prefix_kv)")
    with pytest.raises(KeyError):
        AM.lower_is_better("latency of something undeclared")
    undeclared = Result(metric="x", kind="ratio", control=1, treatment=2, abs_effect=1, abs_low=0, abs_high=2,
                        rel_effect=1, rel_low=0, rel_high=2, p_value=0.01, n_control=10, n_treatment=10, test="z")
    assert better(undeclared) is None  # no declared direction: no colour, never a guess


def test_a_bad_definition_is_a_clear_error():
    with pytest.raises(ValueError, match="not a unit field"):
        Metric("x", "ratio", "tokens", "requests", "higher")
    with pytest.raises(ValueError, match="direction must be"):
        Metric("x", "mean", "value", None, "up")
    with pytest.raises(ValueError, match="needs a denominator"):
        Metric("x", "ratio", "value", None, "higher")


def test_three_arms_each_against_control_with_holm_over_the_arms():
    u = _units(n=3000, seed=11, lift={"C": 0.08})
    rep = build_report(u, "e", "A", None, primary="latency per request (s)")
    assert rep.treatments == ["B", "C"] and rep.multi_arm
    assert len(rep.srm_units.observed) == 3 and not rep.srm_units.flagged
    prim = [r for r in rep.results if r.primary]
    assert [r.arm for r in prim] == ["B", "C"]
    # Holm over the two arms: p_(1)·2, then max(that, p_(2)) — checked against the helper and by hand.
    holm, _ = adjust([r.p_value for r in prim])
    assert [r.p_holm for r in prim] == pytest.approx(list(holm))
    lo, hi = sorted(r.p_value for r in prim)
    assert sorted(r.p_holm for r in prim) == pytest.approx([min(2 * lo, 1), min(max(2 * lo, hi), 1)])
    # Each row equals the two-arm comparison of that arm with the control.
    c = next(r for r in prim if r.arm == "C")
    s = metric_stats(u[u.variant == "A"], "latency per request (s)")["latency per request (s)"]
    t = metric_stats(u[u.variant == "C"], "latency per request (s)")["latency per request (s)"]
    assert c.abs_effect == pytest.approx(compare("x", s, t).abs_effect)
    assert c.p_holm < 0.05 and "C beats A" in rep.verdict and "Holm" in rep.verdict
    # The other metrics: Holm over every non-primary (metric, arm) row.
    others = [r for r in rep.results if not r.primary and np.isfinite(r.p_value)]
    holm_o, _ = adjust([r.p_value for r in others])
    assert [r.p_holm for r in others] == pytest.approx(list(holm_o))
    assert {tuple(d.arm.unique()) for _, d in rep.effect_over_time.groupby("arm")} == {("B",), ("C",)}
    # each arm's band, its edges and its line in one colour (the band's legend entry showed another arm's)
    from warmscope.analysis.ab_report import effect_figure

    traces = effect_figure(rep).data
    for i in range(0, len(traces), 3):
        upper, band, line = traces[i : i + 3]
        assert upper.mode == band.mode == "lines" and upper.line.width == band.line.width == 0
        assert upper.line.color == band.line.color == line.line.color
        assert band.fillcolor.replace("rgba", "rgb").rsplit(",", 1)[0] + ")" == line.line.color
    md = render_markdown(rep)
    assert "B, C vs A" in md and "| B vs A |" in md and "| C vs A |" in md


def test_a_store_gains_the_sums_of_a_newly_declared_metric(tmp_path):
    path = tmp_path / "s.sqlite"
    st = EmbeddedStore(path)
    rnd = random.Random(2)
    cols = _TABLES["ab_units"]
    rows = [("e", "AB"[i % 2], f"u{i}", 1000.0 + i, 1001.0 + i,
             *[rnd.randint(0, 3) if c not in ("latency_sum", "latency_sq", "ttft_sum", "value", "gpu_s")
               else rnd.random() for c in cols[5:]]) for i in range(80)]
    st.write({"ab_units": rows, "ab_lookups": []})
    before, _ = st.moments("e")
    st.close()
    # An older store lacks a sum the list now needs (here: dropped by hand).
    con = sqlite3.connect(path)
    con.execute('ALTER TABLE ab_moments DROP COLUMN "x_gpu_s"')
    con.commit()
    con.close()
    st = EmbeddedStore(path)  # a writable open adds the column and recomputes the sums from the unit rows
    after, _ = st.moments("e")
    st.close()
    b, a = before.sort_values(["variant", "bucket"]), after.sort_values(["variant", "bucket"])
    assert a["x_gpu_s"].to_numpy() == pytest.approx(b["x_gpu_s"].to_numpy()) and a["x_gpu_s"].sum() > 0


def test_report_ab_cli_compares_the_arms_it_is_given(tmp_path, capsys):
    from warmscope.app.cli.main import main as cli_main

    path = tmp_path / "abc.sqlite"
    st = EmbeddedStore(path)
    u = _units(n=900, seed=4)
    cols = _TABLES["ab_units"]
    st.write({"ab_units": [tuple(r[c] for c in cols) for _, r in u.iterrows()],
              "ab_lookups": [("e", r.variant, r.unit_hash, ly, int(r[f"lookups_{ly}"]), int(r[f"hits_{ly}"]))
                             for _, r in u.iterrows() for ly in ("kv", "resp")]})
    st.close()
    out = tmp_path / "r.html"
    base = ["--store", str(path), "report", "ab", "--experiment", "e", "--out", str(out)]
    assert cli_main(base) == 0  # default: every arm besides the control
    md = out.with_suffix(".md").read_text()
    assert "B, C vs A" in md and "| C vs A |" in md and "Holm over 2 arms" in capsys.readouterr().out
    assert cli_main(base + ["--treatment", "C", "--primary", "hit rate (kv)"]) == 0
    md = out.with_suffix(".md").read_text()
    assert "C vs A" in md and "| B vs A |" not in md and "★ hit rate (kv)" in md
    assert cli_main(base + ["--treatment", "B,C", "--control", "B"]) == 2
    assert "same variant" in capsys.readouterr().err
    assert cli_main(base + ["--treatment", "Z"]) == 2
    assert "--treatment 'Z' is not a variant of 'e'; variants: A, B, C" in capsys.readouterr().err
