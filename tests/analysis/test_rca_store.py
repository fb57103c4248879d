"""Root cause straight from a store: the significance gate, the baseline clamp,
`warmscope rca --store --window` and `--export`."""

import json
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from warmscope.analysis.drilldown import drill_down, regression_test
from warmscope.app.cli import rca as cli_rca
from warmscope.collectors.store import EmbeddedStore

T0 = 1_800_000_000.0  # a realistic Unix time (2027-01-15)
TENANTS = ["acme", "globex", "hooli"]
LAYERS = ["response", "prefix_kv"]


def lookups(minutes=120, fault_from=None, seed=0, n=400, rate=0.7):
    """Per-minute lookups per tenant × layer; from minute ``fault_from`` on,
    globex's response cache misses everything."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(minutes):
        ts = T0 + 60.0 * (m + 1)
        for t in TENANTS:
            for layer in LAYERS:
                p = 0.0 if fault_from is not None and m >= fault_from and (t, layer) == ("globex", "response") \
                    else rate
                hits = int(rng.binomial(n, p))
                for result, c in (("hit", hits), ("miss", n - hits)):
                    if c:
                        rows.append((ts, t, layer, f"{layer}:doc:*", result, "", "A", "m", "r0",
                                     "1024" if layer == "prefix_kv" else "", c))
    cols = ["ts", "tenant", "layer", "family", "result", "experiment", "variant", "model", "replica",
            "length_bucket", "count"]
    return rows, pd.DataFrame(rows, columns=cols)


def test_flat_range_says_no_significant_regression():
    _, lk = lookups()
    dd = drill_down(lk, anomaly=(T0 + 3600, T0 + 7200))
    assert not dd.significant and dd.localization.causes == []
    assert "no significant regression in this range" in dd.localization.notes[0]
    # the p-value is read against the test's α (a p of 0.012 is "no regression" only at α = 0.01)
    assert "not below the test's α = 0.01" in dd.localization.notes[0] or "too few minutes" in dd.localization.notes[0]


def test_injected_fault_is_significant_and_localised():
    _, lk = lookups(fault_from=80)
    dd = drill_down(lk, anomaly=(T0 + 80 * 60, T0 + 7200))
    assert dd.significant and dd.test["p"] < 1e-6
    assert [c.element for c in dd.localization.causes] == [{"tenant": "globex", "layer": "response"}]
    # globex × response is 1/6 of the traffic and fell 0.7 -> 0: the aggregate falls by about
    # 0.7 / 6 = 0.1167 (11.7 points); the cause holds nearly all of it.
    assert dd.localization.change == pytest.approx(-0.7 / 6, abs=0.01)
    assert dd.localization.causes[0].explanatory_power > 0.9


def test_dimensions_a_source_lacks_are_named_not_dropped_silently():
    """A source that maps only some labels onto the lookups frame: the cause is still found over the rest,
    and a note names what was not searched."""
    _, lk = lookups(fault_from=80)
    dd = drill_down(lk.drop(columns=["model", "length_bucket"]), anomaly=(T0 + 80 * 60, T0 + 7200))
    assert [c.element for c in dd.localization.causes] == [{"tenant": "globex", "layer": "response"}]
    assert "not searched: model, length_bucket (the source's lookups carry no such labels)" in dd.localization.notes
    # the same on a flat range (no regression: the note still says what a search would have left out)
    _, flat = lookups()
    dd = drill_down(flat.drop(columns=["replica"]), anomaly=(T0 + 3600, T0 + 7200))
    assert not dd.significant and dd.localization.notes[-1] == (
        "not searched: replica (the source's lookups carry no such label)")
    # a frame that carries none of the dimensions asked for: one clear message, no search
    dd = drill_down(lk, anomaly=(T0 + 80 * 60, T0 + 7200), dims=["engine"])
    assert dd.localization.error == "the lookups carry none of the dimensions asked for (engine)"
    # all present (the store's own frame): no such note
    dd = drill_down(lk, anomaly=(T0 + 80 * 60, T0 + 7200))
    assert not any(n.startswith("not searched") for n in dd.localization.notes)


def test_baseline_never_starts_before_the_data():
    _, lk = lookups(minutes=60)
    dd = drill_down(lk, anomaly=(T0 + 20 * 60, T0 + 60 * 60))  # 40 min window, 20 min of data before it
    assert dd.baseline[0] >= T0 - 1e-6 and dd.baseline[1] == T0 + 20 * 60
    dd = drill_down(lk, anomaly=(T0, T0 + 30 * 60))
    assert dd.localization.error and "no data before the window" in dd.localization.error


def test_regression_test_is_welchs_t_and_holds_its_level_on_a_flat_line():
    _, lk = lookups(fault_from=60, seed=3)
    res = regression_test(lk, (T0 + 3600, T0 + 7200), (T0, T0 + 3600))
    # Same numbers through scipy: per-minute effective hit rates of the two windows.
    hits = np.where(lk.result == "hit", lk["count"], 0)
    g = pd.DataFrame({"m": ((lk.ts - T0 - 1) // 60).astype(int), "h": hits, "n": lk["count"]}).groupby("m").sum()
    r = (g.h / g.n).to_numpy()
    ref = stats.ttest_ind(r[60:], r[:60], equal_var=False)
    assert res["t"] == pytest.approx(ref.statistic) and res["p"] == pytest.approx(ref.pvalue)
    # A/A: on flat binomial traffic the gate rejects at about its alpha (0.01).
    rej = [regression_test(lookups(minutes=40, seed=s, n=100)[1], (T0 + 1200, T0 + 2400), (T0, T0 + 1200))["p"]
           < 0.01 for s in range(200)]
    assert np.mean(rej) <= 0.04


@pytest.fixture()
def store(tmp_path):
    rows, _ = lookups(fault_from=80)
    path = tmp_path / "s.sqlite"
    st = EmbeddedStore(path)
    st.write({"lookups": rows})
    st.close()
    return path


def iso(t):
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_cli_localises_a_store_window_and_exports_the_leaves(store, tmp_path, capsys):
    out_csv = tmp_path / "leaves.csv"
    code = cli_rca.main(["--store", str(store), "--window", f"{iso(T0 + 80 * 60)}..{iso(T0 + 7200)}",
                         "--export", str(out_csv), "--compact"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert [c["element"] for c in json.loads(cap.out)] == [{"tenant": "globex", "layer": "response"}]
    leaves = pd.read_csv(out_csv, keep_default_na=False)
    assert {"tenant", "layer", "hits", "lookups", "hits_exp", "lookups_exp"} <= set(leaves.columns)
    assert len(leaves) == 6 and "wrote 6 leaves" in cap.err
    # The exported table gives the same answer through the CSV path.
    code = cli_rca.main([str(out_csv), "--dims", "tenant", "layer", "--v-num", "hits", "--v-den", "lookups",
                         "--f-num", "hits_exp", "--f-den", "lookups_exp", "--compact"])
    assert code == 0 and json.loads(capsys.readouterr().out)[0]["element"] == {"tenant": "globex",
                                                                             "layer": "response"}


def test_cli_store_window_errors(store, tmp_path, capsys):
    for argv, needle in (
        (["--store", str(store), "--window", "yesterday"], "write START..END"),
        (["--store", str(store), "--window", f"{T0 + 600:.0f}..{T0:.0f}"], "END must be after START"),
        (["--store", str(tmp_path / "none.sqlite"), "--window", f"{T0:.0f}..{T0 + 60:.0f}"], "no store at"),
        (["--store", str(store)], "needs --window"),
        (["--store", str(store), "--window", f"{T0:.0f}..{T0 + 600:.0f}"], "no data before the window"),
    ):
        assert cli_rca.main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, (argv, err)
    # A flat window: [] on stdout, the reason on stderr.
    assert cli_rca.main(["--store", str(store), "--window", f"{T0 + 1800:.0f}..{T0 + 3600:.0f}"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == [] and "no significant regression" in cap.err
