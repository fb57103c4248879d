"""Typed configuration, read once from TOML and the environment.

One loader serves every section (``[collectors]`` here, ``[analysis]`` in
:mod:`warmscope.analysis.config`, ``[simulator]`` in
:mod:`warmscope.simulator.config`): a section is a frozen dataclass whose
fields are declared with :func:`setting` — the default, the allowed range or
choices, an environment variable, or a parser for structured values — and
:func:`load_section` reads, converts and checks them. Every error is one
:class:`ConfigError` naming the key, what is allowed and what was given.

Precedence: keyword overrides > environment variables > the section in the
TOML file named by ``WARMSCOPE_CONFIG`` (or passed in) > defaults.

Collector environment variables: ``WARMSCOPE_EXPORTER`` (embedded|otlp|prometheus|none),
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

import math
import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "CollectorConfig",
    "ConfigError",
    "EXPORTERS",
    "default_data_dir",
    "setting",
    "load_section",
]

EXPORTERS = ("embedded", "otlp", "prometheus", "none")

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is malformed; the message names key and fix."""


# ---------------------------------------------------------------- the loader
@dataclass(frozen=True)
class _Spec:
    ge: float | None = None  # allowed range: value >= ge, > gt, <= le
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    env: str = ""  # environment variable that sets it
    parse: Callable[[str, Any], Any] | None = None  # (key, raw value) -> value, raising ConfigError

    def allowed(self) -> str:
        if self.ge is not None and self.le is not None:
            return f"in [{self.ge:g}, {self.le:g}]"
        parts = [
            f">= {self.ge:g}" if self.ge is not None else "",
            f"> {self.gt:g}" if self.gt is not None else "",
            f"<= {self.le:g}" if self.le is not None else "",
        ]
        return " and ".join(p for p in parts if p)

    def holds(self, x: float) -> bool:
        return (
            (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
        )


def setting(
    default: Any = MISSING,
    *,
    default_factory: Any = MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] = (),
    env: str = "",
    parse: Callable[[str, Any], Any] | None = None,
) -> Any:
    """A configuration field: its default and what values are allowed.

    The type comes from the default (bool, int, float, str or tuple; a tuple
    also takes a comma-separated string). ``ge``/``gt``/``le`` bound numbers,
    ``choices`` lists the allowed strings, ``env`` names an environment
    variable, ``parse(key, value)`` converts structured values itself."""
    spec = _Spec(ge=ge, gt=gt, le=le, choices=tuple(choices), env=env, parse=parse)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={"warmscope": spec})
    return field(default=default, metadata={"warmscope": spec})


def _convert(key: str, val: Any, default: Any) -> Any:
    kind = type(default).__name__
    try:
        if isinstance(default, bool):
            if isinstance(val, bool):
                return val
            s = str(val).strip().lower()
            if s not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError
            return s in ("1", "true", "yes", "on")
        if isinstance(default, int):
            if isinstance(val, bool) or (isinstance(val, float) and not val.is_integer()):
                raise ValueError
            return int(val)
        if isinstance(default, float):
            if isinstance(val, bool):
                raise ValueError
            out = float(val)
            if not math.isfinite(out):
                raise ConfigError(f"{key} must be a finite number, got {val!r}")
            return out
        if isinstance(default, tuple):
            if isinstance(val, str):
                return tuple(s.strip() for s in val.split(",") if s.strip())
            if isinstance(val, Mapping):
                raise ValueError
            return tuple(tuple(v) if isinstance(v, list) else v for v in val)
        if isinstance(val, (Mapping, list, tuple)):
            raise ValueError
        return str(val)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        kind = {
            "int": "whole number",
            "float": "number",
            "bool": "boolean (true or false)",
            "tuple": "list",
            "str": "string",
        }.get(kind, kind)
        raise ConfigError(f"{key} must be a {kind}, got {val!r}") from None


def read_section(section: str, path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The ``[section]`` table of a TOML file (empty without a file)."""
    if not path:
        return {}
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"config file {p} does not exist; create it or unset WARMSCOPE_CONFIG"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"config file {p} cannot be read ({e}); fix its permissions or unset WARMSCOPE_CONFIG"
        ) from None
    sec = doc.get(section, {})
    if not isinstance(sec, dict):
        raise ConfigError(f"{p}: [{section}] must be a table")
    return dict(sec)


def load_section(
    cls: type[T],
    section: str,
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Read ``[section]`` of the TOML file (``path`` or ``$WARMSCOPE_CONFIG``), then the fields'
    environment variables, then ``overrides`` (``None`` values are skipped), into ``cls``: every
    value converted and checked. Raises :class:`ConfigError` naming ``section.key``."""
    env = os.environ if env is None else env
    raw = read_section(section, path or env.get("WARMSCOPE_CONFIG"))
    known = {f.name: f for f in fields(cls) if not f.name.startswith("_")}  # type: ignore[arg-type]
    for f in known.values():
        spec = f.metadata.get("warmscope")
        if spec is not None and spec.env and env.get(spec.env):
            raw[f.name] = env[spec.env]
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return build(cls, section, raw)


def build(cls: type[T], section: str, raw: Mapping[str, Any]) -> T:
    """``cls`` from already-read values (same conversion and checks as :func:`load_section`)."""
    known = {f.name: f for f in fields(cls) if not f.name.startswith("_")}  # type: ignore[arg-type]
    kw: dict[str, Any] = {}
    for key, val in raw.items():
        name = f"{section}.{key}"
        if key not in known:
            raise ConfigError(f"{name} is not a known setting; known: {', '.join(sorted(known))}")
        f = known[key]
        spec: _Spec = f.metadata.get("warmscope") or _Spec()
        # default_factory is callable once default is MISSING
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
        out = spec.parse(name, val) if spec.parse else _convert(name, val, default)
        if spec.choices and out not in spec.choices:
            shown = ", ".join(c if c else '"" (empty)' for c in spec.choices)
            raise ConfigError(f"{name} must be one of {shown}; got {val!r}")
        if isinstance(out, (int, float)) and not isinstance(out, bool) and not spec.holds(out):
            raise ConfigError(f"{name} must be {spec.allowed()}, got {val!r}")
        kw[key] = out
    return cls(**kw)


# ---------------------------------------------------------------- [collectors]
def default_data_dir() -> Path:
    return Path(os.environ.get("WARMSCOPE_DATA_DIR", "var"))


def _default_replica() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _family_rules(key: str, val: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(val, (str, Mapping)):
        raise ConfigError(f"{key} must be a list of [regex, replacement] pairs, got {val!r}")
    out = []
    for rule in val:
        rule = tuple(rule) if isinstance(rule, (list, tuple)) else rule
        if not (
            isinstance(rule, tuple) and len(rule) == 2 and all(isinstance(s, str) for s in rule)
        ):
            raise ConfigError(f"{key} entries must be [regex, replacement] pairs, got {rule!r}")
        try:
            pat = re.compile(rule[0])
        except re.error as e:
            raise ConfigError(f"{key}: pattern {rule[0]!r} is not a valid regex: {e}") from None
        try:  # the template's group references, checked here rather than at each matching lookup
            pat.sub(rule[1], "")
        except (re.error, IndexError) as e:
            raise ConfigError(
                f"{key}: template {rule[1]!r} does not fit pattern {rule[0]!r} "
                f"({pat.groups} groups): {e}"
            ) from None
        out.append(rule)
    return tuple(out)


@dataclass(frozen=True)
class CollectorConfig:
    exporter: str = setting("embedded", choices=EXPORTERS, env="WARMSCOPE_EXPORTER")
    store_path: str = setting("", env="WARMSCOPE_STORE")  # "" -> <data dir>/warmscope.sqlite
    redis_url: str = setting(
        "", env="WARMSCOPE_REDIS_URL"
    )  # set -> hot keys and A/B unit records go to Redis
    key_secret: str = setting(
        "", env="WARMSCOPE_KEY_SECRET"
    )  # "" -> a secret file in the data dir, made once
    tenants: tuple[str, ...] = setting(
        (), env="WARMSCOPE_TENANTS"
    )  # allow-list; empty -> first max_tenants seen
    max_tenants: int = setting(64, ge=1, le=10_000)
    max_families: int = setting(256, ge=1, le=100_000)  # per layer; beyond -> "other"
    family_rules: tuple[tuple[str, str], ...] = setting(
        (), parse=_family_rules
    )  # (regex, replacement) tried first
    family_vocabulary: tuple[str, ...] = ()  # extra words a default family may keep verbatim
    replica: str = setting(default_factory=_default_replica, env="WARMSCOPE_REPLICA")
    # "" -> OTEL_EXPORTER_OTLP_ENDPOINT or http://127.0.0.1:4318
    otlp_endpoint: str = setting("", env="OTEL_EXPORTER_OTLP_ENDPOINT")
    prometheus_port: int = setting(9464, ge=0, le=65535, env="WARMSCOPE_PROMETHEUS_PORT")
    prometheus_addr: str = "127.0.0.1"
    flush_interval_s: float = setting(10.0, ge=0.05, le=3600, env="WARMSCOPE_FLUSH_INTERVAL")
    hot_keys_k: int = setting(100, ge=1, le=100_000)
    # hot keys and A/B unit records: flushed this often (metric points every flush)
    side_flush_s: float = setting(300.0, ge=0, le=86400)
    hot_key_window_s: int = setting(3600, ge=60, le=7 * 86400)
    hot_key_ttl_s: int = setting(2 * 86400, ge=60, le=90 * 86400)
    warmed_key_limit: int = setting(
        200_000, ge=0, le=50_000_000
    )  # per process, across open warm-up runs
    early_window_s: float = setting(
        900.0, ge=0, le=7 * 86400
    )  # recall: keys seen this long after a run
    early_key_limit: int = setting(50_000, ge=0, le=10_000_000)  # per run
    # per sink: rows kept for retry while it is down; beyond: dropped, counted
    max_pending_rows: int = setting(100_000, ge=0, le=50_000_000)
    # A/B unit records between flushes (flushed early at half); beyond: dropped
    max_buffered_units: int = setting(100_000, ge=0, le=50_000_000)
    # per label (model, experiment, variant, trigger, strategy); beyond: "other"
    max_label_values: int = setting(64, ge=1, le=100_000)
    max_layers: int = setting(256, ge=1, le=4000)  # cache layers per process; beyond: "other"
    # taken scrape port: try the next ones (several worker processes)
    prometheus_port_span: int = setting(16, ge=1, le=1000)
    # close() returns within about this long, whatever the sinks do
    close_timeout_s: float = setting(15.0, ge=0.1, le=3600)
    export_timeout_s: float = setting(3.0, ge=0.1, le=600)  # one OTLP export attempt

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> CollectorConfig:
        return load_section(cls, "collectors", path, env, overrides)

    @classmethod
    def _from_raw(cls, raw: Mapping[str, Any]) -> CollectorConfig:
        """From values already read (e.g. ``{**cfg.as_dict(), "replica": r}``), checked like
        :meth:`load`."""
        return build(cls, "collectors", raw)

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
            base = (
                Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
                / "warmscope"
            )
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
                "collectors.key_secret is not set; with Redis, OTLP or Prometheus export every "
                "replica must hash keys with the same secret: set WARMSCOPE_KEY_SECRET (or "
                "key_secret in warmscope.toml)"
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
