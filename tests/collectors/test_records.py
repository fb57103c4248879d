"""Everything that restates a record's layout is derived from collectors.records."""

from __future__ import annotations

import sqlite3

from warmscope.collectors import EmbeddedStore, InstrumentedCache, request_context
from warmscope.collectors.aggregator import HISTOGRAM_LABELS
from warmscope.collectors.store import layout
from warmscope.model import records, schema


def test_every_store_table_has_the_columns_and_types_its_record_declares(tmp_path):
    EmbeddedStore(tmp_path / "s.sqlite").close()
    con = sqlite3.connect(tmp_path / "s.sqlite")
    for name, rec in records.RECORDS.items():
        info = con.execute(f"PRAGMA table_info({name})").fetchall()
        assert [(r[1], r[2]) for r in info] == [(c.name, c.type) for c in rec.columns], name
        pk = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]
        assert pk == list(rec.key), name
        if rec.rollup:  # same columns, unique on time + labels
            assert [r[1] for r in con.execute(f"PRAGMA table_info({name}_1h)")] == list(rec.cols)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {f"{r.name}_1h" for r in records.RECORDS.values() if r.rollup} <= names
    assert not {f"{r.name}_1h" for r in records.RECORDS.values() if not r.rollup} & names
    con.close()


def test_label_orders_and_attribute_keys_follow_the_records():
    assert schema.LOOKUP_LABELS == tuple(records.COLUMN_ATTRS[c] for c in records.LOOKUPS.labels)
    assert schema.CACHE_LOOKUPS.attributes == schema.LOOKUP_LABELS
    assert schema.REQUESTS.attributes == tuple(records.COLUMN_ATTRS[c] for c in records.REQUEST_LABELS)
    assert schema.CACHE_WRITES.attributes == tuple(records.COLUMN_ATTRS[c] for c in records.WRITE_LABELS)
    assert HISTOGRAM_LABELS == ("tenant", "experiment", "variant", "model", "replica", "layer")
    assert records.PROM_LABELS["length_bucket"] == "warmscope_prompt_length_bucket"
    assert records.UNIT_SUMS + records.UNIT_HIST == records.AB_UNITS.measures
    assert layout.UPSERT["hot_keys"].endswith('"err" = max("err", excluded."err")')


def test_the_aggregator_labels_series_by_column_name_not_position(make_tel):
    tel = make_tel(replica="rep-9")
    cache = InstrumentedCache({"resp:8812": 1}, layer="response", telemetry=tel)
    with request_context(tenant="ten", unit="u1", experiment="exp", variant="B", model="mod", prompt_tokens=100,
                         telemetry=tel):
        cache.get("resp:8812")
        tel.record_request(latency_s=0.5, gpu_s=0.25, sla_met=True)
    want = {"tenant": "ten", "layer": "response", "family": "resp:*", "result": "hit", "experiment": "exp",
            "variant": "B", "model": "mod", "replica": "rep-9", "length_bucket": ""}
    (key,) = tel.aggregator.lookup_totals()
    assert dict(zip(records.LOOKUP_LABELS, key, strict=True)) == want
    (rkey, sums), = tel.aggregator.request_totals().items()
    assert dict(zip(records.REQUEST_LABELS, rkey, strict=True))["sla_met"] == "true"
    assert dict(zip(records.REQUESTS.measures, sums, strict=True)) == {"requests": 1, "gpu_s": 0.25, "conversions": 0,
                                                          "value": 0.0, "unmeasured": 0}
    tel.flush(now=60.0)
    lk = tel.store.frame("lookups")
    assert lk[list(want)].to_dict("records") == [want]
    u = tel.store.frame("ab_units").iloc[0]
    # latency 0.5 s falls in the bucket (0.32, 0.64]: h6 of DURATION_BUCKETS
    assert (u["requests"], u["latency_sum"], u["latency_sq"], u["gpu_s"], u["sla_met"], u["h6"]) == \
        (1, 0.5, 0.25, 0.25, 1, 1)
    assert u[list(records.UNIT_HIST)].sum() == 1
    ab = tel.store.frame("ab_lookups").iloc[0]
    assert (ab["layer"], ab["lookups"], ab["hits"]) == ("response", 1, 1)
