"""Hit rate explorer: pick a dimension, filter, drill down one level at a time (click a heatmap
cell, or pick a value); breadcrumbs go back. The drill path and grouping live in the URL.

With engine metrics only, the same page explores the engines' prefix-cache counters: dimensions
model, instance and engine, lookups are prompt tokens and the hit rate is token-weighted."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from warmscope.analysis.drilldown import RCA_DIMS
from warmscope.app.dashboard import cached, charts, engine_view, fmt, state


@dataclass(frozen=True)
class _View:
    """What the page explores: the collectors' lookups, or the engines' prompt tokens."""

    engine: bool
    dims: tuple[str, ...]
    label: dict[str, str]
    unit: str

    def name(self, dim: str) -> str:
        return self.label.get(dim, dim)


def _view(start: float, end: float) -> _View:
    if engine_view.active(start, end):  # engine metrics only
        return _View(True, tuple(engine_view.DIMS), {"engine_kind": "engine kind"}, "prompt tokens")
    return _View(
        False,
        tuple(RCA_DIMS),
        {"length_bucket": "prompt length", "family": "key family"},
        "lookups",
    )


def _encode(path: list[tuple[str, str]]) -> str:
    return ",".join(f"{d}:{v}" for d, v in path)


def _decode(v: _View, s: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for part in filter(None, s.split(",")):
        d, _, val = part.partition(":")
        if d in v.dims and val and d not in {x[0] for x in out}:
            out.append((d, val))
    return out


def _reset_pickers() -> None:
    # Dependent pickers start over whenever the path changes: no stale value from another level.
    for k in [k for k in st.session_state if str(k).startswith("drill-pick")] + ["groupby"]:
        st.session_state.pop(k, None)
    # New keys for the heatmap and the drill picker: the browser keeps an old chart's click (it
    # would drill again with it) and an old picker's choice (the next level's picker showed the
    # value just drilled into) for a widget whose key it has seen.
    st.session_state["heat-gen"] = st.session_state.get("heat-gen", 0) + 1


def _breadcrumbs(v: _View, path: list[tuple[str, str]]) -> None:
    """Each crumb goes back to that level."""
    crumbs = st.columns(min(len(path) + 1, 6))
    if crumbs[0].button("All traffic", key="crumb-root", icon=":material/home:"):
        path.clear()
        _reset_pickers()
        st.rerun()
    for i, (d, val) in enumerate(path):
        if crumbs[min(i + 1, 5)].button(f"› {v.name(d)} = {val}", key=f"crumb-{i}"):
            del path[i + 1 :]
            _reset_pickers()
            st.rerun()


def _controls(
    v: _View, start: float, end: float, path: list[tuple[str, str]]
) -> tuple[str, int, list[str]]:
    """The group-by and bucket pickers: (dimension, bucket seconds, dimensions left)."""
    free = [d for d in v.dims if d not in {p[0] for p in path}]
    state.init_from_url("groupby", cast=lambda x: x if x in free else free[0])
    if st.session_state.get("groupby") not in free:
        st.session_state["groupby"] = free[0]
    c1, c2 = st.columns([1, 2])
    by = c1.selectbox("Group by", free, key="groupby", format_func=v.name)
    res = state.step(start, end) or 0
    opts = [f for f in (60, 300, 600, 1800, 3600, 6 * 3600) if f >= res]
    freq = c2.select_slider(
        "Bucket",
        options=opts,
        value=min([o for o in opts if o >= engine_view.bucket(start, end)] or opts[-1:])
        if v.engine
        else max(600, opts[0]),
        format_func=lambda x: f"{x // 3600} h" if x >= 3600 else f"{x // 60} min",
    )
    state.url_set(drill=_encode(path) or None, groupby=by)
    return str(by), int(freq), free


def _totals(
    v: _View, start: float, end: float, path: list[tuple[str, str]], total: pd.DataFrame
) -> None:
    """How the hit rate is defined here, and both totals (weights in and out)."""
    if v.engine:
        st.caption(
            "Hit rate = cached prompt tokens / prompt tokens (the engines' prefix-cache counters), "
            "token-weighted over the selection; the share of prompt tokens of each group is in the "
            "table below."
        )
        return
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
    bypassed = float(total.bypassed.iloc[0]) if "bypassed" in total else 0.0
    if bypassed:
        st.caption(
            f"{fmt.integer(bypassed)} lookups bypassed the cache in the selection "
            f"({bypassed / (bypassed + float(total.lookups.iloc[0])):.1%} of all requests that "
            "could have asked it): they are not in the hit rate — the table's Bypassed column "
            "says where."
        )
    cached.unmeasured_note(start, end, tenant=dict(path).get("tenant"))


def _time_chart(
    v: _View,
    start: float,
    end: float,
    path: list[tuple[str, str]],
    by: str,
    freq: int,
    top: pd.DataFrame,
) -> None:
    """The hit rate of the 12 largest groups over time, with Wilson bands on lookups."""
    t = cached.rates(start, end, (by,), freq, path, engine=v.engine)
    t = t[t.lookups > 0]
    keep = list(top[by].astype(str).head(12))
    t = t[t[by].astype(str).isin(keep)]
    fig = go.Figure()
    for val, g in t.groupby(by):
        g = charts.break_at_gaps(g, "bucket", freq)  # no line across buckets without lookups
        g["time"] = g.bucket.astype("datetime64[s]")
        # Prompt tokens are not independent trials: no Wilson band on a token-weighted rate.
        ci = "" if v.engine else "95% CI %{customdata[0]:.1%}–%{customdata[1]:.1%}, "
        fig.add_trace(
            go.Scatter(
                x=g.time,
                y=g.hit_rate,
                mode="lines+markers" if v.engine else "lines",
                name=str(val),
                customdata=g[["ci_low", "ci_high", "lookups"]].to_numpy(),
                hovertemplate=f"%{{x|%H:%M}} · %{{y:.1%}} ({ci}%{{customdata[2]:,.0f}} {v.unit})"
                f"<extra>{val}</extra>",
                error_y=None
                if v.engine
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
        title=f"Hit rate by {v.name(by)}",
        yaxis=dict(range=[0, 1.05], tickformat=".0%", title="hit rate"),
        xaxis_title="time (UTC)",
        height=420,
        legend_title_text=v.name(by),
    )
    charts.annotate(fig, start, end)
    st.plotly_chart(fig, width="stretch")


def _heatmap(start: float, end: float, path: list[tuple[str, str]]) -> None:
    """Tenant × layer hit rates; a click drills into the cell."""
    st.subheader("Tenant × layer · click a cell to drill down")
    hm = cached.rates(start, end, ("tenant", "layer"), path=path)
    hm = hm[hm.lookups > 0]
    if not len(hm):
        return
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


def _groups(v: _View, top: pd.DataFrame, by: str, path: list[tuple[str, str]]) -> None:
    """The groups' table, and a picker that drills into one."""
    st.subheader(f"By {v.name(by)}")
    top = top.assign(share=top.lookups / top.lookups.sum())
    if v.engine:
        top = top.drop(columns=["ci_low", "ci_high", "bypassed"])
    st.dataframe(
        top.rename(columns={by: v.name(by)}).style.format(
            {
                "hits": "{:,.0f}",
                "lookups": "{:,.0f}",
                "hit_rate": "{:.1%}",
                "ci_low": "{:.1%}",
                "ci_high": "{:.1%}",
                "share": "{:.1%}",
                "bypassed": "{:,.0f}",
            }
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "hits": "Cached prompt tokens" if v.engine else "Hits",
            "lookups": "Prompt tokens" if v.engine else "Lookups",
            "hit_rate": "Hit rate",
            "ci_low": "95% CI low",
            "ci_high": "95% CI high",
            "share": f"Share of {v.unit}",
            "bypassed": st.column_config.Column(
                "Bypassed",
                help="Lookups that skipped the cache (a bypass): in neither hits nor lookups, so "
                "a bypass spike lowers the lookups, not the hit rate",
            ),
        },
    )
    choice = st.selectbox(
        f"Drill into a {v.name(by)}",
        ["—"] + list(top[by].astype(str)),
        key=f"drill-pick-{st.session_state.get('heat-gen', 0)}",
    )
    if choice != "—":
        path.append((by, choice))
        _reset_pickers()
        st.rerun()


def render() -> None:
    start, end = state.time_range()
    v = _view(start, end)
    if v.engine:
        st.info(engine_view.COLLECTORS_NOTE)
    if "drill" not in st.session_state:
        st.session_state["drill"] = _decode(v, state.url_get("drill") or "")
    path = st.session_state["drill"]  # [(dim, value), ...]
    _breadcrumbs(v, path)
    # Every table below is cached per range, path, grouping and bucket: a rerun reads a few rows,
    # not the range.
    total = cached.rates(start, end, path=path, engine=v.engine)
    if v.engine and not path and (total.empty or not total.lookups.iloc[0]):
        engine_view.no_engine_data()
    if total.empty or not total.lookups.iloc[0]:
        st.info(
            "No lookups match this selection in the time range; go back with the breadcrumbs or "
            "widen the range."
        )
        state.url_set(drill=_encode(path) or None)
        st.stop()
    by, freq, free = _controls(v, start, end, path)
    state.resolution_note(start, end)
    _totals(v, start, end, path, total)
    top = cached.rates(start, end, (by,), path=path, engine=v.engine)
    top = top.sort_values("lookups", ascending=False)
    _time_chart(v, start, end, path, by, freq, top)
    if "tenant" in free and "layer" in free:
        _heatmap(start, end, path)
    _groups(v, top, by, path)
