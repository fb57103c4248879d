"""Shared fixtures: real services on free loopback ports, per-test pipelines.

Services are started here (not mocked): ``redis-server`` from the system. When
a binary is missing, tests that need it are skipped on a developer machine and
*fail* under ``CI=true`` (scripts/test.sh installs them first).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry

CI = os.environ.get("CI", "").lower() == "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The marker a test needs to start each binary: the quick path (scripts/test.sh --quick) leaves
# these markers out and promises to start none of these services.
MARKER_OF = {
    "redis-server": "redis",
    "redis-cli": "redis",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "victoria-metrics": "prometheus",
    "chromium": "browser",
}
_running: list[pytest.Item] = []  # the test being set up or run (pytest_runtest_protocol)
# Fixtures that start a service: a test using one carries the service's marker.
FIXTURE_MARKER = {
    "redis_server": "redis",
    "redis_client": "redis",
    "redis_cluster": "redis",
    "cluster_client": "redis",
    "streamlit_server": "browser",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in set(item.fixturenames) & FIXTURE_MARKER.keys():
            item.add_marker(FIXTURE_MARKER[fixture])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


def need_binary(name: str) -> str:
    marker = MARKER_OF.get(name)
    item = _running[-1] if _running else None
    if (
        marker
        and item is not None
        and f"not {marker}" in (item.config.option.markexpr or "")
        and item.get_closest_marker(marker) is None
    ):  # a run that leaves the marker out (the quick path) must not start the service
        pytest.fail(
            f"{item.nodeid} starts {name} but is not marked @pytest.mark.{marker}, so "
            f'-m "not {marker}" (the quick path) ran it',
            pytrace=False,
        )
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed; run scripts/test.sh (it installs it with apt-get)"
        if CI:
            pytest.fail(msg + " — required under CI=true", pytrace=False)
        pytest.skip(msg)
    return path


def wait_until(check, timeout: float = 15.0, what: str = "service") -> None:
    delay, deadline = 0.02, time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # not up yet
            last = e
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    raise RuntimeError(f"{what} did not become ready in {timeout}s: {last}")


class ExpositionHandler(BaseHTTPRequestHandler):
    """A stand-in /metrics: every GET is answered with :meth:`exposition` in the Prometheus text
    format (version 0.0.4), and nothing is logged. Subclasses return the page's bytes."""

    def exposition(self) -> bytes:
        raise NotImplementedError

    def do_GET(self):  # noqa: N802
        body = self.exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def prom_query(url: str, expr: str, at: float | None = None) -> list[dict]:
    """The result of an instant PromQL query (at ``at``, else now) against the Prometheus API at ``url``."""
    q = {"query": expr} | ({"time": f"{at:.3f}"} if at else {})
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(q)}", timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


class RedisServer:
    def __init__(self, tmp: Path, port: int | None = None) -> None:
        binary = need_binary("redis-server")
        self.port = port or free_port()
        self.dir = tmp
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        import redis

        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: client.ping(), what=f"redis-server on port {self.port}")
        client.close()

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def redis_client(redis_server):
    c = redis_server.client()
    c.flushdb()
    yield c
    c.close()


@pytest.fixture
def make_tel(tmp_path):
    """Build pipelines with an in-memory OTel reader and a private store."""
    made: list[Telemetry] = []

    def make(with_reader: bool = True, **overrides):
        from opentelemetry.sdk.metrics import MeterProvider
        from warmscope.collectors.otel import InMemoryReader

        overrides.setdefault("store_path", str(tmp_path / "store.sqlite"))
        overrides.setdefault("key_secret", "test-secret")
        overrides.setdefault("exporter", "embedded")
        overrides.setdefault("replica", "r0")
        clock = overrides.pop("clock", time.time)
        redis_client = overrides.pop("redis_client", None)
        cfg = CollectorConfig.load(env={}, **overrides)
        reader = InMemoryReader() if with_reader else None
        provider = MeterProvider(metric_readers=[reader]) if reader else None
        tel = Telemetry(cfg, meter_provider=provider, background=False, clock=clock,
                        redis_client=redis_client)
        tel.reader = reader
        made.append(tel)
        return tel

    yield make
    for t in made:
        t.close()


# --- a real vLLM engine on the CPU (warmscope.simulator.real_engine) ---------

@pytest.fixture(scope="session")
def vllm_engines():
    """Factory: ``vllm_engines(n)`` starts n vLLM engines (concurrently) with the
    tiny model on free loopback ports and returns them; every engine started is
    stopped, with its process group and run folder, at the end of the session.
    A vLLM that cannot be installed or started skips the test, and fails it
    under CI=true."""
    from concurrent.futures import ThreadPoolExecutor

    from warmscope.simulator import real_engine as re_

    started: list = []

    def start(n: int = 1, **kw):
        try:
            re_.ensure_installed()
            re_.model_dir()
        except re_.EngineError as e:
            msg = f"vLLM is not available: {e}; run scripts/test.sh (it installs it)"
            if CI:
                pytest.fail(msg + " — required under CI=true", pytrace=False)
            pytest.skip(msg)
        engines = [re_.VLLMEngine(**kw) for _ in range(n)]
        started.extend(engines)
        with ThreadPoolExecutor(n) as ex:
            errors = [f.exception() for f in [ex.submit(e.start) for e in engines]]
        bad = [e for e in errors if e is not None]
        if bad:
            pytest.fail(f"vLLM did not start: {bad[0]}", pytrace=False)
        return engines

    yield start
    for e in started:
        e.stop()


@pytest.fixture(scope="session")
def redis_cluster():
    """A 3-master Redis Cluster on free 127.0.0.1 ports (``bench.redis_cluster``),
    stopped after the session. Skipped without redis-server / redis-cli; fails
    under CI=true."""
    from bench.redis_cluster import ClusterUnavailable, LocalCluster

    need_binary("redis-server")
    need_binary("redis-cli")
    try:
        c = LocalCluster(masters=3)
    except ClusterUnavailable as e:
        if CI:
            pytest.fail(f"Redis Cluster did not start: {e}", pytrace=False)
        pytest.skip(f"Redis Cluster did not start: {e}")
    yield c
    c.stop()


@pytest.fixture
def cluster_client(redis_cluster):
    """A ``RedisCluster`` client on the session's cluster, emptied first."""
    from redis.cluster import RedisCluster

    c = RedisCluster.from_url(redis_cluster.url)
    c.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield c
    c.close()


# --- the dashboard served (Streamlit) on a free loopback port --------


@contextlib.contextmanager
def streamlit_app(env: dict[str, str], cwd: Path | None = None):
    """Serve the dashboard (``app/dashboard/main.py``) with ``env`` (the whole environment) on a free loopback
    port; yields its URL and stops the server afterwards."""
    import urllib.request

    from warmscope.app.dashboard.serve import command

    port = free_port()
    # served as `warmscope dashboard` serves it: Streamlit, its settings, the caches warmed at start
    proc = subprocess.Popen(command("--server.port", str(port), "--server.address", "127.0.0.1"), env=env,
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200, 60,
                   "streamlit")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def streamlit_server(store):
    """The dashboard over the requesting module's ``store`` fixture (an embedded store's path), and the
    chromium binary to drive it: ``(url, chromium)``."""
    chromium = need_binary("chromium")
    with streamlit_app(dict(os.environ, WARMSCOPE_STORE=str(store))) as url:
        yield url, chromium
