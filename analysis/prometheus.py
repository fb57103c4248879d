"""Prometheus source: the canonical ``lookups`` and ``requests`` frames from
the collectors' series, via prometheus-api-client.

Queries are built here, never from raw user text: label *names* come from a
fixed map of warmscope dimensions, label *values* (tenant, layer, … picked in
the UI) are escaped as PromQL string literals, and lists become an anchored,
regex-escaped ``=~`` alternation — so no input can change a query's meaning.
Counters are read raw per step and differenced (resets handled: a drop is a
new counter; a series born inside the range counts from 0); the step grows
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

import os

import math
import re
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

import pandas as pd

from .sources import SourceError

__all__ = ["PrometheusSource", "promql_string", "selector", "choose_step", "LABELS"]

# Canonical frame column -> Prometheus label (OTel attribute with dots -> underscores).
LABELS = {
    "tenant": "warmscope_tenant",
    "layer": "warmscope_cache_layer",
    "family": "warmscope_key_family",
    "result": "warmscope_cache_result",
    "experiment": "warmscope_experiment",
    "variant": "warmscope_variant",
    "model": "gen_ai_request_model",
    "replica": "warmscope_replica",
    "length_bucket": "warmscope_prompt_length_bucket",
    "sla_met": "warmscope_sla_met",
}
_LOOKUP_COLS = ["tenant", "layer", "family", "result", "experiment", "variant", "model", "replica", "length_bucket"]
_REQUEST_COLS = ["tenant", "experiment", "variant", "model", "replica", "sla_met"]
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


def choose_step(start: float, end: float, points: int = 300, minimum: float = 15.0) -> int:
    """A step (seconds) giving about ``points`` points, rounded to a clean value."""
    raw = max((end - start) / points, minimum)
    for s in (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400):
        if s >= raw:
            return s
    return int(math.ceil(raw / 86400) * 86400)


class PrometheusSource:
    label = "Prometheus"

    def __init__(self, url: str, timeout: float = 10.0, scrape_interval: float = 15.0) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.scrape_interval = scrape_interval
        # One connect retry; no read or status retries: a slow or failing
        # Prometheus should be reported now, not after minutes of retrying.
        retry = Retry(total=1, connect=1, read=0, status=0, redirect=0, raise_on_status=False)
        # TLS certificates are verified unless WARMSCOPE_PROMETHEUS_INSECURE=1 says otherwise.
        insecure = os.environ.get("WARMSCOPE_PROMETHEUS_INSECURE", "").lower() in ("1", "true", "yes")
        self._prom = PrometheusConnect(url=self.url, disable_ssl=insecure, timeout=timeout, retry=retry)

    def describe(self) -> str:
        return f"Prometheus · {self.url}"

    # ------------------------------------------------------------ querying
    def query_range(self, query: str, start: float, end: float, step: int) -> list[dict]:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return self._prom.custom_query_range(
                query, start_time=datetime.fromtimestamp(start, timezone.utc),
                end_time=datetime.fromtimestamp(end, timezone.utc), step=f"{step}s")
        except requests.exceptions.Timeout:
            raise SourceError(f"Prometheus at {self.url} did not answer within {self.timeout:g} s; it may be "
                              "overloaded — narrow the time range or raise the timeout") from None
        except requests.exceptions.ConnectionError as e:
            from urllib3.exceptions import ReadTimeoutError

            if isinstance(getattr(e.args[0], "reason", None) if e.args else None, ReadTimeoutError):
                raise SourceError(f"Prometheus at {self.url} did not answer within {self.timeout:g} s; it may be "
                                  "overloaded — narrow the time range or raise the timeout") from None
            raise SourceError(f"Prometheus at {self.url} is unreachable; start it or set WARMSCOPE_PROMETHEUS_URL "
                              "to the right address") from None
        except PrometheusApiClientException as e:
            raise SourceError(f"Prometheus at {self.url} refused the query: {str(e)[:300]}") from None
        except (ValueError, KeyError, TypeError) as e:  # JSON decode or an unexpected body
            raise SourceError(f"Prometheus at {self.url} answered with something that is not the Prometheus "
                              f"API ({type(e).__name__}); check the URL points at Prometheus itself") from None

    def _increase_frame(self, metric: str, cols: list[str], start: float, end: float,
                        filters: Mapping | None, value: str) -> pd.DataFrame:
        """Per-step increments of a counter, per label set.

        Raw series are read one step before the range and differenced here:
        a drop is a counter reset (the new value is the increment), and a
        series first seen inside the range is a counter born at 0 — so short
        series are counted whole, which ``increase()`` (it needs two samples
        and extrapolates) would not do.
        """
        step = max(choose_step(start, end), int(self.scrape_interval))
        # Points fall on end, end - step, …: the last one sees everything up to end.
        q0 = end - math.ceil((end - start) / step + 1) * step
        rows = []
        for series in self.query_range(selector(metric, filters), q0, end, step):
            m = series.get("metric", {})
            labels = tuple(m.get(LABELS[c], "") for c in cols)
            prev = None
            for ts, v in series.get("values", []):
                ts, fv = float(ts), float(v)
                if not math.isfinite(fv):
                    continue
                if prev is None:
                    d = fv if ts > q0 + step / 2 else None  # born in range: counts from 0
                else:
                    d = fv - prev if fv >= prev else fv  # a drop is a reset
                prev = fv
                if d and ts > start:
                    rows.append((ts, *labels, d))
        df = pd.DataFrame(rows, columns=["ts", *cols, value]).astype({"ts": float, value: float})
        if len(df):
            df = df.groupby(["ts", *cols], as_index=False, sort=True)[value].sum()
        return df

    def frame(self, name: str, start: float | None = None, end: float | None = None,
              filters: Mapping[str, str | Sequence[str]] | None = None) -> pd.DataFrame:
        """``lookups`` or ``requests`` (canonical columns; counts are increments per step)."""
        if start is None or end is None:
            raise SourceError("give a time range: Prometheus frames are always windowed")
        if name == "lookups":
            df = self._increase_frame("warmscope_cache_lookups_total", _LOOKUP_COLS, start, end, filters, "count")
            return df[["ts", *_LOOKUP_COLS, "count"]]
        if name == "requests":
            req = self._increase_frame("warmscope_requests_total", _REQUEST_COLS, start, end, filters, "requests")
            base = [c for c in _REQUEST_COLS if c != "sla_met"]
            extra = {}
            for metric, col in (("warmscope_gpu_time_seconds_total", "gpu_s"),
                                ("warmscope_conversions_total", "conversions"),
                                ("warmscope_conversion_value_total", "value")):
                f = {k: v for k, v in (filters or {}).items() if k != "sla_met"}
                extra[col] = self._increase_frame(metric, base, start, end, f, col)
            # GPU time and conversions carry no SLA label: spread them over the
            # SLA rows by request share (totals stay exact).
            out = req.copy()
            tot = out.groupby(["ts", *base])["requests"].transform("sum")
            share = (out["requests"] / tot.where(tot > 0)).fillna(0)
            for col, df in extra.items():
                merged = out[["ts", *base]].merge(df, on=["ts", *base], how="left")[col].fillna(0).to_numpy()
                out[col] = merged * share.to_numpy()
            return out[["ts", *_REQUEST_COLS, "requests", "gpu_s", "conversions", "value"]]
        raise SourceError(f"frame {name!r} does not come from Prometheus (it holds lookups and requests); "
                          "hot keys, A/B units and warm-up runs come from Redis or the embedded store")

    def frames(self, names: Iterable[str], start: float | None = None, end: float | None = None) -> dict:
        return {n: self.frame(n, start, end) for n in names}
