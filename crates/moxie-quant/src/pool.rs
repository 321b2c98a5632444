//! The reuse policy of per-thread buffer pools: moxie-core's work buffers (`scratch`) and the
//! int8 GEMM's activation buffers ([`crate::GemmActs`]). A pool keeps a few buffers a thread
//! gave back; a take reuses the smallest that is large enough, else the largest (which the
//! caller grows), so a steady sequence of takes settles on a fixed set of buffers and no
//! batch-sized buffer is allocated and zeroed again.

/// The entry of `pool` to reuse for `len` (by `size`): the smallest with `size >= len`, else
/// the largest; removed from the pool. `None` for an empty pool.
pub fn take_fitting<T>(pool: &mut Vec<T>, len: usize, size: impl Fn(&T) -> usize) -> Option<T> {
    let fit = (0..pool.len())
        .filter(|&i| size(&pool[i]) >= len)
        .min_by_key(|&i| size(&pool[i]))
        .or_else(|| (0..pool.len()).max_by_key(|&i| size(&pool[i])));
    fit.map(|i| pool.swap_remove(i))
}

/// Put `item` back into `pool`; beyond `max` entries the smallest (by `size`) is dropped.
pub fn give_back<T>(pool: &mut Vec<T>, item: T, max: usize, size: impl Fn(&T) -> usize) {
    pool.push(item);
    if pool.len() > max {
        if let Some(i) = (0..pool.len()).min_by_key(|&i| size(&pool[i])) {
            pool.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_that_fits_else_the_largest() {
        let mut pool = vec![vec![0u8; 10], vec![0; 1000], vec![0; 100]];
        assert_eq!(
            take_fitting(&mut pool, 50, Vec::len).map(|v| v.len()),
            Some(100)
        );
        assert_eq!(
            take_fitting(&mut pool, 5000, Vec::len).map(|v| v.len()),
            Some(1000)
        );
        assert_eq!(
            take_fitting(&mut pool, 1, Vec::len).map(|v| v.len()),
            Some(10)
        );
        assert!(take_fitting(&mut pool, 1, Vec::len).is_none());
    }

    #[test]
    fn giving_back_beyond_the_bound_drops_the_smallest() {
        let mut pool = Vec::new();
        for len in [30, 10, 20] {
            give_back(&mut pool, vec![0u8; len], 2, Vec::len);
        }
        let mut lens: Vec<usize> = pool.iter().map(Vec::len).collect();
        lens.sort();
        assert_eq!(lens, [20, 30]);
    }
}
