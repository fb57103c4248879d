"""The `warmscope` command line.

warmscope demo [--port 8501] [--fresh]   simulate a day into the embedded store if empty, open the
                                         dashboard
warmscope demo --engine vllm             real prefix-cache hits from vLLM's CPU build
                                         (app/cli/engine_demo.py)
warmscope dashboard [--port 8501]        open the dashboard on the configured source
warmscope simulate [options]             run the emulated inference stack (see --help)
warmscope report ab [options]            write the A/B report (HTML and Markdown)
warmscope rca CSV --dims ... | --window S..E   root causes of a change: a leaf table or a store
                                               window (JSON)
warmscope rules --runbook-base URL --out DIR   rule files linking your own runbook copy
warmscope upgrade-store                  bring a store written by an older warmscope up to date
warmscope gateway --upstream URL         a recording reverse proxy in front of an OpenAI-compatible
                                         engine
warmscope kv-events --engine URL         vLLM KV-cache events: block stores, reuses, evictions per
                                         salt
warmscope warmup --engine URL --from F   warm an engine's prefix cache and record the run
warmscope advise [--budget-gpu-s N]      request forecasts and tuned warm-up parameters
                                         (app/cli/advise.py)
warmscope misses [--since 6h] [--by tenant|engine|family] [--json]   why prefix-KV tokens missed
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from . import advise, gateway, grafana, kv, misses, rca, rules, runs, warmup, whatif
from .base import Command, Group, Simple, check_commands, overwrite_problem, store_path
from .terminal import progress as _progress

if TYPE_CHECKING:
    from warmscope.simulator import SimConfig
    from warmscope.simulator.faults import Fault

APP_MAIN = Path(__file__).resolve().parents[1] / "dashboard" / "main.py"  # the Streamlit script


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem and where to look, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        for a in self._actions:  # no (sub)command given: name them, not argparse's dest
            sub = isinstance(a, argparse._SubParsersAction)
            if sub and message.endswith(f"required: {a.dest}"):
                message = f"give a command: {', '.join(a.choices or ())}"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _number(
    kind: type[int] | type[float],
    lo: float | None = None,
    lo_open: bool = False,
    hi: float | None = None,
) -> Callable[[str], float]:
    """An argparse type: a finite number of ``kind`` within bounds, or a clear error."""
    import math

    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a{'n integer' if kind is int else ' number'}"
            ) from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if lo_open else '>='} {lo:g}, got {text}"
            )
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}, got {text}")
        return v

    parse.__name__ = kind.__name__
    return parse


_PORT = _number(int, 1, hi=65535)
_POS_FLOAT = _number(float, 0, lo_open=True)
_NONNEG_FLOAT = _number(float, 0)
_POS_INT = _number(int, 1)
_NONNEG_INT = _number(int, 0)


def _redis_url(text: str) -> str:
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Redis URL; use redis://HOST:PORT/DB")
    return text


def _writable_file(text: str) -> str:
    """A file path whose directory exists (or can be made) and is writable: checked before a long
    run."""
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: {parent} is not a writable directory"
        )
    return text


def _streamlit(cmd: list[str], env: dict[str, str]) -> int:
    """Run Streamlit in its own process group; SIGINT/SIGTERM stop it (and anything it started):
    SIGTERM first, SIGKILL after ``_STOP_GRACE_S``. Streamlit ends with this process even when
    this one is killed with SIGKILL (``serve.die_with_parent``)."""
    import signal
    import time

    from warmscope.app.dashboard.serve import PARENT_ENV

    env = {**env, PARENT_ENV: str(os.getpid())}

    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    got: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        got.append(signum)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        asked: float | None = None
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if got and asked is None:
                    asked = time.monotonic()
                if asked is not None and time.monotonic() - asked > _STOP_GRACE_S:
                    try:  # still there after the grace: it goes now
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                continue
        if got:
            try:  # anything the dashboard left behind in its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return 128 + got[0]
        return rc
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_STOP_GRACE_S = 5.0  # Streamlit gets this long to end after SIGTERM


def _cannot_listen(cmd: str, address: str, port: int) -> bool:
    """True (and one line on stderr) when ``address:port`` cannot be listened on:
    checked here, before Streamlit starts and prints a traceback instead."""
    import socket

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        fam, kind, proto, _, addr = infos[0]
        with socket.socket(fam, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except (OSError, UnicodeError, IndexError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        print(
            f"warmscope {cmd}: cannot listen on {address}:{port} ({reason}); pass --address with "
            "an address of this machine (127.0.0.1, 0.0.0.0) and a free --port",
            file=sys.stderr,
        )
        return True
    return False


def cmd_dashboard(args: argparse.Namespace) -> int:
    if _cannot_listen("dashboard", args.address, args.port):
        return 2
    env = dict(os.environ, WARMSCOPE_STORE=str(store_path(args)))
    from warmscope.app.dashboard.serve import (
        command,
    )  # Streamlit, and a warm-up of the caches as soon as it is up

    cmd = command("--server.port", str(args.port), "--server.address", args.address)
    print(
        f"warmscope dashboard on http://{args.address}:{args.port}  "
        f"(store: {env['WARMSCOPE_STORE']})",
        file=sys.stderr,
    )
    return _streamlit(cmd, env)


def _remove_store(path: Path) -> None:
    """Remove the store and the files SQLite keeps beside it — nothing else
    (``prod.sqlite.backup`` next to ``prod.sqlite`` stays)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = path.with_name(path.name + suffix)
        if p.is_file() or p.is_symlink():
            p.unlink()


def _say_if_upgrading(path: Path) -> None:
    """A store from an older warmscope is upgraded when opened for writing; say so (it can take a
    minute)."""
    from warmscope.collectors.store import EmbeddedStore, StoreError

    if not path.exists():
        return
    try:
        EmbeddedStore(path, readonly=True).close()
    except StoreError as e:
        if "older warmscope" in str(e):
            print(
                f"upgrading {path} to this warmscope's schema (its data is kept)…", file=sys.stderr
            )


def _check_store(path: Path) -> None:
    """Raise StoreError unless ``path`` is a warmscope store (any version)."""
    import sqlite3

    from warmscope.collectors.store import StoreError

    if path.stat().st_size == 0:
        return
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        finally:
            con.close()
    except sqlite3.Error as e:
        raise StoreError(
            f"{path} is not a warmscope store ({e}); --fresh only replaces a warmscope store: "
            "move the file away or pass another --store"
        ) from None


def demo_world(hours: float, now: float | None = None) -> tuple[SimConfig, list[Fault]]:
    """The demo's simulated span and traps, placed so the dashboard's default range (the last 6
    hours of data) shows a warm-up run, both injected traps and the alerts they raise: the span ends
    at the current minute; a scheduled warm-up 5.5 h before the end, a response-cache bypass for
    globex 5 h to 3.5 h before it and a cross-tenant read (a security finding) 2.5 h to 1.5 h before
    it (scaled down for spans under 6 h)."""
    import math
    import time
    from dataclasses import replace

    from warmscope.simulator import SimConfig, parse_fault

    w = min(hours, 6.0)

    def at(before: float) -> float:  # hours from the start
        return round(max(hours - before * w / 6.0, 0.0), 4)

    now = time.time() if now is None else now
    # Replicas restart every hour (rolling, behind a readiness gate) and popular content changes
    # hourly, so warm-up has cold starts to prevent and a moving target to follow.
    # Three pools on the same traffic: no warm-up (the control), yesterday's top keys, and the
    # predictive heat decay.
    cfg = SimConfig.load(
        hours=hours,
        strategy_a="none",
        strategy_b="static_topk",
        strategy_c="predictive",
        restart_every_h=1.0,
        content_drift_h=1.0,
        peak_warmup_at_h=at(5.5),
        start=math.floor(now / 60) * 60 - hours * 3600,
    )
    faults = [
        replace(
            parse_fault("bypass:tenant=globex,layer=response"),
            start=at(5.0) * 3600,
            end=at(3.5) * 3600,
        ),
        replace(
            parse_fault("tenant_isolation:layer=response"), start=at(2.5) * 3600, end=at(1.5) * 3600
        ),
    ]
    return cfg, faults


def cmd_demo(args: argparse.Namespace) -> int:
    from warmscope.collectors.store import EmbeddedStore, StoreError

    if getattr(args, "engine", None) or getattr(
        args, "engine_url", None
    ):  # real engine: app/cli/engine_demo.py
        from warmscope.app.cli.engine_demo import run

        return run(args)
    if not getattr(args, "no_dashboard", False) and _cannot_listen("demo", args.address, args.port):
        return 2

    path = store_path(args)
    if path.is_dir():
        raise StoreError(f"embedded store {path} is a directory; pass --store FILE")
    if args.fresh and path.exists():
        _check_store(path)  # --fresh replaces a store, never a file that is not one
        _remove_store(path)
    _say_if_upgrading(path)
    store = EmbeddedStore(path)
    empty = store.counts()["lookups"] == 0
    store.close()
    if empty:
        from warmscope.simulator import simulate

        cfg, faults = demo_world(args.hours)
        print(
            f"simulating {cfg.hours:g} h of traffic into {path} (once; --fresh starts over)",
            file=sys.stderr,
        )
        # The What if page's real production hour is read while the day is simulated, from the
        # first progress report on (the simulation's worker processes are forked by then, and a
        # process is best forked with no other thread running).
        trace: list[Any] = []
        bar = _progress("simulating")

        def report(done: int, total: int) -> None:
            if not trace:
                trace.append(whatif.read_demo_trace())
            bar(done, total)

        try:
            s = simulate(cfg, path, faults, progress=report)
        except KeyboardInterrupt:
            print(
                f"\ninterrupted: {path} holds part of the simulated day; "
                "`warmscope demo --fresh` starts over",
                file=sys.stderr,
            )
            raise
        print(f"wrote {s.requests:,} simulated requests in {s.wall_s:.0f} s", file=sys.stderr)
        whatif.import_demo_trace(path, trace[0] if trace else None)
    else:
        whatif.import_demo_trace(path)
    if args.no_dashboard:
        return 0
    return cmd_dashboard(args)


def cmd_upgrade_store(args: argparse.Namespace) -> int:
    from warmscope.collectors.store import SCHEMA_VERSION, EmbeddedStore, StoreError

    path = store_path(args)
    if not path.exists():
        print(f"warmscope upgrade-store: {path} does not exist; pass --store PATH", file=sys.stderr)
        return 2
    _say_if_upgrading(path)
    try:
        EmbeddedStore(path).close()  # a writable open upgrades in place
    except StoreError as e:
        print(f"warmscope upgrade-store: {e}", file=sys.stderr)
        return 1
    print(f"{path} is at schema version {SCHEMA_VERSION}", file=sys.stderr)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    import json

    from warmscope.collectors.store import EmbeddedStore
    from warmscope.simulator import SimConfig, parse_fault, simulate
    from warmscope.simulator.engine import block_trace_file

    try:
        cfg = SimConfig.load(
            hours=args.hours,
            rps=args.rps,
            tenants=args.tenants,
            replicas=args.replicas,
            strategy_a=args.strategy_a,
            strategy_b=args.strategy_b,
            strategy_c=args.strategy_c,
            seed=args.seed,
            tick_s=args.tick,
            b_response_ttl_s=args.b_response_ttl,
            b_kv_capacity_tokens=args.b_kv_capacity,
            restart_every_h=args.restart_every,
            content_drift_h=args.content_drift,
        )
        faults = [parse_fault(f) for f in args.fault]
    except ValueError as e:
        print(f"warmscope simulate: {e}", file=sys.stderr)
        return 2
    path = Path(args.out) if args.out else store_path(args)
    if path.is_dir():
        print(f"warmscope simulate: {path} is a directory; pass --out FILE", file=sys.stderr)
        return 2
    if args.speed is not None and not args.realtime:
        print(
            "warmscope simulate: --speed paces a --realtime run; add --realtime or leave it out",
            file=sys.stderr,
        )
        return 2
    if args.fresh and args.append:
        print(
            "warmscope simulate: --fresh replaces the store and --append adds to it; pass one",
            file=sys.stderr,
        )
        return 2
    traces: dict[str, Path] = {}  # pool -> its block-trace file
    if args.block_trace:  # one file per pool
        traces = {v: block_trace_file(args.block_trace, v) for v in cfg.arms}
    outputs = [("--faults-out", Path(args.faults_out))] if args.faults_out else []
    outputs += [("--block-trace", out) for out in traces.values()]
    for flag, out in outputs:
        problem = overwrite_problem(flag, out, path)
        if problem:
            print(f"warmscope simulate: {problem}", file=sys.stderr)
            return 2
    if path.exists() and args.fresh:
        _check_store(path)
    if path.exists() and not (args.fresh or args.append):
        if EmbeddedStore(path).counts()["lookups"]:
            print(
                f"warmscope simulate: {path} already holds data; pass --fresh to replace it or "
                "--append to add to it",
                file=sys.stderr,
            )
            return 2
    if args.fresh and path.exists():
        _remove_store(path)
    collector_config = None  # the simulator's own (embedded store, no export)
    if args.exporter != "embedded" or args.redis_url:
        from warmscope.collectors.config import CollectorConfig

        collector_config = CollectorConfig.load(
            env={},
            exporter=args.exporter,
            key_secret="warmscope-sim",
            max_families=1024,
            redis_url=args.redis_url or "",
            prometheus_port=args.prometheus_port,
            side_flush_s=900,
        )
    if args.faults_out:  # fail now, not after the whole run
        try:
            Path(args.faults_out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.faults_out, "a"):
                pass
        except OSError as e:
            print(
                "warmscope simulate: cannot write --faults-out "
                f"{args.faults_out}: {e.strerror or e}",
                file=sys.stderr,
            )
            return 2
    s = simulate(
        cfg,
        path,
        faults,
        workers=args.workers,
        progress=None if args.quiet else _progress("simulating"),
        collector_config=collector_config,
        realtime=bool(args.realtime),
        speed=args.speed or 1.0,
        **({"block_trace": args.block_trace} if args.block_trace else {}),
    )
    if args.faults_out:
        truth = [f.ground_truth(cfg.start, cfg.hours) for f in faults]
        Path(args.faults_out).write_text(json.dumps(truth, indent=2, default=str))
    for variant, out in traces.items():  # what a replay of each pool's trace needs: its capacity
        if out.exists():
            blocks = cfg.for_variant(variant, "kv_capacity_tokens") // cfg.block_tokens
            print(
                f"pool {variant}'s block trace: {out} (its replicas' prefix caches hold {blocks:,} "
                f"blocks): warmscope whatif --trace {out} --capacity {blocks}",
                file=sys.stderr,
            )
    print(
        json.dumps(
            {
                "store": str(path),
                "requests": s.requests,
                "wall_s": round(s.wall_s, 2),
                "requests_per_s": round(s.rps),
                "warmup_runs": s.warmups,
                "units": s.units,
                "faults": len(faults),
            }
        )
    )
    return 0


def cmd_report_ab(args: argparse.Namespace) -> int:
    from warmscope.analysis.ab_report import render_html, render_markdown, report_for
    from warmscope.sources import EmbeddedSource, SourceError

    def fail(msg: str) -> int:
        print(f"warmscope report ab: {msg}", file=sys.stderr)
        return 2

    path = store_path(args)
    if not path.exists():
        return fail(
            f"{path} does not exist; pass --store PATH (or run `warmscope demo` for demo data)"
        )
    out = Path(args.out)
    md = Path(args.markdown) if args.markdown else out.with_suffix(".md")
    if out.resolve() == md.resolve():
        return fail(
            f"the HTML report and the Markdown one would both be {out}; give --markdown another "
            "path (or an --out ending in .html)"
        )
    for flag, target in (("--out", out), ("--markdown", md)):
        problem = overwrite_problem(flag, target, path)
        if problem:
            return fail(problem)
    try:
        src = EmbeddedSource(path)
        experiment = args.experiment
        known = _experiments(path)
        if experiment not in known:
            return fail(
                f"no experiment {experiment!r} in {path}; known: {', '.join(known) or 'none'} "
                "(pass one with --experiment)"
            )
        variants = _variants(path, experiment)
        treatments = [
            t.strip() for arg in (args.treatment or []) for t in arg.split(",") if t.strip()
        ]
        if not treatments:  # every arm besides the control
            treatments = [v for v in variants if v != args.control]
        for flag, v in [("--control", args.control)] + [("--treatment", t) for t in treatments]:
            if variants and v not in variants:
                return fail(
                    f"{flag} {v!r} is not a variant of {experiment!r}; variants: "
                    f"{', '.join(variants)}"
                )
        if args.control in treatments:
            return fail("--control and --treatment name the same variant; pick two different ones")
        if not treatments:
            return fail(
                f"{experiment!r} has no variant besides the control "
                f"{args.control!r}; nothing to compare"
            )
        rep = report_for(src, experiment, args.control, treatments, primary=args.primary)
    except SourceError as e:
        return fail(str(e))
    if rep.error:
        return fail(rep.error)
    metrics = [r.metric for r in rep.results]
    if args.primary not in metrics:
        return fail(
            f"--primary {args.primary!r} is not a metric of this report; metrics: "
            + ", ".join(repr(m) for m in metrics)
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(rep))
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(render_markdown(rep))
    except OSError as e:
        return fail(f"cannot write {e.filename or out}: {e.strerror or e}")
    print(rep.verdict)
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


def _experiments(path: Path) -> list[str]:
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT DISTINCT experiment FROM ab_moments WHERE experiment != '' ORDER BY 1"
        ).fetchall()
        if not rows:
            rows = con.execute(
                "SELECT DISTINCT experiment FROM ab_units WHERE experiment != '' ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]
    except sqlite3.Error:
        return []
    finally:
        con.close()


def _variants(path: Path, experiment: str) -> list[str]:
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for table in ("ab_moments", "ab_units"):
            rows = con.execute(
                f"SELECT DISTINCT variant FROM {table} WHERE experiment = ? ORDER BY 1",
                (experiment,),
            ).fetchall()
            if rows:
                return [r[0] for r in rows]
        return []
    except sqlite3.Error:
        return []
    finally:
        con.close()


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port", type=_PORT, default=8501, help="dashboard port, 1-65535 (default 8501)"
    )
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; the "
        "dashboard has no login, put an authenticating proxy in front before "
        "exposing it)",
    )


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from warmscope.app.cli.engine_demo import add_arguments as engine_demo_arguments

    _serve_arguments(p)
    p.add_argument("--fresh", action="store_true", help="delete the store first")
    p.add_argument("--no-dashboard", action="store_true", help="only fill the store")
    p.add_argument("--hours", type=_POS_FLOAT, default=24.0, help="simulated hours (default 24)")
    engine_demo_arguments(p)


def _simulate_arguments(p: argparse.ArgumentParser) -> None:
    from warmscope.simulator.config import STRATEGIES
    from warmscope.simulator.faults import TRAPS

    p.epilog = (
        "fault spec: TRAP[:DIM=VALUE,...][@HH:MM-HH:MM][;PARAM=VALUE]; traps: "
        + ", ".join(TRAPS)
        + "; dims: tenant, layer, replica, template, model"
    )
    # No flag has a default of its own: an unset flag keeps [simulator] of WARMSCOPE_CONFIG,
    # else SimConfig's default (the values in the help).
    p.add_argument("--hours", type=_POS_FLOAT, help="simulated hours (default 24)")
    p.add_argument("--rps", type=_POS_FLOAT, help="mean requests per second (default 12)")
    p.add_argument("--tenants", type=_POS_INT, help="tenants (default 8)")
    p.add_argument("--replicas", type=_POS_INT, help="replicas per variant pool (default 2)")
    p.add_argument(
        "--strategy-a",
        choices=STRATEGIES,
        help="warm-up strategy of pool A, the control (default none)",
    )
    p.add_argument(
        "--strategy-b",
        choices=STRATEGIES,
        help="warm-up strategy of pool B, the treatment (default static_topk)",
    )
    p.add_argument(
        "--strategy-c",
        choices=STRATEGIES,
        help="warm-up strategy of a third pool C, a second treatment: sessions split three ways "
        "(default: two pools)",
    )
    p.add_argument(
        "--b-response-ttl", type=_POS_FLOAT, help="pool B's response-cache TTL in s (A/B of TTLs)"
    )
    p.add_argument(
        "--b-kv-capacity",
        type=_POS_INT,
        help="pool B's prefix-KV capacity in tokens (A/B of capacities)",
    )
    p.add_argument(
        "--block-trace",
        metavar="FILE",
        help="also write each pool's prefix-KV block trace (Mooncake format, one file per pool: "
        "FILE's name with -A, -B, ...) for `warmscope whatif` and `warmscope advise --trace`",
    )
    p.add_argument(
        "--restart-every",
        type=_POS_FLOAT,
        metavar="HOURS",
        help="rolling restarts: each replica restarts every HOURS, staggered (default: never)",
    )
    p.add_argument(
        "--content-drift",
        type=_POS_FLOAT,
        metavar="HOURS",
        help="trending content: popular fills and RAG chunks change every HOURS (default: never)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a trap (repeatable): TRAP[:DIM=VALUE,...][@HH:MM-HH:MM][;PARAM=VALUE], "
        "e.g. bypass:tenant=globex,layer=response@10:00-11:30; DIM: tenant, layer, replica, "
        "template, model; PARAM: min_tokens (kv_fixed_len), ttl_s (warmup_timing); the traps: "
        "docs/get-started/simulator.md",
    )
    p.add_argument("--seed", type=_NONNEG_INT, help="random seed, >= 0 (default 1)")
    p.add_argument("--tick", type=_POS_FLOAT, help="flush interval in virtual seconds (default 60)")
    p.add_argument("--out", help="store path (default: the configured embedded store)")
    p.add_argument(
        "--faults-out", type=_writable_file, help="also write the ground truth as JSON here"
    )
    p.add_argument("--fresh", action="store_true", help="replace an existing store")
    p.add_argument("--append", action="store_true", help="add to an existing store")
    p.add_argument(
        "--workers",
        type=_POS_INT,
        help="processes simulating the pools, >= 1 (default: one per pool, at most one per core; "
        "fewer than the pools share them out by cost)",
    )
    p.add_argument("--realtime", action="store_true", help="pace virtual time to the wall clock")
    p.add_argument(
        "--speed",
        type=_POS_FLOAT,
        help="with --realtime: virtual seconds per wall second, > 0 (default 1)",
    )
    p.add_argument(
        "--exporter",
        choices=("embedded", "otlp", "prometheus"),
        default="embedded",
        help="where metric points go (default: the embedded store)",
    )
    p.add_argument(
        "--prometheus-port", type=_PORT, default=9464, help="scrape port with --exporter prometheus"
    )
    p.add_argument(
        "--redis-url",
        type=_redis_url,
        help="response cache, hot keys and A/B units in Redis (redis://HOST:PORT/DB)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _report_ab_arguments(p: argparse.ArgumentParser) -> None:
    from warmscope.model.ab_metrics import DEFAULT_PRIMARY, metric_names

    p.add_argument(
        "--experiment",
        default="warmup-strategy",
        help="experiment name (default warmup-strategy); an unknown name lists the known ones",
    )
    p.add_argument("--control", default="A", help="control variant (default A)")
    p.add_argument(
        "--treatment",
        action="append",
        metavar="ARM",
        help="treatment variant, compared with the control; repeat it or separate arms by commas "
        "for an A/B/n report (default: every variant besides the control)",
    )
    p.add_argument(
        "--primary",
        default=DEFAULT_PRIMARY,
        help="primary metric, the verdict's (Holm-adjusted over the arms with more than one "
        "treatment, else tested as is); one of: "
        + "; ".join(metric_names(["LAYER"]))
        + f" (default {DEFAULT_PRIMARY})",
    )
    p.add_argument(
        "--out", default="ab-report.html", help="HTML report path (default ab-report.html)"
    )
    p.add_argument("--markdown", help="Markdown path (default: next to --out)")


# Every `warmscope` command, in the order `warmscope --help` lists them (app/cli/base.py: Command).
COMMANDS: tuple[Command, ...] = (
    Simple(
        "demo",
        run=cmd_demo,
        arguments=_demo_arguments,
        help="simulate a day into the embedded store if empty, open the dashboard",
    ),
    Simple("dashboard", run=cmd_dashboard, arguments=_serve_arguments, help="open the dashboard"),
    Simple(
        "simulate",
        run=cmd_simulate,
        arguments=_simulate_arguments,
        help="run the emulated GPU inference stack into a store",
        description="Simulate replicas serving tenants through weights, LoRA, embedding, "
        "prefix-KV and response caches; pools A and B (and C with --strategy-c) "
        "run different warm-up strategies.",
    ),
    rules.COMMAND,
    Simple(
        "upgrade-store",
        run=cmd_upgrade_store,
        help="upgrade a store written by an older warmscope, keeping its data",
    ),
    rca.COMMAND,
    advise.COMMAND,
    Group(
        "report",
        "write reports",
        (
            Simple(
                "ab",
                run=cmd_report_ab,
                arguments=_report_ab_arguments,
                help="the A/B report (HTML and Markdown) for an experiment",
            ),
        ),
    ),
    misses.COMMAND,
    whatif.COMMAND,
    whatif.TRACE_COMMAND,
    runs.COMMAND,
    gateway.COMMAND,
    kv.COMMAND,
    warmup.COMMAND,
    grafana.COMMAND,
)
check_commands(COMMANDS)


def parser() -> argparse.ArgumentParser:
    """The `warmscope` parser: the global options and every command of ``COMMANDS`` (the CLI
    reference, docs/reference/cli.md, is generated from it)."""
    ap = _Parser(prog="warmscope", description="Cache warm-up observability and A/B analysis")
    ap.add_argument(
        "--store", help="embedded store path (default: $WARMSCOPE_STORE or var/warmscope.sqlite)"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["rca"]:  # light path: no collectors, simulator or pandas import
        from warmscope.app.cli.rca import main as rca_main

        return rca_main(argv[1:])
    from warmscope.collectors.config import ConfigError

    args = parser().parse_args(argv)
    import signal
    import sqlite3

    from warmscope.collectors.store import StoreError

    old = None
    if threading_main():
        # SIGTERM stops like Ctrl-C: simulator workers and the dashboard are stopped, nothing left
        # running.
        old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        rc: int = args.fn(args)
        sys.stdout.flush()  # a closed reader shows here, inside the handler below
        return rc
    except ConfigError as e:
        print(f"warmscope: configuration error: {e}", file=sys.stderr)
        return 2
    except StoreError as e:
        print(f"warmscope {args.cmd}: {e}", file=sys.stderr)
        return 2
    except sqlite3.Error as e:
        print(f"warmscope {args.cmd}: the store cannot be used: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. piped into head: the reader has what it wanted
        # stdout to /dev/null, so that the interpreter's last flush at exit raises nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        print(
            f"warmscope {args.cmd}: {e.strerror or e}{f': {e.filename}' if e.filename else ''}",
            file=sys.stderr,
        )
        return 1
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
