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
    ({"hot_keys_k": 0}, "collectors.hot_keys_k must be in"),
    ({"flush_interval_s": "soon"}, "collectors.flush_interval_s must be a float"),
    ({"no_such": 1}, "collectors.no_such is not a known setting"),
    ({"family_rules": [["(unclosed", "x"]]}, "not a valid regex"),
])
def test_bad_values_name_the_key(raw, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
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
