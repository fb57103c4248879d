"""An ASGI reverse proxy that records OpenAI-compatible traffic on its way to an engine.

For services that cannot change code: point them at the gateway instead of
the engine. Every request is forwarded to ``upstream`` unchanged (method,
path, query, headers except hop-by-hop ones, body) and the response comes
back unchanged, streamed chunk by chunk as the engine sends it;
``/chat/completions`` and ``/completions`` are recorded as described in
:mod:`warmscope.collectors.llm` (a stream whose usage chunk the gateway asked for and takes out
goes back chunked, without the upstream's length). An upstream that ends a response early (a
stream cut, a body shorter than its length) cuts the caller's response there (its connection
closes) and is counted in the recorder's ``cut_streams``, without a traceback in the log. When
the engine cannot be reached the client gets ``502`` (``504`` on a timeout), as from any reverse
proxy, and the failure is counted. Bad input is forwarded as is and counted, never a crash: header
values are forwarded as the bytes that came (UTF-8 or latin-1 tenants
included). The gateway's own bounds: a body over ``max_body_bytes`` gets
``413``, a body not read within ``body_timeout_s`` gets ``408``, and request
headers not complete within ``header_timeout_s`` of the connection (or of the
previous response) get ``408`` from :func:`bounded_protocol`; a client that
hangs up before its body is read is counted, not logged. All four are counted
in ``app.state.stats``.

Needs the ``gateway`` extra (Starlette, uvicorn, httpx)::

    from warmscope.collectors.gateway import make_app
    app = make_app("http://127.0.0.1:8000")      # any ASGI server runs it

or ``warmscope gateway --upstream http://127.0.0.1:8000 --port 8080``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .llm import LLMRecorder
from .pipeline import Telemetry

__all__ = [
    "make_app",
    "bounded_protocol",
    "UpstreamCut",
    "MAX_BODY_BYTES",
    "BODY_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
]

MAX_BODY_BYTES = 32 << 20  # 32 MiB: far above any chat request, far below what hurts the process
BODY_TIMEOUT_S = 30.0  # to read a whole request body
HEADER_TIMEOUT_S = 10.0  # to read a request's headers
GATEWAY_STATS = ("too_large", "body_timeouts", "header_timeouts", "client_disconnects")

_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class UpstreamCut(Exception):
    """The upstream ended a response early: the caller's response is cut where the upstream's
    was (its connection closed), and the request counted in the recorder's ``cut_streams``."""


def _quiet_cut(record: logging.LogRecord) -> bool:
    """uvicorn logs an exception that ends a response as "Exception in ASGI application" with
    its traceback; an upstream's cut is expected and counted, so it is not logged."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, UpstreamCut)


def _error(status: int, message: str) -> JSONResponse:
    err = {"message": f"warmscope gateway: {message}", "type": "request_error"}
    return JSONResponse({"error": err}, status_code=status, headers={"connection": "close"})


class _Gateway:
    """One gateway's state and its request path: read the body (bounded), forward it upstream
    with the recorder's changes, stream the answer back through the recorder."""

    def __init__(
        self,
        upstream: str,
        recorder: LLMRecorder,
        timeout_s: float,
        max_body_bytes: int,
        body_timeout_s: float,
        kv: Any,
    ) -> None:
        self.base = upstream.rstrip("/")
        self.recorder = recorder
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.kv = kv  # a kv.gateway_hook.KVGatewayHook: session id (and salt) for KV events
        self.stats = dict.fromkeys(GATEWAY_STATS, 0)
        self.client = httpx.AsyncClient(
            base_url=self.base,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # an idle upstream connection is dropped at 4 s, before the 5 s after which uvicorn
            # (vLLM's and SGLang's server) closes it: a request is never sent on a connection
            # the upstream is closing at that moment (a ReadError, answered 502)
            limits=httpx.Limits(
                max_connections=256, max_keepalive_connections=64, keepalive_expiry=4.0
            ),
        )

    async def read_body(self, request: Request) -> bytes | Response:
        """The request body, or the response that refuses it (counted)."""
        limit, stats = self.max_body_bytes, self.stats
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > limit:
            stats["too_large"] += 1
            return _error(413, f"body of {size} bytes is over the limit of {limit}")
        parts: list[bytes] = []
        n = 0

        async def read() -> bool:
            nonlocal n
            async for chunk in request.stream():
                n += len(chunk)
                if n > limit:
                    return False
                parts.append(chunk)
            return True

        try:
            fits = await asyncio.wait_for(read(), self.body_timeout_s)
        except TimeoutError:
            stats["body_timeouts"] += 1
            return _error(408, f"request body not received within {self.body_timeout_s:g} s")
        if not fits:
            stats["too_large"] += 1
            return _error(413, f"request body is over the limit of {limit} bytes")
        return b"".join(parts)

    def upstream_request(self, request: Request, body: bytes, ex: Any) -> httpx.Request:
        """The request to send upstream: the header bytes as they came (a UTF-8 or latin-1 value
        is forwarded, not re-encoded) less hop-by-hop ones, and the recorder's body."""
        path = request.url.path
        headers = [
            (k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in _HOP
        ]
        if ex is not None and ex.body is not None:  # plain, so the usage chunk can be taken out
            headers = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        content = body if ex is None or ex.body is None else ex.body
        if self.kv is not None:
            content = self.kv.before(ex, path, content)
        return self.client.build_request(
            request.method, path, params=request.url.query or None, headers=headers, content=content
        )

    def unreachable(self, e: Exception) -> JSONResponse:
        """502 (or 504 on a timeout) naming the upstream."""
        timeout = isinstance(e, httpx.TimeoutException)
        message = (
            f"warmscope gateway: upstream {self.base} "
            + ("timed out" if timeout else "unreachable")
            + f" ({type(e).__name__})"
        )
        return JSONResponse(
            {"error": {"message": message, "type": "upstream_error"}},
            status_code=504 if timeout else 502,
        )

    async def proxy(self, request: Request) -> Response:
        try:
            body = await self.read_body(request)
        except ClientDisconnect:  # the client hung up mid-body: nobody to answer
            self.stats["client_disconnects"] += 1
            return Response(status_code=499)
        if isinstance(body, Response):
            return body
        ex = self.recorder.begin(request.method, request.url.path, request.headers, body)
        try:
            resp = await self.client.send(self.upstream_request(request, body, ex), stream=True)
        except Exception as e:
            if ex is not None:
                ex.finish(e)
            return self.unreachable(e)
        encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        if ex is not None:
            ex.response(resp.status_code, resp.headers.get("content-type"))
            if encoded:
                ex.skip, ex.strip = True, False  # compressed bytes are forwarded, not parsed
        # The upstream's length holds for the body as it came; a stream whose usage chunk is
        # taken out is shorter, and goes out chunked.
        hop = _HOP if ex is not None and ex.strip else _HOP - {"content-length"}
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in hop}
        return StreamingResponse(
            self.relay(resp, ex, request.url.path),
            status_code=resp.status_code,
            headers=out_headers,
        )

    async def relay(self, resp: httpx.Response, ex: Any, path: str) -> AsyncIterator[bytes]:
        """The upstream's body through the recorder; an upstream cut cuts the caller's too."""
        try:
            async for chunk in resp.aiter_raw():
                yield chunk if ex is None else ex.feed(chunk)
        except httpx.HTTPError as e:
            if ex is not None:
                ex.finish(e)
            raise UpstreamCut(
                f"upstream {self.base} ended {path} early ({type(e).__name__})"
            ) from None
        except BaseException as e:  # the client went away
            if ex is not None:
                ex.finish(e)
            raise
        finally:
            await resp.aclose()
        if ex is not None:
            yield ex.flush()
            ex.finish()
            if self.kv is not None:
                self.kv.after(ex)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        logging.getLogger("uvicorn.error").addFilter(_quiet_cut)  # counted, not a traceback
        yield
        await self.client.aclose()
        self.recorder.close()
        if self.kv is not None:
            self.kv.close()


def make_app(
    upstream: str,
    telemetry: Telemetry | None = None,
    timeout_s: float = 600.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
    kv: Any = None,
    **recorder_kw: Any,
) -> Starlette:
    """The gateway as a Starlette app; ``app.state.recorder`` holds its
    :class:`~warmscope.collectors.llm.LLMRecorder` (``stats``, ``hot_prefixes``),
    ``app.state.stats`` the requests it refused or lost (:data:`GATEWAY_STATS`)."""
    gw = _Gateway(
        upstream,
        LLMRecorder(telemetry, **recorder_kw),
        timeout_s,
        max_body_bytes,
        body_timeout_s,
        kv,
    )
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    app = Starlette(routes=[Route("/{path:path}", gw.proxy, methods=methods)], lifespan=gw.lifespan)
    app.state.recorder = gw.recorder
    app.state.upstream = gw.base
    app.state.stats = gw.stats
    return app


def bounded_protocol(app: Any, header_timeout_s: float = HEADER_TIMEOUT_S) -> type[Any]:
    """uvicorn's h11 protocol with a header read timeout: a connection whose
    request headers are not complete ``header_timeout_s`` after it opened (or
    after its previous response) gets ``408`` and is closed, counted in
    ``app.state.stats["header_timeouts"]`` when the app has one. Pass it as
    ``uvicorn.Config(http=...)``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    stats = getattr(getattr(app, "state", None), "stats", None)

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if stats is not None:
                stats["header_timeouts"] += 1
            if self.conn.our_state is h11.IDLE:
                body = b"request headers not received in time\n"
                head = [
                    (b"content-type", b"text/plain"),
                    (b"connection", b"close"),
                    (b"content-length", str(len(body)).encode()),
                ]
                with contextlib.suppress(h11.LocalProtocolError):
                    resp = h11.Response(status_code=408, headers=head, reason=b"Request Timeout")
                    out = self.conn.send(resp) or b""
                    self.transport.write(out + (self.conn.send(h11.Data(data=body)) or b""))
            self.transport.close()

    return BoundedH11Protocol


@contextlib.contextmanager
def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    header_timeout_s: float = HEADER_TIMEOUT_S,
) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a background thread; yields its base URL.
    ``port=0`` picks a free one. Stopped (gracefully) when the block ends. A
    gateway app gets the header read timeout of :func:`bounded_protocol`."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    gateway = hasattr(getattr(app, "state", None), "stats")
    http: Any = bounded_protocol(app, header_timeout_s) if gateway else "auto"
    cfg = uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False, http=http)
    server = uvicorn.Server(cfg)
    th = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="warmscope-asgi"
    )
    th.start()
    deadline = time.monotonic() + 30
    while not server.started and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        th.join(timeout=10)
        sock.close()
