"""Terminal output the commands share."""

from __future__ import annotations

import sys
from collections.abc import Callable


def progress(label: str) -> Callable[[int, int], None]:
    """A terminal progress bar; redraws only when the percentage changes."""
    last = [-1]
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct == last[0] or (not tty and done < total):
            return
        last[0] = pct
        width = 30
        filled = width * pct // 100
        end = "\n" if done >= total else ""
        print(
            f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {pct:3d}%",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return show
