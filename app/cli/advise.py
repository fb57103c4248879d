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
from pathlib import Path

from warmscope.app.cli.base import Simple, store_path
from warmscope.app.cli.terminal import progress

__all__ = ["COMMAND", "cmd_advise"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-gpu-s", type=float, help="cap on warm-up GPU-seconds per day (default: no cap)"
    )
    p.add_argument(
        "--objective",
        choices=("value", "slo", "net_gpu_s", "roi"),
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


def _fmt_h(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else (f"{s / 60:.0f} min" if s >= 60 else f"{s:g} s")


def cmd_advise(args: argparse.Namespace, progress, store_path) -> int:
    import pandas as pd
    from warmscope.analysis.advisor import (
        NoRecommendation,
        advise,
        advise_prefix,
        check_input,
        fidelity_text,
        layer_table,
        prefix_only,
        prefix_text,
    )
    from warmscope.analysis.forecast import forecast_table
    from warmscope.analysis.value import values_for
    from warmscope.sources import EmbeddedSource, SourceError

    path = Path(store_path(args))
    if args.budget_gpu_s is not None and not (
        args.budget_gpu_s > 0 and math.isfinite(args.budget_gpu_s)
    ):
        print(
            "warmscope advise: --budget-gpu-s must be a positive number of GPU-seconds per "
            "day, got "
            f"{args.budget_gpu_s:g}",
            file=sys.stderr,
        )
        return 2
    if args.iterations < 0:
        print("warmscope advise: --iterations must be >= 0", file=sys.stderr)
        return 2
    if not path.exists():
        print(
            f"warmscope advise: {path} does not exist; pass --store PATH (fill one with "
            "`warmscope demo "
            "--no-dashboard` or `warmscope simulate`)",
            file=sys.stderr,
        )
        return 2
    try:
        src = EmbeddedSource(path)
        fr = src.frames(
            [
                "lookups",
                "warmup_runs",
                "warmed_keys",
                "hot_keys",
                "gauges",
                "faults",
                "histograms",
                "misses",
            ]
        )
    except SourceError as e:
        print(f"warmscope advise: {e}", file=sys.stderr)
        return 2
    lk = fr["lookups"]
    if args.variant is not None:
        if args.variant not in set(lk["variant"].astype(str)):
            print(
                f"warmscope advise: variant {args.variant!r} not in {path}; variants there: "
                f"{', '.join(sorted(set(lk['variant'].astype(str)))) or 'none'}",
                file=sys.stderr,
            )
            return 2
    if args.variant is None and prefix_only(fr):
        return _advise_prefix(args, src, fr, path, advise_prefix, prefix_text, NoRecommendation)
    missing = check_input(fr, args.variant)
    if missing:
        print(f"warmscope advise: {missing}", file=sys.stderr)
        return 2
    vm = values_for(
        src,
        fr,
        float(lk["ts"].min()),
        float(lk["ts"].max()),
        args.slo_ttft_s,
        args.slo_penalty,
        args.objective,
    )
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
        if e.fidelity is not None:
            print(fidelity_text(e.fidelity))
        print(f"warmscope advise: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"warmscope advise: {e}", file=sys.stderr)
        return 2
    out = rec.as_dict()
    out["forecast"] = json.loads(ft.to_json(orient="records"))
    out["store"] = str(path)
    if args.json == "-":
        print(json.dumps(out, indent=2, default=str))
        return 0
    kept = ft[ft.kept].set_index("horizon_s")
    rows = []
    for h, g in ft.groupby("horizon_s"):
        d = g.set_index("model")
        rows.append(
            {
                "horizon": _fmt_h(h),
                "kept": kept.loc[h, "model"] if h in kept.index else "",
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
    if rec.peak:
        when = lambda t: pd.Timestamp(t, unit="s").strftime("%Y-%m-%d %H:%M")  # noqa: E731
        print(
            f"\nNext peak: {when(rec.peak.at)} UTC, {rec.peak.rate:.1f} req/s "
            f"(range {rec.peak.lo:.1f}–{rec.peak.hi:.1f}); trigger the warm-up at "
            f"{when(rec.trigger_at)} UTC"
        )
    print(f"\n{rec.evaluations} replays, {rec.seconds:.1f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _advise_prefix(args, src, fr, path, advise_prefix, prefix_text, NoRecommendation) -> int:
    """A recording of an engine's prefix cache only (a gateway's): warm-set size and lead time."""
    from warmscope.analysis.value import values_for

    lk = fr["lookups"]
    vm = values_for(
        src,
        fr,
        float(lk["ts"].min()),
        float(lk["ts"].max()),
        args.slo_ttft_s,
        args.slo_penalty,
        args.objective,
    )
    try:
        adv = advise_prefix(fr, src.units(None), vm, args.objective)
    except NoRecommendation as e:
        print(f"warmscope advise: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"warmscope advise: {e}", file=sys.stderr)
        return 2
    k = args.versus_top_k if args.versus_top_k and args.versus_top_k > 0 else None
    out = adv.as_dict(k)
    out["store"] = str(path)
    if args.json == "-":
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(prefix_text(adv, k))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
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
