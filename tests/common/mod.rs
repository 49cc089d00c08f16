//! Process-test helpers: start the real `app` binary in a temporary directory on a free
//! port, capture its log, talk HTTP/1.1 to it over plain TCP, and kill its whole process
//! group on drop (printing the log when the test failed).

#![allow(dead_code)]

pub mod exported;
pub mod host;
pub mod nvml_sim;
pub mod pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Two JSON values of numbers (nested arrays alike) equal within 1e-6 relative: a served
/// answer against torch's own.
pub fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close(p, q))
        }
        (p, q) => match (p.as_f64(), q.as_f64()) {
            (Some(p), Some(q)) => (p - q).abs() <= 1e-6 * (1.0 + q.abs()),
            _ => false,
        },
    }
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn app_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_app"))
}

/// A metadata file in a fresh temporary directory, its model pointing at a fixture.
pub struct App {
    pub dir: tempfile::TempDir,
}

impl App {
    pub fn new(model: &str, extra: &str) -> App {
        let dir = tempfile::tempdir().unwrap();
        let app = App { dir };
        app.write_metadata(model, extra);
        app
    }

    /// The two-input fixture (`pair.pt`) with both inputs declared: `features` (float32,
    /// `[-1, 3]`) and `scale` (int64, `[-1]`), so `POST /` takes named inputs.
    pub fn pair() -> App {
        App::new(
            "pair.pt",
            r#""inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 3]},
                          {"name": "scale", "datatype": "INT64", "shape": [-1]}]"#,
        )
    }

    pub fn metadata(&self) -> PathBuf {
        self.dir.path().join("app-metadata.json")
    }

    /// Rewrites the metadata (`extra` is inserted as more JSON fields, e.g. `"version": "2"`).
    pub fn write_metadata(&self, model: &str, extra: &str) {
        let model = fixtures().join(model);
        let sep = if extra.is_empty() { "" } else { ", " };
        std::fs::write(
            self.metadata(),
            format!(
                r#"{{"name": "test app", "model": "{}"{sep}{extra}}}"#,
                model.display()
            ),
        )
        .unwrap();
    }
}

pub struct Server {
    pub child: Option<Child>,
    pub port: u16,
    pub log: Arc<Mutex<String>>,
    /// Its stdout's lines alone (they are in `log` too, interleaved with stderr's as the two
    /// readers happened to take them).
    stdout: Arc<Mutex<String>>,
    /// Output streams (stdout, stderr) that reached their end.
    closed: Arc<(Mutex<usize>, Condvar)>,
}

/// How long a test waits for a state the server reports before it fails. Generous: a
/// busy machine makes states arrive later, never wrongly.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The log filter the tests run with: the master's `pool` and `worker_retiring` events are
/// debug-level.
const LOG_FILTER: &str = "info,vramfork::master=debug";

impl Server {
    /// Starts `app` with `args` (plus `--metadata`, `--port 0`) and waits until it listens.
    pub fn start(app: &App, args: &[&str]) -> Server {
        Self::start_env(app, args, &[])
    }

    pub fn start_env(app: &App, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::spawn(app, args, env).wait_listening()
    }

    /// Waits until the started `app` listens (its `listening` event: JSON logs), and
    /// learns its port.
    pub fn wait_listening(mut self) -> Server {
        let s = &mut self;
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(port) = s.log_port() {
                s.port = port;
                return self;
            }
            if let Some(st) = s.try_exit() {
                panic!("app exited ({st}) before listening:\n{}", s.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "app never listened:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `app` without waiting for anything. It logs JSON lines, so that the tests read
    /// the master's events (`src/master/events.rs`) rather than its wording.
    pub fn spawn(app: &App, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::spawn_under(&[], app, args, env)
    }

    /// [`Server::spawn`] through `launcher` (a program and its arguments that end by
    /// executing `app`, such as `systemd-socket-activate -l ADDR`): the launcher's process
    /// becomes the master. It gets the app's environment as `--setenv=NAME=VALUE` arguments (the
    /// way `systemd-socket-activate` passes one on) and decides the address, so no `--port`.
    pub fn spawn_under(
        launcher: &[&str],
        app: &App,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let mut vars: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                !k.starts_with("VRAMFORK_")
                    && !k.starts_with("LISTEN_")
                    && ![
                        "CLAMS_GUNICORN_WORKERS",
                        "NOTIFY_SOCKET",
                        "WATCHDOG_USEC",
                        "WATCHDOG_PID",
                    ]
                    .contains(&k.as_str())
            })
            .collect();
        vars.push(("VRAMFORK_LOG".into(), LOG_FILTER.into()));
        vars.push(("VRAMFORK_LOG_FORMAT".into(), "json".into()));
        // A GPU-memory ledger of this server's own (tests that share one give theirs in
        // `env`): a server the test killed keeps its reservation for its lease, which would
        // shrink the plan of the next one the test starts.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ledger = app.dir.path().join(format!("ledger-{n}"));
        vars.push(("VRAMFORK_LEDGER".into(), ledger.display().to_string()));
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut cmd = match launcher.split_first() {
            None => {
                let mut c = Command::new(app_bin());
                c.arg("--metadata")
                    .arg(app.metadata())
                    .args(["--port", "0"]);
                c
            }
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest);
                for (k, v) in &vars {
                    c.arg(format!("--setenv={k}={v}"));
                }
                c.arg(app_bin()).arg("--metadata").arg(app.metadata());
                c
            }
        };
        cmd.args(args)
            .current_dir(app.dir.path())
            .env_clear()
            .envs(vars);
        Self::spawn_command(cmd)
    }

    /// Starts `cmd` (which ends by executing `app`, with the arguments and environment it
    /// was given) as [`Server::spawn`] does: its own process group, its output captured.
    pub fn spawn_command(mut cmd: Command) -> Server {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().expect("start app");
        let log = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let closed = Arc::new((Mutex::new(0usize), Condvar::new()));
        for (stream, own) in [
            (
                Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
                None,
            ),
            (
                Box::new(child.stdout.take().unwrap()),
                Some(Arc::clone(&stdout)),
            ),
        ] {
            let log = Arc::clone(&log);
            let closed = Arc::clone(&closed);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(own) = &own {
                        let mut o = own.lock().unwrap();
                        o.push_str(&line);
                        o.push('\n');
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                *closed.0.lock().unwrap() += 1;
                closed.1.notify_all();
            });
        }
        Server {
            child: Some(child),
            port: 0,
            log,
            stdout,
            closed,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The pretty-printed JSON document it wrote on stdout (`app plan --json` and the like),
    /// read from stdout alone: its log lines on stderr can never fall inside it.
    pub fn stdout_json(&self) -> serde_json::Value {
        let out = self.stdout.lock().unwrap().clone();
        let start = out
            .find("\n{\n")
            .map(|i| i + 1)
            .or_else(|| out.starts_with("{\n").then_some(0))
            .unwrap_or_else(|| panic!("no JSON document on stdout:\n{}", self.log_text()));
        serde_json::Deserializer::from_str(&out[start..])
            .into_iter::<serde_json::Value>()
            .next()
            .unwrap()
            .unwrap_or_else(|e| panic!("bad JSON ({e}):\n{out}"))
    }

    fn log_port(&self) -> Option<u16> {
        let e = self.events().into_iter().find(|e| e.name == "listening")?;
        e.str("addr")?.rsplit(':').next()?.parse().ok()
    }

    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    /// Waits for `app` to exit, at most `limit`, and for its output to end (every process
    /// that shared it gone, or 10 s).
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.try_exit() {
                let (n, cv) = &*self.closed;
                let _ = cv
                    .wait_timeout_while(n.lock().unwrap(), Duration::from_secs(10), |n| *n < 2)
                    .unwrap();
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "app did not exit within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// The master's events so far, in order (its JSON log lines that carry an `event`).
    pub fn events(&self) -> Vec<Event> {
        self.all_events()
            .into_iter()
            .filter(Event::is_masters)
            .collect()
    }

    /// Every process's events (the master's, the workers', the template's).
    pub fn all_events(&self) -> Vec<Event> {
        self.log_text().lines().filter_map(Event::parse).collect()
    }

    /// Waits for the first master event named `name` for which `pred` holds, among those
    /// from index `after` on (see [`Server::mark`]); returns it with its index.
    pub fn wait_event_after(
        &self,
        after: usize,
        name: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> (usize, Event) {
        self.poll(
            &format!("a {name:?} event (from #{after}) as wanted"),
            || {
                self.events()
                    .into_iter()
                    .enumerate()
                    .skip(after)
                    .find(|(_, e)| e.name == name && pred(e))
            },
        )
    }

    /// How many master events named `name` came before the first one named `mark`.
    pub fn count_before(&self, name: &str, mark: &str) -> usize {
        let events = self.events();
        let at = events.iter().position(|e| e.name == mark).unwrap();
        events[..at].iter().filter(|e| e.name == name).count()
    }

    /// Waits for the first master event named `name` for which `pred` holds.
    pub fn wait_event(&self, name: &str, pred: impl Fn(&Event) -> bool) -> Event {
        self.wait_event_after(0, name, pred).1
    }

    /// The most worker processes the master has had at once (booting, ready and retiring,
    /// over all its `pool` events so far).
    pub fn max_pool_processes(&self) -> u64 {
        self.events_named("pool")
            .iter()
            .map(|p| {
                ["booting", "ready", "retiring"]
                    .iter()
                    .map(|k| p.u64(k).unwrap_or(0))
                    .sum()
            })
            .max()
            .unwrap_or(0)
    }

    /// How many master events there are now: later waits can start from here.
    pub fn mark(&self) -> usize {
        self.events().len()
    }

    /// The master's events named `name`.
    pub fn events_named(&self, name: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.name == name)
            .collect()
    }

    /// Waits until the master's latest `pool` event (its pool as it is now) satisfies
    /// `pred`; returns it.
    pub fn wait_pool(&self, pred: impl Fn(&Event) -> bool) -> Event {
        self.poll("the pool as wanted", || {
            let pool = self.events().into_iter().rev().find(|e| e.name == "pool");
            pool.filter(|p| pred(p))
        })
    }

    /// The pids of the workers the master has reported ready and not since retiring or
    /// gone, from its events.
    pub fn ready_pids(&self) -> Vec<u32> {
        ready_pids(&self.events())
    }

    /// Waits until the master reports exactly `n` workers wanted and ready, none booting or
    /// retiring; returns their pids.
    pub fn wait_workers(&self, n: usize) -> Vec<u32> {
        self.wait_workers_where(n, |_| true)
    }

    /// [`Server::wait_workers`], until the ready pids also satisfy `pred`.
    pub fn wait_workers_where(&self, n: usize, pred: impl Fn(&[u32]) -> bool) -> Vec<u32> {
        self.poll(
            &format!("{n} ready workers, none booting or retiring"),
            || {
                let events = self.events();
                let pool = events.iter().rev().find(|e| e.name == "pool");
                let settled = pool.is_some_and(|p| {
                    p.u64("workers") == Some(n as u64)
                        && p.u64("ready") == Some(n as u64)
                        && p.u64("booting") == Some(0)
                        && p.u64("retiring") == Some(0)
                });
                let pids = ready_pids(&events);
                (settled && pids.len() == n && pred(&pids)).then_some(pids)
            },
        )
    }

    /// Polls `check` until it gives a value; fails the test with the log after [`PATIENCE`].
    pub fn poll<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(v) = check() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what} within {PATIENCE:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path: &str) -> Response {
        http(self.port, "GET", path, None)
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        http(self.port, "POST", path, Some(body))
    }

    /// The port of the metrics listener (`--metrics-port`), from the master's
    /// `metrics_listening` event.
    pub fn metrics_port(&self) -> u16 {
        let e = self.wait_event("metrics_listening", |_| true);
        e.str("addr")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {:?}", e.fields))
    }
}

/// Workers reported ready and not since retiring or gone, replaying `events`.
fn ready_pids(events: &[Event]) -> Vec<u32> {
    let mut ready = Vec::new();
    for e in events {
        let Some(pid) = e.u64("pid").map(|p| p as u32) else {
            continue;
        };
        match e.name.as_str() {
            "worker_ready" => ready.push(pid),
            "worker_retiring" | "worker_exited" | "worker_killed" => ready.retain(|p| *p != pid),
            _ => {}
        }
    }
    ready.sort();
    ready
}

/// One of the master's log events (`--log-format json`).
#[derive(Debug, Clone)]
pub struct Event {
    pub name: String,
    pub level: String,
    pub target: String,
    pub timestamp: String,
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl Event {
    /// A JSON log line with an `event` field; `None` for anything else.
    pub fn parse(line: &str) -> Option<Event> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = v.get("fields")?.as_object()?.clone();
        Some(Event {
            name: fields.get("event")?.as_str()?.to_string(),
            level: v.get("level")?.as_str()?.to_string(),
            target: v.get("target")?.as_str()?.to_string(),
            timestamp: v.get("timestamp")?.as_str()?.to_string(),
            fields,
        })
    }

    /// Logged by the master (the `app` binary's own module or `vramfork::master`), not by a
    /// worker or the template.
    pub fn is_masters(&self) -> bool {
        self.target == "app" || self.target.starts_with("vramfork::master")
    }

    pub fn u64(&self, k: &str) -> Option<u64> {
        self.fields.get(k)?.as_u64()
    }

    pub fn i64(&self, k: &str) -> Option<i64> {
        self.fields.get(k)?.as_i64()
    }

    pub fn f64(&self, k: &str) -> Option<f64> {
        self.fields.get(k)?.as_f64()
    }

    pub fn str(&self, k: &str) -> Option<&str> {
        self.fields.get(k)?.as_str()
    }

    pub fn message(&self) -> &str {
        self.str("message").unwrap_or_default()
    }

    /// Seconds since the Unix epoch, from the event's RFC 3339 UTC timestamp.
    pub fn secs(&self) -> f64 {
        let t = &self.timestamp;
        let bad = || panic!("unexpected timestamp {t:?}");
        let (date, time) = t.trim_end_matches('Z').split_once('T').unwrap_or_else(bad);
        let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
        let (y, m, day) = (d[0], d[1], d[2]);
        // Days from civil date (Howard Hinnant's algorithm).
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        let hms: Vec<f64> = time.split(':').map(|x| x.parse().unwrap()).collect();
        days as f64 * 86_400.0 + hms[0] * 3600.0 + hms[1] * 60.0 + hms[2]
    }
}

impl Drop for Server {
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
        if std::thread::panicking() {
            eprintln!(
                "---- app log ----\n{}---- end of app log ----",
                self.log_text()
            );
        }
    }
}

/// Live (not zombie) worker children of `pid` (the template and its spare left out), from
/// /proc.
pub fn worker_pids(pid: u32) -> Vec<u32> {
    children(pid)
        .into_iter()
        .filter(|(_, c)| c != "vf-template" && c != "vf-spare")
        .map(|(p, _)| p)
        .collect()
}

/// Live (not zombie) children of `pid` with their process names, from /proc.
pub fn children(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let comm = &stat[stat.find('(').map_or(0, |i| i + 1)..close];
        if fields.len() > 1 && fields[0] != "Z" && fields[1] == pid.to_string() {
            out.push((p, comm.to_string()));
        }
    }
    out.sort();
    out
}

pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .map(|i| !stat[i + 2..].starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn pid(&self) -> u32 {
        self.header("x-worker-pid")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no X-Worker-Pid in {self:?}"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Response {
    try_http(port, method, path, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> std::io::Result<Response> {
    let (status, headers, body) = parse_raw(raw)?;
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(body).to_string(),
    })
}

/// Header lines as (name, value).
pub type Headers = Vec<(String, String)>;

/// A raw HTTP/1.1 answer split into status, headers and the body's bytes.
pub fn parse_raw(raw: &[u8]) -> std::io::Result<(u16, Headers, &[u8])> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end (connection reset?)"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty response"))?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok((status, headers, &raw[end + 4..]))
}

/// What a `tests/support` script makes in a folder (its arguments: the folder, then the
/// README it trains on), made once per version of the script and of the support modules
/// it imports (`imports`) and kept in the target's temporary directory as `NAME-HASH`;
/// tests running at once may each make them, the first rename wins. The script must print
/// `{"ok": true}` and write `expected.json`.
pub fn made_once(script: &str, imports: &[&str], name: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let support = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for file in std::iter::once(&script).chain(imports) {
        std::fs::read(support.join(file)).unwrap().hash(&mut h);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{:x}", h.finish()));
    if dir.join("expected.json").is_file() {
        return dir;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let made = python_json(
        script,
        &[tmp.path().to_str().unwrap(), readme.to_str().unwrap()],
        b"",
    );
    assert_eq!(made["ok"], true, "{made}");
    let tmp = tmp.keep();
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another test made them first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    dir
}

/// A port nobody listens on now (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A test that cannot run on this machine says so and returns: `SKIPPED: TEST: WHY` on its
/// standard error, and the same line appended to the file `VRAMFORK_SKIPS` names
/// (`scripts/test` sets it, prints every skip in its summary, and in CI fails on a skip
/// `.ci/allowed-skips` does not list).
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIPPED: {test}: {why}\n");
    eprint!("{line}");
    if let Some(file) = std::env::var_os("VRAMFORK_SKIPS") {
        let opened = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(file);
        // One short write with O_APPEND: lines of tests running at once never interleave.
        if let Ok(mut f) = opened {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The test environment's Python: the torch venv, where `scripts/setup-torch` installs the
/// tests' packages (`scripts/test` sets `VRAMFORK_PYTHON`).
pub fn python() -> String {
    std::env::var("VRAMFORK_PYTHON")
        .expect("VRAMFORK_PYTHON is not set: run the tests through scripts/test")
}

/// Runs a Python script of `tests/support/` with the test environment's Python (the torch
/// venv, where `scripts/setup-torch` installs the tests' packages), `stdin` on its standard
/// input; its standard output is JSON. Fails the test with its standard error otherwise.
pub fn python_json(script: &str, args: &[&str], stdin: &[u8]) -> serde_json::Value {
    let python = python();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(script);
    let mut child = Command::new(python)
        .arg(path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let body = stdin.to_vec();
    let writer = std::thread::spawn(move || input.write_all(&body));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub const MLP_INPUT: &str = r#"{"inputs": [[1.0, 2.0, 3.0, 4.0]]}"#;

/// An HTTP/1.1 client that keeps its connection alive, as load generators do, and opens a
/// new one only when the server said `Connection: close`.
pub struct KeepAlive {
    port: u16,
    conn: Option<TcpStream>,
}

impl KeepAlive {
    pub fn new(port: u16) -> KeepAlive {
        KeepAlive { port, conn: None }
    }

    /// One request; an error is a failed request (reset, closed under it…).
    pub fn post(&mut self, path: &str, body: &str) -> std::io::Result<Response> {
        self.request("POST", path, body)
    }

    /// One request of any method on the kept connection (a new one when there is none).
    pub fn request(&mut self, method: &str, path: &str, body: &str) -> std::io::Result<Response> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.conn = Some(s);
        }
        let s = self.conn.as_mut().unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let result = s.write_all(req.as_bytes()).and_then(|_| read_one(s));
        match &result {
            Ok(r)
                if r.header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close")) =>
            {
                self.conn = None
            }
            Ok(_) => {}
            Err(_) => self.conn = None,
        }
        result
    }
}

/// Reads one response with a Content-Length body from a kept-alive connection.
pub fn read_one(s: &mut TcpStream) -> std::io::Result<Response> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        raw.push(byte[0]);
    }
    let head = parse_response(&raw)?;
    let len: usize = head
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    raw.extend_from_slice(&body);
    parse_response(&raw)
}

/// Whether the server has neither answered on nor closed `s` yet (a peek that does not wait).
pub fn nothing_from_server(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: recv(2) into a 1-byte stack buffer on our own open socket.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// A connection that has sent `bytes` and nothing more.
pub fn connect_and_send(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(bytes).expect("send");
    s
}

/// The largest number of worker processes (named `vf-worker-*`: the template and its spare
/// are not workers) seen by sampling /proc until stopped.
pub struct WorkerCountMonitor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<usize>>,
}

impl WorkerCountMonitor {
    pub fn start(master: u32) -> WorkerCountMonitor {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut max = 0;
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                let n = children(master)
                    .iter()
                    .filter(|(_, c)| c.starts_with("vf-worker"))
                    .count();
                max = max.max(n);
                std::thread::sleep(Duration::from_millis(2));
            }
            max
        });
        WorkerCountMonitor {
            stop,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle.take().unwrap().join().unwrap()
    }
}

/// A raw answer: status, headers, body bytes.
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A v2 answer with binary data: its JSON header (`Inference-Header-Content-Length`
    /// bytes) and the raw bytes after it.
    pub fn binary_parts(&self) -> (serde_json::Value, &[u8]) {
        let n: usize = self
            .header("inference-header-content-length")
            .expect("an Inference-Header-Content-Length header")
            .parse()
            .unwrap();
        let head = serde_json::from_slice(&self.body[..n]).unwrap();
        (head, &self.body[n..])
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request with `extra` header lines and a byte body, on a fresh connection.
pub fn raw(port: u16, method: &str, path: &str, extra: &str, body: &[u8]) -> Raw {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let (status, headers, body) = parse_raw(&all).unwrap();
    Raw {
        status,
        headers,
        body: body.to_vec(),
    }
}

/// A binary request: JSON header plus raw bytes.
pub fn binary(header: &str, data: &[u8]) -> (String, Vec<u8>) {
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(data);
    (
        format!("Inference-Header-Content-Length: {}\r\n", header.len()),
        body,
    )
}
