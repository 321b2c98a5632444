// Products with weight matrices of every type in quant.cuh, and embedding-row lookups.
//
// Weights: `n_mat` matrices (mat_bytes apart) of `n_out` rows (row_bytes apart) of `n_in`
// values (a multiple of 32). Activations x and results y are f32.
//
// mul_mat_T / mul_mat_id_T: one warp per output row (block = 32 x ROWS threads, the block's
// warps take consecutive rows). The lanes take the row's 32-value chunks lane-strided (lane
// l: chunks l, l+32, ...; adjacent lanes read adjacent blocks), dequantize each chunk once
// and multiply it with up to MX_MM_TOK tokens at a time, kept as per-lane partial sums;
// one warp sum per token gives the row's value. More tokens: the next group of MX_MM_TOK
// dequantizes the row again. Accumulation is in f32.
//
// Convergence: no thread returns early; a warp without a row (past n_out, a batch or id
// index past the end, an id outside 0..n_mat) runs the same loops and shuffles with no
// chunks, and only the writes are guarded. Every lane reaches every shuffle even where the
// emulator's shuffles wait for the whole block.
//
// Grid y and z together index the batch (mul_mat) or the routed row (mul_mat_id), so their
// count may exceed CUDA's 65535 limit on grid y: index = blockIdx.z * gridDim.y + blockIdx.y.
#pragma once

#define MX_MM_TOK 8

// The end of a pass of a warp's row over tokens t0 .. t0 + nt: each token's lane partial sums
// summed over the warp, written by lane 0 of a live warp to y[t*ldy + col]. nt is the same for
// every thread of the grid, so these shuffles are converged.
__device__ __forceinline__ void mx_store_pass(const float* acc, int nt, bool live, int lane,
                                              float* y, int t0, int ldy, long long col) {
    MX_UNROLL
    for (int k = 0; k < MX_MM_TOK; ++k) {
        if (k < nt) {
            float s = mx_warp_sum(acc[k]);
            if (live && lane == 0) {
                y[(long long)(t0 + k) * ldy + col] = s;
            }
        }
    }
}

// Y[t][r] = sum_i W_b[r][i] * X[t][i] for t < n_tok, with b = the batch index:
// y[t*ldy + b*y_batch + r], x[t*ldx + b*x_batch + i].
template <int TY>
__device__ __forceinline__ void mx_mul_mat(const uint8_t* w, unsigned long long row_bytes,
                                           unsigned long long mat_bytes, int n_in, int n_out,
                                           int n_batch, const float* x, int ldx, int x_batch,
                                           float* y, int ldy, int y_batch, int n_tok) {
    int lane = threadIdx.x;
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    long long b = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    bool live = r < n_out && b < n_batch;
    int n_chunks = live ? n_in / 32 : 0;
    const uint8_t* wr = w + (live ? b * mat_bytes + (unsigned long long)r * row_bytes : 0ull);
    const float* xb = x + (live ? b * x_batch : 0ll);
    for (int t0 = 0; t0 < n_tok; t0 += MX_MM_TOK) {
        int nt = n_tok - t0 < MX_MM_TOK ? n_tok - t0 : MX_MM_TOK;
        float acc[MX_MM_TOK];
        MX_UNROLL
        for (int k = 0; k < MX_MM_TOK; ++k) {
            acc[k] = 0.0f;
        }
        for (int c = lane; c < n_chunks; c += MX_WARP) {
            float v[32];
            mx_dequant_chunk<TY>(wr, c, v);
            const float* xc = xb + (long long)t0 * ldx + 32 * c;
            MX_UNROLL
            for (int k = 0; k < MX_MM_TOK; ++k) {
                if (k < nt) {
                    const float* xp = xc + (long long)k * ldx;
                    float s = 0.0f;
                    MX_UNROLL
                    for (int i = 0; i < 32; ++i) {
                        s += v[i] * xp[i];
                    }
                    acc[k] += s;
                }
            }
        }
        mx_store_pass(acc, nt, live, lane, y, t0, ldy, b * y_batch + r);
    }
}

// Routed experts: for j < n_ids, e = ids[j]: y[j*ldy + r] = sum_i W_e[r][i] x[(j/x_div)*ldx + i].
// An id outside 0..n_mat gives a row of zeros.
template <int TY>
__device__ __forceinline__ void mx_mul_mat_id(const uint8_t* w, unsigned long long row_bytes,
                                              unsigned long long mat_bytes, int n_in, int n_out,
                                              int n_mat, const int* ids, int n_ids,
                                              const float* x, int ldx, int x_div, float* y,
                                              int ldy) {
    int lane = threadIdx.x;
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    long long j = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    bool live = r < n_out && j < n_ids;
    int e = live ? ids[j] : -1;
    bool has = live && e >= 0 && e < n_mat;
    int n_chunks = has ? n_in / 32 : 0;
    const uint8_t* wr =
        w + (has ? (unsigned long long)e * mat_bytes + (unsigned long long)r * row_bytes : 0ull);
    const float* xr = x + (live ? (j / x_div) * ldx : 0ll);
    float acc = 0.0f;
    for (int c = lane; c < n_chunks; c += MX_WARP) {
        float v[32];
        mx_dequant_chunk<TY>(wr, c, v);
        const float* xp = xr + 32 * c;
        float s = 0.0f;
        MX_UNROLL
        for (int i = 0; i < 32; ++i) {
            s += v[i] * xp[i];
        }
        acc += s;
    }
    acc = mx_warp_sum(acc);
    if (live && lane == 0) {
        y[j * ldy + r] = acc;
    }
}

// Embedding rows: out[j*n_in + i] = W[rows[j]][i] for j < n (rows counted through all
// n_rows rows, matrix after matrix); an id outside 0..n_rows gives zeros. One thread per
// 32-value chunk: blockIdx.x * blockDim.x + threadIdx.x; j from grid y and z.
template <int TY>
__device__ __forceinline__ void mx_get_rows(const uint8_t* w, unsigned long long row_bytes,
                                            int n_in, int n_rows, const int* rows, int n,
                                            float* out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    long long j = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    if (c >= n_in / 32 || j >= n) {
        return;
    }
    int id = rows[j];
    float v[32];
    if (id >= 0 && id < n_rows) {
        mx_dequant_chunk<TY>(w + (unsigned long long)id * row_bytes, c, v);
    } else {
        MX_UNROLL
        for (int i = 0; i < 32; ++i) {
            v[i] = 0.0f;
        }
    }
    float* o = out + j * n_in + 32 * c;
    MX_UNROLL
    for (int i = 0; i < 32; ++i) {
        o[i] = v[i];
    }
}

#define MX_MATMUL_KERNELS(name, TY)                                                            \
    extern "C" __global__ void mul_mat_##name(                                                 \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_batch, const float* x, int ldx, int x_batch, float* y, int ldy,        \
        int y_batch, int n_tok) {                                                              \
        mx_mul_mat<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_batch, x, ldx, x_batch, y, ldy, \
                       y_batch, n_tok);                                                        \
    }                                                                                          \
    extern "C" __global__ void mul_mat_id_##name(                                              \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_mat, const int* ids, int n_ids, const float* x, int ldx, int x_div,    \
        float* y, int ldy) {                                                                   \
        mx_mul_mat_id<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_mat, ids, n_ids, x, ldx,     \
                          x_div, y, ldy);                                                      \
    }                                                                                          \
    extern "C" __global__ void get_rows_##name(const uint8_t* w, unsigned long long row_bytes, \
                                               int n_in, int n_rows, const int* rows, int n,   \
                                               float* out) {                                   \
        mx_get_rows<TY>(w, row_bytes, n_in, n_rows, rows, n, out);                             \
    }

MX_MATMUL_KERNELS(f32, MX_T_F32)
MX_MATMUL_KERNELS(f16, MX_T_F16)
MX_MATMUL_KERNELS(bf16, MX_T_BF16)
MX_MATMUL_KERNELS(q4_0, MX_T_Q4_0)
MX_MATMUL_KERNELS(q4_1, MX_T_Q4_1)
MX_MATMUL_KERNELS(q5_0, MX_T_Q5_0)
MX_MATMUL_KERNELS(q5_1, MX_T_Q5_1)
MX_MATMUL_KERNELS(q8_0, MX_T_Q8_0)
MX_MATMUL_KERNELS(q2_k, MX_T_Q2_K)
MX_MATMUL_KERNELS(q3_k, MX_T_Q3_K)
MX_MATMUL_KERNELS(q4_k, MX_T_Q4_K)
MX_MATMUL_KERNELS(q5_k, MX_T_Q5_K)
MX_MATMUL_KERNELS(q6_k, MX_T_Q6_K)
MX_MATMUL_KERNELS(iq4_nl, MX_T_IQ4_NL)
MX_MATMUL_KERNELS(iq4_xs, MX_T_IQ4_XS)
MX_MATMUL_KERNELS(iq2_xxs, MX_T_IQ2_XXS)
MX_MATMUL_KERNELS(iq2_xs, MX_T_IQ2_XS)
MX_MATMUL_KERNELS(iq2_s, MX_T_IQ2_S)
MX_MATMUL_KERNELS(iq3_xxs, MX_T_IQ3_XXS)
MX_MATMUL_KERNELS(iq3_s, MX_T_IQ3_S)
MX_MATMUL_KERNELS(iq1_s, MX_T_IQ1_S)
MX_MATMUL_KERNELS(iq1_m, MX_T_IQ1_M)
MX_MATMUL_KERNELS(iq2_k, MX_T_IQ2_K)
MX_MATMUL_KERNELS(iq3_k, MX_T_IQ3_K)
MX_MATMUL_KERNELS(iq4_k, MX_T_IQ4_K)
MX_MATMUL_KERNELS(iq5_k, MX_T_IQ5_K)
MX_MATMUL_KERNELS(iq6_k, MX_T_IQ6_K)
MX_MATMUL_KERNELS(iq2_ks, MX_T_IQ2_KS)
MX_MATMUL_KERNELS(iq3_ks, MX_T_IQ3_KS)
MX_MATMUL_KERNELS(iq4_ks, MX_T_IQ4_KS)
MX_MATMUL_KERNELS(iq5_ks, MX_T_IQ5_KS)
MX_MATMUL_KERNELS(q6_0, MX_T_Q6_0)
