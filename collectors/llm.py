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
  that is not streamed —, duration, prompt and cached tokens), and the A/B unit (a session) from the request
  context or a session header.

The prefix key is ``KIND:ROLE:TEMPLATE:0DIGEST``. ``DIGEST`` is a keyed hash
of the whole prefix, so hits, misses and warm-set precision are counted per
prefix. ``TEMPLATE`` is a keyed hash, written in letters, of the request's
*template* with its digits blanked: for a chat, the first system (or
developer) message, or the first message when there is none; for a
completion, the prompt's first block, up to the first blank line
(:func:`template_of`). The key family is ``KIND:ROLE:TEMPLATE:*`` (e.g.
``chat:system:qkzvmwab:*``): every conversation that starts from one system
prompt is one family, whatever its history, and no family carries any prompt
text. The recorder registers this rule on its layer (before any
``family_rules``), so a warm-up run's keys get the same family. Like every
key, a prefix key leaves the process only as its keyed hash. The prefix texts
stay in process, in a bounded library that the warm-up runner
(:mod:`warmscope.collectors.warmup_runner`) reads for its ``hot`` warm set.

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

import atexit
import hashlib
import json
import logging
import operator
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from warmscope.model import schema

from .aggregator import ERROR
from .context import RequestContext, _current
from .genai import annotate_current_span, usage_attributes
from .labels import decode_header
from .pipeline import Telemetry, current_telemetry

try:  # the client extra's JSON parser (about 2.5x as fast as the standard library's on request bodies)
    import orjson
except ImportError:  # pragma: no cover - the standard library's scanner alone
    orjson = None  # type: ignore[assignment]
_orjson_loads = orjson.loads if orjson is not None else None

__all__ = [
    "LLMRecorder",
    "Exchange",
    "prefix_of",
    "template_of",
    "read_library",
    "TENANT_HEADER",
    "SESSION_HEADER",
]

log = logging.getLogger("warmscope.collectors")

TENANT_HEADER = "x-warmscope-tenant"
SESSION_HEADER = "x-warmscope-session"
LAYER = "prefix_kv"
_PATHS = ("/chat/completions", "/completions")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_SYSTEM_ROLES = ("system", "developer")
# The family of a prefix key (KIND:ROLE:TEMPLATE:DIGEST) is KIND:ROLE:TEMPLATE:*.
FAMILY_RULE = (
    r"(chat|completion):(system|developer|user|assistant|tool|other|prompt):([a-z]{8}):0[0-9a-f]{16}",
    r"\1:\2:\3:*",
)
_BODY_CAP = 8 << 20  # non-streamed response bodies read for usage up to 8 MiB
_LIB_CAP = 1024  # prefixes kept in process for the warm-up runner
_DIGITS = str.maketrans("0123456789", "0000000000")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_MEMO_CAP = _LIB_CAP * 4  # prefix keys memoised per recorder
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
_JSON = json.JSONDecoder()
_SCAN = _JSON.scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__ (the C scanner)
_SECOND = operator.itemgetter(1)
_USAGE = b'"usage"'
_PROMPT_TOKENS = b'"prompt_tokens"'
_FINISH = (
    b'"finish_reason":"'  # a choice's last chunk (compact JSON; "finish_reason": null otherwise)
)
_FINGERPRINT = b'"system_fingerprint"'
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'
_BRACE_USAGE = b"{" + _INCLUDE_USAGE
_NULL_COMPACT, _NULL_SPACED = b'"usage":null', b'"usage": null'
_NULL_FIELD = b',"usage":null'  # the form engines write: taken out first, in one scan
_CHOICES_NONE = b'"choices":[]'  # a usage-only chunk (compact JSON)


def _pairs(pre: list[Any]) -> list[Any]:
    return [[m.get("role"), m.get("content")] if isinstance(m, dict) else m for m in pre]


def prefix_of(body: Mapping[str, Any], path: str = "/chat/completions") -> tuple[str, Any] | None:
    """(kind, prefix) of a request body: the messages before the last one (or
    the first message) as [role, content] pairs, or the first 512 characters
    of a completion prompt."""
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs:
        return "chat", _pairs(msgs[:-1] if len(msgs) > 1 else msgs[:1])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return "completion", prompt[:512]
    return None


def template_of(kind: str, prefix: Any) -> tuple[str, str]:
    """(role, text) of the part of a prompt prefix its key family is made of:
    for a chat, the first system (or developer) message, else the first
    message; for a completion, the prompt's first block (up to the first blank
    line). Conversations that share a system prompt share a family whatever
    their history."""
    if kind != "chat":
        return "prompt", str(prefix).split("\n\n", 1)[0]
    first = None
    for m in prefix:
        if isinstance(m, (list, tuple)) and len(m) == 2 and m[0] in _SYSTEM_ROLES:
            first = m
            break
    if first is None:
        first = prefix[0] if prefix else None
    if not (isinstance(first, (list, tuple)) and len(first) == 2):
        return "other", json.dumps(first, sort_keys=True, ensure_ascii=False)
    role, content = first
    text = (
        content
        if isinstance(content, str)
        else json.dumps(content, sort_keys=True, ensure_ascii=False)
    )
    return (role if role in _ROLES else "other"), text


def read_library(path: str | os.PathLike[str]) -> dict[str, tuple[str, str | None, Any]]:
    """A prompt library file (see :class:`LLMRecorder`): prefix key -> (kind,
    tenant, prefix). Lines that do not parse (a write cut by a crash) are skipped."""
    out: dict[str, tuple[str, str | None, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                e = json.loads(line)
                out[e["key"]] = (e["kind"], e.get("tenant"), e["prefix"])
            except (ValueError, KeyError, TypeError):
                continue
    return out


class Exchange:
    """One request in flight: fed the response bytes, recorded once at the end.

    ``body``: the request body to send instead of the caller's (``None``: send
    the caller's), set when the recorder asked a stream for its usage; the
    extra usage chunk is then taken out of what the caller reads (``strip``)."""

    # Defaults at class level: a new exchange sets only what differs per request.
    ttft: float | None = None
    status = 0
    stream = False
    buf: list[bytes] | None = None
    size = 0
    usage: dict[Any, Any] | None = None
    done = False
    tail = b""
    body: bytes | None = None
    strip = False
    drop_blank = False
    _fingerprint: bytes | None = None
    held = b""  # lines held back (each ending with a newline): the last choice chunk and what follows it

    def __init__(
        self, rec: LLMRecorder, key: str | None, labels: tuple[Any, ...], kind: str | None, pre: Any
    ) -> None:
        self.rec = rec
        self.t0 = time.perf_counter()
        self.key = key
        self.labels = labels
        self.kind = kind
        self.pre = pre
        self.skip = key is None

    def response(self, status: int, content_type: str | None) -> None:
        try:
            self.status = int(status)
            # content_type is a str here: bool(content_type) is checked first
            self.stream = bool(content_type) and "text/event-stream" in content_type  # type: ignore[operator]
            if not self.stream or self.status >= 400:
                self.strip = False
        except Exception as e:
            self.rec.agg.count_error("record", "llm response", e)

    def feed(self, chunk: bytes) -> bytes:
        """A piece of the response body, as it arrives; returns the bytes to
        pass on to the caller (the same bytes, unless a usage chunk the caller
        did not ask for is being taken out)."""
        if self.strip:
            return self._filter(chunk)
        if self.skip or not chunk:
            return chunk
        try:
            if self.stream:
                if self.ttft is None:
                    self.ttft = time.perf_counter() - self.t0
                if not self.tail and _PROMPT_TOKENS not in chunk:
                    i = chunk.rfind(b"\n")
                    self.tail = chunk[i + 1 :] if len(chunk) - i <= _BODY_CAP else b""
                    return chunk
                data = self.tail + chunk
                lines = data.split(b"\n")
                self.tail = lines.pop()
                if len(self.tail) > _BODY_CAP:
                    self.tail = b""
                for line in lines:
                    if _PROMPT_TOKENS in line and line.startswith(b"data:"):
                        u = _loadb(line[5:]).get("usage")
                        if isinstance(u, dict):
                            self.usage = u
            elif self.status < 400:
                self.size += len(chunk)
                if self.size <= _BODY_CAP:
                    if self.buf is None:
                        self.buf = [chunk]
                    else:
                        self.buf.append(chunk)
        except Exception as e:
            self.rec.agg.count_error("record", "llm response chunk", e)
        return chunk

    def _filter(self, chunk: bytes) -> bytes:
        """Streams whose usage the recorder asked for: whole lines are passed on
        as they complete, without the usage-only chunk and its ``"usage": null``
        fields, so the caller reads what the engine would have sent it. An
        engine that moves ``system_fingerprint`` from the last choice chunk to
        the usage chunk (vLLM) gets it moved back: the last choice chunk is
        held until the next event shows whether it is the usage chunk.

        Most chunks take the fast way: a few byte scans over the complete
        lines (and a ``bytes.replace`` of ``"usage": null``, which cannot occur
        inside a JSON string, whose quotes are escaped); the usage-only chunk
        is cut out where it is found (:meth:`_usage_only`), and only the lines
        around the last choice (or an unusual usage line) are looked at one
        by one (:meth:`_lines`)."""
        if self.ttft is None and chunk:
            self.ttft = time.perf_counter() - self.t0
        data = self.tail + chunk if self.tail else chunk
        try:
            i = data.rfind(b"\n")
            if i < 0:
                self.tail = data
                if len(data) > _BODY_CAP:  # no line in sight: stop filtering, pass everything on
                    return self._give_up(b"")
                return b""
            if i + 1 < len(data):
                self.tail, done = data[i + 1 :], data[: i + 1]
            else:
                self.tail, done = b"", data
            if self.held or self.drop_blank:
                return self._lines(done)
            f = done.find(_FINISH)
            p = done.find(_PROMPT_TOKENS)
            if f < 0:
                if p < 0:  # the usual chunk: its "usage": null taken out
                    done = done.replace(
                        _NULL_FIELD, b""
                    )  # (a no-op without one: the same object back)
                    return _without_other_null_usage(done) if _USAGE in done else done
                out = self._usage_only(done, p)
                if out is not None:
                    return out
            return self._lines(done, (f, p))  # the lines looked at from where these were found
        except Exception as e:  # pass on what is left unchanged, stop filtering
            self.rec.agg.count_error("record", "llm stream filter", e)
            return self._give_up(data)

    def _lines(self, done: bytes, found: tuple[int, int] | None = None) -> bytes:
        """Complete lines (``done`` ends with a newline) when a choice's last
        chunk or a usage object is among them, or lines are held: the lines up
        to the next one that needs a look pass on in one piece (see
        :meth:`_filter`). State is stored only at the end, so a line that does
        not parse leaves it as it was. ``found``: where the first
        ``finish_reason`` and ``prompt_tokens`` are in ``done`` (-1: nowhere),
        when the caller searched already (nothing held, no blank line to drop)."""
        out: list[bytes] = []
        held, drop_blank = self.held, self.drop_blank
        pos, n = 0, len(done)
        while pos < n:
            if drop_blank:  # the blank line that ended the usage chunk's event
                drop_blank = False
                e = done.index(b"\n", pos)
                if not done[pos:e].strip():
                    pos = e + 1
                    continue
            if held:  # the next data line shows whether the held chunk was the last before the usage chunk
                if done.startswith(b"data:", pos):
                    d = pos
                else:
                    d = done.find(b"\ndata:", pos)
                    if d < 0:
                        held += done[pos:]
                        break
                    d += 1
                held += done[pos:d]
                pos = d
                e = done.index(b"\n", d)
                line = done[d:e]
                if _PROMPT_TOKENS in line and self._usage_line(
                    line
                ):  # the usage-only chunk: not the caller's
                    fp = self._fingerprint
                    k = held.index(b"\n")
                    if fp is not None and _FINGERPRINT not in held[:k]:
                        j = held.rfind(b"}", 0, k)
                        held = held[:j] + b',"system_fingerprint":' + fp + held[j:]
                    out.append(held)
                    held, pos = b"", e + 1
                    if done.startswith(b"\n", pos):  # the blank line that ends its event
                        pos += 1
                    else:
                        drop_blank = True
                    continue
                out.append(held)
                held = b""
            if found is not None:  # pos is 0 here: nothing was held or dropped before
                (f, p), found = found, None
            else:
                f, p = done.find(_FINISH, pos), done.find(_PROMPT_TOKENS, pos)
            if f < 0 and p < 0:
                rest = done[pos:]
                out.append(_without_null_usage(rest) if _USAGE in rest else rest)
                break
            m = p if f < 0 else f if p < 0 else min(f, p)
            start = max(done.rfind(b"\n", pos, m) + 1, pos)
            if start > pos:
                seg = done[pos:start]
                out.append(_without_null_usage(seg) if _USAGE in seg else seg)
            e = done.index(b"\n", m)
            line = done[start:e]
            pos = e + 1
            if line.startswith(b"data:"):
                if _PROMPT_TOKENS in line:
                    if self._usage_line(line):
                        if done.startswith(b"\n", pos):  # the blank line that ends its event
                            pos += 1
                        else:
                            drop_blank = True
                        continue
                elif _USAGE in line:  # "usage": null, added because usage was asked for
                    line = _without_null_usage(line)
                if _FINISH in line:
                    held = line + b"\n"
                    continue
            out.append(line + b"\n")
        self.held, self.drop_blank = held, drop_blank
        return b"".join(out)

    def _usage_only(self, done: bytes, p: int) -> bytes | None:
        """Complete lines with a usage object at ``p`` and no choice's last
        chunk, nothing held: when that line is the usage-only chunk, followed
        by the blank line that ends its event (or by the end of ``done``) and
        nothing after it needs a look, the lines without it, as :meth:`_lines`
        returns them; else None (and :meth:`_lines` looks at them one by one)."""
        s = done.rfind(b"\n", 0, p) + 1
        e = done.index(b"\n", p)
        if not done.startswith(b"data:", s) or done.find(_CHOICES_NONE, s, e) < 0:
            return None
        pos = e + 1
        if pos < len(done):
            if done[pos] != 10:  # no blank line right after it
                return None
            pos += 1
            rest = done[pos:]
            if _PROMPT_TOKENS in rest:
                return None
        else:
            rest = b""
        if not self._usage_line(done[s:e]):
            return None
        if pos == e + 1:  # its event's blank line comes with the next chunk
            self.drop_blank = True
        out = done[:s] + rest if rest else done[:s]
        out = out.replace(
            _NULL_FIELD, b""
        )  # as _lines does for each part: no pattern spans a line end
        return _without_other_null_usage(out) if _USAGE in out else out

    def _usage_line(self, line: bytes) -> bool:
        """Note the usage object of a ``data:`` line; True when the line is the
        usage-only chunk (no choices), whose ``system_fingerprint`` (JSON) is
        kept in ``_fingerprint``."""
        obj = _loadb(line[5:])
        u = obj.get("usage")
        if not isinstance(u, dict):
            return False
        self.usage = u
        if obj.get("choices") != []:
            return False
        fp = obj.get("system_fingerprint")
        self._fingerprint = None if fp is None else json.dumps(fp).encode()
        return True

    def _give_up(self, data: bytes) -> bytes:
        held = self.held
        self.strip, self.tail, self.held = False, b"", b""
        return held + data

    def flush(self) -> bytes:
        """The end of the body: bytes still held back (a last line without a newline)."""
        if not self.strip:
            return b""
        rest = self.tail
        return self._give_up(rest)

    def end(self) -> bytes:
        """The body ended without error: :meth:`flush`, then :meth:`finish`."""
        rest = self.flush()
        self.finish()
        return rest

    def finish(self, error: BaseException | None = None) -> None:
        """The response ended (``error``: how it failed). Records once; never raises."""
        if self.done:
            return
        self.done = True
        try:
            self.rec._finish(self, error)
        except Exception as e:
            self.rec.agg.count_error("record", "llm request", e)


def _loadb(data: bytes) -> Any:
    """``json.loads`` of UTF-8 bytes: through orjson when it is installed;
    what orjson refuses (NaN, Infinity, lone surrogates) goes the standard
    library's way, so either parses what ``json.loads`` does, except an
    integer past 64 bits, which orjson reads as a float (no token count is
    that large; such a count is then not an int, and counted as no usage)."""
    if _orjson_loads is not None:
        try:
            return _orjson_loads(data)
        except ValueError:
            pass
    return _loads(data.decode("utf-8"))


def _loads(text: str) -> Any:
    """``json.loads`` of a str, through the C scanner directly (no Python
    frames in the way for the usual text that starts with its value)."""
    start = 1 if text.startswith(" ") else 0  # "data: {...}"
    try:
        obj, end = _SCAN(text, start)
    except StopIteration:  # more leading whitespace, or not JSON: the full decoder says which
        return _JSON.decode(text)
    if end != len(text) and not text[end:].isspace():
        return _JSON.decode(text)  # raises: extra data
    return obj


def _without_null_usage(lines: bytes) -> bytes:
    """``lines`` without the ``"usage": null`` fields a server adds to each chunk
    when usage is asked for (the pattern cannot occur inside a JSON string:
    its quotes would be escaped)."""
    if (
        _NULL_COMPACT in lines
    ):  # the form engines write (compact JSON): one scan when it is the only one
        lines = lines.replace(_NULL_FIELD, b"")
    return _without_other_null_usage(lines)


def _without_other_null_usage(lines: bytes) -> bytes:
    """The rest of :func:`_without_null_usage`, once ``,"usage":null`` is out
    (the callers that took it out already skip this when no ``"usage"`` is left)."""
    if _NULL_COMPACT in lines:
        lines = lines.replace(b'"usage":null,', b"")
    if _NULL_SPACED in lines:
        lines = lines.replace(b', "usage": null', b"")
        if _NULL_SPACED in lines:
            lines = lines.replace(b'"usage": null, ', b"")
    return lines


def _usage_of(body: bytes) -> dict[Any, Any] | None:
    """The ``usage`` object of a completion body: found by its key from the end
    (engines write it last) and only that object parsed; the whole body when
    that fails. Raises ValueError for a body that is not JSON."""
    i = body.rfind(_USAGE)
    if i >= 0:
        j = body.find(b":", i + 7)
        if j >= 0:
            try:
                u = _JSON.raw_decode(body[j + 1 : j + 4097].decode("utf-8", "replace").lstrip())[0]
                if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
                    return u
            except ValueError:
                pass
    u = json.loads(body).get("usage")
    return u if isinstance(u, dict) else None


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
        # (labels, prompt tokens) -> the context _context_of gives them (no bucket computed per request)
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


class LLMRecorder:
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
        self.tel = telemetry or current_telemetry()
        self.agg = self.tel.aggregator
        self.binding = self.agg.bind_layer(layer)
        self.binding.families.add_key_rule(*FAMILY_RULE)
        if follow_runs:
            from .run_follow import follow_runs as follow

            follow(self.tel, self.binding.layer)
        self.experiment = experiment
        self.variant = variant
        self.tenant_header = tenant_header.lower()
        self.session_header = session_header.lower()
        self._th, self._sh = (
            self.tenant_header.encode("latin-1"),
            self.session_header.encode("latin-1"),
        )
        self._hlens = frozenset((len(self._th), len(self._sh)))
        self.request_usage = request_usage
        self.stats: dict[str, int] = {s: 0 for s in STATS}
        self._secret: bytes | None = None
        self._library: dict[str, list[Any]] = {}  # key -> [requests, tenant, kind, prefix]
        self._keys: dict[tuple[Any, ...], str] = {}  # (kind, hash of the prefix) -> key; bounded
        self._contexts: dict[tuple[Any, ...], RequestContext] = {}  # labels -> context (bounded)
        self._lock = threading.Lock()
        self._batch = _Pending.of(self.agg, self.binding)
        self._warned_usage = False
        self.prompt_library = os.fspath(prompt_library) if prompt_library is not None else None
        self._lib_file: Any = None
        self._lib_written = 0
        self._lib_flushed = 0.0

    # ------------------------------------------------------------- parsing
    def _digest(self, text: str, n: int) -> bytes:
        if self._secret is None:
            self._secret = self.tel.config.resolved_secret()[:64]
        return hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), key=self._secret, digest_size=n
        ).digest()

    def prefix_key(self, kind: str, prefix: Any) -> str:
        """The lookup key of a prompt prefix (a list of [role, content] pairs or
        a prompt's first 512 characters): ``KIND:ROLE:TEMPLATE:0DIGEST``, where
        ``TEMPLATE`` is a keyed hash, in letters, of :func:`template_of`'s text
        with its digits blanked and ``DIGEST`` a keyed hash of the whole
        prefix. No prompt text, only keyed hashes; the key's family
        (:data:`FAMILY_RULE`) is ``KIND:ROLE:TEMPLATE:*``."""
        role, tpl_text = template_of(kind, prefix)
        text = (
            prefix
            if isinstance(prefix, str)
            else json.dumps(prefix, sort_keys=True, ensure_ascii=False)
        )
        tpl = "".join(_LETTERS[b % 26] for b in self._digest(tpl_text.translate(_DIGITS), 8))
        return f"{kind}:{role}:{tpl}:0{self._digest(text, 8).hex()}"

    def _key_of(self, req: dict[Any, Any]) -> tuple[str | None, str | None, Any]:
        """(key, kind, prefix) of a parsed request body; the key memoised by
        the prefix's hash (no text kept)."""
        pre: Any
        msgs = req.get("messages")
        if isinstance(msgs, list) and msgs:
            kind = "chat"
            pre = msgs[:-1] if len(msgs) > 1 else msgs[:1]
            try:
                if len(pre) == 1:  # the common case (a system prompt): no list built
                    m = pre[0]
                    fp = hash(((m["role"], m["content"]),))
                else:
                    fp = hash(tuple([(m["role"], m["content"]) for m in pre]))
            except (TypeError, KeyError):  # content parts (lists), odd messages: no memo
                fp = None
        else:
            prompt = req.get("prompt")
            if isinstance(prompt, list) and prompt:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                return None, None, None
            kind, pre = "completion", prompt[:512]
            fp = hash(pre)
        if fp is not None:
            hit = self._keys.get((kind, fp))
            if hit is not None:
                return hit, kind, pre
        key = self.prefix_key(kind, _pairs(pre) if kind == "chat" else pre)
        if fp is not None:
            if len(self._keys) >= _MEMO_CAP:
                self._keys.clear()
            self._keys[(kind, fp)] = key
        return key, kind, pre

    def _headers(self, headers: Any) -> tuple[str | None, str | None]:
        """(tenant, session) from the request headers, without a loop in Python;
        decoded by :func:`.labels.decode_header` (UTF-8, else latin-1)."""
        rows = getattr(headers, "_list", None)
        if isinstance(rows, list) and (
            not rows or len(rows[0]) == 3
        ):  # httpx: (name, lower-case name, value)
            names = list(map(_SECOND, rows))
            t = decode_header(rows[names.index(self._th)][2]) if self._th in names else None
            s = decode_header(rows[names.index(self._sh)][2]) if self._sh in names else None
            return t, s
        raw = getattr(headers, "raw", None)
        if raw is None:
            get = headers.get
            return decode_header(get(self.tenant_header)), decode_header(get(self.session_header))
        t = s = None
        for k, v in raw:
            if len(k) in self._hlens:
                k = k.lower()
                if k == self._th:
                    t = decode_header(v)
                elif k == self._sh:
                    s = decode_header(v)
        return t, s

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
                    "(counted in warmscope's no_usage statistic; the request is not recorded)"
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
