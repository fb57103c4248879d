"""Instrument an OpenAI-compatible client: an httpx transport and an ``openai`` wrapper.

Needs the ``client`` extra (``pip install "warmscope[client]"``)::

    import openai
    from warmscope import collectors
    from warmscope.collectors.openai_client import instrument_openai

    tel = collectors.setup()
    client = instrument_openai(openai.OpenAI(base_url="http://vllm:8000/v1", api_key="-"))
    with collectors.request_context(tenant="acme", unit=session_id):
        client.chat.completions.create(model="m", messages=msgs,
                                       stream=True, stream_options={"include_usage": True})

Any httpx user can take the transport itself:
``httpx.Client(transport=InstrumentedTransport())`` (``AsyncInstrumentedTransport``
for ``httpx.AsyncClient``). What is recorded is described in
:mod:`warmscope.collectors.llm`. The transport passes requests and responses
through unchanged (streaming included) and never raises anything of its own:
the caller sees exactly the responses and exceptions it would see without it.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from .llm import Exchange, LLMRecorder
from .pipeline import Telemetry

_SECOND = operator.itemgetter(1)

__all__ = [
    "InstrumentedTransport",
    "AsyncInstrumentedTransport",
    "instrument_openai",
    "recorder_of",
]


def _begin(recorder: LLMRecorder, request: httpx.Request) -> tuple[Exchange | None, httpx.Request]:
    """The exchange to record (None: pass through) and the request to send:
    the caller's, or a copy whose body asks a stream for its usage."""
    try:
        body: bytes | None = request.content
    except httpx.RequestNotRead:  # a streamed upload: not parsed
        body = None
    ex = recorder.begin(request.method, request.url.path, request.headers, body)
    if ex is None or ex.body is None:
        return ex, request
    try:
        return ex, _with_body(request, ex.body)
    except Exception as e:  # send the caller's request as it was
        recorder.agg.count_error("record", "llm request", e)
        ex.body, ex.strip = None, False
        return ex, request


def _with_body(request: httpx.Request, body: bytes) -> httpx.Request:
    """A copy of ``request`` with another body, asking for a plain (not
    compressed) response so that the usage chunk can be taken out of it. The
    caller's request object is left as it was. Copied attribute by attribute:
    building a new ``httpx.Request`` parses the URL again (~100 µs), and the
    headers are rebuilt from their parsed list in one pass when httpx keeps
    one (``Headers.copy`` and ``__setitem__`` re-encode every header)."""
    new = httpx.Request.__new__(httpx.Request)
    new.__dict__.update(request.__dict__)
    new.headers = _headers_with(request.headers, (_LENGTH, b"%d" % len(body)), _IDENTITY)
    new.stream = httpx.ByteStream(body)
    new._content = body
    return new


_LENGTH, _ENCODING = b"content-length", b"accept-encoding"
_IDENTITY = (_ENCODING, b"identity")


def _headers_with(headers: httpx.Headers, *items: tuple[bytes, bytes]) -> httpx.Headers:
    """A copy of ``headers`` with each (lower-case name, value) of ``items`` set
    in the place of the first header of that name (or appended), the others of
    that name dropped, as ``Headers.__setitem__`` does."""
    lst = getattr(headers, "_list", None)
    if not isinstance(lst, list):  # another httpx: the public way
        out = headers.copy()
        for k, v in items:
            out[k.decode("ascii")] = v.decode("latin-1")
        return out
    rows = lst[:]
    names = list(map(_SECOND, rows))  # lower-case names, listed in C
    for k, v in items:
        n = names.count(k)
        if n == 1:  # the usual case: set in its place
            rows[names.index(k)] = (k, k, v)
        elif n == 0:
            rows.append((k, k, v))
            names.append(k)
        else:  # in the first one's place, and no other of that name
            i = names.index(k)
            rows[i] = (k, k, v)
            rows[i + 1 :] = [r for r in rows[i + 1 :] if r[1] != k]
            names = list(map(_SECOND, rows))
    new = httpx.Headers.__new__(httpx.Headers)
    new._list = rows
    new._encoding = headers._encoding
    return new


class _Stream:
    """The response body read through the recorder (sync and async below); a
    body that fails records how it ended, and the error reaches the caller.
    Once the exchange is recorded the stream lets go of it: httpx's response
    and its stream refer to each other, so what they hold is freed only by a
    garbage collection, and the exchange (the parsed prefix and usage) is
    then freed at once instead."""

    def __init__(self, inner: Any, ex: Exchange) -> None:
        self._inner = inner
        self._ex: Exchange | None = ex

    def _finish(self, error: BaseException | None = None) -> None:
        """Record how the body ended (``error``: how it failed), once, and let go of the
        exchange."""
        ex, self._ex = self._ex, None
        if ex is not None:
            ex.finish(error)

    def _end(self, ex: Exchange) -> bytes:
        """The body ended without error: let go of the exchange; the bytes it still held."""
        self._ex = None
        return ex.end()


class _SyncStream(_Stream, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        ex = self._ex
        if ex is None:  # read again after its end: passed through
            yield from self._inner
            return
        feed, filt = ex.feed, ex._filter
        try:
            for chunk in self._inner:
                out = filt(chunk) if ex.strip else feed(chunk)  # (as feed does, without its frame)
                if out:  # bytes held back (a line not yet complete) come with a later chunk
                    yield out
        except BaseException as e:
            self._finish(e)
            raise
        rest = self._end(ex)
        del ex, feed, filt
        if rest:
            yield rest

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._finish()


class _AsyncStream(_Stream, httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        ex = self._ex
        if ex is None:  # read again after its end: passed through
            async for chunk in self._inner:
                yield chunk
            return
        feed, filt = ex.feed, ex._filter
        try:
            async for chunk in self._inner:
                out = filt(chunk) if ex.strip else feed(chunk)
                if out:
                    yield out
        except BaseException as e:
            self._finish(e)
            raise
        rest = self._end(ex)
        del ex, feed, filt
        if rest:
            yield rest

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._finish()


def _wrap(resp: httpx.Response, ex: Exchange, stream: Any) -> httpx.Response:
    ctype = enc = b""
    lst = getattr(resp.headers, "_list", None)  # (raw name, lower-case name, value)
    rows = lst if isinstance(lst, list) else [(k, k.lower(), v) for k, v in resp.headers.raw]
    names = list(map(_SECOND, rows))  # lower-case names, listed in C
    if b"content-type" in names:
        ctype = rows[names.index(b"content-type")][2]
    if b"content-encoding" in names:
        enc = rows[names.index(b"content-encoding")][2].lower()
    ex.response(resp.status_code, ctype.decode("latin-1"))
    if enc not in (b"", b"identity"):
        ex.skip, ex.strip = True, False  # compressed bytes are passed on, not parsed
    resp.stream = stream  # the same response, its body read through the recorder
    return resp


class InstrumentedTransport(httpx.BaseTransport):
    """An httpx transport that records OpenAI-compatible completions and
    forwards everything to ``transport`` (default: ``httpx.HTTPTransport()``)."""

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        telemetry: Telemetry | None = None,
        recorder: LLMRecorder | None = None,
        **recorder_kw: Any,
    ) -> None:
        self.transport = transport or httpx.HTTPTransport()
        self.recorder = recorder or LLMRecorder(telemetry, **recorder_kw)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        ex, request = _begin(self.recorder, request)
        if ex is None:
            return self.transport.handle_request(request)
        try:
            resp = self.transport.handle_request(request)
        except BaseException as e:
            ex.finish(e)
            raise
        return _wrap(resp, ex, _SyncStream(resp.stream, ex))

    def close(self) -> None:
        self.transport.close()


class AsyncInstrumentedTransport(httpx.AsyncBaseTransport):
    """The asyncio counterpart of :class:`InstrumentedTransport`."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        telemetry: Telemetry | None = None,
        recorder: LLMRecorder | None = None,
        **recorder_kw: Any,
    ) -> None:
        self.transport = transport or httpx.AsyncHTTPTransport()
        self.recorder = recorder or LLMRecorder(telemetry, **recorder_kw)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ex, request = _begin(self.recorder, request)
        if ex is None:
            return await self.transport.handle_async_request(request)
        try:
            resp = await self.transport.handle_async_request(request)
        except BaseException as e:
            ex.finish(e)
            raise
        return _wrap(resp, ex, _AsyncStream(resp.stream, ex))

    async def aclose(self) -> None:
        await self.transport.aclose()


def instrument_openai(client: Any, telemetry: Telemetry | None = None, **recorder_kw: Any) -> Any:
    """A copy of an ``openai.OpenAI`` / ``openai.AsyncOpenAI`` (or any client with
    ``with_options(http_client=...)``) whose requests go through an instrumented
    transport. Timeouts, retries and base URL are the client's own.
    ``recorder_kw``: :class:`~warmscope.collectors.llm.LLMRecorder` options
    (``experiment``, ``variant``, ``tenant_header``, ``session_header``)."""
    is_async = "Async" in type(client).__name__
    if is_async:
        http: Any = httpx.AsyncClient(
            transport=AsyncInstrumentedTransport(telemetry=telemetry, **recorder_kw),
            timeout=client.timeout,
            follow_redirects=True,
        )
    else:
        http = httpx.Client(
            transport=InstrumentedTransport(telemetry=telemetry, **recorder_kw),
            timeout=client.timeout,
            follow_redirects=True,
        )
    return client.with_options(http_client=http)


def recorder_of(client: Any) -> LLMRecorder:
    """The recorder behind an instrumented openai or httpx client (for its
    ``stats`` and ``hot_prefixes``)."""
    http = getattr(client, "_client", client)
    return http._transport.recorder  # type: ignore[no-any-return]  # set by the instrumented transport
