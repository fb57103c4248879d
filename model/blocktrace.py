"""A block trace: every request's prefix-cache blocks, in arrival order.

What a replay of an engine's prefix cache needs, per request: when it arrived and
ended, who sent it (tenant), where it ran (engine), its cache salt, its prompt,
output and cached tokens, its time to first token, and the ordered chain of its
blocks. A block is a 63-bit digest; two requests share a block when they share the
digest at the same position after the same digests (the chain identity of a
prefix cache). No token id and no text is ever held here: the recorder (the KV
watcher) keys its digests with a secret, and a trace read from a file keeps only
the ids the file gave.

Three digests per block, so that a replay can ask three questions of one recording:

* ``h`` — the block as the engine cached it (tokens after the same preceding
  tokens, under the request's salt);
* ``c`` — the same chain *without* the salt: two salted tenants that send the same
  system prompt have different ``h`` and the same ``c`` (what dropping the salt
  would share);
* ``s`` — the chain with the template's drifting blocks (a timestamp that changes
  every hash after it) replaced by one placeholder per salt and position: what a
  stable template would cache. Equal to ``h`` where nothing drifted.

``full[i]`` is how many leading entries of request ``i``'s chain are full blocks an
engine would cache (a recorded chain holds only those; a chain read from a trace
file in the Mooncake format also holds the prompt's last, partial block). Blocks
the chain does not name (the output's) are unique to the request.

``cls`` keeps, per block, how the recording judged it (:data:`BLOCK_CLASSES`:
``hit`` or a miss class), 255 where it was not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "BLOCK_CLASSES",
    "UNJUDGED",
    "MASK63",
    "BlockTrace",
    "TraceError",
    "TraceBuilder",
    "chain_ids",
]

# How the recording judged each block: a hit, or the miss class of the KV attribution.
BLOCK_CLASSES = ("hit", "elsewhere", "evicted", "isolated", "drifted", "cold")
UNJUDGED = 255
MASK63 = (1 << 63) - 1  # digests keep the top bit clear: the replay's synthetic blocks use it


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the line or parameter and what to do."""


def chain_ids(ids: Sequence[int], salt: int = 0) -> list[int]:
    """63-bit chain digests of a sequence of block ids: the ``k``-th depends on ids ``0..k``
    (and the salt), as a prefix cache's block hashes do. Never 0."""
    out = []
    prev = salt & MASK63
    for b in ids:
        prev = _mix(prev, int(b))
        out.append(prev)
    return out


def _mix(prev: int, x: int) -> int:
    # splitmix64 of (prev, x): a 63-bit digest that is never 0
    z = (prev * 0x9E3779B97F4A7C15 + x + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = (z ^ (z >> 31)) & MASK63
    return z or 1


@dataclass
class BlockTrace:
    """Columnar: per-request arrays of length ``n``; per-block arrays indexed through
    ``offsets`` (request ``i``'s blocks are ``offsets[i]:offsets[i+1]``)."""

    block_size: int
    t: np.ndarray  # arrival, seconds (float64, non-decreasing)
    t_end: np.ndarray  # completion, seconds; NaN when unknown
    prompt: np.ndarray  # prompt tokens (int64)
    output: np.ndarray  # output tokens (int64)
    cached: np.ndarray  # cached prompt tokens the engine reported; -1 when unknown
    ttft: np.ndarray  # time to first token, seconds; NaN when unknown
    tenant: np.ndarray  # index into ``tenants`` (int32)
    engine: np.ndarray  # index into ``engines`` (int32); -1 when unknown
    salt: np.ndarray  # index into ``salts`` (int32); 0 = no salt
    full: np.ndarray  # leading chain entries that are full, cacheable blocks (int64)
    offsets: np.ndarray  # int64, n + 1
    h: np.ndarray  # uint64 per block
    c: np.ndarray  # uint64 per block
    s: np.ndarray  # uint64 per block
    cls: np.ndarray  # uint8 per block
    tenants: tuple[str, ...] = ("",)
    engines: tuple[str, ...] = ()
    salts: tuple[str, ...] = ("",)
    restarts: tuple[tuple[float, int], ...] = ()  # (time, engine index): the cache was emptied
    source: str = ""
    capacity: dict[str, int] = field(default_factory=dict)  # engine -> num_gpu_blocks, if known
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def n_blocks(self) -> int:
        return int(self.offsets[-1])

    def chain(self, i: int) -> np.ndarray:
        return self.h[self.offsets[i] : self.offsets[i + 1]]

    @property
    def span_s(self) -> float:
        return float(self.t[-1] - self.t[0]) if len(self) else 0.0

    def subset(self, keep: np.ndarray) -> BlockTrace:
        """The requests where ``keep`` (a boolean mask) is true, in order."""
        keep = np.asarray(keep, bool)
        idx = np.flatnonzero(keep)
        lens = np.diff(self.offsets)[idx]
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        take = (
            np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in idx])
            if len(idx)
            else np.zeros(0, np.int64)
        ).astype(np.int64)
        return BlockTrace(
            self.block_size,
            self.t[idx],
            self.t_end[idx],
            self.prompt[idx],
            self.output[idx],
            self.cached[idx],
            self.ttft[idx],
            self.tenant[idx],
            self.engine[idx],
            self.salt[idx],
            self.full[idx],
            offsets,
            self.h[take],
            self.c[take],
            self.s[take],
            self.cls[take],
            self.tenants,
            self.engines,
            self.salts,
            tuple(r for r in self.restarts if len(idx) and self.t[idx[0]] <= r[0]),
            self.source,
            dict(self.capacity),
            list(self.notes),
        )

    def window(self, start: float, end: float) -> BlockTrace:
        return self.subset((self.t >= start) & (self.t < end))

    def check(self) -> None:
        """Raise :class:`TraceError` when the arrays do not describe a replayable trace."""
        n = len(self)
        if self.block_size <= 0:
            raise TraceError(f"block size {self.block_size}: must be a positive number of tokens")
        for name in ("t_end", "prompt", "output", "cached", "ttft", "tenant", "engine", "salt"):
            if len(getattr(self, name)) != n:
                raise TraceError(
                    f"trace column {name} has {len(getattr(self, name))} rows, not {n}"
                )
        if len(self.offsets) != n + 1 or (n and np.any(np.diff(self.offsets) < 0)):
            raise TraceError("trace offsets are not a non-decreasing index of the blocks")
        if n and np.any(np.diff(self.t) < 0):
            i = int(np.flatnonzero(np.diff(self.t) < 0)[0]) + 1
            raise TraceError(
                f"request {i + 1}: its arrival ({self.t[i]:.3f} s) is before the one before it "
                f"({self.t[i - 1]:.3f} s): sort the trace by arrival time"
            )
        if np.any(self.prompt < 0) or np.any(self.output < 0):
            raise TraceError("a request has a negative token count")


class TraceBuilder:
    """Collects requests one at a time (a recorder, a file reader) and builds a
    :class:`BlockTrace`. Tenants, engines and salts are named; the builder numbers them."""

    def __init__(self, block_size: int, source: str = "") -> None:
        self.block_size = block_size
        self.source = source
        self._rows: list[tuple[float, float, int, int, int, float, int, int, int, int]] = []
        self._h: list[int] = []
        self._c: list[int] = []
        self._s: list[int] = []
        self._cls: list[int] = []
        self._offsets = [0]
        self._names: dict[str, dict[str, int]] = {"tenant": {"": 0}, "engine": {}, "salt": {"": 0}}
        self.restarts: list[tuple[float, int]] = []

    def _code(self, kind: str, name: str | None) -> int:
        if name is None:
            return -1 if kind == "engine" else 0
        d = self._names[kind]
        code = d.get(name)
        if code is None:
            code = d[name] = len(d)
        return code

    def add(
        self,
        t: float,
        prompt: int,
        output: int,
        h: Sequence[int],
        *,
        t_end: float = float("nan"),
        cached: int = -1,
        ttft: float = float("nan"),
        tenant: str | None = None,
        engine: str | None = None,
        salt: str | None = None,
        full: int | None = None,
        c: Sequence[int] | None = None,
        s: Sequence[int] | None = None,
        cls: Sequence[int] | None = None,
    ) -> None:
        n = len(h)
        self._rows.append(
            (
                float(t),
                float(t_end),
                int(prompt),
                int(output),
                int(cached),
                float(ttft),
                self._code("tenant", tenant),
                self._code("engine", engine),
                self._code("salt", salt or None),
                n if full is None else min(int(full), n),
            )
        )
        self._h.extend(h)
        self._c.extend(h if c is None else c)
        self._s.extend(h if s is None else s)
        self._cls.extend([UNJUDGED] * n if cls is None else cls)
        self._offsets.append(self._offsets[-1] + n)

    def restart(self, t: float, engine: str) -> None:
        self.restarts.append((float(t), self._code("engine", engine)))

    def __len__(self) -> int:
        return len(self._rows)

    def build(self) -> BlockTrace:
        rows = np.array(self._rows, dtype=np.float64).reshape(-1, 10)

        def names(kind: str) -> tuple[str, ...]:
            d = self._names[kind]
            return tuple(sorted(d, key=d.__getitem__))

        trace = BlockTrace(
            self.block_size,
            rows[:, 0].copy(),
            rows[:, 1].copy(),
            rows[:, 2].astype(np.int64),
            rows[:, 3].astype(np.int64),
            rows[:, 4].astype(np.int64),
            rows[:, 5].copy(),
            rows[:, 6].astype(np.int32),
            rows[:, 7].astype(np.int32),
            rows[:, 8].astype(np.int32),
            rows[:, 9].astype(np.int64),
            np.array(self._offsets, np.int64),
            np.array(self._h, np.uint64),
            np.array(self._c, np.uint64),
            np.array(self._s, np.uint64),
            np.array(self._cls, np.uint8),
            names("tenant"),
            names("engine"),
            names("salt"),
            tuple(self.restarts),
            self.source,
        )
        return trace
