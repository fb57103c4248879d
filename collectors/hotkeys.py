"""Hot keys: a batched Space-Saving sketch per (tenant, layer) and thread.

A sketch is a dict ``key -> entry`` of up to K + max(K, 1024) entries; when
full it keeps the top K by estimated count, and new keys enter with the
largest evicted estimate as both their starting estimate and error bound, so
``hits + misses <= true count <= hits + misses + err`` for every key reported.
Reads are appended to per-thread lists on the hot path and folded into the
sketch in batches (:func:`collections.Counter` runs in C, and the per-key work
is paid once per distinct key per batch).

A sketch's scope packs the tenant id and the layer id in one int:
``tenant_id << 12 | layer_id``.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

from warmscope.model import records

__all__ = [
    "HotKeySketch",
    "ENTRY",
    "E_EST",
    "E_HITS",
    "E_MISSES",
    "E_ERR",
    "E_FAMILY",
    "E_KEY",
    "BATCH",
    "scope",
    "merge",
    "cross_tenant_reads",
    "top_k",
]

# A sketch entry is a list in this order (a list, not an object: millions of
# them are created and compared on the lookup path).
ENTRY = ("est", "hits", "misses", "err", "family", "key")
E_EST, E_HITS, E_MISSES, E_ERR, E_FAMILY, E_KEY = range(len(ENTRY))
BATCH = 2048  # buffered hot-key reads per (thread, layer, tenant, result)
LAYER_BITS = 12
MAX_LAYER_ID = 4000  # scope ids pack the layer id in LAYER_BITS bits
_LAYER_MASK = (1 << LAYER_BITS) - 1
_est = operator.itemgetter(E_EST)


def scope(tenant_id: int, layer_id: int) -> int:
    return (tenant_id << LAYER_BITS) | layer_id


def scope_ids(sc: int) -> tuple[int, int]:
    """(tenant id, layer id) of a sketch scope."""
    return sc >> LAYER_BITS, sc & _LAYER_MASK


class HotKeySketch:
    """The sketch half of the aggregator: folding, compaction (per owner thread)."""

    hot_k: int
    _hot_cap: int
    _hot_floor: dict[int, int]
    _bindings: list[Any]

    def _sketch(self, layer_id: int, hot: dict[Any, Any], hbuf: dict[Any, Any]) -> None:
        """Fold buffered keys into the Space-Saving sketches (owner thread, or
        the flusher once no thread can touch these dicts). ``hbuf`` maps a
        tenant id to (hit keys, miss keys)."""
        fams = self._bindings[layer_id].families
        for tid, pair in list(hbuf.items()):
            sk = hot.get(tid)
            if sk is None:
                sk = hot[tid] = {}
            for r, lst in enumerate(pair):  # r: 0 hit, 1 miss -> E_HITS, E_MISSES
                if not lst:
                    continue
                counted = Counter(lst)
                lst.clear()
                hk = scope(tid, layer_id)
                col = E_HITS + r
                for key, n in counted.items():
                    e = sk.get(key)
                    if e is None:
                        if len(sk) >= self._hot_cap:
                            self._compact(hk, sk)
                        floor = self._hot_floor.get(hk, 0)
                        e = sk[key] = [floor, 0, 0, floor, fams.family(key), key]
                    e[E_EST] += n
                    e[col] += n

    def _compact(self, hk: int, sk: dict[Any, Any]) -> None:
        """Keep the top K entries; the largest evicted estimate becomes the floor."""
        top = heapq.nlargest(self.hot_k + 1, sk.values(), key=_est)
        if len(top) > self.hot_k:
            self._hot_floor[hk] = max(self._hot_floor.get(hk, 0), top[-1][E_EST])
            top.pop()
        sk.clear()
        sk.update((e[E_KEY], e) for e in top)


def merge(into: dict[int, dict[Any, Any]], layer_id: int, hot: dict[int, dict[Any, Any]]) -> None:
    """Add one thread's sketches of a layer (tenant id -> sketch) to ``into`` (scope -> sketch).
    The first sketch of a scope becomes the merged one as it is: the thread has let go of it (its
    buffers were swapped out), so its entries need no copy."""
    for tid, sk in hot.items():
        sc = scope(tid, layer_id)
        acc = into.get(sc)
        if acc is None:
            into[sc] = sk
            continue
        for key, e in sk.items():
            a = acc.get(key)
            if a is None:
                acc[key] = list(e)
            else:  # the same key seen by two threads
                a[E_HITS] += e[E_HITS]
                a[E_MISSES] += e[E_MISSES]
                a[E_ERR] = max(a[E_ERR], e[E_ERR])
                a[E_EST] = a[E_HITS] + a[E_MISSES] + a[E_ERR]


def cross_tenant_reads(
    hot: dict[int, dict[Any, Any]], layer_name: Callable[[int], str]
) -> dict[str, int]:
    """Per layer (except layers declared shared in ``records.LAYERS``): keys found in more than one
    tenant's sketch, counted once per extra tenant."""
    owners: dict[tuple[Any, ...], int] = {}
    for sc, acc in hot.items():
        layer = layer_name(scope_ids(sc)[1])
        if records.layer(layer).shared:
            continue
        for key in acc:
            owners[(layer, key)] = owners.get((layer, key), 0) + 1
    out: dict[str, int] = {}
    for (layer, _), n in owners.items():
        if n > 1:
            out[layer] = out.get(layer, 0) + n - 1
    return out


def top_k(hot: dict[int, dict[Any, Any]], k: int) -> None:
    """Keep the top ``k`` entries of every merged sketch (in place)."""
    for sc, acc in hot.items():
        if len(acc) > k:
            hot[sc] = {e[E_KEY]: e for e in heapq.nlargest(k, acc.values(), key=_est)}
