//! Logging never stops serving. The real `app` gets as its stderr
//! a pipe this test creates and holds:
//!
//! - filled to the brim once the pool is ready and never read (a stalled journal, a log
//!   driver applying back-pressure): the server still answers every request while it
//!   recycles workers, replaces one killed with SIGKILL, reloads on HUP and stops on TERM,
//!   and counts the lines it could not write in `/metrics`;
//! - read again after a while: the lines that were dropped are said in a `log_lines_dropped`
//!   line;
//! - shrunk to one page and read: access-log lines longer than a pipe takes in one write
//!   (4 KiB), from two workers at once, come out whole (valid JSON, one per request).
//!
//! The port and the metrics port are chosen here (`--port`, `--metrics-port`): the log,
//! where the tests usually learn them, is not read. Every wait is on a state the server
//! reports over HTTP. `LOG_STALL_APP=/path/to/app` runs them against another build (an
//! `app` with its `app-worker` beside it), e.g. the one before a change.

mod common;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{app_bin, children, free_port, try_http, App, Response, MLP_INPUT, PATIENCE};

/// The app with a stderr this test holds: `read` (its read end, never read unless a test
/// takes it) and `fill` (a write end of the test's own, non-blocking).
struct Stalled {
    child: Option<Child>,
    port: u16,
    metrics: u16,
    read: Option<File>,
    fill: Option<File>,
}

impl Stalled {
    /// Starts `app --production` with `args` and JSON logs on a fresh pipe (`pipe_size`
    /// bytes of room when given), then waits until `workers` workers are ready.
    fn start(app: &App, args: &[&str], workers: u32) -> Stalled {
        let mut s = Stalled::spawn(app, args, None);
        s.wait_ready(workers);
        s
    }

    /// Starts `app --production` with `args` and JSON logs on a fresh pipe (`pipe_size`
    /// bytes of room when given).
    fn spawn(app: &App, args: &[&str], pipe_size: Option<i32>) -> Stalled {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid 2-int array for the kernel to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        if let Some(size) = pipe_size {
            // SAFETY: fcntl on a pipe this test owns.
            let got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
            assert_eq!(got, size, "F_SETPIPE_SZ");
        }
        // A description of the test's own (O_NONBLOCK on it leaves the app's alone).
        let fill = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", write.as_raw_fd()))
            .unwrap();
        let (port, metrics) = (free_port(), free_port());
        let mut vars: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                !k.starts_with("VRAMFORK_") && !k.starts_with("LISTEN_") && k != "NOTIFY_SOCKET"
            })
            .collect();
        vars.push(("VRAMFORK_LOG".into(), "info,vramfork::master=debug".into()));
        vars.push(("VRAMFORK_LOG_FORMAT".into(), "json".into()));
        let bin = std::env::var_os("LOG_STALL_APP").map_or_else(app_bin, Into::into);
        let child = Command::new(bin)
            .arg("--metadata")
            .arg(app.metadata())
            .args(["--production", "--port", &port.to_string()])
            .args(["--metrics-port", &metrics.to_string()])
            .args(args)
            .current_dir(app.dir.path())
            .env_clear()
            .envs(vars)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(write))
            .process_group(0)
            .spawn()
            .expect("start app");
        Stalled {
            child: Some(child),
            port,
            metrics,
            read: Some(File::from(read)),
            fill: Some(fill),
        }
    }

    /// Waits until the master says `workers` of `workers` workers are ready.
    fn wait_ready(&mut self, workers: u32) {
        let want = format!("{workers} of {workers} workers ready");
        self.wait_for(&format!("/health/ready: {want}"), |s| {
            s.health("/health/ready")
                .filter(|r| r.status == 200 && r.body.contains(&want))
        });
    }

    /// Fills the pipe until not one more byte fits, the app writing into it meanwhile.
    fn fill_pipe(&mut self) {
        let mut line = vec![b'x'; 4095];
        line.push(b'\n');
        for chunk in [&line[..], b"\n"] {
            loop {
                match self.fill.as_mut().unwrap().write(chunk) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => panic!("filling the pipe: {e}"),
                }
            }
        }
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes waiting in the pipe.
        unsafe {
            libc::ioctl(
                self.fill.as_ref().unwrap().as_raw_fd(),
                libc::FIONREAD,
                &mut unread,
            )
        };
        assert!(unread > 0, "the pipe holds {unread} bytes");
    }

    /// An answer of the metrics port (`/metrics`, `/health/live`, `/health/ready`).
    fn health(&self, path: &str) -> Option<Response> {
        try_http(self.metrics, "GET", path, None).ok()
    }

    /// The value of a `/metrics` sample (`name` with its labels), summed over workers.
    fn metric(&self, sample: &str) -> Option<f64> {
        let r = self.health("/metrics")?;
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// One request on a fresh connection; a failed one fails the test.
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        try_http(self.port, method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path} was not answered: {e}"))
    }

    /// Polls `check` until it gives a value, or fails after [`PATIENCE`] (or when the app
    /// has exited).
    fn wait_for<T>(&mut self, what: &str, mut check: impl FnMut(&Stalled) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            if let Some(st) = self.try_exit() {
                panic!("app exited ({st}) while waiting for {what}");
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what} within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the master to exit (after a TERM), at most [`PATIENCE`].
    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.try_exit() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "the master did not exit within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.as_ref().unwrap().id() as i32, sig) };
    }

    /// Reads the pipe from now on, on a thread: every line that comes out.
    fn read_from_now(&mut self) -> Arc<Mutex<Vec<String>>> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = lines.clone();
        let read = self.read.take().unwrap();
        std::thread::spawn(move || {
            let mut r = BufReader::new(read);
            let mut buf = Vec::new();
            while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                out.lock().unwrap().push(line);
                buf.clear();
            }
        });
        lines
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            let workers = children(pid as u32);
            // SAFETY: kill(2) on our child's process group and its other children.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                for (w, _) in workers {
                    libc::kill(w as i32, libc::SIGKILL);
                }
            }
            let _ = child.wait();
        }
    }
}

/// Nothing outside a request can stop serving, a log reader that stalls included
/// (docs/production.md). Once the pipe is full every process's next line meets it: the workers' on
/// recycling (and their access lines), the master's on every reap, start, reload and stop.
#[test]
fn a_stderr_nobody_reads_stops_nothing() {
    let app = App::new("mlp.pt", r#""version": "1""#);
    let mut s = Stalled::start(
        &app,
        &["--workers", "2", "--max-requests", "25", "--access-log"],
        2,
    );
    s.fill_pipe();

    // Recycling: every answer comes, from more and more workers.
    let mut pids = BTreeSet::new();
    for i in 0..300 {
        let r = try_http(s.port, "POST", "/", Some(MLP_INPUT))
            .unwrap_or_else(|e| panic!("request {i} of 300 was not answered: {e}"));
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        pids.insert(r.pid());
    }
    // 300 requests at 25 per worker: at least 12 workers answered, forked from the template
    // (which logs without a thread of its own: a process with threads must not fork).
    assert!(
        pids.len() >= 12,
        "{} workers answered: {pids:?}",
        pids.len()
    );
    let forked = s.metric("vramfork_worker_starts_total{method=\"fork\"}");
    assert!(forked.is_some_and(|n| n >= 12.0), "{forked:?} forked");

    // A reload: the new metadata is served once the master has replaced its workers.
    app.write_metadata("mlp.pt", r#""version": "2""#);
    s.signal(libc::SIGHUP);
    s.wait_for("the reloaded metadata", |s| {
        let r = s.request("GET", "/", None);
        assert_eq!(r.status, 200, "{r:?}");
        (r.json()["version"] == "2").then_some(())
    });

    // A worker killed: the master reaps it and starts another.
    let victim = s.request("GET", "/", None).pid();
    // SAFETY: kill(2) on a worker of our own child.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    s.wait_for("the killed worker replaced", |s| {
        let exits = s.metric("vramfork_worker_exits_total{reason=\"signal\"}")?;
        let ready = s.metric("vramfork_workers{state=\"ready\"}")?;
        (exits >= 1.0 && ready == 2.0).then_some(())
    });
    for i in 0..20 {
        let r = s.request("POST", "/", Some(MLP_INPUT));
        assert_eq!(r.status, 200, "request {i} after the kill: {r:?}");
        assert_ne!(r.pid(), victim);
    }

    // The master's own probes answer from a loop that turns.
    for path in ["/health/live", "/health/ready"] {
        let r = s
            .health(path)
            .unwrap_or_else(|| panic!("{path} not answered"));
        assert_eq!(r.status, 200, "{path}: {r:?}");
    }
    // What could not be written is counted, by the workers and by the master.
    s.wait_for("dropped log lines counted", |s| {
        s.metric("vramfork_log_lines_dropped_total")
            .filter(|n| *n > 0.0)
    });

    // TERM: a graceful stop, exit 0.
    s.signal(libc::SIGTERM);
    let status = s.wait_exit();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// When the reader comes back, a process that dropped lines says how many, in a
/// `log_lines_dropped` line after the lines it had kept; every line comes out whole. Here
/// the workers drop access-log lines: long ones, more than their queue holds.
#[test]
fn a_reader_that_comes_back_learns_what_was_dropped() {
    let app = App::new("mlp.pt", "");
    let mut s = Stalled::start(&app, &["--workers", "2", "--access-log"], 2);
    s.fill_pipe();
    let long = format!("/nowhere/{}", "p".repeat(3500));
    // 1,000 lines of 3.5 KiB: more than a worker's queue (1 MiB, at most 3/4 of it for
    // access lines) holds, whichever worker answers how many.
    for i in 0..1000 {
        let r = try_http(s.port, "GET", &long, None)
            .unwrap_or_else(|e| panic!("request {i} of 1000 was not answered: {e}"));
        assert_eq!(r.status, 404, "request {i}: {r:?}");
    }
    s.wait_for("dropped access lines counted", |s| {
        s.metric("vramfork_access_log_dropped_total")
            .filter(|n| *n > 0.0)
    });
    let lines = s.read_from_now();
    let notice = s.wait_for("a log_lines_dropped line", |_| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| common::Event::parse(l))
            .find(|e| e.name == "log_lines_dropped")
    });
    assert!(
        notice.u64("access_dropped").is_some_and(|n| n > 0),
        "{notice:?}"
    );
    s.signal(libc::SIGTERM);
    let status = s.wait_exit();
    assert_eq!(status.code(), Some(0), "{status}");
    // The output ends when every process has gone (and the test's own write end is
    // closed): each line in it is whole (the filler is lines of `x`, and empty lines).
    s.fill = None;
    let deadline = Instant::now() + PATIENCE;
    while Arc::strong_count(&lines) > 1 {
        assert!(Instant::now() < deadline, "the output never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = lines.lock().unwrap().clone();
    for l in all {
        let filler = l.bytes().all(|b| b == b'x');
        assert!(
            filler || serde_json::from_str::<serde_json::Value>(&l).is_ok(),
            "not a whole line: {l:?}"
        );
    }
}

/// A request target is the client's to choose, so an access line can be
/// longer than the 4 KiB a pipe takes in one piece. Two workers write such lines at once
/// into a one-page pipe that the test reads: every line comes out as one JSON object.
#[test]
fn long_access_lines_from_two_workers_stay_whole() {
    let app = App::new("mlp.pt", "");
    let mut s = Stalled::spawn(&app, &["--workers", "2", "--access-log"], Some(4096));
    let lines = s.read_from_now();
    s.wait_ready(2);
    let long = format!("/nowhere/{}", "a".repeat(6000));
    let (clients, each) = (4, 100);
    let port = s.port;
    let answered: Vec<BTreeSet<u32>> = (0..clients)
        .map(|c| {
            let path = format!("{long}?client={c}");
            std::thread::spawn(move || {
                let mut pids = BTreeSet::new();
                for i in 0..each {
                    let r = try_http(port, "GET", &path, None)
                        .unwrap_or_else(|e| panic!("client {c}, request {i}: {e}"));
                    assert_eq!(r.status, 404, "{r:?}");
                    pids.insert(r.pid());
                }
                pids
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let pids: BTreeSet<u32> = answered.into_iter().flatten().collect();
    assert_eq!(pids.len(), 2, "both workers answered: {pids:?}");
    let sent = (clients * each) as f64;

    // Every request has its line, or was counted as dropped (a reader too slow for the
    // writers): wait for that, or for a line that is not whole.
    let (access, invalid) = s.wait_for("every access line, or a broken one", |s| {
        let (mut access, mut invalid) = (Vec::new(), Vec::new());
        for l in lines.lock().unwrap().iter() {
            match serde_json::from_str::<serde_json::Value>(l) {
                Ok(v) if v["fields"]["event"] == "access" => access.push(v),
                Ok(_) => {}
                Err(_) => invalid.push(l.clone()),
            }
        }
        let dropped = s.metric("vramfork_access_log_dropped_total")?;
        (!invalid.is_empty() || access.len() as f64 + dropped == sent).then_some((access, invalid))
    });
    assert!(
        invalid.is_empty(),
        "{} lines are not whole, e.g. {:.300}",
        invalid.len(),
        invalid[0]
    );
    assert!(!access.is_empty());
    let writers: BTreeSet<u64> = access
        .iter()
        .filter_map(|v| v["fields"]["pid"].as_u64())
        .collect();
    assert_eq!(writers.len(), 2, "lines from both workers: {writers:?}");
    for v in &access {
        let path = v["fields"]["path"].as_str().unwrap();
        // The start of the target is kept, whatever the line's length.
        assert!(path.starts_with(&long[..1000]), "{:.200}", path);
    }
}
