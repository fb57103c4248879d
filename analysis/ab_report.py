"""The A/B report: metrics from per-unit records, SRM first, a verdict, and
the same content as HTML (self-contained), Markdown, or a dashboard page.

Metrics (treatment vs control, unit = session):

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

One metric is primary (tested at α as is); the others get Holm and BH
adjustments. Without unit records (a Prometheus-only deployment),
:func:`build_from_series` compares per-variant time-bucket means instead,
with a warning.

Example::

    rep = build_report(store.units("warmup-strategy"), experiment="warmup-strategy")
    Path("ab.html").write_text(render_html(rep))
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from warmscope.collectors.ab_moments import BUCKET_S, NB, bucket_of
from warmscope.collectors.schema import DURATION_BUCKETS

from .ab import SRM, Mean, Power, Proportion, Quantile, Ratio, Result, adjust, batch_means, compare, power, srm
from .buckets import bucket_start
from .hitrate import hit_table

__all__ = ["ABReport", "build_report", "build_report_from_moments", "moment_stats", "report_for", "build_from_series", "render_markdown", "render_html", "metric_stats",
           "DEFAULT_PRIMARY"]

DEFAULT_PRIMARY = "latency per request (s)"
_H = [f"h{i}" for i in range(len(DURATION_BUCKETS) + 1)]


@dataclass
class ABReport:
    experiment: str
    control: str
    treatment: str
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

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.results])


def metric_stats(u: pd.DataFrame, only: str | None = None) -> dict[str, object]:
    """Sufficient statistics of every metric (or just ``only``) for one arm's unit rows."""
    req = u["requests"].to_numpy(float)
    hist = lambda: u[_H].to_numpy(float) if all(h in u.columns for h in _H) else \
        np.zeros((len(u), len(_H)))  # noqa: E731
    makers = {
        "conversion (units)": lambda: Proportion.from_units(u["conversions"].to_numpy(float)),
        "conversions per request": lambda: Ratio.from_units(u["conversions"], req),
        "value per unit": lambda: Mean.from_units(u["value"]),
    }
    for c in sorted(c for c in u.columns if c.startswith("lookups_")):
        layer = c[len("lookups_"):]
        makers[f"hit rate ({layer})"] = lambda layer=layer, c=c: Ratio.from_units(u[f"hits_{layer}"], u[c])
    makers.update({
        "GPU-s per request": lambda: Ratio.from_units(u["gpu_s"], req),
        "latency per request (s)": lambda: Ratio.from_units(u["latency_sum"], req),
        "TTFT per request (s)": lambda: Ratio.from_units(u["ttft_sum"], req),
        "SLA met per request": lambda: Ratio.from_units(u["sla_met"], req),
        "P95 latency (s)": lambda: Quantile.from_units(0.95, DURATION_BUCKETS, hist()),
        "P99 latency (s)": lambda: Quantile.from_units(0.99, DURATION_BUCKETS, hist()),
    })
    return {k: f() for k, f in makers.items() if only is None or k == only}


_LOWER_IS_BETTER = ("latency", "TTFT", "GPU-s", "P95", "P99")


def _better(r: Result) -> bool | None:
    if not np.isfinite(r.abs_effect) or r.abs_effect == 0:
        return None
    lower = any(k in r.metric for k in _LOWER_IS_BETTER)
    return (r.abs_effect < 0) if lower else (r.abs_effect > 0)


def _verdict(rep: ABReport, prim: Result | None) -> str:
    if rep.error:
        return f"No verdict: {rep.error}"
    if rep.srm_units is not None and rep.srm_units.flagged:
        return (f"Do not trust this result: the unit split {rep.srm_units.observed} does not match the plan "
                f"(sample-ratio mismatch, p = {rep.srm_units.p_value:.2g}). Find the cause before reading metrics.")
    if prim is None or prim.error:
        return f"No verdict on {rep.primary}: {prim.error if prim else 'metric not available'}."
    rel = f"{prim.rel_effect:+.1%} (95% CI {prim.rel_low:+.1%} to {prim.rel_high:+.1%})" \
        if np.isfinite(prim.rel_effect) else f"{prim.abs_effect:+.4g}"
    if prim.p_value < 0.05:
        good = _better(prim)
        word = "beats" if good else "is worse than"
        return (f"{rep.treatment} {word} {rep.control} on {prim.metric}: {rel}, p = {prim.p_value:.2g}"
                f"{' (always-valid p = %.2g)' % prim.seq_p if np.isfinite(prim.seq_p) else ''}.")
    mde = f"; the smallest effect this test can detect now is {rep.power.mde_rel:.1%}" \
        if rep.power and np.isfinite(rep.power.mde_rel) else ""
    return f"No significant difference on {prim.metric} ({rel}, p = {prim.p_value:.2g}){mde}."


def _finish(rep: ABReport, sa: dict, sb: dict, primary: str, alpha: float, target_rel: float, has_pre: bool,
            cumulative) -> ABReport:
    """Tests, adjustments, power, the over-time curve and the verdict, shared by
    the unit-row and the moments paths. ``cumulative()`` yields (t, stats_a,
    stats_b) for units that arrived before t."""
    if primary not in sa:
        rep.warnings.append(f"primary metric {primary!r} not found; using {DEFAULT_PRIMARY!r}")
        rep.primary = primary = DEFAULT_PRIMARY
    results = [compare(m, sa[m], sb[m], alpha, primary=(m == primary)) for m in sa]
    others = [i for i, r in enumerate(results) if not r.primary]
    holm, bh = adjust([results[i].p_value for i in others])
    for j, i in enumerate(others):
        results[i] = replace(results[i], p_holm=float(holm[j]), p_bh=float(bh[j]))
    rep.results = sorted(results, key=lambda r: (not r.primary, r.metric))
    prim = next((r for r in rep.results if r.primary), None)
    rep.power = power(sa[primary], sb[primary], rep.days_observed, target_rel) if prim else None
    rows = []
    for t, a, b in cumulative(primary):
        if a.n < 2 or b.n < 2:
            continue
        r = compare(primary, a, b, alpha)
        rows.append((t, r.rel_effect, r.rel_low, r.rel_high, r.seq_low, r.seq_high, r.abs_effect))
    rep.effect_over_time = pd.DataFrame(rows, columns=["t", "effect", "low", "high", "seq_low", "seq_high",
                                                       "abs_effect"])
    if not has_pre:
        rep.warnings.append("CUPED not applied: the unit records carry no pre-period values (pre_<metric> "
                            "columns); analysis.ab.cuped adjusts a metric when they exist")
    rep.verdict = _verdict(rep, prim)
    return rep


def _points(buckets: np.ndarray, points: int) -> np.ndarray:
    """Over-time points: ends of arrival buckets (``BUCKET_S``), at most ``points``, evenly picked."""
    ends = np.unique(buckets) + BUCKET_S
    if len(ends) == 0:
        return ends
    return ends[np.unique(np.linspace(0, len(ends) - 1, min(points, len(ends))).round().astype(int))]


def _start(units: dict[str, int], experiment: str, control: str, treatment: str, primary: str,
           planned: Sequence[float], request_totals: dict[str, float] | None) -> ABReport:
    rep = ABReport(experiment, control, treatment, "unit records", units, None, None, [], primary, "", None, 0.0)
    rep.srm_units = srm([units[control], units[treatment]], planned, what="units")
    if request_totals:
        rep.srm_requests = srm([request_totals.get(control, 0), request_totals.get(treatment, 0)], planned,
                               what="requests")
    return rep


def _empty(experiment: str, control: str, treatment: str, primary: str, units: dict) -> ABReport:
    rep = ABReport(experiment, control, treatment, "unit records", units, None, None, [], primary, "", None, 0.0)
    rep.error = f"no unit records for experiment {experiment!r}; is the experiment name right?"
    rep.verdict = _verdict(rep, None)
    return rep


def _request_totals(requests: pd.DataFrame | None, experiment: str) -> dict[str, float] | None:
    if requests is None or not len(requests):
        return None
    return requests[requests["experiment"] == experiment].groupby("variant")["requests"].sum().to_dict()


def build_report(units: pd.DataFrame, experiment: str, control: str = "A", treatment: str = "B",
                 primary: str = DEFAULT_PRIMARY, planned: Sequence[float] = (0.5, 0.5),
                 requests: pd.DataFrame | None = None, alpha: float = 0.05, target_rel: float = 0.02,
                 over_time_points: int = 12) -> ABReport:
    """Everything the report shows, from ``EmbeddedStore.units(experiment)`` rows
    (one per unit). :func:`build_report_from_moments` gives the same report
    from the store's A/B moments without reading unit rows."""
    u = units[units["experiment"] == experiment] if len(units) else units
    counts = {v: int((u["variant"] == v).sum()) for v in (control, treatment)} if len(u) else {}
    if u.empty:
        return _empty(experiment, control, treatment, primary, counts)
    rep = _start(counts, experiment, control, treatment, primary, planned, _request_totals(requests, experiment))
    a, b = u[u["variant"] == control], u[u["variant"] == treatment]
    rep.days_observed = max((u["last_ts"].max() - u["first_ts"].min()) / 86400.0, 1e-9)
    # Each arm sorted once; a point is a prefix of each (a view, no copy).
    arms = [x.sort_values("first_ts") for x in (a, b)]
    ts = [arm["first_ts"].to_numpy() for arm in arms]
    pts = _points(bucket_of(u["first_ts"].to_numpy()), over_time_points)

    def cumulative(metric):
        for t in pts:
            pa, pb = (arm.iloc[: int(np.searchsorted(x, t, side="left"))] for arm, x in zip(arms, ts))
            yield t, metric_stats(pa, only=metric)[metric], metric_stats(pb, only=metric)[metric]

    return _finish(rep, metric_stats(a), metric_stats(b), primary, alpha, target_rel,
                   any(c.startswith("pre_") for c in u.columns), cumulative)


def moment_stats(m: pd.Series, layers: dict[str, pd.Series], only: str | None = None) -> dict[str, object]:
    """Sufficient statistics of every metric (or just ``only``) from one arm's
    summed ``ab_moments`` row and ``ab_layer_moments`` rows by layer; equal to
    :func:`metric_stats` on that arm's unit rows."""
    n = int(round(m["n"]))

    def ratio(x: str) -> Ratio:
        return Ratio(n, m[f"s_{x}"], m["s_requests"], m[f"q_{x}"], m["q_requests"], m[f"x_{x}"])

    def quant(q: float) -> Quantile:
        k = range(NB)
        arr = lambda p: np.array([m[f"{p}{i}"] for i in k], dtype=float)  # noqa: E731
        return Quantile(q, tuple(DURATION_BUCKETS), int(round(m["nh"])), arr("h"), float(m["nn"]), arr("cc"),
                        arr("cd"), arr("dd"), arr("cn"), arr("dn"))

    makers = {
        "conversion (units)": lambda: Proportion(n, int(round(m["pos"]))),
        "conversions per request": lambda: ratio("conversions"),
        "value per unit": lambda: Mean(n, m["s_value"], m["q_value"]),
    }
    for layer in sorted(layers):
        lm = layers[layer]
        makers[f"hit rate ({layer})"] = lambda lm=lm: Ratio(n, lm["s_hits"], lm["s_lookups"], lm["q_hits"],
                                                            lm["q_lookups"], lm["x_hits"])
    makers.update({
        "GPU-s per request": lambda: ratio("gpu_s"),
        "latency per request (s)": lambda: ratio("latency_sum"),
        "TTFT per request (s)": lambda: ratio("ttft_sum"),
        "SLA met per request": lambda: ratio("sla_met"),
        "P95 latency (s)": lambda: quant(0.95),
        "P99 latency (s)": lambda: quant(0.99),
    })
    return {k: f() for k, f in makers.items() if only is None or k == only}


def build_report_from_moments(moments: pd.DataFrame, layer_moments: pd.DataFrame, experiment: str,
                              control: str = "A", treatment: str = "B", primary: str = DEFAULT_PRIMARY,
                              planned: Sequence[float] = (0.5, 0.5), request_totals: dict[str, float] | None = None,
                              alpha: float = 0.05, target_rel: float = 0.02, over_time_points: int = 12) -> ABReport:
    """The report from ``EmbeddedStore.moments(experiment)``: milliseconds for
    any number of units. ``request_totals``: requests per variant from the
    request metrics, for the request-level sample-ratio check."""
    mm = moments
    counts = {v: int(round(mm.loc[mm["variant"] == v, "n"].sum())) for v in (control, treatment)} if len(mm) \
        else {}
    if not len(mm) or not sum(counts.values()):
        return _empty(experiment, control, treatment, primary, counts)
    rep = _start(counts, experiment, control, treatment, primary, planned, request_totals)
    rep.days_observed = max((mm["max_last"].max() - mm["min_first"].min()) / 86400.0, 1e-9)
    layers = sorted(layer_moments["layer"].unique()) if len(layer_moments) else []
    sums = [c for c in mm.columns if c not in ("variant", "bucket", "min_first", "max_last")]
    lsums = [c for c in layer_moments.columns if c not in ("variant", "bucket", "layer")]

    def arm(v: str, before: float = np.inf):
        a = mm[(mm["variant"] == v) & (mm["bucket"] < before)][sums].sum()
        lm = layer_moments[(layer_moments["variant"] == v) & (layer_moments["bucket"] < before)] \
            if len(layer_moments) else layer_moments
        zero = pd.Series(0.0, index=lsums)
        by = lm.groupby("layer")[lsums].sum() if len(lm) else None
        return a, {ly: (by.loc[ly] if by is not None and ly in by.index else zero) for ly in layers}

    def cumulative(metric):
        for t in _points(mm["bucket"].to_numpy(), over_time_points):
            (ma, la), (mb, lb) = arm(control, t), arm(treatment, t)
            yield t, moment_stats(ma, la, metric)[metric], moment_stats(mb, lb, metric)[metric]

    (ma, la), (mb, lb) = arm(control), arm(treatment)
    return _finish(rep, moment_stats(ma, la), moment_stats(mb, lb), primary, alpha, target_rel, False, cumulative)


def report_for(source, experiment: str, control: str = "A", treatment: str = "B",
               primary: str = DEFAULT_PRIMARY, **kw) -> ABReport:
    """The report from the best data a source has: the store's A/B moments,
    else unit rows (e.g. Redis), else metric series (batch means)."""
    if hasattr(source, "moments"):
        m, lm = source.moments(experiment)
        if len(m):
            return build_report_from_moments(m, lm, experiment, control, treatment, primary,
                                             request_totals=source.request_totals(experiment), **kw)
    units = source.units(experiment)
    if len(units):
        return build_report(units, experiment, control, treatment, primary=primary,
                            requests=source.frame("requests"), **kw)
    return build_from_series(source.frame("lookups"), source.frame("requests"), experiment, control, treatment)


def build_from_series(lookups: pd.DataFrame, requests: pd.DataFrame, experiment: str, control: str = "A",
                      treatment: str = "B", freq: float = 600.0, layer: str | None = None) -> ABReport:
    """Prometheus-only fallback: per-variant time-bucket means (batch means)."""
    rep = ABReport(experiment, control, treatment, "metric series (batch means)", {}, None, None, [],
                   "hit rate (batch means)", "", None, 0.0)
    rep.warnings.append("no A/B unit records: compared per-variant time-bucket means from metric series; unit-"
                        "level data (the collectors' A/B unit records) give a sounder answer")
    lk = lookups[lookups["experiment"] == experiment] if len(lookups) else lookups
    if layer:
        lk = lk[lk["layer"] == layer]
    if lk.empty:
        rep.error = f"no metric series for experiment {experiment!r}"
        rep.verdict = _verdict(rep, None)
        return rep
    t = hit_table(lk, by=["variant"], freq=freq)
    res = [batch_means(t[t.variant == control]["hit_rate"].to_numpy(), t[t.variant == treatment]["hit_rate"]
                       .to_numpy(), "hit rate (batch means)")]
    rq = requests[requests["experiment"] == experiment] if len(requests) else requests
    if len(rq):
        b = bucket_start(rq["ts"], freq)
        g = rq.assign(bucket=b).groupby(["variant", "bucket"])[["requests", "gpu_s"]].sum()
        g["v"] = g["gpu_s"] / g["requests"]
        ca = g.loc[control, "v"].to_numpy() if control in g.index.get_level_values(0) else []
        cb = g.loc[treatment, "v"].to_numpy() if treatment in g.index.get_level_values(0) else []
        res.append(batch_means(ca, cb, "GPU-s per request (batch means)"))
        tot = rq.groupby("variant")["requests"].sum()
        rep.srm_requests = srm([tot.get(control, 0), tot.get(treatment, 0)], what="requests")
    rep.results = [replace(res[0], primary=True)] + res[1:]
    rep.verdict = _verdict(rep, rep.results[0])
    return rep


# ---------------------------------------------------------------- render
def _fmt(x: float, pct: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "–"
    return f"{x:+.2%}" if pct else (f"{x:.4g}")


def _rows(rep: ABReport) -> list[list[str]]:
    out = []
    for r in rep.results:
        p_adj = "–" if r.primary else _fmt(r.p_holm)
        ctrl = f"> {_fmt(r.control)}" if r.control_above else _fmt(r.control)
        trt = f"> {_fmt(r.treatment)}" if r.treatment_above else _fmt(r.treatment)
        out.append([
            ("★ " if r.primary else "") + r.metric, r.kind, ctrl, trt,
            f"{_fmt(r.abs_effect)} [{_fmt(r.abs_low)}, {_fmt(r.abs_high)}]",
            f"{_fmt(r.rel_effect, True)} [{_fmt(r.rel_low, True)}, {_fmt(r.rel_high, True)}]",
            _fmt(r.p_value), _fmt(r.rel_p_value), p_adj, _fmt(r.p_bh) if not r.primary else "–", _fmt(r.seq_p),
            r.error or r.warning or "",
        ])
    return out


HEADERS = ["metric", "kind", "control", "treatment", "difference [95% CI]", "relative [95% CI]", "p",
           "p (relative)", "p (Holm)", "p (BH)", "always-valid p", "note"]


def _srm_line(s: SRM | None) -> str:
    if s is None:
        return ""
    state = "MISMATCH" if s.flagged else "ok"
    return (f"SRM on {s.what}: {state} — observed {', '.join(f'{x:,.0f}' for x in s.observed)} for a planned "
            f"{' / '.join(f'{x:.0%}' for x in s.expected_share)} split, χ² = {s.chi2:.2f}, p = {s.p_value:.3g}")


def render_markdown(rep: ABReport) -> str:
    lines = [f"# A/B report: {rep.experiment} — {rep.treatment} vs {rep.control}", "",
             f"**{rep.verdict}**", ""]
    for s in (rep.srm_units, rep.srm_requests):
        if s is not None:
            lines.append(f"- {_srm_line(s)}")
    lines.append(f"- Source: {rep.source}; units: " + ", ".join(f"{k} {v:,}" for k, v in rep.units.items())
                 + f"; {rep.days_observed:.2f} days observed")
    if rep.power is not None and np.isfinite(rep.power.mde_rel):
        lines.append(f"- {rep.power.note} (primary metric: {rep.primary})")
    for w in rep.warnings:
        lines.append(f"- ⚠ {w}")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in _rows(rep):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    lines += ["", "★ primary metric (tested at α = 0.05 as is); the others are Holm- and BH-adjusted. "
              "Always-valid p: mixture SPRT, safe to read at any time (sequential).", ""]
    return "\n".join(lines)


def effect_figure(rep: ABReport):
    import plotly.graph_objects as go

    d = rep.effect_over_time
    fig = go.Figure()
    if len(d):
        t = pd.to_datetime(d["t"], unit="s")
        fig.add_trace(go.Scatter(x=t, y=d["high"], line=dict(width=0), showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=t, y=d["low"], fill="tonexty", line=dict(width=0), name="95% CI",
                                 fillcolor="rgba(31,119,180,0.2)"))
        fig.add_trace(go.Scatter(x=t, y=d["effect"], name="relative effect", line=dict(color="#1f77b4")))
        fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"{rep.primary}: cumulative relative effect ({rep.treatment} vs {rep.control})",
                      yaxis_tickformat="+.1%", height=360, margin=dict(l=40, r=20, t=50, b=40))
    return fig


def render_html(rep: ABReport, include_plotlyjs: bool | str = True) -> str:
    """A self-contained HTML page (plotly.js inlined unless told otherwise)."""
    e = html.escape
    srm_html = "".join(
        f'<div class="srm {"bad" if s.flagged else "ok"}">{e(_srm_line(s))}</div>'
        for s in (rep.srm_units, rep.srm_requests) if s is not None)
    table = "<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr></thead><tbody>"
    for row in _rows(rep):
        table += "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
    table += "</tbody></table>"
    warn = "".join(f'<p class="warn">⚠ {e(w)}</p>' for w in rep.warnings)
    pw = ""
    if rep.power is not None and np.isfinite(rep.power.mde_rel):
        pw = f"<p>{e(rep.power.note)} (primary metric: {e(rep.primary)})</p>"
    fig = effect_figure(rep).to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    units = ", ".join(f"{e(k)} {v:,}" for k, v in rep.units.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>A/B report: {e(rep.experiment)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px}}table{{border-collapse:collapse;
font-size:.9rem}}td,th{{border:1px solid #ddd;padding:4px 8px;text-align:right}}td:first-child,th:first-child
{{text-align:left}}.srm{{padding:.5rem 1rem;margin:.5rem 0;border-radius:4px}}.ok{{background:#e8f5e9}}
.bad{{background:#ffebee;font-weight:bold}}.verdict{{font-size:1.25rem;margin:1rem 0}}.warn{{color:#b26a00}}
</style></head><body><h1>A/B report: {e(rep.experiment)} — {e(rep.treatment)} vs {e(rep.control)}</h1>
{srm_html}<p class="verdict"><b>{e(rep.verdict)}</b></p>{warn}
<p>Source: {e(rep.source)}; units: {units}; {rep.days_observed:.2f} days observed.</p>{pw}
{table}<p><small>★ primary metric (tested at α = 0.05 as is); others Holm- and BH-adjusted. Always-valid p:
mixture SPRT, safe to read at any time (sequential). Ratio metrics by the delta method at the unit level;
quantiles by Deng et al.'s outer CI.</small></p>{fig}</body></html>"""

