"""The app reads through the composite source: frames are routed by the
WARMSCOPE_* settings (Redis records beside a store's metric points), alerts of
other systems come as rows, and app/dashboard/data.py itself holds no data access."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from warmscope.collectors import InstrumentedCache, request_context
from warmscope.sources.alertmanager import alert_rows

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "dashboard" / "main.py")


def test_app_data_composes_and_caches_only():
    text = (ROOT / "app" / "dashboard" / "data.py").read_text()
    for needle in ("SELECT", "_con(", "_TABLES", "sqlite3", "urlopen", "EmbeddedStore", ".execute("):
        assert needle not in text, needle
    assert not re.search(r"\bimport (redis|requests|urllib)", text)


@pytest.mark.redis
def test_hot_keys_page_reads_redis_records_beside_the_stores_points(make_tel, redis_client, redis_server, tmp_path,
                                                                   monkeypatch):
    store = tmp_path / "points.sqlite"
    tel = make_tel(redis_client=redis_client, store_path=str(store))  # points to the store, records to Redis
    c = InstrumentedCache({"k:1": 1}, layer="prefix_kv", telemetry=tel)
    with request_context(tenant="acme", telemetry=tel):
        for _ in range(5):
            c.get("k:1")
        c.get("k:2")
    for u in range(8):  # A/B unit records: to Redis as well
        with request_context(tenant="acme", unit=f"u{u}", experiment="exp", variant="AB"[u % 2], telemetry=tel):
            c.get("k:1" if u % 2 else f"k:{u + 10}")
            tel.record_request(latency_s=0.2, ttft_s=0.05, gpu_s=0.1, sla_met=True)
    tel.flush()
    assert tel.store.frame("hot_keys").empty  # the store has no hot keys: they went to Redis
    from warmscope.sources import RedisRecords

    in_redis = RedisRecords(redis_server.url).frame("hot_keys")
    assert sorted(in_redis.key_hash) and set(in_redis.tenant) == {"acme"}
    monkeypatch.setenv("WARMSCOPE_STORE", str(store))
    monkeypatch.setenv("WARMSCOPE_REDIS_URL", redis_server.url)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.session_state["range"] = "everything"
    at.run()
    at.switch_page("entries/hotkeys.py").run()
    assert not at.exception, at.exception
    assert f"Redis · {redis_server.url}" in at.sidebar.caption[0].value and str(store) in at.sidebar.caption[0].value
    shown = at.dataframe[0].value
    assert sorted(shown.key_hash) == sorted(in_redis.key_hash)
    assert dict(zip(shown.key_hash, shown.hits, strict=True)) == \
        dict(zip(in_redis.key_hash, in_redis.hits, strict=True))
    assert shown.hits.max() == 9  # k:1: five hits, then four by the B units
    at.switch_page("entries/ab.py").run()  # experiments and the report from Redis unit rows
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="ab-exp").value == "exp"
    assert any(m.value.startswith("### ") for m in at.markdown)  # the verdict
    assert any("ws-wrapped" in m.value and "Difference" in m.value for m in at.markdown)  # the metrics table


def test_alerts_of_alertmanager_and_prometheus_become_the_same_rows():
    # Shapes of Alertmanager's /api/v2/alerts and Prometheus' /api/v1/alerts answers.
    am = alert_rows("alertmanager", [{
        "labels": {"alertname": "WarmscopeHitRateDrop", "severity": "warning"},
        "annotations": {"summary": "hit rate fell", "runbook_url": "https://example.org/rb#drop"},
        "startsAt": "2026-11-30T10:00:00Z", "status": {"state": "active"}}])
    prom = alert_rows("prometheus", [{
        "labels": {"alertname": "WarmscopeHitRateDrop", "severity": "warning"},
        "annotations": {"summary": "hit rate fell", "runbook_url": "https://example.org/rb#drop"},
        "state": "firing", "activeAt": "2026-11-30T10:00:00Z"}])
    for df, origin in ((am, "alertmanager"), (prom, "prometheus")):
        assert df.to_dict("records") == [{
            "origin": origin, "alertname": "WarmscopeHitRateDrop", "state": "firing", "severity": "warning",
            "summary": "hit rate fell", "runbook_url": "https://example.org/rb#drop",
            "since": 1796032800.0}]  # 2026-11-30 10:00 UTC = 1796032800


def test_alertmanager_down_is_a_warning_and_the_page_goes_on(tmp_path, monkeypatch):
    from warmscope.collectors.store import EmbeddedStore

    from tests.conftest import free_port

    EmbeddedStore(tmp_path / "s.sqlite").close()
    monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "s.sqlite"))
    monkeypatch.setenv("WARMSCOPE_ALERTMANAGER_URL", f"http://127.0.0.1:{free_port()}")
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    at.switch_page("entries/alerts.py").run()
    assert not at.exception
    assert "Alertmanager at http://127.0.0.1:" in at.warning[0].value and "could not be read" in at.warning[0].value
    assert "showing the conditions evaluated here instead" in at.warning[0].value
