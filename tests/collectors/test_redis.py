"""The redis-py wrapper against a real redis-server."""

import pytest
import redis
from warmscope.collectors import instrument_redis, request_context, uninstrument_redis
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.conftest import free_port
from tests.helpers import total

pytestmark = pytest.mark.redis
LOOKUPS = schema.CACHE_LOOKUPS.name


def _counts(tel, **kw):
    return {
        res: total(tel.reader, LOOKUPS, {ATTR.RESULT: res, **kw}) for res in ("hit", "miss", "error")
    }


def test_reads_count_hits_and_misses(make_tel, redis_client):
    tel = make_tel()
    r = instrument_redis(redis_client, layer="response", telemetry=tel)
    r.set("resp:1", "a")
    r.hset("h:1", "f", "v")
    r.json_ok = False
    with request_context(tenant="t1", telemetry=tel):
        assert r.get("resp:1") == b"a"
        assert r.get("resp:2") is None
        assert r.mget("resp:1", "resp:2", "resp:3") == [b"a", None, None]
        assert r.hget("h:1", "f") == b"v"
        assert r.hget("h:1", "g") is None
        assert r.hgetall("h:missing") == {}
        assert r.exists("resp:1") == 1
        assert r.exists("resp:9") == 0
        assert r.hmget("h:1", "f", "x") == [b"v", None]
    assert _counts(tel, **{ATTR.TENANT: "t1"}) == {"hit": 5, "miss": 7, "error": 0}
    assert total(tel.reader, schema.CACHE_WRITES.name) == 2


def test_pipeline_reads_are_counted_at_execute(make_tel, redis_client):
    tel = make_tel()
    r = instrument_redis(redis_client, layer="embedding", telemetry=tel)
    r.set("emb:1", "x")
    for transaction in (True, False):
        p = r.pipeline(transaction=transaction)
        p.get("emb:1").get("emb:2").mset({"emb:3": "y", "emb:4": "z"})
        assert p.execute() == [b"x", None, True]
    assert _counts(tel) == {"hit": 2, "miss": 2, "error": 0}
    assert total(tel.reader, schema.CACHE_WRITES.name) == 1 + 4


def test_layer_can_depend_on_the_key(make_tel, redis_client):
    tel = make_tel()
    r = instrument_redis(redis_client, layer=lambda k: "embedding" if k.startswith("emb:") else "response",
                         telemetry=tel)
    r.get("emb:1")
    r.get("resp:1")
    assert total(tel.reader, LOOKUPS, {ATTR.LAYER: "embedding"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.LAYER: "response"}) == 1


def test_instrument_is_idempotent_and_reversible(make_tel, redis_client):
    tel = make_tel()
    instrument_redis(redis_client, telemetry=tel)
    instrument_redis(redis_client, telemetry=tel)  # no double counting
    redis_client.get("x")
    assert total(tel.reader, LOOKUPS) == 1
    uninstrument_redis(redis_client)
    uninstrument_redis(redis_client)
    redis_client.get("x")
    redis_client.pipeline().get("x").execute()
    assert total(tel.reader, LOOKUPS) == 1
    assert "execute_command" not in redis_client.__dict__


def test_connection_failure_is_counted_as_error_and_raised(make_tel):
    tel = make_tel()
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    r = instrument_redis(dead, telemetry=tel)
    with pytest.raises(redis.ConnectionError):
        r.get("resp:1")
    with pytest.raises(redis.ConnectionError):
        r.pipeline().get("a").get("b").execute()
    assert _counts(tel)["error"] == 3


def test_a_cluster_client_is_instrumented_too(make_tel, cluster_client):
    """A RedisCluster client: single-key reads and a cross-slot pipeline count the same way."""
    tel = make_tel()
    r = instrument_redis(cluster_client, layer="response", telemetry=tel)
    r.set("resp:1", "a")
    with request_context(tenant="t1", telemetry=tel):
        assert r.get("resp:1") == b"a"
        assert r.get("resp:2") is None
        p = r.pipeline()
        p.get("resp:1").get("resp:3").get("other:4")  # three keys, three slots
        assert p.execute() == [b"a", None, None]
    assert _counts(tel, **{ATTR.TENANT: "t1"}) == {"hit": 2, "miss": 3, "error": 0}
    assert total(tel.reader, schema.CACHE_WRITES.name) == 1
