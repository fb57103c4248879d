import sqlite3
import subprocess
import sys
import textwrap

import pytest

from collectors import EmbeddedStore, InstrumentedCache, StoreError
from collectors.store import FRAMES, _TABLES


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
    doc = EmbeddedStore.__module__ and sys.modules["collectors.store"].__doc__
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


def test_a_reader_in_another_process_sees_committed_data(make_tel, tmp_path):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    for i in range(5):
        c.get(f"k:{i}")
    tel.flush(now=1.0)
    code = textwrap.dedent(f"""
        from collectors import EmbeddedStore
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
    from collectors import request_context

    return request_context(tenant="t", unit="u", experiment="e", variant="A", telemetry=tel)
