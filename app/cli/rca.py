"""`warmscope rca`: root causes of a change, from a leaf table or straight from a store.

    warmscope rca leaves.csv --dims tenant layer family --v-num hits --v-den lookups \\
        --f-num hits_exp --f-den lookups_exp            # a ratio measure (hit rate)
    warmscope rca leaves.csv.gz --dims a b c --v real --f predict   # an additive measure
    warmscope rca --store var/warmscope.sqlite --window 2026-11-30T10:00..2026-11-30T11:30 \\
        [--baseline START..END] [--export leaves.csv]   # the hit rate, from the lookups

Prints a JSON list ``[{"element": {dim: value}, "score": s, "explanatory_power": ep,
"direction": "up"|"down"}, ...]``, most important first; ``[]`` when nothing moved
beyond noise (the reason goes to stderr). Bad input gets one message naming the row
or column and exit status 2.

Kept light on purpose: a CSV leaf table is read with the standard library and
numpy only (no pandas, no collectors), so a call costs little more than the
Python start.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import sys
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from warmscope.app.cli.base import Simple, overwrite_problem

if TYPE_CHECKING:
    import numpy as np
    from warmscope.analysis.rootcause import Localization

PROG = "warmscope rca"


class InputError(Exception):
    """Bad input: the message names the problem and what to do."""


DESCRIPTION = (
    "One CSV row per combination of dimension values (a leaf), with observed and expected values; "
    "or, with --window, the hit rate of a store's lookups. Prints the root-cause set as JSON, most "
    "important first; [] when nothing moved beyond noise (the reason on stderr)."
)
EPILOG = (
    "examples:\n"
    "  warmscope rca leaves.csv --dims tenant layer --v-num hits --v-den lookups --f-num hits_exp "
    "--f-den lookups_exp\n"
    "  warmscope rca leaves.csv --dims a b c --v real --f predict\n"
    "  warmscope rca --store var/warmscope.sqlite --window 2026-11-30T10:00..2026-11-30T11:00 "
    "--export leaves.csv\n\n"
    "times: ISO 8601 (UTC unless an offset is given) or Unix seconds"
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("csv", nargs="?", help="leaf table (CSV, optionally .gz); omit with --window")
    p.add_argument(
        "--dims",
        nargs="+",
        help="dimension columns (CSV: required; store: default tenant layer "
        "family model replica variant length_bucket)",
    )
    p.add_argument("--v", help="observed column of an additive measure")
    p.add_argument("--f", help="expected column of an additive measure")
    p.add_argument("--v-num", help="observed numerator of a ratio measure")
    p.add_argument("--v-den", help="observed denominator of a ratio measure")
    p.add_argument("--f-num", help="expected numerator of a ratio measure")
    p.add_argument("--f-den", help="expected denominator of a ratio measure")
    p.add_argument(
        "--store",
        dest="rca_store",
        metavar="PATH",
        help="embedded store to read the lookups from (default: $WARMSCOPE_STORE or "
        "var/warmscope.sqlite)",
    )
    p.add_argument("--window", metavar="START..END", help="anomaly window of the store's data")
    p.add_argument(
        "--baseline",
        metavar="START..END",
        help="baseline window (default: the same length just before --window)",
    )
    p.add_argument("--export", metavar="CSV", help="with --window: also write the leaf table here")
    p.add_argument(
        "--max-depth",
        type=int,
        help="most dimensions per element (default: all, bounded beyond 10 dimensions)",
    )
    p.add_argument("--max-causes", type=int, default=10, help="most elements reported (default 10)")
    p.add_argument("--compact", action="store_true", help="one-line JSON")


def _fail(msg: str) -> int:
    print(f"{PROG}: {msg}", file=sys.stderr)
    return 2


def read_leaf_csv(path: str, dims: list[str], measures: list[str]) -> dict[str, np.ndarray]:
    """Columns of a CSV leaf table as numpy arrays (dims as strings, measures
    as floats). Raises InputError naming the file, row or column."""
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        raise InputError(f"{path} is a directory; give a CSV file")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        # Decompress and decode in one read, then parse: the csv module over a gzip stream
        # costs twice as much as over the whole text in memory.
        with opener(p, "rt", newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(io.StringIO(fh.read(), newline="")))
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text; save it as a UTF-8 CSV") from None
    except csv.Error as e:
        raise InputError(f"{path} is not valid CSV: {e}") from None
    rows = [r for r in rows if r]  # blank lines
    if not rows:
        raise InputError(f"{path} is empty; expected a header line and one row per leaf")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise InputError(f"{path} has a header but no rows")
    widths = set(map(len, body))
    for i, r in enumerate(body if widths != {len(header)} else ()):
        if len(r) != len(header):
            raise InputError(
                f"{path}, row {i + 2}: {len(r)} fields, the header has {len(header)}; "
                "every row needs one value per column"
            )
    missing = [c for c in dims + measures if c not in header]
    if missing:
        raise InputError(
            f"{path}: no column(s) {', '.join(missing)}; the header has {', '.join(header)}"
        )
    table = np.array(body, dtype=object)  # rows x columns; a third of the cost of zip(*body)
    out = {}
    for c in dims:
        out[c] = np.ascontiguousarray(table[:, header.index(c)])
    for c in measures:
        raw = table[:, header.index(c)]
        try:
            out[c] = np.array(raw, dtype=float)
        except ValueError:
            for i, x in enumerate(raw):
                try:
                    float(x)
                except ValueError:
                    what = "is empty" if not x.strip() else f"{x!r} is not a number"
                    raise InputError(f"{path}, row {i + 2}, column {c!r}: {what}") from None
    return out


def _measures(args: argparse.Namespace) -> tuple[list[str], dict[str, str]] | None:
    additive = args.v is not None or args.f is not None
    ratio = any(x is not None for x in (args.v_num, args.v_den, args.f_num, args.f_den))
    if additive == ratio:
        return None
    if additive:
        if args.v is None or args.f is None:
            return None
        return [args.v, args.f], {"v": args.v, "f": args.f}
    if None in (args.v_num, args.v_den, args.f_num, args.f_den):
        return None
    return [args.v_num, args.v_den, args.f_num, args.f_den], {
        "v_num": args.v_num,
        "v_den": args.v_den,
        "f_num": args.f_num,
        "f_den": args.f_den,
    }


def _bounds_problem(args: argparse.Namespace) -> str | None:
    if args.max_depth is not None and args.max_depth < 1:
        return "--max-depth must be at least 1"
    if args.max_causes < 1:
        return "--max-causes must be at least 1"
    return None


def _print(loc: Localization, args: argparse.Namespace) -> int:
    for note in loc.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    # most important first, at most --max-causes
    out = [c.as_json() for c in loc.ranked()[: args.max_causes]]
    try:
        print(
            json.dumps(out, indent=None if args.compact else 2, ensure_ascii=False, allow_nan=False)
        )
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into head: the reader has what it wanted
        # stdout to /dev/null, so that the interpreter's last flush at exit raises nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def run_csv(args: argparse.Namespace) -> int:
    from warmscope.analysis.rootcause import LeafTableError, localize, validate_leaves

    if not args.dims:
        return _fail("give the dimension columns with --dims")
    m = _measures(args)
    if m is None:
        return _fail(
            "give either --v and --f (additive measure) or all of --v-num --v-den --f-num --f-den "
            "(ratio measure)"
        )
    cols, kw = m
    if len(set(args.dims)) != len(args.dims):
        return _fail("a dimension is named twice in --dims")
    if set(args.dims) & set(cols):
        return _fail(
            f"column(s) {', '.join(sorted(set(args.dims) & set(cols)))} given both as a "
            "dimension and as a measure"
        )
    try:
        table = read_leaf_csv(args.csv, list(args.dims), cols)
        validate_leaves(table, args.dims, cols, ratio="v_num" in kw, row_offset=2)
    except InputError as e:
        return _fail(str(e))
    except LeafTableError as e:
        return _fail(f"{args.csv}, {e}")
    bad = _bounds_problem(args)
    if bad:
        return _fail(bad)
    loc = localize(
        table,
        args.dims,
        v=kw.get("v"),
        f=kw.get("f"),
        v_num=kw.get("v_num"),
        v_den=kw.get("v_den"),
        f_num=kw.get("f_num"),
        f_den=kw.get("f_den"),
        max_depth=args.max_depth,
        max_causes=args.max_causes,
        validate=False,
    )
    if loc.error:
        return _fail(loc.error)
    return _print(loc, args)


def parse_window(text: str, what: str) -> tuple[float, float]:
    """``START..END``: ISO 8601 (UTC unless an offset is given) or Unix seconds."""
    from datetime import datetime

    if not text or ".." not in text:
        raise InputError(
            f"{what} {text!r}: write START..END, e.g. 2026-11-30T10:00..2026-11-30T11:00"
        )
    parts = text.split("..")
    if len(parts) != 2:
        raise InputError(f"{what} {text!r}: write START..END with one '..'")

    def one(s: str) -> float:
        s = s.strip()
        try:
            return float(s)
        except ValueError:
            pass
        try:
            d = datetime.fromisoformat(s)
        except ValueError:
            raise InputError(
                f"{what}: {s!r} is neither an ISO 8601 time (2026-11-30T10:00) nor Unix seconds"
            ) from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=UTC)
        return d.timestamp()

    a, b = one(parts[0]), one(parts[1])
    if not b > a:
        raise InputError(f"{what} {text!r}: END must be after START")
    return a, b


def run_store(args: argparse.Namespace) -> int:
    from warmscope.analysis.drilldown import RCA_DIMS, drill_down_source
    from warmscope.sources import EmbeddedSource, SourceError

    if args.csv:
        return _fail("give either a CSV leaf table or --window (the store's lookups), not both")
    if _measures(args) is not None or any(
        (args.v, args.f, args.v_num, args.v_den, args.f_num, args.f_den)
    ):
        return _fail(
            "--window localises the store's hit rate; --v/--f/--v-num... are for a CSV leaf table"
        )
    try:
        window = parse_window(args.window, "--window")
        baseline = parse_window(args.baseline, "--baseline") if args.baseline else None
    except InputError as e:
        return _fail(str(e))
    bad = _bounds_problem(args)
    if bad:
        return _fail(bad)
    if args.dims:
        unknown = [d for d in args.dims if d not in RCA_DIMS]
        if unknown:
            return _fail(
                f"--dims {' '.join(unknown)}: not a dimension of the store's lookups; "
                f"use some of: {' '.join(RCA_DIMS)}"
            )
        if len(set(args.dims)) != len(args.dims):
            return _fail("a dimension is named twice in --dims")
    path = args.rca_store or args.store_global
    if path is None:
        from warmscope.collectors.config import CollectorConfig

        path = str(CollectorConfig.load().resolved_store_path())
    if not Path(path).exists():
        return _fail(
            f"no store at {path}; give --store PATH "
            "(fill one with `warmscope demo` or your services)"
        )
    if args.export:
        problem = overwrite_problem("--export", args.export, path)
        if problem:
            return _fail(problem)
    try:
        source = EmbeddedSource(path)
    except SourceError as e:
        return _fail(str(e))
    dims = list(args.dims) if args.dims else list(RCA_DIMS)
    try:
        dd = drill_down_source(source, window, baseline, dims=dims, max_depth=args.max_depth)
    except SourceError as e:
        return _fail(str(e))
    if dd.localization.error:
        return _fail(dd.localization.error)
    if args.export:
        try:
            dd.leaves.to_csv(args.export, index=False)
        except OSError as e:
            return _fail(f"cannot write {args.export}: {e}")
        print(
            f"{PROG}: wrote {len(dd.leaves)} leaves to {args.export} (ratio measure: --v-num hits "
            "--v-den lookups --f-num hits_exp --f-den lookups_exp)",
            file=sys.stderr,
        )
    return _print(dd.localization, args)


def cmd_rca(args: argparse.Namespace) -> int:
    if not hasattr(args, "store_global"):
        args.store_global = getattr(args, "store", None)
    if args.window or args.rca_store and not args.csv:
        if not args.window:
            return _fail("--store needs --window START..END (the anomaly window)")
        return run_store(args)
    if args.baseline or args.export:
        return _fail("--baseline and --export go with --window")
    if not args.csv:
        return _fail("give a CSV leaf table, or --window START..END to read a store")
    return run_csv(args)


COMMAND = Simple(
    "rca",
    run=cmd_rca,
    arguments=configure,
    help="root causes of a change: from a CSV leaf table or a store window (prints JSON)",
    description=DESCRIPTION,
    epilog=EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)


def main(argv: list[str]) -> int:
    """Entry for `warmscope rca ...` without loading the rest of the CLI."""
    ap = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(ap)
    args = ap.parse_args(argv)
    args.store_global = None
    try:
        return cmd_rca(args)
    except KeyboardInterrupt:
        return 130
