"""Request forecasts per key family (or per tenant × layer) at several horizons,
with prediction intervals, checked against baselines on held-back data.

The series is the request count (hit + miss lookups) per flush bucket of each
group, read as a rate in requests per second. For a bucket ending at ``t`` and
a horizon ``H`` the target is the mean rate over ``(t, t + H]``: the sum of the
next ``m = max(1, round(H / step))`` buckets divided by ``m · step``. A horizon
shorter than the store's flush interval cannot be observed at its own width;
it is then evaluated as the next bucket's rate and flagged
(``resolution_limited``) — run the collectors with a shorter flush interval
(``flush_interval_s``) to score it at its own width.

Models (all fitted on the first 60 % of the buckets; the next 20 % choose the
model and calibrate the intervals; the last 20 % are held back and give every
figure reported):

* ``seasonal_naive`` — the rate one season (a day) before the target window
  when the history holds a day, else the last bucket's rate (the label says
  which);
* ``ses`` — simple exponential smoothing of the rate, smoothing constant
  chosen on the training part from a grid; the forecast is the level;
* ``regression`` — one pooled least-squares model over all groups on log rates:
  fast and slow exponential levels, the last bucket, the hour's mean and the
  time of day (sine, cosine). It is kept only when it beats both baselines'
  MAPE on the selection part; otherwise the best baseline is used.

Intervals are empirical: the 5 % and 95 % quantiles of the selection part's
log-ratio errors ``log1p(actual) − log1p(forecast)`` added to the forecast, so a
90 % interval; the reported coverage is the share of held-back targets inside.
MAPE is ``mean |actual − forecast| / actual`` over targets with actual > 0.

Example::

    fc = forecast_table(lookups, by=("family",))     # one row per horizon × model
    nxt = next_peak(lookups)                         # when the total rate peaks next
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "HORIZONS",
    "series",
    "Evaluation",
    "evaluate",
    "forecast_table",
    "forecast_now",
    "next_peak",
    "prediction_error",
    "PredictionError",
    "Peak",
]

HORIZONS = (5.0, 180.0, 3600.0)
LEVELS = (0.05, 0.95)
SES_GRID = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
DAY = 86400.0


def _step(ts: np.ndarray) -> float:
    u = np.unique(ts)
    if len(u) < 2:
        return float("nan")
    return float(np.min(np.diff(u)))


def series(
    lookups: pd.DataFrame, by: Sequence[str] = ("family",), step: float | None = None
) -> pd.DataFrame:
    """Requests per second per bucket: wide (bucket end ts × group), gaps filled with 0."""
    lk = lookups[lookups["result"].isin(["hit", "miss"])]
    if lk.empty:
        return pd.DataFrame()
    step = step or _step(lk["ts"].to_numpy(float))
    if not np.isfinite(step):
        return pd.DataFrame()
    b = np.ceil(lk["ts"].to_numpy(float) / step - 1e-9) * step
    cols = list(by)
    if len(cols) == 1:
        codes, uniq = pd.factorize(lk[cols[0]].astype(str), sort=True)
        labels = [str(u) for u in uniq]
    else:
        codes, uniq = pd.factorize(pd.MultiIndex.from_frame(lk[cols].astype(str)), sort=True)
        labels = [" · ".join(u) for u in uniq]
    K = len(labels)
    b0 = float(b.min())
    bi = np.rint((b - b0) / step).astype(np.int64)
    T = int(bi.max()) + 1
    m = np.bincount(bi * K + codes, weights=lk["count"].to_numpy(float), minlength=T * K).reshape(
        T, K
    )
    out = pd.DataFrame(m / step, index=b0 + step * np.arange(T), columns=pd.Index(labels, name="k"))
    out.index.name = "b"
    out.attrs["step_s"] = step
    return out


def _targets(y: np.ndarray, m: int) -> np.ndarray:
    """Row i: mean of rows i+1 .. i+m (NaN past the end)."""
    T = len(y)
    c = np.vstack([np.zeros((1, y.shape[1])), np.cumsum(y, axis=0)])
    out = np.full_like(y, np.nan)
    i = np.arange(T - m)
    out[i] = (c[i + 1 + m] - c[i + 1]) / m
    return out


def _ses_levels(y: np.ndarray, alpha: float) -> np.ndarray:
    """Level after each row: ``l_t = α·y_t + (1 − α)·l_{t−1}``, ``l_{−1} = y_0`` (a first-order
    filter)."""
    from scipy.signal import lfilter

    if len(y) == 0:
        return y.astype(float)
    out = lfilter(
        [alpha], [1.0, -(1.0 - alpha)], y, axis=0, zi=((1.0 - alpha) * y[:1]).astype(float)
    )
    return out[0]  # type: ignore[no-any-return]  # scipy is untyped


def _mape(a: np.ndarray, p: np.ndarray) -> float:
    m = np.isfinite(a) & np.isfinite(p) & (a > 0)
    return float(np.mean(np.abs(a[m] - p[m]) / a[m])) if m.any() else float("nan")


@dataclass
class Evaluation:
    """One horizon's held-back figures for every model, and the one kept."""

    horizon_s: float
    step_s: float
    resolution_limited: bool
    mape: dict[str, float]
    coverage: dict[str, float]
    chosen: str
    note: str = ""
    selection_mape: dict[str, float] = field(default_factory=dict)
    bands: dict[str, tuple[float, float]] = field(default_factory=dict)
    alpha: float = float("nan")
    coef: np.ndarray | None = None


class _Fitted:
    """Every model's forecasts for one horizon over the whole series (row i = forecast made at
    bucket i)."""

    def __init__(self, y: np.ndarray, ts: np.ndarray, step: float, m: int, train_end: int) -> None:
        self.y, self.ts, self.m, self.step = y, ts, m, step
        self.target = _targets(y, m)
        T = len(y)
        season = int(round(DAY / step))
        if T > season + m:
            sn = np.full_like(y, np.nan)
            i = np.arange(season - 1, T)
            # the window one day earlier: rows i+1-season .. i+m-season
            c = np.vstack([np.zeros((1, y.shape[1])), np.cumsum(y, axis=0)])
            lo, hi = i + 1 - season, np.minimum(i + 1 - season + m, T)
            sn[i] = (c[hi] - c[lo]) / np.maximum(hi - lo, 1)[:, None]
            self.sn_label = "seasonal_naive (daily)"
        else:
            sn = y.copy()
            self.sn_label = "seasonal_naive (last bucket; under a day of history)"
        self.pred: dict[str, np.ndarray] = {"seasonal_naive": sn}
        best, self.alpha = np.inf, SES_GRID[0]
        keep = _ses_levels(
            y, SES_GRID[0]
        )  # kept when no error is finite (e.g. an all-zero training target)
        for a in SES_GRID:
            lv = _ses_levels(y, a)
            e = _mape(self.target[:train_end], lv[:train_end])
            if e < best:
                best, self.alpha, keep = e, a, lv
        self.pred["ses"] = keep
        self.pred["regression"], self.coef = self._regression(train_end)

    def features(self) -> np.ndarray:
        y = self.y
        fast, slow = _ses_levels(y, 0.3), _ses_levels(y, 0.02)
        k = max(1, int(round(3600 / self.step)))
        c = np.vstack([np.zeros((1, y.shape[1])), np.cumsum(y, axis=0)])
        i = np.arange(len(y))
        hour = (c[i + 1] - c[np.maximum(i + 1 - k, 0)]) / np.minimum(i + 1, k)[:, None]
        tod = 2 * np.pi * ((self.ts + self.m * self.step / 2) % DAY) / DAY
        S = y.shape[1]
        cols = [
            np.log1p(fast),
            np.log1p(slow),
            np.log1p(y),
            np.log1p(hour),
            np.repeat(np.sin(tod)[:, None], S, 1),
            np.repeat(np.cos(tod)[:, None], S, 1),
            np.ones_like(y),
        ]
        return np.stack(cols, axis=-1)  # T × S × F

    def _regression(self, train_end: int) -> tuple[np.ndarray, np.ndarray]:
        X = self.features()
        tgt = np.log1p(self.target)
        Xt, yt = X[:train_end].reshape(-1, X.shape[-1]), tgt[:train_end].ravel()
        ok = np.isfinite(yt)
        if ok.sum() < X.shape[-1] * 5:
            return np.full_like(self.y, np.nan), np.zeros(X.shape[-1])
        A = Xt[ok]
        coef = np.linalg.solve(A.T @ A + 1e-6 * np.eye(A.shape[1]), A.T @ yt[ok])
        return np.expm1(X @ coef).clip(min=0.0), coef


def _split(T: int) -> tuple[int, int]:
    return int(T * 0.6), int(T * 0.8)


def _evaluate_one(
    y: np.ndarray, ts: np.ndarray, step: float, h: float
) -> tuple[Evaluation, _Fitted | None]:
    T = len(y)
    train_end, sel_end = _split(T)
    m = max(1, int(round(h / step)))
    if sel_end - train_end < 2 or T - sel_end <= m:
        return Evaluation(
            h, step, h < step, {}, {}, "", note="too little history for this horizon"
        ), None
    f = _Fitted(y, ts, step, m, train_end)
    a_sel, a_test = f.target[train_end:sel_end], f.target[sel_end:]
    mape, cov, sel, bands = {}, {}, {}, {}
    for name, p in f.pred.items():
        sel[name] = _mape(a_sel, p[train_end:sel_end])
        err = np.log1p(a_sel) - np.log1p(p[train_end:sel_end])
        err = err[np.isfinite(err)]
        lo, hi = np.quantile(err, LEVELS).tolist() if len(err) else (np.nan, np.nan)
        bands[name] = (lo, hi)
        pt = p[sel_end:]
        mape[name] = _mape(a_test, pt)
        ok = np.isfinite(a_test) & np.isfinite(pt)
        la, lp = np.log1p(a_test[ok]), np.log1p(pt[ok])
        cov[name] = float(np.mean((la >= lp + lo) & (la <= lp + hi))) if ok.any() else float("nan")
    base = min(("seasonal_naive", "ses"), key=lambda n: sel[n] if np.isfinite(sel[n]) else np.inf)
    chosen = (
        "regression" if np.isfinite(sel["regression"]) and sel["regression"] < sel[base] else base
    )
    note = f.sn_label
    if h < step:
        note += f"; {h:g} s horizon scored as the next {step:g}-s bucket (flush interval)"
    return Evaluation(h, step, h < step, mape, cov, chosen, note, sel, bands, f.alpha, f.coef), f


def evaluate(s: pd.DataFrame, horizons: Iterable[float] = HORIZONS) -> list[Evaluation]:
    """Held-back MAPE and 90 % interval coverage per horizon and model (see the module doc)."""
    if s.empty:
        return []
    step = float(s.attrs.get("step_s") or _step(s.index.to_numpy(float)))
    y, ts = s.to_numpy(float), s.index.to_numpy(float)
    return [_evaluate_one(y, ts, step, h)[0] for h in horizons]


def forecast_table(
    lookups: pd.DataFrame, by: Sequence[str] = ("family",), horizons: Iterable[float] = HORIZONS
) -> pd.DataFrame:
    """One row per horizon × model: held-back MAPE and coverage, which model is kept."""
    rows = []
    for e in evaluate(series(lookups, by), horizons):
        for name in e.mape:
            rows.append(
                {
                    "horizon_s": e.horizon_s,
                    "model": name,
                    "mape": e.mape[name],
                    "coverage_90": e.coverage[name],
                    "kept": name == e.chosen,
                    "resolution_limited": e.resolution_limited,
                    "note": e.note,
                }
            )
        if not e.mape:
            rows.append(
                {
                    "horizon_s": e.horizon_s,
                    "model": "",
                    "mape": np.nan,
                    "coverage_90": np.nan,
                    "kept": False,
                    "resolution_limited": e.resolution_limited,
                    "note": e.note,
                }
            )
    return pd.DataFrame(
        rows,
        columns=["horizon_s", "model", "mape", "coverage_90", "kept", "resolution_limited", "note"],
    )


def forecast_now(
    lookups: pd.DataFrame,
    by: Sequence[str] = ("family",),
    horizons: Iterable[float] = HORIZONS,
    evaluations: list[Evaluation] | None = None,
) -> pd.DataFrame:
    """The kept model's forecast from every bucket: columns ts, group, horizon_s, actual, forecast,
    lo, hi (actual is the realised target, NaN for the newest buckets)."""
    s = series(lookups, by)
    if s.empty:
        return pd.DataFrame(columns=["ts", "group", "horizon_s", "actual", "forecast", "lo", "hi"])
    evs = evaluations if evaluations is not None else evaluate(s, horizons)
    step = s.attrs["step_s"]
    y, ts = s.to_numpy(float), s.index.to_numpy(float)
    frames = []
    for e in evs:
        if not e.chosen:
            continue
        m = max(1, int(round(e.horizon_s / step)))
        f = _Fitted(y, ts, step, m, _split(len(y))[0])
        p = f.pred[e.chosen]
        lo, hi = e.bands[e.chosen]
        frames.append(
            pd.DataFrame(
                {
                    "ts": np.repeat(ts, y.shape[1]),
                    "group": np.tile(s.columns.astype(str), len(ts)),
                    "horizon_s": e.horizon_s,
                    "actual": f.target.ravel(),
                    "forecast": p.ravel(),
                    "lo": np.expm1(np.log1p(p) + lo).clip(min=0).ravel(),
                    "hi": np.expm1(np.log1p(p) + hi).ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass
class Peak:
    """The next time the total request rate peaks, from the daily profile."""

    at: float  # Unix s
    rate: float  # requests/s (hourly mean around the peak)
    lo: float
    hi: float
    basis: str


def next_peak(
    lookups: pd.DataFrame, after: float | None = None, smooth_s: float = 3600.0
) -> Peak | None:
    """Time of day where the hour-smoothed total rate is highest over the recorded days, placed at
    its next occurrence after ``after`` (default: the end of the data); the interval is the 5–95 %
    range of that time of day's rate across the days seen, or of the hour around it when one day is
    recorded."""
    s = series(lookups, ("layer",))
    if s.empty:
        return None
    step = s.attrs["step_s"]
    tot = s.sum(axis=1)
    k = max(1, int(round(smooth_s / step)))
    sm = tot.rolling(k, center=True, min_periods=max(1, k // 2)).mean()
    tod = sm.index.to_numpy(float) % DAY
    prof = pd.Series(sm.to_numpy(), index=(tod // step) * step).groupby(level=0).mean()
    best = float(prof.idxmax())  # type: ignore[arg-type]  # a numeric index
    end = float(after if after is not None else s.index.max())
    at = (end // DAY) * DAY + best
    while at <= end:
        at += DAY
    near = tot[
        np.abs(((tot.index.to_numpy(float) - best + DAY / 2) % DAY) - DAY / 2) <= smooth_s / 2
    ]
    lo, hi = np.quantile(near, LEVELS) if len(near) else (np.nan, np.nan)
    days = (s.index.max() - s.index.min()) / DAY
    basis = (
        f"hour-smoothed total rate over {days:.1f} day(s) of history; interval: the bucket rates "
        f"within ±{smooth_s / 120:g} min of that time of day"
    )
    return Peak(at, float(prof.max()), float(lo), float(hi), basis)


@dataclass
class PredictionError:
    """The request-prediction error at one horizon: the kept model's held-back MAPE with a 95 %
    CI."""

    value: float  # NaN when it cannot be computed (``note`` says why)
    note: str
    ci: tuple[float, float] = (float("nan"), float("nan"))
    horizon_s: float = 15.0
    step_s: float = float("nan")
    resolution_limited: bool = False
    model: str = ""
    baselines: dict[str, float] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:  # ``value, note = prediction_error(...)``
        return iter((self.value, self.note))


def _block_ci(a: np.ndarray, p: np.ndarray, blocks: int = 10) -> tuple[float, float]:
    """95 % CI of the MAPE by batch means: the held-back rows cut into contiguous time blocks
    (errors of neighbouring buckets are correlated), a t interval over the blocks' MAPEs."""
    from scipy import stats

    cuts = np.array_split(np.arange(len(a)), min(blocks, len(a)))
    v = np.array([_mape(a[c], p[c]) for c in cuts if len(c)])
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return float(v.mean() - half), float(v.mean() + half)


def prediction_error(
    lookups: pd.DataFrame,
    horizon_s: float = 15.0,
    by: Sequence[str] = ("family",),
    max_step_s: float = 60.0,
) -> PredictionError:
    """The kept model's held-back MAPE at ``horizon_s`` (the score card's request-prediction
    dimension).

    Lookups flushed more coarsely than ``horizon_s`` (but at most every ``max_step_s``) are scored
    one bucket ahead and flagged ``resolution_limited``, as :func:`evaluate` does; coarser lookups
    (hourly rollups) or too short a history give NaN and the reason. Unpacks as ``value, note``."""
    s = series(lookups, by)
    if s.empty:
        return PredictionError(float("nan"), "no hit/miss lookups", horizon_s=horizon_s)
    step = float(s.attrs["step_s"])
    if step > max_step_s:
        return PredictionError(
            float("nan"),
            f"needs lookups per {max_step_s:g} s or finer; these are per {step:g} s",
            horizon_s=horizon_s,
            step_s=step,
        )
    y = s.to_numpy(float)
    ev, f = _evaluate_one(y, s.index.to_numpy(float), step, horizon_s)
    if f is None or not ev.chosen:
        return PredictionError(float("nan"), ev.note, horizon_s=horizon_s, step_s=step)
    sel_end = _split(len(y))[1]
    ci = _block_ci(f.target[sel_end:], f.pred[ev.chosen][sel_end:])
    width = (
        f"{horizon_s:g} s ahead"
        if not ev.resolution_limited
        else f"{horizon_s:g} s ahead, scored as the next {step:g}-s bucket (the flush interval; "
        f"flush every {horizon_s:g} s or faster to score it at its own width)"
    )
    note = (
        f"{ev.chosen} forecast per {' × '.join(by)}, {width}; held-back last 20 % "
        f"(baselines: seasonal-naive {ev.mape['seasonal_naive']:.3f}, SES {ev.mape['ses']:.3f})"
    )
    return PredictionError(
        ev.mape[ev.chosen],
        note,
        ci,
        horizon_s,
        step,
        ev.resolution_limited,
        ev.chosen,
        {k: ev.mape[k] for k in ("seasonal_naive", "ses")},
    )
