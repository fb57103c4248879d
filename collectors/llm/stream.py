"""Reading a response: :class:`Exchange` is one request in flight, fed the response bytes as
they arrive, and recorded once at the end by its :class:`~.recorder.LLMRecorder`.

A non-streamed body is kept (up to 8 MiB) and only its ``usage`` object parsed
(:func:`_usage_of`); a stream gives the time to its first chunk and its usage
line. When the recorder asked a stream for its usage
(``stream_options.include_usage``), the exchange filters the stream
(:meth:`Exchange._filter`): the usage-only chunk and the ``"usage": null``
fields it caused are taken out with byte scans, so the caller reads what the
engine would have sent it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from .jsonbytes import _JSON, _loadb

if TYPE_CHECKING:
    from .recorder import LLMRecorder

_BODY_CAP = 8 << 20  # non-streamed response bodies read for usage up to 8 MiB

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
    # lines held back (each ending with a newline): the last choice chunk and what follows it
    held = b""

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
            self.stream = bool(content_type and "text/event-stream" in content_type)
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
                    # (a no-op without one: the same object back)
                    done = done.replace(_NULL_FIELD, b"")
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
            # the next data line shows whether the held chunk was the last before the usage chunk
            if held:
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
                # the usage-only chunk: not the caller's
                if _PROMPT_TOKENS in line and self._usage_line(line):
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
        # as _lines does for each part: no pattern spans a line end
        out = out.replace(_NULL_FIELD, b"")
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


def _without_null_usage(lines: bytes) -> bytes:
    """``lines`` without the ``"usage": null`` fields a server adds to each chunk
    when usage is asked for (the pattern cannot occur inside a JSON string:
    its quotes would be escaped)."""
    # the form engines write (compact JSON): one scan when it is the only one
    if _NULL_COMPACT in lines:
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
