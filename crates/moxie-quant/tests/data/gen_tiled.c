// Generator of tests/data/ggml_tiled_golden.bin: runs ggml's tiled K-quant / IQ matmul
// (ggml-cpu/tiled/tiled.cpp + tiled-kernel.cpp) on random weights and Q8_K activations.
//
// Built for the machine that made the golden logits (GCC 12, Sapphire Rapids: the AVX-512 VNNI
// microkernel, with GCC's FMA contraction of its epilogue); runs on any x86-64 CPU with
// AVX-512 F/BW/VL/DQ/VNNI (made on an AMD EPYC Zen 4). L = llama.cpp's ggml directory at the
// reference commit:
//   gcc -O2 -std=gnu11 -c -I$L/include -I$L/src $L/src/ggml-quants.c -o base.o        # as ggml-base
//   g++ -O3 -march=sapphirerapids -std=gnu++17 -c -I$L/include -I$L/src -I$L/src/ggml-cpu \
//       $L/src/ggml-cpu/tiled/tiled.cpp -o tiled.o                                     # as ggml-cpu
//   g++ -O3 -march=sapphirerapids -std=gnu++17 -c -I$L/include -I$L/src -I$L/src/ggml-cpu \
//       $L/src/ggml-cpu/tiled/tiled-kernel.cpp -o tiled-kernel.o                       # as ggml-cpu
//   gcc -O2 -march=native -std=gnu11 -I$L/include -I$L/src/ggml-cpu gen_tiled.c base.o tiled.o \
//       tiled-kernel.o -lm -lstdc++ -no-pie -o gen_tiled
//   ./gen_tiled ggml_tiled_golden.bin
// The threadpool is stubbed (one thread); the op entry points are called directly.
//
// File format (little-endian):
//   two activation sets, each: u32 n_in, u32 n_rows, Q8_K rows (quantize_row_q8_K_ref of
//   random floats). Set 0 feeds mul_mat, set 1 feeds mul_mat_id.
//   then sections until end of file (the K-quants and IQ4_XS for both sets, then IQ3_S, IQ1_S,
//   IQ1_M for both sets): u32 set (0: mul_mat, 1: mul_mat_id), u32 type id,
//   u32 n_out, weight rows (random raw blocks, finite scales), u32 n_calls, and per call:
//   u32 n_routed, u32 act_row[n_routed], f32 out[n_routed][n_out] (out[i][r] = row r of the
//   weights times activation row act_row[i], as ggml's tiled path computed it).
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <immintrin.h>
#include "ggml.h"
#include "ggml-cpu.h"

void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d %s\n", file, line, fmt); abort(); }
void ggml_log_internal(int level, const char * fmt, ...) { (void)level; (void)fmt; }
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[256];
float ggml_table_f32_ue4m3[256];
const char * ggml_type_name(enum ggml_type type) { (void)type; return ""; }
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);

// same layout as ggml-cpu-impl.h
struct ggml_compute_params { int ith, nth; size_t wsize; void * wdata; struct ggml_threadpool * threadpool; bool use_ref; };
bool ggml_compute_forward_mul_mat_tiled(const struct ggml_compute_params * params, struct ggml_tensor * dst);
bool ggml_compute_forward_mul_mat_id_tiled(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                                           int64_t cur_a, int64_t cne1, const int32_t * expert_rows, char * scratch);

// the ggml-base / ggml-cpu pieces tiled.cpp uses
static int chunk_counter;
void ggml_barrier(struct ggml_threadpool * tp) { (void)tp; }
void ggml_threadpool_chunk_set(struct ggml_threadpool * tp, int value) { (void)tp; chunk_counter = value; }
int ggml_threadpool_chunk_add(struct ggml_threadpool * tp, int value) { (void)tp; int r = chunk_counter; chunk_counter += value; return r; }
float ggml_fp16_to_fp32(ggml_fp16_t h) { return _cvtsh_ss(h); }
static size_t tsize(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q2_K: return 84; case GGML_TYPE_Q3_K: return 110; case GGML_TYPE_Q4_K: return 144;
        case GGML_TYPE_Q5_K: return 176; case GGML_TYPE_Q6_K: return 210; case GGML_TYPE_IQ4_XS: return 136;
        case GGML_TYPE_IQ2_XXS: return 66; case GGML_TYPE_IQ2_XS: return 74; case GGML_TYPE_IQ2_S: return 82;
        case GGML_TYPE_IQ3_XXS: return 98;
        case GGML_TYPE_IQ3_S: return 110; case GGML_TYPE_IQ1_S: return 50; case GGML_TYPE_IQ1_M: return 56;
        case GGML_TYPE_Q8_K: return 292; case GGML_TYPE_F32: return 4;
        default: abort();
    }
}
size_t ggml_type_size(enum ggml_type type) { return tsize(type); }
int64_t ggml_blck_size(enum ggml_type type) { return type == GGML_TYPE_F32 ? 1 : 256; }
size_t ggml_row_size(enum ggml_type type, int64_t ne) { return tsize(type) * ne / ggml_blck_size(type); }
int64_t ggml_nelements(const struct ggml_tensor * t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
static struct ggml_type_traits_cpu traits = { NULL, NULL, GGML_TYPE_Q8_K, 1 };
const struct ggml_type_traits_cpu * ggml_get_type_traits_cpu(enum ggml_type type) { (void)type; return &traits; }

static uint64_t rs = 88172645463325252ull;
static uint32_t xr(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)(rs >> 16); }
static float frand(void) { return (xr() / 4294967296.0f) * 2.0f - 1.0f; }

static void set_tensor(struct ggml_tensor * t, enum ggml_type ty, int64_t ne0, int64_t ne1, int64_t ne2, void * data) {
    memset(t, 0, sizeof(*t));
    t->type = ty;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = ne2; t->ne[3] = 1;
    t->nb[0] = tsize(ty);
    t->nb[1] = ggml_row_size(ty, ne0);
    t->nb[2] = t->nb[1] * ne1;
    t->nb[3] = t->nb[2] * ne2;
    t->data = data;
}

static uint8_t * random_weights(int id, int nblocks) {
    int ts = (int) tsize((enum ggml_type) id);
    uint8_t * w = malloc((size_t) nblocks * ts);
    for (int i = 0; i < nblocks * ts; i++) w[i] = xr();
    for (int b = 0; b < nblocks; b++) {
        uint8_t * blk = w + b * ts;
        uint16_t h1 = 0x2000 | (xr() & 0x0fff), h2 = 0x2000 | (xr() & 0x0fff);
        if (xr() & 1) h1 |= 0x8000;
        int o1 = 0, o2 = -1;
        if (id == GGML_TYPE_Q2_K) { o1 = 80; o2 = 82; }
        if (id == GGML_TYPE_Q3_K) { o1 = 108; }
        if (id == GGML_TYPE_Q4_K || id == GGML_TYPE_Q5_K) { o2 = 2; }
        if (id == GGML_TYPE_Q6_K) { o1 = 208; }
        if (id == GGML_TYPE_IQ1_M) {
            // no d field: the f16 scale lives in the top nibbles of the 4 u16 scale words
            for (int k = 0; k < 4; k++) blk[48 + 2 * k + 1] = (blk[48 + 2 * k + 1] & 0x0f) | (((h1 >> (4 * k)) & 0xf) << 4);
            continue;
        }
        memcpy(blk + o1, &h1, 2);
        if (o2 >= 0) memcpy(blk + o2, &h2, 2);
    }
    return w;
}

static uint8_t * acts(FILE * f, int n_in, int n_rows) {
    float * x = malloc(sizeof(float) * n_in);
    size_t rb = ggml_row_size(GGML_TYPE_Q8_K, n_in);
    uint8_t * a = malloc(rb * n_rows);
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < n_in; i++) x[i] = frand() * (1 + (i % 7)) * (1 + r % 3);
        quantize_row_q8_K_ref(x, a + r * rb, n_in);
    }
    uint32_t hdr[2] = { (uint32_t) n_in, (uint32_t) n_rows };
    fwrite(hdr, 4, 2, f);
    fwrite(a, 1, rb * n_rows, f);
    free(x);
    return a;
}

int main(int argc, char ** argv) {
    if (argc < 2) return 1;
    FILE * f = fopen(argv[1], "wb");
    // set 0: mul_mat, 10 activation rows (the narrow path), K = 768 (one 3-slab chunk)
    // set 1: mul_mat_id, 20 rows; one expert gets 9 of them (narrow path, 2 slabs per chunk),
    //        then all 20 in a shuffled order (standard path, one slab at a time)
    const int n_in0 = 768, n_tok0 = 10, n_in1 = 512, n_tok1 = 20, n_out = 24;
    uint8_t * a0 = acts(f, n_in0, n_tok0);
    uint8_t * a1 = acts(f, n_in1, n_tok1);

    size_t wsize = 64 + 4 * 512 * 1024;
    void * wdata = aligned_alloc(64, wsize);
    struct ggml_compute_params params = { 0, 1, wsize, wdata, NULL, false };

    const int ids0[] = { GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS,
                         GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS };
    const int ids1[] = { GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M };
    for (int pass = 0; pass < 2; pass++)
    for (int set = 0; set < 2; set++) {
        const int * ids = pass ? ids1 : ids0;
        const unsigned n_ids = pass ? 3 : 10;
        for (unsigned t = 0; t < n_ids; t++) {
            const int id = ids[t];
            const int n_in = set ? n_in1 : n_in0, n_tok = set ? n_tok1 : n_tok0;
            const size_t wrb = ggml_row_size((enum ggml_type) id, n_in);
            uint8_t * w = random_weights(id, n_out * n_in / 256);
            uint32_t hdr[3] = { (uint32_t) set, (uint32_t) id, (uint32_t) n_out };
            fwrite(hdr, 4, 3, f);
            fwrite(w, 1, wrb * n_out, f);

            struct ggml_tensor src0, src1, dst;
            float * out = malloc(sizeof(float) * n_out * n_tok);
            if (set == 0) {
                set_tensor(&src0, (enum ggml_type) id, n_in, n_out, 1, w);
                set_tensor(&src1, GGML_TYPE_Q8_K, n_in, n_tok, 1, a0);
                set_tensor(&dst, GGML_TYPE_F32, n_out, n_tok, 1, out);
                dst.src[0] = &src0; dst.src[1] = &src1;
                for (int i = 0; i < n_out * n_tok; i++) out[i] = -1e30f;
                if (!ggml_compute_forward_mul_mat_tiled(&params, &dst)) abort();
                uint32_t nc = 1, nr = (uint32_t) n_tok;
                fwrite(&nc, 4, 1, f);
                fwrite(&nr, 4, 1, f);
                for (uint32_t i = 0; i < nr; i++) fwrite(&i, 4, 1, f);
                fwrite(out, 4, (size_t) n_out * n_tok, f);
            } else {
                // one expert (ne02 = 1), one used slot per token: src1 [n_in, 1, n_tok], dst [n_out, 1, n_tok]
                set_tensor(&src0, (enum ggml_type) id, n_in, n_out, 1, w);
                set_tensor(&src1, GGML_TYPE_Q8_K, n_in, 1, n_tok, a1);
                set_tensor(&dst, GGML_TYPE_F32, n_out, 1, n_tok, out);
                dst.src[0] = &src0; dst.src[1] = &src1;
                uint32_t nc = 2;
                fwrite(&nc, 4, 1, f);
                for (int call = 0; call < 2; call++) {
                    int32_t rows[2 * 20];
                    int nr = 0;
                    if (call == 0) {
                        for (int i = 0; i < n_tok && nr < 9; i += 2) { rows[2 * nr] = 0; rows[2 * nr + 1] = i; nr++; }
                    } else {
                        for (int i = 0; i < n_tok; i++) { rows[2 * nr] = 0; rows[2 * nr + 1] = (7 * i + 3) % n_tok; nr++; }
                    }
                    for (int i = 0; i < n_out * n_tok; i++) out[i] = -1e30f;
                    if (!ggml_compute_forward_mul_mat_id_tiled(&params, &dst, 0, nr, rows, (char *) wdata)) abort();
                    uint32_t unr = (uint32_t) nr;
                    fwrite(&unr, 4, 1, f);
                    for (int i = 0; i < nr; i++) { uint32_t r = (uint32_t) rows[2 * i + 1]; fwrite(&r, 4, 1, f); }
                    for (int i = 0; i < nr; i++) fwrite(out + (size_t) rows[2 * i + 1] * n_out, 4, (size_t) n_out, f);
                }
            }
            free(out);
            free(w);
        }
    }
    fclose(f);
    free(a0); free(a1); free(wdata);
    return 0;
}
