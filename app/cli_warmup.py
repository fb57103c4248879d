"""`warmscope warmup`: warm a real engine's prefix cache from a warm set and record the run."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from urllib.parse import urlparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("warmup", help="send a warm set to an OpenAI-compatible engine (max_tokens=1) and record "
                       "the warm-up run", description="Warm an engine's prefix cache: each prompt of the warm set "
                       "is sent with max_tokens=1, rate-limited; Ctrl-C cancels. The run (prefix keys, tokens, "
                       "duration, status) is recorded where the collectors' configuration says.")
    p.add_argument("--engine", required=True, metavar="URL", help="the engine's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--from", dest="source", default=None, metavar="FILE",
                   help="JSON-lines warm set: one {\"messages\": [...]} or {\"prompt\": \"...\"} per line, optional "
                   "\"tenant\"; 'hot' (the recorded hot prefixes) is available from Python in the serving process")
    p.add_argument("--top-k", type=int, default=50, help="warm at most this many prefixes (default 50)")
    p.add_argument("--tenant", help="only this tenant's prompts; the run is labelled with it")
    p.add_argument("--model", help="model name (default: the engine's first model)")
    p.add_argument("--rate", type=float, default=20.0, help="requests per second (default 20; 0 = no limit)")
    p.add_argument("--trigger", default="manual", help="trigger label of the run (default manual)")
    p.add_argument("--strategy", default="engine_prefix", help="strategy label of the run (default engine_prefix)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds (default 60)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_warmup)


def cmd_warmup(args: argparse.Namespace) -> int:
    u = urlparse(args.engine)
    if u.scheme not in ("http", "https") or not u.netloc:
        print(f"warmscope warmup: --engine {args.engine!r} is not an http(s) URL; "
              "pass e.g. --engine http://127.0.0.1:8000", file=sys.stderr)
        return 2
    if args.source in (None, "hot"):
        print("warmscope warmup: the recorded hot prefixes live only in the serving process (prompt text never "
              "leaves it): call warmscope.collectors.warmup_runner.run_warmup(engine, 'hot', recorder=...) there, "
              "or pass --from FILE with a JSON-lines warm set", file=sys.stderr)
        return 2
    if args.top_k < 1:
        print(f"warmscope warmup: --top-k {args.top_k} must be at least 1", file=sys.stderr)
        return 2
    try:
        from warmscope.collectors.warmup_runner import WarmupInputError, load_prompts, run_warmup
    except ImportError as e:
        print(f"warmscope warmup: {e.name} is not installed; pip install \"warmscope[client]\"", file=sys.stderr)
        return 2
    from warmscope import collectors

    from .cli import _progress

    try:
        prompts = load_prompts(args.source)
    except WarmupInputError as e:
        print(f"warmscope warmup: {e}", file=sys.stderr)
        return 2
    overrides = {"store_path": args.store} if getattr(args, "store", None) else {}
    tel = collectors.setup(**overrides)
    cancel = threading.Event()
    old = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        res = run_warmup(args.engine, prompts, telemetry=tel, top_k=args.top_k, tenant=args.tenant,
                         model=args.model, rate=args.rate, strategy=args.strategy, trigger=args.trigger,
                         timeout_s=args.timeout, cancel=cancel,
                         progress=None if args.quiet else _progress("warming"))
    finally:
        signal.signal(signal.SIGINT, old)
        tel.close()
    line = (f"warm-up run {res.run_id}: {res.status}, {res.keys} prefixes, {res.prompt_tokens} prompt tokens "
            f"({res.cached_tokens} already cached), {res.duration_s:.1f} s")
    if res.status != "ok":
        print(f"warmscope warmup: {line} — {res.error}", file=sys.stderr)
        return 130 if res.status == "cancelled" else 1
    print(line, file=sys.stderr)
    return 0
