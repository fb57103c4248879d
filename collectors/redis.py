"""redis-py client instrumentation: hit/miss for reads, counts for writes.

:func:`instrument` wraps one client instance (and the pipelines it creates);
:func:`uninstrument` restores it. Both are idempotent (a marker attribute
prevents double wrapping). Commands understood:

* reads — ``GET GETEX GETDEL HGET HGETALL JSON.GET`` (``None``/empty = miss),
  ``MGET`` and ``JSON.MGET`` (per key), ``HMGET`` (per field, keyed by the hash
  key), ``EXISTS`` (per key; with several keys and a partial count, hits are
  attributed in argument order — the count is exact, the per-key split is not);
* writes — ``SET SETEX PSETEX SETNX GETSET MSET MSETNX HSET HMSET HSETNX JSON.SET``;
* a command that raises (connection lost, timeout) counts its keys as ``error``
  and the exception propagates unchanged.

``redis.asyncio`` clients and their pipelines are counted the same way (their wrappers are
coroutines). Without code, :mod:`warmscope.collectors.autoinstrument` instruments every
client of a process (``opentelemetry-instrument``).

Pipelines are interpreted at ``execute()`` from the queued command stack, so
``pipe.get(a).get(b).execute()`` counts two lookups. The layer is fixed per
client, or a function of the key (``layer=lambda k: "embedding" if
k.startswith("emb:") else "response"``).

Example::

    import redis
    from warmscope.collectors import instrument_redis
    r = instrument_redis(redis.Redis(), layer="response")
    r.get("resp:v1:8812")          # counted as hit or miss
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .aggregator import ERROR, HIT, MISS
from .cache import _Recorder
from .pipeline import Telemetry

__all__ = ["instrument", "uninstrument", "is_instrumented"]

_MARK = "_warmscope_instrumented"
_SINGLE_READS = {"GET", "GETEX", "GETDEL", "HGET", "HGETALL", "JSON.GET"}
_WRITES_1 = {"SET", "SETEX", "PSETEX", "SETNX", "GETSET", "HSET", "HMSET", "HSETNX", "JSON.SET"}
_WRITES_PAIRS = {"MSET", "MSETNX"}


def _name(args: tuple[Any, ...]) -> str:
    c = args[0]
    return (c.decode() if isinstance(c, bytes) else str(c)).upper()


def _str(k: Any) -> Any:
    return k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k


class _Interpreter:
    def __init__(self, layer: str | Callable[[Any], str], telemetry: Telemetry | None) -> None:
        self._fixed = layer if isinstance(layer, str) else None
        self._fn = None if isinstance(layer, str) else layer
        self._tel = telemetry
        self._recs: dict[str, _Recorder] = {}

    def rec(self, key: Any) -> _Recorder:
        layer = self._fixed or str(self._fn(key))  # type: ignore[misc]
        r = self._recs.get(layer)
        if r is None:
            r = self._recs[layer] = _Recorder(layer, self._tel, None)
        return r

    def reads(self, args: tuple[Any, ...]) -> list[Any] | None:
        name = _name(args)
        if name in _SINGLE_READS or name == "HMGET":
            return [_str(args[1])] if name != "HMGET" else [_str(args[1])] * max(len(args) - 2, 1)
        if name in ("MGET", "EXISTS"):
            return [_str(k) for k in args[1:]]
        if name == "JSON.MGET":
            return [_str(k) for k in args[1:-1]]
        return None

    def outcome(self, args: tuple[Any, ...], response: Any) -> None:
        """Record what one command did, given its response (or exception)."""
        try:
            name = _name(args)
            keys = self.reads(args)
            if keys is not None:
                if isinstance(response, BaseException):
                    for k in keys:
                        self.rec(k)(k, ERROR)
                elif name == "EXISTS":
                    n = int(response or 0)
                    for i, k in enumerate(keys):
                        self.rec(k)(k, HIT if i < n else MISS)
                elif len(keys) > 1 or name in ("MGET", "JSON.MGET", "HMGET"):
                    vals = list(response or [])
                    for k, v in zip(keys, vals, strict=False):
                        self.rec(k)(k, MISS if v is None else HIT)
                else:
                    k = keys[0]
                    self.rec(k)(
                        k, MISS if response is None or response == {} or response == [] else HIT
                    )
            elif not isinstance(response, BaseException):
                if name in _WRITES_1:
                    k = _str(args[1])
                    self.rec(k).write(k)
                elif name in _WRITES_PAIRS:
                    for k in args[1::2]:
                        k = _str(k)
                        self.rec(k).write(k)
        except Exception as e:
            self.failed("redis response interpretation", e)

    def failed(self, what: str, e: BaseException) -> None:
        tel = self._tel
        if tel is None:
            from .pipeline import current_telemetry

            tel = current_telemetry()
        tel.aggregator.count_error("hook", what, e)


def instrument(
    client: Any, layer: str | Callable[[Any], str] = "response", telemetry: Telemetry | None = None
) -> Any:
    """Instrument a ``redis.Redis``, ``redis.asyncio.Redis`` or ``redis.cluster.RedisCluster``
    client in place (idempotent); returns it. An asyncio client and its pipelines are counted
    as the sync ones are."""
    if getattr(client, _MARK, False):
        return client
    interp = _Interpreter(layer, telemetry)
    orig_exec = client.execute_command
    orig_pipeline = client.pipeline
    execute_command: Callable[..., Any]

    if inspect.iscoroutinefunction(orig_exec):

        async def execute_command(*args: Any, **options: Any) -> Any:
            try:
                resp = await orig_exec(*args, **options)
            except Exception as e:
                interp.outcome(args, e)
                raise
            interp.outcome(args, resp)
            return resp
    else:

        def execute_command(*args: Any, **options: Any) -> Any:
            try:
                resp = orig_exec(*args, **options)
            except Exception as e:
                interp.outcome(args, e)
                raise
            interp.outcome(args, resp)
            return resp

    def pipeline(*a: Any, **kw: Any) -> Any:
        pipe = orig_pipeline(*a, **kw)
        _instrument_pipeline(pipe, interp)
        return pipe

    client.execute_command = execute_command
    client.pipeline = pipeline
    setattr(client, _MARK, True)
    return client


def _stack(pipe: Any, interp: _Interpreter) -> list[tuple[Any, ...]]:
    try:
        return _queued(pipe)
    except Exception as e:  # an unknown pipeline shape: serve the host, count the failure
        interp.failed("redis pipeline inspection", e)
        return []


def _results(interp: _Interpreter, stack: list[tuple[Any, ...]], results: Any) -> None:
    for args, r in zip(stack, results, strict=False):
        interp.outcome(args, r)


def _instrument_pipeline(pipe: Any, interp: _Interpreter) -> None:
    if getattr(pipe, _MARK, False):
        return
    orig_execute = pipe.execute
    execute: Callable[..., Any]

    if inspect.iscoroutinefunction(orig_execute):

        async def execute(raise_on_error: bool = True) -> Any:
            stack = _stack(pipe, interp)
            try:
                results = await orig_execute(raise_on_error)
            except Exception as e:
                _results(interp, stack, [e] * len(stack))
                raise
            _results(interp, stack, results)
            return results
    else:

        def execute(raise_on_error: bool = True) -> Any:
            stack = _stack(pipe, interp)
            try:
                results = orig_execute(raise_on_error)
            except Exception as e:
                _results(interp, stack, [e] * len(stack))
                raise
            _results(interp, stack, results)
            return results

    pipe.execute = execute
    setattr(pipe, _MARK, True)


def _queued(pipe: Any) -> list[tuple[Any, ...]]:
    """The queued commands' arguments, in order: a ``Pipeline``'s command stack, or the
    command queue of redis-py's cluster pipeline (results come back in queue order)."""
    strategy = getattr(pipe, "_execution_strategy", None)
    if strategy is not None and hasattr(strategy, "command_queue"):
        return [tuple(c.args) for c in strategy.command_queue]
    return [args for args, _ in list(pipe.command_stack)]


def is_instrumented(obj: Any) -> bool:
    """Whether ``obj`` (a client or pipeline) is instrumented by :func:`instrument`."""
    return bool(obj.__dict__.get(_MARK, False)) if hasattr(obj, "__dict__") else False


def uninstrument(client: Any) -> Any:
    """Undo :func:`instrument` (idempotent); returns the client."""
    if getattr(client, _MARK, False):
        for attr in ("execute_command", "pipeline", _MARK):
            client.__dict__.pop(attr, None)
    return client
