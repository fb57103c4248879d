import re

from opentelemetry.sdk.metrics import MeterProvider
from warmscope.collectors.otel import PrometheusReader
from warmscope.model import schema


def test_instrument_names_are_dotted_lower_case_with_base_units():
    for inst in schema.INSTRUMENTS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+", inst.name), inst.name
        assert inst.unit in ("s", "By", "1") or re.fullmatch(r"\{[a-z]+\}", inst.unit), inst.unit
        assert inst.description.endswith(".")
    assert len({i.name for i in schema.INSTRUMENTS}) == len(schema.INSTRUMENTS)


def test_lookups_use_one_counter_with_a_result_attribute():
    assert schema.CACHE_LOOKUPS.kind == "counter"
    assert schema.ATTR.RESULT in schema.CACHE_LOOKUPS.attributes
    assert schema.RESULTS == ("hit", "miss", "bypass", "error")


def test_genai_quantities_use_semconv_names():
    assert schema.TTFT.name == "gen_ai.server.time_to_first_token"
    assert schema.TOKEN_USAGE.name == "gen_ai.client.token.usage"
    assert "cache_read.input_tokens" in schema.CACHE_READ_TOKENS.name


def test_length_bucket_is_power_of_two_upper_bound():
    assert schema.length_bucket(1) == "32"
    assert schema.length_bucket(32) == "32"
    assert schema.length_bucket(33) == "64"
    assert schema.length_bucket(4000) == "4096"
    assert schema.length_bucket(10**9) == "inf"
    assert schema.length_bucket(None) == "unknown"


def test_prom_name_matches_what_the_prometheus_exporter_emits():
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reader = PrometheusReader(registry=reg, disable_target_info=True)
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    for inst in schema.INSTRUMENTS:
        if inst.kind == "counter":
            meter.create_counter(inst.name, unit=inst.unit, description=inst.description).add(1)
        elif inst.kind == "gauge":
            meter.create_gauge(inst.name, unit=inst.unit, description=inst.description).set(0.5)
    text = generate_latest(reg).decode()
    for inst in schema.INSTRUMENTS:
        if inst.kind in ("counter", "gauge"):
            assert f"\n{schema.prom_name(inst)}{{" in text or f"\n{schema.prom_name(inst)} " in text, (
                schema.prom_name(inst), text[:2000])
    provider.shutdown()
