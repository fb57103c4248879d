"""Fault injection: the collectors never break the host, never lose or double
count without saying so, and stay bounded.

Real parts: redis-server (killed; stopped with SIGSTOP past the client's
timeout), a SQLite store held under an exclusive lock by another connection,
a local HTTP server that accepts OTLP connections and never answers, a taken
TCP port. Loads are small (thousands of rows, not millions): the bounds are
set small to match, so every path runs in seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import stat
import threading
import urllib.request
from pathlib import Path

import pytest
from warmscope import collectors
from warmscope.collectors import pipeline, request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry
from warmscope.collectors.store import EmbeddedStore
from warmscope.model import schema
from warmscope.sources.redis_source import RedisSource

from tests.conftest import RedisServer, free_port, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_installed_pipeline():
    pipeline.shutdown()
    yield
    pipeline.shutdown()


def _host_work(n: int = 3) -> None:
    """What a host does: wrap caches, label requests, call a memoised function."""

    @collectors.cached(layer="memo")
    def double(x):
        return 2 * x

    for i in range(n):
        c = collectors.InstrumentedCache({}, layer="response")
        with collectors.request_context(tenant="t", unit=f"u{i}", experiment="e", variant="A"):
            c.get("k")
            c["k"] = 1
            assert c.get("k") == 1
            assert double(i) == 2 * i
            collectors.current_telemetry().record_request(latency_s=0.1)


def _lookups_in_store(path: Path) -> int:
    return int(EmbeddedStore(path, readonly=True).frame("lookups")["count"].sum())


# ------------------------------------------------------------------ item 1
def _newer_store(p: Path) -> None:
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES('schema_version', '99')")
    con.commit()
    con.close()


@pytest.mark.parametrize("case", ["bad flush interval", "bad TOML", "unknown key", "corrupt store", "newer store",
                                  "unwritable store", "store is a directory", "garbage Redis URL"])
def test_setup_never_raises_into_the_host(case, tmp_path, monkeypatch, caplog):
    store = tmp_path / "s.sqlite"
    monkeypatch.setenv("WARMSCOPE_KEY_SECRET", "s")
    monkeypatch.setenv("WARMSCOPE_STORE", str(store))
    stage = "store"
    if case == "bad flush interval":
        monkeypatch.setenv("WARMSCOPE_FLUSH_INTERVAL", "abc")
        stage = "config"
    elif case in ("bad TOML", "unknown key"):
        cfg = tmp_path / "warmscope.toml"
        cfg.write_text("[collectors\nx=" if case == "bad TOML" else "[collectors]\nflush_intervall = 3\n")
        monkeypatch.setenv("WARMSCOPE_CONFIG", str(cfg))
        stage = "config"
    elif case == "corrupt store":
        store.write_bytes(b"not a database" * 100)
    elif case == "newer store":
        _newer_store(store)
    elif case == "unwritable store":
        (tmp_path / "afile").write_text("x")
        monkeypatch.setenv("WARMSCOPE_STORE", str(tmp_path / "afile" / "sub" / "s.sqlite"))
    elif case == "store is a directory":
        store.mkdir()
    elif case == "garbage Redis URL":
        monkeypatch.setenv("WARMSCOPE_REDIS_URL", "garbage")
        monkeypatch.setenv("WARMSCOPE_EXPORTER", "none")
        stage = "redis"
    before = store.read_bytes() if store.is_file() else None
    with caplog.at_level(logging.ERROR, logger="warmscope.collectors"):
        _host_work()  # raises nothing
        tel = collectors.current_telemetry()
        assert tel.aggregator.errors[stage] >= 1
        # the lookups are still counted in memory
        assert sum(tel.aggregator.lookup_totals().values()) == 3 * 2 + 3
        tel.flush()
        pipeline.shutdown()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors, "one clear line says what is wrong"
    assert len({r.getMessage() for r in errors}) <= 2
    if before is not None:
        assert store.read_bytes() == before  # a store we cannot use is left as it was


def test_locked_store_at_start_up_is_retried_and_nothing_is_lost(tmp_path):
    store = tmp_path / "locked.sqlite"
    EmbeddedStore(store).close()
    held = sqlite3.connect(store, isolation_level=None)
    held.execute("BEGIN EXCLUSIVE")  # another writer holding the lock for a long time
    try:
        tel = collectors.setup(exporter="embedded", store_path=str(store), key_secret="s", flush_interval_s=3600)
        assert tel.store is None and tel.aggregator.errors["store"] >= 1
        c = collectors.InstrumentedCache({}, layer="response", telemetry=tel)
        for i in range(100):
            c.get(f"k{i}")
        tel.flush()  # still locked: kept
    finally:
        held.rollback()
        held.close()
    tel.flush()  # the lock is gone: the store opens and every lookup lands once
    assert tel.store is not None
    tel.flush()
    assert _lookups_in_store(store) == 100


def test_setup_is_idempotent_and_a_taken_scrape_port_moves_to_the_next(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        kw = dict(exporter="prometheus", prometheus_port=port, key_secret="s", store_path=str(tmp_path / "s.sqlite"))
        a = collectors.setup(**kw)
        assert collectors.setup(**kw) is a  # twice: the same pipeline, no second server
        assert a.otel is not None and a.otel._server is not None
        served = a.otel._server[0].server_address[1]
        assert served != port and port < served < port + 16
        collectors.InstrumentedCache({}, layer="response", telemetry=a).get("k")
        body = urllib.request.urlopen(f"http://127.0.0.1:{served}/metrics", timeout=5).read().decode()
        assert "warmscope_cache_lookups_total" in body
        b = collectors.setup(**{**kw, "flush_interval_s": 30})  # a different config replaces it
        assert b is not a and b.otel is not None and b.otel._server is not None
    finally:
        taken.close()


def test_every_port_of_the_plan_taken_still_serves_the_host(tmp_path, caplog):
    socks = []
    base = free_port()
    for p in (base, base + 1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            s.listen(1)
        except OSError:
            pytest.skip("neighbouring port not free")
        socks.append(s)
    try:
        with caplog.at_level(logging.ERROR, logger="warmscope.collectors"):
            tel = collectors.setup(exporter="prometheus", prometheus_port=base, prometheus_port_span=2,
                                   key_secret="s", store_path=str(tmp_path / "s.sqlite"))
            _host_work()
        assert tel.otel is None and tel.aggregator.errors["export"] == 1
        assert any("taken" in r.getMessage() for r in caplog.records)
    finally:
        for s in socks:
            s.close()


# ------------------------------------------------------------------ item 2
def test_redis_down_memory_is_bounded_and_every_dropped_row_is_counted(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=dead, key_secret="s", side_flush_s=0,
                               max_pending_rows=3_000, max_buffered_units=2_000, close_timeout_s=2)
    tel = Telemetry(cfg, background=False)
    per_thread, threads = 2_500, 4
    errors = []

    def work(j):
        try:
            for i in range(per_thread):
                with request_context(tenant="t", unit=f"u{j}-{i}", experiment="e", variant="A", telemetry=tel):
                    tel.record_request(latency_s=0.1)
                if i % 500 == 499 and j == 0:
                    tel.flush(settle=False)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    ts = [threading.Thread(target=work, args=(j,)) for j in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors
    assert tel.pending_rows("redis") <= 3_000
    tel.flush()
    assert tel.pending_rows("redis") <= 3_000  # the bound holds on the way in, not after a failed write
    tel.close()
    dropped = tel.aggregator.dropped_counts()
    # one unit per request, one row per unit: every row was written (none: Redis is down) or counted
    assert dropped.get("record", 0) + dropped.get("redis", 0) == per_thread * threads
    assert dropped.get("record", 0) > 0  # the in-memory unit bound was hit as well
    assert tel.pending_rows("redis") == 0


@pytest.mark.redis
def test_close_returns_while_redis_is_stopped(tmp_path):
    srv = RedisServer(tmp_path)
    try:
        cfg = CollectorConfig.load(env={}, exporter="none", redis_url=srv.url, key_secret="s", close_timeout_s=1)
        tel = Telemetry(cfg, background=True)
        with request_context(tenant="t", unit="u", experiment="e", variant="A", telemetry=tel):
            tel.record_request(latency_s=0.1)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            tel.close()  # must come back while the server is still stopped
            assert srv.proc.poll() is None
            dropped = tel.aggregator.dropped_counts().get("redis", 0)
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        # either the row made it before the stop, or it is counted as dropped; never both
        written = len(RedisSource(srv.url).units("e"))
        assert written + dropped == 1
    finally:
        srv.stop()


# ------------------------------------------------------------------ item 3
def _unit_requests(client, exp: str = "e") -> int:
    return int(RedisSource("", client=client).units(exp)["requests"].sum())


@pytest.mark.redis
def test_redis_stalled_past_the_timeout_counts_each_increment_once(tmp_path):
    srv = RedisServer(tmp_path)
    client = srv.client()
    try:
        cfg = CollectorConfig.load(env={}, exporter="none", redis_url=srv.url, key_secret="s")
        tel = Telemetry(cfg, background=False)

        def traffic(lo, hi):
            for i in range(lo, hi):
                with request_context(tenant="t", unit=f"u{i % 50}", experiment="e", variant="AB"[i % 2],
                                     telemetry=tel):
                    tel.record_request(latency_s=0.1)

        traffic(0, 300)
        tel.flush()  # an open connection, as in a running service
        traffic(300, 600)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            tel.flush()  # the client times out; Redis applies the batch when it resumes
            assert tel.aggregator.errors["redis"] == 1 and tel.pending_rows("redis") > 0
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        # The stall hit the read of the units' old totals or the script: once Redis resumes, what it had
        # received is applied (600) or nothing of the batch is (300).
        wait_until(lambda: _unit_requests(client) in (300, 600), what="the stalled batch settled")
        tel.flush()  # the retry carries the same batch id: skipped if applied, else applied now
        tel.close()
        assert tel.pending_rows("redis") == 0
        assert _unit_requests(client) == 600  # not 600 + the retried batch
    finally:
        srv.stop()


@pytest.mark.redis
def test_redis_killed_and_restarted_loses_nothing(tmp_path):
    srv = RedisServer(tmp_path)
    port = srv.port
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=srv.url, key_secret="s")
    tel = Telemetry(cfg, background=False)
    for i in range(200):
        with request_context(tenant="t", unit=f"u{i % 20}", experiment="e", variant="A", telemetry=tel):
            tel.record_request(latency_s=0.1)
    srv.proc.kill()
    srv.proc.wait()
    tel.flush()
    assert tel.aggregator.errors["redis"] >= 1
    srv2 = RedisServer(tmp_path, port=port)
    try:
        tel.flush()
        tel.close()
        assert _unit_requests(srv2.client()) == 200
    finally:
        srv2.stop()


# ------------------------------------------------------------------ item 4
class _HangingReceiver:
    """Accepts connections and never answers (a wedged collector)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def test_otlp_hanging_receiver_failures_are_counted_and_close_is_bounded(tmp_path):
    rx = _HangingReceiver()
    try:
        cfg = CollectorConfig.load(env={}, exporter="otlp", otlp_endpoint=f"http://127.0.0.1:{rx.port}",
                                   key_secret="s", flush_interval_s=0.2, export_timeout_s=0.5, close_timeout_s=1.5,
                                   store_path=str(tmp_path / "s.sqlite"))
        tel = Telemetry(cfg)
        c = collectors.InstrumentedCache({}, layer="response", telemetry=tel)
        for i in range(100):
            c.get(f"k{i}")
        wait_until(lambda: tel.aggregator.errors["export"] >= 1, timeout=30, what="a counted export failure")
        done = threading.Event()
        threading.Thread(target=lambda: (tel.close(), done.set()), daemon=True).start()
        # close() returns although the receiver never answers (the receiver is still up)
        assert done.wait(60)
        assert rx.held
    finally:
        rx.close()


# ------------------------------------------------------------------ item 5
def test_secret_retried_until_it_can_be_made_nothing_lost(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the data directory should be")
    monkeypatch.setenv("WARMSCOPE_DATA_DIR", str(blocker / "data"))
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(tmp_path / "s.sqlite"))
    tel = Telemetry(cfg, background=False)
    for i in range(300):
        with request_context(tenant="t", unit=f"u{i}", experiment="e", variant="A", telemetry=tel):
            tel.record_request(latency_s=0.1)
    with caplog.at_level(logging.ERROR, logger="warmscope.collectors"):
        tel.flush()
    assert tel.aggregator.errors["config"] >= 1
    assert any("WARMSCOPE_KEY_SECRET" in r.getMessage() for r in caplog.records)
    blocker.unlink()  # the directory can be made now
    tel.flush()
    tel.close()
    assert len(EmbeddedStore(tmp_path / "s.sqlite", readonly=True).frame("ab_units")) == 300
    secret = blocker / "data" / "key-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_secret_is_never_made_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("WARMSCOPE_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    cwd = tmp_path / "host"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = CollectorConfig.load(env={}, exporter="none")
    tel = Telemetry(cfg, background=False)
    assert len(tel.hasher.hash("k")) == 16
    assert not list(cwd.rglob("key-secret"))
    assert (tmp_path / "xdg" / "warmscope" / "key-secret").is_file()


@pytest.mark.redis
def test_an_explicit_secret_is_required_when_hashes_leave_the_host(tmp_path, caplog):
    srv = RedisServer(tmp_path)
    try:
        cfg = CollectorConfig.load(env={}, exporter="none", redis_url=srv.url)
        tel = Telemetry(cfg, background=False)
        for i in range(50):
            with request_context(tenant="t", unit=f"u{i}", experiment="e", variant="A", telemetry=tel):
                tel.record_request(latency_s=0.1)
        with caplog.at_level(logging.ERROR, logger="warmscope.collectors"):
            tel.flush()
            tel.close()
        assert any("WARMSCOPE_KEY_SECRET" in r.getMessage() for r in caplog.records)
        assert not len(RedisSource(srv.url).units("e"))
        assert tel.aggregator.dropped_counts()["redis"] == 50  # not silent: every unit counted
    finally:
        srv.stop()


# ------------------------------------------------------------------ item 7
def test_free_labels_are_capped_and_overflow_counted(make_tel):
    tel = make_tel(max_label_values=8)
    c = collectors.InstrumentedCache({}, layer="response", telemetry=tel)
    for i in range(100):
        with request_context(tenant="t", model=f"m{i}", experiment=f"x{i}", variant=f"v{i}", telemetry=tel):
            c.get("k")
    series = tel.aggregator.lookup_totals()
    assert len(series) == 9  # 8 values + other
    assert sum(series.values()) == 100
    assert tel.aggregator.label_overflow() == {"model": 92, "experiment": 92, "variant": 92}
    tel.flush()
    from tests.helpers import total

    assert total(tel.reader, schema.LABEL_OVERFLOW.name, {schema.ATTR.LABEL: "model"}) == 92


def test_many_layers_never_wrap_into_another_scope(make_tel):
    tel = make_tel(max_layers=10)
    caches = [collectors.InstrumentedCache({}, layer=f"L{i}", telemetry=tel) for i in range(4100)]
    with request_context(tenant="t", telemetry=tel):
        for _ in range(2):
            caches[4099].get("hot")
            caches[3].get("cold")
    hot, _ = tel.aggregator.take_buffers(True)
    scopes = {tel.aggregator.hot_scope(hk): set(sk) for hk, sk in hot.items()}
    assert scopes == {("t", "other"): {"hot"}, ("t", "L3"): {"cold"}}
    assert tel.aggregator.label_overflow()["layer"] == 4090


def test_a_store_on_a_read_only_file_system_reaches_the_writer_and_loses_nothing(tmp_path):
    # A fault that reaches SQLite's writer: the store's file system mounted read only (in a private mount
    # namespace: chmod does not stop root, and a file system cannot turn read only under an open writer).
    # The host never sees an exception; the failed writes are counted, the rows wait and land once the file
    # system is writable again; a reader says what is wrong instead of "not a warmscope store".
    from bench.bench_faults import run_readonly_fs_case

    res = run_readonly_fs_case(str(tmp_path))
    if "skipped" in res:
        pytest.skip(res["skipped"])
    assert res.get("host_exceptions") == "0/1", res
    assert res["store_errors_while_read_only"] >= 1 and res["rows_kept_while_read_only"] == 1000
    assert res["units_lost"] == 0 and res["dropped_counted"] == {}
    assert res["reader_while_read_only"].startswith("cannot read embedded store") and "read-only" in \
        res["reader_while_read_only"]
