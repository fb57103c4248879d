"""`warmscope warmup`: warm a real engine's prefix cache from a warm set and record the run."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import ModuleType

from warmscope.app.cli.base import Simple
from warmscope.app.cli.http import bad_url, load, telemetry
from warmscope.app.cli.terminal import progress


def _hours(text: str) -> float:
    """Hours: a number (hours) or a duration (30m, 6h, 2d, 90s) as ``--since`` of the other
    commands takes it."""
    from warmscope.app.cli.misses import _DURATION, _UNIT_S

    m = _DURATION.match(text.strip())
    if m:
        return float(m[1]) * _UNIT_S[m[2]] / 3600.0
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of hours nor a duration (30m, 6h, 2d)"
        ) from None


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        required=True,
        metavar="URL",
        help="the engine's base URL, e.g. http://127.0.0.1:8000",
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="FILE|hot",
        help='JSON-lines warm set: one {"messages": [...]} or {"prompt": "..."} per line, optional '
        "\"tenant\"; or 'hot': the most requested prefixes in the store's hot keys "
        "(needs --library)",
    )
    p.add_argument(
        "--library",
        metavar="PATH",
        help="with --from hot: the prompt library file the serving process writes "
        "(LLMRecorder(prompt_library=...) or 'warmscope gateway --prompt-library PATH')",
    )
    p.add_argument(
        "--since",
        type=_hours,
        default=24.0,
        metavar="HOURS",
        help="with --from hot: hot keys recorded in the last this many hours, or a duration as "
        "the other commands take it (30m, 6h, 2d; default 24)",
    )
    p.add_argument(
        "--top-k", type=int, default=50, help="warm at most this many prefixes (default 50)"
    )
    p.add_argument("--tenant", help="only this tenant's prompts; the run is labelled with it")
    p.add_argument("--model", help="model name (default: the engine's first model)")
    p.add_argument(
        "--rate", type=float, default=20.0, help="requests per second (default 20; 0 = no limit)"
    )
    p.add_argument("--trigger", default="manual", help="trigger label of the run (default manual)")
    p.add_argument(
        "--strategy",
        default="engine_prefix",
        help="strategy label of the run (default engine_prefix)",
    )
    p.add_argument(
        "--replica",
        help="replica label of the run: give the serving process's replica "
        "(its WARMSCOPE_REPLICA) and that process matches the requests that follow to this run for "
        "warm-set precision and recall (default: this process's replica label)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="per-request timeout in seconds (default 60)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _warm_set(args: argparse.Namespace, runner: ModuleType) -> list[dict[str, object]]:
    """The prompts to send (raises the runner's WarmupInputError on bad input)."""
    if args.source != "hot":
        prompts: list[dict[str, object]] = runner.load_prompts(args.source)
        return prompts
    from warmscope.collectors.config import CollectorConfig

    cfg = CollectorConfig.load(**({"store_path": args.store} if args.store else {}))
    store = cfg.resolved_store_path()
    hot: list[dict[str, object]] = runner.hot_from_store(
        args.library,
        store,
        cfg.resolved_secret(),
        top_k=args.top_k,
        tenant=args.tenant,
        since_s=args.since * 3600,
    )
    return hot


def cmd_warmup(args: argparse.Namespace) -> int:
    if bad_url("warmup", "--engine", args.engine):
        return 2
    if args.source == "hot" and not args.library:
        print(
            "warmscope warmup: --from hot needs --library PATH, the prompt library the serving "
            "process keeps on its host (LLMRecorder(prompt_library=PATH) or 'warmscope gateway "
            "--prompt-library PATH'): the store holds only hashed prefix keys, never prompt text",
            file=sys.stderr,
        )
        return 2
    for flag, v in (("--top-k", args.top_k), ("--since", args.since), ("--timeout", args.timeout)):
        if not v > 0:
            print(f"warmscope warmup: {flag} {v:g} must be positive", file=sys.stderr)
            return 2
    if not args.rate >= 0:
        print(
            f"warmscope warmup: --rate {args.rate:g} must be positive (or 0: no limit)",
            file=sys.stderr,
        )
        return 2
    runner = load("warmup", "client", "warmscope.collectors.warmup_runner")
    if runner is None:
        return 2

    try:
        prompts = _warm_set(args, runner)
    except runner.WarmupInputError as e:
        print(f"warmscope warmup: {e}", file=sys.stderr)
        return 2
    tel = telemetry(args)
    tel.serves_replica = False  # it records a run for the replica; the serving process writes as it
    cancel = threading.Event()
    old = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        res = runner.run_warmup(
            args.engine,
            prompts,
            telemetry=tel,
            top_k=args.top_k,
            tenant=args.tenant,
            model=args.model,
            rate=args.rate,
            strategy=args.strategy,
            trigger=args.trigger,
            timeout_s=args.timeout,
            cancel=cancel,
            progress=None if args.quiet else progress("warming"),
        )
    finally:
        signal.signal(signal.SIGINT, old)
        tel.close()
    line = (
        f"warm-up run {res.run_id}: {res.status}, {res.keys} prefixes, {res.prompt_tokens} prompt "
        f"tokens ({res.cached_tokens} already cached), {res.duration_s:.1f} s"
    )
    if res.status != "ok":
        print(f"warmscope warmup: {line} — {res.error} ({args.engine})", file=sys.stderr)
        return 130 if res.status == "cancelled" else 1
    print(line, file=sys.stderr)
    return 0


COMMAND = Simple(
    "warmup",
    run=cmd_warmup,
    arguments=_arguments,
    help="send a warm set to an OpenAI-compatible engine (max_tokens=1) and record the warm-up run",
    description="Warm an engine's prefix cache: each prompt of the warm set is sent "
    "with max_tokens=1, rate-limited; Ctrl-C cancels. The run (prefix "
    "keys, tokens, duration, status) is recorded where the collectors' "
    "configuration says. The warm set is a JSON-lines file (--from FILE) "
    "or the hot prefixes recorded in the store (--from hot), turned back "
    "into prompts by the prompt library the serving process keeps on its "
    "host (--library; the store itself holds no prompt text).",
)
