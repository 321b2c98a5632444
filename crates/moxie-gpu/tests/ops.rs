//! The kernels of `kernels/ops.cu`, run on the CPU emulator, against plain Rust references.
//! (Routing is checked against moxie-core's `route_top_k` in moxie-core's tests.)

use std::sync::Arc;

use moxie_gpu::emu::EmuGpu;
use moxie_gpu::ops::{AttnShape, DeltaNetDims, KvView, Selection};
use moxie_gpu::{Buffer, Gpu, GpuBackend};
use moxie_quant::GgmlType;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn gpu() -> Gpu {
    let backend: Arc<dyn GpuBackend> = EmuGpu::new("CUDA0", 1 << 28);
    Gpu::new(backend)
}

fn upload(g: &Gpu, v: &[f32]) -> Buffer {
    Buffer::from_f32(g.backend(), v).unwrap()
}

fn read(b: &Buffer, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    b.read_f32(0, &mut out).unwrap();
    out
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn rms_norm_rows_with_strides_and_in_place() {
    let g = gpu();
    for (rows, cols) in [(1, 7), (3, 64), (2, 1500)] {
        let x = values(rows * cols, 1);
        let w = values(cols, 2);
        let xb = upload(&g, &x);
        let wb = upload(&g, &w);
        g.rms_norm(xb.ptr(), cols, wb.ptr(), xb.ptr(), cols, rows, cols, 1e-6)
            .unwrap();
        let got = read(&xb, rows * cols);
        let mut want = x.clone();
        for r in want.chunks_exact_mut(cols) {
            let ms = r.iter().map(|v| (v * v) as f64).sum::<f64>() / cols as f64;
            let s = 1.0 / (ms + 1e-6).sqrt();
            for (v, w) in r.iter_mut().zip(&w) {
                *v = (*v as f64 * s) as f32 * w;
            }
        }
        close(&got, &want, 1e-5, &format!("rms_norm {rows}x{cols}"));
    }
}

#[test]
fn elementwise_ops() {
    let g = gpu();
    let n = 1000;
    let (a, b) = (values(n, 3), values(n, 4));
    let (ab, bb) = (upload(&g, &a), upload(&g, &b));
    g.add(ab.ptr(), bb.ptr(), n).unwrap();
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(read(&ab, n), sum);
    let bias = values(10, 5);
    let biasb = upload(&g, &bias);
    g.add_bias(ab.ptr(), biasb.ptr(), n, 10).unwrap();
    let biased: Vec<f32> = sum
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % 10])
        .collect();
    assert_eq!(read(&ab, n), biased);
    g.swiglu(ab.ptr(), bb.ptr(), n).unwrap();
    let want: Vec<f32> = biased
        .iter()
        .zip(&b)
        .map(|(x, u)| x / (1.0 + (-x).exp()) * u)
        .collect();
    close(&read(&ab, n), &want, 1e-6, "swiglu");
    // Strided copy: 3 rows of 4 values from a 7-wide layout into a 5-wide one, offset 1.
    let src = values(21, 6);
    let sb = upload(&g, &src);
    let db = upload(&g, &[0.0; 15]);
    g.copy_rows(db.ptr().offset::<f32>(1), 5, sb.ptr(), 7, 3, 4)
        .unwrap();
    let got = read(&db, 15);
    for r in 0..3 {
        assert_eq!(got[r * 5], 0.0);
        assert_eq!(&got[r * 5 + 1..r * 5 + 5], &src[r * 7..r * 7 + 4]);
    }
}

#[test]
fn rope_normal_and_neox_with_offset() {
    let g = gpu();
    let (n_tok, n_head, hd, offset, n_pairs) = (3, 2, 12, 4, 4);
    let x = values(n_tok * n_head * hd, 7);
    let cs: Vec<f32> = (0..n_tok * n_pairs)
        .flat_map(|i| {
            let t = i as f32 * 0.37;
            [t.cos(), t.sin()]
        })
        .collect();
    for neox in [false, true] {
        let xb = upload(&g, &x);
        let cb = upload(&g, &cs);
        g.rope(
            xb.ptr(),
            cb.ptr(),
            n_tok,
            n_head,
            hd,
            n_head * hd,
            offset,
            n_pairs,
            neox,
        )
        .unwrap();
        let mut want = x.clone();
        for t in 0..n_tok {
            for h in 0..n_head {
                let base = t * n_head * hd + h * hd + offset;
                for i in 0..n_pairs {
                    let (a, b) = if neox {
                        (i, i + n_pairs)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (c, s) = (cs[(t * n_pairs + i) * 2], cs[(t * n_pairs + i) * 2 + 1]);
                    let (x0, x1) = (want[base + a], want[base + b]);
                    want[base + a] = x0.mul_add(c, -(x1 * s));
                    want[base + b] = x0.mul_add(s, x1 * c);
                }
            }
        }
        assert_eq!(read(&xb, x.len()), want, "neox {neox}");
    }
}

#[test]
fn kv_store_rounds_to_f16_like_half() {
    let g = gpu();
    let src: Vec<f32> = values(2 * 9, 8)
        .iter()
        .map(|v| v * 70000.0)
        .chain([1e-7, -3e-5, 65519.0, 65520.0, f32::INFINITY, f32::NAN])
        .collect();
    let rows = src.len() / 6;
    let sb = upload(&g, &src);
    let cache = Buffer::new(g.backend(), src.len() * 2).unwrap();
    g.kv_store(cache.ptr(), GgmlType::F16, sb.ptr(), rows, 6, 6)
        .unwrap();
    let mut raw = vec![0u8; src.len() * 2];
    cache.read(0, &mut raw).unwrap();
    for (i, v) in src.iter().enumerate() {
        let got = u16::from_ne_bytes([raw[2 * i], raw[2 * i + 1]]);
        let want = half::f16::from_f32(*v);
        if v.is_nan() {
            assert!(half::f16::from_bits(got).is_nan());
        } else {
            assert_eq!(got, want.to_bits(), "{v}");
        }
    }
}

/// Causal attention reference: query t (at position pos0 + t) over positions 0..=pos0 + t, or
/// over the positions `sel[t]` lists; caches of types `(kt, vt)` round as the CPU does: each
/// query row through the keys' dot partner (f16, q8_0), and for a prompt batch over f16 values
/// whose context stays under `ATTN_ROUND_PROBS_BELOW`, the normalised probabilities to f16.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: AttnShape,
    k_row: usize,
    v_row: usize,
    n_tok: usize,
    sel: Option<&[Option<Vec<usize>>]>,
    (kt, vt): (GgmlType, GgmlType),
) -> Vec<f32> {
    let mut q = q.to_vec();
    let partner = moxie_quant::vec_dot_type(kt).unwrap();
    for row in q.chunks_exact_mut(s.dk) {
        round_trip(row, partner);
    }
    let q = &q[..];
    let round_p =
        n_tok > 1 && vt == GgmlType::F16 && s.pos0 + n_tok < moxie_gpu::ops::ATTN_ROUND_PROBS_BELOW;
    let group = s.n_head / s.n_head_kv;
    let mut out = vec![0f32; n_tok * s.n_head * s.dv];
    for t in 0..n_tok {
        let positions: Vec<usize> = match sel.and_then(|l| l[t].clone()) {
            Some(list) => list,
            None => (0..=s.pos0 + t).collect(),
        };
        for h in 0..s.n_head {
            let kvh = h / group;
            let qr = &q[(t * s.n_head + h) * s.dk..][..s.dk];
            let scores: Vec<f64> = positions
                .iter()
                .map(|&p| {
                    let kr = &k[p * k_row + kvh * s.dk..][..s.dk];
                    qr.iter().zip(kr).map(|(a, b)| (a * b) as f64).sum::<f64>() * s.scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let mut l: f64 = e.iter().sum();
            if round_p {
                for p in e.iter_mut() {
                    *p = half::f16::from_f32((*p / l) as f32).to_f64();
                }
                l = 1.0;
            }
            for d in 0..s.dv {
                let acc: f64 = positions
                    .iter()
                    .zip(&e)
                    .map(|(&p, &ep)| ep * v[p * v_row + kvh * s.dv + d] as f64)
                    .sum();
                out[(t * s.n_head + h) * s.dv + d] = (acc / l) as f32;
            }
        }
    }
    out
}

#[test]
fn attention_gqa_and_mla_shapes_over_several_tiles() {
    let g = gpu();
    // (n_head, n_head_kv, dk, dv, pos0, n_tok, mla)
    for (nh, nkv, dk, dv, pos0, n_tok, mla) in [
        (4, 2, 64, 64, 0, 5, false),
        (4, 2, 64, 64, 300, 1, false),
        (4, 1, 72, 64, 130, 3, true),
        (2, 2, 32, 48, 7, 2, false),
        // Blocks of 8 heads of a kv head: 12 = 8 + 4; MLA's 16 heads over the latent (576
        // wide keys, the first 512 its values) in two blocks; 8 heads of 1152.
        (12, 1, 64, 64, 140, 2, false),
        (16, 2, 128, 96, 0, 4, false),
        (16, 1, 576, 512, 150, 2, true),
        (8, 1, 1152, 128, 20, 2, false),
    ] {
        // Key and value cache types (MLA: its keys are its values).
        for (kt, vt) in [
            (GgmlType::F32, GgmlType::F32),
            (GgmlType::F16, GgmlType::F16),
            (GgmlType::Q8_0, GgmlType::Q8_0),
            (GgmlType::Q8_0, GgmlType::F16),
            (GgmlType::F16, GgmlType::Q8_0),
        ] {
            let vt = if mla { kt } else { vt };
            let n_pos = pos0 + n_tok;
            let k_row = nkv * dk;
            let v_row = if mla { k_row } else { nkv * dv };
            let q8 = kt == GgmlType::Q8_0 || vt == GgmlType::Q8_0;
            if q8 && (dk % 32 != 0 || dv % 32 != 0) {
                continue; // q8_0 heads are whole blocks (the CPU cache refuses others too)
            }
            let q = values(n_tok * nh * dk, 9);
            let mut k = values(n_pos * k_row, 10);
            let mut v = if mla {
                k.clone()
            } else {
                values(n_pos * v_row, 11)
            };
            let store = |data: &[f32], ty: GgmlType| -> Buffer {
                let src = upload(&g, data);
                let bytes = ty.row_bytes(data.len() as u64).unwrap() as usize;
                let b = Buffer::new(g.backend(), bytes).unwrap();
                g.kv_store(b.ptr(), ty, src.ptr(), 1, data.len(), data.len())
                    .unwrap();
                g.synchronize().unwrap();
                b
            };
            let kb = store(&k, kt);
            let vb = if mla { None } else { Some(store(&v, vt)) };
            // The reference reads what the caches hold.
            round_trip(&mut k, kt);
            if mla {
                v = k.clone();
            } else {
                round_trip(&mut v, vt);
            }
            let qb = upload(&g, &q);
            let ob = Buffer::new(g.backend(), n_tok * nh * dv * 4).unwrap();
            let s = AttnShape {
                n_head: nh,
                n_head_kv: nkv,
                dk,
                dv,
                pos0,
                scale: 1.0 / (dk as f32).sqrt(),
            };
            let view = KvView {
                k: kb.ptr(),
                v: vb.as_ref().map_or(kb.ptr(), Buffer::ptr),
                k_row,
                v_row,
                k_type: kt,
                v_type: vt,
            };
            g.attention(s, qb.ptr(), view, None, ob.ptr(), n_tok)
                .unwrap();
            let want = attention_ref(&q, &k, &v, s, k_row, v_row, n_tok, None, (kt, vt));
            let got = read(&ob, want.len());
            let what =
                format!("attention h{nh}/{nkv} dk{dk} dv{dv} pos0 {pos0} n{n_tok} {kt}/{vt}");
            close(&got, &want, 2e-5, &what);
            // Fewer heads a block: more blocks, the same bits.
            for heads in [1, 3] {
                let g = g.clone().with_attention_heads(heads);
                g.attention(s, qb.ptr(), view, None, ob.ptr(), n_tok)
                    .unwrap();
                let other = read(&ob, want.len());
                assert!(
                    got.iter()
                        .zip(&other)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: blocks of {heads} heads changed the results"
                );
            }
        }
    }
}

/// `x` as a cache of type `ty` holds it: through the CPU's conversion to `ty` and back.
fn round_trip(x: &mut [f32], ty: GgmlType) {
    if ty == GgmlType::F32 {
        return;
    }
    let mut bytes = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    moxie_quant::quantize_fn(ty).unwrap()(x, &mut bytes);
    moxie_quant::dequantize_fn(ty).unwrap()(&bytes, x);
}

/// The GPU's q8_0 cache rows are the bytes the CPU cache stores for the same values (so a
/// layer's cache means the same on either device), zero blocks and ties included.
#[test]
fn kv_store_q8_0_writes_the_cpu_cache_bytes() {
    let g = gpu();
    let (rows, width, stride) = (5, 96, 100);
    let mut src = values(rows * stride, 70);
    src[..32].fill(0.0); // an all-zero block: scale 0
                         // The block's largest magnitude 127/64, so values are multiplied by exactly 64: 62.5 is a
                         // tie, which the CPU's conversion rounds to even (62).
    src[32] = 1.984375;
    src[33] = 0.9765625;
    let sb = upload(&g, &src);
    let row_bytes = GgmlType::Q8_0.row_bytes(width as u64).unwrap() as usize;
    let cache = Buffer::new(g.backend(), rows * row_bytes).unwrap();
    g.kv_store(cache.ptr(), GgmlType::Q8_0, sb.ptr(), rows, width, stride)
        .unwrap();
    g.synchronize().unwrap();
    let mut got = vec![0u8; rows * row_bytes];
    cache.read(0, &mut got).unwrap();
    let quantize = moxie_quant::quantize_fn(GgmlType::Q8_0).unwrap();
    for r in 0..rows {
        let mut want = vec![0u8; row_bytes];
        quantize(&src[r * stride..r * stride + width], &mut want);
        assert_eq!(
            &got[r * row_bytes..(r + 1) * row_bytes],
            &want[..],
            "row {r}"
        );
    }
    // Rows that are not whole blocks are refused, not stored.
    let err = g
        .kv_store(cache.ptr(), GgmlType::Q8_0, sb.ptr(), 1, 40, 40)
        .unwrap_err();
    assert!(err.to_string().contains("40"), "{err}");
}

#[test]
fn moe_sum_weights_each_tokens_rows() {
    let g = gpu();
    let (n_tok, k, e) = (3, 4, 300);
    let rows = values(n_tok * k * e, 12);
    let w = values(n_tok * k, 13);
    let base = values(n_tok * e, 14);
    let (rb, wb) = (upload(&g, &rows), upload(&g, &w));
    for accumulate in [false, true] {
        let ob = upload(&g, &base);
        g.moe_sum(rb.ptr(), wb.ptr(), ob.ptr(), n_tok, k, e, accumulate)
            .unwrap();
        let want: Vec<f32> = (0..n_tok * e)
            .map(|i| {
                let (t, d) = (i / e, i % e);
                let s: f32 = (0..k)
                    .map(|j| w[t * k + j] * rows[(t * k + j) * e + d])
                    .sum();
                if accumulate {
                    base[i] + s
                } else {
                    s
                }
            })
            .collect();
        close(&read(&ob, n_tok * e), &want, 1e-6, "moe_sum");
    }
}

#[test]
fn oversized_shapes_are_errors_not_launches() {
    let g = gpu();
    let b = Buffer::new(g.backend(), 64).unwrap();
    let s = AttnShape {
        n_head: 2,
        n_head_kv: 1,
        dk: 4096,
        dv: 64,
        pos0: 0,
        scale: 1.0,
    };
    let view = KvView {
        k: b.ptr(),
        v: b.ptr(),
        k_row: 4096,
        v_row: 4096,
        k_type: GgmlType::F16,
        v_type: GgmlType::F16,
    };
    let err = g.attention(s, b.ptr(), view, None, b.ptr(), 1).unwrap_err();
    assert!(err.to_string().contains("4096"), "{err}");
    // DeltaNet heads that are not whole warps, value heads not a multiple of key heads, too
    // many convolution taps.
    let p = b.ptr();
    for (n_k, n_v, d) in [(1, 2, 48), (2, 3, 64), (1, 1, 512)] {
        let dims = DeltaNetDims { n_k, n_v, d };
        let err = g.gated_delta_net(dims, p, p, p, p, p, 1, 1e-6).unwrap_err();
        assert!(err.to_string().contains("DeltaNet"), "{err}");
    }
    let err = g.ssm_conv_silu(p, p, p, p, 1, 4, 9).unwrap_err();
    assert!(err.to_string().contains("9 taps"), "{err}");
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn mul_sigmoid_per_value_and_per_row() {
    let g = gpu();
    let (n, row) = (6 * 40, 40);
    let y = values(n, 21);
    for group in [1, row] {
        let gates = values(n / group, 22);
        let (yb, gb) = (upload(&g, &y), upload(&g, &gates));
        g.mul_sigmoid(yb.ptr(), gb.ptr(), n, group).unwrap();
        let want: Vec<f32> = (0..n).map(|i| y[i] * sigmoid(gates[i / group])).collect();
        close(
            &read(&yb, n),
            &want,
            1e-6,
            &format!("mul_sigmoid group {group}"),
        );
    }
}

#[test]
fn delta_net_gates_pick_beta_and_alpha_per_value_head() {
    let g = gpu();
    // 2 key heads with 3 value heads each; alphas large enough to take softplus's x > 20 arm.
    let dims = DeltaNetDims {
        n_k: 2,
        n_v: 6,
        d: 32,
    };
    let (n_tok, r) = (5, 3);
    let ba: Vec<f32> = values(n_tok * 12, 23).iter().map(|v| v * 30.0).collect();
    let (dt, a) = (values(6, 24), values(6, 25));
    let (bab, dtb, ab) = (upload(&g, &ba), upload(&g, &dt), upload(&g, &a));
    let (beta, gate) = (upload(&g, &[0.0; 30]), upload(&g, &[0.0; 30]));
    g.delta_net_gates(
        dims,
        bab.ptr(),
        dtb.ptr(),
        ab.ptr(),
        beta.ptr(),
        gate.ptr(),
        n_tok,
    )
    .unwrap();
    let (mut want_b, mut want_g) = (Vec::new(), Vec::new());
    for t in 0..n_tok {
        for vh in 0..6 {
            let row = &ba[t * 12 + (vh / r) * 2 * r..];
            want_b.push(sigmoid(row[vh % r]));
            let x = row[r + vh % r] + dt[vh];
            let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
            want_g.push(sp * a[vh]);
        }
    }
    close(&read(&beta, 30), &want_b, 1e-6, "beta");
    close(&read(&gate, 30), &want_g, 1e-6, "g");
}

/// The convolution over all tokens at once from a given state, with SiLU: tap `i` of a
/// channel weighs the input `k - 1 - i` tokens back.
fn conv_ref(x: &[f32], state: &[f32], w: &[f32], ch: usize, k: usize) -> Vec<f32> {
    let n = x.len() / ch;
    let mut out = vec![0f32; n * ch];
    for c in 0..ch {
        let mut win: Vec<f32> = state[c * (k - 1)..(c + 1) * (k - 1)].to_vec();
        win.extend((0..n).map(|t| x[t * ch + c]));
        for t in 0..n {
            let s: f32 = (0..k).map(|i| win[t + i] * w[c * k + i]).sum();
            out[t * ch + c] = s * sigmoid(s);
        }
    }
    out
}

#[test]
fn ssm_conv_continues_its_state_across_batches() {
    let g = gpu();
    let (ch, k) = (200, 4);
    let x = values(9 * ch, 26);
    let w = values(ch * k, 27);
    let state0 = values(ch * (k - 1), 28);
    let want = conv_ref(&x, &state0, &w, ch, k);
    let (st, wb) = (upload(&g, &state0), upload(&g, &w));
    // 6 tokens, then 2 (fewer than the window keeps), then 1.
    let mut t0 = 0;
    for n in [6, 2, 1] {
        let xb = upload(&g, &x[t0 * ch..(t0 + n) * ch]);
        let out = upload(&g, &vec![0.0; n * ch]);
        g.ssm_conv_silu(xb.ptr(), st.ptr(), wb.ptr(), out.ptr(), n, ch, k)
            .unwrap();
        let what = format!("conv tokens {t0}..{}", t0 + n);
        close(
            &read(&out, n * ch),
            &want[t0 * ch..(t0 + n) * ch],
            1e-5,
            &what,
        );
        t0 += n;
    }
    // The state holds the last k - 1 inputs of every channel.
    let got = read(&st, ch * (k - 1));
    for c in 0..ch {
        for i in 0..k - 1 {
            assert_eq!(
                got[c * (k - 1) + i],
                x[(6 + i) * ch + c],
                "state of channel {c}"
            );
        }
    }
}

/// The gated delta rule with the state as a plain matrix `S[h][i][j]` (the kernel keeps it
/// transposed): per token L2-normed q and k of the value head's key head, `S *= exp(g)`,
/// `S += k (beta (v - Sᵀk))ᵀ`, `o = Sᵀq / sqrt(d)`.
fn delta_rule_ref(
    dims: DeltaNetDims,
    conv: &[f32],
    beta: &[f32],
    gate: &[f32],
    s: &mut [f64],
    eps: f32,
) -> Vec<f32> {
    let DeltaNetDims { n_k, n_v, d } = dims;
    let ch = dims.channels();
    let n = conv.len() / ch;
    let l2 = |v: &[f32]| -> Vec<f64> {
        let ss: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let scale = 1.0 / (ss / d as f64 + eps as f64 / d as f64).sqrt() / (d as f64).sqrt();
        v.iter().map(|&x| x as f64 * scale).collect()
    };
    let mut out = vec![0f32; n * n_v * d];
    for t in 0..n {
        let row = &conv[t * ch..(t + 1) * ch];
        for vh in 0..n_v {
            let kh = vh / (n_v / n_k);
            let q = l2(&row[kh * d..(kh + 1) * d]);
            let k = l2(&row[(n_k + kh) * d..(n_k + kh + 1) * d]);
            let v = &row[(2 * n_k + vh) * d..(2 * n_k + vh + 1) * d];
            let sh = &mut s[vh * d * d..(vh + 1) * d * d];
            let decay = (gate[t * n_v + vh] as f64).exp();
            sh.iter_mut().for_each(|x| *x *= decay);
            let b = beta[t * n_v + vh] as f64;
            for j in 0..d {
                let kv: f64 = (0..d).map(|i| sh[i * d + j] * k[i]).sum();
                let delta = (v[j] as f64 - kv) * b;
                for i in 0..d {
                    sh[i * d + j] += k[i] * delta;
                }
            }
            for j in 0..d {
                let o: f64 = (0..d).map(|i| sh[i * d + j] * q[i]).sum();
                out[(t * n_v + vh) * d + j] = (o / (d as f64).sqrt()) as f32;
            }
        }
    }
    out
}

#[test]
fn gated_delta_net_matches_the_delta_rule_across_batches() {
    let g = gpu();
    for dims in [
        DeltaNetDims {
            n_k: 2,
            n_v: 4,
            d: 64,
        },
        DeltaNetDims {
            n_k: 1,
            n_v: 1,
            d: 32,
        },
    ] {
        let (n_v, d, ch) = (dims.n_v, dims.d, dims.channels());
        let n = 7;
        let conv = values(n * ch, 29);
        let beta: Vec<f32> = values(n * n_v, 30).iter().map(|v| sigmoid(*v)).collect();
        // g < 0: the state decays.
        let gate: Vec<f32> = values(n * n_v, 31).iter().map(|v| -v.abs()).collect();
        let s0 = values(n_v * d * d, 32);
        // The reference's S[h][i][j] is the kernel's ssm[h][j][i].
        let mut s_ref: Vec<f64> = vec![0.0; n_v * d * d];
        for h in 0..n_v {
            for i in 0..d {
                for j in 0..d {
                    s_ref[(h * d + i) * d + j] = s0[(h * d + j) * d + i] as f64;
                }
            }
        }
        let want = delta_rule_ref(dims, &conv, &beta, &gate, &mut s_ref, 1e-6);
        let ssm = upload(&g, &s0);
        let mut t0 = 0;
        for nt in [4, 1, 2] {
            let cb = upload(&g, &conv[t0 * ch..(t0 + nt) * ch]);
            let bb = upload(&g, &beta[t0 * n_v..(t0 + nt) * n_v]);
            let gb = upload(&g, &gate[t0 * n_v..(t0 + nt) * n_v]);
            let out = upload(&g, &vec![0.0; nt * n_v * d]);
            g.gated_delta_net(
                dims,
                cb.ptr(),
                bb.ptr(),
                gb.ptr(),
                ssm.ptr(),
                out.ptr(),
                nt,
                1e-6,
            )
            .unwrap();
            let w = &want[t0 * n_v * d..(t0 + nt) * n_v * d];
            close(
                &read(&out, nt * n_v * d),
                w,
                1e-4,
                &format!("{dims:?} tokens from {t0}"),
            );
            t0 += nt;
        }
        let got = read(&ssm, n_v * d * d);
        for h in 0..n_v {
            for i in 0..d {
                for j in 0..d {
                    let w = s_ref[(h * d + i) * d + j] as f32;
                    let v = got[(h * d + j) * d + i];
                    assert!(
                        (v - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{dims:?} S[{h}][{i}][{j}]: {v} vs {w}"
                    );
                }
            }
        }
    }
}

/// Attention over selected positions (DeepSeek sparse attention): per token a list of past
/// positions, in any order, over more than one tile; a token with count -1 sees them all.
#[test]
fn attention_over_selected_positions() {
    let g = gpu();
    let (nh, dk, dv, pos0, n_tok) = (4, 72, 64, 300, 3);
    let n_pos = pos0 + n_tok;
    let k_row = dk;
    let q = values(n_tok * nh * dk, 40);
    let k = values(n_pos * k_row, 41);
    let stride = 150;
    // Token 0: every other position backwards (150 of them); token 1: all; token 2: a few.
    let lists: Vec<Option<Vec<usize>>> = vec![
        Some((0..stride).map(|i| pos0 - 2 * i).collect()),
        None,
        Some(vec![3, 302, 77, 150]),
    ];
    let mut list = vec![0i32; n_tok * stride];
    let mut counts = vec![-1i32; n_tok];
    for (t, l) in lists.iter().enumerate() {
        if let Some(l) = l {
            counts[t] = l.len() as i32;
            for (i, &p) in l.iter().enumerate() {
                list[t * stride + i] = p as i32;
            }
        }
    }
    let lb = Buffer::from_bytes(g.backend(), bytemuck::cast_slice(&list)).unwrap();
    let cb = Buffer::from_bytes(g.backend(), bytemuck::cast_slice(&counts)).unwrap();
    let kb = upload(&g, &k);
    let qb = upload(&g, &q);
    let ob = Buffer::new(g.backend(), n_tok * nh * dv * 4).unwrap();
    let s = AttnShape {
        n_head: nh,
        n_head_kv: 1,
        dk,
        dv,
        pos0,
        scale: 1.0 / (dk as f32).sqrt(),
    };
    let view = KvView {
        k: kb.ptr(),
        v: kb.ptr(),
        k_row,
        v_row: k_row,
        k_type: GgmlType::F32,
        v_type: GgmlType::F32,
    };
    let sel = Selection {
        list: lb.ptr(),
        counts: cb.ptr(),
        stride,
    };
    g.attention(s, qb.ptr(), view, Some(sel), ob.ptr(), n_tok)
        .unwrap();
    let want = attention_ref(
        &q,
        &k,
        &k,
        s,
        k_row,
        k_row,
        n_tok,
        Some(&lists),
        (GgmlType::F32, GgmlType::F32),
    );
    close(&read(&ob, want.len()), &want, 2e-5, "selected attention");
}

#[test]
fn layer_norm_and_scale() {
    let g = gpu();
    let (rows, cols) = (3, 128);
    let x = values(rows * cols, 50);
    let w = values(cols, 51);
    let b = values(cols, 52);
    for (with_w, with_b) in [(true, true), (false, false)] {
        let xb = upload(&g, &x);
        let (wb, bb) = (upload(&g, &w), upload(&g, &b));
        g.layer_norm(
            xb.ptr(),
            with_w.then(|| wb.ptr()),
            with_b.then(|| bb.ptr()),
            xb.ptr(),
            rows,
            cols,
            0.0,
        )
        .unwrap();
        let mut want = x.clone();
        for r in want.chunks_exact_mut(cols) {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            for (i, v) in r.iter_mut().enumerate() {
                let mut y = (*v as f64 - mean) / var.sqrt();
                if with_w {
                    y *= w[i] as f64;
                }
                if with_b {
                    y += b[i] as f64;
                }
                *v = y as f32;
            }
        }
        close(&read(&xb, rows * cols), &want, 2e-5, "layer_norm");
    }
    let yb = upload(&g, &x);
    g.scale(yb.ptr(), 0.25, x.len()).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 0.25).collect();
    close(&read(&yb, x.len()), &want, 0.0, "scale");
}

/// The indexer's scores, Σ_h relu(q_h · k_j) · w_h, for every past position of each token,
/// and the top-k selection of distinct scores (ties are checked against the CPU's selection in
/// moxie-core's tests).
#[test]
fn dsa_scores_and_top_k() {
    let g = gpu();
    let (nh, d, pos0, n_tok, k) = (4, 64, 20, 3, 8);
    let stride = pos0 + n_tok;
    let q = values(n_tok * nh * d, 60);
    let keys = values(stride * d, 61);
    let w = values(n_tok * nh, 62);
    let (qb, kb, wb) = (upload(&g, &q), upload(&g, &keys), upload(&g, &w));
    let sb = Buffer::new(g.backend(), n_tok * stride * 4).unwrap();
    g.dsa_scores(
        qb.ptr(),
        kb.ptr(),
        GgmlType::F32,
        wb.ptr(),
        sb.ptr(),
        stride,
        n_tok,
        nh,
        d,
        pos0,
    )
    .unwrap();
    let got = read(&sb, n_tok * stride);
    for t in 0..n_tok {
        for j in 0..=pos0 + t {
            let want: f32 = (0..nh)
                .map(|h| {
                    let dot: f32 = (0..d)
                        .map(|c| q[(t * nh + h) * d + c] * keys[j * d + c])
                        .sum();
                    dot.max(0.0) * w[t * nh + h]
                })
                .sum();
            close(
                &[got[t * stride + j]],
                &[want],
                1e-5,
                &format!("score {t} {j}"),
            );
        }
    }
    let lb = Buffer::new(g.backend(), n_tok * k * 4).unwrap();
    let cb = Buffer::new(g.backend(), n_tok * 4).unwrap();
    let sel = g
        .dsa_top_k(sb.ptr(), stride, n_tok, pos0, k, lb.ptr(), cb.ptr())
        .unwrap();
    assert_eq!(sel.stride, k);
    let mut list = vec![0i32; n_tok * k];
    let mut counts = vec![0i32; n_tok];
    lb.read(0, bytemuck::cast_slice_mut(&mut list)).unwrap();
    cb.read(0, bytemuck::cast_slice_mut(&mut counts)).unwrap();
    for t in 0..n_tok {
        assert_eq!(counts[t], k as i32);
        let mut picked: Vec<usize> = list[t * k..(t + 1) * k]
            .iter()
            .map(|&x| x as usize)
            .collect();
        picked.sort_unstable();
        let row = &got[t * stride..t * stride + pos0 + t + 1];
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let mut want = order[..k].to_vec();
        want.sort_unstable();
        assert_eq!(picked, want, "token {t}");
    }
    // Tokens that see no more than k positions are left unmasked.
    g.dsa_top_k(sb.ptr(), stride, 2, 2, k, lb.ptr(), cb.ptr())
        .unwrap();
    cb.read(0, bytemuck::cast_slice_mut(&mut counts[..2]))
        .unwrap();
    assert_eq!(&counts[..2], &[-1, -1]);
}
