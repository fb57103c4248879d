import itertools
import json

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.drilldown import change_point, drill_down
from warmscope.analysis.rootcause import localize

DIMS = {"a": 8, "b": 6, "c": 5, "d": 4, "e": 4}


def cube(seed=0):
    rng = np.random.default_rng(seed)
    g = pd.DataFrame(
        list(itertools.product(*[[f"{k}{i}" for i in range(n)] for k, n in DIMS.items()])),
        columns=list(DIMS),
    )
    return g, rng


def elements(loc):
    return {frozenset(c.element.items()) for c in loc.causes}


@pytest.mark.parametrize("seed", range(5))
def test_planted_additive_anomalies_are_found(seed):
    g, rng = cube(seed)
    f = rng.lognormal(3, 1, len(g))
    v = f * (1 + rng.normal(0, 0.05, len(g)))
    planted = [{"a": f"a{seed}", "b": "b2"}, {"c": "c4"}]
    m = np.zeros(len(g), bool)
    for p in planted:
        m |= np.logical_and.reduce([g[k] == val for k, val in p.items()])
    df = g.assign(v=np.where(m, v * 0.3, v), f=f)
    loc = localize(df, list(DIMS), v="v", f="f")
    assert elements(loc) == {frozenset(p.items()) for p in planted}
    assert sum(c.explanatory_power for c in loc.causes) == pytest.approx(1.0, abs=0.1)
    json.dumps([c.as_json() for c in loc.causes])


@pytest.mark.parametrize("seed", range(5))
def test_planted_ratio_anomaly_three_dimensions_deep(seed):
    g, rng = cube(seed + 10)
    den = rng.poisson(150, len(g)) + 1
    p = rng.beta(8, 3, len(g))
    planted = {"b": f"b{seed}", "d": "d1", "e": "e3"}
    m = np.logical_and.reduce([g[k] == val for k, val in planted.items()])
    num = rng.binomial(den, np.where(m, p * 0.2, p))
    df = g.assign(vn=num, vd=den, fn=p * den, fd=den)
    loc = localize(df, list(DIMS), v_num="vn", v_den="vd", f_num="fn", f_den="fd")
    assert elements(loc) == {frozenset(planted.items())}
    assert loc.observed < loc.expected


def test_no_change_and_bad_input_give_messages():
    g, rng = cube()
    f = rng.lognormal(3, 1, len(g))
    calm = localize(g.assign(v=f, f=f), list(DIMS), v="v", f="f")
    assert calm.causes == [] and calm.notes
    noisy = localize(
        g.assign(v=f * (1 + rng.normal(0, 0.02, len(g))), f=f), list(DIMS), v="v", f="f"
    )
    assert noisy.causes == []
    assert "lacks column(s)" in localize(g, ["a", "zz"], v="v", f="f").error
    assert "empty" in localize(g.iloc[:0].assign(v=1.0, f=1.0), ["a"], v="v", f="f").error


def test_change_point_finds_a_step():
    ts = np.arange(60, 120 * 60 + 1, 60.0)
    rate = np.where(ts > 80 * 60, 0.4, 0.8)
    lk = pd.concat(
        [
            pd.DataFrame({"ts": ts, "result": "hit", "count": (1000 * rate).astype(int)}),
            pd.DataFrame({"ts": ts, "result": "miss", "count": (1000 * (1 - rate)).astype(int)}),
        ]
    )
    assert change_point(lk.sort_values("ts")) == pytest.approx(80 * 60, abs=60)
    assert change_point(lk.iloc[:10]) is None


def test_drill_down_on_an_empty_frame_says_so():
    dd = drill_down(pd.DataFrame(columns=["ts", "result", "count"]))
    assert "no lookups" in dd.localization.error


def test_cli_prints_the_root_cause_set(tmp_path, capsys):
    from warmscope.app.cli.main import main as cli_main

    g, rng = cube(3)
    f = rng.lognormal(3, 1, len(g))
    m = (g.a == "a1") & (g.c == "c2")
    g.assign(obs=np.where(m, f * 0.2, f), exp=f).to_csv(tmp_path / "leaves.csv", index=False)
    leaves = str(tmp_path / "leaves.csv")
    assert cli_main(["rca", leaves, "--dims", *DIMS, "--v", "obs", "--f", "exp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["element"] == {"a": "a1", "c": "c2"} and 0.9 <= out[0]["explanatory_power"] <= 1.0
    assert (
        set(out[0]) == {"element", "score", "explanatory_power", "direction"}
        and out[0]["direction"] == "down"
    )
    assert cli_main(["rca", str(tmp_path / "nope.csv"), "--dims", "a", "--v", "o", "--f", "e"]) == 2
    assert cli_main(["rca", leaves, "--dims", "a", "--v", "obs", "--v-num", "x"]) == 2
