"""The block trace a gateway recorded (the embedded store's ``block_trace`` rows) as a
:class:`~warmscope.model.blocktrace.BlockTrace`, and a trace written into a store.

A store holds the requests a gateway's KV hook traced (``records.BLOCK_TRACE``): per request its
arrival, end, tenant, engine, salt, tokens, TTFT and the keyed digests of its blocks. Restarts
of an engine are not rows of their own: an engine whose cache was emptied shows as requests
that miss what they hit before (the replay sees the same).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from warmscope.collectors.store import EmbeddedStore, StoreError
from warmscope.model import records
from warmscope.model.blocktrace import BlockTrace, TraceBuilder, TraceError

from .base import SourceError

__all__ = ["trace_from_rows", "read_store_trace", "write_store_trace", "store_trace_rows"]

_COLS = records.BLOCK_TRACE.cols


def _u64(b: Any) -> list[int]:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return []
    out: list[int] = np.frombuffer(bytes(b), dtype="<u8").tolist()
    return out


def trace_from_rows(rows: Iterable[Sequence[Any]] | pd.DataFrame, source: str = "") -> BlockTrace:
    """Build a trace from ``block_trace`` rows (tuples in ``records.BLOCK_TRACE`` column order,
    or its frame), in arrival order."""
    if isinstance(rows, pd.DataFrame):
        it: Iterable[Sequence[Any]] = rows[list(_COLS)].itertuples(index=False, name=None)
    else:
        it = rows
    ordered = sorted(it, key=lambda r: float(r[0]))
    if not ordered:
        raise TraceError("no traced requests: the store holds no block trace in this range")
    sizes = {int(r[9]) for r in ordered}
    if len(sizes) > 1:
        raise TraceError(
            f"the traced requests have different block sizes ({sorted(sizes)}): replay the "
            "engines of one block size at a time"
        )
    b = TraceBuilder(sizes.pop(), source)
    capacity: dict[str, int] = {}
    for r in ordered:
        ts, t_end, tenant, engine, salt, prompt, output, cached, ttft, _bs, cap, _bucket = r[:12]
        h, c, s, cls = _u64(r[12]), _u64(r[13]), _u64(r[14]), r[15]
        if cap and engine:
            capacity[str(engine)] = int(cap)
        b.add(
            float(ts),
            int(prompt),
            int(output),
            h,
            t_end=float(t_end) if t_end is not None else math.nan,
            cached=int(cached),
            ttft=float(ttft) if ttft is not None else math.nan,
            tenant=str(tenant) if tenant else None,
            engine=str(engine) if engine else None,
            salt=None if not salt or salt == "unsalted" else str(salt),
            full=len(h),
            c=c if len(c) == len(h) else None,
            s=s if len(s) == len(h) else None,
            cls=list(bytes(cls)) if cls is not None and len(bytes(cls)) == len(h) else None,
        )
    trace = b.build()
    trace.capacity = {e: capacity[e] for e in trace.engines if e in capacity}
    trace.check()
    return trace


def read_store_trace(
    path: str | os.PathLike[str], start: float | None = None, end: float | None = None
) -> BlockTrace:
    """The block trace an embedded store holds, between ``start`` and ``end`` (arrival)."""
    try:
        store = EmbeddedStore(Path(path), readonly=True)
    except StoreError as e:
        raise SourceError(str(e)) from None
    try:
        df = store.frame("block_trace", start, end)
    except StoreError as e:
        raise SourceError(str(e)) from None
    finally:
        store.close()
    return trace_from_rows(df, source=str(path))


def store_trace_rows(trace: BlockTrace) -> list[tuple[Any, ...]]:
    """A trace as ``block_trace`` rows (what :func:`write_store_trace` writes)."""

    def blob(a: np.ndarray) -> bytes:
        return a.astype("<u8").tobytes()

    rows = []
    for i in range(len(trace)):
        lo, hi = int(trace.offsets[i]), int(trace.offsets[i + 1])
        full = lo + int(min(trace.full[i], hi - lo))
        h = trace.h[lo:full]
        s = trace.s[lo:full]
        rows.append(
            (
                float(trace.t[i]),
                float(trace.t_end[i]),
                trace.tenants[trace.tenant[i]],
                trace.engines[trace.engine[i]] if trace.engine[i] >= 0 else "",
                trace.salts[trace.salt[i]] if trace.salt[i] > 0 else "unsalted",
                int(trace.prompt[i]),
                int(trace.output[i]),
                int(trace.cached[i]),
                float(trace.ttft[i]),
                int(trace.block_size),
                int(trace.capacity.get(trace.engines[trace.engine[i]], 0))
                if trace.engine[i] >= 0
                else 0,
                int(h[0]) & 0xFF if len(h) else 0,
                blob(h),
                blob(trace.c[lo:full]),
                b"" if np.array_equal(s, h) else blob(s),
                trace.cls[lo:full].tobytes(),
            )
        )
    return rows


def write_store_trace(trace: BlockTrace, path: str | os.PathLike[str]) -> int:
    """Append ``trace``'s requests to the store's block trace (one transaction); returns the
    rows written. Only full blocks are kept (a Mooncake chain's partial last block is not a
    block an engine caches)."""
    try:
        store = EmbeddedStore(Path(path))
    except StoreError as e:
        raise SourceError(str(e)) from None
    try:
        return store.write({"block_trace": store_trace_rows(trace)})
    finally:
        store.close()
