"""A/B unit records: handed to a healthy sink (a real redis-server) before their
buffer's bound is reached, drops logged when they start; under sustained load,
Redis down and close, every record is delivered or counted, and a unit's rows
are written together or not at all."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry


def record_units(tel, threads: int, rate: float, seconds: float) -> int:
    """``rate`` new units per second over ``threads`` threads, ``rate × seconds`` in all (or what
    three times ``seconds`` allows). The rate is sustained, never a burst: when this process is
    not scheduled for a while (a loaded machine), the time it lost is forgiven rather than caught
    up at once: a catch-up of 0.6 s would be 240 units within milliseconds, more than a bound of
    200 holds however fast the flusher is (it dropped 64 when the process was stopped thrice for
    0.6 s), and dropping such a burst is what the bound is for."""
    made = [0] * threads

    def work(i: int) -> None:
        per, t0, n, lost = rate / threads, time.monotonic(), 0, 0.0
        goal = int(seconds * per)
        while n < goal and time.monotonic() - t0 < 3 * seconds:
            due = min(goal, int((time.monotonic() - t0 - lost) * per))
            if due - n > 2:  # a stall: at most two units late, the rest of the lost time forgiven
                lost += (due - n - 2) / per
                due = n + 2
            while n < due:
                with request_context(tenant="t", unit=f"u{i}-{n}", experiment="e", variant="A",
                                     telemetry=tel) as ctx:
                    tel.aggregator.record_request(ctx, None, 0.01, 0, 0, 0.0, None, None, 0.0)
                n += 1
            time.sleep(0.005)
        made[i] = n

    ths = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(made)


def test_new_units_faster_than_the_bound_per_second_are_all_written(redis_server, redis_client):
    # 400 new units/s against a bound of 200: the old flusher looked at the
    # buffer once a second and dropped about half of them (the rate stays well
    # under what a redis-server takes on a loaded 2-core box, ~1,000 units/s).
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=redis_server.url, key_secret="s",
                               replica="r0", max_buffered_units=200, flush_interval_s=10)
    tel = Telemetry(cfg, background=True)
    made = record_units(tel, threads=4, rate=400, seconds=4)
    tel.close()
    assert made > 1200
    assert tel.aggregator.dropped_counts() == {}
    stored = sum(1 for _ in redis_client.scan_iter(match="ws:{ab:e:*}:u:A:*", count=1000))
    assert stored == made


def test_drops_are_logged_when_they_start(tmp_path, caplog):
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(tmp_path / "s.db"),
                               key_secret="s", max_buffered_units=50)
    tel = Telemetry(cfg, background=False)
    for n in range(80):
        with request_context(unit=f"u{n}", experiment="e", variant="A", telemetry=tel) as ctx:
            tel.aggregator.record_request(ctx, None, 0.01, 0, 0, 0.0, None, None, 0.0)
    with caplog.at_level(logging.WARNING, logger="warmscope.collectors"):
        tel.flush()
    tel.close()
    assert tel.aggregator.dropped_counts() == {"record": 30}
    assert "30 A/B unit records dropped" in caplog.text


def test_documented_retry_chunk_size_is_the_codes():
    import re
    from pathlib import Path

    from warmscope.collectors import pipeline

    docs = Path(__file__).parents[2] / "docs"
    text = "".join((docs / page).read_text() for page in ("instrument/in-process.md", "operate/redis.md"))
    sizes = {int(n.replace(",", "")) for n in re.findall(r"chunks\s+of\s+([\d,]+)\s+rows", text)}
    assert sizes == {pipeline._CHUNK_ROWS}


def test_every_record_is_delivered_or_counted_and_a_unit_stays_whole(redis_server, redis_client, caplog):
    # Four threads create new A/B units (one lookup and one request each) as fast as they can against small
    # bounds, so records are dropped at the record buffer and at the Redis backlog. Before: a full backlog kept
    # a unit's lookup row and dropped its request row (half-written units), and close() lost rows uncounted.
    # Now: created = delivered + counted, exactly, and no unit is half-written.
    from warmscope.collectors import InstrumentedCache

    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=redis_server.url, key_secret="s",
                               replica="r0", max_buffered_units=3000, max_pending_rows=5001,
                               flush_interval_s=0.2)
    tel = Telemetry(cfg, background=True)
    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    per_thread = 6000

    def work(i: int) -> None:
        for n in range(per_thread):
            with request_context(tenant="t", unit=f"u{i}-{n}", experiment="e", variant="AB"[n % 2],
                                 telemetry=tel):
                cache.get(f"k{i}-{n}")  # a key read once is never a hot key: only unit records are rows here
                tel.record_request(latency_s=0.01, ttft_s=0.005)

    ths = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    with caplog.at_level(logging.WARNING, logger="warmscope.collectors"):
        tel.close(timeout=120)
    dropped = tel.aggregator.dropped_counts()
    req = lk = half = 0
    for k in redis_client.scan_iter(match="ws:{ab:e:*}:u:*", count=5000):
        a, b = redis_client.hmget(k, "requests", "prefix_kv:lookups")
        req += a is not None
        lk += b is not None
        half += (a is None) != (b is None)
    assert half == 0
    assert req + lk + sum(dropped.values()) == 2 * 4 * per_thread
    assert tel.pending_rows("redis") == 0
    assert "NoneType" not in caplog.text and "close()" not in caplog.text


def test_close_counts_and_logs_every_row_it_does_not_write(redis_server, redis_client, caplog):
    # No time left at close: nothing is written, and the log says how many rows were dropped (before: "close()
    # gave up after 0.0 s; unwritten rows are dropped (counted)", no number).
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=redis_server.url, key_secret="s",
                               replica="r0")
    tel = Telemetry(cfg, background=False)
    from warmscope.collectors import InstrumentedCache

    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    for n in range(300):
        with request_context(unit=f"u{n}", experiment="e", variant="AB"[n % 2], telemetry=tel):
            cache.get(f"k{n}")
            tel.record_request(latency_s=0.01)
    with caplog.at_level(logging.ERROR, logger="warmscope.collectors"):
        tel.close(timeout=0.0)
    assert tel.aggregator.dropped_counts() == {"redis": 600}
    assert re.search(r"close\(\) (stopped writing after 0\.0 s|could not write everything): 600 rows not "
                     r"written, counted as dropped in warmscope\.telemetry\.dropped \(redis 600\)", caplog.text)
    assert not list(redis_client.scan_iter(match="ws:{ab:*", count=1000))


@pytest.mark.redis
def test_redis_down_under_load_drops_whole_units_and_counts_them(tmp_path):
    # Redis is down while units keep coming: the backlog fills up and rows are dropped. Before: the backlog
    # kept a unit's lookup row and dropped its request row (half-written units once Redis was back). Now a
    # unit's rows are kept or dropped together, and delivered + counted = created.
    from warmscope.collectors import InstrumentedCache

    from tests.conftest import RedisServer

    srv = RedisServer(tmp_path)
    port = srv.port
    cfg = CollectorConfig.load(env={}, exporter="none", redis_url=srv.url, key_secret="s", replica="r0",
                               max_pending_rows=2_501, max_buffered_units=100_000)
    tel = Telemetry(cfg, background=False)
    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)
    srv.stop()
    made = 0
    for _flush in range(6):  # six flushes of 1,000 units while Redis is down: 12,000 rows for 2,501 places
        for _ in range(1000):
            with request_context(unit=f"u{made}", experiment="e", variant="AB"[made % 2], telemetry=tel):
                cache.get(f"k{made}")
                tel.record_request(latency_s=0.01)
            made += 1
        tel.flush()
    assert tel.pending_rows("redis") <= 2_501
    srv2 = RedisServer(tmp_path, port=port)
    try:
        tel.close()
        client = srv2.client()
        req = lk = half = 0
        for k in client.scan_iter(match="ws:{ab:e:*}:u:*", count=5000):
            a, b = client.hmget(k, "requests", "prefix_kv:lookups")
            req += a is not None
            lk += b is not None
            half += (a is None) != (b is None)
        assert half == 0 and req > 0
        assert req + lk + sum(tel.aggregator.dropped_counts().values()) == 2 * made
    finally:
        srv2.stop()


def test_the_thread_that_buffers_a_quarter_of_the_bound_wakes_the_flusher_once_per_take(tmp_path):
    # max_buffered_units 40: the 10th new unit (40 // 4) wakes the flusher, the 11th..30th do not;
    # after a take the count starts over and the 10th wakes it again.
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(tmp_path / "s.db"),
                               key_secret="s", max_buffered_units=40)
    tel = Telemetry(cfg, background=False)
    woken: list[int] = []
    tel.aggregator.on_units_filling = lambda: woken.append(tel.aggregator.units_buffered)

    def units(first: int, n: int) -> None:
        for i in range(first, first + n):
            with request_context(unit=f"u{i}", experiment="e", variant="A", telemetry=tel) as ctx:
                tel.aggregator.record_request(ctx, None, 0.01, 0, 0, 0.0, None, None, 0.0)

    units(0, 9)
    assert woken == []
    units(9, 21)
    assert woken == [10]
    tel.flush()
    assert tel.aggregator.units_buffered == 0
    units(30, 10)
    assert woken == [10, 10]
    tel.close()


def test_a_background_pipeline_wires_the_wake_to_its_flusher(tmp_path):
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(tmp_path / "s.db"),
                               key_secret="s", max_buffered_units=40, flush_interval_s=3600)
    tel = Telemetry(cfg, background=True)
    try:
        assert tel.aggregator.on_units_filling == tel._wake.set
        for i in range(10):
            with request_context(unit=f"u{i}", experiment="e", variant="A", telemetry=tel) as ctx:
                tel.aggregator.record_request(ctx, None, 0.01, 0, 0, 0.0, None, None, 0.0)
        # woken at the 10th: flushed long before the hour's interval (polled at 0.1 s otherwise)
        deadline = time.monotonic() + 30
        while tel.aggregator.units_buffered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tel.aggregator.units_buffered == 0
    finally:
        tel.close()


def test_a_request_keeps_its_units_decision_however_many_units_are_decided_meanwhile(tmp_path):
    # A request's lookup is dropped at the bound; before its request record, a flood of other new
    # units (each dropped, each decision remembered) overflows the aggregator's bounded memory of
    # decisions (2 × 50 + 1,024 here) and a flush empties the buffer. The request record must follow
    # its lookup (dropped), not be decided afresh (kept, with room again): a half-written unit.
    from warmscope.collectors import InstrumentedCache
    from warmscope.collectors.store import EmbeddedStore

    path = tmp_path / "s.db"
    cfg = CollectorConfig.load(env={}, exporter="embedded", store_path=str(path), key_secret="s",
                               max_buffered_units=50)
    tel = Telemetry(cfg, background=False)
    cache = InstrumentedCache({}, layer="prefix_kv", telemetry=tel)

    def whole_request(unit: str) -> None:
        with request_context(unit=unit, experiment="e", variant="A", telemetry=tel):
            cache.get(f"k-{unit}")
            tel.record_request(latency_s=0.01)

    for n in range(25):  # the buffer at its bound: 50 records (each unit's lookup and request)
        whole_request(f"fill{n}")
    with request_context(unit="u", experiment="e", variant="A", telemetry=tel):
        cache.get("k-u")  # dropped: the bound is reached
        for n in range(2 * 50 + 1024 + 10):  # the flood, dropped too
            whole_request(f"flood{n}")
        tel.flush()  # the buffer is empty again
        tel.record_request(latency_s=0.01)  # must be dropped with its lookup
    tel.close()
    st = EmbeddedStore(path)
    try:
        units = {r[0] for r in st.query("SELECT unit_hash FROM ab_units")}
        looked = {r[0] for r in st.query("SELECT unit_hash FROM ab_lookups")}
    finally:
        st.close()
    assert len(units) == 25 and units == looked  # the 25 kept whole; u and the flood dropped whole
    # the fill's 25 lookups and requests kept; u's two records and the flood's two each dropped
    assert tel.aggregator.dropped_counts() == {"record": 2 + 2 * (2 * 50 + 1024 + 10)}
