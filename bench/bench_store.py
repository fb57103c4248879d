"""Embedded-store write throughput: points per second, batched.

    python -m bench.bench_store [--rows 200000]

Baseline: the same rows inserted with a bare sqlite3 executemany into the same
table layout (no warmscope code). Target: >= 50k points/s through
EmbeddedStore.write.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from warmscope.collectors.store import EmbeddedStore
from warmscope.collectors.store.layout import DDL as _DDL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()
    rows = [(float(i // 100), f"t{i % 8}", "prefix_kv", f"fam{i % 50}", "hit", "", "", "m", "r0", "512", i)
            for i in range(args.rows)]
    tmp = Path(tempfile.mkdtemp())
    con = sqlite3.connect(tmp / "bare.sqlite")
    con.executescript(_DDL)
    con.execute("PRAGMA journal_mode=WAL")
    t = time.perf_counter()
    with con:
        con.executemany("INSERT INTO lookups VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    bare = args.rows / (time.perf_counter() - t)
    st = EmbeddedStore(tmp / "ws.sqlite")
    t = time.perf_counter()
    for i in range(0, args.rows, 10_000):  # flush-sized batches
        st.write({"lookups": rows[i:i + 10_000]})
    ws = args.rows / (time.perf_counter() - t)
    print(f"bare sqlite executemany : {bare:>12,.0f} points/s  (1.00)")
    print(f"EmbeddedStore.write     : {ws:>12,.0f} points/s  ({ws / bare:.2f} x bare; target >= 50,000/s)")


if __name__ == "__main__":
    main()
