"""JSON of bytes, as request bodies and streamed usage chunks are read: orjson when it is
installed, else the standard library's C scanner called directly."""

from __future__ import annotations

import json
from typing import Any

# orjson, the client extra's JSON parser: about 2.5x as fast as the standard library's on
# request bodies.
try:
    import orjson
except ImportError:  # pragma: no cover - the standard library's scanner alone
    orjson = None  # type: ignore[assignment]
_orjson_loads = orjson.loads if orjson is not None else None

_JSON = json.JSONDecoder()
# the C scanner, set by JSONDecoder.__init__
_SCAN = _JSON.scan_once  # type: ignore[attr-defined]


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
