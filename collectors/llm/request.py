"""Reading a request: its prompt prefix, the prefix's key and key family, its tenant and session.

The prefix key is ``KIND:ROLE:TEMPLATE:0DIGEST``. ``DIGEST`` is a keyed hash
of the whole prefix, so hits, misses and warm-set precision are counted per
prefix. ``TEMPLATE`` is a keyed hash, written in letters, of the request's
*template* with its digits blanked: for a chat, the first system (or
developer) message, or the first message when there is none; for a
completion, the prompt's first block, up to the first blank line
(:func:`template_of`). The key family is ``KIND:ROLE:TEMPLATE:*``
(:data:`FAMILY_RULE`, e.g. ``chat:system:qkzvmwab:*``): every conversation that
starts from one system prompt is one family, whatever its history, and no
family carries any prompt text.

:class:`RequestReader` is the part of :class:`~.recorder.LLMRecorder` that
reads a request (the key memo, the header names); :func:`read_library` reads
the prompt library file a recorder writes.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections.abc import Mapping
from typing import Any

from ..labels import decode_header
from ..pipeline import Telemetry

TENANT_HEADER = "x-warmscope-tenant"
SESSION_HEADER = "x-warmscope-session"

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_SYSTEM_ROLES = ("system", "developer")
# The family of a prefix key (KIND:ROLE:TEMPLATE:DIGEST) is KIND:ROLE:TEMPLATE:*.
FAMILY_RULE = (
    r"(chat|completion):(system|developer|user|assistant|tool|other|prompt)"
    r":([a-z]{8}):0[0-9a-f]{16}",
    r"\1:\2:\3:*",
)

_DIGITS = str.maketrans("0123456789", "0000000000")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_MEMO_CAP = 4096  # prefix keys memoised per recorder (four times its in-process library)

_SECOND = operator.itemgetter(1)


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
    """A prompt library file (see :class:`~.recorder.LLMRecorder`): prefix key -> (kind,
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


class RequestReader:
    """The request side of :class:`~.recorder.LLMRecorder`: a prefix's key
    (memoised by the prefix's in-process hash; the memo holds no prompt text)
    and the tenant and session headers."""

    def __init__(self, telemetry: Telemetry, tenant_header: str, session_header: str) -> None:
        self.tel = telemetry
        self.tenant_header = tenant_header.lower()
        self.session_header = session_header.lower()
        self._th, self._sh = (
            self.tenant_header.encode("latin-1"),
            self.session_header.encode("latin-1"),
        )
        self._hlens = frozenset((len(self._th), len(self._sh)))
        self._secret: bytes | None = None
        self._keys: dict[tuple[Any, ...], str] = {}  # (kind, hash of the prefix) -> key; bounded

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
        # httpx: (name, lower-case name, value)
        if isinstance(rows, list) and (not rows or len(rows[0]) == 3):
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
