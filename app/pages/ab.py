"""A/B: the report product teams read — SRM first, the verdict, metrics, effect over time."""

from __future__ import annotations

import streamlit as st

from warmscope.analysis.ab_report import DEFAULT_PRIMARY, effect_figure, render_html
from warmscope.app import data, engine_view

st.title("A/B report")
if engine_view.no_unit_records():  # Prometheus only: no unit records anywhere
    engine_view.ab_advice()
try:
    exps = data.experiments()
except data.SourceError as e:
    st.error(str(e))
    st.stop()
if not exps:
    st.info("No experiment has unit records yet. Set `experiment`, `variant` and `unit` in "
            "`collectors.request_context(...)` (the simulator does this for its A and B pools).")
    st.stop()
c1, c2, c3 = st.columns(3)
exp = c1.selectbox("Experiment", exps, key="ab-exp")
control = c2.text_input("Control variant", "A", key="ab-control")
treatment = c3.text_input("Treatment variant", "B", key="ab-treatment")
primary = st.selectbox("Primary metric", [DEFAULT_PRIMARY, "GPU-s per request", "conversions per request",
                                          "P95 latency (s)", "hit rate (prefix_kv)", "hit rate (response)"],
                       key="ab-primary")
try:
    with st.spinner("Computing the report…"):
        rep = data.ab_report(exp, control, treatment, primary)
except data.SourceError as e:
    st.error(str(e))
    st.stop()
if rep.error:
    st.error(rep.error)
    st.stop()
for s in (rep.srm_units, rep.srm_requests):
    if s is not None:
        msg = (f"Sample-ratio check on {s.what}: observed {', '.join(f'{x:,.0f}' for x in s.observed)} for a "
               f"{' / '.join(f'{x:.0%}' for x in s.expected_share)} plan (χ² = {s.chi2:.2f}, p = {s.p_value:.3g})")
        (st.error if s.flagged else st.success)(("MISMATCH — " if s.flagged else "OK — ") + msg)
st.markdown(f"### {rep.verdict}")
for w in rep.warnings:
    st.warning(w)
if rep.power is not None and rep.power.mde_rel == rep.power.mde_rel:
    st.caption(rep.power.note)
t = rep.table()
st.dataframe(t[["metric", "kind", "control", "treatment", "abs_effect", "rel_effect", "rel_low", "rel_high",
                "p_value", "p_holm", "p_bh", "seq_p", "error"]].style.format(
    {"control": "{:.4g}", "treatment": "{:.4g}", "abs_effect": "{:+.4g}", "rel_effect": "{:+.2%}",
     "rel_low": "{:+.2%}", "rel_high": "{:+.2%}", "p_value": "{:.3g}", "p_holm": "{:.3g}", "p_bh": "{:.3g}",
     "seq_p": "{:.3g}"}, na_rep="–"), hide_index=True, width="stretch")
st.caption("★ The primary metric is tested as is; the others carry Holm and BH adjusted p-values. seq_p is the "
           "always-valid (mixture SPRT) p-value, safe to watch continuously.")
st.plotly_chart(effect_figure(rep), width="stretch")
st.download_button("Download the HTML report", render_html(rep), file_name=f"ab-{exp}.html", mime="text/html")
