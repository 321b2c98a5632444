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
