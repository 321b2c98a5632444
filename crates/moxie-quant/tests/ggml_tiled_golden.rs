//! Bit-exact comparison of [`moxie_quant::tiled_dot_fn`] with ggml's tiled K-quant / IQ matmul
//! (`ggml-cpu/tiled/`), compiled for the Sapphire Rapids machine that made the golden logits
//! and run through its `mul_mat` and `mul_mat_id` entry points by `data/gen_tiled.c`
//! (file format described there).

use moxie_quant::*;

fn u32_at(d: &[u8], p: &mut usize) -> u32 {
    let v = u32::from_le_bytes(d[*p..*p + 4].try_into().unwrap());
    *p += 4;
    v
}

fn take<'a>(d: &'a [u8], p: &mut usize, k: usize) -> &'a [u8] {
    let s = &d[*p..*p + k];
    *p += k;
    s
}

#[test]
fn tiled_matches_ggml() {
    let data: &[u8] = include_bytes!("data/ggml_tiled_golden.bin");
    let mut p = 0usize;
    let mut sets = vec![];
    for _ in 0..2 {
        let n_in = u32_at(data, &mut p) as usize;
        let n_rows = u32_at(data, &mut p) as usize;
        let rb = GgmlType::Q8_K.row_bytes(n_in as u64).unwrap() as usize;
        sets.push((n_in, rb, take(data, &mut p, rb * n_rows)));
    }
    let mut checked = 0;
    let mut differs_from_vec_dot = 0;
    let mut types_seen = std::collections::BTreeSet::new();
    while p < data.len() {
        let set = u32_at(data, &mut p) as usize;
        let ty = GgmlType::from_id(u32_at(data, &mut p)).unwrap();
        let n_out = u32_at(data, &mut p) as usize;
        let (n_in, arb, acts) = sets[set];
        let wrb = ty.row_bytes(n_in as u64).unwrap() as usize;
        let w = take(data, &mut p, wrb * n_out);
        let dot = tiled_dot_fn(ty, n_in).unwrap();
        let n_calls = u32_at(data, &mut p);
        for _ in 0..n_calls {
            let n_routed = u32_at(data, &mut p) as usize;
            // the ggml side's eligibility: every call in the file went through the tiled path
            if set == 0 {
                assert!(tiled_used_for_mul_mat(ty, n_routed));
            } else {
                assert!(tiled_used_for_mul_mat_id(ty, n_routed));
            }
            let rows: Vec<usize> = (0..n_routed)
                .map(|_| u32_at(data, &mut p) as usize)
                .collect();
            for &row in &rows {
                let a = &acts[row * arb..(row + 1) * arb];
                for r in 0..n_out {
                    let want = f32::from_le_bytes(take(data, &mut p, 4).try_into().unwrap());
                    let got = dot(n_in, &w[r * wrb..(r + 1) * wrb], a);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} set {set} act row {row} weight row {r}: {got} vs ggml {want}"
                    );
                    let vd = vec_dot(ty, n_in, &w[r * wrb..(r + 1) * wrb], a).unwrap();
                    differs_from_vec_dot += (vd.to_bits() != want.to_bits()) as usize;
                    checked += 1;
                }
            }
        }
        types_seen.insert(ty.id());
    }
    // Q2_K..Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
    assert_eq!(types_seen.len(), 13);
    assert_eq!(checked, 13 * 24 * (10 + 9 + 20));
    // the file would not test anything if vec_dot's order gave the same results
    assert!(
        differs_from_vec_dot > checked / 10,
        "{differs_from_vec_dot} of {checked}"
    );
}
