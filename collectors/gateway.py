"""An ASGI reverse proxy that records OpenAI-compatible traffic on its way to an engine.

For services that cannot change code: point them at the gateway instead of
the engine. Every request is forwarded to ``upstream`` unchanged (method,
path, query, headers except hop-by-hop ones, body) and the response comes
back unchanged, streamed chunk by chunk as the engine sends it;
``/chat/completions`` and ``/completions`` are recorded as described in
:mod:`warmscope.collectors.llm`. When the engine cannot be reached the client
gets ``502`` (``504`` on a timeout), as from any reverse proxy, and the failure
is counted. Bad input is forwarded as is and counted, never a crash.

Needs the ``gateway`` extra (Starlette, uvicorn, httpx)::

    from warmscope.collectors.gateway import make_app
    app = make_app("http://127.0.0.1:8000")      # any ASGI server runs it

or ``warmscope gateway --upstream http://127.0.0.1:8000 --port 8080``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .llm import LLMRecorder
from .pipeline import Telemetry

__all__ = ["make_app"]

_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})


def make_app(upstream: str, telemetry: Telemetry | None = None, timeout_s: float = 600.0,
             kv: Any = None, **recorder_kw: Any) -> Starlette:
    """The gateway as a Starlette app; ``app.state.recorder`` holds its
    :class:`~warmscope.collectors.llm.LLMRecorder` (``stats``, ``hot_prefixes``)."""
    base = upstream.rstrip("/")
    recorder = LLMRecorder(telemetry, **recorder_kw)
    client = httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(timeout_s, connect=10.0),
                               limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    async def proxy(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        ex = recorder.begin(request.method, path, request.headers, body)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        if ex is not None and ex.body is not None:  # a plain body, so that the usage chunk can be taken out
            headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"] + [("accept-encoding", "identity")]
        content = body if ex is None or ex.body is None else ex.body
        if kv is not None:  # a kv.gateway_hook.KVGatewayHook: session id (and salt) for KV events
            content = kv.before(ex, path, content)
        req = client.build_request(request.method, path, params=request.url.query or None,
                                   headers=headers, content=content)
        try:
            resp = await client.send(req, stream=True)
        except Exception as e:
            if ex is not None:
                ex.finish(e)
            timeout = isinstance(e, httpx.TimeoutException)
            return JSONResponse({"error": {"message": f"warmscope gateway: upstream {base} "
                                           + ("timed out" if timeout else "unreachable") + f" ({type(e).__name__})",
                                           "type": "upstream_error"}}, status_code=504 if timeout else 502)
        encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        if ex is not None:
            ex.response(resp.status_code, resp.headers.get("content-type"))
            if encoded:
                ex.skip, ex.strip = True, False  # compressed bytes are forwarded, not parsed

        async def body_iter() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk if ex is None else ex.feed(chunk)
            except BaseException as e:  # upstream cut, or the client went away
                if ex is not None:
                    ex.finish(e)
                raise
            finally:
                await resp.aclose()
            if ex is not None:
                yield ex.flush()
                ex.finish()
                if kv is not None:
                    kv.after(ex)

        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP - {"content-length"}}
        return StreamingResponse(body_iter(), status_code=resp.status_code, headers=out_headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()
        recorder.close()
        if kv is not None:
            kv.close()

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    app = Starlette(routes=[Route("/{path:path}", proxy, methods=methods)], lifespan=lifespan)
    app.state.recorder = recorder
    app.state.upstream = base
    return app


@contextlib.contextmanager
def serve(app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> Iterator[str]:
    """Run an ASGI app with uvicorn in a background thread; yields its base URL.
    ``port=0`` picks a free one. Stopped (gracefully) when the block ends."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    cfg = uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False)
    server = uvicorn.Server(cfg)
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="warmscope-asgi")
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
