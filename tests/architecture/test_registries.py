"""The extension points' registries: each entry complete, checked when its module is imported, and
read by what needs it (one list, not parallel ones)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from warmscope.app.cli import base as cli_base
from warmscope.app.cli.main import COMMANDS
from warmscope.app.dashboard import pages
from warmscope.model import records
from warmscope.model.registry import RegistryError

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ pages
def test_every_view_module_is_a_page_with_a_render_function_and_a_two_line_entry():
    views = {p.stem for p in pages.VIEWS.glob("*.py") if p.stem != "__init__"}
    entries = {p.stem for p in pages.ENTRIES.glob("*.py")}
    assert views == entries == {p.name for p in pages.PAGES}
    for p in pages.PAGES:
        tree = ast.parse(p.view.read_text())
        # a module of definitions: nothing runs at import but imports and constants
        assert all(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                  ast.AnnAssign)) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                   or (isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")  # imports for types
                   for n in tree.body), p.name
        assert any(isinstance(n, ast.FunctionDef) and n.name == "render" for n in tree.body), p.name
        assert not re.search(r"^\s*st\.title\(", p.view.read_text(), re.M), p.name  # run() draws it
        assert p.file.read_text().splitlines() == ["from warmscope.app.dashboard.pages import run", "",
                                                   f'run("{p.name}")']
        # no page imports a private name of the analysis
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("warmscope.analysis"):
                assert not [a.name for a in n.names if a.name.startswith("_")], (p.name, n.module)


def test_an_entry_that_is_not_the_two_lines_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "ENTRIES", tmp_path)
    (tmp_path / "overview.py").write_text("import streamlit as st\nst.title('x')\n")
    bad = dataclasses.replace(pages.PAGES[0])
    with pytest.raises(RegistryError, match="must be exactly"):
        pages.check_pages((bad,))


@pytest.mark.parametrize("change, words", [
    (dict(name="nope"), "no view module"),
    (dict(title=""), "needs a title"),
    (dict(heading=""), "needs the heading"),
    (dict(icon="🔥"), "Material icon"),
    (dict(engine_only=" "), "engine_only is the text"),
])
def test_an_incomplete_page_fails_with_a_clear_message(change, words):
    bad = dataclasses.replace(pages.PAGES[1], **change)
    with pytest.raises(RegistryError, match=f"dashboard page entry '{bad.name}'") as e:
        pages.check_pages((pages.PAGES[0], bad))
    assert words in str(e.value)


def test_pages_need_one_default_and_distinct_names():
    with pytest.raises(RegistryError, match="declared twice"):
        pages.check_pages((*pages.PAGES, pages.PAGES[-1]))
    with pytest.raises(RegistryError, match="exactly one page must be the default"):
        pages.check_pages(pages.PAGES[1:])


def test_prewarm_steps_match_the_pages_that_ask_for_them():
    from warmscope.app.dashboard import prewarm

    prewarm.check_prewarm(pages.PAGES, prewarm._WARM)  # as at import
    flipped = tuple(dataclasses.replace(p, prewarm=not p.prewarm) if p.name == "advisor" else p
                    for p in pages.PAGES)
    with pytest.raises(RegistryError, match="'advisor': prewarm=True needs prewarm._warm_advisor"):
        prewarm.check_prewarm(flipped, prewarm._WARM)
    with pytest.raises(RegistryError, match="'hotkeys': has prewarm._warm_hotkeys but prewarm=False"):
        prewarm.check_prewarm(tuple(dataclasses.replace(p, prewarm=False) if p.name == "hotkeys" else p
                               for p in pages.PAGES), prewarm._WARM)


# ----------------------------------------------------------------- layers
def _undeclared() -> str:
    """A layer name no declaration uses (whatever the registry holds)."""
    name = "undeclared"
    while name in records.LAYERS:
        name += "_"
    return name


def test_layer_declarations_drive_hit_rates_and_sharing(monkeypatch):
    # A registry of the test's own: the functions read whatever LAYERS holds when called.
    monkeypatch.setattr(records, "LAYERS", {"w": records.Layer(shared=True, in_hit_rate=False),
                                            "kv": records.Layer(length_buckets=True),
                                            "lora": records.Layer(loaded_at_start=True)})
    assert records.not_in_hit_rate() == ("w",) and records.shared_layers() == ("w",)
    assert records.start_layers() == ("lora",)
    monkeypatch.setitem(records.LAYERS, "emb", records.Layer(shared=True))
    assert records.shared_layers() == ("w", "emb") and records.not_in_hit_rate() == ("w",)
    assert records.layer(_undeclared()) == records.Layer()  # undeclared: a plain per-tenant cache
    with pytest.raises(RegistryError, match="must be True or False"):
        records.Layer(in_hit_rate="no")  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="LAYERS entry 'x': must be a Layer"):
        records.check_layers({"x": {"shared": True}})  # type: ignore[dict-item]
    with pytest.raises(RegistryError, match="non-empty string"):
        records.check_layers({" x": records.Layer()})


def test_a_layer_declared_at_run_time_counts_alike_on_the_score_card_and_the_dashboard(monkeypatch):
    """Hit rates leave out the layers declared in_hit_rate=False when they are computed, not when
    a module was imported: the score card and the dashboard's filter agree on a new declaration."""
    import pandas as pd
    from warmscope.analysis.hitrate import hit_table
    from warmscope.analysis.scores import score_card
    from warmscope.app.dashboard.cached import hit_rate_layers
    from warmscope.model import schema

    scratch = _undeclared()
    lookups = pd.DataFrame([(60.0, "t", "kv", "f:*", "hit", 8), (60.0, "t", "kv", "f:*", "miss", 2),
                            (60.0, "t", scratch, "s:*", "miss", 10)],
                           columns=["ts", "tenant", "layer", "family", "result", "count"])

    def rates() -> tuple[float, float]:
        card = {d.name: d for d in score_card({"lookups": lookups}).dimensions}
        dash = hit_table(hit_rate_layers(lookups))["hit_rate"].iloc[0]
        return card["cache_hit_rate"].value, float(dash)

    assert rates() == (pytest.approx(8 / 20), pytest.approx(8 / 20))  # 8 hits of 20 lookups
    monkeypatch.setitem(records.LAYERS, scratch, records.Layer(in_hit_rate=False, shared=True))
    assert rates() == (pytest.approx(8 / 10), pytest.approx(8 / 10))  # the scratch layer left out
    card = {d.name: d for d in score_card({"lookups": lookups}).dimensions}
    assert scratch in card["cache_hit_rate"].source  # "layers except ..., <scratch>"
    assert scratch in schema.SHARED_LAYERS  # the name modules import reads the registry too


def test_no_module_names_a_layer_to_leave_out_of_hit_rates():
    """"Leave this layer out" is records.LAYERS' in_hit_rate, not a string compared in the code."""
    pattern = re.compile(r"""\.layer\s*!=\s*["']weights|\["layer"\]\s*!=\s*["']weights""")
    packages = ("model", "collectors", "sources", "analysis", "app")
    found = [str(p.relative_to(ROOT)) for pkg in packages
             for p in (ROOT / pkg).rglob("*.py") if pattern.search(p.read_text())]
    assert found == []


# --------------------------------------------------------------- commands
def test_help_lists_the_registry_in_its_order():
    names = [c.name for c in COMMANDS]
    assert {"demo", "simulate", "report", "rca", "warmup"} <= set(names)
    out = subprocess.run([sys.executable, "-m", "warmscope.app.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "{" + ",".join(names) + "}" in out.replace("\n", "").replace(" ", "")


def test_a_command_that_is_not_one_fails_with_a_clear_message():
    with pytest.raises(RegistryError, match="CLI command entry 'x': needs a help line"):
        cli_base.Simple("x", help="", run=lambda a: 0)

    class NoRun:
        name = "norun"

        def add_parser(self, sub):
            return sub.add_parser(self.name)

    with pytest.raises(RegistryError, match="'norun': must have a name, add_parser"):
        cli_base.check_commands((*COMMANDS, NoRun()))  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="'rules': declared twice"):
        cli_base.check_commands((*COMMANDS, COMMANDS[3]))


def test_a_simple_command_parses_and_runs():
    ran = []
    cmd = cli_base.Simple("hello", help="say hello", run=lambda a: ran.append(a.who) or 0,
                          arguments=lambda p: p.add_argument("--who", default="world"))
    ap = argparse.ArgumentParser()
    cmd.add_parser(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(["hello", "--who", "you"])
    assert args.fn(args) == 0 and ran == ["you"]
