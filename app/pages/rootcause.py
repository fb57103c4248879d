"""Root cause: pick a regression window, get ranked explanations and trap verdicts."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from warmscope.analysis.drilldown import change_point, drill_down
from warmscope.analysis.hitrate import hit_table
from warmscope.analysis.traps import HOT_KEY_LOOKBACK_S, detect_all
from warmscope.app import engine_view, ui

st.title("Root cause")
start, end = ui.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.rootcause(start, end)
    st.stop()
fr = ui.load(["lookups", "writes", "warmup_runs", "warmed_keys"], start, end)
lk = fr["lookups"]
ui.resolution_note(start, end)
mode = st.radio("Regression window", ["detected change point", "choose"], horizontal=True, key="rc-mode")
if mode == "choose":
    a0, a1 = st.slider("Anomaly window (hours before the end)", 0.0, max((end - start) / 3600, 0.1),
                       (0.0, min(0.5, (end - start) / 3600)), step=0.05, key="rc-win")
    anomaly = (end - a1 * 3600, end - a0 * 3600)
else:
    cp = change_point(lk)
    if cp is None:
        st.info("Too little data to find a change point; choose the window, or widen the time range.")
        st.stop()
    anomaly = (cp, end)
length = anomaly[1] - anomaly[0]
baseline = (anomaly[0] - length, anomaly[0])
t = hit_table(lk, freq=max(300, ui.step(start, end) or 0))
t["time"] = t.bucket.astype("datetime64[s]")
fig = px.line(t, x="time", y="hit_rate", range_y=[0, 1], title="Effective hit rate "
              f"({'hourly' if ui.step(start, end) else '5-minute'} buckets)")
fig.add_vrect(x0=pd.Timestamp(anomaly[0], unit="s"), x1=pd.Timestamp(anomaly[1], unit="s"), fillcolor="red",
              opacity=0.12, line_width=0, annotation_text="anomaly")
fig.add_vrect(x0=pd.Timestamp(baseline[0], unit="s"), x1=pd.Timestamp(baseline[1], unit="s"), fillcolor="grey",
              opacity=0.12, line_width=0, annotation_text="baseline")
st.plotly_chart(fig, width="stretch")
st.caption(f"Anomaly {ui.when(anomaly[0])} → {ui.when(anomaly[1])}; baseline {ui.when(baseline[0])} → "
           f"{ui.when(baseline[1])}")
fr.update(ui.load(["hot_keys"], max(start, anomaly[0] - HOT_KEY_LOOKBACK_S), end))  # what the isolation check reads
dd = drill_down(lk, anomaly=anomaly, baseline=baseline)
loc = dd.localization
st.subheader("Ranked explanations")
if loc.error:
    st.warning(loc.error)
elif not loc.causes:
    st.info("; ".join(loc.notes) or "Nothing stands out: the change is spread thinly or within noise.")
else:
    st.metric("Effective hit rate", f"{loc.observed:.1%}", f"{loc.observed - loc.expected:+.1%} vs expected")
    rows = [{"cause": " · ".join(f"{k}={v}" for k, v in c.element.items()), "explains": c.explanatory_power,
             "score": c.score, "leaves": c.leaves} for c in loc.causes]
    df = pd.DataFrame(rows)
    st.dataframe(df.style.format({"explains": "{:.0%}", "score": "{:.2f}"}), hide_index=True,
                 width="stretch")
    st.plotly_chart(px.bar(df, x="explains", y="cause", orientation="h", title="Share of the change explained"),
                    width="stretch")
st.subheader("Cold-start traps")
for v in detect_all(fr, anomaly, baseline):
    if v.detected:
        st.warning(f"{'🔒 ' if v.trap == 'tenant_isolation' else ''}**{v.trap}** "
                   f"(confidence {v.confidence:.0%}): {v.evidence}")
with st.expander("Traps not seen"):
    for v in detect_all(fr, anomaly, baseline):
        if not v.detected:
            st.write(f"**{v.trap}** — {v.evidence}")
