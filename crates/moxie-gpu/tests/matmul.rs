//! The weight kernels of `kernels/matmul.cu` and `kernels/matmul_q8.cu` on the emulated GPU,
//! for every weight type: `mul_mat` (dense and batched per head), `mul_mat_id` (routed
//! experts) and `get_rows`, against moxie-quant's dequantization (`dequantize_fn`) with f64
//! dot products. Where products take int8 activations (`Gpu::with_int8_activations`, for
//! the types `Gpu::has_int8_kernels`) the reference multiplies the activations as moxie-quant's
//! CPU path quantizes them for the type (Q8_0, Q8_1 or Q8_K), which the GPU must reproduce: a
//! kernel that skipped the quantization, or quantized differently, misses the bound by orders
//! of magnitude.
//!
//! With the `cuda` feature and `MOXIE_TEST_CUDA=1` the same tests run on the real CUDA0 (all
//! but the one that needs the emulator's small memory):
//! `MOXIE_TEST_CUDA=1 cargo test --release -p moxie-gpu --features cuda --test matmul`.

use std::sync::Arc;

use moxie_gpu::emu::EmuGpu;
use moxie_gpu::{Buffer, DevPtr, Error, Gpu, GpuBackend, Weight};
use moxie_quant::GgmlType;

/// xorshift64*: reproducible test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// The emulated GPU, or with the `cuda` feature and `MOXIE_TEST_CUDA=1` the real CUDA0
/// (`scripts/gpu-check.sh` runs these tests there).
fn gpu() -> Gpu {
    #[cfg(feature = "cuda")]
    if std::env::var("MOXIE_TEST_CUDA").is_ok_and(|v| v == "1") {
        let backend: Arc<dyn GpuBackend> =
            moxie_gpu::cuda::CudaGpu::open(0).expect("CUDA0 (MOXIE_TEST_CUDA=1)");
        return Gpu::new(backend);
    }
    let backend: Arc<dyn GpuBackend> = EmuGpu::new("EMU0", 256 << 20);
    Gpu::new(backend)
}

/// One product of `mul_mats` / `mul_mat_ids`: the weight, its output and output stride.
type Product<'w> = (&'w Weight, DevPtr, usize);

/// [`gpu`] with tensor cores: the emulator reporting them (`mma.sync` emulated by warp
/// shuffles), or the real CUDA0 where it has them.
fn gpu_with_tensor_cores() -> Gpu {
    #[cfg(feature = "cuda")]
    if std::env::var("MOXIE_TEST_CUDA").is_ok_and(|v| v == "1") {
        return gpu();
    }
    let emu = EmuGpu::new("EMU0", 256 << 20);
    emu.set_tensor_cores(true);
    let backend: Arc<dyn GpuBackend> = emu;
    Gpu::new(backend)
}

/// A quantized weight tensor on the device, with its rows dequantized on the host.
struct Tensor {
    _buf: Buffer,
    w: Weight,
    /// `n_mat * n_out` rows of `n_in` values, as moxie-quant dequantizes them.
    rows: Vec<Vec<f32>>,
    /// The same rows as the GPU's products read them, where that differs (IQ6_K's int8
    /// products: its code book, [`code_book_row`]).
    dot_rows: Option<Vec<Vec<f32>>>,
}

impl Tensor {
    fn new(
        gpu: &Gpu,
        ty: GgmlType,
        n_in: usize,
        n_out: usize,
        n_mat: usize,
        rng: &mut Rng,
    ) -> Tensor {
        let quantize = moxie_quant::quantize_weights_fn(ty);
        let dequantize = moxie_quant::dequantize_fn(ty).unwrap();
        let row_bytes = ty.row_bytes(n_in as u64).unwrap() as usize;
        let mut bytes = vec![0u8; row_bytes * n_out * n_mat];
        let mut rows = Vec::with_capacity(n_out * n_mat);
        let code_book = ty == GgmlType::IQ6_K && gpu.int8_activations();
        let mut dot_rows = Vec::new();
        for (i, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            // Rows of different magnitudes, so that scales vary.
            let scale = 0.05 + (i % 7) as f32 * 0.4;
            let src: Vec<f32> = rng.vec(n_in).iter().map(|v| v * scale).collect();
            match quantize {
                Some(quantize) => quantize(&src, dst),
                // types moxie only reads (IQ1/IQ2/IQ3, ik_llama.cpp's): random blocks with
                // finite scales, per block or, for the _KS types, in the row prefix
                None => {
                    for b in dst.iter_mut() {
                        *b = rng.next() as u8;
                    }
                    let meta = ty.row_meta_bytes();
                    let d = scale * 0.01 * (1.0 + rng.unit());
                    match meta {
                        0 => {}
                        2 => dst[..2].copy_from_slice(&moxie_quant::f32_to_fp16(d).to_le_bytes()),
                        4 => dst[..4].copy_from_slice(&d.to_le_bytes()),
                        _ => unreachable!("{ty}: row prefix of {meta} bytes"),
                    }
                    for blk in dst[meta..].chunks_exact_mut(ty.type_size()) {
                        let d = moxie_quant::f32_to_fp16(scale * 0.01 * (1.0 + rng.unit()));
                        if ty == GgmlType::IQ1_M {
                            // its f16 scale is spread over the top nibbles of the scale words
                            moxie_quant::iq1::set_iq1m_scale(blk, d);
                        }
                        for &off in ty.f16_scale_offsets() {
                            blk[off..off + 2].copy_from_slice(&d.to_le_bytes());
                        }
                    }
                }
            }
            let mut row = vec![0f32; n_in];
            dequantize(dst, &mut row);
            rows.push(row);
            if code_book {
                dot_rows.push(code_book_row(ty, dst, n_in));
            }
        }
        let buf = Buffer::from_bytes(gpu.backend(), &bytes).unwrap();
        let w = Weight {
            ptr: buf.ptr(),
            ty,
            n_in,
            n_out,
            n_mat,
        };
        assert_eq!(w.row_bytes(), row_bytes);
        Tensor {
            _buf: buf,
            w,
            rows,
            dot_rows: code_book.then_some(dot_rows),
        }
    }

    /// Row `r` of matrix `mat` as the GPU's products read it.
    fn row(&self, mat: usize, r: usize) -> &[f32] {
        &self.dot_rows.as_ref().unwrap_or(&self.rows)[mat * self.w.n_out + r]
    }
}

/// A row's values as dot products read them (moxie-quant's `vec_dot` with each one-hot
/// activation row): IQ6_K's products take its code book, whose values its dequantization's
/// cubic only rounds to, so its int8 products are checked against these.
fn code_book_row(ty: GgmlType, row: &[u8], n_in: usize) -> Vec<f32> {
    let act = moxie_quant::vec_dot_type(ty).unwrap();
    let mut q = vec![0u8; act.row_bytes(n_in as u64).unwrap() as usize];
    (0..n_in)
        .map(|i| {
            let mut x = vec![0f32; n_in];
            x[i] = 1.0;
            moxie_quant::quantize_row(act, &x, &mut q).unwrap();
            moxie_quant::vec_dot(ty, n_in, row, &q).unwrap()
        })
        .collect()
}

/// `Σ w·x` in f64, and `Σ |w·x|` (the scale of f32 rounding errors in the sum).
fn dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| {
        let p = w as f64 * x as f64;
        (s + p, a + p.abs())
    })
}

/// `x` as products with weights of type `ty` see it: where the GPU quantizes activations,
/// quantized to the CPU path's blocks for `ty` (Q8_0, Q8_1 (the same integers and scales) or
/// Q8_K) and back, else as it is.
fn seen(gpu: &Gpu, ty: GgmlType, x: &[f32]) -> Vec<f32> {
    if !(gpu.int8_activations() && Gpu::has_int8_kernels(ty)) {
        return x.to_vec();
    }
    let act = match moxie_quant::vec_dot_type(ty).unwrap() {
        GgmlType::Q8_1 => GgmlType::Q8_0,
        a => a,
    };
    let mut q = vec![0u8; act.row_bytes(x.len() as u64).unwrap() as usize];
    moxie_quant::quantize_fn(act).unwrap()(x, &mut q);
    let mut back = vec![0f32; x.len()];
    moxie_quant::dequantize_fn(act).unwrap()(&q, &mut back);
    back
}

/// `got` against the f64 product of `w` with `x` as `gpu` sees it for weights of type `ty`.
fn assert_close(
    got: f32,
    w: &[f32],
    x: &[f32],
    (gpu, ty): (&Gpu, GgmlType),
    what: &dyn Fn() -> String,
) {
    let (want, mag) = dot(w, &seen(gpu, ty, x));
    let err = (got as f64 - want).abs();
    assert!(
        err <= 1e-5 * mag + 1e-30,
        "{}: got {got}, want {want} (err {err:e}, Σ|w·x| {mag:e})",
        what()
    );
}

fn download(buf: &Buffer, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    buf.read_f32(0, &mut v).unwrap();
    v
}

const SENTINEL: f32 = -12345.0;

fn dense(gpu: &Gpu, ty: GgmlType, rng: &mut Rng) {
    let block = ty.block_size().max(32);
    // 768 leaves lanes idle; 2304 (72 chunks) has lanes take two or three chunks.
    dense_sizes(
        gpu,
        ty,
        rng,
        &[block, 768, 2304],
        &[1, 5, 67],
        &[1, 3, 9, 17],
    );
}

fn dense_sizes(
    gpu: &Gpu,
    ty: GgmlType,
    rng: &mut Rng,
    n_ins: &[usize],
    n_outs: &[usize],
    n_toks: &[usize],
) {
    for &n_in in n_ins {
        for &n_out in n_outs {
            let t = Tensor::new(gpu, ty, n_in, n_out, 1, rng);
            for &n_tok in n_toks {
                // Padded strides: x rows one value longer than n_in, y rows three longer than n_out.
                let (ldx, ldy) = (n_in + 1, n_out + 3);
                let x = rng.vec(ldx * n_tok);
                let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
                let yb = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; ldy * n_tok]).unwrap();
                gpu.mul_mat(&t.w, 1, xb.ptr(), ldx, 0, yb.ptr(), ldy, 0, n_tok)
                    .unwrap();
                let y = download(&yb, ldy * n_tok);
                for tok in 0..n_tok {
                    for r in 0..ldy {
                        let got = y[tok * ldy + r];
                        if r >= n_out {
                            assert_eq!(got, SENTINEL, "{ty} wrote past n_out");
                            continue;
                        }
                        let xt = &x[tok * ldx..tok * ldx + n_in];
                        assert_close(got, t.row(0, r), xt, (gpu, ty), &|| {
                            format!(
                                "{ty} n_in {n_in} n_out {n_out} n_tok {n_tok}: tok {tok} row {r}"
                            )
                        });
                    }
                }
            }
        }
    }
}

/// Per-head products: matrix b of the weight with head b of each token's row
/// (x[t*ldx + b*x_batch + i], y[t*ldy + b*y_batch + r]).
fn batched(gpu: &Gpu, ty: GgmlType, rng: &mut Rng, n_tok: usize) {
    let block = ty.block_size().max(32);
    let (n_in, n_out, n_mat, n_batch) = (2 * block, 6, 4, 3);
    let t = Tensor::new(gpu, ty, n_in, n_out, n_mat, rng);
    let (x_batch, ldx) = (n_in + 2, n_batch * (n_in + 2) + 4);
    let (y_batch, ldy) = (n_out, n_batch * n_out + 1);
    let x = rng.vec(ldx * n_tok);
    let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
    let yb = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; ldy * n_tok]).unwrap();
    gpu.mul_mat(
        &t.w,
        n_batch,
        xb.ptr(),
        ldx,
        x_batch,
        yb.ptr(),
        ldy,
        y_batch,
        n_tok,
    )
    .unwrap();
    let y = download(&yb, ldy * n_tok);
    for tok in 0..n_tok {
        for b in 0..n_batch {
            for r in 0..n_out {
                let xo = tok * ldx + b * x_batch;
                assert_close(
                    y[tok * ldy + b * y_batch + r],
                    t.row(b, r),
                    &x[xo..xo + n_in],
                    (gpu, ty),
                    &|| format!("{ty} batched: tok {tok} batch {b} row {r}"),
                );
            }
        }
        assert_eq!(
            y[tok * ldy + ldy - 1],
            SENTINEL,
            "{ty} batched wrote padding"
        );
    }
}

/// Routed experts with repeated and out-of-range ids, for gate/up (x_div 2) and down
/// (x_div 1) layouts.
fn routed(gpu: &Gpu, ty: GgmlType, rng: &mut Rng) {
    let block = ty.block_size().max(32);
    let (n_in, n_out, n_mat) = (2 * block, 7, 4);
    let t = Tensor::new(gpu, ty, n_in, n_out, n_mat, rng);
    let ids: Vec<i32> = vec![2, 0, 2, 9, 3, -1, 1, 2];
    for x_div in [1, 2] {
        check_routed(gpu, &t, &ids, x_div, rng, "routed");
    }
}

/// `mul_mat_id` of `t` for routed rows `ids` (x rows shared by `x_div` of them, padded rows of
/// x and y) against the reference: zeros for an id outside `0..n_mat`, nothing past `n_out`.
fn check_routed(gpu: &Gpu, t: &Tensor, ids: &[i32], x_div: usize, rng: &mut Rng, what: &str) {
    let (ty, n_in, n_out, n_mat) = (t.w.ty, t.w.n_in, t.w.n_out, t.w.n_mat);
    let idb = Buffer::from_bytes(gpu.backend(), bytemuck::cast_slice(ids)).unwrap();
    let n_x = ids.len().div_ceil(x_div);
    let ldx = n_in + 5;
    let ldy = n_out + 1;
    let x = rng.vec(ldx * n_x);
    let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
    let yb = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; ldy * ids.len()]).unwrap();
    gpu.mul_mat_id(
        &t.w,
        idb.ptr(),
        ids.len(),
        xb.ptr(),
        ldx,
        x_div,
        yb.ptr(),
        ldy,
    )
    .unwrap();
    let y = download(&yb, ldy * ids.len());
    for (j, &e) in ids.iter().enumerate() {
        for r in 0..n_out {
            let got = y[j * ldy + r];
            if !(0..n_mat as i32).contains(&e) {
                assert_eq!(
                    got.to_bits(),
                    0,
                    "{ty} {what} id {e} out of range: row {r} = {got}"
                );
                continue;
            }
            let xo = (j / x_div) * ldx;
            assert_close(
                got,
                t.row(e as usize, r),
                &x[xo..xo + n_in],
                (gpu, ty),
                &|| format!("{ty} {what} x_div {x_div}: j {j} expert {e} row {r}"),
            );
        }
        assert_eq!(y[j * ldy + n_out], SENTINEL, "{ty} {what} wrote padding");
    }
}

/// Embedding rows: exactly moxie-quant's values; ids count through all matrices; bad ids
/// give zeros.
fn get_rows(gpu: &Gpu, ty: GgmlType, rng: &mut Rng) {
    // 3 chunks per 256 block row and more than one get_rows block of chunks (64 per block).
    let n_in = if ty.block_size() == 256 { 2304 } else { 2080 };
    let (n_out, n_mat) = (5, 2);
    let t = Tensor::new(gpu, ty, n_in, n_out, n_mat, rng);
    let n_rows = (n_out * n_mat) as i32;
    let ids: Vec<i32> = vec![3, 0, n_rows - 1, -1, n_rows, 7, 3, i32::MAX];
    let idb = Buffer::from_bytes(gpu.backend(), bytemuck::cast_slice(&ids)).unwrap();
    let out = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; n_in * ids.len()]).unwrap();
    gpu.get_rows(&t.w, idb.ptr(), ids.len(), out.ptr()).unwrap();
    let got = download(&out, n_in * ids.len());
    for (j, &id) in ids.iter().enumerate() {
        let row = &got[j * n_in..(j + 1) * n_in];
        if (0..n_rows).contains(&id) {
            let want = &t.rows[id as usize];
            for (i, (g, w)) in row.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} get_rows id {id} value {i}: {g} != {w}"
                );
            }
        } else {
            assert!(
                row.iter().all(|v| v.to_bits() == 0),
                "{ty} get_rows id {id} not zeros"
            );
        }
    }
}

fn check_type(ty: GgmlType) {
    assert!(Gpu::supports(ty));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ty.id() as u64);
    // The f32 products, and the int8 ones where the type has them.
    let int8 = if Gpu::has_int8_kernels(ty) {
        &[false, true][..]
    } else {
        &[false]
    };
    for &on in int8 {
        let gpu = gpu().with_int8_activations(on);
        dense(&gpu, ty, &mut rng);
        batched(&gpu, ty, &mut rng, 5);
        routed(&gpu, ty, &mut rng);
    }
    if Gpu::has_int8_kernels(ty) {
        // Prompt batches on tensor cores (from 16 tokens): tiles of 16 rows and 32 tokens,
        // cut at both ends (67 rows: a block of 64 and a partial one; 17 and 40 tokens).
        let gpu = gpu_with_tensor_cores().with_int8_activations(true);
        assert!(gpu.tensor_cores());
        let block = ty.block_size().max(32);
        dense_sizes(&gpu, ty, &mut rng, &[block, 768], &[5, 67], &[17, 40]);
        batched(&gpu, ty, &mut rng, 33);
    }
    get_rows(&gpu(), ty, &mut rng);
}

macro_rules! type_tests {
    ($($name:ident: $ty:ident,)*) => {
        $(
            #[test]
            fn $name() {
                check_type(GgmlType::$ty);
            }
        )*
    };
}

type_tests! {
    f32: F32,
    f16: F16,
    bf16: BF16,
    q4_0: Q4_0,
    q4_1: Q4_1,
    q5_0: Q5_0,
    q5_1: Q5_1,
    q8_0: Q8_0,
    q2_k: Q2_K,
    q3_k: Q3_K,
    q4_k: Q4_K,
    q5_k: Q5_K,
    q6_k: Q6_K,
    iq4_nl: IQ4_NL,
    iq4_xs: IQ4_XS,
    iq2_xxs: IQ2_XXS,
    iq2_xs: IQ2_XS,
    iq2_s: IQ2_S,
    iq3_xxs: IQ3_XXS,
    iq3_s: IQ3_S,
    iq1_s: IQ1_S,
    iq1_m: IQ1_M,
    iq2_k: IQ2_K,
    iq3_k: IQ3_K,
    iq4_k: IQ4_K,
    iq5_k: IQ5_K,
    iq6_k: IQ6_K,
    iq2_ks: IQ2_KS,
    iq3_ks: IQ3_KS,
    iq4_ks: IQ4_KS,
    iq5_ks: IQ5_KS,
    q6_0: Q6_0,
}

#[test]
fn bad_arguments_are_errors() {
    let gpu = gpu();
    let buf = Buffer::new(gpu.backend(), 1 << 16).unwrap();
    let w = Weight {
        ptr: buf.ptr(),
        ty: GgmlType::Q4_K,
        n_in: 256,
        n_out: 4,
        n_mat: 2,
    };
    let p = buf.ptr();
    // Unsupported types.
    for ty in [GgmlType::TQ1_0, GgmlType::Q8_K, GgmlType::I32] {
        let w = Weight { ty, ..w };
        match gpu.mul_mat(&w, 1, p, 256, 0, p, 4, 0, 1) {
            Err(Error::Unsupported(msg)) => {
                assert_eq!(msg, format!("{ty} weights are not supported on the GPU"))
            }
            other => panic!("{ty}: {other:?}"),
        }
        assert!(matches!(
            gpu.get_rows(&w, p, 1, p),
            Err(Error::Unsupported(_))
        ));
    }
    // n_in not a whole number of blocks.
    let odd = Weight { n_in: 288, ..w };
    assert!(gpu.mul_mat(&odd, 1, p, 288, 0, p, 4, 0, 1).is_err());
    let odd = Weight {
        ty: GgmlType::F16,
        n_in: 48,
        ..w
    };
    assert!(gpu.get_rows(&odd, p, 1, p).is_err());
    // More batches than matrices, overlapping outputs, misaligned pointers, x_div 0.
    assert!(gpu.mul_mat(&w, 3, p, 256, 256, p, 4, 4, 1).is_err());
    assert!(gpu.mul_mat(&w, 1, p, 256, 0, p, 3, 0, 2).is_err());
    assert!(gpu
        .mul_mat(&w, 1, p.byte_add(2), 256, 0, p, 4, 0, 1)
        .is_err());
    let shifted = Weight {
        ptr: p.byte_add(8),
        ..w
    };
    assert!(gpu.mul_mat(&shifted, 1, p, 256, 0, p, 4, 0, 1).is_err());
    // A _KS type's rows (f32 prefix + 136-byte blocks) need 4-byte alignment, not 16.
    let ks = Weight {
        ty: GgmlType::IQ4_KS,
        ptr: p.byte_add(4),
        ..w
    };
    gpu.mul_mat(&ks, 1, p, 256, 0, p, 4, 0, 1).unwrap();
    let ks = Weight {
        ptr: p.byte_add(2),
        ..ks
    };
    assert!(gpu.mul_mat(&ks, 1, p, 256, 0, p, 4, 0, 1).is_err());
    assert!(gpu.mul_mat_id(&w, p, 1, p, 256, 0, p, 4).is_err());
    // Zero sizes launch nothing and succeed.
    gpu.mul_mat(&w, 0, p, 256, 0, p, 4, 0, 1).unwrap();
    gpu.mul_mat(&w, 1, p, 256, 0, p, 4, 0, 0).unwrap();
    gpu.mul_mat_id(&w, p, 0, p, 256, 1, p, 4).unwrap();
    gpu.get_rows(&w, p, 0, p).unwrap();
    gpu.synchronize().unwrap();
}

/// More routed rows and looked-up rows than CUDA allows in grid y: the launches spread them
/// over grid y and z (Q8_0's products also quantize that many activation rows).
#[test]
fn counts_past_the_grid_y_limit() {
    let gpu = gpu().with_int8_activations(true);
    let mut rng = Rng(7);
    let t = Tensor::new(&gpu, GgmlType::Q8_0, 32, 1, 3, &mut rng);
    let n: usize = 70_000;
    let ids: Vec<i32> = (0..n as i32).map(|j| j % 4).collect();
    let idb = Buffer::from_bytes(gpu.backend(), bytemuck::cast_slice(&ids)).unwrap();
    let x_div = 1;
    let x = rng.vec(32 * n.div_ceil(x_div));
    let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
    let yb = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; n]).unwrap();
    gpu.mul_mat_id(&t.w, idb.ptr(), n, xb.ptr(), 32, x_div, yb.ptr(), 1)
        .unwrap();
    let y = download(&yb, n);
    for (j, &e) in ids.iter().enumerate() {
        if e == 3 {
            assert_eq!(y[j].to_bits(), 0, "row {j}");
        } else {
            let xo = (j / x_div) * 32;
            assert_close(
                y[j],
                t.row(e as usize, 0),
                &x[xo..xo + 32],
                (&gpu, t.w.ty),
                &|| format!("row {j}"),
            );
        }
    }
    let out = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; 32 * n]).unwrap();
    gpu.get_rows(&t.w, idb.ptr(), n, out.ptr()).unwrap();
    let got = download(&out, 32 * n);
    for (j, &e) in ids.iter().enumerate() {
        let row = &got[32 * j..32 * j + 32];
        if e == 3 {
            assert!(row.iter().all(|v| v.to_bits() == 0), "row {j}");
        } else {
            assert_eq!(row, &t.rows[e as usize][..], "row {j}");
        }
    }
}

/// `kernels/iqk_values.cuh` holds moxie-quant's code books of ik_llama.cpp's types (`iqk.rs`),
/// every entry in order.
#[test]
fn ik_code_books_equal_moxie_quants() {
    use moxie_quant::iqk;
    let src = include_str!("../kernels/iqk_values.cuh");
    let table = |name: &str| -> Vec<i8> {
        let start = src
            .find(&format!("int8_t {name}["))
            .unwrap_or_else(|| panic!("{name} not in iqk_values.cuh"));
        let body = &src[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        body.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}: {v:?}: {e}")))
            .collect()
    };
    for (name, want) in [
        ("mx_iq2nl_values", &iqk::IQ2NL[..]),
        ("mx_iq3nl_values", &iqk::IQ3NL[..]),
        ("mx_iq4k_values", &iqk::IQ4K[..]),
        ("mx_iq5nl_values", &iqk::IQ5NL[..]),
        ("mx_iq6nl_values", &iqk::IQ6NL[..]),
    ] {
        assert_eq!(table(name), want, "{name}");
    }
}

/// Where the device has no room for the int8 activations' work buffer, the product runs the
/// f32 kernel instead: the results are the unquantized activations' (the bound `seen` would
/// give quantized ones misses by orders of magnitude), and nothing fails.
#[test]
fn products_without_room_for_int8_activations_take_f32_ones() {
    let ty = GgmlType::Q4_K;
    assert!(Gpu::has_int8_kernels(ty));
    let (n_in, n_out, n_tok) = (2304, 5, 17);
    let w_bytes = ty.row_bytes(n_in as u64).unwrap() as usize * n_out;
    // Weights, activations and results (each allocation rounded up to 256 bytes), and less
    // than the 58 KiB the int8 activations would take.
    let room = [w_bytes, 4 * n_in * n_tok, 4 * n_out * n_tok]
        .iter()
        .map(|b| b.next_multiple_of(256))
        .sum::<usize>()
        + 1024;
    let backend: Arc<dyn GpuBackend> = EmuGpu::new("EMU0", room as u64);
    let gpu = Gpu::new(backend).with_int8_activations(true);
    let mut rng = Rng(23);
    let t = Tensor::new(&gpu, ty, n_in, n_out, 1, &mut rng);
    let x = rng.vec(n_in * n_tok);
    let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
    let yb = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; n_out * n_tok]).unwrap();
    gpu.mul_mat(&t.w, 1, xb.ptr(), n_in, 0, yb.ptr(), n_out, 0, n_tok)
        .unwrap();
    let y = download(&yb, n_out * n_tok);
    for tok in 0..n_tok {
        for r in 0..n_out {
            let xt = &x[tok * n_in..(tok + 1) * n_in];
            // F32 is never quantized: the reference is the activations as they are.
            assert_close(
                y[tok * n_out + r],
                t.row(0, r),
                xt,
                (&gpu, GgmlType::F32),
                &|| format!("tok {tok} row {r}"),
            );
        }
    }
}

/// `quantize_q8x` gives exactly the bytes of moxie-quant's activation blocks (the CPU path's):
/// the same int8 codes, the same scale (Q8_0's f16 d, Q8_K's f32 d), and sums of each 16 that
/// match the codes. Rows of varied magnitude, with zero blocks, ties of magnitude of both
/// signs, and values on rounding boundaries.
#[test]
fn int8_activations_are_the_cpu_blocks() {
    let gpu = gpu();
    let mut rng = Rng(31);
    for (act, per) in [(GgmlType::Q8_0, 32usize), (GgmlType::Q8_K, 256)] {
        let (n_in, n_rows) = (1024usize, 6usize);
        let mut x: Vec<f32> = (0..n_in * n_rows)
            .map(|i| rng.unit() * [1e-3, 0.5, 7.0, 300.0][i / n_in % 4])
            .collect();
        // A zero block, a tie of magnitudes with opposite signs (the first one sets Q8_K's
        // sign), and values that land on .5 after scaling.
        x[n_in..n_in + per].fill(0.0);
        x[2 * n_in + 3] = 9.0;
        x[2 * n_in + 5] = -9.0;
        for j in 0..per {
            x[3 * n_in + j] = (j as f32 - 16.0) * 0.5;
        }
        let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
        let codes = Buffer::new(gpu.backend(), n_in * n_rows).unwrap();
        let meta = Buffer::new(gpu.backend(), n_in * n_rows / 32 * 16).unwrap();
        let cfg = moxie_gpu::LaunchConfig {
            grid: [(n_in / per).div_ceil(8) as u32, n_rows as u32, 1],
            block: [32, 8, 1],
            shared_bytes: 0,
        };
        let args = [
            moxie_gpu::Arg::Ptr(xb.ptr()),
            moxie_gpu::Arg::I32(n_in as i32),
            moxie_gpu::Arg::I32(1),
            moxie_gpu::Arg::I32(n_in as i32),
            moxie_gpu::Arg::I32(0),
            moxie_gpu::Arg::I32(n_rows as i32),
            moxie_gpu::Arg::I32(per as i32),
            moxie_gpu::Arg::Ptr(codes.ptr()),
            moxie_gpu::Arg::Ptr(meta.ptr()),
        ];
        gpu.backend().launch("quantize_q8x", cfg, &args).unwrap();
        let mut got_q = vec![0u8; n_in * n_rows];
        codes.read(0, &mut got_q).unwrap();
        let got_m = download(&meta, n_in * n_rows / 32 * 4);
        let quantize = moxie_quant::quantize_fn(act).unwrap();
        let block_bytes = act.type_size();
        for r in 0..n_rows {
            let mut want = vec![0u8; act.row_bytes(n_in as u64).unwrap() as usize];
            quantize(&x[r * n_in..(r + 1) * n_in], &mut want);
            for (b, blk) in want.chunks_exact(block_bytes).enumerate() {
                let (d, qs) = match act {
                    GgmlType::Q8_0 => (
                        moxie_quant::fp16_to_f32(u16::from_le_bytes([blk[0], blk[1]])),
                        &blk[2..34],
                    ),
                    _ => (
                        f32::from_le_bytes(blk[..4].try_into().unwrap()),
                        &blk[4..260],
                    ),
                };
                let at = r * n_in + b * per;
                assert_eq!(&got_q[at..at + per], qs, "{act} row {r} block {b}: codes");
                for c in 0..per / 32 {
                    let m = &got_m[(at / 32 + c) * 4..(at / 32 + c) * 4 + 4];
                    assert_eq!(m[0].to_bits(), d.to_bits(), "{act} row {r} block {b}: d");
                    for h in 0..2 {
                        let s: i32 = qs[32 * c + 16 * h..32 * c + 16 * h + 16]
                            .iter()
                            .map(|&v| v as i8 as i32)
                            .sum();
                        assert_eq!(m[1 + h], d * s as f32, "{act} row {r} chunk {c}: sum {h}");
                    }
                }
            }
        }
    }
}

/// A prompt batch's routed rows (many per expert) go through `group_rows` and the grouped
/// kernel: every row against the reference, experts with no rows, with a number of rows that
/// is not a multiple of the 8 per pass, and ids out of range (zeros). Also on tensor cores
/// (16 rows a warp: 9 and 70 rows cut the tiles).
#[test]
fn routed_batches_grouped_by_expert() {
    let mut rng = Rng(41);
    let types = [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ2_XS];
    let runs = types
        .iter()
        .map(|&ty| (ty, false, 9))
        .chain(types.iter().flat_map(|&ty| [(ty, true, 9), (ty, true, 70)]));
    for (ty, tensor_cores, n_out) in runs {
        let gpu = match tensor_cores {
            true => gpu_with_tensor_cores(),
            false => gpu(),
        }
        .with_int8_activations(true);
        let block = ty.block_size().max(32);
        let (n_in, n_mat) = (2 * block, 6);
        let t = Tensor::new(&gpu, ty, n_in, n_out, n_mat, &mut rng);
        // Expert 4 gets no rows; 5 gets 3; -1 and 6 are out of range.
        let ids: Vec<i32> = (0..203)
            .map(|j| match j % 29 {
                0 => -1,
                1 => 6,
                2 | 3 if j < 40 => 5,
                2 => 5,
                _ => [0, 1, 2, 3, 0, 1, 2][j % 7],
            })
            .collect();
        assert!(
            ids.len() >= 4 * n_mat,
            "enough rows to take the grouped kernel"
        );
        for x_div in [1, 3] {
            check_routed(&gpu, &t, &ids, x_div, &mut rng, "grouped");
        }
    }
}

/// Products that share their input (`mul_mats`: q/k/v, gate/up; `mul_mat_ids`: an expert
/// layer's gate and up) give each product's results bit for bit, and quantize the input once
/// where every weight takes the same int8 activations: 1 + n launches instead of 2n. Weights
/// of different activation blocks (Q8_0 and Q4_K) or without int8 kernels (F16) take separate
/// products. Decode-sized (grouped by nothing) and prompt-sized (grouped by expert) routes.
#[test]
fn products_sharing_an_input_quantize_it_once() {
    let mut rng = Rng(53);
    let emu = EmuGpu::new("EMU0", 256 << 20);
    let backend: Arc<dyn GpuBackend> = emu.clone();
    let gpu = Gpu::new(backend).with_int8_activations(true);
    let n_in = 512;
    for (types, shared) in [
        (
            &[GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS][..],
            true,
        ),
        (&[GgmlType::Q8_0, GgmlType::Q4_0][..], true),
        (&[GgmlType::Q8_0, GgmlType::Q4_K][..], false),
        (&[GgmlType::Q4_K, GgmlType::F16][..], false),
    ] {
        let ts: Vec<Tensor> = types
            .iter()
            .enumerate()
            .map(|(i, &ty)| Tensor::new(&gpu, ty, n_in, 5 + 3 * i, 4, &mut rng))
            .collect();
        for (n_tok, ids) in [
            (3, vec![0, 3, 1, 2, -1, 0]),
            (40, (0..80).map(|j| j % 5 - 1).collect::<Vec<i32>>()),
        ] {
            let ldx = n_in + 3;
            let x = rng.vec(ldx * n_tok);
            let xb = Buffer::from_f32(gpu.backend(), &x).unwrap();
            let idb = Buffer::from_bytes(gpu.backend(), bytemuck::cast_slice(&ids)).unwrap();
            let outs = |rows: usize| -> Vec<(Buffer, usize)> {
                ts.iter()
                    .map(|t| {
                        let ldy = t.w.n_out + 2;
                        let b = Buffer::from_f32(gpu.backend(), &vec![SENTINEL; ldy * rows]);
                        (b.unwrap(), ldy)
                    })
                    .collect()
            };
            let read_all = |bs: &[(Buffer, usize)], rows: usize| -> Vec<Vec<f32>> {
                bs.iter().map(|(b, ldy)| download(b, ldy * rows)).collect()
            };
            // Each product on its own, then all together: the same results; the launches of
            // each way.
            let compare = |rows: usize,
                           what: &str,
                           one_product: &dyn Fn(&Weight, DevPtr, usize),
                           all_products: &dyn Fn(&[Product])|
             -> (u64, u64) {
                let (one, all) = (outs(rows), outs(rows));
                let before = emu.launches();
                for (t, (b, ldy)) in ts.iter().zip(&one) {
                    one_product(&t.w, b.ptr(), *ldy);
                }
                let separate = emu.launches() - before;
                let products: Vec<_> = ts
                    .iter()
                    .zip(&all)
                    .map(|(t, (b, ldy))| (&t.w, b.ptr(), *ldy))
                    .collect();
                let before = emu.launches();
                all_products(&products);
                let together = emu.launches() - before;
                assert_eq!(
                    read_all(&one, rows),
                    read_all(&all, rows),
                    "{types:?} {what}"
                );
                (separate, together)
            };
            // Dense.
            let (separate, together) = compare(
                n_tok,
                "dense",
                &|w, y, ldy| {
                    gpu.mul_mat(w, 1, xb.ptr(), ldx, 0, y, ldy, 0, n_tok)
                        .unwrap()
                },
                &|products| gpu.mul_mats(products, xb.ptr(), ldx, n_tok).unwrap(),
            );
            let want = if shared {
                1 + ts.len() as u64
            } else {
                separate
            };
            assert_eq!(together, want, "{types:?} dense: launches");
            // Routed, x rows shared by 2 routes each.
            let n_ids = ids.len();
            let (separate, together) = compare(
                n_ids,
                "routed",
                &|w, y, ldy| {
                    gpu.mul_mat_id(w, idb.ptr(), n_ids, xb.ptr(), ldx, 2, y, ldy)
                        .unwrap()
                },
                &|products| {
                    gpu.mul_mat_ids(products, idb.ptr(), n_ids, xb.ptr(), ldx, 2)
                        .unwrap()
                },
            );
            // One quantization fewer per product after the first.
            let want = if shared {
                separate - (ts.len() as u64 - 1)
            } else {
                separate
            };
            assert_eq!(together, want, "{types:?} routed {n_ids}: launches");
        }
    }
}
