//! The dynamic expert cache of one MoE layer (`--expert-cache`, planned in
//! `placement/expert_cache.rs`): which of the layer's experts are resident on the cache
//! device, and the policy that changes them between decode steps.
//!
//! A decode step's selected experts that are resident are hits (computed on the cache device);
//! the others are computed on the CPU and, after the step, brought in (uploads on the copy
//! stream, off the token's critical path), each evicting the policy's victim among the experts
//! the step did not select. A prompt batch computes none of its experts in the cache (prompt
//! batches keep their own path); it only records their use and refills the cache with the
//! policy's choice, ready for decoding. Each resident has a slot; on a GPU the slots are
//! copies of the experts' matrices there (`gpu`), filled as experts are brought in.

use std::sync::Mutex;

use crate::device::{DeviceId, Reservation};
use crate::telemetry::{CachePolicy, DecayedCount};

/// One layer's cache.
pub struct ExpertCache {
    pub device: DeviceId,
    pub policy: CachePolicy,
    /// Experts it holds at most.
    pub slots: usize,
    /// Its bytes on `device`, held for the model's lifetime.
    pub held: Reservation,
    /// On a GPU: where the residents' copies sit.
    pub gpu: Option<super::GpuExpertSlots>,
    state: Mutex<CacheState>,
}

struct CacheState {
    resident: Vec<bool>,
    n_resident: usize,
    /// Per expert: its slot while resident, else -1; and the slots nobody holds.
    slot_of: Vec<i32>,
    free: Vec<usize>,
    /// Per expert: the clock of its last selection, and its selections so far.
    last_use: Vec<u64>,
    uses: Vec<u64>,
    /// Per expert: its recency-weighted selections ([`CachePolicy::Decay`]).
    decayed: Vec<DecayedCount>,
    /// Tokens seen (one per decode step; a prompt batch's each).
    clock: u64,
    counts: CacheCounts,
}

/// What a layer's cache did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Distinct experts selected by decode steps, and how many of them were resident.
    pub lookups: u64,
    pub hits: u64,
    /// Experts brought in.
    pub uploads: u64,
}

impl CacheCounts {
    pub fn add(&mut self, o: &CacheCounts) {
        self.lookups += o.lookups;
        self.hits += o.hits;
        self.uploads += o.uploads;
    }

    /// What was counted since `before` (an earlier reading of the same counters).
    pub fn since(&self, before: &CacheCounts) -> CacheCounts {
        CacheCounts {
            lookups: self.lookups - before.lookups,
            hits: self.hits - before.hits,
            uploads: self.uploads - before.uploads,
        }
    }
}

impl ExpertCache {
    /// An empty cache of `slots` experts of a layer of `n_expert`. `seed_uses` (a profile's
    /// selection counts, one per expert) seeds LFU's counts, and fills the cache with the
    /// most used experts before the first token.
    pub fn new(
        device: DeviceId,
        policy: CachePolicy,
        slots: usize,
        n_expert: usize,
        held: Reservation,
        seed_uses: Option<&[u64]>,
    ) -> ExpertCache {
        let slots = slots.min(n_expert);
        let mut state = CacheState {
            resident: vec![false; n_expert],
            n_resident: 0,
            slot_of: vec![-1; n_expert],
            free: (0..slots).rev().collect(),
            last_use: vec![0; n_expert],
            uses: seed_uses
                .filter(|u| u.len() == n_expert)
                .map_or_else(|| vec![0; n_expert], <[u64]>::to_vec),
            decayed: vec![DecayedCount::default(); n_expert],
            clock: 0,
            counts: CacheCounts::default(),
        };
        if seed_uses.is_some() {
            state.refill(policy, slots, &mut Vec::new());
            // The first fill is part of loading, not of any step.
            state.counts.uploads = 0;
        }
        ExpertCache {
            device,
            policy,
            slots,
            held,
            gpu: None,
            state: Mutex::new(state),
        }
    }

    /// Each route's slot in the cache (-1: not resident) into `slots`, and which experts are
    /// resident into `resident`, as they are before the pass that uses them.
    pub fn residents(&self, ids: &[i32], slots: &mut Vec<i32>, resident: &mut Vec<bool>) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        slots.clear();
        slots.extend(ids.iter().map(|&e| s.slot_of[e as usize]));
        resident.clone_from(&s.resident);
    }

    /// The residents now, as `(expert, slot)` (the experts a seeded cache starts with).
    pub fn placed(&self) -> Vec<(usize, usize)> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let slot = |e: usize| usize::try_from(s.slot_of[e]).ok().map(|x| (e, x));
        (0..s.resident.len()).filter_map(slot).collect()
    }

    /// One pass over the layer: `selected` are its distinct experts (each once), `tokens` the
    /// pass's tokens (1: a decode step; more: a prompt batch, whose `routes` are its tokens'
    /// top-k `(expert, weight)`, token after token). Returns `(hits, uploads)`: experts computed in
    /// the cache, experts brought in after it; `brought_in` gets them as `(expert, slot)`.
    pub fn step(
        &self,
        selected: &[usize],
        tokens: usize,
        routes: &[(usize, f32)],
        brought_in: &mut Vec<(usize, usize)>,
    ) -> (u64, u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        brought_in.clear();
        let before = s.counts.uploads;
        if tokens > 1 {
            let k = (routes.len() / tokens).max(1);
            for (i, &(e, _)) in routes.iter().enumerate() {
                if i % k == 0 {
                    s.clock += 1;
                }
                let c = s.clock;
                s.last_use[e] = c;
                s.uses[e] += 1;
                s.decayed[e].add(c);
            }
            s.refill(self.policy, self.slots, brought_in);
            return (0, s.counts.uploads - before);
        }
        s.clock += 1;
        let now = s.clock;
        let mut hits = 0;
        for &e in selected {
            hits += u64::from(s.resident[e]);
            s.last_use[e] = now;
            s.uses[e] += 1;
            s.decayed[e].add(now);
        }
        s.counts.lookups += selected.len() as u64;
        s.counts.hits += hits;
        for &e in selected {
            if s.resident[e] || self.slots == 0 {
                continue;
            }
            if s.n_resident == self.slots {
                // The victim: never one this step used (their last use is `now`).
                let victim = (0..s.resident.len())
                    .filter(|&x| s.resident[x] && s.last_use[x] != now)
                    .min_by_key(|&x| s.rank(self.policy, x));
                let Some(v) = victim else { break };
                s.evict(v);
            }
            let slot = s.admit(e);
            brought_in.push((e, slot));
        }
        (hits, s.counts.uploads - before)
    }

    /// Whether expert `e` is resident now.
    pub fn holds(&self, e: usize) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.resident.get(e).copied().unwrap_or(false)
    }

    pub fn counts(&self) -> CacheCounts {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).counts
    }
}

impl CacheState {
    fn evict(&mut self, x: usize) {
        self.resident[x] = false;
        self.n_resident -= 1;
        let slot = std::mem::replace(&mut self.slot_of[x], -1);
        self.free.push(slot as usize);
    }

    /// Make `x` resident in a free slot (there is one); returns it.
    fn admit(&mut self, x: usize) -> usize {
        let slot = self.free.pop().expect("a free slot");
        self.resident[x] = true;
        self.n_resident += 1;
        self.slot_of[x] = slot as i32;
        self.counts.uploads += 1;
        slot
    }

    /// How much the policy wants to keep expert `x` (larger: keep).
    fn rank(&self, policy: CachePolicy, x: usize) -> (u64, u64) {
        policy.keep_rank(self.uses[x], self.last_use[x], &self.decayed[x], self.clock)
    }

    /// Make the policy's best `slots` experts (ever used) the residents; the ones brought in
    /// go to `brought_in` with their slots.
    fn refill(&mut self, policy: CachePolicy, slots: usize, brought_in: &mut Vec<(usize, usize)>) {
        let mut order: Vec<usize> = (0..self.resident.len())
            .filter(|&x| self.uses[x] > 0)
            .collect();
        order.sort_by_key(|&x| std::cmp::Reverse((self.rank(policy, x), usize::MAX - x)));
        let keep = &order[..slots.min(order.len())];
        let mut want = vec![false; self.resident.len()];
        keep.iter().for_each(|&x| want[x] = true);
        let leaving: Vec<usize> = (0..want.len())
            .filter(|&x| self.resident[x] && !want[x])
            .collect();
        leaving.into_iter().for_each(|x| self.evict(x));
        for &x in keep {
            if !self.resident[x] {
                let slot = self.admit(x);
                brought_in.push((x, slot));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Devices;

    impl ExpertCache {
        fn step_(&self, selected: &[usize], tokens: usize, in_order: &[usize]) -> (u64, u64) {
            let mut brought_in = Vec::new();
            let routes: Vec<(usize, f32)> = in_order.iter().map(|&e| (e, 1.0)).collect();
            let r = self.step(selected, tokens, &routes, &mut brought_in);
            // Every expert brought in has a slot of its own.
            let mut slots: Vec<usize> = self.placed().iter().map(|p| p.1).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), self.placed().len());
            assert!(slots.iter().all(|&x| x < self.slots));
            assert!(brought_in.iter().all(|b| self.placed().contains(b)));
            assert_eq!(brought_in.len() as u64, r.1);
            r
        }
    }

    fn cache(policy: CachePolicy, slots: usize) -> ExpertCache {
        let devices = Devices::cpu_only();
        let held = devices.reserve(crate::device::CPU, 0, "test").unwrap();
        ExpertCache::new(crate::device::CPU, policy, slots, 8, held, None)
    }

    #[test]
    fn lru_keeps_the_most_recent_experts() {
        let c = cache(CachePolicy::Lru, 3);
        assert_eq!(c.step_(&[0, 1], 1, &[]), (0, 2));
        assert_eq!(c.step_(&[1, 2], 1, &[]), (1, 1));
        // Full (0, 1, 2); 3 evicts the least recent, 0.
        assert_eq!(c.step_(&[3, 2], 1, &[]), (1, 1));
        assert!(!c.holds(0) && c.holds(1) && c.holds(2) && c.holds(3));
        assert_eq!(c.step_(&[0], 1, &[]), (0, 1));
        assert!(!c.holds(1));
        let n = c.counts();
        assert_eq!((n.lookups, n.hits, n.uploads), (7, 2, 5));
    }

    #[test]
    fn lfu_keeps_the_most_used_and_never_evicts_what_a_step_selected() {
        let c = cache(CachePolicy::Lfu, 2);
        c.step_(&[0], 1, &[]);
        c.step_(&[0], 1, &[]);
        c.step_(&[1], 1, &[]);
        // 2 evicts 1 (one use) rather than 0 (two).
        c.step_(&[2], 1, &[]);
        assert!(c.holds(0) && c.holds(2) && !c.holds(1));
        // Both residents selected with a newcomer: nothing to evict this step.
        assert_eq!(c.step_(&[0, 2, 5], 1, &[]), (2, 0));
        assert!(!c.holds(5));
    }

    #[test]
    fn decay_forgets_old_favourites() {
        // 0 chosen 4 times, then 3 and 5 together for a while, then a newcomer 6: LFU keeps
        // the old favourite 0 as long as 3 and 5 have fewer uses; decay lets it go once its
        // uses are a few half-lives old.
        let run = |policy, steps| {
            let c = cache(policy, 3);
            for _ in 0..4 {
                c.step_(&[0], 1, &[]);
            }
            for _ in 0..steps {
                c.step_(&[3, 5], 1, &[]);
            }
            c.step_(&[6], 1, &[]);
            assert!(c.holds(6));
            c.holds(0)
        };
        assert!(run(CachePolicy::Lfu, 3), "LFU keeps the old favourite");
        assert!(!run(CachePolicy::Decay, 30), "decay forgets it");
        // Recent enough, it stays (LRU would evict it: least recently used).
        assert!(run(CachePolicy::Decay, 2));
        assert!(!run(CachePolicy::Lru, 2));
    }

    #[test]
    fn a_prompt_batch_computes_nothing_in_the_cache_and_refills_it() {
        let c = cache(CachePolicy::Lru, 2);
        c.step_(&[7], 1, &[]);
        // Tokens chose 1 4 | 4 6 | 6 3: the two most recent are 3 and 6.
        assert_eq!(c.step_(&[1, 4, 6, 3], 3, &[1, 4, 4, 6, 6, 3]), (0, 2));
        assert!(c.holds(3) && c.holds(6) && !c.holds(7));
        assert_eq!(c.counts().lookups, 1);
    }

    #[test]
    fn a_seeded_cache_starts_full_of_the_profile_s_favourites() {
        let devices = Devices::cpu_only();
        let held = devices.reserve(crate::device::CPU, 0, "test").unwrap();
        let seed = [5, 0, 9, 1, 0, 0, 7, 0];
        let c = ExpertCache::new(
            crate::device::CPU,
            CachePolicy::Lfu,
            3,
            8,
            held,
            Some(&seed),
        );
        assert!(c.holds(0) && c.holds(2) && c.holds(6) && !c.holds(3));
        assert_eq!(c.counts().uploads, 0);
        assert_eq!(c.step_(&[2, 3], 1, &[]), (1, 1));
    }
}
