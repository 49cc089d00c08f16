//! Helpers the `.pt2` tests share (`tests/pt2.rs`, `tests/aoti.rs`): answers compared
//! within 1e-5, the MLP fixture's cases, batch counts, a worker's model-thread team, forked
//! workers answering on teams of two threads, and a boot that must be refused.

use serde_json::{json, Value};

use super::*;

/// Two JSON values of numbers equal within 1e-5 (absolute): one format's answer against
/// another's.
pub fn within_1e5(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| within_1e5(p, q))
        }
        (p, q) => match (p.as_f64(), q.as_f64()) {
            (Some(p), Some(q)) => (p - q).abs() <= 1e-5,
            _ => false,
        },
    }
}

pub fn fixture_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub const MLP_INPUT_DECL: &str = r#""input": {"shape": [-1, 4], "dtype": "float32"}"#;

/// The `POST /` outputs of `s` for each of mlp_expected.json's cases.
pub fn mlp_answers(s: &Server) -> Vec<Value> {
    let cases = fixture_json("mlp_expected.json")["cases"].clone();
    cases
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let r = s.post("/", &json!({"inputs": case["inputs"]}).to_string());
            assert_eq!(r.status, 200, "{case}: {r:?}\n{}", s.log_text());
            r.json()["outputs"].clone()
        })
        .collect()
}

/// `vramfork_batches_total` samples of a `/metrics` scrape with a `size` label above 1.
pub fn multi_row_passes(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("vramfork_batches_total{"))
        .filter(|l| !l.contains("size=\"1\""))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// The worker's OS threads named `name` (`/proc/<pid>/task/*/comm`): libgomp's helpers for
/// the model thread's team are clones of it and carry its name, `vf-model`.
pub fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
            comm.unwrap_or_default().trim() == name
        })
        .count()
}

/// A `POST /` body of `rows` rows of 64 numbers.
pub fn rows64(rows: usize) -> String {
    let row: Vec<String> = (0..64).map(|i| format!("{:.3}", i as f64 / 64.0)).collect();
    let row = format!("[{}]", row.join(","));
    format!("{{\"inputs\": [{}]}}", vec![row; rows].join(","))
}

/// Starts `app ARGS` on `model` with the metadata fields `extra`, expecting it to refuse:
/// exit 3, the log naming every one of `want`.
pub fn refused(model: &str, extra: &str, want: &[&str]) {
    let app = App::new(model, extra);
    for args in [&["--production", "--workers", "1"][..], &[][..]] {
        let mut s = Server::spawn(&app, args, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(3), "{model} {args:?}: {log}");
        for w in want {
            assert!(log.contains(w), "{model} {args:?}: no {w:?} in\n{log}");
        }
    }
}

/// Two workers forked from the template with `--torch-threads 2` each answer a request of
/// `small` rows and one of 512 (the latter on an OpenMP team), and each worker's model
/// thread has its team of two: a forked child never inherits a team that did not survive
/// the fork (the template runs no multi-threaded pass before it forks).
pub fn forked_workers_answer_on_teams_of_two(app: &App, small: usize) {
    let s = Server::start(
        app,
        &["--production", "--workers", "2", "--torch-threads", "2"],
    );
    let pids = s.wait_workers(2);
    let methods: Vec<String> = s
        .events_named("worker_started")
        .iter()
        .map(|e| e.str("method").unwrap_or_default().to_string())
        .collect();
    assert!(
        methods.iter().all(|m| m == "fork"),
        "workers should be forked from the template: {methods:?}\n{}",
        s.log_text()
    );
    let bodies = [rows64(small), rows64(512)];
    let mut served = std::collections::BTreeSet::new();
    let server = &s;
    s.poll("every worker to answer both request sizes", || {
        let answers: Vec<(usize, Response)> = std::thread::scope(|sc| {
            let sent: Vec<_> = (0..2)
                .flat_map(|_| 0..bodies.len())
                .map(|k| {
                    let b = &bodies[k];
                    (k, sc.spawn(move || server.post("/", b)))
                })
                .collect();
            sent.into_iter()
                .map(|(k, h)| (k, h.join().unwrap()))
                .collect()
        });
        for (k, r) in answers {
            assert_eq!(r.status, 200, "{}", r.body);
            let rows = r.json()["outputs"].as_array().map(Vec::len);
            assert_eq!(rows, Some(if k == 0 { small } else { 512 }), "{}", r.body);
            served.insert((r.pid(), k));
        }
        pids.iter()
            .all(|p| served.contains(&(*p, 0)) && served.contains(&(*p, 1)))
            .then_some(())
    });
    for pid in pids {
        assert_eq!(
            threads_named(pid, "vf-model"),
            2,
            "worker {pid}: its model thread's team\n{}",
            s.log_text()
        );
    }
}

/// The MLP fixture's first four cases (`mlp_expected.json`), one row each, sent to `port` at
/// once (so that a batching worker can stack them): each answer equals torch's within 1e-5.
pub fn four_mlp_rows_at_once(port: u16) {
    let rows: Vec<(Value, Value)> = fixture_json("mlp_expected.json")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| {
            let ins = c["inputs"].as_array().unwrap().clone();
            let outs = c["outputs"].as_array().unwrap().clone();
            ins.into_iter().zip(outs)
        })
        .take(4)
        .collect();
    let sent: Vec<_> = rows
        .iter()
        .map(|(input, _)| {
            let body = json!({ "inputs": [input] }).to_string();
            std::thread::spawn(move || http(port, "POST", "/", Some(&body)))
        })
        .collect();
    for (h, (input, want)) in sent.into_iter().zip(&rows) {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{input}: {r:?}");
        let got = &r.json()["outputs"][0];
        assert!(within_1e5(got, want), "{input}: {got} vs torch's {want}");
    }
}
