// Dequantization of every weight type the GPU kernels read, one 32-value chunk at a time.
//
// Every type's block is either 32 values (Q4_0 .. Q8_0, IQ4_NL, Q6_0) or a 256-value
// super-block of eight 32-value chunks (the K-quants, IQ4_XS, the IQ1/IQ2/IQ3 types, whose
// code books are in iq_grids.cuh, and ik_llama.cpp's IQ2_K .. IQ6_K and IQ2_KS .. IQ5_KS,
// whose code books are in iqk_values.cuh); F32/F16/BF16 rows are cut into chunks of
// 32. So `mx_dequant_chunk<TY>(row, c, out)` — chunk c of a row, elements 32c .. 32c+31 —
// is all a kernel needs to read any type, and the kernels in matmul.cu are generic over TY.
// The types whose values are integer codes times a scale (plus an offset) decode once, to the
// codes (`mx_q8_chunk`, which the int8 products of matmul_q8.cu multiply), and take their f32
// values from them (`mx_deq_codes`).
// `row` is the start of the row: the _KS types keep their scale there (an f16 or f32 row
// prefix, ggml's row_meta), before the row's first block.
//
// The values equal moxie-quant's `dequantize_row_*` (ggml's, ik_llama.cpp's) bit for bit: the
// same f32 operations in the same order. On the GPU the multiplies and adds go through
// __fmul_rn / __fadd_rn, which NVRTC never contracts into an FMA (a plain `d * q - m` may
// become one); where moxie-quant uses a fused multiply-add (IQ6_K's curve) so does the kernel.
//
// Loads: the kernels require the weight's base address to be aligned to the type's alignment
// in src/matmul.rs (`kernels`; matmul.rs checks it; device allocations are 256-aligned). Since
// every row and matrix starts a whole number of blocks (plus a row prefix) in, a block's
// alignment is then the largest power of two (at most 16) dividing its size and the row
// prefix, and each type loads its fields with the widest accesses that alignment allows
// (mx_load_words).
#pragma once

// Type tags (template arguments of the generic kernels).
#define MX_T_F32 0
#define MX_T_F16 1
#define MX_T_BF16 2
#define MX_T_Q4_0 3
#define MX_T_Q4_1 4
#define MX_T_Q5_0 5
#define MX_T_Q5_1 6
#define MX_T_Q8_0 7
#define MX_T_Q2_K 8
#define MX_T_Q3_K 9
#define MX_T_Q4_K 10
#define MX_T_Q5_K 11
#define MX_T_Q6_K 12
#define MX_T_IQ4_NL 13
#define MX_T_IQ4_XS 14
#define MX_T_IQ2_XXS 15
#define MX_T_IQ2_XS 16
#define MX_T_IQ2_S 17
#define MX_T_IQ3_XXS 18
#define MX_T_IQ3_S 19
#define MX_T_IQ1_S 20
#define MX_T_IQ1_M 21
#define MX_T_IQ2_K 22
#define MX_T_IQ3_K 23
#define MX_T_IQ4_K 24
#define MX_T_IQ5_K 25
#define MX_T_IQ6_K 26
#define MX_T_IQ2_KS 27
#define MX_T_IQ3_KS 28
#define MX_T_IQ4_KS 29
#define MX_T_IQ5_KS 30
#define MX_T_Q6_0 31

#ifdef __CUDACC_RTC__
#define MX_FMUL(a, b) __fmul_rn((a), (b))
#define MX_FADD(a, b) __fadd_rn((a), (b))
#define MX_FSUB(a, b) __fadd_rn((a), -(b))
#define MX_UNROLL _Pragma("unroll")
#elif defined(MXEMU_FP_CONTRACT)
// The emulator built to fuse as NVRTC does (build.rs, MXEMU_FP_CONTRACT=1): a volatile keeps
// these operations out of the compiler's fused multiply-adds, as __fmul_rn does on a GPU.
static inline float mx_unfused(float r) {
    volatile float v = r;
    return v;
}
#define MX_FMUL(a, b) mx_unfused((a) * (b))
#define MX_FADD(a, b) mx_unfused((a) + (b))
#define MX_FSUB(a, b) mx_unfused((a) - (b))
#define MX_UNROLL
#else
#define MX_FMUL(a, b) ((a) * (b))
#define MX_FADD(a, b) ((a) + (b))
#define MX_FSUB(a, b) ((a) - (b))
#define MX_UNROLL
#endif

struct alignas(16) MxU32x4 {
    uint32_t a, b, c, d;
};
struct alignas(8) MxU32x2 {
    uint32_t a, b;
};

// N little-endian 32-bit words from p, read with accesses of ALIGN bytes (p aligned to it).
template <int ALIGN, int N>
__device__ __forceinline__ void mx_load_words(const uint8_t* p, uint32_t* w) {
    if (ALIGN >= 16 && N % 4 == 0) {
        const MxU32x4* q = (const MxU32x4*)p;
        MX_UNROLL
        for (int i = 0; i < N / 4; ++i) {
            MxU32x4 v = q[i];
            w[4 * i] = v.a;
            w[4 * i + 1] = v.b;
            w[4 * i + 2] = v.c;
            w[4 * i + 3] = v.d;
        }
    } else if (ALIGN >= 8 && N % 2 == 0) {
        const MxU32x2* q = (const MxU32x2*)p;
        MX_UNROLL
        for (int i = 0; i < N / 2; ++i) {
            MxU32x2 v = q[i];
            w[2 * i] = v.a;
            w[2 * i + 1] = v.b;
        }
    } else if (ALIGN >= 4) {
        const uint32_t* q = (const uint32_t*)p;
        MX_UNROLL
        for (int i = 0; i < N; ++i) {
            w[i] = q[i];
        }
    } else {
        const uint16_t* q = (const uint16_t*)p;
        MX_UNROLL
        for (int i = 0; i < N; ++i) {
            w[i] = (uint32_t)q[2 * i] | ((uint32_t)q[2 * i + 1] << 16);
        }
    }
}

// Byte k of the words loaded by mx_load_words.
__device__ __forceinline__ uint32_t mx_byte(const uint32_t* w, int k) {
    return (w[k >> 2] >> ((k & 3) * 8)) & 0xffu;
}

__device__ __forceinline__ uint32_t mx_ld_u16(const uint8_t* p) {
    return *(const uint16_t*)p;
}

__device__ __forceinline__ float mx_ld_f16(const uint8_t* p) {
    return mx_f16_to_f32(*(const uint16_t*)p);
}

__device__ __forceinline__ float mx_ld_f32(const uint8_t* p) {
    return __uint_as_float(*(const uint32_t*)p);
}

// kvalues_iq4nl, the IQ4_NL / IQ4_XS code book, as packed bytes (no table in memory).
__device__ __forceinline__ float mx_iq4nl_value(uint32_t q) {
    const uint64_t lo = 0xF6EADDCFBFAD9881ull; // -127 -104 -83 -65 -49 -35 -22 -10
    const uint64_t hi = 0x7159453526190D01ull; //    1   13  25  38  53  69  89 113
    uint64_t w = q < 8u ? lo : hi;
    return (float)(int8_t)(uint8_t)(w >> ((q & 7u) * 8u));
}

// ---- float rows -------------------------------------------------------------------------

__device__ __forceinline__ void mx_deq_f32(const uint8_t* row, int c, float* out) {
    uint32_t w[32];
    mx_load_words<16, 32>(row + (uint64_t)c * 128u, w);
    MX_UNROLL
    for (int i = 0; i < 32; ++i) {
        out[i] = __uint_as_float(w[i]);
    }
}

__device__ __forceinline__ void mx_deq_f16(const uint8_t* row, int c, float* out) {
    uint32_t w[16];
    mx_load_words<16, 16>(row + (uint64_t)c * 64u, w);
    MX_UNROLL
    for (int i = 0; i < 16; ++i) {
        out[2 * i] = mx_f16_to_f32((uint16_t)(w[i] & 0xffffu));
        out[2 * i + 1] = mx_f16_to_f32((uint16_t)(w[i] >> 16));
    }
}

__device__ __forceinline__ void mx_deq_bf16(const uint8_t* row, int c, float* out) {
    uint32_t w[16];
    mx_load_words<16, 16>(row + (uint64_t)c * 64u, w);
    MX_UNROLL
    for (int i = 0; i < 16; ++i) {
        out[2 * i] = mx_bf16_to_f32((uint16_t)(w[i] & 0xffffu));
        out[2 * i + 1] = mx_bf16_to_f32((uint16_t)(w[i] >> 16));
    }
}

// ---- 32-value blocks (one chunk = one block) ---------------------------------------------

// ---- 256-value super-blocks (chunk c = sub-block c % 8 of super-block c / 8) -------------

// Q3_K, 110 bytes: hmask[32], qs[64], scales[12] (16 six-bit scales), d. Sub-block s reads
// the 2-bit field 2*(s%4) of qs[32*(s/4) ..][32] and bit s of hmask (clear: subtract 4),
// scales 2s and 2s+1; value d*(scale - 32) * q.
__device__ __forceinline__ int mx_q3_k_scale(const uint8_t* sc, int is) {
    uint32_t lo = ((uint32_t)sc[is & 7] >> (4 * (is >> 3))) & 0xfu;
    uint32_t hi = ((uint32_t)sc[8 + (is & 3)] >> (2 * (is >> 2))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K (get_scale_min_k4) from the 12
// scale bytes at `s` (byte loads: j is not a compile-time constant).
__device__ __forceinline__ void mx_scale_min_k4(const uint8_t* s, int j, uint32_t* sc,
                                                uint32_t* mn) {
    if (j < 4) {
        *sc = (uint32_t)s[j] & 63u;
        *mn = (uint32_t)s[j + 4] & 63u;
    } else {
        *sc = ((uint32_t)s[j + 4] & 0xfu) | (((uint32_t)s[j - 4] >> 6) << 4);
        *mn = ((uint32_t)s[j + 4] >> 4) | (((uint32_t)s[j] >> 6) << 4);
    }
}

// ---- IQ1/IQ2/IQ3 code-book types -------------------------------------------------------------
// Blocks of 66/74/82/98 bytes are only 2-byte aligned. Each group of 8 values is one grid
// entry of magnitudes with a sign byte (bit j negates value j); value db * (±grid), with
// db = d * (0.5 + ls) * 0.25 (IQ3_XXS: * 0.5) for the 4-bit scale ls of its 32 (IQ2_XS,
// IQ2_S: of its 16). ggml multiplies the magnitude by db and then by ±1: the same float.

__device__ __forceinline__ float mx_grid_db(float d, uint32_t ls, float sub) {
    return MX_FMUL(MX_FMUL(d, MX_FADD(0.5f, (float)ls)), sub);
}

// ---- ik_llama.cpp's types ----------------------------------------------------------------
// moxie-quant's iqk.rs has the layouts. A value is (d * scale) * code, with code the entry of
// its book (iqk_values.cuh) at the value's index, plus the book's half size where its group's
// `extra` bit is set. The _K types (an f16 d per block) have two 16-value groups per chunk:
// scale and extra bit 2s for the first 16 values of sub-block s, 2s+1 for the last 16. The _KS
// types (one d per row, before the blocks) have one 32-value group per chunk. Both keep a
// sub-block's codes alike (IQ2_K as IQ2_KS, ..., IQ5_K as IQ5_KS), so one function per bit
// width reads a group's codes: values l0 .. l0+N-1 of the chunk, from the upper half of the
// book when hi is 1. mx_q8_chunk gives them with their scales d * scale, for the int8
// products and the f32 values (mx_deq_codes); IQ6_K's f32 values alone take its cubic.

// Byte l of the code words `w` (zeroed first) set to the signed code v.
__device__ __forceinline__ void mx_put_code(uint32_t* w, int l, int v) {
    w[l >> 2] |= (uint32_t)(uint8_t)(int8_t)v << (8 * (l & 3));
}

// 2-bit codes (IQ2_K, IQ2_KS) of sub-block s: bit pair s%4 of q[32], the bytes qs[32*(s/4) ..].
template <int N>
__device__ __forceinline__ void mx_iq2k_codes(const uint32_t* q, int s, int l0, uint32_t hi,
                                              uint32_t* w) {
    int shift = 2 * (s & 3);
    MX_UNROLL
    for (int l = l0; l < l0 + N; ++l) {
        uint32_t i = ((mx_byte(q, l) >> shift) & 3u) + hi * 4u;
        mx_put_code(w, l, mx_iq2nl_values[i]);
    }
}

// 3-bit codes (IQ3_K, IQ3_KS) of sub-block s: bit pair s%4 of q[32] (qs[32*(s/4) ..]), bit s
// of qh[32] as the third bit.
template <int N>
__device__ __forceinline__ void mx_iq3k_codes(const uint32_t* q, const uint32_t* qh, int s,
                                              int l0, uint32_t hi, uint32_t* w) {
    int shift = 2 * (s & 3);
    MX_UNROLL
    for (int l = l0; l < l0 + N; ++l) {
        uint32_t i = (((mx_byte(q, l) >> shift) & 3u) | (((mx_byte(qh, l) >> s) & 1u) << 2)) + hi * 8u;
        mx_put_code(w, l, mx_iq3nl_values[i]);
    }
}

// 4-bit codes (IQ4_K, IQ4_KS) of a sub-block: the low nibbles of q[16] (qs[16s ..]), then
// their high nibbles.
template <int N>
__device__ __forceinline__ void mx_iq4k_codes(const uint32_t* q, int l0, uint32_t hi,
                                              uint32_t* w) {
    MX_UNROLL
    for (int l = l0; l < l0 + N; ++l) {
        uint32_t i = ((mx_byte(q, l & 15) >> (4 * (l >> 4))) & 0xfu) + hi * 16u;
        mx_put_code(w, l, mx_iq4k_values[i]);
    }
}

// 5-bit codes (IQ5_K, IQ5_KS) of sub-block s: nibble s%2 of q[32] (qs[32*(s/2) ..]), bit s of
// qh[32] as the fifth bit.
template <int N>
__device__ __forceinline__ void mx_iq5k_codes(const uint32_t* q, const uint32_t* qh, int s,
                                              int l0, uint32_t hi, uint32_t* w) {
    int shift = 4 * (s & 1);
    MX_UNROLL
    for (int l = l0; l < l0 + N; ++l) {
        uint32_t i = (((mx_byte(q, l) >> shift) & 0xfu) | (((mx_byte(qh, l) >> s) & 1u) << 4)) + hi * 32u;
        mx_put_code(w, l, mx_iq5nl_values[i]);
    }
}

// The 6-bit scale of group g of IQ4_K / IQ5_K: a nibble of scales_l[g/2] (bytes 8..15) with
// bits 2(g%4) .. of scales_h[g/4] (bytes 4..7) on top, minus 32.
__device__ __forceinline__ int mx_iqk_scale6(const uint8_t* b, int g) {
    uint32_t lo = ((uint32_t)b[8 + (g >> 1)] >> (4 * (g & 1))) & 0xfu;
    uint32_t hi = ((uint32_t)b[4 + (g >> 2)] >> (2 * (g & 3))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}

// Chunk c of an IQ6_K row (212-byte blocks: d, extra, scales[16] (int8), qs[128], qh[64]),
// sub-block s = c % 8: the 6-bit index of each value (byte l of `idx`: nibble s%2 of
// qs[32*(s/2) + l], bits 2(s%4) .. 2(s%4)+1 of qh[32*(s/4) + l] on top), and per 16 values the
// scale d * scale and the `extra` bit that picks the upper half of the book (or adds 1 to
// the curve).
__device__ __forceinline__ void mx_iq6k_chunk(const uint8_t* row, int c, uint32_t* idx,
                                              float* dl, uint32_t* hi) {
    const uint8_t* b = row + (uint64_t)(c >> 3) * 212u;
    int s = c & 7;
    float d = mx_ld_f16(b);
    uint32_t extra = mx_ld_u16(b + 2) >> (2 * s);
    uint32_t sc = mx_ld_u16(b + 4 + 2 * s);
    uint32_t q[8];
    uint32_t qh[8];
    mx_load_words<4, 8>(b + 20 + 32 * (s >> 1), q);
    mx_load_words<4, 8>(b + 148 + 32 * (s >> 2), qh);
    MX_UNROLL
    for (int part = 0; part < 2; ++part) {
        dl[part] = MX_FMUL(d, (float)(int8_t)(uint8_t)((sc >> (8 * part)) & 0xffu));
        hi[part] = (extra >> part) & 1u;
    }
    MX_UNROLL
    for (int w = 0; w < 8; ++w) {
        idx[w] = 0;
    }
    MX_UNROLL
    for (int l = 0; l < 32; ++l) {
        uint32_t i = ((mx_byte(q, l) >> (4 * (s & 1))) & 0xfu) |
                     (((mx_byte(qh, l) >> (2 * (s & 3))) & 3u) << 4);
        mx_put_code(idx, l, (int)i);
    }
}

// ---- integer codes (IQ1/IQ2/IQ3, legacy types, K-quants, IQ4) ---------------------------------
// One 32-value weight chunk as int8 codes: value i = d[i / 16] * (int8)byte i of q + o[i / 16].
// The types with such codes decode here once, for the int8 products (matmul_q8.cu) and for the
// f32 values (mx_deq_codes): d * q (+ o) is the same float as ggml's dequantization.
struct MxQ8Chunk {
    uint32_t q[8];
    float d[2];
    float o[2];
};

// Word w of the low (HI false) or high nibbles of `qs` (16 bytes as 4 words): elements
// 4w..4w+3 of the nibble layout Q4_0 / Q4_1 / IQ4_NL / IQ4_XS share.
__device__ __forceinline__ uint32_t mx_nibbles(const uint32_t* qs, int w, bool hi) {
    return (hi ? qs[w] >> 4 : qs[w]) & 0x0f0f0f0fu;
}

// The IQ4_NL code book applied to the four nibble codes of a word.
__device__ __forceinline__ uint32_t mx_iq4nl_word(uint32_t codes) {
    uint32_t r = 0;
    MX_UNROLL
    for (int k = 0; k < 4; ++k) {
        int v = (int)mx_iq4nl_value((codes >> (8 * k)) & 0xfu);
        r |= ((uint32_t)(uint8_t)(int8_t)v) << (8 * k);
    }
    return r;
}

// Codes of BITS bits with the offset 2^(BITS-1) taken off, as signed bytes: per byte,
// (v ^ 2^(BITS-1)) sign-extended from BITS bits. The integer sums then equal the CPU's, which
// sums the signed values (q - 8, q - 16, q - 4, q - 32); an offset taken off in floats after
// the sum would cancel most of it.
template <int BITS>
__device__ __forceinline__ uint32_t mx_signed_codes(uint32_t w) {
    const uint32_t top = 0x01010101u << (BITS - 1);
    uint32_t t = w ^ top;
    // Where a byte's sign bit (top) is set, the bits above it too: top * (2^(9-BITS) - 2) is
    // those bits within the byte, so nothing carries into the next.
    return t | ((t & top) * ((0x100u >> (BITS - 1)) - 2u));
}

// Byte j of each word: the fifth bits of a Q5_0 / Q5_1 half (qh bits `base + 4w .. +4`) moved
// to bit 4 of each byte.
__device__ __forceinline__ uint32_t mx_q5_high(uint32_t qh, int base, int w) {
    uint32_t bits = (qh >> (base + 4 * w)) & 0xfu;
    return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// The 8 values of grid entry g (byte j = magnitude j) with the signs of `signs` (bit j negates
// value j) as signed bytes, into two words.
__device__ __forceinline__ void mx_grid8_codes(uint64_t g, uint32_t signs, uint32_t* w) {
    w[0] = 0;
    w[1] = 0;
    MX_UNROLL
    for (int j = 0; j < 8; ++j) {
        int v = (int)((g >> (8 * j)) & 0xffu);
        v = (signs >> j) & 1u ? -v : v;
        w[j >> 2] |= (uint32_t)(uint8_t)(int8_t)v << (8 * (j & 3));
    }
}

// The 8 values of IQ1 grid entry g (bytes -1, 0, 1) plus delta (±1/8), times 8: 8 g ± 1 as
// signed bytes, into two words (the scale takes the 1/8, exactly).
__device__ __forceinline__ void mx_iq1_codes(uint64_t g, bool neg, uint32_t* w) {
    w[0] = 0;
    w[1] = 0;
    MX_UNROLL
    for (int j = 0; j < 8; ++j) {
        int v = 8 * (int)(int8_t)(uint8_t)((g >> (8 * j)) & 0xffu) + (neg ? -1 : 1);
        w[j >> 2] |= (uint32_t)(uint8_t)(int8_t)v << (8 * (j & 3));
    }
}

template <int TY>
__device__ __forceinline__ void mx_q8_chunk(const uint8_t* row, int c, MxQ8Chunk& k) {
    const bool ik = TY == MX_T_IQ2_K || TY == MX_T_IQ3_K || TY == MX_T_IQ4_K ||
                    TY == MX_T_IQ5_K || TY == MX_T_IQ6_K || TY == MX_T_IQ2_KS ||
                    TY == MX_T_IQ3_KS || TY == MX_T_IQ4_KS || TY == MX_T_IQ5_KS ||
                    TY == MX_T_Q6_0;
    if (ik) {
        // ik_llama.cpp's types set their codes byte by byte, and have no offsets.
        MX_UNROLL
        for (int w = 0; w < 8; ++w) {
            k.q[w] = 0;
        }
        k.o[0] = k.o[1] = 0.0f;
    }
    if (TY == MX_T_Q4_0 || TY == MX_T_Q4_1 || TY == MX_T_IQ4_NL) {
        // Q4_0, 18 bytes: d, qs[16]; byte j holds element j (low nibble) and j+16; (q - 8) * d.
        // Q4_1, 20 bytes: d, m, qs[16]; q * d + m.
        // IQ4_NL, 18 bytes: d, qs[16] (nibbles as Q4_0); d * kvalues[q].
        const int size = TY == MX_T_Q4_1 ? 20 : 18;
        const int qoff = TY == MX_T_Q4_1 ? 4 : 2;
        const uint8_t* b = row + (uint64_t)c * size;
        float d = mx_ld_f16(b);
        uint32_t qs[4];
        if (TY == MX_T_Q4_1) {
            mx_load_words<4, 4>(b + qoff, qs);
        } else {
            mx_load_words<2, 4>(b + qoff, qs);
        }
        MX_UNROLL
        for (int w = 0; w < 4; ++w) {
            uint32_t lo = mx_nibbles(qs, w, false);
            uint32_t hi = mx_nibbles(qs, w, true);
            if (TY == MX_T_IQ4_NL) {
                lo = mx_iq4nl_word(lo);
                hi = mx_iq4nl_word(hi);
            } else if (TY == MX_T_Q4_0) {
                lo = mx_signed_codes<4>(lo);
                hi = mx_signed_codes<4>(hi);
            }
            k.q[w] = lo;
            k.q[4 + w] = hi;
        }
        float o = TY == MX_T_Q4_1 ? mx_ld_f16(b + 2) : 0.0f;
        k.d[0] = k.d[1] = d;
        k.o[0] = k.o[1] = o;
    } else if (TY == MX_T_Q5_0 || TY == MX_T_Q5_1) {
        // Q5_0, 22 bytes: d, qh[4] (bit j: fifth bit of element j), qs[16]; (q - 16) * d.
        // Q5_1, 24 bytes: d, m, qh[4], qs[16]; q * d + m.
        // 22 / 24 bytes: d, (Q5_1: m,) qh (bit j: fifth bit of element j), qs[16].
        const uint8_t* b = row + (uint64_t)c * (TY == MX_T_Q5_1 ? 24u : 22u);
        float d = mx_ld_f16(b);
        uint32_t qh;
        uint32_t qs[4];
        if (TY == MX_T_Q5_1) {
            qh = *(const uint32_t*)(b + 4);
            mx_load_words<8, 4>(b + 8, qs);
        } else {
            qh = mx_ld_u16(b + 2) | (mx_ld_u16(b + 4) << 16);
            mx_load_words<2, 4>(b + 6, qs);
        }
        MX_UNROLL
        for (int w = 0; w < 4; ++w) {
            uint32_t lo = mx_nibbles(qs, w, false) | mx_q5_high(qh, 0, w);
            uint32_t hi = mx_nibbles(qs, w, true) | mx_q5_high(qh, 16, w);
            k.q[w] = TY == MX_T_Q5_0 ? mx_signed_codes<5>(lo) : lo;
            k.q[4 + w] = TY == MX_T_Q5_0 ? mx_signed_codes<5>(hi) : hi;
        }
        float o = TY == MX_T_Q5_0 ? 0.0f : mx_ld_f16(b + 2);
        k.d[0] = k.d[1] = d;
        k.o[0] = k.o[1] = o;
    } else if (TY == MX_T_Q8_0) {
        // Q8_0, 34 bytes: d, qs[32] (int8); q * d.
        const uint8_t* b = row + (uint64_t)c * 34u;
        mx_load_words<2, 8>(b + 2, k.q);
        k.d[0] = k.d[1] = mx_ld_f16(b);
        k.o[0] = k.o[1] = 0.0f;
    } else if (TY == MX_T_Q2_K) {
        // Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, one per 16 values),
        // qs[64], d, dmin. Sub-block s (0..7) reads the 2-bit field 2*(s%4) of qs[32*(s/4) ..][32]
        // with scales 2s (first 16 values) and 2s+1; value d*sc * q - dmin*m.
        const uint8_t* b = row + (uint64_t)(c >> 3) * 84u;
        int s = c & 7;
        uint32_t sc = mx_ld_u16(b + 2 * s);
        uint32_t q[8];
        mx_load_words<4, 8>(b + 16 + 32 * (s >> 2), q);
        float d = mx_ld_f16(b + 80);
        float dmin = mx_ld_f16(b + 82);
        int shift = 2 * (s & 3);
        MX_UNROLL
        for (int w = 0; w < 8; ++w) {
            k.q[w] = (q[w] >> shift) & 0x03030303u;
        }
        MX_UNROLL
        for (int h = 0; h < 2; ++h) {
            uint32_t scp = (sc >> (8 * h)) & 0xffu;
            k.d[h] = MX_FMUL(d, (float)(scp & 0xfu));
            k.o[h] = -MX_FMUL(dmin, (float)(scp >> 4));
        }
    } else if (TY == MX_T_Q3_K) {
        const uint8_t* b = row + (uint64_t)(c >> 3) * 110u;
        int s = c & 7;
        uint32_t hm[8];
        uint32_t q[8];
        mx_load_words<2, 8>(b, hm);
        mx_load_words<2, 8>(b + 32 + 32 * (s >> 2), q);
        float d_all = mx_ld_f16(b + 108);
        int shift = 2 * (s & 3);
        MX_UNROLL
        for (int w = 0; w < 8; ++w) {
            k.q[w] = mx_signed_codes<3>(((q[w] >> shift) & 0x03030303u) |
                                        (((hm[w] >> s) & 0x01010101u) << 2));
        }
        MX_UNROLL
        for (int h = 0; h < 2; ++h) {
            k.d[h] = MX_FMUL(d_all, (float)mx_q3_k_scale(b + 96, 2 * s + h));
            k.o[h] = 0.0f;
        }
    } else if (TY == MX_T_Q4_K || TY == MX_T_Q5_K) {
        // Q4_K, 144 bytes: d, dmin, scales[12], qs[128]. Sub-block s: nibble s%2 of
        // qs[32*(s/2) ..][32]; value d*sc * q - dmin*m.
        // Q5_K, 176 bytes: d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus bit s of qh[l] as
        // the fifth bit (16).
        const bool q5 = TY == MX_T_Q5_K;
        const uint8_t* b = row + (uint64_t)(c >> 3) * (q5 ? 176u : 144u);
        int s = c & 7;
        float d = mx_ld_f16(b);
        float dmin = mx_ld_f16(b + 2);
        uint32_t sc, mn;
        mx_scale_min_k4(b + 4, s, &sc, &mn);
        uint32_t q[8];
        mx_load_words<16, 8>(b + (q5 ? 48 : 16) + 32 * (s >> 1), q);
        int shift = 4 * (s & 1);
        MX_UNROLL
        for (int w = 0; w < 8; ++w) {
            k.q[w] = (q[w] >> shift) & 0x0f0f0f0fu;
        }
        if (q5) {
            uint32_t qh[8];
            mx_load_words<16, 8>(b + 16, qh);
            MX_UNROLL
            for (int w = 0; w < 8; ++w) {
                k.q[w] |= ((qh[w] >> s) & 0x01010101u) << 4;
            }
        }
        k.d[0] = k.d[1] = MX_FMUL(d, (float)sc);
        k.o[0] = k.o[1] = -MX_FMUL(dmin, (float)mn);
    } else if (TY == MX_T_Q6_K) {
        // Q6_K, 210 bytes: ql[128], qh[64], scales[16] (int8, one per 16 values), d. Sub-block s of
        // half h = s/4, k = s%4: low 4 bits are nibble k/2 of ql[64h + 32(k%2) ..][32], high 2 bits
        // are field 2k of qh[32h ..][32]; value d*scale * (q - 32).
        const uint8_t* b = row + (uint64_t)(c >> 3) * 210u;
        int s = c & 7;
        int h = s >> 2;
        int kk = s & 3;
        uint32_t ql[8];
        uint32_t qh[8];
        mx_load_words<2, 8>(b + 64 * h + 32 * (kk & 1), ql);
        mx_load_words<2, 8>(b + 128 + 32 * h, qh);
        uint32_t sc = mx_ld_u16(b + 192 + 2 * s);
        float d = mx_ld_f16(b + 208);
        int lshift = 4 * (kk >> 1);
        int hshift = 2 * kk;
        MX_UNROLL
        for (int w = 0; w < 8; ++w) {
            k.q[w] = mx_signed_codes<6>(((ql[w] >> lshift) & 0x0f0f0f0fu) |
                                        (((qh[w] >> hshift) & 0x03030303u) << 4));
        }
        MX_UNROLL
        for (int p = 0; p < 2; ++p) {
            k.d[p] = MX_FMUL(d, (float)(int8_t)(uint8_t)((sc >> (8 * p)) & 0xffu));
            k.o[p] = 0.0f;
        }
    } else if (TY == MX_T_IQ2_XXS) {
        // IQ2_XXS, 66 bytes: d, then per 32 values two u32: 4 grid indices (bytes of the first) and
        // 4 x 7 sign bits (ksigns_iq2xs) with ls in the top 4 bits (the second).
        const uint8_t* b = row + (uint64_t)(c >> 3) * 66u;
        int ib = c & 7;
        uint32_t w[2];
        mx_load_words<2, 2>(b + 2 + 8 * ib, w);
        k.d[0] = k.d[1] = mx_grid_db(mx_ld_f16(b), w[1] >> 28, 0.25f);
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            mx_grid8_codes(mx_iq2xxs_grid[mx_byte(w, l)],
                           mx_ksigns_iq2xs[(w[1] >> (7 * l)) & 127u], k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ2_XS) {
        // IQ2_XS, 74 bytes: d, qs[32] u16 (9-bit grid index, 7 sign bits), scales[8] (low nibble:
        // the first 16 of a 32, high nibble: the last 16).
        const uint8_t* b = row + (uint64_t)(c >> 3) * 74u;
        int ib = c & 7;
        float d = mx_ld_f16(b);
        uint32_t w[2];
        mx_load_words<2, 2>(b + 2 + 8 * ib, w);
        uint32_t sc = b[66 + ib];
        k.d[0] = mx_grid_db(d, sc & 15u, 0.25f);
        k.d[1] = mx_grid_db(d, sc >> 4, 0.25f);
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            uint32_t q = (w[l >> 1] >> (16 * (l & 1))) & 0xffffu;
            mx_grid8_codes(mx_iq2xs_grid[q & 511u], mx_ksigns_iq2xs[q >> 9], k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ2_S) {
        // IQ2_S, 82 bytes: d, qs[32] (grid index low bytes), signs[32] (8 explicit bits per 8),
        // qh[8] (bits 2l..2l+1: index bits 8..9 of group l), scales[8] as IQ2_XS.
        const uint8_t* b = row + (uint64_t)(c >> 3) * 82u;
        int ib = c & 7;
        float d = mx_ld_f16(b);
        uint32_t qs[1], sg[1];
        mx_load_words<2, 1>(b + 2 + 4 * ib, qs);
        mx_load_words<2, 1>(b + 34 + 4 * ib, sg);
        uint32_t qh = b[66 + ib];
        uint32_t sc = b[74 + ib];
        k.d[0] = mx_grid_db(d, sc & 15u, 0.25f);
        k.d[1] = mx_grid_db(d, sc >> 4, 0.25f);
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            uint32_t idx = mx_byte(qs, l) | ((qh << (8 - 2 * l)) & 0x300u);
            mx_grid8_codes(mx_iq2s_grid[idx], mx_byte(sg, l), k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ3_XXS) {
        // IQ3_XXS, 98 bytes: d, qs[64] (per 8 values two indices of 4-value entries), then per 32 one
        // u32 of 4 x 7 sign bits with ls on top.
        const uint8_t* b = row + (uint64_t)(c >> 3) * 98u;
        int ib = c & 7;
        uint32_t qs[2], aux[1];
        mx_load_words<2, 2>(b + 2 + 8 * ib, qs);
        mx_load_words<2, 1>(b + 66 + 4 * ib, aux);
        k.d[0] = k.d[1] = mx_grid_db(mx_ld_f16(b), aux[0] >> 28, 0.5f);
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            uint64_t g = (uint64_t)mx_iq3xxs_grid[mx_byte(qs, 2 * l)] |
                         ((uint64_t)mx_iq3xxs_grid[mx_byte(qs, 2 * l + 1)] << 32);
            mx_grid8_codes(g, mx_ksigns_iq2xs[(aux[0] >> (7 * l)) & 127u], k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ3_S) {
        // IQ3_S, 110 bytes: d, qs[64] (grid index low bytes, two 4-value entries per 8 values), qh[8]
        // (bit k: index bit 8 of entry k of its 32), signs[32] (8 explicit bits per 8), scales[4]
        // (a nibble per 32); db = d * (1 + 2 ls).
        const uint8_t* b = row + (uint64_t)(c >> 3) * 110u;
        int ib = c & 7;
        uint32_t qs[2], sg[1];
        mx_load_words<2, 2>(b + 2 + 8 * ib, qs);
        mx_load_words<2, 1>(b + 74 + 4 * ib, sg);
        uint32_t qh = b[66 + ib];
        uint32_t ls = ((uint32_t)b[106 + (ib >> 1)] >> (4 * (ib & 1))) & 0xfu;
        k.d[0] = k.d[1] = MX_FMUL(mx_ld_f16(b), (float)(int)(1 + 2 * ls));
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            uint32_t i1 = mx_byte(qs, 2 * l) | ((qh << (8 - 2 * l)) & 256u);
            uint32_t i2 = mx_byte(qs, 2 * l + 1) | ((qh << (7 - 2 * l)) & 256u);
            uint64_t g = (uint64_t)mx_iq3s_grid[i1] | ((uint64_t)mx_iq3s_grid[i2] << 32);
            mx_grid8_codes(g, mx_byte(sg, l), k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ1_S) {
        // IQ1_S, 50 bytes: d, qs[32] (grid index low bytes), qh[8] u16 per 32 (bits 3l..3l+2: index
        // bits 8..10 of group l, 12..14: ls, 15: delta sign); dl = d * (2 ls + 1), delta ±1/8.
        const uint8_t* b = row + (uint64_t)(c >> 3) * 50u;
        int ib = c & 7;
        uint32_t qs[1];
        mx_load_words<2, 1>(b + 2 + 4 * ib, qs);
        uint32_t qh = mx_ld_u16(b + 34 + 2 * ib);
        float dl = MX_FMUL(mx_ld_f16(b), (float)(int)(2 * ((qh >> 12) & 7u) + 1));
        k.d[0] = k.d[1] = MX_FMUL(dl, 0.125f);
        k.o[0] = k.o[1] = 0.0f;
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            uint32_t idx = mx_byte(qs, l) | (((qh >> (3 * l)) & 7u) << 8);
            mx_iq1_codes(mx_iq1s_grid[idx], (qh & 0x8000u) != 0, k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ1_M) {
        // IQ1_M, 56 bytes: qs[32], qh[16] (a nibble per group of 8: index bits 8..10, delta sign),
        // scales[8] (4 u16: 3-bit scales per 16 values; the top nibbles of the four words are the
        // f16 d).
        const uint8_t* b = row + (uint64_t)(c >> 3) * 56u;
        int ib = c & 7;
        uint32_t sc0 = mx_ld_u16(b + 48), sc1 = mx_ld_u16(b + 50);
        uint32_t sc2 = mx_ld_u16(b + 52), sc3 = mx_ld_u16(b + 54);
        uint32_t dbits =
            (sc0 >> 12) | ((sc1 >> 8) & 0x00f0u) | ((sc2 >> 4) & 0x0f00u) | (sc3 & 0xf000u);
        float d = mx_f16_to_f32((uint16_t)dbits);
        uint32_t sc = mx_ld_u16(b + 48 + 2 * (ib >> 1));
        float dl1 = MX_FMUL(d, (float)(int)(2 * ((sc >> (6 * (ib & 1))) & 7u) + 1));
        float dl2 = MX_FMUL(d, (float)(int)(2 * ((sc >> (6 * (ib & 1) + 3)) & 7u) + 1));
        k.d[0] = MX_FMUL(dl1, 0.125f);
        k.d[1] = MX_FMUL(dl2, 0.125f);
        k.o[0] = k.o[1] = 0.0f;
        uint32_t qs[1];
        mx_load_words<4, 1>(b + 4 * ib, qs);
        uint32_t qh0 = b[32 + 2 * ib], qh1 = b[33 + 2 * ib];
        uint32_t idx[4] = {mx_byte(qs, 0) | ((qh0 << 8) & 0x700u),
                           mx_byte(qs, 1) | ((qh0 << 4) & 0x700u),
                           mx_byte(qs, 2) | ((qh1 << 8) & 0x700u),
                           mx_byte(qs, 3) | ((qh1 << 4) & 0x700u)};
        uint32_t neg[4] = {qh0 & 0x08u, qh0 & 0x80u, qh1 & 0x08u, qh1 & 0x80u};
        MX_UNROLL
        for (int l = 0; l < 4; ++l) {
            mx_iq1_codes(mx_iq1s_grid[idx[l]], neg[l] != 0, k.q + 2 * l);
        }
    } else if (TY == MX_T_IQ4_XS) {
        // IQ4_XS, 136 bytes: d, scales_h (u16), scales_l[4], qs[128]. Sub-block s: 6-bit scale
        // ls = nibble s%2 of scales_l[s/2] | bits 2s..2s+1 of scales_h << 4, qs[16s ..][16] as
        // IQ4_NL; value d*(ls - 32) * kvalues[q].
        const uint8_t* b = row + (uint64_t)(c >> 3) * 136u;
        int s = c & 7;
        float d = mx_ld_f16(b);
        uint32_t sh = mx_ld_u16(b + 2);
        uint32_t sl = b[4 + (s >> 1)];
        int ls = (int)(((sl >> (4 * (s & 1))) & 0xfu) | (((sh >> (2 * s)) & 3u) << 4));
        uint32_t qs[4];
        mx_load_words<8, 4>(b + 8 + 16 * s, qs);
        MX_UNROLL
        for (int w = 0; w < 4; ++w) {
            k.q[w] = mx_iq4nl_word(mx_nibbles(qs, w, false));
            k.q[4 + w] = mx_iq4nl_word(mx_nibbles(qs, w, true));
        }
        k.d[0] = k.d[1] = MX_FMUL(d, (float)(ls - 32));
        k.o[0] = k.o[1] = 0.0f;
    } else if (TY == MX_T_IQ2_K) {
        // IQ2_K, 76 bytes: d, extra (u16), scales[8] (a nibble per 16 values, minus 8),
        // qs[64].
        const uint8_t* b = row + (uint64_t)(c >> 3) * 76u;
        int s = c & 7;
        float d = mx_ld_f16(b);
        uint32_t extra = mx_ld_u16(b + 2) >> (2 * s);
        uint32_t sc = b[4 + s];
        uint32_t q[8];
        mx_load_words<4, 8>(b + 12 + 32 * (s >> 2), q);
        MX_UNROLL
        for (int part = 0; part < 2; ++part) {
            k.d[part] = MX_FMUL(d, (float)((int)((sc >> (4 * part)) & 0xfu) - 8));
            mx_iq2k_codes<16>(q, s, 16 * part, (extra >> part) & 1u, k.q);
        }
    } else if (TY == MX_T_IQ3_K) {
        // IQ3_K, 110 bytes: d, extra, signs (u16: bit g negates group g's scale), scales[8] (a
        // nibble s per 16 values: 2s + 1), qs[64], qh[32].
        const uint8_t* b = row + (uint64_t)(c >> 3) * 110u;
        int s = c & 7;
        float d = mx_ld_f16(b);
        uint32_t extra = mx_ld_u16(b + 2) >> (2 * s);
        uint32_t signs = mx_ld_u16(b + 4) >> (2 * s);
        uint32_t sc = b[6 + s];
        uint32_t q[8];
        uint32_t qh[8];
        mx_load_words<2, 8>(b + 14 + 32 * (s >> 2), q);
        mx_load_words<2, 8>(b + 78, qh);
        MX_UNROLL
        for (int part = 0; part < 2; ++part) {
            int v = 2 * (int)((sc >> (4 * part)) & 0xfu) + 1;
            k.d[part] = MX_FMUL(d, (float)((signs >> part) & 1u ? -v : v));
            mx_iq3k_codes<16>(q, qh, s, 16 * part, (extra >> part) & 1u, k.q);
        }
    } else if (TY == MX_T_IQ4_K) {
        // IQ4_K, 144 bytes: d, extra, scales_h[4], scales_l[8], qs[128].
        const uint8_t* b = row + (uint64_t)(c >> 3) * 144u;
        int s = c & 7;
        float d = mx_ld_f16(b);
        uint32_t extra = mx_ld_u16(b + 2) >> (2 * s);
        uint32_t q[4];
        mx_load_words<16, 4>(b + 16 + 16 * s, q);
        MX_UNROLL
        for (int part = 0; part < 2; ++part) {
            k.d[part] = MX_FMUL(d, (float)mx_iqk_scale6(b, 2 * s + part));
            mx_iq4k_codes<16>(q, 16 * part, (extra >> part) & 1u, k.q);
        }
    } else if (TY == MX_T_IQ5_K) {
        // IQ5_K, 176 bytes: as IQ4_K, then qh[32].
        const uint8_t* b = row + (uint64_t)(c >> 3) * 176u;
        int s = c & 7;
        float d = mx_ld_f16(b);
        uint32_t extra = mx_ld_u16(b + 2) >> (2 * s);
        uint32_t q[8];
        uint32_t qh[8];
        mx_load_words<16, 8>(b + 16 + 32 * (s >> 1), q);
        mx_load_words<16, 8>(b + 144, qh);
        MX_UNROLL
        for (int part = 0; part < 2; ++part) {
            k.d[part] = MX_FMUL(d, (float)mx_iqk_scale6(b, 2 * s + part));
            mx_iq5k_codes<16>(q, qh, s, 16 * part, (extra >> part) & 1u, k.q);
        }
    } else if (TY == MX_T_IQ6_K) {
        // IQ6_K: the codes of its book (what the CPU's dot products sum), not the cubic its
        // f32 values take (mx_deq_iq6_k).
        uint32_t idx[8];
        uint32_t hi[2];
        mx_iq6k_chunk(row, c, idx, k.d, hi);
        MX_UNROLL
        for (int l = 0; l < 32; ++l) {
            mx_put_code(k.q, l, mx_iq6nl_values[mx_byte(idx, l) + 64u * hi[l >> 4]]);
        }
    } else if (TY == MX_T_IQ2_KS) {
        // IQ2_KS, an f16 d before the row's blocks of 70 bytes: extra (u16: bit s picks the
        // upper half for sub-block s, bit 8+s tops its scale), scales[4] (a nibble per 32
        // values), qs[64]. Scale: nibble | top bit << 4, minus 16.
        float d = mx_ld_f16(row);
        const uint8_t* b = row + 2 + (uint64_t)(c >> 3) * 70u;
        int s = c & 7;
        uint32_t extra = mx_ld_u16(b);
        uint32_t nib = ((uint32_t)b[2 + (s >> 1)] >> (4 * (s & 1))) & 0xfu;
        k.d[0] = k.d[1] = MX_FMUL(d, (float)((int)(nib | (((extra >> (8 + s)) & 1u) << 4)) - 16));
        uint32_t q[8];
        mx_load_words<2, 8>(b + 6 + 32 * (s >> 2), q);
        mx_iq2k_codes<32>(q, s, 0, (extra >> s) & 1u, k.q);
    } else if (TY == MX_T_IQ3_KS) {
        // IQ3_KS, an f16 d before the row's blocks of 102 bytes: extra (u16: bit s tops
        // sub-block s's scale, bit 8+s picks its upper half), scales[4] (nibble s/4 of byte
        // s%4), qs[64], qh[32].
        float d = mx_ld_f16(row);
        const uint8_t* b = row + 2 + (uint64_t)(c >> 3) * 102u;
        int s = c & 7;
        uint32_t extra = mx_ld_u16(b);
        uint32_t nib = ((uint32_t)b[2 + (s & 3)] >> (4 * (s >> 2))) & 0xfu;
        k.d[0] = k.d[1] = MX_FMUL(d, (float)((int)(nib | (((extra >> s) & 1u) << 4)) - 16));
        uint32_t q[8];
        uint32_t qh[8];
        mx_load_words<2, 8>(b + 6 + 32 * (s >> 2), q);
        mx_load_words<2, 8>(b + 70, qh);
        mx_iq3k_codes<32>(q, qh, s, 0, (extra >> (8 + s)) & 1u, k.q);
    } else if (TY == MX_T_IQ4_KS) {
        // IQ4_KS, an f32 d before the row's blocks of 136 bytes: scales[8] (bits 1..7 minus
        // 127, bit 0 picks the upper half), qs[128].
        float d = mx_ld_f32(row);
        const uint8_t* b = row + 4 + (uint64_t)(c >> 3) * 136u;
        int s = c & 7;
        uint32_t sc = b[s];
        k.d[0] = k.d[1] = MX_FMUL(d, (float)((int)(sc & 254u) - 127));
        uint32_t q[4];
        mx_load_words<4, 4>(b + 8 + 16 * s, q);
        mx_iq4k_codes<32>(q, 0, sc & 1u, k.q);
    } else if (TY == MX_T_IQ5_KS) {
        // IQ5_KS, an f32 d before the row's blocks of 168 bytes: scales[8] as IQ4_KS,
        // qs[128], qh[32].
        float d = mx_ld_f32(row);
        const uint8_t* b = row + 4 + (uint64_t)(c >> 3) * 168u;
        int s = c & 7;
        uint32_t sc = b[s];
        k.d[0] = k.d[1] = MX_FMUL(d, (float)((int)(sc & 254u) - 127));
        uint32_t q[8];
        uint32_t qh[8];
        mx_load_words<4, 8>(b + 8 + 32 * (s >> 1), q);
        mx_load_words<4, 8>(b + 136, qh);
        mx_iq5k_codes<32>(q, qh, s, 0, sc & 1u, k.q);
    } else if (TY == MX_T_Q6_0) {
        // Q6_0, 26 bytes (32 values): d, qh[8], qs[16]. Element j < 16: low nibble of qs[j]
        // with bits 4(j/8) .. 4(j/8)+1 of qh[j%8] on top; element j+16: the high nibble with
        // the next two bits; (q - 32) * d.
        const uint8_t* b = row + (uint64_t)c * 26u;
        k.d[0] = k.d[1] = mx_ld_f16(b);
        uint32_t qh[2];
        uint32_t q[4];
        mx_load_words<2, 2>(b + 2, qh);
        mx_load_words<2, 4>(b + 10, q);
        MX_UNROLL
        for (int j = 0; j < 16; ++j) {
            uint32_t v = mx_byte(q, j);
            uint32_t h = mx_byte(qh, j & 7) >> (4 * (j >> 3));
            mx_put_code(k.q, j, (int)((v & 0xfu) | ((h & 3u) << 4)) - 32);
            mx_put_code(k.q, j + 16, (int)((v >> 4) | (((h >> 2) & 3u) << 4)) - 32);
        }
    }
}

// Chunk c of a row of a type with integer codes as f32: d * q, plus the offset for the types
// that have one (their mins; adding a zero offset would turn ggml's -0.0 into +0.0).
template <int TY>
__device__ __forceinline__ void mx_deq_codes(const uint8_t* row, int c, float* out) {
    const bool offsets = TY == MX_T_Q4_1 || TY == MX_T_Q5_1 || TY == MX_T_Q2_K ||
                         TY == MX_T_Q4_K || TY == MX_T_Q5_K;
    MxQ8Chunk k;
    mx_q8_chunk<TY>(row, c, k);
    MX_UNROLL
    for (int i = 0; i < 32; ++i) {
        float v = MX_FMUL(k.d[i >> 4], (float)(int8_t)(uint8_t)mx_byte(k.q, i));
        out[i] = offsets ? MX_FADD(v, k.o[i >> 4]) : v;
    }
}

// IQ6_K's value for a 6-bit index q: ik_llama.cpp's cubic A + q (B + q (-C + q D)) with fused
// multiply-adds, as moxie-quant's iq6k_curve (and ik's x86 build) evaluates it.
__device__ __forceinline__ float mx_iq6k_curve(float q) {
    return fmaf(q, fmaf(q, fmaf(q, 0.0011972f, -0.11218f), 6.2568f), -127.0f);
}

// IQ6_K's f32 values: (d * scale) * (curve(index) + extra bit) (mx_iq6k_chunk).
__device__ __forceinline__ void mx_deq_iq6_k(const uint8_t* row, int c, float* out) {
    uint32_t idx[8];
    float dl[2];
    uint32_t hi[2];
    mx_iq6k_chunk(row, c, idx, dl, hi);
    MX_UNROLL
    for (int l = 0; l < 32; ++l) {
        float m = (float)hi[l >> 4];
        out[l] = MX_FMUL(dl[l >> 4], MX_FADD(mx_iq6k_curve((float)mx_byte(idx, l)), m));
    }
}

// ---- dispatch --------------------------------------------------------------------------

// Chunk c of a row (elements 32c .. 32c+31) of type TY into out[32]; TY is a constant, so
// the branches fold away.
template <int TY>
__device__ __forceinline__ void mx_dequant_chunk(const uint8_t* row, int c, float* out) {
    if (TY == MX_T_F32) {
        mx_deq_f32(row, c, out);
    } else if (TY == MX_T_F16) {
        mx_deq_f16(row, c, out);
    } else if (TY == MX_T_BF16) {
        mx_deq_bf16(row, c, out);
    } else if (TY == MX_T_Q4_0) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q4_1) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q5_0) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q5_1) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q8_0) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q2_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q3_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q4_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q5_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q6_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ4_NL) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ4_XS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ2_XXS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ2_XS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ2_S) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ3_XXS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ3_S) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ1_S) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ1_M) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ2_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ3_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ4_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ5_K) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ6_K) {
        mx_deq_iq6_k(row, c, out);
    } else if (TY == MX_T_IQ2_KS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ3_KS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ4_KS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_IQ5_KS) {
        mx_deq_codes<TY>(row, c, out);
    } else if (TY == MX_T_Q6_0) {
        mx_deq_codes<TY>(row, c, out);
    }
}
