"""The generated reference pages equal freshly generated ones, and the generator reads the code
(the command registry, the configuration dataclasses), not a list of its own."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from .helpers import DOCS, script

ref = script("docs_reference")


def test_committed_reference_pages_equal_fresh_ones():
    fresh = ref.generate()
    assert sorted(fresh) == ["alerts.md", "cli.md", "configuration.md", "metrics.md", "records.md"]
    stale = [name for name, text in fresh.items() if (DOCS / "reference" / name).read_text() != text]
    assert not stale, f"stale generated pages {stale}: run python scripts/docs_reference.py"
    assert ref.main(["--check"]) == 0


def test_a_command_added_to_the_registry_appears_in_the_cli_reference(monkeypatch):
    from warmscope.app.cli import main as cli
    from warmscope.app.cli.base import Simple

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--shards", type=int, default=16, help="shards per experiment (default %(default)s)")

    extra = Simple("prune", run=lambda a: 0, arguments=arguments, help="drop rows older than a week")
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, extra))
    page = ref.cli_page()
    assert "[`warmscope prune`](#warmscope-prune) | drop rows older than a week |" in page
    assert "## `warmscope prune`" in page
    assert "| `--shards SHARDS` | shards per experiment (default 16) |" in page
    for c in cli.COMMANDS:  # every registered command, groups with their subcommands
        assert f"## `warmscope {c.name}`" in page, c.name
    assert "## `warmscope report ab`" in page


def test_every_configuration_field_is_described_from_the_code():
    from warmscope.analysis.config import AnalysisConfig
    from warmscope.collectors.config import CollectorConfig
    from warmscope.simulator.config import SimConfig

    page = ref.configuration_page()
    classes = {"collectors": CollectorConfig, "analysis": AnalysisConfig, "simulator": SimConfig}
    for section, cls in classes.items():
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in page, f"{section}.{f.name}"
    # the notes only name fields that exist
    for key in [*ref.NOTES, *ref.FACTORY_DEFAULTS]:
        section, name = key.split(".")
        assert name in {f.name for f in dataclasses.fields(classes[section])}, key
    # a comment beside the field is its description; the simulator's table in its docstring
    assert "| extra words a default family may keep verbatim |" in page
    assert "prefix-KV block size in tokens" in page
    assert "| `max_tenants` | integer | `64` | 1 to 10_000 |" in page


def test_a_field_without_a_description_stops_the_generator():
    @dataclasses.dataclass(frozen=True)
    class Described:
        # read before the flush
        window_s: float = 3.0  # seconds
        limit: int = 4  # rows kept

    rows = ref.config_rows("x", Described, {})
    assert [r[-1] for r in rows] == ["read before the flush seconds", "rows kept"]

    @dataclasses.dataclass(frozen=True)
    class Undescribed:
        described: int = 3  # a field with a comment
        bare: int = 4

    with pytest.raises(SystemExit, match="x.bare has no description"):
        ref.config_rows("x", Undescribed, {})


def test_metrics_page_lists_every_instrument_with_its_prometheus_name():
    from warmscope.model import schema

    page = ref.metrics_page()
    for inst in schema.INSTRUMENTS:
        assert f"| `{inst.name}` | `{schema.prom_name(inst)}` |" in page, inst.name
    assert "`warmscope_cache_lookups_total`" in page and "`warmscope_kv_miss_class`" in page
