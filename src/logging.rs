//! Logging set-up shared by the master and the workers: `tracing` to stderr, filtered by
//! `VRAMFORK_LOG` (default `info`), as text or JSON lines.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; later calls are no-ops.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_env("VRAMFORK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        // The target tells the master's events (`vramfork::master::…`) from the workers'.
        builder.json().with_target(true).try_init()
    } else {
        builder.try_init()
    };
}
