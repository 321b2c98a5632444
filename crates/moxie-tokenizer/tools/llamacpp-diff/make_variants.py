"""Make GGUF variants of a fixture model for the llama.cpp differential check.

usage: make_variants.py PRE1,PRE2,... BASE.gguf OUT_DIR

* pre-<name>.gguf: the base with tokenizer.ggml.pre = <name>
* spm.gguf: the vocabulary turned into a SentencePiece one (tokenizer.ggml.model = "llama":
  byte-level tokens decoded, spaces as U+2581, <unk>/<s>/</s> in front, 256 <0xXX> byte
  tokens, scores = -id)
* spm-phi3.gguf: spm.gguf named "Phi-3-mini test" (llama.cpp sets RSTRIP on special tokens)
* bpe-jina.gguf: a CONTROL "<mask>" token and pre jina-v2-es (llama.cpp sets LSTRIP on it)
* bpe-phi3.gguf: <unk>/<s>/</s> added, pre gpt-2, named "phi3 bpe"
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_edit import load, save  # noqa: E402

pres = [p for p in sys.argv[1].split(",") if p]
base = load(sys.argv[2])
out = sys.argv[3]
os.makedirs(out, exist_ok=True)


def variant(name, kv):
    save(dict(base, kv=kv), os.path.join(out, name + ".gguf"))


for pre in pres:
    kv = dict(base["kv"])
    kv["tokenizer.ggml.pre"] = (8, pre)
    variant("pre-" + pre, kv)

# SentencePiece variant
kv = dict(base["kv"])
toks = kv["tokenizer.ggml.tokens"][1][1]
types = kv["tokenizer.ggml.token_type"][1][1]
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
new, newtypes, scores, seen = [], [], [], set()
for i, (t, ty) in enumerate(zip(toks, types)):
    if ty == 1:
        try:
            s = bytes(dec[c] for c in t).decode("utf-8")
        except Exception:
            s = "[BAD%d]" % i
        s = s.replace(" ", "\u2581")
        if s in seen or s == "":
            s = "[DUP%d]" % i
    else:
        s = t
    seen.add(s)
    new.append(s)
    newtypes.append(ty)
    scores.append(-float(i))
new = ["<unk>", "<s>", "</s>"] + new
newtypes = [2, 3, 3] + newtypes
scores = [0.0, 0.0, 0.0] + scores
for b in range(256):
    new.append("<0x%02X>" % b)
    newtypes.append(6)
    scores.append(0.0)
kv["tokenizer.ggml.model"] = (8, "llama")
kv.pop("tokenizer.ggml.pre", None)
kv.pop("tokenizer.ggml.merges", None)
kv.pop("tokenizer.ggml.add_bos_token", None)
kv["tokenizer.ggml.tokens"] = (9, (8, new))
kv["tokenizer.ggml.token_type"] = (9, (5, newtypes))
kv["tokenizer.ggml.scores"] = (9, (6, scores))
kv["tokenizer.ggml.bos_token_id"] = (4, 1)
kv["tokenizer.ggml.eos_token_id"] = (4, 2)
kv["tokenizer.ggml.padding_token_id"] = (4, 0)
variant("spm", kv)
kv = dict(kv)
kv["general.name"] = (8, "Phi-3-mini test")
variant("spm-phi3", kv)

# BPE + <mask> with LSTRIP (jina-v2-es)
kv = dict(base["kv"])
kv["tokenizer.ggml.tokens"] = (9, (8, list(kv["tokenizer.ggml.tokens"][1][1]) + ["<mask>"]))
kv["tokenizer.ggml.token_type"] = (9, (5, list(kv["tokenizer.ggml.token_type"][1][1]) + [3]))
kv["tokenizer.ggml.pre"] = (8, "jina-v2-es")
variant("bpe-jina", kv)

# BPE named phi3 (RSTRIP on all special tokens)
kv = dict(base["kv"])
kv["tokenizer.ggml.tokens"] = (9, (8, list(kv["tokenizer.ggml.tokens"][1][1]) + ["<unk>", "<s>", "</s>"]))
kv["tokenizer.ggml.token_type"] = (9, (5, list(kv["tokenizer.ggml.token_type"][1][1]) + [2, 3, 3]))
kv["tokenizer.ggml.pre"] = (8, "gpt-2")
kv["general.name"] = (8, "phi3 bpe")
variant("bpe-phi3", kv)
