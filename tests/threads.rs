//! Torch's intra-op threads where the passes run. libtorch keeps its intra-op
//! setting per thread (OpenMP's team size and MKL's thread count are the calling thread's),
//! so `--torch-threads` must be applied on the model thread itself: set on the worker's main
//! thread only, a plain MLP's matrix products ran on OpenMP teams of one thread per core and
//! served 50–100× slower at two or more clients. Every OpenMP helper thread libgomp starts
//! for the model thread's team is a clone of it and carries its name, so the team a worker
//! really runs is visible as its threads named `vf-model`.
//!
//! The model is built on the spot, not a fixture: the MLP of another project's benchmark the
//! regression was found with (`tests/support/make_shapes.py mlp256`), asked one row (MKL's
//! matrix product starts the team) and 512 rows (then ATen's own `parallel_for` does too).

mod common;

use std::collections::BTreeMap;

use common::{python_json, App, Server};

/// The worker's OS threads, counted by name (`/proc/<pid>/task/*/comm`).
fn threads(pid: u32) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let comm = std::fs::read_to_string(task.unwrap().path().join("comm")).unwrap_or_default();
        *out.entry(comm.trim().to_string()).or_insert(0) += 1;
    }
    out
}

/// The MLP in a fresh directory, its metadata as `app-metadata.json`.
fn mlp256() -> App {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    python_json("make_shapes.py", &[out, "mlp256"], b"");
    std::fs::rename(
        dir.path().join("mlp256.json"),
        dir.path().join("app-metadata.json"),
    )
    .unwrap();
    App { dir }
}

/// A `POST /` body of `rows` rows of 64 numbers.
fn body(rows: usize) -> String {
    let row: Vec<String> = (0..64).map(|i| format!("{:.3}", i as f64 / 64.0)).collect();
    let row = format!("[{}]", row.join(","));
    format!("{{\"inputs\": [{}]}}", vec![row; rows].join(","))
}

/// Sends one-row and 512-row requests, two at a time, until every worker in `pids` has
/// answered both kinds; every answer must be 200.
fn serve_on_every_worker(s: &Server, pids: &[u32]) {
    let bodies = [body(1), body(512)];
    let mut served: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    s.poll("every worker to answer both request sizes", || {
        let answers: Vec<(usize, common::Response)> = std::thread::scope(|sc| {
            let sent: Vec<_> = (0..2)
                .flat_map(|_| 0..bodies.len())
                .map(|k| {
                    let b = &bodies[k];
                    (k, sc.spawn(move || s.post("/", b)))
                })
                .collect();
            sent.into_iter()
                .map(|(k, h)| (k, h.join().unwrap()))
                .collect()
        });
        for (k, r) in answers {
            assert_eq!(r.status, 200, "{}", r.body);
            *served.entry((r.pid(), k)).or_insert(0) += 1;
        }
        pids.iter()
            .all(|p| (0..bodies.len()).all(|k| served.contains_key(&(*p, k))))
            .then_some(())
    });
}

/// `pid`'s threads are its main thread (the event loop, `vf-worker-N`: with one torch thread
/// exactly one, so that the passes run there (`runner/inline.rs`) started no OpenMP team of
/// its own, whose threads would carry its name; with `n` > 1, where no pass runs there, an
/// exec'd worker also has `n` - 1 idle threads of the same name, started when its main thread
/// sets libtorch's count (`at::set_num_threads` sizes caffe2's pthreadpool too)), the model
/// thread's team of `n`
/// (`vf-model`), its log writer (`vf-log`), the watchdog of passes on the event loop
/// (`vf-watch`, with one thread only), a server without a master's watch of the process
/// that started it (`vf-parent`, one, `parent_watch.rs`) and, at most, the event loop's
/// blocking threads (`vf-http`, which parse large bodies).
fn assert_team(pid: u32, n: usize, what: &str, s: &Server) {
    let t = threads(pid);
    let model = t.get("vf-model").copied().unwrap_or(0);
    let others: Vec<_> = t
        .keys()
        .filter(|k| {
            !matches!(
                k.as_str(),
                "vf-model" | "vf-http" | "vf-log" | "vf-watch" | "vf-parent"
            ) && !k.starts_with("vf-worker-")
        })
        .collect();
    let main: usize = t
        .iter()
        .filter(|(k, _)| k.starts_with("vf-worker-"))
        .map(|(_, c)| c)
        .sum();
    let watch = t.get("vf-watch").copied().unwrap_or(0);
    let parent = t.get("vf-parent").copied().unwrap_or(0);
    assert!(
        model == n
            && others.is_empty()
            && parent <= 1
            && (main == 1 || (n > 1 && main <= n))
            && watch <= usize::from(n == 1),
        "{what}: worker {pid} should run its passes on {n} thread(s) named vf-model beside its \
         main thread (and vf-http blocking threads), but has {t:?}\n{}",
        s.log_text()
    );
}

#[test]
fn torch_threads_reach_the_model_thread_of_forked_and_execd_workers() {
    let app = mlp256();
    // 3 on a 2-core machine too: libtorch's default is one per core, so 1 and 3 both differ
    // from what an unset model thread would run with on any machine of 2 cores.
    for n in [1usize, 2, 3] {
        let t = n.to_string();
        let s = Server::start(
            &app,
            &["--production", "--workers", "2", "--torch-threads", &t],
        );
        let pids = s.wait_workers(2);
        let methods: Vec<_> = s
            .events_named("worker_started")
            .iter()
            .map(|e| e.str("method").unwrap_or_default().to_string())
            .collect();
        assert!(
            methods.iter().all(|m| m == "fork"),
            "workers should be forked from the template: {methods:?}\n{}",
            s.log_text()
        );
        serve_on_every_worker(&s, &pids);
        for pid in pids {
            assert_team(pid, n, &format!("forked, --torch-threads {n}"), &s);
        }
        drop(s);

        // Development mode: the one worker is exec'd and loads the model itself.
        let s = Server::start(&app, &["--torch-threads", &t]);
        serve_on_every_worker(&s, &[s.pid()]);
        assert_team(s.pid(), n, &format!("exec'd, --torch-threads {n}"), &s);
    }
}

#[test]
fn the_operators_omp_num_threads_is_the_default_and_the_flag_beats_it() {
    let app = mlp256();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "2"],
        &[("OMP_NUM_THREADS", "3")],
    );
    let pids = s.wait_workers(2);
    serve_on_every_worker(&s, &pids);
    for pid in pids {
        assert_team(pid, 3, "OMP_NUM_THREADS=3", &s);
    }
    drop(s);
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "2", "--torch-threads", "1"],
        &[("OMP_NUM_THREADS", "3"), ("MKL_NUM_THREADS", "3")],
    );
    let pids = s.wait_workers(2);
    serve_on_every_worker(&s, &pids);
    for pid in pids {
        assert_team(pid, 1, "--torch-threads 1 over OMP_NUM_THREADS=3", &s);
    }
}
