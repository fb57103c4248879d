"""Hand-built vLLM KV-event messages for the tests (both encodings)."""

from __future__ import annotations

from typing import Any

import msgspec

ENC = msgspec.msgpack.Encoder()
B = 4  # block size of the hand-built streams


def stored(hashes: list[Any], parent: Any, tokens: list[int], salt: str | None = None,
           session: str | None = None, form: str = "map", bsize: int = B) -> Any:
    extra: list[Any] = [None] * len(hashes)
    if salt is not None:
        extra[0] = [salt]
    if form == "map":
        e: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes,
                             "parent_block_hash": parent, "token_ids": tokens,
                             "block_size": bsize, "lora_id": None, "medium": "GPU",
                             "lora_name": None, "extra_keys": extra, "group_idx": 0}
        if session is not None:
            e["session_id"] = session
        return e
    arr = ["BlockStored", hashes, parent, tokens, bsize, None, "GPU", None, extra, 0,
           None, None, None, None, session]
    while arr[-1] is None:  # omit_defaults drops trailing defaults
        arr.pop()
    return arr


def removed(hashes: list[Any], form: str = "map") -> Any:
    if form == "map":
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
    return ["BlockRemoved", hashes, "GPU"]


def cleared(form: str = "map") -> Any:
    return {"type": "AllBlocksCleared"} if form == "map" else ["AllBlocksCleared"]


def payload(events: list[Any], ts: float = 1000.0, dp: int | None = 0) -> bytes:
    return ENC.encode([ts, events, dp] if dp is not None else [ts, events])


def frames(seq: int, events: list[Any], ts: float = 1000.0) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload(events, ts)]


def toks(*blocks: int) -> list[int]:
    """Token ids of whole blocks: block value v is [v, v, v, v]."""
    return [v for v in blocks for _ in range(B)]
