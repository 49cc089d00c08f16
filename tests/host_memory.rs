//! Process tests of host memory: recycling on a worker's own memory
//! (`--max-worker-memory-mb`), the plan bounded by the memory the server may use (a cgroup's
//! limit, read from a directory `--memory-cgroup` names or from a real cgroup the server
//! runs in), and the kernel's OOM killer taking a worker, never the master. Models are
//! built on the spot with the test venv's torch (`tests/support/make_memory_models.py`,
//! `make_large_model.py`).
//!
//! The real-cgroup tests create a memory cgroup of their own (cgroup v1: below this
//! process's; v2: beside it) and start `app` in it; where the machine gives no writable
//! memory controller they say so on stderr and pass without running (CI runs as root on
//! machines that have one).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;
use vramfork::master::resources::host_memory::{Cgroup, Version};

const MB: u64 = 1 << 20;

/// A model built by `make_memory_models.py` (`leak`, or `scratch MB`) in `app`'s folder,
/// with metadata declaring its `[1, 1]` input (so the template warms it up).
fn memory_model(app: &App, kind: &[&str]) -> PathBuf {
    let model = app.dir.path().join(format!("{}.pt", kind[0]));
    let mut args = vec![kind[0], model.to_str().unwrap()];
    args.extend(&kind[1..]);
    python_json("make_memory_models.py", &args, b"");
    std::fs::write(
        app.metadata(),
        format!(
            r#"{{"name": "{}", "model": "{}", "input": {{"shape": [1, 1], "dtype": "float32"}}}}"#,
            kind[0],
            model.display()
        ),
    )
    .unwrap();
    model
}

/// `clients` threads each sending `each` requests with `body`; the statuses (0: the
/// connection failed).
fn load(port: u16, clients: usize, each: usize, body: &'static str) -> Vec<u16> {
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            thread::spawn(move || {
                (0..each)
                    .map(|_| try_http(port, "POST", "/", Some(body)).map_or(0, |r| r.status))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

/// One sample's value from a scrape of `/metrics` (`name{labels}` as written there).
fn metric(port: u16, sample: &str) -> Option<f64> {
    let r = http(port, "GET", "/metrics", None);
    r.body
        .lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The most the workers' own memory (`Private_Dirty + SwapPss`) summed to while `busy`
/// ran, sampled from /proc.
fn peak_tree_own_memory(master: u32, busy: impl FnOnce()) -> u64 {
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let sum: u64 = worker_pids(master)
                    .into_iter()
                    .filter_map(|p| vramfork::own_memory::own(Some(p)))
                    .sum();
                peak.fetch_max(sum, Ordering::Relaxed);
                thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    busy();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    peak.load(Ordering::Relaxed)
}

#[test]
fn a_leaking_worker_is_recycled_near_the_limit_and_no_request_fails() {
    let app = App::new("mlp.pt", "");
    memory_model(&app, &["leak"]);
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "2",
            "--max-worker-memory-mb",
            "120",
            "--metrics-port",
            "0",
        ],
    );
    s.wait_workers(2);
    let mport = s.metrics_port();
    // 4 clients × 40 requests, each kept for good: 1280 MB leaked in all.
    let mut statuses = Vec::new();
    let peak = peak_tree_own_memory(s.pid(), || {
        statuses = load(s.port, 4, 40, r#"{"inputs": [[8.0]]}"#)
    });
    assert!(
        statuses.iter().all(|st| *st == 200),
        "every request is answered: {statuses:?}\n{}",
        s.log_text()
    );
    let recycled = s.events_named("worker_memory_recycled");
    assert!(recycled.len() >= 4, "{}", s.log_text());
    for e in &recycled {
        let own = e.u64("own_mb").unwrap();
        // Past the limit, by at most the request that took it there (and the ones it had
        // in hand).
        assert!(own > 120 && own <= 120 + 4 * 8, "{e:?}");
    }
    let exits = s.events_named("worker_exited");
    let by_memory = exits
        .iter()
        .filter(|e| e.str("reason") == Some("host_memory"))
        .count();
    assert!(by_memory >= 4, "{}", s.log_text());
    assert!(exits
        .iter()
        .all(|e| e.i64("code") == Some(0) && e.str("signal").is_none()));
    // Two workers and a replacement beside a retiring one, each at most the limit plus
    // what it had in hand: far below the 1280 MB kept without recycling.
    assert!(
        peak <= 3 * (120 + 4 * 8) * MB,
        "the workers held {} MB at once",
        peak / MB
    );
    let exited = metric(
        mport,
        r#"vramfork_worker_exits_total{reason="host-memory"}"#,
    );
    assert!(exited.unwrap_or(0.0) >= 4.0, "{exited:?}");
}

#[test]
fn forked_workers_sharing_300_mb_of_weights_are_not_recycled_at_a_limit_below_that() {
    let app = App::new("mlp.pt", "");
    let model = app.dir.path().join("large.pt");
    python_json(
        "make_large_model.py",
        &[model.to_str().unwrap(), "300"],
        b"",
    );
    std::fs::write(
        app.metadata(),
        format!(
            r#"{{"name": "large", "model": "{}", "input": {{"shape": [-1, 4]}}}}"#,
            model.display()
        ),
    )
    .unwrap();
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "2",
            "--max-worker-memory-mb",
            "100",
            "--metrics-port",
            "0",
        ],
    );
    let pids = s.wait_workers(2);
    let started = s.events_named("worker_started");
    assert!(
        started.iter().all(|e| e.str("method") == Some("fork")),
        "{}",
        s.log_text()
    );
    let body = r#"{"inputs": [[1.0, 2.0, 3.0, 4.0]]}"#;
    let answered: Vec<(u16, u32)> = (0..40)
        .map(|_| {
            let r = s.post("/", body);
            (r.status, r.pid())
        })
        .collect();
    assert!(
        answered
            .iter()
            .all(|(st, pid)| *st == 200 && pids.contains(pid)),
        "{answered:?}"
    );
    assert!(
        s.events_named("worker_memory_recycled").is_empty(),
        "{}",
        s.log_text()
    );
    assert!(
        s.events_named("worker_retiring").is_empty(),
        "{}",
        s.log_text()
    );
    // Each maps the 300 MB of weights, and holds a few MB of its own.
    let mport = s.metrics_port();
    for slot in 0..2 {
        let rss = metric(
            mport,
            &format!(r#"vramfork_worker_resident_memory_bytes{{slot="{slot}"}}"#),
        );
        let own = metric(
            mport,
            &format!(r#"vramfork_worker_private_memory_bytes{{slot="{slot}"}}"#),
        );
        let (rss, own) = (rss.unwrap() as u64, own.unwrap() as u64);
        assert!(
            rss > 300 * MB && own < 100 * MB,
            "slot {slot}: rss {rss}, own {own}"
        );
    }
    assert_eq!(s.ready_pids().len(), 2);
}

/// A cgroup v2 directory as `--memory-cgroup` reads it: `limit_mb` of which `in_use_mb` in
/// use.
fn fake_v2(dir: &Path, limit_mb: u64, in_use_mb: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let files = [
        ("memory.max", (limit_mb * MB).to_string()),
        ("memory.current", (in_use_mb * MB).to_string()),
        (
            "memory.stat",
            "anon 0\nfile 0\ninactive_file 0\n".to_string(),
        ),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n".to_string(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text + "\n").unwrap();
    }
}

#[test]
fn a_memory_limit_read_from_a_given_cgroup_directory_bounds_the_plan() {
    let app = App::new("mlp.pt", "");
    memory_model(&app, &["scratch", "100"]);
    let cg = app.dir.path().join("cgroup");
    // 300 MB may be used: one or two workers of a model that writes 100 MB per pass.
    fake_v2(&cg, 400, 100);
    let cg_arg = cg.to_str().unwrap();
    // `app plan` shows the row, from the file (the flag and its variable alike).
    for (args, env) in [
        (vec!["plan", "--json", "--memory-cgroup", cg_arg], vec![]),
        (
            vec!["plan", "--json"],
            vec![("VRAMFORK_MEMORY_CGROUP", cg_arg)],
        ),
    ] {
        let out = std::process::Command::new(app_bin())
            .args(["--metadata", app.metadata().to_str().unwrap()])
            .args(&args)
            .envs(env)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let host = &plan["host"]["budget"];
        assert_eq!(host["limit_mb"], 400, "{plan}");
        assert_eq!(host["in_use_mb"], 100, "{plan}");
        assert!(host["room_mb"].as_u64().unwrap() <= 300, "{plan}");
        assert!(host["source"].as_str().unwrap().contains(cg_arg), "{plan}");
    }
    let s = Server::start(&app, &["--production", "--memory-cgroup", cg_arg]);
    let e = s.wait_event("host_memory_planned", |_| true);
    let (room, per, bound) = (
        e.u64("room_mb").unwrap(),
        e.u64("per_worker_mb").unwrap(),
        e.u64("bound").unwrap(),
    );
    // The pass's 100 MB is measured (× 1.2 headroom), the shared weights are not.
    assert!((120..200).contains(&per), "{e:?}");
    assert_eq!(bound, room / per, "{e:?}");
    assert!(
        e.fields["bounded"] == true && (1..=2).contains(&bound),
        "{e:?}"
    );
    let pids = s.wait_workers(bound as usize);
    assert_eq!(s.events_named("worker_started").len(), pids.len());
    let r = s.post("/", r#"{"inputs": [[1.0]]}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    // One more worker than host memory holds: TTIN is refused, saying why.
    s.signal(libc::SIGTTIN);
    let refused = s.wait_event("ttin_refused", |_| true);
    assert!(refused.message().contains("host memory"), "{refused:?}");
    assert_eq!(s.events_named("worker_started").len(), pids.len());
}

#[test]
fn when_not_even_one_worker_fits_in_the_memory_left_the_master_says_so_and_exits_2() {
    let app = App::new("mlp.pt", "");
    memory_model(&app, &["scratch", "100"]);
    let cg = app.dir.path().join("cgroup");
    // 50 MB may be used; one pass writes 100 MB.
    fake_v2(&cg, 250, 200);
    let mut s = Server::spawn(
        &app,
        &["--production", "--memory-cgroup", cg.to_str().unwrap()],
        &[],
    );
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(2), "{}", s.log_text());
    let e = s.wait_event("host_memory_refused", |_| true);
    let why = e.message();
    assert!(
        why.contains("not even one worker fits in host memory")
            && why.contains("50 MB may be used")
            && why.contains("warm-up peak"),
        "{why}"
    );
    assert!(
        s.events_named("worker_ready").is_empty(),
        "{}",
        s.log_text()
    );
}

#[test]
fn a_v1_directory_is_read_too_and_a_directory_without_limit_files_is_refused() {
    let app = App::new("mlp.pt", "");
    let cg = app.dir.path().join("v1");
    std::fs::create_dir_all(&cg).unwrap();
    for (name, text) in [
        ("memory.limit_in_bytes", "9223372036854771712"),
        ("memory.usage_in_bytes", "104857600"),
        (
            "memory.stat",
            "hierarchical_memory_limit 536870912\ntotal_inactive_file 0",
        ),
        (
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0",
        ),
    ] {
        std::fs::write(cg.join(name), format!("{text}\n")).unwrap();
    }
    let plan = |dir: &Path| {
        std::process::Command::new(app_bin())
            .args([
                "--metadata",
                app.metadata().to_str().unwrap(),
                "plan",
                "--json",
            ])
            .arg("--memory-cgroup")
            .arg(dir)
            .output()
            .unwrap()
    };
    let out = plan(&cg);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["host"]["budget"]["limit_mb"], 512, "{v}");
    assert!(v["host"]["budget"]["source"]
        .as_str()
        .unwrap()
        .starts_with("cgroup v1"));
    let out = plan(app.dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--memory-cgroup") && err.contains("memory.max"),
        "{err}"
    );
}

/// A memory cgroup of this test's own, with a limit, removed when dropped.
struct TestCgroup {
    dir: PathBuf,
    version: Version,
}

impl TestCgroup {
    /// A new memory cgroup limited to `limit_mb` (v1: below this process's; v2: beside
    /// it, since a v2 cgroup with processes cannot enable controllers for children).
    /// `None`, said on stderr, where the machine does not let this process make one.
    fn create(name: &str, limit_mb: u64) -> Option<TestCgroup> {
        let Some(own) = Cgroup::find() else {
            skip(
                &format!("host_memory ({name})"),
                "no memory cgroup found in /proc/self/cgroup",
            );
            return None;
        };
        let unique = format!("vftest-{name}-{}", std::process::id());
        let dir = match own.version {
            Version::V1 => own.dir.join(unique),
            Version::V2 => own.dir.parent().unwrap_or(&own.dir).join(unique),
        };
        let limit_file = match own.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        let made = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join(limit_file), (limit_mb * MB).to_string()));
        if let Err(e) = made {
            skip(
                &format!("host_memory ({name})"),
                &format!("cannot make a memory cgroup at {}: {e}", dir.display()),
            );
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(TestCgroup {
            dir,
            version: own.version,
        })
    }

    /// The kernel's count of OOM kills in it.
    fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        vramfork::master::resources::host_memory::stat_field(&text, "oom_kill").unwrap()
    }

    /// `app` started in the cgroup (moved there before it executes, so every process it
    /// starts is in it too), listening.
    fn start(&self, app: &App, args: &[&str]) -> Server {
        let procs = self.dir.join("cgroup.procs");
        let script = format!(
            r#"echo 0 > '{}' || exit 99
while [ $# -gt 0 ]; do case "$1" in --setenv=*) export "${{1#--setenv=}}"; shift;; *) break;; esac; done
exec "$@""#,
            procs.display()
        );
        let mut all = args.to_vec();
        all.extend(["--port", "0"]);
        let mut s = Server::spawn_under(&["sh", "-c", &script, "sh"], app, &all, &[]);
        let e = s.wait_event("listening", |_| true);
        s.port = e
            .str("addr")
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        s
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Empty once the server's processes are gone (the Server is dropped first).
        for _ in 0..500 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

#[test]
fn in_a_memory_cgroup_too_small_for_the_cpu_plan_fewer_workers_answer_every_request() {
    let app = App::new("mlp.pt", "");
    memory_model(&app, &["scratch", "100"]);
    // The issue's example: 486 MB for the server and about two and a half such passes.
    let Some(cg) = TestCgroup::create("plan", 486) else {
        return;
    };
    let s = cg.start(&app, &["--production"]);
    let e = s.wait_event("host_memory_planned", |_| true);
    let src = e.str("source").unwrap();
    assert!(
        src.contains("limit 486 MB") && src.contains(cg.dir.to_str().unwrap()),
        "the server found the cgroup it runs in: {e:?}"
    );
    let cpu_bound = 2 * std::thread::available_parallelism().unwrap().get() as u64 + 1;
    let workers = e.u64("workers").unwrap();
    assert!(e.fields["bounded"] == true && workers < cpu_bound, "{e:?}");
    s.wait_workers(workers as usize);
    // 5 clients × 10 requests, each pass writing 100 MB.
    let statuses = load(s.port, 5, 10, r#"{"inputs": [[1.0]]}"#);
    assert!(
        statuses.iter().all(|st| *st == 200),
        "{statuses:?}\n{}",
        s.log_text()
    );
    assert_eq!(cg.oom_kills(), 0, "{}", s.log_text());
    assert!(s.events_named("worker_oom_killed").is_empty());
    // The figures, for docs/production.md's example (seen with --no-capture).
    eprintln!(
        "486 MB cgroup: {workers} workers (CPU plan {cpu_bound}), {} MB per worker, room {} MB; {}/{} answered, 0 OOM kills",
        e.u64("per_worker_mb").unwrap(),
        e.u64("room_mb").unwrap(),
        statuses.len(),
        statuses.len()
    );
    assert!(
        s.events_named("worker_exited").is_empty(),
        "{}",
        s.log_text()
    );
}

#[test]
fn a_worker_oom_killed_under_a_real_cgroup_limit_is_logged_counted_and_replaced() {
    let app = App::new("mlp.pt", "");
    std::fs::write(
        app.metadata(),
        format!(
            r#"{{"name": "alloc", "model": "{}", "input": {{"shape": [1, 1], "dtype": "float32"}}}}"#,
            fixtures().join("alloc.pt").display()
        ),
    )
    .unwrap();
    let Some(cg) = TestCgroup::create("oom", 500) else {
        return;
    };
    let s = cg.start(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
    );
    let mport = s.metrics_port();
    let first = s.wait_workers(1)[0];
    // A pass that writes 700 MB in a 500 MB cgroup: the kernel's OOM killer takes the
    // worker (its oom_score_adj is above the master's and the template's).
    let big = try_http(s.port, "POST", "/", Some(r#"{"inputs": [[700.0]]}"#));
    assert!(
        big.is_err() || big.as_ref().unwrap().status != 200,
        "{big:?}"
    );
    let e = s.wait_event("worker_oom_killed", |_| true);
    assert_eq!(e.u64("pid"), Some(first as u64), "{e:?}");
    assert!(e.u64("own_mb").is_some(), "the worker's last figure: {e:?}");
    assert!(
        e.str("counted_in")
            .unwrap()
            .contains(cg.dir.to_str().unwrap()),
        "{e:?}"
    );
    assert!(cg.oom_kills() >= 1);
    // The master lives on and replaces it; the replacement serves.
    let next = s.wait_workers_where(1, |p| p[0] != first)[0];
    let r = s.post("/", r#"{"inputs": [[1.0]]}"#);
    assert_eq!((r.status, r.pid()), (200, next), "{}", r.body);
    assert!(process_alive(s.pid()));
    let killed = metric(mport, r#"vramfork_worker_exits_total{reason="oom-kill"}"#);
    assert_eq!(killed, Some(1.0), "{}", s.log_text());
}

/// The scratch model with no declared input (so no warm-up pass measures it at start).
fn undeclared_scratch(app: &App, mb: &str) {
    let model = memory_model(app, &["scratch", mb]);
    let meta = format!(r#"{{"name": "scratch", "model": "{}"}}"#, model.display());
    std::fs::write(app.metadata(), meta).unwrap();
}

/// Nothing measured a pass at start (no declared input shape): one worker serves
/// until its first answered request shows how far a pass takes its memory, then the pool
/// opens within the host-memory bound, and TTIN is refused past it.
#[test]
fn with_nothing_measured_at_start_one_worker_serves_until_its_pass_bounds_the_pool() {
    let app = App::new("mlp.pt", "");
    undeclared_scratch(&app, "100");
    let cg = app.dir.path().join("cgroup");
    fake_v2(&cg, 400, 100);
    let s = Server::start(
        &app,
        &["--production", "--memory-cgroup", cg.to_str().unwrap()],
    );
    let unmeasured = s.wait_event("host_memory_unmeasured", |_| true);
    assert!(
        unmeasured.message().contains("one worker serves"),
        "{unmeasured:?}"
    );
    s.wait_workers(1);
    let r = s.post("/", r#"{"inputs": [[1.0]]}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let e = s.wait_event("host_memory_planned", |_| true);
    assert!(
        e.str("source").unwrap().contains("worker 0 holds"),
        "measured from the serving worker: {e:?}"
    );
    let (room, per, bound) = (
        e.u64("room_mb").unwrap(),
        e.u64("per_worker_mb").unwrap(),
        e.u64("bound").unwrap(),
    );
    // Its pass's 100 MB and what the worker holds, × 1.2 headroom.
    assert!((120..260).contains(&per), "{e:?}");
    assert_eq!(bound, room / per, "{e:?}");
    assert!(
        e.fields["bounded"] == true && (1..=2).contains(&bound),
        "{e:?}"
    );
    assert_eq!(
        s.count_before("worker_started", "host_memory_planned"),
        1,
        "one worker until the pass was measured:\n{}",
        s.log_text()
    );
    let pids = s.wait_workers(bound as usize);
    s.signal(libc::SIGTTIN);
    let refused = s.wait_event("ttin_refused", |_| true);
    assert!(refused.message().contains("host memory"), "{refused:?}");
    assert_eq!(s.events_named("worker_started").len(), pids.len());
}

/// With an operator's worker count, nothing is held (the count is theirs): every worker
/// starts at once, and the first pass measured warns when the count is past the bound.
#[test]
fn with_nothing_measured_an_operators_worker_count_starts_at_once_and_is_warned_of() {
    let app = App::new("mlp.pt", "");
    undeclared_scratch(&app, "100");
    let cg = app.dir.path().join("cgroup");
    fake_v2(&cg, 400, 100);
    let cg = cg.to_str().unwrap();
    let s = Server::start(
        &app,
        &["--production", "--workers", "3", "--memory-cgroup", cg],
    );
    s.wait_workers(3);
    let r = s.post("/", r#"{"inputs": [[1.0]]}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let e = s.wait_event("host_memory_planned", |_| true);
    assert!(
        e.fields["bounded"] == false && e.u64("bound").unwrap() < 3,
        "{e:?}"
    );
    let w = s.wait_event("plan_warning", |w| {
        w.message().contains("above the host-memory bound")
    });
    assert!(w.message().contains("--workers = 3"), "{w:?}");
}

/// The issue's case: a model writing 100 MB per pass, no declared input, a 486 MB memory
/// cgroup. On the CPU plan's count (5 workers on 2 cores) a burst of first requests
/// OOM-killed workers; with one worker serving first, every request is answered.
#[test]
fn a_burst_of_first_requests_with_nothing_measured_is_answered_without_an_oom_kill() {
    let app = App::new("mlp.pt", "");
    undeclared_scratch(&app, "100");
    let Some(cg) = TestCgroup::create("burst", 486) else {
        return;
    };
    let s = cg.start(&app, &["--production"]);
    s.wait_workers(1);
    let statuses = load(s.port, 5, 10, r#"{"inputs": [[1.0]]}"#);
    assert!(
        statuses.iter().all(|st| *st == 200),
        "{statuses:?}\n{}",
        s.log_text()
    );
    let e = s.wait_event("host_memory_planned", |_| true);
    let cpu_bound = 2 * std::thread::available_parallelism().unwrap().get() as u64 + 1;
    assert!(
        e.fields["bounded"] == true && e.u64("workers").unwrap() < cpu_bound,
        "{e:?}"
    );
    assert_eq!(cg.oom_kills(), 0, "{}", s.log_text());
    assert!(s.events_named("worker_oom_killed").is_empty());
}
