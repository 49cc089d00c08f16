//! Logging shared by the master, the template and the workers: `tracing` events filtered by
//! `VRAMFORK_LOG` (default `info`) as text or JSON lines, the lines a process writes itself
//! ([`say`]: why it exits) and the workers' access log all leave the process through one
//! bounded, non-blocking path to stderr ([`queue`]), so that a log reader that stalls (a
//! pipe nobody reads, a stalled journal) never holds anything that serves or supervises:
//! lines that do not fit are dropped and counted (`vramfork_log_lines_dropped_total`), and a
//! `log_lines_dropped` line says how many once stderr takes lines again.
//!
//! A line is written whole in one write of at most 4,096 bytes (`PIPE_BUF`: atomic on a
//! pipe), so lines of the processes sharing stderr never mix; a longer one is shortened
//! ([`cut`]). Nothing here takes the process-wide `std::io::stderr` lock.

mod cut;
mod queue;
mod sink;

use std::time::Duration;

use tracing_subscriber::EnvFilter;

pub use cut::{marker, PIPE_BUF};
pub use queue::Kind;

/// Before a process exits: how long its last lines may take at most, and how long it waits
/// when none of them can be written (a reader that stalls) before it leaves them — counted
/// from the last write that went out, so that a process that finds stderr stalled for long
/// (or never wrote a line) waits only 10 ms.
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);
pub const EXIT_STUCK: Duration = Duration::from_millis(100);

/// Installs the global subscriber (later calls are no-ops) and starts this process's writer
/// thread (once per process: a worker forked from the template starts its own).
pub fn init(json: bool) {
    install(json);
    queue::logger().start_writer();
}

/// [`init`] without a thread, for a process that must stay single-threaded (the template):
/// each line is written by the caller that logs it, without waiting, or kept for later.
pub fn init_single_threaded(json: bool) {
    install(json);
}

fn install(json: bool) {
    let filter = EnvFilter::try_from_env("VRAMFORK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LineWriter(Vec::new()))
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = if json {
        // The target tells the master's events (`vramfork::master::…`) from the workers'.
        builder.json().with_target(true).try_init()
    } else {
        builder.try_init()
    };
    if installed.is_ok() {
        // The default hook writes to stderr under its lock, and would wait there.
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("<unnamed>");
            let trace = std::backtrace::Backtrace::capture();
            let trace = match trace.status() {
                std::backtrace::BacktraceStatus::Captured => format!("\n{trace}"),
                _ => String::new(),
            };
            say(&format!("thread '{name}' {info}{trace}"));
        }));
    }
}

/// Collects what the `tracing` formatter writes for one event, and queues it as one line.
struct LineWriter(Vec<u8>);

impl std::io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            queue::logger().submit([std::mem::take(&mut self.0)], Kind::Log);
        }
    }
}

/// Writes `line` to stderr as one whole line (see the module doc): for the lines the
/// master and the workers write themselves, such as why they exit.
pub fn say(line: &str) {
    queue::logger().submit([line.as_bytes().to_vec()], Kind::Log);
}

/// Queues whole lines of `kind` (the access log's); returns how many were dropped.
pub fn submit(lines: impl IntoIterator<Item = Vec<u8>>, kind: Kind) -> u64 {
    queue::logger().submit(lines, kind)
}

/// Lines of `kind` this process has dropped: found no room, left unwritten at its exit, or
/// written to a reader that had gone.
pub fn dropped(kind: Kind) -> u64 {
    queue::logger().dropped(kind)
}

/// Writes what is queued before the process exits or execs: at most [`EXIT_FLUSH`], and no
/// more than [`EXIT_STUCK`] since anything was written; what is left then is dropped and
/// counted. Never waits for ever.
pub fn flush() {
    queue::logger().flush(EXIT_FLUSH, EXIT_STUCK);
}
