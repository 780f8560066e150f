#!/usr/bin/env bash
# dev.sh - set up, build, run and test kt on a Debian machine.
#
#   ./dev.sh demo    install what is missing, build, generate the default synthetic
#                    model, serve it with kt-serve and send it one chat request (curl)
#   ./dev.sh test    install what is missing, build, run the whole test suite (ctest)
#   ./dev.sh asan    the test suite again, built with AddressSanitizer + UBSan
#   ./dev.sh fuzz    build the libFuzzer targets (clang) and fuzz each for
#                    KT_FUZZ_SECONDS (default 60)
#   ./dev.sh build   install and build only
#
# Runs as root or through sudo.  Installs Debian packages only; test and asan also
# install Debian's OpenMPI (libopenmpi-dev, openmpi-bin: the tests that run kt over
# ranks with mpirun), iproute2 (`ip netns`: the two-host test), nodejs, npm and chromium
# and run `npm ci` in tests/openai-sdk (the openai SDK and the AI SDK, pinned),
# tests/anthropic-sdk (@anthropic-ai/sdk, pinned), tests/langchain (@langchain/openai +
# @langchain/core, pinned) and tests/dashboard (playwright-core, pinned) for the
# real-client and browser tests.  Nothing else.
set -euo pipefail
cd "$(dirname "$0")"

KT_JOBS=${KT_JOBS:-$(nproc)}
KT_MODEL_DIR=${KT_MODEL_DIR:-models}
KT_DEFAULT_PRESET=${KT_DEFAULT_PRESET:-tiny}

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "dev.sh: installing packages needs root: run it as root, or install sudo (apt-get install sudo) and add yourself to the sudo group" >&2
        exit 1
    fi
}

# install_missing PKG... : apt-get install only what dpkg does not already have.
install_missing() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    local out
    out=$(mktemp)
    if ! { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$out" 2>&1; then
        tail -n 40 "$out" >&2
        rm -f "$out"
        echo "dev.sh: apt-get could not install ${missing[*]}" >&2
        exit 1
    fi
    rm -f "$out"
}

BASE_PACKAGES=(build-essential cmake ninja-build pkg-config
    libnuma-dev libhwloc-dev libjemalloc-dev libyaml-dev libjansson-dev libmicrohttpd-dev libdnnl-dev curl)

werror_flag() {
    # Warnings are errors in CI; a developer on a newer compiler still gets a build.
    if [ "${CI:-}" = "true" ] || [ "${KT_WERROR:-0}" = "1" ]; then echo -DKT_WERROR=ON; else echo -DKT_WERROR=OFF; fi
}

configure_and_build() { # dir, extra cmake args...
    local dir=$1; shift
    cmake -S . -B "$dir" -G Ninja $(werror_flag) "$@" >"$dir.configure.log" 2>&1 || {
        cat "$dir.configure.log" >&2; exit 1; }
    grep -E 'kt: CUDA' "$dir.configure.log" >&2 || true
    cmake --build "$dir" -j "$KT_JOBS"
}

build_release() {
    install_missing "${BASE_PACKAGES[@]}"
    mkdir -p build
    log "building kt (build/)"
    # KT_CMAKE_ARGS: extra configure arguments (CI: -DKT_CUDA=ON with the host's nvcc).
    configure_and_build build -DCMAKE_BUILD_TYPE=Release ${KT_CMAKE_ARGS:-}
}

run_tests() { # dir
    log "running the test suite ($1)"
    local rc=0
    ctest --test-dir "$1" --output-on-failure -j "$KT_JOBS" --timeout 900 || rc=$?
    # Say why each skipped test skipped (ctest itself only says "Skipped").
    awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} /^skipped: /{print "  " name ": " $0}' \
        "$1/Testing/Temporary/LastTest.log" >&2 || true
    return $rc
}

# demo_serve MODEL: kt-serve on MODEL, one chat request with curl, then SIGTERM.
demo_serve() {
    local model=$1 port=${KT_DEMO_PORT:-8080} name
    name=$(basename "$model" .gguf)
    log "kt-serve: an OpenAI-compatible server for $model on http://127.0.0.1:$port"
    build/tools/kt-serve -m "$model" --port "$port" &
    local pid=$!
    trap "kill $pid 2>/dev/null || true" EXIT
    for _ in $(seq 600); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break
        kill -0 "$pid" 2>/dev/null || { echo "kt-serve did not start (port $port in use? set KT_DEMO_PORT)" >&2; exit 1; }
        sleep 0.1
    done
    log "curl: one chat request (random weights: the text is noise, the pipeline is real)"
    curl -sS "http://127.0.0.1:$port/v1/chat/completions" -H "Content-Type: application/json" \
        -d "{\"model\": \"$name\", \"messages\": [{\"role\": \"user\", \"content\": \"Write one sentence about rivers.\"}], \"max_tokens\": 48, \"seed\": 1}"
    echo
    kill -TERM "$pid"
    wait "$pid"
    trap - EXIT
}

# The real-client tests run the official SDKs under Debian's Node (tests/openai-sdk: the
# openai SDK and the AI SDK; tests/anthropic-sdk: @anthropic-ai/sdk; tests/langchain:
# @langchain/openai + @langchain/core; each pinned in its package-lock.json);
# the dashboard test drives Debian's chromium with playwright-core (tests/dashboard, pinned
# likewise). ca-certificates is only recommended by nodejs, and npm needs it to reach the
# registry.
TEST_PACKAGES=(nodejs npm ca-certificates chromium)
# OpenMPI for the pipeline over ranks (runtime/dist): the build finds it (KT_MPI=AUTO) and
# test_kt_run_mpi / test_kt_serve_mpi drive mpirun on this machine; iproute2 for
# test_kt_run_netns and test_kt_serve_netns (`ip netns`, `ip link`: two network namespaces joined by a veth pair,
# one rank in each; a minbase Debian root has no `ip`).
MPI_PACKAGES=(libopenmpi-dev openmpi-bin iproute2)
install_sdk_test() {
    install_missing "${TEST_PACKAGES[@]}"
    local dir
    for dir in openai-sdk anthropic-sdk langchain dashboard; do
        log "npm ci in tests/$dir (pinned in its package-lock.json)"
        if ! (cd "tests/$dir" && npm ci --no-audit --no-fund --loglevel=error); then
            # CI must run the real-client tests; a developer offline still gets the rest.
            [ "${CI:-}" = "true" ] && { echo "dev.sh: npm ci failed in tests/$dir" >&2; exit 1; }
            log "npm ci failed: the tests that need tests/$dir will skip"
        fi
    done
}

cmd=${1:-}
case "$cmd" in
build)
    build_release
    ;;
demo)
    build_release
    mkdir -p "$KT_MODEL_DIR"
    model="$KT_MODEL_DIR/$KT_DEFAULT_PRESET.gguf"
    log "generating the synthetic model $model"
    build/tools/kt-synth --preset "$KT_DEFAULT_PRESET" -o "$model"
    demo_serve "$model"
    ;;
test)
    install_missing "${MPI_PACKAGES[@]}"
    build_release
    install_sdk_test
    run_tests build
    ;;
asan)
    install_missing "${BASE_PACKAGES[@]}" "${MPI_PACKAGES[@]}"
    mkdir -p build-asan
    log "building kt with ASan+UBSan (build-asan/)"
    configure_and_build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKT_SANITIZE=ON -DKT_CUDA=OFF
    install_sdk_test
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} run_tests build-asan
    ;;
fuzz)
    install_missing "${BASE_PACKAGES[@]}" clang libclang-rt-dev libomp-dev
    mkdir -p build-fuzz
    log "building fuzz targets with clang (build-fuzz/)"
    CC=clang cmake -S . -B build-fuzz -G Ninja $(werror_flag) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKT_CUDA=OFF \
        -DKT_FUZZ=ON -DKT_SANITIZE=ON -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link >build-fuzz.configure.log 2>&1 || {
        cat build-fuzz.configure.log >&2; exit 1; }
    secs=${KT_FUZZ_SECONDS:-60}
    fuzzed=0
    for src in tests/fuzz/fuzz_*.c; do
        name=$(basename "$src" .c)
        what=${name#fuzz_}
        targets=("$name")
        [ -f "tests/test_${what}_corrupt.c" ] && targets+=("test_${what}_corrupt")
        cmake --build build-fuzz -j "$KT_JOBS" --target "${targets[@]}"
        # Seeds: the malformed corpus the matching test writes, small files only.
        seeds="build-fuzz/seeds/$what" corpus="build-fuzz/corpus/$what"
        rm -rf "$seeds"; mkdir -p "$seeds" "$corpus"
        [ "$what" = placement ] && cp configs/*.yaml "$seeds"/
        if [ -x "build-fuzz/tests/test_${what}_corrupt" ]; then
            KT_TEST_TMP="$PWD/build-fuzz/tests/tmp" "build-fuzz/tests/test_${what}_corrupt" >/dev/null
            find "build-fuzz/tests/tmp/corpus/$what" -type f -size -8k -exec cp -t "$seeds" {} +
        fi
        log "fuzzing $name for ${secs}s"
        if ! "build-fuzz/tests/fuzz/$name" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 \
                "$corpus" "$seeds" >"build-fuzz/$name.log" 2>&1; then
            tail -n 60 "build-fuzz/$name.log" >&2
            echo "fuzz: $fuzzed passed, 1 failed"
            exit 1
        fi
        grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "build-fuzz/$name.log" >&2 || true
        fuzzed=$((fuzzed + 1))
    done
    echo "fuzz: $fuzzed passed, 0 failed"
    ;;
*)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
