"""`warmscope gateway`: run the recording reverse proxy in front of an engine."""

from __future__ import annotations

import argparse
import sys

from warmscope.app.cli.base import Simple
from warmscope.app.cli.http import bad_url, load, telemetry


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream",
        required=True,
        metavar="URL",
        help="the engine's base URL, e.g. http://127.0.0.1:8000 (requests keep their path, "
        "e.g. /v1/...)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--experiment", help="experiment label for requests (e.g. when this gateway fronts one arm)"
    )
    p.add_argument("--variant", help="variant label for requests (e.g. A or B)")
    p.add_argument(
        "--tenant-header",
        default="x-warmscope-tenant",
        help="request header naming the tenant (else the body's user field)",
    )
    p.add_argument(
        "--session-header",
        default="x-warmscope-session",
        help="request header naming the session, the A/B unit",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="upstream timeout in seconds (default 600)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 << 20,
        metavar="N",
        help="largest request body accepted, else 413 (default 33554432, 32 MiB)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a client has to send its request headers, else 408 (default 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a client has to send its request body, else 408 (default 30)",
    )
    p.add_argument(
        "--prompt-library",
        metavar="PATH",
        help="append each newly seen prompt prefix (its text) to this local JSON-lines file, so "
        "that 'warmscope warmup --from hot --library PATH' can warm the hot ones; never exported",
    )
    p.add_argument(
        "--kv-events",
        action="store_true",
        help="watch the upstream engine's KV-cache events (found through GET "
        "/kv_event_sources) and record why each chat request's missed tokens missed",
    )
    p.add_argument(
        "--kv-engine",
        action="append",
        default=[],
        metavar="URL",
        help="with --kv-events: another engine whose events are watched too, so that a "
        "prefix cached there reads as a routing miss (repeat for each engine)",
    )
    p.add_argument(
        "--kv-salt-tenants",
        action="store_true",
        help="with --kv-events: add cache_salt = tenant to every chat request (tenant "
        "isolation at the engine)",
    )


def _unreachable(url: str, timeout_s: float = 2.0) -> str | None:
    """Why nothing answers at ``url`` (a connection error or a timeout), or None when something
    does (any HTTP status)."""
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return None


def cmd_gateway(args: argparse.Namespace) -> int:
    if bad_url("gateway", "--upstream", args.upstream):
        return 2
    if not 0 < args.port < 65536:
        print(f"warmscope gateway: --port {args.port} is out of range (1-65535)", file=sys.stderr)
        return 2
    for flag, v in (
        ("--max-body-bytes", args.max_body_bytes),
        ("--timeout", args.timeout),
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
    ):
        if not v > 0:
            print(f"warmscope gateway: {flag} must be > 0, got {v}", file=sys.stderr)
            return 2
    uvicorn = load("gateway", "gateway", "uvicorn")
    gateway = uvicorn and load("gateway", "gateway", "warmscope.collectors.gateway")
    if not gateway:
        return 2
    if (args.kv_engine or args.kv_salt_tenants) and not args.kv_events:
        print(
            "warmscope gateway: --kv-engine and --kv-salt-tenants go with --kv-events",
            file=sys.stderr,
        )
        return 2
    if any(bad_url("gateway", "--kv-engine", u) for u in args.kv_engine):
        return 2
    kvmod = (
        load("gateway", "kv", "warmscope.collectors.kv.gateway_hook") if args.kv_events else None
    )
    if args.kv_events and not kvmod:
        return 2
    down = _unreachable(args.upstream)
    if down:
        print(
            f"warmscope gateway: nothing answers at {args.upstream} yet ({down}); forwarding "
            "anyway: requests get HTTP 502 until the engine is up",
            file=sys.stderr,
        )
    tel = telemetry(args)
    kv = None
    if kvmod:
        from warmscope.collectors.kv import KVWatcher

        watcher = KVWatcher([args.upstream, *args.kv_engine])
        if not watcher.specs:
            print(
                f"warmscope gateway: {args.upstream} "
                + (
                    "does not answer, so where it publishes KV events is unknown; restart the "
                    "gateway once the engine is up"
                    if down
                    else "publishes no KV events (start vLLM with --kv-events-config, see "
                    "docs/kv-events.md)"
                )
                + "; forwarding without them",
                file=sys.stderr,
            )
        else:
            kv = kvmod.KVGatewayHook(
                watcher.start(),
                tel,
                engine=watcher.specs[0].name,
                salt_tenants=args.kv_salt_tenants,
            )
    app = gateway.make_app(
        args.upstream,
        telemetry=tel,
        timeout_s=args.timeout,
        kv=kv,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout,
        experiment=args.experiment,
        variant=args.variant,
        tenant_header=args.tenant_header,
        session_header=args.session_header,
        prompt_library=args.prompt_library,
    )
    print(
        f"warmscope gateway on http://{args.host}:{args.port} -> {app.state.upstream}",
        file=sys.stderr,
    )
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            http=gateway.bounded_protocol(app, args.header_timeout),
        )
    except (OSError, SystemExit) as e:
        print(
            f"warmscope gateway: could not listen on {args.host}:{args.port} ({e})", file=sys.stderr
        )
        return 1
    finally:
        tel.close()
        app.state.recorder.close()
        st = {**app.state.recorder.stats, **app.state.stats}
        counts = ", ".join(f"{k} {v}" for k, v in st.items() if v)
        print(
            "warmscope gateway stopped" + (f": {counts}" if counts else " (no requests)"),
            file=sys.stderr,
        )
        if st.get("no_usage"):
            n, total = st["no_usage"], st["recorded"] + st["no_usage"]
            print(
                f"warmscope gateway: {n} of {total} answered requests ({n / total:.1%}) carried no "
                "token usage and are left out of the token hit rates "
                "(warmscope_requests_unmeasured_total)",
                file=sys.stderr,
            )
    return 0


COMMAND = Simple(
    "gateway",
    run=cmd_gateway,
    arguments=_arguments,
    help="a reverse proxy in front of an OpenAI-compatible engine that records "
    "per-tenant prefix-cache hits",
    description="Forward every request to --upstream unchanged (streaming included) "
    "and record chat/completion requests: tenant, key family, prompt and "
    "cached tokens, TTFT, duration. Telemetry goes where the collectors' "
    "configuration says (WARMSCOPE_* env / warmscope.toml; default the "
    "embedded store).",
)
