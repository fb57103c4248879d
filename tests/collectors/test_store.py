import sqlite3
import subprocess
import sys
import textwrap

import pytest
from warmscope.collectors import EmbeddedStore, InstrumentedCache, StoreError
from warmscope.collectors.store import _TABLES, FRAMES
from warmscope.collectors.store.layout import SCHEMA_VERSION


def test_every_frame_has_its_documented_columns_even_when_empty(tmp_path):
    st = EmbeddedStore(tmp_path / "s.sqlite")
    for name in FRAMES:
        df = st.frame(name)
        assert len(df) == 0
        if name == "histograms":
            assert list(df.columns) == ["ts", "metric", "tenant", "experiment", "variant", "model", "replica",
                                        "layer", "le", "count", "sum", "total"]
        else:
            assert list(df.columns) == list(_TABLES[name])
    doc = EmbeddedStore.__module__ and sys.modules["warmscope.collectors.store"].__doc__
    for name in FRAMES:
        assert f"``{name}``" in doc


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist; run `warmscope simulate`"):
        EmbeddedStore(tmp_path / "nope.sqlite", readonly=True)


def test_unknown_frame_names_the_frames(tmp_path):
    with pytest.raises(StoreError, match="unknown frame 'lookup'; frames: lookups"):
        EmbeddedStore(tmp_path / "s.sqlite").frame("lookup")


def test_time_filter_and_histogram_explode(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    c.get("a:1")
    tel.record_request(ttft_s=0.03, latency_s=0.5)
    tel.flush(now=60.0)
    c.get("a:1")
    c.get("a:1")
    tel.record_request(ttft_s=0.03, latency_s=0.5)
    tel.flush(now=120.0)
    st = tel.store
    assert st.frame("lookups")["count"].tolist() == [1, 2]
    assert st.frame("lookups", start=100)["count"].tolist() == [2]
    assert st.frame("lookups", end=100)["count"].tolist() == [1]
    h = st.frame("histograms")
    ttft = h[(h.metric == "gen_ai.server.time_to_first_token") & (h.ts == 120.0)]
    assert ttft["count"].sum() == 1 and ttft.loc[ttft["count"] == 1, "le"].item() == 0.04


@pytest.mark.slow
def test_a_reader_in_another_process_sees_committed_data(make_tel, tmp_path):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    for i in range(5):
        c.get(f"k:{i}")
    tel.flush(now=1.0)
    code = textwrap.dedent(f"""
        from warmscope.collectors import EmbeddedStore
        s = EmbeddedStore({str(tel.store.path)!r}, readonly=True)
        print(int(s.frame("lookups")["count"].sum()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"


def test_locked_store_loses_nothing(make_tel, tmp_path):
    tel = make_tel(store_path=str(tmp_path / "locked.sqlite"))
    tel.store.timeout = 0.1
    tel.store.close()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    with request_context_unit(tel):
        c.get("k:1")
    blocker = sqlite3.connect(tmp_path / "locked.sqlite", timeout=0.1)
    blocker.execute("BEGIN EXCLUSIVE")
    tel.flush(now=10.0)  # fails, counted, nothing raised
    assert tel.aggregator.errors["store"] == 1
    c.get("k:1")
    blocker.rollback()
    blocker.close()
    tel.flush(now=20.0)
    df = tel.store.frame("lookups")
    assert df["count"].sum() == 2 and set(df.ts) == {20.0}  # one delta, written late
    assert tel.store.frame("ab_lookups")["lookups"].sum() == 1  # kept and retried


def request_context_unit(tel):
    from warmscope.collectors import request_context

    return request_context(tenant="t", unit="u", experiment="e", variant="A", telemetry=tel)


_V2_AB = """
CREATE TABLE ab_units(experiment TEXT, variant TEXT, unit_hash TEXT, first_ts REAL, last_ts REAL, requests INTEGER,
  latency_sum REAL, latency_sq REAL, ttft_sum REAL, conversions INTEGER, value REAL, gpu_s REAL, sla_met INTEGER,
  {h});
CREATE TABLE ab_lookups(experiment TEXT, variant TEXT, unit_hash TEXT, layer TEXT, lookups INTEGER, hits INTEGER);
"""


def _v2_store(path, rows_u, rows_l):
    """A store as schema 2 wrote it: A/B tables append one row per unit per flush window."""
    from warmscope.collectors.store import _DDL, _H

    con = sqlite3.connect(path)
    ddl = "".join(s + ";" for s in _DDL.split(";") if s.strip() and "TABLE IF NOT EXISTS ab_" not in s)
    con.executescript(ddl + _V2_AB.replace("{h}", ", ".join(f"{h} INTEGER DEFAULT 0" for h in _H)))
    con.execute("INSERT INTO meta VALUES('schema_version', '2')")
    cols = _TABLES["ab_units"]
    con.executemany(f"INSERT INTO ab_units({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})", rows_u)
    con.executemany("INSERT INTO ab_lookups VALUES(?, ?, ?, ?, ?, ?)", rows_l)
    con.commit()
    con.close()


@pytest.mark.slow
def test_a_schema_2_store_is_upgraded_in_place_and_loses_nothing(tmp_path):
    import random

    import pandas as pd
    from warmscope.collectors.store import _H

    rnd = random.Random(3)
    nh = len(_H)
    rows_u, rows_l = [], []
    for i in range(300):  # units active in 1-4 flush windows
        var = "AB"[i % 2]
        for w in range(rnd.randint(1, 4)):
            ts = 900.0 * (i % 7 + w)
            rows_u.append(("e", var, f"u{i}", ts, ts, rnd.randint(1, 5), rnd.random(), rnd.random(), rnd.random(),
                           rnd.randint(0, 1), rnd.random(), rnd.random(), rnd.randint(0, 3),
                           *[rnd.randint(0, 2) for _ in range(nh)]))
            for layer in rnd.sample(["prefix_kv", "response", "lora"], rnd.randint(0, 3)):
                rows_l.append(("e", var, f"u{i}", layer, rnd.randint(1, 9), rnd.randint(0, 1)))
    path = tmp_path / "v2.sqlite"
    _v2_store(path, rows_u, rows_l)

    with pytest.raises(StoreError, match="older warmscope .* upgrade-store"):
        EmbeddedStore(path, readonly=True)
    out = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(path), "upgrade-store"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "upgrading" in out.stderr and f"schema version {SCHEMA_VERSION}" in out.stderr  # 2 -> 3 -> 4 -> 5
    got = EmbeddedStore(path, readonly=True).units("e").set_index("unit_hash").sort_index()

    # Reference: the same rows folded by hand, independently of SQL.
    raw = pd.DataFrame(rows_u, columns=list(_TABLES["ab_units"]))
    exp = raw.groupby("unit_hash").agg({**{c: "sum" for c in raw.columns[5:]}, "first_ts": "min",
                                        "last_ts": "max", "variant": "first"}).sort_index()
    assert len(got) == 300
    for c in exp.columns:
        if c == "variant":
            assert (got[c] == exp[c]).all()
        else:
            assert got[c].to_numpy() == pytest.approx(exp[c].to_numpy()), c
    lk = pd.DataFrame(rows_l, columns=["e", "v", "unit_hash", "layer", "lookups", "hits"])
    ref = lk.groupby(["unit_hash", "layer"])[["lookups", "hits"]].sum()
    for (uh, layer), r in ref.iterrows():
        assert got.at[uh, f"lookups_{layer}"] == r["lookups"]
        assert got.at[uh, f"hits_{layer}"] == r["hits"]
    assert got["lookups_lora"].sum() == lk.loc[lk.layer == "lora", "lookups"].sum()
    # The upgraded store goes on adding to the same unit rows.
    st = EmbeddedStore(path)
    st.write({"ab_units": [("e", "A", "u0", 0.0, 99999.0, 7) + (0,) * (len(_TABLES["ab_units"]) - 6)]})
    again = st.units("e").set_index("unit_hash")
    assert again.at["u0", "requests"] == exp.at["u0", "requests"] + 7
    assert again.at["u0", "last_ts"] == 99999.0 and len(again) == 300


def test_hourly_rollups_equal_the_per_flush_rows_summed_by_hour(tmp_path):
    import math
    import random

    import numpy as np
    import pandas as pd
    from warmscope.collectors.store import ROLLUP_S, _backfill_rollups, histogram_row

    rnd = random.Random(5)
    st = EmbeddedStore(tmp_path / "r.sqlite")
    hsum = 0.0
    for tick in range(1, 400):  # one-minute flushes over ~6.6 hours, some on hour boundaries
        ts = 1_700_000_000.0 - 1_700_000_000.0 % 3600 + 60.0 * tick
        lk = [(ts, t, ly, "f", res, "", "", "m", "r0", "", rnd.randint(1, 9))
              for t in ("a", "b") for ly in ("kv", "resp") for res in ("hit", "miss") if rnd.random() < 0.8]
        rq = [(ts, "a", "e", v, "m", "r0", "true", rnd.randint(1, 5), rnd.random(), rnd.randint(0, 1), rnd.random(),
               rnd.randint(0, 2))
              for v in "AB"]
        hs = [histogram_row(ts, "gen_ai.server.time_to_first_token", ("a", "", "", "m", "r0", ""), [0.1, 1.0],
                            [rnd.randint(0, 3), rnd.randint(0, 3), rnd.randint(0, 1)], rnd.random(), 4)]
        hsum += hs[0][10]
        st.write({"lookups": lk, "requests": rq, "histograms": hs})
    req_meas = ["requests", "gpu_s", "conversions", "value", "unmeasured"]
    for name, meas in (("lookups", ["count"]), ("requests", req_meas)):
        raw = st.frame(name)
        dims = [c for c in raw.columns if c not in meas and c != "ts"]
        ref = raw.assign(ts=np.ceil(raw.ts / ROLLUP_S) * ROLLUP_S).groupby(["ts"] + dims)[meas].sum()
        got = st.frame(name, step=ROLLUP_S)
        assert got.attrs["step_s"] == ROLLUP_S and "step_s" not in raw.attrs
        got = got.set_index(["ts"] + dims)[meas].sort_index()
        assert len(got) == len(ref) < len(raw) / 20
        assert got.to_numpy(float) == pytest.approx(ref.sort_index().to_numpy(float))
    h = st.frame("histograms")
    hr = st.frame("histograms", step=ROLLUP_S)
    ref = h.assign(ts=np.ceil(h.ts / ROLLUP_S) * ROLLUP_S).groupby(["ts", "le"])["count"].sum()
    assert hr.groupby(["ts", "le"])["count"].sum().to_dict() == ref.to_dict()
    assert hr.drop_duplicates("ts")["total"].sum() == 4 * 399  # every flush recorded total=4
    assert math.isclose(hr.drop_duplicates("ts")["sum"].sum(), hsum)
    before = {n: st.frame(n, step=ROLLUP_S) for n in ("lookups", "requests", "histograms")}
    con = st._con()
    with con:
        _backfill_rollups(con)  # the upgrade path: rebuilt from the per-flush rows in SQL
    for n, b in before.items():
        a = st.frame(n, step=ROLLUP_S)
        key = [c for c in a.columns if c not in ("count", "requests", "gpu_s", "conversions", "value", "unmeasured",
                                                 "sum", "total")]
        pd.testing.assert_frame_equal(a.sort_values(key).reset_index(drop=True),
                                      b.sort_values(key).reset_index(drop=True), check_dtype=False)
