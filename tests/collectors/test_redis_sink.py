"""Hot keys, A/B unit records and warm-up runs flushed to a real Redis."""

import json

import pytest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.redis_sink import AB_SHARDS, ab_tag, key, run_tag
from warmscope.sources.redis_source import RedisSource

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
    base = "ws:{hot:7200:t1}:prefix_kv"
    hits = dict(redis_client.zrange(base + ":hits", 0, -1, withscores=True))
    misses = dict(redis_client.zrange(base + ":misses", 0, -1, withscores=True))
    assert sorted(hits.values()) == [40.0] and sorted(misses.values()) == [4.0]
    assert 0 < redis_client.ttl(base + ":hits") <= tel.config.hot_key_ttl_s
    fams = redis_client.hgetall(base + ":fam")
    assert set(fams.values()) == {b"k:*"}
    tot = {"lookups": 0, "hits": 0, "requests": 0, "conversions": 0}
    n = 0
    for shard in range(AB_SHARDS):
        tag = ab_tag("exp", shard)
        for m in redis_client.smembers(key(tag, "units")):
            var, uh = m.decode().split(":")
            h = redis_client.hgetall(key(tag, "u", var, uh))
            n += 1
            for f in ("requests", "conversions"):
                tot[f] += int(h.get(f.encode(), 0))
            for f in ("lookups", "hits"):  # per layer
                tot[f] += int(h.get(f"prefix_kv:{f}".encode(), 0))
    assert n == 4
    assert tot == {"lookups": 44, "hits": 40, "requests": 4, "conversions": 1}
    run_ids = redis_client.zrange("ws:runs", 0, -1)
    assert len(run_ids) == 1
    rec = redis_client.hgetall(key(run_tag(run_ids[0].decode())))
    assert rec[b"status"] == b"ok" and rec[b"keys"] == b"1"
    warmed = redis_client.hgetall(key(run_tag(run_ids[0].decode()), "warmed"))
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
        assert len(RedisSource(srv2.url).units("exp")) == 4
        hits = client.zrange("ws:{hot:0:t1}:prefix_kv:hits", 0, -1, withscores=True)
        assert [s for _, s in hits] == [40.0]  # written once, not twice
    finally:
        srv2.stop()


def test_cross_tenant_keys_are_counted_outside_shared_layers(make_tel):
    from warmscope.model import schema

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


def test_a_layout1_database_is_migrated_with_its_moments(redis_client):
    """Keys as the sink wrote them before hash tags and moments: units, hot keys, a run."""
    from warmscope.collectors.redis_sink import migrate_layout1
    from warmscope.model import ab_metrics as M

    r = redis_client
    r.sadd("ws:ab:experiments", "exp")
    for i, var in enumerate("AAB"):
        r.sadd("ws:ab:exp:units", f"{var}:u{i}")
        r.hset(f"ws:ab:exp:{var}:u{i}", mapping={"requests": 2 + i, "latency_sum": 0.5 * (i + 1), "h3": 2 + i,
                                                  "first_ts": 1000.0 + i, "last_ts": 1100.0,
                                                  "kv:lookups": 10, "kv:hits": 3 * i})
    r.zadd("ws:hot:windows", {"3600:t1:kv": 3600})
    r.zadd("ws:hot:3600:t1:kv:hits", {"abcd": 7})
    r.hset("ws:hot:3600:t1:kv:fam", "abcd", "k:*")
    r.zadd("ws:runs", {"run-1": 50.0})
    r.hset("ws:run:run-1", mapping={"run_id": "run-1", "status": "ok", "started": 50.0, "keys": 1, "layer": "kv"})
    r.hset("ws:run:run-1:warmed", "abcd", json.dumps(["k:*", "t1", "kv", 50.0, 3600, 0.1, 60.0, None, 1]))
    assert migrate_layout1(r) == {"units": 3, "hot_keys": 1, "runs": 1}
    assert migrate_layout1(r) == {"units": 0, "hot_keys": 0, "runs": 0}  # nothing left to move
    assert not r.exists("ws:ab:exp:A:u0", "ws:hot:3600:t1:kv:hits", "ws:run:run-1")
    src = RedisSource("", client=r)
    u = src.units("exp").sort_values("unit_hash")
    assert u["requests"].tolist() == [2, 3, 4] and u["hits_kv"].tolist() == [0, 3, 6]
    m, lm = src.moments("exp")
    # A: units u0, u1 — requests 2, 3: Σ = 5, Σ² = 4 + 9 = 13; B: u2 — 4, 16
    assert m.set_index("variant")[["n", "s_requests", "q_requests"]].to_dict("index") == \
        {"A": {"n": 2, "s_requests": 5, "q_requests": 13}, "B": {"n": 1, "s_requests": 4, "q_requests": 16}}
    # layer kv: hits 0, 3 (A) and 6 (B); Σ hits·lookups = 10·(0 + 3) = 30 for A
    assert lm.set_index("variant")["x_hits"].to_dict() == {"A": 30, "B": 60}
    assert src.frame("hot_keys")[["tenant", "layer", "key_hash", "hits"]].values.tolist() == [["t1", "kv", "abcd", 7]]
    assert src.frame("warmup_runs")["run_id"].tolist() == ["run-1"]
    assert src.frame("warmed_keys")["key_hash"].tolist() == ["abcd"]
    assert set(M.COLUMNS) <= set(m.columns)


def test_large_batches_in_slices_equal_the_embedded_store(make_tel, tmp_path, redis_server, redis_client):
    # 4,600 units in the first flush: written in slices of hash tags, each computed while the one before is
    # written; two more flushes add to the same units. Units (totals and layers) and moments equal the store's.
    import numpy as np
    import pandas as pd
    from warmscope.collectors import redis_sink
    from warmscope.sources import EmbeddedSource

    from tests.collectors.test_redis_cluster import _traffic

    assert 4600 // redis_sink._SLICE_UNITS >= redis_sink._SLICES  # the first batch goes out in slices
    via_redis = make_tel(redis_url=redis_server.url, store_path=str(tmp_path / "a.sqlite"), side_flush_s=0,
                         max_buffered_units=100_000)
    via_store = make_tel(store_path=str(tmp_path / "b.sqlite"), side_flush_s=0, max_buffered_units=100_000)
    for seed, now, (units, start) in ((1, 1000.0, (4600, 0)), (2, 2000.0, (300, 4500)), (3, 2900.0, (200, 0))):
        for tel in (via_redis, via_store):
            _traffic(tel, np.random.default_rng(seed), units, start)
            tel.flush(now=now)
    assert via_redis.pending_rows("redis") == 0 and via_redis.aggregator.errors.get("redis", 0) == 0
    src, emb = RedisSource(redis_server.url), EmbeddedSource(str(tmp_path / "b.sqlite"))
    cols = ["variant", "unit_hash"]
    u_r = src.units("exp").sort_values(cols).reset_index(drop=True)
    u_e = emb.units("exp").sort_values(cols).reset_index(drop=True)
    assert len(u_r) == 4800 + 686  # sessions s0..s4799, and lookups-only units for u % 7 == 0
    pd.testing.assert_frame_equal(u_r[u_e.columns], u_e, check_dtype=False, rtol=1e-12)
    for (a, b), k in zip(zip(src.moments("exp"), emb.moments("exp"), strict=True),
                         (["variant", "bucket"], ["variant", "bucket", "layer"]), strict=True):
        pd.testing.assert_frame_equal(a.sort_values(k).reset_index(drop=True), b.sort_values(k).reset_index(drop=True),
                                      check_dtype=False, rtol=1e-9)
