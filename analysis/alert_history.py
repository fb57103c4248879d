"""Alert history: when each alert condition fired and when it resolved.

:func:`analysis.alerts.evaluate` says which conditions hold over one window. A
rule engine evaluates its rules again and again; this does the same over
recorded frames: every ``every`` seconds it evaluates the window of
``lookback`` seconds ending there (as an alerting rule's range selector
would), and joins consecutive evaluations where the same alert holds for the
same subject (a layer, a run, …) into one episode.

An episode ``fired`` at the first evaluation where it held and ``resolved`` at
the first evaluation after that where it no longer held (NaN: still firing at
the last evaluation). The last evaluation is at ``end`` itself and is
:func:`holding_now`: the alerts a page lists as open are the episodes still
firing (:func:`open_alerts`), one state machine at one evaluation time.
``since`` is the condition's own onset as the evaluator reports it (the start
of the window's latest third for a regression, the first flush that shows a
cross-tenant read or a bypass, the run's start for a warm set).

Example::

    hist = alert_history(frames, start, end, every=600, lookback=3600)
    # columns: alert, subject, severity, fired, resolved, since, summary, evaluations
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .alerts import evaluate

__all__ = [
    "alert_history",
    "subject_of",
    "evaluation_times",
    "holding_now",
    "open_alerts",
    "COLUMNS",
    "LOOKBACK_S",
]

LOOKBACK_S = 3600.0  # each evaluation covers the hour before it (a rule's one-hour range)

COLUMNS = ["alert", "subject", "severity", "fired", "resolved", "since", "summary", "evaluations"]
_ORDER = {"critical": 0, "warning": 1, "info": 2}
_SUBJECT = re.compile(r"^(layer \S+?|run \S+|strategy \S+ on \S+?)(?=[: ]|$)")


def subject_of(summary: str) -> str:
    """What an alert is about, from its summary: ``layer prefix_kv``, ``run run-1-00009``,
    ``strategy static_topk on embedding``, or "" (one per alert name)."""
    m = _SUBJECT.match(summary or "")
    return m.group(1) if m else ""


def evaluation_times(start: float, end: float, every: float) -> np.ndarray:
    """Evaluation instants ``…, end − 2·every, end − every, end`` after ``start``: the last one is
    ``end`` itself (what holds now)."""
    if every <= 0:
        raise ValueError(f"every must be positive, got {every!r}")
    n = max(int(np.ceil((end - start) / every - 1e-9)), 1)
    return end - every * np.arange(n - 1, -1, -1)


def _window(frames: Mapping[str, pd.DataFrame], lo: float, hi: float) -> dict[str, pd.DataFrame]:
    """The frames a window [lo, hi) needs: runs that started in it and their keys; hot keys from the
    detectors' lookback; the time-indexed frames' rows stamped in (lo, hi]."""
    out = dict(frames)
    lk = frames.get("lookups", pd.DataFrame())
    if len(lk):  # what dates a cross-tenant read: every flush up to the instant
        out["lookups_before"] = lk[lk["ts"].to_numpy(dtype=float) <= hi]
    for k in ("lookups", "writes", "requests", "histograms", "gauges"):
        f = frames.get(k, pd.DataFrame())
        if len(f):  # stamped at the end of their interval: (lo, hi]
            ts = f["ts"].to_numpy(dtype=float)
            if len(ts) > 1 and (np.diff(ts) >= 0).all():
                out[k] = f.iloc[np.searchsorted(ts, lo, "right") : np.searchsorted(ts, hi, "right")]
            else:
                out[k] = f[(ts > lo) & (ts <= hi)]
    runs = frames.get("warmup_runs", pd.DataFrame())
    if len(runs):
        runs = runs[(runs["started"] >= lo) & (runs["started"] < hi)]
        out["warmup_runs"] = runs
        for k in ("warmed_keys", "early_keys"):
            f = frames.get(k, pd.DataFrame())
            if len(f):
                out[k] = f[f["run_id"].isin(runs["run_id"])]
    hk = frames.get("hot_keys", pd.DataFrame())
    if len(hk):
        # every window up to the instant: a leak is dated from its first shared window
        out["hot_keys"] = hk[hk["window"] <= hi]
    return out


def newest_of(frames: Mapping[str, pd.DataFrame]) -> float | None:
    """The newest lookup stamp in ``frames`` (None without lookups)."""
    lk = frames.get("lookups", pd.DataFrame())
    return float(lk["ts"].max()) if len(lk) else None


def holding_now(
    frames: Mapping[str, pd.DataFrame],
    end: float,
    lookback: float = LOOKBACK_S,
    newest: float | None = None,
) -> pd.DataFrame:
    """The alerts holding at ``end``: the conditions evaluated over the ``lookback`` before it —
    the last evaluation of :func:`alert_history` over any range that ends at ``end``."""
    lo = end - lookback
    return evaluate(_window(frames, lo, end), lo, end, newest if newest is not None else end)


def open_alerts(history: pd.DataFrame) -> pd.DataFrame:
    """The episodes of an :func:`alert_history` still firing at its last evaluation."""
    return history[history["resolved"].isna()].reset_index(drop=True)


def alert_history(
    frames: Mapping[str, pd.DataFrame],
    start: float,
    end: float,
    every: float = 600.0,
    lookback: float = LOOKBACK_S,
) -> pd.DataFrame:
    """Alert episodes over (start, end]: evaluations every ``every`` s, each over the ``lookback`` s
    before it (frames must reach back to ``start − lookback``). One row per episode, oldest
    first."""
    if lookback <= 0:
        raise ValueError(f"lookback must be positive, got {lookback!r}")
    times = evaluation_times(start, end, every)
    newest = max(newest_of(frames) or end, end)
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    r: Any  # an itertuples row: pandas types its fields as any scalar
    for t in times:
        now = holding_now(frames, float(t), lookback, newest)
        seen: set[tuple[str, str]] = set()
        for r in now.itertuples():
            key = (r.alert, subject_of(r.summary))
            if key in seen:  # one row per alert and subject per evaluation
                continue
            seen.add(key)
            ep = open_.get(key)
            if ep is None:
                open_[key] = {
                    "alert": r.alert,
                    "subject": key[1],
                    "severity": r.severity,
                    "fired": float(t),
                    "resolved": np.nan,
                    "since": float(r.since) if r.since == r.since else np.nan,
                    "summary": r.summary,
                    "evaluations": 1,
                }
            else:
                ep["evaluations"] += 1
                if _ORDER.get(r.severity, 9) < _ORDER.get(
                    ep["severity"], 9
                ):  # the worst severity it reached
                    ep["severity"] = r.severity
                    ep["summary"] = r.summary
        for key in [k for k in open_ if k not in seen]:
            ep = open_.pop(key)
            ep["resolved"] = float(t)
            done.append(ep)
    done.extend(open_.values())
    out = pd.DataFrame(done, columns=COLUMNS)
    return out.sort_values(["fired", "alert", "subject"], kind="stable").reset_index(drop=True)
