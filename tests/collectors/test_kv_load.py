"""The KV-event load test at a small scale: simulated engines' streams into sharded subscriber
processes over real ZMQ sockets, with publisher queues small enough that batches are dropped
and must be repaired from the replay sockets. Nothing may be lost or counted twice."""

from __future__ import annotations

import pytest

from bench.bench_kv_load import check, make_stream, run


def test_a_stream_knows_its_truth():
    out, t = make_stream(engine=3, n_batches=50, capacity=32, prefixes=20, seed=5)
    assert t.batches == len(out) == 50
    # every block stored is either still resident or was removed
    assert t.stored == t.resident + t.removed and 0 < t.resident <= 32
    assert t.block_events == t.stored + t.removed


@pytest.mark.slow
def test_sharded_subscribers_lose_and_double_count_nothing_under_drops():
    res = run(engines=12, shards=3, publishers=2, batches=150, hwm=2, timeout_s=120)
    assert check(res) == []
    rows = res["rows"].values()
    assert all(r["batches"] == 150 and r["unrepaired"] == 0 for r in rows)
    # the small send queues dropped batches, and the replay sockets repaired all of them
    assert sum(r["repaired"] for r in rows) > 0
    assert len(res["shards"]) == 3 and sum(s["engines"] for s in res["shards"]) == 12
