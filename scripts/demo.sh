#!/usr/bin/env bash
# Set everything up and open the dashboard on the embedded store with demo data:
#   bash scripts/demo.sh            (then open http://127.0.0.1:8501)
# Extra arguments go to `warmscope demo` (e.g. --port 8600, --fresh).
source "$(dirname "$0")/_setup.sh"
ensure_venv app
exec .venv/bin/warmscope demo "$@"
