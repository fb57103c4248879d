"""Hit rate explorer: pick a dimension, filter, drill down one level at a time."""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from warmscope.analysis.hitrate import hit_table
from warmscope.app import engine_view, ui

DIMS = ["tenant", "layer", "family", "replica", "variant", "model", "length_bucket"]
st.title("Hit rate explorer")
start, end = ui.time_range()
if engine_view.active(start, end):  # engine metrics only
    engine_view.explorer(start, end)
    st.stop()
lk = ui.load(["lookups"], start, end)["lookups"]
path = st.session_state.setdefault("drill", [])  # [(dim, value), ...]

# Breadcrumbs: each goes back to that level.
crumbs = st.columns(len(path) + 1)
if crumbs[0].button("All traffic", key="crumb-root"):
    path.clear()
    st.rerun()
for i, (d, v) in enumerate(path):
    if crumbs[i + 1].button(f"› {d} = {v}", key=f"crumb-{i}"):
        del path[i + 1:]
        st.rerun()

for d, v in path:
    lk = lk[lk[d].astype(str) == v]
if lk.empty:
    st.info("No lookups match this selection in the time range; go back with the breadcrumbs or widen the range.")
    st.stop()
free = [d for d in DIMS if d not in {p[0] for p in path}]
by = st.selectbox("Group by", free, key="groupby")
res = ui.step(start, end) or 0
opts = [f for f in (60, 300, 600, 1800, 3600, 6 * 3600) if f >= res]
freq = st.select_slider("Bucket", options=opts, value=max(600, opts[0]),
                        format_func=lambda s: f"{s // 3600} h" if s >= 3600 else f"{s // 60} min")
ui.resolution_note(start, end)
t = hit_table(lk, by=[by], freq=freq)
t = t[t.lookups > 0]
top = hit_table(lk, by=[by]).sort_values("lookups", ascending=False)
keep = list(top[by].astype(str).head(12))
t = t[t[by].astype(str).isin(keep)]
t["time"] = t.bucket.astype("datetime64[s]")
fig = go.Figure()
for val, g in t.groupby(by):
    fig.add_trace(go.Scatter(x=g.time, y=g.hit_rate, mode="lines", name=str(val),
                             error_y=dict(type="data", symmetric=False, array=g.ci_high - g.hit_rate,
                                          arrayminus=g.hit_rate - g.ci_low, thickness=0.5)))
fig.update_layout(title=f"Hit rate by {by} (95% Wilson CI)", yaxis_range=[0, 1], height=420)
st.plotly_chart(fig, width="stretch")

st.subheader("Tenant × layer")
hm = hit_table(lk, by=["tenant", "layer"])
if len(hm):
    piv = hm.pivot(index="tenant", columns="layer", values="hit_rate")
    heat = px.imshow(piv, text_auto=".0%", color_continuous_scale="RdYlGn", zmin=0, zmax=1, aspect="auto")
    ev = st.plotly_chart(heat, width="stretch", on_select="rerun", key="heat")
    pts = (ev or {}).get("selection", {}).get("points", []) if isinstance(ev, dict) else \
        getattr(getattr(ev, "selection", None), "points", [])
    if pts:
        p = pts[0]
        new = [("tenant", str(p["y"])), ("layer", str(p["x"]))]
        if all(d not in {q[0] for q in path} for d, _ in new):
            path.extend(new)
            st.rerun()

st.subheader(f"By {by}")
top = top.assign(share=top.lookups / top.lookups.sum())
st.dataframe(top.style.format({"hit_rate": "{:.1%}", "ci_low": "{:.1%}", "ci_high": "{:.1%}", "share": "{:.1%}"}),
             hide_index=True, width="stretch")
choice = st.selectbox(f"Drill into a {by}", ["—"] + list(top[by].astype(str)), key="drill-pick")
if choice != "—":
    path.append((by, choice))
    st.session_state.pop("drill-pick", None)
    st.rerun()
