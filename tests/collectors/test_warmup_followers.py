"""An external warm-up and the serving process that follows it, on a real redis-server: the README's recipe
(the gateway as replica gw-c, `warmscope warmup --replica gw-c`) raises no replica-collision warning, and a
run is followed within about a second of its end, not at the serving process's next flush."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.gateway import make_app, serve
from warmscope.collectors.pipeline import Telemetry
from warmscope.collectors.run_follow import follow_runs
from warmscope.collectors.warmup_runner import run_warmup

from tests.conftest import wait_until

from .llm_upstream import make_upstream

pytestmark = pytest.mark.redis
SYSTEM = "You are the help desk of a very small shop; answer in one short line please. " * 3


def chat(system: str, user: str) -> dict:
    return {"model": "tiny", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def serving(url: str, **kw) -> Telemetry:
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=url, key_secret="shared", replica="gw-c", **kw)
    return Telemetry(cfg, background=True)


def test_the_readme_warm_up_recipe_raises_no_replica_collision(redis_server, redis_client, tmp_path):
    # The gateway serves as gw-c; `warmscope warmup --replica gw-c` records a run for it that lasts several
    # flush intervals of both processes. Before: each saw the other write as gw-c, logged "replica 'gw-c' is
    # also written by process(es) ...: per-replica warm-up attribution will be wrong" and counted a config
    # error, though the run is meant for that replica.
    tel = serving(redis_server.url, flush_interval_s=0.1)
    warm_set = tmp_path / "warm.jsonl"
    warm_set.write_text("".join(json.dumps({"messages": [{"role": "system", "content": f"{SYSTEM} desk {d}"}]})
                                + "\n" for d in "ABCD"))
    env = {**os.environ, "WARMSCOPE_REDIS_URL": redis_server.url, "WARMSCOPE_KEY_SECRET": "shared",
           "WARMSCOPE_FLUSH_INTERVAL": "0.1"}
    env.pop("WARMSCOPE_REPLICA", None)
    with serve(make_upstream(prefill_s_per_token=0.004)) as up, serve(make_app(up, telemetry=tel)) as gw:
        httpx.post(gw + "/v1/chat/completions", json=chat(SYSTEM, "hello"))  # the gateway serves gw-c
        done = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "warmup", "--engine", up, "--from",
                               str(warm_set), "--replica", "gw-c", "--rate", "2", "--quiet"],
                              env=env, capture_output=True, text=True, timeout=180)
    tel.close()
    assert done.returncode == 0, done.stderr
    assert "ok, 4 prefixes" in done.stderr
    assert "also written by" not in done.stderr
    assert tel.replica_collisions == set() and tel.aggregator.errors["config"] == 0
    # a second serving process as gw-c is still a collision
    a, b = serving(redis_server.url, flush_interval_s=0.05), serving(redis_server.url, flush_interval_s=0.05)
    try:
        wait_until(lambda: b.instance_id in a.replica_collisions, 10, "the collision seen")
    finally:
        a.close()
        b.close()


def test_a_run_recorded_elsewhere_is_followed_within_a_second_not_at_the_next_flush(redis_server, redis_client):
    # The serving process flushes every 30 s. Before: it followed a run recorded elsewhere only at its next
    # flush, so requests in the seconds after the run were not credited to it (keys read 0, recall NaN). Now
    # it looks for new runs about every second between flushes.
    from warmscope.analysis.coverage import warm_set_coverage
    from warmscope.collectors.openai_client import InstrumentedTransport
    from warmscope.sources.redis_source import RedisSource

    systems = [f"{SYSTEM} counter {d}" for d in "AB"]
    tel = serving(redis_server.url, flush_interval_s=30, early_window_s=600)
    with serve(make_upstream()) as up:
        client = httpx.Client(base_url=up, transport=InstrumentedTransport(telemetry=tel))
        follower = follow_runs(tel)
        cfg = CollectorConfig.load(env={}, exporter="none", redis_url=redis_server.url, key_secret="shared",
                                   replica="gw-c")
        runner = Telemetry(cfg, background=False)  # another process's pipeline, here in this one
        res = run_warmup(up, [{"messages": [{"role": "system", "content": s}]} for s in systems],
                         telemetry=runner, rate=0)
        runner.close()
        assert res.status == "ok"
        wait_until(lambda: res.run_id in follower.followed, 5, "the run followed between flushes")
        for i, system in enumerate([systems[0], f"{SYSTEM} counter C"]):  # A was warmed, C was not
            client.post("/v1/chat/completions", json=chat(system, f"q{i}"))
    tel.close()
    src = RedisSource("redis://unused", client=redis_client)
    cov = warm_set_coverage(src.frame("warmup_runs", 0, 4e9), src.frame("warmed_keys", 0, 4e9),
                            src.frame("early_keys", 0, 4e9), recall_window_s=600).set_index("run_id")
    row = cov.loc[res.run_id]
    # 2 warmed, A read: precision 1/2; A and C requested after the run, A warmed: recall 1/2
    assert row["keys_warmed"] == 2 and row["keys_read"] == 1 and row["precision"] == pytest.approx(0.5)
    assert row["early_keys"] == 2 and row["recall"] == pytest.approx(0.5)
