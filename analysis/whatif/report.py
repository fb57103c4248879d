"""The what-if answer for one recording: its curves and its table of fixes, in one object the CLI
and the dashboard both render (:func:`whatif`), and as JSON (:meth:`WhatIf.as_dict`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from warmscope.model.blocktrace import BlockTrace, TraceError

from .curves import Curve, lru_curve, vllm_curve
from .fixes import FixTable, fixes

__all__ = ["WhatIf", "whatif", "EXACT_LIMIT", "SAMPLE_RATE"]

EXACT_LIMIT = 20_000_000  # block references an exact LRU curve is computed for (~1.3 GB)
SAMPLE_RATE = 0.01  # SHARDS rate beyond it


def _num(x: Any) -> Any:
    if isinstance(x, float | np.floating):
        return None if math.isnan(float(x)) else round(float(x), 6)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, dict):
        return {k: _num(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_num(v) for v in x]
    return x


@dataclass
class WhatIf:
    trace: BlockTrace
    capacity: int  # blocks per engine (vLLM's num_gpu_blocks)
    capacity_note: str  # where the capacity came from
    table: FixTable
    lru: Curve
    vllm: Curve | None

    def as_dict(self) -> dict[str, Any]:
        t = self.trace

        def curve(c: Curve | None) -> dict[str, Any] | None:
            if c is None:
                return None
            out: dict[str, Any] = dict(c.summary())
            out["points"] = [
                {"blocks": int(b), "tokens": int(b) * c.block_size, "hit_rate": float(h)}
                for b, h in zip(c.capacity, c.hit_rate, strict=True)
            ]
            if c.by_tenant:
                out["by_tenant"] = {k: [float(x) for x in v] for k, v in c.by_tenant.items()}
            return out

        d: dict[str, Any] = _num(
            {
                "trace": {
                    "source": t.source,
                    "requests": len(t),
                    "engines": list(t.engines),
                    "tenants": [x for x in t.tenants if x],
                    "block_size": t.block_size,
                    "block_references": t.n_blocks,
                    "span_s": t.span_s,
                    "prompt_tokens": int(t.prompt.sum()),
                },
                "capacity_blocks": self.capacity,
                "capacity_note": self.capacity_note,
                **self.table.as_dict(),
                "lru_curve": curve(self.lru),
                "vllm_curve": curve(self.vllm),
            }
        )
        return d


def whatif(
    trace: BlockTrace,
    capacity: int,
    capacity_note: str = "",
    engines: int | None = None,
    concurrent: bool = False,
    unsalt: Iterable[str] | None = None,
    vllm_points: int = 0,
    rate: float | None = None,
    warm: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> WhatIf:
    """Curves and fixes of ``trace`` at ``capacity`` blocks per engine. ``vllm_points``: sizes of
    the vLLM curve (0: none; each is a full replay). ``rate``: SHARDS sampling for the LRU curve
    (default: exact up to :data:`EXACT_LIMIT` block references)."""
    if capacity < 2:
        raise TraceError(
            f"capacity {capacity} blocks: an engine needs at least 2 (one is vLLM's null block)"
        )
    steps = 2 + vllm_points
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, steps)

    r = rate if rate is not None else (1.0 if trace.n_blocks <= EXACT_LIMIT else SAMPLE_RATE)
    lru = lru_curve(trace, rate=r, today=capacity)
    tick()
    table = fixes(trace, capacity, engines=engines, concurrent=concurrent, unsalt=unsalt, warm=warm)
    tick()
    v = None
    if vllm_points > 0:

        def inner(k: int, n: int) -> None:
            if progress is not None:
                progress(2 + k, steps)

        v = vllm_curve(
            trace,
            engines=engines,
            concurrent=concurrent,
            today=capacity,
            points=vllm_points,
            progress=inner,
        )
    return WhatIf(trace, capacity, capacity_note, table, lru, v)
