//! Fidelity against llama.cpp: every fixture whose architecture and block types moxie supports
//! (`common::supported_models`), every golden sequence, evaluated from an empty cache in one
//! batch.
//!
//! Bounds (issue #2): for F32 files, mean KL(llama.cpp || moxie) at most 1e-5 and top-1
//! agreement of at least 99%; for quantized files, mean KLD at most
//! max(1e-3, KLD(file golden || F32 master golden) / 10) and top-1 of at least 95%. Greedy
//! continuations must equal the golden ones up to the first step whose golden top1-top2
//! margin is below 0.05.
//!
//! ik_llama.cpp's files (their own block types; `reference_engine` ik_llama.cpp) have no
//! summation order to reproduce: ik's kernels change with the batch size (from 32 rows it
//! re-quantizes weights to int8), and its own batch-1 run differs from its batch-512 goldens by
//! up to mean KLD 4e-2. Below 32 rows its arithmetic also differs from exact integer sums:
//! Q8_2 activations (32 values, bf16 scale) for K-quants and Q8_0, the query kept in f32 against
//! the f16 cache, and for IQ4_K..IQ6_K, IQ4_KS, IQ5_KS unsigned codes in `vpmaddubsw` whose i16
//! pair sums saturate. Emulating those reproduces its first logits row (measured), but moxie
//! keeps exact integer arithmetic and Q8_K activations, which land as near the exact model as
//! ik's goldens do (mean KLD from llama.cpp's f32 run on each file's dequantized weights, over
//! the 9 files' 504 positions: moxie 3.2e-3, ik 5.5e-3; moxie nearer on 15 of 27 sequences).
//! Their bound, in both numerics: mean KLD at most max(the quantized-file bound, 2 x ik's own
//! batch-1 vs batch-512 KLD) and top-1 agreement of at least min(95%, ik's own agreement - 5
//! points), each taken over all positions of a file's three sequences (the 8 positions of s8
//! alone, where ik's two batch sizes share one path, make one near-tie or routing flip 12.5
//! points); the per-sequence verdicts are reported, greedy runs too.
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory fails the test.

use std::sync::Arc;

use moxie_core::{Logits, MlaPrompts, Model, Numerics, Parallel};
use moxie_gguf::GgufFile;
use serde_json::Value;

mod common;
use common::{
    fixtures, golden_index, ik_bound, ik_own, ik_own_pooled, is_ik, kld_per_row, supported_models,
    token_ids, FixtureModel as Case,
};

/// Mean over rows of KL(p ‖ q).
fn mean_kld(a: &[f32], b: &[f32], n_vocab: usize) -> f64 {
    let k = kld_per_row(a, b, n_vocab);
    k.iter().sum::<f64>() / k.len() as f64
}

/// Whether per-position KLDs pass the rule the fixtures' README gives for a run whose
/// summation order differs from llama.cpp's (as llama.cpp's own batch-size and flash-attention
/// variants do): MoE routing flips on near-tied experts make isolated positions jump, so the
/// median position must be inside `bound` and at most 1 position in 20 beyond `10 * bound`.
fn per_position_ok(klds: &[f64], bound: f64) -> bool {
    let mut sorted = klds.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let outliers = klds.iter().filter(|&&k| k > 10.0 * bound).count();
    median <= bound && outliers * 20 <= klds.len()
}

/// The fixture model of `case`, as the command line loads it for `numerics`: fast numerics
/// with the routed experts interleaved (load-time repacking, the default), exact without.
fn load_model(case: &Case, numerics: Numerics) -> Model {
    let file = Arc::new(GgufFile::open(&case.path).unwrap_or_else(|e| panic!("{e}")));
    let mut model = Model::load(file).unwrap_or_else(|e| panic!("{}: {e}", case.stem));
    if numerics == Numerics::Fast {
        model.set_cpu_weight_layout(&Parallel::new(2), true, &moxie_core::progress::NoProgress);
    }
    model
}

/// KL(F32 master golden || this file's golden) for sequence `seq`: how far the file's own
/// weight quantization moves llama.cpp's logits, the scale of the quantized files' bounds.
fn master_kld(fx: &std::path::Path, index: &Value, case: &Case, seq: &str, n_vocab: usize) -> f64 {
    let logits = |stem: &str| {
        let f = index["models"][stem]["sequences"][seq]["logits_file"]
            .as_str()
            .unwrap();
        moxie_core::npy::read_f32(&fx.join(f)).unwrap().1
    };
    let master = format!("{}-tiny-F32", case.arch);
    mean_kld(&logits(&master), &logits(&case.stem), n_vocab)
}

fn argmax(x: &[f32]) -> usize {
    moxie_core::sampling::argmax(x) as usize
}

fn top1_agreement(a: &[f32], b: &[f32], n_vocab: usize) -> f64 {
    let rows = a.len() / n_vocab;
    let same = (0..rows)
        .filter(|&r| {
            argmax(&a[r * n_vocab..(r + 1) * n_vocab]) == argmax(&b[r * n_vocab..(r + 1) * n_vocab])
        })
        .count();
    same as f64 / rows as f64
}

/// llama.cpp's summation order: every file's logits must equal llama.cpp's bit for bit (the
/// KLD and greedy bounds are reported alongside).
#[test]
fn logits_and_greedy_match_llama_cpp_exact() {
    check_all_fixtures(Numerics::Exact, false);
}

/// The fast batched kernels (int8 GEMM, f32 attention) stay inside the same bounds.
#[test]
fn logits_and_greedy_match_llama_cpp_fast() {
    check_all_fixtures(Numerics::Fast, false);
}

/// ik_llama.cpp's files under exact numerics (its types take `vec_dot` at every batch size,
/// the other tensors llama.cpp's orders), inside the ik bound.
#[test]
fn logits_match_ik_llama_cpp_exact() {
    check_all_fixtures(Numerics::Exact, true);
}

/// ik_llama.cpp's files under fast numerics (int8 GEMM for batches), inside the ik bound.
#[test]
fn logits_match_ik_llama_cpp_fast() {
    check_all_fixtures(Numerics::Fast, true);
}

/// `--mla-use 3` ([`MlaPrompts::Expanded`]): with deepseek2's prompt batches expanding every
/// head's keys and values, its F32 file stays inside the F32 bound of llama.cpp's goldens
/// (the quantized files amplify the roundings the expansion does not repeat past theirs, which
/// is why it is not the default), and the longest sequence's logits differ from the absorbed
/// run's: the expanded path ran.
#[test]
fn expanded_mla_prompts_stay_inside_the_f32_bound() {
    let fx = fixtures();
    let index = golden_index();
    let case = fixture_case(&index, "deepseek2-tiny-F32");
    let model = load_model(&case, Numerics::Fast);
    let n_vocab = model.config.n_vocab;
    let absorbed = Parallel::new(2);
    let expanded = Parallel::new(2).with_mla_prompts(MlaPrompts::Expanded);
    let mut longest = (0, false);
    for (seq, s) in case.entry["sequences"].as_object().unwrap() {
        let tokens = token_ids(s);
        let (_, golden) =
            moxie_core::npy::read_f32(&fx.join(s["logits_file"].as_str().unwrap())).unwrap();
        let run = |par: &Parallel| {
            let mut cache = model.new_state(Some(512)).unwrap();
            model
                .forward(&tokens, &mut cache, par, Logits::All)
                .unwrap()
        };
        let (a, e) = (run(&absorbed), run(&expanded));
        let kld = mean_kld(&golden, &e, n_vocab);
        let top1 = top1_agreement(&golden, &e, n_vocab);
        println!("{seq}: expanded vs llama.cpp mean KLD {kld:.3e}, top-1 {top1:.3}");
        assert!(
            kld <= 1e-5 && top1 >= 0.99,
            "{seq}: KLD {kld:e}, top-1 {top1}"
        );
        if tokens.len() > longest.0 {
            longest = (tokens.len(), a != e);
        }
    }
    assert!(
        longest.1,
        "the longest sequence did not take the expanded path"
    );
}

/// The supported fixture named `stem`.
fn fixture_case(index: &Value, stem: &str) -> Case {
    supported_models(index)
        .into_iter()
        .find(|c| c.stem == stem)
        .unwrap_or_else(|| panic!("the fixture {stem}"))
}

/// Every supported fixture whose goldens come from ik_llama.cpp (`ik`) or from llama.cpp.
fn check_all_fixtures(numerics: Numerics, ik: bool) {
    let fx = fixtures();
    let index = golden_index();
    let cases: Vec<Case> = supported_models(&index)
        .into_iter()
        .filter(|c| is_ik(c) == ik)
        .collect();
    let expected = if ik { 9 } else { 17 };
    assert!(
        cases.len() >= expected,
        "expected the fixture models, found {}",
        cases.len()
    );
    let par = Parallel::new(2).with_numerics(numerics);
    let mut failures = Vec::new();
    let mut table = String::from(
        "model | seq | bit-identical | mean KLD | bound | top-1 | greedy to first near-tie | greedy, all steps\n",
    );
    for case in &cases {
        let model = load_model(case, numerics);
        let n_vocab = model.config.n_vocab;
        // ik files, over all positions: KLD, top-1 matches, and the bound's parts.
        let mut pooled = Pooled::default();
        for (seq, s) in case.entry["sequences"].as_object().unwrap() {
            let tokens = token_ids(s);
            let (_, golden) =
                moxie_core::npy::read_f32(&fx.join(s["logits_file"].as_str().unwrap())).unwrap();
            let mut cache = model.new_state(Some(512)).unwrap();
            let ours = model
                .forward(&tokens, &mut cache, &par, Logits::All)
                .unwrap();
            assert_eq!(ours.len(), golden.len());
            // Under exact numerics every llama.cpp file must give llama.cpp's logits to the
            // last bit: activations are converted and every product summed in ggml's order.
            let identical = ours
                .iter()
                .zip(&golden)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if numerics == Numerics::Exact && !identical && !ik {
                let (i, (a, b)) = ours
                    .iter()
                    .zip(&golden)
                    .enumerate()
                    .find(|(_, (a, b))| a.to_bits() != b.to_bits())
                    .unwrap();
                failures.push(format!(
                    "{} {seq}: logit {i} (position {}) is {a:e}, llama.cpp's {b:e}: not bit-identical",
                    case.stem,
                    i / n_vocab
                ));
            }
            let klds = kld_per_row(&golden, &ours, n_vocab);
            let kld = klds.iter().sum::<f64>() / klds.len() as f64;
            let top1 = top1_agreement(&golden, &ours, n_vocab);
            let (bound, top1_min) = if case.is_f32 {
                (1e-5, 0.99f64)
            } else {
                let m = master_kld(&fx, &index, case, seq, n_vocab);
                ((m / 10.0).max(1e-3), 0.95)
            };
            // ik_llama.cpp is measured against itself: its batch-1 vs batch-512 distance.
            let (bound, top1_min) = if ik {
                pooled.add(&klds, top1, bound);
                let (own_kld, own_top1) = ik_own(&case.entry, seq);
                ik_bound(bound, top1_min, own_kld, own_top1)
            } else {
                (bound, top1_min)
            };

            // Greedy: prompt in one batch, then one token per step.
            let want: Vec<u32> = s["greedy_continuation"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let margins: Vec<f64> = s["greedy_top1_top2_margin"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let check_n = margins.iter().position(|&m| m < 0.05).unwrap_or(want.len());
            // Generate all golden steps: the bound only covers steps before the first
            // near-tie, the rest is reported (it shows whether decode is bit-exact too).
            let mut cache = model.new_state(Some(512)).unwrap();
            let mut logits = model
                .forward(&tokens, &mut cache, &par, Logits::Last)
                .unwrap();
            let mut got = Vec::new();
            for _ in 0..want.len() {
                let t = argmax(&logits) as u32;
                got.push(t);
                logits = model.forward(&[t], &mut cache, &par, Logits::Last).unwrap();
            }
            let greedy_ok = got[..check_n] == want[..check_n];
            // Exact numerics must meet the bounds outright. Fast numerics sum in another order,
            // which the quantized files amplify through routing flips (fixtures README): the
            // per-position rule applies to them and greedy runs are reported, not required.
            let passed = if ik {
                // Per sequence: reported; the file's pooled check below decides.
                true
            } else if numerics == Numerics::Exact || case.is_f32 {
                kld <= bound && top1 >= top1_min && greedy_ok
            } else {
                per_position_ok(&klds, bound) && top1 >= 0.9
            };
            let same_prefix = got.iter().zip(&want).take_while(|(a, b)| a == b).count();

            let within = if kld <= bound && top1 >= top1_min {
                ""
            } else {
                " (outside)"
            };
            table.push_str(&format!(
                "{} | {seq} | {identical} | {kld:.3e} | {bound:.1e} | {:.1}% (min {:.1}%){within} | {}/{check_n} | {same_prefix}/{}\n",
                case.stem,
                top1 * 100.0,
                top1_min * 100.0,
                same_prefix.min(check_n),
                want.len()
            ));
            if !passed {
                failures.push(format!(
                    "{} {seq}: kld {kld:.3e} (bound {bound:.1e}), top1 {top1:.3}, greedy {:?} vs {:?}",
                    case.stem,
                    &got[..check_n],
                    &want[..check_n]
                ));
            }
        }
        if ik {
            let (kld, bound, top1, top1_min) = pooled.verdict(&case.entry);
            let ok = kld <= bound && top1 >= top1_min;
            table.push_str(&format!(
                "{} | all | - | {kld:.3e} | {bound:.1e} | {:.1}% (min {:.1}%) | {} | -\n",
                case.stem,
                top1 * 100.0,
                top1_min * 100.0,
                if ok { "pass" } else { "FAIL" }
            ));
            if !ok {
                failures.push(format!(
                    "{}: over all positions kld {kld:.3e} (bound {bound:.1e}), top1 {top1:.3} \
                     (min {top1_min:.3})",
                    case.stem
                ));
            }
        }
    }
    println!("numerics: {numerics:?}\n{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An ik_llama.cpp file's sequences pooled position by position: the sums behind its mean KLD
/// and top-1 agreement, and behind the position-weighted mean of the core bound.
#[derive(Default)]
struct Pooled {
    positions: f64,
    kld: f64,
    top1: f64,
    core_bound: f64,
}

impl Pooled {
    fn add(&mut self, klds: &[f64], top1: f64, core_bound: f64) {
        let n = klds.len() as f64;
        self.positions += n;
        self.kld += klds.iter().sum::<f64>();
        self.top1 += n * top1;
        self.core_bound += n * core_bound;
    }

    /// (mean KLD, its bound, top-1 agreement, its minimum), with ik's own distance pooled over
    /// the same positions (every sequence of `entry` was added).
    fn verdict(&self, entry: &Value) -> (f64, f64, f64, f64) {
        let n = self.positions;
        let (own_kld, own_top1) = ik_own_pooled(entry);
        let (bound, top1_min) = ik_bound(self.core_bound / n, 0.95, own_kld, own_top1);
        (self.kld / n, bound, self.top1 / n, top1_min)
    }
}

/// A q8_0 KV cache (`-ctk q8_0 -ctv q8_0`) moves logits from the f16 cache's by a bounded
/// amount on every fixture, in both numerics: per sequence, mean KL(f16 cache || q8_0 cache)
/// at most max(0.05, KL(file golden || F32 master golden)). The tiny random models amplify the
/// cache's rounding: llama.cpp's own q8_0 cache moves glm4moe-tiny-F32 by 2.6e-2, as ours does.
/// A wrong block offset or scale moves them by whole nats. No llama.cpp golden exists for
/// it; docs/performance.md has the hand-run comparison with llama.cpp's q8_0 cache.
#[test]
fn q8_0_kv_cache_stays_close_to_f16() {
    let fx = fixtures();
    let index = golden_index();
    let q8 = moxie_quant::GgmlType::Q8_0;
    let mut failures = Vec::new();
    let mut table = String::from("model | seq | numerics | mean KLD | bound\n");
    for case in &supported_models(&index) {
        let model = load_model(case, Numerics::Exact);
        let n_vocab = model.config.n_vocab;
        for (seq, s) in case.entry["sequences"].as_object().unwrap() {
            let tokens = token_ids(s);
            let bound = 0.05f64.max(if case.is_f32 {
                0.0
            } else {
                master_kld(&fx, &index, case, seq, n_vocab)
            });
            for numerics in [Numerics::Exact, Numerics::Fast] {
                let par = Parallel::new(2).with_numerics(numerics);
                let run = |cache: &mut moxie_core::SeqState| {
                    // The prompt in one batch, then its last 4 tokens again one at a time
                    // (decode against a cache that already holds positions).
                    let split = tokens.len().saturating_sub(4);
                    let mut all = model
                        .forward(&tokens[..split], cache, &par, Logits::All)
                        .unwrap();
                    for &t in &tokens[split..] {
                        all.extend(model.forward(&[t], cache, &par, Logits::All).unwrap());
                    }
                    all
                };
                let f16 = run(&mut model.new_state(Some(512)).unwrap());
                let q8 = moxie_core::KvTypes { k: q8, v: q8 };
                let mut cache = model.new_state_typed(Some(512), q8).unwrap();
                let ours = run(&mut cache);
                let kld = mean_kld(&f16, &ours, n_vocab);
                table.push_str(&format!(
                    "{} | {seq} | {numerics:?} | {kld:.3e} | {bound:.3e}\n",
                    case.stem
                ));
                if kld > bound {
                    failures.push(format!("{} {seq} {numerics:?}: kld {kld:.3e}", case.stem));
                }
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fast decode (one token against a filled cache: flash-style attention, in position order)
/// stays within the golden bounds around exact decode: the prompt but its last 20 tokens in one
/// exact batch, then those one at a time in each numerics. F32 files: at most 1e-5 per
/// position. Quantized files, over each model's ~45 decoded positions: the median inside the
/// golden bound and at most 1 position in 10 beyond 10x it. That is looser than the batch
/// rule's 1 in 20 because decode compounds: a routing flip at one step changes the cache every
/// later step reads (measured: 0-3 such positions per model, at 14-146x the bound).
#[test]
fn fast_decode_matches_exact_decode() {
    let fx = fixtures();
    let index = golden_index();
    let mut failures = Vec::new();
    for case in &supported_models(&index) {
        // Interleaved experts: fast decode takes the default kernels, exact decode puts the
        // rows back in GGUF order (bit-identical, `tests/interleaved.rs`).
        let model = load_model(case, Numerics::Fast);
        let n_vocab = model.config.n_vocab;
        // (KLD, bound) of every decoded position of this model.
        let mut positions = Vec::new();
        for (seq, s) in case.entry["sequences"].as_object().unwrap() {
            let tokens = token_ids(s);
            let split = tokens.len().saturating_sub(20).max(1);
            let decode = |numerics: Numerics| {
                let par = Parallel::new(2).with_numerics(numerics);
                let mut cache = model.new_state(Some(512)).unwrap();
                // The prompt part in exact numerics for both, so only decode differs.
                let exact = Parallel::new(2).with_numerics(Numerics::Exact);
                model
                    .forward(&tokens[..split], &mut cache, &exact, Logits::None)
                    .unwrap();
                let mut all = Vec::new();
                for &t in &tokens[split..] {
                    all.extend(model.forward(&[t], &mut cache, &par, Logits::All).unwrap());
                }
                all
            };
            let (exact, fast) = (decode(Numerics::Exact), decode(Numerics::Fast));
            let bound = if case.is_f32 {
                1e-5
            } else {
                (master_kld(&fx, &index, case, seq, n_vocab) / 10.0).max(1e-3)
            };
            for k in kld_per_row(&exact, &fast, n_vocab) {
                positions.push((k, bound));
            }
        }
        // The rule with each sequence's bound: scale every KLD by it, bound 1.
        let scaled: Vec<f64> = positions.iter().map(|(k, b)| k / b).collect();
        let mut sorted = scaled.clone();
        sorted.sort_by(f64::total_cmp);
        let outliers = scaled.iter().filter(|&&k| k > 10.0).count();
        let ok = if case.is_f32 {
            scaled.iter().all(|&k| k <= 1.0)
        } else {
            sorted[sorted.len() / 2] <= 1.0 && outliers * 10 <= scaled.len()
        };
        if !ok {
            failures.push(format!(
                "{}: KLD / bound per position {scaled:.2?}",
                case.stem
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The glm-dsa goldens exercise the indexer: its `top_k` (32) is smaller than the longer
/// sequences, so from position 32 on each query attends to a strict subset of the past. The
/// same F32 model with its indexers removed (dense MLA) still gives llama.cpp's logits bit for
/// bit before position 32, and misses them from there on (mean KLD far beyond the 1e-5 bound),
/// so the selection, not just MLA, is what the exact test checks.
#[test]
fn ignoring_the_dsa_indexer_fails_the_glm_dsa_goldens() {
    let fx = fixtures();
    let index = golden_index();
    let case = fixture_case(&index, "glm-dsa-tiny-F32");
    let mut model = load_model(&case, Numerics::Exact);
    let top_k = 32;
    for layer in &mut model.layers {
        match &mut layer.mixer {
            moxie_core::blocks::Mixer::Mla(m) => {
                assert!(m.sparse.is_some(), "every glm-dsa layer is sparse");
                m.sparse = None;
            }
            _ => panic!("glm-dsa layers are MLA"),
        }
    }
    let par = Parallel::new(2).with_numerics(Numerics::Exact);
    let n_vocab = model.config.n_vocab;
    let s = &case.entry["sequences"]["s120"];
    let tokens = token_ids(s);
    let (_, golden) =
        moxie_core::npy::read_f32(&fx.join(s["logits_file"].as_str().unwrap())).unwrap();
    let mut state = model.new_state(Some(512)).unwrap();
    let dense = model
        .forward(&tokens, &mut state, &par, Logits::All)
        .unwrap();
    let split = top_k * n_vocab;
    assert!(
        dense[..split]
            .iter()
            .zip(&golden[..split])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "dense MLA should equal the golden before the selection starts"
    );
    let later = mean_kld(&golden[split..], &dense[split..], n_vocab);
    eprintln!("glm-dsa-tiny-F32 s120 with dense MLA: mean KLD {later:.3e} from position {top_k}");
    assert!(
        later > 1e-2,
        "without the indexer, positions >= {top_k} are still within KLD {later:.2e}"
    );
}
