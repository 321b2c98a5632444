//! Kernel micro-benchmarks: matrix-vector and 32-row products for every weight type moxie
//! computes with, reported as weight bytes read per second (divan's `BytesCount`, GB/s).
//!
//! ```text
//! cargo bench -p moxie-quant --bench dot                         # everything (a few minutes)
//! cargo bench -p moxie-quant --bench dot -- matvec_dram          # one group (divan filter)
//! cargo bench -p moxie-quant --bench dot -- 'matvec_l2::Q4_K'    # one type of one group
//! MOXIE_QUANT_SIMD=avx2 cargo bench -p moxie-quant --bench dot   # compare kernel levels
//! ```
//!
//! Groups (all single-threaded, rows of 4096 elements, weights from `quantize_weights_fn` on
//! deterministic pseudo-random data — random raw blocks with a fixed scale for the IQ1/IQ2/IQ3
//! types and ik_llama.cpp's types (IQ2_K .. IQ6_K, IQ2_KS .. IQ5_KS, Q6_0), which moxie does
//! not quantize —, activations quantized to `vec_dot_type` outside the timed loop):
//!
//! * `matvec_l2`: one activation row against a matrix of about 512 KiB (e.g. 224 Q4_0 rows),
//!   which stays in L2: measures the `vec_dot_fn` kernel's compute speed.
//! * `matvec_dram`: one activation row against a 4096 x 4096 matrix; each iteration takes the
//!   next of several copies that together exceed 1 GiB (`MOXIE_BENCH_DRAM_MIB` changes it), so
//!   every matvec streams its weights from memory like decode does. Measures bandwidth.
//! * `batch32_l2` / `batch32_dram`: 32 activation rows, the same matrices, with the kernels
//!   that keep llama.cpp's summation order (what moxie-core's `Mat::matmul_q` runs under
//!   `--exact`, and by default for types without an int8 GEMM): `tiled_dot_many_fn` for
//!   Q2_K..Q6_K, IQ4_XS and the IQ1/IQ2/IQ3 types, `tinyblas_dot_many_fn` for Q8_0/Q4_0/Q5_0/IQ4_NL (each weight row
//!   unpacked once for all 32 rows), `tinyblas_dot_fn` for F32/F16 and `vec_dot_fn` for
//!   BF16/Q4_1/Q5_1 and ik_llama.cpp's types (token by token over the whole matrix). Bytes are
//!   the weight bytes, read once per iteration, so 32x the figure is the activation-row
//!   throughput.
//! * `batch32_gemm_l2` / `batch32_gemm_dram`: the same with `gemm_q8`, the default batched path
//!   (int8 AVX-512 VNNI, or AVX2 `vpmaddubsw`) for Q8_0/Q4_0/Q5_0/Q4_K/Q5_K/Q6_K, the
//!   IQ1/IQ2/IQ3 types and ik_llama.cpp's types; its `GemmActs` are prepared outside the timed
//!   loop. Skipped where `gemm_available()` is false (no AVX2, or `MOXIE_QUANT_SIMD=scalar`).
//! * `batch64_gemm_interleaved_l2`: `gemm_q8_interleaved` on groups repacked as at load time
//!   (the default prefill path for Q4_K/Q5_K/Q6_K/Q8_0), 64 tokens, L2-resident.
//! * `attention_bf16`: one-token attention's two bf16 products (`gemm_bf16_abt` for the
//!   scores, `gemm_bf16_ab` for the weighted values) on one block of DeepSeek's MLA shapes, in
//!   multiply-adds per second; `VDPBF16PS` does 32 per instruction, so 32x the CPU's rate of
//!   that instruction is the ceiling. On CPUs with AMX-BF16 the products run on AMX tiles
//!   (`MOXIE_QUANT_SIMD=avx512` measures `VDPBF16PS` there).
//!
//! `MOXIE_QUANT_SIMD` (`scalar`, `avx2`, `avx512`) lowers the level `vec_dot_fn` and
//! `quantize_fn` pick, as everywhere in moxie, and turns `gemm_q8` off below `avx512`; the level
//! in use is printed first. The exact-order batched kernels have one variant each (built for
//! the x86-64-v3 baseline), so it does not change them.
//!
//! Under `cargo test --benches` (divan's test mode, each benchmark run once) the matrices are
//! shrunk to 16 rows and one copy so the check stays fast. Not a test: nothing about time is
//! asserted.

use divan::counter::BytesCount;
use divan::{black_box, Bencher};
use moxie_quant::iq1::set_iq1m_scale;
use moxie_quant::{
    f32_to_fp16, gemm_available, gemm_bf16_ab, gemm_bf16_abt, gemm_f32_ab, gemm_f32_abt, gemm_q8,
    gemm_q8_interleaved, gemm_supports, hardware_simd_level, quantize_fn, quantize_weights_fn,
    simd_level, tiled_dot_many_fn, tinyblas_dot_fn, tinyblas_dot_many_fn, vec_dot_fn, vec_dot_type,
    DotManyFn, GemmActs, GgmlType, VecDotFn, GEMM_TILE_ROWS,
};
use GgmlType::*;

/// Elements per row (the inner dimension).
const COLS: usize = 4096;
/// Rows of the DRAM-resident matrix.
const DRAM_ROWS: usize = 4096;
/// Weight bytes of the L2-resident matrix (fits the 1-2 MiB L2 of current x86 server cores).
const L2_BYTES: usize = 512 << 10;
/// Default total size of the rotated copies of the DRAM-resident matrix (> any L3 so far).
const DRAM_MIB: usize = 1024;
/// Activation rows of the batched benchmarks.
const BATCH: usize = 32;

const TYPES: &[GgmlType] = &[
    F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, Q6_0, IQ2_K, IQ3_K, IQ4_K, IQ5_K, IQ6_K,
    IQ2_KS, IQ3_KS, IQ4_KS, IQ5_KS,
];
/// The types `gemm_q8` handles.
const GEMM_TYPES: &[GgmlType] = &[
    Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, Q6_0,
    IQ2_K, IQ3_K, IQ4_K, IQ5_K, IQ6_K, IQ2_KS, IQ3_KS, IQ4_KS, IQ5_KS,
];

fn main() {
    println!(
        "moxie-quant dot kernels: level {} (hardware {}; MOXIE_QUANT_SIMD lowers it), \
         rows of {COLS}, 1 thread",
        simd_level().name(),
        hardware_simd_level().name()
    );
    divan::main();
}

/// divan runs benchmarks for real only with `--bench` (and without `--test`).
fn bench_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

/// xorshift64: deterministic data without a rand dependency.
struct Rng(u64);

impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `copies` back-to-back matrices of `rows` x [`COLS`] weights of type `ty`.
struct Weights {
    data: Vec<u8>,
    row_bytes: usize,
    rows: usize,
    copies: usize,
}

impl Weights {
    /// The rows are the quantization of (at most) 64 random rows, repeated: the kernels' speed
    /// does not depend on the values, and quantizing a whole GiB would take minutes.
    fn new(ty: GgmlType, rows: usize, min_total_bytes: usize) -> Weights {
        let (rows, min_total_bytes) = if bench_mode() {
            (rows, min_total_bytes)
        } else {
            (16, 0)
        };
        let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
        let mat_bytes = rows * row_bytes;
        let copies = min_total_bytes.div_ceil(mat_bytes).max(1);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(ty.id()));
        let mut x = vec![0f32; COLS];
        let base: Vec<u8> = (0..rows.min(64))
            .flat_map(|_| {
                x.iter_mut().for_each(|v| *v = rng.f32());
                let mut row = vec![0u8; row_bytes];
                match quantize_weights_fn(ty) {
                    Some(quantize) => quantize(&x, &mut row),
                    None => raw_row(ty, &x, &mut row),
                }
                row
            })
            .collect();
        let total = mat_bytes * copies;
        let mut data = Vec::with_capacity(total);
        while data.len() < total {
            let take = base.len().min(total - data.len());
            data.extend_from_slice(&base[..take]);
        }
        Weights {
            data,
            row_bytes,
            rows,
            copies,
        }
    }

    fn l2(ty: GgmlType) -> Weights {
        let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
        Weights::new(ty, (L2_BYTES / row_bytes / 4 * 4).max(4), 0)
    }

    fn dram(ty: GgmlType) -> Weights {
        let mib = std::env::var("MOXIE_BENCH_DRAM_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DRAM_MIB);
        Weights::new(ty, DRAM_ROWS, mib << 20)
    }

    fn mat_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Copy number `i % copies`.
    fn matrix(&self, i: usize) -> &[u8] {
        let b = self.mat_bytes();
        &self.data[(i % self.copies) * b..][..b]
    }
}

/// A row of a type moxie does not quantize (the IQ1/IQ2/IQ3 types, ik_llama.cpp's types) from
/// the bits of `x`, every scale 1/64: the f16 ones of each block and, for ik's `_KS` types, the
/// row's own (f16 or f32) before its blocks.
fn raw_row(ty: GgmlType, x: &[f32], row: &mut [u8]) {
    for (b, v) in row.iter_mut().zip(x.iter().cycle()) {
        *b = (v.to_bits() >> 7) as u8;
    }
    let d = f32_to_fp16(1.0 / 64.0);
    let meta = ty.row_meta_bytes();
    match meta {
        0 => {}
        2 => row[..2].copy_from_slice(&d.to_le_bytes()),
        4 => row[..4].copy_from_slice(&(1.0f32 / 64.0).to_le_bytes()),
        _ => unreachable!("{ty}: row prefix of {meta} bytes"),
    }
    for blk in row[meta..].chunks_exact_mut(ty.type_size()) {
        if ty == IQ1_M {
            set_iq1m_scale(blk, d);
        } else {
            for &off in ty.f16_scale_offsets() {
                blk[off..off + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
}

/// `n` activation rows of [`COLS`] random values in `ty`'s `vec_dot_type`, back to back.
fn activations(ty: GgmlType, n: usize) -> (Vec<u8>, usize) {
    let at = vec_dot_type(ty).unwrap();
    let quantize = quantize_fn(at).unwrap();
    let stride = at.row_bytes(COLS as u64).unwrap() as usize;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut x = vec![0f32; COLS];
    let mut acts = vec![0u8; n * stride];
    for row in acts.chunks_exact_mut(stride) {
        x.iter_mut().for_each(|v| *v = rng.f32());
        quantize(&x, row);
    }
    (acts, stride)
}

fn matvec(bencher: Bencher, w: Weights, ty: GgmlType) {
    let dot = vec_dot_fn(ty).unwrap();
    let row_bytes = w.row_bytes;
    time_matvec(bencher, &w, ty, |m, a, out| {
        for (o, row) in out.iter_mut().zip(m.chunks_exact(row_bytes)) {
            *o = dot(COLS, row, a);
        }
    });
}

/// Times `product(matrix, activation row, out)` over the copies of `w` in turn, one
/// activation row of `ty`'s dot partner, counting the matrix's bytes.
fn time_matvec(
    bencher: Bencher,
    w: &Weights,
    ty: GgmlType,
    product: impl Fn(&[u8], &[u8], &mut [f32]),
) {
    let (a, _) = activations(ty, 1);
    let mut out = vec![0f32; w.rows];
    let mut i = 0;
    bencher
        .counter(BytesCount::new(w.mat_bytes()))
        .bench_local(|| {
            let m = black_box(w.matrix(i));
            i += 1;
            product(m, &a, &mut out);
            black_box(&out);
        });
}

#[divan::bench(args = TYPES, min_time = 0.5, max_time = 1)]
fn matvec_l2(bencher: Bencher, ty: GgmlType) {
    matvec(bencher, Weights::l2(ty), ty);
}

#[divan::bench(args = TYPES, max_time = 2)]
fn matvec_dram(bencher: Bencher, ty: GgmlType) {
    matvec(bencher, Weights::dram(ty), ty);
}

/// The same one-token product on the interleaved 16-row layout (`moxie_quant::repack`).
fn matvec_repacked(bencher: Bencher, mut w: Weights, ty: GgmlType) {
    use moxie_quant::repack::{gemv, repack, REPACK_ROWS};
    let b = w.mat_bytes();
    let mut packed = vec![0u8; b];
    for m in w.data.chunks_exact_mut(b) {
        repack(ty, m, w.rows, COLS, &mut packed);
        m.copy_from_slice(&packed);
    }
    let group_bytes = REPACK_ROWS * w.row_bytes;
    time_matvec(bencher, &w, ty, |m, a, out| {
        for (o, g) in out
            .chunks_exact_mut(REPACK_ROWS)
            .zip(m.chunks_exact(group_bytes))
        {
            gemv(ty, COLS, g, a, o.try_into().unwrap());
        }
    });
}

#[divan::bench(args = [Q4_K, Q5_K, Q6_K, Q8_0], min_time = 0.5, max_time = 1)]
fn matvec_repacked_l2(bencher: Bencher, ty: GgmlType) {
    let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
    matvec_repacked(
        bencher,
        Weights::new(ty, (L2_BYTES / row_bytes / 16 * 16).max(16), 0),
        ty,
    );
}

#[divan::bench(args = [Q4_K, Q5_K, Q6_K, Q8_0], max_time = 2)]
fn matvec_repacked_dram(bencher: Bencher, ty: GgmlType) {
    matvec_repacked(bencher, Weights::dram(ty), ty);
}

/// The kernel moxie-core's `Mat::matmul_q` uses for a batch of [`BATCH`] rows.
enum Batched {
    Many(DotManyFn),
    Dot(VecDotFn),
}

fn batched_kernel(ty: GgmlType) -> Batched {
    if let Some(f) = tiled_dot_many_fn(ty, COLS) {
        Batched::Many(f)
    } else if let Some(f) = tinyblas_dot_many_fn(ty, COLS) {
        Batched::Many(f)
    } else if let Some(f) = tinyblas_dot_fn(ty, COLS) {
        Batched::Dot(f)
    } else {
        Batched::Dot(vec_dot_fn(ty).unwrap())
    }
}

fn batch(bencher: Bencher, w: Weights, ty: GgmlType) {
    let kernel = batched_kernel(ty);
    let (acts, stride) = activations(ty, BATCH);
    let mut out = vec![0f32; w.rows * BATCH];
    let mut i = 0;
    bencher
        .counter(BytesCount::new(w.mat_bytes()))
        .bench_local(|| {
            let m = black_box(w.matrix(i));
            i += 1;
            match kernel {
                // [row][token], each weight row unpacked once.
                Batched::Many(many) => {
                    for (o, row) in out.chunks_exact_mut(BATCH).zip(m.chunks_exact(w.row_bytes)) {
                        many(COLS, row, &acts, stride, o);
                    }
                }
                // [token][row], the whole matrix once per token.
                Batched::Dot(dot) => {
                    for (o, a) in out.chunks_exact_mut(w.rows).zip(acts.chunks_exact(stride)) {
                        for (y, row) in o.iter_mut().zip(m.chunks_exact(w.row_bytes)) {
                            *y = dot(COLS, row, a);
                        }
                    }
                }
            }
            black_box(&out);
        });
}

#[divan::bench(args = TYPES, min_time = 0.5, max_time = 1)]
fn batch32_l2(bencher: Bencher, ty: GgmlType) {
    batch(bencher, Weights::l2(ty), ty);
}

#[divan::bench(args = TYPES, max_time = 2)]
fn batch32_dram(bencher: Bencher, ty: GgmlType) {
    batch(bencher, Weights::dram(ty), ty);
}

fn batch_gemm(bencher: Bencher, ty: GgmlType, weights: fn(GgmlType) -> Weights) {
    if !gemm_available() || !gemm_supports(ty, COLS) {
        return;
    }
    let w = weights(ty);
    let (acts, stride) = activations(ty, BATCH);
    let act = vec_dot_type(ty).unwrap();
    let g = GemmActs::new(act, COLS, &acts, stride).unwrap();
    let mut out = vec![0f32; w.rows.div_ceil(GEMM_TILE_ROWS) * GEMM_TILE_ROWS * BATCH];
    let mut i = 0;
    bencher
        .counter(BytesCount::new(w.mat_bytes()))
        .bench_local(|| {
            let m = black_box(w.matrix(i));
            i += 1;
            assert!(gemm_q8(ty, COLS, m, &g, &mut out, &[]));
            black_box(&out);
        });
}

/// `gemm_q8_interleaved` on groups repacked at load time (moxie's default for these types),
/// 64 tokens (an expert's share of a 512-token prompt with 8 of 64 experts), L2-resident.
#[divan::bench(args = [Q4_K, Q5_K, Q6_K, Q8_0], min_time = 0.5, max_time = 1)]
fn batch64_gemm_interleaved_l2(bencher: Bencher, ty: GgmlType) {
    const TOKENS: usize = 64;
    if !gemm_available() || !moxie_quant::repack::repack_supports(ty, GEMM_TILE_ROWS, COLS) {
        return;
    }
    let w = Weights::l2(ty);
    let rows = w.rows / GEMM_TILE_ROWS * GEMM_TILE_ROWS;
    let plain = &w.matrix(0)[..rows * w.row_bytes];
    let mut groups = vec![0u8; plain.len()];
    moxie_quant::repack::repack(ty, plain, rows, COLS, &mut groups);
    let (acts, stride) = activations(ty, TOKENS);
    let g = GemmActs::new(vec_dot_type(ty).unwrap(), COLS, &acts, stride).unwrap();
    let mut out = vec![0f32; rows * TOKENS];
    bencher
        .counter(BytesCount::new(groups.len()))
        .bench_local(|| {
            assert!(gemm_q8_interleaved(
                ty,
                COLS,
                black_box(&groups),
                &g,
                &mut out,
                &[]
            ));
            black_box(&out);
        });
}

/// [`batch64_gemm_interleaved_l2`] on matrices in DRAM (copies over 1 GiB, see `dram`),
/// walked as moxie-core's MoE does: 32-row chunks, each with the next chunk as the bytes to
/// prefetch. Against the L2 figure: what the weights' first reads cost.
#[divan::bench(args = [Q4_K, Q8_0], max_time = 2)]
fn batch64_gemm_interleaved_dram(bencher: Bencher, ty: GgmlType) {
    const TOKENS: usize = 64;
    const CHUNK: usize = 2 * GEMM_TILE_ROWS;
    if !gemm_available() || !moxie_quant::repack::repack_supports(ty, GEMM_TILE_ROWS, COLS) {
        return;
    }
    let mut w = Weights::dram(ty);
    let b = w.mat_bytes();
    let mut packed = vec![0u8; b];
    for m in w.data.chunks_exact_mut(b) {
        moxie_quant::repack::repack(ty, m, w.rows, COLS, &mut packed);
        m.copy_from_slice(&packed);
    }
    let (acts, stride) = activations(ty, TOKENS);
    let g = GemmActs::new(vec_dot_type(ty).unwrap(), COLS, &acts, stride).unwrap();
    let mut out = vec![0f32; CHUNK * TOKENS];
    let chunk_bytes = CHUNK * w.row_bytes;
    let mut i = 0;
    bencher.counter(BytesCount::new(b)).bench_local(|| {
        let m = black_box(w.matrix(i));
        i += 1;
        for (k, c) in m.chunks(chunk_bytes).enumerate() {
            let next = m
                .get((k + 1) * chunk_bytes..)
                .map_or(&[][..], |r| &r[..r.len().min(chunk_bytes)]);
            assert!(gemm_q8_interleaved(ty, COLS, c, &g, &mut out, next));
        }
        black_box(&out);
    });
}

#[divan::bench(args = GEMM_TYPES, min_time = 0.5, max_time = 1)]
fn batch32_gemm_l2(bencher: Bencher, ty: GgmlType) {
    batch_gemm(bencher, ty, Weights::l2);
}

#[divan::bench(args = GEMM_TYPES, max_time = 2)]
fn batch32_gemm_dram(bencher: Bencher, ty: GgmlType) {
    batch_gemm(bencher, ty, Weights::dram);
}

/// One-token MLA attention's two bf16 products for one block of cached positions: 16 query
/// heads against 64 positions of 576-wide keys (scores), then the 16 x 64 probabilities times
/// the positions' first 512 elements (values) — DeepSeek's shapes, in L1/L2. Counted in
/// multiply-adds (`ItemsCount`), so the figure against the CPU's `VDPBF16PS` rate (32 per
/// instruction) says how close decode at depth runs to the instruction's peak.
#[divan::bench(args = ["scores", "values"], min_time = 0.5, max_time = 1)]
fn attention_bf16(bencher: Bencher, product: &str) {
    attention(bencher, product, true);
}

/// [`attention_bf16`]'s products in f32 (`gemm_f32_abt`, `gemm_f32_ab`): what one-token
/// attention takes where the CPU lacks `VDPBF16PS` (and below 512 positions everywhere).
/// Counted in multiply-adds, against the CPU's FMA rate (16 per cycle on AVX2 with two FMA
/// units, 32 on AVX-512).
#[divan::bench(args = ["scores", "values"], min_time = 0.5, max_time = 1)]
fn attention_f32(bencher: Bencher, product: &str) {
    attention(bencher, product, false);
}

/// A prompt batch's MLA attention products for one block of 16 tokens: their 256 query rows
/// (16 heads each) against 256 cached positions, as bf16 products over the latents (scores),
/// and the probabilities times the values. Multiply-adds per second against the tile unit's
/// rate (AMX: 512 per cycle per core) say how far the batch path is from it.
#[divan::bench(args = ["scores", "values"], min_time = 0.5, max_time = 1)]
fn attention_batch_bf16(bencher: Bencher, product: &str) {
    attention_shaped(bencher, product, true, 256, 256);
}

/// [`attention_batch_bf16`]'s products in f32 (`gemm_f32_abt`, `gemm_f32_ab`): the batch
/// path where the CPU lacks `VDPBF16PS`, or where f32 FMAs outrun it. Against the FMA rate.
/// `scores_packed`: the scores by `gemm_f32_abt_packed`, the queries packed in each call.
#[divan::bench(args = ["scores", "scores_packed", "values"], min_time = 0.5, max_time = 1)]
fn attention_batch_f32(bencher: Bencher, product: &str) {
    attention_shaped(bencher, product, false, 256, 512);
}

/// One of [`attention_bf16`]'s products (`bf16`) or [`attention_f32`]'s, on the same values.
fn attention(bencher: Bencher, product: &str, bf16: bool) {
    attention_shaped(bencher, product, bf16, 16, 64);
}

/// MLA's attention products for `heads` query rows over `positions` cached latents.
fn attention_shaped(bencher: Bencher, product: &str, bf16: bool, heads: usize, positions: usize) {
    let (dk, dv) = (576, 512);
    let mut rng = Rng(11);
    let mut f32s = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.f32()).collect() };
    let (q, k, p) = (
        f32s(heads * dk),
        f32s(positions * dk),
        f32s(heads * positions),
    );
    // Line-aligned, as attention's converted rows are (`moxie_quant::aligned`).
    let to_bf16 = |x: &[f32]| {
        let mut out = moxie_quant::aligned::AlignedU16::new();
        out.resize(x.len(), 0);
        moxie_quant::bf16gemm::f32_to_bf16(x, &mut out);
        out
    };
    let (q16, k16, p16) = (to_bf16(&q), to_bf16(&k), to_bf16(&p));
    let mut out = vec![0f32; heads * dv.max(positions)];
    let scores = product.starts_with("scores");
    let macs = heads * positions * if scores { dk } else { dv };
    let mut packed = Vec::new();
    if product == "scores_packed" {
        bencher
            .counter(divan::counter::ItemsCount::new(macs))
            .bench_local(|| {
                moxie_quant::f32gemm::pack_rows(heads, dk, black_box(&q), dk, &mut packed);
                moxie_quant::gemm_f32_abt_packed(
                    heads,
                    positions,
                    dk,
                    &packed,
                    black_box(&k),
                    dk,
                    &mut out,
                    positions,
                );
                black_box(&out);
            });
        return;
    }
    bencher
        .counter(divan::counter::ItemsCount::new(macs))
        .bench_local(|| {
            match (scores, bf16) {
                (true, true) => gemm_bf16_abt(
                    heads,
                    positions,
                    dk,
                    black_box(&q16),
                    dk,
                    black_box(&k16),
                    dk,
                    &mut out,
                    positions,
                    &[],
                ),
                (true, false) => gemm_f32_abt(
                    heads,
                    positions,
                    dk,
                    black_box(&q),
                    dk,
                    black_box(&k),
                    dk,
                    &mut out,
                    positions,
                    &[],
                ),
                (false, true) => gemm_bf16_ab(
                    heads,
                    positions,
                    dv,
                    black_box(&p16),
                    positions,
                    black_box(&k16),
                    dk,
                    &mut out,
                    dv,
                ),
                (false, false) => gemm_f32_ab(
                    heads,
                    positions,
                    dv,
                    black_box(&p),
                    positions,
                    black_box(&k),
                    dk,
                    &mut out,
                    dv,
                ),
            }
            black_box(&out);
        });
}
