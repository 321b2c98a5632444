//! Summation-order helpers shared by the ops that reproduce llama.cpp's AVX-512 CPU kernels
//! (softmax, the attention products). Which kernel llama.cpp runs for which product, and why
//! the order matters, is described in `docs/architecture.md` ("Numerics").

/// `_mm512_reduce_add_ps` as GCC implements it: halves, quarters, then pairs.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_order_is_the_tree_not_the_sequence() {
        let v: [f32; 16] = std::array::from_fn(|i| if i == 0 { 1e8 } else { 1.0 + i as f32 });
        let seq: f32 = v.iter().sum();
        let tree = reduce_add_16(&v);
        let exact: f64 = v.iter().map(|&x| x as f64).sum();
        assert!((tree as f64 - exact).abs() <= 8.0);
        // Distinct orders give distinct roundings on this input; the tree is what ggml does.
        assert_ne!(tree, seq);
    }
}
