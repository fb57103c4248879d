"""`warmscope gateway`: run the recording reverse proxy in front of an engine."""

from __future__ import annotations

import argparse
import sys

from warmscope.app.cli.base import Simple
from warmscope.app.cli.http import bad_url, load, telemetry


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", required=True, metavar="URL",
                   help="the engine's base URL, e.g. http://127.0.0.1:8000 (requests keep their path, e.g. /v1/...)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--experiment", help="experiment label for requests (e.g. when this gateway fronts one arm)")
    p.add_argument("--variant", help="variant label for requests (e.g. A or B)")
    p.add_argument("--tenant-header", default="x-warmscope-tenant",
                   help="request header naming the tenant (else the body's user field)")
    p.add_argument("--session-header", default="x-warmscope-session",
                   help="request header naming the session, the A/B unit")
    p.add_argument("--timeout", type=float, default=600.0, help="upstream timeout in seconds (default 600)")
    p.add_argument("--prompt-library", metavar="PATH",
                   help="append each newly seen prompt prefix (its text) to this local JSON-lines file, so that "
                   "'warmscope warmup --from hot --library PATH' can warm the hot ones; never exported")


def cmd_gateway(args: argparse.Namespace) -> int:
    if bad_url("gateway", "--upstream", args.upstream):
        return 2
    if not 0 < args.port < 65536:
        print(f"warmscope gateway: --port {args.port} is out of range (1-65535)", file=sys.stderr)
        return 2
    uvicorn = load("gateway", "gateway", "uvicorn")
    gateway = uvicorn and load("gateway", "gateway", "warmscope.collectors.gateway")
    if not gateway:
        return 2
    tel = telemetry(args)
    app = gateway.make_app(args.upstream, telemetry=tel, timeout_s=args.timeout, experiment=args.experiment,
                           variant=args.variant, tenant_header=args.tenant_header,
                           session_header=args.session_header, prompt_library=args.prompt_library)
    print(f"warmscope gateway on http://{args.host}:{args.port} -> {app.state.upstream}", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except (OSError, SystemExit) as e:
        print(f"warmscope gateway: could not listen on {args.host}:{args.port} ({e})", file=sys.stderr)
        return 1
    finally:
        tel.close()
        app.state.recorder.close()
        st = app.state.recorder.stats
        print("warmscope gateway stopped: " + ", ".join(f"{k} {v}" for k, v in st.items() if v), file=sys.stderr)
    return 0


COMMAND = Simple("gateway", run=cmd_gateway, arguments=_arguments,
                 help="a reverse proxy in front of an OpenAI-compatible engine that records "
                      "per-tenant prefix-cache hits",
                 description="Forward every request to --upstream unchanged (streaming included) "
                             "and record chat/completion requests: tenant, key family, prompt and "
                             "cached tokens, TTFT, duration. Telemetry goes where the collectors' "
                             "configuration says (WARMSCOPE_* env / warmscope.toml; default the "
                             "embedded store).")
