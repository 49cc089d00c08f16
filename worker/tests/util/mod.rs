//! Test helpers: start the real `app-worker` the way the master does (config in the
//! environment, a listening socket on fd 3, a control socket on fd 4), talk to it with a
//! tiny HTTP/1.1 client over a raw `TcpStream`, and read its control messages.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vramfork::protocol::{ControlMsg, ENV_LISTEN_FDS, ENV_WORKER_CONFIG};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// A duration of `n` milliseconds as the configuration carries one.
pub fn ms(n: u64) -> Value {
    json!({"secs": n / 1000, "nanos": (n % 1000) * 1_000_000})
}

/// A worker configuration for fixture `name` (`tests/fixtures/<name>.json`), with `tweak`
/// applied to the JSON.
pub fn config(name: &str, tweak: impl FnOnce(&mut Value)) -> Value {
    let md_path = fixtures().join(format!("{name}.json"));
    let md = std::fs::read_to_string(&md_path).unwrap();
    let model: Value = serde_json::from_str(&md).unwrap();
    let model_path = fixtures().join(model["model"].as_str().unwrap());
    let mut cfg = json!({
        "slot": 7, "generation": 0,
        "metadata_json": md, "metadata_path": md_path,
        "model_path": model_path, "device": "cpu", "gpu": null,
        "max_requests": 0, "max_worker_gpu_mb": null, "heartbeat_ms": 200,
        "torch_threads": 1, "nvml_library": null, "has_control": true,
        // The master's configuration groups, as it sends them (`master::worker_config`).
        "limits": {
            "max_requests": 0, "max_requests_jitter": 0, "timeout": ms(30_000),
            "boot_timeout": ms(60_000), "graceful_timeout": ms(10_000),
            "request_timeout": ms(20_000), "max_queue_wait": null, "max_body_bytes": 4096
        },
        "batch": {
            "max_batch_size": 0, "max_batch_size_override": null,
            "batch_timeout": ms(0), "warmup_passes": 2, "inline_passes": true
        },
        "host_memory": {"max_worker_memory_mb": null, "memory_cgroup": null},
        "access": {"api_key_file": null, "metrics_api_key_file": null, "tls": null},
        "log": {"json": false, "access_log": false},
        "tracing": {"export": null}
    });
    tweak(&mut cfg);
    cfg
}

pub struct Worker {
    pub child: Child,
    pub addr: SocketAddr,
    control: Option<BufReader<UnixStream>>,
    /// Messages read while waiting for something else, not yet handed out.
    pending: VecDeque<ControlMsg>,
    log: Arc<Mutex<String>>,
    /// The thread reading stderr; it ends when every holder of the pipe has exited.
    log_reader: Option<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// How long a test waits for a state the worker reports. Generous: a busy machine makes
/// states arrive later, never wrongly.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How to start a worker; `config: None` leaves `VRAMFORK_WORKER_CONFIG` unset.
pub struct Start {
    pub config: Option<String>,
    pub listen_fd: bool,
}

impl Worker {
    /// Starts a worker with `cfg` and waits for its `ready` message.
    pub fn ready(cfg: Value) -> Worker {
        let mut w = Worker::spawn(Start {
            config: Some(cfg.to_string()),
            listen_fd: true,
        });
        match w.next_msg(Duration::from_secs(60)) {
            Some(ControlMsg::Ready { pid, .. }) => assert_eq!(pid, w.child.id()),
            other => panic!("expected ready, got {other:?}\n{}", w.log()),
        }
        w
    }

    pub fn spawn(start: Start) -> Worker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_app-worker"));
        cmd.env_remove(ENV_WORKER_CONFIG)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(c) = &start.config {
            cmd.env(ENV_WORKER_CONFIG, c);
        }
        if start.listen_fd {
            cmd.env(ENV_LISTEN_FDS, "1");
        }
        let (lfd, cfd, pass_listener) = (listener.as_raw_fd(), theirs.as_raw_fd(), start.listen_fd);
        // SAFETY: the closure runs in the child between fork and exec and only calls fcntl
        // and dup2, which are async-signal-safe; the fds it duplicates are open in the parent.
        // Both are first moved above 100 so that dup2 onto 3 and 4 never hits one of them
        // (dup2 of an fd onto itself would keep close-on-exec set).
        unsafe {
            cmd.pre_exec(move || {
                let high = |fd: i32| {
                    let h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100);
                    if h < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(h)
                    }
                };
                let (l, c) = (high(lfd)?, high(cfd)?);
                if pass_listener && libc::dup2(l, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::dup2(c, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(listener);
        drop(theirs);
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let log_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Worker {
            child,
            addr,
            control: Some(BufReader::new(ours)),
            pending: VecDeque::new(),
            log,
            log_reader: Some(log_reader),
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The next control message that is not a heartbeat.
    pub fn next_msg(&mut self, within: Duration) -> Option<ControlMsg> {
        if let Some(m) = self.pending.pop_front() {
            return Some(m);
        }
        let deadline = Instant::now() + within;
        loop {
            let m = self.next_any(deadline.saturating_duration_since(Instant::now()))?;
            if !matches!(m, ControlMsg::Heartbeat { .. }) {
                return Some(m);
            }
        }
    }

    /// Waits until a heartbeat reports `n` requests in flight (other messages are kept for
    /// [`Worker::next_msg`]).
    pub fn wait_in_flight(&mut self, n: u32) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_any(left) {
                Some(ControlMsg::Heartbeat { in_flight, .. }) if in_flight == n => return,
                Some(ControlMsg::Heartbeat { .. }) => {}
                Some(m) => self.pending.push_back(m),
                None => panic!(
                    "no heartbeat with {n} in flight; pending {:?}\n{}",
                    self.pending,
                    self.log()
                ),
            }
        }
    }

    pub fn next_any(&mut self, within: Duration) -> Option<ControlMsg> {
        let r = self.control.as_mut()?;
        r.get_ref()
            .set_read_timeout(Some(within.max(Duration::from_millis(1))))
            .unwrap();
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(ControlMsg::from_line(line.trim_end()).expect("control line parses")),
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; it has not been reaped (we hold `child`).
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0);
    }

    /// Waits for the worker to exit; panics (with its log) past `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.status = Some(s);
                // Its stderr has ended too: every line it wrote is in the log.
                if let Some(r) = self.log_reader.take() {
                    let _ = r.join();
                }
                return s;
            }
            if Instant::now() > deadline {
                panic!("worker did not exit within {within:?}\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path: &str) -> Resp {
        http(self.addr, "GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        http(self.addr, "POST", path, &[], body.as_bytes())
    }

    pub fn connect(&self) -> Conn {
        Conn::open(self.addr)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- worker log ---\n{}", self.log());
        }
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn pid(&self) -> u32 {
        self.header("x-worker-pid")
            .unwrap_or_else(|| panic!("no X-Worker-Pid in {self:?}"))
            .parse()
            .unwrap()
    }

    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field in {}", String::from_utf8_lossy(&self.body)))
            .to_string()
    }
}

/// One request on a fresh connection (`Connection: close`).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut c = Conn::open(addr);
    let mut h = headers.to_vec();
    h.push(("Connection", "close"));
    c.send(method, path, &h, body);
    c.read_response()
}

/// A keep-alive HTTP/1.1 connection.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.stream.write_all(req.as_bytes()).unwrap();
        self.stream.write_all(body).unwrap();
    }

    pub fn request(&mut self, method: &str, path: &str, body: &str) -> Resp {
        self.send(method, path, &[], body.as_bytes());
        self.read_response()
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads one response (the server always sends Content-Length).
    pub fn read_response(&mut self) -> Resp {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            assert!(
                self.fill() > 0,
                "connection closed before a response head: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        let head = String::from_utf8(self.buf[..head_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let start = head_end + 4;
        while self.buf.len() < start + len {
            assert!(self.fill() > 0, "connection closed inside a response body");
        }
        let body = self.buf[start..start + len].to_vec();
        self.buf.drain(..start + len);
        Resp {
            status,
            headers,
            body,
        }
    }

    /// Whether the server's answer (or its closing) has already arrived: a peek that does
    /// not wait.
    pub fn has_data_now(&self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut b = [0u8; 1];
        // SAFETY: recv(2) into a 1-byte stack buffer on our own open socket.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n >= 0
    }

    /// Whether the server closed the connection (EOF) within `within`.
    pub fn closed_by_server(&mut self, within: Duration) -> bool {
        self.stream.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }
}
