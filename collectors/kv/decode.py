"""Decoding vLLM KV-cache event messages, in either encoding, without raising.

A message is the ZMQ multipart ``[topic, seq, payload]``: ``seq`` is an 8-byte
big-endian sequence number, ``payload`` a msgpack ``EventBatch`` encoded as the
array ``[ts, events, data_parallel_rank]``. vLLM 0.32 encodes each event as a
map tagged by ``"type"``; other versions encode them as tagged arrays
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, ...]``
(field order as in ``vllm/distributed/kv_events.py``). Both are read here.

Events come out as small tuples, the only form the rest of the package sees:

* ``(STORED, hashes, parent, token_ids, block_size, salt, session_id)``
* ``(REMOVED, hashes)``
* ``(CLEARED,)``

Block hashes are 64-bit ints: vLLM publishes ints by default (the low 64 bits of
its block hash); a hash sent as bytes is reduced the same way, so both forms of
one block agree. A message that cannot be read (garbage, truncated, wrong
shape) or an event of an unknown type is counted in :class:`DecodeStats` and
skipped; nothing is raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "CLEARED",
    "REMOVED",
    "STORED",
    "Batch",
    "DecodeStats",
    "Event",
    "decode_message",
    "decode_payload",
    "hash64",
]

STORED, REMOVED, CLEARED = 1, 2, 3
MASK64 = (1 << 64) - 1
Event = tuple[Any, ...]

# Positions in the tagged-array form (index 0 is the tag).
_A_HASHES, _A_PARENT, _A_TOKENS, _A_BSIZE = 1, 2, 3, 4
_A_LORA_NAME, _A_EXTRA, _A_SESSION = 7, 8, 14


@dataclass
class DecodeStats:
    """What could not be read, by kind (counts only: no message bytes are kept)."""

    messages: int = 0
    events: int = 0
    bad_frames: int = 0  # not three frames, or a sequence number that is not 8 bytes
    bad_payload: int = 0  # not msgpack, truncated, or not an EventBatch
    bad_event: int = 0  # an event of a known type whose fields have the wrong shape
    unknown_event: int = 0  # an event type this version does not know
    unknown_types: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {
            "messages": self.messages,
            "events": self.events,
            "bad_frames": self.bad_frames,
            "bad_payload": self.bad_payload,
            "bad_event": self.bad_event,
            "unknown_event": self.unknown_event,
        }


@dataclass
class Batch:
    seq: int
    ts: float
    events: list[Event]
    dp_rank: int | None = None


_decoder = msgspec.msgpack.Decoder()


def hash64(h: Any) -> int | None:
    """A block hash as vLLM's int form: the low 64 bits (ints and bytes alike)."""
    if type(h) is int:
        return h & MASK64
    if isinstance(h, (bytes, bytearray, memoryview)):
        return int.from_bytes(h, "big") & MASK64
    return None


def _salt_of(extra: Any, lora_name: Any) -> str | None:
    """The cache_salt in the first block's extra keys (a string; the LoRA name,
    when set, is the first string and is skipped)."""
    if not isinstance(extra, list) or not extra:
        return None
    first = extra[0]
    if not isinstance(first, list):
        return None
    skip = lora_name is not None
    for v in first:
        if isinstance(v, str):
            if skip and v == lora_name:
                skip = False
                continue
            return v
    return None


def _hashes(raw: Any) -> list[int] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for h in raw:
        v = hash64(h)
        if v is None:
            return None
        out.append(v)
    return out


def _stored(
    hs: Any, parent: Any, tokens: Any, bsize: Any, extra: Any, lora: Any, session: Any
) -> Event | None:
    hashes = _hashes(hs)
    if hashes is None or not isinstance(tokens, list) or type(bsize) is not int or bsize <= 0:
        return None
    p = None if parent is None else hash64(parent)
    if parent is not None and p is None:
        return None
    return (
        STORED,
        hashes,
        p,
        tokens,
        bsize,
        _salt_of(extra, lora),
        session if isinstance(session, str) else None,
    )


def _event(e: Any, st: DecodeStats) -> Event | None:
    if isinstance(e, dict):
        kind = e.get("type")
        if kind == "BlockStored":
            out = _stored(
                e.get("block_hashes"),
                e.get("parent_block_hash"),
                e.get("token_ids"),
                e.get("block_size"),
                e.get("extra_keys"),
                e.get("lora_name"),
                e.get("session_id"),
            )
        elif kind == "BlockRemoved":
            hashes = _hashes(e.get("block_hashes"))
            out = None if hashes is None else (REMOVED, hashes)
        elif kind == "AllBlocksCleared":
            out = (CLEARED,)
        else:
            _unknown(kind, st)
            return None
    elif isinstance(e, list) and e:
        kind = e[0]
        n = len(e)
        if kind == "BlockStored" and n > _A_BSIZE:
            out = _stored(
                e[_A_HASHES],
                e[_A_PARENT],
                e[_A_TOKENS],
                e[_A_BSIZE],
                e[_A_EXTRA] if n > _A_EXTRA else None,
                e[_A_LORA_NAME] if n > _A_LORA_NAME else None,
                e[_A_SESSION] if n > _A_SESSION else None,
            )
        elif kind == "BlockRemoved" and n > 1:
            hashes = _hashes(e[1])
            out = None if hashes is None else (REMOVED, hashes)
        elif kind == "AllBlocksCleared":
            out = (CLEARED,)
        elif kind in ("BlockStored", "BlockRemoved"):
            out = None
        else:
            _unknown(kind, st)
            return None
    else:
        out = None
    if out is None:
        st.bad_event += 1
    return out


def _unknown(kind: Any, st: DecodeStats) -> None:
    st.unknown_event += 1
    name = kind if isinstance(kind, str) and len(kind) <= 64 else "?"
    if name in st.unknown_types or len(st.unknown_types) < 32:
        st.unknown_types[name] = st.unknown_types.get(name, 0) + 1


def decode_payload(payload: bytes, seq: int, st: DecodeStats) -> Batch | None:
    """One EventBatch payload; None (counted) when it cannot be read."""
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError):
        st.bad_payload += 1
        return None
    if (
        not isinstance(raw, list)
        or len(raw) < 2
        or not isinstance(raw[1], list)
        or not isinstance(raw[0], (int, float))
    ):
        st.bad_payload += 1
        return None
    events: list[Event] = []
    for e in raw[1]:
        ev = _event(e, st)
        if ev is not None:
            events.append(ev)
    st.events += len(events)
    dp = raw[2] if len(raw) > 2 and type(raw[2]) is int else None
    return Batch(seq, float(raw[0]), events, dp)


def decode_message(frames: list[bytes], st: DecodeStats) -> Batch | None:
    """``[topic, seq, payload]`` as received; None (counted) when it cannot be read."""
    st.messages += 1
    if len(frames) != 3 or len(frames[1]) != 8:
        st.bad_frames += 1
        return None
    return decode_payload(frames[2], int.from_bytes(frames[1], "big"), st)
