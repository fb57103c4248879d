"""The block trace the KV watcher records (hand-built event streams, block size 4): each request's
chain — its hit prefix from the engine's full-mode reuse report (or walked from the store's
parent), then what it stored — keyed digests, the recording's class per block, the drift-stable
chain; a reuse report read as a report, not a store (whatever the watcher's reuse_reports
setting); and the rows through the pipeline into the store's block trace."""

from __future__ import annotations

import numpy as np
from warmscope.collectors.kv import KVState
from warmscope.collectors.kv.attribution import TRACE_WAIT_S
from warmscope.collectors.miss_counts import trace_record
from warmscope.sources.trace_store import read_store_trace, trace_from_rows

from tests.collectors.kv_events import stored, toks
from tests.collectors.test_kv_attribution import feed, zero

B = 4


class _Waits:
    """The state's wait clock, moved on by the test: the waits are judged without sleeping."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _state(rows: list) -> KVState:
    return KVState(["e1", "e2"], trace_sink=rows.append, trace_key=b"k" * 16, wait_clock=_Waits())


def _past_the_wait(st: KVState) -> None:
    """TRACE_WAIT_S (1 s) and a little more pass on the state's wait clock."""
    st.wait_clock.t += TRACE_WAIT_S + 0.1


def _done(st: KVState, sid: str, prompt: int, cached: int, output: int = 1, t: float = 1.0) -> None:
    st.submit(sid, prompt, cached, lambda a: None, wait_s=5,
              trace={"ts": t, "t_end": t + 0.5, "tenant": "acme", "output": output, "ttft": 0.1})
    st.resolve_pending()


def test_a_chain_of_stored_blocks_then_a_reported_prefix():
    rows: list = []
    st = _state(rows)
    # r1: 9 tokens, nothing cached: stores blocks 1, 2 (the 9th token is partial)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="r1")], 1.0)
    _done(st, "r1", 9, 0)
    # r2 asked for reports: reuses 1, 2 (parent-less report, its first event), stores 3 after 2
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="r2"),
                    stored([3], 2, toks(3), session="r2")], 2.0)
    _done(st, "r2", 13, 8)
    assert st.counts["reuse_reports"] == 1
    # the report did not become a second copy of blocks 1 and 2
    assert st.indexes["e1"].copies(1) == 1 and st.indexes["e1"].copies(2) == 1
    # r3 reuses all of r1's full blocks, stores nothing (4 + 1 tokens: no block fills)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="r3")], 3.0)
    _done(st, "r3", 10, 8)
    _past_the_wait(st)  # past the wait for output blocks
    st.resolve_pending()
    assert [len(r.h) for r in rows] == [2, 3, 2]
    r1, r2, r3 = rows
    assert r2.h[:2] == r1.h and r3.h == r1.h  # the same blocks: the same keyed digests
    assert r1.cls == bytes([5, 5]) and r2.cls == bytes([0, 0, 5]) and r3.cls == bytes([0, 0])
    # keyed: not the engine's hashes
    assert set(r1.h).isdisjoint({1, 2, 3}) and all(0 < x < 1 << 63 for x in r1.h)
    assert r2.cached == 8 and r2.engine == "e1" and r2.tenant == "acme" and r2.output == 1
    assert st.counts["traced"] == 3 and st.counts["trace_incomplete"] == 0


def test_the_prefix_walked_from_the_parent_without_reports():
    rows: list = []
    st = _state(rows)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="a")], 1.0)
    _done(st, "a", 9, 0)
    # b hits 1, 2 (no report), stores 3 with parent 2: its chain is walked back to the root
    feed(st, "e1", [stored([3], 2, toks(3), session="b")], 2.0)
    _done(st, "b", 13, 8)
    _past_the_wait(st)
    st.resolve_pending()
    assert rows[1].h[:2] == rows[0].h and len(rows[1].h) == 3


def test_output_blocks_join_the_chain_when_they_arrive():
    rows: list = []
    st = _state(rows)
    # 9 prompt tokens + 8 output: (9 + 8 - 1) // 4 = 4 full blocks, 2 of them from the output
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="o")], 1.0)
    _done(st, "o", 9, 0, output=8)
    assert rows == []  # waiting for the output's blocks
    feed(st, "e1", [stored([7, 8], 2, toks(7, 8), session="o")], 1.2)
    st.resolve_pending()
    assert len(rows) == 1 and len(rows[0].h) == 4
    assert rows[0].cls == bytes([5, 5, 255, 255])  # output blocks are not judged


def test_a_full_hit_answered_before_its_report_arrives_waits_for_it():
    """A request whose whole prompt was cached needs no store event, so it is judged as soon as
    it is submitted; under load its reuse report can reach the watcher after that. Its trace
    waits for the report (up to the output wait) instead of being counted incomplete."""
    rows: list = []
    st = _state(rows)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="a")], 1.0)
    _done(st, "a", 9, 0)
    _done(st, "late", 9, 8)  # 8 of 9 tokens cached: nothing to judge, no event yet
    assert st.counts["trace_incomplete"] == 0 and len(rows) == 1  # a, not yet late
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="late")], 2.0)
    _past_the_wait(st)
    st.resolve_pending()
    assert st.counts["trace_incomplete"] == 0 and st.counts["traced"] == 2, st.counts
    assert rows[1].h == rows[0].h and rows[1].cls == bytes([0, 0])


def test_a_request_whose_events_never_come_is_counted_after_the_wait():
    rows: list = []
    st = _state(rows)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="a")], 1.0)  # the block size
    _done(st, "a", 9, 0)
    _done(st, "ghost", 9, 8)
    assert st.counts["trace_incomplete"] == 0  # still waiting
    _past_the_wait(st)
    st.resolve_pending()
    assert st.counts["trace_incomplete"] == 1 and len(rows) == 1  # a


def test_a_one_block_event_waits_to_be_told():
    rows: list = []
    st = _state(rows)
    feed(st, "e1", [stored([1], None, toks(1), session="x")], 1.0)
    _done(st, "x", 4, 0)
    # y: a 4-token prompt recomputes its only block (cap (4-1)//4 = 0): a second copy
    feed(st, "e1", [stored([1], None, toks(1), session="y")], 2.0)
    _done(st, "y", 4, 0)
    assert st.indexes["e1"].copies(1) == 2
    # z: 8 tokens, block 1 reused (one-block report), then its store of block 2 after 1
    feed(st, "e1", [stored([1], None, toks(1), session="z"), stored([2], 1, toks(2), session="z")],
         3.0)
    _done(st, "z", 9, 4)
    assert st.indexes["e1"].copies(1) == 2  # the report added no copy
    _past_the_wait(st)
    st.resolve_pending()
    assert [len(r.h) for r in rows] == [1, 1, 2]


def test_a_client_full_mode_report_is_not_read_as_a_store():
    """reuse_reports off (the default): a request that asked for full-mode reports itself gets
    the same classes as without them, and the index holds what the engine holds."""
    for reports in (False, True):
        st = KVState(["e1", "e2"])
        feed(st, "e1", [stored([1, 2, 3], None, toks(1, 2, 3), session="a")], 1.0)
        assert st.attribute("a", 13, 0).classes == zero(cold=12, partial=1)
        ev = [stored([4], 2, toks(4), session="b")]
        if reports:
            ev = [stored([1, 2], None, toks(1, 2), session="b")] + ev
        feed(st, "e2", [stored([1, 2], None, toks(1, 2), session="c")], 1.5)  # c: on e2, cold
        feed(st, "e1", ev, 2.0)
        got = st.attribute("b", 13, 8).classes
        assert got == zero(cold=4, partial=1), (reports, got)
        assert st.indexes["e1"].resident_copies() == 4


def test_drift_gets_a_stable_chain():
    rows: list = []
    st = _state(rows)
    # a: stamp block 10, then 2, 3; b: stamp 11, then the same tokens 2, 3 (drifted after 1
    # unseen block); c: stamp 12 again drifted; d: b's stamp again, all hits
    feed(st, "e1", [stored([101, 102, 103], None, toks(10, 2, 3), session="a")], 1.0)
    _done(st, "a", 13, 0)
    feed(st, "e1", [stored([201, 202, 203], None, toks(11, 2, 3), session="b")], 2.0)
    _done(st, "b", 13, 0)
    feed(st, "e1", [stored([301, 302, 303], None, toks(12, 2, 3), session="c")], 3.0)
    _done(st, "c", 13, 0)
    _past_the_wait(st)
    st.resolve_pending()
    a, b, c = rows
    assert b.cls == bytes([5, 4, 4])  # cold stamp, drifted after it
    assert a.s == [] and b.s and c.s == b.s  # b and c share their stable chain
    assert b.s != b.h


def test_trace_rows_through_the_pipeline_into_the_store(make_tel, tmp_path):
    rows: list = []
    st = _state(rows)
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="r1")], 1.0)
    _done(st, "r1", 9, 0)
    feed(st, "e2", [stored([1, 2], None, toks(1, 2), session="r2")], 2.0)
    _done(st, "r2", 9, 0, t=2.0)
    _past_the_wait(st)
    st.resolve_pending()
    tel = make_tel()
    for r in rows:
        tel.record_trace(r)
    tel.flush()
    tr = read_store_trace(tel.config.resolved_store_path())
    assert len(tr) == 2 and sorted(tr.engines) == ["e1", "e2"]
    assert np.array_equal(tr.chain(0), tr.chain(1)) and tr.chain(0).tolist() == rows[0].h
    direct = trace_from_rows([trace_record(r, "acme") for r in rows])
    assert np.array_equal(direct.h, tr.h) and direct.tenants == tr.tenants
    # garbage handed to record_trace is counted, never raised
    tel.record_trace(object())
    tel.flush()
    assert tel.aggregator.errors.get("record", 0) >= 1


def test_the_store_keeps_a_day_whole_and_samples_beyond(tmp_path):
    """Rows older than a day before the newest write are thinned to the buckets 0-31 of 256 (one
    request in eight, whole prefix groups: the bucket is the first block's)."""
    from warmscope.collectors.store import EmbeddedStore
    from warmscope.collectors.store.writer import TRACE_FULL_S, TRACE_KEEP_BUCKETS

    store = EmbeddedStore(tmp_path / "s.sqlite")
    row = list(trace_record(_row(0), "acme"))
    old = []
    for b in range(256):  # one request a bucket, two days ago
        r = list(row)
        r[0] = 1000.0
        r[11] = b
        old.append(tuple(r))
    store.write({"block_trace": old})
    assert store.query("SELECT count(*) FROM block_trace")[0][0] == 256  # nothing newer yet
    new = list(row)
    new[0] = 1000.0 + TRACE_FULL_S + 3600
    store.write({"block_trace": [tuple(new)]})
    kept = store.query("SELECT bucket FROM block_trace WHERE ts < 2000 ORDER BY bucket")
    assert [b for (b,) in kept] == list(range(TRACE_KEEP_BUCKETS))
    store.close()


def _row(i: int):
    from warmscope.collectors.kv.attribution import TraceRow

    return TraceRow(float(i), float(i) + 1, "acme", "e1", "unsalted", 9, 1, 0, 0.1, 4, [1, 2], [1, 2],
                    [], bytes([5, 5]))
