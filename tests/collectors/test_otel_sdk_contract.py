"""The OpenTelemetry SDK contract collectors/otel.py relies on.

The request histograms reach every exporter through an override of the SDK's
``MetricReader._receive_metrics`` (the OTel API has no observable histogram,
and the Prometheus reader has no public hook), and the bridge finds its
readers through ``MeterProvider._metric_readers``. Both names are private, so
pyproject.toml pins the tested SDK range; these tests fail first when a new
SDK moves or reshapes them."""

from __future__ import annotations

import inspect

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)
from warmscope.collectors import request_context
from warmscope.collectors.otel import InMemoryReader, PeriodicReader, PrometheusReader
from warmscope.model import schema


def _params(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def test_the_private_receive_hook_still_exists_with_the_shape_we_override():
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    assert "_receive_metrics" in MetricReader.__abstractmethods__
    for cls in (MetricReader, InMemoryMetricReader, PeriodicExportingMetricReader, PrometheusMetricReader):
        assert "_receive_metrics" in vars(cls), cls  # each reader we extend implements it itself
        assert _params(vars(cls)["_receive_metrics"]) == ["self", "metrics_data", "timeout_millis"], cls


def test_the_provider_still_keeps_its_readers_where_the_bridge_looks():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        assert list(provider._metric_readers) == [reader]
    finally:
        provider.shutdown()


class _Keep(MetricExporter):
    """A real exporter that keeps what it is given (public MetricExporter API)."""

    def __init__(self) -> None:
        super().__init__()
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


@pytest.mark.parametrize("kind", ["memory", "periodic", "prometheus"])
def test_every_warmscope_reader_receives_the_request_histograms(kind, make_tel, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.pipeline import Telemetry

    keep, reg = _Keep(), CollectorRegistry()
    reader = {"memory": lambda: InMemoryReader(),
              "periodic": lambda: PeriodicReader(keep, export_interval_millis=3_600_000),
              "prometheus": lambda: PrometheusReader(registry=reg, disable_target_info=True)}[kind]()
    provider = MeterProvider(metric_readers=[reader])
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "s.sqlite"), key_secret="k", exporter="embedded")
    tel = Telemetry(cfg, meter_provider=provider, background=False)
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
            names = {n for n in (schema.TTFT.name, schema.REQUEST_DURATION.name)
                     if f"{schema.prom_name(schema.TTFT if n == schema.TTFT.name else schema.REQUEST_DURATION)}"
                        "_count{" in text}
        # Without the hook no histogram reaches any of them: these are observed nowhere else.
        assert {schema.TTFT.name, schema.REQUEST_DURATION.name} <= names, names
    finally:
        tel.close()
        provider.shutdown()
