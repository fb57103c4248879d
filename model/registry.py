"""What the registries of warmscope's extension points share: the error an incomplete entry raises.

Each extension point has one registry, declared where its entries live and checked when that module
is imported:

* score dimensions: ``analysis/dimensions.py`` (``@dimension(...)`` on each computation,
  ``DIMENSIONS``);
* dashboard pages: ``app/dashboard/pages.py`` (``PAGES``);
* cache layers: ``model/records.py`` (``LAYERS``);
* CLI commands: ``app/cli/main.py`` (``COMMANDS``, each a :class:`warmscope.app.cli.base.Command`).

An entry with a missing or inconsistent field raises :class:`RegistryError` at import, naming the
registry, the entry and the field, so a half-added extension cannot be silently left out.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RegistryError", "require", "unique"]


class RegistryError(ValueError):
    """A registry entry is incomplete or inconsistent (raised when its module is imported)."""


def require(ok: object, registry: str, entry: str, problem: str) -> None:
    """Raise ``RegistryError("<registry> entry <entry>: <problem>")`` unless ``ok``."""
    if not ok:
        raise RegistryError(f"{registry} entry {entry!r}: {problem}")


def unique(registry: str, names: Iterable[str]) -> None:
    """Raise ``RegistryError`` when a name appears twice in ``registry``."""
    seen: set[str] = set()
    for name in names:
        require(name not in seen, registry, name, "declared twice")
        seen.add(name)
