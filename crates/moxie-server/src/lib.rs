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
//! * [`http`] has the routes and the OpenAI / llama-server response shapes;
//! * [`conn`] accepts connections and holds slow and hostile clients to `--timeout`.

pub mod conn;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod http;
pub mod metrics;
pub mod output;
pub mod prompt;
pub mod request;
pub mod tool_calls;

pub use conn::DEFAULT_TIMEOUT;
pub use engine::{Engine, EngineConfig};
pub use error::ApiError;
pub use http::{router, AppState, ProfileOut};
pub use metrics::Metrics;
pub use prompt::{Prompter, ReasoningMode};
pub use request::GenDefaults;

/// Serve `router` on `listener` until Ctrl-C or SIGTERM, then stop the engine.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: std::sync::Arc<AppState>,
) -> std::io::Result<()> {
    let engine = state.engine.clone();
    let profile_state = state.clone();
    // `--profile-out`: the routing profile rewritten every interval while serving.
    let writer = state.profile.as_ref().map(|p| {
        let (state, every) = (state.clone(), p.every);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await; // the first tick is immediate
            loop {
                tick.tick().await;
                write_profile(&state);
            }
        })
    });
    let timeout = state.timeout;
    let app = router(state);
    conn::serve_connections(listener, app, timeout, shutdown_signal()).await;
    engine.shutdown();
    if let Some(w) = writer {
        w.abort();
    }
    // And once more with everything the engine counted.
    write_profile(&profile_state);
    Ok(())
}

/// Write the routing profile if `--profile-out` asked for one; a failure is reported, not
/// fatal (the server keeps serving).
fn write_profile(state: &AppState) {
    if let Some(p) = &state.profile {
        if let Err(e) = p.write(&state.engine.routing) {
            eprintln!("warning: --profile-out: {e}");
        }
    }
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
