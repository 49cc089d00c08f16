//! The GPU-memory ledger under attack and under faults (docs/security.md, "The GPU ledger"):
//! a held lock, FIFOs and links under its names, garbage and absurd entries, a user who may
//! not use it, and MIG compute instances that share one GPU instance. Real `app` processes
//! against a simulated GPU (the NVML stand-in, `--simulated-gpus`), as in `tests/ledger.rs`.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::host::{Host, A100_SHARE_MB};
use common::*;

const TYP_MB: u64 = 4000;

/// A process holding `flock(LOCK_EX)` on `path` (opened read-only, as any user who can open
/// it may) until dropped.
struct Holder(Child);

impl Holder {
    fn hold(path: &Path, launcher: &[&str]) -> Result<Holder, String> {
        let script = "import fcntl,sys,time\nf=open(sys.argv[1])\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(30)";
        let mut c = match launcher.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg("python3");
                c
            }
            None => Command::new("python3"),
        };
        let mut child = c
            .args(["-c", script])
            .arg(path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        if line.trim() == "held" {
            return Ok(Holder(child));
        }
        let o = child.wait_with_output().unwrap();
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `pid` waits for an flock on `path`'s inode (a `->` line of /proc/locks).
fn waits_on_lock(pid: u32, path: &Path) -> bool {
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let (dev, ino) = (m.dev(), m.ino());
    let id = format!(
        "{:02x}:{:02x}:{ino}",
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff)
    );
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"->")
            && f.get(5) == Some(&pid.to_string().as_str())
            && f.get(6) == Some(&id.as_str())
    })
}

/// Whether a file of the ledger directory was written after `since`.
fn written_since(dir: &Path, since: std::time::SystemTime) -> bool {
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    files
        .filter(|f| f.file_name().to_string_lossy().ends_with(".json"))
        .any(|f| {
            f.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > since)
        })
}

/// A lock held by another process — for as long as it likes — never delays a killed
/// worker's replacement or a TERM by more than a second: a serving master never waits on
/// the lock (its renewal takes none). A server started meanwhile waits a bounded time,
/// saying who holds the lock (`ledger_wait`), then exits 2 naming the holder; `app plan`
/// needs no lock and answers at once. A user who cannot write the directory cannot even
/// open the lock.
#[test]
fn a_held_lock_never_delays_a_replacement_or_a_term() {
    let host = Host::new();
    std::fs::set_permissions(host.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let app = host.app(TYP_MB);
    let (a, n) = host.serving(&app, &["--workers", "2"]);
    assert_eq!(n, 2);
    let lock = host.ledger().join("gpu-ledger.lock");
    assert!(lock.exists(), "the server made the lock file");
    let since = std::time::SystemTime::now();
    let holder = Holder::hold(&lock, &[]).expect("the test holds the lock");
    // Past the master's next renewal: it renewed (never waiting), or it waits on the lock.
    a.poll("the master's next renewal after the hold began", || {
        (written_since(&host.ledger(), since) || waits_on_lock(a.pid(), &lock)).then_some(())
    });
    let started = Instant::now();
    let b_app = host.app(TYP_MB);
    let mut b = host.spawn(&b_app, &["--production"]);

    let killed = a.wait_workers(2)[0];
    let mark = a.mark();
    let t = Instant::now();
    // SAFETY: kill(2) of a worker of the server this test started.
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };
    a.wait_event_after(mark, "worker_started", |e| {
        e.u64("pid") != Some(u64::from(killed))
    });
    let replaced = t.elapsed();
    assert!(
        replaced < Duration::from_secs(1),
        "a worker was replaced after {replaced:?} while the lock was held"
    );

    let mark = a.mark();
    let t = Instant::now();
    a.signal(libc::SIGTERM);
    a.wait_event_after(mark, "stopping", |_| true);
    let stopped = t.elapsed();
    assert!(
        stopped < Duration::from_secs(1),
        "TERM acted on after {stopped:?} while the lock was held"
    );
    let mut a = a;
    assert_eq!(a.wait_exit(PATIENCE).code(), Some(0));

    // `app plan` takes no lock.
    let mut plan = host.spawn(&app, &["plan", "--json"]);
    assert_eq!(
        plan.wait_exit(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        plan.log_text()
    );

    // The server started during the hold: a bounded wait, said, then exit 2 naming the holder.
    let wait = b.wait_event("ledger_wait", |_| true);
    assert_eq!(
        wait.u64("holder"),
        Some(u64::from(holder.pid())),
        "{wait:?}"
    );
    let st = b.wait_exit(Duration::from_secs(30));
    let log = b.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains(&format!("pid {}", holder.pid())), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    drop(holder);
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let nobody = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ];
        let tried = Holder::hold(&lock, &nobody);
        assert!(
            tried.is_err(),
            "a user who cannot write the ledger's directory took its lock"
        );
    }
}

/// How a start on `host` ended within `limit`: its exit status and log (`None` if it was
/// still running, killed then).
fn ends_within(mut s: Server, limit: Duration) -> (Option<i32>, String) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = s.try_exit() {
            return (st.code(), s.log_text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (None, s.log_text())
}

/// A FIFO or a link where the ledger's files go — what a local user could make in a
/// directory every user may write — is refused by name at once (exit 2: a server that
/// cannot use the ledger others share does not plan alone), by `app plan` too; nothing is
/// made through a link, nothing hangs.
#[test]
fn fifos_and_links_in_the_ledger_directory_are_refused_by_name() {
    for name in ["gpu-ledger.json", "gpu-ledger.lock", "server-planted.json"] {
        for what in ["FIFO", "link"] {
            for mode in ["--production", "plan"] {
                let host = Host::new();
                let dir = host.ledger();
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
                let path = dir.join(name);
                let target = host.dir.path().join("made-through-the-link");
                if what == "FIFO" {
                    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                    // SAFETY: mkfifo(3) with a NUL-terminated path that outlives the call.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
                } else {
                    std::os::unix::fs::symlink(&target, &path).unwrap();
                }
                let app = host.app(TYP_MB);
                let s = host.spawn(&app, &[mode]);
                let (code, log) = ends_within(s, Duration::from_secs(20));
                let case = format!("{what} at {name}, {mode}");
                let kind = if what == "FIFO" {
                    "is a FIFO"
                } else {
                    "is a symbolic link"
                };
                if name == "gpu-ledger.lock" && mode == "plan" {
                    // `app plan` takes no lock: it plans with the ledger.
                    assert_eq!(code, Some(0), "{case}: {log}");
                } else {
                    assert_eq!(code, Some(2), "{case}: {log}");
                    assert!(log.contains(name) && log.contains(kind), "{case}: {log}");
                }
                assert!(!target.exists(), "{case}: a file was made through the link");
            }
        }
    }
}

/// Garbage in the shared file, a hand-made entry that never expires and reserves more
/// than the GPU has, and an entry file of garbage never let a server over-commit (the
/// serving neighbour's entry still counts) nor block every later start: the absurd entries
/// are said (`ledger_entry_dropped`) and count for nothing.
#[test]
fn garbage_and_absurd_entries_never_let_a_server_over_commit_or_block() {
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (_first, n_first) = host.serving(&a, &[]);
    let dir = host.ledger();
    let forever = format!(
        r#"{{"servers": {{"x": {{"pid": 1, "app": "ghost", "expires_ms": {max}, "gpus": {{"{uuid}": {max}}}}}}}}}"#,
        max = u64::MAX,
        uuid = nvml_sim::SimGpus::new(vec![nvml_sim::SimGpu::a100_40gb()]).uuid_of(0)
    );
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let planted = format!(
        r#"{{"version": 2, "pid": 1, "app": "ghost", "boot_id": "{}", "expires_boot_ms": {}, "gpus": {{"x": 1}}}}"#,
        boot_id.trim(),
        u64::MAX
    );
    let cases = [
        ("gpu-ledger.json", "garbage".to_string(), true),
        ("gpu-ledger.json", forever, false),
        ("server-ghost.json", planted, true),
        ("server-junk.json", "{\"version\": 2".to_string(), true),
    ];
    for (file, text, said) in cases {
        std::fs::write(dir.join(file), text).unwrap();
        let got = ends_within_listening(host.spawn(&b, &["--production"]));
        let (s, n) = got.unwrap_or_else(|(code, log)| panic!("{file}: exit {code:?}: {log}"));
        let total = (n_first + n) * TYP_MB;
        assert!(
            n >= 1 && total <= A100_SHARE_MB,
            "{file}: {n_first} + {n} workers reserve {total} MB of {A100_SHARE_MB}"
        );
        if said {
            let e = s.wait_event("ledger_entry_dropped", |e| {
                e.str("file").is_some_and(|f| f.ends_with(file))
            });
            assert!(e.message().contains("counts for nothing"), "{e:?}");
        }
        s.signal(libc::SIGTERM);
        let mut s = s;
        assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
        std::fs::remove_file(dir.join(file)).unwrap();
    }
}

/// A server's start: `Ok` with its worker count once listening, else its exit and log.
fn ends_within_listening(mut s: Server) -> Result<(Server, u64), (Option<i32>, String)> {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if let Some(e) = s.events().into_iter().find(|e| e.name == "listening") {
            let n = e.u64("workers").unwrap();
            s.wait_workers(n as usize);
            return Ok((s, n));
        }
        if let Some(st) = s.try_exit() {
            return Err((st.code(), s.log_text()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err((None, s.log_text()))
}

/// `app plan` as another user (uid 65534) on a host whose ledger a root server made: a
/// ledger that is there but that this user may not use is a refusal naming the directory
/// and the fix, never "plans alone" beside the root server's reservation. Once the
/// directory is shared through a group the user is in (mode 2770, as the shipped
/// tmpfiles.d line makes it), the same `app plan` sees the root server's reservation.
#[test]
fn a_ledger_this_user_may_not_use_is_a_refusal_and_a_group_shares_it() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(
            "ledger_attacks::a_ledger_this_user_may_not_use_is_a_refusal_and_a_group_shares_it",
            "running as another user needs root",
        );
        return;
    }
    let host = Host::new();
    let open =
        |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    open(host.dir.path());
    let (_root, n) = host.serving(&host.app(TYP_MB), &["--workers", "2"]);
    assert_eq!(n, 2);
    let other = host.app(TYP_MB);
    open(other.dir.path());
    let plan_as_nobody = || {
        let lib = nvml_sim::mock_library().display().to_string();
        let script = r#"while [ $# -gt 0 ]; do case "$1" in --setenv=*) export "${1#--setenv=}"; shift;; *) break;; esac; done
exec "$@""#;
        let launcher = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ];
        let env = host.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let args = host.args(&lib, &["plan", "--json"]);
        let mut s = Server::spawn_under(&launcher, &other, &args, &env);
        let st = s.wait_exit(Duration::from_secs(30));
        (st.code(), s)
    };
    let (code, s) = plan_as_nobody();
    let log = s.log_text();
    assert_eq!(code, Some(2), "{log}");
    let dir = host.ledger().display().to_string();
    assert!(log.contains(&dir) && log.contains("may not read"), "{log}");
    assert!(
        log.contains("tmpfiles.d") && !log.contains("plans alone,"),
        "{log}"
    );

    // Shared through group 65534 (the user's own), set-group-ID: its files take the group.
    let c = std::ffi::CString::new(dir.as_str()).unwrap();
    // SAFETY: chown(2) with a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, 65534) }, 0);
    std::fs::set_permissions(host.ledger(), std::fs::Permissions::from_mode(0o2770)).unwrap();
    for f in std::fs::read_dir(host.ledger()).unwrap().flatten() {
        let c = std::ffi::CString::new(f.path().to_str().unwrap()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, 65534) }, 0);
    }
    let theirs = host.reserved();
    assert_eq!(theirs, 2 * TYP_MB);
    // The root server's next renewal writes its entry anew: still readable by the group.
    let since = std::time::SystemTime::now();
    _root.poll("the root server's renewal", || {
        written_since(&host.ledger(), since).then_some(())
    });
    let (code, s) = plan_as_nobody();
    assert_eq!(code, Some(0), "{}", s.log_text());
    let plan = s.stdout_json();
    assert_eq!(
        plan["gpus"][0]["ledger_mb"].as_u64(),
        Some(theirs),
        "{plan:#}"
    );
}

/// Two servers on two compute instances of one MIG GPU instance (two MIG devices sharing
/// its memory, each reporting all of it) add up in the ledger: the second plans on what
/// the first left of the GPU instance, not on all of it again.
#[test]
fn servers_on_compute_instances_of_one_gpu_instance_add_up() {
    use nvml_sim::{SimGpu, SimMig, SimMigInstance};
    let ci = |uuid: &str, ci: u32| {
        SimMigInstance::new("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", uuid, 19_968, 1, ci)
    };
    let gpu = SimGpu::a100_40gb().mig(
        SimMig::enabled()
            .instance(ci("MIG-ci-a", 0))
            .instance(ci("MIG-ci-b", 1)),
    );
    let host = Host::with_gpu(gpu);
    let lib = nvml_sim::mock_library().display().to_string();
    let on = |app: &App, uuid: &str, more: &[&str]| {
        let mut env = host.env();
        env.push(("CUDA_VISIBLE_DEVICES".into(), uuid.into()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Server::spawn(app, &host.args(&lib, more), &env)
    };
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let first = on(&a, "MIG-ci-a", &["--production", "--workers", "2"]).wait_listening();
    first.wait_workers(2);
    let theirs = first
        .wait_event("ledger_reserved", |_| true)
        .u64("reserved_mb")
        .unwrap();
    assert_eq!(theirs, 2 * TYP_MB);
    let mut plan = on(&b, "MIG-ci-b", &["plan", "--json"]);
    assert_eq!(
        plan.wait_exit(PATIENCE).code(),
        Some(0),
        "{}",
        plan.log_text()
    );
    let p = plan.stdout_json();
    assert_eq!(p["gpus"][0]["ledger_mb"].as_u64(), Some(theirs), "{p:#}");
}
