"""The gateway at the edges of what an upstream sends: a streamed answer with a Content-Length (the
usage chunk taken out must not leave the caller a cut body), upstream responses that end early (cut for
the caller, counted, no traceback), the 408's reason phrase and the no-usage warning's wording; and no
"shutdown can only be called once" when a process with the Prometheus or OTLP exporter exits."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from warmscope.collectors.gateway import make_app, serve

from .llm_upstream import make_upstream
from .test_edges import raw_request


def _sse(model: str, include_usage: bool) -> bytes:
    """A vLLM-like chat stream; with include_usage the "usage": null fields and the usage-only chunk."""
    out = []
    for i, tok in enumerate(["", "ok", " ok", " ok"]):
        delta = {"role": "assistant", "content": tok} if i == 0 else {"content": tok}
        chunk = {"id": "c1", "object": "chat.completion.chunk", "model": model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": "length" if i == 3 else None}]}
        if include_usage:
            chunk["usage"] = None
        out.append(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n")
    if include_usage:
        usage = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
                 "prompt_tokens_details": {"cached_tokens": 32}}
        out.append(f"data: {json.dumps({'id': 'c1', 'choices': [], 'usage': usage}, separators=(',', ':'))}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


class RawUpstream:
    """An HTTP/1.1 upstream written by hand, for what a well-behaved server does not send: the body's model
    picks the answer. ``sized``: a complete stream with a Content-Length instead of chunks; ``short``: a body
    shorter than its Content-Length; ``cut``: a chunked stream closed mid-way; ``unended``: every chunk of a
    stream but not the last (empty) one; ``whole``: a chunked stream as it should be."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                          if k.strip().lower() == b"content-length")
            while len(body) < length:
                body += conn.recv(65536)
            req = json.loads(body)
            model = req["model"]
            sse = _sse(model, bool((req.get("stream_options") or {}).get("include_usage")))
            start = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
            if model == "sized":
                conn.sendall(start + b"content-length: %d\r\n\r\n" % len(sse) + sse)
            elif model == "short":
                conn.sendall(start + b"content-length: %d\r\n\r\n" % (len(sse) + 100) + sse)
            else:
                chunks = [sse[:120], sse[120:]]
                out = start + b"transfer-encoding: chunked\r\n\r\n"
                if model == "cut":
                    out += b"%x\r\n%s\r\n" % (len(chunks[0]), chunks[0]) + b"%x\r\n" % len(chunks[1]) + chunks[1][:20]
                else:  # unended, or whole: with the last chunk
                    out += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
                    if model == "whole":
                        out += b"0\r\n\r\n"
                conn.sendall(out)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_upstream():
    u = RawUpstream()
    yield u
    u.close()


def _chat(model: str) -> dict:
    return {"model": model, "stream": True, "messages": [{"role": "system", "content": "s" * 200},
                                                           {"role": "user", "content": "hello"}]}


def test_a_stream_with_a_content_length_reaches_the_caller_whole(make_tel, raw_upstream):
    # The gateway asks for the usage chunk and takes it out; before, it forwarded the upstream's length and
    # the caller got "peer closed connection without sending complete message body".
    tel = make_tel()
    app = make_app(raw_upstream.url, telemetry=tel)
    with serve(app) as gw:
        r = httpx.post(gw + "/v1/chat/completions", json=_chat("sized"))
    assert r.status_code == 200
    assert r.content == _sse("sized", include_usage=False)  # what the engine sends a caller who did not ask
    assert "content-length" not in r.headers or int(r.headers["content-length"]) == len(r.content)
    st = app.state.recorder.stats
    assert (st["usage_requested"], st["recorded"], st["cut_streams"]) == (1, 1, 0)


def test_upstream_responses_cut_short_are_cut_for_the_caller_counted_and_not_logged(make_tel, raw_upstream,
                                                                                      capfd):
    tel = make_tel()
    app = make_app(raw_upstream.url, telemetry=tel)
    with serve(app, log_level="info") as gw:
        for model in ("short", "cut", "unended"):
            with pytest.raises(httpx.RemoteProtocolError):  # the caller sees the body end early
                httpx.post(gw + "/v1/chat/completions", json=_chat(model))
        ok = httpx.post(gw + "/v1/chat/completions", json=_chat("whole"))  # and the gateway keeps serving
        assert ok.status_code == 200 and ok.content == _sse("whole", include_usage=False)
    assert app.state.recorder.stats["cut_streams"] == 3 and app.state.recorder.stats["recorded"] == 1
    err = capfd.readouterr().err
    assert "Exception in ASGI application" not in err and "Traceback" not in err


def test_the_header_timeout_has_its_reason_phrase(make_tel):
    app = make_app("http://127.0.0.1:9", telemetry=make_tel())
    with serve(app, header_timeout_s=0.3) as gw:
        out = raw_request(gw, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    assert out.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), out[:40]


def test_the_no_usage_warning_says_the_request_is_recorded_unmeasured(make_tel, caplog):
    tel = make_tel()
    with serve(make_upstream()) as up, serve(make_app(up, telemetry=tel)) as gw:
        with caplog.at_level(logging.WARNING, logger="warmscope.collectors"):
            r = httpx.post(gw + "/v1/chat/completions", json={"model": "nousage", "messages": [
                {"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert "no usage.prompt_tokens_details.cached_tokens" in caplog.text
    assert "recorded as unmeasured" in caplog.text and "not recorded" not in caplog.text
    tel.flush()
    req = tel.store.frame("requests")
    assert int(req["requests"].sum()) == 1 and int(req["unmeasured"].sum()) == 1


@pytest.mark.parametrize("exporter", ["prometheus", "otlp"])
def test_a_process_with_an_exporter_exits_without_a_second_shutdown(tmp_path, exporter):
    code = (
        "from warmscope import collectors\n"
        f"tel = collectors.setup(exporter={exporter!r}, key_secret='s', prometheus_port=0, "
        f"otlp_endpoint='http://127.0.0.1:9', store_path={str(tmp_path / 's.db')!r}, export_timeout_s=0.2)\n"
        "tel.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "shutdown can only be called once" not in out.stderr
