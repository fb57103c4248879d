"""`warmscope misses`: why prefix-KV prompt tokens missed, from the embedded store.

    warmscope misses                         the last 24 hours of data: tokens and share per class
    warmscope misses --since 6h --by tenant  one row per tenant, a column per class
    warmscope misses --since 2026-12-01T08:00 --json

``--since`` is a duration back from the newest data (``30m``, ``6h``, ``2d``) or a time
(ISO 8601, UTC unless an offset is given, or Unix seconds). The table's classes add up to the
missed tokens (prompt − cached) of every classified request in the range; the line below it is
the warm-up-addressable share (see docs/architecture.md, "Why misses").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from warmscope.app.cli.base import Simple, store_path

PROG = "warmscope misses"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--since",
        default="24h",
        help="a duration back from the newest data (30m, 6h, 2d) or a time "
        "(ISO 8601, UTC unless an offset is given, or Unix seconds); default 24h",
    )
    p.add_argument(
        "--by",
        choices=("tenant", "engine", "family"),
        help="one row per tenant, engine or key family",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _since(text: str, newest: float) -> float:
    m = _DURATION.match(text.strip())
    if m:
        return newest - float(m[1]) * _UNIT_S[m[2]]
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither a duration (30m, 6h, 2d) nor a time "
            "(2026-12-01T08:00, or Unix seconds)"
        ) from None
    return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()


def _num(x: float) -> Any:
    """JSON-safe: NaN becomes null, whole floats ints."""
    if x != x:
        return None
    return int(x) if float(x).is_integer() else round(float(x), 6)


def cmd_misses(args: argparse.Namespace, path: Path) -> int:
    from warmscope.analysis import misses as mz
    from warmscope.sources import EmbeddedSource, SourceError

    def fail(msg: str) -> int:
        print(f"{PROG}: {msg}", file=sys.stderr)
        return 2

    if not path.exists():
        return fail(
            f"{path} does not exist; pass --store PATH (or run `warmscope demo` for demo data)"
        )
    try:
        src = EmbeddedSource(path)
        b = src.time_bounds()
        newest = b[1] if b else 0.0
        start = _since(args.since, newest)
        fr = src.frames(["misses", "warmed_keys"], start, newest + 1e-6) if b else {}
    except ValueError as e:
        return fail(str(e))
    except SourceError as e:
        return fail(str(e))
    m = fr.get("misses")
    if m is None or m.empty or float(m["tokens"].sum()) <= 0:
        msg = (
            f"no missed-token classes in {path} since {args.since}: they come from the simulator "
            "(`warmscope demo`) or a classifier that calls Telemetry.record_misses"
        )
        if args.json:
            print(json.dumps({"since": start if b else None, "tokens": 0, "rows": []}))
        else:
            print(msg)
        return 0
    addr = mz.addressable(m, fr["warmed_keys"])
    if args.by:
        t = mz.by_dimension(m, args.by)
    else:
        t = mz.class_table(m)
    if args.json:
        rows = [
            {
                k: (_num(v) if isinstance(v, float) else (int(v) if hasattr(v, "item") else v))
                for k, v in r.items()
            }
            for r in t.to_dict("records")
        ]
        print(
            json.dumps(
                {
                    "since": start,
                    "until": newest,
                    "by": args.by or "miss_class",
                    "rows": rows,
                    "tokens": _num(addr["tokens"]),
                    "addressable_tokens": _num(addr["addressable"]),
                    "addressable_share": _num(addr["share"]),
                    "warmed_keys": addr["warmed_keys"],
                    "warm_hits": _num(addr["warm_hits"]),
                },
                indent=2,
            )
        )
        return 0
    print(_render(t, args.by))
    share = addr["share"]
    shown = "-" if share != share else f"{share:.1%}"
    print(
        f"\nwarm-up-addressable: {shown} of {addr['tokens']:,.0f} missed tokens "
        f"(cold + evicted in {addr['families']} warmed tenant x family pairs); "
        f"hits on {addr['warmed_keys']:,} warmed prefix_kv keys: {addr['warm_hits']:,.0f}"
    )
    return 0


HEADERS = {"addressable_share": "cold+evicted share"}


def _render(t: Any, by: str | None) -> str:
    """A plain text table: integers with thousands separators, shares in percent, '-' if none."""

    def cell(c: str, v: Any) -> str:
        if isinstance(v, float) and math.isnan(v):
            return "-"
        if c == "share" or c.endswith("_share"):
            return f"{v:.1%}"
        if isinstance(v, (int, float)) or hasattr(v, "item"):
            return f"{float(v):,.0f}"
        return str(v)

    cols = list(t.columns)
    body = [[cell(c, r[c]) for c in cols] for r in t.to_dict("records")]
    # "addressable" names the warmed families' cold + evicted share (the summary line); a
    # tenant's or family's column is cold + evicted of all its misses, as the dashboard calls it
    head = [HEADERS.get(c, c.replace("_", " ")) for c in cols]
    widths = [
        max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)
    ]
    first = 0  # the label column is left-aligned, numbers right-aligned
    lines = [
        "  ".join(
            h.ljust(w) if i == first else h.rjust(w)
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    ]
    for row in body:
        lines.append(
            "  ".join(
                v.ljust(w) if i == first else v.rjust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    return cmd_misses(args, store_path(args))


COMMAND = Simple(
    "misses",
    run=_run,
    arguments=_arguments,
    help="why prefix-KV prompt tokens missed, per class (elsewhere, evicted, "
    "isolated, drifted, cold, partial)",
    description="Missed prompt tokens (prompt - cached) by why they missed, from the embedded "
    "store: per class, or per tenant, engine or key family with --by.",
)
