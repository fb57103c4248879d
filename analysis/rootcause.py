"""Multi-dimensional root-cause localisation of a regression.

Input: a *leaf table* — one row per combination of dimension values — with an
observed and an expected (baseline or forecast) value, either for an additive
measure (misses, lookups, latency sum) or for a derived ratio measure (hit
rate = hits / lookups, given observed and expected numerator and denominator).
Output: a ranked set of root-cause *elements*, each a combination of
dimension values such as ``{tenant=t3, layer=prefix_kv}``.

Method. The published localisers split into search-by-explanatory-power
(Adtributor: one dimension only; iDice, HotSpot: search over combinations)
and deviation-clustering methods (Squeeze, RiskLoc), which lead on
multi-dimensional, multi-element benchmarks. This module scores candidates by
HotSpot's *potential score* under Squeeze's *generalised ripple effect* (the
leaves under one root cause move by one common ratio), searched greedily
rather than by Monte-Carlo:

1. work on the part that moved: hits at the observed lookups (ratio measures)
   or the measure itself (additive);
2. for every element of 1–``max_depth`` dimensions, the potential score is
   ``1 − ‖observed − a‖ / ‖observed − expected‖``, where ``a`` moves the
   element's leaves by its own ratio and keeps the rest as expected; computed
   from per-element sums, so one groupby per dimension subset;
3. greedy cover: take the element with the largest gain (a small penalty per
   extra dimension — succinctness); keep only elements that move the measure
   the way the total moved, beyond binomial noise (``z_min``, ratios), and —
   given traffic volumes (``v_vol``/``f_vol``) — whose traffic did not grow by
   more than ``max_volume_growth`` (grown traffic is downstream pressure from
   misses upstream, an effect, not a cause);
4. refinement: if at least 10% of the chosen element's expected value sits in
   children (by one more dimension) that clearly did not move although a move
   like the others' would have shown, and the moved children fit better each
   with its own ratio, report the moved children instead (the fault sat below
   the element);
5. apply the chosen ripple, remove those leaves, repeat until no element adds
   ``min_gain``.

Each cause carries its score and its *explanatory power*: the share of the
total change that reverting its leaves to expected would undo (for ratios,
the change of the aggregate ratio).

Example::

    loc = localize(leaves, ["tenant", "layer", "family"], v_num="hits", v_den="lookups",
                   f_num="hits_exp", f_den="lookups_exp")
    [c.element for c in loc.causes]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["RootCause", "Localization", "localize"]


@dataclass(frozen=True)
class RootCause:
    element: dict[str, str]
    score: float
    explanatory_power: float
    leaves: int
    abnormal_leaves: int

    def as_json(self) -> dict:
        return {"element": self.element, "score": round(self.score, 6),
                "explanatory_power": round(self.explanatory_power, 6)}


@dataclass
class Localization:
    causes: list[RootCause]
    measure: str
    observed: float
    expected: float
    abnormal_leaves: int
    leaves: int
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _ratio_total(num: np.ndarray, den: np.ndarray) -> float:
    d = den.sum()
    return float(num.sum() / d) if d else float("nan")


def _refine(sub, vals, member, dims, keys, h, cur, den, z_min, unmoved_share=0.10):
    """Split an element by one more dimension when some of its children clearly
    did not move — |z| < 2 although a move like the others' would have been
    detectable there — they hold at least ``unmoved_share`` of its expected
    value, and the moved children fit the data better than the whole element
    moving by one ratio: return the children that moved, or None."""
    best = None
    tot = cur[member].sum()
    if tot <= 0:
        return None

    def z_of(o_, e_, m):
        if den is not None:
            n = den[m].sum()
            p = min(max(e_ / max(n, 1), 0.01), 0.99)
            return (o_ - e_) / np.sqrt(max(n * p * (1 - p), 1e-9))
        return (o_ - e_) / np.sqrt(e_ + 1)

    for d in dims:
        if d in sub:
            continue
        kids = []
        for v in np.unique(keys[d][member]):
            m = member & (keys[d] == v)
            e_, o_ = cur[m].sum(), h[m].sum()
            if e_ > 0:
                kids.append((v, m, e_, o_, z_of(o_, e_, m)))
        direction = np.sign(h[member].sum() - tot)
        moved = [(v, m, e_, o_) for v, m, e_, o_, z in kids if abs(z) >= z_min and np.sign(z) == direction]
        if not moved:
            continue
        k_moved = sum(o for *_, o in moved) / sum(e for _, _, e, _ in moved)
        still_share = 0.0
        for v, m, e_, o_, z in kids:
            # Unmoved only where the others' move would have shown: low-traffic children prove nothing.
            if abs(z) < 2 and abs(z_of(k_moved * e_, e_, m)) >= z_min:
                still_share += e_ / tot
        # Children carrying a small part of the element's move are noise or
        # knock-on effects, not where the fault sits.
        dev = abs(h[member].sum() - tot)
        moved = [x for x in moved if abs(x[3] - x[2]) >= 0.1 * dev]
        if not moved:
            continue
        if still_share >= unmoved_share:
            # Keep the split only if the moved children, each with its own
            # ratio (the rest as expected), fit the data better than the whole
            # element moving by one ratio; of several dimensions, the best fit.
            k_all = h[member].sum() / tot
            whole = float(np.sum((h[member] - k_all * cur[member]) ** 2))
            split = float(np.sum((h[member] - cur[member]) ** 2))
            for _, m, e_, o_ in moved:
                split += float(np.sum((h[m] - (o_ / e_) * cur[m]) ** 2) - np.sum((h[m] - cur[m]) ** 2))
            if split < whole and (best is None or split < best[0]):
                best = (split, d, [(v, m) for v, m, _, _ in moved])
    if best is None:
        return None
    _, d, moved = best
    base = {c: str(v) for c, v in zip(sub, vals)}
    return [({**base, d: str(v)}, m) for v, m in moved]


def localize(
    leaves: pd.DataFrame,
    dims: Sequence[str],
    v: str | None = None,
    f: str | None = None,
    v_num: str | None = None,
    v_den: str | None = None,
    f_num: str | None = None,
    f_den: str | None = None,
    max_depth: int = 3,
    max_causes: int = 5,
    z_min: float = 4.0,
    min_gain: float = 0.05,
    v_vol: str | None = None,
    f_vol: str | None = None,
    max_volume_growth: float = 0.25,
) -> Localization:
    """Root causes of the difference between observed and expected (see module doc)."""
    dims = list(dims)
    ratio = v is None
    need = dims + ([v_num, v_den, f_num, f_den] if ratio else [v, f])
    missing = [c for c in need if c is None or c not in leaves.columns]
    if missing:
        return Localization([], "", float("nan"), float("nan"), 0, len(leaves),
                            f"leaf table lacks column(s) {missing}; give dims and either v/f (additive) or "
                            "v_num/v_den/f_num/f_den (ratio)")
    if leaves.empty:
        return Localization([], "", float("nan"), float("nan"), 0, 0, "the leaf table is empty")
    L = leaves.reset_index(drop=True)
    if ratio:
        vn, vd = L[v_num].to_numpy(float), L[v_den].to_numpy(float)
        fn, fd = L[f_num].to_numpy(float), L[f_den].to_numpy(float)
        obs_t, exp_t = _ratio_total(vn, vd), _ratio_total(fn, fd)
        with np.errstate(invalid="ignore", divide="ignore"):
            o = np.where(vd > 0, vn / vd, np.nan)
            e = np.where(fd > 0, fn / fd, np.nan)
            # A leaf's share of the change: what reverting it alone would undo.
            contrib = np.where(np.isfinite(o) & np.isfinite(e), (o - e) * vd, 0.0)
        measure = f"{v_num}/{v_den}"
    else:
        ov, ev = L[v].to_numpy(float), L[f].to_numpy(float)
        obs_t, exp_t = float(ov.sum()), float(ev.sum())
        contrib = ov - ev
        measure = v
    total = float(np.nansum(contrib))
    if not np.isfinite(total) or total == 0:
        return Localization([], measure, obs_t, exp_t, 0, len(L), None,
                            ["observed equals expected: nothing to explain"])
    # Work on the additive part that moved: hits (ratio; lookups are held at
    # their observed values) or the measure itself (additive).
    if ratio:
        h = vn
        fexp = np.where(np.isfinite(e), e, 0.0) * vd
    else:
        h, fexp = ov, ev
    dev_norm = float(np.sqrt(np.sum((h - fexp) ** 2)))
    loc = Localization([], measure, obs_t, exp_t, 0, len(L))
    if dev_norm == 0:
        loc.notes.append("observed equals expected: nothing to explain")
        return loc
    keys = {c: L[c].astype(str).to_numpy() for c in dims}
    subsets = [sub for k in range(1, max_depth + 1) for sub in itertools.combinations(dims, k)]
    cur = fexp.copy()  # expected, with the causes found so far applied (ripple effect)
    explained = 0.0
    taken = np.zeros(len(L), dtype=bool)
    base = pd.DataFrame({c: keys[c] for c in dims})
    while len(loc.causes) < max_causes:
        r0 = h - cur
        sq0 = float(np.sum(r0 * r0))
        base["h"], base["f"] = h, cur
        base["hh"], base["hf"], base["ff"], base["rr"] = h * h, h * cur, cur * cur, r0 * r0
        base["n"] = vd if ratio else 0.0
        base["vv"] = L[v_vol].to_numpy(float) if v_vol else 0.0
        base["fv"] = L[f_vol].to_numpy(float) if f_vol else 0.0
        base["free"] = ~taken
        best = None
        for sub in subsets:
            g = base[base["free"]].groupby(list(sub), sort=False)[["h", "f", "hh", "hf", "ff", "rr", "n", "vv",
                                                                  "fv"]].sum()
            g = g[g["f"] > 0]
            if g.empty:
                continue
            k = (g["h"] / g["f"]).to_numpy()
            # Residual if the element's leaves all moved by its own ratio k.
            within = g["hh"].to_numpy() - 2 * k * g["hf"].to_numpy() + k * k * g["ff"].to_numpy()
            new_sq = sq0 - g["rr"].to_numpy() + within
            ps = 1 - np.sqrt(np.maximum(new_sq, 0)) / dev_norm
            gain = ps - explained - 0.02 * (len(sub) - 1)
            # A cause moves the measure the way the total moved.
            gain = np.where(np.sign(g["h"].to_numpy() - g["f"].to_numpy()) == np.sign(total), gain, -np.inf)
            if v_vol and f_vol:  # grown traffic: pressure from upstream misses, an effect
                grew = g["vv"].to_numpy() > (1 + max_volume_growth) * np.maximum(g["fv"].to_numpy(), 1e-9)
                gain = np.where(grew, -np.inf, gain)
            if ratio:  # only moves beyond binomial noise may be causes
                n_e = np.maximum(g["n"].to_numpy(), 1)
                p_e = np.clip(g["f"].to_numpy() / n_e, 1e-6, 1 - 1e-6)
                z_e = (g["h"].to_numpy() - g["f"].to_numpy()) / np.sqrt(n_e * p_e * (1 - p_e))
                gain = np.where(np.abs(z_e) >= z_min, gain, -np.inf)
            i = int(np.argmax(gain))
            idx = g.index[i] if len(sub) > 1 else (g.index[i],)
            if best is None or gain[i] > best[0]:
                best = (gain[i], ps[i], sub, idx, k[i])
        if best is None or best[0] < min_gain:
            break
        gain, ps, sub, vals, k = best
        member = ~taken
        for c, val in zip(sub, vals):
            member &= keys[c] == str(val)
        parts = _refine(sub, vals, member, dims, keys, h, cur, vd if ratio else None, z_min) \
            if len(sub) < max_depth else None
        ep = float(np.nansum(contrib[member]) / total)
        if parts:
            # The element held leaves that did not move: keep only its children that did.
            for elem, m in parts:
                km = h[m].sum() / cur[m].sum() if cur[m].sum() else 1.0
                new_cur = np.where(m, cur * km, cur)
                ps_new = 1 - np.sqrt(np.sum((h - new_cur) ** 2)) / dev_norm
                loc.causes.append(RootCause(elem, float(ps_new - explained), float(np.nansum(contrib[m]) / total),
                                            int(m.sum()), int(m.sum())))
                cur, explained = new_cur, ps_new
                taken |= m
            continue
        loc.causes.append(RootCause({c: str(val) for c, val in zip(sub, vals)}, float(ps - explained), ep,
                                    int(member.sum()), int(member.sum())))
        cur = np.where(member, cur * k, cur)
        taken |= member
        explained = ps
    loc.abnormal_leaves = int(taken.sum())
    if not loc.causes:
        loc.notes.append("no combination of dimension values explains the change beyond noise")
    return loc
