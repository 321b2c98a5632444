//! llama-quantize's quantizers given an importance matrix, bit-exact against ggml's compiled C
//! code (`data/gen_imatrix_golden.c`: `ggml-quants.c` built as ggml-base is). Per type, rows
//! with zero, single-value, integer and positive-only blocks and importance weights with zeros
//! (experts that saw no tokens) and a spread over decades.

use moxie_quant::*;

struct Case {
    ty: GgmlType,
    n_per_row: usize,
    x: Vec<f32>,
    qw: Vec<f32>,
    q: Vec<u8>,
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn cases() -> Vec<Case> {
    let data: &[u8] = include_bytes!("data/imatrix_golden.bin");
    let mut p = 0usize;
    let mut take = |k: usize| {
        let s = &data[p..p + k];
        p += k;
        s
    };
    let mut out = vec![];
    loop {
        let hdr = take(12);
        let u = |i: usize| u32::from_le_bytes(hdr[4 * i..4 * i + 4].try_into().unwrap());
        let ty = GgmlType::from_id(u(0)).unwrap();
        let (n, nrow) = (u(1) as usize, u(2) as usize);
        let x = f32s(take(4 * n * nrow));
        let qw = f32s(take(4 * n));
        let q = take(ty.row_bytes(n as u64).unwrap() as usize * nrow).to_vec();
        out.push(Case {
            ty,
            n_per_row: n,
            x,
            qw,
            q,
        });
        if out.len() == 36 {
            break;
        }
    }
    out
}

#[test]
fn weighted_quantizers_match_ggml() {
    let cases = cases();
    let mut weighted = 0;
    for c in &cases {
        let rb = c.ty.row_bytes(c.n_per_row as u64).unwrap() as usize;
        let imx = quantize_weights_imatrix(c.ty).unwrap_or_else(|| panic!("{}", c.ty));
        for (r, (x, want)) in
            c.x.chunks_exact(c.n_per_row)
                .zip(c.q.chunks_exact(rb))
                .enumerate()
        {
            let mut got = vec![0u8; rb];
            match imx {
                ImatrixQuantizer::Weighted(f) => {
                    f(x, &mut got, &c.qw);
                    weighted += 1;
                }
                ImatrixQuantizer::Ignores => quantize_weights_fn(c.ty).unwrap()(x, &mut got),
            }
            if let Some(b) = (0..rb).find(|&b| got[b] != want[b]) {
                panic!(
                    "{} n_per_row {} row {r}: first difference at byte {b} (block {})",
                    c.ty,
                    c.n_per_row,
                    b / c.ty.type_size()
                );
            }
        }
    }
    // Q8_0 ignores the weights; the other eleven types use them.
    assert_eq!(weighted, 11 * (2 + 2 + 3));
}

/// Weights change the result (the test above would also pass for a port that ignored them
/// if the golden did): the same rows quantized without weights differ for every weighted type.
#[test]
fn weights_matter() {
    for c in cases().iter().filter(|c| c.n_per_row >= 512) {
        let Some(ImatrixQuantizer::Weighted(_)) = quantize_weights_imatrix(c.ty) else {
            continue;
        };
        let rb = c.ty.row_bytes(c.n_per_row as u64).unwrap() as usize;
        let mut plain = vec![0u8; rb];
        quantize_weights_fn(c.ty).unwrap()(&c.x[..c.n_per_row], &mut plain);
        assert_ne!(plain, c.q[..rb], "{}", c.ty);
    }
}

#[test]
fn validate_row_data_finds_non_finite_values() {
    let mut b = vec![0u8; 18 * 3];
    assert_eq!(validate_row_data(GgmlType::Q4_0, &b), Ok(()));
    b[36..38].copy_from_slice(&0x7c00u16.to_le_bytes());
    assert_eq!(validate_row_data(GgmlType::Q4_0, &b), Err(2));
    let f: Vec<u8> = [1.0f32, f32::NAN]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(validate_row_data(GgmlType::F32, &f), Err(1));
    assert_eq!(validate_row_data(GgmlType::F32, &f[..4]), Ok(()));
    assert_eq!(
        validate_row_data(GgmlType::BF16, &0x7f80u16.to_le_bytes()),
        Err(0)
    );
    assert_eq!(
        validate_row_data(GgmlType::F16, &0x3c00u16.to_le_bytes()),
        Ok(())
    );
}
