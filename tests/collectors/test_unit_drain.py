"""Issue 30 item 7: A/B unit records are handed to a healthy sink (a real
redis-server) before their buffer's bound is reached, and drops are logged
when they start."""

from __future__ import annotations

import logging
import threading
import time

from warmscope.collectors import request_context
from warmscope.collectors.config import CollectorConfig
from warmscope.collectors.pipeline import Telemetry


def record_units(tel, threads: int, rate: float, seconds: float) -> int:
    made = [0] * threads

    def work(i: int) -> None:
        per, t0, n = rate / threads, time.monotonic(), 0
        while (el := time.monotonic() - t0) < seconds:
            while n < int(el * per):
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
