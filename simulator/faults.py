"""Injectable cold-start traps, with ground truth.

A fault is one of the seven cold-start traps (listed below), switched on for a window and a
scope. Spec syntax (``warmscope simulate --fault``)::

    TRAP[:DIM=VALUE[,DIM=VALUE...]][@START-END][;PARAM=VALUE...]

``START``/``END`` are ``HH:MM`` from the start of the simulated day (or hours as
a number); DIM is one of ``tenant``, ``layer``, ``replica``, ``template``,
``model``. Examples::

    bypass:tenant=globex,layer=response@10:00-11:30
    tenant_isolation:layer=response@14:00-15:00
    kv_fixed_len:replica=a-0@06:00-09:00;min_tokens=2048

Traps (name — what the simulator does in scope and window — its signature):

``warmup_out_of_step`` (1)
    the scoped replica restarts at START: caches and weights dropped, weights
    reload, and its warm-up only finishes at END — traffic meets a cold
    replica: weights/prefix misses on that replica only.
``dynamic_tokenisation`` (2)
    prompts of the scoped template are tokenised with a random variant, so
    one template maps to many prefix/response keys: same families, many more
    distinct keys, hit rate falls while requests repeat as before.
``kv_fixed_len`` (3)
    the prefix-KV cache serves only sequences of at least ``min_tokens``
    (default 2048): short prompts miss, by length bucket.
``tenant_isolation`` (4)
    response-cache keys lose their tenant scope: tenants read each other's
    entries (cross-tenant reads; a data leak).
``bypass`` (5)
    a middleware path skips the cache: lookups are ``bypass`` results.
``key_explosion`` (6)
    response keys gain per-user and per-minute dimensions: new key families,
    equal requests land on different keys.
``warmup_timing`` (7)
    the scoped warm-up runs at START with entries that expire (TTL
    ``ttl_s``, default 300 s) before the traffic that needs them arrives:
    warm-set precision collapses.

Ground truth rows: ``{"trap", "scope": {dim: value}, "start", "end", "params"}``
with absolute (virtual) Unix seconds, written to the store's ``faults`` frame
and, with ``--faults-out``, to a JSON file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Fault", "TRAPS", "parse_fault", "DIMS"]

TRAPS = (
    "warmup_out_of_step",
    "dynamic_tokenisation",
    "kv_fixed_len",
    "tenant_isolation",
    "bypass",
    "key_explosion",
    "warmup_timing",
)
DIMS = ("tenant", "layer", "replica", "template", "model")
_SPEC = re.compile(
    r"^(?P<trap>[a-z_]+)(?::(?P<scope>[^@;]*))?(?:@(?P<win>[^;]+))?(?:;(?P<params>.*))?$"
)


@dataclass(frozen=True)
class Fault:
    trap: str
    scope: dict[str, str] = field(default_factory=dict)
    start: float = 0.0  # seconds from the simulation start
    end: float = float("inf")
    params: dict[str, Any] = field(default_factory=dict)

    def active(self, t_rel: float) -> bool:
        return self.start <= t_rel < self.end

    def matches(self, **dims: str) -> bool:
        for k, v in self.scope.items():
            if k in dims and dims[k] != v:
                return False
        return True

    def ground_truth(self, t0: float, hours: float) -> dict[str, Any]:
        end = min(self.end, hours * 3600)
        return {
            "trap": self.trap,
            "scope": dict(self.scope),
            "start": t0 + self.start,
            "end": t0 + end,
            "params": dict(self.params),
        }


def _time(s: str) -> float:
    """``HH:MM`` (00:00-24:00) as seconds from midnight."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", s.strip())
    if not m:
        raise ValueError(f"{s.strip()!r} is not HH:MM (write 10:00, not 10 or 10.0)")
    h, mi = int(m[1]), int(m[2])
    if mi > 59:
        raise ValueError(f"minute {mi} in {s.strip()!r} is not 00-59")
    if h > 24 or (h == 24 and mi):
        raise ValueError(f"{s.strip()!r} is not a time of day (00:00-24:00)")
    return h * 3600 + mi * 60


# Parameters the traps read, and their types (others pass through as given).
_PARAM_TYPES = {"min_tokens": int, "ttl_s": float}
LAYERS = ("weights", "response", "lora", "embedding", "prefix_kv")  # the simulator's caches


def parse_fault(spec: str) -> Fault:
    """Parse a ``--fault`` spec; errors name the part that is wrong."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(
            f"fault spec {spec!r} is not TRAP[:DIM=VALUE,...][@HH:MM-HH:MM][;PARAM=VALUE]"
        )
    trap = m["trap"]
    if trap not in TRAPS:
        raise ValueError(f"unknown trap {trap!r} in {spec!r}; traps: {', '.join(TRAPS)}")
    scope: dict[str, str] = {}
    for part in filter(None, (m["scope"] or "").split(",")):
        if "=" not in part:
            raise ValueError(f"scope part {part!r} in {spec!r} must be DIM=VALUE")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in DIMS:
            raise ValueError(
                f"unknown scope dimension {k!r} in {spec!r}; dimensions: {', '.join(DIMS)}"
            )
        if k in scope:
            raise ValueError(f"scope dimension {k!r} is given twice in {spec!r}; give it once")
        if k == "layer" and v not in LAYERS:
            raise ValueError(f"unknown layer {v!r} in {spec!r}; layers: {', '.join(LAYERS)}")
        scope[k] = v
    start, end = 0.0, float("inf")
    if m["win"]:
        if "-" not in m["win"]:
            raise ValueError(
                f"window {m['win']!r} in {spec!r} must be HH:MM-HH:MM (a start and an end)"
            )
        try:
            a, b = m["win"].split("-", 1)
            start, end = _time(a), _time(b)
        except ValueError as e:
            raise ValueError(f"window {m['win']!r} in {spec!r} must be HH:MM-HH:MM ({e})") from None
        if end <= start:
            raise ValueError(f"window {m['win']!r} in {spec!r} must end after it starts")
    params: dict[str, Any] = {}
    for part in filter(None, (m["params"] or "").split(";")):
        if "=" not in part:
            raise ValueError(f"parameter {part!r} in {spec!r} must be NAME=VALUE")
        k, v = (x.strip() for x in part.split("=", 1))
        if k in _PARAM_TYPES:
            typ = _PARAM_TYPES[k]
            try:
                num = float(v)
                if not (num > 0 and num != float("inf")) or (typ is int and not num.is_integer()):
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"parameter {k} in {spec!r} must be a positive "
                    f"{'integer' if typ is int else 'number'}, got {v!r}"
                ) from None
            params[k] = num
            continue
        raise ValueError(
            f"unknown parameter {k!r} in {spec!r}; parameters: min_tokens (kv_fixed_len), "
            "ttl_s (warmup_timing)"
        )
    return Fault(trap, scope, start, end, params)
