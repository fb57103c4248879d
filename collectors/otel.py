"""OpenTelemetry export: observable instruments read the aggregator at export.

Counters are OTel *observable* counters whose callbacks sum the aggregator's
per-thread dicts, so the SDK's cost is paid once per export interval instead of
~7 µs per lookup. The OTel API has no observable histogram, so the request
histograms (already bucketed by the aggregator) reach each exporter through
warmscope's readers (:class:`InMemoryReader`, :class:`PeriodicReader`,
:class:`PrometheusReader`) by public routes only:

* a reader's collection runs the observable callbacks of every pipeline on its meter provider
  on the collecting thread; each callback notes its pipeline there, and the reader binds the
  pipelines noted during its own collection (:class:`Histograms`), so it exports the histograms
  of the pipelines it reads and of no other provider's;
* the in-memory reader adds them to what ``get_metrics_data()`` returns, the periodic reader's
  exporter adds them to each batch before the wrapped exporter sends it, and the Prometheus
  reader registers a prometheus_client custom collector beside the OTel one that yields them as
  histogram families at each scrape.

With a meter provider whose readers are not warmscope's, counters still export and
histograms do not.

``exporter = "otlp"`` sends OTLP/HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default
``http://127.0.0.1:4318``); ``exporter = "prometheus"`` serves a scrape endpoint
on ``prometheus_addr:prometheus_port``.

Example (tests)::

    reader = InMemoryReader()
    provider = MeterProvider(metric_readers=[reader])
    tel = Telemetry(cfg, meter_provider=provider, background=False)
    data = reader.get_metrics_data()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    Counter,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import (
    Histogram as HistogramInstrument,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import HistogramMetricFamily
from warmscope.model import records, schema
from warmscope.model.records import COLUMN_ATTRS, prom_label

from .aggregator import H_COUNT, H_SUM, HISTOGRAM_LABELS, HISTOGRAMS, Aggregator
from .warm_tracking import S_BYTES, S_GPU_S, S_KEYS, S_RUNS

__all__ = [
    "OTelBridge",
    "Histograms",
    "InMemoryReader",
    "PeriodicReader",
    "PrometheusReader",
    "SCOPE",
    "build_provider",
    "stop_server",
]

SCOPE = "warmscope.collectors"
_CARDINALITY = 100_000  # our own caps bound series; the SDK default (2000) would drop some

# The pipelines whose observable callbacks ran on this thread since a warmscope reader last
# started a collection here (OTelBridge notes them; a reader binds them, see Histograms).
_SEEN = threading.local()


def _seen() -> dict[int, tuple[Aggregator, int]]:
    seen: dict[int, tuple[Aggregator, int]] | None = getattr(_SEEN, "aggs", None)
    if seen is None:
        seen = _SEEN.aggs = {}
    return seen


class Histograms:
    """The aggregators whose request histograms one reader exports (several pipelines may share
    a provider, e.g. simulated replicas), each with the time its pipeline started."""

    def __init__(self) -> None:
        self._aggs: list[tuple[Aggregator, int]] = []

    @staticmethod
    def start() -> None:
        """A collection starts on this thread: forget the pipelines seen before it."""
        _seen().clear()

    def bind_seen(self) -> None:
        """Bind the pipelines whose callbacks this thread's collection ran (once each)."""
        seen = _seen()
        for agg, start_ns in seen.values():
            if all(a is not agg for a, _ in self._aggs):
                self._aggs.append((agg, start_ns))
        seen.clear()

    def inject(self, md: MetricsData) -> MetricsData:
        """``md`` with the histograms added (in the scope ``SCOPE``)."""
        for agg, start_ns in self._aggs:
            try:
                md = _inject(md, agg, start_ns)
            except Exception as e:  # never break export
                agg.count_error("export", "histogram injection", e)
        return md

    def families(self, prefix: str = "", scope_labels: bool = True) -> list[HistogramMetricFamily]:
        """The histograms as Prometheus metric families, one per histogram, named and labelled
        as the OTel Prometheus exporter names and labels what it translates (each pipeline's
        points with its own scope: ``SCOPE`` and the replica as the scope's version)."""
        by_name: dict[str, tuple[Metric, list[dict[str, str]], list[HistogramDataPoint]]] = {}
        for agg, start_ns in self._aggs:
            try:
                scope = {"otel_scope_name": SCOPE, "otel_scope_version": agg.replica}
                scope["otel_scope_schema_url"] = ""
                for m in _histogram_metrics(agg, start_ns):
                    _, rows, points = by_name.setdefault(m.name, (m, [], []))
                    assert isinstance(m.data, Histogram)
                    for p in m.data.data_points:
                        attrs = {prom_label(k): str(v) for k, v in (p.attributes or {}).items()}
                        rows.append({**(scope if scope_labels else {}), **attrs})
                        points.append(p)
            except Exception as e:  # never break a scrape
                agg.count_error("export", "histogram families", e)
        return [_family(m, rows, points, prefix) for m, rows, points in by_name.values()]


def _family(
    m: Metric, rows: list[dict[str, str]], points: list[HistogramDataPoint], prefix: str
) -> HistogramMetricFamily:
    inst = next(h for h, _ in HISTOGRAMS if h.name == m.name)
    keys = sorted({k for r in rows for k in r})
    name = schema.prom_name(inst)
    fam = HistogramMetricFamily(
        f"{prefix}_{name}" if prefix else name,
        m.description or "",
        labels=keys,
        unit=schema.prom_unit(inst),
    )
    for row, p in zip(rows, points, strict=True):
        cumulative, buckets = 0, []
        for edge, n in zip([*p.explicit_bounds, "+Inf"], p.bucket_counts, strict=True):
            cumulative += n
            buckets.append((f"{edge}", cumulative))
        fam.add_metric([row.get(k, "") for k in keys], buckets=buckets, sum_value=p.sum)
    return fam


def _limits() -> dict[type, int]:
    return {
        t: _CARDINALITY
        for t in (
            Counter,
            UpDownCounter,
            HistogramInstrument,
            ObservableCounter,
            ObservableUpDownCounter,
            ObservableGauge,
        )
    }


class InMemoryReader(InMemoryMetricReader):
    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cardinality_limits", _limits())
        self.histograms = Histograms()
        super().__init__(**kw)

    def get_metrics_data(self) -> MetricsData | None:
        self.histograms.start()
        md = super().get_metrics_data()
        self.histograms.bind_seen()
        return None if md is None else self.histograms.inject(md)


class _HistogramExporter(MetricExporter):
    """Adds a reader's histograms to each batch, then lets the wrapped exporter send it."""

    def __init__(self, inner: MetricExporter, histograms: Histograms) -> None:
        # The wrapped exporter's preferences, as MetricExporter keeps them (and
        # PeriodicExportingMetricReader reads them); the SDK's defaults when it has none.
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner, self.histograms = inner, histograms

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kw: Any
    ) -> MetricExportResult:
        self.histograms.bind_seen()  # the collection that made this batch ran on this thread
        md = self.histograms.inject(metrics_data)
        return self.inner.export(md, timeout_millis=timeout_millis, **kw)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kw)


class PeriodicReader(PeriodicExportingMetricReader):
    """Exports through ``exporter`` with the histograms added. Its own thread collects on a
    timer; a flush or the shutdown collects on the caller's thread (they start the collection)."""

    def __init__(self, exporter: MetricExporter, **kw: Any) -> None:
        kw.setdefault("cardinality_limits", _limits())
        self.histograms = Histograms()
        super().__init__(_HistogramExporter(exporter, self.histograms), **kw)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        self.histograms.start()
        return super().force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
        self.histograms.start()
        super().shutdown(timeout_millis, **kw)


class _ScrapeStart:
    """A prometheus_client collector registered before the OTel one: a scrape's collection
    starts (its collectors run in the order they were registered)."""

    def __init__(self, histograms: Histograms) -> None:
        self.histograms = histograms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        self.histograms.start()
        yield from ()


class _HistogramCollector:
    """A prometheus_client custom collector registered after the OTel one: the histograms of the
    pipelines the scrape's collection ran, as metric families."""

    def __init__(self, histograms: Histograms, prefix: str, scope_labels: bool) -> None:
        self.histograms, self.prefix, self.scope_labels = histograms, prefix, scope_labels

    def collect(self) -> Iterator[HistogramMetricFamily]:
        self.histograms.bind_seen()
        yield from self.histograms.families(self.prefix, self.scope_labels)


def _prometheus_reader_cls() -> type[Any]:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, CollectorRegistry

    class PrometheusReader(PrometheusMetricReader):
        """The OTel Prometheus reader, and beside its collector on ``registry`` one that yields
        the histograms (``resource_attribute_filter`` labels the counters only)."""

        def __init__(
            self,
            registry: CollectorRegistry = REGISTRY,
            prefix: str = "",
            scope_info_enabled: bool = True,
            **kw: Any,
        ) -> None:
            kw.setdefault("cardinality_limits", _limits())
            self.histograms = h = Histograms()
            self._registry_ws = registry
            self._collectors_ws = (
                _ScrapeStart(h),
                _HistogramCollector(h, prefix, scope_info_enabled),
            )
            registry.register(self._collectors_ws[0])  # before the OTel collector
            super().__init__(
                registry=registry, prefix=prefix, scope_info_enabled=scope_info_enabled, **kw
            )
            registry.register(self._collectors_ws[1])  # after it

        def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
            for c in self._collectors_ws:
                self._registry_ws.unregister(c)
            super().shutdown(timeout_millis, **kw)

    return PrometheusReader


def PrometheusReader(**kw: Any) -> Any:  # noqa: N802 - a class factory (lazy import)
    return _prometheus_reader_cls()(**kw)


def _histogram_metrics(agg: Aggregator, start_ns: int) -> list[Metric]:
    now = time.time_ns()
    per: dict[int, list[HistogramDataPoint]] = {}
    for (i, labels), h in agg.histogram_totals().items():
        # The layer only on per-layer histograms (load durations).
        attrs = {
            COLUMN_ATTRS[c]: v
            for c, v in zip(HISTOGRAM_LABELS, labels, strict=True)
            if v or c != "layer"
        }
        if HISTOGRAMS[i][0] is schema.TOKEN_USAGE:
            attrs[schema.ATTR.TOKEN_TYPE] = "input"
        per.setdefault(i, []).append(
            HistogramDataPoint(
                attributes=attrs,
                start_time_unix_nano=start_ns,
                time_unix_nano=now,
                count=int(h[H_COUNT]),
                sum=float(h[H_SUM]),
                bucket_counts=list(h[:H_SUM]),
                explicit_bounds=list(HISTOGRAMS[i][1]),
                min=None,  # type: ignore[arg-type]
                max=None,  # type: ignore[arg-type]
            )
        )
    return [
        Metric(
            name=HISTOGRAMS[i][0].name,
            description=HISTOGRAMS[i][0].description,
            unit=HISTOGRAMS[i][0].unit,
            data=Histogram(
                data_points=pts, aggregation_temporality=AggregationTemporality.CUMULATIVE
            ),
        )
        for i, pts in sorted(per.items())
    ]


def _inject(md: MetricsData | None, agg: Aggregator, start_ns: int) -> MetricsData:
    hist = _histogram_metrics(agg, start_ns)
    if not hist:
        return md  # type: ignore[return-value]
    scope = InstrumentationScope(SCOPE)
    if md is None or not md.resource_metrics:
        res = Resource.create(resource_attributes(agg.replica, agg))
        return MetricsData([ResourceMetrics(res, [ScopeMetrics(scope, hist, "")], "")])
    rm = md.resource_metrics[0]
    scopes = list(rm.scope_metrics)
    for j, sm in enumerate(scopes):
        if sm.scope.name == SCOPE:
            merged = {m.name: m for m in sm.metrics}
            for m in hist:  # same histogram from another pipeline: concatenate points
                old = merged.get(m.name)
                if old is not None and isinstance(old.data, Histogram):
                    m = Metric(
                        m.name,
                        m.description,
                        m.unit,
                        Histogram(
                            # hist holds Histogram metrics only
                            list(old.data.data_points) + list(m.data.data_points),  # type: ignore[arg-type]
                            m.data.aggregation_temporality,  # type: ignore[union-attr]
                        ),
                    )
                merged[m.name] = m
            scopes[j] = ScopeMetrics(sm.scope, list(merged.values()), sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope, hist, ""))
    out = [ResourceMetrics(rm.resource, scopes, rm.schema_url)] + list(md.resource_metrics[1:])
    return MetricsData(out)


def _counting_exporter(agg: Aggregator | None, **kw: Any) -> Any:
    """An OTLP/HTTP exporter whose failed exports (refused, timed out, HTTP
    errors) are counted in ``warmscope.telemetry.errors{stage="export"}``; the
    SDK itself only logs them."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    class CountingOTLPExporter(OTLPMetricExporter):
        # the SDK declares timeout_millis as float | None
        def export(
            self,
            metrics_data: Any,
            timeout_millis: float = 10_000,  # type: ignore[override]
            **k: Any,
        ) -> Any:
            try:
                result = super().export(metrics_data, timeout_millis=timeout_millis, **k)
            except Exception as e:  # never let the SDK thread die
                if agg is not None:
                    agg.count_error("export", "OTLP export failed", e)
                return MetricExportResult.FAILURE
            if result is not MetricExportResult.SUCCESS and agg is not None:
                agg.count_error(
                    "export", "OTLP export failed (receiver unreachable, slow or refusing)"
                )
            return result

    return CountingOTLPExporter(**kw)


def _start_scrape_server(cfg: Any, registry: Any) -> tuple[Any, int]:
    """Serve on ``prometheus_port``; when it is taken (several worker
    processes on one host), the next free one of ``prometheus_port_span``
    ports. Returns the server and the port it listens on."""
    from prometheus_client import start_http_server

    first = int(cfg.prometheus_port)
    span = 1 if first == 0 else max(1, int(getattr(cfg, "prometheus_port_span", 1)))
    last_err: OSError | None = None
    for port in range(first, min(65536, first + span)):
        try:
            server = start_http_server(port, addr=cfg.prometheus_addr, registry=registry)
            return server, server[0].server_address[1]
        except OSError as e:
            last_err = e
    raise OSError(
        f"ports {first}-{first + span - 1} on {cfg.prometheus_addr} are all taken ({last_err}); "
        "set WARMSCOPE_PROMETHEUS_PORT or prometheus_port_span"
    )


def resource_attributes(replica: str, agg: Any = None) -> dict[str, str]:
    """``service.instance.id``: this process (two processes configured with one
    replica label stay two series, not one that jumps between their totals),
    and the replica label as ``warmscope.replica``."""
    instance = getattr(agg, "instance_id", None) or replica
    return {
        "service.instance.id": f"{replica}/{instance}" if instance != replica else replica,
        "warmscope.replica": replica,
    }


def build_provider(cfg: Any, agg: Aggregator | None = None) -> tuple[MeterProvider, Any]:
    """A meter provider exporting as ``cfg.exporter`` says (``otlp`` or
    ``prometheus``), and the scrape server it started (or None).

    Several pipelines in one process (the simulator's replicas) share one."""
    res = Resource.create(
        {"service.name": "warmscope-collectors", **resource_attributes(cfg.replica, agg)}
    )
    server = None
    timeout_s = float(getattr(cfg, "export_timeout_s", 10.0))
    if cfg.exporter == "otlp":
        kw: dict[str, Any] = {"timeout": timeout_s}
        if cfg.otlp_endpoint:
            base = cfg.otlp_endpoint.rstrip("/")
            kw["endpoint"] = base if base.endswith("/v1/metrics") else base + "/v1/metrics"
        reader: Any = PeriodicReader(
            _counting_exporter(agg, **kw),
            export_interval_millis=cfg.flush_interval_s * 1000,
            export_timeout_millis=timeout_s * 1000,
        )
    elif cfg.exporter == "prometheus":
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()  # our own: no clash with the host's default registry
        reader = PrometheusReader(registry=registry)
        server, port = _start_scrape_server(cfg, registry)
        if port != cfg.prometheus_port and cfg.prometheus_port:
            import logging

            logging.getLogger("warmscope.collectors").warning(
                "warmscope: scrape port %d is taken; serving metrics on %s:%d",
                cfg.prometheus_port,
                cfg.prometheus_addr,
                port,
            )
    else:
        raise ValueError(f"exporter {cfg.exporter!r} has no meter provider")
    # shutdown_on_exit=False: the pipeline shuts it down (close(), at exit too); the SDK's own
    # exit hook would shut it down a second time and print "shutdown can only be called once".
    return MeterProvider(metric_readers=[reader], resource=res, shutdown_on_exit=False), server


def stop_server(server: Any) -> None:
    server[0].shutdown()
    server[0].server_close()


class OTelBridge:
    """Registers warmscope's observable instruments on a meter provider."""

    def __init__(self, agg: Aggregator, cfg: Any, provider: MeterProvider | None = None) -> None:
        # Several pipelines may share a provider (simulated replicas): each
        # registers its instruments under its own meter, named by replica.
        self.agg = agg
        self._owned = provider is None
        self._server = None
        if provider is None:
            provider, self._server = build_provider(cfg, agg)
        self.provider = provider
        self.start_ns = time.time_ns()  # the histograms' start time
        self._register(provider.get_meter(SCOPE, version=agg.replica))

    def _safe(
        self, fn: Callable[[], Iterable[Observation]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(options: CallbackOptions) -> Iterable[Observation]:
            try:
                _seen()[id(self.agg)] = (self.agg, self.start_ns)  # see Histograms.bind_seen
                return list(fn())
            except Exception as e:
                self.agg.count_error("export", "observable callback", e)
                return []

        return cb

    def _register(self, meter: Any) -> None:
        """One observable instrument per schema instrument that the aggregator counts."""
        for inst, fn in (
            *self._cache_series(),
            *self._request_series(),
            *self._warmup_series(),
            *self._kv_series(),
            *self._self_series(),
        ):
            create = {
                "counter": meter.create_observable_counter,
                "gauge": meter.create_observable_gauge,
                "updown": meter.create_observable_up_down_counter,
            }[inst.kind]
            create(inst.name, [self._safe(fn)], unit=inst.unit, description=inst.description)

    def _cache_series(self) -> list[tuple[schema.Instrument, Callable[[], Iterable[Observation]]]]:
        agg = self.agg

        def totals(
            read: Callable[[], dict[Any, Any]], attrs: tuple[str, ...]
        ) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                for k, n in read().items():
                    yield Observation(n, dict(zip(attrs, k, strict=True)))

            return gen

        def cross() -> Iterator[Observation]:
            for layer, n in list(agg.cross_tenant.items()):
                yield Observation(n, {schema.ATTR.LAYER: layer, schema.ATTR.REPLICA: agg.replica})

        return [
            (schema.CACHE_LOOKUPS, totals(agg.lookup_totals, schema.LOOKUP_LABELS)),
            (schema.CACHE_WRITES, totals(agg.write_totals, schema.WRITE_LABELS)),
            (schema.CROSS_TENANT_KEYS, cross),
        ]

    def _request_series(
        self,
    ) -> list[tuple[schema.Instrument, Callable[[], Iterable[Observation]]]]:
        agg = self.agg
        # REQUEST_LABELS + sla_met: the request series' label order
        attrs_sla = schema.REQUESTS.attributes

        def req(measure: str, with_sla: bool) -> Callable[[], Iterator[Observation]]:
            idx = records.REQUESTS.measures.index(measure)
            n = len(attrs_sla) if with_sla else len(attrs_sla) - 1

            def gen() -> Iterator[Observation]:
                acc: dict[tuple[Any, ...], float] = {}
                for labels, r in agg.request_totals().items():
                    key = labels[:n]
                    acc[key] = acc.get(key, 0) + r[idx]
                for key, v in acc.items():
                    yield Observation(v, dict(zip(attrs_sla, key, strict=False)))

            return gen

        def gauge(name: str) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                if name in agg.gauges:
                    yield Observation(agg.gauges[name], {schema.ATTR.REPLICA: agg.replica})

            return gen

        return [
            (schema.REQUESTS, req("requests", True)),
            (schema.GPU_TIME, req("gpu_s", False)),
            (schema.CONVERSIONS, req("conversions", False)),
            (schema.CONVERSION_VALUE, req("value", False)),
            (schema.UNMEASURED_REQUESTS, req("unmeasured", False)),
            (schema.GPU_MEMORY, gauge(schema.GPU_MEMORY.name)),
        ]

    def _warmup_series(self) -> list[tuple[schema.Instrument, Callable[[], Iterable[Observation]]]]:
        agg = self.agg

        def warm(idx: int) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                acc: dict[tuple[Any, ...], float] = {}
                for labels, sums in list(agg.warmup_counts.items()):
                    k = labels if idx == S_RUNS else labels[:-1]  # status only on the runs counter
                    acc[k] = acc.get(k, 0) + sums[idx]
                attrs = schema.WARMUP_LABELS + ((schema.ATTR.STATUS,) if idx == S_RUNS else ())
                for k, v in acc.items():
                    yield Observation(v, dict(zip(attrs, k, strict=True)))

            return gen

        def per_run(read: Callable[[], dict[Any, Any]]) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                for labels, n in list(read().items()):
                    yield Observation(n, dict(zip(schema.WARMUP_LABELS, labels, strict=True)))

            return gen

        return [
            (schema.WARMUP_RUNS, warm(S_RUNS)),
            (schema.WARMUP_KEYS, warm(S_KEYS)),
            (schema.WARMUP_BYTES, warm(S_BYTES)),
            (schema.WARMUP_GPU_TIME, warm(S_GPU_S)),
            (schema.WARMUP_KEYS_READ, per_run(lambda: agg.warm_read)),
            (schema.WARMUP_ACTIVE, per_run(lambda: agg.warmup_active)),
        ]

    def _kv_series(self) -> list[tuple[schema.Instrument, Callable[[], Iterable[Observation]]]]:
        """Missed tokens by (tenant, engine, class: no family), engine block counts by salt."""
        agg = self.agg

        def missed() -> Iterator[Observation]:
            for k, n in agg.miss_totals().items():
                yield Observation(n, dict(zip(schema.MISS_LABELS, k, strict=True)))

        def blocks(idx: int) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                for k, v in agg.kv_totals().items():
                    yield Observation(v[idx], dict(zip(schema.KV_BLOCK_LABELS, k, strict=True)))

            return gen

        return [
            (schema.KV_MISSED_TOKENS, missed),
            (schema.KV_BLOCKS_STORED, blocks(0)),
            (schema.KV_BLOCKS_REUSED, blocks(1)),
            (schema.KV_BLOCKS_EVICTED, blocks(2)),
            (schema.KV_BLOCKS_RESIDENT, blocks(3)),
        ]

    def _self_series(self) -> list[tuple[schema.Instrument, Callable[[], Iterable[Observation]]]]:
        agg = self.agg

        def by(
            read: Callable[[], dict[Any, Any]], attr: str
        ) -> Callable[[], Iterator[Observation]]:
            def gen() -> Iterator[Observation]:
                for k, n in list(read().items()):
                    yield Observation(n, {attr: k})

            return gen

        return [
            (schema.TELEMETRY_ERRORS, by(lambda: agg.errors, schema.ATTR.STAGE)),
            (schema.TELEMETRY_DROPPED, by(agg.dropped_counts, schema.ATTR.STAGE)),
            (schema.LABEL_OVERFLOW, by(agg.label_overflow, schema.ATTR.LABEL)),
            (schema.LABEL_BOUNDED, by(agg.label_bounded, schema.ATTR.LABEL)),
        ]

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop exporting; returns within about ``timeout_s`` even when the
        receiver hangs (the last export is then abandoned and counted)."""
        if self._owned:
            import threading

            def stop() -> None:
                try:
                    self.provider.shutdown(timeout_millis=timeout_s * 1000)
                except Exception as e:
                    self.agg.count_error("export", "shutdown", e)

            t = threading.Thread(target=stop, name="warmscope-otel-shutdown", daemon=True)
            t.start()
            t.join(timeout_s)
            if t.is_alive():
                self.agg.count_error(
                    "export", "exporter shutdown did not finish in time; last export abandoned"
                )
        if self._server is not None:
            try:
                stop_server(self._server)
            except Exception as e:
                self.agg.count_error("export", "scrape endpoint shutdown", e)
