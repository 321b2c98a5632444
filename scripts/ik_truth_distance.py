#!/usr/bin/env python3
"""How far moxie and ik_llama.cpp's goldens each are from the exact model, on the ik-type fixtures.

The "exact model" of a quantized file is llama.cpp's F32 run on the file's weights dequantized
to F32 (`moxie quantize --allow-requantize FILE OUT F32`; the dequantization of every ik type
is bit-exact to ik_llama.cpp's, see crates/moxie-quant/tests/iqk.rs). Both engines then differ
from it only by their own arithmetic (activation quantization, accumulation order, ik's i16
saturation). Prints, per file and sequence, mean KL(exact || ik golden), KL(exact || moxie),
KL(ik golden || moxie) and top-1 agreements, then the position-weighted means.

Usage (from the repo root, after `cargo build --release -p moxie-cli` and the peers set-up):
    python3 scripts/ik_truth_distance.py [--fixtures ../shared/fixtures] [TYPE ...]
TYPE defaults to all nine (IQ2_K IQ2_KS IQ3_K IQ3_KS IQ4_K IQ4_KS IQ5_K IQ5_KS IQ6_K).
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

TYPES = ["IQ2_K", "IQ2_KS", "IQ3_K", "IQ3_KS", "IQ4_K", "IQ4_KS", "IQ5_K", "IQ5_KS", "IQ6_K"]


def log_softmax(x):
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def kld(p_logits, q_logits):
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(1)


def top1(a, b):
    return float((a.argmax(1) == b.argmax(1)).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.environ.get("MOXIE_FIXTURES", "../shared/fixtures"))
    ap.add_argument("--moxie", default="target/release/moxie")
    ap.add_argument("--peer", default=None, help="peers/llamacpp.py (default: next to fixtures)")
    ap.add_argument("types", nargs="*", default=TYPES)
    a = ap.parse_args()
    fx = os.path.abspath(a.fixtures)
    peer = a.peer or os.path.join(os.path.dirname(fx), "peers", "llamacpp.py")
    index = json.load(open(os.path.join(fx, "golden", "index.json")))
    print("file seq | KL(exact||ik) | KL(exact||moxie) | KL(ik||moxie) | top-1 exact/ik | exact/moxie | ik/moxie")
    tot = {"ik": 0.0, "moxie": 0.0, "n": 0, "nearer": 0, "seqs": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for ty in a.types:
            stem = f"qwen3moe-tiny-{ty}"
            model = os.path.join(fx, "models", stem + ".gguf")
            f32 = os.path.join(tmp, stem + "-F32.gguf")
            subprocess.run([a.moxie, "quantize", "--allow-requantize", model, f32, "F32"],
                           check=True, capture_output=True)
            for seq, s in index["models"][stem]["sequences"].items():
                toks = ",".join(str(t) for t in s["token_ids"])
                exact_npy, moxie_npy = os.path.join(tmp, "exact.npy"), os.path.join(tmp, "moxie.npy")
                subprocess.run(["python3", peer, "logits", f32, "--tokens", toks, "--out", exact_npy],
                               check=True, capture_output=True)
                subprocess.run([a.moxie, "logits", "-m", model, "--tokens", toks, "--out", moxie_npy],
                               check=True, capture_output=True)
                ex = np.load(exact_npy).astype(np.float64)
                mx = np.load(moxie_npy).astype(np.float64)
                ik = np.load(os.path.join(fx, s["logits_file"])).astype(np.float64)
                k_ik, k_mx = kld(ex, ik).mean(), kld(ex, mx).mean()
                print(f"{ty} {seq} | {k_ik:.2e} | {k_mx:.2e} | {kld(ik, mx).mean():.2e} | "
                      f"{top1(ex, ik):.3f} | {top1(ex, mx):.3f} | {top1(ik, mx):.3f}")
                n = ex.shape[0]
                tot["ik"] += k_ik * n
                tot["moxie"] += k_mx * n
                tot["n"] += n
                tot["nearer"] += int(k_mx < k_ik)
                tot["seqs"] += 1
    n = tot["n"]
    print(f"all {n} positions | mean KL(exact||ik) {tot['ik'] / n:.2e} | mean KL(exact||moxie) "
          f"{tot['moxie'] / n:.2e} | moxie nearer on {tot['nearer']} of {tot['seqs']} sequences")


if __name__ == "__main__":
    main()
