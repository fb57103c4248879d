"""What a `warmscope` command is: a name, how it adds its parser, and how it runs.

Every command is one object in ``main.COMMANDS``; ``main.main`` adds their parsers in that order
and calls ``args.fn(args)`` for the one given. Most commands are a :class:`Simple` declared in
their own module (``rules.COMMAND``, ``gateway.COMMAND``, ...); a command with subcommands is a
:class:`Group`. The registry is checked when ``main`` is imported (:func:`check_commands`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from warmscope.model.registry import require, unique

__all__ = ["Command", "Simple", "Group", "check_commands", "store_path", "overwrite_problem"]

Subparsers = Any  # argparse's _SubParsersAction, private in typeshed's eyes


@runtime_checkable
class Command(Protocol):
    """A `warmscope` subcommand: ``add_parser`` adds it to the main parser's subparsers and sets
    ``fn`` (what ``main`` calls with the parsed arguments; its return is the exit code)."""

    @property
    def name(self) -> str: ...

    def add_parser(self, sub: Subparsers) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _nothing(p: argparse.ArgumentParser) -> None:
    """No arguments."""


@dataclass(frozen=True)
class Simple:
    """A command with one parser: ``arguments(p)`` adds its options, ``run(args)`` does the work
    and returns the exit code. ``description``, ``epilog`` and ``formatter_class`` go to
    argparse."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = _nothing
    description: str | None = None
    epilog: str | None = None
    formatter_class: type[argparse.HelpFormatter] | None = None
    uses_store: bool = True  # it reads or records into the embedded store: takes --store too

    def __post_init__(self) -> None:
        def need(ok: object, problem: str) -> None:
            require(ok, "CLI command", self.name, problem)

        need(self.name and " " not in self.name, "needs a one-word name")
        need(self.help, "needs a help line (warmscope --help lists it)")
        need(callable(self.run), "needs run(args) -> exit code")
        need(callable(self.arguments), "arguments must be a function")

    def add_parser(self, sub: Subparsers) -> argparse.ArgumentParser:
        extra = {
            k: v
            for k in ("description", "epilog", "formatter_class")
            if (v := getattr(self, k)) is not None
        }
        p: argparse.ArgumentParser = sub.add_parser(self.name, help=self.help, **extra)
        self.arguments(p)
        if self.uses_store and "--store" not in p._option_string_actions:
            # `warmscope CMD --store PATH` as well as `warmscope --store PATH CMD` (the messages
            # say "pass --store PATH"); absent, the global option's value stands
            p.add_argument(
                "--store",
                default=argparse.SUPPRESS,
                metavar="PATH",
                help="the embedded store (as `warmscope --store PATH CMD`)",
            )
        p.set_defaults(fn=self.run)
        return p


@dataclass(frozen=True)
class Group:
    """A command whose subcommands are commands (``warmscope report ab``)."""

    name: str
    help: str
    commands: tuple[Command, ...]

    def __post_init__(self) -> None:
        require(
            self.name and self.help,
            "CLI command",
            self.name or "(no name)",
            "needs a name and a help line",
        )
        check_commands(self.commands, f"CLI command {self.name}")

    def add_parser(self, sub: Subparsers) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(self.name, help=self.help)
        inner = p.add_subparsers(dest=self.name, required=True)
        for c in self.commands:
            c.add_parser(inner)
        return p

    def run(self, args: argparse.Namespace) -> int:  # argparse requires a subcommand: not reached
        names = ", ".join(c.name for c in self.commands)
        raise SystemExit(f"warmscope {self.name}: give one of {names}")


def check_commands(commands: tuple[Command, ...], registry: str = "CLI command") -> None:
    """Raise ``RegistryError`` for an entry that is not a :class:`Command` or a name used twice."""
    for c in commands:
        require(
            isinstance(c, Command) and isinstance(c.name, str),
            registry,
            getattr(c, "name", repr(c)),
            "must have a name, add_parser(sub) and run(args) (app/cli/base.py: Command)",
        )
    unique(registry, [c.name for c in commands])


def store_path(args: argparse.Namespace) -> Path:
    """The store a command reads: ``--store``, else the collectors' configured path."""
    from warmscope.collectors.config import CollectorConfig

    return Path(args.store) if args.store else CollectorConfig.load().resolved_store_path()


_SQLITE_HEADER = b"SQLite format 3\x00"


def overwrite_problem(flag: str, out: str | Path, store: str | Path | None = None) -> str | None:
    """Why writing an output file at ``out`` (given as ``flag``) would destroy data, or None: it is
    the store the command reads (``store``), or any SQLite database (a report, a trace or a table
    never replaces one). Checked before anything is written."""
    path = Path(out)
    if store is not None and (
        path.resolve() == Path(store).resolve()
        or (path.exists() and Path(store).exists() and path.samefile(store))
    ):
        return f"{flag} {out} is the store this command reads; give another path"
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError:  # absent, a directory, unreadable: the write itself says what is wrong
        return None
    if head == _SQLITE_HEADER:
        return (
            f"{flag} {out} is a SQLite database (a store?); warmscope does not write over one: "
            "give another path"
        )
    return None
