"""Shared fixtures: real services on free loopback ports, per-test pipelines.

Services are started here (not mocked): ``redis-server`` from the system. When
a binary is missing, tests that need it are skipped on a developer machine and
*fail* under ``CI=true`` (scripts/test.sh installs them first).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry

CI = os.environ.get("CI", "").lower() == "true"


# Ports: each pytest-xdist worker (PYTEST_XDIST_WORKER=gw0, gw1, ...) hands out ports from its own
# slice of 12000-31999 (below the kernel's ephemeral range, where outgoing connections and
# bind(0) take theirs), one after the other, so two workers never pick the same port between
# choosing it and binding it; the start within the slice depends on the process id, so two
# sessions on one machine start apart. Any port that cannot be bound is passed over.
_PORTS_LO, _PORTS_HI, _PORT_SLICES = 12000, 32000, 8


def _port_slice() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    i = int(worker[2:]) % _PORT_SLICES if worker[2:].isdigit() else 0
    width = (_PORTS_HI - _PORTS_LO) // _PORT_SLICES
    return _PORTS_LO + i * width, _PORTS_LO + (i + 1) * width


_next_port = [0]


def free_port() -> int:
    lo, hi = _port_slice()
    width = hi - lo
    if not _next_port[0]:
        _next_port[0] = os.getpid() * 7919 % width
    for _ in range(width):
        port = lo + _next_port[0] % width
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free 127.0.0.1 port in {lo}-{hi - 1}")


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


@pytest.hookimpl(tryfirst=True)  # the markers below, before other plugins look at them
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in set(item.fixturenames) & FIXTURE_MARKER.keys():
            item.add_marker(FIXTURE_MARKER[fixture])
    _schedule(items)


# --- parallel runs (pytest-xdist, scripts/test.sh: -n N --dist loadgroup --no-loadscope-reorder) ---
# (the groups reach the controller's scheduler through a file: see pytest_xdist_make_scheduler)
# Work goes to the workers in groups: the engine tests in one group (one worker, one pool of
# engines for the session: vllm_engines), but for a module with engines of its own that names a
# group of its own (ENGINE_GROUP: a second worker and pool), every module whose tests share a module- or
# class-scoped fixture (a simulated store, a served dashboard, a live Prometheus) in a group of
# its own, so each such fixture is built once; every other test alone. Groups are handed out in
# the order below, the longest first, so that no long group starts last.


def _group(item) -> tuple[int, str | None]:
    """(rank, group): lower ranks are handed out first; group None runs the test alone."""
    if item.get_closest_marker("engine"):
        # a module whose engines no other module asks for (configurations of its own) may name a
        # group of its own (ENGINE_GROUP): its engines then start and serve on another worker,
        # beside the rest, instead of after them on one worker (the longest path of the run)
        return 0, "engine-" + getattr(item.module, "ENGINE_GROUP", "shared")
    defs = getattr(item, "_fixtureinfo", None)
    shared = defs is not None and any(
        fd.scope in ("module", "class", "package")
        for name in item.fixturenames
        for fd in defs.name2fixturedefs.get(name, ())
        if fd.baseid  # fixtures of the project's test files, not pytest's own
    )
    heavy = any(item.get_closest_marker(m) for m in ("browser", "prometheus", "slow", "redis"))
    rank = (1 if shared else 2) if heavy else (3 if shared else 4)
    return rank, item.module.__name__ if shared else None


def _schedule(items) -> None:
    ranked, groups = [], {}
    first: dict[str, tuple[int, int]] = {}  # group -> (its lowest rank, where it starts)
    for i, item in enumerate(items):
        rank, group = _group(item)
        if group is not None:
            groups[item.nodeid] = group
            r, start = first.get(group, (rank, i))
            first[group] = (min(r, rank), start)
        ranked.append((rank, i, group, item))
    # A group goes where its first test is, at its lowest rank, its tests in collection order (tests
    # of a module may depend on the order they were written in); the rest stably by rank.
    key = [(*first[g], i) if g is not None else (rank, i, i) for rank, i, g, _ in ranked]
    items[:] = [item for _, item in sorted(zip(key, (r[3] for r in ranked), strict=True), key=lambda kv: kv[0])]
    out = os.environ.get(_GROUPS_ENV)
    if out and os.environ.get("PYTEST_XDIST_WORKER") == "gw0":  # every worker collects the same
        Path(out).write_text(json.dumps(groups))


# pytest-xdist's own groups (the xdist_group mark) are lost under pytest 9, whose node ids no longer
# come from the ``_nodeid`` attribute xdist rewrites. So the first worker writes each grouped test's
# group to a file named by the run's controller, and the controller's scheduler (loadscope, whose
# unit of work is a scope) takes a test's scope from it: its group, or the test itself.
_GROUPS_ENV = "WARMSCOPE_XDIST_GROUPS"


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="warmscope-xdist-groups-", suffix=".json")
        os.close(fd)
        os.environ[_GROUPS_ENV] = path  # the workers start after this and inherit it
        config.add_cleanup(lambda: os.path.exists(path) and os.unlink(path))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Work units are the groups of tests/conftest.py (_group); ungrouped tests go alone."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                try:
                    self._groups = json.loads(Path(os.environ[_GROUPS_ENV]).read_text() or "{}")
                except (KeyError, OSError, ValueError):
                    self._groups = {}
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


# --- where the time goes: printed at the end of every run --------------------------------------

_times: dict[str, float] = {}
_marks: dict[str, set[str]] = {}
_SUMMARY_MARKERS = ("engine", "browser", "prometheus", "redis", "slow")


_setups: dict[str, float] = {}
# CPU seconds per test, of the process that ran it ("self") and of the children reaped while it ran
# ("children": its CLI calls and builds, but also any service a fixture stopped then, e.g. a vLLM
# engine the pool evicted: a figure to read with care): a CPU-bound suite's time goes where the CPU
# goes, which a wall time alone does not say.
_cpu: dict[str, list[float]] = {}
_cpu_mark: list[float] = []
_workers: dict[str, str] = {}
TIMES_FILE = Path(__file__).resolve().parents[1] / "test-output" / "test-times.json"


def _rusage() -> list[float]:
    import resource

    return [
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    ]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _cpu_mark[:] = _rusage()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    now = _rusage()
    before = _cpu_mark or now
    # each phase's report carries the CPU spent since the last one (setup: since the test started)
    outcome.get_result().user_properties.append(("cpu_s", [a - b for a, b in zip(now, before, strict=True)]))
    _cpu_mark[:] = now


def pytest_runtest_logreport(report):
    _times[report.nodeid] = _times.get(report.nodeid, 0.0) + report.duration
    if report.when == "setup":
        _setups[report.nodeid] = report.duration
    _marks.setdefault(report.nodeid, {m for m in _SUMMARY_MARKERS if m in report.keywords})
    cpu = dict(report.user_properties).get("cpu_s")
    if cpu:
        acc = _cpu.setdefault(report.nodeid, [0.0, 0.0])
        acc[0] += cpu[0]
        acc[1] += cpu[1]
    node = getattr(report, "node", None)  # the xdist worker that ran it
    if node is not None:
        _workers[report.nodeid] = str(getattr(node, "gateway", node).id)


def _marker(nodeid: str) -> str:
    return next((m for m in _SUMMARY_MARKERS if m in _marks.get(nodeid, ())), "unmarked")


def _write_times() -> None:
    """Every test's wall and CPU seconds to test-output/test-times.json (for finding where a run's
    time went; the terminal shows the ten slowest)."""
    rows = [
        {
            "test": nodeid,
            "wall_s": round(t, 3),
            "setup_s": round(_setups.get(nodeid, 0.0), 3),
            "cpu_self_s": round(_cpu.get(nodeid, [0.0, 0.0])[0], 3),
            "cpu_children_s": round(_cpu.get(nodeid, [0.0, 0.0])[1], 3),
            "marker": _marker(nodeid),
            "worker": _workers.get(nodeid, ""),
        }
        for nodeid, t in sorted(_times.items(), key=lambda kv: -kv[1])
    ]
    try:
        TIMES_FILE.parent.mkdir(exist_ok=True)
        TIMES_FILE.write_text(json.dumps(rows, indent=0))
    except OSError:
        pass


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _times or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    tr.write_sep("=", "ten slowest tests (setup + call + teardown)")
    for nodeid, t in sorted(_times.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{t:8.1f}s  {nodeid}")
    tr.write_line("slowest setups (fixtures; a module's shared fixtures are set up by its first test):")
    for nodeid, t in sorted(_setups.items(), key=lambda kv: -kv[1])[:5]:
        tr.write_line(f"{t:8.1f}s  {nodeid}")
    per: dict[str, list[float]] = {}
    cpu: dict[str, float] = {}
    for nodeid, t in _times.items():
        key = _marker(nodeid)
        per.setdefault(key, []).append(t)
        cpu[key] = cpu.get(key, 0.0) + _cpu.get(nodeid, (0.0, 0.0))[0]
    tr.write_line(
        "test time by marker (first of engine, browser, prometheus, redis, slow): "
        + ", ".join(f"{k} {sum(v):.0f}s/{len(v)}" for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])))
    )
    tr.write_line(
        "CPU of the test processes themselves, by marker (their subprocesses and services not "
        "included; test-output/test-times.json has both): "
        + ", ".join(f"{k} {v:.0f}s" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
    )
    tr.write_line("most CPU in the test's own process:")
    for nodeid, c in sorted(_cpu.items(), key=lambda kv: -kv[1][0])[:5]:
        tr.write_line(f"{c[0]:8.1f}s  {nodeid}")
    _write_times()
    tr.write_line(f"every test's wall and CPU seconds: {TIMES_FILE}")


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


# --- simulated stores, built once per code version ----------------------------------------------

STORE_CACHE = Path(os.environ.get("WARMSCOPE_TEST_STORES", Path.home() / ".cache" / "warmscope" / "test-stores"))


_SIM_FOLDERS = ("model", "collectors", "sources", "simulator")
_DYNAMIC = ("sources",)  # packages that import their modules by name (sources/__init__.py)


def simulation_sources(root: Path) -> list[Path]:
    """The source files a simulated store can depend on: every module of model/, collectors/,
    sources/ and simulator/ that ``warmscope.simulator`` imports, directly or not (its static
    import graph, function-level imports included: grimp, import-linter's), with their packages'
    ``__init__.py``, and every module of a package that imports its modules by name
    (``from warmscope.sources import X``) when the package itself is imported. Not the engine
    harness, the gateway, the KV-event subscriber or the Prometheus source: a change there leaves
    the cached stores valid (tests/simulator/test_store_cache_key.py checks that a simulation imports nothing
    else). Without grimp: every file of those folders."""
    every = sorted(p for folder in _SIM_FOLDERS for p in (root / folder).rglob("*.py"))
    try:
        import grimp
    except ImportError:
        return every
    graph = grimp.build_graph(*(f"warmscope.{f}" for f in _SIM_FOLDERS), cache_dir=None)
    mods = {"warmscope.simulator"} | graph.find_upstream_modules("warmscope.simulator")
    keep: set[Path] = set()
    for m in mods:
        parts = m.split(".")[1:]  # without "warmscope"
        for i in range(1, len(parts) + 1):  # the module and the packages Python runs first
            base = root.joinpath(*parts[:i])
            keep.add(base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py"))
    # a package that imports its modules by name counts whole when it is itself imported
    whole = {d for d in _DYNAMIC if f"warmscope.{d}" in mods}
    return [p for p in every if p in keep or p.relative_to(root).parts[0] in whole]


@functools.lru_cache(maxsize=4)
def simulator_version(root: Path | None = None) -> str:
    """A digest of everything a simulated store depends on: the source of the modules a
    simulation imports (:func:`simulation_sources`), numpy's and Python's versions."""
    import numpy

    if root is None:
        import warmscope.simulator

        root = Path(warmscope.simulator.__file__).resolve().parents[1]
    h = hashlib.sha256(f"{sys.version} numpy {numpy.__version__}".encode())
    for path in simulation_sources(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def simulated_store(path: Path, cfg, faults=(), workers: int = 1) -> Path:
    """``simulate(cfg, path, faults, workers=workers)``, built once for each configuration, faults and
    :func:`simulator_version` (kept in ``STORE_CACHE``, or ``$WARMSCOPE_TEST_STORES``) and copied to
    ``path``: a test module that reads a simulated day gets the same store as if it simulated it, and
    the simulation runs once per code version, not once per module, worker or run. Tests of the
    simulator itself call ``simulate`` directly."""
    import fcntl

    from warmscope.simulator import simulate

    key = hashlib.sha256(repr((cfg, list(faults), workers)).encode()).hexdigest()[:24]
    folder = STORE_CACHE / simulator_version()
    if not folder.exists():
        _prune_store_cache()
    folder.mkdir(parents=True, exist_ok=True)
    cached = folder / f"{key}.sqlite"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the other workers wait for its store
        if not cached.exists():
            build = folder / f"{key}.building.sqlite"
            for f in folder.glob(build.name + "*"):
                f.unlink()
            simulate(cfg, build, list(faults), workers=workers)
            _copy_store(build, cached)
            for f in folder.glob(build.name + "*"):
                f.unlink()
    os.utime(folder)  # in use (see _prune_store_cache)
    _copy_store(cached, path)
    return path


def _prune_store_cache(days: float = 3.0) -> None:
    """Remove the stores of code versions nobody has used for ``days`` (other checkouts may still be
    using theirs: a version's folder is touched whenever one of its stores is read)."""
    if not STORE_CACHE.is_dir():
        return
    old = time.time() - days * 86400
    for folder in STORE_CACHE.iterdir():
        if folder.is_dir() and folder.stat().st_mtime < old:
            shutil.rmtree(folder, ignore_errors=True)


def _copy_store(src: Path, dst: Path) -> None:
    """A consistent copy of an SQLite store (its WAL folded in), through SQLite's backup."""
    import sqlite3

    a, b = sqlite3.connect(f"file:{src}?mode=ro", uri=True), sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


# --- real vLLM engines on the CPU (warmscope.simulator.real_engine), shared by the session ------


class EnginePool:
    """vLLM engines shared by the session's tests, kept by configuration.

    ``pool(n, **config)`` returns n running engines started with ``VLLMEngine(**config)``: the ones
    a test asked for before with the same configuration, and new ones (started concurrently) for
    the rest. So "a pair of engines with 96 blocks" (``pool(2, num_gpu_blocks_override=96)``) is
    started once and handed to every test that asks for it. Each engine handed out has an empty
    prefix cache (``fresh``; vLLM's /reset_prefix_cache): the same hits and misses as a freshly
    started engine; its /metrics counters go on counting, so tests compare before/after. A test
    may stop an engine (the pool starts another the next time). At most ``max_live`` engines run
    at once: starting more stops the engines of the configurations asked for least recently.
    Every engine is stopped, with its process group and run folder, at the end of the session."""

    def __init__(self, max_live: int = 4) -> None:
        self.max_live = max_live
        self.by_config: dict[tuple, list] = {}
        self.used: dict[tuple, int] = {}  # configuration -> when it was last asked for
        self.asked = 0
        self.starts = 0  # engines started (for the session's summary)

    def __call__(self, n: int = 1, *, fresh: bool = True, **config):
        from warmscope.simulator import real_engine as re_

        try:
            re_.ensure_installed()
            re_.model_dir()
        except re_.EngineError as e:
            msg = f"vLLM is not available: {e}; run scripts/test.sh (it installs it)"
            if CI:
                pytest.fail(msg + " — required under CI=true", pytrace=False)
            pytest.skip(msg)
        key = tuple(sorted(config.items()))
        self.asked += 1
        self.used[key] = self.asked
        live = [e for e in self.by_config.get(key, []) if e.running]
        self.by_config[key] = live
        need = max(0, n - len(live))
        self._make_room(need, keep=key)
        reused = len(live)  # the rest are started below, with empty caches
        self._start(config, need, live)
        engines = live[:n]
        if fresh:
            for e in engines[:reused]:
                e.reset_prefix_cache()
        return engines

    def _start(self, config: dict, k: int, live: list) -> None:
        """Start ``k`` engines with ``config`` concurrently and add them to ``live``; one that fails
        is started once more (on a machine short of memory a start can fail for a moment), a
        second failure fails the test."""
        from concurrent.futures import ThreadPoolExecutor

        from warmscope.simulator import real_engine as re_

        last: BaseException | None = None
        for _attempt in (1, 2):
            # HTTP ports from the session's slice: an engine binds its port some 30 s after it is
            # chosen, and a port from the ephemeral range can be taken by an outgoing connection
            # meanwhile
            todo = [re_.VLLMEngine(dev_endpoints=True, **{"port": free_port(), **config})
                    for _ in range(k)]
            if not todo:
                return
            self.starts += len(todo)
            with ThreadPoolExecutor(len(todo)) as ex:
                errors = [f.exception() for f in [ex.submit(e.start) for e in todo]]
            for e, err in zip(todo, errors, strict=True):
                if err is None:
                    live.append(e)
                    k -= 1
                else:
                    last = err
                    print(f"vLLM did not start: {err}", file=sys.stderr)
        if k:
            pytest.fail(f"vLLM did not start (twice): {last}", pytrace=False)

    def _make_room(self, need: int, keep: tuple) -> None:
        for key in sorted(self.by_config, key=lambda k: self.used.get(k, 0)):
            running = sum(e.running for es in self.by_config.values() for e in es)
            if running + need <= self.max_live:
                return
            if key != keep:
                for e in self.by_config.pop(key):
                    e.stop()

    def stop(self) -> None:
        for engines in self.by_config.values():
            for e in engines:
                e.stop()
        self.by_config.clear()


@pytest.fixture(autouse=True)
def _main_module_kept():
    """Streamlit's AppTest runs a page as ``__main__`` and leaves it in ``sys.modules``; a process
    a later test starts with multiprocessing's spawn re-runs ``__main__`` by its path, so it would
    run that page script (and fail: ``NameError: __args``). Each test gets the original back."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(autouse=True, scope="module")
def _background_jobs_end_with_their_module():
    """The pages' background jobs (the alert history, the Advisor's tuning: tens of seconds each,
    in child processes of the process that ran the page, one at a time) end with the test module
    that started them, instead of running on beside later modules' tests and holding the
    one-at-a-time lock a later job waits for (a one-second test of the background module once took
    14 s that way). Jobs still queued behind the lock start their child when the one before ends:
    each is ended too, until no job's watcher is left. Their futures are forgotten with them, so a
    later page starts its own."""
    yield
    import multiprocessing
    import threading

    ended = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        kids = [p for p in multiprocessing.active_children() if p.name == "warmscope-background"]
        for p in kids:
            p.terminate()
        for p in kids:
            p.join(10)
        ended += len(kids)
        if not any(t.name == "warmscope-background-watch" and t.is_alive() for t in threading.enumerate()):
            break
        time.sleep(0.02)
    cached = sys.modules.get("warmscope.app.dashboard.cached")
    if ended and cached is not None:
        cached._history_jobs.clear()
        cached._advice_jobs.clear()


@pytest.fixture(scope="session")
def vllm_engines():
    """The session's :class:`EnginePool`: ``vllm_engines(n, **config)`` returns n running engines
    with that configuration (``VLLMEngine``'s keyword arguments), started once and shared, each
    with an empty prefix cache. A vLLM that cannot be installed or started skips the test, and
    fails it under CI=true."""
    pool = EnginePool()
    yield pool
    pool.stop()


@pytest.fixture(scope="session")
def redis_cluster():
    """A 3-master Redis Cluster on free 127.0.0.1 ports (``bench.redis_cluster``),
    stopped after the session. Skipped without redis-server / redis-cli; fails
    under CI=true."""
    from bench.redis_cluster import ClusterUnavailable, LocalCluster

    need_binary("redis-server")
    need_binary("redis-cli")
    try:
        # No replicas, so no failover to be quick about: a long node timeout keeps a master that a
        # loaded machine did not schedule for a second from being marked failed (the cluster then
        # answers CLUSTERDOWN; seen once in a clean-clone CI run with the default 1 s)
        c = LocalCluster(masters=3, node_timeout_ms=15_000)
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


STREAMLIT_START_S = 180  # a loaded CI machine (three workers on two cores) has taken over 60 s


@contextlib.contextmanager
def streamlit_app(env: dict[str, str], cwd: Path | None = None):
    """Serve the dashboard (``app/dashboard/main.py``) with ``env`` (the whole environment) on a free loopback
    port; yields its URL and stops the server afterwards. A server that exits before it answers fails at
    once, and a failure shows the end of its output."""
    import tempfile
    import urllib.request

    from warmscope.app.dashboard.serve import command

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"streamlit-{port}-", suffix=".log", delete=False)
    # served as `warmscope dashboard` serves it: Streamlit, its settings, the caches warmed at start
    proc = subprocess.Popen(command("--server.port", str(port), "--server.address", "127.0.0.1"), env=env,
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the dashboard exited with {proc.returncode} before it answered")
        return urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200

    try:
        try:
            wait_until(ready, STREAMLIT_START_S, "streamlit")
        except (RuntimeError, SystemExit) as e:
            tail = Path(log.name).read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{e}; its output ends:\n" + "\n".join(tail)) from None
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        Path(log.name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def streamlit_server(store):
    """The dashboard over the requesting module's ``store`` fixture (an embedded store's path), and the
    chromium binary to drive it: ``(url, chromium)``."""
    chromium = need_binary("chromium")
    with streamlit_app(dict(os.environ, WARMSCOPE_STORE=str(store))) as url:
        yield url, chromium
