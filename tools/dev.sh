#!/usr/bin/env bash
# Set-up and everyday commands for a fresh checkout.
#   bash tools/dev.sh test     install everything into .venv, then run the whole test suite
#   bash tools/dev.sh serve    install, then start the server (127.0.0.1:28100)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${SWAMA_VENV:-.venv}

install() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # One MLX backend per environment: CPU here (use the `cuda` extra on NVIDIA machines).
    "$VENV/bin/python" -m pip install --quiet -e ".[cpu,test]"
}

case "${1:-}" in
    test)
        install
        "$VENV/bin/python" -m swama.tools.specs check
        "$VENV/bin/ruff" check engine handlers tools tests
        # pytest exits 5 when it collects no test: that is a failure here, not a pass.
        "$VENV/bin/python" -m pytest -q "${@:2}"
        ;;
    serve)
        install
        exec "$VENV/bin/swama" serve "${@:2}"
        ;;
    *)
        echo "usage: bash tools/dev.sh test|serve [args...]" >&2
        exit 2
        ;;
esac
