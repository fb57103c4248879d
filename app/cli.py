"""The `warmscope` command line.

    warmscope demo [--port 8501] [--fresh]   simulate a day into the embedded store if empty, open the dashboard
    warmscope dashboard [--port 8501]        open the dashboard on the configured source
    warmscope simulate [options]             run the emulated inference stack (see --help)
    warmscope report ab [options]            write the A/B report (HTML and Markdown)
    warmscope rca CSV --dims ... | --window S..E   root causes of a change: a leaf table or a store window (JSON)
    warmscope upgrade-store                  bring a store written by an older warmscope up to date
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

APP_MAIN = Path(__file__).with_name("main.py")


def _progress(label: str):
    """A terminal progress bar; redraws only when the percentage changes."""
    last = [-1]
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct == last[0] or (not tty and done < total):
            return
        last[0] = pct
        width = 30
        filled = width * pct // 100
        end = "\n" if done >= total else ""
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {pct:3d}%", end=end, file=sys.stderr,
              flush=True)
    return show


def _store_path(args: argparse.Namespace) -> Path:
    from warmscope.collectors.config import CollectorConfig

    return Path(args.store) if args.store else CollectorConfig.load().resolved_store_path()


def cmd_dashboard(args: argparse.Namespace) -> int:
    env = dict(os.environ, WARMSCOPE_STORE=str(_store_path(args)))
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.headless", "true",
           "--server.port", str(args.port), "--server.address", args.address,
           "--browser.gatherUsageStats", "false"]
    print(f"warmscope dashboard on http://{args.address}:{args.port}  (store: {env['WARMSCOPE_STORE']})",
          file=sys.stderr)
    return subprocess.call(cmd, env=env)


def _remove_store(path: Path) -> None:
    for p in path.parent.glob(path.name + "*"):
        p.unlink()


def _say_if_upgrading(path: Path) -> None:
    """A store from an older warmscope is upgraded when opened for writing; say so (it can take a minute)."""
    from warmscope.collectors.store import EmbeddedStore, StoreError

    if not path.exists():
        return
    try:
        EmbeddedStore(path, readonly=True).close()
    except StoreError as e:
        if "older warmscope" in str(e):
            print(f"upgrading {path} to this warmscope's schema (its data is kept)…", file=sys.stderr)


def cmd_demo(args: argparse.Namespace) -> int:
    from warmscope.collectors.store import EmbeddedStore

    path = _store_path(args)
    if args.fresh and path.exists():
        _remove_store(path)
    _say_if_upgrading(path)
    store = EmbeddedStore(path)
    empty = store.counts()["lookups"] == 0
    store.close()
    if empty:
        from warmscope.simulator import SimConfig, parse_fault, simulate

        # A day with two injected traps, so every page has something to show.
        cfg = SimConfig.load(hours=args.hours, strategy_a="none", strategy_b="static_topk")
        faults = [parse_fault("bypass:tenant=globex,layer=response@10:00-11:30"),
                  parse_fault("tenant_isolation:layer=response@14:00-15:00")]
        print(f"simulating {cfg.hours:g} h of traffic into {path} (once; --fresh starts over)", file=sys.stderr)
        s = simulate(cfg, path, faults, progress=_progress("simulating"))
        print(f"wrote {s.requests:,} simulated requests in {s.wall_s:.0f} s", file=sys.stderr)
    if args.no_dashboard:
        return 0
    return cmd_dashboard(args)


def cmd_upgrade_store(args: argparse.Namespace) -> int:
    from warmscope.collectors.store import SCHEMA_VERSION, EmbeddedStore, StoreError

    path = _store_path(args)
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

    try:
        cfg = SimConfig.load(
            hours=args.hours, rps=args.rps, tenants=args.tenants, replicas=args.replicas,
            strategy_a=args.strategy_a, strategy_b=args.strategy_b, seed=args.seed, tick_s=args.tick,
            b_response_ttl_s=args.b_response_ttl, b_kv_capacity_tokens=args.b_kv_capacity,
        )
        faults = [parse_fault(f) for f in args.fault]
    except ValueError as e:
        print(f"warmscope simulate: {e}", file=sys.stderr)
        return 2
    path = Path(args.out) if args.out else _store_path(args)
    if path.exists() and not (args.fresh or args.append):
        if EmbeddedStore(path).counts()["lookups"]:
            print(f"warmscope simulate: {path} already holds data; pass --fresh to replace it or --append "
                  "to add to it", file=sys.stderr)
            return 2
    if args.fresh and path.exists():
        _remove_store(path)
    kw: dict = {}
    if args.exporter != "embedded" or args.redis_url:
        from warmscope.collectors.config import CollectorConfig

        kw["collector_config"] = CollectorConfig.load(
            env={}, exporter=args.exporter, key_secret="warmscope-sim", max_families=1024,
            redis_url=args.redis_url or "", prometheus_port=args.prometheus_port, side_flush_s=900,
        )
    if args.realtime:
        kw.update(realtime=True, speed=args.speed)
    s = simulate(cfg, path, faults, workers=args.workers,
                 progress=None if args.quiet else _progress("simulating"), **kw)
    if args.faults_out:
        truth = [f.ground_truth(cfg.start, cfg.hours) for f in faults]
        Path(args.faults_out).write_text(json.dumps(truth, indent=2, default=str))
    print(json.dumps({"store": str(path), "requests": s.requests, "wall_s": round(s.wall_s, 2),
                      "requests_per_s": round(s.rps), "warmup_runs": s.warmups, "units": s.units,
                      "faults": len(faults)}))
    return 0


def cmd_report_ab(args: argparse.Namespace) -> int:
    from warmscope.analysis.ab_report import render_html, render_markdown, report_for
    from warmscope.analysis.sources import EmbeddedSource, SourceError

    try:
        src = EmbeddedSource(_store_path(args))
        experiment = args.experiment
        rep = report_for(src, experiment, args.control, args.treatment, primary=args.primary)
    except SourceError as e:
        print(f"warmscope report ab: {e}", file=sys.stderr)
        return 2
    if rep.error:
        print(f"warmscope report ab: {rep.error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(rep))
    md = Path(args.markdown) if args.markdown else out.with_suffix(".md")
    md.write_text(render_markdown(rep))
    print(rep.verdict)
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["rca"]:  # light path: no collectors, simulator or pandas import
        from .cli_rca import main as rca_main

        return rca_main(argv[1:])
    from warmscope.collectors.config import ConfigError

    ap = argparse.ArgumentParser(prog="warmscope", description="Cache warm-up observability and A/B analysis")
    ap.add_argument("--store", help="embedded store path (default: $WARMSCOPE_STORE or var/warmscope.sqlite)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn, helptext in (("demo", cmd_demo, "simulate a day into the embedded store if empty, open the "
                                "dashboard"), ("dashboard", cmd_dashboard, "open the dashboard")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--port", type=int, default=8501)
        p.add_argument("--address", default="127.0.0.1")
        p.set_defaults(fn=fn)
        if name == "demo":
            p.add_argument("--fresh", action="store_true", help="delete the store first")
            p.add_argument("--no-dashboard", action="store_true", help="only fill the store")
            p.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    from warmscope.simulator.config import STRATEGIES
    from warmscope.simulator.faults import TRAPS

    p = sub.add_parser("simulate", help="run the emulated GPU inference stack into a store",
                       description="Simulate replicas serving tenants through weights, LoRA, embedding, "
                       "prefix-KV and response caches; pools A and B run different warm-up strategies.",
                       epilog="fault spec: TRAP[:DIM=VALUE,...][@HH:MM-HH:MM][;PARAM=VALUE]; traps: "
                       + ", ".join(TRAPS) + "; dims: tenant, layer, replica, template, model")
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--rps", type=float, help="mean requests per second (default 12)")
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--replicas", type=int, default=2, help="replicas per variant pool")
    p.add_argument("--strategy-a", choices=STRATEGIES, default="none")
    p.add_argument("--strategy-b", choices=STRATEGIES, default="static_topk")
    p.add_argument("--b-response-ttl", type=float, help="pool B's response-cache TTL in s (A/B of TTLs)")
    p.add_argument("--b-kv-capacity", type=int, help="pool B's prefix-KV capacity in tokens (A/B of capacities)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a trap (repeatable)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tick", type=float, help="flush interval in virtual seconds (default 60)")
    p.add_argument("--out", help="store path (default: the configured embedded store)")
    p.add_argument("--faults-out", help="also write the ground truth as JSON here")
    p.add_argument("--fresh", action="store_true", help="replace an existing store")
    p.add_argument("--append", action="store_true", help="add to an existing store")
    p.add_argument("--workers", type=int, help="processes (default: 2 on a multi-core machine)")
    p.add_argument("--realtime", action="store_true", help="pace virtual time to the wall clock")
    p.add_argument("--speed", type=float, default=1.0, help="with --realtime: virtual seconds per wall second")
    p.add_argument("--exporter", choices=("embedded", "otlp", "prometheus"), default="embedded")
    p.add_argument("--prometheus-port", type=int, default=9464)
    p.add_argument("--redis-url", help="response cache, hot keys and A/B units in Redis")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_simulate)
    p = sub.add_parser("upgrade-store", help="upgrade a store written by an older warmscope, keeping its data")
    p.set_defaults(fn=cmd_upgrade_store)
    from .cli_rca import add_parser as add_rca_parser, cmd_rca

    add_rca_parser(sub).set_defaults(fn=cmd_rca)
    rp = sub.add_parser("report", help="write reports").add_subparsers(dest="report", required=True)
    p = rp.add_parser("ab", help="the A/B report (HTML and Markdown) for an experiment")
    p.add_argument("--experiment", default="warmup-strategy")
    p.add_argument("--control", default="A")
    p.add_argument("--treatment", default="B")
    p.add_argument("--primary", default="latency per request (s)", help="primary metric name (as in the table)")
    p.add_argument("--out", default="ab-report.html")
    p.add_argument("--markdown", help="Markdown path (default: next to --out)")
    p.set_defaults(fn=cmd_report_ab)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"warmscope: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
