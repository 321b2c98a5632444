// Generator of tests/data/imatrix_golden.bin: llama-quantize's quantizers given an importance
// matrix (ggml-quants.c `quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`), run by
// ggml's own code on random rows and weights.
//
// ggml-quants.c is built as ggml-base is (no -march, so no FMA contraction):
// (L = path to llama.cpp's ggml directory at the reference commit)
//   gcc -O2 -std=gnu11 -c -I$L/include -I$L/src $L/src/ggml-quants.c -o base.o
//   gcc -O2 -std=gnu11 -I$L/include gen_imatrix_golden.c base.o -lm -o gen_imatrix
//   ./gen_imatrix imatrix_golden.bin
//
// File format: sections until end of file, little-endian:
//   u32 type id, u32 n_per_row, u32 nrow, f32 x[nrow * n_per_row], f32 qw[n_per_row],
//   quantized bytes of quantize_<type>(x, nrow, n_per_row, qw).
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "ggml.h"

void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) { (void)level; (void)fmt; }
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[256];
float ggml_table_f32_ue4m3[256];

typedef size_t (*qc_t)(const float * src, void * dst, int64_t nrow, int64_t n_per_row, const float * imatrix);
size_t quantize_q4_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q4_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q5_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q8_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q2_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q3_K(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q4_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_K(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q6_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_iq4_nl(const float*, void*, int64_t, int64_t, const float*); size_t quantize_iq4_xs(const float*, void*, int64_t, int64_t, const float*);

static struct { int id; int bs; int ts; qc_t qc; } T[] = {
    {2, 32, 18, quantize_q4_0}, {3, 32, 20, quantize_q4_1}, {6, 32, 22, quantize_q5_0}, {7, 32, 24, quantize_q5_1},
    {8, 32, 34, quantize_q8_0}, {10, 256, 84, quantize_q2_K}, {11, 256, 110, quantize_q3_K}, {12, 256, 144, quantize_q4_K},
    {13, 256, 176, quantize_q5_K}, {14, 256, 210, quantize_q6_K}, {20, 32, 18, quantize_iq4_nl}, {23, 256, 136, quantize_iq4_xs},
};

// the quantizers' row_size bookkeeping
size_t ggml_type_size(enum ggml_type type) {
    for (size_t i = 0; i < sizeof(T)/sizeof(T[0]); i++) if (T[i].id == (int)type) return T[i].ts;
    abort();
}
int64_t ggml_blck_size(enum ggml_type type) {
    for (size_t i = 0; i < sizeof(T)/sizeof(T[0]); i++) if (T[i].id == (int)type) return T[i].bs;
    abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { return ggml_type_size(type) * ne / ggml_blck_size(type); }
const char * ggml_type_name(enum ggml_type type) { (void)type; return ""; }

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t xr(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)(rs >> 16); }
static float frand(void) { return (xr() / 4294967296.0f) * 2.0f - 1.0f; }

int main(int argc, char ** argv) {
    // ggml's fp16 -> fp32 table, as ggml_init fills it
    for (int i = 0; i < 65536; i++) { uint32_t w = (uint32_t)i << 16; uint32_t sign = w & 0x80000000u; uint32_t two_w = w + w; float nv; uint32_t b = (two_w >> 4) + (0xE0u << 23); memcpy(&nv, &b, 4); nv *= 0x1.0p-112f; float dv; uint32_t b2 = (two_w >> 17) | (126u << 23); memcpy(&dv, &b2, 4); dv -= 0.5f; uint32_t r; if (two_w < (1u << 27)) memcpy(&r, &dv, 4); else memcpy(&r, &nv, 4); r |= sign; memcpy(&ggml_table_f32_f16[i], &r, 4); }
    if (argc < 2) { fprintf(stderr, "usage: %s OUT.bin\n", argv[0]); return 1; }
    FILE * f = fopen(argv[1], "wb");
    const int ntypes = sizeof(T)/sizeof(T[0]);
    for (int rep = 0; rep < 3; rep++)
    for (int t = 0; t < ntypes; t++) {
        // rep 0: one super-block per row; 1: several; 2: many blocks with skewed weights
        const int n = T[t].bs == 32 ? (rep == 0 ? 64 : rep == 1 ? 288 : 512) : (rep == 0 ? 256 : rep == 1 ? 512 : 1024);
        const int nrow = rep == 2 ? 3 : 2;
        float * x = malloc(sizeof(float) * n * nrow);
        float * qw = malloc(sizeof(float) * n);
        for (int i = 0; i < n * nrow; i++) x[i] = frand() * (1 + (i % 7)) * (rep == 2 ? 0.02f : 1.0f);
        // an all-zero block, one with a single value, one with small integers, one positive-only
        for (int i = 0; i < 32; i++) x[i] = 0;
        for (int i = 32; i < 64; i++) x[i] = i == 40 ? 3.0f : 0;
        if (n > 96) for (int i = 64; i < 96; i++) x[i] = (i % 5) - 2.0f;
        if (n > 128) for (int i = 96; i < 128; i++) x[i] = fabsf(x[i]) + 0.5f;
        // importance weights: positive, spread over decades, some zero (experts that saw no tokens)
        for (int i = 0; i < n; i++) { float u = (frand() + 1.0f) * 0.5f; qw[i] = rep == 2 ? expf(8.0f * u - 4.0f) : u * u * 4.0f; }
        for (int i = 0; i < n; i += 37) qw[i] = 0;
        if (rep == 1) for (int i = n - 32; i < n; i++) qw[i] = 0;
        const int nb = n / T[t].bs;
        uint8_t * q = malloc((size_t)nb * T[t].ts * nrow);
        T[t].qc(x, q, nrow, n, qw);
        uint32_t hdr[3] = {T[t].id, n, nrow};
        fwrite(hdr, 4, 3, f); fwrite(x, 4, (size_t)n * nrow, f); fwrite(qw, 4, n, f); fwrite(q, 1, (size_t)nb * T[t].ts * nrow, f);
        free(x); free(qw); free(q);
    }
    fclose(f);
    return 0;
}
