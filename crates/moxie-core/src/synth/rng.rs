//! Small seeded random numbers: SplitMix64 (seeding), xoshiro256++ (streams) and Box-Muller
//! normals. Every tensor gets its own seed from the model seed and the tensor name, and every
//! row its own stream from the tensor seed and the row index, so a file's bytes depend on
//! neither the tensor order nor the number of threads.

/// One SplitMix64 step: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a 64-bit hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// The seed of tensor `name` in a model generated with `seed`.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut s = seed ^ fnv1a64(name.as_bytes()).rotate_left(17);
    splitmix64(&mut s)
}

/// xoshiro256++ (Blackman & Vigna).
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// A generator whose state is filled by SplitMix64 from `seed`.
    pub fn new(seed: u64) -> Xoshiro256 {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Xoshiro256 { s }
    }

    /// The stream of row `row` of the tensor seeded with `tensor_seed`.
    pub fn for_row(tensor_seed: u64, row: u64) -> Xoshiro256 {
        let mut s = tensor_seed ^ row.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Xoshiro256::new(splitmix64(&mut s))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills `out` with independent standard normal samples (Box-Muller in Marsaglia's polar
    /// form, two per accepted draw). Only IEEE-exact arithmetic (no libm), so the values are
    /// the same on every platform.
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut i = 0;
        while i < out.len() {
            let (a, b) = self.normal_pair();
            out[i] = a;
            if let Some(o) = out.get_mut(i + 1) {
                *o = b;
            }
            i += 2;
        }
    }

    /// Two independent standard normal samples.
    pub fn normal_pair(&mut self) -> (f32, f32) {
        const SCALE: f64 = 1.0 / (1u64 << 31) as f64;
        loop {
            let x = self.next_u64();
            let a = (x >> 32) as f64 * SCALE - 1.0;
            let b = (x & 0xFFFF_FFFF) as f64 * SCALE - 1.0;
            let s = a * a + b * b;
            if s < 1.0 && s > 0.0 {
                let f = (-2.0 * ln(s) / s).sqrt();
                return ((a * f) as f32, (b * f) as f32);
            }
        }
    }
}

/// Natural logarithm of a positive normal `x` (relative error < 1e-10) from exponent and
/// mantissa with the atanh series: portable, unlike libm's.
fn ln(x: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7FF) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let series = 2.0
        + z2 * (2.0 / 3.0
            + z2 * (2.0 / 5.0
                + z2 * (2.0 / 7.0 + z2 * (2.0 / 9.0 + z2 * (2.0 / 11.0 + z2 * (2.0 / 13.0))))));
    z * series + e as f64 * LN2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_unit_variance() {
        let mut g = Xoshiro256::new(42);
        let mut v = vec![0f32; 100_001];
        g.fill_normal(&mut v);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn ln_is_accurate() {
        for &x in &[1e-18, 1e-5, 0.1, 0.5, 0.7, 0.99999, 1.0, 1.5, 3.0] {
            assert!(
                (ln(x) - f64::ln(x)).abs() <= 1e-10 * f64::ln(x).abs().max(1e-6),
                "{x}"
            );
        }
    }

    #[test]
    fn normal_tails_are_gaussian() {
        let mut g = Xoshiro256::new(7);
        let mut v = vec![0f32; 200_000];
        g.fill_normal(&mut v);
        let beyond2 = v.iter().filter(|x| x.abs() > 2.0).count() as f64 / v.len() as f64;
        assert!((beyond2 - 0.0455).abs() < 0.003, "P(|x| > 2) = {beyond2}");
    }

    #[test]
    fn streams_differ_by_row_and_name() {
        let a = Xoshiro256::for_row(tensor_seed(1, "x"), 0).next_u64();
        let b = Xoshiro256::for_row(tensor_seed(1, "x"), 1).next_u64();
        let c = Xoshiro256::for_row(tensor_seed(1, "y"), 0).next_u64();
        let d = Xoshiro256::for_row(tensor_seed(2, "x"), 0).next_u64();
        assert!(a != b && a != c && a != d);
        assert_eq!(a, Xoshiro256::for_row(tensor_seed(1, "x"), 0).next_u64());
    }
}
