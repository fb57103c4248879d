import re

import pytest
from warmscope.collectors.config import CollectorConfig, ConfigError


def test_defaults_are_embedded_and_bounded():
    cfg = CollectorConfig.load(env={})
    assert cfg.exporter == "embedded"
    assert cfg.max_tenants > 0 and cfg.max_families > 0


def test_env_overrides_toml_and_keywords_override_env(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text('[collectors]\nexporter = "otlp"\nhot_keys_k = 7\ntenants = ["a", "b"]\n')
    cfg = CollectorConfig.load(p, env={"WARMSCOPE_EXPORTER": "prometheus"})
    assert cfg.exporter == "prometheus" and cfg.hot_keys_k == 7 and cfg.tenants == ("a", "b")
    cfg = CollectorConfig.load(p, env={"WARMSCOPE_EXPORTER": "prometheus"}, exporter="none")
    assert cfg.exporter == "none"


def test_env_tenant_list_is_comma_separated():
    assert CollectorConfig.load(env={"WARMSCOPE_TENANTS": "t1, t2,,t3"}).tenants == ("t1", "t2", "t3")


@pytest.mark.parametrize("raw, needle", [
    ({"exporter": "kafka"}, "collectors.exporter"),
    ({"hot_keys_k": 0}, "collectors.hot_keys_k must be in [1, 100000], got 0"),
    ({"max_tenants": 2.5}, "collectors.max_tenants must be a whole number, got 2.5"),
    ({"flush_interval_s": float("nan")}, "collectors.flush_interval_s must be a finite number"),
    ({"flush_interval_s": "soon"}, "collectors.flush_interval_s must be a number, got 'soon'"),
    ({"no_such": 1}, "collectors.no_such is not a known setting"),
    ({"family_rules": [["(unclosed", "x"]]}, "not a valid regex"),
    ({"family_rules": [[r"^tenant:(\w+)", r"t:\2"]]}, "invalid group reference 2"),
    ({"family_rules": [[r"^tenant:(\w+)", r"t:\g<name>"]]}, "does not fit pattern"),
])
def test_bad_values_name_the_key(raw, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        CollectorConfig.load(env={}, **raw)


def test_malformed_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[collectors\nexporter=")
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        CollectorConfig.load(p, env={})


def test_missing_config_file_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        CollectorConfig.load(env={"WARMSCOPE_CONFIG": str(tmp_path / "nope.toml")})


def test_secret_is_made_once_with_private_permissions(tmp_path):
    cfg = CollectorConfig.load(env={}, store_path=str(tmp_path / "s.sqlite"))
    s1 = cfg.resolved_secret()
    s2 = cfg.resolved_secret()
    assert s1 == s2 and len(s1) >= 32
    assert (tmp_path / "key-secret").stat().st_mode & 0o777 == 0o600


def test_one_loader_reads_every_section_from_one_file(tmp_path):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.simulator.config import SimConfig

    p = tmp_path / "w.toml"
    p.write_text('[collectors]\nhot_keys_k = 9\n[analysis]\nslo_ttft_s = 2.5\n[simulator]\ntenants = 3\n'
                 'strategy_b = "predictive"\n')
    assert CollectorConfig.load(p, env={}).hot_keys_k == 9
    assert AnalysisConfig.load(p).slo_ttft_s == 2.5
    sim = SimConfig.load(p, tenants=None, hours=2)  # None: an unset command-line option keeps the file's value
    assert (sim.tenants, sim.strategy_b, sim.hours) == (3, "predictive", 2.0)


@pytest.mark.parametrize("section, raw, message", [
    ("simulator", {"tenants": 0}, "simulator.tenants must be > 0 and <= 676, got 0"),
    ("simulator", {"tenants": 677}, "simulator.tenants must be > 0 and <= 676, got 677"),
    ("simulator", {"seed": -1}, "simulator.seed must be >= 0, got -1"),
    ("simulator", {"diurnal_amplitude": 1.5}, "simulator.diurnal_amplitude must be in [0, 1], got 1.5"),
    ("simulator", {"lambda_mode": "auto"}, "simulator.lambda_mode must be one of slo, fixed; got 'auto'"),
    ("simulator", {"rps": "fast"}, "simulator.rps must be a number, got 'fast'"),
    ("analysis", {"prediction_alpha": 2}, "analysis.prediction_alpha must be in [0.001, 1], got 2"),
    ("analysis", {"roi_windows_s": [300, -1]}, "analysis.roi_windows_s must be positive seconds"),
    ("analysis", {"treatment_varient": "B"}, "analysis.treatment_varient is not a known setting; known: "),
])
def test_every_section_names_the_key_and_the_allowed_range(section, raw, message):
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.simulator.config import SimConfig

    cls = {"simulator": SimConfig, "analysis": AnalysisConfig}[section]
    with pytest.raises(ConfigError, match=re.escape(message)):
        cls.load(None, **raw)


def test_environment_variables_are_checked_like_the_file():
    with pytest.raises(ConfigError, match=re.escape("collectors.prometheus_port must be in [0, 65535], got '70000'")):
        CollectorConfig.load(env={"WARMSCOPE_PROMETHEUS_PORT": "70000"})
    assert CollectorConfig.load(env={"WARMSCOPE_FLUSH_INTERVAL": "0.5"}).flush_interval_s == 0.5


def test_a_missing_config_file_is_an_error_for_every_section(tmp_path, monkeypatch):
    from warmscope.simulator.config import SimConfig

    monkeypatch.setenv("WARMSCOPE_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml does not exist; create it or unset WARMSCOPE_CONFIG"):
        SimConfig.load()
