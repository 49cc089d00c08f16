//! Process tests of the systemd integration: the real `app --production` started by Debian's
//! `systemd-socket-activate` (the listening socket handed over through `LISTEN_FDS`), and the
//! `sd_notify` messages it sends to a datagram socket the test binds (`NOTIFY_SOCKET`),
//! watchdog included.

mod common;

use std::net::UdpSocket;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;

fn mlp() -> App {
    App::new("mlp.pt", r#""version": "1""#)
}

fn activate(port: u16, datagram: bool) -> Vec<String> {
    let mut v = vec!["systemd-socket-activate".to_string()];
    if datagram {
        v.push("--datagram".into());
    }
    v.extend(["-l".into(), format!("127.0.0.1:{port}")]);
    v
}

/// What `/proc/PID/environ` holds, as NAME=VALUE strings.
fn environ(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[test]
fn socket_activation_serves_on_the_inherited_socket_across_a_hup() {
    let app = mlp();
    let port = free_port();
    let launcher = activate(port, false);
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let unused = free_port().to_string();
    let mut s = Server::spawn_under(
        &launcher,
        &app,
        &["--production", "--workers", "2", "--port", &unused],
        &[],
    );
    // systemd-socket-activate starts the app at the first connection; that request waits in
    // the socket's queue while the master starts and its workers boot, and is answered.
    // (Connecting is retried until systemd-socket-activate listens.)
    let first = thread::spawn(move || {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            match try_http(port, "POST", "/", Some(MLP_INPUT)) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && std::time::Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(20))
                }
                other => return other,
            }
        }
    });
    let listening = s.wait_event("listening", |_| true);
    assert_eq!(listening.str("socket"), Some("systemd"), "{listening:?}");
    assert_eq!(
        listening.str("addr"),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    let handed = s.wait_event("socket_activation", |_| true);
    assert_eq!(handed.u64("fd"), Some(3), "{handed:?}");
    let unused_warning = s.wait_event("address_unused", |_| true);
    assert_eq!(
        unused_warning.u64("port"),
        Some(unused.parse::<u64>().unwrap())
    );
    s.port = port;
    let first = first
        .join()
        .unwrap()
        .expect("the first request is answered");
    assert_eq!(first.status, 200);
    let workers = s.wait_workers(2);
    // The master keeps systemd's variables to itself: workers get their socket through
    // their own hand-over. (The master's own /proc environ shows what it was started with.)
    for &pid in &workers {
        let env = environ(pid);
        assert!(
            env.iter().all(|e| !e.starts_with("LISTEN_PID=")
                && !e.starts_with("LISTEN_FDNAMES=")
                && !e.starts_with("NOTIFY_SOCKET=")),
            "pid {pid}: {env:?}"
        );
    }

    // A reload under a client that keeps sending: every request answered, by the new
    // workers in the end, on the same inherited socket.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut out = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                out.push(
                    try_http(port, "POST", "/", Some(MLP_INPUT))
                        .map(|r| r.status)
                        .map_err(|e| e.to_string()),
                );
            }
            out
        })
    };
    app.write_metadata("mlp.pt", r#""version": "2""#);
    s.signal(libc::SIGHUP);
    s.wait_event("reload_complete", |_| true);
    s.wait_workers_where(2, |p| p.iter().all(|p| !workers.contains(p)));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let results = client.join().unwrap();
    assert!(!results.is_empty());
    assert!(
        results.iter().all(|r| *r == Ok(200)),
        "requests failed across the HUP: {:?}",
        results
            .iter()
            .filter(|r| **r != Ok(200))
            .collect::<Vec<_>>()
    );
    assert_eq!(s.get("/").json()["version"], "2");

    s.signal(libc::SIGTERM);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
}

#[test]
fn a_socket_that_is_not_a_listening_tcp_stream_exits_2() {
    let app = mlp();
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let launcher = activate(port, true);
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let mut s = Server::spawn_under(&launcher, &app, &["--production"], &[]);
    // A datagram starts the app on the UDP socket it is handed.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        udp.send_to(b"hello", ("127.0.0.1", port)).unwrap();
        if let Some(st) = s.try_exit() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the app never exited:\n{}",
            s.log_text()
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(2), "{}", s.log_text());
    let line = s
        .log_text()
        .lines()
        .find(|l| l.starts_with("app: socket activation:"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no error line:\n{}", s.log_text()));
    assert!(line.contains("datagram (UDP) socket"), "{line}");
    assert!(line.contains("ListenStream="), "{line}");
}

/// A datagram socket standing in for systemd's notify socket: every message it receives,
/// in order.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    msgs: Arc<Mutex<Vec<String>>>,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        let msgs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&msgs);
        thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        });
        NotifySocket {
            _dir: dir,
            path,
            msgs,
        }
    }

    fn env(&self) -> String {
        self.path.to_str().unwrap().to_string()
    }

    fn all(&self) -> Vec<String> {
        self.msgs.lock().unwrap().clone()
    }

    /// Waits for the first message from index `after` on that has every line of `lines`
    /// (a line ending in `=` matches any value); returns its index.
    fn wait(&self, s: &Server, after: usize, lines: &[&str]) -> usize {
        s.poll(
            &format!("a notify message with {lines:?} (from #{after})"),
            || {
                self.all()
                    .iter()
                    .enumerate()
                    .skip(after)
                    .find(|(_, m)| has_lines(m, lines))
                    .map(|(i, _)| i)
            },
        )
    }
}

fn has_lines(msg: &str, lines: &[&str]) -> bool {
    lines.iter().all(|want| {
        msg.lines().any(|l| {
            if want.ends_with('=') {
                l.starts_with(want) && l.len() > want.len()
            } else {
                l == *want
            }
        })
    })
}

/// Starts `app --production --workers 1` with `NOTIFY_SOCKET` at a socket of the test's
/// (plus `env`).
fn start_notified(app: &App, env: &[(&str, &str)]) -> (NotifySocket, Server) {
    let notify = NotifySocket::bind();
    let path = notify.env();
    let mut all = vec![("NOTIFY_SOCKET", path.as_str())];
    all.extend_from_slice(env);
    let s = Server::start_env(app, &["--production", "--workers", "1"], &all);
    (notify, s)
}

#[test]
fn notify_reports_ready_status_reload_and_stop_in_order() {
    let app = mlp();
    let (notify, mut s) = start_notified(&app, &[]);
    let pid = format!("MAINPID={}", s.pid());
    let ready = notify.wait(&s, 0, &["READY=1", &pid, "STATUS=1/1 workers ready"]);
    let before: Vec<String> = notify.all()[..ready].to_vec();
    assert!(
        before
            .iter()
            .all(|m| has_lines(m, &["STATUS="]) && !m.contains("READY=1")),
        "{before:?}"
    );
    assert!(
        before
            .iter()
            .any(|m| has_lines(m, &["STATUS=0/1 workers ready"])),
        "{before:?}"
    );
    let first = s.wait_workers(1);

    // HUP: RELOADING with the monotonic clock, then READY once the new worker serves.
    app.write_metadata("mlp.pt", r#""version": "2""#);
    s.signal(libc::SIGHUP);
    let reloading = notify.wait(&s, ready + 1, &["RELOADING=1", "MONOTONIC_USEC="]);
    let reloaded = notify.wait(&s, reloading + 1, &["READY=1"]);
    s.wait_workers_where(1, |p| p != first.as_slice());
    assert_eq!(s.get("/").json()["version"], "2");

    // TTIN: the status follows the pool.
    s.signal(libc::SIGTTIN);
    let grown = notify.wait(&s, reloaded + 1, &["STATUS=1/2 workers ready"]);
    let both = notify.wait(&s, grown + 1, &["STATUS=2/2 workers ready"]);
    s.wait_workers(2);

    s.signal(libc::SIGTERM);
    let stopping = notify.wait(&s, both + 1, &["STOPPING=1"]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
    let all = notify.all();
    assert!(
        all[stopping + 1..].iter().all(|m| !m.contains("READY=1")),
        "READY after STOPPING: {all:?}"
    );
    // No WATCHDOG_USEC, no watchdog messages (the supervisor loop ran many times by now).
    assert!(all.iter().all(|m| !m.contains("WATCHDOG=1")), "{all:?}");
    let events = s.events_named("systemd_notify");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].u64("watchdog_ms"), None, "{:?}", events[0]);
}

#[test]
fn watchdog_usec_gets_watchdog_messages_from_the_supervisor_loop() {
    let app = mlp();
    let (notify, mut s) = start_notified(&app, &[("WATCHDOG_USEC", "400000")]);
    let on = s.wait_event("systemd_notify", |_| true);
    assert_eq!(on.u64("watchdog_ms"), Some(400), "{on:?}");
    // Petted from the start, and on after READY while the loop runs.
    let first = notify.wait(&s, 0, &["WATCHDOG=1"]);
    let ready = notify.wait(&s, 0, &["READY=1"]);
    assert!(first < ready, "{:?}", notify.all());
    let mut at = ready;
    for _ in 0..3 {
        at = notify.wait(&s, at + 1, &["WATCHDOG=1"]);
    }
    s.signal(libc::SIGTERM);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
}

#[test]
fn watchdog_for_another_pid_is_not_ours() {
    let app = mlp();
    // WATCHDOG_PID names another process (pid 1): this one must not pet the watchdog.
    let (notify, mut s) =
        start_notified(&app, &[("WATCHDOG_USEC", "400000"), ("WATCHDOG_PID", "1")]);
    let on = s.wait_event("systemd_notify", |_| true);
    assert_eq!(on.u64("watchdog_ms"), None, "{on:?}");
    notify.wait(&s, 0, &["READY=1"]);
    s.signal(libc::SIGTERM);
    notify.wait(&s, 0, &["STOPPING=1"]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
    let all = notify.all();
    assert!(all.iter().all(|m| !m.contains("WATCHDOG=1")), "{all:?}");
}

#[test]
fn unit_files_pass_systemd_analyze_verify() {
    // The units as shipped, with ExecStart pointed at this build's app (verify checks that
    // the command exists and is executable).
    let dir = tempfile::tempdir().unwrap();
    let units = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
    let service = std::fs::read_to_string(units.join("vramfork.service")).unwrap();
    assert!(service.contains("ExecStart=/opt/vramfork/bin/app "));
    let service = service.replace(
        "ExecStart=/opt/vramfork/bin/app ",
        &format!("ExecStart={} ", app_bin().display()),
    );
    std::fs::write(dir.path().join("vramfork.service"), service).unwrap();
    std::fs::copy(
        units.join("vramfork.socket"),
        dir.path().join("vramfork.socket"),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args([
            "verify",
            "--man=no",
            "./vramfork.service",
            "./vramfork.socket",
        ])
        .current_dir(dir.path())
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Unknown keys and other mistakes are warnings with exit status 0: none is allowed.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// The install the README gives works as written. `deploy/install` puts the
/// binaries and libtorch under a prefix (hard links here, to spare 3.6 GB) and writes the
/// environment file the unit reads; the installed `app` then serves when run the way the
/// unit runs it: as an unprivileged user (here `nobody`, for whom the build user's home and
/// its libtorch are out of reach when that home is private), with only the unit's
/// environment.
#[test]
fn the_installed_server_serves_as_an_unprivileged_user_with_the_units_environment() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(
            "systemd::the_installed_server_serves_as_an_unprivileged_user_with_the_units_environment",
            "switching to an unprivileged user needs root",
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let prefix = root.path().join("opt");
    let etc = root.path().join("etc");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_app"))
        .parent()
        .unwrap()
        .to_path_buf();
    let torch = std::env::var("LIBTORCH").expect("LIBTORCH is set by scripts/env.sh");
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    {
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &std::path::Path| std::fs::metadata(p).unwrap().dev();
        if dev(root.path()) != dev(std::path::Path::new(&torch)) {
            // --link needs one filesystem; a copy is 3.6 GB, too much for a test.
            skip(
                "systemd::the_installed_server_serves_as_an_unprivileged_user_with_the_units_environment",
                "the temporary folder and libtorch are on different filesystems (--link needs one)",
            );
            return;
        }
    }
    let out = std::process::Command::new(repo.join("deploy/install"))
        .args(["--bin", bin.to_str().unwrap(), "--torch", &torch, "--link"])
        .args([
            "--prefix",
            prefix.to_str().unwrap(),
            "--etc",
            etc.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy/install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The model and metadata, where the service user can read them.
    std::fs::copy(fixtures().join("mlp.pt"), etc.join("mlp.pt")).unwrap();
    std::fs::write(
        etc.join("metadata.json"),
        r#"{"name": "installed", "model": "mlp.pt", "input": {"shape": [-1, 4]}}"#,
    )
    .unwrap();
    // The unit's environment: the env file, nothing of ours.
    let env_text = std::fs::read_to_string(etc.join("env")).unwrap();
    let unit_env: Vec<(String, String)> = env_text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains('='))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert!(
        unit_env
            .iter()
            .any(|(k, v)| k == "LD_LIBRARY_PATH" && v.starts_with(prefix.to_str().unwrap())),
        "{env_text}"
    );
    let as_nobody = |program: &PathBuf, args: &[&str]| {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(unit_env.iter().cloned())
            .stdin(std::process::Stdio::null());
        c
    };
    let port = free_port();
    let log_path = root.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = as_nobody(
        &prefix.join("bin/app"),
        &[
            "--production",
            "--workers",
            "1",
            "--metadata",
            etc.join("metadata.json").to_str().unwrap(),
            "--port",
            &port.to_string(),
        ],
    )
    .stdout(log.try_clone().unwrap())
    .stderr(log)
    .spawn()
    .unwrap();
    // Stopped whatever happens below (the master takes its workers with it).
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill(2) of the child this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let mut server = Stop(child);
    let server_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Ready once the port takes a connection and a request gets 200 (the master binds first,
    // its worker answers once it has loaded the model).
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let r = raw(port, "POST", "/", "", br#"{"inputs": [[1, 2, 3, 4]]}"#);
            if r.status == 200 || std::time::Instant::now() > deadline {
                break r.status;
            }
        } else if std::time::Instant::now() > deadline {
            break 0;
        }
        if let Ok(Some(st)) = server.0.try_wait() {
            panic!("the installed app exited ({st}): {}", server_log());
        }
        thread::sleep(Duration::from_millis(100));
    };
    drop(server);
    assert_eq!(status, 200, "{}", server_log());
    // Where the build user's home is private (as root's is), the installed libraries are all
    // the service user has: without the env file's LD_LIBRARY_PATH the worker cannot start.
    let build_home_private = as_nobody(
        &PathBuf::from("/usr/bin/test"),
        &["-r", &format!("{torch}/lib/libtorch_cpu.so")],
    )
    .status()
    .map(|s| !s.success())
    .unwrap_or(false);
    if build_home_private {
        let st = as_nobody(&prefix.join("bin/app-worker"), &[])
            .env_remove("LD_LIBRARY_PATH")
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            st.code(),
            Some(127),
            "the worker found libtorch without the env file"
        );
    }
}

/// The shipped unit can use the default GPU-memory ledger: under `ProtectSystem=strict` (a
/// read-only `/run` for the service) it names `/run/vramfork` writable, and the shipped
/// tmpfiles.d line makes that directory as the server wants it — root's, group vramfork,
/// mode 2770 (set-group-ID; no other user may enter) — as `systemd-tmpfiles` really makes it
/// in a scratch root.
#[test]
fn the_units_ledger_directory_is_writable_and_made_by_the_shipped_tmpfiles_line() {
    let units = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
    let service = std::fs::read_to_string(units.join("vramfork.service")).unwrap();
    let values = |key: &str| -> Vec<String> {
        service
            .lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(values("ProtectSystem"), vec!["strict".to_string()]);
    let writable: Vec<String> = values("ReadWritePaths")
        .iter()
        .map(|p| p.trim_start_matches(['-', '+']).to_string())
        .collect();
    assert!(
        writable.iter().any(|p| p == "/run/vramfork"),
        "ReadWritePaths {writable:?} lacks the default ledger /run/vramfork"
    );
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    std::fs::create_dir_all(root.path().join("run")).unwrap();
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        root.path().join("etc/group"),
        "root:x:0:\nvramfork:x:4321:\n",
    )
    .unwrap();
    let out = std::process::Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg(format!("--root={}", root.path().display()))
        .arg(units.join("vramfork-tmpfiles.conf"))
        .output()
        .expect("systemd-tmpfiles (Debian package systemd)");
    assert!(
        out.status.success(),
        "systemd-tmpfiles: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::MetadataExt;
    let made = std::fs::metadata(root.path().join("run/vramfork")).unwrap();
    assert!(made.is_dir());
    assert_eq!(made.mode() & 0o7777, 0o2770);
    assert_eq!((made.uid(), made.gid()), (0, 4321));
}
