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

/// Writes `line` and a newline to stderr in one `write` (atomic on a pipe up to `PIPE_BUF`,
/// 4096 bytes): for the lines the master and the workers write themselves (why they exit).
/// stderr is shared by the master and every worker, and `eprintln!` writes its pieces one by
/// one, so another process's log line could land inside one (and a JSON log line then could
/// not be read back whole). A failure to write is ignored (`eprintln!` would panic).
pub fn say(line: &str) {
    use std::io::Write;
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&buf);
}
