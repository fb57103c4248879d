#!/usr/bin/env bash
# Set everything up and open the dashboard on the embedded store with demo data:
#   bash scripts/demo.sh            (then open http://127.0.0.1:8501)
# Extra arguments go to `warmscope demo` (e.g. --port 8600, --fresh).
source "$(dirname "$0")/_setup.sh"
ensure_venv app
# Python writes the bytecode of what it imports (once) even where PYTHONDONTWRITEBYTECODE is set:
# the setup leaves the dependencies' bytecode to first import (scripts/_setup.sh)
export PYTHONDONTWRITEBYTECODE=
exec .venv/bin/warmscope demo "$@"
