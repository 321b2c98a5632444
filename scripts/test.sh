#!/usr/bin/env bash
# All checks: formatting, lints (warnings are errors), and every test.
# Fidelity tests read ../shared/fixtures (or $MOXIE_FIXTURES) and fail if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The CUDA backend (feature `cuda`, driver loaded at run time) must build and lint clean too.
cargo clippy --workspace --all-targets --features moxie-cli/cuda -- -D warnings
cargo test --workspace
# The `cuda` feature's tests: those that need no GPU run (NVRTC selection, errors without a
# driver; the NVRTC compile tests skip, saying so, without libnvrtc), and the #[ignore]d GPU
# ones compile (scripts/gpu-check.sh runs them on a GPU).
cargo test -p moxie-gpu --features cuda
cargo test -p moxie-core --features cuda --test gpu_emu --no-run
# The GPU's int8 products round as the CPU's with fused multiply-adds too: the emulator built
# to fuse a * b + c as NVRTC does (its own target folder, so the other builds stay as they are).
MXEMU_FP_CONTRACT=1 CARGO_TARGET_DIR=target/emu-fused \
    cargo test -p moxie-core --test gpu_emu int8_gpu_products_agree_with_the_cpu_to_float_rounding
