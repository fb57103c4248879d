"""OpenTelemetry auto-instrumentation: ``opentelemetry-instrument python app.py`` counts every
Redis and OpenAI-client cache lookup of a process, with no code.

The ``opentelemetry_instrumentor`` entry point ``warmscope`` names :class:`WarmscopeInstrumentor`,
a ``BaseInstrumentor`` (``pip install "warmscope[instrument]"``). ``instrument()`` patches

* ``redis.Redis`` / ``redis.asyncio.Redis`` ``execute_command`` and the ``execute`` of their
  pipelines (``redis.client.Pipeline``, ``redis.asyncio.client.Pipeline``): every client, sync or
  async, is counted as :func:`warmscope.collectors.instrument_redis` counts one (a client that
  is also instrumented by hand is counted once; warmscope's own Redis traffic, its sink writing
  and reading at a flush, is not counted);
* ``openai.OpenAI`` / ``openai.AsyncOpenAI``: each client built afterwards sends through
  warmscope's instrumented httpx transport (:mod:`warmscope.collectors.openai_client`) unless it
  already does (``instrument_openai``).

Options, as ``instrument(**kwargs)`` (the environment gives the defaults under
``opentelemetry-instrument``):

``telemetry``       the pipeline (default :func:`warmscope.collectors.setup`, from ``WARMSCOPE_*``)
``redis_layer``     layer name or ``key -> layer`` function (``WARMSCOPE_REDIS_LAYER``,
                    else ``response``)
``request_hook``    ``hook(span, instance, args, kwargs)`` before a Redis command, or
                    ``hook(span, request)`` (an ``httpx.Request``) before an OpenAI request
``response_hook``   ``hook(span, instance, response)`` after a Redis command, or
                    ``hook(span, request, response)`` after an OpenAI response's headers
``redis``/``openai``  ``False`` leaves that library alone
``genai_spans``     ``False``: do not read GenAI usage attributes of spans back
                    (:class:`~warmscope.collectors.genai.GenAIUsageSpanProcessor`, added to the
                    SDK tracer provider, ``tracer_provider`` or the global one)

``span`` is the current span (a contrib instrumentation's span when one is active), as the
contrib instrumentations pass theirs, so the same hooks serve both. A hook that raises is counted
in ``warmscope.telemetry.errors{stage="hook"}``; the command goes on. ``instrument()`` twice is a
no-op (``BaseInstrumentor``); ``uninstrument()`` restores the classes (clients built meanwhile
keep their instrumented transport).

Each patch is a small module-level wrapper factory (``_redis_command`` and the like) handed to
wrapt's ``wrap_function_wrapper`` and undone with ``unwrap``, as the opentelemetry-python-contrib
instrumentations do: a wrapper gets ``(wrapped, instance, args, kwargs)`` and can be tested alone.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from .context import INTERNAL
from .pipeline import Telemetry, current_telemetry, setup
from .redis import _Interpreter, _queued, is_instrumented

__all__ = ["WarmscopeInstrumentor"]

Hook = Callable[..., Any] | None
Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


def _call(hook: Hook, tel: Telemetry, what: str, *args: Any) -> None:
    if hook is None:
        return
    try:
        hook(trace.get_current_span(), *args)
    except Exception as e:  # a hook never breaks the host
        tel.aggregator.count_error("hook", what, e)


# ---- Redis: what the sync and async wrappers share ----------------------------------------------


class _RedisHooks:
    """A Redis command's or pipeline's way through warmscope: whether it is observed (not counted
    already by a hand-instrumented client, not warmscope's own traffic), then its replies
    interpreted (hits, misses, writes, errors) and the hooks called. ``*_asked`` return what the
    answer is read against (the command's arguments, the pipeline's queued commands) or None."""

    def __init__(self, interp: _Interpreter, tel: Telemetry, req: Hook, resp: Hook) -> None:
        self.interp, self.tel, self.req, self.resp = interp, tel, req, resp

    def _observed(self, client: Any) -> bool:
        return not (is_instrumented(client) or INTERNAL.get())

    def command_asked(
        self, client: Any, args: tuple[Any, ...], options: dict[str, Any]
    ) -> tuple[Any, ...] | None:
        if not self._observed(client):
            return None
        _call(self.req, self.tel, "redis request_hook", client, args, options)
        return args

    def command_failed(self, args: tuple[Any, ...], e: Exception) -> None:
        self.interp.outcome(args, e)

    def command_answered(self, client: Any, args: tuple[Any, ...], reply: Any) -> Any:
        self.interp.outcome(args, reply)
        _call(self.resp, self.tel, "redis response_hook", client, reply)
        return reply

    def pipeline_asked(
        self, pipe: Any, args: tuple[Any, ...], options: dict[str, Any]
    ) -> list[tuple[Any, ...]] | None:
        if not self._observed(pipe):
            return None
        try:
            stack = _queued(pipe)
        except Exception as e:
            self.interp.failed("redis pipeline inspection", e)
            stack = []
        _call(self.req, self.tel, "redis request_hook", pipe, ("PIPELINE",), {"stack": stack})
        return stack

    def pipeline_failed(self, stack: list[tuple[Any, ...]], e: Exception) -> None:
        for args in stack:
            self.interp.outcome(args, e)

    def pipeline_answered(self, pipe: Any, stack: list[tuple[Any, ...]], replies: Any) -> Any:
        for args, reply in zip(stack, replies, strict=False):
            self.interp.outcome(args, reply)
        _call(self.resp, self.tel, "redis response_hook", pipe, replies)
        return replies


def _observing(
    asked: Callable[..., Any], failed: Callable[..., None], answered: Callable[..., Any]
) -> Wrapper:
    """A wrapper that asks, calls, and hands the reply or the error on (the error is raised
    again unchanged)."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        what = asked(instance, args, kwargs)
        if what is None:
            return wrapped(*args, **kwargs)
        try:
            reply = wrapped(*args, **kwargs)
        except Exception as e:
            failed(what, e)
            raise
        return answered(instance, what, reply)

    return wrapper


def _async_observing(
    asked: Callable[..., Any], failed: Callable[..., None], answered: Callable[..., Any]
) -> Wrapper:
    """:func:`_observing` for a coroutine method (``redis.asyncio``)."""

    async def wrapper(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        what = asked(instance, args, kwargs)
        if what is None:
            return await wrapped(*args, **kwargs)
        try:
            reply = await wrapped(*args, **kwargs)
        except Exception as e:
            failed(what, e)
            raise
        return answered(instance, what, reply)

    return wrapper


def _redis_command(hooks: _RedisHooks) -> Wrapper:
    """``Redis.execute_command``: each command observed."""
    return _observing(hooks.command_asked, hooks.command_failed, hooks.command_answered)


def _async_redis_command(hooks: _RedisHooks) -> Wrapper:
    return _async_observing(hooks.command_asked, hooks.command_failed, hooks.command_answered)


def _redis_pipeline(hooks: _RedisHooks) -> Wrapper:
    """``Pipeline.execute``: each queued command observed with its reply."""
    return _observing(hooks.pipeline_asked, hooks.pipeline_failed, hooks.pipeline_answered)


def _async_redis_pipeline(hooks: _RedisHooks) -> Wrapper:
    return _async_observing(hooks.pipeline_asked, hooks.pipeline_failed, hooks.pipeline_answered)


# (module, class, method, wrapper factory): what instrument() patches in redis-py.
_REDIS_TARGETS: tuple[tuple[str, str, str, Callable[[_RedisHooks], Wrapper]], ...] = (
    ("redis.client", "Redis", "execute_command", _redis_command),
    ("redis.client", "Pipeline", "execute", _redis_pipeline),
    ("redis.asyncio.client", "Redis", "execute_command", _async_redis_command),
    ("redis.asyncio.client", "Pipeline", "execute", _async_redis_pipeline),
)


# ---- the OpenAI client ---------------------------------------------------------------------------


def _openai_init(tel: Telemetry, req: Hook, resp: Hook, is_async: bool) -> Wrapper:
    """``OpenAI.__init__`` / ``AsyncOpenAI.__init__``: the client's httpx client sends through
    warmscope's instrumented transport (a new httpx client when the caller gave none); a client
    of an unknown shape works uninstrumented."""
    import httpx

    from .llm import LLMRecorder
    from .openai_client import AsyncInstrumentedTransport, InstrumentedTransport

    recorder: list[LLMRecorder] = []  # one for every client, made at the first

    class Hooked(InstrumentedTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            _call(req, tel, "openai request_hook", request)
            r = super().handle_request(request)
            _call(resp, tel, "openai response_hook", request, r)
            return r

    class AsyncHooked(AsyncInstrumentedTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            _call(req, tel, "openai request_hook", request)
            r = await super().handle_async_request(request)
            _call(resp, tel, "openai response_hook", request, r)
            return r

    def hooked(t: Any) -> Any:
        if t is None or isinstance(t, (InstrumentedTransport, AsyncInstrumentedTransport)):
            return t
        if not recorder:
            recorder.append(LLMRecorder(tel))
        return (AsyncHooked if is_async else Hooked)(t, recorder=recorder[0])

    def instrumented(http: Any) -> Any:
        if http is None:
            http = (httpx.AsyncClient if is_async else httpx.Client)(follow_redirects=True)
        # e.g. an httpx2 client of the caller's (openai accepts httpx's and httpx2's)
        if not isinstance(http, (httpx.AsyncClient, httpx.Client)):
            tel.aggregator.count_error(
                "hook",
                "openai http_client not httpx: not instrumented",
                TypeError(type(http).__name__),
            )
            return http
        http._transport = hooked(http._transport)
        http._mounts = {k: hooked(v) for k, v in http._mounts.items()}
        return http

    def wrapper(wrapped: Any, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            kwargs["http_client"] = instrumented(kwargs.get("http_client"))
        except Exception as e:  # an unknown client shape: it works uninstrumented
            tel.aggregator.count_error("hook", "openai client instrumentation", e)
        wrapped(*args, **kwargs)

    return wrapper


class WarmscopeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """warmscope's Redis and OpenAI-client instrumentation as an OpenTelemetry instrumentor."""

    _wrapped: list[tuple[Any, str]]  # (class, method) wrapped, in order

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # each library is patched when it is importable; none is required

    def _instrument(self, **kwargs: Any) -> None:
        self._wrapped = []
        tel: Telemetry = kwargs.get("telemetry") or setup()
        req, resp = kwargs.get("request_hook"), kwargs.get("response_hook")
        if kwargs.get("redis", True):
            layer = (
                kwargs.get("redis_layer") or os.environ.get("WARMSCOPE_REDIS_LAYER") or "response"
            )
            self._redis(_RedisHooks(_Interpreter(layer, tel), tel, req, resp))
        if kwargs.get("openai", True):
            self._openai(tel, req, resp)
        if kwargs.get("genai_spans", True):
            self._genai_spans(tel, kwargs.get("tracer_provider"))

    def _wrap(self, owner: Any, name: str, wrapper: Wrapper) -> None:
        wrap_function_wrapper(owner, name, wrapper)
        self._wrapped.append((owner, name))

    def _redis(self, hooks: _RedisHooks) -> None:
        try:
            owners = [importlib.import_module(m) for m, _, _, _ in _REDIS_TARGETS]
        except ImportError:
            return
        for owner, (_, cls, method, factory) in zip(owners, _REDIS_TARGETS, strict=True):
            self._wrap(getattr(owner, cls), method, factory(hooks))

    def _openai(self, tel: Telemetry, req: Hook, resp: Hook) -> None:
        try:
            import httpx  # noqa: F401  # the transports' and the client's
            import openai

            from . import llm, openai_client  # noqa: F401
        except ImportError:
            return
        self._wrap(openai.OpenAI, "__init__", _openai_init(tel, req, resp, False))
        self._wrap(openai.AsyncOpenAI, "__init__", _openai_init(tel, req, resp, True))

    def _genai_spans(self, tel: Telemetry, provider: Any) -> None:
        """Read the GenAI usage attributes of every span back into warmscope's counts (an SDK
        tracer provider only: the API's default provider records no spans)."""
        from .genai import GenAIUsageSpanProcessor

        provider = provider or trace.get_tracer_provider()
        if not hasattr(provider, "add_span_processor"):
            return
        proc = getattr(self, "_span_processor", None)
        if proc is None or proc.provider is not provider:
            proc = GenAIUsageSpanProcessor(tel)
            proc.provider = provider
            provider.add_span_processor(proc)
            self._span_processor = proc
        proc.active = True

    def _uninstrument(self, **kwargs: Any) -> None:
        proc = getattr(self, "_span_processor", None)
        if proc is not None:  # an SDK provider cannot drop a processor: it stops counting
            proc.active = False
        for owner, name in reversed(getattr(self, "_wrapped", [])):
            unwrap(owner, name)
        self._wrapped = []


def telemetry() -> Telemetry:
    """The pipeline the instrumentor counts into (for tests and hooks)."""
    return current_telemetry()
