"""No raw key, prompt or unit text in any byte warmscope exports."""

from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from warmscope.collectors import InstrumentedCache, instrument_redis, request_context

SECRETS = [b"zq7SECRET", b"What is my balance", b"sess-9Q"]


def _keys():
    return [f"acct:{i}:zq7SECRET{i}:What is my balance {i}" for i in range(50)]


def _workload(tel, cache, tmp_marker=""):
    with tel.warmup("static_topk", layer="response", tenant="bank") as run:
        for k in _keys()[:20]:
            cache[k] = "v"
            run.warmed(k)
    for j in range(3):
        with request_context(tenant="bank", unit=f"sess-9Q{j}", experiment="e", variant="A", telemetry=tel):
            for k in _keys():
                cache.get(k)
            tel.record_request(ttft_s=0.1, latency_s=0.5, prompt_tokens=10, gpu_s=0.1, sla_met=True)


def _assert_clean(blob: bytes, where: str):
    for s in SECRETS:
        assert s not in blob, f"{s!r} leaked into {where}"


def test_no_key_text_in_otlp_payload_or_store_file(make_tel, tmp_path):
    tel = make_tel(store_path=str(tmp_path / "p.sqlite"), early_window_s=0)
    cache = InstrumentedCache({}, layer="response", telemetry=tel)
    _workload(tel, cache)
    md = tel.reader.get_metrics_data()
    _assert_clean(encode_metrics(md).SerializeToString(), "OTLP payload")
    _assert_clean(md.to_json().encode(), "metrics JSON")
    tel.close()
    assert len(tel.store.frame("hot_keys")) > 0 and len(tel.store.frame("warmed_keys")) == 20
    for f in Path(tmp_path).glob("p.sqlite*"):
        _assert_clean(f.read_bytes(), f.name)


def test_no_key_text_in_prometheus_exposition(make_tel):
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest
    from warmscope.collectors.otel import PrometheusReader
    from warmscope.collectors.pipeline import Telemetry

    reg = CollectorRegistry()
    reader = PrometheusReader(registry=reg)
    tel0 = make_tel(with_reader=False)
    tel = Telemetry(tel0.config, meter_provider=MeterProvider(metric_readers=[reader]), background=False)
    cache = InstrumentedCache({}, layer="response", telemetry=tel)
    _workload(tel, cache)
    text = generate_latest(reg)
    assert b"warmscope_cache_lookups_total" in text
    _assert_clean(text, "Prometheus exposition")
    tel.close()


@pytest.mark.redis
def test_no_key_text_in_what_warmscope_writes_to_redis(make_tel, redis_client):
    tel = make_tel(redis_client=redis_client, early_window_s=60)
    r = instrument_redis(redis_client, layer="response", telemetry=tel)

    class RedisMap:
        def get(self, k, d=None):
            v = r.get(k)
            return d if v is None else v

        def __setitem__(self, k, v):
            r.set(k, v)

    _workload(tel, RedisMap())
    tel.close()
    ws_keys = list(redis_client.scan_iter("ws:*"))
    assert ws_keys, "the sink wrote nothing"
    kinds = set()
    for k in ws_keys:
        _assert_clean(k, "a Redis key name")
        kinds.add(k.split(b":")[1].lstrip(b"{"))  # ws:{ab:...}: a hash tag
        t = redis_client.type(k)
        if t == b"hash":
            blob = repr(redis_client.hgetall(k)).encode()
        elif t == b"zset":
            blob = repr(redis_client.zrange(k, 0, -1, withscores=True)).encode()
        elif t == b"set":
            blob = repr(redis_client.smembers(k)).encode()
        else:
            blob = redis_client.get(k) or b""
        assert len(blob) > 4
        _assert_clean(blob, f"Redis value of {k!r}")
    assert {b"hot", b"ab", b"run"} <= kinds
