//! Loading's progress bar: `moxie_core::progress::Progress` drawn with indicatif on stderr
//! (bytes, bytes/s and time left) while a step runs, then cleared: the summary line each step
//! prints after it is the record. indicatif draws nothing where stderr is not a terminal.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use moxie_core::progress::Progress;

/// The bar of the step in progress, if any.
#[derive(Default)]
pub struct LoadBar(Mutex<Option<ProgressBar>>);

impl LoadBar {
    fn bar(&self) -> std::sync::MutexGuard<'_, Option<ProgressBar>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Progress for LoadBar {
    fn start(&self, what: &str, total: u64) {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{msg:<34} [{bar:30}] {binary_bytes:>10} / {binary_total_bytes:<10} \
             {binary_bytes_per_sec:>12}  {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(what.to_owned());
        if let Some(old) = self.bar().replace(bar) {
            old.finish_and_clear();
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = self.bar().as_ref() {
            bar.inc(bytes);
        }
    }

    fn finish(&self) {
        if let Some(bar) = self.bar().take() {
            bar.finish_and_clear();
        }
    }
}
