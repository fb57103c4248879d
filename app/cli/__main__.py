"""``python -m warmscope.app.cli``: the same as the ``warmscope`` command."""

import sys

from .main import main

sys.exit(main())
