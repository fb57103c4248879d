"""`warmscope runs`: warm-up runs with precision, recall, ROI per window and a verdict, from a
store.

One row per warm-up of a replica (the runs it opened per cache layer merged, as the ROI counts their
benefit once): precision and recall over its warmed keys, compute and business ROI with 95 %
intervals at each window (T+5 min, T+1 h, T+24 h by default) and a verdict from the T+1 h window.
``--json`` writes the same rows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmscope.app.cli.base import Simple, store_path

if TYPE_CHECKING:
    import pandas as pd
    from warmscope.sources import EmbeddedSource

__all__ = ["COMMAND", "cmd_runs", "verdict"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--limit", type=int, default=20, help="newest runs to show (default 20; 0 = all)"
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def verdict(roi_row: dict[str, Any]) -> str:
    """From one window's ROI row: "worth it" (an ROI's 95 % interval above zero), "not worth it"
    (every estimable ROI's interval below zero), "within noise", or why there is none; "so far" when
    the window runs past the data."""
    state = str(roi_row.get("state", ""))
    if state in ("no requests", "no cost"):
        return f"no verdict: {state}"
    lows = [roi_row[k] for k in ("roi_compute_low", "roi_business_low") if _finite(roi_row.get(k))]
    highs = [
        roi_row[k] for k in ("roi_compute_high", "roi_business_high") if _finite(roi_row.get(k))
    ]
    if not lows:
        return (
            f"no verdict: {state if state == 'cost too small to estimate' else 'not enough points'}"
        )
    so_far = "" if roi_row.get("complete", True) else " so far"
    if max(lows) > 0:
        return "worth it" + so_far
    if highs and max(highs) < 0:
        return "not worth it" + so_far
    return "within noise" + so_far


def cmd_runs(args: argparse.Namespace, store_path: Callable[[argparse.Namespace], Path]) -> int:
    import pandas as pd
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.analysis.coverage import warm_set_coverage
    from warmscope.analysis.roi import replica_runs, roi_text, roi_windows
    from warmscope.sources import EmbeddedSource, SourceError

    path = Path(store_path(args))
    if not path.exists():
        print(f"warmscope runs: {path} does not exist; pass --store PATH", file=sys.stderr)
        return 2
    if args.limit < 0:
        print("warmscope runs: --limit must be >= 0", file=sys.stderr)
        return 2
    cfg = AnalysisConfig.load()
    try:
        src = EmbeddedSource(path)
        fr = src.frames(["warmup_runs", "warmed_keys", "early_keys"])
        runs = fr["warmup_runs"]
        if runs.empty:
            print(f"warmscope runs: no warm-up runs in {path}", file=sys.stderr)
            return 1
        cov = warm_set_coverage(runs, fr["warmed_keys"], fr["early_keys"], cfg.recall_window_s)
        merged = replica_runs(runs).sort_values("started", ascending=False)
        if args.limit:
            merged = merged.head(args.limit)
        span = max(cfg.roi_windows_s)
        rq = src.frame(
            "requests",
            float(merged["started"].min()) - span - 60,
            float(merged["ended"].max()) + span + 60,
        )
    except SourceError as e:
        print(f"warmscope runs: {e}", file=sys.stderr)
        return 2
    bounds = src.time_bounds()
    data_end = float(bounds[1]) if bounds else None
    out: list[dict[str, Any]] = []
    run_rows: Iterable[Any] = merged.itertuples()  # one merged run: its columns as attributes
    for r in run_rows:
        mine = cov[
            (cov["replica"] == r.replica)
            & (cov["started"] >= r.started - 1)
            & (cov["started"] <= (r.ended if r.ended == r.ended else r.started) + 1)
        ]
        k, read = float(mine["keys_warmed"].sum()), float(mine["keys_read"].sum())
        early, ew = float(mine["early_keys"].sum()), float(mine["early_warmed"].sum())
        roi = roi_windows(
            pd.Series(r._asdict()),
            rq,
            cfg.price_per_gpu_s,
            cfg.value_per_conversion,
            cfg.roi_windows_s,
            data_end=data_end,
        )
        txt = roi_text(roi)
        hour = roi[roi["window_s"] == 3600.0]
        row = (
            {str(k): v for k, v in (hour if len(hour) else roi.tail(1)).iloc[0].items()}
            if len(roi)
            else {}
        )
        out.append(
            {
                "run_id": r.run_id,
                "started": pd.Timestamp(r.started, unit="s").strftime("%Y-%m-%d %H:%M:%S"),
                "replica": r.replica,
                "layers": r.layer,
                "strategy": r.strategy,
                "trigger": r.trigger,
                "keys": int(k),
                "precision": read / k if k else None,
                "recall": ew / early if early else None,
                "gpu_s": float(r.gpu_s),
                "roi": [
                    {"window": w, "compute": c, "business": b}
                    for w, c, b in zip(
                        txt["window"], txt["roi_compute"], txt["roi_business"], strict=True
                    )
                ],
                "verdict": verdict(row),
                "prices": {"gpu_s": cfg.price_per_gpu_s, "conversion": cfg.value_per_conversion},
            }
        )
    exps = _experiments(src, runs, rq, out)
    if args.json:
        print(json.dumps({"runs": out, "experiments": exps}, indent=1))
        return 0
    rows = []
    for o in out:
        d = {
            "started (UTC)": o["started"],
            "replica": o["replica"],
            "strategy": o["strategy"],
            "trigger": o["trigger"],
            "keys": o["keys"],
            "precision": f"{o['precision']:.1%}"
            if o["precision"] is not None
            else "no warmed keys",
            "recall": f"{o['recall']:.1%}" if o["recall"] is not None else "no requests",
        }
        for w in o["roi"]:
            d[f"compute ROI {w['window']}"] = w["compute"]
        d["business ROI T+1 h"] = next(
            (w["business"] for w in o["roi"] if w["window"].startswith("T+1 h")), ""
        )
        d["verdict"] = o["verdict"]
        rows.append(d)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 60)
    print(pd.DataFrame(rows).to_string(index=False))
    for x in exps:
        print(f"\n{x['text']}")
    print(
        f"\nPrices: GPU-s at {cfg.price_per_gpu_s:g}, a conversion at "
        f"{cfg.value_per_conversion:g} ([analysis]); verdict from the T+1 h window.",
        file=sys.stderr,
    )
    return 0


def _experiments(
    src: EmbeddedSource, runs: pd.DataFrame, rq: pd.DataFrame, out: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each experiment's whole-run compute ROI per treatment arm, beside the newest run's T+5 min
    ROI."""
    from warmscope.analysis.roi import SEED_VS_EXPERIMENT, experiment_roi

    res = []
    rv = (
        {
            str(r): str(v)
            for r, v in rq[["replica", "variant"]].drop_duplicates().itertuples(index=False)
            if str(v)
        }
        if len(rq)
        else {}
    )
    for name in src.experiments():
        units = src.units(name)
        if units.empty:
            continue
        arms = sorted(set(units["variant"].astype(str)))
        warmed = {v for r, v in rv.items() if r in set(runs["replica"].astype(str))}
        control = next((a for a in arms if a not in warmed), arms[0])
        tab = experiment_roi(units, runs, rv, control)
        for r in tab.itertuples():
            seed = next((o for o in out if rv.get(o["replica"]) == r.variant), None)
            t5 = seed["roi"][0]["compute"] if seed else "no run of this arm shown"
            text = (
                f"Experiment {name}, arm {r.variant} vs {control}: compute ROI {r.roi:+.2f} (95 % "
                f"CI {r.roi_low:+.2f} to {r.roi_high:+.2f}) over {r.requests:,.0f} requests and "
                f"{r.runs} runs ({r.gpu_s_saved:+,.0f} GPU-s saved for {r.warm_gpu_s:,.0f} spent); "
                f"the arm's newest run at T+5 min: {t5}. {SEED_VS_EXPERIMENT}"
            )
            res.append(
                {
                    "experiment": name,
                    "variant": r.variant,
                    "control": control,
                    "roi": r.roi,
                    "roi_low": r.roi_low,
                    "roi_high": r.roi_high,
                    "gpu_s_saved": r.gpu_s_saved,
                    "warm_gpu_s": r.warm_gpu_s,
                    "newest_run_t5": t5,
                    "text": text,
                }
            )
    return res


def _run(args: argparse.Namespace) -> int:
    return cmd_runs(args, store_path)


COMMAND = Simple(
    "runs",
    run=_run,
    arguments=_arguments,
    help="warm-up runs with precision, recall, ROI per window and a verdict",
    description="Warm-up runs of a store, newest first: precision and recall of the warmed "
    "keys, compute and business ROI per window with 95 % intervals, and a verdict from the "
    "T+1 h window (worth it: an ROI's interval above zero; not worth it: every ROI's interval "
    "below zero; else within noise).",
)
