"""llama.cpp's MTP draft logits for a sequence (reference for moxie's Model::draft).
usage: mtp_ref.py MODEL TOKENS(comma) OUT.npz
Target: tokens in one batch, hidden h_nextn of every position. Draft: token k at position k
with hidden h[k-1] (zeros for k = 0), one batch, logits of every row."""
import ctypes, sys
import numpy as np
import llama_cpp.llama_cpp as lc

lib = lc._lib  # the staging nextn API is exported only under its C++ name
path, toks, out = sys.argv[1], [int(t) for t in sys.argv[2].split(',')], sys.argv[3]
lc.llama_backend_init()
mp = lc.llama_model_default_params()
mp.load_mtp = True
mp.use_extra_bufts = False
model = lc.llama_model_load_from_file(path.encode(), mp)
assert model

def cparams(mtp):
    cp = lc.llama_context_default_params()
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512
    cp.n_threads = 2; cp.n_threads_batch = 2
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if mtp:
        cp.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
    return cp

set_nextn = getattr(lib, '_Z26llama_set_embeddings_nextnP13llama_contextbb')
set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
get_nextn = getattr(lib, '_Z26llama_get_embeddings_nextnP13llama_context')
get_nextn.argtypes = [ctypes.c_void_p]
get_nextn.restype = ctypes.POINTER(ctypes.c_float)

n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
n_embd = lc.llama_model_n_embd(model)
n = len(toks)

tgt = lc.llama_init_from_model(model, cparams(False))
set_nextn(tgt, True, False)
b = lc.llama_batch_init(n, 0, 1)
for i, t in enumerate(toks):
    b.token[i] = t; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = True
b.n_tokens = n
assert lc.llama_decode(tgt, b) == 0
logits_tgt = np.array([[lc.llama_get_logits_ith(tgt, i)[j] for j in range(n_vocab)] for i in range(n)], dtype=np.float32)
hp = get_nextn(tgt)
hidden = np.ctypeslib.as_array(hp, shape=(n * n_embd,)).reshape(n, n_embd).copy()

dft = lc.llama_init_from_model(model, cparams(True))
assert dft
zeros = np.zeros(n_embd, dtype=np.float32)
state = np.ascontiguousarray(np.vstack([zeros] + [hidden[k - 1] for k in range(1, n)]), dtype=np.float32)
bd = lc.llama_batch_init(n, 0, 1)
for i, t in enumerate(toks):
    bd.token[i] = t; bd.pos[i] = i; bd.n_seq_id[i] = 1; bd.seq_id[i][0] = 0; bd.logits[i] = True
bd.n_tokens = n
# A batch carrying both token ids and embedding rows is how llama.cpp's MTP hook feeds the
# draft context (the row is the hidden-state input).
bd.embd = state.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
rc = lc.llama_decode(dft, bd)
assert rc == 0, rc
logits_dft = np.array([[lc.llama_get_logits_ith(dft, i)[j] for j in range(n_vocab)] for i in range(n)], dtype=np.float32)
np.savez(out, tokens=np.array(toks), logits_tgt=logits_tgt, hidden=hidden, logits_dft=logits_dft)
h = 0xcbf29ce484222325
for b in logits_dft.view(np.uint32).ravel().tolist():
    for byte in int(b).to_bytes(4, 'little'):
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
print(f"draft logits {logits_dft.shape}, FNV-1a 64 of their bits: {h:#018x}")
for r, row in enumerate(logits_dft):
    a = int(np.argmax(row))
    print(f"row {r}: argmax {a}, logit {int(row[a:a + 1].view(np.uint32)[0]):#010x} ({row[a]})")
