"""The compose stack and the collector config, validated structurally (no
Docker engine runs here): services, pinned images, health checks, memory
limits, mounted files, the app's endpoints, and a valid collector pipeline."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
OTELCOL = yaml.safe_load((ROOT / "otel-collector.yaml").read_text())


def test_stack_has_every_service_pinned_healthchecked_and_limited():
    svc = COMPOSE["services"]
    assert set(svc) == {"redis", "otel-collector", "prometheus", "victoria-metrics", "alertmanager", "app",
                        "simulator"}
    for name, s in svc.items():
        image = s.get("image", "")
        assert image and ":" in image and not image.endswith(":latest"), name
        assert re.search(r":v?\d", image), f"{name}: image tag must be a version"
        assert s.get("healthcheck", {}).get("test"), name
        assert s.get("mem_limit"), name


def test_mounted_files_exist():
    for name, s in COMPOSE["services"].items():
        for v in s.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (ROOT / src).exists(), f"{name} mounts missing {src}"
    assert (ROOT / "Dockerfile").exists()


def test_prometheus_receives_otlp_keeps_data_and_loads_the_rules():
    p = COMPOSE["services"]["prometheus"]
    flags = " ".join(p["command"])
    assert "--web.enable-otlp-receiver" in flags and "--storage.tsdb.retention.time=" in flags
    assert "./rules:/etc/prometheus/rules:ro" in p["volumes"]
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]


def test_prometheus_remote_writes_to_victoria_metrics_which_keeps_a_year():
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    vm = COMPOSE["services"]["victoria-metrics"]
    port = next(f.split(":")[-1] for f in vm["command"] if f.startswith("-httpListenAddr="))
    assert [w["url"] for w in prom["remote_write"]] == [f"http://victoria-metrics:{port}/api/v1/write"]
    assert "-retentionPeriod=12" in vm["command"]  # months: beyond Prometheus' 15 days
    assert any(v.endswith(":/storage") for v in vm["volumes"]) and "-storageDataPath=/storage" in vm["command"]
    assert vm["volumes"][0].split(":")[0] in COMPOSE["volumes"]
    assert f"http://localhost:{port}/health" in vm["healthcheck"]["test"]


def test_app_and_simulator_point_at_the_right_hosts():
    app = COMPOSE["services"]["app"]["environment"]
    assert app["WARMSCOPE_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert app["WARMSCOPE_REDIS_URL"] == "redis://redis:6379/0"
    sim = COMPOSE["services"]["simulator"]
    assert sim["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    cmd = sim["command"]
    assert "--realtime" in cmd and cmd[cmd.index("--exporter") + 1] == "otlp"
    col = COMPOSE["services"]["otel-collector"]
    assert col["environment"]["PROMETHEUS_OTLP_ENDPOINT"] == "http://prometheus:9090/api/v1/otlp"
    assert "./otel-collector.yaml:/etc/otelcol-contrib/config.yaml:ro" in col["volumes"]


def test_collector_pipeline_is_valid_and_limits_memory_first():
    rec = OTELCOL["receivers"]["otlp"]["protocols"]
    assert {"grpc", "http"} <= set(rec)
    pipe = OTELCOL["service"]["pipelines"]["metrics"]
    assert pipe["receivers"] == ["otlp"]
    assert pipe["processors"][0] == "memory_limiter" and "batch" in pipe["processors"]
    for kind in ("receivers", "processors", "exporters"):
        for comp in pipe[kind]:
            assert comp in OTELCOL[kind], f"{kind} {comp} used but not defined"
    exp = OTELCOL["exporters"][pipe["exporters"][0]]
    assert "${env:PROMETHEUS_OTLP_ENDPOINT}" in exp["metrics_endpoint"]
    assert all("${env:" in v["endpoint"] for v in rec.values())


def test_safe_defaults_loopback_ports_no_default_secret_tls_verified():
    for name, s in COMPOSE["services"].items():
        for port in s.get("ports", []):
            # nothing in the stack authenticates: published on the host's loopback only
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all interfaces"
    secret = COMPOSE["services"]["simulator"]["environment"]["WARMSCOPE_KEY_SECRET"]
    assert secret.startswith("${WARMSCOPE_KEY_SECRET:?"), "no default secret: compose must require one"
    assert "change-me" not in (ROOT / "docker-compose.yml").read_text()
    cmd = (ROOT / "Dockerfile").read_text().split("CMD", 1)[1]
    assert "0.0.0.0" not in cmd
    assert "disable_ssl=True" not in (ROOT / "sources" / "prometheus.py").read_text()


def test_prometheus_source_verifies_tls_unless_told_not_to(monkeypatch):
    from warmscope.sources.prometheus import PrometheusSource

    monkeypatch.delenv("WARMSCOPE_PROMETHEUS_INSECURE", raising=False)
    assert PrometheusSource("https://prometheus.example:9090")._prom._session.verify is not False
    monkeypatch.setenv("WARMSCOPE_PROMETHEUS_INSECURE", "1")
    assert PrometheusSource("https://prometheus.example:9090")._prom._session.verify is False


def test_store_files_are_owner_only(tmp_path):
    import stat

    from warmscope.collectors.store import EmbeddedStore

    st = EmbeddedStore(tmp_path / "s.sqlite")
    st.write({"gauges": [(1.0, "m", "r", 0.5)]})
    for f in tmp_path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
    st.close()
