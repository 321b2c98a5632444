// Products with int8 activations (llama.cpp's MMVQ scheme): the activations are quantized to
// int8 per 32 values (`quantize_q8x`), each weight chunk is unpacked once to 32 int8 codes
// with a scale and an offset per 16 values (`mx_q8_chunk`, quant.cuh), and every token's chunk product
// is four `dp4a` per 16 values: int8 x int8 summed in int32, two float scalings per chunk.
// A weight row is read once per pass of up to MX_MM_TOK tokens, as in matmul.cu, but as
// bytes and integer ops rather than 32 floats per chunk, and an activation chunk is 32 bytes
// rather than 128.
//
// Activations ("q8x"): rows of n_in values (a multiple of 32), compact: qs[row][n_in] int8
// and meta[row][n_in / 32] float4 {d, d * Σ q[0..16], d * Σ q[16..32], 0}: the integers and
// scales of the CPU path's activation blocks for the weight's type (Q8_0 / Q8_1 per 32, Q8_K
// per 256; `quantize_q8x`), so that a product sums exactly the CPU's integer products and
// differs from it only in float rounding; the sums are split in halves for the types whose
// offsets change every 16.
//
// Weights: value i of chunk c = d[h] * q[i] + o[h], h = i / 16, q[i] the signed bytes of
// MxQ8Chunk::q. The codes are the integers the CPU's dot products sum (Q4_0's q - 8, Q6_K's
// q - 32, Q8_0's -127..127, the IQ4 code book's -127..113, the IQ2/IQ3 grids' signed
// magnitudes, IQ1's 8 x (grid + delta), Q4_K's 0..15 with its min as the offset, ik_llama.cpp's code
// books), so the integer sums are the CPU's; the scale and offset are the float terms the
// type's dequantization multiplies and adds.
#pragma once

// a·b over the four signed bytes of each word, plus c.
__device__ __forceinline__ int mx_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDACC_RTC__
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    MX_UNROLL
    for (int k = 0; k < 4; ++k) {
        c += (int)(int8_t)(uint8_t)(a >> (8 * k)) * (int)(int8_t)(uint8_t)(b >> (8 * k));
    }
    return c;
#endif
}

// A chunk's value from its halves' integer sums s0, s1, the weight chunk's scales d0, d1 and
// offsets o0, o1, and the activation chunk's meta m: m.x (d0 s0 + d1 s1) + (o0 m.y + o1 m.z),
// rounded term by term as the CPU does. NVRTC fuses a * b + c into one rounding by default,
// and a fused term that differs from the CPU's in its last bit can flip the rounding of a
// later activation to int8, which reaches every later position through the cache (IQ3_KS's
// fixture on an H200: median position KLD 1.1e-4 against ~3e-13 unfused).
__device__ __forceinline__ float mx_q8_terms(float4 m, float d0, float d1, float o0, float o1,
                                             int s0, int s1) {
    float v = MX_FMUL(m.x, MX_FADD(MX_FMUL(d0, (float)s0), MX_FMUL(d1, (float)s1)));
    return MX_FADD(v, MX_FADD(MX_FMUL(o0, m.y), MX_FMUL(o1, m.z)));
}

// Σ over chunk `k` of weight value x activation for one activation chunk: its 8 code words
// and meta {d, d * Σ first 16, d * Σ last 16}.
__device__ __forceinline__ float mx_q8_chunk_dot(const MxQ8Chunk& k, const uint32_t* x,
                                                 float4 m) {
    int s0 = 0;
    int s1 = 0;
    MX_UNROLL
    for (int w = 0; w < 4; ++w) {
        s0 = mx_dp4a(k.q[w], x[w], s0);
        s1 = mx_dp4a(k.q[4 + w], x[4 + w], s1);
    }
    return mx_q8_terms(m, k.d[0], k.d[1], k.o[0], k.o[1], s0, s1);
}

// The 8 code words of activation chunk `c` of row `r` (16-byte aligned: rows are whole
// chunks of 32 bytes and the buffer is aligned).
__device__ __forceinline__ void mx_q8x_words(const int8_t* qs, long long r, int n_in, int c,
                                             uint32_t* x) {
    const uint4* p = (const uint4*)(qs + r * n_in + 32 * c);
    uint4 a = p[0];
    uint4 b = p[1];
    x[0] = a.x;
    x[1] = a.y;
    x[2] = a.z;
    x[3] = a.w;
    x[4] = b.x;
    x[5] = b.y;
    x[6] = b.z;
    x[7] = b.w;
}

// Rows r < n_rows * n_batch of x (row r: token r / n_batch, head r % n_batch at
// x[t*ldx + b*x_batch]) to q8x, with the integers moxie's CPU path (ggml-cpu on x86) gives the
// same row for the weight's dot type, so both sum the same integer products:
// - per == 32 (Q8_0 / Q8_1, for the legacy types and IQ4_NL): amax of the 32, d = amax / 127
//   rounded to f16 (what the block stores), q = x * (127 / amax) rounded to nearest even;
// - per == 256 (Q8_K, for the K-quants and IQ4_XS): `max` the first value of largest
//   magnitude, iscale = -127 / max, q = min(127, x * iscale rounded to nearest even),
//   d = 1 / iscale.
// One warp per block of `per` values (8 warps a block, along grid x; each lane takes per / 32
// consecutive values); the row from grid y and z.
extern "C" __global__ void quantize_q8x(const float* x, int n_in, int n_batch, int ldx,
                                        int x_batch, int n_rows, int per, int8_t* qs,
                                        float4* meta) {
    int lane = threadIdx.x;
    int blk = blockIdx.x * blockDim.y + threadIdx.y;
    long long r = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    // No thread returns early (see matmul.cu, "Convergence"): a warp past the end reads
    // nothing and writes nothing.
    bool live = blk < n_in / per && r < (long long)n_rows * n_batch;
    long long t = live ? r / n_batch : 0;
    long long b = live ? r % n_batch : 0;
    const float* xr = x + t * ldx + b * x_batch + (long long)blk * per;
    int8_t* qr = qs + r * n_in + (long long)blk * per;
    if (per == 32) {
        float v = live ? xr[lane] : 0.0f;
        float amax = mx_warp_max(fabsf(v));
        float d = mx_f16_to_f32(mx_f32_to_f16(amax / 127.0f));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int q = (int)rintf(v * id);
        q = q > 127 ? 127 : q < -128 ? -128 : q;
        // Sums within each half of the warp: lanes 0 and 16 end with their half's.
        int s = q;
        for (int m = 1; m < 16; m <<= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, m, MX_WARP);
        }
        int s_hi = __shfl_sync(0xffffffffu, s, 16, MX_WARP);
        if (live) {
            qr[lane] = (int8_t)q;
            if (lane == 0) {
                meta[r * (n_in / 32) + blk] =
                    make_float4(d, d * (float)s, d * (float)s_hi, 0.0f);
            }
        }
        return;
    }
    // per == 256: lane l holds values 8l .. 8l+7.
    float v[8];
    float amax = 0.0f;
    float max = 0.0f;
    MX_UNROLL
    for (int i = 0; i < 8; ++i) {
        v[i] = live ? xr[8 * lane + i] : 0.0f;
        float ax = fabsf(v[i]);
        if (ax > amax) {
            amax = ax;
            max = v[i];
        }
    }
    // The largest magnitude; on ties the one from the lowest lane (the first value, as the
    // CPU scans). `src` is the lane the candidate came from.
    int src = lane;
    for (int m = 1; m < MX_WARP; m <<= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, amax, m, MX_WARP);
        float om = __shfl_xor_sync(0xffffffffu, max, m, MX_WARP);
        int os = __shfl_xor_sync(0xffffffffu, src, m, MX_WARP);
        if (oa > amax || (oa == amax && os < src)) {
            amax = oa;
            max = om;
            src = os;
        }
    }
    float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
    float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    int s = 0;
    uint32_t words[2] = {0u, 0u};
    MX_UNROLL
    for (int i = 0; i < 8; ++i) {
        int q = (int)rintf(iscale * v[i]);
        q = q > 127 ? 127 : q;
        s += q;
        words[i >> 2] |= (uint32_t)(uint8_t)(int8_t)q << (8 * (i & 3));
    }
    // Sums of 16 (lane pairs), then chunk c = lanes 4c .. 4c+3: its halves at lanes 4c, 4c+2.
    s += __shfl_xor_sync(0xffffffffu, s, 1, MX_WARP);
    int s_hi = __shfl_down_sync(0xffffffffu, s, 2, MX_WARP);
    if (live) {
        uint2* out = (uint2*)(qr + 8 * lane);
        *out = make_uint2(words[0], words[1]);
        if ((lane & 3) == 0) {
            meta[r * (n_in / 32) + (long long)blk * 8 + lane / 4] =
                make_float4(d, d * (float)s, d * (float)s_hi, 0.0f);
        }
    }
}

// One warp's pass over weight row `wr` (`n_chunks` chunks, 0 for a warp without a row): the
// lanes take its chunks lane-strided, unpack each once and multiply it with the first `nt`
// (at most N) of the q8x rows `xr`; acc[k] gets row k's sum over the lane's chunks.
template <int TY, int N>
__device__ __forceinline__ void mx_q8_row_pass(const uint8_t* wr, int n_chunks, const int8_t* qs,
                                               const float4* meta, int n_in, const long long* xr,
                                               int nt, float* acc) {
    MX_UNROLL
    for (int k = 0; k < N; ++k) {
        acc[k] = 0.0f;
    }
    for (int c = threadIdx.x; c < n_chunks; c += MX_WARP) {
        MxQ8Chunk ch;
        mx_q8_chunk<TY>(wr, c, ch);
        MX_UNROLL
        for (int k = 0; k < N; ++k) {
            if (k < nt) {
                uint32_t xw[8];
                mx_q8x_words(qs, xr[k], n_in, c, xw);
                acc[k] += mx_q8_chunk_dot(ch, xw, meta[xr[k] * (n_in / 32) + c]);
            }
        }
    }
}

// As mx_mul_mat (matmul.cu) over q8x activations: row t*n_batch + b of qs / meta is token t's
// head b.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_q8(const uint8_t* w, unsigned long long row_bytes,
                                              unsigned long long mat_bytes, int n_in, int n_out,
                                              int n_batch, const int8_t* qs, const float4* meta,
                                              float* y, int ldy, int y_batch, int n_tok) {
    int lane = threadIdx.x;
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    long long b = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    bool live = r < n_out && b < n_batch;
    int n_chunks = live ? n_in / 32 : 0;
    const uint8_t* wr = w + (live ? b * mat_bytes + (unsigned long long)r * row_bytes : 0ull);
    for (int t0 = 0; t0 < n_tok; t0 += MX_MM_TOK) {
        int nt = n_tok - t0 < MX_MM_TOK ? n_tok - t0 : MX_MM_TOK;
        long long xr[MX_MM_TOK];
        MX_UNROLL
        for (int k = 0; k < MX_MM_TOK; ++k) {
            xr[k] = (long long)(t0 + k) * n_batch + b;
        }
        float acc[MX_MM_TOK];
        mx_q8_row_pass<TY, MX_MM_TOK>(wr, n_chunks, qs, meta, n_in, xr, nt, acc);
        mx_store_pass(acc, nt, live, lane, y, t0, ldy, b * y_batch + r);
    }
}

// As mx_mul_mat_id (matmul.cu) over q8x activations: routed row j reads q8x row j / x_div.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_id_q8(const uint8_t* w, unsigned long long row_bytes,
                                                 unsigned long long mat_bytes, int n_in,
                                                 int n_out, int n_mat, const int* ids, int n_ids,
                                                 const int8_t* qs, const float4* meta, int x_div,
                                                 float* y, int ldy) {
    int lane = threadIdx.x;
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    long long j = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    bool live = r < n_out && j < n_ids;
    int e = live ? ids[j] : -1;
    bool has = live && e >= 0 && e < n_mat;
    int n_chunks = has ? n_in / 32 : 0;
    const uint8_t* wr =
        w + (has ? (unsigned long long)e * mat_bytes + (unsigned long long)r * row_bytes : 0ull);
    long long xr = live ? j / x_div : 0;
    float acc;
    mx_q8_row_pass<TY, 1>(wr, n_chunks, qs, meta, n_in, &xr, 1, &acc);
    acc = mx_warp_sum(acc);
    if (live && lane == 0) {
        y[j * ldy + r] = acc;
    }
}

// Routed rows grouped by expert, for batches where experts see several rows each: `group_rows`
// (one block) sorts the row indices by expert into `order` (within an expert in any order:
// every row's result depends on its own row only), with each expert's first index in
// `offsets` (n_mat + 1) and its first chunk of up to MX_MM_TOK rows in `chunk_start`
// (n_mat + 1); `cursor` (n_mat) is scratch. Rows whose id is outside 0..n_mat get zeros here.
extern "C" __global__ void group_rows(const int* ids, int n_ids, int n_mat, int n_out,
                                      float* y, int ldy, int* offsets, int* cursor,
                                      int* chunk_start, int* order) {
    for (int e = threadIdx.x; e < n_mat; e += blockDim.x) {
        cursor[e] = 0;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_ids; j += blockDim.x) {
        int e = ids[j];
        if (e >= 0 && e < n_mat) {
            atomicAdd(&cursor[e], 1);
        } else {
            for (int r = 0; r < n_out; ++r) {
                y[(long long)j * ldy + r] = 0.0f;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0;
        int chunks = 0;
        for (int e = 0; e < n_mat; ++e) {
            offsets[e] = at;
            chunk_start[e] = chunks;
            at += cursor[e];
            chunks += (cursor[e] + MX_MM_TOK - 1) / MX_MM_TOK;
            cursor[e] = 0;
        }
        offsets[n_mat] = at;
        chunk_start[n_mat] = chunks;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_ids; j += blockDim.x) {
        int e = ids[j];
        if (e >= 0 && e < n_mat) {
            order[offsets[e] + atomicAdd(&cursor[e], 1)] = j;
        }
    }
}

// Chunk `chunk` of `group_rows`' grouping: its expert `e` (the last with chunk_start[e] <=
// chunk), the index in `order` of its first row (`first`), and its rows (up to MX_MM_TOK;
// 0 past the last chunk, where `e` and `first` are 0).
__device__ __forceinline__ int mx_group_chunk(long long chunk, int n_mat, const int* offsets,
                                              const int* chunk_start, int& e, int& first) {
    e = 0;
    first = 0;
    if (chunk >= chunk_start[n_mat]) {
        return 0;
    }
    int lo = 0;
    int hi = n_mat;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (chunk_start[mid] <= chunk) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    e = lo;
    first = offsets[e] + (int)(chunk - chunk_start[e]) * MX_MM_TOK;
    return min(MX_MM_TOK, offsets[e + 1] - first);
}

// As mx_mul_mat_id_q8 over rows grouped by `group_rows`: grid y and z index chunks of up to
// MX_MM_TOK rows of one expert (past the last chunk a block computes nothing), so each weight
// chunk is unpacked once for all of them and the expert's weights are read once per chunk
// rather than once per routed row.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_id_grouped_q8(
    const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in,
    int n_out, int n_mat, const int* order, const int* offsets, const int* chunk_start,
    const int8_t* qs, const float4* meta, int x_div, float* y, int ldy) {
    int lane = threadIdx.x;
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    long long chunk = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    int e;
    int first;
    int nt = mx_group_chunk(chunk, n_mat, offsets, chunk_start, e, first);
    bool live = r < n_out && nt > 0;
    nt = live ? nt : 0;
    int n_chunks = live ? n_in / 32 : 0;
    const uint8_t* wr =
        w + (live ? (unsigned long long)e * mat_bytes + (unsigned long long)r * row_bytes : 0ull);
    int rows[MX_MM_TOK];
    long long xr[MX_MM_TOK];
    MX_UNROLL
    for (int k = 0; k < MX_MM_TOK; ++k) {
        rows[k] = k < nt ? order[first + k] : 0;
        xr[k] = rows[k] / x_div;
    }
    float acc[MX_MM_TOK];
    mx_q8_row_pass<TY, MX_MM_TOK>(wr, n_chunks, qs, meta, n_in, xr, nt, acc);
    // Every lane of a warp has the same nt (the chunk is the block's): converged shuffles.
    MX_UNROLL
    for (int k = 0; k < MX_MM_TOK; ++k) {
        float s = mx_warp_sum(acc[k]);
        if (k < nt && lane == 0) {
            y[(long long)rows[k] * ldy + r] = s;
        }
    }
}

// Prompt batches on tensor cores (`mma.sync`, sm_80 and later): a warp multiplies 16 weight rows
// by 32 tokens, one chunk of 32 values at a time. The chunk's 16 rows are unpacked once into
// shared memory (`mx_q8_chunk`, lanes 0-15 a row each) and read back as the A fragments of two
// 16x8x16 int8 products per 8 tokens, one per half of the chunk (its two scales and offsets),
// with the tokens' int8 words as the B fragments. Each (row, token) then takes the chunk's
// float terms exactly as `mx_q8_chunk_dot` forms them: the integer sums are the CPU's, and the
// results differ from the dp4a kernel's only in the order the chunks are added.
#define MX_MMA_TOK 32
#define MX_MMA_WARPS 4

// D (16x8 int32) = A (16x16 int8) x B (16x8 int8). Lane 4g + q holds a0 = A[g][4q..4q+3],
// a1 = A[g+8][4q..4q+3] and b = B[4q..4q+3][g] (column g's bytes), and gets d[0] = D[g][2q],
// d[1] = D[g][2q+1], d[2] = D[g+8][2q], d[3] = D[g+8][2q+1] (the PTX fragments of
// mma.m16n8k16 for .s8).
__device__ __forceinline__ void mx_mma_s8(uint32_t a0, uint32_t a1, uint32_t b, int* d) {
#if defined(__CUDACC_RTC__) && __CUDA_ARCH__ >= 800
    d[0] = d[1] = d[2] = d[3] = 0;
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
#else
    // The same sums gathered from the other lanes' fragments (the emulator; older GPUs).
    int lane = threadIdx.x & (MX_WARP - 1);
    int g = lane >> 2;
    int q = lane & 3;
    d[0] = d[1] = d[2] = d[3] = 0;
    MX_UNROLL
    for (int w = 0; w < 4; ++w) {
        uint32_t lo = __shfl_sync(0xffffffffu, a0, 4 * g + w, MX_WARP);
        uint32_t hi = __shfl_sync(0xffffffffu, a1, 4 * g + w, MX_WARP);
        uint32_t c0 = __shfl_sync(0xffffffffu, b, 8 * q + w, MX_WARP);
        uint32_t c1 = __shfl_sync(0xffffffffu, b, 8 * q + 4 + w, MX_WARP);
        d[0] = mx_dp4a(lo, c0, d[0]);
        d[1] = mx_dp4a(lo, c1, d[1]);
        d[2] = mx_dp4a(hi, c0, d[2]);
        d[3] = mx_dp4a(hi, c1, d[3]);
    }
#endif
}

// One chunk of a warp's 16 rows as each lane's A fragments: values 0..15 (words 0..3) and
// 16..31 (words 4..7) of rows g and g + 8, and those rows' scales and offsets.
struct MxMmaRows {
    uint32_t lo0, lo1, hi0, hi1;
    float t[2][4];
};

// Unpack chunk c of the warp's 16 rows (lane l < 16 unpacks row l from `wr`, zeros where
// `unpacks` is false) through the warp's shared `codes` and `terms` into `f`.
template <int TY>
__device__ __forceinline__ void mx_mma_unpack(const uint8_t* wr, bool unpacks, int c,
                                              uint32_t (*codes)[8], float (*terms)[4],
                                              MxMmaRows& f) {
    int lane = threadIdx.x;
    int g = lane >> 2;
    int q = lane & 3;
    // The previous chunk's fragments have been read by every lane.
    __syncwarp();
    if (lane < 16) {
        MxQ8Chunk ch;
        if (unpacks) {
            mx_q8_chunk<TY>(wr, c, ch);
        } else {
            MX_UNROLL
            for (int i = 0; i < 8; ++i) {
                ch.q[i] = 0u;
            }
            ch.d[0] = ch.d[1] = ch.o[0] = ch.o[1] = 0.0f;
        }
        MX_UNROLL
        for (int i = 0; i < 8; ++i) {
            codes[lane][i] = ch.q[i];
        }
        terms[lane][0] = ch.d[0];
        terms[lane][1] = ch.d[1];
        terms[lane][2] = ch.o[0];
        terms[lane][3] = ch.o[1];
    }
    __syncwarp();
    f.lo0 = codes[g][q];
    f.lo1 = codes[g + 8][q];
    f.hi0 = codes[g][4 + q];
    f.hi1 = codes[g + 8][4 + q];
    MX_UNROLL
    for (int i = 0; i < 4; ++i) {
        f.t[0][i] = terms[g][i];
        f.t[1][i] = terms[g + 8][i];
    }
}

// The chunk times 8 tokens: `blo`, `bhi` this lane's B words (its token g's words q and 4 + q
// of the chunk), `m` the q8x meta of its output tokens 2q and 2q + 1; acc[e] gets row
// g + 8 (e >> 1), token 2q + (e & 1), with the float terms of mx_q8_chunk_dot.
__device__ __forceinline__ void mx_mma_tokens(const MxMmaRows& f, uint32_t blo, uint32_t bhi,
                                              const float4* m, float* acc) {
    int slo[4];
    int shi[4];
    mx_mma_s8(f.lo0, f.lo1, blo, slo);
    mx_mma_s8(f.hi0, f.hi1, bhi, shi);
    MX_UNROLL
    for (int e = 0; e < 4; ++e) {
        const float* d = f.t[e >> 1];
        acc[e] += mx_q8_terms(m[e & 1], d[0], d[1], d[2], d[3], slo[e], shi[e]);
    }
}

// Words q and 4 + q of chunk c of q8x row r (zeros for r < 0).
__device__ __forceinline__ void mx_mma_b_words(const int8_t* qs, long long r, int n_in, int c,
                                               uint32_t& lo, uint32_t& hi) {
    lo = 0u;
    hi = 0u;
    if (r >= 0) {
        const uint32_t* xw = (const uint32_t*)(qs + r * n_in + 32 * c);
        lo = xw[threadIdx.x & 3];
        hi = xw[4 + (threadIdx.x & 3)];
    }
}

// The q8x meta of chunk c of row r (zeros for r < 0).
__device__ __forceinline__ float4 mx_mma_meta(const float4* meta, long long r, int n_chunks,
                                              int c) {
    return r >= 0 ? meta[r * n_chunks + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// Chunk c (unpacked in `f`) times one tile of 8 tokens, into `acc`: the B words of q8x row
// `rb` (this lane's B token) and the meta of rows ro[0], ro[1] (its output tokens); -1 for none.
__device__ __forceinline__ void mx_mma_tile(const MxMmaRows& f, const int8_t* qs,
                                            const float4* meta, long long rb,
                                            const long long* ro, int n_in, int n_chunks, int c,
                                            float* acc) {
    uint32_t blo;
    uint32_t bhi;
    mx_mma_b_words(qs, rb, n_in, c, blo, bhi);
    float4 m[2] = {mx_mma_meta(meta, ro[0], n_chunks, c), mx_mma_meta(meta, ro[1], n_chunks, c)};
    mx_mma_tokens(f, blo, bhi, m, acc);
}

// As mx_mul_mat_q8 on tensor cores: block (32, MX_MMA_WARPS), warp w of block x takes rows
// 16 (MX_MMA_WARPS x + w) .. + 16; grid y and z index (token tile, matrix) pairs, token tile
// s / n_batch of MX_MMA_TOK tokens for matrix s % n_batch.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_q8_mma(const uint8_t* w, unsigned long long row_bytes,
                                                  unsigned long long mat_bytes, int n_in,
                                                  int n_out, int n_batch, const int8_t* qs,
                                                  const float4* meta, float* y, int ldy,
                                                  int y_batch, int n_tok) {
    __shared__ uint32_t codes[MX_MMA_WARPS][16][8];
    __shared__ float terms[MX_MMA_WARPS][16][4];
    int lane = threadIdx.x;
    int wp = threadIdx.y;
    int g = lane >> 2;
    int q = lane & 3;
    int r0 = (blockIdx.x * MX_MMA_WARPS + wp) * 16;
    long long s = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    long long b = s % n_batch;
    int t0 = (int)(s / n_batch) * MX_MMA_TOK;
    // No thread returns early (see matmul.cu, "Convergence"): rows past n_out unpack zeros and
    // tokens past n_tok read and write nothing.
    int row = r0 + (lane & 15);
    bool unpacks = lane < 16 && row < n_out && t0 < n_tok;
    const uint8_t* wr =
        w + (unpacks ? b * mat_bytes + (unsigned long long)row * row_bytes : 0ull);
    int n_chunks = n_in / 32;
    // q8x rows: this lane's B token (t0 + 8j + g) and output tokens (t0 + 8j + 2q + k) per
    // tile of 8; -1 past n_tok.
    long long rb[4];
    long long ro[4][2];
    MX_UNROLL
    for (int j = 0; j < 4; ++j) {
        int tb = t0 + 8 * j + g;
        rb[j] = tb < n_tok ? (long long)tb * n_batch + b : -1;
        MX_UNROLL
        for (int k = 0; k < 2; ++k) {
            int to = t0 + 8 * j + 2 * q + k;
            ro[j][k] = to < n_tok ? (long long)to * n_batch + b : -1;
        }
    }
    float acc[4][4];
    MX_UNROLL
    for (int j = 0; j < 4; ++j) {
        MX_UNROLL
        for (int e = 0; e < 4; ++e) {
            acc[j][e] = 0.0f;
        }
    }
    for (int c = 0; c < n_chunks; ++c) {
        MxMmaRows f;
        mx_mma_unpack<TY>(wr, unpacks, c, codes[wp], terms[wp], f);
        MX_UNROLL
        for (int j = 0; j < 4; ++j) {
            mx_mma_tile(f, qs, meta, rb[j], ro[j], n_in, n_chunks, c, acc[j]);
        }
    }
    MX_UNROLL
    for (int j = 0; j < 4; ++j) {
        MX_UNROLL
        for (int e = 0; e < 4; ++e) {
            int r = r0 + g + 8 * (e >> 1);
            int tok = t0 + 8 * j + 2 * q + (e & 1);
            if (r < n_out && tok < n_tok) {
                y[(long long)tok * ldy + b * y_batch + r] = acc[j][e];
            }
        }
    }
}

// As mx_mul_mat_id_grouped_q8 on tensor cores: block (32, MX_MMA_WARPS), warp w of block x
// takes rows 16 (MX_MMA_WARPS x + w) .. + 16 of the chunk's expert; grid y and z index the
// chunks of up to MX_MM_TOK (8) routed rows, one 16x8 product per half-chunk.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_id_grouped_q8_mma(
    const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in,
    int n_out, int n_mat, const int* order, const int* offsets, const int* chunk_start,
    const int8_t* qs, const float4* meta, int x_div, float* y, int ldy) {
    __shared__ uint32_t codes[MX_MMA_WARPS][16][8];
    __shared__ float terms[MX_MMA_WARPS][16][4];
    int lane = threadIdx.x;
    int wp = threadIdx.y;
    int g = lane >> 2;
    int q = lane & 3;
    int r0 = (blockIdx.x * MX_MMA_WARPS + wp) * 16;
    long long chunk = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    int e;
    int first;
    int nt = mx_group_chunk(chunk, n_mat, offsets, chunk_start, e, first);
    int row = r0 + (lane & 15);
    bool unpacks = lane < 16 && row < n_out && nt > 0;
    const uint8_t* wr =
        w + (unpacks ? (unsigned long long)e * mat_bytes + (unsigned long long)row * row_bytes
                     : 0ull);
    int n_chunks = n_in / 32;
    // Routed rows: this lane's B row (g) and output rows (2q, 2q + 1) of the chunk; -1 past nt.
    int jb = g < nt ? order[first + g] : -1;
    int jo[2];
    MX_UNROLL
    for (int k = 0; k < 2; ++k) {
        jo[k] = 2 * q + k < nt ? order[first + 2 * q + k] : -1;
    }
    long long rb = jb >= 0 ? jb / x_div : -1;
    long long ro[2] = {jo[0] >= 0 ? jo[0] / x_div : -1, jo[1] >= 0 ? jo[1] / x_div : -1};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c = 0; c < n_chunks; ++c) {
        MxMmaRows f;
        mx_mma_unpack<TY>(wr, unpacks, c, codes[wp], terms[wp], f);
        mx_mma_tile(f, qs, meta, rb, ro, n_in, n_chunks, c, acc);
    }
    MX_UNROLL
    for (int k = 0; k < 4; ++k) {
        int r = r0 + g + 8 * (k >> 1);
        int j = jo[k & 1];
        if (r < n_out && j >= 0) {
            y[(long long)j * ldy + r] = acc[k];
        }
    }
}

#define MX_MATMUL_Q8_KERNELS(name, TY)                                                         \
    extern "C" __global__ void mul_mat_q8_##name(                                              \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_batch, const int8_t* qs, const float4* meta, float* y, int ldy,        \
        int y_batch, int n_tok) {                                                              \
        mx_mul_mat_q8<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_batch, qs, meta, y, ldy,     \
                          y_batch, n_tok);                                                     \
    }                                                                                          \
    extern "C" __global__ void mul_mat_q8_mma_##name(                                          \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_batch, const int8_t* qs, const float4* meta, float* y, int ldy,        \
        int y_batch, int n_tok) {                                                              \
        mx_mul_mat_q8_mma<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_batch, qs, meta, y, ldy, \
                              y_batch, n_tok);                                                 \
    }                                                                                          \
    extern "C" __global__ void mul_mat_id_q8_##name(                                           \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_mat, const int* ids, int n_ids, const int8_t* qs, const float4* meta,  \
        int x_div, float* y, int ldy) {                                                        \
        mx_mul_mat_id_q8<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_mat, ids, n_ids, qs,      \
                             meta, x_div, y, ldy);                                             \
    }                                                                                          \
    extern "C" __global__ void mul_mat_id_grouped_q8_mma_##name(                               \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_mat, const int* order, const int* offsets, const int* chunk_start,     \
        const int8_t* qs, const float4* meta, int x_div, float* y, int ldy) {                  \
        mx_mul_mat_id_grouped_q8_mma<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_mat, order,   \
                                         offsets, chunk_start, qs, meta, x_div, y, ldy);       \
    }                                                                                          \
    extern "C" __global__ void mul_mat_id_grouped_q8_##name(                                   \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_mat, const int* order, const int* offsets, const int* chunk_start,     \
        const int8_t* qs, const float4* meta, int x_div, float* y, int ldy) {                  \
        mx_mul_mat_id_grouped_q8<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_mat, order,       \
                                     offsets, chunk_start, qs, meta, x_div, y, ldy);           \
    }

MX_MATMUL_Q8_KERNELS(q4_0, MX_T_Q4_0)
MX_MATMUL_Q8_KERNELS(q4_1, MX_T_Q4_1)
MX_MATMUL_Q8_KERNELS(q5_0, MX_T_Q5_0)
MX_MATMUL_Q8_KERNELS(q5_1, MX_T_Q5_1)
MX_MATMUL_Q8_KERNELS(q8_0, MX_T_Q8_0)
MX_MATMUL_Q8_KERNELS(q2_k, MX_T_Q2_K)
MX_MATMUL_Q8_KERNELS(q3_k, MX_T_Q3_K)
MX_MATMUL_Q8_KERNELS(q4_k, MX_T_Q4_K)
MX_MATMUL_Q8_KERNELS(q5_k, MX_T_Q5_K)
MX_MATMUL_Q8_KERNELS(q6_k, MX_T_Q6_K)
MX_MATMUL_Q8_KERNELS(iq4_nl, MX_T_IQ4_NL)
MX_MATMUL_Q8_KERNELS(iq4_xs, MX_T_IQ4_XS)
MX_MATMUL_Q8_KERNELS(iq2_xxs, MX_T_IQ2_XXS)
MX_MATMUL_Q8_KERNELS(iq2_xs, MX_T_IQ2_XS)
MX_MATMUL_Q8_KERNELS(iq2_s, MX_T_IQ2_S)
MX_MATMUL_Q8_KERNELS(iq3_xxs, MX_T_IQ3_XXS)
MX_MATMUL_Q8_KERNELS(iq3_s, MX_T_IQ3_S)
MX_MATMUL_Q8_KERNELS(iq1_s, MX_T_IQ1_S)
MX_MATMUL_Q8_KERNELS(iq1_m, MX_T_IQ1_M)
MX_MATMUL_Q8_KERNELS(iq2_k, MX_T_IQ2_K)
MX_MATMUL_Q8_KERNELS(iq3_k, MX_T_IQ3_K)
MX_MATMUL_Q8_KERNELS(iq4_k, MX_T_IQ4_K)
MX_MATMUL_Q8_KERNELS(iq5_k, MX_T_IQ5_K)
MX_MATMUL_Q8_KERNELS(iq6_k, MX_T_IQ6_K)
MX_MATMUL_Q8_KERNELS(iq2_ks, MX_T_IQ2_KS)
MX_MATMUL_Q8_KERNELS(iq3_ks, MX_T_IQ3_KS)
MX_MATMUL_Q8_KERNELS(iq4_ks, MX_T_IQ4_KS)
MX_MATMUL_Q8_KERNELS(iq5_ks, MX_T_IQ5_KS)
MX_MATMUL_Q8_KERNELS(q6_0, MX_T_Q6_0)
