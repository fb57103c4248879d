"""Decoding KV-event messages: both encodings, bad input counted and never raised."""

from __future__ import annotations

import pytest
from warmscope.collectors.kv.decode import (
    CLEARED,
    REMOVED,
    STORED,
    DecodeStats,
    decode_message,
    hash64,
)

from tests.collectors.kv_events import ENC, cleared, frames, removed, stored, toks


@pytest.mark.parametrize("form", ["map", "array"])
def test_both_encodings_give_the_same_events(form):
    st = DecodeStats()
    msg = frames(7, [stored([11, 12], None, toks(1, 2), salt="t1", session="s1", form=form),
                     removed([11], form=form), cleared(form=form)], ts=5.5)
    b = decode_message(msg, st)
    assert b is not None and b.seq == 7 and b.ts == 5.5 and b.dp_rank == 0
    assert b.events == [(STORED, [11, 12], None, toks(1, 2), 4, "t1", "s1"),
                        (REMOVED, [11]), (CLEARED,)]
    assert st.as_dict() == {"messages": 1, "events": 3, "bad_frames": 0, "bad_payload": 0,
                            "bad_event": 0, "unknown_event": 0}


def test_short_array_form_of_older_versions():
    # [tag, hashes, parent, tokens, block_size, lora_id, medium]: no extra keys, no session
    st = DecodeStats()
    b = decode_message(frames(0, [["BlockStored", [5], 4, toks(9), 4, None, "GPU"]]), st)
    assert b is not None and b.events == [(STORED, [5], 4, toks(9), 4, None, None)]


def test_bytes_hashes_are_reduced_like_vllm_ints():
    h = bytes(range(32))
    # vLLM's int form: int.from_bytes(hash, "big") & (2**64 - 1) = the last 8 bytes
    assert hash64(h) == int.from_bytes(bytes(range(24, 32)), "big")
    assert hash64(-1) == 2**64 - 1
    assert hash64("x") is None


def test_garbage_truncated_and_unknown_are_counted():
    st = DecodeStats()
    good = frames(1, [stored([1], None, toks(1))])
    assert decode_message([b"", b"\x00" * 8, b"\xc1garbage"], st) is None      # not msgpack
    assert decode_message([b"", b"\x00" * 8, good[2][:-3]], st) is None       # truncated
    assert decode_message([b"", b"\x00" * 7, good[2]], st) is None            # short seq
    assert decode_message([b"", good[2]], st) is None                          # two frames
    assert decode_message([b"", b"\x00" * 8, ENC.encode({"ts": 1})], st) is None  # not a batch
    b = decode_message(frames(2, [{"type": "BlockMoved", "block_hashes": [1]},
                                  ["Teleported", 1], stored([1], None, toks(1)),
                                  {"type": "BlockStored", "block_hashes": "nope"}, 17]), st)
    assert b is not None and len(b.events) == 1
    assert st.bad_payload == 3 and st.bad_frames == 2
    assert st.unknown_event == 2 and st.unknown_types == {"BlockMoved": 1, "Teleported": 1}
    assert st.bad_event == 2  # the BlockStored with a string for hashes, and the bare 17
    assert st.messages == 6
