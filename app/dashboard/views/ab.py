"""A/B: the experiment list, then the report product teams read — SRM first, the verdict, metrics
coloured win / lose / neutral, guardrails, a breakdown by tenant and model, effect over time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import streamlit as st
from warmscope.analysis.ab_report import (
    DEFAULT_PRIMARY,
    HEADERS,
    P_HELP,
    better,
    effect_figure,
    fmt_p,
    guardrail_statement,
    headline,
    metric_rows,
    p_classes,
    p_reading,
    plain_number,
    render_html,
)
from warmscope.app.dashboard import cached, data, engine_view, fmt, state
from warmscope.model.ab_metrics import find, in_list_order

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler
    from warmscope.analysis.ab import Result
    from warmscope.analysis.ab_report import ABReport


COLOURS = {"win": "#d1f0d9", "lose": "#ffd8d3", "neutral": ""}
# the p that decides a row's outcome in bold, the BH p (never deciding) in grey, as in the HTML
CELL = {"decides": "font-weight: 700", "aside": "color: #6e7781", "": ""}
# the breakdown's p columns: Holm decides the colour, as in the metric tables
SEGMENT_P_HELP = {
    "p": "Unadjusted p of the segment's difference, for reference: it decides nothing.",
    "p (Holm)": "Holm-adjusted across every row of this table (family-wise error at most 5 %): "
    "the p that decides the row's colour, win / lose below 0.05.",
    "p (BH)": P_HELP["p (BH)"].replace("which metrics", "which segments"),
}


SEGMENT_CUTS = {
    "tenant": ["tenant"],
    "model": ["model"],
    "layer": ["layer"],
    "tenant × layer": ["tenant", "layer"],
    "prompt length": ["length_bucket"],
}
OUTCOME_MARKS = {"win": "#1a7f37", "lose": "#cf222e", "neutral": "#6e7781", "not tested": "#c0c0c0"}


def breakdown(
    exp: str, control: str, treatments: list[str], first: float | None, last: float | None
) -> pd.DataFrame | None:
    """Each segment's arms compared (one treatment with the control), as a table coloured by
    outcome and a forest plot per metric; returns the table shown (None when there is none)."""
    st.subheader("Breakdown by segment")
    if not st.toggle(
        "Compute the breakdown (reads the experiment's metric series)", key="ab-breakdown"
    ):
        st.caption(
            "Per tenant, model, layer, tenant × layer or prompt length: each arm's value, the "
            "difference with its 95% CI, and p-values corrected for the number of segments."
        )
        return None
    treatment, dim = _breakdown_choice(treatments)
    if first is None or last is None:
        st.info(f"No metric series for {exp} to break down.")
        return None
    # Hourly buckets (read from the hourly rollups) past six hours: enough buckets per arm, few
    # rows to read.
    freq = 600.0 if last - first <= 6 * 3600 else 3600.0
    bd = _segments(exp, control, treatment, SEGMENT_CUTS[dim], first, last, freq)
    if bd is None or bd.empty:
        if bd is not None:
            st.info(f"No metric series for {exp} to break down.")
        return None
    seg = bd[SEGMENT_CUTS[dim]].astype(str).agg(" · ".join, axis=1)
    shown = _segment_table(bd, seg, dim)
    _forest_plots(bd, seg)
    _breakdown_caption(dim, freq)
    return shown


def _breakdown_choice(treatments: list[str]) -> tuple[str, str]:
    """The treatment arm (asked when there are several) and the segment dimension (kept in the
    URL)."""
    treatment = (
        treatments[0]
        if len(treatments) == 1
        else st.selectbox(
            "Treatment arm",
            treatments,
            key="ab-bd-arm",
            help="The breakdown compares one treatment arm with the control.",
        )
    )
    state.init_from_url("ab-dim", "segment", cast=lambda v: v if v in SEGMENT_CUTS else "tenant")
    if st.session_state.get("ab-dim") not in SEGMENT_CUTS:
        st.session_state["ab-dim"] = "tenant"
    dim = st.radio("By", list(SEGMENT_CUTS), horizontal=True, key="ab-dim")
    state.url_set(segment=dim)
    return str(treatment), str(dim)


def _segments(
    exp: str,
    control: str,
    treatment: str,
    by: list[str],
    first: float,
    last: float,
    freq: float,
) -> pd.DataFrame | None:
    """``segment_table`` over the experiment's span; None (the error shown) when the source
    fails."""
    from warmscope.analysis.ab_segments import segment_table

    try:
        fr = data.frames(
            ["lookups", "requests", "histograms"],
            first - 60,
            last + 60,
            None if freq < 3600 else 3600.0,
        )
    except data.SourceError as e:
        st.error(str(e))
        return None
    with st.spinner("Comparing the arms per segment…"):
        return segment_table(
            fr["lookups"],
            fr["requests"],
            fr["histograms"],
            exp,
            control,
            treatment,
            by,
            freq=freq,
        )


def _segment_cell(v: float, pct: bool) -> str:
    return "–" if v != v else (f"{v:.1%}" if pct else plain_number(v))


def _segment_diff(v: float, lo: float, hi: float, pct: bool) -> str:
    """A difference and its CI: points for a hit rate, else signed plain numbers."""
    if v != v:
        return "–"

    def f(x: float) -> str:
        return f"{x * 100:+.1f} pts" if pct else ("+" if x > 0 else "") + plain_number(x)

    return f"{f(v)} [{f(lo)}, {f(hi)}]"


def _segment_table(bd: pd.DataFrame, seg: pd.Series, dim: str) -> pd.DataFrame:
    """The segments' table, each row coloured by its outcome; the Holm p (which decides the
    colour) bold, the BH p grey. Returns the table's cells."""
    pct = bd.metric == "hit rate"
    shown = pd.DataFrame(
        {
            "Outcome": bd.outcome,
            dim.capitalize(): seg,
            "Metric": bd.metric,
            "Control": [_segment_cell(v, p) for v, p in zip(bd.control, pct, strict=True)],
            "Treatment": [_segment_cell(v, p) for v, p in zip(bd.treatment, pct, strict=True)],
            "Difference [95% CI]": [
                _segment_diff(*x)
                for x in zip(bd.difference, bd.ci_low, bd.ci_high, pct, strict=True)
            ],
            "Relative": bd.relative.map(lambda v: "–" if v != v else f"{v:+.1%}"),
            "p": bd.p.map(fmt_p),
            "p (Holm)": bd.p_holm.map(fmt_p),
            "p (BH)": bd.p_bh.map(fmt_p),
            "Buckets (ctrl / trt)": [
                f"{a} / {b}" for a, b in zip(bd.buckets_control, bd.buckets_treatment, strict=True)
            ],
        }
    )
    colours = dict(COLOURS, **{"not tested": ""})
    # as in the metric tables: the Holm p decides the colour (bold), the BH p never does (grey)
    cell = {"p (Holm)": CELL["decides"], "p (BH)": CELL["aside"]}
    fmt.wrapped_table(
        shown.style.apply(
            lambda row: [
                "; ".join(
                    x
                    for x in (f"background-color: {colours[row['Outcome']]}", cell.get(str(c), ""))
                    if x
                )
                for c in shown.columns
            ],
            axis=1,
        ),
        help=SEGMENT_P_HELP,
    )
    return shown


def _forest_plots(bd: pd.DataFrame, seg: pd.Series) -> None:
    """A forest plot per metric: each segment's difference and its 95% CI, coloured by outcome."""
    import plotly.graph_objects as go

    metrics = list(dict.fromkeys(bd.metric))
    cols = st.columns(len(metrics))
    for col, m in zip(cols, metrics, strict=True):
        g, sg = bd[bd.metric == m], seg[bd.metric == m]
        scale = 100 if m == "hit rate" else 1
        fig = go.Figure(
            go.Scatter(
                x=g.difference * scale,
                y=sg,
                mode="markers",
                marker=dict(size=9, color=[OUTCOME_MARKS[o] for o in g.outcome]),
                error_x=dict(
                    type="data",
                    symmetric=False,
                    array=(g.ci_high - g.difference) * scale,
                    arrayminus=(g.difference - g.ci_low) * scale,
                    color="#6e7781",
                ),
                customdata=g.outcome,
                hovertemplate="%{y}: %{x:.3g} (%{customdata})<extra></extra>",
            )
        )
        fig.add_vline(x=0, line_width=1, line_color="black")
        fig.update_layout(
            title=f"{m}: treatment − control",
            height=120 + 26 * len(g),
            showlegend=False,
            xaxis_title="points" if m == "hit rate" else ("seconds" if "(s)" in m else "GPU-s"),
            yaxis=dict(autorange="reversed"),
            margin=dict(t=40, b=40, l=10, r=10),
        )
        col.plotly_chart(fig, width="stretch")


def _breakdown_caption(dim: str, freq: float) -> None:
    unit = "10-minute" if freq < 3600 else "hourly"
    st.caption(
        f"Per {dim}: each arm's mean of its {unit} bucket values (batch means, Welch's "
        "t-test); difference treatment − control with its 95% CI (bars; not adjusted). "
        f"p-values Holm- and BH-adjusted across every {dim} × metric row; green / red: treatment "
        "significantly better / worse at Holm p < 0.05. Hit rate leaves the model-weights layer "
        "out; GPU-s per request and TTFT have no layer or prompt length. Unit records carry no "
        "tenant or model, so this is coarser than the report above (buckets are not independent "
        "units)."
    )


def _experiment_list(el: pd.DataFrame) -> None:
    """Every experiment: its arms named, span, units, status and verdict (the first arm as
    control, every other arm a treatment, the default primary metric)."""
    try:
        newest = (data.time_bounds() or (0, 0))[1]
    except data.SourceError:
        newest = 0
    rows = []
    for key, g in el.groupby("experiment", sort=True):
        name = str(key)
        last = g["last"].max()
        arms_ = list(g.variant.astype(str))
        try:
            verdict = (
                headline(
                    dataclasses.replace(
                        data.ab_report(name, arms_[0], tuple(arms_[1:]), DEFAULT_PRIMARY),
                        labels=cached.arm_labels(name),
                    )
                )
                if len(arms_) > 1
                else "one arm only"
            )
        except data.SourceError as e:
            verdict = str(e)
        rows.append(
            {
                "Experiment": name,
                "Arms": " / ".join(f"{a} ({cached.arm_labels(name).get(a, '?')})" for a in arms_),
                "Started (UTC)": fmt.when(g["first"].min()),
                "Last unit (UTC)": fmt.when(last),
                "Units": int(g.units.sum()),
                "Status": "running" if newest and newest - last < 3600 else "stopped",
                "Verdict": verdict,
            }
        )
    st.subheader("Experiments")
    # the verdict is a sentence: wrapped, not cut
    fmt.wrapped_table(pd.DataFrame(rows).style.format({"Units": "{:,}"}))


def _arms(exps: list[str], el: pd.DataFrame) -> tuple[str, str, list[str], Any]:
    """The experiment, control and treatment pickers (kept in the URL): (experiment, control,
    treatments, the column for the primary-metric picker)."""
    state.init_from_url("ab-exp", "experiment")
    if st.session_state.get("ab-exp") not in exps:
        st.session_state["ab-exp"] = exps[0]
    arms = (
        list(el[el.experiment == st.session_state["ab-exp"]].variant.astype(str))
        if len(el)
        else ["A", "B"]
    )
    arms = arms or ["A", "B"]
    if st.session_state.get("ab-control") not in arms:  # another experiment's arm
        st.session_state["ab-control"] = arms[0]
    c1, c2, c3, c4 = st.columns([2, 1, 2, 2])
    exp = c1.selectbox("Experiment", exps, key="ab-exp")
    labels = cached.arm_labels(st.session_state["ab-exp"])

    def named(a: str) -> str:
        return f"{a} ({labels[a]})" if labels.get(a) else a

    state.init_from_url("ab-control", "control", cast=lambda v: v if v in arms else arms[0])
    control = c2.selectbox(
        "Control",
        arms,
        key="ab-control",
        format_func=named,
        help="The arm every other arm is compared with (also the HTML report's control).",
    )
    others = [a for a in arms if a != control]
    if [
        a for a in st.session_state.get("ab-arms", []) if a not in others
    ] or "ab-arms" not in st.session_state:
        st.session_state["ab-arms"] = others  # every other arm, compared with the control
    treatments = c3.multiselect(
        "Treatment arms",
        others,
        key="ab-arms",
        help="Each arm is compared with the control; with two or more, the primary metric's "
        "p-values are Holm-adjusted over the arms.",
    )
    if not treatments:
        st.warning("Pick at least one treatment arm to compare with the control.")
        st.stop()
    return str(exp), str(control), list(treatments), c4


def _report(exp: str, control: str, treatments: list[str], column: Any) -> ABReport:
    """The report for the primary metric picked in ``column``. The choices are the declared
    metrics (model.ab_metrics), per-layer ones for this experiment's layers: read from the
    report itself, which holds every declared metric."""
    state.init_from_url("ab-primary", "primary")
    wanted = st.session_state.get("ab-primary") or DEFAULT_PRIMARY
    try:
        with st.spinner("Computing the report…"):
            rep = data.ab_report(exp, control, tuple(treatments), wanted)
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    choices = in_list_order(r.metric for r in rep.results) or [DEFAULT_PRIMARY]
    st.session_state["ab-primary"] = (
        wanted
        if wanted in choices
        else (DEFAULT_PRIMARY if DEFAULT_PRIMARY in choices else choices[0])
    )
    primary = column.selectbox(
        "Primary metric",
        choices,
        key="ab-primary",
        help="The metric the verdict is about; which way is better comes from its definition.",
    )
    state.url_set(experiment=exp, primary=primary, control=control)
    if primary != wanted:
        rep = data.ab_report(exp, control, tuple(treatments), primary)
    if rep.error:
        st.error(rep.error)
        st.stop()
    return rep


def _srm(rep: ABReport) -> None:
    """The sample-ratio checks, first: a mismatch makes every figure below suspect."""
    for s in (rep.srm_units, rep.srm_requests):
        if s is not None:
            msg = (
                f"Sample-ratio check on {s.what}: observed "
                f"{', '.join(f'{x:,.0f}' for x in s.observed)} for a "
                f"{' / '.join(f'{x:.0%}' for x in s.expected_share)} plan (χ² = {s.chi2:.2f}, p = "
                f"{s.p_value:.3g}; a mismatch is p < {s.threshold:g})"
            )
            (st.error if s.flagged else st.success)(("MISMATCH — " if s.flagged else "OK — ") + msg)


def render() -> None:
    if engine_view.no_unit_records():  # Prometheus only: no unit records anywhere
        engine_view.ab_advice()
    try:
        exps = data.experiments()
    except data.SourceError as e:
        st.error(str(e))
        st.stop()
    if not exps:
        st.info(
            "No experiment has unit records yet. Set `experiment`, `variant` and `unit` in "
            "`collectors.request_context(...)` (the simulator does this for its A and B pools)."
        )
        st.stop()
    el = data.experiment_list()
    if len(el):
        _experiment_list(el)
    exp, control, treatments, column = _arms(exps, el)
    rep = _report(exp, control, treatments, column)
    g = el[el.experiment == exp] if len(el) else el
    span = (
        f"{fmt.when(g['first'].min())} → {fmt.when(g['last'].max())} UTC"
        if len(g)
        else "its whole run"
    )
    st.caption(
        f"The report covers the whole experiment ({span}), not the sidebar range: an A/B test is "
        "read over every unit it enrolled."
    )
    _srm(rep)
    rep = dataclasses.replace(rep, labels=cached.arm_labels(exp))
    st.markdown(f"### {headline(rep)}")
    st.caption(rep.verdict)
    for w in rep.warnings:
        st.warning(w)
    if rep.power is not None and rep.power.mde_rel == rep.power.mde_rel:
        st.caption(rep.power.note)
    _metric_tables(rep)
    # The breakdown by segment: unit records carry no tenant or model, so segments are compared
    # on the experiment's labelled metric series (batch means per time bucket), with the
    # difference's CI and Holm / BH across every row of the table.
    shown = breakdown(
        exp,
        control,
        treatments,
        g["first"].min() if len(g) else None,
        g["last"].max() if len(g) else None,
    )
    st.download_button(
        "Download the HTML report",
        render_html(rep, breakdown=shown),
        file_name=f"ab-{exp}.html",
        mime="text/html",
        help="The same report as this page (headline, SRM, metrics, guardrails, the breakdown when "
        "computed, effect over time) as one HTML file, with this page's control.",
    )


def _outcome(rep: ABReport, r: Result) -> str:
    p = r.p_value if r.primary and not rep.multi_arm else r.p_holm
    if not np.isfinite(p) or p >= 0.05:
        return "neutral"
    good = better(r)
    return "neutral" if good is None else ("win" if good else "lose")


def _table(rep: ABReport, results: list[Result], rows: list[list[str]]) -> pd.DataFrame:
    t = pd.DataFrame(rows, columns=HEADERS)
    t.insert(0, "Outcome", [_outcome(rep, r) for r in results])
    return t


def _styled(rep: ABReport, results: list[Result], t: pd.DataFrame) -> Styler:
    cells = [[""] + c for c in p_classes(rep, results)]  # "Outcome" first
    # a p-value on one line ("< 0.001", not "<" above "0.001")
    keep = ["white-space: nowrap" if c in P_HELP else "" for c in t.columns]

    def style(row: pd.Series) -> list[str]:
        bg = f"background-color: {COLOURS[row['Outcome']]}"
        return [
            "; ".join(x for x in (bg, CELL[c], k) if x)
            for c, k in zip(cells[int(str(row.name))], keep, strict=True)
        ]

    return t.style.apply(style, axis=1)


def _metric_tables(rep: ABReport) -> None:
    """The metrics and the guardrails, coloured win / lose / neutral, and the effect over time."""
    all_rows = metric_rows(rep)
    is_guard = [bool((d := find(r.metric)) and d.guardrail) and not r.primary for r in rep.results]
    main_res = [r for r, gd in zip(rep.results, is_guard, strict=True) if not gd]
    guard_res = [r for r, gd in zip(rep.results, is_guard, strict=True) if gd]
    st.subheader("Metrics")
    main_rows = [row for row, gd in zip(all_rows, is_guard, strict=False) if not gd]
    fmt.wrapped_table(_styled(rep, main_res, _table(rep, main_res, main_rows)), help=P_HELP)
    st.caption(
        (
            "★ primary metric, Holm-adjusted over the arms; "
            if rep.multi_arm
            else "★ primary metric, tested as is; "
        )
        + "the others carry Holm and BH adjusted p-values. One row per metric and treatment arm. "
        "Green: the arm is significantly better than the control, red: significantly worse, no "
        f"colour: no significant difference. {p_reading()} Always-valid p (mixture SPRT) is safe "
        "to watch continuously. Hover a p column's name for what it is."
    )
    st.subheader("Guardrails")
    if guard_res:
        gt = _table(
            rep, guard_res, [row for row, gd in zip(all_rows, is_guard, strict=False) if gd]
        )
        said = guardrail_statement(rep)
        (st.error if said.startswith("Guardrail breached") else st.success)(said)
        fmt.wrapped_table(_styled(rep, guard_res, gt), help=P_HELP)
    else:
        st.info("No guardrail metric in this report.")
    st.plotly_chart(effect_figure(rep), width="stretch")
