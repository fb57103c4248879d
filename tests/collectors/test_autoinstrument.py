"""OpenTelemetry auto-instrumentation (collectors/autoinstrument.py) against a real redis-server:

* the real ``opentelemetry-instrument`` command runs a small app that never imports warmscope's
  instrumentation; the instrumentor is found through the ``opentelemetry_instrumentor`` entry
  point declared in pyproject.toml (registered for the child as an install registers it: a
  dist-info directory on its path), and the app's sync and ``redis.asyncio`` clients and
  pipelines, and its ``openai.OpenAI`` client talking to a small OpenAI-compatible engine, are
  counted in the embedded store it flushes to at exit;
* in process: hooks, a double ``instrument()``, a client instrumented by hand counted once, async
  errors reaching the caller unchanged and counted, ``uninstrument()``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

pytest.importorskip("opentelemetry.instrumentation")
from warmscope.collectors import instrument_redis, request_context  # noqa: E402
from warmscope.collectors.autoinstrument import WarmscopeInstrumentor  # noqa: E402
from warmscope.model import schema  # noqa: E402
from warmscope.model.schema import ATTR  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from tests.helpers import total  # noqa: E402

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]
LOOKUPS, WRITES = schema.CACHE_LOOKUPS.name, schema.CACHE_WRITES.name

APP = textwrap.dedent("""
    import asyncio, json, os, sys
    import redis, redis.asyncio as aredis

    url, dead = os.environ["APP_REDIS_URL"], os.environ["APP_DEAD_URL"]
    out = {}
    r = redis.Redis.from_url(url)
    r.set("resp:1", "x")
    r.get("resp:1"); r.get("resp:missing")                      # hit, miss
    r.pipeline().get("resp:1").get("resp:nope").set("resp:2", "y").execute()   # hit, miss, write

    async def main():
        a = aredis.Redis.from_url(url)
        await a.get("resp:1"); await a.get("resp:missing2")     # hit, miss
        async with a.pipeline(transaction=False) as p:
            p.get("resp:2"); p.get("resp:gone")
            res = await p.execute()                              # hit, miss
            out["async_pipeline"] = [v.decode() if v else v for v in res]
        await a.hset("resp:h", "f", "v")                         # write
        for client, key in ((a, "resp:h"), (aredis.Redis.from_url(dead), "resp:1")):
            try:
                await client.get(key)                  # WRONGTYPE, connection refused: errors
            except Exception as e:
                name = type(e).__module__ + "." + type(e).__name__
                out.setdefault("errors", []).append([name, str(e)[:40]])
        await a.aclose()

    asyncio.run(main())
    import openai                                                # an OpenAI-compatible engine
    client = openai.OpenAI(base_url=os.environ["APP_ENGINE_URL"] + "/v1", api_key="-")
    msgs = [{"role": "system", "content": "You are terse. " * 40}, {"role": "user", "content": "q"}]
    for _ in range(2):                          # the second finds its prefix cached
        u = client.chat.completions.create(model="m", messages=msgs, max_tokens=1).usage
        out.setdefault("usage", []).append([u.prompt_tokens, u.prompt_tokens_details.cached_tokens])
    from warmscope.collectors.autoinstrument import WarmscopeInstrumentor
    out["instrumented"] = WarmscopeInstrumentor().is_instrumented_by_opentelemetry
    WarmscopeInstrumentor().instrument()                         # a no-op
    r.get("resp:1")                                              # hit, counted once
    print(json.dumps(out))
""")


def _entry_point_dir(tmp: Path) -> Path:
    """A dist-info directory with pyproject.toml's ``opentelemetry_instrumentor`` entry points."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    group = eps["opentelemetry_instrumentor"]
    d = tmp / "site" / "warmscope_entrypoints-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: warmscope-entrypoints\nVersion: 0.0\n"
    )
    (d / "entry_points.txt").write_text(
        "[opentelemetry_instrumentor]\n" + "".join(f"{k} = {v}\n" for k, v in group.items())
    )
    return d.parent


@pytest.fixture(scope="module")
def engine():
    """A small OpenAI-compatible engine (tests/collectors/llm_upstream.py) on a loopback port."""
    from warmscope.collectors.gateway import serve

    from .llm_upstream import make_upstream

    with serve(make_upstream()) as url:
        yield url


def test_opentelemetry_instrument_command_counts_sync_and_async_clients(
    tmp_path, redis_server, redis_client, engine
):
    cli = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable))
    assert cli, "opentelemetry-instrument is not installed (pip install 'warmscope[instrument]')"
    site = _entry_point_dir(tmp_path)
    (tmp_path / "app.py").write_text(APP)
    store = tmp_path / "store.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSCOPE_", "OTEL_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), *sys.path[1:]]),
        APP_REDIS_URL=redis_server.url,
        APP_DEAD_URL=f"redis://127.0.0.1:{free_port()}/0",
        APP_ENGINE_URL=engine,
        WARMSCOPE_STORE=str(store),
        WARMSCOPE_EXPORTER="embedded",
        WARMSCOPE_KEY_SECRET="test-secret",
        WARMSCOPE_REPLICA="app-0",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    p = subprocess.run(
        [cli, sys.executable, "app.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(p.stdout, p.stderr[-3000:])
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["instrumented"] is True and out["async_pipeline"] == ["y", None]
    assert [e[0] for e in out["errors"]] == [
        "redis.exceptions.ResponseError",
        "redis.exceptions.ConnectionError",
    ]
    assert out["errors"][0][1].startswith("WRONGTYPE")

    from warmscope.collectors.store import EmbeddedStore

    lk = EmbeddedStore(store, readonly=True).frame("lookups")
    got = lk[lk.layer == "response"].groupby("result")["count"].sum().to_dict()
    print("lookups by result:", got)
    assert got == {"hit": 5, "miss": 4, "error": 2}
    wr = EmbeddedStore(store, readonly=True).frame("writes")
    assert wr[wr.layer == "response"]["count"].sum() == 3  # SET, the pipeline's SET, HSET
    # the openai client, also without code: prompt tokens as prefix_kv lookups (cached ones hit)
    (p1, c1), (p2, c2) = out["usage"]
    assert c1 == 0 < c2
    kv = lk[lk.layer == "prefix_kv"].groupby("result")["count"].sum().to_dict()
    print("prefix_kv tokens by result:", kv, "usage:", out["usage"])
    assert kv == {"hit": c2, "miss": p1 + p2 - c2}


@pytest.fixture
def instrumentor():
    inst = WarmscopeInstrumentor()
    yield inst
    inst.uninstrument()


def _counts(tel) -> dict[str, float]:
    return {
        res: total(tel.reader, LOOKUPS, {ATTR.RESULT: res, ATTR.LAYER: "response"})
        for res in ("hit", "miss", "error")
    }


def test_hooks_double_instrument_hand_instrumented_and_uninstrument(
    make_tel, redis_server, redis_client, instrumentor
):
    tel = make_tel()
    seen: list[tuple] = []

    def bad_hook(span, instance, response):
        seen.append(("response", response))
        raise RuntimeError("a broken hook")

    instrumentor.instrument(
        telemetry=tel,
        request_hook=lambda span, inst, args, kw: seen.append(("request", args)),
        response_hook=bad_hook,
        openai=False,
    )
    instrumentor.instrument(telemetry=tel)  # a no-op: the first hooks and pipeline stay
    r = redis.Redis.from_url(redis_server.url)
    r.set("resp:a", "1")
    assert r.get("resp:a") == b"1" and r.get("resp:b") is None
    assert ("request", ("GET", "resp:a")) in seen and ("response", b"1") in seen
    assert _counts(tel) == {"hit": 1, "miss": 1, "error": 0}
    assert (
        total(tel.reader, schema.TELEMETRY_ERRORS.name, {ATTR.STAGE: "hook"}) >= 3
    )  # the broken hook, counted
    hand = instrument_redis(redis.Redis.from_url(redis_server.url), layer="response", telemetry=tel)
    hand.get("resp:a")
    hand.pipeline().get("resp:a").execute()
    assert _counts(tel) == {"hit": 3, "miss": 1, "error": 0}  # counted once each, not twice
    instrumentor.uninstrument()
    r.get("resp:a")
    assert _counts(tel)["hit"] == 3
    assert redis.Redis.execute_command.__name__ == "execute_command" and not hasattr(
        redis.Redis.execute_command, "__wrapped__"
    )


def test_async_errors_reach_the_caller_unchanged_and_are_counted(
    make_tel, redis_server, redis_client, instrumentor
):
    tel = make_tel()
    instrumentor.instrument(telemetry=tel, openai=False)
    dead = f"redis://127.0.0.1:{free_port()}/0"

    async def run():
        a = aredis.Redis.from_url(redis_server.url)
        await a.hset("resp:h", "f", "v")
        errors = []
        for client, key in ((a, "resp:h"), (aredis.Redis.from_url(dead), "resp:x")):
            try:
                await client.get(key)
            except Exception as e:
                errors.append(e)
        async with a.pipeline() as p:  # a transaction whose command fails: execute raises
            p.get("resp:h")
            try:
                await p.execute()
            except Exception as e:
                errors.append(e)
        await a.aclose()
        return errors

    errors = asyncio.run(run())
    assert [type(e) for e in errors] == [
        redis.exceptions.ResponseError,
        redis.exceptions.ConnectionError,
        redis.exceptions.ResponseError,
    ]
    assert str(errors[0]).startswith("WRONGTYPE") and str(errors[2]).startswith(
        "Command # 1 (GET resp:h)"
    )
    assert _counts(tel) == {"hit": 0, "miss": 0, "error": 3}

    # the same with an asyncio client instrumented by hand (instrument_redis), no instrumentor
    instrumentor.uninstrument()
    tel2 = make_tel()

    async def by_hand():
        a = instrument_redis(
            aredis.Redis.from_url(redis_server.url), layer="response", telemetry=tel2
        )
        await a.set("resp:k", "v")
        assert await a.get("resp:k") == b"v" and await a.get("resp:none") is None
        async with a.pipeline(transaction=False) as p:
            p.get("resp:k")
            p.get("resp:none")
            assert await p.execute() == [b"v", None]
        try:
            await a.get("resp:h")
        except redis.exceptions.ResponseError as e:
            assert str(e).startswith("WRONGTYPE")
        else:
            raise AssertionError("WRONGTYPE expected")
        await a.aclose()

    asyncio.run(by_hand())
    assert _counts(tel2) == {"hit": 2, "miss": 2, "error": 1}


def test_warmscopes_own_redis_traffic_is_not_counted(
    make_tel, redis_server, redis_client, instrumentor
):
    tel = make_tel(redis_url=redis_server.url)  # hot keys, runs and A/B units go to this Redis
    seen: list[tuple] = []
    instrumentor.instrument(
        telemetry=tel, openai=False, request_hook=lambda span, inst, args, kw: seen.append(args)
    )
    r = redis.Redis.from_url(redis_server.url)
    with request_context(tenant="acme", unit="session-1", experiment="e", variant="A"):
        r.get("resp:a")
        with tel.warmup("static_topk", layer="response", trigger="replica_start") as run:
            r.set("resp:a", "1")
            run.warmed("resp:a")
        r.get("resp:a")
        tel.record_request(
            ttft_s=0.1, latency_s=0.2, prompt_tokens=10, cached_tokens=5, gpu_s=0.1, sla_met=True
        )
    assert len(seen) == 3
    for _ in range(2):
        tel.flush()  # the sink: INFO, SCRIPT LOAD, pipelines of scripts, on the same classes
    assert len(seen) == 3, f"warmscope's own commands went through the hooks: {seen[3:6]}"
    assert redis_client.dbsize() > 2, "the sink wrote to Redis"
    assert _counts(tel) == {"hit": 1, "miss": 1, "error": 0}


def test_a_wrapper_factory_works_alone(make_tel):
    """The patches are module-level wrappers over (wrapped, instance, args, kwargs), testable without
    patching redis-py: a reply is interpreted, an error reaches the caller unchanged and is counted, a
    hand-instrumented client passes through untouched."""
    from warmscope.collectors.autoinstrument import _redis_command, _redis_pipeline, _RedisHooks
    from warmscope.collectors.redis import _Interpreter

    tel = make_tel()
    asked: list = []
    hooks = _RedisHooks(_Interpreter("response", tel), tel, lambda span, c, a, kw: asked.append(a), None)
    command = _redis_command(hooks)
    client = object()
    assert command(lambda *a, **k: b"1", client, ("GET", "resp:a"), {}) == b"1"
    assert command(lambda *a, **k: None, client, ("GET", "resp:b"), {}) is None

    def refused(*a, **k):
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError, match="refused"):
        command(refused, client, ("GET", "resp:c"), {})
    assert asked == [("GET", "resp:a"), ("GET", "resp:b"), ("GET", "resp:c")]
    assert _counts(tel) == {"hit": 1, "miss": 1, "error": 1}
    hand = instrument_redis(redis.Redis(), layer="response", telemetry=tel)  # counted by itself
    assert command(lambda *a, **k: b"1", hand, ("GET", "resp:a"), {}) == b"1"
    assert _counts(tel) == {"hit": 1, "miss": 1, "error": 1} and len(asked) == 3

    class Pipe:  # what _queued reads of a redis-py pipeline
        command_stack = [(("GET", "resp:a"), {}), (("GET", "resp:z"), {})]

    assert _redis_pipeline(hooks)(lambda *a, **k: [b"1", None], Pipe(), (), {}) == [b"1", None]
    assert _counts(tel) == {"hit": 2, "miss": 2, "error": 1}
