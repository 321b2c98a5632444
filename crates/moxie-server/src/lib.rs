//! `moxie serve`: an OpenAI-compatible HTTP server over a loaded [`moxie_core::Model`].
//!
//! * [`request`] parses bodies field by field (every bad field is a 400 naming it);
//! * [`prompt`] renders chat templates (tools, reasoning switches, `chat_template_kwargs`),
//!   tokenizes and checks the context;
//! * [`engine`] owns the model on its own thread with N slots (own KV caches, prompt-prefix
//!   reuse) and a bounded queue;
//! * [`output`] splits the generated text into reasoning, content and tool calls
//!   ([`tool_calls`]: per-family syntaxes), [`grammar`] constrains forced tool calls and JSON
//!   output;
//! * [`http`] has the routes and the OpenAI / llama-server response shapes.

pub mod engine;
pub mod error;
pub mod grammar;
pub mod http;
pub mod metrics;
pub mod output;
pub mod prompt;
pub mod request;
pub mod tool_calls;

pub use engine::{Engine, EngineConfig};
pub use error::ApiError;
pub use http::{router, AppState};
pub use metrics::Metrics;
pub use prompt::{Prompter, ReasoningMode};
pub use request::GenDefaults;

/// Serve `router` on `listener` until Ctrl-C or SIGTERM, then stop the engine.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: std::sync::Arc<AppState>,
) -> std::io::Result<()> {
    let engine = state.engine.clone();
    let app = router(state);
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await;
    engine.shutdown();
    res
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
