"""Recording: :class:`LLMRecorder` turns each request into a ``prefix_kv`` lookup measured in
tokens and a request record, counted in batches (:class:`_Pending`); it keeps the prompt
prefixes it saw in process (and, when asked, in a local prompt library file) for the
warm-up runner.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from warmscope.model import schema

from ..aggregator import ERROR
from ..context import RequestContext, _current
from ..genai import annotate_current_span, usage_attributes
from ..pipeline import Telemetry, current_telemetry
from .jsonbytes import _loadb
from .request import FAMILY_RULE, SESSION_HEADER, TENANT_HEADER, RequestReader, _pairs
from .stream import _BRACE_USAGE, _INCLUDE_USAGE, Exchange, _usage_of

log = logging.getLogger("warmscope.collectors")

LAYER = "prefix_kv"
_PATHS = ("/chat/completions", "/completions")

_LIB_CAP = 1024  # prefixes kept in process for the warm-up runner
_FILE_CAP = 20_000  # prefixes one process appends to a prompt library file
_PENDING = 64  # requests a thread buffers before it counts them
STATS = (
    "requests",
    "recorded",
    "engine_errors",
    "timeouts",
    "connect_errors",
    "cut_streams",
    "no_usage",
    "bad_body",
    "not_recorded",
    "usage_requested",
    "library_full",
)


def _context_of(
    agg: Any,
    memo: dict[tuple[Any, ...], RequestContext],
    labels: tuple[Any, ...],
    prompt_tokens: int | None,
) -> RequestContext:
    """The request context of (tenant, unit, experiment, variant, model) and a
    prompt length, memoised in ``memo`` (bounded)."""
    k = labels + (None if prompt_tokens is None else schema.length_bucket(prompt_tokens),)
    ctx = memo.get(k)
    if ctx is None:
        tenant, unit, exp, var, model = labels
        ctx = RequestContext(agg, tenant, unit, exp, var, model, prompt_tokens)
        if len(memo) >= 4096:
            memo.clear()
        memo[k] = ctx
    return ctx


class _Pending:
    """Recorded requests of one layer waiting to be counted: each thread
    appends to its own list (one append per request); a list is counted when
    it fills, and every list before the aggregator reads its counters
    (:meth:`drain`, run by each read), in the counting thread's counters.
    One per aggregator and layer (kept in its ``drains``), shared by the
    layer's recorders, so that recorders made and dropped leave nothing
    behind; a finished thread's list is dropped once counted."""

    _made = threading.Lock()

    def __init__(self, agg: Any, binding: Any) -> None:
        self.agg, self.binding = agg, binding
        self.tls = threading.local()
        self.lists: list[tuple[threading.Thread, list[tuple[Any, ...]]]] = []
        self.lock = threading.Lock()
        self.contexts: dict[tuple[Any, ...], RequestContext] = {}
        # (labels, prompt tokens) -> the context _context_of gives them (no length bucket
        # computed per request)
        self.near: dict[tuple[Any, ...], RequestContext] = {}
        agg.drains.append(self.drain)

    @classmethod
    def of(cls, agg: Any, binding: Any) -> _Pending:
        with cls._made:
            for drain in agg.drains:  # the one made for this layer already
                p = getattr(drain, "__self__", None)
                if isinstance(p, _Pending) and p.binding is binding:
                    return p
            return cls(agg, binding)

    def new_list(self) -> list[tuple[Any, ...]]:
        p: list[tuple[Any, ...]] = []
        with self.lock:
            self.lists.append((threading.current_thread(), p))
        self.tls.p = p
        return p

    def count(self, p: list[tuple[Any, ...]]) -> None:
        """Count the requests waiting in ``p`` (in the calling thread's
        counters). Taken under the lock, so each is counted once; the owning
        thread only appends, at the end, meanwhile."""
        with self.lock:
            items = p[:]
            del p[: len(items)]
        record, b, agg, memo, near = (
            self.agg.record_llm,
            self.binding,
            self.agg,
            self.contexts,
            self.near,
        )
        for key, hits, misses, labels, prompt, ttft, duration in items:
            try:  # one request that fails to count costs only itself
                ctx = near.get((labels, prompt))
                if ctx is None:
                    if len(near) >= 4096 or len(memo) >= 4096:  # (kept in step with the memo)
                        near.clear()
                    ctx = near[(labels, prompt)] = _context_of(agg, memo, labels, prompt)
                record(b, key, hits, misses, ctx, ttft, duration)
            except Exception as e:
                agg.count_error("record", "llm request", e)

    def drain(self) -> None:
        """Count every request still waiting; drop the lists of finished threads."""
        gone = False
        for t, p in list(self.lists):
            if p:
                self.count(p)
            if not t.is_alive():
                gone = True
        if gone:
            with self.lock:
                keep = [(t, p) for t, p in self.lists if t.is_alive() or p]
                self.lists[:] = keep


class LLMRecorder(RequestReader):
    """Parses OpenAI-compatible requests and responses into warmscope records.

    ``experiment``/``variant``: labels for requests made outside a request
    context with those set (e.g. a client bound to one arm's engine).
    ``request_usage``: a streamed request that does not say whether it wants
    usage gets ``stream_options.include_usage`` (so the engine reports cached
    tokens) and the extra usage chunk is taken out of what the caller reads.
    ``prompt_library``: a local JSON-lines file to which each newly seen prompt
    prefix is appended (key, kind, tenant, prefix text; mode 0600; at most
    20,000 per process), so that ``warmscope warmup --from hot`` can turn the
    hot keys recorded in the store back into prompts on this host. It holds
    prompt text: keep it where the prompts may be kept; it is never exported.
    ``follow_runs``: follow the warm-up runs another process (``warmscope
    warmup``) recorded for this replica in the shared store, so that their
    precision and recall come from the requests made here
    (:mod:`warmscope.collectors.run_follow`; read at each flush).

    Per request the recorder parses the request body once, finds the prefix
    key in a memo keyed by the prefix's in-process hash (the memo holds no
    prompt text), reads only the ``usage`` object of a response, and appends
    the request to the calling thread's waiting list, counted in batches in
    the aggregator's counters (when the list fills, and before any read of
    them: a flush, or OpenTelemetry at export time). A request that warm-up
    tracking may time (a warm-up run's keys or recall window are open) and a
    newly seen prefix are counted at once."""

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        *,
        experiment: str | None = None,
        variant: str | None = None,
        tenant_header: str = TENANT_HEADER,
        session_header: str = SESSION_HEADER,
        layer: str = LAYER,
        request_usage: bool = True,
        prompt_library: str | os.PathLike[str] | None = None,
        follow_runs: bool = True,
    ) -> None:
        RequestReader.__init__(
            self, telemetry or current_telemetry(), tenant_header, session_header
        )
        self.agg = self.tel.aggregator
        self.binding = self.agg.bind_layer(layer)
        self.binding.families.add_key_rule(*FAMILY_RULE)
        if follow_runs:
            from ..run_follow import follow_runs as follow

            follow(self.tel, self.binding.layer)
        self.experiment = experiment
        self.variant = variant
        self.request_usage = request_usage
        self.stats: dict[str, int] = {s: 0 for s in STATS}
        self._library: dict[str, list[Any]] = {}  # key -> [requests, tenant, kind, prefix]
        self._contexts: dict[tuple[Any, ...], RequestContext] = {}  # labels -> context (bounded)
        self._lock = threading.Lock()
        self._batch = _Pending.of(self.agg, self.binding)
        self._warned_usage = False
        self.prompt_library = os.fspath(prompt_library) if prompt_library is not None else None
        self._lib_file: Any = None
        self._lib_written = 0
        self._lib_flushed = 0.0

    # ------------------------------------------------------------- a request
    def begin(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None
    ) -> Exchange | None:
        """A request is about to be sent; None when it is not one to record.
        When the returned exchange has a ``body``, send that instead."""
        try:
            if method != "POST" and method.upper() != "POST" or not path.endswith(_PATHS):
                return None
            self.stats["requests"] += 1
            key = kind = pre = model = user = None
            try:
                req: Any = (
                    _loadb(body)
                    if isinstance(body, bytes)
                    else (json.loads(body) if body else None)
                )
            except (ValueError, UnicodeDecodeError):
                req = None
            if not isinstance(req, dict):
                self.stats["bad_body"] += 1
                self.agg.count_error(
                    "record", "request body is not a JSON object; forwarded, not recorded"
                )
            else:
                key, kind, pre = self._key_of(req)
                model, user = req.get("model"), req.get("user")
            ctx = _current.get()
            tenant = unit = exp = var = None
            if ctx is not None:
                tenant = ctx.tenant if ctx.tenant != schema.UNKNOWN else None
                unit, exp, var = ctx.unit, ctx.experiment or None, ctx.variant or None
                model = model or (ctx.model if ctx.model != schema.UNKNOWN else None)
            if (
                tenant is None or unit is None
            ) and headers is not None:  # (empty headers give none)
                ht, hs = self._headers(headers)
                tenant, unit = tenant or ht, unit or hs
            if tenant is None and isinstance(user, str):
                tenant = user
            labels = (
                tenant,
                unit,
                exp or self.experiment,
                var or self.variant,
                model if isinstance(model, str) else None,
            )
            ex = Exchange(self, key, labels, kind, pre)
            if key is not None and self.request_usage and req.get("stream") is True:
                self._ask_usage(ex, req, body)  # type: ignore[arg-type]
            return ex
        except Exception as e:
            self.agg.count_error("record", "llm request", e)
            return None

    def _ask_usage(self, ex: Exchange, req: dict[Any, Any], body: bytes) -> None:
        so = req.get("stream_options")
        if so is None and "stream_options" not in req:
            if body[:1] == b"{":  # as json.dumps and httpx write it: spliced in after the brace
                # (bytes.replace of the first brace: the new body built in one copy)
                ex.body = (
                    body.replace(b"{", _BRACE_USAGE, 1)
                    if type(body) is bytes
                    else b"{" + _INCLUDE_USAGE + body[1:]
                )
            else:
                i = body.find(b"{")
                ex.body = bytes(body[: i + 1]) + _INCLUDE_USAGE + bytes(body[i + 1 :])
        elif isinstance(so, dict) and "include_usage" not in so:
            ex.body = json.dumps({**req, "stream_options": {**so, "include_usage": True}}).encode()
        else:
            return  # the caller decided
        ex.strip = True
        self.stats["usage_requested"] += 1

    # ------------------------------------------------------------ recording
    def _context(self, ex: Exchange, prompt_tokens: int | None) -> RequestContext:
        return _context_of(self.agg, self._contexts, ex.labels, prompt_tokens)

    def _finish(self, ex: Exchange, error: BaseException | None) -> None:
        duration = time.perf_counter() - ex.t0
        failed = error is not None or ex.status >= 400
        if failed:
            name = type(error).__name__.lower() if error is not None else ""
            kind = (
                "timeouts"
                if "timeout" in name
                else "connect_errors"
                if "connect" in name
                else "cut_streams"
                if ex.status and ex.status < 400
                else "engine_errors"
            )
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
                usage = _usage_of(ex.buf[0] if len(ex.buf) == 1 else b"".join(ex.buf))
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
                log.warning(
                    "warmscope: a response carried no usage.prompt_tokens_details.cached_tokens; "
                    "start vLLM with --enable-prompt-tokens-details (SGLang reports it by default) "
                    'and, for streamed requests, send stream_options={"include_usage": true} '
                    "(counted in warmscope's no_usage statistic; such a request is recorded as "
                    "unmeasured: its latency counts, no tokens or cache hits)"
                )
            ctx = self._context(ex, None)
            self.agg.record_request(
                ctx, ex.ttft, duration, None, None, 0.0, None, None, 0.0, unmeasured=True
            )
            return
        if cached > prompt:
            cached = prompt
        elif cached < 0:
            cached = 0
        self.stats["recorded"] += 1
        # the GenAI registry's names, on the current span (a contrib client span, or the caller's)
        annotate_current_span(usage_attributes(prompt, cached, usage))
        agg = self.agg
        e = self._library.get(ex.key)  # type: ignore[arg-type]
        if e is not None and not (agg.warmed or agg.early or agg.remote_warmed):
            # The usual request: counted later, in a batch (warm-up reads, timed
            # when they happen, and new prefixes are counted at once).
            e[0] += 1
            batch = self._batch
            try:
                p = batch.tls.p
            except AttributeError:
                p = batch.new_list()
            p.append((ex.key, cached, prompt - cached, ex.labels, prompt, ex.ttft, duration))
            if len(p) >= _PENDING:
                batch.count(p)
            return
        ctx = self._context(ex, prompt)
        if agg.remote_warmed:  # a run recorded elsewhere may have warmed this key
            self._adopt(ex.key)  # type: ignore[arg-type]
        agg.record_llm(self.binding, ex.key, cached, prompt - cached, ctx, ex.ttft, duration)
        if e is not None:
            e[0] += 1
        else:
            self._remember(ex.key, ctx.tenant, ex.kind, ex.pre)  # type: ignore[arg-type]

    def _adopt(self, key: str) -> None:
        try:
            self.agg.adopt_warmed(key, self.tel.hasher.hash(key))
        except Exception as e:  # no key secret: nothing can be matched by hash
            self.agg.count_error("record", "matching a warm-up run recorded elsewhere", e)

    def _remember(self, key: str, tenant: str, kind: str, pre: Any) -> None:
        prefix = _pairs(pre) if kind == "chat" else pre
        lib = self._library
        with self._lock:
            if len(lib) >= _LIB_CAP:  # keep the more requested half
                keep = sorted(lib.items(), key=lambda kv: -kv[1][0])[: _LIB_CAP // 2]
                lib.clear()
                lib.update(keep)
            lib[key] = [1, tenant, kind, prefix]
            if self.prompt_library is not None:
                self._append_library(key, tenant, kind, prefix)

    def _append_library(self, key: str, tenant: str, kind: str, prefix: Any) -> None:
        """Append a newly seen prefix to the local prompt library (under the lock)."""
        try:
            if self._lib_written >= _FILE_CAP:
                self.stats["library_full"] += 1
                return
            if self._lib_file is None:
                fd = os.open(
                    self.prompt_library,  # type: ignore[arg-type]  # checked by the caller
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    0o600,
                )
                self._lib_file = os.fdopen(fd, "a", encoding="utf-8")
                atexit.register(self.close)
            self._lib_file.write(
                json.dumps(
                    {"key": key, "kind": kind, "tenant": tenant, "prefix": prefix},
                    ensure_ascii=False,
                )
                + "\n"
            )
            self._lib_written += 1
            now = time.monotonic()
            if now - self._lib_flushed >= 1.0:
                self._lib_file.flush()
                self._lib_flushed = now
        except Exception as e:
            self.agg.count_error("record", f"prompt library {self.prompt_library}", e)

    def close(self) -> None:
        """Flush and close the prompt library file (also done at exit)."""
        with self._lock:
            f, self._lib_file = self._lib_file, None
        if f is not None:
            try:
                f.close()
            except Exception as e:
                self.agg.count_error("record", f"prompt library {self.prompt_library}", e)

    def hot_prefixes(self, top_k: int, tenant: str | None = None) -> list[tuple[str, str, Any]]:
        """The ``top_k`` most requested prefixes seen here (in process only):
        (key, kind, prefix), most requested first."""
        with self._lock:
            items = [(k, e) for k, e in self._library.items() if tenant is None or e[1] == tenant]
        items.sort(key=lambda kv: -kv[1][0])
        return [(k, e[2], e[3]) for k, e in items[:top_k]]
