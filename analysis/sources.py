"""Where frames come from: the only I/O in ``analysis``.

:class:`EmbeddedSource` reads the embedded store. Every source has
``frame(name, start=None, end=None)`` returning the canonical frames documented
in :mod:`collectors.store`, and ``frames(names, ...)`` for several at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from warmscope.collectors.store import FRAMES, EmbeddedStore, StoreError

__all__ = ["EmbeddedSource", "SourceError", "FRAMES"]


class SourceError(RuntimeError):
    """A backend cannot give the data; the message names it and what to do."""


class EmbeddedSource:
    label = "embedded store"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._store = EmbeddedStore(self.path, readonly=True)
        except StoreError as e:
            raise SourceError(str(e)) from None

    def frame(self, name: str, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        try:
            return self._store.frame(name, start, end)
        except StoreError as e:
            raise SourceError(str(e)) from None

    def frames(self, names: Iterable[str] = FRAMES, start: float | None = None,
               end: float | None = None) -> dict[str, pd.DataFrame]:
        return {n: self.frame(n, start, end) for n in names}

    def units(self, experiment: str | None = None) -> pd.DataFrame:
        return self._call(self._store.units, experiment)

    def moments(self, experiment: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-variant A/B moments (see :mod:`collectors.ab_moments`)."""
        return self._call(self._store.moments, experiment)

    def request_totals(self, experiment: str) -> dict[str, float]:
        return self._call(self._store.request_totals, experiment)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except StoreError as e:
            raise SourceError(str(e)) from None

    def describe(self) -> str:
        return f"{self.label} · {self.path}"
