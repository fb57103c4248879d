"""Multi-dimensional root-cause localisation of a change.

Input: a *leaf table* — one row per combination of dimension values — with an
observed and an expected value of an additive measure (misses, lookups) or of a
ratio measure (hit rate = hits / lookups). Output: a ranked set of root-cause
*elements*, each a combination of dimension values such as
``{tenant=t3, layer=prefix_kv}``. Any categorical columns can be dimensions.

:func:`localize` is a short sequence of named steps over a :class:`Measure`
and :class:`Options`: :func:`residuals`, :func:`candidates`,
:func:`significant` (with :func:`additive_move` for the leaves' votes),
:func:`climb` / :func:`split`, :func:`cover`, :func:`absorb` and
:func:`explain`. The method and the reasoning behind each rule are in
``docs/rootcause.md``.

Example::

    loc = localize(leaves, ["tenant", "layer", "family"], v_num="hits", v_den="lookups",
                   f_num="hits_exp", f_den="lookups_exp")
    [c.element for c in loc.causes]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, NamedTuple, cast

import numpy as np

__all__ = [
    "RootCause",
    "Localization",
    "localize",
    "LeafTableError",
    "validate_leaves",
    "MAX_SUBSETS",
    "localize_measure",
    "Measure",
    "Options",
    "Residuals",
    "RatioResiduals",
    "AdditiveResiduals",
    "Search",
    "RatioSearch",
    "AdditiveSearch",
    "Sums",
    "residuals",
    "candidates",
    "significant",
    "additive_move",
    "climb",
    "split",
    "cover",
    "absorb",
    "explain",
]

MAX_SUBSETS = 400  # dimension subsets searched; beyond it the depth is bounded


class LeafTableError(ValueError):
    """The leaf table cannot be localised (the message names the row or column)."""


@dataclass(frozen=True)
class RootCause:
    element: dict[str, str]
    score: float
    explanatory_power: float
    leaves: int
    abnormal_leaves: int
    direction: int = 0  # +1 the element moved up, -1 down
    change: float = 0.0  # its leaves' signed change (measure units; ratio: rate points)

    def as_json(self) -> dict[str, Any]:
        return {
            "element": self.element,
            "score": _finite(self.score),
            "explanatory_power": _finite(self.explanatory_power),
            "direction": "up" if self.direction > 0 else "down",
        }


def _finite(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


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
    # observed − expected (ratio: in rate units, e.g. 0.031 = 3.1 points)
    change: float = float("nan")
    mix: float = 0.0  # part of the change due to the traffic mix alone (ratio measures)
    rest: float = 0.0  # part of the change in leaves outside the causes

    def ranked(self) -> list[RootCause]:
        """The causes by score, highest first (``causes`` is in the search's order): the order
        every page and the CLI show, so "the largest cause" is one cause everywhere."""
        return sorted(self.causes, key=lambda c: -c.score)


@dataclass(frozen=True)
class Options:
    """How :func:`localize` searches; each rule is explained in docs/rootcause.md."""

    max_depth: int | None = None  # most dimensions per element (None: all, see max_subsets)
    max_causes: int = 10  # most elements reported
    purity: float = 0.7  # weighted share of an element's votes its move needs
    alpha: float = 0.01  # family-wise error rate over all candidate elements
    max_volume_growth: float = 0.25  # ratio with volumes: more growth is downstream pressure
    load_effect: int = 1  # ratio with volumes: the way more traffic moves the rate
    max_subsets: int = MAX_SUBSETS  # dimension subsets searched; beyond it depth is bounded
    min_share: float | None = None  # least share of the change a cause holds (None: see below)
    sigma_floor: float = 0.005  # additive: least relative noise
    refine: bool = True  # split an element one level too coarse
    unmoved_share: float = 0.10  # split: share of an element that clearly did not move

    def share(self, ratio: bool) -> float:
        """The least share of the absolute change a cause must hold: as given, or by
        default 5 % for ratio measures (real rate data has many tiny leaves with extreme
        rates that move nothing) and none for additive ones."""
        if self.min_share is not None:
            return self.min_share
        return 0.05 if ratio else 0.0


@dataclass(frozen=True)
class Measure:
    """The measure localised: additive (``v`` observed, ``f`` expected) or a ratio
    (observed and expected numerator and denominator), with optional traffic volumes
    (``v_vol``, ``f_vol``) for a ratio."""

    v: str | None = None
    f: str | None = None
    v_num: str | None = None
    v_den: str | None = None
    f_num: str | None = None
    f_den: str | None = None
    v_vol: str | None = None
    f_vol: str | None = None

    @property
    def ratio(self) -> bool:
        return self.v is None and self.f is None

    @property
    def columns(self) -> list[str | None]:
        """The measure's columns: [v, f] or [v_num, v_den, f_num, f_den]."""
        return [self.v_num, self.v_den, self.f_num, self.f_den] if self.ratio else [self.v, self.f]

    @property
    def name(self) -> str:
        return f"{self.v_num}/{self.v_den}" if self.ratio else str(self.v)


def _ratio_total(num: np.ndarray, den: np.ndarray) -> float:
    d = den.sum()
    return float(num.sum() / d) if d else float("nan")


def _names(leaves: Any) -> list[str]:
    return [str(c) for c in (leaves.columns if hasattr(leaves, "columns") else leaves.keys())]


def _col(leaves: Any, c: str) -> np.ndarray:
    x = leaves[c]
    return x.to_numpy() if hasattr(x, "to_numpy") else np.asarray(x)


def _nrows(leaves: Any) -> int:
    if hasattr(leaves, "columns"):
        return len(leaves)
    names = _names(leaves)
    return len(_col(leaves, names[0])) if names else 0


def _factorize(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and the distinct values (as strings) of a dimension column."""
    if hasattr(x, "factorize"):  # a pandas Series: its own hash table
        cd, uniq = x.factorize(use_na_sentinel=False)
        return np.asarray(cd, dtype=np.int64), np.asarray([str(u) for u in uniq], dtype=object)
    seen: dict[str, int] = {}
    cd = np.fromiter((seen.setdefault(str(v), len(seen)) for v in x), dtype=np.int64, count=len(x))
    return cd, np.asarray(list(seen), dtype=object)


def _numeric(x: np.ndarray, c: str, row_offset: int) -> np.ndarray:
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        for i, val in enumerate(x):
            try:
                float(val)
            except (TypeError, ValueError):
                raise LeafTableError(
                    f"column {c!r}, row {i + row_offset}: {val!r} is not a number"
                ) from None
        raise


def validate_leaves(
    leaves: Any, dims: Sequence[str], cols: Sequence[str], ratio: bool, row_offset: int = 2
) -> dict[str, np.ndarray]:
    """Check a leaf table (a DataFrame or a mapping of column → array) and
    return its measure columns as floats; raise :class:`LeafTableError` naming
    the first bad row/column: missing columns, non-numeric, NaN/inf or
    negative values, numerator above denominator (ratio). ``row_offset`` turns
    a 0-based index into the row number a user sees (2: a CSV with a header
    line)."""
    names = _names(leaves)
    missing = [c for c in [*dims, *cols] if c not in names]
    if missing:
        raise LeafTableError(
            f"no column(s) {', '.join(map(str, missing))}; columns are {', '.join(names)}"
        )
    if _nrows(leaves) == 0:
        raise LeafTableError("the leaf table has no rows")
    out = {}
    for c in cols:
        arr = _numeric(_col(leaves, c), c, row_offset)
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise LeafTableError(
                f"column {c!r}, row {i + row_offset}: value is empty, NaN or infinite; "
                "give a finite number (0 for no traffic)"
            )
        if ratio and (arr < 0).any():
            i = int(np.flatnonzero(arr < 0)[0])
            raise LeafTableError(
                f"column {c!r}, row {i + row_offset}: negative count {arr[i]:g}; numerators and "
                "denominators of a ratio measure must be ≥ 0"
            )
        out[c] = arr
    if ratio:
        for n, d in ((cols[0], cols[1]), (cols[2], cols[3])):
            a, b = out[n], out[d]
            bad = a > b * (1 + 1e-9) + 1e-9
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise LeafTableError(
                    f"row {i + row_offset}: numerator {n}={a[i]:g} is above denominator "
                    f"{d}={b[i]:g}; a ratio measure needs numerator ≤ denominator"
                )
    return out


def contributions(leaves: Any, measure: Measure) -> tuple[np.ndarray, float]:
    """Each leaf's signed contribution to the change, and the part of the
    change no leaf holds (traffic mix). Additive: ``v − f`` (mix 0). Ratio:
    ``(num − den·rate_exp) / Σden`` in rate units — the leaves' contributions
    add up to the change at the observed traffic mix, and the mix term to the
    rest, so the two sum to observed − expected rate exactly."""
    # unchecked here: a column the measure does not name (None) fails in _col
    cols = [_col(leaves, c).astype(float) for c in measure.columns]  # type: ignore[arg-type]
    if not measure.ratio:
        v, f = cols
        return v - f, 0.0
    vn, vd, fn, fd = cols
    tot_v, tot_f = vd.sum(), fd.sum()
    if tot_v <= 0 or tot_f <= 0:
        return np.zeros(len(vn)), 0.0
    p0 = fn.sum() / tot_f
    with np.errstate(invalid="ignore", divide="ignore"):
        pe = np.where(fd > 0, fn / np.where(fd > 0, fd, 1), p0)
    c = (vn - vd * pe) / tot_v
    mix = float((vd * pe).sum() / tot_v - p0)
    return c, mix


def _subsets(
    dims: list[str], max_depth: int | None, budget: int
) -> tuple[list[tuple[int, ...]], int]:
    n = len(dims)
    top = n if max_depth is None else min(max_depth, n)
    out: list[tuple[int, ...]] = []
    depth = 0
    for k in range(1, top + 1):
        c = math.comb(n, k)
        if out and len(out) + c > budget:
            break
        out.extend(itertools.combinations(range(n), k))
        depth = k
    if depth < top and n <= 16:
        # single leaves are always candidates (cheap: the identity grouping)
        out.append(tuple(range(n)))
    return out, depth


@dataclass
class Residuals:
    """Step 1's result: each leaf's evidence, in the form the search sums per element
    (:class:`RatioResiduals` or :class:`AdditiveResiduals`)."""

    ok: np.ndarray  # leaves that carry evidence (observed or expected traffic)
    h: np.ndarray  # observed (ratio: numerator; additive: standardised log ratio)
    e: np.ndarray  # expected (ratio: numerator at the observed traffic; additive: 0)
    var: np.ndarray  # variance of h − e before over-dispersion
    z: np.ndarray  # standardised residual
    phi: float  # over-dispersion (variance factor)


@dataclass
class RatioResiduals(Residuals):
    vd: np.ndarray  # observed denominator
    pe: np.ndarray  # expected rate


@dataclass
class AdditiveResiduals(Residuals):
    size: np.ndarray  # expected value + floor: how much evidence a leaf can hold
    dv: np.ndarray  # observed − expected, in the measure's units
    fe: np.ndarray  # expected value (≥ 0)
    floor: float  # the floor added to both sides of a log ratio
    sigma: float  # the relative noise


def _ratio_residuals(
    vn: np.ndarray, vd: np.ndarray, fn: np.ndarray, fd: np.ndarray, fvol: np.ndarray | None
) -> RatioResiduals:
    """Binomial residuals of the numerator at the observed denominator, over-dispersion removed."""
    p0 = fn.sum() / fd.sum()
    pe = (fn + p0) / (fd + 1.0)  # one pseudo-event toward the overall rate
    pe = np.clip(pe, 1e-6, 1 - 1e-6)
    ok = vd > 0
    if fvol is not None:  # leaves that lost their traffic still count in an element's volume
        ok = ok | (fvol > 0)
    h, e = vn, vd * pe  # observed and expected numerator at observed traffic
    # A floor of one event: tiny counts prove little; no traffic, no evidence.
    var = np.where(vd > 0, np.maximum(vd * pe * (1 - pe), 1.0), 0.0)
    z = np.where(var > 0, (h - e) / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)
    zs = z[ok & (var >= 1.0)]
    mad = 1.4826 * float(np.median(np.abs(zs - np.median(zs)))) if len(zs) >= 10 else 1.0
    phi = max(1.0, mad) ** 2
    return RatioResiduals(ok, h, e, var, z / math.sqrt(phi), phi, vd=vd, pe=pe)


def _additive_residuals(
    ov: np.ndarray, ev: np.ndarray, sigma_floor: float, notes: list[str]
) -> AdditiveResiduals | None:
    """Log ratios in units of the robust relative noise; None when nothing moved."""
    # Multiplicative noise: log ratios, with a floor (the 5th percentile of
    # the positive expected values) so that small leaves prove little.
    neg = int(((ov < 0) | (ev < 0)).sum())
    if neg:
        notes.append(
            f"{neg} leaves with negative values: counted as 0 when judging noise, "
            "with their own values in the change"
        )
    ovp, evp = np.maximum(ov, 0.0), np.maximum(ev, 0.0)
    ok = (evp > 0) | (ovp > 0)
    pos = evp[evp > 0]
    floor = float(np.quantile(pos, 0.05)) if len(pos) else 1.0
    lr = np.log((ovp + floor) / (evp + floor))
    sides = [np.abs(lr[ok & (lr > 0)]), np.abs(lr[ok & (lr < 0)])]
    scales = [1.4826 * float(np.median(s)) for s in sides if len(s) >= 10]
    # Too few leaves on a side to estimate it: the median of all of them.
    sigma = (
        min(scales) if scales else 1.4826 * float(np.median(np.abs(lr[ok]))) if ok.any() else 0.0
    )
    sigma = max(sigma, sigma_floor) if ok.any() and np.abs(lr[ok]).max() > 0 else 0.0
    if not np.isfinite(sigma) or sigma <= 0:
        return None
    z = np.where(ok, lr / sigma, 0.0)
    return AdditiveResiduals(
        ok,
        h=z,
        e=np.zeros_like(z),
        var=np.ones_like(z),
        z=z,
        phi=1.0,
        size=evp + floor,
        dv=ov - ev,
        fe=evp,
        floor=floor,
        sigma=sigma,
    )


def _noise_ceiling(contrib: np.ndarray, z: np.ndarray, ok: np.ndarray) -> float:
    """The largest residual on the quieter side of zero: a single leaf must exceed it."""
    up, down = float(contrib[ok & (contrib > 0)].sum()), float(-contrib[ok & (contrib < 0)].sum())
    quiet = z[ok & (z < 0)] if up >= down else z[ok & (z > 0)]
    return float(np.abs(quiet).max()) if len(quiet) else 0.0


def _group(
    codes: list[np.ndarray], sizes: list[int], sub: tuple[int, ...]
) -> tuple[np.ndarray, int]:
    """Each leaf's element index under the dimension subset ``sub``, and the number of elements."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    space = 1
    for j in sub:
        if space * sizes[j] >= 1 << 62:  # renumber the keys seen so far before they would overflow
            uniq, key = np.unique(key, return_inverse=True)
            space = len(uniq)
        key = key * sizes[j] + codes[j]
        space *= sizes[j]
    if space <= max(4 * len(key), 1 << 16):
        # A small key space: number the keys that occur, in key order, without sorting.
        present = np.bincount(key, minlength=space) > 0
        return (np.cumsum(present) - 1)[key], int(present.sum())
    order = np.argsort(key, kind="stable")
    sk = key[order]
    flags = np.r_[True, sk[1:] != sk[:-1]] if len(sk) else np.zeros(0, dtype=bool)
    inv = np.empty(len(key), dtype=np.int64)
    inv[order] = np.cumsum(flags) - 1
    return inv, int(flags.sum())


def significant(
    dev: np.ndarray,
    var: np.ndarray,
    n: np.ndarray,
    phi: float,
    z_crit: float,
    ceiling: float,
    largest: np.ndarray | None = None,
) -> np.ndarray:
    """Step 3, significance: which elements moved beyond their leaves' noise.

    ``dev``, ``var`` and ``n`` are each element's summed residual, summed
    variance and leaf count; ``phi`` the over-dispersion. Rule: ``|Z| =
    |dev| / sqrt(var·phi) ≥ z_crit`` (the Bonferroni level over all candidate
    elements); an element of one leaf must also exceed ``ceiling``, the largest
    residual seen on the quieter side of zero (noise shows on both sides, a
    cause on one). With ``largest`` (each element's largest leaf |residual|),
    an element of several leaves must stay significant without that leaf, so
    that one outlier does not carry its parent."""
    z = dev / np.sqrt(np.maximum(var * phi, 1e-12))
    ok: np.ndarray = (n > 0) & (np.abs(z) >= z_crit) & ((n >= 2) | (np.abs(z) > ceiling))
    if largest is not None:
        rest = np.sqrt(np.maximum(var * (n - 1) / np.maximum(n, 1) * phi, 1e-12))
        ok &= (n < 2) | ((np.abs(dev) - largest) / rest >= z_crit)
    return ok


def additive_move(
    expected: np.ndarray, observed_sum: Any, expected_sum: Any, n: Any, floor: float
) -> np.ndarray:
    """Each leaf's log ratio under its element's move, for an additive measure.

    The move is the generalised ripple effect: every leaf of the element scales
    by one common factor ``k = (Σv + n·floor) / (Σf + n·floor)``, taken on the
    floored scale on which residuals are measured (``log((v + floor) /
    (f + floor))``), and no leaf can fall below zero: the moved leaf is
    ``max(k·(f + floor), floor)``. A leaf votes for the move when its own log
    ratio is nearer this than zero. A leaf far below the floor that went to
    zero thus moved as much as it could, and a tiny leaf's vote weighs little
    (the evidence a leaf can hold is its squared expected shift). Sums may be
    scalars or per-leaf arrays (each leaf's element's)."""
    fs = expected + floor
    k = (observed_sum + n * floor) / np.maximum(expected_sum + n * floor, 1e-300)
    out: np.ndarray = np.log(np.maximum(k * fs, floor) / fs)
    return out


class Grouping(NamedTuple):
    """The candidate elements of one dimension subset."""

    dims: tuple[int, ...]  # the dimension subset (indices into the dimensions)
    element: np.ndarray  # each leaf's element
    n_elements: int


@dataclass
class Sums:
    """One grouping's sums per element over its free leaves (kept up to date by
    :meth:`Search.take`); the measure's own sums in :class:`RatioSums` or :class:`AdditiveSums`."""

    observed: np.ndarray  # Σ h
    expected: np.ndarray  # Σ e
    var: np.ndarray  # Σ var
    leaves: np.ndarray  # how many free leaves

    @property
    def deviation(self) -> np.ndarray:
        dev: np.ndarray = self.observed - self.expected
        return dev


@dataclass
class RatioSums(Sums):
    den: np.ndarray  # Σ observed denominator
    vol: np.ndarray | None = None  # Σ observed traffic volume (with volumes)
    fvol: np.ndarray | None = None  # Σ expected traffic volume


@dataclass
class AdditiveSums(Sums):
    dv: np.ndarray  # Σ observed − expected, in the measure's units
    fe: np.ndarray  # Σ expected value


class Search:
    """The state of steps 3–6 over the leaves with evidence: each candidate element's sums,
    kept up to date as leaves are taken, and the tests of one element by its own move
    (:meth:`best`, :meth:`assess`). What depends on the measure is in :class:`RatioSearch`
    and :class:`AdditiveSearch`; :meth:`over` picks the one for the residuals."""

    # Step 4a: widen a cause to the parent whose other leaves moved too (:func:`climb`).
    climbs = False
    sums_type: type[Sums] = Sums  # each grouping's sums per element

    @staticmethod
    def over(r: Residuals, *args: Any) -> Search:
        """The search for ``r``'s measure, over the arguments of :class:`Search`."""
        return (RatioSearch if isinstance(r, RatioResiduals) else AdditiveSearch)(r, *args)

    def __init__(
        self,
        r: Residuals,
        codes: list[np.ndarray],
        sizes: list[int],
        subsets: list[tuple[int, ...]],
        vol: np.ndarray | None,
        fvol: np.ndarray | None,
        ceiling: float,
        opts: Options,
    ):
        """``vol``/``fvol``: observed and expected traffic per leaf (ratio measures: see
        :meth:`RatioSearch.excluded`); ``ceiling``: see :func:`significant`."""
        self.idx = idx = np.flatnonzero(r.ok)
        self.codes = [c[idx] for c in codes]
        self.h, self.e, self.var, self.phi = r.h[idx], r.e[idx], r.var[idx], r.phi
        # observed and expected traffic volume per leaf, both or none (ratio measures: see
        # RatioSearch.excluded)
        both = vol is not None and fvol is not None
        self.vol = vol[idx] if both else None  # type: ignore[index]
        self.fvol = fvol[idx] if both else None  # type: ignore[index]
        self.growth, self.load_effect = opts.max_volume_growth, opts.load_effect
        self._leaves(r, idx)
        self.ceiling, self.purity, self.unmoved_share = ceiling, opts.purity, opts.unmoved_share
        self.groups = [Grouping(sub, *_group(self.codes, sizes, sub)) for sub in subsets]
        n_cand = sum(g.n_elements for g in self.groups)
        self.z_crit = NormalDist().inv_cdf(1 - opts.alpha / max(2 * n_cand, 1))
        # one follow-up test of a chosen element's parent
        self.z_rest = NormalDist().inv_cdf(1 - opts.alpha)
        self.free = np.ones(len(idx), dtype=bool)
        self.abs_dev = np.abs(self.h - self.e)
        # Each leaf's saturated gain: its fit at its own value (see ``rank``).
        self.saturated = self._saturated()
        every = self._weights(slice(None))
        self.sums = [
            self.sums_type(**{k: np.bincount(g.element, w, g.n_elements) for k, w in every.items()})
            for g in self.groups
        ]

    # -- the measure's part
    def _leaves(self, r: Residuals, idx: np.ndarray) -> None:
        """Keep the measure's own per-leaf arrays of the leaves ``idx``."""
        raise NotImplementedError

    def _saturated(self) -> np.ndarray:
        raise NotImplementedError

    def _own(self) -> dict[str, np.ndarray]:
        """The measure's own per-leaf quantities, by the name of their sum in :attr:`sums_type`."""
        raise NotImplementedError

    def _weights(self, rows: slice | np.ndarray) -> dict[str, np.ndarray | None]:
        """The per-leaf quantities of the leaves ``rows`` summed per element, by the name of their
        sum (None: a count of leaves)."""
        own = {name: per_leaf[rows] for name, per_leaf in self._own().items()}
        return {
            "observed": self.h[rows],
            "expected": self.e[rows],
            "var": self.var[rows],
            "leaves": None,
            **own,
        }

    def purity_and_fit(self, mask: np.ndarray) -> tuple[float, float]:
        """Purity and fit of one set of leaves moving together (see :meth:`best`)."""
        raise NotImplementedError

    def votes(
        self, s: Sums, sel: np.ndarray, element: np.ndarray, count: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For the free leaves ``sel`` (``element``: each one's element) under their element's
        own move: each leaf's vote and weight, and each element's fit and saturated gain."""
        raise NotImplementedError

    def excluded(self, s: Sums) -> np.ndarray | None:
        """Elements left out before the purity test (None: none)."""
        return None

    def log_move(self, mask: np.ndarray) -> float:
        """The log of the common factor by which the leaves in ``mask`` moved."""
        raise NotImplementedError

    def unmoved_test(self, member: np.ndarray) -> Callable[[np.ndarray], tuple[float, float]]:
        """For :func:`split`: a child's (expected size, z its element's move would show in it)."""
        raise NotImplementedError

    # -- shared
    def take(self, member: np.ndarray) -> None:
        """Remove an explained element's leaves from every element's sums."""
        rows = np.flatnonzero(member)
        taken = self._weights(rows)
        for g, s in zip(self.groups, self.sums, strict=True):
            element = g.element[rows]
            for name, w in taken.items():
                total: np.ndarray = getattr(s, name)
                total -= np.bincount(element, w, g.n_elements)
        self.free &= ~member

    def assess(self, mask: np.ndarray) -> tuple[float, float, float]:
        """Z, purity and fit of one set of leaves moving together."""
        dev = float(self.h[mask].sum() - self.e[mask].sum())
        z = dev / math.sqrt(max(float(self.var[mask].sum()) * self.phi, 1e-12))
        return (z, *self.purity_and_fit(mask))

    def best(self) -> tuple[tuple[int, ...], np.ndarray, int] | None:
        """Step 3, the candidates' test and choice: of the elements of the free
        leaves that are :func:`significant` (and, with volumes, not downstream
        pressure) and *pure* — at least ``purity`` of their leaves' weighted
        votes for the element's own move (additive: :func:`additive_move`;
        ratio: the better of one factor or one common rate, votes weighted by
        the expected log-likelihood ratio) — the one whose move fits best
        (ratio: log-likelihood gain; additive: n·m²/2 for its mean standardised
        log ratio m), less the residue that move leaves in the element's own
        leaves (:func:`rank`). Returns (dimension subset, its free leaves,
        direction)."""
        best = None
        free = self.free.astype(float)
        for g, s in zip(self.groups, self.sums, strict=True):
            dev = s.deviation
            cand = significant(dev, s.var, s.leaves, self.phi, self.z_crit, self.ceiling)
            out = self.excluded(s)
            if out is not None:
                cand &= ~out
            if not cand.any():
                continue
            # Robust to one outlier: without its largest leaf the element must still be significant.
            largest = np.zeros(g.n_elements)
            np.maximum.at(largest, g.element, self.abs_dev * free)
            cand &= significant(dev, s.var, s.leaves, self.phi, self.z_crit, self.ceiling, largest)
            if not cand.any():
                continue
            # Votes only where they can matter: free leaves of the surviving elements.
            sel = np.flatnonzero(cand[g.element] & self.free)
            el = g.element[sel]
            vote, w, fit, sat = self.votes(s, sel, el, g.n_elements)
            weight = np.bincount(el, w, g.n_elements)
            purity = np.where(
                weight > 0,
                np.bincount(el, w * vote, g.n_elements) / np.maximum(weight, 1e-300),
                0.0,
            )
            cand &= purity >= self.purity
            if not cand.any():
                continue
            gain = np.where(cand, rank(fit, sat), -np.inf)
            i = int(np.argmax(gain))
            if best is None or gain[i] > best[0]:
                best = (gain[i], g.dims, g.element, i, int(np.sign(dev[i])))
        if best is None:
            return None
        _, sub, element, i, direction = best
        return sub, self.free & (element == i), direction

    def _element_of(self, sub: tuple[int, ...], row: int) -> np.ndarray:
        """The free leaves sharing ``row``'s values of the dimensions in ``sub``."""
        m = self.free.copy()
        for j in sub:
            m &= self.codes[j] == self.codes[j][row]
        return m


class RatioSearch(Search):
    """A ratio measure: events ``h`` in ``vd`` trials at expected rate ``pe`` per leaf; an
    element moves by one factor or to one common rate, whichever fits its leaves better."""

    climbs = True  # a cause of a rate seldom moves all its children alike
    sums_type = RatioSums

    def _leaves(self, r: Residuals, idx: np.ndarray) -> None:
        r = cast(RatioResiduals, r)
        self.vd, self.pe = r.vd[idx], r.pe[idx]

    def _saturated(self) -> np.ndarray:
        rate = np.clip(self.h / np.maximum(self.vd, 1e-12), 1e-6, 1 - 1e-6)
        return _binom_llr(self.h, self.vd, rate, self.pe)

    def _own(self) -> dict[str, np.ndarray]:
        own = {"den": self.vd}
        if self.vol is not None and self.fvol is not None:
            own |= {"vol": self.vol, "fvol": self.fvol}
        return own

    def move(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The moved rate of each leaf in ``mask`` under the model that fits the leaves
        better — all scaled by the element's factor, or all converged to its common rate —
        and each leaf's log-likelihood ratio against "unchanged"."""
        events, trials, rate = self.h[mask], self.vd[mask], self.pe[mask]
        factor = events.sum() / max(self.e[mask].sum(), 1e-12)
        common = events.sum() / max(trials.sum(), 1e-12)
        best = None
        for moved in (
            np.clip(factor * rate, 1e-6, 1 - 1e-6),
            np.clip(np.full_like(rate, common), 1e-6, 1 - 1e-6),
        ):
            llr = _binom_llr(events, trials, moved, rate)
            if best is None or llr.sum() > best[1].sum():
                best = (moved, llr)
        assert best is not None  # the loop runs twice
        return best

    def purity_and_fit(self, mask: np.ndarray) -> tuple[float, float]:
        trials, rate = self.vd[mask], self.pe[mask]
        moved, llr = self.move(mask)
        w = trials * _kl(moved, rate)
        vote = votes_ratio(self.h[mask], trials, rate, moved, self.unmoved_share)
        return float((w * vote).sum() / max(w.sum(), 1e-300)), float(llr.sum()) / self.phi

    def votes(
        self, s: Sums, sel: np.ndarray, element: np.ndarray, count: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        den = cast(RatioSums, s).den
        factor = np.where(s.expected > 0, s.observed / np.maximum(s.expected, 1e-12), 1.0)
        common = s.observed / np.maximum(den, 1e-12)
        events, trials, rate = self.h[sel], self.vd[sel], self.pe[sel]
        by_factor = np.clip(factor[element] * rate, 1e-6, 1 - 1e-6)
        to_common = np.clip(common[element], 1e-6, 1 - 1e-6)
        llr_factor = _binom_llr(events, trials, by_factor, rate)
        llr_common = _binom_llr(events, trials, to_common, rate)
        use_common = (
            np.bincount(element, llr_common, count) > np.bincount(element, llr_factor, count)
        )[element]
        moved = np.where(use_common, to_common, by_factor)
        llr = np.where(use_common, llr_common, llr_factor)
        vote = votes_ratio(events, trials, rate, moved, self.unmoved_share)
        w = trials * _kl(moved, rate)
        fit = np.bincount(element, llr, count) / self.phi
        sat: np.ndarray = np.bincount(element, self.saturated[sel], count) / self.phi
        return vote, w, fit, sat

    def excluded(self, s: Sums) -> np.ndarray | None:
        """Elements whose move the traffic volume explains rather than a cause
        of their own: downstream pressure, when misses upstream send more
        requests here, moves the measure the way more load does
        (``load_effect``: +1, up, for a hit rate — more traffic reuses more
        keys). Such a move is an effect when the element's traffic grew by more
        than ``max_volume_growth``, or when the added traffic alone could have
        brought it: beyond the expected volume every added event may count in
        the numerator (or none may, for ``load_effect`` −1). An element with no
        expected traffic at all has no expected rate of its own; it is judged
        within a parent that existed."""
        rs = cast(RatioSums, s)
        if rs.vol is None or rs.fvol is None:
            return None
        vol, fvol, dev = rs.vol, rs.fvol, s.deviation
        kept = np.where(vol > 0, np.minimum(fvol, vol) / np.maximum(vol, 1e-300), 1.0)
        if self.load_effect > 0:  # above: every added event a hit
            beyond = s.observed - (s.expected * kept + rs.den * (1 - kept))
        else:  # below: no added event a hit
            beyond = s.expected * kept - s.observed
        within = beyond < self.z_crit * np.sqrt(np.maximum(s.var * self.phi, 1e-12))
        grown = vol > (1 + self.growth) * np.maximum(fvol, 1e-9)
        added: np.ndarray = (fvol <= 0) | ((np.sign(dev) == self.load_effect) & (within | grown))
        return added

    def log_move(self, mask: np.ndarray) -> float:
        """``Σ num / Σ expected num``, as a log."""
        k = float(self.h[mask].sum()) / max(float(self.e[mask].sum()), 1e-12)
        return math.log(max(k, 1e-6))

    def unmoved_test(self, member: np.ndarray) -> Callable[[np.ndarray], tuple[float, float]]:
        # The shift each leaf would show under the element's own move (its better-fitting model).
        shift = np.zeros(len(self.h))
        shift[member] = self.vd[member] * self.move(member)[0] - self.e[member]

        def child(km: np.ndarray) -> tuple[float, float]:
            sd = math.sqrt(max(float(self.var[km].sum()) * self.phi, 1e-12))
            return float(self.e[km].sum()), float(shift[km].sum()) / sd

        return child


class AdditiveSearch(Search):
    """An additive measure: standardised log ratios per leaf; an element moves by one factor
    on the floored scale (:func:`additive_move`)."""

    sums_type = AdditiveSums

    def _leaves(self, r: Residuals, idx: np.ndarray) -> None:
        r = cast(AdditiveResiduals, r)
        self.size, self.dv, self.fe = r.size[idx], r.dv[idx], r.fe[idx]
        self.floor, self.sigma = r.floor, r.sigma

    def _saturated(self) -> np.ndarray:
        sat: np.ndarray = self.h * self.h / 2
        return sat

    def _own(self) -> dict[str, np.ndarray]:
        return {"dv": self.dv, "fe": self.fe}

    def purity_and_fit(self, mask: np.ndarray) -> tuple[float, float]:
        z, fe = self.h[mask], self.fe[mask]
        mean = z.sum() / len(z)
        moved = (
            additive_move(
                fe, float(fe.sum() + self.dv[mask].sum()), float(fe.sum()), len(fe), self.floor
            )
            / self.sigma
        )
        w = moved * moved
        vote = votes_additive(z, moved, self.unmoved_share)
        purity = float((w * vote).sum() / max(float(w.sum()), 1e-300))
        return purity, len(z) * mean * mean / 2

    def votes(
        self, s: Sums, sel: np.ndarray, element: np.ndarray, count: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        a = cast(AdditiveSums, s)
        n = s.leaves
        mean = s.observed / np.maximum(n, 1)  # the element's mean log ratio (noise units)
        moved = additive_move(
            self.fe[sel], (a.fe + a.dv)[element], a.fe[element], n[element], self.floor
        )
        moved /= self.sigma
        vote = votes_additive(self.h[sel], moved, self.unmoved_share)
        w = moved * moved  # the evidence the leaf can hold
        fit = n * mean * mean / 2
        sat = np.bincount(element, self.saturated[sel], count)
        return vote, w, fit, sat

    def log_move(self, mask: np.ndarray) -> float:
        """``(Σv + n·floor) / (Σf + n·floor)`` on the floored scale of the residuals (as in
        :func:`additive_move`), as a log."""
        fe, n = float(self.fe[mask].sum()), float(mask.sum())
        k = (fe + float(self.dv[mask].sum()) + n * self.floor) / max(fe + n * self.floor, 1e-300)
        return math.log(max(k, 1e-6))

    def unmoved_test(self, member: np.ndarray) -> Callable[[np.ndarray], tuple[float, float]]:
        mean = self.h[member].mean()  # the element's mean standardised log ratio

        def child(km: np.ndarray) -> tuple[float, float]:
            return float(self.size[km].sum()), mean * math.sqrt(float(km.sum()))

        return child


def votes_ratio(
    h: np.ndarray, n: np.ndarray, p: np.ndarray, rm: np.ndarray, share: float
) -> np.ndarray:
    """Step 3, purity votes (ratio measures): does each leaf move with its element? ``h``
    events in ``n`` trials at expected rate ``p``; ``rm`` the rate the element's move gives the
    leaf. Rule: a leaf moves with the element when it fits a move of its own, between ``share``
    (``unmoved_share``) and all of the element's, in log factors, better than "unchanged" —
    the binomial log-likelihood at ``p·(rm/p)^f`` beats ``p``, ``f`` the leaf's own fraction
    of the move clipped to [share, 1]. Reason: ``split`` counts a child as not moved with its
    element only under ``share`` of the element's move; a vote must use the same line, or a
    cause whose children moved unevenly (×2 beside ×6) is impure although no child of it is
    unmoved. Leaves with little evidence weigh little (the caller's weights)."""
    lm = np.log(rm / p)
    x = np.log(np.maximum(h, 1e-12) / np.maximum(n * p, 1e-12))  # the leaf's own log factor
    f = np.clip(np.where(lm != 0, x / np.where(lm != 0, lm, 1.0), 0.0), share, 1.0)
    out: np.ndarray = _binom_llr(h, n, np.clip(p * np.exp(f * lm), 1e-6, 1 - 1e-6), p) > 0
    return out


def votes_additive(hs: np.ndarray, ph: np.ndarray, share: float) -> np.ndarray:
    """Step 3, purity votes (additive measures): the rule of :func:`votes_ratio` on the
    standardised log ratios: leaf ``hs``, the element's move ``ph`` (:func:`additive_move`). A
    leaf moves with the element when it is nearer a move of its own fraction ``f`` of ``ph``,
    ``f`` clipped to [share, 1], than zero."""
    f = np.clip(np.where(ph != 0, hs / np.where(ph != 0, ph, 1.0), 0.0), share, 1.0)
    out: np.ndarray = np.abs(hs - f * ph) < np.abs(hs)
    return out


def rank(fit: np.ndarray, saturated: np.ndarray) -> np.ndarray:
    """Step 3, the choice among candidates: an element's fit less the residue
    its move leaves unexplained in its own leaves.

    ``fit`` is the gain of the element's one move over "unchanged" (ratio:
    log-likelihood; additive: n·m²/2), ``saturated`` the gain its leaves would
    have, each at its own value (ratio: each leaf's binomial log-likelihood
    ratio at its observed rate; additive: Σ z²/2); the residue ``saturated −
    fit`` is what the one move does not explain. Rule: rank by ``fit −
    residue``. Reason: ranked by fit alone, a parent that gathers a cause's
    leaves together with leaves that moved only partly, or not at all, can
    fit more in total than the cause itself while being pure enough; the
    cover then names that mix (a replica × layer × model holding the length
    buckets that went to zero next to a bucket that dropped a little) instead
    of the element whose leaves moved as one, as the generalised ripple effect
    has it. A cause whose siblings moved too is still widened afterwards by
    ``climb`` and ``absorb``."""
    out: np.ndarray = 2 * fit - saturated
    return out


def climb(
    search: Search, sub: tuple[int, ...], member: np.ndarray, direction: int
) -> tuple[tuple[int, ...], np.ndarray]:
    """Step 4a, climb (ratio measures): a cause of a rate seldom moves all its
    children alike. Rule: go up to a parent (one dimension fewer) when the
    parent's other leaves moved the same way on their own (|z| ≥ the one-test
    level at ``alpha``) and the parent is pure; of several, the purest, then the
    best fitting; repeat. Returns the (subset, free leaves) reached."""
    while len(sub) > 1:
        up_best = None
        row = int(np.flatnonzero(member)[0])
        for drop in sub:
            parent_dims = tuple(j for j in sub if j != drop)
            parent = search._element_of(parent_dims, row)
            rest = parent & ~member
            if not rest.any():
                continue
            z_rest, _, _ = search.assess(rest)
            _, purity, fit = search.assess(parent)
            if (
                np.sign(z_rest) == direction
                and abs(z_rest) >= search.z_rest
                and purity >= search.purity
                and (up_best is None or (purity, fit) > up_best[0])
            ):
                up_best = ((purity, fit), parent_dims, parent)
        if up_best is None:
            break
        _, sub, member = up_best
    return sub, member


def split(
    search: Search, sub: tuple[int, ...], member: np.ndarray, direction: int
) -> list[tuple[tuple[int, ...], np.ndarray]] | None:
    """Step 4b, split: an element one level too coarse. Rule: split it by one
    more dimension when children holding at least ``unmoved_share`` of its
    expected size (measure units, not leaves) clearly did not move with it and
    the children that did move fit better, each with its own move, than the
    whole element, after a price of z_crit²/2 per extra element. A child
    clearly did not move with the element, where the element's own move would
    have shown in it at the Bonferroni level, when it shows no move (|z| < 2)
    or a move of less than ``unmoved_share`` of the element's, as log factors
    (:meth:`Search.log_move`): the generalised ripple effect has every leaf of a
    cause move by one factor, and a child that kept nearly all it had while
    its siblings lost most is not part of that move. Returns [(subset,
    leaves)] of the moved children, or None."""
    z_crit = search.z_crit
    _, _, fit_element = search.assess(member)
    expected_in = search.unmoved_test(member)
    move_element = search.log_move(member)
    best = None
    for j, codes in enumerate(search.codes):
        if j in sub:
            continue
        values = np.unique(codes[member])
        if len(values) < 2:
            continue
        moved, unmoved, total_size, fit_split = [], 0.0, 0.0, 0.0
        for value in values:
            child = member & (codes == value)
            z_child, purity, fit = search.assess(child)
            size, z_expected = expected_in(child)
            total_size += size
            # Clearly not moved with the element: no move of its own (|z| < 2), or a move
            # under unmoved_share of the element's (log factors), where the element's
            # move would have shown at the Bonferroni level.
            if abs(z_expected) >= z_crit and (
                abs(z_child) < 2
                or move_element != 0
                and search.log_move(child) / move_element < search.unmoved_share
            ):
                unmoved += size
            elif (
                np.sign(z_child) == direction
                and abs(z_child) >= search.z_rest
                and purity >= search.purity
            ):
                moved.append(child)
                fit_split += fit
        # Each further element is one more parameter picked among many: it must pay
        # its way (a BIC-like price of z_crit²/2 in log-likelihood).
        fit_split -= (len(moved) - 1) * z_crit * z_crit / 2
        if (
            moved
            and total_size > 0
            and unmoved / total_size >= search.unmoved_share
            and fit_split > fit_element
            and (best is None or fit_split > best[0])
        ):
            best = (fit_split, j, moved)
    if best is None:
        return None
    _, j, moved = best
    return [(tuple(sorted((*sub, j))), child) for child in moved]


def _shortest(
    sub: tuple[int, ...], row: int, codes: list[np.ndarray], ok: np.ndarray
) -> tuple[int, ...]:
    """The shortest name for the same leaves: drop a dimension that does not narrow them."""

    def leaves_of(s: tuple[int, ...]) -> np.ndarray:
        m = ok.copy()
        for k in s:
            m &= codes[k] == codes[k][row]
        return m

    for j in list(sub):
        if len(sub) < 2:
            break
        wider = tuple(k for k in sub if k != j)
        if np.array_equal(leaves_of(wider), leaves_of(sub)):
            sub = wider
    return sub


def cover(
    search: Search,
    contrib: np.ndarray,
    codes: list[np.ndarray],
    names: list[tuple[str, np.ndarray]],
    ok: np.ndarray,
    max_causes: int,
    min_share: float,
    refine: bool,
) -> tuple[list[RootCause], np.ndarray]:
    """Step 5, cover: greedy. Rule: take the best candidate (:meth:`Search.best`),
    climb (ratio) and split it, name it by the fewest dimensions that select the
    same leaves, :func:`absorb` it, remove its leaves from every element's sums,
    and repeat until no candidate remains, a cause would hold less than
    ``min_share`` of the absolute change, or ``max_causes`` are found. Returns
    the causes and the leaves they hold (all rows)."""
    causes: list[RootCause] = []
    idx = search.idx
    taken_all = np.zeros(len(contrib), dtype=bool)
    total_abs_contrib = float(np.abs(contrib).sum()) or 1.0
    while len(causes) < max_causes and search.free.any():
        found = search.best()
        if found is None:
            break
        top_sub, top_member, direction = found
        if search.climbs:
            top_sub, top_member = climb(search, top_sub, top_member, direction)
        if (
            min_share > 0
            and abs(float(contrib[idx[top_member]].sum())) / total_abs_contrib < min_share
        ):
            break
        parts = split(search, top_sub, top_member, direction) if refine else None
        parts = parts or [(top_sub, top_member)]
        for sub, member in parts:
            row = idx[np.flatnonzero(member)[0]]
            sub = _shortest(sub, row, codes, ok)
            element = {names[j][0]: str(names[j][1][codes[j][row]]) for j in sub}
            # All leaves of the element (those without traffic included) for its share of the
            # change.
            full = ~taken_all
            for j in sub:
                full &= codes[j] == codes[j][row]
            cause = RootCause(
                element,
                score=float(np.abs(contrib[full]).sum() / total_abs_contrib),
                explanatory_power=float("nan"),
                leaves=int(full.sum()),
                abnormal_leaves=int(member.sum()),
                direction=direction,
                change=float(contrib[full].sum()),
            )
            causes = absorb(causes, cause)
            taken_all |= full
            search.take(member)
    return causes, taken_all


def absorb(causes: list[RootCause], new: RootCause) -> list[RootCause]:
    """Step 6, absorb: add ``new`` to the causes. Rule: an earlier cause below
    it (it names a subset of the earlier one's values) that moved the same way
    is part of it — its siblings moved too, on their own — so the parent names
    both: scores, leaves and changes add, in the place of the first child."""
    kids = [
        c
        for c in causes
        if c.direction == new.direction
        and len(c.element) > len(new.element)
        and new.element.items() <= c.element.items()
    ]
    if not kids:
        return [*causes, new]
    merged = replace(
        new,
        score=new.score + sum(c.score for c in kids),
        leaves=new.leaves + sum(c.leaves for c in kids),
        abnormal_leaves=new.abnormal_leaves + sum(c.abnormal_leaves for c in kids),
        change=new.change + sum(c.change for c in kids),
    )
    first = min(causes.index(c) for c in kids)
    rest = [c for c in causes if c not in kids]
    return [*rest[:first], merged, *rest[first:]]


def explain(loc: Localization, total: float, mix: float, sum_contrib: float) -> None:
    """Step 7, explain. Rule: the total change splits exactly into the causes'
    changes, the rest of the leaves (``loc.rest`` = Σ contributions − Σ causes)
    and the traffic mix; a part's explanatory power is its change over the sum
    of all parts' absolute changes, signed so that a part moving with the total
    is positive — the |shares| add up to 100 %."""
    loc.change = float(total) if np.isfinite(total) else float("nan")
    loc.mix = mix
    loc.rest = float(sum_contrib - sum(c.change for c in loc.causes))
    gross = sum(abs(c.change) for c in loc.causes) + abs(loc.rest) + abs(mix)
    sign = 1.0 if not np.isfinite(total) or total >= 0 else -1.0
    loc.causes = [
        replace(c, explanatory_power=sign * c.change / gross if gross > 0 else float("nan"))
        for c in loc.causes
    ]


def _measure_columns(
    leaves: Any, dims: list[str], cols: list[Any], ratio: bool, validate: bool
) -> tuple[dict[Any, np.ndarray] | None, str | None]:
    """The measure columns as floats, or the reason they cannot be used."""
    if any(c is None for c in cols):
        return (
            None,
            "give either v and f (additive measure) or v_num, v_den, f_num and f_den "
            "(ratio measure)",
        )
    names = _names(leaves)
    missing = [c for c in dims + cols if c not in names]
    if missing:
        return None, (
            f"leaf table lacks column(s) {missing}; give dims and either v/f (additive) or "
            "v_num/v_den/f_num/f_den (ratio)"
        )
    if _nrows(leaves) == 0:
        return None, "the leaf table is empty"
    if not validate:
        return {c: _col(leaves, c).astype(float) for c in cols}, None
    try:
        return validate_leaves(leaves, dims, cols, ratio, row_offset=0), None
    except LeafTableError as e:
        return None, str(e)


def localize(
    leaves: Any,
    dims: Sequence[str],
    v: str | None = None,
    f: str | None = None,
    v_num: str | None = None,
    v_den: str | None = None,
    f_num: str | None = None,
    f_den: str | None = None,
    max_depth: int | None = None,
    max_causes: int = 10,
    purity: float = 0.7,
    alpha: float = 0.01,
    v_vol: str | None = None,
    f_vol: str | None = None,
    max_volume_growth: float = 0.25,
    load_effect: int = 1,
    max_subsets: int = MAX_SUBSETS,
    min_share: float | None = None,
    sigma_floor: float = 0.005,
    refine: bool = True,
    unmoved_share: float = 0.10,
    validate: bool = True,
) -> Localization:
    """Root causes of the difference between observed and expected: the columns
    name a :class:`Measure`, the rest are :class:`Options` (docs/rootcause.md)."""
    measure = Measure(
        v=v, f=f, v_num=v_num, v_den=v_den, f_num=f_num, f_den=f_den, v_vol=v_vol, f_vol=f_vol
    )
    opts = Options(
        max_depth=max_depth,
        max_causes=max_causes,
        purity=purity,
        alpha=alpha,
        max_volume_growth=max_volume_growth,
        load_effect=load_effect,
        max_subsets=max_subsets,
        min_share=min_share,
        sigma_floor=sigma_floor,
        refine=refine,
        unmoved_share=unmoved_share,
    )
    return localize_measure(leaves, dims, measure, opts, validate)


def localize_measure(
    leaves: Any,
    dims: Sequence[str],
    measure: Measure,
    opts: Options | None = None,
    validate: bool = True,
) -> Localization:
    """:func:`localize` over a measure object and options: the named steps in order."""
    opts = opts or Options()
    dims = list(dims)
    loc, cols = _start(leaves, dims, measure, validate)
    if cols is None:
        return loc
    res = residuals(measure, cols, opts, loc.notes)  # 1. residuals
    if res is None:
        loc.notes.append("observed equals expected: nothing to explain")
        return loc
    subsets = candidates(dims, opts, loc.notes)  # 2. candidates
    factorized = [_factorize(leaves[c]) for c in dims]
    codes = [cd for cd, _ in factorized]
    contrib, mix = contributions(cols, measure)
    search = Search.over(
        res,
        codes,
        [len(u) for _, u in factorized],
        subsets,
        cols.get(measure.v_vol),
        cols.get(measure.f_vol),
        _noise_ceiling(contrib, res.z, res.ok),
        opts,
    )
    names = [(dims[j], factorized[j][1]) for j in range(len(dims))]
    # 3.–6. significance and purity, climb/split, cover, absorb (see cover)
    loc.causes, taken_all = cover(
        search,
        contrib,
        codes,
        names,
        res.ok,
        opts.max_causes,
        opts.share(measure.ratio),
        opts.refine,
    )
    loc.abnormal_leaves = int(taken_all.sum())
    explain(loc, loc.observed - loc.expected, mix, float(contrib.sum()))  # 7. explain
    if not loc.causes:
        loc.notes.append(
            "no combination of dimension values moved beyond the leaves' own noise "
            f"(Bonferroni z ≥ {search.z_crit:.1f}, purity ≥ {opts.purity:.0%})"
        )
    return loc


def _start(
    leaves: Any, dims: list[str], measure: Measure, validate: bool
) -> tuple[Localization, dict[Any, np.ndarray] | None]:
    """The empty result with the totals, and the measure's columns as floats (None
    when there is nothing to localise: the reason is in the result)."""
    nrows = _nrows(leaves)
    cols, err = _measure_columns(leaves, dims, measure.columns, measure.ratio, validate)
    if cols is None:
        return Localization([], "", float("nan"), float("nan"), 0, nrows, err), None
    if measure.v_vol and measure.f_vol and measure.ratio:
        for c in (measure.v_vol, measure.f_vol):
            cols[c] = _col(leaves, c).astype(float)
    if measure.ratio:
        vd, fd = cols[measure.v_den], cols[measure.f_den]
        obs_t, exp_t = _ratio_total(cols[measure.v_num], vd), _ratio_total(cols[measure.f_num], fd)
    else:
        obs_t, exp_t = float(cols[measure.v].sum()), float(cols[measure.f].sum())
    loc = Localization([], measure.name, obs_t, exp_t, 0, nrows)
    if measure.ratio and (fd.sum() <= 0 or vd.sum() <= 0):
        loc.notes.append("no traffic in the observed or the expected period: nothing to compare")
        return loc, None
    return loc, cols


def residuals(
    measure: Measure, cols: dict[Any, np.ndarray], opts: Options, notes: list[str]
) -> Residuals | None:
    """Step 1, residuals: each leaf's standardised evidence of a change.

    Additive: ``log((v + floor) / (f + floor)) / σ`` — multiplicative noise, the
    floor (5th percentile of the positive expected values) so a leaf from
    nothing is not infinitely abnormal, ``σ`` the robust relative noise.
    Ratio: binomial residuals of the numerator at the observed denominator,
    over-dispersion removed. None when nothing moved: no leaf carries evidence."""
    if measure.ratio:
        fvol = cols.get(measure.f_vol) if measure.v_vol else None
        res: Residuals | None = _ratio_residuals(
            cols[measure.v_num], cols[measure.v_den], cols[measure.f_num], cols[measure.f_den], fvol
        )
    else:
        res = _additive_residuals(cols[measure.v], cols[measure.f], opts.sigma_floor, notes)
    if res is None or not res.ok.any():
        return None
    dev_total = float(np.abs(res.h - res.e)[res.ok].sum())
    return res if dev_total > 0 and np.isfinite(dev_total) else None


def candidates(dims: Sequence[str], opts: Options, notes: list[str]) -> list[tuple[int, ...]]:
    """Step 2, candidates: the dimension subsets whose elements are searched.

    All subsets of 1…``max_depth`` dimensions while their number stays within
    ``max_subsets`` (the search is linear in it); beyond, the depth is bounded
    (a note says so) and single leaves stay candidates (the subset of all
    dimensions)."""
    n = len(dims)
    if n > 10 and opts.max_depth is None:
        notes.append(
            f"{n} dimensions: the search is bounded (at most {opts.max_subsets} dimension "
            "subsets; single leaves are always candidates)"
        )
    subsets, depth = _subsets(list(dims), opts.max_depth, opts.max_subsets)
    if opts.max_depth is None and depth < n <= 10:
        notes.append(f"elements of up to {depth} dimensions (and single leaves) were searched")
    return subsets


def _binom_llr(k: np.ndarray, n: np.ndarray, p1: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """log L(p1) − log L(p0) for k events in n trials."""
    llr: np.ndarray = k * np.log(p1 / p0) + (n - k) * np.log((1 - p1) / (1 - p0))
    return llr


def _kl(p1: np.ndarray, p0: np.ndarray) -> np.ndarray:
    kl: np.ndarray = p1 * np.log(p1 / p0) + (1 - p1) * np.log((1 - p1) / (1 - p0))
    return kl
