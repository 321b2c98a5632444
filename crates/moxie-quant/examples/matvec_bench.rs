//! Micro-benchmark: single-threaded 4096 x 4096 matrix-vector product per weight type, every
//! available kernel level (scalar / AVX2 / AVX-512), reported as weight bytes read per second.
//!
//! ```text
//! cargo run -p moxie-quant --release --example matvec_bench            # all types, cache-resident
//! cargo run -p moxie-quant --release --example matvec_bench -- --dram  # rotate > 512 MiB of copies
//! cargo run -p moxie-quant --release --example matvec_bench -- Q4_K Q8_0
//! ```
//!
//! One 4096 x 4096 matrix fits in a large L3 (Q4_K: 9.4 MB), so the default measures kernel
//! speed; `--dram` cycles through enough copies to exceed 512 MiB so each matvec streams from
//! memory. Weights are random raw blocks with finite scales (the kernels' speed does not depend
//! on the values). The activation is quantized once per matvec, as ggml does; its cost is
//! reported separately. Not a test: it asserts nothing about time.

use std::time::{Duration, Instant};

use moxie_quant::*;

const ROWS: usize = 4096;
const COLS: usize = 4096;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn random_matrix(ty: GgmlType, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
    let mut m = vec![0u8; row_bytes * ROWS];
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let q = quantize_weights_fn(ty).unwrap();
            let mut x = vec![0f32; COLS];
            for row in m.chunks_exact_mut(row_bytes) {
                x.iter_mut().for_each(|v| *v = rng.f32());
                q(&x, row);
            }
        }
        _ => {
            for b in m.iter_mut() {
                *b = rng.next() as u8;
            }
            for blk in m.chunks_exact_mut(ty.type_size()) {
                for &off in ty.f16_scale_offsets() {
                    let h = f32_to_fp16(rng.f32() * 0.01);
                    blk[off..off + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    m
}

fn matvec(f: VecDotFn, w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
        *o = f(COLS, row, a);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dram = args.iter().any(|a| a == "--dram");
    let wanted: Vec<GgmlType> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| GgmlType::from_name(a).unwrap_or_else(|| panic!("unknown type {a}")))
        .collect();
    let types: Vec<GgmlType> = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ]
    .into_iter()
    .filter(|t| wanted.is_empty() || wanted.contains(t))
    .collect();

    let mut levels = vec![SimdLevel::Scalar];
    for l in [SimdLevel::Avx2, SimdLevel::Avx512] {
        if l <= hardware_simd_level() {
            levels.push(l);
        }
    }
    println!(
        "{ROWS}x{COLS} matvec, 1 thread, {} (hardware level {}, dispatch uses {})",
        if dram {
            "weights rotated over > 512 MiB (DRAM)"
        } else {
            "one matrix (cache-resident where it fits)"
        },
        hardware_simd_level().name(),
        simd_level().name()
    );
    println!(
        "{:<7} {:>9} {:<7} {:>10} {:>8} {:>12}",
        "type", "MiB", "kernel", "ms/matvec", "GB/s", "act-quant us"
    );

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let x: Vec<f32> = (0..COLS).map(|_| rng.f32()).collect();
    let mut out = vec![0f32; ROWS];
    for ty in types {
        let at = vec_dot_type(ty).unwrap();
        let row_bytes = ty.row_bytes(COLS as u64).unwrap() as usize;
        let mat_bytes = row_bytes * ROWS;
        let copies = if dram {
            (512 * 1024 * 1024 / mat_bytes + 1).max(2)
        } else {
            1
        };
        let first = random_matrix(ty, &mut rng);
        let mats: Vec<Vec<u8>> = vec![first; copies];
        let mut a = vec![0u8; at.row_bytes(COLS as u64).unwrap() as usize];

        for &level in &levels {
            let f = vec_dot_fn_for_level(ty, level).unwrap();
            let q = quantize_fn_for_level(at, level).unwrap();
            // activation quantization cost
            let t = Instant::now();
            let mut qn = 0u32;
            while t.elapsed() < Duration::from_millis(20) {
                q(std::hint::black_box(&x), &mut a);
                qn += 1;
            }
            let q_us = t.elapsed().as_secs_f64() * 1e6 / qn as f64;

            matvec(f, &mats[0], row_bytes, &a, &mut out); // warm-up
            let mut times = vec![];
            let start = Instant::now();
            let mut i = 0;
            while times.len() < 5
                || (start.elapsed() < Duration::from_millis(600) && times.len() < 200)
            {
                let m = &mats[i % copies];
                i += 1;
                let t = Instant::now();
                matvec(f, std::hint::black_box(m), row_bytes, &a, &mut out);
                times.push(t.elapsed().as_secs_f64());
                std::hint::black_box(&out);
            }
            times.sort_by(|p, q| p.partial_cmp(q).unwrap());
            let med = times[times.len() / 2];
            println!(
                "{:<7} {:>9.2} {:<7} {:>10.3} {:>8.2} {:>12.2}",
                ty.name(),
                mat_bytes as f64 / (1 << 20) as f64,
                level.name(),
                med * 1e3,
                mat_bytes as f64 / med / 1e9,
                q_us
            );
        }
    }
}
