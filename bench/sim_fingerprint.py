"""Fingerprint of a simulated store: per table, the row count and a SHA-256 of its sorted rows.

    python -m bench.sim_fingerprint [--hours 2] [--workers 2] [--fault SPEC ...] [--store PATH]

Simulates ``--hours`` of the default day (same seed every time) and prints one
line per table. Two runs of the same code print the same lines; a change to the
simulator or the write path that keeps its output prints them too. Floats are
rounded to 9 significant digits first: sums whose addition order depends on how
the writer happened to merge flushes differ in the last bits only.
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from warmscope.simulator import SimConfig, simulate
from warmscope.simulator.faults import parse_fault


def _norm(v: Any) -> Any:
    return float(f"{v:.9g}") if isinstance(v, float) else v


def fingerprint(path: str | Path) -> dict[str, tuple[int, str]]:
    con = sqlite3.connect(str(path))
    out: dict[str, tuple[int, str]] = {}
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    for t in tables:
        rows = sorted(repr(tuple(_norm(v) for v in r)) for r in con.execute(f'SELECT * FROM "{t}"'))
        h = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
        out[t] = (len(rows), h)
    con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Fingerprint the store of a short simulated run.")
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (1: one process)")
    ap.add_argument("--fault", action="append", default=[],
                    help="a fault to inject, as `warmscope simulate --fault` takes it (repeatable)")
    ap.add_argument("--store", help="keep the store at this path (default: a temporary file)")
    args = ap.parse_args()
    path = Path(args.store) if args.store else Path(tempfile.mkdtemp()) / "fp.sqlite"
    summ = simulate(SimConfig.load(hours=args.hours), path, faults=[parse_fault(f) for f in args.fault],
                    workers=args.workers)
    print(f"requests {summ.requests}")
    for t, (n, h) in fingerprint(path).items():
        if t != "meta":
            print(f"{t:<24} {n:>9,} {h}")


if __name__ == "__main__":
    main()
