//! The one path every line of a process takes to stderr: a bounded queue of whole lines
//! ([`CAPACITY`] bytes) that never makes the caller wait on the output, and the drain that
//! writes it without blocking, in writes of whole lines of at most `PIPE_BUF` bytes. A line
//! that does not fit is dropped and counted; once lines can be written again after drops, a
//! `log_lines_dropped` line says how many (at most one a second).
//!
//! Who drains: a writer thread of the process's own (master, workers), which waits for room
//! with `poll` while holding no lock that a caller takes; or, in a process that must stay
//! single-threaded (the template, a spare), the caller that queued the line, taking what
//! fits now and leaving the rest for later. A forked child starts with an empty queue: what
//! the parent had queued is the parent's to write.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::cut::{fit, PIPE_BUF};
use super::sink::Sink;

/// What a line is: counted apart, because the access log has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A log line (`tracing`, or a process's own last words).
    Log = 0,
    /// An access-log line (`--access-log`).
    Access = 1,
}

/// Bytes of lines queued at most; more are dropped.
pub const CAPACITY: usize = 1 << 20;
/// Access-log lines take at most this much of the queue, so that a flood of them leaves
/// room for the lines that say why a process exits.
const ACCESS_ROOM: usize = CAPACITY / 4 * 3;
/// How long the writer thread waits for room, or for lines, before it looks again.
const TICK: Duration = Duration::from_secs(1);
/// The least a flush waits for room before it gives up (see [`Logger::flush`]).
const MIN_WAIT: Duration = Duration::from_millis(10);
/// At most one `log_lines_dropped` line this often.
const NOTICE_EVERY: Duration = Duration::from_secs(1);

struct Entry {
    line: Vec<u8>,
    kind: Kind,
}

#[derive(Default)]
struct Queue {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// Dropped since the process started, by [`Kind`].
    dropped: [u64; 2],
    /// Dropped since the last `log_lines_dropped` line, by [`Kind`].
    unsaid: [u64; 2],
}

/// The writing side, held while (and only while) lines are written without blocking.
#[derive(Default)]
struct Output {
    /// The lines of one write.
    chunk: Vec<u8>,
    /// What a partial write left (a terminal or a socket can take part of a write).
    rest: Vec<u8>,
    /// The last write found no room.
    stalled: bool,
    /// When a write last went out (in this process, or in the parent it was forked from).
    wrote_at: Option<Instant>,
    last_notice: Option<Instant>,
}

/// What a drain came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Everything queued was written.
    Empty,
    /// The output has no room; lines are left.
    Stalled,
    /// Another thread is writing.
    Busy,
}

pub struct Logger {
    sink: Sink,
    queue: Mutex<Queue>,
    more: Condvar,
    output: Mutex<Output>,
    /// The process whose lines the queue holds (a forked child finds its parent's here).
    owner: AtomicU32,
    /// The process whose writer thread drains the queue (0: none).
    writer: AtomicU32,
}

static LOGGER: LazyLock<Logger> = LazyLock::new(|| Logger::new(Sink::stderr()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// This process's logger.
pub fn logger() -> &'static Logger {
    let l = &*LOGGER;
    let me = std::process::id();
    if l.owner.load(Ordering::Acquire) != me {
        l.adopt(me);
    }
    l
}

impl Logger {
    fn new(sink: Sink) -> Logger {
        Logger {
            sink,
            queue: Mutex::new(Queue::default()),
            more: Condvar::new(),
            output: Mutex::new(Output::default()),
            owner: AtomicU32::new(std::process::id()),
            writer: AtomicU32::new(0),
        }
    }

    /// In a forked child (forked by a single-threaded process, so no lock is held by a
    /// thread that is gone): starts from an empty queue and no writer thread.
    fn adopt(&self, me: u32) {
        *lock(&self.queue) = Queue::default();
        let mut out = lock(&self.output);
        *out = Output {
            wrote_at: out.wrote_at,
            ..Output::default()
        };
        drop(out);
        self.owner.store(me, Ordering::Release);
    }

    /// Starts this process's writer thread (once per process).
    pub fn start_writer(&'static self) {
        let me = std::process::id();
        if self.writer.swap(me, Ordering::AcqRel) == me {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("vf-log".into())
            .spawn(move || self.write_forever());
        if spawned.is_err() {
            // Lines are then written by whoever queues them, as in the template.
            self.writer.store(0, Ordering::Release);
        }
    }

    fn threaded(&self) -> bool {
        self.writer.load(Ordering::Acquire) == std::process::id()
    }

    /// Queues whole lines (each cut to `PIPE_BUF` when longer); returns how many were
    /// dropped for want of room. Never waits on the output.
    pub fn submit(&self, lines: impl IntoIterator<Item = Vec<u8>>, kind: Kind) -> u64 {
        let room = match kind {
            Kind::Log => CAPACITY,
            Kind::Access => ACCESS_ROOM,
        };
        // Made (formatted, cut) before the lock: other threads' lines do not wait on it.
        let lines: Vec<Vec<u8>> = lines
            .into_iter()
            .map(|mut line| {
                fit(&mut line);
                line
            })
            .collect();
        let mut refused = 0;
        {
            let mut q = lock(&self.queue);
            for line in lines {
                if q.bytes + line.len() > room {
                    refused += 1;
                    continue;
                }
                q.bytes += line.len();
                q.entries.push_back(Entry { line, kind });
            }
            q.dropped[kind as usize] += refused;
            q.unsaid[kind as usize] += refused;
        }
        if self.threaded() {
            self.more.notify_one();
        } else {
            self.drain();
        }
        refused
    }

    /// Lines of `kind` dropped by this process so far.
    pub fn dropped(&self, kind: Kind) -> u64 {
        lock(&self.queue).dropped[kind as usize]
    }

    /// Bytes queued now.
    fn queued(&self) -> usize {
        lock(&self.queue).bytes
    }

    /// Writes what it can now without waiting, then says what was dropped if the output
    /// has room again.
    pub fn drain(&self) -> Drained {
        let mut out = match self.output.try_lock() {
            Ok(o) => o,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Drained::Busy,
        };
        let drained = self.write_all_queued(&mut out);
        let notice = self.notice_due(&mut out);
        drop(out);
        if let Some([log, access]) = notice {
            let total = log + access;
            tracing::warn!(
                event = "log_lines_dropped",
                dropped = log,
                access_dropped = access,
                "stderr could not keep up: {total} lines dropped ({log} log lines, {access} access-log lines) since the last such line"
            );
        }
        drained
    }

    fn write_all_queued(&self, out: &mut Output) -> Drained {
        loop {
            if !out.rest.is_empty() {
                match self.sink.write(&out.rest) {
                    Ok(n) if n == out.rest.len() => {
                        out.rest.clear();
                        out.wrote_at = Some(Instant::now());
                    }
                    Ok(n) => {
                        out.rest.drain(..n);
                        out.wrote_at = Some(Instant::now());
                        out.stalled = true;
                        return Drained::Stalled;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        out.stalled = true;
                        return Drained::Stalled;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => out.rest.clear(),
                }
            }
            // Whole lines, up to what a pipe takes atomically.
            let mut taken = Vec::new();
            out.chunk.clear();
            {
                let mut q = lock(&self.queue);
                while let Some(e) = q.entries.front() {
                    if !taken.is_empty() && out.chunk.len() + e.line.len() > PIPE_BUF {
                        break;
                    }
                    let e = q.entries.pop_front().expect("a front entry");
                    q.bytes -= e.line.len();
                    out.chunk.extend_from_slice(&e.line);
                    taken.push(e);
                }
            }
            if taken.is_empty() {
                return Drained::Empty;
            }
            match self.sink.write(&out.chunk) {
                Ok(n) if n == out.chunk.len() => {
                    out.stalled = false;
                    out.wrote_at = Some(Instant::now());
                }
                Ok(n) => {
                    out.rest = out.chunk[n..].to_vec();
                    out.wrote_at = Some(Instant::now());
                    out.stalled = true;
                    return Drained::Stalled;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    let mut q = lock(&self.queue);
                    for e in taken.into_iter().rev() {
                        q.bytes += e.line.len();
                        q.entries.push_front(e);
                    }
                    if e.kind() == std::io::ErrorKind::WouldBlock {
                        out.stalled = true;
                        return Drained::Stalled;
                    }
                }
                Err(_) => {
                    // The reader is gone (EPIPE) or there is no stderr: lost, and counted,
                    // but never said (no line can say it).
                    let mut q = lock(&self.queue);
                    for e in taken {
                        q.dropped[e.kind as usize] += 1;
                    }
                }
            }
        }
    }

    /// The drops to say, when lines go out again and none was said for a while.
    fn notice_due(&self, out: &mut Output) -> Option<[u64; 2]> {
        if out.stalled || out.last_notice.is_some_and(|t| t.elapsed() < NOTICE_EVERY) {
            return None;
        }
        let mut q = lock(&self.queue);
        if q.unsaid == [0, 0] {
            return None;
        }
        out.last_notice = Some(Instant::now());
        Some(std::mem::take(&mut q.unsaid))
    }

    /// The writer thread: drains, waits for room or for lines, and again.
    fn write_forever(&self) {
        loop {
            match self.drain() {
                Drained::Stalled => {
                    self.sink.wait_writable(TICK);
                }
                Drained::Empty | Drained::Busy => {
                    let q = lock(&self.queue);
                    if q.entries.is_empty() {
                        let _ = self.more.wait_timeout(q, TICK);
                    }
                }
            }
        }
    }

    /// Writes what is queued, waiting at most `limit` in all and giving up sooner when
    /// nothing could be written for `stuck` (counted from the last write that went out, so
    /// that a process that finds stderr long stalled, or never wrote a line, waits only
    /// [`MIN_WAIT`]): before a process exits or execs. What is left then is dropped and counted (the process is
    /// leaving; nobody would write it).
    pub fn flush(&self, limit: Duration, stuck: Duration) {
        self.write_queued(limit, stuck);
        let mut q = lock(&self.queue);
        for e in std::mem::take(&mut q.entries) {
            q.dropped[e.kind as usize] += 1;
        }
        q.bytes = 0;
    }

    fn write_queued(&self, limit: Duration, stuck: Duration) {
        let start = Instant::now();
        let floor = start
            .checked_sub(stuck.saturating_sub(MIN_WAIT))
            .unwrap_or(start);
        // A process none of whose lines ever went out (a worker forked while stderr was
        // stalled) waits the least; one whose writer is writing right now, the most.
        let wrote_at = match self.output.try_lock() {
            Ok(o) => o.wrote_at.unwrap_or(floor),
            Err(_) => start,
        };
        let mut progress = wrote_at.max(floor);
        let mut left = self.queued();
        loop {
            let drained = self.drain();
            let now = Instant::now();
            let queued = self.queued();
            if queued < left {
                progress = now;
                left = queued;
            }
            let give_up = (start + limit).min(progress + stuck);
            if drained == Drained::Empty || now >= give_up {
                return;
            }
            let wait = (give_up - now).min(Duration::from_millis(10));
            match drained {
                Drained::Stalled => {
                    self.sink.wait_writable(wait);
                }
                _ => std::thread::sleep(wait.min(Duration::from_millis(1))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::RawFd;

    fn pipe(size: i32) -> (RawFd, RawFd) {
        let mut fds = [0; 2];
        // SAFETY: a 2-int array for the kernel to fill; then fcntl on our own pipe.
        unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            assert_eq!(libc::fcntl(fds[1], libc::F_SETPIPE_SZ, size), size);
            libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK);
        }
        (fds[0], fds[1])
    }

    /// Everything the pipe holds now (its read end is non-blocking).
    fn read_all(fd: RawFd) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: reading into a live buffer from our own read end.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
    }

    fn leak(l: Logger) -> &'static Logger {
        Box::leak(Box::new(l))
    }

    #[test]
    fn a_stalled_reader_costs_callers_nothing_and_lines_stay_whole() {
        let (r, w) = pipe(4096);
        let l = leak(Logger::new(Sink::open(w)));
        // Queued and written by the caller (no writer thread): the pipe takes one page.
        let line =
            |i: usize| format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "p".repeat(1000)).into_bytes();
        let mut refused = 0;
        for i in 0..2000 {
            refused += l.submit([line(i)], Kind::Log);
        }
        assert_eq!(l.drain(), Drained::Stalled);
        // The queue holds what it can; the rest was dropped and counted.
        assert!(refused > 0);
        assert_eq!(l.dropped(Kind::Log), refused);
        assert!(l.queued() <= CAPACITY);
        // The reader comes back: whole lines in order, then a drained queue.
        let mut got = Vec::new();
        while l.queued() > 0 {
            got.extend(read_all(r));
            l.drain();
        }
        got.extend(read_all(r));
        let text = String::from_utf8(got).unwrap();
        let mut last = None;
        for t in text.lines() {
            let v: serde_json::Value = serde_json::from_str(t).unwrap();
            let n = v["n"].as_u64().unwrap();
            assert!(last.is_none_or(|p| n > p), "in order");
            last = Some(n);
        }
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn access_lines_leave_room_for_log_lines() {
        let (r, w) = pipe(4096);
        let l = leak(Logger::new(Sink::open(w)));
        let big = vec![b'a'; 4000];
        let mut access_refused = 0;
        for _ in 0..(CAPACITY / 4000 + 10) {
            access_refused += l.submit([big.clone()], Kind::Access);
        }
        assert!(access_refused > 0);
        assert_eq!(l.submit([b"why I exit".to_vec()], Kind::Log), 0);
        assert_eq!(l.dropped(Kind::Access), access_refused);
        assert_eq!(l.dropped(Kind::Log), 0);
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn flush_is_bounded_when_nobody_reads() {
        let (r, w) = pipe(4096);
        let l = leak(Logger::new(Sink::open(w)));
        for _ in 0..10 {
            l.submit([vec![b'z'; 3000]], Kind::Log);
        }
        // It returns (after 50 ms without progress, long before its limit); what it could
        // not write is dropped and counted.
        l.flush(Duration::from_secs(3600), Duration::from_millis(50));
        assert_eq!(l.queued(), 0);
        let written = read_all(r).len() / 3001;
        assert!(written > 0);
        assert_eq!(l.dropped(Kind::Log), 10 - written as u64);
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn the_writer_thread_writes_what_callers_queue() {
        let (r, w) = pipe(65536);
        let l = leak(Logger::new(Sink::open(w)));
        l.start_writer();
        l.submit([b"one".to_vec(), b"two".to_vec()], Kind::Log);
        l.flush(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(read_all(r), b"one\ntwo\n");
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }
}
