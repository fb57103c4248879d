"""The store's A/B moments: kept exact under upserts, and the report they give
equals the report from unit rows."""

import random
import sqlite3

import numpy as np
import pandas as pd
import pytest
from warmscope.analysis.ab_report import build_report, build_report_from_moments
from warmscope.collectors import EmbeddedStore
from warmscope.collectors.store import _TABLES
from warmscope.model import ab_metrics as M
from warmscope.simulator import SimConfig

from tests.conftest import simulated_store

EXP = "warmup-strategy"


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("abm") / "s.sqlite"
    simulated_store(path, SimConfig.load(hours=2.0, rps=6.0, tenants=4, replicas=2, seed=4, strategy_b="static_topk"),
                    workers=2)
    return path


def _same(r1, r2):
    t1, t2 = r1.table().set_index(["metric", "arm"]), r2.table().set_index(["metric", "arm"])
    assert list(t1.index) == list(t2.index)
    for c in ("control", "treatment", "abs_effect", "abs_low", "abs_high", "rel_effect", "p_value", "p_holm",
              "seq_p", "n_control", "n_treatment"):
        assert t1[c].to_numpy(float) == pytest.approx(t2[c].to_numpy(float), rel=1e-9, abs=1e-12, nan_ok=True), c
    assert r1.units == r2.units and r1.verdict == r2.verdict
    assert r1.days_observed == pytest.approx(r2.days_observed)
    e1, e2 = r1.effect_over_time, r2.effect_over_time
    assert len(e1) == len(e2) and len(e1) >= 4
    assert list(e1["arm"]) == list(e2["arm"])
    for c in e1.columns.drop("arm"):
        assert e1[c].to_numpy(float) == pytest.approx(e2[c].to_numpy(float), rel=1e-9, abs=1e-12, nan_ok=True)


@pytest.mark.slow
def test_report_from_moments_equals_report_from_units(sim_store):
    st = EmbeddedStore(sim_store, readonly=True)
    units = st.units(EXP)
    assert len(units) > 1000
    m, lm = st.moments(EXP)
    for primary in ("latency per request (s)", "P95 latency (s)", "hit rate (prefix_kv)"):
        _same(build_report(units, EXP, primary=primary), build_report_from_moments(m, lm, EXP, primary=primary))


def test_incremental_moments_equal_a_rebuild_from_unit_rows(sim_store, tmp_path):
    # The simulator wrote units over many flush windows in two processes; the
    # SQL rebuild recomputes every sum from the final unit rows.
    copy = tmp_path / "c.sqlite"
    src = sqlite3.connect(sim_store)
    dst = sqlite3.connect(copy)
    src.backup(dst)
    src.close()
    before = EmbeddedStore(copy).moments(EXP)
    with dst:
        M.rebuild_sql(dst)
    dst.close()
    after = EmbeddedStore(copy).moments(EXP)
    for b, a in zip(before, after, strict=True):
        assert len(b) == len(a) > 0
        keys = [c for c in ("variant", "bucket", "layer") if c in b.columns]
        b, a = b.sort_values(keys).reset_index(drop=True), a.sort_values(keys).reset_index(drop=True)
        assert (b[keys] == a[keys]).all().all()
        num = [c for c in b.columns if c not in keys]
        assert b[num].to_numpy(float) == pytest.approx(a[num].to_numpy(float), rel=1e-9, abs=1e-9)


def test_upserts_keep_units_and_moments_exact(tmp_path):
    """Random batches: units recur across batches and within one, lookups arrive
    for units with no request record; the final rows and moments match an
    independent pandas fold of everything written."""
    rnd = random.Random(7)
    st = EmbeddedStore(tmp_path / "u.sqlite")
    cols = _TABLES["ab_units"]
    written_u, written_l = [], []
    for batch in range(30):
        t = 1000.0 + 300 * batch
        urows = []
        for _ in range(rnd.randint(0, 60)):
            i = rnd.randint(0, 150)
            urows.append(("e", "AB"[i % 2], f"u{i}", t, t + rnd.random() * 10,
                          *[rnd.randint(0, 3) if c not in ("latency_sum", "latency_sq", "ttft_sum", "value", "gpu_s")
                            else rnd.random() for c in cols[5:]]))
        lrows = [("e", "AB"[i % 2], f"u{i}", rnd.choice(["kv", "resp"]), rnd.randint(1, 9), rnd.randint(0, 1))
                 for i in (rnd.randint(0, 200) for _ in range(rnd.randint(0, 40)))]
        st.write({"ab_units": urows, "ab_lookups": lrows})
        written_u += urows
        written_l += lrows
    raw = pd.DataFrame(written_u, columns=list(cols))
    ref = raw.groupby("unit_hash").agg({**{c: "sum" for c in cols[5:]}, "first_ts": "min", "last_ts": "max"})
    got = st.units("e").set_index("unit_hash")
    lk_only = set(pd.DataFrame(written_l)[2]) - set(ref.index)
    assert lk_only and set(got.index) == set(ref.index) | lk_only  # a lookups-only unit gets a zero row
    for c in cols[5:]:
        assert got.loc[ref.index, c].to_numpy(float) == pytest.approx(ref[c].to_numpy(float)), c
    assert (got.loc[list(lk_only), "requests"] == 0).all()
    lk = pd.DataFrame(written_l, columns=["e", "v", "unit_hash", "layer", "lookups", "hits"])
    lref = lk.groupby(["unit_hash", "layer"])[["lookups", "hits"]].sum()
    for (uh, layer), r in lref.iterrows():
        assert got.at[uh, f"lookups_{layer}"] == r["lookups"] and got.at[uh, f"hits_{layer}"] == r["hits"]
    # Moments: totals per variant against sums over the folded units (numpy, not SQL).
    m, lm = st.moments("e")
    for v in "AB":
        g = got[got["variant"] == v]
        tot = g[["requests", "latency_sum", "conversions"]].to_numpy(float)
        mv = m[m["variant"] == v].sum(numeric_only=True)
        assert mv["n"] == len(g) and mv["pos"] == (g["conversions"] > 0).sum()
        assert mv["q_latency_sum"] == pytest.approx((tot[:, 1] ** 2).sum())
        assert mv["x_latency_sum"] == pytest.approx((tot[:, 1] * tot[:, 0]).sum())
        h = g[[f"h{k}" for k in range(M.NB)]].to_numpy(float)
        cum = np.cumsum(h, axis=1) - h
        assert mv[[f"cc{k}" for k in range(M.NB)]].to_numpy(float) == pytest.approx((cum * cum).sum(axis=0))
        assert mv[[f"dn{k}" for k in range(M.NB)]].to_numpy(float) == \
            pytest.approx((h * h.sum(axis=1)[:, None]).sum(axis=0))
        for layer in ("kv", "resp"):
            lv = lm[(lm["variant"] == v) & (lm["layer"] == layer)].sum(numeric_only=True)
            x, y = g[f"hits_{layer}"].to_numpy(float), g[f"lookups_{layer}"].to_numpy(float)
            assert lv["n"] == (y > 0).sum() and lv["x_hits"] == pytest.approx((x * y).sum())
    _same_buckets = m.groupby("variant")["bucket"].min()
    assert (_same_buckets == M.bucket_of(np.array([1000.0]))[0]).all()
