//! What a `/v1/embeddings` body may cost a worker: the body is read in one streaming pass
//! that keeps at most 2,048 inputs (and no token ids for a model that takes text only), so
//! a worker holds a bounded multiple of the body while it is read — the one docs/security.md
//! states, read from there — and never a tree of the whole body. Real `app` servers with
//! two workers serving the BERT encoder of `tests/support/make_embeddings.py`, each sent
//! the three ~57 MB bodies of the reliability probe (30 million token ids in one flat
//! array for a model whose `token_ids` is off; 15 million one-character strings; 15
//! million one-id rows), one at a time and eight at once beside a good client.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{made_once, App, Server};
use serde_json::json;

/// What the bodies weigh, about: under the default `--max-body-mb` (64 MiB).
const BODY_BYTES: usize = 57_000_000;

/// The multiple of a body a worker's peak memory may grow by while it is read, as
/// docs/security.md states it ("… at most N× its body …").
fn documented_multiple() -> f64 {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/security.md"))
            .unwrap();
    let at = doc
        .find("a worker's peak memory grows by at most ")
        .expect("docs/security.md states the multiple for /v1/embeddings bodies");
    let rest = &doc[at + "a worker's peak memory grows by at most ".len()..];
    let n: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse().expect("a number before `×`")
}

/// A server of two workers serving the encoder behind a text input, `token_ids` off, with
/// `args`.
fn serve(args: &[&str]) -> (Server, App) {
    let art = made_once("make_embeddings.py", &["wordpiece.py"], "embeddings");
    let app = App {
        dir: tempfile::tempdir().unwrap(),
    };
    for f in std::fs::read_dir(&art).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, app.dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let metadata = json!({
        "name": "emb",
        "model": "bert.pt",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": 24, "truncation": true}}],
        "embeddings": {"pooling": "cls"},
    });
    std::fs::write(app.metadata(), serde_json::to_vec(&metadata).unwrap()).unwrap();
    let mut all = vec!["--production", "--workers", "2", "--torch-threads", "1"];
    all.extend_from_slice(args);
    let s = Server::start(&app, &all);
    s.wait_workers(2);
    (s, app)
}

/// `{"model":"emb","input":[ITEM,ITEM,…]}` of about [`BODY_BYTES`].
fn body(item: &str) -> Arc<Vec<u8>> {
    let n = BODY_BYTES / (item.len() + 1);
    let mut b = Vec::with_capacity(BODY_BYTES + 64);
    b.extend_from_slice(br#"{"model":"emb","input":["#);
    for i in 0..n {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(item.as_bytes());
    }
    b.extend_from_slice(b"]}");
    Arc::new(b)
}

/// The three bodies: flat ids, one-character strings, one-id rows.
fn bodies() -> Vec<(&'static str, Arc<Vec<u8>>)> {
    vec![
        ("flat ids", body("7")),
        ("strings", body("\"a\"")),
        ("rows", body("[7]")),
    ]
}

/// POSTs `body` on a new connection; the status (0 when the connection failed).
fn post(port: u16, body: &[u8]) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, "no connection".into());
    };
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let head = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
        return (0, "the connection broke while sending".into());
    }
    let mut all = Vec::new();
    if s.read_to_end(&mut all).is_err() {
        return (0, "the connection broke while reading".into());
    }
    match common::parse_raw(&all) {
        Ok((status, _, b)) => (status, String::from_utf8_lossy(b).into_owned()),
        Err(e) => (0, format!("no answer: {e}")),
    }
}

fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the peak of each worker (`clear_refs` 5) and returns their resident sizes now.
fn reset_peaks(pids: &[u32]) -> Vec<u64> {
    pids.iter()
        .map(|p| {
            std::fs::write(format!("/proc/{p}/clear_refs"), "5").unwrap();
            status_kb(*p, "VmRSS:")
        })
        .collect()
}

/// How much the workers' peaks grew since `base`, in bytes, all added up.
fn growth(pids: &[u32], base: &[u64]) -> f64 {
    let kb: u64 = pids
        .iter()
        .zip(base)
        .map(|(p, b)| status_kb(*p, "VmHWM:").saturating_sub(*b))
        .sum();
    kb as f64 * 1024.0
}

#[test]
fn each_57_mb_body_is_refused_within_the_documented_multiple_of_its_size() {
    let multiple = documented_multiple();
    let (s, _app) = serve(&[]);
    let pids = s.wait_workers(2);
    for (what, b) in bodies() {
        let base = reset_peaks(&pids);
        let (status, answer) = post(s.port, &b);
        let grew = growth(&pids, &base);
        assert_eq!(status, 400, "{what}: {answer}");
        let times = grew / b.len() as f64;
        eprintln!(
            "{what}: {} bytes, the workers' peak grew {times:.2}×",
            b.len()
        );
        assert!(
            times <= multiple,
            "{what}: the workers' peak grew by {:.0} MB, {times:.1}× the body's {} MB (at most {multiple}×)",
            grew / 1e6,
            b.len() / 1_000_000
        );
    }
    assert_eq!(s.wait_workers(2), pids, "the same workers serve");
}

#[test]
fn eight_57_mb_bodies_at_once_leave_both_workers_alive_and_a_good_client_served() {
    let multiple = documented_multiple();
    // The good client's request waits for a worker as long as it takes: each worker reads
    // the bodies it has taken first (seconds each in a debug build), and a 503 for the wait
    // would say nothing about memory.
    let (s, _app) = serve(&["--max-queue-wait", "0"]);
    let pids = s.wait_workers(2);
    let kinds = bodies();
    let base = reset_peaks(&pids);
    let port = s.port;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let good = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let one = json!({"model": "emb", "input": "a good client's sentence"}).to_string();
            let mut answers = Vec::new();
            loop {
                answers.push(post(port, one.as_bytes()));
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return answers;
                }
            }
        })
    };
    let bad: Vec<_> = (0..8)
        .map(|i| {
            let (what, b) = kinds[i % kinds.len()].clone();
            std::thread::spawn(move || (what, post(port, &b)))
        })
        .collect();
    let mut sent = 0;
    for t in bad {
        let (what, (status, answer)) = t.join().unwrap();
        assert_eq!(status, 400, "{what}: {answer}");
        sent += kinds.iter().find(|k| k.0 == what).unwrap().1.len();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers = good.join().unwrap();
    for (status, answer) in &answers {
        assert_eq!(*status, 200, "the good client: {answer}");
    }
    let grew = growth(&pids, &base);
    eprintln!(
        "eight bodies, {} MB: the workers' peaks grew {:.0} MB; the good client had {} answers",
        sent / 1_000_000,
        grew / 1e6,
        answers.len()
    );
    assert!(
        grew <= multiple * sent as f64,
        "the workers' peaks grew by {:.0} MB for {} MB of bodies (at most {multiple}×)",
        grew / 1e6,
        sent / 1_000_000
    );
    assert_eq!(s.wait_workers(2), pids, "the same workers serve");
    assert!(
        s.events_named("worker_oom_killed").is_empty(),
        "{}",
        s.log_text()
    );
}
