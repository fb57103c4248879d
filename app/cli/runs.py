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
from pathlib import Path
from typing import Any, NamedTuple

from warmscope.app.cli.base import Simple, store_path

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


class _Runs(NamedTuple):
    """What the rows are read from."""

    runs: Any  # the warm-up runs (one per replica and layer)
    coverage: Any  # precision and recall of each run (analysis.coverage.warm_set_coverage)
    merged: Any  # one row per warm-up of a replica, newest first, at most --limit
    requests: Any  # the requests around them, for the ROI windows
    data_end: float | None  # the newest data: a window past it is "so far"


def cmd_runs(args: argparse.Namespace, store_path: Any) -> int:
    from warmscope.analysis.config import AnalysisConfig
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
        data = _read(src, cfg, args.limit)
    except SourceError as e:
        print(f"warmscope runs: {e}", file=sys.stderr)
        return 2
    if data is None:
        print(f"warmscope runs: no warm-up runs in {path}", file=sys.stderr)
        return 1
    out = [_row(r, data, cfg) for r in data.merged.itertuples()]
    exps = _experiments(src, data.runs, data.requests, out)
    if args.json:
        print(json.dumps({"runs": out, "experiments": exps}, indent=1))
    else:
        _print_table(out, exps, cfg)
    return 0


def _read(src: Any, cfg: Any, limit: int) -> _Runs | None:
    """The runs of the store, their coverage and the requests around the newest ``limit`` of
    them (0: all); None when there is no run."""
    from warmscope.analysis.coverage import warm_set_coverage
    from warmscope.analysis.roi import replica_runs

    fr = src.frames(["warmup_runs", "warmed_keys", "early_keys"])
    runs = fr["warmup_runs"]
    if runs.empty:
        return None
    cov = warm_set_coverage(runs, fr["warmed_keys"], fr["early_keys"], cfg.recall_window_s)
    merged = replica_runs(runs).sort_values("started", ascending=False)
    if limit:
        merged = merged.head(limit)
    span = max(cfg.roi_windows_s)
    rq = src.frame(
        "requests",
        float(merged["started"].min()) - span - 60,
        float(merged["ended"].max()) + span + 60,
    )
    bounds = src.time_bounds()
    return _Runs(runs, cov, merged, rq, float(bounds[1]) if bounds else None)


def _row(r: Any, data: _Runs, cfg: Any) -> dict[str, Any]:
    """One warm-up of a replica: its keys, precision, recall, ROI per window and verdict."""
    import pandas as pd
    from warmscope.analysis.roi import roi_text, roi_windows

    cov = data.coverage
    mine = cov[
        (cov["replica"] == r.replica)
        & (cov["started"] >= r.started - 1)
        & (cov["started"] <= (r.ended if r.ended == r.ended else r.started) + 1)
    ]
    k, read = float(mine["keys_warmed"].sum()), float(mine["keys_read"].sum())
    early, ew = float(mine["early_keys"].sum()), float(mine["early_warmed"].sum())
    roi = roi_windows(
        pd.Series(r._asdict()),
        data.requests,
        cfg.price_per_gpu_s,
        cfg.value_per_conversion,
        cfg.roi_windows_s,
        data_end=data.data_end,
    )
    txt = roi_text(roi)
    hour = roi[roi["window_s"] == 3600.0]
    row = (
        {str(k): v for k, v in (hour if len(hour) else roi.tail(1)).iloc[0].items()}
        if len(roi)
        else {}
    )
    status = str(getattr(r, "status", None) or "ok")
    error = str(getattr(r, "error", None) or "")
    return {
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
            for w, c, b in zip(txt["window"], txt["roi_compute"], txt["roi_business"], strict=True)
        ],
        "status": status,
        "verdict": verdict(row)
        if status == "ok"
        else f"no verdict: the run ended {status}" + (f" ({error})" if error else ""),
        "prices": {"gpu_s": cfg.price_per_gpu_s, "conversion": cfg.value_per_conversion},
    }


def _print_table(out: list[dict[str, Any]], exps: list[dict[str, Any]], cfg: Any) -> None:
    import pandas as pd

    rows = []
    for o in out:
        precision, recall = o["precision"], o["recall"]
        d = {
            "started (UTC)": o["started"],
            "replica": o["replica"],
            "strategy": o["strategy"],
            "trigger": o["trigger"],
            "keys": o["keys"],
            "precision": f"{precision:.1%}" if precision is not None else "no warmed keys",
            "recall": f"{recall:.1%}" if recall is not None else "no requests",
        }
        for w in o["roi"]:  # one column per window; a window still open says so in its cell
            win, unfinished = (
                w["window"].removesuffix(" (unfinished)"),
                "(unfinished)" in w["window"],
            )
            d[f"compute ROI {win}"] = w["compute"] + (" (unfinished)" if unfinished else "")
        d["business ROI T+1 h"] = next(
            (w["business"] for w in o["roi"] if w["window"].startswith("T+1 h")), ""
        )
        d["verdict"] = o["verdict"]
        rows.append(d)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 60)
    print(pd.DataFrame(rows).fillna("").to_string(index=False))
    for e in exps:
        print(f"\n{e['text']}")
    print(
        f"\nPrices: GPU-s at {cfg.price_per_gpu_s:g}, a conversion at "
        f"{cfg.value_per_conversion:g} ([analysis]); verdict from the T+1 h window.",
        file=sys.stderr,
    )


def _experiments(src: Any, runs: Any, rq: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
