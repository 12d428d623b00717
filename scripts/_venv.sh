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
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  # torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -e ".[dev]"
  touch "$stamp"
fi
