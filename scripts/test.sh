#!/usr/bin/env bash
# All checks: formatting, lints (warnings are errors), and every test.
# Fidelity tests read ../shared/fixtures (or $MOXIE_FIXTURES) and fail if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
