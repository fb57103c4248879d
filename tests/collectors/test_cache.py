import pytest
from warmscope.collectors import InstrumentedCache, cached, observe, request_context
from warmscope.model import schema
from warmscope.model.schema import ATTR

from tests.helpers import points, total

LOOKUPS = schema.CACHE_LOOKUPS.name


def test_hits_and_misses_are_counted_with_request_labels(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="embedding", telemetry=tel)
    with request_context(tenant="acme", model="m1", experiment="e1", variant="B", telemetry=tel):
        assert c.get("emb:chunk:1") is None
        c["emb:chunk:1"] = [0.1]
        assert c.get("emb:chunk:1") == [0.1]
        assert c["emb:chunk:1"] == [0.1]
    r = tel.reader
    assert total(r, LOOKUPS, {ATTR.RESULT: "hit", ATTR.TENANT: "acme", ATTR.VARIANT: "B"}) == 2
    assert total(r, LOOKUPS, {ATTR.RESULT: "miss", ATTR.LAYER: "embedding"}) == 1
    assert total(r, schema.CACHE_WRITES.name) == 1
    (p,) = [p for p in points(r, LOOKUPS) if p.attributes[ATTR.RESULT] == "miss"]
    assert p.attributes[ATTR.FAMILY] == "emb:chunk:*"
    assert p.attributes[ATTR.MODEL] == "m1" and p.attributes[ATTR.REPLICA] == "r0"


def test_lookup_outside_a_request_is_labelled_unknown(make_tel):
    tel = make_tel()
    c = InstrumentedCache({"k": 1}, layer="response", telemetry=tel)
    c.get("k")
    (p,) = points(tel.reader, LOOKUPS)
    assert p.attributes[ATTR.TENANT] == schema.UNKNOWN and p.value == 1


def test_getitem_raises_keyerror_on_miss_and_counts_it(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    with pytest.raises(KeyError):
        c["nope"]
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "miss"}) == 1


def test_get_or_load_loads_once(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="embedding", telemetry=tel)
    calls = []
    for _ in range(3):
        c.get_or_load("e:1", lambda k: calls.append(k) or 42)
    assert calls == ["e:1"]
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "hit"}) == 2
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "miss"}) == 1


def test_bypass_is_its_own_result(make_tel):
    tel = make_tel()
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    c.bypass("resp:1")
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "bypass"}) == 1


def test_backend_exception_is_counted_as_error_and_propagates(make_tel):
    class Broken(dict):
        def get(self, k, d=None):
            raise ConnectionError("backend down")

    tel = make_tel()
    c = InstrumentedCache(Broken(), layer="response", telemetry=tel)
    with pytest.raises(ConnectionError):
        c.get("k")
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "error"}) == 1


def test_instrumentation_failure_never_reaches_the_caller(make_tel, monkeypatch):
    tel = make_tel()
    c = InstrumentedCache({"k": "v"}, layer="response", telemetry=tel)

    def boom(*a, **k):
        raise RuntimeError("aggregator broke")

    c._record = boom
    assert c.get("k") == "v"
    assert tel.aggregator.errors["record"] == 1
    assert total(tel.reader, schema.TELEMETRY_ERRORS.name, {ATTR.STAGE: "record"}) == 1


def test_backend_with_set_method_is_used(make_tel):
    class Store:
        def __init__(self):
            self.d = {}

        def get(self, k, default=None):
            return self.d.get(k, default)

        def set(self, k, v):
            self.d[k] = v

    tel = make_tel()
    s = Store()
    c = InstrumentedCache(s, layer="response", telemetry=tel)
    c.set("a", 1)
    assert s.d == {"a": 1} and c.get("a") == 1


def test_observe_decorator_counts_none_as_miss(make_tel):
    tel = make_tel()
    data = {"lora:t1": "adapter"}

    @observe(layer="lora", telemetry=tel)
    def find(key):
        return data.get(key)

    assert find("lora:t1") == "adapter" and find("lora:t2") is None
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "hit", ATTR.LAYER: "lora"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "miss", ATTR.LAYER: "lora"}) == 1


def test_cached_decorator_memoises_with_bounded_lru(make_tel):
    tel = make_tel()
    calls = []

    @cached(layer="tokenizer", maxsize=2, telemetry=tel)
    def tok(text):
        calls.append(text)
        return len(text)

    for t in ["a", "a", "b", "c", "a"]:
        tok(t)
    assert calls == ["a", "b", "c", "a"]  # "a" was evicted by the LRU bound
    assert len(tok.cache) == 2
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "hit"}) == 1
    assert total(tel.reader, LOOKUPS, {ATTR.RESULT: "miss"}) == 4


def test_prompt_length_bucket_only_on_prefix_kv_layer(make_tel):
    tel = make_tel()
    kv = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    rsp = InstrumentedCache({}, layer="response", telemetry=tel)
    with request_context(tenant="t", prompt_tokens=3000, telemetry=tel):
        kv.get("kv:1")
        rsp.get("r:1")
    by_layer = {p.attributes[ATTR.LAYER]: p.attributes[ATTR.LENGTH_BUCKET] for p in points(tel.reader, LOOKUPS)}
    assert by_layer == {"prefix_kv": "4096", "response": ""}


def test_get_or_load_times_the_load_per_layer(make_tel):
    import time as _t

    tel = make_tel()
    c = InstrumentedCache({}, layer="embedding", telemetry=tel)
    c.get_or_load("e:1", lambda k: _t.sleep(0.02) or 1)
    c.get_or_load("e:1", lambda k: 1 / 0)  # a hit: the loader is not called
    c.record_load(0.5)
    tel.flush(now=1.0)
    h = tel.store.frame("histograms")
    load = h[h.metric == "warmscope.cache.load.duration"]
    assert set(load.layer) == {"embedding"} and load.total.iloc[0] == 2
    assert 0.52 <= load["sum"].iloc[0] < 0.6
    (p,) = points(tel.reader, "warmscope.cache.load.duration")
    assert p.count == 2 and p.attributes[ATTR.LAYER] == "embedding"


def test_gpu_memory_gauge_reaches_store_and_otel(make_tel):
    tel = make_tel()
    tel.record_gpu_memory(0.42)
    tel.flush(now=3.0)
    g = tel.store.frame("gauges")
    assert g.value.tolist() == [0.42] and g.metric.tolist() == [schema.GPU_MEMORY.name]
    (p,) = points(tel.reader, schema.GPU_MEMORY.name)
    assert p.value == 0.42 and p.attributes[ATTR.REPLICA] == "r0"
