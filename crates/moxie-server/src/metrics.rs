//! Counters and gauges for `GET /metrics` (Prometheus text format).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Everything `/metrics` reports. Counters only grow; gauges are set by the engine.
#[derive(Default)]
pub struct Metrics {
    pub requests_total: AtomicU64,
    pub requests_success_total: AtomicU64,
    /// 4xx answers (bad input, auth).
    pub requests_invalid_total: AtomicU64,
    /// 503 answers (queue full).
    pub requests_rejected_total: AtomicU64,
    /// Clients that went away before the answer was complete.
    pub requests_cancelled_total: AtomicU64,
    pub requests_failed_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    /// Prompt tokens taken from a slot's cache instead of being evaluated.
    pub prompt_tokens_cached_total: AtomicU64,
    pub prompt_micros_total: AtomicU64,
    pub tokens_predicted_total: AtomicU64,
    pub predicted_micros_total: AtomicU64,
    pub requests_processing: AtomicU64,
    pub requests_queued: AtomicU64,
    pub kv_cache_tokens: AtomicU64,
    /// `--expert-cache` (all layers): decode selections looked up, found resident, and experts
    /// brought in; reported when `has_expert_cache` is 1.
    pub expert_cache_lookups: AtomicU64,
    pub expert_cache_hits: AtomicU64,
    pub expert_cache_uploads: AtomicU64,
    pub has_expert_cache: AtomicU64,
    /// Gauges fixed at start.
    pub n_slots: AtomicU64,
    pub kv_cache_capacity: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// The Prometheus exposition text.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut s = String::new();
        let mut put = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(s, "# HELP moxie_{name} {help}");
            let _ = writeln!(s, "# TYPE moxie_{name} {kind}");
            let _ = writeln!(s, "moxie_{name} {value}");
        };
        let prompt_s = g(&self.prompt_micros_total) as f64 / 1e6;
        let predicted_s = g(&self.predicted_micros_total) as f64 / 1e6;
        let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        put(
            "requests_total",
            "counter",
            "Requests received by the completion endpoints.",
            g(&self.requests_total) as f64,
        );
        put(
            "requests_success_total",
            "counter",
            "Requests answered in full.",
            g(&self.requests_success_total) as f64,
        );
        put(
            "requests_invalid_total",
            "counter",
            "Requests refused with a 4xx error.",
            g(&self.requests_invalid_total) as f64,
        );
        put(
            "requests_rejected_total",
            "counter",
            "Requests refused with 503 because the queue was full.",
            g(&self.requests_rejected_total) as f64,
        );
        put(
            "requests_cancelled_total",
            "counter",
            "Requests whose client disconnected before the end.",
            g(&self.requests_cancelled_total) as f64,
        );
        put(
            "requests_failed_total",
            "counter",
            "Requests that failed inside the engine.",
            g(&self.requests_failed_total) as f64,
        );
        put(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated.",
            g(&self.prompt_tokens_total) as f64,
        );
        put(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's KV cache.",
            g(&self.prompt_tokens_cached_total) as f64,
        );
        put(
            "prompt_seconds_total",
            "counter",
            "Time spent evaluating prompts.",
            prompt_s,
        );
        put(
            "tokens_predicted_total",
            "counter",
            "Tokens generated.",
            g(&self.tokens_predicted_total) as f64,
        );
        put(
            "tokens_predicted_seconds_total",
            "counter",
            "Time spent generating.",
            predicted_s,
        );
        put(
            "prompt_tokens_per_second",
            "gauge",
            "Average prompt throughput.",
            rate(g(&self.prompt_tokens_total), prompt_s),
        );
        put(
            "predicted_tokens_per_second",
            "gauge",
            "Average generation throughput.",
            rate(g(&self.tokens_predicted_total), predicted_s),
        );
        put(
            "requests_processing",
            "gauge",
            "Requests holding a slot.",
            g(&self.requests_processing) as f64,
        );
        put(
            "requests_queued",
            "gauge",
            "Requests waiting for a slot.",
            g(&self.requests_queued) as f64,
        );
        put(
            "slots_total",
            "gauge",
            "Slots (sequences generated at once).",
            g(&self.n_slots) as f64,
        );
        put(
            "kv_cache_tokens",
            "gauge",
            "Positions held in the slots' KV caches.",
            g(&self.kv_cache_tokens) as f64,
        );
        if g(&self.has_expert_cache) == 1 {
            put(
                "expert_cache_lookups_total",
                "counter",
                "Routed-expert selections of decode steps looked up in the expert cache.",
                g(&self.expert_cache_lookups) as f64,
            );
            put(
                "expert_cache_hits_total",
                "counter",
                "Of those, the ones resident in the cache (computed on its device).",
                g(&self.expert_cache_hits) as f64,
            );
            put(
                "expert_cache_uploads_total",
                "counter",
                "Experts brought into the cache.",
                g(&self.expert_cache_uploads) as f64,
            );
        }
        let cap = g(&self.kv_cache_capacity);
        put(
            "kv_cache_usage_ratio",
            "gauge",
            "KV cache positions in use over capacity.",
            if cap > 0 {
                g(&self.kv_cache_tokens) as f64 / cap as f64
            } else {
                0.0
            },
        );
        s
    }
}

/// Per-layer routing summaries in Prometheus' text format: tokens routed per layer and phase,
/// and how concentrated each layer's selections are (the fewest experts that took half and
/// nine tenths of them, and the busiest expert's share).
pub fn render_routing(p: &moxie_core::telemetry::RoutingProfile) -> String {
    use moxie_core::telemetry::Phase;
    let mut s = String::new();
    if p.layers.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "# HELP moxie_routing_tokens_total Tokens routed by each MoE layer, per phase."
    );
    let _ = writeln!(s, "# TYPE moxie_routing_tokens_total counter");
    for l in &p.layers {
        for (phase, name) in [(Phase::Prefill, "prefill"), (Phase::Decode, "decode")] {
            let _ = writeln!(
                s,
                "moxie_routing_tokens_total{{layer=\"{}\",phase=\"{name}\"}} {}",
                l.layer, l.tokens[phase as usize]
            );
        }
    }
    let _ = writeln!(
        s,
        "# HELP moxie_routing_experts_for_share The fewest experts of a layer that took this \
         share of its selections (both phases; of {} experts).",
        p.n_expert
    );
    let _ = writeln!(s, "# TYPE moxie_routing_experts_for_share gauge");
    for l in &p.layers {
        for share in [0.5, 0.9] {
            let _ = writeln!(
                s,
                "moxie_routing_experts_for_share{{layer=\"{}\",share=\"{share}\"}} {}",
                l.layer,
                l.experts_for_share(None, share)
            );
        }
    }
    let _ = writeln!(
        s,
        "# HELP moxie_routing_top_expert_share The busiest expert's share of a layer's selections."
    );
    let _ = writeln!(s, "# TYPE moxie_routing_top_expert_share gauge");
    for l in &p.layers {
        let (_, share) = l.busiest();
        let _ = writeln!(
            s,
            "moxie_routing_top_expert_share{{layer=\"{}\"}} {share}",
            l.layer
        );
    }
    s
}
