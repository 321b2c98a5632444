#!/usr/bin/env python3
"""Goldens for `moxie quantize`: what llama-quantize writes for a set of recipes on the
fixture F32 masters, recorded as per-tensor (name, type, SHA-256 of the data) lists plus
the whole output file's size and SHA-256 (per part for split outputs).

crates/moxie-cli/tests/quantize_cli.rs runs moxie with the same arguments and compares.
Plain file types (`llama-quantize IN OUT Q4_K_M`) need no golden: the fixture directory has
llama-quantize's own outputs, which the test compares byte for byte.

Regenerate (llama.cpp at the fixtures' commit, 0c1e57098; cmake from PyPI works):

    cmake -S llama.cpp -B build-llq -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF
    cmake --build build-llq --target llama-quantize llama-gguf-split llama-imatrix -j
    python3 scripts/quantize_goldens.py --bin build-llq/bin --fixtures ../shared/fixtures

The importance matrices in crates/moxie-cli/tests/data are inputs, made once with
llama-imatrix on the GPL-3 text (Debian's /usr/share/common-licenses/GPL-3 copied to
calibration.txt in the working directory, so the file name recorded is relative):

    llama-imatrix -m qwen3moe-tiny-F32.gguf -f calibration.txt -o qwen3moe-tiny.imatrix.gguf \\
        --output-format gguf -c 256 --chunks 8 -t 2 --no-ppl
    (likewise `--output-format dat` -> qwen3moe-tiny.imatrix.dat, and deepseek2-tiny -> .gguf)

`--make-imatrix` reruns those commands (needs calibration.txt in the data directory);
llama-imatrix's numbers depend on the machine, so the goldens must then be regenerated too.
The repo keeps the GGUF matrices as `*.imatrix-gguf` (no .gguf files in git); the commands run
in a scratch directory where they have the names above, as the test does.
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "crates", "moxie-cli", "tests", "data")

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 29: "IQ1_M", 30: "BF16",
}

# (model, llama-quantize arguments before IN: flags; after OUT: the type)
RECIPES = []
MODELS = ["qwen3moe", "deepseek2", "glm4moe", "glm-dsa", "qwen3next"]
for m in MODELS:
    RECIPES += [
        # a --tensor-type mix exactly as users write it (layers 3-5 do not exist in some)
        (m, ["--tensor-type", r"blk\.(3|4|5)\.ffn_down_exps=q6_k",
             "--tensor-type", "ffn_(gate|up)_exps=q4_k"], "Q4_K_M"),
        (m, ["--tensor-type", r"blk\.(1|2)\.ffn_down_exps=q6_k",
             "--tensor-type", "ffn_(gate|up)_exps=q5_k"], "Q4_K_M"),
        (m, ["--output-tensor-type", "q6_k"], "Q8_0"),
        (m, ["--pure"], "Q4_K_M"),
        (m, ["--token-embedding-type", "q8_0", "--leave-output-tensor"], "Q5_K_S"),
    ]
for m in ["qwen3moe", "deepseek2"]:
    for t in ["F16", "BF16", "Q3_K_S", "Q3_K_L", "Q4_K_S", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]:
        RECIPES.append((m, [], t))
for t in ["Q4_K_M", "IQ4_XS", "Q2_K_S", "Q4_0", "Q5_1", "Q3_K_M", "Q6_K"]:
    RECIPES.append(("qwen3moe", ["--imatrix", "qwen3moe-tiny.imatrix.gguf"], t))
for t in ["Q4_K_M", "Q5_K_S"]:
    RECIPES.append(("qwen3moe", ["--imatrix", "qwen3moe-tiny.imatrix.dat"], t))
RECIPES.append(("qwen3moe", ["--imatrix", "qwen3moe-tiny.imatrix.gguf",
                             "--exclude-weights", "ffn_down"], "Q4_K_M"))
for t in ["Q4_K_M", "Q5_0", "IQ4_NL", "Q4_1"]:
    RECIPES.append(("deepseek2", ["--imatrix", "deepseek2-tiny.imatrix.gguf"], t))
RECIPES.append(("deepseek2", ["--imatrix", "deepseek2-tiny.imatrix.gguf",
                              "--include-weights", "attn"], "Q3_K_L"))
# split outputs: llama-quantize, then llama-gguf-split with the same limit
SPLITS = [
    ("qwen3moe", [], "Q4_K_M", ["--split-max-tensors", "10"]),
    ("deepseek2", ["--output-tensor-type", "q6_k"], "Q8_0", ["--split-max-size", "1M"]),
]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_gguf_tensors(path):
    """(name, type name, data bytes) per tensor, in file order."""
    with open(path, "rb") as f:
        b = f.read()
    p = 0

    def take(fmt):
        nonlocal p
        v = struct.unpack_from("<" + fmt, b, p)
        p += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal p
        n = take("Q")
        s = b[p:p + n].decode()
        p += n
        return s

    def value(t):
        nonlocal p
        if t == 8:
            return string()
        if t == 9:
            et = take("I")
            n = take("Q")
            return [value(et) for _ in range(n)]
        fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}[t]
        return take(fmt)

    assert b[:4] == b"GGUF", path
    p = 4
    _version, n_t, n_kv = take("I"), take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        k = string()
        v = value(take("I"))
        if k == "general.alignment":
            align = v
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        ty = take("I")
        off = take("Q")
        infos.append((name, dims, ty, off))
    data_start = (p + align - 1) // align * align
    out = []
    for name, dims, ty, off in infos:
        n_el = 1
        for d in dims:
            n_el *= d
        bs, ts = BLOCK[ty]
        n = n_el // bs * ts
        out.append((name, GGML_TYPES[ty], b[data_start + off:data_start + off + n]))
    return out


BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
         20: (32, 18), 23: (256, 136), 30: (1, 2)}


def record(paths):
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            whole = f.read()
        parts.append({
            "bytes": len(whole),
            "sha256": sha256(whole),
            # 64 bits of each tensor's hash are plenty to tell tensors apart
            "tensors": [[n, t, sha256(d)[:16]] for (n, t, d) in read_gguf_tensors(path)],
        })
    return parts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory with llama-quantize, llama-gguf-split")
    ap.add_argument("--fixtures", required=True, help="the shared fixtures directory")
    ap.add_argument("--make-imatrix", action="store_true", help="rerun llama-imatrix first")
    ap.add_argument("--out", default=os.path.join(DATA, "quantize_goldens.json"))
    a = ap.parse_args()
    q = os.path.join(a.bin, "llama-quantize")
    models = os.path.join(os.path.abspath(a.fixtures), "models")
    if a.make_imatrix:
        for m, fmt in [("qwen3moe", "gguf"), ("qwen3moe", "dat"), ("deepseek2", "gguf")]:
            subprocess.run([os.path.join(a.bin, "llama-imatrix"), "-m", f"{models}/{m}-tiny-F32.gguf",
                            "-f", "calibration.txt", "-o", f"{m}-tiny.imatrix.{fmt}", "--output-format", fmt,
                            "-c", "256", "--chunks", "8", "-t", "2", "--no-ppl"], cwd=DATA, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if fmt == "gguf":
                os.replace(os.path.join(DATA, f"{m}-tiny.imatrix.gguf"),
                           os.path.join(DATA, f"{m}-tiny.imatrix-gguf"))
    cases = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as work:
        for name in os.listdir(DATA):
            if name.endswith(".imatrix-gguf"):
                shutil.copy(os.path.join(DATA, name), os.path.join(work, name[:-len("-gguf")] + ".gguf"))
            elif name.endswith(".imatrix.dat"):
                shutil.copy(os.path.join(DATA, name), os.path.join(work, name))
        for m, flags, t in RECIPES:
            out = os.path.join(tmp, "out.gguf")
            # run where the matrices have their recorded names: the path is kept in the output
            subprocess.run([q] + flags + [f"{models}/{m}-tiny-F32.gguf", out, t, "2"], cwd=work,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cases.append({"model": f"{m}-tiny-F32.gguf", "args": flags + [t], "parts": record([out])})
            print(m, " ".join(flags), t, file=sys.stderr)
        for m, flags, t, split in SPLITS:
            out = os.path.join(tmp, "out.gguf")
            subprocess.run([q] + flags + [f"{models}/{m}-tiny-F32.gguf", out, t, "2"], cwd=work,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            prefix = os.path.join(tmp, "split")
            subprocess.run([os.path.join(a.bin, "llama-gguf-split"), "--split"] + split + [out, prefix],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            paths = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("split-"))
            cases.append({"model": f"{m}-tiny-F32.gguf", "args": flags + split + [t], "parts": record(paths)})
            for p in paths:
                os.remove(p)
            print(m, " ".join(flags + split), t, len(paths), "parts", file=sys.stderr)
    doc = {
        "generator": "scripts/quantize_goldens.py",
        "llama_cpp": "0c1e57098 (llama-quantize, llama-gguf-split), GGML_NATIVE=ON",
        "hash": "SHA-256 of each part file; first 16 hex digits of the SHA-256 of each tensor's data",
        "cases": cases,
    }
    # one case per line
    with open(a.out, "w") as f:
        head = {k: v for k, v in doc.items() if k != "cases"}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
