//! Progress of loading's long steps (weights uploaded to GPUs, repacked, read into memory,
//! paged in), reported in bytes to whoever draws it: the CLI's bar, or nothing.

/// Receives a step's size, its advances and its end, from the thread that loads.
pub trait Progress: Sync {
    /// A step of `total` bytes starts; `what` says what is read, e.g. "uploading to CUDA0".
    fn start(&self, what: &str, total: u64);
    /// `bytes` more of the current step are done.
    fn advance(&self, bytes: u64);
    /// The current step is over.
    fn finish(&self);
}

/// Progress that goes nowhere (library callers, tests).
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _what: &str, _total: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn finish(&self) {}
}
