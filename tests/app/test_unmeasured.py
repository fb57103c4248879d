"""Issue 30 item 4: requests whose token usage is not reported (a stream sent
with stream_options.include_usage false) are counted (a requests column and
warmscope.requests.unmeasured), and the share is shown next to the token hit
rates it leaves out (Overview, Hit rate explorer) and by the gateway command."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest
from warmscope.analysis.hitrate import unmeasured_share
from warmscope.collectors.gateway import make_app, serve

from tests.collectors.llm_upstream import make_upstream

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")
MSGS = [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def upstream():
    with serve(make_upstream()) as url:
        yield url


@pytest.fixture
def store_with_a_gap(make_tel, upstream, tmp_path):
    tel = make_tel(store_path=str(tmp_path / "gap.sqlite"))
    app = make_app(upstream, telemetry=tel)
    with serve(app) as gw:
        for _ in range(3):   # measured (the gateway asks for usage)
            body = {"model": "tiny", "messages": MSGS, "stream": True}
            assert httpx.post(gw + "/v1/chat/completions", json=body,
                              headers={"x-warmscope-tenant": "acme"}).status_code == 200
        body = {"model": "tiny", "messages": MSGS, "stream": True, "stream_options": {"include_usage": False}}
        assert httpx.post(gw + "/v1/chat/completions", json=body,
                          headers={"x-warmscope-tenant": "acme"}).status_code == 200
    tel.flush()
    assert app.state.recorder.stats["no_usage"] == 1
    return tel, tmp_path / "gap.sqlite"


def test_unmeasured_requests_are_counted_in_the_store_and_otel(store_with_a_gap):
    tel, _ = store_with_a_gap
    req = tel.store.frame("requests")
    t = unmeasured_share(req, by=["tenant"]).set_index("tenant")
    assert (t.loc["acme", "requests"], t.loc["acme", "unmeasured"], t.loc["acme", "share"]) == (4, 1, 0.25)
    data = tel.reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "warmscope.requests.unmeasured" for p in m.data.data_points]
    assert sum(p.value for p in points) == 1
    assert {p.attributes["warmscope.tenant"] for p in points if p.value} == {"acme"}


@pytest.mark.parametrize("page", ["overview", "hitrate"])
def test_pages_show_the_unmeasured_share_next_to_the_hit_rates(store_with_a_gap, monkeypatch, page):
    _, path = store_with_a_gap
    monkeypatch.setenv("WARMSCOPE_STORE", str(path))
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    if page != "overview":
        at.switch_page(f"entries/{page}.py").run()
    assert not at.exception, at.exception
    notes = [w.value for w in at.warning if "leave out" in w.value]
    assert notes == ["Token hit rates (prefix_kv) leave out 1 of 4 requests (25.0%) whose responses carried no "
                     "token usage (stream_options.include_usage false, or an engine without prompt token "
                     "details)."]


def test_the_gateway_command_says_what_share_went_unmeasured(upstream, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import free_port

    port = free_port()
    env = dict(os.environ, WARMSCOPE_KEY_SECRET="t")
    proc = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(tmp_path / "g.sqlite"),
                             "gateway", "--upstream", upstream, "--port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        for opts in ({}, {}, {}, {"stream_options": {"include_usage": False}}):
            body = {"model": "tiny", "messages": MSGS, "stream": True, **opts}
            assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0 and "Traceback" not in err
    assert "1 of 4 answered requests (25.0%) carried no token usage" in err
