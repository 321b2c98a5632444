#!/usr/bin/env bash
# Speed peers for moxie's CPU claims (issue 17): builds llama.cpp (the copy vendored in the
# llama-cpp-python 0.3.36 sdist) and ik_llama.cpp (commit 8337e4cd), then prints one same-run
# table of llama.cpp, ik_llama.cpp -rtr and moxie for any GGUF. Outside CI.
#
#   scripts/peers.sh setup                       # once: ~20-40 min on 2 cores, needs network
#   scripts/peers.sh bench MODEL.gguf [-t 2] [-p 512] [-n 128] [-d DEPTH] [-r 3] [-- MOXIE_FLAGS]
#
# bench runs rounds alternated (llama.cpp, ik_llama.cpp, moxie; then again), one repetition of
# each engine per round, and prints the median over rounds per engine and test (pp<P>, tg<N>,
# and with -d tg<N> after DEPTH positions of context) with moxie's ratios. llama.cpp runs its
# best CPU configuration per test (weight repacking on or off, flash attention on, AMX off: its
# AMX kernels crash on some of these CPUs, see the shim below); ik_llama.cpp runs -rtr 1 with
# its defaults (flash attention, -mla 3, -fmoe). moxie is target/release/moxie (build it first)
# with MOXIE_FLAGS appended.
#
# PEERS_DIR (default ~/.cache/moxie-peers) holds the sources and builds; IK_SRC may point at an
# existing ik_llama.cpp checkout at 8337e4cd instead of cloning it.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$HOME/.cache/moxie-peers}"
LLAMA_PY_VERSION=0.3.36
IK_REPO=https://github.com/ikawrakow/ik_llama.cpp
IK_COMMIT=8337e4cd
LLAMA_BENCH="$PEERS_DIR/llama.cpp/build/bin/llama-bench"
IK_BENCH="$PEERS_DIR/ik_llama.cpp/build/bin/llama-bench"
NOAMX="$PEERS_DIR/noamx.so"
JOBS="${JOBS:-$(nproc)}"

die() { echo "peers.sh: $*" >&2; exit 1; }

setup_llama() {
    local dir="$PEERS_DIR/llama.cpp"
    [ -x "$LLAMA_BENCH" ] && { echo "llama.cpp: $LLAMA_BENCH already built"; return; }
    mkdir -p "$PEERS_DIR"
    local tgz="$PEERS_DIR/llama_cpp_python-$LLAMA_PY_VERSION.tar.gz"
    if [ ! -f "$tgz" ]; then
        # The sdist's address and sha256 from the package index (PEP 503 simple page).
        python3 - "$tgz" "$LLAMA_PY_VERSION" <<'EOF'
import hashlib, re, sys, urllib.request
out, ver = sys.argv[1], sys.argv[2]
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
m = re.search(r'href="([^"#]*llama_cpp_python-%s\.tar\.gz)#sha256=([0-9a-f]{64})"' % re.escape(ver), page)
if not m:
    sys.exit(f"no llama-cpp-python {ver} sdist on the index")
data = urllib.request.urlopen(m.group(1), timeout=600).read()
if hashlib.sha256(data).hexdigest() != m.group(2):
    sys.exit("sdist sha256 mismatch")
open(out, "wb").write(data)
EOF
    fi
    rm -rf "$dir" "$PEERS_DIR/sdist"
    mkdir -p "$PEERS_DIR/sdist"
    tar -xzf "$tgz" -C "$PEERS_DIR/sdist"
    mv "$PEERS_DIR/sdist/llama_cpp_python-$LLAMA_PY_VERSION/vendor/llama.cpp" "$dir"
    rm -rf "$PEERS_DIR/sdist"
    cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
    cmake --build "$dir/build" --target llama-bench -j "$JOBS"
}

setup_ik() {
    local dir="$PEERS_DIR/ik_llama.cpp"
    [ -x "$IK_BENCH" ] && { echo "ik_llama.cpp: $IK_BENCH already built"; return; }
    mkdir -p "$PEERS_DIR"
    if [ -n "${IK_SRC:-}" ]; then
        rm -rf "$dir" && cp -r "$IK_SRC" "$dir" && rm -rf "$dir/build"
    elif [ ! -d "$dir/.git" ]; then
        git clone --filter=blob:none "$IK_REPO" "$dir"
    fi
    if [ -d "$dir/.git" ]; then
        git -C "$dir" checkout -q "$IK_COMMIT"
    fi
    cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >/dev/null
    cmake --build "$dir/build" --target llama-bench llama-sweep-bench -j "$JOBS"
}

# An LD_PRELOAD shim: refuse arch_prctl(ARCH_REQ_XCOMP_PERM) so ggml finds AMX unusable and
# keeps it off, while its other repacked-weight kernels stay on.
setup_noamx() {
    [ -f "$NOAMX" ] && return
    mkdir -p "$PEERS_DIR"
    cat >"$PEERS_DIR/noamx.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
long syscall(long nr, ...) {
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_arch_prctl && a[0] == 0x1023) { errno = EPERM; return -1; }
    static long (*next)(long, ...);
    if (!next) next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
EOF
    cc -O2 -shared -fPIC -o "$NOAMX" "$PEERS_DIR/noamx.c" -ldl
}

bench() {
    local model="" t=2 p=512 n=128 d=0 r=3
    local moxie_flags=()
    while [ $# -gt 0 ]; do
        case "$1" in
            -t) t="$2"; shift 2 ;;
            -p) p="$2"; shift 2 ;;
            -n) n="$2"; shift 2 ;;
            -d) d="$2"; shift 2 ;;
            -r) r="$2"; shift 2 ;;
            --) shift; moxie_flags=("$@"); break ;;
            -*) die "unknown flag $1" ;;
            *) [ -z "$model" ] || die "one model only"; model="$1"; shift ;;
        esac
    done
    [ -f "$model" ] || die "no model file '$model'"
    local moxie="$ROOT/target/release/moxie"
    [ -x "$moxie" ] || die "build moxie first: cargo build --release"
    [ -x "$LLAMA_BENCH" ] && [ -x "$IK_BENCH" ] || die "run 'scripts/peers.sh setup' first"
    setup_noamx
    local out
    out="$(mktemp -d)"
    local gp=() dd=()
    if [ "$d" -gt 0 ]; then gp=(-gp "$d,$n"); dd=(-d "0,$d"); fi
    for round in $(seq 1 "$r"); do
        echo "round $round of $r: llama.cpp, ik_llama.cpp -rtr, moxie" >&2
        LD_PRELOAD="$NOAMX" "$LLAMA_BENCH" -m "$model" -t "$t" -p "$p" -n "$n" "${dd[@]}" \
            -r 1 -fa 1 --repack 0,1 -o jsonl >"$out/llama.$round.jsonl" 2>/dev/null \
            || die "llama.cpp failed on $model"
        "$IK_BENCH" -m "$model" -t "$t" -p "$p" -n "$n" "${gp[@]}" -r 1 -rtr 1 -o json \
            >"$out/ik.$round.json" 2>/dev/null || die "ik_llama.cpp failed on $model"
        "$moxie" bench -m "$model" -t "$t" -p "$p" -n "$n" "${dd[@]}" -r 1 -o jsonl \
            "${moxie_flags[@]}" >"$out/moxie.$round.jsonl" 2>/dev/null || die "moxie failed on $model"
    done
    trap 'echo "peers.sh: raw results kept in $out" >&2' ERR
    python3 - "$out" "$model" "$t" "$r" <<'EOF'
import glob, json, os, statistics, sys
out, model, t, r = sys.argv[1:]

def test_name(rec):
    # ik's -gp D,N records say "tg<N>@pp<D>"; the others give n_prompt / n_gen / n_depth
    if "@pp" in rec.get("test", ""):
        name, d = rec["test"].split("@pp")
    else:
        n_gen, d = rec["n_gen"], rec.get("n_depth", 0)
        name = f"tg{n_gen}" if n_gen else f"pp{rec['n_prompt']}"
    return f"{name} @ d{d}" if int(d) else name

def load(engine):
    best = {}  # (round, test) -> t/s, best over the engine's configurations
    for f in glob.glob(os.path.join(out, engine + ".*")):
        rnd = f.split(".")[-2]
        text = open(f).read().strip()
        recs = json.loads(text) if text.startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
        for rec in recs:
            key = (rnd, test_name(rec))
            best[key] = max(best.get(key, 0.0), rec["avg_ts"])
    by_test = {}
    for (_, test), v in best.items():
        by_test.setdefault(test, []).append(v)
    return {k: statistics.median(v) for k, v in by_test.items()}

eng = {e: load(e) for e in ("llama", "ik", "moxie")}
tests = sorted(set().union(*[set(v) for v in eng.values()]), key=lambda s: (not s.startswith("pp"), s))
print(f"model {os.path.basename(model)}, {t} threads, medians of {r} alternated rounds (t/s)\n")
print("| test | llama.cpp best | ik_llama.cpp -rtr | moxie | moxie / ik | moxie / llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
fmt = lambda x: f"{x:.2f}" if x else "-"
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
for test in tests:
    l, i, m = (eng[e].get(test) for e in ("llama", "ik", "moxie"))
    print(f"| {test} | {fmt(l)} | {fmt(i)} | {fmt(m)} | {ratio(m, i)} | {ratio(m, l)} |")
EOF
    rm -rf "$out"
}

case "${1:-}" in
    setup) setup_llama; setup_ik; setup_noamx ;;
    bench) shift; bench "$@" ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
