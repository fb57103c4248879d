"""Miss attribution: why each missed block of a request was not in the engine's cache.

:class:`KVState` holds one :class:`~.index.ResidencyIndex` per watched engine and
applies their event batches (the subscriber calls :meth:`KVState.apply`). When a
``BlockStored`` that carries a ``session_id`` arrives, its blocks are the
request's missed blocks (vLLM stores every full block it computed), and each is
judged *before* the event is applied, against the state the request met:

1. ``elsewhere``: the same block (hash: same tokens after the same preceding
   tokens, same salt) is resident on another watched engine (a routing miss);
2. ``evicted``: it was stored on a watched engine and is resident on none now
   (capacity), with the time since it was removed;
3. ``isolated``: the same tokens after the same preceding tokens are resident,
   but only under another salt (tenant isolation);
4. ``drifted``: never stored with these preceding tokens, but the same block
   tokens were stored at the same position after preceding blocks of which
   between 1 and ``drift_blocks`` differ (a timestamp in a template);
5. ``cold`` otherwise.

Removals published between the previous store and this one are this request's
own evictions (vLLM's order within a request: reuse report, removals, new
store); they are applied after the judgement, since the hit was decided before
them. :meth:`KVState.attribute` then splits a request's missed tokens
(``prompt - cached``) exactly: its first ``floor((prompt - 1) / block) -
cached / block`` stored blocks by class, and the rest ``partial`` (the last
partial block, and the last full block when the prompt is a multiple of the
block size: vLLM never hits it). Missed blocks whose events never arrived
(a gap that could not be repaired, no session id) are ``unknown``.
See docs/kv-events.md for a worked example.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warmscope.model.records import MISS_CLASSES as CLASSES

from .decode import CLEARED, REMOVED, STORED, Batch
from .index import MASK64, ResidencyIndex, Salts, StoreBlocks

__all__ = ["CLASSES", "Attribution", "KVState", "TraceRow", "TRACE_WAIT_S"]

_ELSEWHERE, _EVICTED, _ISOLATED, _DRIFTED, _COLD = range(5)
_MAX_BLOCKS_PER_SESSION = 4096
_UNJUDGED = 255  # model.blocktrace.UNJUDGED (a block class byte: not judged)
TRACE_WAIT_S = 1.0  # how long a traced request waits for its output blocks' store events
_MAX_DRIFT_SOURCES = 65_536


@dataclass
class TraceRow:
    """One request's block chain for the block trace (``records.BLOCK_TRACE``): keyed 63-bit
    digests, root first (the prompt's full blocks, then its output's). ``s`` is empty when the
    drift-stable chain equals ``h``; ``cls``: one byte a block (0 hit, then the classes of
    :data:`CLASSES` from 1, 255 not judged)."""

    ts: float
    t_end: float
    tenant: str | None
    engine: str
    salt: str
    prompt: int
    output: int
    cached: int
    ttft: float
    block_size: int
    h: list[int]
    c: list[int]
    s: list[int]
    cls: bytes
    capacity: int = 0  # the engine's num_gpu_blocks, 0 when it did not say


@dataclass
class Attribution:
    """One request's missed tokens by class (they add up to prompt - cached)."""

    classes: dict[str, int]
    engine: str | None = None
    evicted_age_s: list[float] = field(default_factory=list)  # per evicted block
    complete: bool = True  # False: some missed blocks had no events (``unknown``)


class _Session:
    __slots__ = ("engine", "codes", "ages", "unseen", "block_size", "chain", "salt", "reported")

    def __init__(self, engine: str, block_size: int) -> None:
        self.engine = engine
        self.codes = bytearray()
        self.ages: list[tuple[int, float]] = []  # (block number in codes, seconds since removal)
        self.unseen = 0
        self.block_size = block_size
        self.chain: _Chain | None = None  # kept when requests are traced
        self.salt = 0
        self.reported = 0  # the first block of the session's reuse report (0: none)


class _Chain:
    """A traced request's blocks, root first: the hit prefix (walked from the first store's
    parent), then every block it stored. ``unseen``: a stored block whose tokens were never
    stored at its position before (the drift rule's count)."""

    __slots__ = ("h", "c", "d", "hits", "unseen", "ok")

    def __init__(self, h: list[int], c: list[int], d: list[int], ok: bool) -> None:
        self.h, self.c, self.d = h, c, d
        self.hits = len(h)
        self.unseen: list[bool] = [False] * len(h)
        self.ok = ok


@dataclass
class _Pending:
    session: str
    prompt: int
    cached: int
    deadline: float
    callback: Callable[[Attribution], None]
    trace: dict[str, Any] | None = None


class KVState:
    """The watched engines' residency and the per-request judgements; see the module doc.

    Mutated only by the thread that calls :meth:`apply` (the subscriber's);
    :meth:`attribute` may be called from any thread."""

    def __init__(
        self,
        engines: list[str],
        max_blocks: int = 1_000_000,
        max_sessions: int = 65_536,
        drift_blocks: int = 2,
        reuse_reports: bool = False,
        block_size: int = 0,
        clock: Callable[[], float] = time.time,
        wait_clock: Callable[[], float] = time.monotonic,
        trace_sink: Callable[[TraceRow], None] | None = None,
        trace_key: bytes | None = None,
    ) -> None:
        self.salts = Salts()
        # The block trace: a traced request's chain goes to ``trace_sink`` once its output's
        # blocks are in (or after TRACE_WAIT_S). Digests are keyed with ``trace_key``.
        self.trace_sink = trace_sink
        self.trace_key = trace_key or os.urandom(16)
        self._tracing: dict[str, tuple[dict[str, Any], float]] = {}
        self.capacity: dict[str, int] = {}  # engine -> num_gpu_blocks (its /metrics), for traces
        # one-block parent-less events of resident blocks, undecided (see apply)
        self._held: dict[str, tuple[str, list[int], list[int], int, str | None, float]] = {}
        self._drift_sources: OrderedDict[int, None] = OrderedDict()
        self.indexes = {
            e: ResidencyIndex(
                e, max_blocks=max_blocks, salts=self.salts, reuse_reports=reuse_reports
            )
            for e in engines
        }
        self.drift_blocks = drift_blocks
        self.block_size = block_size
        self.max_sessions = max_sessions
        self.clock = clock  # wall time, for the indexes' residency
        self.wait_clock = wait_clock  # the deadlines of submit's wait_s and of TRACE_WAIT_S
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self.counts = {
            "sessions_forgotten": 0,
            "attributed": 0,
            "incomplete": 0,
            "callback_errors": 0,
            "reuse_reports": 0,
            "traced": 0,
            "trace_incomplete": 0,
            "trace_errors": 0,
        }
        self.class_tokens = dict.fromkeys(CLASSES, 0)

    # ------------------------------------------------------------ events
    def apply(self, engine: str, batch: Batch) -> None:
        idx = self.indexes[engine]
        ts = batch.ts
        removals: list[list[int]] = []

        def settle() -> None:
            for r in removals:
                idx.remove(r, ts)
            removals.clear()

        for ev in batch.events:
            kind = ev[0]
            if kind == REMOVED:
                removals.append(ev[1])
            elif kind == STORED:
                _, hashes, parent, tokens, bsize, salt, session = ev
                if session is not None and session in self._held:
                    self._resolve_held(session, follows=parent)
                if idx.is_reuse_report(parent, hashes) or self._is_report(
                    idx, parent, hashes, session
                ):
                    settle()
                    if session is not None and len(hashes) == 1 and not idx.reuse_reports:
                        # one resident block, parent-less: the report of a one-block hit, or a
                        # one-block prompt recomputing its only block (a second copy): the
                        # session's next store, or its cached tokens, tell which
                        self._held[session] = (engine, hashes, tokens, bsize, salt, ts)
                        continue
                    idx.reused(hashes, ts)
                    if session is not None:
                        self._note_report(idx, session, hashes, bsize)
                    continue
                sb = idx.read_store(hashes, parent, tokens, bsize, salt)
                if session is not None:
                    self._judge(idx, sb, session, bsize, ts, parent)
                settle()
                idx.store(sb, parent, bsize, ts)
                if not self.block_size:
                    self.block_size = bsize
            elif kind == CLEARED:
                settle()
                idx.clear(ts)
        settle()
        if self._pending or self._tracing:
            self.resolve_pending()

    def _is_report(
        self, idx: ResidencyIndex, parent: int | None, hashes: list[int], session: str | None
    ) -> bool:
        """vLLM's ``kv_cache_report_mode: "full"`` reports the blocks a request reused as a
        parent-less store of resident blocks, before anything the request stores. Told apart
        from a store by the session: it is the session's first event (its own store, when it
        has one, follows with the report's last block as parent)."""
        if session is None or parent is not None or not hashes:
            return False
        rec = self._sessions.get(session)
        if rec is not None and rec.reported != hashes[0]:
            return False  # not its first event, nor the same report again (a retried step)
        return all(idx.has(h) for h in hashes)

    def _note_report(self, idx: ResidencyIndex, session: str, hashes: list[int], bs: int) -> None:
        """A session's reuse report: its hit prefix, as the engine named it."""
        with self._cond:
            rec = self._sessions.get(session)
            if rec is None:
                if len(self._sessions) >= self.max_sessions:
                    self._sessions.popitem(last=False)
                    self.counts["sessions_forgotten"] += 1
                rec = self._sessions[session] = _Session(idx.name, bs)
        self.counts["reuse_reports"] += 1
        rec.reported = hashes[0]
        if rec.chain is None and self.trace_sink is not None:
            c, d, salt = idx.rows_of(hashes)
            rec.chain = _Chain(list(hashes), c, d, len(c) == len(hashes))
            rec.salt = salt

    def _resolve_held(
        self, session: str, follows: int | None = None, cached_blocks: int | None = None
    ) -> None:
        """Decide a held one-block event: a report when the session's next store continues
        from its block or the request's cached tokens cover it; otherwise a store."""
        engine, hashes, tokens, bsize, salt, ts = self._held.pop(session)
        idx = self.indexes[engine]
        report = follows == hashes[-1] if cached_blocks is None else cached_blocks >= 1
        if report and all(idx.has(h) for h in hashes):
            idx.reused(hashes, ts)
            self._note_report(idx, session, hashes, bsize)
            return
        sb = idx.read_store(hashes, None, tokens, bsize, salt)
        self._judge(idx, sb, session, bsize, ts, None)
        idx.store(sb, None, bsize, ts)

    def engine_restarted(self, engine: str) -> None:
        self.indexes[engine].clear(self.clock())

    def _judge(
        self,
        me: ResidencyIndex,
        sb: StoreBlocks,
        session: str,
        bsize: int,
        ts: float,
        parent: int | None = None,
    ) -> None:
        engines = list(self.indexes.values())
        others = [e for e in engines if e is not me]
        with self._cond:
            rec = self._sessions.get(session)
            if rec is None:
                if len(self._sessions) >= self.max_sessions:
                    self._sessions.popitem(last=False)
                    self.counts["sessions_forgotten"] += 1
                rec = self._sessions[session] = _Session(me.name, bsize)
                rec.salt = sb.salt
                if self.trace_sink is not None:
                    if parent is None:
                        rec.chain = _Chain([], [], [], True)
                    else:
                        ph, pc, pd = me.prefix_of(parent)
                        rec.chain = _Chain(ph, pc, pd, bool(ph))
        codes = rec.codes
        unseen = rec.unseen
        chain = rec.chain
        seen = [e.seen_table for e in engines]
        drift = self.drift_blocks
        for h, c, k, d in zip(sb.hashes, sb.contents, sb.seen_keys, sb.digests, strict=True):
            if len(codes) >= _MAX_BLOCKS_PER_SESSION:
                break
            code = _COLD
            if any(o.has(h) for o in others):
                code = _ELSEWHERE
            else:
                latest = None
                for e in engines:
                    t = e.removed_at(h)
                    if t is not None and (latest is None or t > latest):
                        latest = t
                if latest is not None and not me.has(h):
                    code = _EVICTED
                    rec.ages.append((len(codes), max(0.0, ts - latest)))
                elif any(e.holds_content_elsewhere(c, h) for e in engines):
                    code = _ISOLATED
            new = False
            if k >= 0:
                for st in seen:
                    if st.find(k) >= 0:
                        if code == _COLD and 1 <= unseen <= drift:
                            code = _DRIFTED
                        break
                else:
                    unseen += 1
                    new = True
            codes.append(code)
            if chain is not None:
                chain.h.append(h)
                chain.c.append(c)
                chain.d.append(d)
                chain.unseen.append(new)
        rec.unseen = unseen
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------ requests
    def attribute(
        self,
        session: str | None,
        prompt_tokens: int,
        cached_tokens: int,
        wait_s: float = 0.0,
        block_size: int | None = None,
    ) -> Attribution:
        """Split ``prompt_tokens - cached_tokens`` into classes; waits up to ``wait_s``
        for the request's store event when it has not been applied yet."""
        prompt = max(0, int(prompt_tokens))
        cached = min(max(0, int(cached_tokens)), prompt)
        rec = None
        bs = block_size or self.block_size
        need = self._need(prompt, cached, bs)
        if session is not None:
            with self._cond:

                def ready() -> bool:
                    r = self._sessions.get(session)
                    b = block_size or (r.block_size if r is not None else 0) or self.block_size
                    n = self._need(prompt, cached, b)
                    return b > 0 and (n == 0 or (r is not None and len(r.codes) >= n))

                if wait_s > 0 and not ready():
                    self._cond.wait_for(ready, timeout=wait_s)
                rec = self._sessions.get(session)
            if rec is not None:
                bs = block_size or rec.block_size
                need = self._need(prompt, cached, bs)
        return self._split(rec, prompt, cached, need, bs)

    @staticmethod
    def _need(prompt: int, cached: int, bs: int) -> int:
        if bs <= 0 or prompt <= 0:
            return 0
        return max(0, (prompt - 1) // bs - cached // bs)

    def _split(
        self, rec: _Session | None, prompt: int, cached: int, need: int, bs: int
    ) -> Attribution:
        out = dict.fromkeys(CLASSES, 0)
        missed = prompt - cached
        if bs <= 0:
            out["unknown"] = missed
            self._count(out, False)
            return Attribution(out, None, [], False)
        have = 0
        ages: list[float] = []
        if rec is not None:
            have = min(need, len(rec.codes))
            codes = bytes(rec.codes[:have])
            for k in range(_COLD + 1):
                out[CLASSES[k]] = codes.count(k) * bs
            if rec.ages:
                ages = [a for i, a in rec.ages if i < have]
        out["unknown"] = (need - have) * bs
        out["partial"] = missed - need * bs
        if out["partial"] < 0:  # cached tokens not a whole number of blocks (not vLLM)
            out["unknown"] += out["partial"]
            out["partial"] = 0
        complete = have == need
        self._count(out, complete)
        return Attribution(out, rec.engine if rec is not None else None, ages, complete)

    def _count(self, out: dict[str, int], complete: bool) -> None:
        self.counts["attributed"] += 1
        if not complete:
            self.counts["incomplete"] += 1
        for k, v in out.items():
            self.class_tokens[k] += v

    def forget(self, session: str) -> None:
        with self._cond:
            self._sessions.pop(session, None)

    def submit(
        self,
        session: str | None,
        prompt_tokens: int,
        cached_tokens: int,
        callback: Callable[[Attribution], None],
        wait_s: float = 2.0,
        trace: dict[str, Any] | None = None,
    ) -> None:
        """Attribute later, without blocking: ``callback`` runs on the subscriber's
        thread once the request's events are in (or after ``wait_s``). ``trace``: the
        request's arrival (``ts``), end (``t_end``), ``tenant``, ``output`` tokens and ``ttft``
        — with a ``trace_sink``, its block chain is handed on too."""
        if session is None:
            self._call(callback, self.attribute(None, prompt_tokens, cached_tokens))
            return
        with self._cond:
            self._pending.append(
                _Pending(
                    session,
                    prompt_tokens,
                    cached_tokens,
                    self.wait_clock() + wait_s,
                    callback,
                    trace if self.trace_sink is not None else None,
                )
            )

    def resolve_pending(self) -> None:
        if self._tracing:
            self._flush_traces()
        with self._cond:
            if not self._pending:
                return
            now = self.wait_clock()
            keep, due = [], []
            for p in self._pending:
                r = self._sessions.get(p.session)
                bs = r.block_size if r is not None else self.block_size
                n = self._need(p.prompt, p.cached, bs)
                if (
                    bs > 0 and (n == 0 or (r is not None and len(r.codes) >= n))
                ) or now >= p.deadline:
                    due.append(p)
                else:
                    keep.append(p)
            self._pending = keep
        for p in due:
            if p.session in self._held:
                bs = self._held[p.session][3]
                self._resolve_held(p.session, cached_blocks=p.cached // bs if bs > 0 else 0)
            a = self.attribute(p.session, p.prompt, p.cached)
            if p.trace is not None:
                meta = {**p.trace, "prompt": p.prompt, "cached": p.cached}
                self._tracing[p.session] = (meta, now + TRACE_WAIT_S)
            else:
                self.forget(p.session)
            self._call(p.callback, a)

    # ------------------------------------------------------------ block trace
    def _flush_traces(self, force: bool = False) -> None:
        """Hand on the traced requests whose output blocks are in, or whose wait is over."""
        now = self.wait_clock()
        for session, (meta, deadline) in list(self._tracing.items()):
            rec = self._sessions.get(session)
            bs = rec.block_size if rec is not None else self.block_size
            if rec is None or rec.chain is None or bs <= 0:
                # a full hit is judged on submission; its reuse report may still be on the way
                if now < deadline and not force:
                    continue
                del self._tracing[session]
                self.counts["trace_incomplete"] += 1
                self.forget(session)
                continue
            want = (meta["prompt"] + max(int(meta.get("output", 0)) - 1, 0)) // bs
            if len(rec.chain.h) < want and now < deadline and not force:
                continue
            del self._tracing[session]
            try:
                row = self._trace_row(rec, meta)
            except Exception:
                self.counts["trace_errors"] += 1
                row = None
            self.forget(session)
            if row is None:
                continue
            try:
                assert self.trace_sink is not None
                self.trace_sink(row)
                self.counts["traced"] += 1
            except Exception:
                self.counts["trace_errors"] += 1

    def _prf(self, x: int) -> int:
        d = hashlib.blake2b(x.to_bytes(8, "little"), key=self.trace_key, digest_size=8).digest()
        return (int.from_bytes(d, "little") >> 1) or 1

    def _trace_row(self, rec: _Session, meta: dict[str, Any]) -> TraceRow | None:
        ch = rec.chain
        assert ch is not None
        bs = rec.block_size
        prompt, cached = int(meta["prompt"]), int(meta["cached"])
        if not ch.ok or ch.hits != cached // bs:
            # the hit prefix could not be walked (a block of it left the index first)
            self.counts["trace_incomplete"] += 1
            return None
        n = len(ch.h)
        need = max(0, (prompt - 1) // bs - ch.hits)  # the judged blocks, as attribute() says
        cls = bytearray(n)
        codes = rec.codes
        for j in range(ch.hits, n):
            i = j - ch.hits
            cls[j] = codes[i] + 1 if i < need and i < len(codes) else _UNJUDGED
        # drift: the unseen blocks before a drifted one changed every hash after them
        src = [h in self._drift_sources for h in ch.h]
        for j in range(ch.hits, n):
            if cls[j] == _DRIFTED + 1:
                for i in range(ch.hits, j):
                    if ch.unseen[i]:
                        src[i] = True
        stable = list(ch.h)
        if any(src):
            first = src.index(True)
            prev = ch.h[first - 1] if first else hash(("root", rec.salt)) & MASK64
            for j in range(first, n):
                x = hash(("drift", rec.salt, j)) if src[j] else hash((rec.salt, j, ch.d[j]))
                prev = hash((prev, x & MASK64)) & MASK64
                stable[j] = prev
            for j in range(n):
                if src[j] and ch.h[j] not in self._drift_sources:
                    self._drift_sources[ch.h[j]] = None
                    if len(self._drift_sources) > _MAX_DRIFT_SOURCES:
                        self._drift_sources.popitem(last=False)
        prf = self._prf
        h = [prf(x) for x in ch.h]
        return TraceRow(
            float(meta.get("ts", 0.0)),
            float(meta.get("t_end", float("nan"))),
            meta.get("tenant"),
            rec.engine,
            self.salts.label(rec.salt),
            prompt,
            int(meta.get("output", 0)),
            cached,
            float(meta.get("ttft", float("nan"))),
            bs,
            h,
            [prf(x) for x in ch.c],
            [] if stable == ch.h else [prf(x) for x in stable],
            bytes(cls),
            self.capacity.get(rec.engine, 0),
        )

    def _call(self, cb: Callable[[Attribution], None], a: Attribution) -> None:
        try:
            cb(a)
        except Exception:
            self.counts["callback_errors"] += 1
