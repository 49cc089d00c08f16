//! Process tests that keep real models at their own speed inside a worker: no page faults
//! per forward pass for buffers the model allocates each time (the heap keeps them,
//! `worker/src/heap.rs`), and a template that still forks when the model holds hundreds of
//! MB of weights (loading with libtorch's default thread count starts threads).

mod common;

use common::*;

/// Minor page faults of a process so far (`/proc/<pid>/stat`, field 10).
fn minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(7).unwrap().parse().unwrap()
}

/// alloc.pt allocates (and fills) a 16 MB tensor on every pass. Once warm, a pass must not
/// fault its pages in again: 16 MB mapped afresh is 4,096 faults a pass. Judged on the
/// median pass, since the kernel may also reclaim idle pages on its own (this build machine
/// runs DAMON's proactive pageout), which shows as an occasional pass that faults.
#[test]
fn a_buffer_allocated_every_pass_does_not_fault_every_pass() {
    let app = App::new("alloc.pt", r#""input": {"shape": [1, 1]}"#);
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let mut per_pass: Vec<u64> = (0..45)
        .map(|_| {
            let f0 = minor_faults(pid);
            let r = s.post("/", r#"{"inputs": [[16]]}"#);
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.pid(), pid);
            minor_faults(pid) - f0
        })
        .skip(5)
        .collect();
    per_pass.sort_unstable();
    let median = per_pass[per_pass.len() / 2];
    eprintln!("minor faults per request, sorted: {per_pass:?}");
    assert!(
        median < 1024,
        "the median pass faults {median} pages: the model's 16 MB buffer is mapped afresh each time ({per_pass:?})"
    );
}

/// A model with 300 MB of weights still loads in a single-threaded template, so workers
/// are forked from it (sharing the weights) rather than each started by exec.
#[test]
fn a_model_with_hundreds_of_mb_of_weights_gets_a_forking_template() {
    let app = App::new("mlp.pt", "");
    let model = app.dir.path().join("large.pt");
    let made = python_json(
        "make_large_model.py",
        &[model.to_str().unwrap(), "300"],
        b"",
    );
    assert!(made["bytes"].as_u64().unwrap() > 300 << 20, "{made}");
    let meta = app.metadata();
    std::fs::write(
        &meta,
        format!(
            r#"{{"name": "large", "model": "{}", "input": {{"shape": [-1, 4]}}}}"#,
            model.display()
        ),
    )
    .unwrap();
    let s = Server::start(&app, &["--production", "--workers", "2"]);
    s.wait_workers(2);
    let started = s.events_named("worker_started");
    let methods: Vec<&str> = started.iter().filter_map(|e| e.str("method")).collect();
    assert!(
        !methods.is_empty() && methods.iter().all(|m| *m == "fork"),
        "workers were started by {methods:?}, not forked from the template:\n{}",
        s.log_text()
    );
    let r = s.post("/", r#"{"inputs": [[1.0, 2.0, 3.0, 4.0]]}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["outputs"],
        serde_json::json!([[1.5, 2.5, 3.5, 4.5]])
    );
}
