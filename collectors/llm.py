"""Prefix-cache telemetry for OpenAI-compatible inference APIs, without touching the engine.

vLLM and SGLang return the prompt tokens they served from their prefix cache
(``usage.prompt_tokens_details.cached_tokens``; vLLM needs
``--enable-prompt-tokens-details``), and a streamed response gives the time to
the first token. :class:`LLMRecorder` turns each request into:

* a ``prefix_kv`` lookup **measured in tokens**: ``cached_tokens`` hits and
  ``prompt_tokens - cached_tokens`` misses, for the request's tenant, model,
  experiment and variant, keyed by the request's *prompt prefix* (the messages
  before the last one, else the first message, else the prompt's first
  characters);
* a request record (TTFT from the first streamed chunk — none for a request
  that is not streamed —, duration, prompt and cached tokens), and the A/B unit (a session) from the request context or a
  session header.

The prefix key is ``KIND:ROLE:TEMPLATE:DIGEST`` where ``TEMPLATE`` is a keyed
hash of the prefix with its digits blanked, written in letters, and
``DIGEST`` a keyed hash of the prefix itself: the key family (with the
default rules, ``chat:system:TEMPLATE:*``) names a template without carrying
any of its text, and the key, like every key, leaves the process only as its
keyed hash. The prefix texts stay in process, in a bounded library that the
warm-up runner (:mod:`warmscope.collectors.warmup_runner`) reads for its
``hot`` warm set.

Labels: tenant from the request context, else the tenant header
(``x-warmscope-tenant``), else the body's ``user`` field; the A/B unit from the
context, else the session header (``x-warmscope-session``); experiment and
variant from the context, else the recorder's defaults.

Never raises into the caller. Engine errors (HTTP status >= 400), timeouts,
connection failures and cut streams count as ``error`` lookups and in
:attr:`LLMRecorder.stats`; a response without usage details is counted and
logged once with what to enable; a body that is not JSON is counted
(``bad_body``) and passed through unchanged.

httpx (the ``client`` extra) is needed only by :mod:`.openai_client`; this
module uses the standard library alone, so the gateway and the client share it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any, Mapping

from . import schema
from .aggregator import ERROR
from .context import RequestContext, _current
from .pipeline import Telemetry, current_telemetry

__all__ = ["LLMRecorder", "Exchange", "prefix_of", "TENANT_HEADER", "SESSION_HEADER"]

log = logging.getLogger("warmscope.collectors")

TENANT_HEADER = "x-warmscope-tenant"
SESSION_HEADER = "x-warmscope-session"
LAYER = "prefix_kv"
_PATHS = ("/chat/completions", "/completions")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_BODY_CAP = 8 << 20  # non-streamed response bodies read for usage up to 8 MiB
_LIB_CAP = 1024  # prefixes kept in process for the warm-up runner
_DIGITS = str.maketrans("0123456789", "0000000000")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
STATS = ("requests", "recorded", "engine_errors", "timeouts", "connect_errors", "cut_streams",
         "no_usage", "bad_body", "not_recorded")


def prefix_of(body: Mapping[str, Any], path: str = "/chat/completions") -> tuple[str, str, Any] | None:
    """(kind, role, prefix) of a request body: the messages before the last one
    (or the first message), or the first 512 characters of a completion prompt."""
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs:
        pre = msgs[:-1] if len(msgs) > 1 else msgs[:1]
        first = pre[0] if isinstance(pre[0], dict) else {}
        role = first.get("role") if first.get("role") in _ROLES else "other"
        return "chat", str(role), [[m.get("role"), m.get("content")] if isinstance(m, dict) else m for m in pre]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return "completion", "prompt", prompt[:512]
    return None


class Exchange:
    """One request in flight: fed the response bytes, recorded once at the end."""

    __slots__ = ("rec", "t0", "ttft", "status", "stream", "buf", "size", "usage", "key", "labels",
                 "prompt", "done", "tail", "skip")

    def __init__(self, rec: "LLMRecorder", key: str | None, labels: tuple, prompt: Any) -> None:
        self.rec = rec
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.status = 0
        self.stream = False
        self.buf: list[bytes] = []
        self.size = 0
        self.usage: dict | None = None
        self.key = key
        self.labels = labels
        self.prompt = prompt
        self.done = False
        self.tail = b""
        self.skip = key is None

    def response(self, status: int, content_type: str | None) -> None:
        try:
            self.status = int(status)
            self.stream = bool(content_type) and "text/event-stream" in content_type
        except Exception as e:
            self.rec.agg.count_error("record", "llm response", e)

    def feed(self, chunk: bytes) -> None:
        """A piece of the response body, as it arrives."""
        if self.skip or not chunk:
            return
        try:
            if self.stream:
                if self.ttft is None:
                    self.ttft = time.perf_counter() - self.t0
                data = self.tail + chunk
                lines = data.split(b"\n")
                self.tail = lines.pop()
                if len(self.tail) > _BODY_CAP:
                    self.tail = b""
                for line in lines:
                    if b'"prompt_tokens"' in line and line.startswith(b"data:"):
                        u = json.loads(line[5:]).get("usage")
                        if isinstance(u, dict):
                            self.usage = u
            elif self.status < 400:
                self.size += len(chunk)
                if self.size <= _BODY_CAP:
                    self.buf.append(chunk)
        except Exception as e:
            self.rec.agg.count_error("record", "llm response chunk", e)

    def finish(self, error: BaseException | None = None) -> None:
        """The response ended (``error``: how it failed). Records once; never raises."""
        if self.done:
            return
        self.done = True
        try:
            self.rec._finish(self, error)
        except Exception as e:
            self.rec.agg.count_error("record", "llm request", e)


class LLMRecorder:
    """Parses OpenAI-compatible requests and responses into warmscope records.

    ``experiment``/``variant``: labels for requests made outside a request
    context with those set (e.g. a client bound to one arm's engine)."""

    def __init__(self, telemetry: Telemetry | None = None, *, experiment: str | None = None,
                 variant: str | None = None, tenant_header: str = TENANT_HEADER,
                 session_header: str = SESSION_HEADER, layer: str = LAYER) -> None:
        self.tel = telemetry or current_telemetry()
        self.agg = self.tel.aggregator
        self.binding = self.agg.bind_layer(layer)
        self.experiment = experiment
        self.variant = variant
        self.tenant_header = tenant_header.lower()
        self.session_header = session_header.lower()
        self.stats: dict[str, int] = {s: 0 for s in STATS}
        self._secret: bytes | None = None
        self._library: dict[str, list] = {}  # key -> [requests, tenant, kind, prefix]
        self._keys: dict[tuple, dict] = {}  # (kind, role) -> prefix text -> key (bounded, in process)
        self._contexts: dict[tuple, RequestContext] = {}  # labels -> context (bounded)
        self._lock = threading.Lock()
        self._warned_usage = False

    # ------------------------------------------------------------- parsing
    def _digest(self, text: str, n: int) -> bytes:
        if self._secret is None:
            self._secret = self.tel.config.resolved_secret()[:64]
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), key=self._secret, digest_size=n).digest()

    def prefix_key(self, kind: str, role: str, prefix: Any) -> str:
        """The lookup key of a prompt prefix: no prompt text, only keyed hashes."""
        text = prefix if isinstance(prefix, str) else json.dumps(prefix, sort_keys=True, ensure_ascii=False)
        memo = self._keys.get((kind, role))
        if memo is None:
            memo = self._keys[(kind, role)] = {}
        key = memo.get(text)
        if key is None:
            tpl = "".join(_LETTERS[b % 26] for b in self._digest(text.translate(_DIGITS), 8))
            key = f"{kind}:{role}:{tpl}:0{self._digest(text, 8).hex()}"
            if len(memo) >= _LIB_CAP * 4:
                memo.clear()
            memo[text] = key
        return key

    def begin(self, method: str, path: str, headers: Mapping[str, str], body: bytes | None) -> Exchange | None:
        """A request is about to be sent; None when it is not one to record."""
        try:
            if method.upper() != "POST" or not path.endswith(_PATHS):
                return None
            self.stats["requests"] += 1
            key, prompt, model, user = None, None, None, None
            try:
                req = json.loads(body) if body else None
            except (ValueError, UnicodeDecodeError):
                req = None
            if not isinstance(req, dict):
                self.stats["bad_body"] += 1
                self.agg.count_error("record", "request body is not a JSON object; forwarded, not recorded")
            else:
                pre = prefix_of(req, path)
                model, user = req.get("model"), req.get("user")
                if pre is not None:
                    kind, role, prefix = pre
                    key = self.prefix_key(kind, role, prefix)
                    prompt = (kind, prefix)
            ctx = _current.get()
            tenant = unit = exp = var = None
            if ctx is not None:
                tenant = ctx.tenant if ctx.tenant != schema.UNKNOWN else None
                unit, exp, var = ctx.unit, ctx.experiment or None, ctx.variant or None
                model = model or (ctx.model if ctx.model != schema.UNKNOWN else None)
            # httpx and Starlette headers are case-insensitive mappings
            tenant = tenant or (headers.get(self.tenant_header) if headers else None) or \
                (user if isinstance(user, str) else None)
            unit = unit or (headers.get(self.session_header) if headers else None)
            labels = (tenant, unit, exp or self.experiment, var or self.variant,
                      model if isinstance(model, str) else None)
            return Exchange(self, key, labels, prompt)
        except Exception as e:
            self.agg.count_error("record", "llm request", e)
            return None

    # ------------------------------------------------------------ recording
    def _context(self, ex: Exchange, prompt_tokens: int | None) -> RequestContext:
        k = ex.labels + (prompt_tokens,)
        ctx = self._contexts.get(k)
        if ctx is None:
            tenant, unit, exp, var, model = ex.labels
            ctx = RequestContext(self.agg, tenant, unit, exp, var, model, prompt_tokens)
            if len(self._contexts) >= 4096:
                self._contexts.clear()
            self._contexts[k] = ctx
        return ctx

    def _finish(self, ex: Exchange, error: BaseException | None) -> None:
        duration = time.perf_counter() - ex.t0
        failed = error is not None or ex.status >= 400
        if failed:
            name = type(error).__name__.lower() if error is not None else ""
            kind = ("timeouts" if "timeout" in name else "connect_errors" if "connect" in name
                    else "cut_streams" if ex.status and ex.status < 400 else "engine_errors")
            self.stats[kind] += 1
            if ex.key is not None:
                self.agg.record_lookup(self.binding, ex.key, ERROR, self._context(ex, None))
            return
        if ex.skip:
            self.stats["not_recorded"] += 1
            return
        usage = ex.usage
        if usage is None and not ex.stream and ex.buf:
            try:
                u = json.loads(b"".join(ex.buf)).get("usage")
                usage = u if isinstance(u, dict) else None
            except (ValueError, AttributeError):
                self.stats["bad_body"] += 1
                self.agg.count_error("record", "response body is not JSON; forwarded, not recorded")
                return
        prompt = usage.get("prompt_tokens") if usage else None
        details = usage.get("prompt_tokens_details") if usage else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(prompt, int) or not isinstance(cached, int):
            self.stats["no_usage"] += 1
            if not self._warned_usage:
                self._warned_usage = True
                log.warning("warmscope: a response carried no usage.prompt_tokens_details.cached_tokens; "
                            "start vLLM with --enable-prompt-tokens-details (SGLang reports it by default) "
                            "and, for streamed requests, send stream_options={\"include_usage\": true} "
                            "(counted in warmscope's no_usage statistic; the request is not recorded)")
            ctx = self._context(ex, None)
            self.agg.record_request(ctx, ex.ttft, duration, None, None, 0.0, None, None, 0.0)
            return
        cached = max(0, min(cached, prompt))
        ctx = self._context(ex, prompt)
        self.agg.record_tokens(self.binding, ex.key, cached, prompt - cached, ctx)
        self.agg.record_request(ctx, ex.ttft, duration, prompt, cached,
                                0.0, None, None, 0.0)
        self.stats["recorded"] += 1
        self._remember(ex.key, ctx.tenant, ex.prompt)

    def _remember(self, key: str, tenant: str, prompt: Any) -> None:
        lib = self._library
        e = lib.get(key)
        if e is not None:
            e[0] += 1
            return
        with self._lock:
            if len(lib) >= _LIB_CAP:  # keep the more requested half
                keep = sorted(lib.items(), key=lambda kv: -kv[1][0])[: _LIB_CAP // 2]
                lib.clear()
                lib.update(keep)
            lib[key] = [1, tenant, prompt[0], prompt[1]]

    def hot_prefixes(self, top_k: int, tenant: str | None = None) -> list[tuple[str, str, Any]]:
        """The ``top_k`` most requested prefixes seen here (in process only):
        (key, kind, prefix), most requested first."""
        with self._lock:
            items = [(k, e) for k, e in self._library.items() if tenant is None or e[1] == tenant]
        items.sort(key=lambda kv: -kv[1][0])
        return [(k, e[2], e[3]) for k, e in items[:top_k]]
