"""The Why misses page under AppTest, on a store with hand-written rows: every figure it shows
equals the arithmetic in the comments; an empty misses frame gives one sentence and no table."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from warmscope.collectors import EmbeddedStore

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
T = 1_800_000_000.0
NAN = None


def _lookups():
    # the page's range comes from the lookups' time bounds
    return [
        (T + s, "acme", "prefix_kv", "kv:chat:sys:*", "hit", "", "", "m", "a-0", "1024", 5)
        for s in (60, 120)
    ]


MISSES = [  # ts, tenant, engine, family, miss_class, tokens, requests
    (T + 60, "acme", "a-0", "kv:chat:sys:*", "cold", 1000, 2),
    (T + 60, "acme", "a-0", "kv:chat:sys:*", "evicted", 600, 1),
    (T + 60, "acme", "a-1", "kv:chat:query:*", "cold", 400, 2),
    (T + 120, "globex", "a-1", "kv:chat:sys:*", "evicted", 500, 1),
    (T + 120, "globex", "a-1", "kv:chat:sys:*", "partial", 300, 3),
    (T + 120, "acme", "a-1", "kv:chat:sys:*", "elsewhere", 200, 1),
]
# run_id, key_hash, family, tenant, layer, warmed_at, ttl_s, gpu_s, first_hit_at, first_miss_at,
# hits
WARMED = [
    # warmed inside the page's range (it starts just before the first lookup, T + 60)
    ("r1", "h1", "kv:chat:sys:*", "acme", "prefix_kv", T + 61, NAN, 0.1, T + 70, NAN, 5),
    ("r1", "h2", "kv:chat:sys:*", "acme", "prefix_kv", T + 61, NAN, 0.1, NAN, T + 100, 0),
    ("r2", "h3", "kv:chat:sys:*", "globex", "response", T + 61, 300.0, 0.0, T + 70, NAN, 7),
]
KV = [  # ts, engine, salt, stored, reused, evicted, resident
    (T + 60, "a-0", "s1", 30, 90, 12, 100),
    (T + 120, "a-0", "s1", 30, 90, 12, 80),
]


@pytest.fixture
def page(tmp_path, monkeypatch):
    def open_page(with_misses: bool = True):
        path = tmp_path / ("full.sqlite" if with_misses else "empty.sqlite")
        st = EmbeddedStore(path)
        st.write(
            {
                "lookups": _lookups(),
                **(
                    {"misses": MISSES, "warmed_keys": WARMED, "kv_blocks": KV}
                    if with_misses
                    else {}
                ),
            }
        )
        st.close()
        monkeypatch.setenv("WARMSCOPE_STORE", str(path))
        at = AppTest.from_file(MAIN, default_timeout=120).run()
        at.switch_page("entries/misses.py").run()
        assert not at.exception, at.exception
        assert not at.error, [e.value for e in at.error]
        return at

    return open_page


def test_the_page_shows_the_rows_arithmetic(page):
    at = page()
    metrics = {m.label: m.value for m in at.metric}
    # 1000 + 600 + 400 + 500 + 300 + 200 = 3,000 missed tokens; cold 1000 + 400 = 1400 is the
    # largest class: 1400 / 3000 = 46.7%.
    assert metrics["Missed prompt tokens"] == "3,000"
    assert metrics["Largest class"] == "cold · 46.7%"
    # Addressable: cold + evicted of (tenant, family) pairs with a warmed prefix_kv key — only
    # (acme, kv:chat:sys:*): 1000 + 600 = 1600 (acme's query cold 400 is another family; globex
    # was warmed in the response layer only). 1600 / 3000 = 53.3%.
    assert metrics["Warm-up-addressable"] == "53.3%"
    assert metrics["Addressable tokens"] == "1,600"
    assert metrics["Warmed prefix_kv keys"] == "2"
    assert metrics["Hits on warmed keys"] == "5"  # h1's 5; h3 (response layer, 7) is not prefix_kv

    classes = at.dataframe[0].value.set_index("miss_class")
    assert classes["tokens"].to_dict() == {
        "elsewhere": 200,
        "evicted": 1100,
        "isolated": 0,
        "drifted": 0,
        "cold": 1400,
        "partial": 300,
    }
    assert classes.loc["evicted", "share"] == pytest.approx(100 * 1100 / 3000)  # shown in percent
    assert classes.loc["partial", "requests"] == 3

    tenants = at.dataframe[1].value.set_index("tenant")
    # acme: cold 1400, evicted 600, elsewhere 200 = 2200; evicted 600 / 2200 = 27.3%,
    # cold + evicted 2000 / 2200 = 90.9%. globex: evicted 500 + partial 300 = 800.
    assert tenants.loc["acme", "total"] == 2200 and tenants.loc["globex", "total"] == 800
    assert tenants.loc["acme", "evicted_share"] == pytest.approx(100 * 600 / 2200)
    assert tenants.loc["acme", "addressable_share"] == pytest.approx(100 * 2000 / 2200)
    assert list(tenants.index) == ["acme", "globex"]  # largest total first
    engines = at.dataframe[2].value.set_index("engine")
    assert engines["total"].to_dict() == {
        "a-0": 1600,
        "a-1": 1400,
    }  # 1000 + 600; 400 + 500 + 300 + 200
    families = at.dataframe[3].value.set_index("family")
    assert families.loc["kv:chat:query:*", "cold"] == 400

    lost = at.dataframe[4].value
    # run r1: h2's first read after warming (at T + 61) missed at T + 100 -> 1 of 2 lost, 50%, 39 s
    assert lost["run_id"].tolist() == ["r1"]
    assert lost[["keys", "lost"]].iloc[0].tolist() == [2, 1]
    assert lost["lost_share"].iloc[0] == pytest.approx(50.0)
    assert lost["median"].iloc[0] == "39 s"
    # a run id leads to the Warm-up runs page, which finds a warm-up by any of its runs' ids
    assert any("*Find a run id* on the Warm-up runs page" in c.value for c in at.caption)
    assert "Find a run id" in json.loads(at.dataframe[4].proto.columns)["run_id"]["help"]

    blocks = at.dataframe[5].value.iloc[0]
    # two flushes 60 s apart span 120 s: stored 60 / 120 = 0.5 /s, reused 180 / 120 = 1.5 /s,
    # evicted 24 / 120 = 0.2 /s; reuse 180 / (180 + 60) = 75%; resident at the end: 80
    assert (
        blocks["stored_per_s"],
        blocks["reused_per_s"],
        blocks["evicted_per_s"],
    ) == pytest.approx((0.5, 1.5, 0.2))
    assert blocks["reuse_ratio"] == "75.0%"
    assert blocks["resident"] == 80


def test_no_misses_gives_one_sentence_and_no_table(page):
    at = page(with_misses=False)
    assert [i.value.split(":")[0] for i in at.info] == [
        "No missed-token classes in this range",
        "No warm-up run warmed prefix_kv keys in this range.",
    ]
    assert not at.metric and not at.dataframe
    assert not [s for s in at.subheader if s.value == "Engine KV blocks per salt"]
