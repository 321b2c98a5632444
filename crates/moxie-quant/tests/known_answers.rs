//! (c) Known answers for hand-built blocks of every type. The expected values are written from
//! ggml's struct definitions as per-element index formulas (not by reusing the crate's loops),
//! with power-of-two scales so every value is exact; a layout that is merely self-consistent
//! between the crate's quantizers and dequantizers cannot pass these.
//!
//! (Bit-exact agreement with ggml's own C code on random blocks is in `ggml_golden.rs`.)

mod common;
use moxie_quant::*;

/// kvalues_iq4nl from ggml-common.h, typed in again on purpose.
const KV: [i32; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// A few `iq3s_grid` entries of ggml-common.h, typed in again: (index, 4 magnitudes).
const IQ3S_POINTS: [(usize, [i32; 4]); 4] = [
    (0, [1, 1, 1, 1]),
    (1, [3, 1, 1, 1]),
    (256, [7, 5, 9, 5]),
    (511, [1, 1, 15, 15]),
];

/// A few `iq1s_grid` entries of ggml-common.h, typed in again: (index, 8 values).
const IQ1S_POINTS: [(usize, [i32; 8]); 5] = [
    (0, [-1; 8]),
    (1028, [-1, 0, 0, 0, 0, 0, 0, 0]),
    (1029, [0; 8]),
    (1030, [1, 0, 0, 0, 0, 0, 0, 0]),
    (2047, [1; 8]),
];

const N: usize = 512;

fn h(v: f32) -> [u8; 2] {
    let b = f32_to_fp16(v);
    assert_eq!(fp16_to_f32(b), v, "test scale must be exact in f16");
    b.to_le_bytes()
}

/// 7 sign bits plus an 8th making the number of set bits even (ggml's `ksigns_iq2xs`).
fn even_signs(s7: u8) -> u8 {
    s7 | ((s7.count_ones() as u8 & 1) << 7)
}

/// Builds `N` elements of `ty`: returns (bytes, expected dequantized values).
fn build(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    use GgmlType::*;
    let nb = N / ty.block_size();
    let mut bytes = vec![];
    let mut vals = vec![];
    let ds = [0.5f32, 0.25, 1.0, -0.125];
    let ms = [-1.0f32, 0.5, -2.0, 0.25];
    for b in 0..nb {
        let d = ds[b % 4];
        let m = ms[b % 4];
        let mut blk: Vec<u8> = vec![];
        let mut e: Vec<f32> = vec![];
        match ty {
            F32 => {
                let v = ((b % 61) as f32 - 30.0) * 0.375;
                blk.extend(v.to_le_bytes());
                e.push(v);
            }
            F16 => {
                let v = ((b % 61) as f32 - 30.0) * 0.375;
                blk.extend(h(v));
                e.push(v);
            }
            BF16 => {
                let v = ((b % 61) as f32 - 30.0) * 0.375;
                blk.extend(f32_to_bf16(v).to_le_bytes());
                e.push(v);
            }
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL => {
                let lo = |j: usize| ((3 * j + b) & 15) as u8;
                let hi = |j: usize| ((5 * j + b + 1) & 15) as u8;
                let qh: u32 = 0x9E37_79B9 ^ (b as u32).wrapping_mul(0x0101_0101);
                blk.extend(h(d));
                if matches!(ty, Q4_1 | Q5_1) {
                    blk.extend(h(m));
                }
                if matches!(ty, Q5_0 | Q5_1) {
                    blk.extend(qh.to_le_bytes());
                }
                for j in 0..16 {
                    blk.push(lo(j) | (hi(j) << 4));
                }
                for i in 0..32 {
                    let nib = if i < 16 { lo(i) } else { hi(i - 16) } as i32;
                    let q5 = nib | ((((qh >> i) & 1) as i32) << 4);
                    e.push(match ty {
                        Q4_0 => d * (nib - 8) as f32,
                        Q4_1 => d * nib as f32 + m,
                        Q5_0 => d * (q5 - 16) as f32,
                        Q5_1 => d * q5 as f32 + m,
                        _ => d * KV[nib as usize] as f32,
                    });
                }
            }
            Q8_0 => {
                blk.extend(h(d));
                for i in 0..32 {
                    let q = ((i * 37 + b * 11) % 255) as i32 - 127;
                    blk.push(q as i8 as u8);
                    e.push(d * q as f32);
                }
            }
            Q2_K => {
                let sc: Vec<u8> = (0..16)
                    .map(|k| (((k * 7 + b) & 15) | (((k * 3 + 2 * b) & 15) << 4)) as u8)
                    .collect();
                let qs: Vec<u8> = (0..64).map(|k| (k * 29 + b * 13) as u8).collect();
                let (d, dmin) = if b == 0 { (0.5, 0.25) } else { (0.125, 1.0) };
                blk.extend(&sc);
                blk.extend(&qs);
                blk.extend(h(d));
                blk.extend(h(dmin));
                for i in 0..256 {
                    let q = (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                    let s = sc[i / 16];
                    e.push(d * (s & 15) as f32 * q as f32 - dmin * (s >> 4) as f32);
                }
            }
            Q3_K => {
                let hm: Vec<u8> = (0..32).map(|k| (k * 73 + b * 5) as u8).collect();
                let qs: Vec<u8> = (0..64).map(|k| (k * 29 + b) as u8).collect();
                let s6: Vec<u8> = (0..16).map(|j| ((j * 11 + b * 7) % 64) as u8).collect();
                let mut sc = [0u8; 12];
                for j in 0..16 {
                    if j < 8 {
                        sc[j] |= s6[j] & 15;
                    } else {
                        sc[j - 8] |= (s6[j] & 15) << 4;
                    }
                    sc[8 + j % 4] |= (s6[j] >> 4) << (2 * (j / 4));
                }
                let d = 0.25f32;
                blk.extend(&hm);
                blk.extend(&qs);
                blk.extend(sc);
                blk.extend(h(d));
                for i in 0..256 {
                    let q2 = ((qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3) as i32;
                    let hbit = (hm[i % 32] >> (i / 32)) & 1;
                    let q = q2 - if hbit == 1 { 0 } else { 4 };
                    e.push(d * (s6[i / 16] as i32 - 32) as f32 * q as f32);
                }
            }
            Q4_K | Q5_K => {
                let sc: Vec<u8> = (0..8).map(|j| ((j * 13 + b * 3) % 64) as u8).collect();
                let mn: Vec<u8> = (0..8).map(|j| ((j * 7 + b * 5 + 1) % 64) as u8).collect();
                let mut packed = [0u8; 12];
                for j in 0..4 {
                    packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                    packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
                    packed[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
                }
                let qs: Vec<u8> = (0..128).map(|k| (k * 31 + b * 17) as u8).collect();
                let qh: Vec<u8> = (0..32).map(|k| (k * 53 + b * 7) as u8).collect();
                let (d, dmin) = (0.5f32, 0.25f32);
                blk.extend(h(d));
                blk.extend(h(dmin));
                blk.extend(packed);
                if ty == Q5_K {
                    blk.extend(&qh);
                }
                blk.extend(&qs);
                for i in 0..256 {
                    let mut q = ((qs[32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 15) as i32;
                    if ty == Q5_K {
                        q += 16 * ((qh[i % 32] >> (i / 32)) & 1) as i32;
                    }
                    e.push(d * sc[i / 32] as f32 * q as f32 - dmin * mn[i / 32] as f32);
                }
            }
            Q6_K => {
                let ql: Vec<u8> = (0..128).map(|k| (k * 41 + b * 3) as u8).collect();
                let qh: Vec<u8> = (0..64).map(|k| (k * 23 + b * 9) as u8).collect();
                let sc: Vec<i8> = (0..16)
                    .map(|k| (((k * 37 + b * 11) % 200) as i32 - 100) as i8)
                    .collect();
                let d = 0.125f32;
                blk.extend(&ql);
                blk.extend(&qh);
                blk.extend(sc.iter().map(|&s| s as u8));
                blk.extend(h(d));
                for i in 0..256 {
                    let (hh, r) = (i / 128, i % 128);
                    let (qq, l) = (r / 32, r % 32);
                    let low = (ql[64 * hh + l + 32 * (qq % 2)] >> (4 * (qq / 2))) & 15;
                    let high = (qh[32 * hh + l] >> (2 * qq)) & 3;
                    let q = (low | (high << 4)) as i32 - 32;
                    e.push(d * sc[i / 16] as f32 * q as f32);
                }
            }
            IQ4_XS => {
                let ls: Vec<u16> = (0..8)
                    .map(|ib| ((ib * 9 + b * 5 + 3) % 64) as u16)
                    .collect();
                let mut scales_h = 0u16;
                let mut scales_l = [0u8; 4];
                for ib in 0..8 {
                    scales_h |= (ls[ib] >> 4) << (2 * ib);
                    scales_l[ib / 2] |= ((ls[ib] & 15) as u8) << (4 * (ib % 2));
                }
                let qs: Vec<u8> = (0..128).map(|k| (k * 47 + b * 19) as u8).collect();
                let d = 0.25f32;
                blk.extend(h(d));
                blk.extend(scales_h.to_le_bytes());
                blk.extend(scales_l);
                blk.extend(&qs);
                for i in 0..256 {
                    let ib = i / 32;
                    let nib = (qs[16 * ib + i % 16] >> (4 * ((i % 32) / 16))) & 15;
                    e.push(d * (ls[ib] as i32 - 32) as f32 * KV[nib as usize] as f32);
                }
            }
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS => {
                let d = 0.5f32;
                blk.extend(h(d));
                let e0 = e.len();
                e.resize(e0 + 256, 0.0);
                // grid index and 7 sign bits of each group of 8, 4-bit scales per 16
                let grid_len = match ty {
                    IQ2_XS => 512,
                    IQ2_S => 1024,
                    _ => 256,
                };
                let idx = |g: usize| (g * 37 + b * 11 + 5) % grid_len;
                let s7 = |g: usize| ((g * 29 + b * 3 + 1) % 128) as u8;
                let ls = |i16: usize| ((i16 * 7 + b) % 16) as u8;
                // per 32, ggml packs one scale for IQ2_XXS / IQ3_XXS: the first 16's
                let ls_of = |i: usize| match ty {
                    IQ2_XS | IQ2_S => ls(i / 16),
                    _ => ls(i / 32 * 2),
                };
                match ty {
                    IQ2_XXS => {
                        for ib in 0..8 {
                            blk.extend((0..4).map(|l| idx(4 * ib + l) as u8));
                            let mut aux = (ls(2 * ib) as u32) << 28;
                            for l in 0..4 {
                                aux |= (s7(4 * ib + l) as u32) << (7 * l);
                            }
                            blk.extend(aux.to_le_bytes());
                        }
                    }
                    IQ2_XS => {
                        for g in 0..32 {
                            blk.extend((idx(g) as u16 | (s7(g) as u16) << 9).to_le_bytes());
                        }
                        blk.extend((0..8).map(|ib| ls(2 * ib) | ls(2 * ib + 1) << 4));
                    }
                    IQ2_S => {
                        blk.extend((0..32).map(|g| idx(g) as u8));
                        // IQ2_S stores all 8 signs; use the even-parity byte like the others
                        blk.extend((0..32).map(|g| even_signs(s7(g))));
                        blk.extend((0..8).map(|ib| {
                            (0..4).fold(0u8, |a, l| a | ((idx(4 * ib + l) >> 8) as u8) << (2 * l))
                        }));
                        blk.extend((0..8).map(|ib| ls(2 * ib) | ls(2 * ib + 1) << 4));
                    }
                    _ => {
                        // two 4-value grid entries per group of 8
                        for g in 0..32 {
                            blk.extend([idx(2 * g) as u8, idx(2 * g + 1) as u8]);
                        }
                        for ib in 0..8 {
                            let mut aux = (ls(2 * ib) as u32) << 28;
                            for l in 0..4 {
                                aux |= (s7(4 * ib + l) as u32) << (7 * l);
                            }
                            blk.extend(aux.to_le_bytes());
                        }
                    }
                }
                for i in 0..256 {
                    let (g, j) = (i / 8, i % 8);
                    let mag = match ty {
                        IQ2_XXS => iq_grids::IQ2XXS_GRID[idx(g)].to_le_bytes()[j],
                        IQ2_XS => iq_grids::IQ2XS_GRID[idx(g)].to_le_bytes()[j],
                        IQ2_S => iq_grids::IQ2S_GRID[idx(g)].to_le_bytes()[j],
                        _ => iq_grids::IQ3XXS_GRID[idx(2 * g + j / 4)].to_le_bytes()[j % 4],
                    } as f32;
                    let sign = if even_signs(s7(g)) >> j & 1 == 1 {
                        -1.0
                    } else {
                        1.0
                    };
                    let sub = if ty == IQ3_XXS { 0.5 } else { 0.25 };
                    e[e0 + i] = d * (0.5 + ls_of(i) as f32) * sub * mag * sign;
                }
            }
            IQ3_S => {
                // d, qs[64], qh[8] (bit k: 9th bit of index k), signs[32], scales[4]
                let sc = |ib: usize| (ib * 3 + b) % 16;
                let point = |ib: usize, k: usize| IQ3S_POINTS[(ib + k + b) % 4];
                let sign = |ib: usize, l: usize| (ib * 37 + l * 11 + b * 5) as u8;
                blk.extend(h(d));
                for ib in 0..8 {
                    blk.extend((0..8).map(|k| point(ib, k).0 as u8));
                }
                for ib in 0..8 {
                    blk.push((0..8).map(|k| ((point(ib, k).0 >> 8) << k) as u8).sum());
                }
                for ib in 0..8 {
                    blk.extend((0..4).map(|l| sign(ib, l)));
                }
                for p in 0..4 {
                    blk.push((sc(2 * p) | (sc(2 * p + 1) << 4)) as u8);
                }
                for i in 0..256 {
                    let (ib, l, j) = (i / 32, i % 32 / 8, i % 8);
                    let mag = point(ib, 2 * l + j / 4).1[j % 4];
                    let neg = (sign(ib, l) >> j) & 1 == 1;
                    let v = d * (1 + 2 * sc(ib)) as f32 * mag as f32;
                    e.push(if neg { -v } else { v });
                }
            }
            IQ1_S | IQ1_M => {
                // IQ1_S: d, qs[32], qh[8] (u16: 3 index bits per group, scale in bits 12..14,
                // delta sign in bit 15). IQ1_M: qs[32], qh[16] (a nibble per group: 3 index
                // bits, delta sign), scales[8] (u16: 3-bit scales per 16, f16 d in the top
                // nibbles).
                let point = |ib: usize, l: usize| IQ1S_POINTS[(ib * 4 + l + b) % 5];
                let ls = |ib: usize, half: usize| 2 * ((ib + 3 * half + b) % 8) + 1;
                let neg = |ib: usize, l: usize| match ty {
                    IQ1_S => (ib + b).is_multiple_of(3),
                    _ => (ib + l + b).is_multiple_of(3),
                };
                if ty == IQ1_S {
                    blk.extend(h(d));
                }
                for ib in 0..8 {
                    blk.extend((0..4).map(|l| point(ib, l).0 as u8));
                }
                if ty == IQ1_S {
                    for ib in 0..8 {
                        let mut qh = (((ls(ib, 0) - 1) / 2) << 12) as u16;
                        qh |= (neg(ib, 0) as u16) << 15;
                        for l in 0..4 {
                            qh |= ((point(ib, l).0 >> 8) << (3 * l)) as u16;
                        }
                        blk.extend(qh.to_le_bytes());
                    }
                } else {
                    for ib in 0..8 {
                        for p in 0..2 {
                            let nib =
                                |l: usize| (point(ib, l).0 >> 8) as u8 | (neg(ib, l) as u8) << 3;
                            blk.push(nib(2 * p) | (nib(2 * p + 1) << 4));
                        }
                    }
                    // the f16 d in the top nibbles of the scale words, typed in again
                    let dbits = f32_to_fp16(d);
                    for w in 0..4 {
                        let mut sc = 0u16;
                        for (k, (ib, half)) in
                            [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate()
                        {
                            sc |= (((ls(2 * w + ib, half) - 1) / 2) << (3 * k)) as u16;
                        }
                        sc |= ((dbits >> (4 * w)) & 0xf) << 12;
                        blk.extend(sc.to_le_bytes());
                    }
                }
                for i in 0..256 {
                    let (ib, l, j) = (i / 32, i % 32 / 8, i % 8);
                    let half = if ty == IQ1_S { 0 } else { l / 2 };
                    let delta = if neg(ib, l) { -0.125 } else { 0.125 };
                    let g = point(ib, l).1[j] as f32;
                    e.push(d * ls(ib, half) as f32 * (g + delta));
                }
            }
            _ => unreachable!(),
        }
        assert_eq!(blk.len(), ty.type_size(), "{ty}");
        bytes.extend(blk);
        vals.extend(e);
    }
    (bytes, vals)
}

/// Hand-built activations of `N` elements in `at`: (bytes, exact values).
fn build_act(at: GgmlType) -> (Vec<u8>, Vec<f32>) {
    use GgmlType::*;
    let mut bytes = vec![];
    let mut vals = vec![];
    match at {
        Q8_0 | Q8_1 => {
            for b in 0..N / 32 {
                let d = if b % 2 == 0 { 0.5f32 } else { 0.0625 };
                let qs: Vec<i32> = (0..32)
                    .map(|j| ((32 * b + j) * 7 % 23) as i32 - 11)
                    .collect();
                bytes.extend(h(d));
                if at == Q8_1 {
                    bytes.extend(h(d * qs.iter().sum::<i32>() as f32));
                }
                bytes.extend(qs.iter().map(|&q| q as i8 as u8));
                vals.extend(qs.iter().map(|&q| d * q as f32));
            }
        }
        Q8_K => {
            for b in 0..N / 256 {
                let d = if b == 0 { 0.25f32 } else { -0.5 };
                let qs: Vec<i32> = (0..256)
                    .map(|j| ((256 * b + j) * 5 % 19) as i32 - 9)
                    .collect();
                bytes.extend(d.to_le_bytes());
                bytes.extend(qs.iter().map(|&q| q as i8 as u8));
                for g in 0..16 {
                    let s: i32 = qs[16 * g..16 * g + 16].iter().sum();
                    bytes.extend((s as i16).to_le_bytes());
                }
                vals.extend(qs.iter().map(|&q| d * q as f32));
            }
        }
        F32 => {
            for i in 0..N {
                let v = (i % 13) as f32 * 0.5 - 3.0;
                bytes.extend(v.to_le_bytes());
                vals.push(v);
            }
        }
        F16 => {
            for i in 0..N {
                let v = (i % 13) as f32 * 0.5 - 3.0;
                bytes.extend(h(v));
                vals.push(v);
            }
        }
        BF16 => {
            for i in 0..N {
                let v = (i % 13) as f32 * 0.5 - 3.0;
                bytes.extend(f32_to_bf16(v).to_le_bytes());
                vals.push(v);
            }
        }
        _ => unreachable!(),
    }
    (bytes, vals)
}

#[test]
fn hand_built_blocks_dequantize_and_dot() {
    for ty in common::ALL_WEIGHT_TYPES {
        let (w, wv) = build(ty);
        let mut out = vec![0f32; N];
        dequantize_row(ty, &w, &mut out).unwrap();
        for i in 0..N {
            assert_eq!(out[i], wv[i], "{ty} element {i}");
        }
        let at = vec_dot_type(ty).unwrap();
        let (a, av) = build_act(at);
        let mut aout = vec![0f32; N];
        dequantize_row(at, &a, &mut aout).unwrap();
        assert_eq!(aout, av, "{at}");
        let exact: f64 = wv.iter().zip(&av).map(|(p, q)| *p as f64 * *q as f64).sum();
        let mag: f64 = wv
            .iter()
            .zip(&av)
            .map(|(p, q)| (*p as f64 * *q as f64).abs())
            .sum();
        for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
            let Some(f) = vec_dot_fn_for_level(ty, level) else {
                continue;
            };
            let got = f(N, &w, &a) as f64;
            assert!(
                (got - exact).abs() <= 2e-6 * mag,
                "{ty} {}: {got} vs {exact}",
                level.name()
            );
        }
    }
}

#[test]
fn q8_0_activation_rounds_half_to_even_and_weights_half_away() {
    let mut x = [0f32; 32];
    x[..7].copy_from_slice(&[2.5, 127.0, -3.5, 0.5, -0.5, 1.5, -126.5]);
    let mut act = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &x, &mut act).unwrap();
    assert_eq!(&act[..2], &[0x00, 0x3C]); // d = 1.0
    let q: Vec<i8> = act[2..9].iter().map(|&v| v as i8).collect();
    assert_eq!(q, [2, 127, -4, 0, 0, 2, -126]);
    let mut wq = [0u8; 34];
    quantize_weights_row(GgmlType::Q8_0, &x, &mut wq).unwrap();
    assert_eq!(&wq[..2], &[0x00, 0x3C]);
    let q: Vec<i8> = wq[2..9].iter().map(|&v| v as i8).collect();
    assert_eq!(q, [3, 127, -4, 1, -1, 2, -127]);
    // Q8_1 activations: same rounding plus s = d * sum
    let mut a1 = [0u8; 36];
    quantize_row(GgmlType::Q8_1, &x, &mut a1).unwrap();
    assert_eq!(&a1[..2], &[0x00, 0x3C]);
    assert_eq!(fp16_to_f32(u16::from_le_bytes([a1[2], a1[3]])), 1.0);
    let q: Vec<i8> = a1[4..11].iter().map(|&v| v as i8).collect();
    assert_eq!(q, [2, 127, -4, 0, 0, 2, -126]);
}

#[test]
fn q8_k_uses_signed_max_and_nearest_even() {
    let mut x = [0f32; 256];
    x[..4].copy_from_slice(&[127.0, 2.5, -3.5, -0.5]);
    x[16] = 10.0;
    let mut a = [0u8; 292];
    quantize_row(GgmlType::Q8_K, &x, &mut a).unwrap();
    // max is +127 -> iscale = -1 -> d = -1 and the quants are negated
    assert_eq!(f32::from_le_bytes(a[0..4].try_into().unwrap()), -1.0);
    let q: Vec<i8> = a[4..8].iter().map(|&v| v as i8).collect();
    assert_eq!(q, [-127, -2, 4, 0]);
    assert_eq!(a[4 + 16] as i8, -10);
    assert_eq!(i16::from_le_bytes([a[260], a[261]]), -125);
    assert_eq!(i16::from_le_bytes([a[262], a[263]]), -10);
    // all-zero block: d = 0, quants and sums zero
    let mut z = [0xAAu8; 292];
    quantize_row(GgmlType::Q8_K, &[0f32; 256], &mut z).unwrap();
    assert!(z.iter().all(|&v| v == 0));
}

#[test]
fn q4_0_weight_known_bytes() {
    let mut x = [0f32; 32];
    x[0] = -8.0;
    x[16] = 7.0;
    x[1] = 4.0;
    x[17] = -4.0;
    x[2] = 0.5;
    x[18] = -0.5;
    let mut q = [0u8; 18];
    quantize_weights_row(GgmlType::Q4_0, &x, &mut q).unwrap();
    let mut expect = [0x88u8; 18];
    expect[0] = 0x00;
    expect[1] = 0x3C; // d = max / -8 = 1.0
    expect[2] = 0xF0;
    expect[3] = 0x4C;
    expect[4] = 0x89;
    assert_eq!(q, expect);
}
