#!/usr/bin/env bash
# Set everything up and run the whole test suite:  bash scripts/test.sh [pytest args]
# Installs what the tests start (redis-server, prometheus/promtool, victoria-metrics,
# chromium, and vLLM's CPU build in its own cached venv)
# when missing; the tests
# start them on free 127.0.0.1 ports and stop them. Under CI=true a missing
# service fails the run instead of skipping tests.
#
# The quick path:  bash scripts/test.sh --quick [pytest args]
# Every test that needs no external service and is not slow (markers in pyproject.toml): no
# redis-server, prometheus/promtool/victoria-metrics, vLLM or Chromium is installed or started.
# 1½ to 3 minutes on two idle cores (the machine decides); lint is scripts/lint.sh.
#
# Both run the tests in parallel (pytest-xdist; WARMSCOPE_TEST_WORKERS=N sets the number of
# workers, 0 runs them in this process): the quick path on one worker per core, the whole suite on
# one more (its tests also wait: on scrapes, real-time runs, engines starting), at most 4. The
# engine tests share one worker and its vLLM engines (the what-if module's own engines another);
# a module whose tests share a fixture runs on one worker (tests/conftest.py). The ten slowest
# tests and the time per marker are printed at the end.
QUICK="not engine and not redis and not prometheus and not browser and not slow"
source "$(dirname "$0")/_setup.sh"
ensure_venv dev
# The test run caches bytecode (in __pycache__, ignored by git) even where PYTHONDONTWRITEBYTECODE
# is set: each pytest worker would otherwise compile and assertion-rewrite every test module again
# (about 5 s of CPU a worker), and each process a test starts would compile what it imports.
export PYTHONDONTWRITEBYTECODE=
CORES="$(nproc 2>/dev/null || echo 1)"
parallel() {  # parallel DEFAULT_WORKERS: the pytest options of a parallel run
  local n="${WARMSCOPE_TEST_WORKERS:-$1}"
  [ "$n" -gt 4 ] && n=4
  [ "$n" -le 1 ] && n=0
  WORKERS="$n"
  PARALLEL=(-n "$n" --dist loadgroup --no-loadscope-reorder)
}
if [ "${1:-}" = "--quick" ]; then
  shift
  parallel "$CORES"
  log "quick path: -m \"$QUICK\" on $WORKERS workers"
  exec .venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" -m "$QUICK" "$@"
fi
parallel "$((CORES + 1))"
ensure_cmd redis-server redis-server
ensure_cmd chromium chromium
ensure_cmd promtool prometheus   # promtool for the rule tests, prometheus for the integration test
ensure_cmd victoria-metrics victoria-metrics   # the long-term PromQL store behind Prometheus
log "vLLM (CPU build) for the real-engine tests: installed once into ~/.cache/warmscope"
.venv/bin/python -m warmscope.simulator.real_engine install
bash "$ROOT/scripts/lint.sh"  # ruff and mypy --strict first: a finding fails the run
log "running tests on $WORKERS workers"
exec .venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" "$@"
