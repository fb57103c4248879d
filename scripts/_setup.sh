# Shared setup for scripts/demo.sh and scripts/test.sh (sourced, not run).
# Idempotent: creates .venv, installs the project, installs system services
# with apt-get when they are missing. Works on a fresh Debian/Ubuntu machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '\033[1m[warmscope]\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*  (run as root or install sudo)"; return 1; fi
}

APT_UPDATED=0
apt_install() {  # apt_install pkg...
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_cmd() {  # ensure_cmd command package
  command -v "$1" >/dev/null 2>&1 || apt_install "$2"
  command -v "$1" >/dev/null 2>&1 || { log "$1 is still missing after installing $2"; return 1; }
}

pick_python() {
  for py in python3.13 python3.12 python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  log "Python >= 3.11 is required (found: $(python3 --version 2>&1 || echo none))"
  return 1
}

# uv, kept once per machine in the user's cache (a small venv of its own): a checkout's venv is
# then made and filled in a few seconds (making a venv with pip in it, then installing uv into it,
# took about 6 s of every fresh checkout's setup). Prints the uv to use, or fails (pip then).
uv_bin() {  # uv_bin python
  local dir="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/warmscope/uv"
  [ "${WARMSCOPE_PIP:-0}" = 1 ] && return 1
  if command -v uv >/dev/null 2>&1; then command -v uv; return 0; fi
  if ! "$dir/bin/uv" --version >/dev/null 2>&1; then
    rm -rf "$dir"
    { "$1" -m venv "$dir" && "$dir/bin/python" -m pip install -q uv; } >/dev/null 2>&1 ||
      { rm -rf "$dir"; return 1; }
  fi
  echo "$dir/bin/uv"
}

ensure_venv() {  # ensure_venv [extra]
  local extra="${1:-}" py stamp want uv=""
  py="$(pick_python)"
  "$py" -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
  uv="$(uv_bin "$py")" || uv=""
  if [ ! -x .venv/bin/python ]; then
    # --seed: pip in the venv too (the packaging tests build wheels with it)
    if [ -z "$uv" ] || ! UV_PYTHON_DOWNLOADS=never "$uv" venv -q --seed \
         --python "$(command -v "$py")" .venv >/dev/null 2>&1; then
      rm -rf .venv
      "$py" -m venv .venv 2>/dev/null || { apt_install python3-venv; rm -rf .venv; "$py" -m venv .venv; }
    fi
  fi
  want="$(sha256sum pyproject.toml | cut -c1-16)-${extra}"
  stamp=".venv/.warmscope-installed"
  if [ ! -f "$stamp" ] || ! grep -qx "$want" "$stamp"; then
    log "installing warmscope${extra:+[$extra]} into .venv"
    # uv installs the same packages in a fraction of pip's time; pip when uv cannot be had or
    # cannot install (WARMSCOPE_PIP=1: pip only). For the demo uv leaves the dependencies'
    # bytecode to Python, which compiles a module when first imported, only the modules imported
    # (compiling all the thousands installed took about 20 s of the demo's setup; demo.sh lets
    # Python write it even where PYTHONDONTWRITEBYTECODE is set). For the tests it compiles them
    # all: the test run starts many processes at once under a timeout (three workers, dashboards,
    # CLI calls), and the first of each would otherwise compile its imports under that load.
    local compile=()
    [ "$extra" = dev ] && compile=(--compile-bytecode)
    if [ -n "$uv" ] &&
       "$uv" pip install -q "${compile[@]}" --python .venv/bin/python -e ".${extra:+[$extra]}"; then
      :
    else
      # a venv's own pip (ensurepip) installs editable projects from 21.3 on: upgraded only if older
      .venv/bin/python -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 22)' 2>/dev/null ||
        .venv/bin/python -m pip install -q --upgrade pip
      .venv/bin/python -m pip install -q -e ".${extra:+[$extra]}"
    fi
    echo "$want" > "$stamp"
  fi
  # The project's own modules compiled here, once: where PYTHONDONTWRITEBYTECODE is set, Python
  # reads bytecode but never writes it, and every process (a test worker, a CLI call, the
  # dashboard) would compile the project again, about 0.3 s of CPU each. Up-to-date files are
  # skipped (a quarter of a second when nothing changed).
  .venv/bin/python -m compileall -q -j 0 model collectors sources analysis simulator app >/dev/null ||
    log "could not compile the project's bytecode (it is compiled on import instead)"
}
