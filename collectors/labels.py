"""Label values from outside: header decoding, length and character bounds, vocabularies.

Every value a caller, a header or a configuration file puts in a label goes
through here before it is counted, compared with an allow-list or exported:

* :func:`decode_header` — a header value as text. HTTP header bytes are not
  always ASCII: UTF-8 (``Ünïcødé-租户``) is decoded as UTF-8, anything else as
  latin-1 (``caf\\xe9`` -> ``café``), never an error. A ``str`` that a server
  decoded as latin-1 from UTF-8 bytes (Starlette, the standard library) gets
  its UTF-8 back.
* :func:`bound` — at most :data:`MAX_LABEL_LEN` characters of letters, digits
  (any script) and ``-_.:@/+``; every other character (controls, spaces,
  quotes, braces, ...) becomes ``_``. A longer value keeps its first characters
  and ends with ``~`` and 8 hex digits of a hash of the whole value, so two
  long values stay two labels. The tenant allow-list and the first-64 rule see
  the bounded value.
* :func:`vocabulary_label` — for free labels that name a mechanism (warm-up
  ``trigger`` and ``strategy``): the family rule of :mod:`.keys`, a segment is
  kept only when it is a word of the vocabulary, anything else (an e-mail
  address, an id) becomes ``*``.

Values changed by a bound are counted by the bucketer or cap that applied it
(``warmscope.telemetry.label_bounded{label}``), through a :class:`Bounder`: the bound
runs once per distinct raw value, and the count is of distinct values, not of calls.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable

__all__ = [
    "MAX_LABEL_LEN",
    "WARMUP_VOCABULARY",
    "Bounder",
    "bound",
    "decode_header",
    "vocabulary_label",
]

MAX_LABEL_LEN = 64

# Characters a label keeps besides letters and digits (str.isalnum: any script); "*" is the
# key families' wildcard segment (kv:chat:sys:*).
_KEEP = frozenset("-_.:@/+*")
_PLAIN = re.compile(r"[A-Za-z0-9\-_.:@/+*]{1,64}")

# Words of warm-up triggers and strategies (besides the family vocabulary).
WARMUP_VOCABULARY = frozenset(
    """
    manual replica owner start startup restart boot deploy deployment rollout canary schedule
    scheduled cron timer periodic forecast peak pre post drop scale up down out autoscale failover
    reload
    api cli demand on event test static topk top engine none hot recent recency predictive lru lfu
    freq frequency decay heat yesterday log semantic warm_cost cost choose embedding advisor
""".split()
)


def decode_header(value: bytes | str | None) -> str | None:
    """A header value as text: UTF-8 when the bytes are UTF-8, else latin-1."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.isascii():
            return value
        try:  # a server decoded UTF-8 bytes as latin-1: get the text back
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def bound(value: str, max_len: int = MAX_LABEL_LEN) -> str:
    """``value`` within the label bounds (see the module doc); unchanged when it is."""
    if _PLAIN.fullmatch(value) and len(value) <= max_len:
        return value
    out = "".join(c if c.isalnum() or c in _KEEP else "_" for c in value)
    if len(out) > max_len:
        digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
        out = out[: max_len - 9] + "~" + digest
    return out


def vocabulary_label(value: str, vocab: frozenset[str]) -> str:
    """The family rule applied to a free label: unknown segments become ``*``."""
    from .keys import default_family  # (keys imports this module)

    return default_family(value, vocab)


MEMO_CAP = 4096  # distinct raw values a Bounder remembers, at most ...
MEMO_CHARS = 1 << 20  # ... and at most this many characters of them (then it starts over)


class Bounder:
    """Raw value -> label: :func:`bound`, then ``then`` (e.g. the vocabulary rule), memoised
    so that each distinct raw value is bounded once. ``bounded`` counts the distinct raw
    values the label differs from. The memo is bounded (:data:`MEMO_CAP` values,
    :data:`MEMO_CHARS` characters; a raw value can be 20,000 characters long): when full it
    starts over, and a value seen again after that is bounded and counted again."""

    def __init__(
        self, max_len: int = MAX_LABEL_LEN, then: Callable[[str], str] | None = None
    ) -> None:
        self.bounded = 0
        self._max_len = max_len
        self._then = then
        self._memo: dict[str, str] = {}
        self._chars = 0
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        out = self._memo.get(value)
        if out is not None:
            return out
        out = bound(value, self._max_len)
        if self._then is not None:
            out = self._then(out)
        with self._lock:  # once per distinct value: counted once, whichever thread saw it first
            if value not in self._memo:
                if len(self._memo) >= MEMO_CAP or self._chars + len(value) > MEMO_CHARS:
                    self._memo.clear()
                    self._chars = 0
                self._memo[value] = out
                self._chars += len(value)
                if out != value:
                    self.bounded += 1
        return out
