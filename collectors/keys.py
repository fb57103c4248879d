"""Key identity without key text: keyed hashes, key families, bounded tenants.

* :class:`KeyHasher` — a keyed BLAKE2b digest. The raw key never leaves the
  process; hot keys, warmed keys and A/B units are exported by this hash only.
  Hashing costs ~0.7 µs, so it runs when something is exported, not per lookup.
* :class:`FamilyNormaliser` — maps a key to its *family*, a template safe to use
  as a label. User rules ``(regex, template)`` are tried first: the first regex
  that matches gives ``match.expand(template)`` (``\\1`` refers to groups) and
  nothing else of the key; the default
  splits on ``:`` / ``/`` / ``|``, keeps a segment only when it is a word of a
  known vocabulary (cache namespaces and task names, :data:`DEFAULT_VOCABULARY`,
  plus ``family_vocabulary``; words may be joined by ``_``/``-``/``.``),
  replaces every other segment — ids, hashes, names, email parts, free text —
  by ``*``, and keeps at most four segments: ``summarize:doc:8812`` ->
  ``summarize:doc:*``, ``user:alicesmith:chat`` -> ``user:*:chat``, a prompt
  used as a key (``resp:What is the capital of France?``) -> ``resp:*``.
  Results are memoised per key (bounded) and the number of families per layer
  is capped; overflow maps to ``other``.
* :class:`TenantBucketer` — an allow-list, or the first ``max_tenants`` seen;
  everything else is ``other``.

Example::

    >>> FamilyNormaliser().family("summarize:doc:8812")
    'summarize:doc:*'
    >>> len(KeyHasher(b"s3cret").hash("summarize:doc:8812"))
    16
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable

from warmscope.model import schema

from .labels import MAX_LABEL_LEN, Bounder, vocabulary_label

__all__ = ["KeyHasher", "FamilyNormaliser", "TenantBucketer", "LabelCap"]

_SPLIT = re.compile(r"([:/|])")
_IDENT = re.compile(r"[A-Za-z_\-.]{1,32}")
_DIGITS = str.maketrans("123456789", "000000000")


class KeyHasher:
    def __init__(self, secret: bytes, memo_size: int = 1 << 17) -> None:
        if not secret:
            raise ValueError("key secret must not be empty")
        self._secret = bytes(secret)[:64]
        self._memo: dict[object, str] = {}  # the same hot keys and units recur every flush
        self._memo_size = memo_size

    def hash(self, key: object) -> str:
        h = self._memo.get(key)
        if h is None:
            data = key if isinstance(key, bytes) else str(key).encode("utf-8", "surrogatepass")
            h = hashlib.blake2b(data, key=self._secret, digest_size=8).hexdigest()
            if len(self._memo) >= self._memo_size:
                self._memo.clear()
            self._memo[key] = h
        return h


# Segments a default family keeps: words that name a cache's structure in
# inference stacks (namespaces, layers, common task names), never anything a
# user typed. Extend it with ``family_vocabulary`` or write ``family_rules``.
DEFAULT_VOCABULARY = frozenset(
    """
    a b c d e f g h i j k l m n o p q r s t u v w x y z
    api adapter adapters audio batch block blocks cache cached chat chunk chunks classify codegen
    completion completions context conv conversation ctx doc docs document documents emb embed
    embedding embeddings extract feature features fn gen generate hist history hot idx image img
    index item items kv lora meta model models msg page pages passage passages prefix prefix_kv
    query queries rag ragqa rerank resp response responses retrieve retrieval search seg segment
    sess session sessions summarize summary sys system tenant tok token tokenizer tokens tool tools
    translate user users vec vector warm weights
""".split()
)
_WORD_SPLIT = re.compile(r"[_\-.]")


def _segment(seg: str, vocab: frozenset[str] = DEFAULT_VOCABULARY) -> str:
    """A segment stays only when it is a known word (or words joined by
    ``_``/``-``/``.``): a name, an email part, an id or free text becomes ``*``."""
    if not seg:
        return ""
    if seg in vocab:
        return seg
    if len(seg) <= 32 and all(w in vocab for w in _WORD_SPLIT.split(seg)):
        return seg
    return "*"


def default_family(key: str, vocab: frozenset[str] = DEFAULT_VOCABULARY) -> str:
    if "/" not in key and "|" not in key:  # the common case: str.split, no regex
        parts = key.split(":")
        if len(parts) > 4:
            return ":".join([_segment(p, vocab) for p in parts[:4]] + ["*"]) or "*"
        return ":".join([_segment(p, vocab) for p in parts]) or "*"
    parts = _SPLIT.split(key)
    out: list[str] = []
    segs = 0
    for i in range(0, len(parts), 2):
        if segs == 4:
            out.append("*")
            break
        out.append(_segment(parts[i], vocab))
        segs += 1
        if i + 1 < len(parts):
            out.append(parts[i + 1])
    return "".join(out) or "*"


class FamilyNormaliser:
    """Key -> family label, memoised and bounded (thread-safe enough: races
    only recompute the same value)."""

    def __init__(
        self,
        rules: Iterable[tuple[str, str]] = (),
        max_families: int = 256,
        memo_size: int = 1 << 18,
        vocabulary: Iterable[str] = (),
    ) -> None:
        self._rules = [(re.compile(p), r) for p, r in rules]
        self._key_rules: list[tuple[re.Pattern[str], str]] = []  # see add_key_rule
        self._vocab = DEFAULT_VOCABULARY | frozenset(vocabulary)
        self._max = max_families
        self._memo: dict[object, str] = {}
        self._memo_size = memo_size
        self._families: set[str] = set()
        self.overflow = 0  # keys whose family was mapped to "other" (first time seen)
        self._lock = threading.Lock()
        # Without rules the default family depends only on each segment's
        # class, which replacing digits by "0" keeps: keys that differ only in
        # digits (ids, counters) share one memo entry. Unique keys then cost a
        # translate and a dict probe instead of a full normalisation.
        self._shapes: dict[str, str] | None = None if self._rules else {}

    def add_key_rule(self, pattern: str, template: str) -> None:
        """A rule for keys of a fixed shape that a producer makes itself (the
        OpenAI-compatible recorder's prefix keys): a key that matches
        ``pattern`` entirely gets ``match.expand(template)`` as its family,
        before ``family_rules`` and the default. Added once per pattern."""
        with self._lock:
            if all(p.pattern != pattern for p, _ in self._key_rules):
                self._key_rules = self._key_rules + [(re.compile(pattern), template)]
                self._memo.clear()  # keys memoised before the rule get it too

    def family(self, key: object) -> str:
        fam = self._memo.get(key)
        if fam is not None:
            return fam
        return self._slow(key)

    def _slow(self, key: object) -> str:
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        fam = None
        for pat, repl in self._key_rules:
            m = pat.fullmatch(text)
            if m:
                fam = m.expand(repl)
                break
        keyed = fam is not None
        shapes = None if keyed else self._shapes
        if shapes is not None:
            shape = text.translate(_DIGITS)
            fam = shapes.get(shape)
            if fam is None:
                fam = default_family(text, self._vocab)
                if len(shapes) >= self._memo_size:
                    shapes.clear()
                shapes[shape] = fam
        for pat, repl in () if keyed else self._rules:
            m = pat.search(text)
            if m:
                # The family is the expanded template alone: the rest of the key
                # text is dropped, so a partial match cannot leak it.
                fam = m.expand(repl)
                break
        if fam is None:
            fam = default_family(text, self._vocab)
        if fam not in self._families:
            with self._lock:
                if len(self._families) >= self._max:
                    fam = schema.OTHER
                    self.overflow += 1
                else:
                    self._families.add(fam)
        if len(self._memo) >= self._memo_size:
            self._memo.clear()  # cleared in place: LayerBinding holds this dict
        try:
            self._memo[key] = fam
        except TypeError:  # unhashable key: no memo
            pass
        return fam


class TenantBucketer:
    """Tenant labels: bounded (:func:`.labels.bound`), then an allow-list or
    the first ``max_tenants`` seen; everything else is ``other``. ``bounded``
    counts the values a bound changed (the allow-list's own entries included)."""

    def __init__(
        self, allow: Iterable[str] = (), max_tenants: int = 64, max_len: int = MAX_LABEL_LEN
    ) -> None:
        self._bound = Bounder(max_len)  # raw -> bounded, memoised; counts distinct values
        self._allow = frozenset(self._bound(str(t)) for t in allow)
        self._seen: set[str] = set()
        self._max = max_tenants
        self._lock = threading.Lock()

    @property
    def bounded(self) -> int:
        return self._bound.bounded

    def label(self, tenant: object) -> str:
        if tenant is None or tenant == "":
            return schema.UNKNOWN
        t = str(tenant)
        if t in self._seen:
            return t
        t = self._bound(t)
        if self._allow:
            return t if t in self._allow else schema.OTHER
        if t in self._seen:
            return t
        with self._lock:
            if t in self._seen:
                return t
            if len(self._seen) < self._max:
                self._seen.add(t)
                return t
        return schema.OTHER


class LabelCap:
    """The first ``limit`` distinct values of one label, then ``other``.

    For labels the caller sets freely (model, experiment, variant, warm-up
    strategy and trigger): a bug that puts a request id in one cannot make a
    series per request. Overflowing values are counted (``overflow``). Every
    value is bounded first (:func:`.labels.bound`, counted in ``bounded``);
    with a ``vocabulary`` (warm-up trigger and strategy), a segment that is
    not a word of it becomes ``*``, as in key families."""

    def __init__(
        self, limit: int = 64, keep: Iterable[str] = (), vocabulary: frozenset[str] | None = None
    ) -> None:
        self._seen: set[str] = set(keep)
        self._max = limit + len(self._seen)
        self._lock = threading.Lock()
        rule = None if vocabulary is None else (lambda b: vocabulary_label(b, vocabulary))
        self._bound = Bounder(then=rule)  # raw -> label, memoised; counts distinct values
        self.overflow = 0

    @property
    def bounded(self) -> int:
        return self._bound.bounded

    def label(self, value: str) -> str:
        if value in self._seen:
            return value
        b = self._bound(value)
        if b != value:
            value = b
            if value in self._seen:
                return value
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self._max:
                self._seen.add(value)
                return value
            self.overflow += 1
        return schema.OTHER
