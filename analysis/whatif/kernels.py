"""The replay's loops, compiled with numba (no Python object per block).

Two kernels:

* :func:`replay_pool` — vLLM's v1 block pool (``vllm/v1/core/block_pool.py``,
  ``kv_cache_manager.py``, ``single_type_kv_cache_manager.py``), per engine, several
  engines behind a routing policy. Per engine: ``N − 1`` usable blocks (block 0 is
  vLLM's null block); a free queue (a doubly linked list, head = next to be reused);
  a map from block hash to its cached copies. A request is looked up (the longest
  run of leading cached blocks, at most ``⌊(prompt − 1) / B⌋``), its hit blocks are
  *touched* (taken out of the free queue), its other blocks are taken from the head
  of the free queue (a block there that holds a hash is evicted), every block that
  is full gets its hash (a second copy when the hash is cached already), and when it
  ends its blocks are freed in reverse order: hashed ones to the tail (the request's
  tail first, so it is evicted first), hashless ones to the head.
* :func:`lru_distances` — Mattson's stack distances with a Fenwick tree of counts,
  in one pass, with prefix semantics: a block hits a block-LRU cache of ``C`` blocks
  when it and every block before it in its request are within ``C`` distinct blocks.

Both take the block identities as ``uint64`` arrays; a 0 identity never occurs
(trace digests are 63-bit and non-zero; blocks the trace does not name get
synthetic identities with the top bit set, unique to the request and position).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "POLICIES",
    "replay_pool",
    "lru_distances",
    "table_capacity",
]

# Routing policy codes of replay_pool.
POLICIES = {
    "recorded": 0,
    "round_robin": 1,
    "random": 2,
    "least_loaded": 3,
    "prefix_aware": 4,
    "tenant_affinity": 5,
}
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_TOP = np.uint64(1) << np.uint64(63)


def table_capacity(n_keys: int) -> int:
    """A power of two with room for ``n_keys`` at a load of at most one half."""
    cap = 16
    while cap < 2 * max(1, n_keys):
        cap *= 2
    return cap


# ----------------------------------------------------------------- hash table
# Open addressing with linear probing, keys uint64 (0 = empty), values int64,
# backward-shift deletion (no tombstones).


@njit(cache=True, inline="always")
def _slot(key: np.uint64, mask: int) -> int:
    return int(np.int64((key * _GOLD) >> np.uint64(20))) & mask


@njit(cache=True)
def _find(keys: np.ndarray, key: np.uint64) -> int:
    mask = len(keys) - 1
    i = _slot(key, mask)
    while keys[i] != 0:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return -1 - i


@njit(cache=True)
def _delete(keys: np.ndarray, vals: np.ndarray, i: int) -> None:
    cap = len(keys)
    mask = cap - 1
    keys[i] = 0
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == 0:
            return
        k = _slot(keys[j], mask)
        # the entry at j stays when its home k lies cyclically in (i, j]
        if (i < k <= j) if i <= j else (k > i or k <= j):
            continue
        keys[i] = keys[j]
        vals[i] = vals[j]
        keys[j] = 0
        i = j


@njit(cache=True, inline="always")
def _ekey(h: np.uint64, e: int) -> np.uint64:
    # a block hash on engine e: one table serves every engine
    return h ^ (np.uint64(e + 1) * np.uint64(0xD6E8FEB86659FD93))


# ----------------------------------------------------------------- the pool
@njit(cache=True)
def _unlink(prv: np.ndarray, nxt: np.ndarray, b: int) -> None:
    p = prv[b]
    q = nxt[b]
    nxt[p] = q
    prv[q] = p


@njit(cache=True)
def _append(prv: np.ndarray, nxt: np.ndarray, sent: int, b: int) -> None:
    last = prv[sent]
    nxt[last] = b
    prv[b] = last
    nxt[b] = sent
    prv[sent] = b


@njit(cache=True)
def _prepend(prv: np.ndarray, nxt: np.ndarray, sent: int, b: int) -> None:
    first = nxt[sent]
    prv[first] = b
    nxt[b] = first
    prv[b] = sent
    nxt[sent] = b


@njit(cache=True)
def _drop_hash(
    tkeys: np.ndarray,
    tvals: np.ndarray,
    bhash: np.ndarray,
    bcopy: np.ndarray,
    beng: np.ndarray,
    b: int,
) -> None:
    """Take block ``b``'s hash out of the cache map (it is evicted or its engine restarted)."""
    key = _ekey(bhash[b], beng[b])
    s = _find(tkeys, key)
    if s >= 0:
        first = tvals[s]
        if first == b:
            if bcopy[b] >= 0:
                tvals[s] = bcopy[b]
            else:
                _delete(tkeys, tvals, s)
        else:
            p = first
            while p >= 0 and bcopy[p] != b:
                p = bcopy[p]
            if p >= 0:
                bcopy[p] = bcopy[b]
    bcopy[b] = -1
    bhash[b] = 0


@njit(cache=True)
def _add_hash(
    tkeys: np.ndarray,
    tvals: np.ndarray,
    bhash: np.ndarray,
    bcopy: np.ndarray,
    b: int,
    e: int,
    h: np.uint64,
) -> None:
    """Cache block ``b`` under ``h``; a hash cached already gets a second copy, last in line."""
    bhash[b] = h
    bcopy[b] = -1
    key = _ekey(h, e)
    s = _find(tkeys, key)
    if s >= 0:
        p = tvals[s]
        while bcopy[p] >= 0:
            p = bcopy[p]
        bcopy[p] = b
    else:
        s = -1 - s
        tkeys[s] = key
        tvals[s] = b


@njit(cache=True)
def _lookup(tkeys: np.ndarray, keys: np.ndarray, start: int, maxhit: int, e: int) -> int:
    n = 0
    while n < maxhit:
        if _find(tkeys, _ekey(keys[start + n], e)) < 0:
            break
        n += 1
    return n


@njit(cache=True)
def replay_pool(
    keys: np.ndarray,  # uint64 block identities, by request through offsets
    offsets: np.ndarray,  # int64, n + 1
    real: np.ndarray,  # int64: leading chain entries that are real, cacheable full blocks
    prompt: np.ndarray,  # int64
    output: np.ndarray,  # int64
    tenant: np.ndarray,  # int64
    rec_engine: np.ndarray,  # int64 (-1 unknown)
    warm: np.ndarray,  # uint8: a warm-up request (routed to rec_engine, not scored)
    events: np.ndarray,  # int64 (m, 2): (kind, index) in time order; kind 0 end, 1 start, 2 restart
    capacity: np.ndarray,  # int64 per engine: vLLM's num_gpu_blocks (block 0 is the null block)
    block_size: int,
    policy: int,
    seed: int,
    classify: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Returns per request (engine, hit blocks, fit: 1 when it fitted the engine's cache) and
    per block a miss kind for the blocks a request could have hit and did not (0: hit or not
    judged, 1: resident on another engine, 2: on none); and per engine the peak blocks held.
    """
    n = len(prompt)
    E = len(capacity)
    usable = np.maximum(capacity - 1, 0)
    base = np.zeros(E + 1, np.int64)
    for eng in range(E):
        base[eng + 1] = base[eng] + usable[eng]
    total = base[E]
    nodes = total + E  # blocks, then one sentinel per engine
    prv = np.empty(nodes, np.int64)
    nxt = np.empty(nodes, np.int64)
    bhash = np.zeros(total, np.uint64)
    bcopy = np.full(total, -1, np.int64)
    bref = np.zeros(total, np.int64)
    beng = np.empty(total, np.int64)
    free = usable.copy()
    for eng in range(E):
        sent = total + eng
        prv[sent] = sent
        nxt[sent] = sent
        for b in range(base[eng], base[eng + 1]):
            beng[b] = eng
            _append(prv, nxt, sent, b)
    cap = 16
    while cap < 2 * max(1, total):
        cap *= 2
    tkeys = np.zeros(cap, np.uint64)
    tvals = np.zeros(cap, np.int64)

    # blocks each request holds while it runs
    nblk = np.zeros(n, np.int64)
    for i in range(n):
        tok = prompt[i] + max(output[i] - 1, 0)
        nblk[i] = (tok + block_size - 1) // block_size
    hoff = np.zeros(n + 1, np.int64)
    for i in range(n):
        hoff[i + 1] = hoff[i] + nblk[i]
    held = np.empty(hoff[n], np.int64)
    nheld = np.zeros(n, np.int64)

    eng_out = np.full(n, -1, np.int64)
    hits_out = np.zeros(n, np.int64)
    fit_out = np.zeros(n, np.uint8)
    kind_out = np.zeros(len(keys), np.uint8)
    load = np.zeros(E, np.int64)
    last_pick = np.full(E, -1, np.int64)
    peak = np.zeros(E, np.int64)
    rr = 0
    rng = np.uint64(seed * 2 + 1)
    picks = 0

    for ev in range(len(events)):
        kind = events[ev, 0]
        i = events[ev, 1]
        if kind == 2:  # engine i restarted: every cached block is gone
            for b in range(base[i], base[i + 1]):
                if bhash[b] != 0:
                    _drop_hash(tkeys, tvals, bhash, bcopy, beng, b)
            continue
        if kind == 0:  # request i ended: free its blocks in reverse order
            e = eng_out[i]
            if e < 0 or fit_out[i] == 0:
                continue
            sent = total + e
            for j in range(nheld[i] - 1, -1, -1):
                b = held[hoff[i] + j]
                bref[b] -= 1
                if bref[b] == 0:
                    if bhash[b] != 0:
                        _append(prv, nxt, sent, b)
                    else:
                        _prepend(prv, nxt, sent, b)
                    free[e] += 1
            load[e] -= prompt[i] + output[i]
            continue
        # ---- request i arrives
        s0 = offsets[i]
        L = offsets[i + 1] - s0
        nreal = min(real[i], L)
        fullp = min(nreal, prompt[i] // block_size)
        maxhit = min((prompt[i] - 1) // block_size, fullp) if prompt[i] > 0 else 0
        e = 0
        if warm[i] or policy == 0:
            e = int(rec_engine[i]) % E if rec_engine[i] >= 0 else 0
        elif policy == 1:
            e = rr % E
            rr += 1
        elif policy == 2:
            rng ^= rng << np.uint64(13)
            rng ^= rng >> np.uint64(7)
            rng ^= rng << np.uint64(17)
            e = int(np.int64(rng >> np.uint64(1))) % E
        elif policy == 5:
            e = int(np.int64((np.uint64(tenant[i] + 1) * _GOLD) >> np.uint64(33))) % E
        else:
            best = -1
            bm = -1
            for c in range(E):
                m = _lookup(tkeys, keys, s0, maxhit, c) if policy == 4 else 0
                better = False
                if best < 0:
                    better = True
                elif m != bm:
                    better = m > bm
                elif load[c] != load[best]:
                    better = bool(load[c] < load[best])
                else:
                    better = bool(last_pick[c] < last_pick[best])
                if better:
                    best = c
                    bm = m
            e = best
        picks += 1
        last_pick[e] = picks
        eng_out[i] = e
        hits = _lookup(tkeys, keys, s0, maxhit, e)
        sent = total + e
        # hit blocks still in the free queue come out of it when touched
        evictable = 0
        for j in range(hits):
            b = tvals[_find(tkeys, _ekey(keys[s0 + j], e))]
            if bref[b] == 0:
                evictable += 1
        need = nblk[i] - hits
        if need > free[e] - evictable:
            continue  # longer than what the engine can give it: not run (fit_out 0)
        fit_out[i] = 1
        hits_out[i] = hits
        if classify and not warm[i]:
            for j in range(hits, maxhit):
                k = np.uint8(2)
                for c in range(E):
                    if c != e and _find(tkeys, _ekey(keys[s0 + j], c)) >= 0:
                        k = np.uint8(1)
                        break
                kind_out[s0 + j] = k
        h0 = hoff[i]
        for j in range(hits):
            b = tvals[_find(tkeys, _ekey(keys[s0 + j], e))]
            if bref[b] == 0:
                _unlink(prv, nxt, b)
                free[e] -= 1
            bref[b] += 1
            held[h0 + j] = b
        for j in range(hits, nblk[i]):
            b = nxt[sent]
            _unlink(prv, nxt, b)
            free[e] -= 1
            if bhash[b] != 0:
                _drop_hash(tkeys, tvals, bhash, bcopy, beng, b)
            bref[b] = 1
            held[h0 + j] = b
        nheld[i] = nblk[i]
        used = usable[e] - free[e]
        if used > peak[e]:
            peak[e] = used
        nfull = (prompt[i] + max(output[i] - 1, 0)) // block_size
        for j in range(hits, nfull):
            if j < nreal:
                h = keys[s0 + j]
            else:  # a block the trace does not name: unique to this request
                h = _TOP | (np.uint64(i) << np.uint64(20)) | np.uint64(j & 0xFFFFF)
            _add_hash(tkeys, tvals, bhash, bcopy, held[h0 + j], e, h)
        load[e] += prompt[i] + output[i]
    return eng_out, hits_out, fit_out, kind_out, peak


# ------------------------------------------------------------ stack distances
@njit(cache=True)
def lru_distances(keys: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per block reference, the smallest block-LRU capacity (in blocks) at which it is a prefix
    hit: its stack distance (distinct blocks referenced since its last reference, itself
    included), at least that of every block before it in its request; ``2**62`` for a first
    reference. ``order``: the requests in the order they reach the cache."""
    R = len(keys)
    inf = np.int64(1) << np.int64(62)
    out = np.full(R, inf, np.int64)
    tree = np.zeros(R + 1, np.int32)  # Fenwick tree over reference times: 1 = latest of its key
    cap = 16
    while cap < 2 * max(1, R):
        cap *= 2
    tkeys = np.zeros(cap, np.uint64)
    tvals = np.zeros(cap, np.int64)
    t = 0
    for r in range(len(order)):
        i = order[r]
        run = np.int64(0)
        for j in range(offsets[i], offsets[i + 1]):
            key = keys[j]
            s = _find(tkeys, key)
            if s >= 0:
                p = tvals[s]
                # marks in (p, t): distinct keys referenced since
                a = 0
                x = t
                while x > 0:
                    a += tree[x]
                    x -= x & -x
                x = p + 1
                while x > 0:
                    a -= tree[x]
                    x -= x & -x
                d = np.int64(a + 1)
                x = p + 1
                while x <= R:
                    tree[x] -= 1
                    x += x & -x
                tvals[s] = t
            else:
                d = inf
                s = -1 - s
                tkeys[s] = key
                tvals[s] = t
            x = t + 1
            while x <= R:
                tree[x] += 1
                x += x & -x
            if d > run:
                run = d
            out[j] = run
            t += 1
    return out
