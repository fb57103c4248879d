"""Telemetry.record_misses / record_kv_stats: the rows they flush to the store, the OpenTelemetry
series they export (exact Prometheus names, no family label), their time buckets, bad input
counted and never raised, the queue's bound, and a schema-3 store upgraded to hold them."""

from __future__ import annotations

import sqlite3

from warmscope.collectors import miss_counts
from warmscope.collectors.store import EmbeddedStore
from warmscope.model import records, schema


def _points(tel) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in tel.reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_classes_reach_the_store_and_the_exporter(make_tel):
    now = [1_000.0]
    tel = make_tel(clock=lambda: now[0], flush_interval_s=10)
    tel.record_misses(
        tenant="acme", engine="e0", family="chat:*", classes={"cold": 100, "evicted": 28}
    )
    tel.record_misses(
        tenant="acme", engine="e0", family="chat:*", classes={"cold": 10, "partial": 0}
    )
    tel.record_misses(
        tenant="globex", engine="e1", family="chat:*", classes={"isolated": 7, "mystery": 3}
    )
    tel.record_kv_stats(engine="e0", salt="s1", stored=5, reused=2, evicted=1, resident=40)
    tel.flush(now=1_000.0)
    m = tel.store.frame("misses").set_index(["tenant", "miss_class"])
    # cold: 100 + 10 in two requests; a zero class is not a row; an unknown name counts as "unknown"
    # (the sum stays exact: 7 + 3 = 10 for globex).
    assert m.loc[("acme", "cold"), ["tokens", "requests"]].tolist() == [110, 2]
    assert m.loc[("acme", "evicted"), "tokens"] == 28
    assert ("acme", "partial") not in m.index
    assert (
        m.loc[("globex", "unknown"), "tokens"] == 3 and m.loc[("globex", "isolated"), "tokens"] == 7
    )
    assert set(m["ts"]) == {1_000.0}  # no ts given: the flush's time, like every metric point
    kv = tel.store.frame("kv_blocks").iloc[0]
    assert kv[["stored", "reused", "evicted", "resident"]].tolist() == [5, 2, 1, 40]

    pts = _points(tel)
    missed = {
        (
            p.attributes["warmscope.tenant"],
            p.attributes["warmscope.replica"],
            p.attributes["warmscope.kv.miss_class"],
        ): p.value
        for p in pts["warmscope.kv.missed_tokens"]
    }
    assert missed == {
        ("acme", "e0", "cold"): 110,
        ("acme", "e0", "evicted"): 28,
        ("globex", "e1", "isolated"): 7,
        ("globex", "e1", "unknown"): 3,
    }
    assert all(
        set(p.attributes) == set(schema.MISS_LABELS) for p in pts["warmscope.kv.missed_tokens"]
    )
    assert [p.value for p in pts["warmscope.kv.blocks.resident"]] == [40]
    assert schema.prom_name(schema.KV_MISSED_TOKENS) == "warmscope_kv_missed_tokens_total"
    assert [
        schema.prom_name(i)
        for i in (
            schema.KV_BLOCKS_STORED,
            schema.KV_BLOCKS_REUSED,
            schema.KV_BLOCKS_EVICTED,
            schema.KV_BLOCKS_RESIDENT,
        )
    ] == [
        "warmscope_kv_blocks_stored_total",
        "warmscope_kv_blocks_reused_total",
        "warmscope_kv_blocks_evicted_total",
        "warmscope_kv_blocks_resident",
    ]

    # The next flush writes only what is new (deltas of cumulative counts).
    tel.record_misses(tenant="acme", engine="e0", family="chat:*", classes={"cold": 5})
    tel.record_kv_stats(engine="e0", salt="s1", stored=1, reused=0, evicted=0, resident=41)
    tel.flush(now=1_010.0)
    m2 = tel.store.frame("misses", 1_005.0)
    assert m2[["miss_class", "tokens", "requests"]].values.tolist() == [["cold", 5, 1]]
    kv2 = tel.store.frame("kv_blocks", 1_005.0).iloc[0]
    assert kv2[["stored", "reused", "evicted", "resident"]].tolist() == [1, 0, 0, 41]


def test_a_given_ts_lands_in_its_flush_interval(make_tel):
    tel = make_tel(clock=lambda: 2_000.0, flush_interval_s=10)
    # ts 1_981.5 lies in the interval (1_980, 1_990]: stamped 1_990 (a flush stamps its
    # interval's end);
    # 1_990.0 itself ends that interval too; 1_990.1 opens the next one (2_000).
    for ts, n in ((1_981.5, 1), (1_990.0, 2), (1_990.1, 4)):
        tel.record_misses(tenant="acme", engine="e0", family="f", classes={"cold": n}, ts=ts)
    tel.flush(now=2_000.0)
    got = tel.store.frame("misses").groupby("ts")["tokens"].sum().to_dict()
    assert got == {1_990.0: 3, 2_000.0: 4}


def test_bad_calls_are_counted_never_raised(make_tel):
    tel = make_tel(clock=lambda: 3_000.0)
    tel.record_misses(tenant="acme", engine="e0", family="f", classes={"cold": -5})  # negative
    tel.record_misses(
        tenant="acme", engine="e0", family="f", classes={"cold": "many"}
    )  # not a number
    tel.record_misses(tenant="acme", engine="e0", family="f", classes=None)  # type: ignore
    tel.record_kv_stats(engine="e0", salt="s", stored=-1, reused=0, evicted=0, resident=0)
    tel.record_misses(tenant="acme", engine="e0", family="f", classes={"cold": 9}, ts=float("nan"))
    tel.record_misses(
        tenant="acme", engine="e0", family="f", classes={"cold": 8}
    )  # the one good call
    tel.flush(now=3_000.0)
    # classes=None fails at the call (not a mapping: counted there); the four others when drained
    assert tel.aggregator.errors["record"] == 5
    assert tel.store.frame("misses")["tokens"].tolist() == [8]


def test_the_queue_is_bounded_and_what_does_not_fit_is_counted(make_tel, monkeypatch):
    monkeypatch.setattr(miss_counts, "MISS_QUEUE_LIMIT", 3)
    tel = make_tel(clock=lambda: 4_000.0)
    for _ in range(5):
        tel.record_misses(tenant="acme", engine="e0", family="f", classes={"cold": 1})
    tel.flush(now=4_000.0)
    assert tel.aggregator.dropped_counts().get("record") == 2  # 5 calls, 3 fit
    assert tel.store.frame("misses")["tokens"].sum() == 3


def test_a_schema_4_store_gains_the_two_tables(tmp_path):
    path = tmp_path / "v4.sqlite"
    EmbeddedStore(path).close()
    con = sqlite3.connect(path)  # as schema 4 left it: no misses / kv_blocks tables
    for t in ("misses", "misses_1h", "kv_blocks"):
        con.execute(f"DROP TABLE {t}")
    con.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    con.commit()
    con.close()
    st = EmbeddedStore(path)
    row = (10.0, "acme", "e0", "f", "cold", 4, 1)
    st.write({"misses": [row]})
    assert st.frame("misses").values.tolist() == [list(row)]
    assert st.frame("misses", step=records.ROLLUP_S)["tokens"].tolist() == [4]
    from warmscope.collectors.store import SCHEMA_VERSION

    # upgraded through every later version (5: misses, kv_blocks; 6: block_trace)
    got = st._con().execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert got == str(SCHEMA_VERSION) and SCHEMA_VERSION >= 6
    assert st.query("SELECT count(*) FROM block_trace")[0][0] == 0
