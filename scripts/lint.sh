#!/usr/bin/env bash
# Lint and type-check:  bash scripts/lint.sh
# ruff over the repository, its formatter's check over the product code, mypy --strict over every
# package (model/, collectors/, sources/, analysis/, simulator/, app/), and the
# import contract (lint-imports), all configured in pyproject.toml, from the same .venv as scripts/test.sh.
source "$(dirname "$0")/_setup.sh"
ensure_venv dev
rc=0
log "ruff check"
.venv/bin/ruff check . || rc=1
log "ruff format --check (product code, 100 columns)"
.venv/bin/ruff format --check collectors analysis app model sources simulator || rc=1
log "ruff: tests and benches within 120 columns"
.venv/bin/ruff check --select E501 --config 'lint.pycodestyle.max-line-length=120' \
  --config 'lint.per-file-ignores={}' tests bench || rc=1
log "mypy (strict: every package: model/, collectors/, sources/, analysis/, simulator/, app/)"
.venv/bin/mypy || rc=1
log "import contract (lint-imports)"
.venv/bin/lint-imports --no-cache || rc=1
exit "$rc"
