"""Hot keys, A/B unit records and warm-up runs flushed to a real Redis."""

import json

import pytest

from warmscope.collectors import InstrumentedCache, request_context
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis


def _traffic(tel):
    c = InstrumentedCache({"k:1": 1}, layer="prefix_kv", telemetry=tel)
    for u in range(4):
        with request_context(tenant="t1", unit=f"u{u}", experiment="exp", variant="AB"[u % 2], telemetry=tel):
            for _ in range(10):
                c.get("k:1")
            c.get("k:2")
            tel.record_request(latency_s=0.3, ttft_s=0.1, gpu_s=0.2, conversion=u == 0, value=5.0, sla_met=True)


def test_hot_keys_and_units_land_in_redis(make_tel, redis_client):
    tel = make_tel(redis_client=redis_client, hot_key_window_s=3600)
    _traffic(tel)
    with tel.warmup("static_topk", layer="prefix_kv", tenant="t1") as run:
        run.warmed("k:1")
    tel.flush(now=7300.0)
    base = "ws:hot:7200:t1:prefix_kv"
    hits = dict(redis_client.zrange(base + ":hits", 0, -1, withscores=True))
    misses = dict(redis_client.zrange(base + ":misses", 0, -1, withscores=True))
    assert sorted(hits.values()) == [40.0] and sorted(misses.values()) == [4.0]
    assert 0 < redis_client.ttl(base + ":hits") <= tel.config.hot_key_ttl_s
    fams = redis_client.hgetall(base + ":fam")
    assert set(fams.values()) == {b"k:*"}
    members = redis_client.smembers("ws:ab:exp:units")
    assert len(members) == 4
    tot = {"lookups": 0, "hits": 0, "requests": 0, "conversions": 0}
    for m in members:
        var, uh = m.decode().split(":")
        h = redis_client.hgetall(f"ws:ab:exp:{var}:{uh}")
        for f in ("requests", "conversions"):
            tot[f] += int(h.get(f.encode(), 0))
        for f in ("lookups", "hits"):  # per layer
            tot[f] += int(h.get(f"prefix_kv:{f}".encode(), 0))
    assert tot == {"lookups": 44, "hits": 40, "requests": 4, "conversions": 1}
    run_ids = redis_client.zrange("ws:runs", 0, -1)
    assert len(run_ids) == 1
    rec = redis_client.hgetall(b"ws:run:" + run_ids[0])
    assert rec[b"status"] == b"ok" and rec[b"keys"] == b"1"
    warmed = redis_client.hgetall(b"ws:run:" + run_ids[0] + b":warmed")
    assert len(warmed) == 1 and json.loads(next(iter(warmed.values())))[0] == "k:*"


def test_redis_down_counts_and_keeps_rows_until_it_is_back(make_tel, tmp_path):
    srv = RedisServer(tmp_path)
    client = srv.client()
    tel = make_tel(redis_client=client)
    _traffic(tel)
    port = srv.port
    srv.stop()
    tel.flush(now=100.0)  # fails: rows are kept, nothing raised
    assert tel.aggregator.errors["redis"] >= 1
    assert tel.pending_rows("redis") > 0
    # The server comes back on the same port: the backlog is written.
    srv2 = RedisServer(tmp_path, port=port)
    try:
        tel.flush(now=200.0)
        assert tel.pending_rows("redis") == 0
        assert len(client.smembers("ws:ab:exp:units")) == 4
        hits = client.zrange("ws:hot:0:t1:prefix_kv:hits", 0, -1, withscores=True)
        assert [s for _, s in hits] == [40.0]  # written once, not twice
    finally:
        srv2.stop()


def test_cross_tenant_keys_are_counted_outside_shared_layers(make_tel):
    from warmscope.collectors import schema
    from tests.helpers import total

    tel = make_tel()
    resp = InstrumentedCache({"resp:shared:1": 1}, layer="response", telemetry=tel)
    weights = InstrumentedCache({"weights:m": 1}, layer="weights", telemetry=tel)
    for t in ("a", "b", "c"):
        with request_context(tenant=t, telemetry=tel):
            for _ in range(3):
                resp.get("resp:shared:1")
                weights.get("weights:m")
    with request_context(tenant="a", telemetry=tel):
        resp.get("resp:own:1")
    tel.flush()
    assert total(tel.reader, schema.CROSS_TENANT_KEYS.name, {schema.ATTR.LAYER: "response"}) == 2
    assert total(tel.reader, schema.CROSS_TENANT_KEYS.name, {schema.ATTR.LAYER: "weights"}) == 0
