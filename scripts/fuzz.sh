#!/usr/bin/env bash
# Coverage-guided fuzzing of moxie's input parsers (issue 21), outside CI. Needs the nightly
# toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#
#   scripts/fuzz.sh seed                 # corpora from the fixtures (fuzz/corpus/TARGET)
#   scripts/fuzz.sh run [SECONDS] [TARGET...]   # each target for SECONDS (default 600), one
#                                        # after another; prints libFuzzer's last status line
#
# Targets (fuzz/fuzz_targets): gguf (a GGUF image of any bytes, and the tokenizer built from
# its metadata), gguf_split (a split set of any bytes: parts written to files and opened as a
# set), tokenize (any text through each architecture's tokenizer and back),
# chat_request (any request body through the server's parsers and chat templates),
# chat_request_json (the same for JSON requests built from the input: most get past parsing;
# its corpus starts empty), grammar
# (constrained decoding: grammars and bytes from the input), tool_calls (every family's parser).
# fuzz/dicts/TARGET.dict, where there is one, is passed as libFuzzer's dictionary (JSON syntax
# and request fields for chat_request). A crash leaves its input in fuzz/artifacts/TARGET/;
# `cargo +nightly fuzz run TARGET FILE` (from fuzz/, with MOXIE_FIXTURES set) replays it.
# MOXIE_FIXTURES names the fixtures (default ../shared/fixtures).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FIX="${MOXIE_FIXTURES:-$ROOT/../shared/fixtures}"
TARGETS=(gguf gguf_split tokenize chat_request chat_request_json grammar tool_calls)
export MOXIE_FIXTURES="$FIX"

seed() {
    local c="$ROOT/fuzz/corpus"
    mkdir -p "$c"/{gguf,gguf_split,tokenize,chat_request,chat_request_json,grammar,tool_calls}
    # GGUF: the header-only big models, and the first 64 KiB of each small model (header,
    # metadata and tensor index; its tensors then run past the end).
    cp "$FIX"/headers/*.gguf "$c/gguf/" 2>/dev/null || true
    for m in "$FIX"/models/*-tiny-Q4_0.gguf "$FIX"/models/*-tiny-Q4_K_M.gguf; do
        head -c 65536 "$m" > "$c/gguf/$(basename "$m").head"
    done
    # Split sets: two tiny models copied into 2 to 7 parts by `moxie quantize`, each part's
    # first 16 KiB (header, metadata and index), joined with gguf_split's separator after a
    # first byte that opens part 1 or part 2.
    local moxie="$ROOT/target/release/moxie" tmp
    [ -x "$moxie" ] || (cd "$ROOT" && cargo build --release -p moxie-cli)
    tmp="$(mktemp -d)"
    for m in qwen3moe-tiny-Q4_0 deepseek2-tiny-Q4_K_M; do
        for n in 8 16; do
            "$moxie" quantize -q --split-max-tensors "$n" "$FIX/models/$m.gguf" "$tmp/$m-$n" COPY
            for pick in 0 1; do
                python3 -c '
import sys
out, pick, parts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sep = b"\xf0GGUF-PART\xf0"
open(out, "wb").write(bytes([pick]) + sep.join(open(p, "rb").read(16384) for p in sorted(parts)))
' "$c/gguf_split/$m-$n-$pick" "$pick" "$tmp/$m-$n"-*.gguf
            done
        done
    done
    rm -rf "$tmp"
    python3 - "$FIX" "$c" <<'EOF'
import json, os, sys, hashlib
fix, c = sys.argv[1], sys.argv[2]
def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    name = hashlib.sha1(data).hexdigest()[:16]
    open(os.path.join(c, target, name), "wb").write(data)
for f in sorted(os.listdir(os.path.join(fix, "golden"))):
    p = os.path.join(fix, "golden", f)
    if f.startswith("tokenizer-"):
        for e in json.load(open(p)):
            for sel in (0x00, 0xC0):
                put("tokenize", bytes([sel]) + e["text"].encode())
    if f.startswith("chat-"):
        d = json.load(open(p))
        put("chat_request", json.dumps({"messages": d["messages"]}))
        put("chat_request", json.dumps({"messages": d["messages"], "tools": [{"type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}}}}], "tool_choice": "required",
            "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 16}))
put("chat_request", json.dumps({"prompt": "Hello", "max_tokens": 8, "temperature": 0.5}))
put("chat_request", json.dumps({"prompt": [1, 2, 3], "stop": ["\n"], "logprobs": 2}))
put("chat_request", json.dumps({"messages": [{"role": "user", "content": "hi"}],
    "response_format": {"type": "json_object"}}))
tools = json.dumps([{"name": "get_weather", "parameters": {"properties": {"city": {}, "unit": {}}}}])
for kind, spec, feed in [
    (0, "", '{"a": [1, 2.5e3, true, null, "x\\u00e9"]}>'),
    (1, "city,unit", '{"city": "Paris", "unit": "C"}>'),
    (2, "", '[{"k": {}}, -0.5, "s"]>'),
    (3, "</end>", "some text </end>>"),
    (4, "alpha,beta,gamma", "beta>"),
    (5, "<arg_key>,</arg_key>,</arg_value>,</tool_call>,city",
     "<arg_key>city</arg_key>Paris</arg_value></tool_call>>"),
] + [(6 + 7 * i, tools, "") for i in range(6)]:
    put("grammar", bytes([kind]) + spec.encode() + b"\xff" + feed.encode())
for text in [
    'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
]:
    put("tool_calls", text)
EOF
    for t in "${TARGETS[@]}"; do
        echo "$t: $(ls "$c/$t" | wc -l) seeds"
    done
}

run() {
    local secs="${1:-600}"
    shift || true
    local targets=("$@")
    [ ${#targets[@]} -eq 0 ] && targets=("${TARGETS[@]}")
    cd "$ROOT/fuzz"
    cargo +nightly fuzz build -O
    for t in "${targets[@]}"; do
        mkdir -p "corpus/$t" "artifacts/$t"
        local log="artifacts/$t/last-run.log"
        local max_len=4096 dict=()
        [ "$t" = gguf ] && max_len=131072
        [ "$t" = gguf_split ] && max_len=131072
        [ -f "dicts/$t.dict" ] && dict=(-dict="dicts/$t.dict")
        # libFuzzer's own limits: 2 GiB of RSS and 10 s per input count as crashes.
        if cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" \
            -max_len="$max_len" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "${dict[@]}" \
            >"$log" 2>&1; then
            echo "$t: no crash in ${secs}s: $(grep -E '^#[0-9]+' "$log" | tail -1)"
        else
            echo "$t: FAILED, see fuzz/$log and fuzz/artifacts/$t/"
            grep -E '^#[0-9]+' "$log" | tail -1 || true
        fi
    done
}

case "${1:-}" in
    seed) seed ;;
    run) shift; run "$@" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
