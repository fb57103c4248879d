"""Timing helpers: best-of-N wall time per operation (noise goes up, never down)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_ns(fn: Callable[[], None], n_ops: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t)
    return best / n_ops


def table(rows: list[tuple[str, float]], baseline: str, unit: str = "ns/op") -> str:
    base = dict(rows)[baseline]
    w = max(len(r[0]) for r in rows)
    out = [f"{'case':<{w}}  {unit:>10}  {'x ' + baseline:>14}"]
    for name, v in rows:
        out.append(f"{name:<{w}}  {v:>10.1f}  {v / base:>14.2f}")
    return "\n".join(out)
