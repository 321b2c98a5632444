//! Dot products in the exact floating-point evaluation order of llama.cpp's CPU kernels on an
//! AVX-512 machine, for the f32/f16 operations where the order is visible in the logits:
//!
//! - batched products (two or more tokens) go through llamafile's `tinyBLAS`: one 16-lane
//!   accumulator per output, fused multiply-add over 16-element steps, then
//!   `_mm512_reduce_add_ps`;
//! - single-token products go through ggml's `vec_dot_f16`/`vec_dot_f32`: four 16-lane
//!   accumulators over 64-element steps, a pairwise reduction, `_mm512_reduce_add_ps`, and the
//!   leftover elements added in f64.
//!
//! MoE routing turns last-bit differences into different experts for near-tied tokens, so
//! matching the order (not just the math) is what keeps moxie's logits on llama.cpp's.

/// `_mm512_reduce_add_ps`: halves, quarters, then pairs.
#[inline]
pub fn reduce_add_16(v: &[f32; 16]) -> f32 {
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = v[i + 8] + v[i];
    }
    let mut t6 = [0f32; 4];
    for i in 0..4 {
        t6[i] = t3[i + 4] + t3[i];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// tinyBLAS order for `n` products `x(i) * y(i)`; `n` must be a multiple of 16.
#[inline]
pub fn dot_tinyblas(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    debug_assert_eq!(n % 16, 0);
    let mut acc = [0f32; 16];
    let mut l = 0;
    while l < n {
        for (lane, a) in acc.iter_mut().enumerate() {
            *a = x(l + lane).mul_add(y(l + lane), *a);
        }
        l += 16;
    }
    reduce_add_16(&acc)
}

/// ggml `vec_dot_f16` / `vec_dot_f32` order (AVX-512) for `n` products.
#[inline]
pub fn dot_vec(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    let mut i = 0;
    while i < np {
        for (j, a) in acc.iter_mut().enumerate() {
            for (lane, v) in a.iter_mut().enumerate() {
                let k = i + j * 16 + lane;
                *v = x(k).mul_add(y(k), *v);
            }
        }
        i += 64;
    }
    let [a0, a1, a2, a3] = acc;
    let mut r = [0f32; 16];
    for (lane, v) in r.iter_mut().enumerate() {
        *v = (a0[lane] + a2[lane]) + (a1[lane] + a3[lane]);
    }
    let mut sum = reduce_add_16(&r) as f64;
    for k in np..n {
        sum += (x(k) * y(k)) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_agree_with_plain_sum_to_rounding() {
        let x: Vec<f32> = (0..576)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let y: Vec<f32> = (0..576)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0)
            .collect();
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
        let t = dot_tinyblas(576, |i| x[i], |i| y[i]) as f64;
        let v = dot_vec(576, |i| x[i], |i| y[i]) as f64;
        let v2 = dot_vec(100, |i| x[i], |i| y[i]) as f64;
        let exact2: f64 = x[..100]
            .iter()
            .zip(&y)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        assert!((t - exact).abs() < 1e-3, "{t} {exact}");
        assert!((v - exact).abs() < 1e-3, "{v} {exact}");
        assert!((v2 - exact2).abs() < 1e-3);
    }
}
