# Sourced by scripts/*: make .venv (once) and install gpulayer with its dev extra and the
# pinned CPU build of torch. Re-running is quick: pip skips what is already there.
VENV="${GPULAYER_VENV:-$PWD/.venv}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "gpulayer needs Python >= 3.10 (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.x" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.gpulayer-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/_venv.sh -nt "$stamp" ]; then
  echo "== installing gpulayer[dev] and torch==2.13.0 (CPU build) into $VENV"
  # torch is pinned (in the dev extra): an unpinned torch would pull a multi-GB CUDA build.
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -e ".[dev]" >"$VENV/pip-install.log" 2>&1; then
    tail -40 "$VENV/pip-install.log" >&2
    echo "pip install failed; the whole log is $VENV/pip-install.log" >&2
    exit 1
  fi
  touch "$stamp"
fi
