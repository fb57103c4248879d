"""`warmscope advise`: request forecasts and tuned warm-up parameters from a recorded store.

Prints a table (forecast error per horizon against the baselines, the recommended parameters next
to the recorded ones, the next peak and when to trigger the warm-up) and writes the same as JSON
with ``--json``. A recording of an engine's prefix cache only (a gateway's) gets the prefix-cache
advisor: warm-set size, lead time, and the prediction against a top-k warm set
(``--versus-top-k``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from warmscope.analysis.objectives import OBJECTIVES
from warmscope.app.cli.base import Simple, store_path
from warmscope.app.cli.terminal import progress

if TYPE_CHECKING:
    import pandas as pd
    from warmscope.analysis.advisor import Recommendation
    from warmscope.analysis.value import ValueModel
    from warmscope.sources import EmbeddedSource

    Frames = dict[str, pd.DataFrame]

__all__ = ["COMMAND", "cmd_advise"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-gpu-s", type=float, help="cap on warm-up GPU-seconds per day (default: no cap)"
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="what the tuning maximises: value (default when the A/B units record conversions) = "
        "GPU-s and TTFT saved, TTFT priced by the measured conversion response to latency; slo "
        "(default when --slo-penalty is set and there are no conversions) = TTFT priced by the SLO "
        "penalty; net_gpu_s (default otherwise) = GPU-s saved minus warm-up GPU-s; roi = the ratio "
        "(saved - cost) / cost",
    )
    p.add_argument(
        "--slo-penalty",
        type=float,
        help="currency per request over the TTFT target (prices latency for --objective slo)",
    )
    p.add_argument(
        "--slo-ttft-s", type=float, help="the TTFT target in s (default: [analysis] slo_ttft_s)"
    )
    p.add_argument(
        "--variant", help="calibrate on this A/B variant's pool only (default: all lookups)"
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=16,
        help="Bayesian-optimisation steps after 8 start points (default 16)",
    )
    p.add_argument(
        "--json", metavar="PATH", help="also write the result as JSON here ('-' for stdout only)"
    )
    p.add_argument(
        "--versus-top-k",
        type=int,
        default=50,
        metavar="K",
        help="for an engine's prefix cache (a gateway recording): also predict the recommendation "
        "against a warm set of the K most requested prefixes, `warmscope warmup --from hot`'s "
        "default (default 50)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    t = p.add_argument_group(
        "warm-up judged on a block trace",
        "which warm-up strategy, how many blocks, and what it buys after a restart, from a paired "
        "replay of the trace (docs/warmup-evaluation.md)",
    )
    t.add_argument("--trace", metavar="FILE", help="a block trace file (the Mooncake format)")
    t.add_argument(
        "--block-trace", action="store_true", help="the block trace the store holds (a gateway's)"
    )
    t.add_argument("--capacity", type=int, help="the engine's num_gpu_blocks (default: recorded)")
    t.add_argument(
        "--k",
        metavar="K[,K...]",
        help="warm-set sizes in blocks, comma-separated (default: 1/64, 1/16, 1/4 and all "
        "of the cache)",
    )
    t.add_argument(
        "--restarts",
        type=int,
        default=30,
        help="restart points, at least 30 for an interval worth reading (default 30)",
    )
    t.add_argument(
        "--warmup-objective",
        choices=("ttft", "net_gpu"),
        default="ttft",
        help="ttft (default): prefill tokens the requests after a restart skip; net_gpu: minus "
        "the warm-up's own prefill",
    )


FRAMES = [
    "lookups",
    "warmup_runs",
    "warmed_keys",
    "hot_keys",
    "gauges",
    "faults",
    "histograms",
    "misses",
]


def _fail(message: str) -> int:
    """Say what is wrong on stderr, prefixed with the command; the exit code 2."""
    print(f"warmscope advise: {message}", file=sys.stderr)
    return 2


def _bad_arguments(args: argparse.Namespace, path: Path) -> str | None:
    """What is wrong with the arguments before the store is read (a budget that is not a positive
    finite number, negative iterations, a store that does not exist), or None."""
    if args.budget_gpu_s is not None and not (
        args.budget_gpu_s > 0 and math.isfinite(args.budget_gpu_s)
    ):
        return (
            "--budget-gpu-s must be a positive number of GPU-seconds per day, got "
            f"{args.budget_gpu_s:g}"
        )
    if args.iterations < 0:
        return "--iterations must be >= 0"
    if not path.exists():
        return (
            f"{path} does not exist; pass --store PATH (fill one with `warmscope demo "
            "--no-dashboard` or `warmscope simulate`)"
        )
    return None


def _bad_variant(args: argparse.Namespace, lk: pd.DataFrame, path: Path) -> str | None:
    """A ``--variant`` the store's lookups do not have, with the variants they do have."""
    if args.variant is None or args.variant in set(lk["variant"].astype(str)):
        return None
    return (
        f"variant {args.variant!r} not in {path}; variants there: "
        f"{', '.join(sorted(set(lk['variant'].astype(str)))) or 'none'}"
    )


def _values(args: argparse.Namespace, src: EmbeddedSource, fr: Frames) -> ValueModel:
    """The value model over the lookups' span, from the store and the SLO arguments."""
    from warmscope.analysis.value import values_for

    lk = fr["lookups"]
    return values_for(
        src,
        fr,
        float(lk["ts"].min()),
        float(lk["ts"].max()),
        args.slo_ttft_s,
        args.slo_penalty,
        args.objective,
    )


def _write_json(args: argparse.Namespace, out: dict[str, object]) -> None:
    """With ``--json PATH``: the result written there, and a line saying so on stderr."""
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)


def cmd_advise(
    args: argparse.Namespace,
    progress: Callable[[str], Callable[[int, int], None]],
    store_path: Callable[[argparse.Namespace], Path],
) -> int:
    from warmscope.analysis.advisor import prefix_only
    from warmscope.sources import EmbeddedSource, SourceError

    path = Path(store_path(args))
    bad = _bad_arguments(args, path)
    if bad:
        return _fail(bad)
    try:
        src = EmbeddedSource(path)
        fr = src.frames(FRAMES)
    except SourceError as e:
        return _fail(str(e))
    bad = _bad_variant(args, fr["lookups"], path)
    if bad:
        return _fail(bad)
    if args.variant is None and prefix_only(fr):
        return _advise_prefix(args, src, fr, path)
    return _advise_layers(args, progress, src, fr, path)


def _advise_layers(
    args: argparse.Namespace,
    progress: Callable[[str], Callable[[int, int], None]],
    src: EmbeddedSource,
    fr: Frames,
    path: Path,
) -> int:
    """The response and embedding caches: forecasts, then the tuned parameters per layer."""
    from warmscope.analysis.advisor import NoRecommendation, advise, check_input, fidelity_text
    from warmscope.analysis.forecast import forecast_table

    missing = check_input(fr, args.variant)
    if missing:
        return _fail(missing)
    lk = fr["lookups"]
    vm = _values(args, src, fr)
    bar = None if args.quiet else progress("advising")
    if bar:
        bar(0, 1)
    ft = forecast_table(lk[lk["variant"] == args.variant] if args.variant else lk)
    try:
        rec = advise(
            fr,
            budget_gpu_s=args.budget_gpu_s,
            variant=args.variant,
            n_iter=args.iterations,
            progress=bar,
            objective=args.objective,
            values=vm,
        )
    except NoRecommendation as e:
        if e.fidelity is not None:  # the table; its sentence is the error below, said once
            print(fidelity_text(e.fidelity, sentence=False))
        return _fail(str(e))
    except ValueError as e:
        return _fail(str(e))
    out = rec.as_dict()
    out["forecast"] = json.loads(ft.to_json(orient="records"))
    out["store"] = str(path)
    if args.json == "-":
        print(json.dumps(out, indent=2, default=str))
        return 0
    _print_forecast(ft)
    _print_parameters(rec)
    _print_replay(rec)
    _print_peak(rec)
    print(f"\n{rec.evaluations} replays, {rec.seconds:.1f} s", file=sys.stderr)
    _write_json(args, out)
    return 0


def _print_forecast(ft: pd.DataFrame) -> None:
    """Forecast error per horizon: the kept model, and MAPE and 90 % coverage per model."""
    import pandas as pd
    from warmscope.analysis.advisor import fmt_hours

    kept = ft[ft.kept].set_index("horizon_s")
    rows = []
    for key, g in ft.groupby("horizon_s"):
        h = cast(float, key)  # seconds
        d = g.set_index("model")
        rows.append(
            {
                "horizon": fmt_hours(h),
                "kept": kept.at[h, "model"] if h in kept.index else "",
                **{f"MAPE {m}": d.loc[m, "mape"] for m in d.index},
                **{f"cover {m}": d.loc[m, "coverage_90"] for m in d.index},
            }
        )
    pd.set_option("display.width", 200)
    print("Forecast (held-back last 20 %, 90 % intervals):")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    notes = ft.drop_duplicates("horizon_s")
    for _, r in notes[notes.resolution_limited].iterrows():
        print(f"  note: {r.note}")


def _print_parameters(rec: Recommendation) -> None:
    """The replay's fidelity, the objective and its prices, and the parameters per layer with
    each layer's notes."""
    from warmscope.analysis.advisor import fidelity_text, layer_table

    if rec.fidelity is not None:
        print("\n" + fidelity_text(rec.fidelity))
    print(f"\nObjective: {rec.objective} ({'; '.join(rec.notes) or 'as asked'})")
    if rec.values is not None:
        print(f"  {rec.values.prices()}")
    print("\nParameters per layer:")
    print(layer_table(rec).to_string())
    for la in rec.layers.values():
        for note in la.notes:
            print(f"  {la.layer}: {note}")


def _print_replay(rec: Recommendation) -> None:
    """The recorded span replayed, recorded -> recommended: hit rates, warm-up cost and ROI, the
    expected gain in the objective's unit, and the staleness notes."""
    o, bo = rec.outcome, rec.base_outcome
    print("\nReplay (recorded span):")
    for layer in o.hit_rate:
        print(f"  hit rate {layer:<10} {bo.hit_rate[layer]:.1%} -> {o.hit_rate[layer]:.1%}")
    print(
        f"  warm-up GPU-s            {bo.warm_gpu_s:.1f} -> {o.warm_gpu_s:.1f} "
        f"(bytes {bo.warm_bytes / 1e6:.0f} MB -> {o.warm_bytes / 1e6:.0f} MB)"
    )
    print(f"  warm-up ROI (compute)    {bo.roi:+.2f} -> {o.roi:+.2f}")
    net = o.net_gpu_s - bo.net_gpu_s
    if rec.objective == "net_gpu_s":
        print(f"  expected gain            {net:+.1f} GPU-s net (GP sd {rec.gain_sd:.1f})")
    elif rec.objective == "roi":
        print(
            f"  expected gain            ROI {rec.gain:+.2f} (GP sd {rec.gain_sd:.2f}); "
            f"{net:+.1f} GPU-s net"
        )
    else:
        lo = sum(la.gain_low for la in rec.layers.values())
        hi = sum(la.gain_high for la in rec.layers.values())
        print(
            f"  expected gain            {rec.gain:+,.2f} in value (95 % CI of the latency price: "
            f"{lo:+,.2f} to {hi:+,.2f}); {net:+.1f} GPU-s net"
        )
    for _layer, note in rec.model.persist_note.items() if rec.model else ():
        print(f"  staleness                {note}")


def _print_peak(rec: Recommendation) -> None:
    """The next forecast peak and when to trigger the warm-up before it, if there is one."""
    import pandas as pd

    if rec.peak and rec.trigger_at is not None:

        def when(t: float) -> str:
            return pd.Timestamp(t, unit="s").strftime("%Y-%m-%d %H:%M")

        print(
            f"\nNext peak: {when(rec.peak.at)} UTC, {rec.peak.rate:.1f} req/s "
            f"(range {rec.peak.lo:.1f}–{rec.peak.hi:.1f}); trigger the warm-up at "
            f"{when(rec.trigger_at)} UTC"
        )


def _advise_prefix(args: argparse.Namespace, src: EmbeddedSource, fr: Frames, path: Path) -> int:
    """A recording of an engine's prefix cache only (a gateway's): warm-set size and lead time."""
    from warmscope.analysis.advisor import NoRecommendation, advise_prefix, prefix_text

    vm = _values(args, src, fr)
    try:
        adv = advise_prefix(fr, src.units(None), vm, args.objective)
    except NoRecommendation as e:
        return _fail(str(e))
    except ValueError as e:
        return _fail(str(e))
    k = args.versus_top_k if args.versus_top_k and args.versus_top_k > 0 else None
    out = adv.as_dict(k)
    out["store"] = str(path)
    if args.json == "-":
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(prefix_text(adv, k))
    _write_json(args, out)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.trace or args.block_trace:
        from warmscope.app.cli.whatif import cmd_warmup_advice

        return cmd_warmup_advice(args)
    return cmd_advise(args, progress, store_path)


COMMAND = Simple(
    "advise",
    run=_run,
    arguments=_arguments,
    help="forecast requests and recommend warm-up parameters from a recorded store",
    description="Forecasts requests per key family at 5 s, 3 min and 1 h (held-back "
    "MAPE and interval coverage against seasonal-naive and exponential "
    "smoothing), replays the recorded traffic through a cache model and "
    "tunes warm-set size, response TTL, heat decay λ and the pre-peak "
    "trigger lead time by Bayesian optimisation.",
)
