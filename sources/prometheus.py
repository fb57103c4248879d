"""Prometheus source: the canonical ``lookups`` and ``requests`` frames from
the collectors' series, via prometheus-api-client.

Queries are built here, never from raw user text: label *names* come from a
fixed map of warmscope dimensions, label *values* (tenant, layer, … picked in
the UI) are escaped as PromQL string literals, and lists become an anchored,
regex-escaped ``=~`` alternation — so no input can change a query's meaning.
Counters are read raw per step and differenced (resets handled: a drop is a
new counter; a collector series first seen inside the range counts from 0; an
engine series only when its target's ``up`` or ``process_start_time_seconds``
shows it was born there, else from its first raw sample, as ``increase()``
would, so a lifetime count is never booked into one step); the step grows
with the range (about 300 points, at least the scrape interval). Each point is
stamped at the end of its step, as the embedded store stamps flush intervals.

Every failure — Prometheus down, slow, answering errors or something that is
not its API — becomes :class:`~analysis.sources.SourceError` naming the URL and
what to do.

Example::

    src = PrometheusSource("http://prometheus:9090")
    lookups = src.frame("lookups", start=t0, end=t1, filters={"tenant": ["acme", "globex"]})
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from warmscope.model import records
from warmscope.sources.base import ENGINE_FRAMES, SourceBase, SourceError

__all__ = [
    "PrometheusSource",
    "promql_string",
    "selector",
    "choose_step",
    "LABELS",
    "ENGINE_FRAMES",
    "engine_kind",
]

# Canonical frame column -> Prometheus label (OTel attribute with dots -> underscores).
# Canonical column -> Prometheus label, and the label columns of the lookup
# and request series: derived from the record declarations.
LABELS = dict(records.PROM_LABELS)
_LOOKUP_COLS = list(records.LOOKUP_LABELS)
_REQUEST_COLS = list(records.REQUEST_LABELS)
_MISS_COLS = [c for c in records.MISSES.labels if c != "family"]  # tenant, engine, miss_class
_KV_COLS = list(records.KV_BLOCKS.labels)  # engine, salt
_ESC = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding exactly ``value``."""
    return '"' + "".join(_ESC.get(ch, ch) for ch in str(value)) + '"'


def selector(metric: str, filters: Mapping[str, str | Sequence[str]] | None = None) -> str:
    """``metric{label="v", label=~"^(?:a|b)$"}`` from canonical column names."""
    parts = []
    for col, val in (filters or {}).items():
        if col not in LABELS:
            raise ValueError(f"cannot filter on {col!r}; dimensions: {', '.join(LABELS)}")
        if isinstance(val, str):
            parts.append(f"{LABELS[col]}={promql_string(val)}")
        else:
            vals = list(val)
            if not vals:
                continue
            alt = "|".join(re.escape(str(v)) for v in vals)
            parts.append(f"{LABELS[col]}=~{promql_string('^(?:' + alt + ')$')}")
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


# ---------------------------------------------------------------- engines
# Native engine metrics (vLLM, SGLang, LMCache), read as each engine exports
# them. Every name is matched in both forms: with colons (Prometheus 3.x, or
# the classic text format) and with the colons escaped to underscores (what a
# current prometheus_client answers Prometheus 2.x asking for OpenMetrics).
# Where both forms exist for one label set, the colon form is kept.
_HIT_NAMES = (
    r"vllm[:_]prefix_cache_hits_total|sglang[:_]cached_tokens_total"
    r"|lmcache[:_]num_hit_tokens(_total)?"
)
_QUERY_NAMES = (
    r"vllm[:_]prefix_cache_queries_total|sglang[:_]prompt_tokens_total"
    r"|lmcache[:_]num_requested_tokens(_total)?"
)
_SOURCE_NAMES = r"vllm[:_]prompt_tokens_cached_by_source_total|sglang[:_]cached_tokens_total"
_KV_NAMES = r"vllm[:_]kv_cache_usage_perc|sglang[:_]token_usage"
_ENGINE_COLS = ["engine_kind", "model", "instance", "engine"]
# read with the engine counters (PrometheusSource._engine_base)
_BASE_NAMES = ("up", "process_start_time_seconds")
_NAME_TAG = "warmscope_metric_name"  # a counter's name, kept through last_over_time()


def _by_name(name: str) -> str:
    return f"{{__name__={promql_string(name)}}}"


def engine_kind(metric_name: str) -> str:
    """``vllm`` / ``sglang`` / ``lmcache`` from a metric name in either form."""
    for kind in ("vllm", "sglang", "lmcache"):
        if metric_name.startswith((kind + ":", kind + "_")):
            return kind
    return "other"


def _dedupe_name_forms(series: list[dict[Any, Any]]) -> list[dict[Any, Any]]:
    """Drop escaped-name series whose colon twin (same labels) is present."""

    def key(m: dict[Any, Any]) -> tuple[Any, ...]:
        return tuple(sorted((k, v) for k, v in m.items() if k != "__name__"))

    colon = {
        (m.get("__name__", "").replace(":", "_"), key(m))
        for m in (s.get("metric", {}) for s in series)
        if ":" in m.get("__name__", "")
    }
    return [
        s
        for s in series
        if ":" in s.get("metric", {}).get("__name__", "")
        or (s.get("metric", {}).get("__name__", ""), key(s.get("metric", {}))) not in colon
    ]


def _engine_labels(m: Mapping[str, str]) -> tuple[str, str, str, str]:
    return (
        engine_kind(m.get("__name__", "")),
        m.get("model_name", ""),
        m.get("instance", ""),
        m.get("engine", ""),
    )


def choose_step(start: float, end: float, points: int = 300, minimum: float = 15.0) -> int:
    """A step (seconds) giving about ``points`` points, rounded to a clean value."""
    raw = max((end - start) / points, minimum)
    for s in (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400):
        if s >= raw:
            return s
    return int(math.ceil(raw / 86400) * 86400)


LOOKBACK_S = 300  # Prometheus' default lookback: how far back an instant selector finds a sample


def counter_window(step: int, lookback_s: int = LOOKBACK_S) -> int:
    """Seconds of samples behind each point of a counter read (at least the step and the
    lookback)."""
    return max(int(step), int(lookback_s))


def last_counts(sel: str, step: int, lookback_s: int = LOOKBACK_S) -> str:
    """The newest sample of ``sel`` behind each point, stale markers ignored.

    A plain selector vanishes at a staleness marker — written when a scrape
    fails or a target goes away — so a target that went down would lose the
    counts of its scrapes after the last point that still saw it (up to one
    step: an hour on week-long ranges). A range selector skips the markers.
    """
    return f"last_over_time({sel}[{counter_window(step, lookback_s)}s])"


# (series labels, time of the first point that sees it, its value there) -> the value its first
# increment is counted from: 0 when the counter was born in the range.
Base = Callable[[dict[Any, Any], float, float], float]


def _born_after_q0(q0: float, step: int) -> Base:
    """The collectors' rule: a series first seen after the grid's first point counts from 0."""
    return lambda _m, ts, fv: 0.0 if ts > q0 + step / 2 else fv


def _increments(
    series: list[dict[Any, Any]],
    labels: Callable[[dict[Any, Any]], tuple[Any, ...]],
    q0: float,
    step: int,
    start: float,
    base: Base | None = None,
) -> list[tuple[Any, ...]]:
    """(ts, *labels, increment) rows of counter series read on the grid from ``q0``: a drop is a
    reset (the new value is the increment); a series first seen after ``q0`` counts from
    ``base(metric, ts, value)`` (default: from 0, a counter born in the range); only points after
    ``start`` are kept."""
    base = base or _born_after_q0(q0, step)
    rows = []
    for s in series:
        m = s.get("metric", {})
        lab = labels(m)
        prev = None
        for ts, v in s.get("values", []):
            ts, fv = float(ts), float(v)
            if not math.isfinite(fv):
                continue
            if prev is None:
                d = fv - base(m, ts, fv) if ts > q0 + step / 2 else None
            else:
                d = fv - prev if fv >= prev else fv  # a drop is a reset
            prev = fv
            if d and ts > start:
                rows.append((ts, *lab, d))
    return rows


class PrometheusSource(SourceBase):
    """A :class:`~warmscope.sources.Source` for ``lookups``, ``requests`` and the engine frames,
    and the alerts Prometheus evaluates."""

    label = "Prometheus"
    kind = "prometheus"
    FRAMES_HELD = frozenset({"lookups", "requests", "misses", "kv_blocks", *ENGINE_FRAMES})

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        scrape_interval: float = 15.0,
        lookback_s: int = LOOKBACK_S,
    ) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.scrape_interval = scrape_interval
        self.lookback_s = int(lookback_s)  # Prometheus' --query.lookback-delta
        # One connect retry; no read or status retries: a slow or failing
        # Prometheus should be reported now, not after minutes of retrying.
        retry = Retry(total=1, connect=1, read=0, status=0, redirect=0, raise_on_status=False)
        # TLS certificates are verified unless WARMSCOPE_PROMETHEUS_INSECURE=1 says otherwise.
        insecure = os.environ.get("WARMSCOPE_PROMETHEUS_INSECURE", "").lower() in (
            "1",
            "true",
            "yes",
        )
        self._prom = PrometheusConnect(
            url=self.url, disable_ssl=insecure, timeout=timeout, retry=retry
        )

    def describe(self) -> str:
        return f"Prometheus · {self.url}"

    # ------------------------------------------------------------ querying
    def query_range(self, query: str, start: float, end: float, step: int) -> list[dict[Any, Any]]:
        return self._call(  # type: ignore[no-any-return]  # JSON list
            lambda: self._prom.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step}s",
            )
        )

    def metric_names(self, names_rx: str, start: float, end: float) -> list[str]:
        """The metric names matching ``names_rx`` (anchored, as PromQL does) with samples in [start,
        end]."""
        got = self._call(
            lambda: self._prom.get_label_values(
                "__name__",
                params={
                    "match[]": f"{{__name__=~{promql_string(names_rx)}}}",
                    "start": f"{start:.3f}",
                    "end": f"{end:.3f}",
                },
            )
        )
        rx = re.compile(names_rx)
        return sorted(n for n in got or [] if isinstance(n, str) and rx.fullmatch(n))

    def _call(self, ask: Callable[[], Any]) -> Any:
        """``ask()`` against the Prometheus API, its failures turned into one-line
        :class:`SourceError` s."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return ask()
        except requests.exceptions.Timeout:
            raise SourceError(
                f"Prometheus at {self.url} did not answer within {self.timeout:g} s; it may be "
                "overloaded — narrow the time range or raise the timeout"
            ) from None
        except requests.exceptions.ConnectionError as e:
            from urllib3.exceptions import ReadTimeoutError

            if isinstance(getattr(e.args[0], "reason", None) if e.args else None, ReadTimeoutError):
                raise SourceError(
                    f"Prometheus at {self.url} did not answer within {self.timeout:g} s; it may be "
                    "overloaded — narrow the time range or raise the timeout"
                ) from None
            raise SourceError(
                f"Prometheus at {self.url} is unreachable; start it or set "
                "WARMSCOPE_PROMETHEUS_URL to the right address"
            ) from None
        except PrometheusApiClientException as e:
            raise SourceError(
                f"Prometheus at {self.url} refused the query: {str(e)[:300]}"
            ) from None
        except (ValueError, KeyError, TypeError) as e:  # JSON decode or an unexpected body
            raise SourceError(
                f"Prometheus at {self.url} answered with something that is not the Prometheus "
                f"API ({type(e).__name__}); check the URL points at Prometheus itself"
            ) from None

    def _counter_grid(self, start: float, end: float) -> tuple[int, float]:
        """(step, first point) of a counter read: points fall on end, end - step, …, one step
        before ``start`` (the last point sees everything up to ``end``)."""
        step = max(choose_step(start, end), int(self.scrape_interval))
        return step, end - math.ceil((end - start) / step + 1) * step

    def _increase_frame(
        self,
        metric: str,
        cols: list[str],
        start: float,
        end: float,
        filters: Mapping[Any, Any] | None,
        value: str,
    ) -> pd.DataFrame:
        """Per-step increments of a counter, per label set.

        Raw series are read one step before the range and differenced here:
        a drop is a counter reset (the new value is the increment), and a
        series first seen inside the range is a counter born at 0 — so short
        series are counted whole, which ``increase()`` (it needs two samples
        and extrapolates) would not do. Each point is the newest sample of its
        :func:`counter_window` (:func:`last_counts`): a target that went down
        keeps the counts of its last scrapes.
        """
        step, q0 = self._counter_grid(start, end)
        series = self.query_range(
            last_counts(selector(metric, filters), step, self.lookback_s), q0, end, step
        )
        rows = _increments(
            series, lambda m: tuple(m.get(LABELS[c], "") for c in cols), q0, step, start
        )
        df = pd.DataFrame(rows, columns=["ts", *cols, value]).astype({"ts": float, value: float})
        if len(df):
            # groupby(as_index=False) gives a DataFrame; pandas-stubs say Series
            df = df.groupby(["ts", *cols], as_index=False, sort=True)[value].sum()  # type: ignore[assignment]
        return df

    def frame(
        self,
        name: str,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
        filters: Mapping[str, str | Sequence[str]] | None = None,
    ) -> pd.DataFrame:
        """``lookups`` or ``requests`` (canonical columns; counts are increments per step), or an
        engine frame (:meth:`engine_frame`). ``step`` is ignored: the step follows the range
        (:func:`choose_step`)."""
        if start is None or end is None:
            raise SourceError("give a time range: Prometheus frames are always windowed")
        if name in ENGINE_FRAMES:
            return self.engine_frame(name, start, end)
        if name == "lookups":
            df = self._increase_frame(
                "warmscope_cache_lookups_total", _LOOKUP_COLS, start, end, filters, "count"
            )
            return df[["ts", *_LOOKUP_COLS, "count"]]
        if name == "requests":
            req = self._increase_frame(
                "warmscope_requests_total", _REQUEST_COLS, start, end, filters, "requests"
            )
            base = [c for c in _REQUEST_COLS if c != "sla_met"]
            extra = {}
            for metric, col in (
                ("warmscope_gpu_time_seconds_total", "gpu_s"),
                ("warmscope_conversions_total", "conversions"),
                ("warmscope_conversion_value_total", "value"),
                ("warmscope_requests_unmeasured_total", "unmeasured"),
            ):
                f = {k: v for k, v in (filters or {}).items() if k != "sla_met"}
                extra[col] = self._increase_frame(metric, base, start, end, f, col)
            # GPU time and conversions carry no SLA label: spread them over the
            # SLA rows by request share (totals stay exact).
            out = req.copy()
            tot = out.groupby(["ts", *base])["requests"].transform("sum")
            share = (out["requests"] / tot.where(tot > 0)).fillna(0)
            for col, df in extra.items():
                merged = (
                    out[["ts", *base]]
                    .merge(df, on=["ts", *base], how="left")[col]
                    .fillna(0)
                    .to_numpy()
                )
                out[col] = merged * share.to_numpy()
            return out[
                ["ts", *_REQUEST_COLS, "requests", "gpu_s", "conversions", "value", "unmeasured"]
            ]
        if name == "misses":
            # No family label in Prometheus (schema.MISS_LABELS): the family column is "".
            df = self._increase_frame(
                "warmscope_kv_missed_tokens_total", _MISS_COLS, start, end, filters, "tokens"
            )
            df["family"] = ""
            df["requests"] = 0.0  # not exported: the store alone counts requests per class
            return df[list(records.MISSES.cols)]
        if name == "kv_blocks":
            f = {k: v for k, v in (filters or {}).items() if k in _KV_COLS}
            kv: pd.DataFrame | None = None
            for col in ("stored", "reused", "evicted"):
                metric = f"warmscope_kv_blocks_{col}_total"
                part = self._increase_frame(metric, _KV_COLS, start, end, f, col)
                kv = part if kv is None else kv.merge(part, on=["ts", *_KV_COLS], how="outer")
            assert kv is not None
            kv = kv.fillna({"stored": 0.0, "reused": 0.0, "evicted": 0.0})
            step, q0 = self._counter_grid(start, end)
            gauge = last_counts(selector("warmscope_kv_blocks_resident", f), step)
            rrows = []
            for s in self.query_range(gauge, q0, end, step):
                lab = tuple(s.get("metric", {}).get(LABELS[c], "") for c in _KV_COLS)
                rrows += [
                    (float(ts), *lab, float(v))
                    for ts, v in s.get("values", [])
                    if float(ts) > start and math.isfinite(float(v))
                ]
            rdf = pd.DataFrame(rrows, columns=["ts", *_KV_COLS, "resident"]).astype({"ts": float})
            # groupby(as_index=False) gives a DataFrame; pandas-stubs say Series
            rdf = rdf.groupby(
                ["ts", *_KV_COLS],  # type: ignore[assignment]
                as_index=False,
            )["resident"].sum()
            kv = kv.merge(rdf, on=["ts", *_KV_COLS], how="outer")
            # a step with a resident gauge and no counter increments has zero of them
            kv = kv.fillna({"stored": 0.0, "reused": 0.0, "evicted": 0.0, "resident": 0.0})
            kv = kv.sort_values(["ts", *_KV_COLS], ignore_index=True)
            return kv[list(records.KV_BLOCKS.cols)]
        raise SourceError(
            f"frame {name!r} does not come from Prometheus (it holds lookups, "
            "requests, misses and kv_blocks); "
            "hot keys, A/B units and warm-up runs come from Redis or the embedded store"
        )

    # ------------------------------------------------------------ engines
    def _raw_increments(
        self,
        names_rxs: Sequence[str],
        start: float,
        end: float,
        labels: Callable[[dict[Any, Any]], tuple[Any, ...]],
    ) -> list[list[tuple[Any, ...]]]:
        """Per-step increments of raw counters, one list per name pattern of ``names_rxs`` (resets
        as in :meth:`_increase_frame`; a series first seen inside the range counts from 0 only on
        the evidence of :meth:`_engine_base`).

        Every counter and the targets' ``up`` and ``process_start_time_seconds`` are read in one
        range query, so they all come from one view of the database: a scrape's samples are seen
        together or not at all. Read as one query per name, a scrape stored between two queries
        was counted in one name and not the other (one more scrape of queries than of hits)."""
        step, q0 = self._counter_grid(start, end)
        window = counter_window(step, self.lookback_s)
        names = self.metric_names("|".join(names_rxs), q0 - window, end)
        if not names:
            return [[] for _ in names_rxs]
        # last_over_time() drops the name, and the two forms of a name share label sets: each
        # part is tagged with its name, which `or` then keeps apart
        parts = [*names, *_BASE_NAMES]
        tag = promql_string(_NAME_TAG)
        query = " or ".join(
            f"label_replace({last_counts(_by_name(n), step, self.lookback_s)}, {tag}, "
            f"{promql_string(n)}, '', '')"
            for n in parts
        )
        series: dict[str, list[dict[Any, Any]]] = {n: [] for n in parts}
        for s in self.query_range(query, q0, end, step):
            m = dict(s.get("metric", {}))
            name = m.pop(_NAME_TAG, "")
            if name in series:
                s["metric"] = {**m, "__name__": name}
                series[name].append(s)
        base = self._engine_base(series, q0, step)
        out = []
        for rx in names_rxs:
            own = [s for n in names if re.fullmatch(rx, n) for s in series[n]]
            out.append(_increments(_dedupe_name_forms(own), labels, q0, step, start, base))
        return out

    def _engine_base(
        self, series: Mapping[str, list[dict[Any, Any]]], q0: float, step: int
    ) -> Base:
        """The value an engine counter first seen at ``ts`` (inside the range) counts from.

        Prometheus' ``increase()`` never counts a series' first sample as an
        increment: the value may hold the engine's whole lifetime (a new
        Prometheus, a Prometheus back after a gap, a target re-added). The
        first sample counts from 0 only on evidence that the counter was 0
        inside the range:

        * the target answered the previous point's scrapes (``up == 1``) without
          this series: the series was made since (a new label set, from 0); or
        * the target's process started inside the range
          (``process_start_time_seconds`` >= the grid's first point): every
          count it holds was made in the range.

        Otherwise the counter counts from its first raw sample (as
        ``increase()`` does, without extrapolation): the increments between
        the scrapes Prometheus saw. ``series`` holds the ``up`` and
        ``process_start_time_seconds`` series read with the counters."""
        up: dict[tuple[str, str], dict[float, float]] = {}
        started: dict[tuple[str, str], dict[float, float]] = {}
        for name, into in zip(_BASE_NAMES, (up, started), strict=True):
            for s in series.get(name, []):
                m = s.get("metric", {})
                into[(m.get("job", ""), m.get("instance", ""))] = {
                    round(float(ts), 3): float(v) for ts, v in s.get("values", [])
                }

        window = counter_window(step, self.lookback_s)

        def base(m: dict[Any, Any], ts: float, fv: float) -> float:
            target = (m.get("job", ""), m.get("instance", ""))
            if up.get(target, {}).get(round(ts - step, 3)) == 1.0:
                return 0.0
            t0 = started.get(target, {}).get(round(ts, 3))
            if t0 is not None and t0 >= q0:
                return 0.0
            return self._first_sample(m, ts, window, fv)

        return base

    def _first_sample(self, m: dict[Any, Any], ts: float, window: int, default: float) -> float:
        """The oldest raw sample of the series ``m`` in the ``window`` seconds up to ``ts``."""
        sel = "{" + ", ".join(f"{k}={promql_string(v)}" for k, v in sorted(m.items())) + "}"
        got = self._call(
            lambda: self._prom.custom_query(f"{sel}[{window}s]", params={"time": f"{ts:.3f}"})
        )
        values = [v for s in got or [] for v in s.get("values", [])]
        return float(min(values, key=lambda v: float(v[0]))[1]) if values else default

    def engine_frame(self, name: str, start: float, end: float) -> pd.DataFrame:
        """Engine frames (token counts are increments per step):

        * ``engine_prefix``: ts, engine_kind, model, instance, engine, hits, queries
          (prefix-cache hit and queried prompt tokens; the token-weighted hit
          rate of any group is sum(hits) / sum(queries));
        * ``engine_cached_by_source``: ts, engine_kind, model, instance, source, tokens;
        * ``engine_ttft``: ts, engine_kind, model, instance, quantile, seconds
          (P50/P95/P99 over a window of the step, at least four scrapes);
        * ``engine_kv_usage``: ts, engine_kind, model, instance, engine, usage (0–1).
        """
        if name == "engine_prefix":
            cols = ["ts", *_ENGINE_COLS]
            parts = []
            both = self._raw_increments((_HIT_NAMES, _QUERY_NAMES), start, end, _engine_labels)
            for rows, col in zip(both, ("hits", "queries"), strict=True):
                df = pd.DataFrame(rows, columns=[*cols, col]).astype({"ts": float, col: float})
                parts.append(df.groupby(cols, as_index=False)[col].sum())
            out = (
                parts[0].merge(parts[1], on=cols, how="outer").fillna({"hits": 0.0, "queries": 0.0})
            )
            # pandas-stubs type the column selection as Any
            return out.sort_values(cols, ignore_index=True)[[*cols, "hits", "queries"]]  # type: ignore[no-any-return]
        if name == "engine_cached_by_source":

            def lab(m: dict[Any, Any]) -> tuple[Any, ...]:
                return (*_engine_labels(m)[:3], m.get("source") or m.get("cache_source") or "all")

            (rows,) = self._raw_increments((_SOURCE_NAMES,), start, end, lab)
            cols = ["ts", "engine_kind", "model", "instance", "source"]
            df = pd.DataFrame(rows, columns=[*cols, "tokens"]).astype(
                {"ts": float, "tokens": float}
            )
            # groupby(as_index=False) gives a DataFrame; pandas-stubs say Series
            return df.groupby(cols, as_index=False)["tokens"].sum()  # type: ignore[return-value]
        step = max(choose_step(start, end), int(self.scrape_interval))
        start = (
            end - math.ceil((end - start) / step) * step
        )  # points on end, end - step, …: the newest is seen
        if name == "engine_ttft":
            win = f"{max(step, int(4 * self.scrape_interval))}s"
            rows = []
            for kind in ("vllm", "sglang"):
                for q in (0.5, 0.95, 0.99):
                    by = "sum by (le, instance, model_name)"
                    expr = (
                        f"histogram_quantile({q}, {by} "
                        f"(rate({kind}:time_to_first_token_seconds_bucket[{win}])) or {by} "
                        f"(rate({kind}_time_to_first_token_seconds_bucket[{win}])))"
                    )
                    for s in self.query_range(expr, start, end, step):
                        m = s.get("metric", {})
                        for ts, v in s.get("values", []):
                            if math.isfinite(float(v)):
                                rows.append(
                                    (
                                        float(ts),
                                        kind,
                                        m.get("model_name", ""),
                                        m.get("instance", ""),
                                        q,
                                        float(v),
                                    )
                                )
            return pd.DataFrame(
                rows, columns=["ts", "engine_kind", "model", "instance", "quantile", "seconds"]
            )
        if name == "engine_kv_usage":
            rows = []
            for s in _dedupe_name_forms(
                self.query_range(f"{{__name__=~{promql_string(_KV_NAMES)}}}", start, end, step)
            ):
                labels = _engine_labels(s.get("metric", {}))
                rows += [
                    (float(ts), *labels, float(v))
                    for ts, v in s.get("values", [])
                    if math.isfinite(float(v))
                ]
            df = pd.DataFrame(rows, columns=["ts", *_ENGINE_COLS, "usage"])
            # groupby(as_index=False) gives a DataFrame; pandas-stubs say Series
            return df.groupby(["ts", *_ENGINE_COLS], as_index=False)["usage"].max()  # type: ignore[return-value]
        raise SourceError(
            f"unknown engine frame {name!r}; engine frames: {', '.join(ENGINE_FRAMES)}"
        )

    # ------------------------------------------------------------ the rest of the Source interface
    def time_bounds(self) -> tuple[float, float] | None:
        """The last week up to now: Prometheus' retention decides what is there."""
        import time

        now = time.time()
        return now - 7 * 86400, now

    def _get(self, path: str) -> Any:
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=self.timeout) as r:
                body = json.loads(r.read())
        except (OSError, ValueError) as e:
            from warmscope.sources.alertmanager import _reason

            raise SourceError(
                f"Prometheus at {self.url} could not be read ({_reason(e)}); check "
                "WARMSCOPE_PROMETHEUS_URL"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise SourceError(
                f"Prometheus at {self.url} answered with something that is not the Prometheus "
                "API; check the URL points at Prometheus itself"
            )
        return body.get("data")

    def alerts(self) -> pd.DataFrame:
        """Pending and firing alerts of the rules Prometheus evaluates (``/api/v1/alerts``)."""
        from warmscope.sources.alertmanager import alert_rows

        data = self._get("/api/v1/alerts")
        return alert_rows(
            "prometheus", (data or {}).get("alerts", []) if isinstance(data, dict) else []
        )

    def health(self) -> str | None:
        try:
            self._get("/api/v1/status/buildinfo")
        except SourceError as e:
            return str(e)
        return None
