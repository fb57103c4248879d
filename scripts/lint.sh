#!/usr/bin/env bash
# Lint and type-check:  bash scripts/lint.sh
# ruff over the repository and mypy --strict over collectors/ and analysis/, both
# configured in pyproject.toml, from the same .venv as scripts/test.sh.
source "$(dirname "$0")/_setup.sh"
ensure_venv dev
rc=0
log "ruff check"
.venv/bin/ruff check . || rc=1
log "mypy (strict: collectors/, analysis/)"
.venv/bin/mypy || rc=1
exit "$rc"
