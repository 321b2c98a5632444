#!/usr/bin/env bash
# Fresh machine (Rust toolchain only): build moxie, generate a tiny synthetic DeepSeek-V3-shaped
# model, and generate text with it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p moxie-cli
mkdir -p target/models
MODEL=target/models/deepseek2-tiny-Q4_K_M.gguf
[ -f "$MODEL" ] || ./target/release/moxie gen --arch deepseek2 --preset tiny --type Q4_K_M --seed 1 -o "$MODEL"
./target/release/moxie inspect "$MODEL" | head -40
./target/release/moxie run -m "$MODEL" -p "The quick brown fox" -n 48 --temp 0 -t 2
