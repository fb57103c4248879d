"""Block traces as files: the Mooncake format, read and written.

The Mooncake trace format (published with the Mooncake paper, FAST'25; read by NVIDIA
Dynamo's data generator and AIPerf as ``mooncake_trace``) is one JSON object a line:

* ``timestamp`` — arrival, milliseconds since the trace's start;
* ``input_length``, ``output_length`` — tokens;
* ``hash_ids`` — the prompt's blocks (``⌈input_length / block⌉`` of them, the last one partial
  when the prompt is not a whole number of blocks) as ids: the same id at the same position
  after the same ids is the same prefix block.

warmscope writes the same fields and, where it knows them, adds its own (other readers ignore
them): ``block_size``, ``tenant``, ``engine``, ``salt`` (a digest, never the salt itself),
``end_timestamp`` (ms), ``cached_tokens``, ``ttft_ms``, ``content_ids`` and ``stable_ids`` (the
chain without the salt and with the template's drift removed, when they differ from
``hash_ids``), ``classes`` (the recording's judgement per block, :data:`BLOCK_CLASSES` as
numbers) and, on lines of their own, ``{"restart": engine, "timestamp": ms}``. Ids are numbered
in order of first appearance, so a written trace carries no digest of the recording.

:func:`read_trace` checks what a replay relies on and raises :class:`TraceError` naming the
line: malformed JSON or fields, timestamps going backwards, a block size that does not match
the hash ids, chains that are not prefix-closed (an id that follows different ids).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from warmscope.model.blocktrace import (
    BLOCK_CLASSES,
    UNJUDGED,
    BlockTrace,
    TraceBuilder,
    TraceError,
    chain_ids,
)

__all__ = ["read_trace", "write_trace", "DEFAULT_BLOCK_SIZE", "MAX_LINE_BYTES"]

DEFAULT_BLOCK_SIZE = 512  # the Mooncake traces' block size
MAX_LINE_BYTES = 16 << 20

try:  # orjson (the client extra) parses about 4x faster
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is part of the dev install
    _loads = json.loads


def _int(v: Any, what: str, line: int, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise TraceError(f"line {line}: {what} must be an integer >= {low}, not {v!r}")
    return v


def _ids(v: Any, what: str, line: int) -> list[int]:
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
    ):
        raise TraceError(f"line {line}: {what} must be a list of non-negative integers")
    return v


def _salt_code(salt: str) -> int:
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little") >> 1


def _side(
    r: dict[str, Any], what: str, no: int, h: list[int], pf: int, salt: int
) -> list[int] | None:
    """``content_ids`` / ``stable_ids``: another chain over the same prompt blocks; the output's
    blocks keep their hash chain."""
    if what not in r:
        return None
    v = _ids(r[what], what, no)
    if len(v) < pf:
        raise TraceError(f"line {no}: {what} must have an id per prompt block")
    return chain_ids(v[:pf], salt) + h[pf:]


def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for no, raw in enumerate(f, 1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"line {no}: longer than {MAX_LINE_BYTES >> 20} MiB")
        s = raw.strip()
        if s:
            yield no, s


def read_trace(path: str | os.PathLike[str], block_size: int | None = None) -> BlockTrace:
    """Read a trace file in the Mooncake format (with warmscope's fields where present).
    ``block_size``: tokens per hash id; the file's own ``block_size`` field, else 512."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as e:
        raise TraceError(f"cannot read the trace {p}: {e.strerror or e}") from None
    with f:
        return _read(f, str(p), block_size)


def _read(f: IO[bytes], name: str, block_size: int | None) -> BlockTrace:
    b: TraceBuilder | None = None
    bs = block_size
    pred: dict[int, tuple[int, int]] = {}  # id -> (the id before it, the line it was first seen)
    last_t = -math.inf
    restarts: list[tuple[float, str]] = []
    capacity: dict[str, int] = {}
    for no, s in _lines(f):
        try:
            r = _loads(s)
        except ValueError as e:
            raise TraceError(f"line {no}: not JSON ({str(e)[:80]})") from None
        if not isinstance(r, dict):
            raise TraceError(f"line {no}: not a JSON object")
        ts = r.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise TraceError(f"line {no}: timestamp must be a number of milliseconds, not {ts!r}")
        if ts < last_t:
            raise TraceError(
                f"line {no}: timestamp {ts} ms is before the previous line's {last_t} ms: "
                "a trace must be in arrival order (sort it by timestamp)"
            )
        last_t = ts
        if "restart" in r:
            restarts.append((ts / 1000.0, str(r["restart"])))
            continue
        if b is None:
            fbs = r.get("block_size")
            if bs is None:
                bs = _int(fbs, "block_size", no, 1) if fbs is not None else DEFAULT_BLOCK_SIZE
            elif fbs is not None and fbs != bs:
                raise TraceError(
                    f"line {no}: the trace says block_size {fbs}, but {bs} was asked for: "
                    "drop the option or pass the trace's own block size"
                )
            if bs <= 0:
                raise TraceError(f"block size {bs}: must be a positive number of tokens")
            b = TraceBuilder(bs, source=name)
        assert bs is not None
        n = _int(r.get("input_length"), "input_length", no, 1)
        out = _int(r.get("output_length", 0), "output_length", no, 0)
        ids = _ids(r.get("hash_ids"), "hash_ids", no)
        if len(ids) != -(-n // bs):
            fits = next(
                (c for c in (16, 32, 64, 128, 256, 512, 1024) if len(ids) == -(-n // c)), None
            )
            hint = f" ({len(ids)} blocks of {fits} tokens would)" if fits else ""
            raise TraceError(
                f"line {no}: {len(ids)} hash ids for {n} input tokens do not match blocks of "
                f"{bs} tokens{hint}: pass the block size the trace was recorded with"
            )
        prev = -1
        for x in ids:
            seen = pred.get(x)
            if seen is None:
                pred[x] = (prev, no)
            elif seen[0] != prev:
                raise TraceError(
                    f"line {no}: hash id {x} follows {prev if prev >= 0 else 'nothing'} here but "
                    f"{seen[0] if seen[0] >= 0 else 'nothing'} on line {seen[1]}: the chains are "
                    "not prefix-closed (each id must name one prefix block)"
                )
            prev = x
        salt = r.get("salt")
        salt_code = 0 if not salt else _salt_code(str(salt))
        recorded = bool(r.get("recorded", False))
        pf = len(ids)
        if recorded:  # warmscope's own: full prompt blocks, then the output's blocks
            pf = n // bs
            ids = ids[:pf] + _ids(r.get("output_ids", []), "output_ids", no)
        h = chain_ids(ids, salt_code)
        c = _side(r, "content_ids", no, h, pf, 0)
        st = _side(r, "stable_ids", no, h, pf, salt_code)
        cls = r.get("classes")
        if cls is not None:
            cls = _ids(cls, "classes", no)
            if len(cls) < pf or any(x >= len(BLOCK_CLASSES) and x != UNJUDGED for x in cls):
                raise TraceError(f"line {no}: classes must give one known class per hash id")
            cls = cls[:pf] + [UNJUDGED] * (len(h) - pf)
        blocks = r.get("num_gpu_blocks")
        if "engine" in r and isinstance(blocks, int) and not isinstance(blocks, bool):
            if blocks > 1:
                capacity[str(r["engine"])] = blocks
        end = r.get("end_timestamp")
        ttft = r.get("ttft_ms")
        cached = r.get("cached_tokens")
        b.add(
            ts / 1000.0,
            n,
            out,
            h,
            t_end=float(end) / 1000.0 if isinstance(end, (int, float)) else math.nan,
            cached=int(cached) if isinstance(cached, int) and not isinstance(cached, bool) else -1,
            ttft=float(ttft) / 1000.0 if isinstance(ttft, (int, float)) else math.nan,
            tenant=str(r["tenant"]) if "tenant" in r else None,
            engine=str(r["engine"]) if "engine" in r else None,
            salt=str(salt) if salt else None,
            # a recorded chain names full blocks only; a Mooncake chain ends with the partial one
            full=len(h) if recorded else n // bs,
            c=c,
            s=st,
            cls=cls,
        )
    if b is None or not len(b):
        raise TraceError(f"{name}: the trace has no requests")
    for t, engine in restarts:
        b.restart(t, engine)
    trace = b.build()
    trace.capacity = capacity
    trace.check()
    return trace


class _Ids:
    """Digests renumbered in order of first appearance; ``fresh()`` is an id no digest has."""

    def __init__(self) -> None:
        self.table: dict[int, int] = {}
        self.n = 0

    def of(self, values: np.ndarray) -> list[int]:
        out = []
        for v in values.tolist():
            x = self.table.get(v)
            if x is None:
                x = self.table[v] = self.n
                self.n += 1
            out.append(x)
        return out

    def fresh(self, k: int) -> list[int]:
        out = list(range(self.n, self.n + k))
        self.n += k
        return out


def _line(trace: BlockTrace, i: int, t0: float, ids: _Ids, cids: _Ids, sids: _Ids) -> str:
    B = trace.block_size
    lo, hi = int(trace.offsets[i]), int(trace.offsets[i + 1])
    n = int(trace.prompt[i])
    want = -(-n // B)  # Mooncake names every prompt block, the partial last one too
    mooncake_like = int(trace.full[i]) < hi - lo  # the chain holds the partial block itself
    pf = min(want, hi - lo) if mooncake_like else min(int(trace.full[i]), n // B, hi - lo)
    fill = want - pf
    r: dict[str, Any] = {
        "timestamp": round((float(trace.t[i]) - t0) * 1000, 3),
        "input_length": n,
        "output_length": int(trace.output[i]),
        "hash_ids": ids.of(trace.h[lo : lo + pf]) + ids.fresh(fill),
        "block_size": B,
    }
    if not mooncake_like and hi - lo > pf:
        r["recorded"] = True  # hash_ids' last entry is a partial block only when it has no id
        r["output_ids"] = ids.of(trace.h[lo + pf : hi])
    tenant = trace.tenants[trace.tenant[i]]
    if tenant:
        r["tenant"] = tenant
    if trace.engine[i] >= 0:
        r["engine"] = trace.engines[trace.engine[i]]
        cap = trace.capacity.get(r["engine"])
        if cap:
            r["num_gpu_blocks"] = cap
    if trace.salt[i] > 0:
        r["salt"] = trace.salts[trace.salt[i]]
    if not math.isnan(trace.t_end[i]):
        r["end_timestamp"] = round((float(trace.t_end[i]) - t0) * 1000, 3)
    if trace.cached[i] >= 0:
        r["cached_tokens"] = int(trace.cached[i])
    if not math.isnan(trace.ttft[i]):
        r["ttft_ms"] = round(float(trace.ttft[i]) * 1000, 3)
    if not np.array_equal(trace.c[lo : lo + pf], trace.h[lo : lo + pf]):
        r["content_ids"] = cids.of(trace.c[lo : lo + pf]) + cids.fresh(fill)
    if not np.array_equal(trace.s[lo : lo + pf], trace.h[lo : lo + pf]):
        r["stable_ids"] = sids.of(trace.s[lo : lo + pf]) + sids.fresh(fill)
    if np.any(trace.cls[lo : lo + pf] != UNJUDGED):
        r["classes"] = trace.cls[lo : lo + pf].tolist() + [UNJUDGED] * fill
    return json.dumps(r, separators=(",", ":")) + "\n"


def write_trace(trace: BlockTrace, path: str | os.PathLike[str]) -> int:
    """Write ``trace`` in the Mooncake format with warmscope's fields; returns the requests
    written. Written to a temporary file first: a failure leaves no partial trace."""
    p = Path(path)
    tmp = p.with_name(p.name + ".part")
    ids, cids, sids = _Ids(), _Ids(), _Ids()
    t0 = float(trace.t[0]) if len(trace) else 0.0
    restarts = sorted(trace.restarts)
    ri = 0

    def restart_line(k: int) -> str:
        rt, re = restarts[k]
        ts = round((rt - t0) * 1000, 3)
        return json.dumps({"timestamp": ts, "restart": trace.engines[re]}) + "\n"

    try:
        with tmp.open("w", encoding="utf-8") as f:
            for i in range(len(trace)):
                while ri < len(restarts) and restarts[ri][0] <= trace.t[i]:
                    f.write(restart_line(ri))
                    ri += 1
                f.write(_line(trace, i, t0, ids, cids, sids))
            for k in range(ri, len(restarts)):
                f.write(restart_line(k))
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(trace)
