#!/usr/bin/env bash
# Everything in moxie that needs an NVIDIA GPU, in two steps: build on any Linux x86-64 machine
# with Rust, then run on the GPU machine, which needs no Rust toolchain (the CUDA driver and
# NVRTC are loaded at run time; NVRTC comes from a CUDA toolkit or `CUDA_HOME`).
#
#   scripts/gpu-check.sh stage [DIR]        # CPU machine: build (release, --features cuda) and
#                                           # copy the binaries and the fixtures into DIR
#                                           # (default .gpu-check, ignored by git)
#   scripts/gpu-check.sh run [DIR] [REPORT] # GPU machine: the checks below, one report file
#                                           # (default DIR/report.md)
#
# `stage` strips the binaries and puts the fixture models in parts of at most PART_MIB (default
# 54) under DIR/parts/N/, so that a remote runner that carries at most 64 MiB with the working
# tree (this project's device tool) can take them one part a call: it prints the calls, in
# order, with their sizes. `run` moves the parts' models into DIR/fixtures/models first.
#
# `run` does, each step under its own time limit (the whole under 10 minutes on an H100):
#   1. the ignored CUDA tests of moxie-gpu (device, copies, every kernel launch), and its
#      weight-product tests of every type (f32 and int8 activations) on the device;
#   2. the every-fixture sweep on the real GPU: all-GPU, `-ngl 999 --cpu-moe` and a mixed
#      split, each against the CPU logits, then q8_0 KV caches on GPU layers and the routing
#      telemetry of GPU-routed layers (moxie-core's gpu_emu tests, the ignored `cuda_` cases);
#   3. `moxie bench` on bench-deepseek2 Q4_K_M, generated there, for the three patterns users
#      compare: CPU-only (`-ngl 0`), hybrid (`-ngl 999 -ot exps=CPU`) and all-GPU (`-ngl 999`),
#      each next to llama.cpp's llama-bench with the same flags when a llama.cpp source tree was
#      staged (LLAMA_SRC at `stage`, e.g. the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp:
#      built there with -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 while steps 1-2 run, about
#      5 minutes on 16 cores). llama.cpp's `-ngl 0` still runs prompt batches' matrix products
#      on the GPU; moxie's `-ngl 0` is CPU only. Then moxie's hybrid and all-GPU again with
#      MOXIE_GPU_INT8=0 (products over f32 activations instead of the default int8 ones), and
#      all-GPU pp512 with MOXIE_GPU_MMA=0 (int8 prompt products on dp4a, not tensor cores),
#      and all-GPU tg128 at depths 0 and 4096 with attention blocks of 8, 2 and 1 query heads
#      (MOXIE_GPU_ATTN_HEADS).
#   4. placement on a model whose routing reuses recent experts (`moxie gen --routing recency`),
#      CUDA0 budgeted at 2 GiB: `moxie bench --ab` of five whole expert layers (`-ot`, 442 MiB)
#      against an expert cache of the same bytes, a cache of all the room left, and hot experts
#      by a profile (`--fit --profile`), each arm's tg, its ratio and the CPU expert reads per
#      generated token (issue 19's real-GPU line).
#
# Environment: MOXIE_FIXTURES (stage: where the fixtures are; run: fixtures elsewhere than
# DIR/fixtures), LLAMA_SRC (stage), PART_MIB (stage), GPU_CHECK_TESTS=0 (skip steps 1-2),
# GPU_CHECK_BENCH=0 (skip steps 3-4), GPU_CHECK_PLACEMENT=0 (skip step 4), GPU_CHECK_REPS (bench
# repetitions, default 3), THREADS (default: all cores), CUDA_ARCH (llama.cpp's, default 90).
# With 10 minutes a command, run the tests and the benches as two commands on one machine:
# GPU_CHECK_BENCH=0 first (it starts llama.cpp's build in a session of its own, which outlives
# the command), then GPU_CHECK_TESTS=0 (it waits for that build).
set -uo pipefail

cmd=${1:-}
dir=${2:-.gpu-check}
root=$(cd "$(dirname "$0")/.." && pwd)

stage() {
    cd "$root" || exit 1
    local fx=${MOXIE_FIXTURES:-$root/../shared/fixtures}
    [ -f "$fx/golden/index.json" ] || { echo "gpu-check: no fixtures at $fx (set MOXIE_FIXTURES)" >&2; exit 1; }
    cargo build --release -p moxie-cli --features cuda || exit 1
    # The test binaries' paths, from cargo's JSON messages.
    local tests
    tests=$(cargo test --release --features cuda -p moxie-gpu --test cuda --test matmul \
        -p moxie-core --test gpu_emu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda", "matmul", "gpu_emu"):
        print(m["target"]["name"], m["executable"])') || exit 1
    [ "$(echo "$tests" | wc -l)" = 3 ] || { echo "gpu-check: test binaries not found: $tests" >&2; exit 1; }
    mkdir -p "$dir/bin" "$dir/fixtures/golden" "$dir/fixtures/models"
    cp target/release/moxie "$dir/bin/moxie"
    while read -r name path; do cp "$path" "$dir/bin/test-$name"; done <<<"$tests"
    # Symbols only (panics still name the test and the message).
    strip "$dir"/bin/* 2>/dev/null || true
    cp "$fx/golden/index.json" "$dir/fixtures/golden/"
    # The models in parts of at most PART_MIB each (largest first, each into the first part it
    # fits), so that each part travels on its own.
    rm -rf "$dir/parts" "$dir/fixtures/models"
    mkdir -p "$dir/fixtures/models"
    local limit=$((${PART_MIB:-54} * 1048576)) part f size
    local -a used=()
    while read -r size f; do
        [ "$size" -le "$limit" ] || { echo "gpu-check: $f is larger than PART_MIB" >&2; exit 1; }
        part=0
        while [ -n "${used[part]:-}" ] && [ $((used[part] + size)) -gt "$limit" ]; do
            part=$((part + 1))
        done
        used[part]=$((${used[part]:-0} + size))
        mkdir -p "$dir/parts/$((part + 1))"
        cp "$f" "$dir/parts/$((part + 1))/"
    done < <(stat -c '%s %n' "$fx"/models/*.gguf | sort -rn)
    if [ -n "${LLAMA_SRC:-}" ]; then
        # Only what llama-bench needs: the CPU and CUDA backends, no other tool.
        rm -rf "$dir/llama-src"
        mkdir -p "$dir/llama-src"
        (cd "$LLAMA_SRC" && tar cf - --exclude='./build*' --exclude=./.git --exclude=./models \
            --exclude=./docs --exclude=./examples --exclude=./tests --exclude=./gguf-py \
            --exclude=./media --exclude=./app --exclude=./benches --exclude=./pocs .) |
            (cd "$dir/llama-src" && tar xf -) || exit 1
        for b in "$dir"/llama-src/ggml/src/ggml-*/; do
            case $b in */ggml-cpu/ | */ggml-cuda/) ;; *) rm -rf "$b" ;; esac
        done
        for t in "$dir"/llama-src/tools/*/; do
            case $t in */llama-bench/) ;; *) rm -rf "$t" ;; esac
        done
        printf 'llama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' >"$dir/llama-src/tools/CMakeLists.txt"
        du -sh "$dir/llama-src"
    fi
    du -sh "$dir/bin" "$dir/fixtures" "$dir"/parts/*
    echo "gpu-check: staged in $dir; on the GPU machine: scripts/gpu-check.sh run $dir"
    # What a runner that carries paths under the repository (at most 64 MiB a call with the
    # working tree) takes, call after call on one machine.
    local rel=$dir
    case $dir in "$root"/*) rel=${dir#"$root"/} ;; /*) rel= ;; esac
    if [ -z "$rel" ]; then
        echo "gpu-check: $dir lies outside the repository: a runner that carries paths under it cannot take it"
    else
        local tree
        tree=$(git ls-files -z --cached --others --exclude-standard |
            du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
        echo "gpu-check: calls for a runner that carries 64 MiB (the working tree is $((tree / 1048576)) MiB):"
        local last="$rel/bin $rel/fixtures" mib p n
        [ -d "$dir/llama-src" ] && last="$last $rel/llama-src"
        # shellcheck disable=SC2086 # the paths are words
        mib=$(cd "$root" && du -smc $last | tail -1 | cut -f1)
        n=$(find "$dir/parts" -mindepth 1 -maxdepth 1 | wc -l)
        for p in "$dir"/parts/*; do
            local part_mib
            part_mib=$(du -sm "$p" | cut -f1)
            # The last (smallest) part goes with the binaries where the two fit one call.
            if [ "${p##*/}" = "$n" ] && [ $((mib + part_mib + tree / 1048576)) -le 62 ]; then
                last="$last $rel/parts/$n"
                mib=$((mib + part_mib))
            else
                echo "  carry $rel/parts/${p##*/} ($part_mib MiB), command: true"
            fi
        done
        echo "  carry $last ($mib MiB), command: GPU_CHECK_BENCH=0 scripts/gpu-check.sh run $rel \$OUT/report-tests.md"
        echo "  then: GPU_CHECK_TESTS=0 scripts/gpu-check.sh run $rel \$OUT/report-bench.md"
    fi
}

run() {
    local report=${3:-$dir/report.md}
    local bin=$dir/bin
    export MOXIE_FIXTURES=${MOXIE_FIXTURES:-$(cd "$dir" && pwd)/fixtures}
    # One NVRTC compile of the kernels for all the steps' processes, whatever HOME is.
    export MOXIE_KERNEL_CACHE=${MOXIE_KERNEL_CACHE:-$(cd "$dir" && pwd)/kernel-cache}
    local threads=${THREADS:-$(nproc)}
    local reps=${GPU_CHECK_REPS:-3}
    local failed=0
    local f
    # The models `stage` put in parts (each part carried on its own).
    if [ -d "$dir/parts" ]; then
        mkdir -p "$dir/fixtures/models"
        for f in "$dir"/parts/*/*.gguf; do
            [ -f "$f" ] && mv -f "$f" "$dir/fixtures/models/"
        done
    fi
    : >"$report"
    say() { echo "$*" | tee -a "$report"; }
    # step NAME LIMIT CMD...: run with a time limit, log to the report, count failures.
    step() {
        local name=$1 limit=$2
        shift 2
        local t0=$SECONDS
        say ""
        say "## $name"
        say '```'
        timeout "$limit" "$@" 2>&1 | tee -a "$report.log" | grep -E -v '^\s*$' |
            grep -E 'test result|^test |passed|FAILED|panicked|KLD|error|Error|\||GPU|CUDA|expert' | tee -a "$report"
        local rc=${PIPESTATUS[0]}
        say '```'
        say "$name: exit $rc after $((SECONDS - t0)) s"
        [ "$rc" = 0 ] || failed=$((failed + 1))
        last_rc=$rc
    }
    local last_rc=0 gpu=0
    say "# moxie gpu-check, $(date -u +%Y-%m-%dT%H:%MZ)"
    say ""
    say '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$report"
    say "$(nproc) CPU threads; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    say '```'
    : >"$report.log"
    # llama.cpp's build runs in a process session of its own, so that it outlives this command
    # when the tests and the benches are two commands (GPU_CHECK_BENCH=0, then
    # GPU_CHECK_TESTS=0); DIR/llama-build.rc holds its exit status once it ends.
    local llama=$dir/llama-build/bin/llama-bench build_rc=$dir/llama-build.rc
    if [ -d "$dir/llama-src" ] && [ ! -x "$llama" ] && [ ! -d "$dir/llama-build" ]; then
        setsid bash -c 'cmake -S "$1/llama-src" -B "$1/llama-build" -G Ninja -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES="$2" -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF &&
            timeout 480 cmake --build "$1/llama-build" -j "$(nproc)" --target llama-bench
            echo $? >"$1/llama-build.rc"' _ "$dir" "${CUDA_ARCH:-90}" \
            >"$dir/llama-build.log" 2>&1 </dev/null &
    fi
    if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
        # (NVRTC's compile of the kernels for this GPU, ~30 s on a 2-core Xeon, is cached on
        # disk for the later steps. kernel_source_compiles_for_sm90 compiles five more times
        # without a device; `stage`'s machine can run it: MOXIE_NVRTC=... cargo test.)
        step "CUDA tests (moxie-gpu, ignored)" 180 "$bin/test-cuda" --include-ignored --test-threads=1 \
            --skip kernel_source_compiles_for_sm90
        step "Weight products of every type on the GPU, f32 and int8 activations (moxie-gpu matmul)" 120 \
            env MOXIE_TEST_CUDA=1 "$bin/test-matmul" --test-threads=4 --skip products_without_room
        step "Every fixture on the GPU against the CPU, q8_0 caches, routing telemetry (moxie-core gpu_emu, ignored)" 240 \
            "$bin/test-gpu_emu" cuda_ --ignored --nocapture --test-threads=1
    fi
    if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
        local model=$dir/bench-deepseek2-Q4_K_M.gguf
        [ -f "$model" ] || step "moxie gen bench-deepseek2 Q4_K_M" 150 \
            "$bin/moxie" gen --arch deepseek2 --preset bench-deepseek2 --type Q4_K_M -o "$model"
        # Without a usable GPU moxie runs `-ngl` layers on the CPU (with a warning), so the
        # GPU patterns below would measure the CPU: this step fails then, says why, and they
        # are skipped.
        step "moxie finds CUDA0 (plan -ngl 999)" 60 bash -c \
            'out=$("$1" plan -m "$2" -ngl 999 2>&1); grep -E "^(CUDA0 |warning)" <<<"$out"; grep -q "^CUDA0 " <<<"$out"' \
            _ "$bin/moxie" "$model"
        gpu=$last_rc
        if [ -d "$dir/llama-src" ] && [ ! -x "$llama" ]; then
            # Wait for the build (at most its own 480 s limit and the configure step).
            local waited=0
            while [ ! -f "$build_rc" ] && [ "$waited" -lt 540 ]; do
                sleep 5
                waited=$((waited + 5))
            done
            say ""
            if [ -x "$llama" ]; then
                say "llama.cpp (CUDA) built"
            else
                cp "$dir/llama-build.log" "$report.llama-build.log"
                say "llama.cpp build failed or unfinished: $report.llama-build.log"
            fi
        fi
        local pattern
        for pattern in "CPU only:-ngl 0" "hybrid:-ngl 999 -ot exps=CPU" "all-GPU:-ngl 999"; do
            local flags=${pattern#*:}
            if [ "$gpu" != 0 ] && [ "$flags" != "-ngl 0" ]; then
                say "" && say "bench ${pattern%%:*} ($flags): skipped, moxie found no CUDA0"
                continue
            fi
            # shellcheck disable=SC2086 # the flags are words
            step "bench ${pattern%%:*} ($flags): moxie" 90 "$bin/moxie" bench -m "$model" -p 512 -n 128 \
                -r "$reps" -t "$threads" $flags
            # shellcheck disable=SC2086
            [ -x "$llama" ] && step "bench ${pattern%%:*} ($flags): llama.cpp" 90 "$llama" -m "$model" \
                -p 512 -n 128 -r "$reps" -t "$threads" $flags
        done
        # The GPU products over f32 activations instead of int8 ones (dp4a, the default).
        [ "$gpu" = 0 ] && for pattern in "hybrid:-ngl 999 -ot exps=CPU" "all-GPU:-ngl 999"; do
            local flags=${pattern#*:}
            # shellcheck disable=SC2086
            step "bench ${pattern%%:*} ($flags), MOXIE_GPU_INT8=0: moxie" 90 env MOXIE_GPU_INT8=0 \
                "$bin/moxie" bench -m "$model" -p 512 -n 128 -r "$reps" -t "$threads" $flags
        done
        # The int8 prompt products on dp4a instead of tensor cores (mma, the default on sm_80+).
        [ "$gpu" = 0 ] && step "bench all-GPU (-ngl 999), MOXIE_GPU_MMA=0: moxie" 90 env MOXIE_GPU_MMA=0 \
            "$bin/moxie" bench -m "$model" -p 512 -n 0 -r "$reps" -t "$threads" -ngl 999
        # One token's attention in blocks of 8 query heads (the default), 2 and 1: at 8, MLA's
        # 16 heads ran on 2 blocks, 57% of all-GPU decode on an H200 (session 26's ncu).
        local heads
        [ "$gpu" = 0 ] && for heads in 8 2 1; do
            step "bench all-GPU decode (-ngl 999), MOXIE_GPU_ATTN_HEADS=$heads: moxie" 120 \
                env MOXIE_GPU_ATTN_HEADS=$heads "$bin/moxie" bench -m "$model" -p 0 -n 128 -d 0,4096 \
                -r "$reps" -t "$threads" -ngl 999
        done
    fi
    if [ "${GPU_CHECK_BENCH:-1}" != 0 ] && [ "${GPU_CHECK_PLACEMENT:-1}" != 0 ] && [ "$gpu" = 0 ]; then
        local recency=$dir/bench-deepseek2-recency-Q4_K_M.gguf
        [ -f "$recency" ] || step "moxie gen bench-deepseek2 Q4_K_M --routing recency" 150 \
            "$bin/moxie" gen --arch deepseek2 --preset bench-deepseek2 --type Q4_K_M --routing recency \
            -o "$recency"
        printf '%s\n' "Describe the history of the printing press and its effect on Europe." \
            "Write a short story about a lighthouse keeper who finds a message in a bottle." \
            "Explain how a compiler turns source code into machine code, step by step." \
            "List the planets of the solar system and one fact about each." >"$dir/prompts.txt"
        step "moxie profile (4 prompts x 48 tokens)" 90 "$bin/moxie" profile -m "$recency" \
            -f "$dir/prompts.txt" -n 48 -o "$dir/recency-profile.json" -t "$threads" -ngl 999
        step "placement A/B (CUDA0 at 2 GiB)" 240 "$bin/moxie" bench -m "$recency" -p 512 -n 128 \
            -r "$reps" -t "$threads" --gpu 2GiB \
            --ab '-ngl 999 -ot blk\.(1|2|3|18|19)\.ffn_.*_exps=CUDA0 -ot exps=CPU' \
            --ab '-ngl 999 -ot exps=CPU --expert-cache 442MiB' \
            --ab '-ngl 999 -ot exps=CPU --expert-cache auto' \
            --ab "-ngl 999 --fit --profile $dir/recency-profile.json"
    fi
    say ""
    say "gpu-check: $failed step(s) failed; full output in $report.log"
    [ "$failed" = 0 ]
}

case $cmd in
stage) stage ;;
run) run "$@" ;;
*)
    sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
