"""Edges: header bytes the gateway must forward, label bounds in one
place (gateway, client, request_context, config), free labels under the family
vocabulary rule, and the gateway's own resource bounds (413, 408, hang-ups)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from warmscope.collectors import keys, labels, request_context
from warmscope.collectors.gateway import make_app, serve
from warmscope.collectors.openai_client import InstrumentedTransport

from .llm_upstream import make_upstream

BODY = {"model": "tiny", "messages": [{"role": "system", "content": "sys prompt one"},
                                      {"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def upstream():
    with serve(make_upstream()) as url:
        yield url


def tenants(tel):
    tel.flush()
    lk = tel.store.frame("lookups")
    return set(lk[lk["layer"] == "prefix_kv"]["tenant"])


def test_non_ascii_tenant_headers_are_forwarded_and_recorded(make_tel, upstream):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel)
    with serve(app) as gw:
        for raw in ("Ünïcødé-租户".encode(), b"caf\xe9"):
            r = httpx.post(gw + "/v1/chat/completions", json=BODY,
                           headers={"x-warmscope-tenant": raw})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] > 0
    assert app.state.recorder.stats["recorded"] == 2
    assert {"Ünïcødé-租户", "café"} <= tenants(tel)


def test_client_decodes_the_tenant_header_as_the_gateway_does(make_tel, upstream):
    tel = make_tel()
    with httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel)) as c:
        assert c.post("/v1/chat/completions", json=BODY,
                      headers={"x-warmscope-tenant": b"caf\xe9"}).status_code == 200
    assert "café" in tenants(tel)


def test_decode_header_utf8_latin1_and_a_latin1_decoded_str():
    assert labels.decode_header("Ünïcødé-租户".encode()) == "Ünïcødé-租户"
    assert labels.decode_header(b"caf\xe9") == "café"
    assert labels.decode_header("Ünïcødé".encode().decode("latin-1")) == "Ünïcødé"   # as Starlette gives it
    assert labels.decode_header(None) is None


def test_long_and_odd_tenants_are_bounded_counted_and_stay_distinct(make_tel):
    tel = make_tel(tenants=())
    long_a, long_b = "a" * 20_000, "a" * 19_999 + "b"
    for t in (long_a, long_b, 'x"y{z}\n', "plain-tenant"):
        with request_context(tenant=t, telemetry=tel) as ctx:
            assert len(ctx.tenant) <= labels.MAX_LABEL_LEN and ctx.tenant != "other"
    bounded = {labels.bound(long_a), labels.bound(long_b)}
    assert len(bounded) == 2 and all(len(b) == 64 for b in bounded)
    assert labels.bound('x"y{z}\n') == "x_y_z__"
    assert labels.bound("plain-tenant") == "plain-tenant"
    assert tel.aggregator.label_bounded()["tenant"] >= 3


def test_allow_list_sees_the_bounded_value():
    long = "t" * 8000
    b = keys.TenantBucketer(allow=[long, "acme"])
    assert b.label(long) == labels.bound(long) != "other"
    assert b.label("acme") == "acme" and b.label("globex") == "other"
    first = keys.TenantBucketer(max_tenants=2)
    assert first.label("x" * 100) == first.label("x" * 100 + "") == labels.bound("x" * 100)


def test_config_allow_list_is_bounded_too(make_tel):
    tel = make_tel(tenants=("t" * 300, "acme"))
    with request_context(tenant="t" * 300, telemetry=tel) as ctx:
        assert ctx.tenant == labels.bound("t" * 300)
    assert tel.aggregator.label_bounded()["tenant"] >= 1


def test_a_free_trigger_gets_the_family_vocabulary_rule(make_tel):
    tel = make_tel()
    with tel.warmup("static_topk", layer="response", trigger="alice.smith@example.com"):
        pass
    with tel.warmup("static_topk", layer="response", trigger="replica_start"):
        pass
    tel.flush()
    runs = tel.store.frame("warmup_runs")
    assert set(runs["trigger"]) == {"*", "replica_start"}
    assert tel.aggregator.label_bounded() == {"trigger": 1}
    dump = json.dumps([m.to_json() for m in [tel.reader.get_metrics_data()]], default=str)
    assert "replica_start" in dump and "alice" not in dump and "example" not in dump


# ------------------------------------------------------------- gateway bounds
def raw_request(url: str, data: bytes, wait_s: float = 3.0, close: bool = False) -> bytes:
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(wait_s)
    s.sendall(data)
    if close:
        s.close()
        return b""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    s.close()
    return out


def test_body_over_the_limit_gets_413_with_or_without_a_length(make_tel, upstream):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel, max_body_bytes=1000)
    big = json.dumps({**BODY, "pad": "x" * 5000}).encode()
    with serve(app) as gw:
        assert httpx.post(gw + "/v1/chat/completions", content=big).status_code == 413
        chunked = httpx.post(gw + "/v1/chat/completions", content=iter([big[:600], big[600:]]))
        assert chunked.status_code == 413
        assert httpx.post(gw + "/v1/chat/completions", json=BODY).status_code == 200
    assert app.state.stats["too_large"] == 2
    assert app.state.recorder.stats["requests"] == 1     # refused bodies are not recorded


def test_slow_headers_and_slow_bodies_get_408(make_tel, upstream):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel, body_timeout_s=0.5)
    with serve(app, header_timeout_s=0.5) as gw:
        t0 = time.monotonic()
        out = raw_request(gw, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        assert out.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2.5
        out = raw_request(gw, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                          b"content-length: 100\r\n\r\n{\"model\"")
        assert out.startswith(b"HTTP/1.1 408"), out[:80]
    assert app.state.stats["header_timeouts"] == 1 and app.state.stats["body_timeouts"] == 1


def test_a_client_hanging_up_mid_body_is_counted_not_logged(make_tel, upstream, caplog):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel)
    with serve(app) as gw:
        for _ in range(3):
            raw_request(gw, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-length: 1000\r\n\r\n{\"model\"", close=True)
        deadline = time.monotonic() + 5
        while app.state.stats["client_disconnects"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert app.state.stats["client_disconnects"] == 3
    assert "Traceback" not in caplog.text and "ClientDisconnect" not in caplog.text
