"""`warmscope kv-events`: watch engines' KV-cache events without the gateway.

For deployments where requests do not pass through ``warmscope gateway``: the engines'
block stores, reuses and evictions per cache salt, and their resident blocks, are printed
and recorded (``warmscope_kv_blocks_*``) where the collectors' configuration says.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from warmscope.app.cli.base import Simple
from warmscope.app.cli.http import bad_url, load, telemetry


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="an engine's base URL; its publishers are read from GET /kv_event_sources "
        "(repeat for each engine)",
    )
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="NAME=EP[,REPLAY]",
        help="an engine's ZMQ endpoint (and replay endpoint) instead of discovery",
    )
    p.add_argument(
        "--interval", type=float, default=10.0, help="seconds between reports (default 10)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="stop after this many seconds (default: until Ctrl-C)",
    )
    p.add_argument(
        "--max-blocks",
        type=int,
        default=1_000_000,
        help="resident blocks kept per engine before rows are dropped and counted",
    )
    p.add_argument("--json", action="store_true", help="print each report as one JSON line")
    p.add_argument("--no-record", action="store_true", help="print only; record nothing")


def _specs(cmd: str, args: argparse.Namespace, spec_type: Any) -> list[Any] | None:
    engines: list[Any] = []
    for url in args.engine:
        if bad_url(cmd, "--engine", url):
            return None
        engines.append(url)
    for e in args.endpoint:
        name, eq, eps = e.partition("=")
        ep, _, rep = eps.partition(",")
        if not (eq and name and ep.startswith(("tcp://", "ipc://", "inproc://"))):
            print(
                f"warmscope {cmd}: --endpoint {e!r} is not NAME=ENDPOINT[,REPLAY_ENDPOINT]; pass "
                "e.g. --endpoint e0=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558",
                file=sys.stderr,
            )
            return None
        engines.append(spec_type(name, ep, rep or None))
    return engines


class StatsRecorder:
    """Turns the watcher's cumulative per engine × salt counts into increments for
    ``Telemetry.record_kv_stats`` (resident blocks as they are)."""

    def __init__(self, tel: Any) -> None:
        self.tel = tel
        self.prev: dict[tuple[str, str], dict[str, int]] = {}

    def __call__(self, st: dict[str, Any]) -> None:
        record = getattr(self.tel, "record_kv_stats", None)
        if record is None:
            return
        for (engine, salt), c in st.get("engine_salt", {}).items():
            p = self.prev.get((engine, salt), {})
            record(
                engine=engine,
                salt=salt,
                stored=c["stores"] - p.get("stores", 0),
                reused=c["reuses"] - p.get("reuses", 0),
                evicted=c["evictions"] - p.get("evictions", 0),
                resident=c["resident"],
            )
            self.prev[(engine, salt)] = dict(c)


def cmd_kv_events(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.duration < 0 or args.max_blocks < 1:
        print(
            "warmscope kv-events: --interval and --max-blocks must be positive, --duration >= 0",
            file=sys.stderr,
        )
        return 2
    kv = load("kv-events", "kv", "warmscope.collectors.kv")
    if not kv:
        return 2
    from warmscope.collectors.kv.__main__ import report_loop

    engines = _specs("kv-events", args, kv.EngineSpec)
    if engines is None:
        return 2
    if not engines:
        print(
            "warmscope kv-events: name at least one engine: --engine http://HOST:PORT (or "
            "--endpoint NAME=tcp://HOST:PORT)",
            file=sys.stderr,
        )
        return 2
    w = kv.KVWatcher(engines, max_blocks=args.max_blocks)
    if not w.specs:
        print(
            "warmscope kv-events: no engine publishes KV events; start vLLM with "
            "--kv-events-config (see docs/kv-events.md) or pass --endpoint",
            file=sys.stderr,
        )
        return 1
    tel = None if args.no_record else telemetry(args)
    names = ", ".join(f"{s.name} ({s.endpoint})" for s in w.specs)
    print(f"warmscope kv-events: watching {names}; Ctrl-C stops", file=sys.stderr)
    w.start()
    try:
        report_loop(
            w, args.interval, args.duration, args.json, None if tel is None else StatsRecorder(tel)
        )
    finally:
        got = int(w.stats().get("batches", -1))
        w.stop()
        if tel is not None:
            tel.close()
    if got == 0:
        print(
            f"warmscope kv-events: no KV event arrived from {names}: is the endpoint the one the "
            "engine publishes on, and did it serve any request?",
            file=sys.stderr,
        )
    return 0


COMMAND = Simple(
    "kv-events",
    run=cmd_kv_events,
    arguments=_arguments,
    help="watch vLLM engines' KV-cache events (block stores, reuses, evictions)",
    description="Subscribe to the KV-cache events of one or more vLLM engines (started with "
    '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
    '"endpoint": "tcp://127.0.0.1:PORT"}\'), keep each engine\'s block residency, print '
    "per-salt store, reuse and eviction rates, and record them with the collectors.",
)
