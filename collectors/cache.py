"""Generic cache wrappers: any get/set cache, a lookup function, a memoiser.

* :class:`InstrumentedCache` wraps a mapping-like object (``dict``, an LRU, a
  ``cachetools`` cache, anything with ``get`` and ``__setitem__`` or ``set``).
  Reads (``get``, ``[]``, :meth:`~InstrumentedCache.get_or_load`) count as hit
  or miss; writes count as writes; ``in`` is not counted (``if k in c: c[k]``
  would count twice). :meth:`~InstrumentedCache.bypass` records a request that
  skipped the cache (``cache-control: no-cache`` paths).
* :func:`observe` wraps a lookup function returning ``None`` on a miss.
* :func:`cached` memoises a function in a bounded in-process LRU and counts.

The wrapper's own bookkeeping never raises into the caller: failures are
counted in ``warmscope.telemetry.errors{stage="record"}``. Exceptions from the
wrapped cache itself propagate unchanged (after being counted as ``error``).

Example::

    from warmscope.collectors import InstrumentedCache, cached
    emb = InstrumentedCache({}, layer="embedding")
    vec = emb.get_or_load(chunk_id, embed_chunk)

    @cached(layer="tokenizer", maxsize=4096)
    def tokenize(text): ...
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .aggregator import BYPASS, ERROR, HIT, MISS
from .context import _current
from .pipeline import Telemetry, current_telemetry

__all__ = ["InstrumentedCache", "observe", "cached"]

_MISSING = object()
_cur = _current.get
F = TypeVar("F", bound=Callable[..., Any])


class _Recorder:
    """Setup-time binding shared by the wrappers: one call per lookup."""

    __slots__ = ("tel", "agg", "binding", "_rec")

    def __init__(
        self, layer: str, telemetry: Telemetry | None, length_buckets: bool | None
    ) -> None:
        self.tel = telemetry or current_telemetry()
        self.agg = self.tel.aggregator
        self.binding = self.agg.bind_layer(layer, length_buckets)
        self._rec = self.agg.record_lookup

    def __call__(self, key: object, result: int) -> None:
        try:
            ctx = _current.get()
            if ctx is None or ctx._agg is not self.agg:
                ctx = self.tel.context()
            self._rec(self.binding, key, result, ctx)
        except Exception as e:  # never break the host
            self.agg.count_error("record", "lookup", e)

    def write(self, key: object) -> None:
        try:
            self.agg.record_write(self.binding, key, self.tel.context())
        except Exception as e:
            self.agg.count_error("record", "write", e)


class InstrumentedCache:
    def __init__(
        self,
        backend: Any,
        layer: str,
        telemetry: Telemetry | None = None,
        length_buckets: bool | None = None,
    ) -> None:
        self.backend = backend
        self.layer = layer
        self._rec = rec = _Recorder(layer, telemetry, length_buckets)
        # Bound once so a lookup touches no attribute chains.
        self._tel, self._agg, self._b, self._record = (
            rec.tel,
            rec.agg,
            rec.binding,
            rec.agg.record_lookup,
        )
        self._get = backend.get
        setter = getattr(backend, "set", None)
        self._set = (
            setter if callable(setter) and not isinstance(backend, dict) else backend.__setitem__
        )

    def get(self, key: Hashable, default: Any = None) -> Any:
        try:
            v = self._get(key, _MISSING)
        except Exception:
            self._rec(key, ERROR)
            raise
        try:  # _Recorder.__call__ inlined: this is the hot path
            ctx = _cur()
            if ctx is None or ctx._agg is not self._agg:
                ctx = self._tel.context()
            self._record(self._b, key, MISS if v is _MISSING or v is None else HIT, ctx)
        except Exception as e:
            self._agg.count_error("record", "lookup", e)
        return default if v is _MISSING else v

    def __getitem__(self, key: Hashable) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self._set(key, value)
        self._rec.write(key)

    def set(self, key: Hashable, value: Any, **kw: Any) -> None:
        """Write through to the backend (extra keywords, e.g. ``ttl``, go to its ``set``)."""
        self._set(key, value, **kw)
        self._rec.write(key)

    def record(self, key: Hashable, hit: bool) -> None:
        """Count a lookup the cache answered outside :meth:`get` — e.g. blocks
        after the first miss of a prefix walk, which cannot hit."""
        self._rec(key, HIT if hit else MISS)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.backend

    def __len__(self) -> int:
        return len(self.backend)

    def get_or_load(self, key: Hashable, loader: Callable[[Hashable], Any]) -> Any:
        """Return the cached value, or load, store and return it (a miss; the
        load is timed into ``warmscope.cache.load.duration``)."""
        v = self.get(key, _MISSING)
        if v is _MISSING:
            t = time.perf_counter()
            v = loader(key)
            self.record_load(time.perf_counter() - t)
            self[key] = v
        return v

    def record_load(self, seconds: float) -> None:
        """Record how long loading a missed value took (for loads done elsewhere)."""
        try:
            self._agg.record_load(self._b, seconds, self._tel.context())
        except Exception as e:
            self._agg.count_error("record", "load duration", e)

    def bypass(self, key: Hashable) -> None:
        """Record a request that skipped this cache on purpose."""
        self._rec(key, BYPASS)


def observe(
    layer: str, telemetry: Telemetry | None = None, key: Callable[..., Hashable] | None = None
) -> Callable[[F], F]:
    """Decorate a lookup function that returns ``None`` on a miss."""

    def deco(fn: F) -> F:
        rec: list[_Recorder] = []

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if not rec:
                rec.append(_Recorder(layer, telemetry, None))
            k = key(*a, **kw) if key else a[0]
            try:
                v = fn(*a, **kw)
            except Exception:
                rec[0](k, ERROR)
                raise
            rec[0](k, MISS if v is None else HIT)
            return v

        return wrapper  # type: ignore[return-value]

    return deco


def cached(
    layer: str,
    maxsize: int = 1024,
    telemetry: Telemetry | None = None,
    key: Callable[..., Hashable] | None = None,
) -> Callable[[F], F]:
    """Memoise a function in a bounded LRU, counting hits and misses."""

    def deco(fn: F) -> F:
        lru: OrderedDict[Any, Any] = OrderedDict()
        rec: list[_Recorder] = []

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if not rec:
                rec.append(_Recorder(layer, telemetry, None))
            k = key(*a, **kw) if key else (a if not kw else (a, tuple(sorted(kw.items()))))
            if len(a) == 1 and not kw and key is None:
                k = a[0]
            v = lru.get(k, _MISSING)
            if v is not _MISSING:
                lru.move_to_end(k)
                rec[0](k, HIT)
                return v
            rec[0](k, MISS)
            v = fn(*a, **kw)
            lru[k] = v
            if len(lru) > maxsize:
                lru.popitem(last=False)
            rec[0].write(k)
            return v

        wrapper.cache = lru  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco
