//! The generation engine: one thread owns the model and N slots (each with its own KV cache)
//! and advances the busy slots in turn, one micro-batch of prompt or one generated token per
//! slot per round. Requests wait in a bounded queue for a free slot.
//!
//! A request's events go out through an unbounded channel (generation is bounded by
//! `max_tokens`, so is the channel); when the receiver is gone the client has left, and the
//! slot is freed before its next step.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use moxie_core::{KvTypes, Logits, Model, Parallel, Sampler, SamplerConfig, SeqState};
use moxie_tokenizer::{Tokenizer, Utf8Stream};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::grammar::{Grammar, GrammarState, TokenConstraint};
use crate::metrics::Metrics;
use crate::output::{partial_suffix, Delta, OutputParser, Parsed};

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub n_slots: usize,
    /// Context of each slot, in tokens.
    pub n_ctx: usize,
    /// Prompt micro-batch.
    pub ubatch: usize,
    /// Requests that may wait for a slot while all are busy; one more gets 503.
    pub queue_limit: usize,
    pub kv_types: KvTypes,
}

/// One request for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (already bounded by the context).
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub parser: OutputParser,
    /// A grammar the answer must follow (forced tool call, JSON output); applied once any
    /// reasoning is over.
    pub grammar: Option<Arc<Grammar>>,
    /// Reasoning tokens allowed before `</think>` is inserted (None: unlimited).
    pub reasoning_budget: Option<usize>,
    pub events: UnboundedSender<Event>,
}

/// What a request hears from the engine.
#[derive(Debug)]
pub enum Event {
    /// The request has a slot and its prompt is being evaluated.
    Started,
    Delta(Delta),
    Done(Box<Done>),
    Error(ApiError),
}

/// The end of a request.
#[derive(Clone, Debug)]
pub struct Done {
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    pub output: Parsed,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

/// llama-server's `timings` object.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
}

impl Timings {
    pub fn to_json(self) -> serde_json::Value {
        let per_tok = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let per_s = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        serde_json::json!({
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": per_tok(self.prompt_ms, self.prompt_n),
            "prompt_per_second": per_s(self.prompt_ms, self.prompt_n),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": per_tok(self.predicted_ms, self.predicted_n),
            "predicted_per_second": per_s(self.predicted_ms, self.predicted_n),
        })
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

/// The handle the HTTP side holds.
pub struct Engine {
    queue: Mutex<Queue>,
    wake: Condvar,
    pub metrics: Arc<Metrics>,
    /// The model's routing counters (read by `/metrics` and `--profile-out`).
    pub routing: Arc<moxie_core::telemetry::RoutingStats>,
    pub config: EngineConfig,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Engine {
    /// Start the engine thread over `model`. Fails if a slot's KV cache cannot be made.
    pub fn start(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        par: Parallel,
        config: EngineConfig,
    ) -> moxie_core::Result<Arc<Engine>> {
        let metrics = Arc::new(Metrics::default());
        let mut slots = Vec::with_capacity(config.n_slots);
        for _ in 0..config.n_slots {
            slots.push(Slot {
                state: model.new_state_typed(Some(config.n_ctx), config.kv_types)?,
                tokens: Vec::new(),
                last_used: 0,
                active: None,
            });
        }
        metrics.n_slots.store(config.n_slots as u64, Relaxed);
        metrics
            .kv_cache_capacity
            .store((config.n_slots * config.n_ctx) as u64, Relaxed);
        let engine = Arc::new(Engine {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            metrics,
            routing: model.routing.clone(),
            config,
            thread: Mutex::new(None),
        });
        let pieces = output_pieces(&tokenizer);
        let constraint = TokenConstraint::new(pieces.clone(), tokenizer.eog_tokens().to_vec());
        let think_close = tokenizer.encode("</think>\n\n", false, true);
        let mut worker = Worker {
            engine: engine.clone(),
            model,
            tokenizer,
            par,
            slots,
            constraint,
            pieces,
            think_close,
            clock: 0,
        };
        let handle = std::thread::Builder::new()
            .name("moxie-engine".into())
            .spawn(move || worker.run())
            .map_err(moxie_core::Error::Io)?;
        *engine.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(engine)
    }

    /// Queue a request; 503 when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.shutdown {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        // Slots that are free now take queued requests at the engine's next turn.
        let busy = self.metrics.requests_processing.load(Relaxed) as usize;
        let free_slots = self.config.n_slots.saturating_sub(busy);
        if q.jobs.len() >= self.config.queue_limit + free_slots {
            Metrics::add(&self.metrics.requests_rejected_total, 1);
            return Err(ApiError::unavailable(format!(
                "all {} slots are busy and {} requests are already waiting; try again later",
                self.config.n_slots,
                q.jobs.len()
            )));
        }
        q.jobs.push_back(job);
        self.metrics
            .requests_queued
            .store(q.jobs.len() as u64, Relaxed);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// Stop taking work, finish nothing more, and join the engine thread.
    pub fn shutdown(&self) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.wake.notify_all();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

struct Slot {
    state: SeqState,
    /// The tokens `state` holds (their keys and values, or the recurrent state after them).
    tokens: Vec<u32>,
    last_used: u64,
    active: Option<Active>,
}

impl Slot {
    /// Forget everything the slot holds.
    fn reset(&mut self) {
        // A state that cannot even be reset fails the next request's restore, which says so.
        let _ = self.state.truncate(0);
        self.tokens.clear();
    }
}

/// A request in a slot.
struct Active {
    job: Job,
    /// Prompt tokens still to evaluate.
    pending: Vec<u32>,
    n_prompt: usize,
    n_cached: usize,
    sampler: Sampler,
    /// The next token to feed (the last one sampled), once the prompt is in.
    next: Option<u32>,
    /// Tokens to emit instead of sampling (the `</think>` a budget inserts).
    forced: VecDeque<u32>,
    generated: usize,
    reasoning_tokens: usize,
    utf8: Utf8Stream,
    /// Decoded text held back because it may begin a stop sequence.
    held: String,
    grammar: Option<GrammarState>,
    t_start: Instant,
    t_prompt_done: Option<Instant>,
}

struct Worker {
    engine: Arc<Engine>,
    model: Model,
    tokenizer: Arc<Tokenizer>,
    par: Parallel,
    slots: Vec<Slot>,
    constraint: TokenConstraint,
    /// The text each token adds to the output.
    pieces: Vec<Vec<u8>>,
    think_close: Vec<u32>,
    clock: u64,
}

/// How a step ended for its slot.
enum Step {
    Continue,
    Finished,
}

impl Worker {
    fn run(&mut self) {
        loop {
            if !self.admit() {
                // Shutting down: the routing GPUs counted joins the model's counters, for the
                // last `--profile-out` write.
                if let Err(e) = self.model.flush_routing() {
                    eprintln!("warning: routing telemetry: {e}");
                }
                return;
            }
            for i in 0..self.slots.len() {
                if self.slots[i].active.is_none() {
                    continue;
                }
                let gone = self.slots[i]
                    .active
                    .as_ref()
                    .is_some_and(|a| a.job.events.is_closed());
                if gone {
                    Metrics::add(&self.engine.metrics.requests_cancelled_total, 1);
                    self.slots[i].active = None;
                    continue;
                }
                // A bug must not take the engine thread down with it (every later request
                // would wait forever): a panic fails this request only.
                let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(i)))
                    .unwrap_or_else(|p| {
                        let what = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(ApiError::internal(format!("the engine failed: {what}")))
                    });
                match step {
                    Ok(Step::Continue) => {}
                    Ok(Step::Finished) => self.slots[i].active = None,
                    Err(e) => {
                        Metrics::add(&self.engine.metrics.requests_failed_total, 1);
                        if let Some(a) = self.slots[i].active.take() {
                            let _ = a.job.events.send(Event::Error(e));
                        }
                        // The state may hold part of a failed batch: start it afresh.
                        self.slots[i].reset();
                    }
                }
            }
            self.update_gauges();
        }
    }

    fn update_gauges(&self) {
        let m = &self.engine.metrics;
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        m.requests_processing.store(busy as u64, Relaxed);
        let held: usize = self.slots.iter().map(|s| s.state.len()).sum();
        m.kv_cache_tokens.store(held as u64, Relaxed);
        if let Some(c) = self.model.expert_cache_counts() {
            m.has_expert_cache.store(1, Relaxed);
            m.expert_cache_lookups.store(c.lookups, Relaxed);
            m.expert_cache_hits.store(c.hits, Relaxed);
            m.expert_cache_uploads.store(c.uploads, Relaxed);
        }
    }

    /// Give free slots to waiting requests; with nothing to do, wait. False at shutdown.
    fn admit(&mut self) -> bool {
        let engine = self.engine.clone();
        let mut q = engine.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if q.shutdown {
                return false;
            }
            while let Some(job) = q.jobs.pop_front() {
                if job.events.is_closed() {
                    Metrics::add(&self.engine.metrics.requests_cancelled_total, 1);
                    continue;
                }
                match self.free_slot_for(&job.prompt) {
                    Some(i) => self.assign(i, job),
                    None => {
                        q.jobs.push_front(job);
                        break;
                    }
                }
            }
            engine
                .metrics
                .requests_queued
                .store(q.jobs.len() as u64, Relaxed);
            self.update_gauges();
            if self.slots.iter().any(|s| s.active.is_some()) {
                return true;
            }
            q = engine.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The free slot sharing the longest prefix with `prompt` (then the least recently used).
    fn free_slot_for(&self, prompt: &[u32]) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(_, s)| (common_prefix(&s.tokens, prompt), u64::MAX - s.last_used))
            .map(|(i, _)| i)
    }

    fn assign(&mut self, i: usize, job: Job) {
        self.clock += 1;
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        // Reuse the cached prefix; at least one token is evaluated, for its logits. A model
        // with recurrent layers keeps less: its state only exists where it was checkpointed.
        let mut keep = common_prefix(&slot.tokens, &job.prompt);
        if keep == job.prompt.len() {
            keep -= 1;
        }
        let keep = match slot.state.truncate(keep) {
            Ok(kept) => kept,
            Err(e) => {
                let _ = job.events.send(Event::Error(ApiError::internal(format!(
                    "restoring the slot's state: {e}"
                ))));
                slot.reset();
                return;
            }
        };
        slot.tokens.truncate(keep);
        let mut sampler = Sampler::new(job.sampler.clone());
        let window = job.sampler.repeat_last_n;
        for &t in &job.prompt[job.prompt.len().saturating_sub(window)..] {
            sampler.accept(t);
        }
        let grammar = job.grammar.as_ref().map(GrammarState::new);
        let _ = job.events.send(Event::Started);
        slot.active = Some(Active {
            pending: job.prompt[keep..].to_vec(),
            n_prompt: job.prompt.len(),
            n_cached: keep,
            job,
            sampler,
            next: None,
            forced: VecDeque::new(),
            generated: 0,
            reasoning_tokens: 0,
            utf8: Utf8Stream::default(),
            held: String::new(),
            grammar,
            t_start: Instant::now(),
            t_prompt_done: None,
        });
    }

    /// One micro-batch of prompt, or one token, for slot `i`.
    fn step(&mut self, i: usize) -> Result<Step, ApiError> {
        let ubatch = self.engine.config.ubatch.max(1);
        let slot = &mut self.slots[i];
        let a = slot.active.as_mut().expect("step on a busy slot");
        let logits = if !a.pending.is_empty() {
            let n = a.pending.len().min(ubatch);
            let chunk: Vec<u32> = a.pending.drain(..n).collect();
            let which = if a.pending.is_empty() {
                Logits::Last
            } else {
                Logits::None
            };
            let logits = self
                .model
                .forward(&chunk, &mut slot.state, &self.par, which)
                .map_err(|e| ApiError::internal(format!("evaluating the prompt: {e}")))?;
            slot.tokens.extend_from_slice(&chunk);
            if !a.pending.is_empty() {
                return Ok(Step::Continue);
            }
            // The end of the prompt is where a later request is most likely to diverge: keep
            // the recurrent state here (nothing is kept for attention-only models).
            slot.state
                .checkpoint()
                .map_err(|e| ApiError::internal(format!("checkpointing the state: {e}")))?;
            let now = Instant::now();
            a.t_prompt_done = Some(now);
            let m = &self.engine.metrics;
            Metrics::add(&m.prompt_tokens_total, (a.n_prompt - a.n_cached) as u64);
            Metrics::add(&m.prompt_tokens_cached_total, a.n_cached as u64);
            Metrics::add(&m.prompt_micros_total, (now - a.t_start).as_micros() as u64);
            logits
        } else {
            let t = a.next.expect("a sampled token follows the prompt");
            if slot.state.len() >= slot.state.n_ctx() {
                return Ok(self.finish(i, "length"));
            }
            let logits = self
                .model
                .forward(&[t], &mut slot.state, &self.par, Logits::Last)
                .map_err(|e| ApiError::internal(format!("generating: {e}")))?;
            slot.tokens.push(t);
            logits
        };
        self.after_logits(i, logits)
    }

    /// Choose the next token from `logits` and pass on its text.
    fn after_logits(&mut self, i: usize, mut logits: Vec<f32>) -> Result<Step, ApiError> {
        let a = self.slots[i].active.as_mut().expect("busy slot");
        let tokens_left = a.job.max_tokens - a.generated;
        let tok = if let Some(t) = a.forced.pop_front() {
            t
        } else {
            if a.job.ignore_eos {
                for &t in self.tokenizer.eog_tokens() {
                    if let Some(l) = logits.get_mut(t as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            if let Some(g) = &a.grammar {
                if !a.job.parser.in_reasoning() {
                    self.constraint.mask(g, tokens_left, &mut logits);
                }
            }
            a.sampler.sample(&logits)
        };
        a.sampler.accept(tok);
        if self.tokenizer.is_eog(tok) && !a.job.ignore_eos {
            return Ok(self.finish(i, "stop"));
        }
        a.generated += 1;
        a.next = Some(tok);
        let piece = self.pieces.get(tok as usize).map_or(&[][..], Vec::as_slice);
        let in_reasoning = a.job.parser.in_reasoning();
        if let Some(g) = a.grammar.as_mut() {
            if !in_reasoning && !g.accept_bytes(piece) {
                // The mask only lets grammar-conforming tokens through (or none could
                // continue): stop following the grammar rather than fail the request.
                a.grammar = None;
            }
        }
        if in_reasoning {
            a.reasoning_tokens += 1;
            if a.job
                .reasoning_budget
                .is_some_and(|b| a.reasoning_tokens >= b)
                && a.forced.is_empty()
            {
                a.forced.extend(self.think_close.iter().copied());
            }
        }
        let text = a.utf8.push(piece);
        let (emit, stopped) = apply_stops(&mut a.held, &text, &a.job.stop);
        if !emit.is_empty() {
            let delta = a.job.parser.push(&emit);
            if !delta.is_empty() && a.job.events.send(Event::Delta(delta)).is_err() {
                Metrics::add(&self.engine.metrics.requests_cancelled_total, 1);
                return Ok(Step::Finished);
            }
        }
        if stopped {
            a.held.clear();
            return Ok(self.finish(i, "stop"));
        }
        if a.generated >= a.job.max_tokens {
            return Ok(self.finish(i, "length"));
        }
        if a.grammar.as_ref().is_some_and(|g| g.is_complete()) && a.forced.is_empty() {
            return Ok(self.finish(i, "stop"));
        }
        Ok(Step::Continue)
    }

    /// Send the request's end and free its slot.
    fn finish(&mut self, i: usize, reason: &'static str) -> Step {
        let slot = &mut self.slots[i];
        let Some(mut a) = slot.active.take() else {
            return Step::Finished;
        };
        // A follow-up request usually repeats the whole exchange: keep the recurrent state
        // at its end too. A failed checkpoint only means recomputing from an earlier one.
        let _ = slot.state.checkpoint();
        let now = Instant::now();
        let t_prompt = a.t_prompt_done.unwrap_or(now);
        let rest = a.utf8.finish();
        let mut tail = std::mem::take(&mut a.held);
        tail.push_str(&rest);
        let mut first = a.job.parser.push(&tail);
        let mut output = a.job.parser.finish();
        first.reasoning.push_str(&output.last.reasoning);
        first.content.push_str(&output.last.content);
        output.last = first;
        let finish_reason = if !output.tool_calls.is_empty() && reason == "stop" {
            "tool_calls"
        } else {
            reason
        };
        let timings = Timings {
            cache_n: a.n_cached,
            prompt_n: a.n_prompt - a.n_cached,
            prompt_ms: (t_prompt - a.t_start).as_secs_f64() * 1e3,
            predicted_n: a.generated,
            predicted_ms: (now - t_prompt).as_secs_f64() * 1e3,
        };
        let m = &self.engine.metrics;
        Metrics::add(&m.tokens_predicted_total, a.generated as u64);
        Metrics::add(
            &m.predicted_micros_total,
            (now - t_prompt).as_micros() as u64,
        );
        Metrics::add(&m.requests_success_total, 1);
        let done = Done {
            finish_reason,
            output,
            usage: Usage {
                prompt_tokens: a.n_prompt,
                completion_tokens: a.generated,
                cached_tokens: a.n_cached,
            },
            timings,
        };
        let _ = a.job.events.send(Event::Done(Box::new(done)));
        Step::Finished
    }
}

/// Marker tokens the output parser must see even when the vocabulary marks them CONTROL
/// (which plain detokenization hides): thinking tags and every family's tool-call markers.
const PRESERVED_MARKERS: [&str; 22] = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<tools>",
    "</tools>",
    "<function=",
    "</function>",
];

/// The text each token adds to the generated output: its piece, control tokens hidden except
/// the markers above.
fn output_pieces(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.n_vocab() as u32)
        .map(|t| {
            if tok.is_control(t) && !tok.is_eog(t) {
                let special = tok.token_to_piece(t, true);
                if PRESERVED_MARKERS.iter().any(|m| m.as_bytes() == special) {
                    return special;
                }
            }
            tok.token_to_piece(t, false)
        })
        .collect()
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Add `text` to `held` and return (text that can be passed on, whether a stop sequence was
/// found). A found stop sequence and all after it is dropped; a tail that may begin one stays
/// in `held`.
pub fn apply_stops(held: &mut String, text: &str, stops: &[String]) -> (String, bool) {
    held.push_str(text);
    if stops.is_empty() {
        return (std::mem::take(held), false);
    }
    if let Some(at) = stops.iter().filter_map(|s| held.find(s.as_str())).min() {
        let out = held[..at].to_string();
        held.clear();
        return (out, true);
    }
    let keep = stops
        .iter()
        .map(|s| partial_suffix(held, s))
        .max()
        .unwrap_or(0);
    let out = held[..held.len() - keep].to_string();
    held.drain(..held.len() - keep);
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_hold_back_partial_matches() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        let mut held = String::new();
        assert_eq!(
            apply_stops(&mut held, "abc E", &stops),
            ("abc ".into(), false)
        );
        assert_eq!(held, "E");
        assert_eq!(apply_stops(&mut held, "N", &stops), (String::new(), false));
        assert_eq!(
            apply_stops(&mut held, "Dtail", &stops),
            (String::new(), true)
        );
        let mut held = String::new();
        assert_eq!(apply_stops(&mut held, "x\n", &stops), ("x".into(), false));
        assert_eq!(apply_stops(&mut held, "y", &stops), ("\ny".into(), false));
        let mut held = String::new();
        assert_eq!(
            apply_stops(&mut held, "a\n\nb", &[]),
            ("a\n\nb".into(), false)
        );
    }

    #[test]
    fn prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
