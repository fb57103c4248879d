"""Miss attribution on hand-built event streams of two engines (block size 4).

Each request's expected classes are worked out by hand in the comments: a prompt of
n tokens with c cached can hit at most (n - 1) // 4 blocks; its missed full blocks
number (n - 1) // 4 - c // 4 and the rest of n - c is ``partial``."""

from __future__ import annotations

from warmscope.collectors.kv import KVState
from warmscope.collectors.kv.decode import DecodeStats, decode_message

from tests.collectors.kv_events import cleared, frames, removed, stored, toks

SEQ = {"e1": 0, "e2": 0}


def feed(state: KVState, engine: str, events, ts: float) -> None:
    b = decode_message(frames(SEQ[engine], events, ts), DecodeStats())
    SEQ[engine] += 1
    assert b is not None
    state.apply(engine, b)


def zero(**kw: int) -> dict[str, int]:
    out = dict.fromkeys(("elsewhere", "evicted", "isolated", "drifted", "cold", "partial",
                         "unknown"), 0)
    out.update(kw)
    return out


def test_each_class_by_hand():
    st = KVState(["e1", "e2"])
    # 1. a: 9 tokens [1 1 1 1 2 2 2 2 9] on e1, nothing cached. (9 - 1) // 4 = 2 missed
    #    blocks, both new: cold 2 x 4 = 8; partial 9 - 8 = 1.
    feed(st, "e1", [stored([11, 12], None, toks(1, 2), session="a")], 100.0)
    assert st.attribute("a", 9, 0).classes == zero(cold=8, partial=1)
    # 2. b: the same prompt on e2: both blocks resident on e1 -> elsewhere 8, partial 1
    feed(st, "e2", [stored([11, 12], None, toks(1, 2), session="b")], 101.0)
    assert st.attribute("b", 9, 0).classes == zero(elsewhere=8, partial=1)
    # 3. c: the same tokens under salt "x" on e1 (other hashes 21, 22): the content is
    #    resident (e1 and e2) only without salt -> isolated 8, partial 1
    feed(st, "e1", [stored([21, 22], None, toks(1, 2), salt="x", session="c")], 102.0)
    assert st.attribute("c", 9, 0).classes == zero(isolated=8, partial=1)
    # 4. d: both engines evict 11 and 12 (at 103 and 104), then the prompt comes back to
    #    e1 at 110: stored before, resident nowhere -> evicted 8 (6 s since the last removal)
    feed(st, "e1", [removed([11, 12])], 103.0)
    feed(st, "e2", [removed([12]), removed([11])], 104.0)
    feed(st, "e1", [stored([11, 12], None, toks(1, 2), session="d")], 110.0)
    a = st.attribute("d", 9, 0)
    assert a.classes == zero(evicted=8, partial=1) and a.evicted_age_s == [6.0, 6.0]
    # 5. drift: e2 stores a chain [5 6 7 3] (session e: 17 tokens, 4 missed blocks, all
    #    cold: cold 16, partial 1); then f: [8 6 7 3] + 1 token. Block 0 (tokens 8) was
    #    never at position 0 -> cold, 1 block unseen so far; blocks 1-3 (tokens 6, 7, 3)
    #    were stored at positions 1-3 after a chain differing in 1 block -> drifted 12.
    feed(st, "e2", [stored([31, 32, 33, 34], None, toks(5, 6, 7, 3), session="e")], 120.0)
    assert st.attribute("e", 17, 0).classes == zero(cold=16, partial=1)
    feed(st, "e2", [stored([41, 42, 43, 44], None, toks(8, 6, 7, 3), session="f")], 121.0)
    assert st.attribute("f", 17, 0).classes == zero(cold=4, drifted=12, partial=1)
    # 6. g: [9 10 7 3]: blocks 0 and 1 never seen there (cold 8), two differing blocks
    #    before block 2 (drift_blocks=2) -> blocks 2 and 3 drifted 8; h: [12 13 14 3]:
    #    three unseen blocks before block 3 -> all cold 16.
    feed(st, "e1", [stored([51, 52, 53, 54], None, toks(9, 10, 7, 3), session="g")], 122.0)
    assert st.attribute("g", 17, 0).classes == zero(cold=8, drifted=8, partial=1)
    feed(st, "e1", [stored([61, 62, 63, 64], None, toks(12, 13, 14, 3), session="h")], 123.0)
    assert st.attribute("h", 17, 0).classes == zero(cold=16, partial=1)


def test_partial_tail_and_the_last_block_rule():
    st = KVState(["e1"])
    # 8 tokens = 2 full blocks, nothing cached: the hit is capped at (8 - 1) // 4 = 1
    # block, so only block 1 is judged (cold 4); block 2 is recomputed anyway: partial 4
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="p")], 1.0)
    assert st.attribute("p", 8, 0).classes == zero(cold=4, partial=4)
    # again, 4 tokens cached: 1 hit block = the cap, no block judged; vLLM stores block 2
    # a second time (same hash): missed 8 - 4 = 4, all partial
    feed(st, "e1", [stored([2], 1, toks(2), session="q")], 2.0)
    assert st.attribute("q", 8, 4).classes == zero(partial=4)
    assert st.indexes["e1"].copies(2) == 2
    # 12 tokens with 4 cached: cap (12 - 1) // 4 = 2, hit 1 -> 1 judged block (cold 4),
    # partial 12 - 4 - 4 = 4
    feed(st, "e1", [stored([3, 4], 2, toks(3, 4), session="r")], 3.0)
    assert st.attribute("r", 12, 4).classes == zero(cold=4, partial=4)


def test_own_evictions_come_after_the_judgement():
    st = KVState(["e1"])
    # e1 holds [1] under salt "y"; request s (no salt, same tokens) evicts it to make room:
    # vLLM publishes its removal and then its store in one batch. The hit was decided
    # before the removal, so the block is isolated (not cold): 5 tokens -> isolated 4,
    # partial 1.
    feed(st, "e1", [stored([7], None, toks(1), salt="y")], 1.0)
    feed(st, "e1", [removed([7]), stored([8], None, toks(1), session="s")], 2.0)
    assert st.attribute("s", 5, 0).classes == zero(isolated=4, partial=1)
    assert st.indexes["e1"].copies(7) == 0 and st.indexes["e1"].copies(8) == 1


def test_missing_events_are_unknown_and_counted():
    st = KVState(["e1"], block_size=4)
    # no store ever came for "z": 9 tokens, 0 cached -> 2 blocks unknown (8), partial 1
    a = st.attribute("z", 9, 0, wait_s=0.05)
    assert a.classes == zero(unknown=8, partial=1) and not a.complete
    assert st.counts["incomplete"] == 1
    # without any block size at all, every missed token is unknown
    assert KVState(["e1"]).attribute("z", 9, 3).classes == zero(unknown=6)


def test_cleared_engine_blocks_count_as_evicted():
    st = KVState(["e1"])
    feed(st, "e1", [stored([1, 2], None, toks(1, 2))], 1.0)
    feed(st, "e1", [cleared()], 2.0)
    # 9 tokens, 0 cached, both blocks were there before the reset -> evicted 8, partial 1
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="u")], 5.0)
    assert st.attribute("u", 9, 0).classes == zero(evicted=8, partial=1)


def test_submit_calls_back_when_the_events_arrive():
    st = KVState(["e1"])
    got = []
    st.submit("v", 9, 0, got.append, wait_s=5)
    assert got == []  # nothing yet: the store has not come
    feed(st, "e1", [stored([1, 2], None, toks(1, 2), session="v")], 1.0)
    assert len(got) == 1 and got[0].classes == zero(cold=8, partial=1)
    st.submit("w", 9, 0, lambda a: 1 / 0, wait_s=0)  # a failing callback: counted
    st.resolve_pending()
    assert st.counts["callback_errors"] == 1
