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
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from .context import INTERNAL
from .pipeline import Telemetry, current_telemetry, setup
from .redis import _Interpreter, _queued, is_instrumented

__all__ = ["WarmscopeInstrumentor"]

Hook = Callable[..., Any] | None


def _call(hook: Hook, tel: Telemetry, what: str, *args: Any) -> None:
    if hook is None:
        return
    try:
        hook(trace.get_current_span(), *args)
    except Exception as e:  # a hook never breaks the host
        tel.aggregator.count_error("hook", what, e)


class WarmscopeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """warmscope's Redis and OpenAI-client instrumentation as an OpenTelemetry instrumentor."""

    _patched: list[tuple[Any, str, Any]]

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # each library is patched when it is importable; none is required

    def _instrument(self, **kwargs: Any) -> None:
        self._patched = []
        tel: Telemetry = kwargs.get("telemetry") or setup()
        req, resp = kwargs.get("request_hook"), kwargs.get("response_hook")
        if kwargs.get("redis", True):
            layer = (
                kwargs.get("redis_layer") or os.environ.get("WARMSCOPE_REDIS_LAYER") or "response"
            )
            self._redis(_Interpreter(layer, tel), tel, req, resp)
        if kwargs.get("openai", True):
            self._openai(tel, req, resp)
        if kwargs.get("genai_spans", True):
            self._genai_spans(tel, kwargs.get("tracer_provider"))

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
        for owner, name, orig in reversed(getattr(self, "_patched", [])):
            setattr(owner, name, orig)
        self._patched = []

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        orig = owner.__dict__[name]
        self._patched.append((owner, name, orig))
        setattr(owner, name, functools.wraps(orig)(make(orig)))

    # ---- Redis ---------------------------------------------------------------------------------

    def _redis(self, interp: _Interpreter, tel: Telemetry, req: Hook, resp: Hook) -> None:
        try:
            import redis
            import redis.asyncio
            import redis.asyncio.client
            import redis.client
        except ImportError:
            return

        # The shared part of the sync and async wrappers, which differ only by their await.
        def asked(client: Any, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
            """Whether a command is observed: not counted already (an instrumented client),
            not warmscope's own. When it is, the request hook has been called."""
            if is_instrumented(client) or INTERNAL.get():
                return False
            _call(req, tel, "redis request_hook", client, args, options)
            return True

        def answered(client: Any, args: tuple[Any, ...], r: Any) -> Any:
            """A command's reply ``r``, once interpreted and given to the response hook."""
            interp.outcome(args, r)
            _call(resp, tel, "redis response_hook", client, r)
            return r

        def command(orig: Any) -> Any:
            if inspect.iscoroutinefunction(orig):

                async def acall(self: Any, *args: Any, **options: Any) -> Any:
                    if not asked(self, args, options):
                        return await orig(self, *args, **options)
                    try:
                        r = await orig(self, *args, **options)
                    except Exception as e:
                        interp.outcome(args, e)
                        raise
                    return answered(self, args, r)

                return acall

            def call(self: Any, *args: Any, **options: Any) -> Any:
                if not asked(self, args, options):
                    return orig(self, *args, **options)
                try:
                    r = orig(self, *args, **options)
                except Exception as e:
                    interp.outcome(args, e)
                    raise
                return answered(self, args, r)

            return call

        def done(stack: list[tuple[Any, ...]], results: Any) -> None:
            for args, r in zip(stack, results, strict=False):
                interp.outcome(args, r)

        def pipe_asked(pipe: Any) -> list[tuple[Any, ...]] | None:
            """The commands of a pipeline that is observed (see ``asked``), after the request
            hook; None when it is not."""
            if is_instrumented(pipe) or INTERNAL.get():
                return None
            try:
                stack = _queued(pipe)
            except Exception as e:
                interp.failed("redis pipeline inspection", e)
                stack = []
            _call(req, tel, "redis request_hook", pipe, ("PIPELINE",), {"stack": stack})
            return stack

        def pipe_answered(pipe: Any, stack: list[tuple[Any, ...]], results: Any) -> Any:
            done(stack, results)
            _call(resp, tel, "redis response_hook", pipe, results)
            return results

        def execute(orig: Any) -> Any:
            if inspect.iscoroutinefunction(orig):

                async def aexecute(self: Any, raise_on_error: bool = True) -> Any:
                    stack = pipe_asked(self)
                    if stack is None:
                        return await orig(self, raise_on_error)
                    try:
                        results = await orig(self, raise_on_error)
                    except Exception as e:
                        done(stack, [e] * len(stack))
                        raise
                    return pipe_answered(self, stack, results)

                return aexecute

            def sexecute(self: Any, raise_on_error: bool = True) -> Any:
                stack = pipe_asked(self)
                if stack is None:
                    return orig(self, raise_on_error)
                try:
                    results = orig(self, raise_on_error)
                except Exception as e:
                    done(stack, [e] * len(stack))
                    raise
                return pipe_answered(self, stack, results)

            return sexecute

        self._patch(redis.client.Redis, "execute_command", command)
        self._patch(redis.client.Pipeline, "execute", execute)
        self._patch(redis.asyncio.client.Redis, "execute_command", command)
        self._patch(redis.asyncio.client.Pipeline, "execute", execute)

    # ---- OpenAI client -------------------------------------------------------------------------

    def _openai(self, tel: Telemetry, req: Hook, resp: Hook) -> None:
        try:
            import httpx
            import openai

            from .llm import LLMRecorder
            from .openai_client import AsyncInstrumentedTransport, InstrumentedTransport
        except ImportError:
            return
        recorder: list[LLMRecorder] = []

        def shared() -> LLMRecorder:
            if not recorder:
                recorder.append(LLMRecorder(tel))
            return recorder[0]

        class _Hooked(InstrumentedTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                _call(req, tel, "openai request_hook", request)
                r = super().handle_request(request)
                _call(resp, tel, "openai response_hook", request, r)
                return r

        class _AsyncHooked(AsyncInstrumentedTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                _call(req, tel, "openai request_hook", request)
                r = await super().handle_async_request(request)
                _call(resp, tel, "openai response_hook", request, r)
                return r

        def wrap_transport(t: Any, is_async: bool) -> Any:
            if t is None or isinstance(t, (InstrumentedTransport, AsyncInstrumentedTransport)):
                return t
            return (_AsyncHooked if is_async else _Hooked)(t, recorder=shared())

        def instrumented(http: Any, is_async: bool) -> Any:
            """``http`` (an httpx client: openai accepts httpx's and httpx2's) sending through
            warmscope's transport; a new httpx client when the caller gave none."""
            if http is None:
                http = (httpx.AsyncClient if is_async else httpx.Client)(follow_redirects=True)
            # e.g. an httpx2 client of the caller's
            if not isinstance(http, (httpx.AsyncClient, httpx.Client)):
                tel.aggregator.count_error(
                    "hook",
                    "openai http_client not httpx: not instrumented",
                    TypeError(type(http).__name__),
                )
                return http
            http._transport = wrap_transport(http._transport, is_async)
            http._mounts = {k: wrap_transport(v, is_async) for k, v in http._mounts.items()}
            return http

        def init(orig: Any, is_async: bool) -> Any:
            def __init__(self: Any, *a: Any, **kw: Any) -> None:  # noqa: N807
                try:
                    kw["http_client"] = instrumented(kw.get("http_client"), is_async)
                except Exception as e:  # an unknown client shape: it works uninstrumented
                    tel.aggregator.count_error("hook", "openai client instrumentation", e)
                orig(self, *a, **kw)

            return __init__

        self._patch(openai.OpenAI, "__init__", lambda orig: init(orig, False))
        self._patch(openai.AsyncOpenAI, "__init__", lambda orig: init(orig, True))


def telemetry() -> Telemetry:
    """The pipeline the instrumentor counts into (for tests and hooks)."""
    return current_telemetry()
