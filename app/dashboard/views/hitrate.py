"""Hit rate explorer: pick a dimension, filter, drill down one level at a time (click a heatmap
cell, or pick a value); breadcrumbs go back. The drill path and grouping live in the URL.

With engine metrics only, the same page explores the engines' prefix-cache counters: dimensions
model, instance and engine, lookups are prompt tokens and the hit rate is token-weighted."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.drilldown import RCA_DIMS
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state


def render() -> None:
    start, end = state.time_range()
    ENGINE = engine_view.active(start, end)  # engine metrics only
    if ENGINE:
        DIMS = list(engine_view.DIMS)
        LABEL = {"engine_kind": "engine kind"}
        UNIT = "prompt tokens"
    else:
        DIMS = list(RCA_DIMS)
        LABEL = {"length_bucket": "prompt length", "family": "key family"}
        UNIT = "lookups"

    def _encode(path: list[tuple[str, str]]) -> str:
        return ",".join(f"{d}:{v}" for d, v in path)

    def _decode(s: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for part in filter(None, s.split(",")):
            d, _, v = part.partition(":")
            if d in DIMS and v and d not in {x[0] for x in out}:
                out.append((d, v))
        return out

    def _reset_pickers() -> None:
        # Dependent pickers start over whenever the path changes: no stale value from another level.
        for k in ("drill-pick", "groupby"):
            st.session_state.pop(k, None)
        # A new heatmap key: the browser keeps an old chart's click and would drill again with it.
        st.session_state["heat-gen"] = st.session_state.get("heat-gen", 0) + 1

    if ENGINE:
        st.info(engine_view.COLLECTORS_NOTE)
    if "drill" not in st.session_state:
        st.session_state["drill"] = _decode(state.url_get("drill") or "")
    path = st.session_state["drill"]  # [(dim, value), ...]

    # Breadcrumbs: each goes back to that level.
    crumbs = st.columns(min(len(path) + 1, 6))
    if crumbs[0].button("All traffic", key="crumb-root", icon=":material/home:"):
        path.clear()
        _reset_pickers()
        st.rerun()
    for i, (d, v) in enumerate(path):
        if crumbs[min(i + 1, 5)].button(f"› {LABEL.get(d, d)} = {v}", key=f"crumb-{i}"):
            del path[i + 1 :]
            _reset_pickers()
            st.rerun()

    # Every table below is cached per range, path, grouping and bucket: a rerun reads a few rows,
    # not the range.
    total = cached.rates(start, end, path=path, engine=ENGINE)
    if ENGINE and not path and (total.empty or not total.lookups.iloc[0]):
        engine_view.no_engine_data()
    if total.empty or not total.lookups.iloc[0]:
        st.info(
            "No lookups match this selection in the time range; go back with the breadcrumbs or "
            "widen "
            "the range."
        )
        state.url_set(drill=_encode(path) or None)
        st.stop()
    free = [d for d in DIMS if d not in {p[0] for p in path}]
    state.init_from_url("groupby", cast=lambda v: v if v in free else free[0])
    if st.session_state.get("groupby") not in free:
        st.session_state["groupby"] = free[0]
    c1, c2 = st.columns([1, 2])
    by = c1.selectbox("Group by", free, key="groupby", format_func=lambda d: LABEL.get(d, d))
    res = state.step(start, end) or 0
    opts = [f for f in (60, 300, 600, 1800, 3600, 6 * 3600) if f >= res]
    freq = c2.select_slider(
        "Bucket",
        options=opts,
        value=min([o for o in opts if o >= engine_view.bucket(start, end)] or opts[-1:])
        if ENGINE
        else max(600, opts[0]),
        format_func=lambda s: f"{s // 3600} h" if s >= 3600 else f"{s // 60} min",
    )
    state.url_set(drill=_encode(path) or None, groupby=by)
    state.resolution_note(start, end)
    if ENGINE:
        st.caption(
            "Hit rate = cached prompt tokens / prompt tokens (the engines' prefix-cache counters), "
            "token-weighted over the selection; the share of prompt tokens of each group is in the "
            "table below."
        )
    else:
        st.caption(
            "Hit rate = hits / (hits + misses) of the selected lookups, model weights included "
            "(the groups below); the overview's hit rate leaves weights out — both totals here. "
            "Bypassed and failed lookups are not counted. Bands: 95% Wilson CI."
        )
        excl = cached.rates(start, end, path=path, hit_rate_layers_only=True)
        c = st.columns(4)
        c[0].metric(
            "Hit rate (weights excluded)",
            fmt.pct(excl.hit_rate.iloc[0]) if len(excl) and excl.lookups.iloc[0] else "no data",
            help="Every layer except model weights: the overview's hit rate",
        )
        c[1].metric(
            "Lookups (weights excluded)", fmt.integer(excl.lookups.iloc[0]) if len(excl) else "0"
        )
        c[2].metric("Hit rate (weights included)", fmt.pct(total.hit_rate.iloc[0]))
        c[3].metric("Lookups (weights included)", fmt.integer(total.lookups.iloc[0]))
        cached.unmeasured_note(start, end, tenant=dict(path).get("tenant"))
    t = cached.rates(start, end, (by,), freq, path, engine=ENGINE)
    t = t[t.lookups > 0]
    top = cached.rates(start, end, (by,), path=path, engine=ENGINE)
    top = top.sort_values("lookups", ascending=False)
    keep = list(top[by].astype(str).head(12))
    t = t[t[by].astype(str).isin(keep)]
    t["time"] = t.bucket.astype("datetime64[s]")
    fig = go.Figure()
    for val, g in t.groupby(by):
        # Prompt tokens are not independent trials: no Wilson band on a token-weighted rate.
        ci = "" if ENGINE else "95% CI %{customdata[0]:.1%}–%{customdata[1]:.1%}, "
        fig.add_trace(
            go.Scatter(
                x=g.time,
                y=g.hit_rate,
                mode="lines+markers" if ENGINE else "lines",
                name=str(val),
                customdata=g[["ci_low", "ci_high", "lookups"]].to_numpy(),
                hovertemplate=f"%{{x|%H:%M}} · %{{y:.1%}} ({ci}%{{customdata[2]:,.0f}} {UNIT})"
                f"<extra>{val}</extra>",
                error_y=None
                if ENGINE
                else dict(
                    type="data",
                    symmetric=False,
                    array=g.ci_high - g.hit_rate,
                    arrayminus=g.hit_rate - g.ci_low,
                    thickness=0.5,
                ),
            )
        )
    fig.update_layout(
        title=f"Hit rate by {LABEL.get(by, by)}",
        yaxis=dict(range=[0, 1.05], tickformat=".0%", title="hit rate"),
        xaxis_title="time (UTC)",
        height=420,
        legend_title_text=LABEL.get(by, by),
    )
    charts.annotate(fig, start, end)
    st.plotly_chart(fig, width="stretch")

    if "tenant" in free and "layer" in free:
        st.subheader("Tenant × layer · click a cell to drill down")
        hm = cached.rates(start, end, ("tenant", "layer"), path=path)
        hm = hm[hm.lookups > 0]
        if len(hm):
            # Square markers instead of a heatmap trace: Plotly reports clicks on markers (not on
            # heatmap cells).
            tenants = sorted(hm.tenant.astype(str).unique(), reverse=True)
            layers = sorted(hm.layer.astype(str).unique())
            heat = go.Figure(
                go.Scatter(
                    x=hm.layer.astype(str),
                    y=hm.tenant.astype(str),
                    mode="markers+text",
                    marker=dict(
                        symbol="square",
                        size=46,
                        color=hm.hit_rate,
                        colorscale="RdYlGn",
                        cmin=0,
                        cmax=1,
                        colorbar=dict(title="hit rate", tickformat=".0%"),
                    ),
                    text=[f"{x:.0%}" for x in hm.hit_rate],
                    textfont=dict(color="black", size=12),
                    customdata=hm[["lookups"]].to_numpy(),
                    hovertemplate=(
                        "tenant %{y} · layer %{x}<br>hit rate %{text} of %{customdata[0]:,} lookups"
                        "<extra>click to drill down</extra>"
                    ),
                )
            )
            heat.update_layout(
                height=max(260, 56 * len(tenants) + 80),
                xaxis=dict(categoryorder="array", categoryarray=layers, title="layer", side="top"),
                yaxis=dict(categoryorder="array", categoryarray=tenants, title="tenant"),
                margin=dict(t=60, b=20),
                clickmode="event+select",
                dragmode=False,
            )
            ev = st.plotly_chart(
                heat,
                width="stretch",
                on_select="rerun",
                selection_mode="points",
                key=f"heat-{st.session_state.get('heat-gen', 0)}",
            )
            pts = ev.selection.get("points", []) if ev and ev.selection else []
            if pts:
                p = pts[0]
                path.extend([("tenant", str(p["y"])), ("layer", str(p["x"]))])
                _reset_pickers()
                st.rerun()

    st.subheader(f"By {LABEL.get(by, by)}")
    top = top.assign(share=top.lookups / top.lookups.sum())
    if ENGINE:
        top = top.drop(columns=["ci_low", "ci_high"])
    st.dataframe(
        top.rename(columns={by: LABEL.get(by, by)}).style.format(
            {
                "hits": "{:,.0f}",
                "lookups": "{:,.0f}",
                "hit_rate": "{:.1%}",
                "ci_low": "{:.1%}",
                "ci_high": "{:.1%}",
                "share": "{:.1%}",
            }
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "hits": "Cached prompt tokens" if ENGINE else "Hits",
            "lookups": "Prompt tokens" if ENGINE else "Lookups",
            "hit_rate": "Hit rate",
            "ci_low": "95% CI low",
            "ci_high": "95% CI high",
            "share": f"Share of {UNIT}",
        },
    )
    choice = st.selectbox(
        f"Drill into a {LABEL.get(by, by)}", ["—"] + list(top[by].astype(str)), key="drill-pick"
    )
    if choice != "—":
        path.append((by, choice))
        _reset_pickers()
        st.rerun()
