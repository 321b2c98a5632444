// Generator of tests/data/ggml_golden.bin: runs ggml's own C kernels on random inputs.
//
// The golden logits were made by llama-cpp-python 0.3.36 built with GCC 12 and -march=native
// on an Intel Sapphire-Rapids-class Xeon. GCC's FMA contraction and auto-vectorisation of the
// few scalar float statements in ggml's kernels depend on the -march tuning, so the ggml-cpu
// parts are built for that machine explicitly (the binary also runs on AMD Zen 4):
// (L = path to llama.cpp's ggml directory at the reference commit)
//   gcc -O2 -std=gnu11 -c -I$L/include -I$L/src $L/src/ggml-quants.c -o base.o        # as ggml-base
//   gcc -O3 -march=sapphirerapids -mno-avxvnni -std=gnu11 -c -I$L/include -I$L/src \
//       -I$L/src/ggml-cpu $L/src/ggml-cpu/arch/x86/quants.c -o x86.o                    # as ggml-cpu
//   g++ -O3 -march=sapphirerapids -mno-avxvnni -std=gnu++17 -c -I$L/include -I$L/src \
//       -I$L/src/ggml-cpu $L/src/ggml-cpu/vec.cpp -o vec.o                               # as ggml-cpu
//   gcc -O2 -std=gnu11 -c -I$L/include -I$L/src -I$L/src/ggml-cpu \
//       $L/src/ggml-cpu/quants.c -o generic.o   # generic kernels; NOT -march=native: GCC 12
//                                               # -O3 -march=native miscompiles the generic q5_0 dot
//   g++ -O3 -march=haswell -std=gnu++17 -c -I$L/include -I$L/src -I$L/src/ggml-cpu \
//       $L/src/ggml-cpu/vec.cpp -o vec_avx2.o                                            # AVX2-only
//   nm --defined-only -g vec_avx2.o | awk '{print $3" avx2_"$3}' > redef.txt
//   objcopy --redefine-syms=redef.txt vec_avx2.o vec_avx2r.o
//   gcc -O2 -march=native -std=gnu11 -I$L/include gen_golden.c base.o x86.o generic.o vec.o \
//       vec_avx2r.o -lm -lstdc++ -no-pie -o gen
//   ./gen ggml_golden.bin
// Needs an x86-64 CPU with AVX-512 F/BW/VL/VNNI (made on an AMD EPYC Zen 4). Zen 4 lacks
// AVX-VNNI, whose VEX encoding GCC picks for -march=sapphirerapids' 256-bit dpbusd: add
// -mno-avxvnni to the two -march=sapphirerapids lines there (the EVEX AVX512-VNNI instruction
// computes the same integers; the floating-point code is unchanged).
//
// File format: sections until end of file (2 x 16 quantized, then F32/F16/BF16, then 2 x 3 IQ
// types without a weight quantizer), little-endian:
//   u32 type id (bit 8 set: x86 dot from the AVX2-only vec.cpp build; bit 9 set: no weight
//   quantization bytes at the end), u32 n,
//   weight bytes (random raw blocks, finite scales), f32 x[n],
//   activation bytes (ggml-cpu x86 quantize_row_q8_0/q8_1/q8_K of x), f32 dequantized weights[n],
//   f32 x86 vec_dot, f32 generic vec_dot, weight bytes of quantize_<type>(x, imatrix = NULL)
//   (not for the IQ2/IQ3 code-book types: their quantizers need an importance matrix).
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdarg.h>
#include "ggml.h"
#include <immintrin.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) {}
float ggml_table_f32_f16[1 << 16];
// x86 cpu
void quantize_row_q8_0(const float * x, void * y, int64_t k);
void quantize_row_q8_1(const float * x, void * y, int64_t k);
void quantize_row_q8_K(const float * x, void * y, int64_t k);
#define VD(name) void name(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
VD(ggml_vec_dot_q4_0_q8_0) VD(ggml_vec_dot_q4_1_q8_1) VD(ggml_vec_dot_q5_0_q8_0) VD(ggml_vec_dot_q5_1_q8_1) VD(ggml_vec_dot_q8_0_q8_0)
VD(ggml_vec_dot_q2_K_q8_K) VD(ggml_vec_dot_q3_K_q8_K) VD(ggml_vec_dot_q4_K_q8_K) VD(ggml_vec_dot_q5_K_q8_K) VD(ggml_vec_dot_q6_K_q8_K)
VD(ggml_vec_dot_iq4_nl_q8_0) VD(ggml_vec_dot_iq4_xs_q8_K)
VD(ggml_vec_dot_q4_0_q8_0_generic) VD(ggml_vec_dot_q4_1_q8_1_generic) VD(ggml_vec_dot_q5_0_q8_0_generic) VD(ggml_vec_dot_q5_1_q8_1_generic) VD(ggml_vec_dot_q8_0_q8_0_generic)
VD(ggml_vec_dot_q2_K_q8_K_generic) VD(ggml_vec_dot_q3_K_q8_K_generic) VD(ggml_vec_dot_q4_K_q8_K_generic) VD(ggml_vec_dot_q5_K_q8_K_generic) VD(ggml_vec_dot_q6_K_q8_K_generic)
VD(ggml_vec_dot_iq4_nl_q8_0_generic) VD(ggml_vec_dot_iq4_xs_q8_K_generic)
VD(ggml_vec_dot_iq2_xxs_q8_K) VD(ggml_vec_dot_iq2_xs_q8_K) VD(ggml_vec_dot_iq2_s_q8_K) VD(ggml_vec_dot_iq3_xxs_q8_K)
VD(ggml_vec_dot_iq2_xxs_q8_K_generic) VD(ggml_vec_dot_iq2_xs_q8_K_generic) VD(ggml_vec_dot_iq2_s_q8_K_generic) VD(ggml_vec_dot_iq3_xxs_q8_K_generic)
VD(ggml_vec_dot_iq3_s_q8_K) VD(ggml_vec_dot_iq1_s_q8_K) VD(ggml_vec_dot_iq1_m_q8_K)
VD(ggml_vec_dot_iq3_s_q8_K_generic) VD(ggml_vec_dot_iq1_s_q8_K_generic) VD(ggml_vec_dot_iq1_m_q8_K_generic)
// base
typedef size_t (*qc_t)(const float * src, void * dst, int64_t nrow, int64_t n_per_row, const float * imatrix);
size_t quantize_q4_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q4_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q5_1(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q8_0(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q2_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q3_K(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q4_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_q5_K(const float*, void*, int64_t, int64_t, const float*); size_t quantize_q6_K(const float*, void*, int64_t, int64_t, const float*);
size_t quantize_iq4_nl(const float*, void*, int64_t, int64_t, const float*); size_t quantize_iq4_xs(const float*, void*, int64_t, int64_t, const float*);
typedef void (*deq_t)(const void *, float *, int64_t);
void dequantize_row_q4_0(const void*, float*, int64_t); void dequantize_row_q4_1(const void*, float*, int64_t);
void dequantize_row_q5_0(const void*, float*, int64_t); void dequantize_row_q5_1(const void*, float*, int64_t);
void dequantize_row_q8_0(const void*, float*, int64_t); void dequantize_row_q2_K(const void*, float*, int64_t);
void dequantize_row_q3_K(const void*, float*, int64_t); void dequantize_row_q4_K(const void*, float*, int64_t);
void dequantize_row_q5_K(const void*, float*, int64_t); void dequantize_row_q6_K(const void*, float*, int64_t);
void dequantize_row_q8_K(const void*, float*, int64_t); void dequantize_row_iq4_nl(const void*, float*, int64_t);
void dequantize_row_iq4_xs(const void*, float*, int64_t);
void dequantize_row_iq2_xxs(const void*, float*, int64_t); void dequantize_row_iq2_xs(const void*, float*, int64_t);
void dequantize_row_iq2_s(const void*, float*, int64_t); void dequantize_row_iq3_xxs(const void*, float*, int64_t);
void dequantize_row_iq3_s(const void*, float*, int64_t); void dequantize_row_iq1_s(const void*, float*, int64_t);
void dequantize_row_iq1_m(const void*, float*, int64_t);
void ggml_vec_dot_f32(int n, float * s, size_t bs, const float * x, size_t bx, const float * y, size_t by, int nrc);
void ggml_vec_dot_f16(int n, float * s, size_t bs, uint16_t * x, size_t bx, uint16_t * y, size_t by, int nrc);
void ggml_vec_dot_bf16(int n, float * s, size_t bs, uint16_t * x, size_t bx, uint16_t * y, size_t by, int nrc);
static float h2f(uint16_t h) { return _cvtsh_ss(h); }
static uint16_t f2h_sw(float f) { // ggml_compute_fp32_to_fp16 (ggml-base, what llama-quantize writes)
    const float scale_to_inf = 0x1.0p+112f; const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    uint32_t w; memcpy(&w, &f, 4); const uint32_t shl1_w = w + w; const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u; if (bias < 0x71000000u) bias = 0x71000000u;
    uint32_t bb = (bias >> 1) + 0x07800000u; float fb; memcpy(&fb, &bb, 4); base = fb + base;
    uint32_t bits; memcpy(&bits, &base, 4);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u; const uint32_t mantissa_bits = bits & 0x00000FFFu;
    return (sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : exp_bits + mantissa_bits);
}
static uint16_t f2bf(float s) { uint32_t i; memcpy(&i, &s, 4); if ((i & 0x7fffffff) > 0x7f800000) return (i >> 16) | 64; return (i + (0x7fff + ((i >> 16) & 1))) >> 16; }
static float bf2f(uint16_t h) { uint32_t i = (uint32_t)h << 16; float f; memcpy(&f, &i, 4); return f; }
static void float_section(FILE * f, int id, int n);
static void iq_section(FILE * f, int t, int n);
typedef void (*vd_t)(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

static uint64_t rs = 88172645463325252ull;
static uint32_t xr(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)(rs >> 16); }
static float frand(void) { return (xr() / 4294967296.0f) * 2.0f - 1.0f; }

int main(int argc, char ** argv) {
    // mode: write binary file: for each type: id u32, n u32, raw weights bytes (random raw blocks w/ finite scale), act f32 input, act bytes(x86), dequant weights f32, dot x86 f32, dot generic f32
    for (int i = 0; i < 65536; i++) { uint32_t w = (uint32_t)i << 16; uint32_t sign = w & 0x80000000u; uint32_t two_w = w + w; float nv; uint32_t b = (two_w >> 4) + (0xE0u << 23); memcpy(&nv, &b, 4); nv *= 0x1.0p-112f; float dv; uint32_t b2 = (two_w >> 17) | (126u << 23); memcpy(&dv, &b2, 4); dv -= 0.5f; uint32_t r; if (two_w < (1u << 27)) memcpy(&r, &dv, 4); else memcpy(&r, &nv, 4); r |= sign; memcpy(&ggml_table_f32_f16[i], &r, 4); }
    FILE * f = fopen(argv[1], "wb");
    struct { int id; int bs; int ts; deq_t dq; vd_t vd; vd_t vdg; int act; qc_t qc; } T[] = {
        {2,32,18,dequantize_row_q4_0,ggml_vec_dot_q4_0_q8_0,ggml_vec_dot_q4_0_q8_0_generic,8,quantize_q4_0},
        {3,32,20,dequantize_row_q4_1,ggml_vec_dot_q4_1_q8_1,ggml_vec_dot_q4_1_q8_1_generic,9,quantize_q4_1},
        {6,32,22,dequantize_row_q5_0,ggml_vec_dot_q5_0_q8_0,ggml_vec_dot_q5_0_q8_0_generic,8,quantize_q5_0},
        {7,32,24,dequantize_row_q5_1,ggml_vec_dot_q5_1_q8_1,ggml_vec_dot_q5_1_q8_1_generic,9,quantize_q5_1},
        {8,32,34,dequantize_row_q8_0,ggml_vec_dot_q8_0_q8_0,ggml_vec_dot_q8_0_q8_0_generic,8,quantize_q8_0},
        {10,256,84,dequantize_row_q2_K,ggml_vec_dot_q2_K_q8_K,ggml_vec_dot_q2_K_q8_K_generic,15,quantize_q2_K},
        {11,256,110,dequantize_row_q3_K,ggml_vec_dot_q3_K_q8_K,ggml_vec_dot_q3_K_q8_K_generic,15,quantize_q3_K},
        {12,256,144,dequantize_row_q4_K,ggml_vec_dot_q4_K_q8_K,ggml_vec_dot_q4_K_q8_K_generic,15,quantize_q4_K},
        {13,256,176,dequantize_row_q5_K,ggml_vec_dot_q5_K_q8_K,ggml_vec_dot_q5_K_q8_K_generic,15,quantize_q5_K},
        {14,256,210,dequantize_row_q6_K,ggml_vec_dot_q6_K_q8_K,ggml_vec_dot_q6_K_q8_K_generic,15,quantize_q6_K},
        {20,32,18,dequantize_row_iq4_nl,ggml_vec_dot_iq4_nl_q8_0,ggml_vec_dot_iq4_nl_q8_0_generic,8,quantize_iq4_nl},
        {23,256,136,dequantize_row_iq4_xs,ggml_vec_dot_iq4_xs_q8_K,ggml_vec_dot_iq4_xs_q8_K_generic,15,quantize_iq4_xs},
        {16,256,66,dequantize_row_iq2_xxs,ggml_vec_dot_iq2_xxs_q8_K,ggml_vec_dot_iq2_xxs_q8_K_generic,15,NULL},
        {17,256,74,dequantize_row_iq2_xs,ggml_vec_dot_iq2_xs_q8_K,ggml_vec_dot_iq2_xs_q8_K_generic,15,NULL},
        {22,256,82,dequantize_row_iq2_s,ggml_vec_dot_iq2_s_q8_K,ggml_vec_dot_iq2_s_q8_K_generic,15,NULL},
        {18,256,98,dequantize_row_iq3_xxs,ggml_vec_dot_iq3_xxs_q8_K,ggml_vec_dot_iq3_xxs_q8_K_generic,15,NULL},
    };
    int ntypes = sizeof(T)/sizeof(T[0]);
    for (int rep = 0; rep < 2; rep++)
    for (int t = 0; t < ntypes; t++) {
        // rep 1: an odd number of 32-blocks (IQ4_NL's scalar tail) and two super-blocks
        int n = T[t].bs == 32 ? (rep ? 288 : 256) : (rep ? 512 : 1024);
        int nb = n / T[t].bs;
        uint8_t * w = malloc(nb * T[t].ts);
        // random raw bytes; then fix f16 scale fields to finite small values
        for (int i = 0; i < nb*T[t].ts; i++) w[i] = xr();
        for (int b = 0; b < nb; b++) {
            uint8_t * blk = w + b*T[t].ts;
            uint16_t h1 = 0x2000 | (xr() & 0x0fff), h2 = 0x2000 | (xr() & 0x0fff); // ~1e-3..1e-2 range positive
            if (xr() & 1) h1 |= 0x8000;
            int id = T[t].id;
            int o1 = 0, o2 = -1;
            if (id == 3 || id == 7) { o2 = 2; }
            if (id == 10) { o1 = 80; o2 = 82; }
            if (id == 11) { o1 = 108; }
            if (id == 12 || id == 13) { o2 = 2; }
            if (id == 14) { o1 = 208; }
            memcpy(blk+o1, &h1, 2); if (o2 >= 0) memcpy(blk+o2, &h2, 2);
        }
        float * x = malloc(n*4); for (int i = 0; i < n; i++) x[i] = frand() * (1 + (i%7)); for (int i = 0; i < 32; i++) x[i] = 0; x[40] = 3.0f; for (int i = 32; i < 64; i++) if (i != 40) x[i] = 0; for (int i = 64; i < 96; i++) x[i] = (i%5) - 2.0f;
        int act = T[t].act; int abs_ = act==15 ? 256 : 32; int ats = act==8?34: act==9?36:292;
        uint8_t * a = malloc(n/abs_*ats);
        if (act == 8) quantize_row_q8_0(x, a, n); else if (act == 9) quantize_row_q8_1(x, a, n); else quantize_row_q8_K(x, a, n);
        float * dq = malloc(n*4); T[t].dq(w, dq, n);
        float s1, s2; T[t].vd(n, &s1, 0, w, 0, a, 0, 1); T[t].vdg(n, &s2, 0, w, 0, a, 0, 1);
        uint32_t hdr[2] = {T[t].id | (T[t].qc ? 0 : 0x200), n};
        fwrite(hdr, 4, 2, f); fwrite(w, 1, nb*T[t].ts, f); fwrite(x, 4, n, f); fwrite(a, 1, n/abs_*ats, f); fwrite(dq, 4, n, f); fwrite(&s1,4,1,f); fwrite(&s2,4,1,f);
        if (T[t].qc) { uint8_t * wq = malloc(nb*T[t].ts); T[t].qc(x, wq, 1, n, NULL); fwrite(wq,1,nb*T[t].ts,f); free(wq); }
        free(w); free(x); free(a); free(dq);
    }
    // F32, F16, BF16 (ids 0, 1, 30); lengths that leave every kind of SIMD tail.
    // Sections with bit 8 set in the id were computed by vec.cpp built for AVX2 only.
    int nf32[] = {232, 205, 70, 29}, nf16[] = {232, 77};
    for (int v = 0; v < 2; v++) {
        for (int k = 0; k < 4; k++) float_section(f, 0 | (v << 8), nf32[k]);
        for (int k = 0; k < 2; k++) float_section(f, 1 | (v << 8), nf16[k]);
    }
    float_section(f, 30, 232);
    // IQ3_S, IQ1_S, IQ1_M: no quantize_<type> without an importance matrix
    for (int rep = 0; rep < 2; rep++)
        for (int t = 0; t < 3; t++) iq_section(f, t, rep ? 512 : 1024);
    fclose(f);
    return 0;
}

// link stubs for symbols ggml-quants.c / quants.c reference but this harness never reaches
float ggml_table_f32_e8m0_half[256];
float ggml_table_f32_ue4m3[256];
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; return 0; }
size_t ggml_type_size(enum ggml_type type) { (void)type; return 0; }
const char * ggml_type_name(enum ggml_type type) { (void)type; return ""; }

// F32/F16/BF16: activations converted as ggml-cpu does (x86: F16C round-to-nearest-even for
// F16, ggml_compute_fp32_to_bf16 for BF16), x86 dot = ggml_vec_dot_{f32,f16,bf16} from vec.cpp
// (build it with: g++ -O3 -march=native -std=gnu++17 -c -I$L/include -I$L/src
// -I$L/src/ggml-cpu $L/src/ggml-cpu/vec.cpp), generic dot = scalar products summed in double.
void avx2_ggml_vec_dot_f32(int n, float * s, size_t bs, const float * x, size_t bx, const float * y, size_t by, int nrc);
void avx2_ggml_vec_dot_f16(int n, float * s, size_t bs, uint16_t * x, size_t bx, uint16_t * y, size_t by, int nrc);
static void float_section(FILE * f, int idv, int n) {
    int id = idv & 0xff, avx2 = idv >> 8;
    int es = id == 0 ? 4 : 2;
    uint8_t * w = malloc(n * es); uint8_t * a = malloc(n * es); uint8_t * wq = malloc(n * es);
    float * x = malloc(n * 4); float * wf = malloc(n * 4); float * dq = malloc(n * 4);
    for (int i = 0; i < n; i++) { wf[i] = frand() * (1 + (i % 5)); x[i] = frand() * (1 + (i % 3)); }
    double g = 0; float s1 = 0;
    for (int i = 0; i < n; i++) {
        if (id == 0) { memcpy(w + 4*i, &wf[i], 4); memcpy(a + 4*i, &x[i], 4); memcpy(wq + 4*i, &x[i], 4); dq[i] = wf[i]; }
        else if (id == 1) { uint16_t hw = f2h_sw(wf[i]); uint16_t ha = _cvtss_sh(x[i], 0); uint16_t hq = f2h_sw(x[i]);
            memcpy(w + 2*i, &hw, 2); memcpy(a + 2*i, &ha, 2); memcpy(wq + 2*i, &hq, 2); dq[i] = h2f(hw); }
        else { uint16_t hw = f2bf(wf[i]); uint16_t ha = f2bf(x[i]);
            memcpy(w + 2*i, &hw, 2); memcpy(a + 2*i, &ha, 2); memcpy(wq + 2*i, &ha, 2); dq[i] = bf2f(hw); }
    }
    for (int i = 0; i < n; i++) {
        float av = id == 0 ? x[i] : id == 1 ? h2f(((uint16_t *)a)[i]) : bf2f(((uint16_t *)a)[i]);
        g += (double)(dq[i] * av);
    }
    float s2 = (float)g;
    if (id == 0 && avx2) avx2_ggml_vec_dot_f32(n, &s1, 0, (float *)w, 0, (float *)a, 0, 1);
    else if (id == 1 && avx2) avx2_ggml_vec_dot_f16(n, &s1, 0, (uint16_t *)w, 0, (uint16_t *)a, 0, 1);
    else if (id == 0) ggml_vec_dot_f32(n, &s1, 0, (float *)w, 0, (float *)a, 0, 1);
    else if (id == 1) ggml_vec_dot_f16(n, &s1, 0, (uint16_t *)w, 0, (uint16_t *)a, 0, 1);
    else ggml_vec_dot_bf16(n, &s1, 0, (uint16_t *)w, 0, (uint16_t *)a, 0, 1);
    uint32_t hdr[2] = {idv, n};
    fwrite(hdr, 4, 2, f); fwrite(w, 1, n*es, f); fwrite(x, 4, n, f); fwrite(a, 1, n*es, f); fwrite(dq, 4, n, f);
    fwrite(&s1, 4, 1, f); fwrite(&s2, 4, 1, f); fwrite(wq, 1, n*es, f);
    free(w); free(a); free(wq); free(x); free(wf); free(dq);
}

// IQ types whose weights llama-quantize only writes with an importance matrix: the section of
// the quantized types without the quantize_<type> bytes (id bit 9 set).
static void iq_section(FILE * f, int t, int n) {
    struct { int id; int ts; deq_t dq; vd_t vd; vd_t vdg; } T[] = {
        {21,110,dequantize_row_iq3_s,ggml_vec_dot_iq3_s_q8_K,ggml_vec_dot_iq3_s_q8_K_generic},
        {19,50,dequantize_row_iq1_s,ggml_vec_dot_iq1_s_q8_K,ggml_vec_dot_iq1_s_q8_K_generic},
        {29,56,dequantize_row_iq1_m,ggml_vec_dot_iq1_m_q8_K,ggml_vec_dot_iq1_m_q8_K_generic},
    };
    int nb = n / 256, ts = T[t].ts;
    uint8_t * w = malloc(nb * ts);
    for (int i = 0; i < nb*ts; i++) w[i] = xr();
    for (int b = 0; b < nb; b++) {
        uint8_t * blk = w + b*ts;
        uint16_t h = 0x2000 | (xr() & 0x0fff);
        if (xr() & 1) h |= 0x8000;
        if (T[t].id == 29) {
            // IQ1_M: the f16 scale lives in the top nibbles of the 4 u16 scale words
            for (int k = 0; k < 4; k++) { blk[48 + 2*k + 1] = (blk[48 + 2*k + 1] & 0x0f) | (((h >> (4*k)) & 0xf) << 4); }
        } else {
            memcpy(blk, &h, 2);
        }
    }
    float * x = malloc(n*4); for (int i = 0; i < n; i++) x[i] = frand() * (1 + (i%7));
    uint8_t * a = malloc(n/256*292);
    quantize_row_q8_K(x, a, n);
    float * dq = malloc(n*4); T[t].dq(w, dq, n);
    float s1, s2; T[t].vd(n, &s1, 0, w, 0, a, 0, 1); T[t].vdg(n, &s2, 0, w, 0, a, 0, 1);
    uint32_t hdr[2] = {T[t].id | 0x200, n};
    fwrite(hdr, 4, 2, f); fwrite(w, 1, nb*ts, f); fwrite(x, 4, n, f); fwrite(a, 1, n/256*292, f); fwrite(dq, 4, n, f); fwrite(&s1,4,1,f); fwrite(&s2,4,1,f);
    free(w); free(x); free(a); free(dq);
}
