"""The ``warmscope`` command line: one module per command group, :mod:`.main` ties them."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
