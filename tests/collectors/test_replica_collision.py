"""Issue 30 item 6: two processes with one replica label. Each pipeline has its
own instance id (in the OTel resource, so OTLP keeps two series apart), and
with Redis each notices the other and says so (counted, logged once)."""

from __future__ import annotations

import logging
import time

from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.otel import build_provider
from warmscope.collectors.pipeline import Telemetry


def pipeline(url: str, replica: str) -> Telemetry:
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=url, key_secret="s", replica=replica,
                               flush_interval_s=0.05)
    return Telemetry(cfg, background=False)


def test_two_processes_with_one_replica_label_are_detected(redis_server, redis_client, caplog):
    a, b, c = pipeline(redis_server.url, "dup-0"), pipeline(redis_server.url, "dup-0"), \
        pipeline(redis_server.url, "solo-0")
    try:
        assert len({a.instance_id, b.instance_id, c.instance_id}) == 3
        with caplog.at_level(logging.WARNING, logger="warmscope.collectors"):
            for t in (a, b, c, a, b, c):
                time.sleep(0.05)
                t.flush()
        assert a.replica_collisions == {b.instance_id} and b.replica_collisions == {a.instance_id}
        assert c.replica_collisions == set()
        assert a.aggregator.errors["config"] == 1 and c.aggregator.errors["config"] == 0
        lines = [r.getMessage() for r in caplog.records if "WARMSCOPE_REPLICA" in r.getMessage()]
        assert len(lines) == 2 and "'dup-0'" in lines[0]
    finally:
        for t in (a, b, c):
            t.close()


def test_each_process_has_its_own_otel_resource(tmp_path):
    # nothing listens on port 9: each provider's last export at shutdown fails, after at most
    # export_timeout_s (the default 3 s is not what this test is about)
    cfgs = [CollectorConfig.load(env={}, exporter="otlp", otlp_endpoint="http://127.0.0.1:9",
                                 store_path=str(tmp_path / f"{i}.db"), key_secret="s", replica="dup-0",
                                 export_timeout_s=0.2)
            for i in range(2)]
    attrs = []
    for cfg in cfgs:
        tel = Telemetry(cfg, background=False, meter_provider=None)
        provider, _ = build_provider(cfg, tel.aggregator)
        attrs.append(dict(provider._sdk_config.resource.attributes))
        provider.shutdown()
        tel.close()
    assert attrs[0]["warmscope.replica"] == attrs[1]["warmscope.replica"] == "dup-0"
    assert attrs[0]["service.instance.id"] != attrs[1]["service.instance.id"]
    assert all(a["service.instance.id"].startswith("dup-0/") for a in attrs)


def test_two_processes_with_one_replica_label_on_one_store_are_detected(tmp_path):
    def one(replica: str) -> Telemetry:
        cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(tmp_path / "s.db"),
                                   key_secret="s", replica=replica, flush_interval_s=0.05)
        return Telemetry(cfg, background=False)

    a, b, c = one("dup-0"), one("dup-0"), one("solo-0")
    try:
        for t in (a, b, c, a, b, c):
            time.sleep(0.05)
            t.flush()
        assert a.replica_collisions == {b.instance_id} and b.replica_collisions == {a.instance_id}
        assert c.replica_collisions == set() and c.aggregator.errors["config"] == 0
    finally:
        for t in (a, b, c):
            t.close()
