"""``python -m warmscope.collectors.kv --engine URL [--engine URL ...]``: watch engines'
KV events and print per-salt store, reuse and eviction rates and the subscriber's counts."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from .subscriber import EngineSpec
from .watcher import KVWatcher


def report_loop(
    w: KVWatcher,
    interval: float,
    duration: float = 0.0,
    as_json: bool = False,
    on_stats: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Every ``interval`` seconds (until ``duration`` is over, or Ctrl-C), print the watcher's
    counts and per-salt store, reuse and eviction rates, and hand the stats to ``on_stats``."""
    t0 = time.monotonic()
    prev: dict[str, dict[str, int]] = {}
    try:
        while not duration or time.monotonic() - t0 < duration:
            left = duration - (time.monotonic() - t0)
            time.sleep(interval if not duration else min(interval, max(0.0, left)))
            st = w.stats()
            if on_stats is not None:
                on_stats(st)
            if as_json:
                print(
                    json.dumps(
                        {k: v for k, v in st.items() if k not in ("engines", "engine_salt")}
                    ),
                    flush=True,
                )
                continue
            print(
                f"[{time.strftime('%H:%M:%S')}] batches {st['batches']} events {st['events']} "
                f"decode errors {st['decode_errors']} gaps {st['gaps']} repaired "
                f"{st['repaired']} unrepaired {st['unrepaired']} resident blocks "
                f"{st['resident_blocks']} dropped {sum(st['dropped_rows'].values())}",
                flush=True,
            )
            for salt, c in sorted(st["per_salt"].items()):
                p = prev.get(salt, {})
                rates = {
                    k: (c[k] - p.get(k, 0)) / interval for k in ("stores", "reuses", "evictions")
                }
                print(
                    f"  {salt:<20} store/s {rates['stores']:8.1f}  reuse/s "
                    f"{rates['reuses']:8.1f}  evict/s {rates['evictions']:8.1f}  "
                    f"resident {c['resident']}",
                    flush=True,
                )
            prev = st["per_salt"]
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m warmscope.collectors.kv", description=__doc__)
    ap.add_argument(
        "--engine",
        action="append",
        default=[],
        help="engine URL (publishers read from GET /kv_event_sources)",
    )
    ap.add_argument(
        "--endpoint",
        action="append",
        default=[],
        help="NAME=ZMQ_ENDPOINT[,REPLAY_ENDPOINT] instead of discovery",
    )
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between reports")
    ap.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds")
    ap.add_argument("--max-blocks", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="print each report as one JSON line")
    args = ap.parse_args(argv)
    engines: list[str | EngineSpec] = list(args.engine)
    for e in args.endpoint:
        name, _, eps = e.partition("=")
        ep, _, rep = eps.partition(",")
        engines.append(EngineSpec(name, ep, rep or None))
    if not engines:
        ap.error("give at least one --engine or --endpoint")
    w = KVWatcher(engines, max_blocks=args.max_blocks).start()
    try:
        report_loop(w, args.interval, args.duration, args.json)
    finally:
        w.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
