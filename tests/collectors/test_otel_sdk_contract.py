"""The OpenTelemetry SDK contract collectors/otel.py relies on: public routes only.

The OTel API has no observable histogram, so the request histograms reach each exporter through
warmscope's readers: the in-memory reader adds them to ``get_metrics_data()``, the periodic
reader's exporter to each batch, and the Prometheus reader yields them from a prometheus_client
custom collector beside the OTel one. A reader exports the histograms of the pipelines whose
observable callbacks its own collection ran. No SDK method is overridden but public ones; the one
private name read is an exporter's ``_preferred_temporality`` / ``_preferred_aggregation`` (what
``MetricExporter.__init__`` keeps and the SDK's periodic reader itself reads), with the SDK's
defaults when it is missing. These tests fail first when a new SDK changes what they rely on."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from warmscope.collectors import request_context
from warmscope.collectors.otel import (
    SCOPE,
    InMemoryReader,
    PeriodicReader,
    PrometheusReader,
    _histogram_metrics,
)
from warmscope.model import schema


class _Keep(MetricExporter):
    """A real exporter that keeps what it is given (public MetricExporter API)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.batches: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kw):
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kw) -> None:
        pass


def _hist_names(md) -> set[str]:
    return {m.name for rm in md.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if type(m.data).__name__ == "Histogram"}


def _pipeline(tmp_path, provider, replica="r0"):
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / f"{replica}.sqlite"), key_secret="k",
                               exporter="embedded", replica=replica)
    return Telemetry(cfg, meter_provider=provider, background=False)


def test_the_readers_override_no_private_sdk_method():
    prom = type(PrometheusReader(registry=CollectorRegistry()))
    for cls in (InMemoryReader, PeriodicReader, prom):
        ours = [c for c in cls.__mro__ if c.__module__.startswith("warmscope.")]  # with any mixin
        sdk = [c for c in cls.__mro__ if c.__module__.startswith("opentelemetry.")]
        private = [n for c in ours for n, v in vars(c).items() if n.startswith("_") and not n.startswith("__")
                   and callable(v) and any(n in vars(b) for b in sdk)]
        assert private == [], (cls, private)
    # what they override instead is public and may be overridden
    assert {"get_metrics_data", "force_flush", "shutdown"} <= set(vars(InMemoryMetricReader)) | set(vars(MetricReader))
    for name in ("get_metrics_data", "force_flush", "shutdown"):
        assert not getattr(getattr(MetricReader, name, None), "__final__", False), name


@pytest.mark.parametrize("kind", ["memory", "periodic", "prometheus"])
def test_every_warmscope_reader_receives_the_request_histograms(kind, tmp_path):
    keep, reg = _Keep(), CollectorRegistry()
    reader = {"memory": lambda: InMemoryReader(),
              "periodic": lambda: PeriodicReader(keep, export_interval_millis=3_600_000),
              "prometheus": lambda: PrometheusReader(registry=reg, disable_target_info=True)}[kind]()
    provider = MeterProvider(metric_readers=[reader])
    tel = _pipeline(tmp_path, provider)
    try:
        with request_context(tenant="t", telemetry=tel):
            tel.record_request(ttft_s=0.05, latency_s=0.3)
        if kind == "memory":
            names = _hist_names(reader.get_metrics_data())
        elif kind == "periodic":
            provider.force_flush()
            names = set().union(*(_hist_names(md) for md in keep.batches))
        else:
            text = generate_latest(reg).decode()
            names = {i.name for i in (schema.TTFT, schema.REQUEST_DURATION) if f"{schema.prom_name(i)}_count{{" in text}
        # These are observed nowhere else: without the readers' routes no histogram reaches any of them.
        assert {schema.TTFT.name, schema.REQUEST_DURATION.name} <= names, names
    finally:
        tel.close()
        provider.shutdown()


def test_the_prometheus_families_are_what_the_otel_exporter_emits_for_the_same_histogram(tmp_path):
    """The oracle: an SDK histogram with the same name, unit, buckets, scope and attributes,
    translated by the OTel Prometheus reader itself."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    ours_reg, oracle_reg = CollectorRegistry(), CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusReader(registry=ours_reg, disable_target_info=True)])
    tel = _pipeline(tmp_path, provider)
    ttfts = [0.05, 0.3, 1.5, 2.0, 0.3, 40.0]
    for i, v in enumerate(ttfts):
        with request_context(tenant=("acme", "globex")[i % 2], telemetry=tel):
            tel.record_request(ttft_s=v)
    ours = generate_latest(ours_reg).decode()
    ((_, bounds),) = [(h, b) for h, b in schema.HISTOGRAMS if h is schema.TTFT]
    view = View(instrument_name=schema.TTFT.name, aggregation=ExplicitBucketHistogramAggregation(list(bounds)))
    oracle_reader = PrometheusMetricReader(registry=oracle_reg, disable_target_info=True)
    oracle_provider = MeterProvider(metric_readers=[oracle_reader], views=[view])
    hist = oracle_provider.get_meter(SCOPE, version="r0").create_histogram(
        schema.TTFT.name, unit=schema.TTFT.unit, description=schema.TTFT.description)
    (metric,) = [m for m in _histogram_metrics(tel.aggregator, 0) if m.name == schema.TTFT.name]
    attrs = {p.attributes["warmscope.tenant"]: dict(p.attributes) for p in metric.data.data_points}
    for i, v in enumerate(ttfts):
        hist.record(v, attrs[("acme", "globex")[i % 2]])
    oracle = generate_latest(oracle_reg).decode()
    try:
        def samples(text):
            return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                          for f in text_string_to_metric_families(text) if f.name == schema.prom_name(schema.TTFT)
                          for s in f.samples)

        assert samples(ours) and samples(ours) == samples(oracle)
        line = [x for x in ours.splitlines() if x.startswith("# HELP " + schema.prom_name(schema.TTFT))]
        assert line and line[0] in oracle
    finally:
        tel.close()
        provider.shutdown()
        oracle_provider.shutdown()


def test_a_reader_exports_the_histograms_of_its_own_provider_only(tmp_path):
    readers, providers, tels = [], [], []
    reg = CollectorRegistry()
    for i, make in enumerate((InMemoryReader, InMemoryReader, lambda: PrometheusReader(registry=reg))):
        readers.append(make())
        providers.append(MeterProvider(metric_readers=[readers[-1]]))
        tels.append(_pipeline(tmp_path, providers[-1], replica=f"r{i}"))
        with request_context(tenant="t", telemetry=tels[-1]):
            tels[-1].record_request(ttft_s=0.1 * (i + 1))
    try:
        for i in (0, 1):  # on this one thread, one collection after the other
            md = readers[i].get_metrics_data()
            replicas = {p.attributes["warmscope.replica"] for rm in md.resource_metrics for sm in rm.scope_metrics
                        for m in sm.metrics if type(m.data).__name__ == "Histogram" for p in m.data.data_points}
            assert replicas == {f"r{i}"}
        text = generate_latest(reg).decode()
        assert 'warmscope_replica="r2"' in text and 'warmscope_replica="r0"' not in text
        assert 'warmscope_replica="r1"' not in text
    finally:
        for t in tels:
            t.close()
        for p in providers:
            p.shutdown()


def test_the_periodic_reader_keeps_the_exporter_s_temporality(tmp_path):
    keep = _Keep(preferred_temporality={ObservableCounter: AggregationTemporality.DELTA})
    reader = PeriodicReader(keep, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    tel = _pipeline(tmp_path, provider)
    try:
        with request_context(tenant="t", telemetry=tel):
            tel.record_request(ttft_s=0.05)
        provider.force_flush()
        temporalities = {m.name: m.data.aggregation_temporality for md in keep.batches for rm in md.resource_metrics
                         for sm in rm.scope_metrics for m in sm.metrics}
        assert temporalities[schema.REQUESTS.name] == AggregationTemporality.DELTA  # an observable counter
        assert temporalities[schema.TTFT.name] == AggregationTemporality.CUMULATIVE  # the aggregator's totals
    finally:
        tel.close()
        provider.shutdown()
