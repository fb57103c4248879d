"""Cache drill-down: from the lookups frame to ranked root causes of a
hit-rate regression.

The measure is the *effective* hit rate: hits over all lookups, bypassed and
failed ones included, so a middleware path that skips the cache shows up as a
regression too. For an anomaly window and a baseline window (by default the
same length just before, or around an automatically found change point):

* a leaf is one combination of tenant, layer, key family, model, replica,
  variant and prompt-length bucket;
* its expected hits are its baseline rate × its lookups in the anomaly window;
  a leaf with fewer than ``min_baseline`` baseline lookups — or a key family
  that did not exist before — is shrunk toward its parent's rate (its key
  family's at the same prompt-length bucket, else its key family's, else
  tenant × layer's, else layer's) by ``min_baseline`` pseudo-lookups;
* without a forecast, :func:`regression_test` first checks that the window's
  hit rate differs from the baseline's beyond its minute-to-minute variation;
* :func:`analysis.rootcause.localize` ranks the causes.

Example::

    dd = drill_down(lookups)                       # change point found automatically
    dd.localization.causes[0].element              # {'tenant': 'globex', 'layer': 'response'}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .buckets import bucket_start
from .hitrate import time_slice
from .rootcause import Localization, localize

if TYPE_CHECKING:
    from warmscope.sources import Source

__all__ = [
    "RCA_DIMS",
    "MISS_DIMS",
    "FRAME_DIMS",
    "leaf_table",
    "miss_leaf_table",
    "change_point",
    "drill_down",
    "drill_down_misses",
    "drill_down_source",
    "regression_test",
    "DrillDown",
]

# The lookups' dimensions a change is localised over, and the hit-rate explorer drills by.
RCA_DIMS = ("tenant", "layer", "family", "model", "replica", "variant", "length_bucket")
# The misses frame (prefix-KV missed tokens by why they missed): the class is a dimension, so a
# regression localises to e.g. {tenant: acme, miss_class: evicted}.
MISS_DIMS = ("tenant", "engine", "family", "miss_class")
# The frames the drill-down offers, and their dimensions.
FRAME_DIMS = {"lookups": RCA_DIMS, "misses": MISS_DIMS}


def _leaf_counts(lk: pd.DataFrame, dims: list[str]) -> pd.DataFrame:
    hits = np.where(lk["result"].to_numpy() == "hit", lk["count"].to_numpy(float), 0.0)
    return (
        pd.DataFrame({"hits": hits, "lookups": lk["count"].to_numpy(float)}, index=lk.index)
        .groupby([lk[c] for c in dims], observed=True)
        .sum()
    )


def leaf_table(
    lookups: pd.DataFrame,
    anomaly: tuple[float, float],
    baseline: tuple[float, float],
    dims: Sequence[str] = RCA_DIMS,
    min_baseline: float = 20.0,
    forecast: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Leaves with observed hits/lookups in ``anomaly`` and expected hits from
    ``baseline`` — or, given ``forecast`` (a lookups frame of what was
    expected: a forecast, or a control replay), from it over the same window."""
    dims = [d for d in dims if d in lookups.columns]
    cur = _leaf_counts(time_slice(lookups, *anomaly), dims)
    base_lk = time_slice(lookups, *baseline) if forecast is None else time_slice(forecast, *anomaly)
    base = _leaf_counts(base_lk, dims)
    # Outer join: a leaf that vanished (e.g. a key family replaced by new ones)
    # has no hits to lose, but its expected traffic belongs to its parents.
    t = cur.merge(base, left_index=True, right_index=True, how="outer", suffixes=("", "_base"))
    t = t.fillna(0.0).reset_index()
    # Parent rate for leaves without baseline: the key family at the same prompt
    # length (short prompts share less prefix), then the key family (across
    # tenants and replicas), then tenant × layer, then layer, then overall.
    prior = np.full(len(t), np.nan)
    for parent in (["family", "length_bucket"], ["family"], ["tenant", "layer"], ["layer"], []):
        parent = [p for p in parent if p in dims]
        if parent:
            pb = _leaf_counts(base_lk, parent)
            pr = (pb["hits"] / pb["lookups"].replace(0, np.nan)).rename("r")
            fill = t[parent].merge(pr.reset_index(), on=parent, how="left")["r"].to_numpy()
        else:
            tot = base_lk["count"].sum()
            fill = np.full(
                len(t),
                base_lk.loc[base_lk["result"] == "hit", "count"].sum() / tot if tot else np.nan,
            )
        prior = np.where(np.isfinite(prior), prior, fill)
    # A leaf with a thin baseline (fewer than min_baseline lookups) is shrunk
    # toward its parent's rate; a thick one keeps its own, zero included.
    prior = np.nan_to_num(prior, nan=0.0)
    hb, nb = t["hits_base"].to_numpy(), t["lookups_base"].to_numpy()
    rate = np.where(
        nb >= min_baseline,
        hb / np.maximum(nb, 1),
        (hb + min_baseline * prior) / (nb + min_baseline),
    )
    t["hits_exp"] = rate * t["lookups"]
    t["lookups_exp"] = t["lookups"]
    # Expected traffic volume, scaled to the anomaly window's length.
    scale = (
        1.0
        if forecast is not None
        else (anomaly[1] - anomaly[0]) / max(baseline[1] - baseline[0], 1e-9)
    )
    t["volume_exp"] = t["lookups_base"] * scale
    return t[dims + ["hits", "lookups", "hits_exp", "lookups_exp", "volume_exp"]]


def change_point(lookups: pd.DataFrame, freq: float = 60.0, min_segment: int = 10) -> float | None:
    """The most likely single change in the per-bucket effective hit rate
    (maximises the standardised mean difference between the two sides);
    returns its timestamp (start of the first changed bucket) or None."""
    if lookups.empty:
        return None
    hits = np.where(lookups["result"].to_numpy() == "hit", lookups["count"].to_numpy(float), 0.0)
    b = bucket_start(lookups["ts"].to_numpy(float), freq)
    g = pd.DataFrame({"b": b, "h": hits, "n": lookups["count"].to_numpy(float)}).groupby("b").sum()
    g = g[g["n"] > 0]
    r = (g["h"] / g["n"]).to_numpy()
    n = len(r)
    if n < 2 * min_segment:
        return None
    c = np.cumsum(r)
    k = np.arange(min_segment, n - min_segment + 1)
    left = c[k - 1] / k
    right = (c[-1] - c[k - 1]) / (n - k)
    stat = np.abs(left - right) * np.sqrt(k * (n - k) / n)
    i = int(np.argmax(stat))
    return float(g.index[k[i]])


def regression_test(
    lookups: pd.DataFrame,
    anomaly: tuple[float, float],
    baseline: tuple[float, float],
    freq: float = 60.0,
) -> dict[str, Any]:
    """Is the anomaly window's effective hit rate different from the baseline's,
    given the baseline's own variability? Welch's t on the per-bucket rates of
    the two windows (each ``freq`` seconds: bucket-to-bucket variation, not
    binomial noise, is what a flat but busy line shows). Returns observed and
    expected rate, their difference, t, degrees of freedom and the two-sided
    p-value; p is NaN when a window has fewer than two buckets."""
    from scipy import stats

    def rates(w: tuple[float, float]) -> tuple[np.ndarray, float, float]:
        sl = time_slice(lookups, *w)
        if sl.empty:
            return np.zeros(0), 0.0, 0.0
        hits = np.where(sl["result"].to_numpy() == "hit", sl["count"].to_numpy(float), 0.0)
        n = sl["count"].to_numpy(float)
        b = np.floor((sl["ts"].to_numpy(float) - w[0]) / freq).astype(np.int64)
        g = pd.DataFrame({"b": b, "h": hits, "n": n}).groupby("b").sum()
        g = g[g["n"] > 0]
        return (g["h"] / g["n"]).to_numpy(), float(hits.sum()), float(n.sum())

    ra, ha, na = rates(anomaly)
    rb, hb, nb = rates(baseline)
    out: dict[str, Any] = {
        "observed": ha / na if na else float("nan"),
        "expected": hb / nb if nb else float("nan"),
        "t": float("nan"),
        "df": float("nan"),
        "p": float("nan"),
        "buckets": (len(ra), len(rb)),
    }
    out["change"] = out["observed"] - out["expected"]
    if len(ra) < 2 or len(rb) < 2:
        return out
    va, vb = ra.var(ddof=1) / len(ra), rb.var(ddof=1) / len(rb)
    diff = ra.mean() - rb.mean()
    se = float(np.sqrt(va + vb))
    if se == 0:
        out.update(t=float("inf") if diff else 0.0, p=0.0 if diff else 1.0)
        return out
    df = (va + vb) ** 2 / (va**2 / (len(ra) - 1) + vb**2 / (len(rb) - 1)) if va + vb > 0 else 1.0
    t = float(diff / se)
    out.update(t=t, df=float(df), p=float(2 * stats.t.sf(abs(t), df)))
    return out


@dataclass
class DrillDown:
    localization: Localization
    anomaly: tuple[float, float]
    baseline: tuple[float, float]
    leaves: pd.DataFrame
    test: dict[str, Any] | None = (
        None  # regression_test() of the two windows (None with a forecast)
    )
    significant: bool = True  # False: "no significant regression in this range", no causes


def drill_down(
    lookups: pd.DataFrame,
    anomaly: tuple[float, float] | None = None,
    baseline: tuple[float, float] | None = None,
    dims: Sequence[str] = RCA_DIMS,
    max_depth: int | None = None,
    forecast: pd.DataFrame | None = None,
    alpha: float = 0.01,
) -> DrillDown:
    """Root causes of the change in ``anomaly`` vs ``baseline``. Without
    ``anomaly``, the change point splits the data: after it is the anomaly,
    the same length before it the baseline. The baseline never starts before
    the data. Without a ``forecast``, causes are sought only when
    :func:`regression_test` finds the windows' hit rates different at
    ``alpha``; otherwise the result says "no significant regression in this
    range" and lists no cause."""

    def empty(
        msg: str,
        anomaly: tuple[float, float] = (np.nan, np.nan),
        baseline: tuple[float, float] = (np.nan, np.nan),
    ) -> DrillDown:
        return DrillDown(
            Localization([], "", np.nan, np.nan, 0, 0, msg), anomaly, baseline, pd.DataFrame()
        )

    if lookups.empty:
        return empty("no lookups in the selected range")
    absent = _absent_note(dims, lookups.columns, "lookups")
    if not any(d in lookups.columns for d in dims):
        return empty(f"the lookups carry none of the dimensions asked for ({', '.join(dims)})")
    uts = np.unique(lookups["ts"].to_numpy(float))
    # A flush stamps the end of its interval: the data starts one interval before the first stamp.
    data_start = float(uts[0]) - (float(np.median(np.diff(uts))) if len(uts) > 1 else 0.0)
    if anomaly is None:
        cp = change_point(lookups)
        if cp is None:
            return empty("too little data to find a change point; pick the windows")
        end = float(lookups["ts"].max())
        anomaly = (cp, end)
    if baseline is None:
        length = anomaly[1] - anomaly[0]
        baseline = (anomaly[0] - length, anomaly[0])
    baseline = (max(baseline[0], data_start), baseline[1])
    if baseline[1] <= baseline[0] or time_slice(lookups, *baseline).empty:
        return empty(
            "no data before the window to compare with; choose a later window or a baseline",
            anomaly,
            baseline,
        )
    test = None
    if forecast is None:
        test = regression_test(lookups, anomaly, baseline)
        if not (test["p"] < alpha):
            loc = Localization([], "hits/lookups", test["observed"], test["expected"], 0, 0)
            loc.change = test["change"]
            p = (
                "too few minutes to test"
                if not np.isfinite(test["p"])
                else f"p = {test['p']:.2g}, not below the test's α = {alpha:g}"
            )
            loc.notes.append(
                f"no significant regression in this range: hit rate {test['observed']:.1%} vs "
                f"{test['expected']:.1%} in the baseline ({test['change'] * 100:+.2f} points, {p}, "
                "against the baseline's minute-to-minute variation)"
            )
            loc.notes += absent
            return DrillDown(loc, anomaly, baseline, pd.DataFrame(), test, significant=False)
    leaves = leaf_table(lookups, anomaly, baseline, dims, forecast=forecast)
    loc = localize(
        leaves,
        [d for d in dims if d in leaves.columns],
        v_num="hits",
        v_den="lookups",
        f_num="hits_exp",
        f_den="lookups_exp",
        max_depth=max_depth,
        v_vol="lookups",
        f_vol="volume_exp",
    )
    loc.notes += absent
    return DrillDown(loc, anomaly, baseline, leaves, test)


def _absent_note(dims: Sequence[str], columns: Iterable[str], frame: str) -> list[str]:
    """A note naming the dimensions asked for that the frame does not carry (a source that maps
    only some labels onto the frame): they were not searched."""
    have = set(columns)
    absent = [d for d in dims if d not in have]
    if not absent:
        return []
    return [
        f"not searched: {', '.join(absent)} (the source's {frame} carry no such "
        f"label{'s' if len(absent) > 1 else ''})"
    ]


def miss_leaf_table(
    misses: pd.DataFrame,
    anomaly: tuple[float, float],
    baseline: tuple[float, float],
    dims: Sequence[str] = MISS_DIMS,
) -> pd.DataFrame:
    """Leaves of the ``misses`` frame: missed tokens in ``anomaly`` (``tokens``) and the
    baseline's tokens scaled to the anomaly window's length (``tokens_exp``), per
    combination of ``dims`` (miss_class included)."""
    dims = [d for d in dims if d in misses.columns]
    cur = time_slice(misses, *anomaly).groupby(dims, observed=True)["tokens"].sum()
    base = time_slice(misses, *baseline).groupby(dims, observed=True)["tokens"].sum()
    scale = (anomaly[1] - anomaly[0]) / max(baseline[1] - baseline[0], 1e-9)
    t = pd.DataFrame({"tokens": cur, "tokens_exp": base * scale}).fillna(0.0).reset_index()
    return t[[*dims, "tokens", "tokens_exp"]]


def drill_down_misses(
    misses: pd.DataFrame,
    anomaly: tuple[float, float],
    baseline: tuple[float, float] | None = None,
    dims: Sequence[str] = MISS_DIMS,
    max_depth: int | None = None,
) -> DrillDown:
    """Root causes of a change in missed prefix-KV tokens (an additive measure) between
    ``anomaly`` and ``baseline`` (default: the same length just before), localised over
    ``dims`` — with ``miss_class`` among them, a cause reads e.g. "tenant acme, evicted"."""
    if baseline is None:
        baseline = (anomaly[0] - (anomaly[1] - anomaly[0]), anomaly[0])
    if misses.empty:
        empty = Localization([], "", np.nan, np.nan, 0, 0, "no missed-token classes in the range")
        return DrillDown(empty, anomaly, baseline, pd.DataFrame())
    leaves = miss_leaf_table(misses, anomaly, baseline, dims)
    loc = localize(
        leaves,
        [d for d in dims if d in leaves.columns],
        v="tokens",
        f="tokens_exp",
        max_depth=max_depth,
    )
    loc.notes += _absent_note(dims, misses.columns, "missed-token rows")
    return DrillDown(loc, anomaly, baseline, leaves)


def drill_down_source(
    source: Source,
    anomaly: tuple[float, float],
    baseline: tuple[float, float] | None = None,
    dims: Sequence[str] = RCA_DIMS,
    max_depth: int | None = None,
    alpha: float = 0.01,
    frame: str = "lookups",
) -> DrillDown:
    """:func:`drill_down` over any :class:`~warmscope.sources.Source`
    that holds ``lookups`` (ts, result, count and the dimension columns): the
    embedded store, Prometheus, or the composite the app builds. Only the two
    windows are read. ``frame="misses"`` localises missed prefix-KV tokens instead
    (:func:`drill_down_misses`, dimensions :data:`MISS_DIMS` unless given)."""
    if baseline is None:
        baseline = (anomaly[0] - (anomaly[1] - anomaly[0]), anomaly[0])
    lo, hi = min(anomaly[0], baseline[0]), max(anomaly[1], baseline[1])
    if frame == "misses":
        misses = source.frame("misses", lo - 1.0, hi + 1.0)
        mdims = MISS_DIMS if dims is RCA_DIMS else dims
        return drill_down_misses(misses, anomaly, baseline, mdims, max_depth=max_depth)
    lookups = source.frame("lookups", lo - 1.0, hi + 1.0)
    return drill_down(
        lookups,
        anomaly,
        baseline,
        dims,  # those the source lacks are named in a note, not searched
        max_depth=max_depth,
        alpha=alpha,
    )
