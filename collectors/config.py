"""Typed collector configuration, read once from TOML and the environment.

Precedence: keyword overrides > environment variables > ``[collectors]`` in the
TOML file named by ``WARMSCOPE_CONFIG`` (or passed in) > defaults. Every value
is validated at load; errors name the key, the allowed range and what was given.

Environment variables: ``WARMSCOPE_EXPORTER`` (embedded|otlp|prometheus|none),
``WARMSCOPE_STORE`` (SQLite path), ``WARMSCOPE_REDIS_URL``,
``WARMSCOPE_KEY_SECRET``, ``WARMSCOPE_TENANTS`` (comma-separated allow-list),
``WARMSCOPE_REPLICA``, ``WARMSCOPE_PROMETHEUS_PORT``, ``WARMSCOPE_FLUSH_INTERVAL``.
The OTLP endpoint follows the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``.

Example::

    >>> cfg = CollectorConfig.load(env={}, exporter="none", tenants=("t1",))
    >>> cfg.exporter, cfg.tenants
    ('none', ('t1',))
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

__all__ = ["CollectorConfig", "ConfigError", "EXPORTERS", "default_data_dir"]

EXPORTERS = ("embedded", "otlp", "prometheus", "none")


class ConfigError(ValueError):
    """A configuration value is malformed; the message names key and fix."""


def default_data_dir() -> Path:
    return Path(os.environ.get("WARMSCOPE_DATA_DIR", "var"))


def _default_replica() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class CollectorConfig:
    exporter: str = "embedded"
    store_path: str = ""  # "" -> <data dir>/warmscope.sqlite
    redis_url: str = ""  # set -> hot keys and A/B unit records go to Redis
    key_secret: str = ""  # "" -> a secret file in the data dir, made once
    tenants: tuple[str, ...] = ()  # allow-list; empty -> first max_tenants seen
    max_tenants: int = 64
    max_families: int = 256  # per layer; beyond -> "other"
    family_rules: tuple[tuple[str, str], ...] = ()  # (regex, replacement) tried first
    family_vocabulary: tuple[str, ...] = ()  # extra words a default family may keep verbatim
    replica: str = field(default_factory=_default_replica)
    otlp_endpoint: str = ""  # "" -> OTEL_EXPORTER_OTLP_ENDPOINT or http://127.0.0.1:4318
    prometheus_port: int = 9464
    prometheus_addr: str = "127.0.0.1"
    flush_interval_s: float = 10.0
    hot_keys_k: int = 100
    side_flush_s: float = 300.0  # hot keys and A/B unit records: flushed this often (metric points every flush)
    hot_key_window_s: int = 3600
    hot_key_ttl_s: int = 2 * 86400
    warmed_key_limit: int = 200_000  # per process, across open warm-up runs
    early_window_s: float = 900.0  # recall: keys seen this long after a run
    early_key_limit: int = 50_000  # per run
    max_pending_rows: int = 100_000  # per sink: rows kept for retry while it is down; beyond: dropped, counted
    max_buffered_units: int = 100_000  # A/B unit records between flushes (flushed early at half); beyond: dropped
    max_label_values: int = 64  # per label (model, experiment, variant, trigger, strategy); beyond: "other"
    max_layers: int = 256  # cache layers per process; beyond: "other"
    prometheus_port_span: int = 16  # taken scrape port: try the next ones (several worker processes)
    close_timeout_s: float = 15.0  # close() returns within about this long, whatever the sinks do
    export_timeout_s: float = 3.0  # one OTLP export attempt

    _RANGES = {
        "max_tenants": (1, 10_000),
        "max_families": (1, 100_000),
        "prometheus_port": (0, 65535),
        "flush_interval_s": (0.05, 3600),
        "hot_keys_k": (1, 100_000),
        "side_flush_s": (0, 86400),
        "hot_key_window_s": (60, 7 * 86400),
        "hot_key_ttl_s": (60, 90 * 86400),
        "warmed_key_limit": (0, 50_000_000),
        "early_window_s": (0, 7 * 86400),
        "early_key_limit": (0, 10_000_000),
        "max_pending_rows": (0, 50_000_000),
        "max_buffered_units": (0, 50_000_000),
        "max_label_values": (1, 100_000),
        "max_layers": (1, 4000),
        "prometheus_port_span": (1, 1000),
        "close_timeout_s": (0.1, 3600),
        "export_timeout_s": (0.1, 600),
    }
    _ENV = {
        "exporter": "WARMSCOPE_EXPORTER",
        "store_path": "WARMSCOPE_STORE",
        "redis_url": "WARMSCOPE_REDIS_URL",
        "key_secret": "WARMSCOPE_KEY_SECRET",
        "tenants": "WARMSCOPE_TENANTS",
        "replica": "WARMSCOPE_REPLICA",
        "prometheus_port": "WARMSCOPE_PROMETHEUS_PORT",
        "flush_interval_s": "WARMSCOPE_FLUSH_INTERVAL",
        "otlp_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    }

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> "CollectorConfig":
        env = os.environ if env is None else env
        raw: dict[str, Any] = {}
        path = path or env.get("WARMSCOPE_CONFIG")
        if path:
            p = Path(path)
            try:
                doc = tomllib.loads(p.read_text())
            except FileNotFoundError:
                raise ConfigError(f"config file {p} does not exist; create it or unset WARMSCOPE_CONFIG") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
            sec = doc.get("collectors", {})
            if not isinstance(sec, dict):
                raise ConfigError(f"{p}: [collectors] must be a table")
            raw.update(sec)
        for name, var in cls._ENV.items():
            if env.get(var):
                raw[name] = env[var]
        raw.update(overrides)
        return cls._from_raw(raw)

    @classmethod
    def _from_raw(cls, raw: Mapping[str, Any]) -> "CollectorConfig":
        known = {f.name: f for f in fields(cls) if not f.name.startswith("_")}
        kw: dict[str, Any] = {}
        for key, val in raw.items():
            if key not in known:
                raise ConfigError(
                    f"collectors.{key} is not a known setting; known: {', '.join(sorted(known))}"
                )
            kw[key] = _coerce(key, val, known[key].default, cls._RANGES.get(key))
        cfg = replace(cls(), **kw)
        if cfg.exporter not in EXPORTERS:
            raise ConfigError(f"collectors.exporter must be one of {EXPORTERS}, got {cfg.exporter!r}")
        for pat, _ in cfg.family_rules:
            import re

            try:
                re.compile(pat)
            except re.error as e:
                raise ConfigError(f"collectors.family_rules: pattern {pat!r} is not a valid regex: {e}") from None
        return cfg

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def resolved_store_path(self) -> Path:
        return Path(self.store_path) if self.store_path else default_data_dir() / "warmscope.sqlite"

    def needs_explicit_secret(self) -> bool:
        """Hashes leave the host (Redis, OTLP, a scrape endpoint): every replica
        must hash with the same secret, so a per-host file secret would
        silently split A/B units and hot keys. Only the embedded store may
        make its own."""
        return bool(self.redis_url) or self.exporter in ("otlp", "prometheus")

    def secret_path(self) -> Path:
        """Where a made secret lives: ``$WARMSCOPE_DATA_DIR``, else beside an
        explicitly configured store, else ``$XDG_DATA_HOME/warmscope`` (or
        ``~/.local/share/warmscope``) — never the host's working directory."""
        if os.environ.get("WARMSCOPE_DATA_DIR"):
            base = Path(os.environ["WARMSCOPE_DATA_DIR"])
        elif self.store_path:
            base = Path(self.store_path).parent
        else:
            base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "warmscope"
        return (base / "key-secret").absolute()

    def resolved_secret(self) -> bytes:
        """The keyed-hash secret; made once (mode 0600) if unset.

        Raises :class:`ConfigError` naming the fix when there is none and one
        cannot (or must not) be made; the pipeline keeps the rows and retries.
        """
        if self.key_secret:
            return self.key_secret.encode()
        if self.needs_explicit_secret():
            raise ConfigError(
                "collectors.key_secret is not set; with Redis, OTLP or Prometheus export every replica must "
                "hash keys with the same secret: set WARMSCOPE_KEY_SECRET (or key_secret in warmscope.toml)"
            )
        p = self.secret_path()
        try:
            try:
                secret = p.read_bytes().strip()
                if secret:
                    return secret
            except FileNotFoundError:
                pass
            p.parent.mkdir(parents=True, exist_ok=True)
            secret = os.urandom(32).hex().encode()
            try:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # raced with another process
                return p.read_bytes().strip()
            try:
                os.write(fd, secret)
            finally:
                os.close(fd)
            return secret
        except OSError as e:
            raise ConfigError(
                f"cannot make the key secret {p}: {e.strerror or e}; set WARMSCOPE_KEY_SECRET or "
                "WARMSCOPE_DATA_DIR to a writable directory (rows are kept and retried)"
            ) from None


def _coerce(key: str, val: Any, default: Any, rng: tuple[float, float] | None) -> Any:
    try:
        if isinstance(default, bool):
            out: Any = val if isinstance(val, bool) else str(val).lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            if isinstance(val, float) and not val.is_integer():
                raise ValueError
            out = int(val)
        elif isinstance(default, float):
            out = float(val)
        elif isinstance(default, tuple):
            if isinstance(val, str):
                out = tuple(s.strip() for s in val.split(",") if s.strip())
            else:
                out = tuple(tuple(v) if isinstance(v, list) else v for v in val)
        else:
            out = str(val)
    except (TypeError, ValueError):
        raise ConfigError(
            f"collectors.{key} must be a {type(default).__name__}, got {val!r}"
        ) from None
    if rng is not None and not (rng[0] <= out <= rng[1]):
        raise ConfigError(f"collectors.{key} must be in [{rng[0]}, {rng[1]}], got {val!r}")
    if key == "family_rules":
        for rule in out:
            if not (isinstance(rule, tuple) and len(rule) == 2 and all(isinstance(s, str) for s in rule)):
                raise ConfigError(
                    f"collectors.family_rules entries must be [regex, replacement] pairs, got {rule!r}"
                )
    return out
