// Products with int8 activations (llama.cpp's MMVQ scheme): the activations are quantized to
// int8 per 32 values (`quantize_q8x`), each weight chunk is unpacked once to 32 int8 codes
// with a scale and an offset per 16 values (`mx_q8_chunk`), and every token's chunk product
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
// magnitudes, IQ1's 8 x (grid + delta), Q4_K's 0..15 with its min as the offset), so the integer sums are the CPU's; the scale and offset are the float terms the
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

// One 32-value weight chunk as int8 codes: value i = d[i / 16] * (int8)byte i of q + o[i / 16].
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
    if (TY == MX_T_Q4_0 || TY == MX_T_Q4_1 || TY == MX_T_IQ4_NL) {
        // 18 / 20 / 18 bytes: d, (Q4_1: m,) qs[16]; low nibbles are elements 0..15.
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
        const uint8_t* b = row + (uint64_t)c * 34u;
        mx_load_words<2, 8>(b + 2, k.q);
        k.d[0] = k.d[1] = mx_ld_f16(b);
        k.o[0] = k.o[1] = 0.0f;
    } else if (TY == MX_T_Q2_K) {
        // As mx_deq_q2_k: 2-bit codes, scale and min per 16.
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
        // As mx_deq_q3_k: the 2-bit field plus 4 where the hmask bit is set, less 4.
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
        // As mx_deq_q6_k: codes 0..63, less 32.
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
        // As mx_deq_iq2_xxs: the grid magnitudes with their signs, db per 32.
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
        // As mx_deq_iq1_s: dl * (g + delta) = (dl / 8) * (8 g ± 1).
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
        // As mx_deq_iq1_m: a scale per 16, the delta's sign per 8.
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
    }
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
    float v = m.x * (k.d[0] * (float)s0 + k.d[1] * (float)s1);
    return v + (k.o[0] * m.y + k.o[1] * m.z);
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
        // nt is the same for every thread of the grid: these shuffles are converged.
        MX_UNROLL
        for (int k = 0; k < MX_MM_TOK; ++k) {
            if (k < nt) {
                float s = mx_warp_sum(acc[k]);
                if (live && lane == 0) {
                    y[(long long)(t0 + k) * ldy + b * y_batch + r] = s;
                }
            }
        }
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
    // The expert whose chunks hold this one: the last e with chunk_start[e] <= chunk.
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
    int e = lo;
    bool live = r < n_out && chunk < chunk_start[n_mat];
    int first = live ? offsets[e] + (int)(chunk - chunk_start[e]) * MX_MM_TOK : 0;
    int nt = live ? min(MX_MM_TOK, offsets[e + 1] - first) : 0;
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

#define MX_MATMUL_Q8_KERNELS(name, TY)                                                         \
    extern "C" __global__ void mul_mat_q8_##name(                                              \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_batch, const int8_t* qs, const float4* meta, float* y, int ldy,        \
        int y_batch, int n_tok) {                                                              \
        mx_mul_mat_q8<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_batch, qs, meta, y, ldy,     \
                          y_batch, n_tok);                                                     \
    }                                                                                          \
    extern "C" __global__ void mul_mat_id_q8_##name(                                           \
        const uint8_t* w, unsigned long long row_bytes, unsigned long long mat_bytes, int n_in, \
        int n_out, int n_mat, const int* ids, int n_ids, const int8_t* qs, const float4* meta,  \
        int x_div, float* y, int ldy) {                                                        \
        mx_mul_mat_id_q8<TY>(w, row_bytes, mat_bytes, n_in, n_out, n_mat, ids, n_ids, qs,      \
                             meta, x_div, y, ldy);                                             \
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
