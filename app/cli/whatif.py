"""`warmscope whatif` and `warmscope trace`: what each fix would buy, replayed from a recording.

    warmscope whatif                              the store's block trace (a gateway's recording)
    warmscope whatif --trace trace.jsonl --capacity 5860
    warmscope whatif --since 6h --unsalt acme,bolt --vllm-curve 12 --json
    warmscope trace export --out trace.jsonl      the store's block trace, in the Mooncake format
    warmscope trace import trace.jsonl            a trace file into the store (aligned to its end)

The capacity is vLLM's ``num_gpu_blocks`` per engine (block 0 is its null block): by default the
one the gateway read from the engines' ``/metrics`` when it recorded; a trace file without it
needs ``--capacity``. See docs/whatif.md for the method and how to read the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from warmscope.app.cli.base import Group, Simple, overwrite_problem, store_path
from warmscope.app.cli.misses import _since
from warmscope.app.cli.terminal import progress

if TYPE_CHECKING:
    from warmscope.model.blocktrace import BlockTrace

__all__ = [
    "COMMAND",
    "TRACE_COMMAND",
    "cmd_whatif",
    "cmd_warmup_advice",
    "import_demo_trace",
    "read_demo_trace",
    "DEMO_TRACE",
]

# A real production hour (Mooncake's conversation trace, Apache-2.0; data/traces/README.md), in a
# checkout: the demo imports it so that the What if page has a trace to replay.
DEMO_TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_conversation.jsonl"

PROG = "warmscope whatif"


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: {msg}", file=sys.stderr)
    return 2


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        help="a trace file in the Mooncake format (default: the block trace in the store)",
    )
    p.add_argument(
        "--block-size", type=int, help="tokens per hash id of --trace (default: its own, or 512)"
    )
    p.add_argument(
        "--capacity",
        type=int,
        help="KV blocks per engine today (vLLM's num_gpu_blocks; default: what the engines "
        "reported when the trace was recorded)",
    )
    p.add_argument(
        "--since",
        help="only requests from this time on: a duration back from the newest (30m, 6h, 2d) "
        "or a time (ISO 8601 or Unix seconds)",
    )
    p.add_argument(
        "--unsalt",
        help="the tenants whose cache salt the table drops, comma-separated (default: the two "
        "that share the most content)",
    )
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="replay requests as in flight from arrival to end (default: one after another)",
    )
    p.add_argument(
        "--vllm-curve",
        type=int,
        default=8,
        metavar="N",
        help="replay the vLLM policy at N capacities for its curve (0: the LRU curve only; "
        "default 8)",
    )
    p.add_argument(
        "--sample",
        type=float,
        help="SHARDS sampling rate for the LRU curve (default: exact up to 20 M block "
        "references, 0.01 beyond)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def load_trace(args: argparse.Namespace, prog: str) -> Any:
    """The trace the arguments name; raises ValueError with the message to print."""
    from warmscope.model.blocktrace import TraceError
    from warmscope.sources.base import SourceError

    try:
        if args.trace:
            from warmscope.sources.trace_file import read_trace

            tr = read_trace(args.trace, args.block_size)
        else:
            path = store_path(args)
            if not Path(path).exists():
                raise ValueError(
                    f"no store at {path}: record a block trace with `warmscope gateway "
                    "--kv-events` or import one with `warmscope trace import FILE`"
                    + ("" if prog == "warmscope trace export" else ", or pass --trace FILE")
                )
            from warmscope.sources.trace_store import read_store_trace

            tr = read_store_trace(path)
    except (TraceError, SourceError) as e:
        raise ValueError(str(e)) from None
    since = getattr(args, "since", None)
    if since:
        start = _since(since, float(tr.t[-1]))
        tr = tr.window(start, math.inf)
        if not len(tr):
            raise ValueError(f"no traced request since {since}")
    return tr


def _capacity(args: argparse.Namespace, tr: Any) -> tuple[int, str]:
    if args.capacity is not None:
        return args.capacity, "given (--capacity)"
    caps = sorted(set(tr.capacity.values()))
    if len(caps) == 1:
        return caps[0], "as the engines reported it (vllm:cache_config_info) when recorded"
    if len(caps) > 1:
        raise ValueError(
            f"the engines had different capacities ({', '.join(map(str, caps))} blocks): pass "
            "--capacity to replay them all at one"
        )
    raise ValueError(
        "the trace does not say the engines' capacity: pass --capacity BLOCKS (vLLM's "
        "num_gpu_blocks per engine; e.g. "
        f"{max(2, int(3_000_000 // tr.block_size)):,} for 3 M tokens of {tr.block_size}-token "
        "blocks)"
    )


def _pct(x: float) -> str:
    return "—" if x != x else f"{x:.1%}"


def _signed(x: float, digits: int = 0) -> str:
    return "—" if x != x else f"{x:+,.{digits}f}"


def render(w: Any) -> str:
    """The what-if answer as text."""
    t, tab = w.trace, w.table
    lines = []
    span = t.span_s
    lines.append(
        f"Block trace: {len(t):,} requests, {t.n_blocks:,} block references of {t.block_size} "
        f"tokens, {len(t.engines) or 1} engine(s), {span / 60:.1f} min ({t.source})"
    )
    rec = (
        ""
        if tab.recorded_hit_rate != tab.recorded_hit_rate
        else (
            f"; the engines reported {_pct(tab.recorded_hit_rate)}, "
            f"{tab.agreement:.1%} of requests replayed to the token"
        )
    )
    lines.append(
        f"Replayed as recorded at {w.capacity:,} blocks per engine ({w.capacity_note}): "
        f"token hit rate {_pct(tab.baseline_hit_rate)}{rec}"
    )
    missed = tab.baseline_missed
    if missed:
        total = sum(missed.values())
        parts = ", ".join(
            f"{k} {v:,} ({v / total:.0%})" for k, v in sorted(missed.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"Tokens a cache could have served and did not, by why: {parts}")
    lines.append("")
    lines.append(
        "What each fix buys (cached tokens gained = prefill tokens saved; 95 % CI over "
        "20 time slices of the trace)"
    )
    head = (
        f"{'fix':<34}{'hit rate':>9}  {'tokens gained (95 % CI)':<44}{'GPU-s saved':>12}  aimed at"
    )
    lines.append(head)
    lines.append("-" * len(head))
    for f in tab.fixes:
        if not f.available:
            lines.append(f"{f.name:<34}{'—':>9}  n/a: {f.note}")
            continue
        ci = f"{_signed(f.gained_ci[0])} to {_signed(f.gained_ci[1])}"
        gained = f"{_signed(f.gained_tokens)} ({ci})"
        lines.append(
            f"{f.name:<34}{_pct(f.hit_rate):>9}  {gained:<44}{_signed(f.gpu_s, 2):>12}  {f.removes}"
        )
    lines.append("")
    for f in tab.fixes:
        if f.available and f.by_class:
            got = ", ".join(
                f"{k} {v:,}" for k, v in sorted(f.by_class.items(), key=lambda kv: -kv[1])
            )
            lost = (
                "; lost: " + ", ".join(f"{k} {v:,}" for k, v in f.lost_by_class.items())
                if f.lost_by_class
                else ""
            )
            lines.append(f"  {f.name}: gains tokens that were {got}{lost}")
        if f.available and f.note:
            lines.append(f"  {f.name}: {f.note}")
    lines.append(f"  prices: {tab.cost_note}")
    if tab.cost is not None:
        for f in tab.fixes:
            if f.available and f.ttft_s_per_request == f.ttft_s_per_request:
                lines.append(
                    f"  {f.name}: TTFT {f.ttft_s_per_request * 1e3:+.2f} ms per request saved "
                    f"(95 % CI {f.ttft_ci[0] * 1e3:+.2f} to {f.ttft_ci[1] * 1e3:+.2f})"
                )
    lines.append("")
    c = w.lru
    s = c.summary()
    lines.append(
        f"Miss-ratio curve (block LRU{', sampled at ' + format(c.rate, 'g') if c.rate < 1 else ''}"
        f"{', per engine' if len(t.engines) > 1 else ''}): at most {_pct(c.max_hit)} with an "
        f"infinite cache"
    )
    for label, key in (
        ("half of that at", "half_max_blocks"),
        ("95 % at", "p95_max_blocks"),
        ("knee at", "knee_blocks"),
    ):
        b = s[key]
        if isinstance(b, float) and b == b:
            lines.append(f"  {label} {b:,.0f} blocks ({b * t.block_size:,.0f} tokens)")
    lines.append(f"  today {w.capacity:,} blocks: {_pct(c.at(w.capacity))}")
    knee = s["knee_blocks"]
    if isinstance(knee, float) and knee == knee and c.max_hit > 0:
        share = c.at(w.capacity) / c.max_hit
        lines.append(
            f"  sizing: today's cache reaches {share:.0%} of what an infinite one would; the "
            f"knee is {knee / w.capacity:.1f}x today ({knee:,.0f} blocks): up to it each "
            "doubling buys much, past it little"
        )
    if w.vllm is not None:
        lines.append("  vLLM policy (exact replay):")
        for b, h in zip(w.vllm.capacity, w.vllm.hit_rate, strict=True):
            mark = "  <- today" if int(b) == w.capacity else ""
            lines.append(f"    {int(b):>10,} blocks  {h:6.1%}  (LRU {c.at(b):6.1%}){mark}")
        lines.append(f"    {w.capacity:>10,} blocks  {tab.baseline_hit_rate:6.1%}  today")
    return "\n".join(lines)


def cmd_whatif(args: argparse.Namespace) -> int:
    from warmscope.analysis.whatif.report import whatif
    from warmscope.model.blocktrace import TraceError

    if args.capacity is not None and args.capacity < 2:
        return _fail(PROG, f"--capacity {args.capacity}: an engine needs at least 2 blocks")
    if args.sample is not None and not 0 < args.sample <= 1:
        return _fail(PROG, f"--sample {args.sample}: a sampling rate in (0, 1]")
    if args.vllm_curve < 0:
        return _fail(PROG, "--vllm-curve: a number of capacities, 0 or more")
    try:
        tr = load_trace(args, PROG)
        cap, note = _capacity(args, tr)
    except ValueError as e:
        return _fail(PROG, str(e))
    unsalt = [x.strip() for x in args.unsalt.split(",") if x.strip()] if args.unsalt else None
    show = None if args.json else progress("replaying")
    try:
        w = whatif(
            tr,
            cap,
            note,
            concurrent=args.concurrent,
            unsalt=unsalt,
            vllm_points=args.vllm_curve,
            rate=args.sample,
            progress=show,
        )
    except TraceError as e:
        return _fail(PROG, str(e))
    if args.json:
        print(json.dumps(w.as_dict(), indent=2))
    else:
        print(render(w))
    return 0


COMMAND = Simple(
    "whatif",
    run=cmd_whatif,
    arguments=_arguments,
    help="what each fix would buy: replay a block trace through vLLM's prefix cache at other "
    "capacities, routings, salts and templates",
    description="Replays a block trace (recorded by `warmscope gateway --kv-events`, or a "
    "Mooncake-format file) through an exact model of vLLM's prefix cache: the miss-ratio curve, "
    "and per fix (more capacity, prefix-aware routing, a dropped salt, a fixed template drift, "
    "warm-up) the cached tokens, GPU-seconds and TTFT it buys.",
)


# ---------------------------------------------------------------- warm-up advice
def render_advice(ev: Any, rec: Any) -> str:
    """The paired evaluation's table and the recommendation, as text."""
    from warmscope.analysis.whatif.warmup import OBJECTIVES, ORACLES

    hs = sorted(ev.horizons)
    lines = [
        f"Warm-up judged on {ev.trace_source}: {len(ev.restarts)} restarts of an engine of "
        f"{ev.capacity:,} blocks ({ev.block_size}-token blocks); each strategy chose its warm set "
        "from the hour before the restart, then the next "
        f"{max(hs) / 60:.0f} min of traffic was replayed (the same restarts and traffic for all)",
        "",
        "Prefill tokens saved per restart over no warm-up (95 % CI), and the share of the "
        "seen oracle's gain (what knowing the next minutes would save, among blocks the trace "
        "had shown before the restart; the oracle knows new content too)",
    ]
    # a horizon's column: two spaces, then its cell right-aligned in 32 (a wider cell still
    # keeps the two spaces from its neighbour)
    head = f"{'K':>7}  {'strategy':<12}" + "".join(f"  {f'within {h / 60:g} min':>32}" for h in hs)
    head += f"{'seen-oracle share':>22}{'precision':>11}"
    lines += [head, "-" * len(head)]
    for k, s, cells in ev.table_rows():
        row = f"{k:>7,}  {s:<12}"
        for c in cells:
            row += (
                f"  {f'{c.gain_tokens:+,.0f} ({c.gain_ci[0]:+,.0f} to {c.gain_ci[1]:+,.0f})':>32}"
            )
        last = cells[-1]  # the longest horizon
        lo_s, hi_s = last.seen_share_ci
        share = (
            "(a bound)"
            if s in ORACLES
            else f"{last.seen_share:.0%} ({lo_s:.0%}-{hi_s:.0%})"
            if last.seen_share == last.seen_share
            else "—"
        )
        prec = f"{last.precision:.0%}" if last.precision == last.precision else "—"
        lines.append(row + f"{share:>22}{prec:>11}")
    settled = ev.settled_by()
    if settled is not None:
        lines += ["", ev.settled_note(settled)]
    lines += ["", f"Recommendation (objective {rec.objective}: {OBJECTIVES[rec.objective]}):"]
    if rec.strategy == "none":
        lines.append("  no warm-up")
    else:
        lines.append(
            f"  {rec.strategy}, K = {rec.k:,} blocks ({rec.k * ev.block_size:,} tokens): "
            f"{rec.gain_tokens:+,.0f} prefill tokens saved per restart in the "
            f"{rec.horizon_s / 60:.0f} min after it (95 % CI {rec.gain_ci[0]:+,.0f} to "
            f"{rec.gain_ci[1]:+,.0f}); {rec.seen_share:.0%} of the seen oracle's gain "
            f"({rec.seen_share_ci[0]:.0%}-{rec.seen_share_ci[1]:.0%}), {rec.oracle_share:.0%} of "
            "the oracle's (which also knows content nobody had sent yet)"
        )
        lines.append(
            f"  the warm-up computes {rec.warm_tokens:,.0f} tokens itself: net "
            f"{rec.net_tokens:+,.0f} tokens per restart (95 % CI {rec.net_ci[0]:+,.0f} to "
            f"{rec.net_ci[1]:+,.0f})"
        )
        if rec.per_token_s == rec.per_token_s:
            lines.append(
                f"  time to first token: {rec.ttft_saved_s_per_request * 1e3:+.2f} ms per request "
                f"in those minutes; lead time (the warm-up's prefill, behind the readiness gate): "
                f"{rec.lead_s:.1f} s"
            )
        else:
            lines.append(
                "  seconds: the trace has no time to first token to price a token with; per "
                f"request {rec.gain_tokens / max(rec.requests, 1):,.0f} prefill tokens saved "
                f"({rec.requests:,.0f} requests in {rec.horizon_s / 60:.0f} min)"
            )
        if rec.restarts_per_hour == rec.restarts_per_hour:
            lines.append(
                f"  per hour: {rec.gain_tokens * rec.restarts_per_hour:+,.0f} tokens at the "
                f"recorded {rec.restarts_per_hour:.2f} restarts an hour"
            )
    if rec.widened:
        lines.append(f"  search: {rec.widened}")
    for n in rec.notes:
        lines.append(f"  {n}")
    lines.append(
        f"  heat decay λ = {ev.lam:.4f}/s (1 / max(0.1 × the {ev.slo_ms:.0f} ms TTFT SLO, 10 s)): "
        "a read's weight halves every "
        f"{math.log(2) / ev.lam:.0f} s"
    )
    return "\n".join(lines)


def cmd_warmup_advice(args: argparse.Namespace) -> int:
    """`warmscope advise --trace FILE` / `--block-trace`: the paired warm-up evaluation."""
    from warmscope.analysis.whatif.warmup import advise
    from warmscope.model.blocktrace import TraceError

    prog = "warmscope advise"
    if args.json and args.json != "-":
        problem = overwrite_problem("--json", args.json, store_path(args))
        if not problem and args.trace and Path(args.trace).resolve() == Path(args.json).resolve():
            problem = f"--json {args.json} is the trace this command reads; give another path"
        if problem:
            return _fail(prog, problem)
    try:
        tr = load_trace(
            argparse.Namespace(trace=args.trace, block_size=None, store=args.store, since=None),
            prog,
        )
        cap, _ = _capacity(args, tr)
    except ValueError as e:
        return _fail(prog, str(e))
    try:
        ks = [int(x) for x in args.k.split(",")] if args.k else None
    except ValueError:
        return _fail(prog, f"--k {args.k!r}: warm-set sizes in blocks, comma-separated")
    slo_ms = 1000.0 * args.slo_ttft_s if args.slo_ttft_s else 1000.0
    cost = math.nan
    from warmscope.analysis.value import fit_token_latency

    fit = fit_token_latency((tr.prompt - np.maximum(tr.cached, 0)).astype(float), tr.ttft)
    if not isinstance(fit, str):
        cost = fit.per_token_s
    show = None if args.quiet else progress("replaying restarts")
    try:
        ev, rec = advise(tr, cap, ks, args.restarts, args.warmup_objective, slo_ms, cost, show)
    except TraceError as e:
        return _fail(prog, str(e))
    if args.json:
        out = {"evaluation": ev.as_dict(), "recommendation": rec.as_dict()}
        # a figure the trace cannot give (no TTFT: no cost per token) is null, not NaN
        text = json.dumps(_nan_to_none(out), indent=2, allow_nan=False, default=str)
        if args.json == "-":
            print(text)
            return 0
        try:
            Path(args.json).write_text(text)
        except OSError as e:
            return _fail(prog, f"cannot write --json {args.json}: {e.strerror or e}")
    print(render_advice(ev, rec))
    return 0


def _nan_to_none(v: Any) -> Any:
    """``v`` with every NaN float (at any depth of dicts, lists and tuples) replaced by None."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _nan_to_none(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_nan_to_none(x) for x in v]
    return v


# ---------------------------------------------------------------- trace
def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the trace file to write (JSON lines)")
    p.add_argument("--since", help="only requests from this time on (as for whatif)")


def cmd_trace_export(args: argparse.Namespace) -> int:
    from warmscope.sources.trace_file import write_trace

    prog = "warmscope trace export"
    args.trace = None
    problem = overwrite_problem("--out", args.out, store_path(args))
    if problem:
        return _fail(prog, problem)
    try:
        tr = load_trace(args, prog)
    except ValueError as e:
        return _fail(prog, str(e))
    try:
        n = write_trace(tr, args.out)
    except OSError as e:
        return _fail(prog, f"cannot write {args.out}: {e.strerror or e}")
    print(f"wrote {n:,} requests ({tr.n_blocks:,} block references) to {args.out}")
    return 0


def _import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a trace in the Mooncake format")
    p.add_argument("--block-size", type=int, help="tokens per hash id (default: its own, or 512)")
    p.add_argument(
        "--align",
        choices=("end", "now", "keep"),
        default="end",
        help="where its times go: end where the store's data ends (default), end now, or as "
        "written (seconds from 1970 for a Mooncake trace)",
    )


def cmd_trace_import(args: argparse.Namespace) -> int:
    from warmscope.model.blocktrace import TraceError
    from warmscope.sources.trace_file import read_trace

    prog = "warmscope trace import"
    try:
        tr = read_trace(args.file, args.block_size)
    except TraceError as e:
        return _fail(prog, str(e))
    return _import_trace(tr, store_path(args), args.align, prog)


def _import_trace(tr: BlockTrace, path: str | Path, align: str, prog: str) -> int:
    """Write the block trace ``tr`` (read already) into the store at ``path``, its times moved
    as ``align`` says (end, now, keep: see ``warmscope trace import --help``); 0 when it did."""
    import time

    import numpy as np
    from warmscope.collectors.store import EmbeddedStore, StoreError
    from warmscope.sources.base import SourceError
    from warmscope.sources.trace_store import write_store_trace

    held = _held_trace(Path(path))
    if held:
        return _fail(
            prog,
            f"{path} already holds a block trace ({held:,} requests); a second one would mix two "
            "traces' hash ids (the same file twice would count every request twice): import into "
            "another store (--store NEW.sqlite)",
        )
    shift = 0.0
    if align != "keep":
        end = time.time()
        if align == "end" and Path(path).exists():
            try:
                store = EmbeddedStore(Path(path))  # (an older store is upgraded first)
                try:
                    rows = store.query("SELECT max(ts) FROM lookups")
                finally:
                    store.close()
                if rows and rows[0][0] is not None:
                    end = float(rows[0][0])
            except StoreError:
                pass
        shift = end - float(tr.t[-1])
    tr.t = tr.t + shift
    tr.t_end = np.where(np.isnan(tr.t_end), tr.t_end, tr.t_end + shift)
    tr.restarts = tuple((t + shift, e) for t, e in tr.restarts)
    try:
        n = write_store_trace(tr, path)
    except (SourceError, OSError) as e:
        return _fail(prog, str(e))
    # the store keeps full blocks only (an engine caches no partial one): the count it holds
    kept = int(np.minimum(tr.full, np.diff(tr.offsets)).sum())
    partial = tr.n_blocks - kept
    print(
        f"imported {n:,} requests ({kept:,} block references, {tr.block_size}-token blocks"
        + (f"; {partial:,} partial last blocks left out" if partial else "")
        + f") into {path}; `warmscope whatif` replays them"
    )
    return 0


def _held_trace(path: Path) -> int:
    """The requests of the block trace the store at ``path`` holds (0: none, or no store yet)."""
    from warmscope.collectors.store import EmbeddedStore, StoreError

    if not path.exists():
        return 0
    try:
        store = EmbeddedStore(path)
        try:
            return int(store.query("SELECT count(*) FROM block_trace")[0][0])
        finally:
            store.close()
    except StoreError:
        return 0


def read_demo_trace() -> Future[BlockTrace] | None:
    """Start reading :data:`DEMO_TRACE` on a thread of its own (the demo reads it while it
    simulates, about 2 s of parsing that would otherwise wait for the simulation to end); None
    where the file is not there. Pass the result to :func:`import_demo_trace`."""
    if not DEMO_TRACE.exists():
        return None
    from warmscope.sources.trace_file import read_trace

    pool = ThreadPoolExecutor(1, thread_name_prefix="demo-trace")
    try:
        return pool.submit(read_trace, DEMO_TRACE, None)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def import_demo_trace(path: Path, pre_read: Future[BlockTrace] | None = None) -> bool:
    """Import :data:`DEMO_TRACE` into the store at ``path`` when the store holds no block trace
    and the file is there (a checkout); True when it did. ``pre_read``: the file already being
    read (:func:`read_demo_trace`)."""
    if not DEMO_TRACE.exists() or not Path(path).exists() or _held_trace(Path(path)):
        return False
    from warmscope.model.blocktrace import TraceError
    from warmscope.sources.trace_file import read_trace

    print(
        "importing a real production hour (Mooncake's conversation trace) for the What if page",
        file=sys.stderr,
    )
    prog = "warmscope demo"
    try:
        tr = pre_read.result() if pre_read is not None else read_trace(DEMO_TRACE, None)
    except TraceError as e:
        _fail(prog, f"{DEMO_TRACE}: {e}")
        return False
    return _import_trace(tr, str(path), "end", prog) == 0


TRACE_COMMAND = Group(
    "trace",
    "the block trace: export it in the Mooncake format, or import a trace file",
    (
        Simple(
            "export",
            run=cmd_trace_export,
            arguments=_export_arguments,
            help="write the store's block trace as a Mooncake-format file",
        ),
        Simple(
            "import",
            run=cmd_trace_import,
            arguments=_import_arguments,
            help="read a Mooncake-format trace file into the store's block trace",
        ),
    ),
)
