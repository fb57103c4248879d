"""Exporter selection and the background flusher, over real sockets."""

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from warmscope import collectors
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry

from tests.conftest import free_port, wait_until


def test_background_flusher_writes_the_store(tmp_path):
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "bg.sqlite"), flush_interval_s=0.05,
                               key_secret="s")
    tel = Telemetry(cfg)
    try:
        c = InstrumentedCache({}, layer="response", telemetry=tel)
        for i in range(10):
            c.get(f"k:{i}")
        wait_until(lambda: tel.store.frame("lookups")["count"].sum() == 10, timeout=10, what="flush")
    finally:
        tel.close()


def test_prometheus_scrape_endpoint_serves_the_counters(tmp_path):
    port = free_port()
    cfg = CollectorConfig.load(env={}, exporter="prometheus", prometheus_port=port,
                               store_path=str(tmp_path / "p.sqlite"), key_secret="s")
    tel = Telemetry(cfg, background=False)
    try:
        c = InstrumentedCache({"resp:1": 1}, layer="response", telemetry=tel)
        with request_context(tenant="t1", telemetry=tel):
            for _ in range(3):
                c.get("resp:1")
            tel.record_request(ttft_s=0.05, latency_s=0.4, gpu_s=0.25, sla_met=True)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        line = [ln for ln in body.splitlines()
                if ln.startswith("warmscope_cache_lookups_total{") and 'warmscope_cache_result="hit"' in ln]
        assert len(line) == 1 and line[0].endswith(" 3.0"), line
        assert 'gen_ai_server_time_to_first_token_seconds_bucket{' in body
        assert "warmscope_gpu_time_seconds_total{" in body
        # Embedded points are not written when Prometheus is the exporter...
        tel.flush()
        assert tel.store.frame("lookups").empty
        # ...but hot keys still have a home without Redis.
        assert not tel.store.frame("hot_keys").empty
    finally:
        tel.close()


class _Sink(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        n = int(self.headers["Content-Length"])
        _Sink.bodies.append((self.path, self.rfile.read(n)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_otlp_http_export_reaches_a_receiver(tmp_path):
    srv = HTTPServer(("127.0.0.1", free_port()), _Sink)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Sink.bodies.clear()
    try:
        cfg = CollectorConfig.load(env={}, exporter="otlp", otlp_endpoint=f"http://127.0.0.1:{srv.server_port}",
                                   store_path=str(tmp_path / "o.sqlite"), key_secret="s", flush_interval_s=60)
        tel = Telemetry(cfg, background=False)
        c = InstrumentedCache({}, layer="embedding", telemetry=tel)
        with request_context(tenant="acme", telemetry=tel):
            c.get("emb:doc:1")
            tel.record_request(latency_s=0.2)
        assert tel.otel.provider.force_flush(10_000)
        tel.close()
    finally:
        srv.shutdown()
        srv.server_close()
    assert _Sink.bodies and _Sink.bodies[0][0] == "/v1/metrics"
    req = ExportMetricsServiceRequest()
    req.ParseFromString(_Sink.bodies[0][1])
    metrics = {m.name: m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    lk = metrics["warmscope.cache.lookups"].sum.data_points
    assert sum(p.as_int for p in lk) == 1
    attrs = {a.key: a.value.string_value for a in lk[0].attributes}
    assert attrs["warmscope.tenant"] == "acme" and attrs["warmscope.cache.result"] == "miss"
    assert metrics["gen_ai.server.request.duration"].histogram.data_points[0].count == 1
    assert b"emb:doc:1" not in _Sink.bodies[0][1]


def test_setup_installs_the_process_pipeline(tmp_path):
    tel = collectors.setup(exporter="embedded", store_path=str(tmp_path / "g.sqlite"), key_secret="s",
                           background=False)
    try:
        assert collectors.current_telemetry() is tel
        c = InstrumentedCache({}, layer="response")
        with request_context(tenant="g"):
            c.get("x:1")
        tel.flush(now=5.0)
        assert tel.store.frame("lookups").tenant.tolist() == ["g"]
    finally:
        collectors.shutdown()
    assert collectors.pipeline._installed is None


def test_close_is_prompt_and_final(tmp_path):
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "c.sqlite"), flush_interval_s=3600, key_secret="s")
    tel = Telemetry(cfg)
    c = InstrumentedCache({}, layer="response", telemetry=tel)
    c.get("k:1")
    t0 = time.monotonic()
    tel.close()
    assert time.monotonic() - t0 < 5
    assert tel.store.frame("lookups")["count"].sum() == 1


def test_a_key_read_once_per_flush_is_hot_when_read_twice_in_its_window(tmp_path):
    # Hot-key window 3600 s, side flushes 10, 310, 610 and 3610 s into it. "twice" is read once
    # before each of the first two flushes (a hit, then a miss): hot, with both reads; its third
    # read (a miss, once in that flush) adds to its row. "span" is read once in each of two
    # windows and "lonely" once in all: neither is hot.
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "h.sqlite"), key_secret="s",
                               side_flush_s=0, hot_key_window_s=3600)
    tel = Telemetry(cfg, background=False)
    try:
        backend = {"twice": 1}
        c = InstrumentedCache(backend, layer="response", telemetry=tel)
        t0 = 1_800_000_000.0 - 1_800_000_000.0 % 3600  # the start of a window
        with request_context(tenant="t1", telemetry=tel):
            c.get("twice")  # hit
            c.get("span")  # miss, in the first window
            c.get("lonely")
            tel.flush(now=t0 + 10)
            assert tel.store.frame("hot_keys").empty  # nothing read twice yet
            backend.clear()
            c.get("twice")  # miss, same window
            tel.flush(now=t0 + 310)
            c.get("twice")  # once more in the window
            tel.flush(now=t0 + 610)
            c.get("span")  # the next window
            tel.flush(now=t0 + 3610)
        hk = tel.store.frame("hot_keys")
        assert len(hk) == 1, hk
        row = hk.iloc[0]
        assert (row["hits"], row["misses"], row["window"]) == (1, 2, t0), row
    finally:
        tel.close()


def test_telemetry_uses_the_collaborators_it_is_given(tmp_path, redis_client):
    """Each collaborator given is used as is (nothing built in its place): the aggregator counts, the
    store receives the points, the Redis sink the hot keys and the exporter the counters."""
    from opentelemetry.sdk.metrics import MeterProvider
    from warmscope.collectors.otel import InMemoryReader
    from warmscope.collectors.pipeline import make_aggregator, open_redis_sink, start_exporter
    from warmscope.collectors.store import EmbeddedStore

    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "unused.sqlite"), key_secret="s", replica="r0")
    agg = make_aggregator(cfg, time.time)
    store = EmbeddedStore(tmp_path / "given.sqlite")
    sink = open_redis_sink(cfg, redis_client, agg)
    reader = InMemoryReader()
    provider = MeterProvider(metric_readers=[reader])
    bridge = start_exporter(cfg, agg, provider)
    tel = Telemetry(cfg, aggregator=agg, store=store, redis_sink=sink, exporter=bridge, background=False)
    try:
        assert (tel.aggregator, tel.store, tel.redis_sink, tel.otel) == (agg, store, sink, bridge)
        c = InstrumentedCache({"resp:1": 1}, layer="response", telemetry=tel)
        with request_context(tenant="t1", telemetry=tel):
            for _ in range(3):
                c.get("resp:1")
        tel.flush()
        assert store.frame("lookups")["count"].sum() == 3           # the given store, not cfg's path
        assert not (tmp_path / "unused.sqlite").exists()
        assert len(redis_client.keys("*")) > 0                       # hot keys went to the given Redis
        names = {m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics}
        assert "warmscope.cache.lookups" in names                    # the given exporter's reader saw them
        assert not any(agg.errors.values())
    finally:
        tel.close()
        provider.shutdown()
        store.close()


def test_a_collaborator_that_cannot_be_built_is_counted_not_raised(tmp_path, caplog):
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "s.sqlite"), key_secret="s",
                               redis_url="redis://127.0.0.1:notaport/0")
    tel = Telemetry(cfg, background=False)
    try:
        assert tel.redis_sink is None and tel.aggregator.errors.get("redis") == 1
        assert sum("cannot use Redis" in r.message for r in caplog.records) == 1
        tel.aggregator.count_error("redis", "again")                 # already explained: no second line
        assert sum("redis" in r.message.lower() for r in caplog.records) == 1
    finally:
        tel.close()
