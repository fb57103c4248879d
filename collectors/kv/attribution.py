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

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from warmscope.model.records import MISS_CLASSES as CLASSES

from .decode import CLEARED, REMOVED, STORED, Batch
from .index import _COPIES, ResidencyIndex, Salts, StoreBlocks

__all__ = ["CLASSES", "Attribution", "KVState"]

_ELSEWHERE, _EVICTED, _ISOLATED, _DRIFTED, _COLD = range(5)
_MAX_BLOCKS_PER_SESSION = 4096


@dataclass
class Attribution:
    """One request's missed tokens by class (they add up to prompt - cached)."""

    classes: dict[str, int]
    engine: str | None = None
    evicted_age_s: list[float] = field(default_factory=list)  # per evicted block
    complete: bool = True  # False: some missed blocks had no events (``unknown``)


class _Session:
    __slots__ = ("engine", "codes", "ages", "unseen", "block_size")

    def __init__(self, engine: str, block_size: int) -> None:
        self.engine = engine
        self.codes = bytearray()
        self.ages: list[tuple[int, float]] = []  # (block number in codes, seconds since removal)
        self.unseen = 0
        self.block_size = block_size


@dataclass
class _Pending:
    session: str
    prompt: int
    cached: int
    deadline: float
    callback: Callable[[Attribution], None]


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
    ) -> None:
        self.salts = Salts()
        self.indexes = {
            e: ResidencyIndex(
                e, max_blocks=max_blocks, salts=self.salts, reuse_reports=reuse_reports
            )
            for e in engines
        }
        self.drift_blocks = drift_blocks
        self.block_size = block_size
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self.counts = {
            "sessions_forgotten": 0,
            "attributed": 0,
            "incomplete": 0,
            "callback_errors": 0,
        }
        self.class_tokens = dict.fromkeys(CLASSES, 0)

    # ------------------------------------------------------------ events
    def apply(self, engine: str, batch: Batch) -> None:
        idx = self.indexes[engine]
        ts = batch.ts
        removals: list[list[int]] = []
        for ev in batch.events:
            kind = ev[0]
            if kind == REMOVED:
                removals.append(ev[1])
            elif kind == STORED:
                _, hashes, parent, tokens, bsize, salt, session = ev
                if idx.is_reuse_report(parent, hashes):
                    for r in removals:
                        idx.remove(r, ts)
                    removals.clear()
                    idx.reused(hashes, ts)
                    continue
                sb = idx.read_store(hashes, parent, tokens, bsize, salt)
                if session is not None:
                    self._judge(idx, sb, session, bsize, ts)
                for r in removals:
                    idx.remove(r, ts)
                removals.clear()
                idx.store(sb, parent, bsize, ts)
                if not self.block_size:
                    self.block_size = bsize
            elif kind == CLEARED:
                for r in removals:
                    idx.remove(r, ts)
                removals.clear()
                idx.clear(ts)
        for r in removals:
            idx.remove(r, ts)
        if self._pending:
            self.resolve_pending()

    def engine_restarted(self, engine: str) -> None:
        self.indexes[engine].clear(self.clock())

    def _judge(
        self, me: ResidencyIndex, sb: StoreBlocks, session: str, bsize: int, ts: float
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
        codes = rec.codes
        unseen = rec.unseen
        other_main = [e.main for e in others]
        my_main = me.main
        removed = [e.removed for e in engines]
        content = [(e.content, e.main) for e in engines]
        seen = [e.seen_table for e in engines]
        drift = self.drift_blocks
        for h, c, k in zip(sb.hashes, sb.contents, sb.seen_keys, strict=True):
            if len(codes) >= _MAX_BLOCKS_PER_SESSION:
                break
            code = _COLD
            for m in other_main:
                if m.find(h) >= 0:
                    code = _ELSEWHERE
                    break
            if code == _COLD:
                latest = None
                for r in removed:
                    t = r.get(h)
                    if t is not None and (latest is None or t > latest):
                        latest = t
                if latest is not None and my_main.find(h) < 0:
                    code = _EVICTED
                    rec.ages.append((len(codes), max(0.0, ts - latest)))
                else:
                    for ct, m in content:
                        cs = ct.find(c)
                        if cs >= 0:
                            ms = m.find(h)
                            if ct.cols[0][cs] > (m.cols[_COPIES][ms] if ms >= 0 else 0):
                                code = _ISOLATED
                                break
            if k >= 0:
                for st in seen:
                    if st.find(k) >= 0:
                        if code == _COLD and 1 <= unseen <= drift:
                            code = _DRIFTED
                        break
                else:
                    unseen += 1
            codes.append(code)
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
    ) -> None:
        """Attribute later, without blocking: ``callback`` runs on the subscriber's
        thread once the request's events are in (or after ``wait_s``)."""
        if session is None:
            self._call(callback, self.attribute(None, prompt_tokens, cached_tokens))
            return
        with self._cond:
            self._pending.append(
                _Pending(session, prompt_tokens, cached_tokens, time.monotonic() + wait_s, callback)
            )

    def resolve_pending(self) -> None:
        with self._cond:
            if not self._pending:
                return
            now = time.monotonic()
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
            a = self.attribute(p.session, p.prompt, p.cached)
            self.forget(p.session)
            self._call(p.callback, a)

    def _call(self, cb: Callable[[Attribution], None], a: Attribution) -> None:
        try:
            cb(a)
        except Exception:
            self.counts["callback_errors"] += 1
