//! Process tests of `app --production` (and development mode): the real binary, real
//! TorchScript fixtures, HTTP over loopback. What a user sees: answers, status codes, worker
//! pids, recycling, signals, recovery after `kill -9`, exit statuses.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// A request's status and answering worker, or its transport error.
type Outcome = Result<(u16, u32), String>;
/// Arguments, environment, expectation.
type Case<'a, T> = (&'a [&'a str], &'a [(&'a str, &'a str)], T);

/// `threads` clients each sending `each` MLP requests; returns (status, worker pid) or the
/// transport error of every request.
fn load(port: u16, threads: usize, each: usize) -> Vec<Outcome> {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            thread::spawn(move || {
                (0..each)
                    .map(|_| {
                        try_http(port, "POST", "/", Some(MLP_INPUT))
                            .map(|r| (r.status, r.pid()))
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

fn assert_all_ok(results: &[Outcome]) -> BTreeSet<u32> {
    let failed: Vec<_> = results
        .iter()
        .filter(|r| !matches!(r, Ok((200, _))))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        results.len()
    );
    results.iter().map(|r| r.as_ref().unwrap().1).collect()
}

/// Clients that keep sending requests until stopped; each result is kept, and the test can
/// wait on what they have seen so far.
struct Background {
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<Outcome>>>,
    handles: Vec<thread::JoinHandle<()>>,
}

impl Background {
    fn start(port: u16, threads: usize) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let results = Arc::new(Mutex::new(Vec::new()));
        let handles = (0..threads)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let results = Arc::clone(&results);
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let r = try_http(port, "POST", "/", Some(MLP_INPUT))
                            .map(|r| (r.status, r.pid()))
                            .map_err(|e| e.to_string());
                        results.lock().unwrap().push(r);
                    }
                })
            })
            .collect();
        Background {
            stop,
            results,
            handles,
        }
    }

    /// Waits until a request sent from now on is answered 200 by a worker whose pid
    /// satisfies `pred` (and `more` requests in all have been answered 200 from now on).
    fn wait_answer(&self, more: usize, pred: impl Fn(u32) -> bool) {
        let from = self.results.lock().unwrap().len();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let seen: Vec<u32> = self.results.lock().unwrap()[from..]
                .iter()
                .filter_map(|r| match r {
                    Ok((200, pid)) => Some(*pid),
                    _ => None,
                })
                .collect();
            if seen.len() >= more && seen.iter().any(|p| pred(*p)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the clients saw no such answer: {seen:?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles {
            h.join().unwrap();
        }
        std::mem::take(&mut *self.results.lock().unwrap())
    }
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until the one worker `old` has retired for `reason` and another is ready in its
/// place; returns the new worker's pid.
fn replaced(s: &Server, old: u32, reason: &str) -> u32 {
    let retiring = s.wait_event("worker_retiring", |e| e.u64("pid") == Some(old.into()));
    assert_eq!(retiring.str("reason"), Some(reason), "{retiring:?}");
    s.wait_workers_where(1, |p| p != [old])[0]
}

fn mlp() -> App {
    App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#)
}

#[test]
fn production_serves_from_named_workers_never_the_master() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    let workers = s.wait_workers(2);
    let mut names: Vec<String> = workers.iter().map(|p| comm(*p)).collect();
    names.sort();
    assert_eq!(names, ["vf-worker-0", "vf-worker-1"]);
    let pids = assert_all_ok(&load(s.port, 2, 10));
    assert!(!pids.contains(&s.pid()), "the master answered a request");
    assert!(
        pids.iter().all(|p| workers.contains(p)),
        "{pids:?} vs {workers:?}"
    );
    let meta = s.get("/").json();
    assert_eq!(meta["name"], "test app");
}

#[test]
fn worker_count_overrides_in_order_of_precedence() {
    let app = mlp();
    let cases: &[Case<usize>] = &[
        (
            &["--workers", "3"],
            &[("VRAMFORK_WORKERS", "1"), ("CLAMS_GUNICORN_WORKERS", "2")],
            3,
        ),
        (
            &[],
            &[("VRAMFORK_WORKERS", "2"), ("CLAMS_GUNICORN_WORKERS", "1")],
            2,
        ),
        (&[], &[("CLAMS_GUNICORN_WORKERS", "1")], 1),
    ];
    for (args, env, n) in cases {
        let mut a = vec!["--production"];
        a.extend_from_slice(args);
        let s = Server::start_env(&app, &a, env);
        // The master reports n workers wanted and n ready; /proc agrees.
        let pids = s.wait_workers(*n);
        assert_eq!(
            worker_pids(s.pid()),
            pids,
            "{args:?} {env:?}:\n{}",
            s.log_text()
        );
    }
}

#[test]
fn invalid_worker_overrides_exit_2_naming_the_source() {
    let app = mlp();
    let cases: &[Case<&str>] = &[
        (&["--workers", "0"], &[], "--workers"),
        (&["--workers", "-2"], &[], "--workers"),
        (&["--workers", "many"], &[], "--workers"),
        (&[], &[("VRAMFORK_WORKERS", "0")], "VRAMFORK_WORKERS"),
        (&[], &[("VRAMFORK_WORKERS", "")], "VRAMFORK_WORKERS"),
        (
            &[],
            &[("CLAMS_GUNICORN_WORKERS", "x")],
            "CLAMS_GUNICORN_WORKERS",
        ),
        (
            &[],
            &[("CLAMS_GUNICORN_WORKERS", "-1")],
            "CLAMS_GUNICORN_WORKERS",
        ),
    ];
    for (args, env, name) in cases {
        let mut a = vec!["--production"];
        a.extend_from_slice(args);
        let mut s = Server::spawn(&app, &a, env);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(2), "{args:?} {env:?}: {}", s.log_text());
        let log = s.log_text();
        assert!(
            log.contains(name) && log.contains("app: "),
            "{args:?} {env:?}: {log}"
        );
        assert!(!log.contains("listening"), "bound before validating: {log}");
    }
}

/// A near-miss of a known metadata field (`est_gpu_mem_type`) would be silently ignored and
/// the app served on the CPU: it is refused before binding, naming the field it resembles.
#[test]
fn a_misspelt_metadata_field_exits_2_naming_the_field_it_resembles() {
    let app = App::new("mlp.pt", r#""est_gpu_mem_type": 4000"#);
    let mut s = Server::spawn(&app, &["--production"], &[]);
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(2), "{}", s.log_text());
    let log = s.log_text();
    assert!(
        log.contains("`est_gpu_mem_type`") && log.contains("rename it to `est_gpu_mem_typ`"),
        "{log}"
    );
    assert!(!log.contains("listening"), "bound before validating: {log}");
}

/// A model that is not TorchScript says how to make one; libtorch's own reason is kept.
#[test]
fn a_file_that_is_not_torchscript_says_how_to_export_one() {
    let app = App::new("not-a-model.pt", "");
    let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(3), "{}", s.log_text());
    let log = s.log_text();
    assert!(
        log.contains("not a TorchScript archive (PytorchStreamReader failed")
            && log.contains("torch.jit.trace or torch.jit.script"),
        "{log}"
    );
}

/// A worker binary the dynamic loader cannot start (a shared library it needs is
/// missing: exit 127, as with libtorch out of reach) is named as such, not as a model that
/// could not be loaded. The binary is a real one, linked here against a library then removed.
#[test]
fn a_worker_that_cannot_find_a_shared_library_is_named_as_such() {
    let app = mlp();
    let dir = app.dir.path();
    std::fs::write(dir.join("lib.c"), "int vf_gone(void) { return 0; }\n").unwrap();
    std::fs::write(
        dir.join("main.c"),
        "int vf_gone(void);\nint main(void) { return vf_gone(); }\n",
    )
    .unwrap();
    let cc = |args: &[&str]| {
        let out = std::process::Command::new("cc")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&["-shared", "-fPIC", "-o", "libvfgone.so", "lib.c"]);
    cc(&["-o", "worker", "main.c", "-L.", "-lvfgone"]);
    std::fs::remove_file(dir.join("libvfgone.so")).unwrap();
    let worker = dir.join("worker").display().to_string();
    let mut s = Server::spawn(
        &app,
        &["--production", "--workers", "1", "--worker-binary", &worker],
        &[],
    );
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(3), "{log}");
    // The loader's own line names the library; the master says what it means.
    assert!(log.contains("libvfgone.so"), "{log}");
    assert!(log.contains("the worker could not start"), "{log}");
    assert!(
        log.contains("a shared library it needs was not found"),
        "{log}"
    );
    assert!(!log.contains("the model could not be loaded"), "{log}");
}

/// A model calling a custom operator (`torchvision::nms`, as every torchvision
/// detection model does) needs the library that registers it. Without it the boot fails
/// naming the operator and `op_libraries`; with torchvision's `_C.so` alone, dlopen's
/// message gets the hint to list libpython first; with both, the model serves and answers
/// what torch answered when the fixture was made (`tests/fixtures/nms_expected.json`).
#[test]
fn op_libraries_load_custom_operators_before_the_model() {
    let libs = common::python_json("op_libraries.py", &[], b"");
    let vision = libs["torchvision_c"]
        .as_str()
        .expect("torchvision is installed by scripts/setup-torch");
    let libpython = libs["libpython"].as_str().unwrap_or_else(|| {
        panic!("no {} found for the venv's Python: install it (Debian: apt-get install libpython3.11; scripts/test does)", libs["libpython_name"])
    });
    let inputs = r#""inputs": [{"name": "boxes", "datatype": "FP32", "shape": [-1, 4]},
                               {"name": "scores", "datatype": "FP32", "shape": [-1]}]"#;

    // No library: the operator is named, and where to declare its library.
    let app = App::new("nms.pt", inputs);
    let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(3), "{}", s.log_text());
    let log = s.log_text();
    assert!(
        log.contains("Unknown builtin op: torchvision::nms"),
        "{log}"
    );
    assert!(
        log.contains("list the shared library that registers it in the metadata's op_libraries"),
        "{log}"
    );

    // torchvision's library alone wants Python's symbols: the hint says what to add.
    let app = App::new(
        "nms.pt",
        &format!(r#"{inputs}, "op_libraries": ["{vision}"]"#),
    );
    let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(3), "{}", s.log_text());
    let log = s.log_text();
    assert!(log.contains("(op_libraries[0] in the metadata)"), "{log}");
    assert!(
        log.contains("list Python's shared library (libpython3.X.so.1.0"),
        "{log}"
    );

    // Both, in order: served, through the template (forked workers inherit the libraries)
    // and by an exec'd worker (development mode).
    let app = App::new(
        "nms.pt",
        &format!(r#"{inputs}, "op_libraries": ["{libpython}", "{vision}"]"#),
    );
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("nms_expected.json")).unwrap(),
    )
    .unwrap();
    let body = serde_json::json!({"inputs": [
        {"name": "boxes", "datatype": "FP32", "shape": [5, 4],
         "data": expected["boxes"].as_array().unwrap().iter().flat_map(|b| b.as_array().unwrap().clone()).collect::<Vec<_>>()},
        {"name": "scores", "datatype": "FP32", "shape": [5], "data": expected["scores"]},
    ]})
    .to_string();
    for args in [&["--production", "--workers", "1"][..], &[][..]] {
        let s = Server::start(&app, args);
        let r = s.post("/v2/models/test%20app/infer", &body);
        assert_eq!(r.status, 200, "{args:?}: {r:?}\n{}", s.log_text());
        let out = &r.json()["outputs"][0];
        assert_eq!(out["datatype"], "INT64", "{out}");
        assert_eq!(out["data"], expected["keep"], "{args:?}: {out}");
    }
}

/// X-Request-Id is echoed on every answer — 200, 400, 404, 504 — and used as the
/// v2 `id` when the body gives none (the body's own `id` wins); an unusable one (spaces)
/// is replaced by a made one, never refused.
#[test]
fn request_ids_are_echoed_on_every_answer() {
    let app = App::new("slow.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--request-timeout", "0.5"],
    );
    s.wait_workers(1);
    let with = |id: &str| format!("X-Request-Id: {id}\r\n");
    let cases = [
        ("POST", "/", r#"{"inputs": [[1]]}"#, 200, "ok-1"),
        ("POST", "/", r#"{"inputs": [[1], [2, 3]]}"#, 400, "bad-2"),
        ("GET", "/nowhere", "", 404, "lost-3"),
        ("POST", "/", r#"{"inputs": [[100000000]]}"#, 504, "stuck-4"),
    ];
    for (method, path, body, status, id) in cases {
        let r = raw(s.port, method, path, &with(id), body.as_bytes());
        assert_eq!(
            r.status,
            status,
            "{method} {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("x-request-id"), Some(id), "{method} {path}");
    }
    s.wait_workers(1);
    let infer = "/v2/models/test%20app/infer";
    let v2 =
        r#"{"inputs": [{"name": "input__0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}"#;
    let r = raw(s.port, "POST", infer, &with("v2-5"), v2.as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["id"], "v2-5");
    let own = v2.replacen('{', r#"{"id": "body-6","#, 1);
    let r = raw(s.port, "POST", infer, &with("header-6"), own.as_bytes());
    assert_eq!(
        (r.json()["id"].clone(), r.header("x-request-id")),
        ("body-6".into(), Some("header-6"))
    );
    let r = raw(
        s.port,
        "POST",
        "/",
        &with("has space"),
        br#"{"inputs": [[1]]}"#,
    );
    let made = r.header("x-request-id").unwrap();
    assert!(
        made.len() == 32 && made.bytes().all(|c| c.is_ascii_hexdigit()),
        "{made}"
    );
}

/// The model thread's log lines carry the request id (the `request` span).
#[test]
fn the_model_threads_log_lines_carry_the_request_id() {
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[(
            "VRAMFORK_LOG",
            "info,vramfork::master=debug,app_worker::runner=debug",
        )],
    );
    s.wait_workers(1);
    let r = raw(
        s.port,
        "POST",
        "/",
        "X-Request-Id: traced-7\r\n",
        MLP_INPUT.as_bytes(),
    );
    assert_eq!(r.status, 200);
    let line = s.poll("the forward line of request traced-7", || {
        s.log_text()
            .lines()
            .find(|l| l.contains("\"forward\"") && l.contains("traced-7"))
            .map(str::to_string)
    });
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["span"]["request_id"], "traced-7", "{line}");
}

#[test]
fn port_in_use_exits_2() {
    let app = mlp();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut s = Server::spawn(&app, &["--production", "--port", &port], &[]);
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(2));
    assert!(s.log_text().contains("already in use"), "{}", s.log_text());
}

#[test]
fn unloadable_models_exit_3_after_bounded_tries() {
    for model in ["missing.pt", "not-a-model.pt"] {
        let app = App::new(model, "");
        let mut s = Server::spawn(&app, &["--production", "--workers", "2"], &[]);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(3), "{model}: {}", s.log_text());
        let log = s.log_text();
        assert!(log.contains("app: the model could not be loaded"), "{log}");
        assert!(
            log.contains(model),
            "the worker's reason names the file: {log}"
        );
        // Bounded: the master gives up after FIRST_BOOT_TRIES (3) failed boots; a fourth
        // may have been under way.
        let tries = s
            .events_named("worker_exited")
            .iter()
            .filter(|e| e.str("phase") == Some("booting") && e.i64("code") == Some(3))
            .count();
        assert!((3..=4).contains(&tries), "{tries} tries: {log}");
    }
}

#[test]
fn recycling_under_concurrent_load_fails_no_request() {
    let app = mlp();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--max-requests", "3"],
    );
    s.wait_workers(2);
    let results = load(s.port, 4, 15);
    let pids = assert_all_ok(&results);
    // 60 requests, at most 3 per worker: at least 20 workers served.
    assert!(
        pids.len() >= 20,
        "{} distinct workers: {pids:?}",
        pids.len()
    );
    let recycled = s
        .events_named("worker_exited")
        .iter()
        .filter(|e| {
            e.i64("code") == Some(0)
                && e.u64("served") == Some(3)
                && e.str("reason") == Some("max_requests")
        })
        .count();
    assert!(recycled >= 10, "{recycled} recycled:\n{}", s.log_text());
}

#[test]
fn max_requests_one_recycles_after_every_request() {
    let app = mlp();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--max-requests", "1"],
    );
    s.wait_workers(2);
    let results = load(s.port, 2, 10);
    let pids = assert_all_ok(&results);
    assert_eq!(pids.len(), 20, "every request had its own worker");
    let log = s.log_text();
    let template = s.events_named("template_ready");
    assert_eq!(template.len(), 1, "{log}");
    // The declared input shape gave the template a warm-up pass (and it stayed
    // single-threaded: every worker below is still forked from it).
    let warmup = template[0].f64("warmup_ms").unwrap_or_default();
    assert!(warmup > 0.0, "warm-up pass: {log}");
    let started = s.events_named("worker_started");
    assert!(started.len() >= 20, "{log}");
    assert!(
        started.iter().all(|e| e.str("method") == Some("fork")),
        "every worker forked from the template: {log}"
    );
    assert!(!log.contains("could not set torch"), "{log}");
    assert_no_failed_boot(&s);
}

/// A warm-up pass that fails on the declared shape used to leave the
/// template forking cold workers that answered 500 to every request of that shape; now the
/// start stops (exit 3), naming the shape and the model's message.
#[test]
fn a_failing_warm_up_pass_stops_the_start_naming_the_shape() {
    // The declared shape is not one the model takes (4 features): the warm-up pass raises.
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 5]}"#);
    let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(3), "{log}");
    for want in [
        "the warm-up pass on the declared input shapes (input__0 [1, 5]) failed",
        "mat1 and mat2 shapes cannot be multiplied",
    ] {
        assert!(log.contains(want), "missing {want:?} in:\n{log}");
    }
    assert!(s.events_named("worker_ready").is_empty(), "{log}");
}

/// No worker died (or was killed) before it was ready: a recycled worker is not a failed
/// boot.
fn assert_no_failed_boot(s: &Server) {
    let failed: Vec<_> = s
        .events_named("worker_exited")
        .into_iter()
        .filter(|e| e.str("phase") == Some("booting"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}:\n{}", s.log_text());
}

#[test]
fn a_killed_worker_is_replaced_and_no_other_request_fails() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    let before = s.wait_workers(2);
    let bg = Background::start(s.port, 2);
    bg.wait_answer(20, |_| true);
    // SAFETY: kill(2) on a worker of our child.
    unsafe { libc::kill(before[0] as i32, libc::SIGKILL) };
    let after = s.wait_workers_where(2, |p| !p.contains(&before[0]));
    // The replacement serves the clients too.
    bg.wait_answer(20, |p| !before.contains(&p) && after.contains(&p));
    let results = bg.finish();
    // Only a request the killed worker had in flight may fail (a reset connection).
    let failed: Vec<_> = results
        .iter()
        .filter(|r| !matches!(r, Ok((200, _))))
        .collect();
    assert!(failed.len() <= 1, "{failed:?}");
    assert!(results.len() > 40);
    let died = s.wait_event("worker_exited", |e| e.u64("pid") == Some(before[0].into()));
    assert_eq!(died.str("signal"), Some("SIGKILL"), "{died:?}");
    assert_eq!(died.level, "WARN");
}

#[test]
fn killing_the_master_takes_every_worker_down() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    // Workers, the template and its spare: every child must go with the master.
    let all = s.poll("the template and its spare", || {
        let kids = children(s.pid());
        let names: Vec<&str> = kids.iter().map(|(_, c)| c.as_str()).collect();
        (names.contains(&"vf-template") && names.contains(&"vf-spare"))
            .then(|| kids.into_iter().map(|(p, _)| p).collect::<Vec<u32>>())
    });
    assert_eq!(all.len(), 4, "{all:?}");
    s.signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    while all.iter().any(|p| process_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "workers outlived the master: {all:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn term_lets_in_flight_requests_finish_then_exits_0() {
    let app = App::new("slow.pt", "");
    let mut s = Server::start(&app, &["--production", "--workers", "2"]);
    let workers = s.wait_workers(2);
    let port = s.port;
    // ~4 s each (slow.pt: ~22 µs per iteration), so that a heartbeat (1 s) reports them.
    let slow: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(move || try_http(port, "POST", "/", Some(r#"{"inputs": [[200000]]}"#)))
        })
        .collect();
    // Both requests are in flight, as the workers' heartbeats say.
    s.wait_event("pool", |e| e.u64("in_flight") == Some(2));
    let mark = s.mark();
    s.signal(libc::SIGTERM);
    for h in slow {
        let r = h.join().unwrap().expect("in-flight request answered");
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Each worker was asked to stop with its request in flight, and finished it.
    for w in &workers {
        let (_, e) = s.wait_event_after(mark, "worker_retiring", |e| {
            e.u64("pid") == Some((*w).into())
        });
        assert_eq!(e.str("reason"), Some("asked"), "{e:?}");
        assert_eq!(e.u64("in_flight"), Some(1), "{e:?}");
    }
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(0), "{}", s.log_text());
    assert!(workers.iter().all(|p| !process_alive(*p)));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port still open"
    );
}

#[test]
fn quick_stop_exits_0_promptly() {
    let app = mlp();
    let mut s = Server::start(&app, &["--production", "--workers", "2"]);
    let workers = s.wait_workers(2);
    s.signal(libc::SIGINT);
    // Promptly: well within the graceful stop's 30 s.
    let st = s.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0));
    assert!(workers.iter().all(|p| !process_alive(*p)));
}

#[test]
fn hup_reloads_under_load_and_keeps_old_workers_on_bad_input() {
    let app = App::new("mlp.pt", r#""version": "1""#);
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    let first = s.wait_workers(2);
    let bg = Background::start(s.port, 2);
    bg.wait_answer(10, |_| true);
    app.write_metadata("mlp.pt", r#""version": "2""#);
    s.signal(libc::SIGHUP);
    s.wait_event("reload_complete", |_| true);
    let second = s.wait_workers_where(2, |p| p.iter().all(|p| !first.contains(p)));
    // The clients go on being served, by the new workers.
    bg.wait_answer(10, |p| second.contains(&p));
    let results = bg.finish();
    assert_all_ok(&results);
    for _ in 0..4 {
        assert_eq!(s.get("/").json()["version"], "2");
    }

    // Invalid metadata: refused, the same workers keep serving.
    let mark = s.mark();
    std::fs::write(app.metadata(), "{ not json").unwrap();
    s.signal(libc::SIGHUP);
    let (_, refused) = s.wait_event_after(mark, "reload_refused", |_| true);
    assert!(
        refused.str("error").unwrap().contains("not valid JSON"),
        "{refused:?}"
    );
    assert_eq!(s.wait_workers(2), second);

    // A model that does not load: the old workers stay.
    let mark = s.mark();
    app.write_metadata("not-a-model.pt", r#""version": "3""#);
    s.signal(libc::SIGHUP);
    s.wait_event_after(mark, "reload_failed", |_| true);
    // The reload ends by saying it went back, not that the new configuration runs.
    let (_, done) = s.wait_event_after(mark, "reload_complete", |_| true);
    assert_eq!(done.str("outcome"), Some("rolled_back"), "{done:?}");
    assert!(
        done.str("model").is_some_and(|m| m.ends_with("mlp.pt")),
        "{done:?}"
    );
    assert_eq!(s.wait_workers(2), second);
    let pids = assert_all_ok(&load(s.port, 2, 5));
    assert!(
        pids.iter().all(|p| second.contains(p)),
        "{pids:?} vs {second:?}"
    );
    assert_eq!(s.get("/").json()["version"], "2");
}

#[test]
fn ttin_and_ttou_add_and_remove_a_worker() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    s.signal(libc::SIGTTIN);
    s.wait_workers(2);
    s.signal(libc::SIGTTOU);
    let one = s.wait_workers(1);
    let mark = s.mark();
    s.signal(libc::SIGTTOU);
    let (_, refused) = s.wait_event_after(mark, "ttou_refused", |_| true);
    assert_eq!(refused.u64("workers"), Some(1), "{refused:?}");
    assert_eq!(s.wait_workers(1), one);
    assert_eq!(worker_pids(s.pid()), one);
    assert_eq!(s.post("/", MLP_INPUT).status, 200);
}

/// USR1 (gunicorn's "reopen logs", which log rotation sends) and USR2 (its binary
/// upgrade) would end the master by their default action; they are acknowledged and the
/// server goes on serving with the same workers.
#[test]
fn usr1_and_usr2_are_acknowledged_not_fatal() {
    let app = mlp();
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let one = s.wait_workers(1);
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        let mark = s.mark();
        s.signal(sig);
        let (_, e) = s.wait_event_after(mark, "signal_ignored", |_| true);
        assert_eq!(e.level, "WARN", "{e:?}");
        // `systemctl kill -s USR1` reaches every process of the service: workers too.
        // SAFETY: kill(2) of this test's own server's worker.
        assert_eq!(unsafe { libc::kill(one[0] as i32, sig) }, 0);
    }
    let r = s.post("/", MLP_INPUT);
    assert_eq!(
        (r.status, r.pid()),
        (200, one[0]),
        "the same worker answers"
    );
    assert_eq!(s.wait_workers(1), one);
}

#[test]
fn a_request_past_the_timeout_gets_504_and_its_worker_is_replaced() {
    let app = App::new("slow.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--request-timeout", "0.5"],
    );
    let first = s.wait_workers(1);
    let r = s.post("/", r#"{"inputs": [[100000000]]}"#);
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("request-timeout"),
        "{r:?}"
    );
    let now = replaced(&s, first[0], "request_timeout");
    let r = s.post("/", r#"{"inputs": [[1]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.pid(), now);
}

#[test]
fn development_mode_serves_in_one_process() {
    let app = mlp();
    let s = Server::start(&app, &[]);
    // The worker itself (no master in development mode) reports that it is ready.
    s.poll("the worker's ready event", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "ready" && e.target.starts_with("app_worker"))
    });
    let r = s.post("/", MLP_INPUT);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.pid(),
        s.pid(),
        "development mode serves from the app process itself"
    );
    assert!(worker_pids(s.pid()).is_empty());
}

#[test]
fn plan_prints_the_cpu_bound_and_exits_0() {
    let app = mlp();
    let mut s = Server::spawn(&app, &["plan", "--json"], &[]);
    let st = s.wait_exit(PATIENCE);
    assert_eq!(st.code(), Some(0));
    let log = s.log_text();
    let start = log.find('{').unwrap();
    let plan: serde_json::Value = serde_json::Deserializer::from_str(&log[start..])
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    let cpus = plan["cpus"].as_u64().unwrap();
    assert_eq!(plan["cpu_bound"].as_u64(), Some(2 * cpus + 1));
    assert_eq!(plan["workers"].as_u64(), Some(2 * cpus + 1));
    let mut s = Server::spawn(&app, &["plan", "--workers", "3"], &[]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0));
    assert!(s.log_text().contains("--workers"), "{}", s.log_text());
}

#[test]
fn cuda_out_of_memory_answers_507_and_the_worker_is_replaced() {
    // oom.pt raises PyTorch's CUDA out-of-memory message (this machine has no GPU): the
    // worker must answer 507 with a JSON error, then recycle itself; the next request is
    // served by its replacement.
    let app = App::new("oom.pt", "");
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let first = s.wait_workers(1);
    let r = s.post("/", r#"{"inputs": [[1.0]]}"#);
    assert_eq!(r.status, 507, "{r:?}");
    assert_eq!(r.pid(), first[0]);
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("CUDA out of memory"), "{msg}");
    let now = replaced(&s, first[0], "out_of_memory");
    let r = s.post("/", r#"{"inputs": [[-1.0]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.pid(),
        now,
        "the worker that ran out of memory kept serving"
    );
}

#[test]
fn a_worker_silent_past_the_timeout_is_killed_and_replaced() {
    let app = mlp();
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--timeout", "1.5"],
    );
    let first = s.wait_workers(1);
    // SAFETY: kill(2) on a worker of our child; it stops sending heartbeats.
    unsafe { libc::kill(first[0] as i32, libc::SIGSTOP) };
    let pid = Some(u64::from(first[0]));
    let killed = s.wait_event("worker_killed", |e| e.u64("pid") == pid);
    assert_eq!(killed.str("why"), Some("heartbeat"), "{killed:?}");
    let exited = s.wait_event("worker_exited", |e| e.u64("pid") == pid);
    assert_eq!(exited.str("killed"), Some("heartbeat"), "{exited:?}");
    assert!(!process_alive(first[0]));
    let now = s.wait_workers_where(1, |p| p != first);
    let r = s.post("/", MLP_INPUT);
    assert_eq!(r.status, 200);
    assert_eq!(r.pid(), now[0]);
}

#[test]
fn recycling_fails_no_request_of_keep_alive_clients() {
    let app = mlp();
    let s = Server::start(
        &app,
        &["--production", "--workers", "2", "--max-requests", "10"],
    );
    s.wait_workers(2);
    let port = s.port;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            thread::spawn(move || {
                let mut c = KeepAlive::new(port);
                (0..60)
                    .map(|_| {
                        c.post("/", MLP_INPUT)
                            .map(|r| (r.status, r.pid()))
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<Outcome> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let pids = assert_all_ok(&results);
    assert!(
        pids.len() >= 24,
        "240 requests, 10 per worker: {} workers",
        pids.len()
    );
    assert_no_failed_boot(&s);
}

#[test]
fn a_client_leaving_during_the_last_allowed_request_does_not_wedge_the_worker() {
    let app = App::new("slow.pt", "");
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--max-requests", "1"],
    );
    let first = s.wait_workers(1);
    let pid = Some(u64::from(first[0]));
    {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let body = r#"{"inputs": [[20000]]}"#;
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        std::io::Write::write_all(&mut c, req.as_bytes()).unwrap();
        // The worker took it as its last request (and retired at once).
        let e = s.wait_event("worker_retiring", |e| e.u64("pid") == pid);
        assert_eq!(e.str("reason"), Some("max_requests"), "{e:?}");
    } // the client gives up mid-request
      // The worker still exits, and its replacement serves.
    let exited = s.wait_event("worker_exited", |e| e.u64("pid") == pid);
    assert_eq!(exited.i64("code"), Some(0), "{exited:?}");
    let now = s.wait_workers_where(1, |p| p != first);
    let r = s.post("/", r#"{"inputs": [[1]]}"#);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.pid(), now[0]);
}
