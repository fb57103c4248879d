"""The simulated caches: an LRU with optional TTL and weighted capacity.

``get(key, default)`` / ``set(key, value)`` like any cache the collectors wrap;
``valid_for(key)`` is what a warm-up runner asks a cache with TTLs (Redis ``PTTL``);
``peek(key)`` says whether an entry is held without touching its recency (the
simulator's ground truth of why a prefix block missed).
Capacity is in weight units (entries by default; tokens for the prefix-KV cache,
where ``weigh`` returns a block's token count). Expired entries count as misses
and are dropped on read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["LRU"]


class LRU:
    __slots__ = ("cap", "ttl", "clock", "weigh", "used", "_d")

    def __init__(
        self,
        capacity: float,
        clock: Callable[[], float],
        ttl: float | None = None,
        weigh: Callable[[Any], float] | None = None,
    ) -> None:
        self.cap = capacity
        self.ttl = ttl
        self.clock = clock
        self.weigh = weigh
        self.used = 0.0
        self._d: OrderedDict[Hashable, tuple[Any, float, float]] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        e = self._d.get(key)
        if e is None:
            return default
        if e[1] and e[1] < self.clock():
            del self._d[key]
            self.used -= e[2]
            return default
        self._d.move_to_end(key)
        return e[0]

    def set(self, key: Hashable, value: Any, ttl: float | None = None) -> None:
        w = self.weigh(value) if self.weigh else 1.0
        old = self._d.pop(key, None)
        if old is not None:
            self.used -= old[2]
        t = ttl if ttl is not None else self.ttl
        self._d[key] = (value, self.clock() + t if t else 0.0, w)
        self.used += w
        while self.used > self.cap and self._d:
            _, (_, _, ow) = self._d.popitem(last=False)
            self.used -= ow

    __setitem__ = set

    def peek(self, key: Hashable) -> bool:
        """Whether ``key`` is held and unexpired, without touching its recency (ground truth)."""
        e = self._d.get(key)
        return e is not None and not (e[1] and e[1] < self.clock())

    def valid_for(self, key: Hashable) -> float:
        """Seconds the entry for ``key`` stays valid: 0 when absent or expired, ``inf`` without a
        TTL."""
        e = self._d.get(key)
        if e is None:
            return 0.0
        return max(e[1] - self.clock(), 0.0) if e[1] else float("inf")

    def __contains__(self, key: Hashable) -> bool:
        return self.get(key, None) is not None

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
        self.used = 0.0
