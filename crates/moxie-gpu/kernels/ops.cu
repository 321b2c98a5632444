// The forward pass's kernels other than the weight products: norms, elementwise ops, RoPE,
// KV-cache stores, attention over the cache, MoE routing and the weighted expert sum.
// Sizes are in elements; a "row" is one token's vector. All activations are f32.

// y = x / sqrt(mean(x^2) + eps) * w, one block per row.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, int ncols,
                                        int x_stride, int y_stride, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (int64_t)blockIdx.x * x_stride;
    float* yr = y + (int64_t)blockIdx.x * y_stride;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = xr[i];
        sum += v * v;
    }
    sum = mx_block_sum(sum, scratch);
    float scale = 1.0f / sqrtf(sum / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        yr[i] = xr[i] * scale * w[i];
    }
}

// y += x
extern "C" __global__ void add_f32(float* y, const float* x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] += x[i];
    }
}

// y[i] += b[i % ncols]
extern "C" __global__ void add_bias_f32(float* y, const float* b, int n, int ncols) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] += b[i % ncols];
    }
}

// g = silu(g) * u (SwiGLU)
extern "C" __global__ void swiglu_f32(float* g, const float* u, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

// Copy n_cols values of each of n_rows rows between strided layouts.
extern "C" __global__ void copy_rows_f32(float* dst, int dst_stride, const float* src,
                                         int src_stride, int n_rows, int n_cols) {
    for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
        for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
            dst[(int64_t)r * dst_stride + i] = src[(int64_t)r * src_stride + i];
        }
    }
}

// Rotate pairs of dimensions of every head: block (token, head); `cs` holds (cos, sin) per
// token and pair, as the host computed them (YaRN included). Pairs are (2i, 2i+1) (normal)
// or (i, i + n_pairs) (NEOX), starting `offset` into each head.
extern "C" __global__ void rope_f32(float* x, const float* cs, int n_head, int head_stride,
                                    int tok_stride, int offset, int n_pairs, int neox) {
    int t = blockIdx.y;
    int h = blockIdx.x;
    float* hx = x + (int64_t)t * tok_stride + (int64_t)h * head_stride + offset;
    const float* c = cs + (int64_t)t * n_pairs * 2;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        int a = neox ? i : 2 * i;
        int b = neox ? i + n_pairs : 2 * i + 1;
        float co = c[2 * i];
        float si = c[2 * i + 1];
        float x0 = hx[a];
        float x1 = hx[b];
        hx[a] = fmaf(x0, co, -(x1 * si));
        hx[b] = fmaf(x0, si, x1 * co);
    }
}

// Store n_rows rows of `width` values (source rows `src_stride` apart) into consecutive
// cache rows (f16 or f32).
extern "C" __global__ void kv_store_f16(uint16_t* cache, const float* src, int n_rows,
                                        int width, int src_stride) {
    for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            cache[(int64_t)r * width + i] = mx_f32_to_f16(src[(int64_t)r * src_stride + i]);
        }
    }
}

extern "C" __global__ void kv_store_f32(float* cache, const float* src, int n_rows, int width,
                                        int src_stride) {
    for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            cache[(int64_t)r * width + i] = src[(int64_t)r * src_stride + i];
        }
    }
}

// q8_0 rows: `width` (a multiple of 32) values as width / 32 blocks of an f16 scale and 32
// int8, quantized as moxie's CPU cache stores them (its AVX2 `quantize_q8_0`: d = amax / 127,
// values times 127 / amax rounded to nearest even), so both hold the same bytes. One thread
// per block.
extern "C" __global__ void kv_store_q8_0(uint8_t* cache, const float* src, int n_rows,
                                         int width, int src_stride) {
    int nb = width / 32;
    for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
        for (int b = threadIdx.x; b < nb; b += blockDim.x) {
            const float* x = src + (int64_t)r * src_stride + b * 32;
            uint8_t* y = cache + ((int64_t)r * nb + b) * 34;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
            }
            uint16_t d = mx_f32_to_f16(amax / 127.0f);
            y[0] = (uint8_t)(d & 0xff);
            y[1] = (uint8_t)(d >> 8);
            float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int i = 0; i < 32; i++) {
                y[2 + i] = (uint8_t)(int8_t)(int)rintf(x[i] * id);
            }
        }
    }
}

// Element `c` of cache row `row` (rows of `n` elements) for each cache type: attention and the
// indexer read the caches through these.
struct MxRowsF32 {
    const float* p;
    __device__ __forceinline__ float at(int64_t row, int n, int c) const {
        return p[row * n + c];
    }
    // Keys of this type multiply f32 queries as they are.
    __device__ __forceinline__ static void round_query(float* q, int n) {}
};

struct MxRowsF16 {
    const uint16_t* p;
    __device__ __forceinline__ float at(int64_t row, int n, int c) const {
        return mx_f16_to_f32(p[row * n + c]);
    }
    // The CPU (as ggml) converts queries to f16, the keys' dot partner: the same rounding.
    // Threads of the block take elements threadIdx.x, + blockDim.x, ...
    __device__ __forceinline__ static void round_query(float* q, int n) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            q[i] = mx_f16_to_f32(mx_f32_to_f16(q[i]));
        }
    }
};

struct MxRowsQ8 {
    const uint8_t* p;
    __device__ __forceinline__ float at(int64_t row, int n, int c) const {
        const uint8_t* b = p + (row * (n / 32) + c / 32) * 34;
        float d = mx_f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        return d * (float)(int8_t)b[2 + (c & 31)];
    }
    // The CPU converts queries to q8_0, the keys' dot partner (its AVX2 quantize_q8_0, as
    // kv_store_q8_0): each block of 32 becomes d * q with d = amax / 127 in f16 and q the value
    // times 127 / amax rounded to nearest even. A thread per block.
    __device__ __forceinline__ static void round_query(float* q, int n) {
        for (int b = threadIdx.x; b < n / 32; b += blockDim.x) {
            float* x = q + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
            }
            float d = mx_f16_to_f32(mx_f32_to_f16(amax / 127.0f));
            float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int i = 0; i < 32; i++) {
                int v = (int)rintf(x[i] * id);
                v = v > 127 ? 127 : v < -128 ? -128 : v;
                x[i] = d * (float)v;
            }
        }
    }
};


#define MX_ATTN_THREADS 128
#define MX_ATTN_MAX_DK 1152
#define MX_ATTN_MAX_DV_PER_THREAD 8
// Query heads of one kv head that a block attends for, reading each cached row once for all
// of them (MLA: the latent row every head reads), and the floats their queries take in
// shared memory (8 heads of up to 576, 4 of 1152: ops.rs picks the heads per block).
#define MX_ATTN_MAX_HEADS 8
#define MX_ATTN_Q_FLOATS 4608
// Key elements of a tile's rows staged in shared memory at a time (a row padded by one, so
// that the threads reading their own rows' element c hit 32 different banks).
#define MX_ATTN_KCHUNK 32

// Scores of the tile's positions p0 .. p0 + blockDim.x (thread x: position p0 + x; MX_NEG_INF
// past `n_pos`) for the `nh` query heads in `qs` (dk floats each). Every thread of the block
// calls it. The tile's key rows are staged through `kt` MX_ATTN_KCHUNK elements at a time, a
// warp reading a row's elements side by side (one or two memory transactions, where a thread
// reading its own row took one per element), and each read once for all the heads; each
// thread still sums its position's dot products in element order.
template <typename K>
__device__ __forceinline__ void mx_attn_scores(const float* qs, K k, const int* list, int p0,
                                               int n_pos, int kvh, int dk, int k_row, int nh,
                                               float scale,
                                               float (*kt)[MX_ATTN_KCHUNK + 1], float* s) {
    int i = p0 + threadIdx.x;
    int lane = threadIdx.x & (MX_WARP - 1);
    int warps = blockDim.x / MX_WARP;
    float dot[MX_ATTN_MAX_HEADS];
    for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
        dot[g] = 0.0f;
    }
    for (int c0 = 0; c0 < dk; c0 += MX_ATTN_KCHUNK) {
        int w = min(MX_ATTN_KCHUNK, dk - c0);
        for (int r = threadIdx.x / MX_WARP; r < (int)blockDim.x; r += warps) {
            int ir = p0 + r;
            if (lane < w && ir < n_pos) {
                int p = list ? list[ir] : ir;
                kt[r][lane] = k.at(p, k_row, kvh * dk + c0 + lane);
            }
        }
        // The chunk is staged before any thread reads it.
        __syncthreads();
        if (i < n_pos) {
            for (int c = 0; c < w; c++) {
                float x = kt[threadIdx.x][c];
                for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
                    if (g < nh) {
                        dot[g] += qs[g * dk + c0 + c] * x;
                    }
                }
            }
        }
        // Every thread has read it before the next chunk overwrites it.
        __syncthreads();
    }
    for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
        s[g] = i < n_pos ? dot[g] * scale : MX_NEG_INF;
    }
}

// Causal softmax attention of the query rows of `hb` heads of one kv head for token t (block
// (head chunk, t)) against the cache: positions 0 ..= pos0 + t, or, when `sel` is given and
// `sel_n[t] >= 0`, only the `sel_n[t]` positions listed at `sel + t * sel_stride` (DeepSeek
// sparse attention's top-k). Keys of kv head h / (n_head / n_head_kv) start at kvh * dk in
// each cache row of `k_row` elements; values at kvh * dv in rows of `v_row` (MLA: v is the key
// cache itself, values its first dv elements). Each thread takes a position of a tile of
// MX_ATTN_THREADS; the tile's key rows are read once for the block's heads (staged by warps,
// `mx_attn_scores`), and each value element once for them too. Online softmax over the tiles,
// so no score buffer grows with the context.
// The query takes the rounding of the keys' dot partner first, as on the CPU (K::round_query).
// Every head's sums run in the same order as with one head a block, so the results do not
// depend on `hb`.
template <typename K, typename V>
__device__ void attention_impl(const float* q, K k, V v, float* out, int n_head,
                               int n_head_kv, int dk, int dv, int k_row, int v_row, int pos0,
                               float scale, const int* sel, const int* sel_n, int sel_stride,
                               int round_p, int hb) {
    __shared__ float qs[MX_ATTN_Q_FLOATS];
    __shared__ float probs[MX_ATTN_MAX_HEADS][MX_ATTN_THREADS];
    __shared__ int rows[MX_ATTN_THREADS];
    __shared__ float scratch[32];
    __shared__ float kt[MX_ATTN_THREADS][MX_ATTN_KCHUNK + 1];
    int group = n_head / n_head_kv;
    int chunks = (group + hb - 1) / hb;
    int kvh = blockIdx.x / chunks;
    int g0 = (blockIdx.x % chunks) * hb;
    int nh = min(hb, group - g0);
    int h0 = kvh * group + g0;
    int t = blockIdx.y;
    const float* qr = q + ((int64_t)t * n_head + h0) * dk;
    for (int i = threadIdx.x; i < nh * dk; i += blockDim.x) {
        qs[i] = qr[i];
    }
    __syncthreads();
    // Each head's dk is a multiple of 32: q8_0's blocks do not straddle heads.
    K::round_query(qs, nh * dk);
    __syncthreads();
    float acc[MX_ATTN_MAX_HEADS][MX_ATTN_MAX_DV_PER_THREAD];
    float m[MX_ATTN_MAX_HEADS];
    float l[MX_ATTN_MAX_HEADS];
    float inv[MX_ATTN_MAX_HEADS];
    float s[MX_ATTN_MAX_HEADS];
    float correction[MX_ATTN_MAX_HEADS];
    for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
        for (int j = 0; j < MX_ATTN_MAX_DV_PER_THREAD; j++) {
            acc[g][j] = 0.0f;
        }
        m[g] = MX_NEG_INF;
        l[g] = 0.0f;
        inv[g] = 0.0f;
    }
    int n_pos = pos0 + t + 1;
    const int* list = 0;
    if (sel != 0 && sel_n[t] >= 0) {
        list = sel + (int64_t)t * sel_stride;
        n_pos = sel_n[t];
    }
    // round_p: the probabilities are normalised and rounded to f16 before they weight the
    // values, as the CPU does for prompt batches over f16 values (ggml converts them to the
    // values' type): a first pass over the keys for the softmax's max and sum, then the
    // weighted values with the rounded probabilities.
    if (round_p) {
        for (int p0 = 0; p0 < n_pos; p0 += blockDim.x) {
            int i = p0 + threadIdx.x;
            mx_attn_scores(qs, k, list, p0, n_pos, kvh, dk, k_row, nh, scale, kt, s);
            for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
                if (g < nh) {
                    float m_new = fmaxf(m[g], mx_block_max(s[g], scratch));
                    float e = i < n_pos ? expf(s[g] - m_new) : 0.0f;
                    l[g] = l[g] * expf(m[g] - m_new) + mx_block_sum(e, scratch);
                    m[g] = m_new;
                }
            }
        }
        for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
            inv[g] = 1.0f / l[g];
        }
    }
    for (int p0 = 0; p0 < n_pos; p0 += blockDim.x) {
        int i = p0 + threadIdx.x;
        if (i < n_pos) {
            rows[threadIdx.x] = list ? list[i] : i;
        }
        mx_attn_scores(qs, k, list, p0, n_pos, kvh, dk, k_row, nh, scale, kt, s);
        for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
            correction[g] = 1.0f;
            if (g >= nh) {
                continue;
            }
            if (round_p) {
                probs[g][threadIdx.x] =
                    i < n_pos ? mx_f16_to_f32(mx_f32_to_f16(expf(s[g] - m[g]) * inv[g])) : 0.0f;
            } else {
                float tile_max = mx_block_max(s[g], scratch);
                float m_new = fmaxf(m[g], tile_max);
                correction[g] = expf(m[g] - m_new);
                float e = i < n_pos ? expf(s[g] - m_new) : 0.0f;
                probs[g][threadIdx.x] = e;
                float tile_sum = mx_block_sum(e, scratch);
                l[g] = l[g] * correction[g] + tile_sum;
                m[g] = m_new;
            }
        }
        // The tile's probs and rows are written before any thread reads them.
        __syncthreads();
        int n_tile = min(n_pos - p0, (int)blockDim.x);
        for (int j = 0; j < MX_ATTN_MAX_DV_PER_THREAD; j++) {
            int d = threadIdx.x + j * blockDim.x;
            if (d < dv) {
                float a[MX_ATTN_MAX_HEADS];
                for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
                    a[g] = acc[g][j] * correction[g];
                }
                for (int pp = 0; pp < n_tile; pp++) {
                    float x = v.at(rows[pp], v_row, kvh * dv + d);
                    for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
                        if (g < nh) {
                            a[g] += probs[g][pp] * x;
                        }
                    }
                }
                for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
                    acc[g][j] = a[g];
                }
            }
        }
        // The next tile overwrites probs and rows.
        __syncthreads();
    }
    for (int g = 0; g < MX_ATTN_MAX_HEADS; g++) {
        if (g >= nh) {
            continue;
        }
        float* o = out + ((int64_t)t * n_head + h0 + g) * dv;
        for (int j = 0; j < MX_ATTN_MAX_DV_PER_THREAD; j++) {
            int d = threadIdx.x + j * blockDim.x;
            if (d < dv) {
                o[d] = round_p ? acc[g][j] : acc[g][j] / l[g];
            }
        }
    }
}

// One kernel per pair of cache types (keys, values); MLA passes its key cache as both.
#define MX_ATTENTION(NAME, KT, KR, VT, VR)                                                     \
    extern "C" __global__ void NAME(const float* q, const KT* k, const VT* v, float* out,       \
                                    int n_head, int n_head_kv, int dk, int dv, int k_row,       \
                                    int v_row, int pos0, float scale, const int* sel,           \
                                    const int* sel_n, int sel_stride, int round_p, int hb) {    \
        attention_impl(q, KR{k}, VR{v}, out, n_head, n_head_kv, dk, dv, k_row, v_row, pos0,     \
                       scale, sel, sel_n, sel_stride, round_p, hb);                             \
    }

MX_ATTENTION(attention_f16, uint16_t, MxRowsF16, uint16_t, MxRowsF16)
MX_ATTENTION(attention_f32, float, MxRowsF32, float, MxRowsF32)
MX_ATTENTION(attention_q8_0, uint8_t, MxRowsQ8, uint8_t, MxRowsQ8)
MX_ATTENTION(attention_q8_0_f16, uint8_t, MxRowsQ8, uint16_t, MxRowsF16)
MX_ATTENTION(attention_f16_q8_0, uint16_t, MxRowsF16, uint8_t, MxRowsQ8)

// Routing telemetry of a layer routed and run on the GPU (its routes never reach the host):
// `tally` (32-bit words) holds tokens[2], counts[2][n_expert] (u32) and mass[2][n_expert]
// (f32), per phase (0: a prompt batch, 1: one token). Adds `n_tok` tokens and, per
// selection, one to its expert's count and its weight to its mass.
extern "C" __global__ void route_tally(const int* ids, const float* weights, int n_sel,
                                       int n_tok, int n_expert, int phase,
                                       unsigned int* tally) {
    unsigned int* counts = tally + 2 + phase * n_expert;
    float* mass = (float*)(tally + 2 + 2 * n_expert) + phase * n_expert;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) {
        atomicAdd(&tally[phase], (unsigned int)n_tok);
    }
    for (; i < n_sel; i += gridDim.x * blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < n_expert) {
            atomicAdd(&counts[e], 1u);
            atomicAdd(&mass[e], weights[i]);
        }
    }
}

#define MX_ROUTE_MAX_EXPERTS 1024
#define MX_ROUTE_MAX_GROUPS 64

// Expert choice per token (one warp per token: the block), as moxie's CPU `route_top_k`:
// gating (softmax or sigmoid), top-k on probability + selection bias within the best groups
// (group score = its two best), ties to the lower index; weights = unbiased probabilities,
// normalised and scaled as configured. The lanes share the elementwise work and each of the k
// picks (a warp argmax, ties to the lower index); the sums the CPU takes in order (softmax's,
// the weights') are taken in the same order by lane 0, so the results are the one-thread
// version's bit for bit.
extern "C" __global__ void route_f32(const float* logits, const float* bias, int has_bias,
                                     int* ids, float* weights, int n_tok, int n_expert, int k,
                                     int sigmoid, int n_groups, int n_group_used, int norm,
                                     float w_scale) {
    __shared__ float probs[MX_ROUTE_MAX_EXPERTS];
    __shared__ float sel[MX_ROUTE_MAX_EXPERTS];
    __shared__ unsigned char taken[MX_ROUTE_MAX_EXPERTS];
    __shared__ float gscore[MX_ROUTE_MAX_GROUPS];
    __shared__ float shared_sum;
    __shared__ unsigned long long shared_keep;
    int lane = threadIdx.x;
    // One block per token: t < n_tok for every block, so every lane reaches every barrier.
    int t = blockIdx.x;
    const float* lg = logits + (int64_t)t * n_expert;
    if (sigmoid) {
        for (int e = lane; e < n_expert; e += MX_WARP) {
            probs[e] = 1.0f / (1.0f + expf(-lg[e]));
        }
    } else {
        float mx = MX_NEG_INF;
        for (int e = lane; e < n_expert; e += MX_WARP) {
            mx = fmaxf(mx, lg[e]);
        }
        mx = mx_warp_max(mx);
        for (int e = lane; e < n_expert; e += MX_WARP) {
            probs[e] = expf(lg[e] - mx);
        }
        __syncthreads();
        if (lane == 0) {
            float sum = 0.0f;
            for (int e = 0; e < n_expert; e++) {
                sum += probs[e];
            }
            shared_sum = sum;
        }
        __syncthreads();
        float sum = shared_sum;
        for (int e = lane; e < n_expert; e += MX_WARP) {
            probs[e] /= sum;
        }
    }
    for (int e = lane; e < n_expert; e += MX_WARP) {
        sel[e] = probs[e] + (has_bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncthreads();
    if (n_groups > 1) {
        int per = n_expert / n_groups;
        for (int g = lane; g < n_groups; g += MX_WARP) {
            float b0 = MX_NEG_INF;
            float b1 = MX_NEG_INF;
            for (int e = g * per; e < (g + 1) * per; e++) {
                float v = sel[e];
                if (v > b0) {
                    b1 = b0;
                    b0 = v;
                } else if (v > b1) {
                    b1 = v;
                }
            }
            gscore[g] = b0 + (per > 1 ? b1 : 0.0f);
        }
        __syncthreads();
        if (lane == 0) {
            unsigned long long keep = 0;
            for (int r = 0; r < n_group_used && r < n_groups; r++) {
                int best = -1;
                for (int g = 0; g < n_groups; g++) {
                    if (!((keep >> g) & 1ull) && (best < 0 || gscore[g] > gscore[best])) {
                        best = g;
                    }
                }
                keep |= 1ull << best;
            }
            shared_keep = keep;
        }
        __syncthreads();
        unsigned long long keep = shared_keep;
        for (int e = lane; e < n_expert; e += MX_WARP) {
            if (!((keep >> (e / per)) & 1ull)) {
                sel[e] = MX_NEG_INF;
            }
        }
        __syncthreads();
    }
    int* out_ids = ids + (int64_t)t * k;
    float* out_w = weights + (int64_t)t * k;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        // This lane's first best among the experts not yet taken, then the warp's.
        int have = 0;
        float bv = MX_NEG_INF;
        int bi = 0;
        for (int e = lane; e < n_expert; e += MX_WARP) {
            if (!taken[e] && (!have || sel[e] > bv)) {
                have = 1;
                bv = sel[e];
                bi = e;
            }
        }
        for (int m = MX_WARP / 2; m > 0; m >>= 1) {
            int oh = __shfl_xor_sync(0xffffffffu, have, m, MX_WARP);
            float ov = __shfl_xor_sync(0xffffffffu, bv, m, MX_WARP);
            int oi = __shfl_xor_sync(0xffffffffu, bi, m, MX_WARP);
            if (oh && (!have || ov > bv || (ov == bv && oi < bi))) {
                have = 1;
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            out_ids[j] = bi;
            out_w[j] = probs[bi];
            sum += probs[bi];
            taken[bi] = 1;
        }
        __syncthreads();
    }
    if (lane == 0) {
        if (norm) {
            sum = fmaxf(sum, 6.103515625e-5f);
            for (int j = 0; j < k; j++) {
                out_w[j] /= sum;
            }
        }
        if (w_scale != 0.0f && w_scale != 1.0f) {
            for (int j = 0; j < k; j++) {
                out_w[j] *= w_scale;
            }
        }
    }
}

// out[t] (+)= sum_j weights[t, j] * rows[t * k + j]: the routed experts' weighted sum.
extern "C" __global__ void moe_sum_f32(const float* rows, const float* weights, float* out,
                                       int n_tok, int k, int n_embd, int accumulate) {
    int t = blockIdx.y;
    for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < n_embd; d += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            s += weights[(int64_t)t * k + j] * rows[((int64_t)t * k + j) * n_embd + d];
        }
        float* o = out + (int64_t)t * n_embd + d;
        *o = accumulate ? *o + s : s;
    }
}

// y *= s
extern "C" __global__ void scale_f32(float* y, float s, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] *= s;
    }
}

// LayerNorm of each row (one block per row, in place allowed): (x - mean) / sqrt(var + eps),
// then times `w` and plus `b` where given (null: none).
extern "C" __global__ void layer_norm_f32(const float* x, const float* w, const float* b,
                                          float* y, int ncols, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (int64_t)blockIdx.x * ncols;
    float* yr = y + (int64_t)blockIdx.x * ncols;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        sum += xr[i];
    }
    float mean = mx_block_sum(sum, scratch) / (float)ncols;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float d = xr[i] - mean;
        sq += d * d;
    }
    float scale = 1.0f / sqrtf(mx_block_sum(sq, scratch) / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        float v = (xr[i] - mean) * scale;
        if (w != 0) {
            v *= w[i];
        }
        if (b != 0) {
            v += b[i];
        }
        yr[i] = v;
    }
}

// DeepSeek sparse attention's indexer scores: block t (a query token), its threads over the
// positions j <= pos0 + t: scores[t * stride + j] = sum_h relu(q[t, h] . k[j]) * w[t, h]
// (heads of `dim` values, `n_head` per token; keys one row of `dim` per position).
template <typename K>
__device__ void dsa_scores_impl(const float* q, K k, const float* w, float* scores,
                                int n_head, int dim, int pos0, int stride) {
    int t = blockIdx.x;
    int n_pos = pos0 + t + 1;
    const float* qt = q + (int64_t)t * n_head * dim;
    const float* wt = w + (int64_t)t * n_head;
    for (int j = threadIdx.x; j < n_pos; j += blockDim.x) {
        float score = 0.0f;
        for (int h = 0; h < n_head; h++) {
            float dot = 0.0f;
            for (int c = 0; c < dim; c++) {
                dot += qt[h * dim + c] * k.at(j, dim, c);
            }
            score += fmaxf(dot, 0.0f) * wt[h];
        }
        scores[(int64_t)t * stride + j] = score;
    }
}

extern "C" __global__ void dsa_scores_f16(const float* q, const uint16_t* k, const float* w,
                                          float* scores, int n_head, int dim, int pos0,
                                          int stride) {
    dsa_scores_impl(q, MxRowsF16{k}, w, scores, n_head, dim, pos0, stride);
}

extern "C" __global__ void dsa_scores_f32(const float* q, const float* k, const float* w,
                                          float* scores, int n_head, int dim, int pos0,
                                          int stride) {
    dsa_scores_impl(q, MxRowsF32{k}, w, scores, n_head, dim, pos0, stride);
}

extern "C" __global__ void dsa_scores_q8_0(const float* q, const uint8_t* k, const float* w,
                                           float* scores, int n_head, int dim, int pos0,
                                           int stride) {
    dsa_scores_impl(q, MxRowsQ8{k}, w, scores, n_head, dim, pos0, stride);
}

// libstdc++'s __adjust_heap on heap[0, len): the hole goes down along the children that
// compare "less" (higher score), then `value` is pushed back up from there.
__device__ void dsa_adjust_heap(int* heap, const float* s, int hole, int len, int value) {
    int top = hole;
    int second = hole;
    while (second < (len - 1) / 2) {
        second = 2 * (second + 1);
        if (s[heap[second]] > s[heap[second - 1]]) {
            second--;
        }
        heap[hole] = heap[second];
        hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
        second = 2 * (second + 1);
        heap[hole] = heap[second - 1];
        hole = second - 1;
    }
    while (hole > top) {
        int parent = (hole - 1) / 2;
        if (!(s[heap[parent]] > s[value])) {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

// The top-k positions of each query token's scores (one thread per token), selected as
// std::partial_sort with ggml's comparator does (libstdc++'s heap selection, ties
// included), like moxie's CPU indexer: `sel + t * k` gets them (unordered) and sel_n[t] = k,
// or sel_n[t] = -1 when the token sees no more than k positions (all of them, unmasked).
extern "C" __global__ void dsa_top_k(const float* scores, int stride, int n_tok, int pos0,
                                     int k, int* sel, int* sel_n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) {
        return;
    }
    int n_valid = pos0 + t + 1;
    if (n_valid <= k) {
        sel_n[t] = -1;
        return;
    }
    const float* s = scores + (int64_t)t * stride;
    int* heap = sel + (int64_t)t * k;
    for (int i = 0; i < k; i++) {
        heap[i] = i;
    }
    if (k >= 2) {
        for (int parent = (k - 2) / 2; parent >= 0; parent--) {
            dsa_adjust_heap(heap, s, parent, k, heap[parent]);
        }
    }
    for (int i = k; i < n_valid; i++) {
        if (s[i] > s[heap[0]]) {
            dsa_adjust_heap(heap, s, 0, k, i);
        }
    }
    sel_n[t] = k;
}

// y[i] *= sigmoid(g[i / group]) over n values: an attention output by its per-value gates
// (group 1), or a shared expert's rows by one gate per token (group = row length).
extern "C" __global__ void mul_sigmoid_f32(float* y, const float* g, int n, int group) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] *= 1.0f / (1.0f + expf(-g[i / group]));
    }
}

// Gated DeltaNet's per-token gates from the ssm_ba projection (2 * n_v values per token: per
// key head, beta then alpha of each of its r = n_v / n_k value heads): beta = sigmoid(b) and
// g = softplus(alpha + dt_bias) * a, per token and value head (one thread each).
extern "C" __global__ void delta_net_gates_f32(const float* ba, const float* dt_bias,
                                               const float* a, float* beta, float* g, int n_tok,
                                               int n_v, int r) {
    int n = n_tok * n_v;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int t = i / n_v;
        int vh = i % n_v;
        const float* row = ba + (int64_t)t * 2 * n_v + (vh / r) * 2 * r;
        int j = vh % r;
        beta[i] = 1.0f / (1.0f + expf(-row[j]));
        float x = row[r + j] + dt_bias[vh];
        float sp = x > 20.0f ? x : logf(1.0f + expf(x));
        g[i] = sp * a[vh];
    }
}

#define MX_CONV_MAX_K 8

// Depthwise causal convolution with SiLU, one thread per channel through the tokens: `x` has
// `ch` channels per token, `w` k taps per channel, `state` the channel's last k - 1 inputs
// before the batch (oldest first), which it holds afterwards. out may not alias x.
extern "C" __global__ void ssm_conv_silu_f32(const float* x, float* state, const float* w,
                                             float* out, int n_tok, int ch, int k) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) {
        return;
    }
    int past = k - 1;
    float win[MX_CONV_MAX_K];
    for (int i = 0; i < past; i++) {
        win[i] = state[(int64_t)c * past + i];
    }
    const float* wc = w + (int64_t)c * k;
    for (int t = 0; t < n_tok; t++) {
        float xin = x[(int64_t)t * ch + c];
        float s = 0.0f;
        for (int i = 0; i < past; i++) {
            s = fmaf(win[i], wc[i], s);
        }
        s = fmaf(xin, wc[past], s);
        out[(int64_t)t * ch + c] = s / (1.0f + expf(-s));
        for (int i = 0; i + 1 < past; i++) {
            win[i] = win[i + 1];
        }
        if (past > 0) {
            win[past - 1] = xin;
        }
    }
    for (int i = 0; i < past; i++) {
        state[(int64_t)c * past + i] = win[i];
    }
}

#define MX_GDN_MAX_D 256

// The gated delta rule of one value head (block vh, d threads: thread j owns row j of the
// head's transposed state, ssm[vh*d*d + j*d + i] = S[i][j]) through the batch's tokens. Per
// token: q and k of the head's key head (vh / (n_v / n_k)) from the convolved rows `conv`
// (`ch` per token: q | k | v), L2-normed as llama.cpp does (RMS norm with eps / d, times
// 1 / sqrt(d)); then S *= exp(g), delta_j = (v_j - S_j . k) beta, S_j += delta_j k,
// out_j = (S_j . q) / sqrt(d), written at out[(t * n_v + vh) * d + j].
extern "C" __global__ void gated_delta_net_f32(const float* conv, const float* beta,
                                               const float* g, float* ssm, float* out,
                                               int n_tok, int n_k, int n_v, int d, int ch,
                                               float eps) {
    __shared__ float qs[MX_GDN_MAX_D];
    __shared__ float ks[MX_GDN_MAX_D];
    __shared__ float scratch[32];
    int vh = blockIdx.x;
    int j = threadIdx.x;
    int kh = vh / (n_v / n_k);
    int key_dim = n_k * d;
    float* row = ssm + ((int64_t)vh * d + j) * d;
    float fd = (float)d;
    float post = 1.0f / sqrtf(fd);
    float scale = 1.0f / sqrtf(fd);
    for (int t = 0; t < n_tok; t++) {
        const float* r = conv + (int64_t)t * ch;
        float q = r[kh * d + j];
        float k = r[key_dim + kh * d + j];
        float v = r[2 * key_dim + vh * d + j];
        float sq = mx_block_sum(q * q, scratch);
        float sk = mx_block_sum(k * k, scratch);
        qs[j] = q * (1.0f / sqrtf(sq / fd + eps / fd)) * post;
        ks[j] = k * (1.0f / sqrtf(sk / fd + eps / fd)) * post;
        __syncthreads();
        float decay = expf(g[(int64_t)t * n_v + vh]);
        float b = beta[(int64_t)t * n_v + vh];
        float sum = 0.0f;
        for (int i = 0; i < d; i++) {
            float s = row[i] * decay;
            row[i] = s;
            sum = fmaf(s, ks[i], sum);
        }
        float delta = (v - sum) * b;
        float o = 0.0f;
        for (int i = 0; i < d; i++) {
            float s = fmaf(ks[i], delta, row[i]);
            row[i] = s;
            o = fmaf(s, qs[i], o);
        }
        out[((int64_t)t * n_v + vh) * d + j] = o * scale;
        // The next token overwrites qs and ks.
        __syncthreads();
    }
}
