"""Detectors for the seven cold-start traps (see simulator/faults.py), over canonical frames.

Each detector compares an anomaly window with a baseline window and returns a
:class:`TrapVerdict`: detected or not, a confidence in [0, 1], the evidence as
a sentence with numbers, and the scope it points at.

======================  =============================================================
trap                    signature looked for
======================  =============================================================
warmup_out_of_step      a replica's lookups in the layers it loads when it (re)starts
                        (``Layer(loaded_at_start=True)``: ``weights``) miss (traffic
                        before its model is loaded / warmed) while the baseline had none
dynamic_tokenisation    a key family's hit rate falls on every replica while its lookups
                        hold steady and its writes per lookup multiply (one template,
                        many keys)
kv_fixed_len            on one replica, ``prefix_kv`` hit rate collapses in the short
                        prompt-length buckets while the long ones are unchanged
tenant_isolation        one key (hash) read by two or more tenants in the same hot-key
                        window, outside shared layers (``weights``) — a data leak
bypass                  ``bypass`` results appear in a tenant × layer that had none
key_explosion           new key families, absent from the baseline, carry most of a
                        tenant × layer's lookups and almost never hit
warmup_timing           a warm-up run whose entries expired or were evicted before they
                        were read (warm-set precision far below the other runs)
======================  =============================================================

Where the frames hold ``misses`` (prefix-KV missed tokens by why they missed) for the
anomaly window, the classes are evidence too (:data:`MISS_EVIDENCE`): key drift shows as
the ``drifted`` share — enough by itself to detect ``dynamic_tokenisation`` when it rises
by ``DRIFT_RISE`` — an expired or evicted warm set as the ``evicted`` share, and tenant
scoping as the ``isolated`` share, shown only for a prefix-KV security verdict and only when
it fell (blocks that tenants' scopes kept apart were now reused across them; a rise is
isolation working, and a response-cache verdict is not about these blocks).
:func:`miss_class_shift` gives every class's share in both windows (the root-cause page
shows it: a too-small cache is an ``evicted`` share that rises).

Example::

    verdicts = detect_all(frames, anomaly=(t1, t2), baseline=(t0, t1))
    [v for v in verdicts if v.detected]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from warmscope.model.records import shared_layers, start_layers

from .coverage import read_in_time
from .hitrate import time_slice

__all__ = [
    "TrapVerdict",
    "detect_all",
    "DETECTORS",
    "MISS_EVIDENCE",
    "miss_class_shift",
    "DRIFT_RISE",
]

Frames = Mapping[str, pd.DataFrame]
Window = tuple[float, float]


@dataclass(frozen=True)
class TrapVerdict:
    trap: str
    detected: bool
    confidence: float
    evidence: str
    scope: dict[Any, Any] = field(default_factory=dict)
    numbers: dict[Any, Any] = field(default_factory=dict)


def _none(trap: str, why: str) -> TrapVerdict:
    return TrapVerdict(trap, False, 0.0, why)


def _rates(lk: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    res = lk["result"].to_numpy()
    c = lk["count"].to_numpy(float)
    d = pd.DataFrame(
        {
            "hits": np.where(res == "hit", c, 0.0),
            "hm": np.where((res == "hit") | (res == "miss"), c, 0.0),
            "all": c,
            "bypass": np.where(res == "bypass", c, 0.0),
        },
        index=lk.index,
    )
    g = d.groupby([lk[b] for b in by], observed=True).sum()
    g["rate"] = g["hits"] / g["hm"].replace(0, np.nan)
    return g


def _fmt_t(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%H:%M")


def out_of_step(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    lk = fr.get("lookups", pd.DataFrame())
    if lk.empty:
        return _none("warmup_out_of_step", "no lookups")
    # the layers a replica loads when it (re)starts (model weights): LAYERS' loaded_at_start
    layers = start_layers()
    lk = lk[lk["layer"].isin(layers)]
    what = " and ".join(layers) or "start-loaded layers"  # what the text calls them: "weights"
    a = _rates(time_slice(lk, *an), ["replica"])
    b = _rates(time_slice(lk, *base), ["replica"])
    if a.empty:
        return _none("warmup_out_of_step", f"no {what} lookups in the window")
    miss = 1 - a["rate"].fillna(1)
    bmiss = (1 - b["rate"].fillna(1)).reindex(a.index).fillna(0)
    worst: Any = (miss - bmiss).idxmax()
    m, bm = float(miss[worst]), float(bmiss[worst])
    if m < 0.02 or m < 5 * bm + 0.01:
        return _none("warmup_out_of_step", f"{what} miss rate at most {m:.1%} (baseline {bm:.1%})")
    n = float(a.loc[worst, "hm"] * m)
    return TrapVerdict(
        "warmup_out_of_step",
        True,
        float(min(1.0, 0.5 + 5 * m)),
        f"replica {worst}: {n:,.0f} requests met unloaded {what} ({m:.1%} of its {what} "
        f"lookups, baseline {bm:.1%}) — traffic arrived before its model was warm",
        {"replica": worst},
        {"miss_rate": m, "baseline": bm},
    )


def tokenisation(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    lk, wr = fr.get("lookups", pd.DataFrame()), fr.get("writes", pd.DataFrame())
    if lk.empty or wr.empty:
        return _none("dynamic_tokenisation", "no lookups or writes")
    lk = lk[~lk["layer"].isin(shared_layers())]
    a, b = _rates(time_slice(lk, *an), ["family"]), _rates(time_slice(lk, *base), ["family"])
    wa = time_slice(wr, *an).groupby("family")["count"].sum()
    wb = time_slice(wr, *base).groupby("family")["count"].sum()
    span_a, span_b = an[1] - an[0], base[1] - base[0]
    t = a.merge(b, left_index=True, right_index=True, how="inner", suffixes=("", "_b"))
    t = t[(t["hm_b"] >= 50) & (t["rate_b"] > 0.3)]
    if t.empty:
        return _none("dynamic_tokenisation", "no family with a baseline to compare")
    t["vol"] = (t["hm"] / span_a) / (t["hm_b"] / span_b)
    t["wpl"] = (wa.reindex(t.index).fillna(0) / t["hm"]) / (
        wb.reindex(t.index).fillna(0) / t["hm_b"]
    ).replace(0, np.nan)
    t["drop"] = 1 - t["rate"] / t["rate_b"]
    cand = t[(t["drop"] > 0.3) & t["vol"].between(0.5, 2.0) & (t["wpl"].fillna(np.inf) > 2.0)]
    if cand.empty:
        return _none(
            "dynamic_tokenisation",
            "no family lost hits at steady volume with more writes per lookup",
        )
    # Every replica carrying the family must show it (a one-replica drop is a different trap).
    reps_a = _rates(time_slice(lk, *an), ["family", "replica"])
    best: Any
    fam: Any
    best, best_drop = None, 0.0
    for fam, row in cand.iterrows():
        per = reps_a.loc[fam] if fam in reps_a.index.get_level_values(0) else None
        if per is None or len(per) < 2 or (per["rate"] < row["rate_b"] * 0.8).mean() < 0.7:
            continue
        if row["drop"] > best_drop:
            best, best_drop = fam, row["drop"]
    if best is None:
        return _none("dynamic_tokenisation", "family drops are confined to single replicas")
    r = cand.loc[best]
    fams = list(cand.index)
    return TrapVerdict(
        "dynamic_tokenisation",
        True,
        float(min(1.0, 0.4 + r["drop"])),
        f"key family {best}: hit rate {r['rate']:.2f} vs {r['rate_b']:.2f} at {r['vol']:.2f}× the "
        f"lookups, writes per lookup ×{r['wpl']:.1f} — one template now maps to many keys"
        + (f" (also {', '.join(fams[:3])})" if len(fams) > 1 else ""),
        {"family": best},
        {"drop": float(r["drop"]), "writes_per_lookup_x": float(r["wpl"])},
    )


def fixed_len(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    lk = fr.get("lookups", pd.DataFrame())
    if lk.empty:
        return _none("kv_fixed_len", "no lookups")
    kv = lk[lk["layer"] == "prefix_kv"]
    kv = kv[kv["length_bucket"].str.fullmatch(r"\d+")]
    if kv.empty:
        return _none("kv_fixed_len", "no prefix_kv lookups with a length bucket")
    a = _rates(time_slice(kv, *an), ["replica", "length_bucket"])
    b = _rates(time_slice(kv, *base), ["replica", "length_bucket"])
    t = a.merge(b, left_index=True, right_index=True, how="inner", suffixes=("", "_b"))
    t = t[(t["hm"] >= 30) & (t["rate_b"] > 0.2)]
    found = []
    for rep, g in t.groupby(level=0):
        g = g.droplevel(0)
        g = g.loc[sorted(g.index, key=int)]
        dropped = g["rate"] < 0.2 * g["rate_b"]
        if dropped.any() and not dropped.all():
            longest_dropped = max(int(x) for x in g.index[dropped])
            longer = g[[int(x) > longest_dropped for x in g.index]]
            if len(longer) and (longer["rate"] >= 0.7 * longer["rate_b"]).all():
                found.append(
                    (
                        rep,
                        longest_dropped,
                        float(g.loc[dropped, "rate"].mean()),
                        float(g.loc[dropped, "rate_b"].mean()),
                    )
                )
    if not found:
        return _none("kv_fixed_len", "no replica where only short prompts lost their prefix hits")
    rep, edge, ra, rb = found[0]
    return TrapVerdict(
        "kv_fixed_len",
        True,
        0.9,
        f"replica {rep}, prefix_kv: prompts ≤ {edge} tokens hit {ra:.2f} vs {rb:.2f} before, "
        "longer prompts unchanged — KV prefill sized for a fixed length",
        {"replica": rep, "layer": "prefix_kv"},
        {"max_short_bucket": edge},
    )


HOT_KEY_LOOKBACK_S = 3600.0  # isolation reads hot-key windows from this long before the anomaly


def isolation(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    hk = fr.get("hot_keys", pd.DataFrame())
    if hk.empty:
        return _none("tenant_isolation", "no hot keys recorded")
    hk = hk[
        (hk["window"] < an[1])
        & (hk["window"] >= an[0] - HOT_KEY_LOOKBACK_S)
        & ~hk["layer"].isin(shared_layers())
    ]
    if hk.empty:
        return _none("tenant_isolation", "no hot keys in the window")
    # A key (per hot-key window and layer) read by two or more tenants: vectorised, no Python
    # per group.
    keys = ["window", "layer", "key_hash"]
    d = hk.drop_duplicates(keys + ["tenant"])
    sh = d[d.duplicated(keys, keep=False)]
    if sh.empty:
        return _none("tenant_isolation", "no key read by more than one tenant")
    n_shared = len(sh.drop_duplicates(["layer", "key_hash"]))  # distinct keys, as the alert counts
    layers = sorted(set(sh["layer"]))
    names = sorted(set(sh["tenant"]))
    return TrapVerdict(
        "tenant_isolation",
        True,
        float(min(1.0, 0.6 + 0.1 * n_shared)),
        f"SECURITY: {n_shared} {'/'.join(layers)} keys were read by two or more tenants "
        f"({', '.join(names[:5])}) — cache keys lack a tenant scope",
        {"layer": layers[0]},
        {"shared_keys": int(n_shared)},
    )


def bypass(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    lk = fr.get("lookups", pd.DataFrame())
    if lk.empty:
        return _none("bypass", "no lookups")
    a = _rates(time_slice(lk, *an), ["tenant", "layer"])
    b = _rates(time_slice(lk, *base), ["tenant", "layer"])
    share = a["bypass"] / a["all"].replace(0, np.nan)
    bshare = (b["bypass"] / b["all"].replace(0, np.nan)).reindex(a.index).fillna(0)
    jump = (share - bshare).dropna()
    if jump.empty or jump.max() < 0.05:
        return _none("bypass", "no bypass spike")
    tenant: Any
    layer: Any
    (tenant, layer) = jump.idxmax()  # type: ignore[misc]  # a (tenant, layer) index
    s = float(share[(tenant, layer)])
    return TrapVerdict(
        "bypass",
        True,
        float(min(1.0, 0.5 + s)),
        f"tenant {tenant}, layer {layer}: {s:.0%} of lookups bypassed the cache (baseline "
        f"{float(bshare[(tenant, layer)]):.0%}) — a middleware path skips it",
        {"tenant": tenant, "layer": layer},
        {"bypass_share": s},
    )


def explosion(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    lk = fr.get("lookups", pd.DataFrame())
    if lk.empty:
        return _none("key_explosion", "no lookups")
    a = _rates(time_slice(lk, *an), ["tenant", "layer", "family"])
    before = set(time_slice(lk, *base)["family"].unique())
    fams = a.index.get_level_values("family")
    new = a[~fams.isin(before)]
    if new.empty:
        return _none("key_explosion", "no new key families")
    scope_tot = a.groupby(level=[0, 1])["hm"].sum()
    nn = new.groupby(level=[0, 1]).agg(hm=("hm", "sum"), hits=("hits", "sum"), n=("hm", "size"))
    nn["share"] = nn["hm"] / scope_tot.reindex(nn.index)
    nn["rate"] = nn["hits"] / nn["hm"].replace(0, np.nan)
    c = nn[(nn["share"] > 0.2) & (nn["rate"].fillna(0) < 0.2)]
    if c.empty:
        return _none("key_explosion", "new families are minor or hit normally")
    tenant: Any
    layer: Any
    (tenant, layer) = c["share"].idxmax()  # type: ignore[misc]  # a (tenant, layer) index
    r = c.loc[(tenant, layer)]
    examples = list(new.loc[(tenant, layer)].index[:3])
    return TrapVerdict(
        "key_explosion",
        True,
        float(min(1.0, 0.4 + r["share"])),
        f"tenant {tenant}, layer {layer}: {int(r['n'])} new key families "
        f"({', '.join(examples)}) carry {r['share']:.0%} of lookups and hit {r['rate']:.0%} — "
        "extra key dimensions split equal requests",
        {"tenant": tenant, "layer": layer},
        {"new_families": int(r["n"])},
    )


def timing(fr: Frames, an: Window, base: Window) -> TrapVerdict:
    runs, wk = fr.get("warmup_runs", pd.DataFrame()), fr.get("warmed_keys", pd.DataFrame())
    if runs.empty or wk.empty:
        return _none("warmup_timing", "no warm-up runs")
    w = wk.assign(read=read_in_time(wk))
    prec = w.groupby("run_id")["read"].agg(["mean", "size"])
    prec = prec[prec["size"] >= 10]
    # Runs triggered by a hit-rate drop react to a regression; they are not its cause.
    inwin = runs[
        (runs["started"] >= an[0])
        & (runs["started"] < an[1])
        & (runs["trigger"] != "hit_rate_drop")
    ]["run_id"]
    cand = prec[prec.index.isin(inwin)]
    others = prec[~prec.index.isin(inwin)]
    if cand.empty:
        return _none("warmup_timing", "no warm-up run in the window")
    worst: Any = cand["mean"].idxmin()
    p = float(cand.loc[worst, "mean"])
    ref = float(others["mean"].median()) if len(others) else 1.0
    if p > 0.3 or p > 0.5 * ref:
        return _none("warmup_timing", f"warm-set precision {p:.2f} (other runs {ref:.2f})")
    run = runs.set_index("run_id").loc[worst]
    return TrapVerdict(
        "warmup_timing",
        True,
        float(min(1.0, 1 - p)),
        f"warm-up run {worst} ({run['trigger']}, {run['layer']}, {run['replica']}, started "
        f"{_fmt_t(run['started'])}): only {p:.0%} of warmed entries were read before they "
        f"expired or were evicted (other runs {ref:.0%}) — warmed out of step with traffic",
        {"replica": run["replica"], "layer": run["layer"]},
        {"precision": p, "others": ref},
    )


DETECTORS: dict[str, Callable[[Frames, Window, Window], TrapVerdict]] = {
    "warmup_out_of_step": out_of_step,
    "dynamic_tokenisation": tokenisation,
    "kv_fixed_len": fixed_len,
    "tenant_isolation": isolation,
    "bypass": bypass,
    "key_explosion": explosion,
    "warmup_timing": timing,
}


MISS_EVIDENCE = {
    "dynamic_tokenisation": "drifted",
    "warmup_timing": "evicted",
    "tenant_isolation": "isolated",
}
DRIFT_RISE = 0.05  # a drifted share this much above the baseline's detects key drift on its own
_MISS_SCOPE = {"drifted": "family", "evicted": "engine", "isolated": "tenant"}


def miss_class_shift(fr: Frames, an: Window, base: Window) -> pd.DataFrame:
    """Per class: missed tokens and their share in the anomaly and the baseline window, and the
    change of share (empty without ``misses`` in the anomaly window)."""
    m = fr.get("misses", pd.DataFrame())
    cols = ["miss_class", "tokens", "share", "tokens_base", "share_base", "change"]
    if m is None or m.empty:
        return pd.DataFrame(columns=cols)
    from warmscope.model.records import MISS_CLASSES

    def per_class(w: Window) -> pd.Series:
        g = time_slice(m, *w).groupby("miss_class")["tokens"].sum()
        return g.reindex(MISS_CLASSES, fill_value=0)

    a, b = per_class(an), per_class(base)
    if a.sum() <= 0:
        return pd.DataFrame(columns=cols)
    t = pd.DataFrame(
        {
            "tokens": a,
            "share": a / a.sum(),
            "tokens_base": b,
            "share_base": b / b.sum() if b.sum() > 0 else np.nan,
        }
    )
    t["change"] = t["share"] - t["share_base"]
    t = t[(t["tokens"] > 0) | (t["tokens_base"] > 0) | (t.index != "unknown")]
    return t.rename_axis("miss_class").reset_index()[cols]


def _with_classes(v: TrapVerdict, fr: Frames, an: Window, base: Window) -> TrapVerdict:
    """``v`` with its miss class as evidence (see module doc)."""
    cls = MISS_EVIDENCE.get(v.trap)
    m = fr.get("misses", pd.DataFrame())
    if cls is None or m is None or m.empty:
        return v
    shift = miss_class_shift(fr, an, base)
    if shift.empty:
        return v
    idx = shift.set_index("miss_class")
    sa, sb = (
        float(idx["share"].to_numpy(float)[idx.index.get_loc(cls)]),
        float(idx["share_base"].to_numpy(float)[idx.index.get_loc(cls)]),
    )
    if sa == 0 and not sb > 0:  # the class never occurred: nothing to say
        return v
    base_txt = f"{sb:.0%}" if np.isfinite(sb) else "no baseline"
    ma = time_slice(m, *an)
    top = ma[ma["miss_class"] == cls].groupby(_MISS_SCOPE[cls])["tokens"].sum()
    where = f" (most in {_MISS_SCOPE[cls]} {top.idxmax()})" if len(top) and top.max() > 0 else ""
    text = f"prefix-KV misses: {cls} {sa:.0%} of missed tokens vs {base_txt} before{where}"
    numbers = {**v.numbers, f"{cls}_share": sa, f"{cls}_share_base": sb}
    if cls == "isolated" and not (
        v.scope.get("layer") == "prefix_kv" and np.isfinite(sb) and sa < sb
    ):
        # ``isolated``: the prefix was resident under another tenant's scope (salt). A fall says
        # tenants began reusing each other's prefixes, which supports a cross-tenant read in the
        # prefix cache; a rise is isolation working, and another layer's verdict is not about
        # these blocks: no evidence either way (the numbers stay)
        return TrapVerdict(v.trap, v.detected, v.confidence, v.evidence, v.scope, numbers)
    if v.detected:
        return TrapVerdict(v.trap, True, v.confidence, f"{v.evidence}; {text}", v.scope, numbers)
    rise = sa - (sb if np.isfinite(sb) else 0.0)
    if cls == "drifted" and rise >= DRIFT_RISE and len(top):
        fam = top.idxmax()
        return TrapVerdict(
            v.trap,
            True,
            float(min(1.0, 0.5 + rise)),
            f"{text} — dynamic content changes a template's key (a timestamp in a system prompt?)",
            {"family": fam},
            numbers,
        )
    return TrapVerdict(v.trap, False, v.confidence, f"{v.evidence}; {text}", v.scope, numbers)


def detect_all(frames: Frames, anomaly: Window, baseline: Window) -> list[TrapVerdict]:
    """Every detector's verdict, detected ones first by confidence. Never raises."""
    out = []
    for name, fn in DETECTORS.items():
        try:
            out.append(_with_classes(fn(frames, anomaly, baseline), frames, anomaly, baseline))
        except (KeyError, ValueError, TypeError) as e:
            out.append(_none(name, f"cannot evaluate: {e}"))
    return sorted(out, key=lambda v: (not v.detected, -v.confidence))
