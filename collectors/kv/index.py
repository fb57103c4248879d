"""A per-engine residency index of KV-cache blocks, built from the engine's events.

What it keeps, per engine, in flat arrays (``array.array``; open addressing with
linear probing and backward-shift deletion, no Python object per block):

* **resident blocks**: block hash -> parent hash, salt, position in its chain
  (depth), stored at, last reused, a content key (the chain of the blocks' token
  digests *without* the salt), and the number of copies.
  Residency is a count: a fully cached prompt whose length is a multiple of the
  block size recomputes its last block and stores a second copy under the same
  hash, and each copy is removed by its own ``BlockRemoved``.
* **resident content**: content key -> copies under any salt (a block resident
  under another tenant's salt has the same content key and another hash).
* **removed blocks**: hash -> removed at, the last ``max_removed`` removals
  (first in, first out).
* **seen blocks**: (salt, position, token digest) of the last ``max_seen`` blocks
  stored (first in, first out): what drift detection asks ("were these tokens
  stored at this position before?").

The salt of a chain is in the first block's ``extra_keys`` of a store that
starts it; later blocks inherit it through their parent. Every table has a hard
row limit; a row that does not fit is dropped and counted per table
(``dropped``). Nothing here raises on bad input: an unknown parent or a removal
of a block never seen stored is counted.

Salts are kept as small ids (:class:`Salts`, shared by the engines of one
watcher); their names leave the process only as labels chosen by the caller
(a tenant name the gateway set) or a short digest.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MASK64", "NO_DEPTH", "ResidencyIndex", "Salts", "StoreBlocks", "bytes_per_block"]

MASK64 = (1 << 64) - 1
NO_DEPTH = 0xFFFF  # a block whose chain position is unknown (its parent was never seen)
_LOAD = 0.7


class _Table:
    """u64 keys -> rows of fixed-width columns; at most ``max_rows`` rows."""

    def __init__(self, max_rows: int, columns: Sequence[str]) -> None:
        self.max_rows = max(1, int(max_rows))
        cap = max(8, int(self.max_rows / _LOAD) + 1)
        self.cap = cap
        self.keys = array("Q", bytes(8 * cap))
        self.used = bytearray(cap)
        self.cols: list[array[Any]] = [array(tc, bytes(array(tc).itemsize * cap)) for tc in columns]
        self.n = 0

    def nbytes(self) -> int:
        return (
            self.keys.itemsize * self.cap + self.cap + sum(c.itemsize * self.cap for c in self.cols)
        )

    def find(self, key: int) -> int:
        cap, used, keys = self.cap, self.used, self.keys
        i = key % cap
        while used[i]:
            if keys[i] == key:
                return i
            i += 1
            if i == cap:
                i = 0
        return -1

    def probe(self, key: int) -> int:
        """The slot of ``key`` (>= 0), or ``-1 - slot`` of the empty slot it would take."""
        cap, used, keys = self.cap, self.used, self.keys
        i = key % cap
        while used[i]:
            if keys[i] == key:
                return i
            i += 1
            if i == cap:
                i = 0
        return -1 - i

    def take(self, key: int, i: int) -> int:
        """Put ``key`` into the empty slot ``i`` found by :meth:`probe`; -1 when full."""
        if self.n >= self.max_rows:
            return -1
        self.used[i] = 1
        self.keys[i] = key
        self.n += 1
        return i

    def add(self, key: int) -> int:
        """A new row for ``key`` (not present); -1 when the table is full."""
        if self.n >= self.max_rows:
            return -1
        cap, used = self.cap, self.used
        i = key % cap
        while used[i]:
            i += 1
            if i == cap:
                i = 0
        used[i] = 1
        self.keys[i] = key
        self.n += 1
        return i

    def delete(self, i: int) -> None:
        cap, used, keys, cols = self.cap, self.used, self.keys, self.cols
        used[i] = 0
        self.n -= 1
        j = i
        while True:
            j += 1
            if j == cap:
                j = 0
            if not used[j]:
                return
            k = keys[j] % cap
            # the entry at j stays when its home k lies cyclically in (i, j]
            if (k > i and k <= j) if i <= j else (k > i or k <= j):
                continue
            keys[i] = keys[j]
            used[i] = 1
            for c in cols:
                c[i] = c[j]
            used[j] = 0
            i = j

    def clear(self) -> None:
        self.used = bytearray(self.cap)
        self.n = 0

    def live(self) -> list[int]:
        used = self.used
        return [i for i in range(self.cap) if used[i]]


class _Fifo:
    """A bounded key -> float map that forgets its oldest entry when full."""

    def __init__(self, max_rows: int) -> None:
        self.t = _Table(max_rows, ["d", "I"])
        self._ring = array("Q", bytes(8 * self.t.max_rows))
        self._head = 0
        self._wrapped = False  # every ring slot has been written once
        self.forgotten = 0

    def nbytes(self) -> int:
        return self.t.nbytes() + self._ring.itemsize * len(self._ring)

    def get(self, key: int) -> float | None:
        s = self.t.find(key)
        return None if s < 0 else self.t.cols[0][s]

    def put(self, key: int, value: float) -> None:
        """Set ``key``'s value; a new key takes the oldest ring slot, forgetting the
        entry that held it (first in, first out by first put)."""
        t = self.t
        cap, used, keys = t.cap, t.used, t.keys
        s = key % cap  # t.probe(key), inlined
        while used[s]:
            if keys[s] == key:
                t.cols[0][s] = value
                return
            s += 1
            if s == cap:
                s = 0
        s = -1 - s
        val_col, pos_col = t.cols
        ring, h = self._ring, self._head
        o = t.find(ring[h]) if self._wrapped else -1
        if o >= 0 and pos_col[o] == h:
            t.delete(o)
            self.forgotten += 1
            s = t.add(key)  # the deletion may have moved the empty slot
        else:
            s = t.take(key, -1 - s)
        val_col[s] = value
        pos_col[s] = h
        ring[h] = key
        h += 1
        if h == len(ring):
            h = 0
            self._wrapped = True
        self._head = h

    def clear(self) -> None:
        self.t.clear()
        self._head = 0
        self._wrapped = False


class Salts:
    """Salt strings as small ids (0: no salt), with labels safe to export."""

    def __init__(self, max_salts: int = 4096) -> None:
        self.max_salts = max_salts
        self._ids: dict[str, int] = {}
        self._labels: list[str] = ["unsalted"]  # exported as a label: plain characters only
        self.overflow = 0

    def id(self, salt: str | None) -> int:
        if not salt:
            return 0
        i = self._ids.get(salt)
        if i is None:
            if len(self._labels) > self.max_salts:
                self.overflow += 1
                return len(self._labels)  # one shared "other" id past the limit
            i = len(self._labels)
            self._ids[salt] = i
            self._labels.append("salt:" + hashlib.sha256(salt.encode()).hexdigest()[:8])
        return i

    def name(self, label: str, salt: str) -> None:
        """Export ``salt`` as ``label`` (e.g. the tenant a gateway salted with)."""
        self._labels[self.id(salt)] = label

    def label(self, i: int) -> str:
        return self._labels[i] if i < len(self._labels) else "(other)"


@dataclass
class StoreBlocks:
    """One BlockStored event, read against the index (before it is applied)."""

    hashes: list[int]
    digests: list[int]
    contents: list[int]
    depth0: int  # position of the first block in its chain (NO_DEPTH: unknown)
    salt: int
    partial: int  # trailing tokens that do not fill a block (not indexed)
    seen_keys: list[int]  # drift-table key per block (-1: position unknown)


@dataclass
class _Counts:
    stores: int = 0
    reuses: int = 0
    evictions: int = 0


# main table columns
_PARENT, _SALT, _COPIES, _DEPTH, _STORED, _REUSED, _CONTENT, _DIGEST = range(8)


class ResidencyIndex:
    """The blocks one engine holds, from its events; see the module docstring.

    ``max_blocks`` bounds resident blocks (and resident content keys),
    ``max_removed`` the memory of removed blocks, ``max_seen`` the drift table.
    Times are the engine's batch timestamps (seconds)."""

    def __init__(
        self,
        name: str = "engine",
        max_blocks: int = 1_000_000,
        max_removed: int | None = None,
        max_seen: int | None = None,
        salts: Salts | None = None,
        reuse_reports: bool = False,
    ) -> None:
        self.name = name
        self.salts = salts or Salts()
        # A parent-less store of blocks that are all resident is vLLM's "full" report of
        # reused blocks when requests ask for it (kv_cache_report_mode); otherwise it is a
        # second copy (see docs/kv-events.md). Off: every store is a store.
        self.reuse_reports = reuse_reports
        self.max_blocks = max_blocks
        self.main = _Table(max_blocks, ["Q", "H", "B", "H", "f", "f", "Q", "Q"])
        self.content = _Table(max_blocks, ["I"])
        n_removed = max_removed if max_removed is not None else max(1, max_blocks // 4)
        self.removed = _Fifo(n_removed)
        self._seen = _Fifo(max_seen if max_seen is not None else max_blocks)
        self.block_size = 0
        self.counts: dict[int, _Counts] = {}
        self._dropped = {"resident": 0, "content": 0}
        self.faults = {
            "unknown_parent": 0,
            "removed_unknown": 0,
            "partial_blocks": 0,
            "cleared": 0,
            "reuse_reports": 0,
            "second_copies": 0,
        }
        self.first_reuse_ts: float | None = None
        self.epoch = 0.0  # stored-at times are float32 offsets from the first event

    # ------------------------------------------------------------ lookups
    def copies(self, h: int) -> int:
        s = self.main.find(h)
        return 0 if s < 0 else self.main.cols[_COPIES][s]

    @property
    def dropped(self) -> dict[str, int]:
        """Rows that did not fit, per table (removed and seen: the oldest forgotten)."""
        return {**self._dropped, "removed": self.removed.forgotten, "seen": self._seen.forgotten}

    def has(self, h: int) -> bool:
        """The block is resident."""
        return self.main.find(h) >= 0

    def holds_content_elsewhere(self, c: int, h: int) -> bool:
        """More copies of content ``c`` are resident than of block ``h`` itself: the same
        tokens after the same tokens are held under another salt."""
        cs = self.content.find(c)
        if cs < 0:
            return False
        ms = self.main.find(h)
        return bool(self.content.cols[0][cs] > (self.main.cols[_COPIES][ms] if ms >= 0 else 0))

    def rows_of(self, hashes: list[int]) -> tuple[list[int], list[int], int]:
        """Content keys and token digests of resident blocks, and the salt id of the first."""
        cols = self.main.cols
        cs: list[int] = []
        ds: list[int] = []
        salt = 0
        for k, h in enumerate(hashes):
            s = self.main.find(h)
            if s < 0:
                break
            if k == 0:
                salt = cols[_SALT][s]
            cs.append(cols[_CONTENT][s])
            ds.append(cols[_DIGEST][s])
        return cs, ds, salt

    def prefix_of(self, parent: int, limit: int = 4096) -> tuple[list[int], list[int], list[int]]:
        """The resident chain that ends at block ``parent``, root first: (hashes, content keys,
        token digests). Empty when a block of it is not resident (or the chain is longer than
        ``limit``)."""
        cols = self.main.cols
        par, dep, con, dig = cols[_PARENT], cols[_DEPTH], cols[_CONTENT], cols[_DIGEST]
        hs: list[int] = []
        cs: list[int] = []
        ds: list[int] = []
        h = parent
        while len(hs) <= limit:
            s = self.main.find(h)
            if s < 0:
                return [], [], []
            hs.append(h)
            cs.append(con[s])
            ds.append(dig[s])
            if dep[s] == 0:
                return hs[::-1], cs[::-1], ds[::-1]
            if dep[s] == NO_DEPTH:
                return [], [], []
            h = par[s]
        return [], [], []

    def removed_at(self, h: int) -> float | None:
        return self.removed.get(h)

    def content_copies(self, c: int) -> int:
        s = self.content.find(c)
        return 0 if s < 0 else self.content.cols[0][s]

    @property
    def seen_table(self) -> _Table:
        """(salt, position, token digest) keys, as ``hash((salt, depth, digest)) & MASK64``."""
        return self._seen.t

    def seen(self, salt: int, depth: int, digest: int) -> bool:
        return self._seen.t.find(hash((salt, depth, digest)) & MASK64) >= 0

    def resident_blocks(self) -> int:
        return self.main.n

    def resident_copies(self) -> int:
        cp = self.main.cols[_COPIES]
        return sum(cp[i] for i in self.main.live())

    def nbytes(self) -> int:
        return (
            self.main.nbytes() + self.content.nbytes() + self.removed.nbytes() + self._seen.nbytes()
        )

    def row(self, h: int) -> dict[str, Any] | None:
        """One resident block as a dict (for tests and debugging)."""
        s = self.main.find(h)
        if s < 0:
            return None
        c = self.main.cols
        return {
            "parent": c[_PARENT][s],
            "salt": self.salts.label(c[_SALT][s]),
            "copies": c[_COPIES][s],
            "depth": c[_DEPTH][s],
            "stored_at": self.epoch + c[_STORED][s],
            "last_reused": (self.epoch + c[_REUSED][s]) if c[_REUSED][s] else None,
        }

    # ------------------------------------------------------------ events
    def read_store(
        self,
        hashes: list[int],
        parent: int | None,
        tokens: list[int],
        block_size: int,
        salt: str | None,
    ) -> StoreBlocks:
        """Digests, content keys and position of a store's blocks (nothing changes)."""
        cols = self.main.cols
        if parent is None:
            depth, cparent, sid = 0, 0, self.salts.id(salt)
        else:
            ps = self.main.find(parent)
            if ps < 0:
                depth, cparent, sid = NO_DEPTH, parent, self.salts.id(salt)
            else:
                depth, cparent = cols[_DEPTH][ps], cols[_CONTENT][ps]
                depth = NO_DEPTH if depth == NO_DEPTH else depth + 1
                sid = self.salts.id(salt) if salt else cols[_SALT][ps]
        digests, contents, seen_keys = [], [], []
        n_full = min(len(hashes), len(tokens) // block_size) if block_size > 0 else 0
        depth = min(depth, NO_DEPTH)
        pos = depth
        for k in range(n_full):
            d = hash(tuple(tokens[k * block_size : (k + 1) * block_size])) & MASK64
            cparent = hash((cparent, d)) & MASK64
            digests.append(d)
            contents.append(cparent)
            if pos < NO_DEPTH - 1:
                seen_keys.append(hash((sid, pos, d)) & MASK64)
                pos += 1
            else:
                seen_keys.append(-1)  # no position: never in the drift table
        return StoreBlocks(
            hashes[:n_full], digests, contents, depth, sid, len(hashes) - n_full, seen_keys
        )

    def is_reuse_report(self, parent: int | None, hashes: list[int]) -> bool:
        if not self.reuse_reports or parent is not None or not hashes:
            return False
        return all(self.main.find(h) >= 0 for h in hashes)

    def reused(self, hashes: list[int], ts: float) -> None:
        self.faults["reuse_reports"] += 1
        cols = self.main.cols
        for h in hashes:
            s = self.main.find(h)
            if s >= 0:
                cols[_REUSED][s] = ts - self.epoch
                self._count(cols[_SALT][s]).reuses += 1

    def store(self, sb: StoreBlocks, parent: int | None, block_size: int, ts: float) -> None:
        if not self.epoch:
            self.epoch = ts
        if block_size > 0:
            self.block_size = block_size
        if parent is not None and sb.depth0 == NO_DEPTH:
            self.faults["unknown_parent"] += 1
        if sb.partial:
            self.faults["partial_blocks"] += sb.partial
        main, content = self.main, self.content
        c_par, c_salt, c_cop, c_dep, c_sto, c_reu, c_con, c_dig = main.cols
        counts = content.cols[0]
        m_used, m_keys, m_cap, m_max = main.used, main.keys, main.cap, main.max_rows
        k_used, k_keys, k_cap, k_max = content.used, content.keys, content.cap, content.max_rows
        put = self._seen.put
        par = 0 if parent is None else parent
        depth = sb.depth0
        sid = sb.salt
        t = ts - self.epoch
        for h, c, k, d in zip(sb.hashes, sb.contents, sb.seen_keys, sb.digests, strict=True):
            s = h % m_cap  # open addressing, inlined: find h or its empty slot
            while m_used[s] and m_keys[s] != h:
                s += 1
                if s == m_cap:
                    s = 0
            if m_used[s]:
                if c_cop[s] < 255:
                    c_cop[s] += 1
                self.faults["second_copies"] += 1
            elif main.n >= m_max:
                self._dropped["resident"] += 1
                s = -1
            else:
                m_used[s] = 1
                m_keys[s] = h
                main.n += 1
                c_par[s] = par
                c_salt[s] = sid
                c_cop[s] = 1
                c_dep[s] = depth
                c_sto[s] = t
                c_reu[s] = 0.0
                c_con[s] = c
                c_dig[s] = d
            if s >= 0:
                cs = c % k_cap
                while k_used[cs] and k_keys[cs] != c:
                    cs += 1
                    if cs == k_cap:
                        cs = 0
                if k_used[cs]:
                    counts[cs] += 1
                elif content.n >= k_max:
                    self._dropped["content"] += 1
                else:
                    k_used[cs] = 1
                    k_keys[cs] = c
                    content.n += 1
                    counts[cs] = 1
            if k >= 0:
                put(k, t)
            if depth < NO_DEPTH - 1:
                depth += 1
            par = h
        self._count(sid).stores += len(sb.hashes)

    def remove(self, hashes: list[int], ts: float) -> None:
        main, content = self.main, self.content
        find, cfind, put = main.find, content.find, self.removed.put
        c_salt, c_cop, c_con = main.cols[_SALT], main.cols[_COPIES], main.cols[_CONTENT]
        counts = content.cols[0]
        evicted: dict[int, int] = {}
        for h in hashes:
            s = find(h)
            if s < 0:
                self.faults["removed_unknown"] += 1
                continue
            sid = c_salt[s]
            evicted[sid] = evicted.get(sid, 0) + 1
            cs = cfind(c_con[s])
            if cs >= 0:
                if counts[cs] <= 1:
                    content.delete(cs)
                else:
                    counts[cs] -= 1
            if c_cop[s] > 1:
                c_cop[s] -= 1
                continue
            main.delete(s)
            put(h, ts)
        for sid, n in evicted.items():
            self._count(sid).evictions += n

    def clear(self, ts: float) -> None:
        """AllBlocksCleared, or the engine restarted: every resident block is gone."""
        self.faults["cleared"] += 1
        keys = self.main.keys
        for s in self.main.live():
            self.removed.put(keys[s], ts)
        self.main.clear()
        self.content.clear()

    def _count(self, sid: int) -> _Counts:
        c = self.counts.get(sid)
        if c is None:
            c = self.counts[sid] = _Counts()
        return c

    def per_salt(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        resident: dict[int, int] = {}
        salt_col, cp = self.main.cols[_SALT], self.main.cols[_COPIES]
        for s in self.main.live():
            resident[salt_col[s]] = resident.get(salt_col[s], 0) + cp[s]
        for sid in set(self.counts) | set(resident):
            c = self.counts.get(sid, _Counts())
            row = out.setdefault(
                self.salts.label(sid), {"stores": 0, "reuses": 0, "evictions": 0, "resident": 0}
            )
            row["stores"] += c.stores
            row["reuses"] += c.reuses
            row["evictions"] += c.evictions
            row["resident"] += resident.get(sid, 0)
        return out


def bytes_per_block(max_blocks: int) -> float:
    """What the index's arrays take per resident block when it is full."""
    return ResidencyIndex(max_blocks=max_blocks).nbytes() / max_blocks
