"""A small OpenAI-compatible HTTP server for the client/gateway tests.

It answers like vLLM (usage with ``prompt_tokens_details.cached_tokens`` in whole
32-token blocks of a prefix seen before) and produces, on request, the faults a
real engine does not produce on demand: a stream cut mid-way (model ``cut``),
a body that is not JSON (``badjson``), no usage details (``nousage``), an
engine error (``error``, HTTP 500). Real behaviour is checked against vLLM in
tests/engine.
"""

from __future__ import annotations

import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

BLOCK = 32


def make_upstream(prefill_s_per_token: float = 0.0) -> Starlette:
    """``prefill_s_per_token``: the answer waits that long per prompt token not cached, as an
    engine's prefill does (0: answers at once)."""
    seen: set[str] = set()

    def usage_for(body: dict) -> dict:
        msgs = body.get("messages") or [{"content": body.get("prompt", "")}]
        prompt = sum(len(str(m.get("content", ""))) for m in msgs) // 4 + 8
        prefix = json.dumps(msgs[:-1] if len(msgs) > 1 else msgs[:1])
        plen = len(prefix) // 4
        cached = (min(plen, prompt - 1) // BLOCK) * BLOCK if prefix in seen else 0
        seen.add(prefix)
        return {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return JSONResponse({"error": {"message": "body is not JSON", "type": "BadRequest"}}, 400)
        model = body.get("model", "")
        if model == "error":
            return JSONResponse({"error": {"message": "engine failed"}}, 500)
        if model == "badjson":
            return Response(b"{not json", media_type="application/json")
        usage = None if model == "nousage" else usage_for(body)
        if prefill_s_per_token and usage:
            missed = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
            await asyncio.sleep(prefill_s_per_token * missed)
        if not body.get("stream"):
            out = {"id": "c1", "object": "chat.completion", "model": model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok ok ok"},
                                "finish_reason": "length"}]}
            if usage:
                out["usage"] = usage
            return JSONResponse(out)
        include = (body.get("stream_options") or {}).get("include_usage")

        async def sse():
            for i, tok in enumerate(["", "ok", " ok", " ok"]):
                delta = {"role": "assistant", "content": tok} if i == 0 else {"content": tok}
                chunk = {"id": "c1", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                if include:
                    chunk["usage"] = None
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                if model == "cut" and i == 1:
                    raise RuntimeError("connection lost mid-stream")
            if include and usage:
                yield f"data: {json.dumps({'id': 'c1', 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models)])
