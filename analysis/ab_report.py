"""The A/B report: metrics from per-unit records, SRM first, a verdict, and
the same content as HTML (self-contained), Markdown, or a dashboard page.

The metrics, their kinds and which way is better come from one list,
:data:`analysis.ab_metrics.METRICS` (treatment vs control, unit = session):

==============================  =========  ==========================================
metric                          kind       definition
==============================  =========  ==========================================
conversion (units)              proportion units with at least one conversion
conversions per request         ratio      Σ conversions / Σ requests
value per unit                  mean       business value per unit
hit rate (<layer>)              ratio      Σ hits / Σ lookups in that cache layer
GPU-s per request               ratio      Σ GPU-seconds / Σ requests
latency per request (s)         ratio      Σ latency / Σ requests
TTFT per request (s)            ratio      Σ TTFT / Σ requests
SLA met per request             ratio      Σ SLA-met requests / Σ requests
P95 / P99 latency (s)           quantile   from per-unit latency histograms (outer CI)
==============================  =========  ==========================================

A/B/n: with more than one treatment arm every arm is compared with the
control (one row per metric and arm) and the sample-ratio check covers all
arms. The primary metric's p-values are Holm-adjusted over the arms (tested
as is with one arm); every other metric's over all its rows and arms (Holm
and BH). Without unit records (a Prometheus-only deployment),
:func:`build_from_series` compares per-variant time-bucket means instead,
with a warning.

Example::

    rep = build_report(store.units("warmup-strategy"), experiment="warmup-strategy")
    Path("ab.html").write_text(render_html(rep))
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from warmscope.model.ab_metrics import (
    BUCKET_S,
    DEFAULT_PRIMARY,
    METRICS,
    NB,
    Metric,
    bucket_of,
    cross_column,
    find,
    pos_column,
)
from warmscope.model.schema import DURATION_BUCKETS

from .ab import (
    SRM,
    Mean,
    Power,
    Proportion,
    Quantile,
    Ratio,
    Result,
    Stat,
    adjust,
    batch_means,
    compare,
    power,
    srm,
)
from .buckets import bucket_start
from .hitrate import hit_table

if TYPE_CHECKING:
    from warmscope.sources import Source

__all__ = [
    "ABReport",
    "build_report",
    "build_report_from_moments",
    "moment_stats",
    "report_for",
    "build_from_series",
    "render_markdown",
    "render_html",
    "metric_stats",
    "better",
    "metric_rows",
    "HEADERS",
    "fmt_p",
    "plain_number",
    "P_HELP",
    "p_reading",
    "p_classes",
    "headline",
    "arm_strategies",
    "arm_label",
    "DEFAULT_PRIMARY",
]

_H = [f"h{i}" for i in range(len(DURATION_BUCKETS) + 1)]
Arms = str | Sequence[str] | None


@dataclass
class ABReport:
    experiment: str
    control: str
    treatment: str  # the first treatment arm (see ``treatments``)
    source: str
    units: dict[str, int]
    srm_units: SRM | None
    srm_requests: SRM | None
    results: list[Result]
    primary: str
    verdict: str
    power: Power | None
    days_observed: float
    effect_over_time: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    treatments: list[str] = field(
        default_factory=list
    )  # every treatment arm, each compared with the control
    labels: dict[str, str] = field(default_factory=dict)  # arm -> what it is (strategy)
    # The primary metric between treatment arms, tested as each arm is against the control:
    # (x, y) -> y against x (y − x), for every ordered pair of treatment arms.
    between: dict[tuple[str, str], Result] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.treatments:
            self.treatments = [self.treatment]

    @property
    def multi_arm(self) -> bool:
        return len(self.treatments) > 1

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.results])


# ----------------------------------------------------------------- statistics per arm
def _names(m: Metric, layers: Sequence[str]) -> list[tuple[str, str | None]]:
    return [(m.named(ly), ly) for ly in layers] if m.per_layer else [(m.name, None)]


def metric_stats(
    u: pd.DataFrame, only: str | None = None, metrics: Sequence[Metric] = METRICS
) -> dict[str, Stat]:
    """Sufficient statistics of every metric (or just ``only``) for one arm's unit rows."""
    req = u["requests"].to_numpy(float) if "requests" in u.columns else np.zeros(len(u))
    layers = sorted(c[len("lookups_") :] for c in u.columns if c.startswith("lookups_"))

    def hist() -> np.ndarray:
        return (
            u[_H].to_numpy(float)
            if all(h in u.columns for h in _H)
            else np.zeros((len(u), len(_H)))
        )

    def col(f: str) -> np.ndarray:
        return req if f == "requests" else u[f].to_numpy(float)

    def make(m: Metric, layer: str | None) -> Stat:
        if m.per_layer:
            return Ratio.from_units(u[f"hits_{layer}"], u[f"lookups_{layer}"])
        if m.kind == "proportion":
            return Proportion.from_units(col(m.numerator))
        if m.kind == "mean":
            return Mean.from_units(col(m.numerator))
        if m.kind == "ratio":
            return Ratio.from_units(
                col(m.numerator), col(cast(str, m.denominator))
            )  # a ratio declares one
        return Quantile.from_units(
            cast(float, m.q), DURATION_BUCKETS, hist()
        )  # a quantile declares its q

    return {
        name: make(m, ly)
        for m in metrics
        for name, ly in _names(m, layers)
        if only is None or name == only
    }


def moment_stats(
    m: pd.Series,
    layers: dict[str, pd.Series],
    only: str | None = None,
    metrics: Sequence[Metric] = METRICS,
) -> dict[str, Stat]:
    """Sufficient statistics of every metric (or just ``only``) from one arm's
    summed ``ab_moments`` row and ``ab_layer_moments`` rows by layer; equal to
    :func:`metric_stats` on that arm's unit rows."""
    n = int(round(m["n"]))

    def make(d: Metric, layer: str | None) -> Stat:
        if d.per_layer:
            lm = layers[cast(str, layer)]  # a per-layer metric is named with its layer
            return Ratio(
                n, lm["s_hits"], lm["s_lookups"], lm["q_hits"], lm["q_lookups"], lm["x_hits"]
            )
        if d.kind == "proportion":
            return Proportion(n, int(round(m[pos_column(d.numerator)])))
        if d.kind == "mean":
            return Mean(n, m[f"s_{d.numerator}"], m[f"q_{d.numerator}"])
        if d.kind == "ratio":
            a, b = d.numerator, cast(str, d.denominator)  # a ratio declares its denominator
            return Ratio(
                n, m[f"s_{a}"], m[f"s_{b}"], m[f"q_{a}"], m[f"q_{b}"], m[cross_column(a, b)]
            )
        arr: Callable[[str], np.ndarray] = lambda p: (  # noqa: E731
            np.array([m[f"{p}{i}"] for i in range(NB)], dtype=float)
        )
        return Quantile(
            cast(float, d.q),
            tuple(DURATION_BUCKETS),
            int(round(m["nh"])),
            arr("h"),
            float(m["nn"]),
            arr("cc"),
            arr("cd"),
            arr("dd"),
            arr("cn"),
            arr("dn"),
        )

    return {
        name: make(d, ly)
        for d in metrics
        for name, ly in _names(d, sorted(layers))
        if only is None or name == only
    }


# ----------------------------------------------------------------- verdict
def better(r: Result) -> bool | None:
    """True when the treatment is better on ``r``'s metric, False when worse, None when there is no
    difference or the metric's direction is not declared."""
    if not np.isfinite(r.abs_effect) or r.abs_effect == 0 or r.direction not in ("higher", "lower"):
        return None
    # a Python bool: the effect is a numpy float, and callers test ``better(r) is True``
    return bool(r.abs_effect < 0) if r.direction == "lower" else bool(r.abs_effect > 0)


def fmt_p(p: float) -> str:
    """A p-value as people read it: "< 0.001" below a thousandth, else three decimals."""
    if p is None or not np.isfinite(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def p_eq(p: float) -> str:
    """``p`` for "p = 0.012" / "p < 0.001" in a sentence."""
    t = fmt_p(p)
    return t if t.startswith("<") else f"= {t}"


def arm_strategies(lookups: pd.DataFrame, runs: pd.DataFrame, experiment: str) -> dict[str, str]:
    """What each arm of ``experiment`` is: the warm-up strategy of the replicas serving it (the
    runs' ``strategy`` on the replicas its lookups came from; ``none`` for an arm whose replicas
    ran no warm-up)."""
    if lookups is None or lookups.empty or "variant" not in lookups.columns:
        return {}
    lk = lookups[lookups["experiment"] == experiment][["variant", "replica"]].drop_duplicates()
    out: dict[str, str] = {}
    for variant, g in lk.groupby("variant"):
        r = runs[runs["replica"].isin(g["replica"])] if len(runs) else runs
        names = sorted(set(r["strategy"].astype(str))) if len(r) else []
        out[str(variant)] = " + ".join(names) or "none"
    return out


def arm_label(rep: ABReport, arm: str) -> str:
    """``arm`` with what it is: "B (static_topk)" (the arm's name alone without a label)."""
    what = rep.labels.get(arm, "")
    return f"{arm} ({what})" if what and what != arm else arm


def headline(rep: ABReport) -> str:
    """One sentence: which arm wins, on what, by how much, with what confidence — or why there is
    no winner. Arms carry their labels (:func:`arm_label`)."""
    if rep.error or (rep.srm_units is not None and rep.srm_units.flagged):
        return rep.verdict
    prims = [r for r in rep.results if r.primary and not r.error]
    if not prims:
        return rep.verdict
    ctrl = arm_label(rep, rep.control)
    sig = [r for r in prims if _p(r, rep.multi_arm) < 0.05 and better(r) is True]
    if not sig:
        worse = [r for r in prims if _p(r, rep.multi_arm) < 0.05 and better(r) is False]
        if worse:
            w = worse[0]
            return (
                f"No arm beats {ctrl} on {w.metric}; {arm_label(rep, w.arm or rep.treatment)} is "
                f"worse by {_rel(w)} (p {p_eq(_p(w, rep.multi_arm))})."
            )
        return (
            f"No arm beats {ctrl} on {prims[0].metric}: no significant difference at p < 0.05 "
            f"({'; '.join(f'{arm_label(rep, r.arm or rep.treatment)} {_rel(r)}' for r in prims)})."
        )
    sign = 1.0 if sig[0].direction == "lower" else -1.0  # the largest improvement first

    def gain(r: Result) -> float:
        return sign * float(r.rel_effect) if np.isfinite(r.rel_effect) else 0.0

    best, *others = sorted(sig, key=gain)
    adj = "Holm-adjusted over the arms, " if rep.multi_arm else ""
    if not others:
        return (
            f"{_arm(rep, best)} wins on {best.metric}: {_rel(best)} against {ctrl} "
            f"({adj}p {p_eq(_p(best, rep.multi_arm))})."
        )
    # Another arm beats the control too: the best one wins only if it also beats that arm,
    # tested as each arm is against the control (Holm over these pairs); else they tie.
    pairs = [rep.between.get((o.arm, best.arm)) for o in others]  # best − other
    p_pairs = adjust([np.nan if x is None or x.error else x.p_value for x in pairs])[0]
    beaten = [
        x is not None and q < 0.05 and better(x) is True
        for x, q in zip(pairs, p_pairs, strict=True)
    ]
    holm = "Holm " if len(others) > 1 else ""

    def vs(o: Result, x: Result | None, q: float) -> str:
        if x is None or x.error:
            return f"{_arm(rep, best)} vs {_arm(rep, o)}: not tested"
        return (
            f"{_arm(rep, best)} vs {_arm(rep, o)}: {x.rel_effect:+.1%}, 95% CI "
            f"{x.rel_low:+.1%} to {x.rel_high:+.1%}, {holm}p {p_eq(q)}"
            if np.isfinite(x.rel_effect)
            else f"{_arm(rep, best)} vs {_arm(rep, o)}: {x.abs_effect:+.4g}, {holm}p {p_eq(q)}"
        )

    peers = list(zip(others, pairs, p_pairs, beaten, strict=True))
    won = [(o, x, q) for o, x, q, b in peers if b]
    level = [(o, x, q) for o, x, q, b in peers if not b]  # not told apart from the best
    if not level:
        text = (
            f"{_arm(rep, best)} wins on {best.metric}: {_rel(best)} against {ctrl} "
            f"({adj}p {p_eq(_p(best, rep.multi_arm))})"
        )
    else:
        order = {a: i for i, a in enumerate(rep.treatments)}
        # tied arms are named in arm order, not ranked
        tied = sorted([best] + [o for o, _, _ in level], key=lambda r: order.get(r.arm, 0))
        ps = [p_eq(_p(r, rep.multi_arm)) for r in tied]
        conf = f"p {ps[0]} each" if len(set(ps)) == 1 else _and([f"p {x}" for x in ps])
        text = (
            f"{_and([_arm(rep, r) for r in tied])} {'both' if len(tied) == 2 else 'all'} beat "
            f"{ctrl} on {best.metric}: "
            + "; ".join(f"{_arm(rep, r)} {_rel(r)}" for r in tied)
            + f" ({adj}{conf})"
        )
        said = "; ".join(vs(o, x, q) for o, x, q in level)
        text += (
            f"; they do not differ significantly from each other ({said})"
            if len(tied) == 2
            else f"; none differs significantly from {_arm(rep, best)} ({said})"
        )
    for o, x, q in won:
        text += f"; {_arm(rep, o)} also beats {ctrl}, by less ({_rel(o)}; {vs(o, x, q)})"
    return text + "."


def _arm(rep: ABReport, r: Result) -> str:
    return arm_label(rep, r.arm or rep.treatment)


def _and(words: Sequence[str]) -> str:
    """Words joined as a sentence reads them: "B", "B and C", "B, C and D"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _p(r: Result, multi: bool) -> float:
    """The p-value a row is judged by: the primary metric's raw p with one treatment arm, else
    Holm's."""
    return r.p_value if r.primary and not multi else r.p_holm


def _rel(r: Result) -> str:
    return (
        f"{r.rel_effect:+.1%} (95% CI {r.rel_low:+.1%} to {r.rel_high:+.1%})"
        if np.isfinite(r.rel_effect)
        else f"{r.abs_effect:+.4g}"
    )


def _verdict(rep: ABReport, prims: Sequence[Result]) -> str:
    if rep.error:
        return f"No verdict: {rep.error}"
    if rep.srm_units is not None and rep.srm_units.flagged:
        return (
            f"Do not trust this result: the unit split {rep.srm_units.observed} does not match the "
            f"plan (sample-ratio mismatch, p = {rep.srm_units.p_value:.2g}). Find the cause "
            "before reading metrics."
        )
    if not prims:
        return f"No verdict on {rep.primary}: metric not available."
    if not rep.multi_arm:
        prim = prims[0]
        if prim.error:
            return f"No verdict on {rep.primary}: {prim.error}."
        if prim.p_value < 0.05:
            word = {True: "beats", False: "is worse than", None: "differs from"}[better(prim)]
            seq = f" (always-valid p {p_eq(prim.seq_p)})" if np.isfinite(prim.seq_p) else ""
            return (
                f"{rep.treatment} {word} {rep.control} on {prim.metric}: {_rel(prim)}, "
                f"p {p_eq(prim.p_value)}{seq}."
            )
        mde = (
            f"; the smallest effect this test can detect now is {rep.power.mde_rel:.1%}"
            if rep.power and np.isfinite(rep.power.mde_rel)
            else ""
        )
        return (
            f"No significant difference on {prim.metric} ({_rel(prim)}, "
            f"p {p_eq(prim.p_value)}){mde}."
        )
    parts = []
    for r in prims:
        if r.error:
            parts.append(f"{r.arm}: not tested ({r.error})")
        elif r.p_holm < 0.05:
            word = {True: "beats", False: "is worse than", None: "differs from"}[better(r)]
            parts.append(f"{r.arm} {word} {rep.control}: {_rel(r)}, Holm p {p_eq(r.p_holm)}")
        else:
            parts.append(
                f"{r.arm}: no significant difference from {rep.control} ({_rel(r)}, Holm p "
                f"{p_eq(r.p_holm)})"
            )
    return (
        f"On {rep.primary}, each arm against {rep.control} (Holm over {len(prims)} arms): "
        + "; ".join(parts)
        + "."
    )


# ----------------------------------------------------------------- assembling
def _finish(
    rep: ABReport,
    stats: Mapping[str, dict[str, Stat]],
    primary: str,
    alpha: float,
    target_rel: float,
    has_pre: bool,
    cumulative: Callable[[str], Iterator[tuple[float, dict[str, Stat]]]],
    metrics: Sequence[Metric],
) -> ABReport:
    """Tests, adjustments, power, the over-time curve and the verdict, shared by
    the unit-row and the moments paths. ``stats``: arm -> metric -> sufficient
    statistics; ``cumulative(metric)`` yields (t, arm -> statistics) for units
    that arrived before t."""
    sa = stats[rep.control]
    if primary not in sa:
        rep.warnings.append(f"primary metric {primary!r} not found; using {DEFAULT_PRIMARY!r}")
        rep.primary = primary = DEFAULT_PRIMARY
    results = []
    for name in sa:
        d = find(name, metrics)
        for arm in rep.treatments:
            r = compare(name, sa[name], stats[arm][name], alpha, primary=(name == primary))
            results.append(replace(r, arm=arm, direction=d.direction if d else ""))
    for group in (
        [i for i, r in enumerate(results) if r.primary],
        [i for i, r in enumerate(results) if not r.primary],
    ):
        holm, bh = adjust([results[i].p_value for i in group])
        for j, i in enumerate(group):
            results[i] = replace(results[i], p_holm=float(holm[j]), p_bh=float(bh[j]))
    rep.results = [r for r in results if r.primary] + [
        r for r in results if not r.primary
    ]  # list order otherwise
    prims = [r for r in rep.results if r.primary]
    d = find(primary, metrics)
    rep.between = {
        (x, y): replace(
            compare(primary, stats[x][primary], stats[y][primary], alpha, primary=True),
            arm=y,
            direction=d.direction if d else "",
        )
        for x in rep.treatments
        for y in rep.treatments
        if x != y and primary in stats[x] and primary in stats[y]
    }
    rep.power = (
        power(sa[primary], stats[rep.treatment][primary], rep.days_observed, target_rel)
        if prims
        else None
    )
    rows = []
    for t, by_arm in cumulative(primary):
        a = by_arm[rep.control]
        for arm in rep.treatments:
            b = by_arm[arm]
            if a.n < 2 or b.n < 2:
                continue
            r = compare(primary, a, b, alpha)
            rows.append(
                (t, arm, r.rel_effect, r.rel_low, r.rel_high, r.seq_low, r.seq_high, r.abs_effect)
            )
    rep.effect_over_time = pd.DataFrame(
        rows, columns=["t", "arm", "effect", "low", "high", "seq_low", "seq_high", "abs_effect"]
    )
    if not has_pre:
        rep.warnings.append(
            "CUPED not applied: the unit records carry no pre-period values (pre_<metric> "
            "columns); analysis.ab.cuped adjusts a metric when they exist"
        )
    rep.verdict = _verdict(rep, prims)
    return rep


def _points(buckets: np.ndarray, points: int) -> np.ndarray:
    """Over-time points: ends of arrival buckets (``BUCKET_S``), at most ``points``, evenly
    picked."""
    ends = np.unique(buckets) + BUCKET_S
    if len(ends) == 0:
        return ends
    picked: np.ndarray = ends[
        np.unique(np.linspace(0, len(ends) - 1, min(points, len(ends))).round().astype(int))
    ]
    return picked


def _arms(control: str, treatment: Arms, present: Iterable[str]) -> list[str]:
    """The treatment arms: as given, else every arm present besides the control (in name order)."""
    if treatment is None or (not isinstance(treatment, str) and len(treatment) == 0):
        return [v for v in sorted(present) if v != control] or ["B"]
    return [treatment] if isinstance(treatment, str) else list(dict.fromkeys(treatment))


def _start(
    units: dict[str, int],
    experiment: str,
    control: str,
    arms: list[str],
    primary: str,
    planned: Sequence[float] | None,
    request_totals: dict[str, float] | None,
) -> ABReport:
    rep = ABReport(
        experiment,
        control,
        arms[0],
        "unit records",
        units,
        None,
        None,
        [],
        primary,
        "",
        None,
        0.0,
        treatments=arms,
    )
    order = [control] + arms
    plan = planned if planned is not None and len(planned) == len(order) else None
    rep.srm_units = srm([units.get(v, 0) for v in order], plan, what="units")
    if request_totals:
        rep.srm_requests = srm([request_totals.get(v, 0) for v in order], plan, what="requests")
    return rep


def _empty(
    experiment: str, control: str, arms: list[str], primary: str, units: dict[str, int]
) -> ABReport:
    rep = ABReport(
        experiment,
        control,
        arms[0],
        "unit records",
        units,
        None,
        None,
        [],
        primary,
        "",
        None,
        0.0,
        treatments=arms,
    )
    rep.error = f"no unit records for experiment {experiment!r}; is the experiment name right?"
    rep.verdict = _verdict(rep, [])
    return rep


def _request_totals(requests: pd.DataFrame | None, experiment: str) -> dict[str, float] | None:
    if requests is None or not len(requests):
        return None
    return cast(
        dict[str, float],
        requests[requests["experiment"] == experiment]
        .groupby("variant")["requests"]
        .sum()
        .to_dict(),
    )


def build_report(
    units: pd.DataFrame,
    experiment: str,
    control: str = "A",
    treatment: Arms = "B",
    primary: str = DEFAULT_PRIMARY,
    planned: Sequence[float] | None = None,
    requests: pd.DataFrame | None = None,
    alpha: float = 0.05,
    target_rel: float = 0.02,
    over_time_points: int = 12,
    metrics: Sequence[Metric] = METRICS,
) -> ABReport:
    """Everything the report shows, from ``EmbeddedStore.units(experiment)`` rows
    (one per unit). ``treatment``: one arm, several (A/B/n), or None for every
    arm besides the control. ``planned``: the planned shares of control and
    treatments in that order (default equal). :func:`build_report_from_moments`
    gives the same report from the store's A/B moments without reading unit rows."""
    u = units[units["experiment"] == experiment] if len(units) else units
    arms = _arms(control, treatment, u["variant"].unique() if len(u) else [])
    counts = {v: int((u["variant"] == v).sum()) for v in [control] + arms} if len(u) else {}
    if u.empty:
        return _empty(experiment, control, arms, primary, counts)
    rep = _start(
        counts, experiment, control, arms, primary, planned, _request_totals(requests, experiment)
    )
    rep.days_observed = max((u["last_ts"].max() - u["first_ts"].min()) / 86400.0, 1e-9)
    # Each arm sorted once; a point is a prefix of each (a view, no copy).
    parts = {v: u[u["variant"] == v].sort_values("first_ts") for v in [control] + arms}
    ts = {v: x["first_ts"].to_numpy() for v, x in parts.items()}
    pts = _points(bucket_of(u["first_ts"].to_numpy()), over_time_points)

    def cumulative(metric: str) -> Iterator[tuple[float, dict[str, Stat]]]:
        for t in pts:
            yield (
                t,
                {
                    v: metric_stats(
                        x.iloc[: int(np.searchsorted(ts[v], t, side="left"))], metric, metrics
                    )[metric]
                    for v, x in parts.items()
                },
            )

    return _finish(
        rep,
        {v: metric_stats(x, metrics=metrics) for v, x in parts.items()},
        primary,
        alpha,
        target_rel,
        any(c.startswith("pre_") for c in u.columns),
        cumulative,
        metrics,
    )


def build_report_from_moments(
    moments: pd.DataFrame,
    layer_moments: pd.DataFrame,
    experiment: str,
    control: str = "A",
    treatment: Arms = "B",
    primary: str = DEFAULT_PRIMARY,
    planned: Sequence[float] | None = None,
    request_totals: dict[str, float] | None = None,
    alpha: float = 0.05,
    target_rel: float = 0.02,
    over_time_points: int = 12,
    metrics: Sequence[Metric] = METRICS,
) -> ABReport:
    """The report from ``EmbeddedStore.moments(experiment)``: milliseconds for
    any number of units. ``request_totals``: requests per variant from the
    request metrics, for the request-level sample-ratio check."""
    mm = moments
    arms = _arms(control, treatment, mm["variant"].unique() if len(mm) else [])
    counts = (
        {v: int(round(mm.loc[mm["variant"] == v, "n"].sum())) for v in [control] + arms}
        if len(mm)
        else {}
    )
    if not len(mm) or not sum(counts.values()):
        return _empty(experiment, control, arms, primary, counts)
    rep = _start(counts, experiment, control, arms, primary, planned, request_totals)
    rep.days_observed = max((mm["max_last"].max() - mm["min_first"].min()) / 86400.0, 1e-9)
    layers = sorted(layer_moments["layer"].unique()) if len(layer_moments) else []
    sums = [c for c in mm.columns if c not in ("variant", "bucket", "min_first", "max_last")]
    lsums = [c for c in layer_moments.columns if c not in ("variant", "bucket", "layer")]

    def arm(v: str, before: float = np.inf) -> tuple[pd.Series, dict[str, pd.Series]]:
        a = mm[(mm["variant"] == v) & (mm["bucket"] < before)][sums].sum()
        lm = (
            layer_moments[(layer_moments["variant"] == v) & (layer_moments["bucket"] < before)]
            if len(layer_moments)
            else layer_moments
        )
        zero = pd.Series(0.0, index=lsums)
        by = lm.groupby("layer")[lsums].sum() if len(lm) else None
        return a, {ly: (by.loc[ly] if by is not None and ly in by.index else zero) for ly in layers}

    def cumulative(metric: str) -> Iterator[tuple[float, dict[str, Stat]]]:
        for t in _points(mm["bucket"].to_numpy(), over_time_points):
            yield (
                t,
                {v: moment_stats(*arm(v, t), metric, metrics)[metric] for v in [control] + arms},
            )

    return _finish(
        rep,
        {v: moment_stats(*arm(v), metrics=metrics) for v in [control] + arms},
        primary,
        alpha,
        target_rel,
        False,
        cumulative,
        metrics,
    )


def report_for(
    source: Source,
    experiment: str,
    control: str = "A",
    treatment: Arms = "B",
    primary: str = DEFAULT_PRIMARY,
    **kw: Any,
) -> ABReport:
    """The report from the best data a source has: the store's A/B moments,
    else unit rows (e.g. Redis), else metric series (batch means, two arms)."""
    if hasattr(source, "moments"):
        m, lm = source.moments(experiment)
        if len(m):
            return build_report_from_moments(
                m,
                lm,
                experiment,
                control,
                treatment,
                primary,
                request_totals=source.request_totals(experiment),
                **kw,
            )
    units = source.units(experiment)
    if len(units):
        return build_report(
            units,
            experiment,
            control,
            treatment,
            primary=primary,
            requests=source.frame("requests"),
            **kw,
        )
    first = treatment if isinstance(treatment, str) else (list(treatment or []) or ["B"])[0]
    return build_from_series(
        source.frame("lookups"), source.frame("requests"), experiment, control, first
    )


def build_from_series(
    lookups: pd.DataFrame,
    requests: pd.DataFrame,
    experiment: str,
    control: str = "A",
    treatment: str = "B",
    freq: float = 600.0,
    layer: str | None = None,
) -> ABReport:
    """Prometheus-only fallback: per-variant time-bucket means (batch means)."""
    rep = ABReport(
        experiment,
        control,
        treatment,
        "metric series (batch means)",
        {},
        None,
        None,
        [],
        "hit rate (batch means)",
        "",
        None,
        0.0,
    )
    rep.warnings.append(
        "no A/B unit records: compared per-variant time-bucket means from metric series; unit-"
        "level data (the collectors' A/B unit records) give a sounder answer"
    )
    lk = lookups[lookups["experiment"] == experiment] if len(lookups) else lookups
    if layer:
        lk = lk[lk["layer"] == layer]
    if lk.empty:
        rep.error = f"no metric series for experiment {experiment!r}"
        rep.verdict = _verdict(rep, [])
        return rep
    t = hit_table(lk, by=["variant"], freq=freq)
    res = [
        batch_means(
            t[t.variant == control]["hit_rate"].to_numpy(),
            t[t.variant == treatment]["hit_rate"].to_numpy(),
            "hit rate (batch means)",
        )
    ]
    rq = requests[requests["experiment"] == experiment] if len(requests) else requests
    if len(rq):
        b = bucket_start(rq["ts"], freq)
        g = rq.assign(bucket=b).groupby(["variant", "bucket"])[["requests", "gpu_s"]].sum()
        g["v"] = g["gpu_s"] / g["requests"]
        ca: np.ndarray | list[float] = (
            cast(pd.Series, g.loc[control, "v"]).to_numpy()
            if control in g.index.get_level_values(0)
            else []
        )
        cb: np.ndarray | list[float] = (
            cast(pd.Series, g.loc[treatment, "v"]).to_numpy()
            if treatment in g.index.get_level_values(0)
            else []
        )
        res.append(batch_means(ca, cb, "GPU-s per request (batch means)"))
        tot = rq.groupby("variant")["requests"].sum()
        rep.srm_requests = srm([tot.get(control, 0), tot.get(treatment, 0)], what="requests")
    hit = find("hit rate (any)")
    gpu = find("GPU-s per request")
    res = [
        replace(r, direction=d.direction if d else "", arm=treatment)
        for r, d in zip(res, (hit, gpu), strict=False)
    ]
    rep.results = [replace(res[0], primary=True)] + res[1:]
    rep.verdict = _verdict(rep, rep.results[:1])
    return rep


# ---------------------------------------------------------------- render
def plain_number(x: float, pct: bool = False) -> str:
    """A report cell: three significant figures in plain notation (``0.649``, ``8.36``, ``12,346``;
    a value under 0.001 with two: ``0.000025``, never ``2.512e-05``); a relative effect as a
    signed percentage, a tiny one with its significant figures (``+0.0025%``, never
    ``-0.00%``)."""
    if x is None or not np.isfinite(x):
        return "–"
    if pct:
        v = 100 * x
        if v == 0 or abs(v) >= 0.01:
            return f"{x:+.2%}"
        digits = np.format_float_positional(abs(v), precision=2, unique=False, fractional=False)
        return f"{'+' if v > 0 else '-'}{digits.rstrip('.')}%"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    prec = 3 if abs(x) >= 1e-3 or x == 0 else 2
    return np.format_float_positional(x, precision=prec, unique=False, fractional=False, trim="-")


def _with_ci(x: float, lo: float, hi: float, pct: bool = False) -> str:
    return f"{plain_number(x, pct)} [{plain_number(lo, pct)}, {plain_number(hi, pct)}]"


def metric_rows(rep: ABReport) -> list[list[str]]:
    """One row per metric and treatment arm (in HEADERS order)."""
    out = []
    for r in rep.results:
        # With one arm the primary metric is tested as is: no adjusted p-value to show.
        p_adj = "–" if r.primary and not rep.multi_arm else fmt_p(r.p_holm)
        p_bh = "–" if r.primary and not rep.multi_arm else fmt_p(r.p_bh)
        ctrl = f"> {plain_number(r.control)}" if r.control_above else plain_number(r.control)
        trt = f"> {plain_number(r.treatment)}" if r.treatment_above else plain_number(r.treatment)
        out.append(
            [
                ("★ " if r.primary else "") + r.metric,
                f"{arm_label(rep, r.arm or rep.treatment)} vs {arm_label(rep, rep.control)}",
                r.kind,
                ctrl,
                trt,
                _with_ci(r.abs_effect, r.abs_low, r.abs_high),
                _with_ci(r.rel_effect, r.rel_low, r.rel_high, pct=True),
                fmt_p(r.p_value),
                fmt_p(r.rel_p_value),
                p_adj,
                p_bh,
                fmt_p(r.seq_p),
                r.error or r.warning or "",
            ]
        )
    return out


HEADERS = [
    "Metric",
    "Arm",
    "Kind",
    "Control",
    "Treatment",
    "Difference [95% CI]",
    "Relative [95% CI]",
    "p",
    "p (relative)",
    "p (Holm)",
    "p (BH)",
    "Always-valid p",
    "Note",
]


#: What each p-value column is for, said the same way by the dashboard's column help and the
#: HTML report's header tooltips.
P_HELP = {
    "p": "Unadjusted two-sided p of the difference. It decides win / lose only for the ★ primary "
    "metric when one treatment arm is compared; every other row is decided by p (Holm).",
    "p (relative)": "Unadjusted p of the relative difference (delta method), for reference: it "
    "decides nothing.",
    "p (Holm)": "Holm-adjusted p (family-wise error at most 5 %): the p that decides win / lose, "
    "the row's colour, for every row but a one-arm primary metric.",
    "p (BH)": "Benjamini–Hochberg adjusted p (false-discovery rate at most 5 %), for screening "
    "which metrics to look at next: it never decides win / lose. A BH p under 0.05 beside a Holm "
    "p over 0.05 is not a significant difference.",
    "Always-valid p": "Mixture-SPRT p, safe to read at any time while the experiment runs; it "
    "decides nothing here.",
}


def p_reading(marked: bool = True) -> str:
    """The legend under a metric table (``marked``: the deciding p is bold, p (BH) grey)."""
    bold, grey = (" in bold", ", in grey,") if marked else ("", "")
    return (
        f"Win / lose is decided by the p{bold}: p (Holm), or p for a one-arm primary metric, "
        f"below 0.05. p (BH){grey} controls the false-discovery rate instead: it is for "
        "screening and never decides (a BH p under 0.05 beside a Holm p over 0.05 is no "
        "significant difference)."
    )


def deciding_p(rep: ABReport, r: Result) -> str:
    """The column (of :data:`HEADERS`) whose p-value decides ``r``'s win / lose."""
    return "p" if r.primary and not rep.multi_arm else "p (Holm)"


def p_classes(rep: ABReport, results: Sequence[Result]) -> list[list[str]]:
    """Per row and column of :data:`HEADERS`: "decides" for the p that decides win / lose,
    "aside" for the BH p (shown, never deciding), "" elsewhere."""
    return [
        [
            "decides" if h == deciding_p(rep, r) else ("aside" if h == "p (BH)" else "")
            for h in HEADERS
        ]
        for r in results
    ]


def _title(rep: ABReport) -> str:
    arms = ", ".join(arm_label(rep, a) for a in rep.treatments)
    return f"A/B report: {rep.experiment} — {arms} vs {arm_label(rep, rep.control)} (control)"


def _footnote(rep: ABReport) -> str:
    if rep.multi_arm:
        return (
            f"★ primary metric: p (Holm) adjusts over the {len(rep.treatments)} arms compared with "
            "the control; every other metric is Holm- and BH-adjusted over all its rows and arms. "
            "Always-valid p: mixture SPRT, safe to read at any time (sequential)."
        )
    return (
        "★ primary metric (tested at α = 0.05 as is); the others are Holm- and BH-adjusted. "
        "Always-valid p: mixture SPRT, safe to read at any time (sequential)."
    )


def _srm_line(s: SRM | None) -> str:
    if s is None:
        return ""
    state = "MISMATCH" if s.flagged else "ok"
    return (
        f"SRM on {s.what}: {state} — observed {', '.join(f'{x:,.0f}' for x in s.observed)} for a "
        f"planned {' / '.join(f'{x:.0%}' for x in s.expected_share)} split, χ² = {s.chi2:.2f}, "
        f"p = {s.p_value:.3g} (a mismatch is p < {s.threshold:g})"
    )


def render_markdown(rep: ABReport) -> str:
    lines = [f"# {_title(rep)}", "", f"**{rep.verdict}**", ""]
    for s in (rep.srm_units, rep.srm_requests):
        if s is not None:
            lines.append(f"- {_srm_line(s)}")
    lines.append(
        f"- Source: {rep.source}; units: "
        + ", ".join(f"{k} {v:,}" for k, v in rep.units.items())
        + f"; {rep.days_observed:.2f} days observed"
    )
    if rep.power is not None and np.isfinite(rep.power.mde_rel):
        lines.append(f"- {rep.power.note} (primary metric: {rep.primary})")
    for w in rep.warnings:
        lines.append(f"- ⚠ {w}")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in metric_rows(rep):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    lines += ["", _footnote(rep), "", p_reading(marked=False), ""]
    return "\n".join(lines)


def effect_figure(rep: ABReport) -> Any:  # a plotly Figure (plotly ships no type information)
    import plotly.graph_objects as go

    d = rep.effect_over_time
    fig = go.Figure()
    palette = ("31,119,180", "255,127,14", "44,160,44", "214,39,40", "148,103,189")
    for i, arm in enumerate(d["arm"].unique() if len(d) else []):
        x = d[d["arm"] == arm]
        c = palette[i % len(palette)]
        t = pd.to_datetime(x["t"], unit="s")
        # the band's edges as lines of no width in the arm's colour: without a mode and a colour
        # plotly drew them as dots of the next default colour (a teal dot on an orange band)
        edge = dict(width=0, color=f"rgb({c})")
        fig.add_trace(
            go.Scatter(
                x=t, y=x["high"], mode="lines", line=edge, showlegend=False, hoverinfo="skip"
            )
        )
        fig.add_trace(
            go.Scatter(
                x=t,
                y=x["low"],
                mode="lines",
                fill="tonexty",
                line=edge,
                name=f"{arm}: 95% CI",
                fillcolor=f"rgba({c},0.2)",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=t, y=x["effect"], name=f"{arm} vs {rep.control}", line=dict(color=f"rgb({c})")
            )
        )
    if len(d):
        fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=f"{rep.primary}: cumulative relative effect ({', '.join(rep.treatments)} vs "
        f"{rep.control})",
        yaxis_tickformat="+.1%",
        height=360,
        margin=dict(l=40, r=20, t=50, b=40),
    )
    return fig


def guardrail_split(rep: ABReport) -> tuple[list[int], list[int]]:
    """Indices of ``rep.results`` that are main metrics and that are guardrails (declared
    ``guardrail`` in ``model.ab_metrics``, the primary metric apart)."""
    from warmscope.model.ab_metrics import find

    guard = [bool((d := find(r.metric)) and d.guardrail) and not r.primary for r in rep.results]
    return [i for i, g in enumerate(guard) if not g], [i for i, g in enumerate(guard) if g]


def guardrail_statement(rep: ABReport) -> str:
    """One sentence on the guardrails: breached (named) or held."""
    _, gi = guardrail_split(rep)
    if not gi:
        return "No guardrail metric in this report."
    bad = [
        rep.results[i]
        for i in gi
        if _p(rep.results[i], rep.multi_arm) < 0.05 and better(rep.results[i]) is False
    ]
    if bad:
        named = ", ".join(f"{r.metric} ({arm_label(rep, r.arm or rep.treatment)})" for r in bad)
        return f"Guardrail breached: {named} significantly worse than the control."
    return (
        "No guardrail (tail latency, GPU cost, SLA) is significantly worse in any treatment arm "
        "than the control."
    )


def _html_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    help: Mapping[str, str] | None = None,
    classes: Sequence[Sequence[str]] | None = None,
) -> str:
    """A table; ``help``: a header's tooltip; ``classes``: each cell's class, row by row."""
    e = html.escape

    def th(h: str) -> str:
        tip = (help or {}).get(h)
        return f'<th title="{e(tip)}">{e(h)}</th>' if tip else f"<th>{e(h)}</th>"

    def td(c: str, cls: str) -> str:
        return f'<td class="{cls}">{e(c)}</td>' if cls else f"<td>{e(c)}</td>"

    out = "<table><thead><tr>" + "".join(th(h) for h in headers) + "</tr></thead>"
    out += "<tbody>"
    for i, row in enumerate(rows):
        cls = classes[i] if classes is not None else [""] * len(row)
        out += "<tr>" + "".join(td(str(c), k) for c, k in zip(row, cls, strict=True)) + "</tr>"
    return out + "</tbody></table>"


def render_html(
    rep: ABReport,
    include_plotlyjs: bool | str = True,
    breakdown: pd.DataFrame | None = None,
) -> str:
    """A self-contained HTML page (plotly.js inlined unless told otherwise): the headline, SRM,
    the metrics, the guardrails with their statement, and ``breakdown`` (a table, e.g. the
    per-segment comparison the dashboard shows) when given."""
    e = html.escape
    srm_html = "".join(
        f'<div class="srm {"bad" if s.flagged else "ok"}">{e(_srm_line(s))}</div>'
        for s in (rep.srm_units, rep.srm_requests)
        if s is not None
    )
    rows = metric_rows(rep)
    mi, gi = guardrail_split(rep)
    # every p on one line ("< 0.001", not "<" above "0.001")
    cls = [
        [f"p {c}".strip() if h in P_HELP else c for c, h in zip(row, HEADERS, strict=True)]
        for row in p_classes(rep, rep.results)
    ]

    def metric_table(idx: list[int]) -> str:
        return _html_table(HEADERS, [rows[i] for i in idx], P_HELP, [cls[i] for i in idx])

    legend = f'<p class="legend">{e(p_reading())}</p>'
    table = "<h2>Metrics</h2>" + metric_table(mi) + legend
    table += f"<h2>Guardrails</h2><p><b>{e(guardrail_statement(rep))}</b></p>"
    if gi:
        table += metric_table(gi) + legend
    if breakdown is not None and len(breakdown):
        table += "<h2>Breakdown by segment</h2>" + _html_table(
            [str(c) for c in breakdown.columns], breakdown.astype(str).itertuples(index=False)
        )
    warn = "".join(f'<p class="warn">⚠ {e(w)}</p>' for w in rep.warnings)
    pw = ""
    if rep.power is not None and np.isfinite(rep.power.mde_rel):
        pw = f"<p>{e(rep.power.note)} (primary metric: {e(rep.primary)})</p>"
    fig = effect_figure(rep).to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    units = ", ".join(f"{e(k)} {v:,}" for k, v in rep.units.items())
    # A backslash at the end of a line inside the string joins it to the next (no newline written).
    return f"""<!doctype html><html><head><meta charset="utf-8">\
<title>A/B report: {e(rep.experiment)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px}}\
table{{border-collapse:collapse;
font-size:.9rem}}td,th{{border:1px solid #ddd;padding:4px 8px;text-align:right}}\
td:first-child,th:first-child
{{text-align:left}}.srm{{padding:.5rem 1rem;margin:.5rem 0;border-radius:4px}}\
.ok{{background:#e8f5e9}}
.bad{{background:#ffebee;font-weight:bold}}.verdict{{font-size:1.25rem;margin:1rem 0}}\
.warn{{color:#b26a00}}
.p{{white-space:nowrap}}.decides{{font-weight:bold}}.aside{{color:#6e7781}}\
th[title]{{text-decoration:underline dotted;cursor:help}}.legend{{font-size:.85rem;color:#444}}
</style></head><body><h1>{e(_title(rep))}</h1>
{srm_html}<p class="verdict"><b>{e(headline(rep))}</b></p><p>{e(rep.verdict)}</p>{warn}
<p>Source: {e(rep.source)}; units: {units}; {rep.days_observed:.2f} days observed.</p>{pw}
{table}<p><small>{e(_footnote(rep))} Ratio metrics by the delta method at the unit level; \
quantiles by Deng et
al.'s outer CI.</small></p>{fig}</body></html>"""
