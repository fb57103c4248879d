"""The ``warmscope`` command line: :mod:`.main` builds the parser and runs a command; the other
modules each hold a command group (``python -m warmscope.app.cli`` is the same as ``warmscope``)."""
