"""OpenAI-compatible client instrumentation, the gateway and the warm-up runner
against a local OpenAI-shaped server (real HTTP on 127.0.0.1; the real engine
is exercised in tests/engine/test_ab_engine.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import httpx
import openai
import pytest
from warmscope.collectors import request_context
from warmscope.collectors.gateway import make_app, serve
from warmscope.collectors.openai_client import (
    InstrumentedTransport,
    instrument_openai,
    recorder_of,
)
from warmscope.collectors.warmup_runner import WarmupInputError, load_prompts, run_warmup

from .llm_upstream import make_upstream

SYSTEM = "You are the zq7 support bot for Initech. Reply in one line. " * 4   # text that must never leave
USER = "My invoice 4471 is wrong"


def msgs(system=SYSTEM, user=USER):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@pytest.fixture(scope="module")
def upstream():
    with serve(make_upstream()) as url:
        yield url


def lookups(tel):
    tel.flush()
    lk = tel.store.frame("lookups")
    return lk[lk["layer"] == "prefix_kv"]


def test_sync_transport_records_tokens_per_tenant_and_passes_bytes_through(make_tel, upstream):
    tel = make_tel()
    plain = httpx.Client(base_url=upstream)
    inst = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    body = {"model": "tiny", "messages": msgs(), "max_tokens": 1}
    first = inst.post("/v1/chat/completions", json=body, headers={"x-warmscope-tenant": "acme"})
    second = inst.post("/v1/chat/completions", json={**body, "user": "globex"})
    ref = plain.post("/v1/chat/completions", json=body)
    assert first.json()["choices"] == ref.json()["choices"]           # the caller's response is untouched
    u1, u2 = first.json()["usage"], second.json()["usage"]
    assert u1["prompt_tokens_details"]["cached_tokens"] == 0 and u2["prompt_tokens_details"]["cached_tokens"] > 0
    lk = lookups(tel)
    by = lk.groupby(["tenant", "result"])["count"].sum().to_dict()
    # tokens, not requests: acme all missed, globex hit its cached tokens
    assert by[("acme", "miss")] == u1["prompt_tokens"]
    assert by[("globex", "hit")] == u2["prompt_tokens_details"]["cached_tokens"]
    assert by[("globex", "miss")] == u2["prompt_tokens"] - u2["prompt_tokens_details"]["cached_tokens"]
    fams = set(lk["family"])
    assert len(fams) == 1 and next(iter(fams)).startswith("chat:system:")
    assert "zq7" not in next(iter(fams)) and "support" not in next(iter(fams))
    assert recorder_of(inst).stats["recorded"] == 2


def test_stream_gives_ttft_and_usage_and_unit_from_the_context(make_tel, upstream):
    tel = make_tel()
    client = instrument_openai(openai.OpenAI(base_url=upstream + "/v1", api_key="-"), telemetry=tel)
    cached = 0
    for _ in range(2):
        with request_context(tenant="acme", unit="sess-1", experiment="exp", variant="B", telemetry=tel):
            chunks = list(client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=3, stream=True,
                                                         stream_options={"include_usage": True}))
        cached += chunks[-1].usage.prompt_tokens_details.cached_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok ok ok"
    tel.flush()
    h = tel.store.frame("histograms")
    ttft = h[h["metric"] == "gen_ai.server.time_to_first_token"]
    assert ttft["count"].sum() == 2 and ttft["sum"].iloc[0] > 0     # one row per bucket; 2 observations
    units = tel.store.units("exp")
    assert len(units) == 1 and units["requests"].iloc[0] == 2 and units["variant"].iloc[0] == "B"
    lk = lookups(tel)
    hits = lk[lk.result == "hit"]["count"].sum()
    assert hits == cached > 0


def test_async_openai_client_streaming_and_not(make_tel, upstream):
    tel = make_tel()

    async def go():
        client = instrument_openai(openai.AsyncOpenAI(base_url=upstream + "/v1", api_key="-"), telemetry=tel)
        with request_context(tenant="initech", telemetry=tel):
            r = await client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=1)
            s = await client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=1, stream=True,
                                                     stream_options={"include_usage": True})
            last = [c async for c in s][-1]
        await client.close()
        return r.usage, last.usage

    u1, u2 = asyncio.run(go())
    lk = lookups(tel)
    assert set(lk["tenant"]) == {"initech"}
    assert lk["count"].sum() == u1.prompt_tokens + u2.prompt_tokens      # 2 requests' prompt tokens
    cached = u1.prompt_tokens_details.cached_tokens + u2.prompt_tokens_details.cached_tokens
    assert lk[lk.result == "hit"]["count"].sum() == cached > 0


def test_faults_reach_the_caller_as_without_warmscope_and_are_counted(make_tel, upstream, caplog):
    tel = make_tel()
    inst_tr = InstrumentedTransport(telemetry=tel)
    inst = httpx.Client(base_url=upstream, transport=inst_tr)
    plain = httpx.Client(base_url=upstream)

    def both(fn):
        out = []
        for c in (plain, inst):
            try:
                out.append(("ok", fn(c)))
            except Exception as e:
                out.append(("raised", type(e)))
        return out

    # engine error: the same 500 and body
    a, b = both(lambda c: (lambda r: (r.status_code, r.content))(
        c.post("/v1/chat/completions", json={"model": "error", "messages": msgs()})))
    assert a == b and a[1][0] == 500
    # a stream cut mid-way: the same exception type for both
    cut = {"model": "cut", "messages": msgs(), "stream": True}
    a, b = both(lambda c: c.post("/v1/chat/completions", json=cut).content)
    assert a == b and a[0] == "raised"
    # a response that is not JSON: forwarded unchanged
    a, b = both(lambda c: c.post("/v1/chat/completions", json={"model": "badjson", "messages": msgs()}).content)
    assert a == b == ("ok", b"{not json")
    # a request body that is not JSON: forwarded, the engine's 400 comes back
    a, b = both(lambda c: c.post("/v1/chat/completions", content=b"\x00garbage{").status_code)
    assert a == b == ("ok", 400)
    # no usage details: one log line naming the fix, counted
    with caplog.at_level(logging.WARNING, logger="warmscope.collectors"):
        for _ in range(2):
            inst.post("/v1/chat/completions", json={"model": "nousage", "messages": msgs()})
    assert sum("enable-prompt-tokens-details" in r.message for r in caplog.records) == 1
    # the engine down: the same connection error
    dead = httpx.Client(base_url="http://127.0.0.1:9", transport=InstrumentedTransport(telemetry=tel))
    with pytest.raises(httpx.ConnectError):
        dead.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs()})
    st = inst_tr.recorder.stats
    assert (st["engine_errors"], st["cut_streams"], st["no_usage"]) == (2, 1, 2)   # the 500 and the 400
    assert st["bad_body"] == 2                       # the non-JSON response and the non-JSON request
    assert dead._transport.recorder.stats["connect_errors"] == 1
    lk = lookups(tel)
    assert lk[lk.result == "error"]["count"].sum() == 3   # engine error, cut stream, engine down


def test_gateway_forwards_unchanged_and_records(make_tel, upstream):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel)
    with serve(app) as gw:
        g, p = httpx.Client(base_url=gw), httpx.Client(base_url=upstream)
        body = {"model": "tiny", "messages": msgs(), "stream": True, "stream_options": {"include_usage": True}}
        p.post("/v1/chat/completions", json={**body, "messages": msgs(user="warm the prefix")})
        via = g.post("/v1/chat/completions", json=body, headers={"x-warmscope-tenant": "acme"})
        ref = p.post("/v1/chat/completions", json=body)   # the same request, straight to the engine
        assert via.status_code == 200 and via.headers["content-type"].startswith("text/event-stream")
        assert via.content == ref.content                # the SSE bytes, untouched
        assert g.get("/v1/models").json() == p.get("/v1/models").json()
        assert g.post("/v1/chat/completions", content=b"{truncated").status_code == 400
        with pytest.raises(httpx.RemoteProtocolError):
            g.post("/v1/chat/completions", json={"model": "cut", "messages": msgs(), "stream": True})
        assert g.get("/v1/models").status_code == 200    # the gateway lives on
    with serve(make_app("http://127.0.0.1:9", telemetry=tel)) as gw:
        r = httpx.post(gw + "/v1/chat/completions", json={"model": "tiny", "messages": msgs()})
        assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    st = app.state.recorder.stats
    assert st["recorded"] == 1 and st["bad_body"] == 1 and st["cut_streams"] == 1
    lk = lookups(tel)
    acme = lk[lk.tenant == "acme"]
    usage = json.loads([line for line in via.text.splitlines() if '"usage": {' in line][0][5:])["usage"]
    assert acme[acme.result == "hit"]["count"].sum() == usage["prompt_tokens_details"]["cached_tokens"] > 0


def test_warmup_runner_warms_records_and_fails_cleanly(make_tel, upstream, tmp_path):
    tel = make_tel(early_window_s=3600)
    inst = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    rec = inst._transport.recorder
    ws = tmp_path / "warm.jsonl"
    ws.write_text("\n".join(json.dumps({"messages": [{"role": "system", "content": f"{SYSTEM} v{i}"}],
                                        "tenant": "acme"}) for i in range(3)) + "\n")
    res = run_warmup(upstream, str(ws), recorder=rec, top_k=2, tenant="acme", rate=0)
    assert (res.status, res.keys) == ("ok", 2) and res.prompt_tokens > 0
    # real requests that share a warmed prefix hit it: the warmed key was read
    for i in range(3):
        with request_context(tenant="acme", telemetry=tel):
            inst.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs(system=f"{SYSTEM} v{i}")})
    tel.close()
    runs = tel.store.frame("warmup_runs")
    assert list(runs["status"]) == ["ok"] and runs["keys"].iloc[0] == 2
    wk = tel.store.frame("warmed_keys")
    assert len(wk) == 2 and wk["first_hit_at"].notna().all()            # precision 2/2
    early = tel.store.frame("early_keys")
    assert len(early) == 3 and set(wk["key_hash"]) < set(early["key_hash"])   # recall 2/3
    # from the in-process hot prefixes
    hot = rec.hot_prefixes(10, tenant="acme")
    assert len(hot) == 3 and all(k.startswith("chat:system:") for k, _, _ in hot)
    # the engine gone: the run ends as error, nothing raised
    bad = run_warmup("http://127.0.0.1:9", str(ws), telemetry=tel, top_k=2)
    assert bad.status == "error" and "ConnectError" in bad.error
    with pytest.raises(WarmupInputError, match=r"bad.jsonl:2: not JSON"):
        (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n{oops\n')
        load_prompts(tmp_path / "bad.jsonl")


def _sse(client, body, **kw):
    with client.stream("POST", "/v1/chat/completions", json=body, **kw) as r:
        return b"".join(r.iter_bytes()), r


def test_streams_ask_for_usage_and_the_caller_reads_what_it_asked_for(make_tel, upstream):
    tel = make_tel()
    plain = httpx.Client(base_url=upstream)
    inst = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    rec = inst._transport.recorder
    body = {"model": "tiny", "messages": msgs(), "stream": True}
    ref, _ = _sse(plain, body)                       # the engine's stream when usage is not asked for
    got, resp = _sse(inst, body, headers={"x-warmscope-tenant": "acme"})
    assert got == ref                                # byte for byte: no usage chunk, no "usage": null
    assert b"usage" not in got
    assert b"stream_options" not in resp.request.content   # the caller's request object as it was
    # the engine was asked for usage, so the cached tokens of the repeat were recorded
    assert rec.stats["usage_requested"] == 1 and rec.stats["recorded"] == 1 and rec.stats["no_usage"] == 0
    # a caller that asks for usage gets the usage chunk, untouched
    asked = {**body, "stream_options": {"include_usage": True}}
    ref2, _ = _sse(plain, asked)
    got2, _ = _sse(inst, asked, headers={"x-warmscope-tenant": "acme"})
    assert b'"choices": [], "usage": {' in got2 and got2.count(b"data:") == ref2.count(b"data:")
    # one that said no is left alone (and counted as without usage)
    _sse(inst, {**body, "stream_options": {"include_usage": False}})
    # other stream options are kept and usage added beside them
    _sse(inst, {**body, "stream_options": {"continuous_usage_stats": False}})
    assert rec.stats["usage_requested"] == 2 and rec.stats["no_usage"] == 1 and rec.stats["recorded"] == 3
    lk = lookups(tel)
    hits = lk[(lk["tenant"] == "acme") & (lk["result"] == "hit")]["count"].sum()
    assert hits > 0                                  # the acme repeat hit its cached prefix
    # the openai client sees the same chunks as without warmscope: none without choices
    oc = instrument_openai(openai.OpenAI(base_url=upstream + "/v1", api_key="-"), telemetry=tel)
    chunks = list(oc.chat.completions.create(model="tiny", messages=msgs(), stream=True))
    assert [c.choices[0].delta.content for c in chunks] == ["", "ok", " ok", " ok"]
    assert recorder_of(oc).stats["recorded"] == 1


def test_usage_chunk_is_taken_out_at_any_chunk_boundary(make_tel, upstream):
    tel = make_tel()
    plain = httpx.Client(base_url=upstream)
    body = {"model": "tiny", "messages": msgs(system="boundaries"), "stream": True}
    ref, _ = _sse(plain, body)
    engine, _ = _sse(plain, {**body, "stream_options": {"include_usage": True}})   # what the engine sends
    rec = InstrumentedTransport(telemetry=tel).recorder
    raw = json.dumps(body).encode()
    for cut in range(1, len(engine)):                # every split into two network chunks, and byte by byte
        for parts in ([engine[:cut], engine[cut:]],) + (([engine[i:i + 1] for i in range(len(engine))],)
                                                        if cut == 1 else ()):
            ex = rec.begin("POST", "/v1/chat/completions", {}, raw)
            assert ex.strip and b'"include_usage":true' in ex.body
            ex.response(200, "text/event-stream; charset=utf-8")
            out = b"".join(ex.feed(p) for p in parts) + ex.flush()
            ex.finish()
            assert out == ref, cut
            assert ex.usage["prompt_tokens"] > 0
    # a line that is not JSON: passed on unchanged from there on, counted, never raised
    ex = rec.begin("POST", "/v1/chat/completions", {}, raw)
    ex.response(200, "text/event-stream")
    odd = b'data: {"usage": {"prompt_tokens": oops\n\n' + ref
    assert b"".join([ex.feed(odd), ex.flush()]) == odd
    assert not ex.strip


def test_gateway_streams_ask_for_usage_too(make_tel, upstream):
    tel = make_tel()
    app = make_app(upstream, telemetry=tel)
    body = {"model": "tiny", "messages": msgs(system="via the gateway"), "stream": True}
    with serve(app) as gw:
        ref, _ = _sse(httpx.Client(base_url=upstream), body)
        got, _ = _sse(httpx.Client(base_url=gw), body)
        got2, _ = _sse(httpx.Client(base_url=gw), body)
    assert got == got2 == ref
    st = app.state.recorder.stats
    assert st["usage_requested"] == 2 and st["recorded"] == 2 and st["no_usage"] == 0


def test_warmup_from_hot_uses_the_store_and_the_local_prompt_library(make_tel, upstream, tmp_path, capsys):
    import os
    import stat

    from warmscope.app.cli.main import main

    store, library = tmp_path / "serving.sqlite", tmp_path / "prompts.jsonl"
    tel = make_tel(store_path=str(store), key_secret="shared-secret")
    client = instrument_openai(openai.OpenAI(base_url=upstream + "/v1", api_key="-"), telemetry=tel,
                               prompt_library=str(library))
    hot_system, cold_system = f"{SYSTEM} the hot one", f"{SYSTEM} the cold one"
    for system, n in ((hot_system, 4), (cold_system, 1)):
        for i in range(n):
            with request_context(tenant="acme", telemetry=tel):
                client.chat.completions.create(model="tiny", messages=msgs(system=system, user=f"q{i}"))
    recorder_of(client).close()
    tel.close()
    assert stat.S_IMODE(os.stat(library).st_mode) == 0o600
    lib = [json.loads(line) for line in library.read_text().splitlines()]
    assert len(lib) == 2 and SYSTEM in library.read_text()          # the text stays on this host...
    hot_key = next(e["key"] for e in lib if e["prefix"][0][1] == hot_system)
    blob = b"".join(p.read_bytes() for p in tmp_path.glob("serving.sqlite*"))
    assert b"zq7" not in blob and hot_key.encode() not in blob          # ...the store has hashes only
    env = {"WARMSCOPE_KEY_SECRET": "shared-secret"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        rc = main(["--store", str(store), "warmup", "--engine", upstream, "--from", "hot", "--library",
                   str(library), "--top-k", "1", "--rate", "0", "--quiet"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert "ok, 1 prefixes" in err
        os.environ["WARMSCOPE_KEY_SECRET"] = "another-secret"          # not the serving process's
        assert main(["--store", str(store), "warmup", "--engine", upstream, "--from", "hot", "--library",
                     str(library), "--quiet"]) == 2
        assert "same key secret" in capsys.readouterr().err
        assert main(["--store", str(store), "warmup", "--engine", upstream, "--from", "hot", "--library",
                     str(tmp_path / "none.jsonl"), "--quiet"]) == 2
        assert "cannot read the prompt library" in capsys.readouterr().err
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    from warmscope.collectors.keys import KeyHasher
    from warmscope.collectors.store import EmbeddedStore

    st = EmbeddedStore(store, readonly=True)
    try:
        wk = st.frame("warmed_keys")
        runs = st.frame("warmup_runs")
    finally:
        st.close()
    # the hottest prefix was warmed, under the key real requests carry
    assert list(wk["key_hash"]) == [KeyHasher(b"shared-secret").hash(hot_key)]
    assert list(runs["status"]) == ["ok"]


def test_cli_bad_input_is_one_clear_message(tmp_path, capsys):
    from warmscope.app.cli.main import main

    assert main(["gateway", "--upstream", "localhost:8000"]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err
    assert main(["warmup", "--engine", "http://127.0.0.1:9", "--from", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ex:                       # argparse: "--from is required"
        main(["warmup", "--engine", "http://127.0.0.1:9"])
    assert ex.value.code == 2 and "--from" in capsys.readouterr().err
    assert main(["warmup", "--engine", "http://127.0.0.1:9", "--from", "hot"]) == 2
    assert "--from hot needs --library" in capsys.readouterr().err
    (tmp_path / "w.jsonl").write_text('{"prompt": "hello"}\n')
    assert main(["--store", str(tmp_path / "s.sqlite"), "warmup", "--engine", "http://127.0.0.1:9",
                 "--from", str(tmp_path / "w.jsonl"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error" in err and "ConnectError" in err and "Traceback" not in err


def _client_workload(tel, upstream):
    client = instrument_openai(openai.OpenAI(base_url=upstream + "/v1", api_key="-"), telemetry=tel,
                               experiment="exp", variant="A")
    with tel.warmup("engine_prefix", layer="prefix_kv", tenant="acme") as run:
        run.warmed(recorder_of(client).prefix_key("chat", [["system", SYSTEM]]))
    for j in range(3):
        with request_context(tenant="acme", unit=f"sess-zq7{j}", telemetry=tel):
            list(client.chat.completions.create(model="tiny", messages=msgs(), stream=True,
                                                stream_options={"include_usage": True}))
            client.chat.completions.create(model="tiny", messages=msgs(user=f"{USER} {j}"))
    assert recorder_of(client).stats["recorded"] == 6


LEAKS = [b"zq7", b"support bot", b"invoice 4471", b"Initech"]


def _clean(blob: bytes, where: str) -> None:
    for s in LEAKS:
        assert s not in blob, f"{s!r} leaked into {where}"


def test_no_prompt_text_in_store_otlp_or_prometheus(make_tel, upstream, tmp_path):
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest
    from warmscope.collectors.otel import PrometheusReader
    from warmscope.collectors.pipeline import Telemetry

    tel = make_tel(store_path=str(tmp_path / "p.sqlite"), early_window_s=0)
    _client_workload(tel, upstream)
    md = tel.reader.get_metrics_data()
    payload = encode_metrics(md).SerializeToString()
    assert b"warmscope.cache.lookups" in payload
    _clean(payload, "the OTLP payload")
    tel.close()
    assert len(tel.store.frame("hot_keys")) > 0 and len(tel.store.units("exp")) == 3
    for f in tmp_path.glob("p.sqlite*"):
        _clean(f.read_bytes(), f.name)
    reg = CollectorRegistry()
    tel2 = Telemetry(make_tel(with_reader=False).config,
                     meter_provider=MeterProvider(metric_readers=[PrometheusReader(registry=reg)]), background=False)
    _client_workload(tel2, upstream)
    text = generate_latest(reg)
    assert b"warmscope_cache_lookups_total" in text and b"prefix_kv" in text
    _clean(text, "the Prometheus exposition")
    tel2.close()


@pytest.mark.redis
def test_no_prompt_text_in_redis(make_tel, upstream, redis_client):
    tel = make_tel(redis_client=redis_client, early_window_s=60)
    _client_workload(tel, upstream)
    tel.close()
    keys = list(redis_client.scan_iter("ws:*"))
    assert {k.split(b":")[1].lstrip(b"{") for k in keys} >= {b"hot", b"ab", b"run"}  # ws:{ab:...}: hash tags
    for k in keys:
        _clean(k, "a Redis key name")
        t = redis_client.type(k)
        blob = {b"hash": lambda k=k: repr(redis_client.hgetall(k)),
                b"zset": lambda k=k: repr(redis_client.zrange(k, 0, -1, withscores=True)),
                b"set": lambda k=k: repr(redis_client.smembers(k))}.get(t, lambda k=k: redis_client.get(k) or b"")()
        _clean(blob if isinstance(blob, bytes) else blob.encode(), f"Redis value of {k!r}")


@pytest.mark.slow
def test_gateway_command_forwards_records_and_stops_cleanly(upstream, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from warmscope.collectors.store import EmbeddedStore

    from tests.conftest import free_port

    port = free_port()
    store = tmp_path / "gw.sqlite"
    env = dict(os.environ, WARMSCOPE_KEY_SECRET="t", WARMSCOPE_FLUSH_INTERVAL="1")
    proc = subprocess.Popen([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "gateway",
                             "--upstream", upstream, "--port", str(port), "--variant", "B"],
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
        r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": msgs(), "user": "acme"})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 0
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0 and "Traceback" not in err
    assert f"gateway on http://127.0.0.1:{port} -> {upstream}" in err and "recorded 1" in err
    lk = EmbeddedStore(store, readonly=True).frame("lookups")
    assert set(lk["tenant"]) == {"acme"} and set(lk["variant"]) == {"B"}
    assert lk["count"].sum() == r.json()["usage"]["prompt_tokens"]


def test_client_and_gateway_libraries_stay_out_of_the_base_install():
    import tomllib

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"]).lower()
    for lib in ("httpx", "openai", "starlette", "uvicorn"):
        assert lib not in base, f"{lib} belongs in an extra"
    extras = meta["optional-dependencies"]
    assert any("httpx" in d for d in extras["client"]) and any("openai" in d for d in extras["client"])
    assert "warmscope[gateway]" in extras["dev"] and any("uvicorn" in d for d in extras["gateway"])
    import subprocess
    import sys

    # the collectors and the recorder import without them
    code = ("import sys; sys.modules.update(httpx=None, openai=None, starlette=None, uvicorn=None); "
            "from warmscope import collectors; import warmscope.collectors.llm")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_template_of_is_the_system_prompt_or_the_first_block():
    from warmscope.collectors.llm import template_of

    chat = [["system", "S"], ["user", "u1"], ["assistant", "a1"]]
    assert template_of("chat", chat) == ("system", "S")
    # a developer message counts as the system prompt, wherever it is
    assert template_of("chat", [["user", "u0"], ["developer", "D"]]) == ("developer", "D")
    assert template_of("chat", [["user", "u0"], ["assistant", "a0"]]) == ("user", "u0")  # no system: the first
    parts = [{"type": "text", "text": "T"}]
    assert template_of("chat", [["system", parts]]) == ("system", json.dumps(parts, sort_keys=True))
    assert template_of("chat", [["robot", "R"]]) == ("other", "R")
    assert template_of("completion", "Summarise.\nBe brief.\n\nDoc 1\n\nmore") == ("prompt", "Summarise.\nBe brief.")
    assert template_of("completion", "one block") == ("prompt", "one block")


def test_family_is_the_system_prompt_template_whatever_the_history(make_tel, upstream, tmp_path):
    """Multi-turn chats that share a system prompt share one key family (their
    prefix keys differ); another system prompt is another family; a chat with
    no system prompt is keyed by its first message and a completion by its
    first block (digits blanked); no family, key hash or stored byte holds
    prompt text."""
    tel = make_tel(store_path=str(tmp_path / "f.sqlite"))
    inst = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    other_system = "You are the zq7 billing desk of Initech. Reply in French."
    chats = {   # tenant -> the conversation so far (the last message is the new question)
        "t1": msgs(SYSTEM, "first") + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}],
        "t2": msgs(SYSTEM, "another history") + [{"role": "assistant", "content": "sure"},
                                                  {"role": "user", "content": "and then"}],
        "t3": msgs(SYSTEM, "single turn"),
        "t4": msgs(other_system, "first") + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "x"}],
        "t5": [{"role": "user", "content": "Ticket 4471: printer zq7 jammed"}, {"role": "assistant", "content": "a"},
               {"role": "user", "content": "b"}],
        "t6": [{"role": "user", "content": "Ticket 9902: printer zq7 jammed"}, {"role": "assistant", "content": "c"},
               {"role": "user", "content": "d"}],
    }
    rec = inst._transport.recorder
    keys = {}
    for tenant, m in chats.items():
        r = inst.post("/v1/chat/completions", json={"model": "tiny", "messages": m, "max_tokens": 1},
                      headers={"x-warmscope-tenant": tenant})
        assert r.status_code == 200
        keys[tenant] = rec._key_of({"messages": m})[0]
    prompts = {"c1": "Summarise for Initech support.\n\nDoc zq7 1", "c2": "Summarise for Initech support.\n\nDoc 2",
               "c3": "Translate for Initech support.\n\nDoc zq7 1"}
    for tenant, p in prompts.items():
        r = inst.post("/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 1},
                      headers={"x-warmscope-tenant": tenant})
        assert r.status_code == 200
    lk = lookups(tel)
    fam = lk.groupby("tenant")["family"].agg(lambda s: set(s)).to_dict()
    assert all(len(f) == 1 for f in fam.values())
    fam = {t: next(iter(f)) for t, f in fam.items()}
    assert fam["t1"] == fam["t2"] == fam["t3"]                 # one system prompt, three histories: one family
    assert len({keys["t1"], keys["t2"], keys["t3"]}) == 3       # ... and three prefix keys
    assert fam["t4"] != fam["t1"]                               # another system prompt, another family
    assert fam["t5"] == fam["t6"] != fam["t1"]                  # no system prompt: the first message, digits blanked
    assert fam["c1"] == fam["c2"] != fam["c3"]                  # completions: the first block
    assert re.fullmatch(r"chat:system:[a-z]{8}:\*", fam["t1"]) and re.fullmatch(r"chat:user:[a-z]{8}:\*", fam["t5"])
    assert re.fullmatch(r"completion:prompt:[a-z]{8}:\*", fam["c1"])
    tel.close()
    hk = tel.store.frame("hot_keys")
    exported = " ".join(list(lk["family"]) + list(hk["family"]) + list(hk["key_hash"]))
    for word in ("zq7", "Initech", "Ticket", "printer", "Summarise", "support"):
        assert word not in exported
    for f in tmp_path.glob("f.sqlite*"):
        blob = f.read_bytes()
        for word in (b"zq7", b"Initech", b"Ticket", b"printer", b"Summarise", b"billing", b"another history"):
            assert word not in blob, (word, f.name)


def test_vllm_shaped_stream_gets_its_fingerprint_back_at_any_chunk_boundary(make_tel):
    """vLLM writes compact JSON and, when usage is on, moves system_fingerprint
    from the last choice chunk to the usage chunk: the caller reads the stream
    it would have read without usage, at every split into network chunks."""
    def ev(obj):
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def chunk(delta, finish=None, **more):
        return {"id": "c", "object": "chat.completion.chunk", "model": "tiny",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **more}

    usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
             "prompt_tokens_details": {"cached_tokens": 32}}
    plain = b"".join([ev(chunk({"role": "assistant", "content": ""})), ev(chunk({"content": "ok"})),
                      ev(chunk({"content": "!"}, "length", system_fingerprint="fp_7")), b"data: [DONE]\n\n"])
    engine = b"".join([ev(chunk({"role": "assistant", "content": ""}, usage=None)),
                       ev(chunk({"content": "ok"}, usage=None)), ev(chunk({"content": "!"}, "length", usage=None)),
                       ev({"id": "c", "object": "chat.completion.chunk", "model": "tiny", "choices": [],
                           "usage": usage, "system_fingerprint": "fp_7"}), b"data: [DONE]\n\n"])
    rec = InstrumentedTransport(telemetry=make_tel()).recorder
    raw = json.dumps({"model": "tiny", "messages": msgs(), "stream": True}).encode()
    splits = [[engine[:c], engine[c:]] for c in range(1, len(engine))]
    splits.append([engine[i:i + 1] for i in range(len(engine))])                 # byte by byte
    splits.append([engine[:c] for c in (len(engine),)])                         # the whole stream at once
    splits.append([e + b"\n\n" for e in engine.split(b"\n\n")[:-1]])              # one event per chunk
    for parts in splits:
        ex = rec.begin("POST", "/v1/chat/completions", {}, raw)
        ex.response(200, "text/event-stream")
        out = b"".join(ex.feed(p) for p in parts) + ex.flush()
        ex.finish()
        assert out == plain, parts
        assert ex.usage == usage
    assert rec.stats["recorded"] == len(splits)


@pytest.mark.slow
def test_a_run_started_by_the_cli_is_matched_to_the_serving_processs_requests(make_tel, upstream, tmp_path):
    """`warmscope warmup` in its own process warms three system prompts for
    replica srv-1; the serving process (replica srv-1, same store and key
    secret) follows the run at its next flush and counts the requests that
    follow against it: precision and recall of the CLI's run come out of the
    store like those of a run made in process. A run recorded for another
    replica is not followed."""
    import os
    import subprocess
    import sys

    from warmscope.analysis.coverage import warm_set_coverage

    store = tmp_path / "shared.sqlite"
    tel = make_tel(store_path=str(store), key_secret="shared-secret", replica="srv-1", early_window_s=600)
    client = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    systems = [f"{SYSTEM} desk {d}" for d in "ABC"]
    warm_set = tmp_path / "warm.jsonl"
    warm_set.write_text("".join(json.dumps({"messages": [{"role": "system", "content": s}], "tenant": "acme"}) + "\n"
                                for s in systems))
    env = {**os.environ, "WARMSCOPE_KEY_SECRET": "shared-secret"}
    for replica in ("srv-1", "srv-2"):
        done = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--store", str(store), "warmup",
                               "--engine", upstream, "--from", str(warm_set), "--replica", replica, "--rate", "0",
                               "--trigger", "replica_start", "--quiet"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "ok, 3 prefixes" in done.stderr
    tel.flush()                                         # the serving process's flush follows srv-1's run
    rec = client._transport.recorder
    asked = [systems[0], systems[0], systems[1], f"{SYSTEM} desk D"]   # A twice, B once, D was never warmed
    for i, system in enumerate(asked):
        r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs(system, f"q{i}")},
                        headers={"x-warmscope-tenant": "acme"})
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 or i == 3
    assert rec.stats["recorded"] == 4
    tel.close()                                         # closes the recall window
    runs = tel.store.frame("warmup_runs")
    assert sorted(runs["replica"]) == ["srv-1", "srv-2"] and set(runs["status"]) == {"ok"}
    cov = warm_set_coverage(runs, tel.store.frame("warmed_keys"), tel.store.frame("early_keys"),
                            recall_window_s=600).set_index("replica")
    # srv-1: 3 warmed, 2 read (A, B): precision 2/3; requested A, B, D of which A, B warmed: recall 2/3
    assert cov.loc["srv-1", "keys_warmed"] == 3 and cov.loc["srv-1", "keys_read"] == 2
    assert cov.loc["srv-1", "precision"] == pytest.approx(2 / 3)
    assert cov.loc["srv-1", "early_keys"] == 3 and cov.loc["srv-1", "recall"] == pytest.approx(2 / 3)
    # srv-2's run warmed the same prompts, but nothing here serves replica srv-2
    assert cov.loc["srv-2", "keys_read"] == 0 and cov.loc["srv-2", "early_keys"] == 0


def test_header_copy_equals_httpx_setitem():
    """The stream's request copy sets content-length and accept-encoding as
    httpx's own Headers.__setitem__ does: in the first one's place, duplicates
    dropped, appended when absent; the caller's headers are left as they were."""
    from warmscope.collectors.openai_client import _headers_with

    items = ((b"content-length", b"9"), (b"accept-encoding", b"identity"))
    for raw in ([("Host", "x"), ("Accept-Encoding", "gzip"), ("content-length", "5"), ("X", "1"),
                 ("accept-encoding", "br")], [("Host", "x")], []):
        h = httpx.Headers(raw)
        before = h.multi_items()
        ref = h.copy()
        ref["content-length"], ref["accept-encoding"] = "9", "identity"
        assert _headers_with(h, *items).multi_items() == ref.multi_items()
        assert h.multi_items() == before


def test_request_copy_sets_length_and_encoding_as_httpx_setitem():
    """The same for the whole request copy (whose usual case, one header of each
    name, takes its own way): body, headers and URL as httpx would make them;
    the caller's request is left as it was."""
    from warmscope.collectors.openai_client import _with_body

    body = b'{"stream_options":{"include_usage":true},"stream":true}'
    for raw in ([], [("Accept-Encoding", "gzip")], [("accept-encoding", "gzip"), ("Accept-Encoding", "br")],
                [("Content-Length", "3"), ("X", "1")]):
        req = httpx.Request("POST", "http://engine/v1/chat/completions", headers=raw, content=b'{"stream":true}')
        before = req.headers.multi_items()
        ref = req.headers.copy()
        ref["content-length"], ref["accept-encoding"] = str(len(body)), "identity"
        new = _with_body(req, body)
        assert new.headers.multi_items() == ref.multi_items()
        assert new.content == body and b"".join(new.stream) == body and new.url == req.url
        assert req.headers.multi_items() == before and req.content == b'{"stream":true}'


@pytest.mark.redis
def test_a_run_recorded_in_redis_by_another_pipeline_is_followed(make_tel, upstream, redis_client):
    """The same with Redis as the shared store: a warm-up run recorded by another
    pipeline (another process's, here in the same process) for replica srv-1 is
    followed by the serving pipeline of srv-1 at its flush."""
    from warmscope.analysis.coverage import warm_set_coverage
    from warmscope.sources.redis_source import RedisSource

    systems = [f"{SYSTEM} redis desk {d}" for d in "AB"]
    runner_tel = make_tel(redis_client=redis_client, key_secret="shared-secret", replica="srv-1")
    res = run_warmup(upstream, [{"messages": [{"role": "system", "content": s}]} for s in systems],
                     telemetry=runner_tel, rate=0, trigger="replica_start")
    assert res.status == "ok" and res.keys == 2
    runner_tel.close()
    tel = make_tel(redis_client=redis_client, key_secret="shared-secret", replica="srv-1", early_window_s=600)
    client = httpx.Client(base_url=upstream, transport=InstrumentedTransport(telemetry=tel))
    tel.flush()
    for i, system in enumerate([systems[0], f"{SYSTEM} redis desk C"]):   # A was warmed, C was not
        client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs(system, f"q{i}")},
                    headers={"x-warmscope-tenant": "acme"})
    tel.close()
    src = RedisSource("redis://unused", client=redis_client)
    runs = src.frame("warmup_runs", 0, 4e9)
    cov = warm_set_coverage(runs, src.frame("warmed_keys", 0, 4e9), src.frame("early_keys", 0, 4e9),
                            recall_window_s=600)
    row = cov.set_index("run_id").loc[res.run_id]
    # 2 warmed, 1 read (A): precision 1/2; requested A and C, A warmed: recall 1/2
    assert row["keys_warmed"] == 2 and row["precision"] == pytest.approx(0.5)
    assert row["early_keys"] == 2 and row["recall"] == pytest.approx(0.5)


def test_the_recorders_family_rule_comes_before_family_rules(make_tel):
    """A user's family_rules still map other keys of the layer, but the
    recorder's prefix keys keep their template family, also for keys
    memoised before the recorder was made."""
    from warmscope.collectors.llm import LLMRecorder

    tel = make_tel(family_rules=[["^(chat|summarize):", "\\1:*"]])
    fams = tel.aggregator.bind_layer("prefix_kv").families
    early = "chat:system:abcdefgh:0" + "0123456789abcdef"
    assert fams.family(early) == "chat:*"                      # before any recorder: the user's rule
    rec = LLMRecorder(tel)
    key = rec.prefix_key("chat", [["system", "You are terse."]])
    assert re.fullmatch(r"chat:system:[a-z]{8}:\*", fams.family(key))
    assert fams.family(early) == "chat:system:abcdefgh:*"       # the memo was cleared when the rule came
    assert fams.family("chat:session:42") == "chat:*"           # other keys: the user's rule as before
    LLMRecorder(tel)                                            # a second recorder adds no second rule
    assert len(fams._key_rules) == 1


def test_requests_counted_in_batches_are_all_read_from_another_thread(make_tel):
    """Recorded requests wait in their thread's list and are counted in
    batches; every read of the counters counts what waits first. 150 requests
    from a worker thread (two full batches and 21 still waiting), read from
    this thread: every token, request and unit is there."""
    import threading

    tel = make_tel()
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101,
             "prompt_tokens_details": {"cached_tokens": 60}}

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.dumps({"id": "c", "choices": [], "usage": usage}).encode()  # a body still to be read
        return httpx.Response(200, stream=httpx.ByteStream(body), headers={"content-type": "application/json"})

    inst = httpx.Client(base_url="http://engine",
                        transport=InstrumentedTransport(httpx.MockTransport(reply), telemetry=tel))
    body = {"model": "tiny", "messages": msgs(), "max_tokens": 1}

    def work() -> None:
        with request_context(tenant="acme", unit="sess-1", experiment="exp", variant="A", telemetry=tel):
            for _ in range(150):
                inst.post("/v1/chat/completions", json=body).raise_for_status()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    rec = recorder_of(inst)
    assert rec.stats["recorded"] == 150, rec.stats
    # the first request (a new prefix) was counted at once, 2 * 64 in batches: 150 - 1 - 128 = 21 wait
    assert sum(len(p) for _, p in rec._batch.lists) == 21
    lk = lookups(tel)
    assert lk.groupby("result")["count"].sum().to_dict() == {"hit": 9000, "miss": 6000}  # 150*60, 150*40
    assert rec._batch.lists == []                                     # counted; the finished thread's list dropped
    h = tel.store.frame("histograms")
    assert h[h["metric"] == "gen_ai.server.request.duration"]["count"].sum() == 150
    units = tel.store.units("exp")
    assert units["requests"].tolist() == [150]
    # recorders made later share the layer's waiting lists: nothing piles up per recorder
    from warmscope.collectors.llm import LLMRecorder

    n = len(tel.aggregator.drains)
    assert all(LLMRecorder(tel)._batch is rec._batch for _ in range(3)) and len(tel.aggregator.drains) == n


@pytest.mark.parametrize("fast", [True, False])
def test_json_bodies_parse_as_the_standard_library_parses_them(fast, monkeypatch):
    """Request bodies and usage chunks go through orjson when it is installed;
    what orjson refuses (NaN, Infinity, lone surrogates) takes the standard
    library's way, so the result is json.loads's either way, except an
    integer past 64 bits, which orjson reads as a float."""
    import math

    from warmscope.collectors.llm import jsonbytes as llm

    if not fast:
        monkeypatch.setattr(llm, "_orjson_loads", None)
    odd = [b'{"model": "m", "messages": [{"role": "system", "content": "caf\\u00e9 4471"}]}',
           b' {"a": NaN, "b": -Infinity}', b'{"n": 18446744073709551615, "m": -9223372036854775808}',
           b'{"s": "\\ud800 lone"}', b'{"u": "\xc3\xa9t\xc3\xa9", "k": [1, 2.5, true, null]}']
    for raw in odd:
        got, want = llm._loadb(raw), json.loads(raw)
        assert json.dumps(got) == json.dumps(want)
    assert math.isnan(llm._loadb(b'{"a": NaN}')["a"])
    big = llm._loadb(b'{"n": 123456789012345678901234567890}')["n"]
    assert big == (1.2345678901234568e29 if fast else 123456789012345678901234567890)
    for bad in (b'{"a": 1', b'{"a": 1} x', b"\xff{}", b""):
        with pytest.raises(ValueError):
            llm._loadb(bad)


def test_a_waiting_request_that_fails_to_count_costs_only_itself(make_tel, monkeypatch):
    """A fault while counting a batch (made here: no real input makes the
    aggregator raise) is counted, not raised, and the batch's other requests
    are still counted."""
    from warmscope.collectors.llm import LLMRecorder
    from warmscope.collectors.llm.recorder import _context_of

    tel = make_tel()
    rec = LLMRecorder(tel)
    key = rec.prefix_key("chat", [["system", "You are terse."]])
    labels = ("acme", None, None, None, "tiny")
    p = [(key, 6, 4, labels, 10, None, 0.01) for _ in range(5)]
    agg, real, calls = tel.aggregator, tel.aggregator.record_llm, []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("made fault")
        real(*args)

    monkeypatch.setattr(agg, "record_llm", flaky)
    before = agg.errors.get("record", 0)
    rec._batch.count(p)
    assert p == [] and len(calls) == 5 and agg.errors.get("record", 0) == before + 1
    # the batch memoised the requests' context while counting: the same object is found again
    memo = dict(rec._batch.contexts)
    assert any(k[:5] == labels for k in memo)
    ctx = _context_of(agg, rec._batch.contexts, labels, 10)
    assert ctx.tenant == "acme" and any(v is ctx for v in memo.values())
    lk = lookups(tel)
    assert lk.groupby("result")["count"].sum().to_dict() == {"hit": 24, "miss": 16}  # 4 counted: 4*6, 4*4
