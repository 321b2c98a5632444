#!/usr/bin/env python3
"""Goldens for `moxie gen --header-only --type FTYPE`: the block type llama-quantize gives
every tensor of the real big-model headers (DeepSeek-V3, GLM-4.7) for a few low-bit file
types, and the size of the result, from `llama-quantize --dry-run`.

crates/moxie-cli/tests/gen_header_only.rs writes the same headers with moxie and checks the
types tensor for tensor, the tensor data size, and that `moxie plan` accounts for every byte.

llama-quantize reads the fixture headers (headers/*.header.gguf, moxie's Q4_K_M layout of
each model, itself checked against llama-quantize) after they are extended to their full
size: a sparse file (`truncate`), so no disk space is used. It passes its checks that each
tensor's data lies within the file, and a dry run reads no tensor data. Its type rules do not
depend on the stored types (only on names, shapes and hyper-parameters), so requantizing the
Q4_K_M layout (`--allow-requantize`) gives what it gives an F32 or BF16 master. No importance
matrix: llama-quantize notes that writing these types would need one, which for IQ2_M, IQ1_M
and Q2_K does not change any tensor's type.

The printed sizes are MiB with 2 decimals; the exact byte counts are computed from each
tensor's shape and new type as llama-quantize does (`nrows * ggml_row_size`), and checked
against the printed total.

Regenerate (llama.cpp at the goldens' commit, built as in scripts/quantize_goldens.py):

    python3 scripts/header_type_goldens.py --bin build-llq/bin --fixtures ../shared/fixtures
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "moxie-cli", "tests", "data", "header_type_goldens.json")

# (moxie gen --header-only preset, fixture stem)
MODELS = [
    ("deepseek-v3-671b", "DeepSeek-V3-671B-Q4_K_M"),
    ("glm-4.7-355b", "GLM-4.7-355B-Q4_K_M"),
]
FTYPES = ["IQ2_M", "IQ1_M", "Q2_K"]

# ggml type name -> (block size, bytes per block), from ggml.c's type_traits
TYPES = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ3_XXS": (256, 98),
    "IQ1_S": (256, 50), "IQ4_NL": (32, 18), "IQ3_S": (256, 110), "IQ2_S": (256, 82),
    "IQ4_XS": (256, 136), "IQ1_M": (256, 56),
}

LINE = re.compile(
    r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+- \[([^\]]*)\], type =\s*(\S+), size =\s*[\d.]+ MiB"
    r"(?: ->\s*[\d.]+ MiB \((\S+)\))?\s*$"
)
QUANT_SIZE = re.compile(r"quant size\s*=\s*([\d.]+) MiB")
FALLBACKS = re.compile(r"WARNING: (\d+) of (\d+) tensor\(s\) required fallback")


def row_bytes(ty, ne0):
    bs, ts = TYPES[ty]
    if ne0 % bs:
        sys.exit(f"{ty}: rows of {ne0} are not whole blocks")
    return ne0 // bs * ts


def dry_run(llq, header, ftype):
    out = subprocess.run(
        [llq, "--dry-run", "--allow-requantize", header, ftype],
        capture_output=True, text=True,
    )
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"llama-quantize --dry-run {ftype} failed:\n{log}")
    names, types, total = [], [], 0
    for line in log.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, shape, cur, new = m.group(3), m.group(4), m.group(5).upper(), m.group(6)
        ty = new.upper() if new else cur
        dims = [int(x) for x in shape.split(",")]
        nrows = 1
        for d in dims[1:]:
            nrows *= d
        names.append(name)
        types.append(ty)
        total += nrows * row_bytes(ty, dims[0])
    mib = QUANT_SIZE.search(log)
    if not names or not mib:
        sys.exit(f"no per-tensor lines or no quant size in llama-quantize's output:\n{log}")
    if f"{total / 1024 / 1024:.2f}" != mib.group(1):
        sys.exit(f"{ftype}: computed {total} bytes, llama-quantize printed {mib.group(1)} MiB")
    fb = FALLBACKS.search(log)
    return names, types, total, mib.group(1), int(fb.group(1)) if fb else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="directory with llama-quantize")
    ap.add_argument("--fixtures", required=True, help="the fixture directory (headers/ inside)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    llq = os.path.join(a.bin, "llama-quantize")
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset, stem in MODELS:
            src = os.path.join(a.fixtures, "headers", f"{stem}.header.gguf")
            with open(os.path.join(a.fixtures, "headers", f"{stem}.header.json")) as f:
                full = json.load(f)["full_file_bytes"]
            header = os.path.join(tmp, f"{stem}.gguf")
            shutil.copyfile(src, header)
            os.truncate(header, full)
            entry = {"preset": preset, "fixture": f"headers/{stem}.header.gguf", "tensors": None,
                     "ftypes": []}
            for ftype in FTYPES:
                names, types, total, mib, n_fb = dry_run(llq, header, ftype)
                if entry["tensors"] is None:
                    entry["tensors"] = names
                elif entry["tensors"] != names:
                    sys.exit(f"{stem}: tensor order differs between file types")
                by_type = {}
                for name, ty in zip(names, types):
                    by_type[ty] = by_type.get(ty, 0) + 1
                entry["ftypes"].append({
                    "ftype": ftype,
                    "tensor_data_bytes": total,
                    "quant_size_mib": mib,
                    "fallbacks": n_fb,
                    "tensors_by_type": dict(sorted(by_type.items())),
                    "types": types,
                })
                print(f"{preset} {ftype}: {len(names)} tensors, {total} bytes ({mib} MiB), "
                      f"{n_fb} fallbacks, {dict(sorted(by_type.items()))}")
            models.append(entry)
    doc = {
        "generator": "scripts/header_type_goldens.py",
        "llama_cpp": "0c1e57098 (llama-quantize --dry-run --allow-requantize on the fixture "
                     "headers extended to their full size; no importance matrix)",
        "about": "per model: tensor names in llama-quantize's order; per file type: the type "
                 "of each tensor in that order, the tensor data bytes (sum of nrows * row "
                 "size), llama-quantize's printed quant size (MiB) and fallback count",
        "models": models,
    }
    # Indented, with each list of names or types on one line.
    text = json.dumps(doc, indent=1)
    text = re.sub(r"\[\n\s*(\"[^\[\]{}]*?\")\n\s*\]",
                  lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)
    if json.loads(text) != doc:
        sys.exit("compact formatting changed the document")
    with open(a.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
