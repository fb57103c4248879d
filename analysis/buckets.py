"""Time buckets for points stamped at the *end* of their interval.

A flush at ``ts`` covers ``(ts − step, ts]``, so a bucket of ``freq`` seconds
starting at ``s`` holds the points with ``s < ts <= s + freq``: a point on a
boundary belongs to the bucket it closes. :func:`bucket_start` returns ``s``.

The arithmetic is done on integers (microseconds): at Unix times (~1.8e9 s) a
float64 is only good to about 2.4e-7 s, so a float nudge such as
``(ts − 1e-9) // freq`` is lost in rounding and every boundary point lands one
bucket late. Microseconds keep timestamps up to year 2255 exact in int64
(1.8e15 < 2^53, and the float→int conversion is exact below 2^53).

Example::

    bucket_start(1_800_000_300.0, 300)   # 1800000000.0 (the point closes that bucket)
    bucket_start(1_800_000_300.5, 300)   # 1800000300.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["bucket_start", "US"]

US = 1_000_000  # integer ticks per second


def _freq_us(freq: float) -> int:
    f = int(round(float(freq) * US))
    if f <= 0:
        raise ValueError(f"bucket width must be at least 1 µs, got {freq!r} s")
    return f


def bucket_start(ts: Any, freq: float) -> Any:
    """Start of the ``freq``-second bucket ``(start, start + freq]`` holding each
    end-stamped time ``ts`` (scalar, array or Series; a Series keeps its index).
    Buckets are aligned to multiples of ``freq`` from the epoch."""
    f = _freq_us(freq)
    if isinstance(ts, pd.Series):
        return pd.Series(bucket_start(ts.to_numpy(dtype=float), freq), index=ts.index, name=ts.name)
    scalar = np.ndim(ts) == 0
    t = np.asarray(ts, dtype=float)
    ok = np.isfinite(t)
    us = np.rint(np.where(ok, t, 0.0) * US).astype(np.int64)
    # (us − 1) // f: a point exactly on a boundary (us = k·f) goes to the bucket it closes, k − 1.
    out = np.where(ok, (((us - 1) // f) * f).astype(float) / US, np.nan)
    return float(out) if scalar else out
