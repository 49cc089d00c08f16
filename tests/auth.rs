//! Token auth: `--api-key-file` on the serving port and `--metrics-api-key-file`
//! on the metrics port, end to end with the real `app`: 401 + `WWW-Authenticate` before the
//! body is read, the health checks open, NVIDIA's client through its `headers=`, refusals
//! counted by reason, keys re-read on HUP, never logged; bad key files refused at start.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{raw, App, Server, PATIENCE};

const K1: &str = "k1-aaaaaaaaaaaaaaaaaaaaaaaa";
const K2: &str = "k2-bbbbbbbbbbbbbbbbbbbbbbbb";
const K3: &str = "k3-cccccccccccccccccccccccc";
const INPUT: &str = r#"{"inputs": [[1, 2, 3, 4]]}"#;

fn bearer(k: &str) -> String {
    format!("Authorization: Bearer {k}\r\n")
}

fn key_file(app: &App, name: &str, text: &str) -> String {
    let p = app.dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn metrics_port(s: &Server) -> u16 {
    let e = s.wait_event("metrics_listening", |_| true);
    e.str("addr")
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_serving_port_requires_a_key_but_its_health_checks_do_not() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "keys", &format!("# two keys\n{K1}\n\n{K2}\n"));
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--api-key-file",
            &keys,
            "--metrics-port",
            "0",
        ],
    );
    s.wait_workers(1);
    let infer = "/v2/models/test%20app/infer";
    let v2 = r#"{"inputs": [{"name": "input__0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}"#;
    for (method, path, body) in [
        ("POST", "/", INPUT),
        ("GET", "/", ""),
        ("POST", infer, v2),
        ("GET", "/v2", ""),
    ] {
        let r = raw(s.port, method, path, "", body.as_bytes());
        assert_eq!(r.status, 401, "{method} {path}");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"vramfork\"")
        );
        assert!(r.json()["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"));
        for k in [K1, K2] {
            let r = raw(s.port, method, path, &bearer(k), body.as_bytes());
            assert_eq!(r.status, 200, "{method} {path} with a key");
        }
    }
    let wrong = raw(s.port, "POST", "/", &bearer(K3), INPUT.as_bytes());
    assert_eq!(
        (wrong.status, wrong.header("www-authenticate")),
        (
            401,
            Some("Bearer realm=\"vramfork\", error=\"invalid_token\"")
        )
    );
    let basic = raw(
        s.port,
        "POST",
        "/",
        "Authorization: Basic dXNlcjpwdw==\r\n",
        INPUT.as_bytes(),
    );
    assert_eq!(
        (basic.status, basic.header("www-authenticate")),
        (
            401,
            Some("Bearer realm=\"vramfork\", error=\"invalid_request\"")
        )
    );
    for path in ["/healthz", "/v2/health/live", "/v2/health/ready"] {
        assert_eq!(raw(s.port, "GET", path, "", b"").status, 200, "{path}");
    }
    // Refusals counted by reason, on the serving port.
    let m = metrics_port(&s);
    let text = s.poll("the refusals in /metrics", || {
        let t = common::http(m, "GET", "/metrics", None).body;
        t.contains(r#"vramfork_auth_failures_total{port="serving",reason="malformed"} 1"#)
            .then_some(t)
    });
    assert!(
        text.contains(r#"vramfork_auth_failures_total{port="serving",reason="missing"} 4"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vramfork_auth_failures_total{port="serving",reason="invalid"} 1"#),
        "{text}"
    );
    // No key reaches the log.
    let log = s.log_text();
    assert!(!log.contains(K1) && !log.contains(K2) && !log.contains(K3));
}

/// A refused request's body is never read: the 401 comes while the client has sent only
/// its head (with a body of 10 MB announced), and the connection closes.
#[test]
fn a_refusal_comes_before_the_body() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "keys", &format!("{K1}\n"));
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--api-key-file", &keys],
    );
    s.wait_workers(1);
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    // A guard against a hang: far shorter than the 30 s the server would give a body.
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(
        c,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got)
        .expect("the answer, without the body being sent");
    let (status, headers, _) = common::parse_raw(&got).unwrap();
    assert_eq!(status, 401);
    assert!(headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("connection") && v == "close"));
}

/// NVIDIA's client carries the key with its `headers=` argument; its health check needs none.
#[test]
fn tritonclient_sends_the_key_with_its_headers() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "keys", &format!("{K1}\n"));
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--api-key-file", &keys],
    );
    s.wait_workers(1);
    let url = format!("127.0.0.1:{}", s.port);
    let ok = common::python_json("triton_auth.py", &[&url, "test app", K1], b"");
    assert_eq!(
        (ok["ready"].clone(), ok["ok"].clone()),
        (true.into(), true.into()),
        "{ok}"
    );
    let refused = common::python_json("triton_auth.py", &[&url, "test app", ""], b"");
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["status"], "401", "{refused}");
}

/// New keys are rolled out with a HUP: the workers that replace the old ones read the file.
#[test]
fn keys_are_read_again_on_hup() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "keys", &format!("{K1}\n"));
    let s = Server::start(
        &app,
        &["--production", "--workers", "1", "--api-key-file", &keys],
    );
    s.wait_workers(1);
    assert_eq!(
        raw(s.port, "POST", "/", &bearer(K1), INPUT.as_bytes()).status,
        200
    );
    key_file(&app, "keys", &format!("{K2}\n"));
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    s.wait_event_after(mark, "reload_complete", |_| true);
    assert_eq!(
        raw(s.port, "POST", "/", &bearer(K1), INPUT.as_bytes()).status,
        401
    );
    assert_eq!(
        raw(s.port, "POST", "/", &bearer(K2), INPUT.as_bytes()).status,
        200
    );
    // A file that no longer holds a usable key is refused, and the old keys stay.
    key_file(&app, "keys", "short\n");
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    let (_, e) = s.wait_event_after(mark, "reload_refused", |_| true);
    let why = e.str("error").unwrap();
    assert!(
        why.contains("--api-key-file") && why.contains("line 1"),
        "{why}"
    );
    assert!(
        !why.contains("short"),
        "the key itself is never told: {why}"
    );
    assert_eq!(
        raw(s.port, "POST", "/", &bearer(K2), INPUT.as_bytes()).status,
        200
    );
}

/// A key file emptied, then replaced by a FIFO, with no HUP: the workers that
/// recycling starts afterwards serve with the keys the master last accepted, so every
/// request is answered; the master says the file on disk does not load; a HUP then is
/// refused at once (a FIFO is never opened to wait for a writer) and the master goes on.
#[test]
fn a_key_file_broken_between_reloads_never_reaches_a_new_worker() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "keys", &format!("{K1}\n"));
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "2",
            "--max-requests",
            "3",
            "--api-key-file",
            &keys,
        ],
    );
    let first = s.wait_workers(2);
    key_file(&app, "keys", "");
    let mut pids = std::collections::BTreeSet::new();
    for i in 0..20 {
        let r = raw(s.port, "POST", "/", &bearer(K1), INPUT.as_bytes());
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, 200, "request {i}: {body}\n{}", s.log_text());
        pids.insert(r.header("x-worker-pid").unwrap().to_string());
    }
    assert!(
        pids.len() > first.len() + 2,
        "recycling started new workers after the file was emptied: {pids:?}"
    );
    let e = s.wait_event("key_file_changed", |e| {
        e.fields.get("loads") == Some(&serde_json::json!(false))
    });
    assert!(e.message().contains("--api-key-file"), "{}", e.message());

    std::fs::remove_file(&keys).unwrap();
    let c = std::ffi::CString::new(keys.clone()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    let (_, e) = s.wait_event_after(mark, "reload_refused", |_| true);
    let why = e.str("error").unwrap();
    assert!(
        why.contains("--api-key-file") && why.contains("FIFO"),
        "{why}"
    );
    for i in 0..8 {
        let r = raw(s.port, "POST", "/", &bearer(K1), INPUT.as_bytes());
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status, 200, "after the FIFO, request {i}: {body}");
    }
}

/// `/metrics` with its own key; the metrics port's health checks stay open.
#[test]
fn metrics_can_have_a_key_of_their_own() {
    let app = App::new("mlp.pt", "");
    let keys = key_file(&app, "metrics-keys", &format!("{K3}\n"));
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--metrics-port",
            "0",
            "--metrics-api-key-file",
            &keys,
        ],
    );
    s.wait_workers(1);
    let m = metrics_port(&s);
    let get = |extra: &str| raw(m, "GET", "/metrics", extra, b"");
    let r = get("");
    assert_eq!(
        (r.status, r.header("www-authenticate")),
        (401, Some("Bearer realm=\"vramfork\""))
    );
    assert_eq!(get(&bearer(K1)).status, 401);
    let ok = get(&bearer(K3));
    assert_eq!(ok.status, 200);
    let text = String::from_utf8(ok.body).unwrap();
    assert!(
        text.contains(r#"vramfork_auth_failures_total{port="metrics",reason="missing"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vramfork_auth_failures_total{port="metrics",reason="invalid"} 1"#),
        "{text}"
    );
    for path in ["/health/live", "/health/ready"] {
        assert_eq!(raw(m, "GET", path, "", b"").status, 200, "{path}");
    }
    // The serving port is not behind this key.
    assert_eq!(raw(s.port, "POST", "/", "", INPUT.as_bytes()).status, 200);
}

#[test]
fn bad_key_files_stop_the_server_at_start() {
    let app = App::new("mlp.pt", "");
    let empty = key_file(&app, "empty", "# nothing\n");
    let short = key_file(&app, "short", "tooshort\n");
    let missing = app.dir.path().join("nowhere").display().to_string();
    let good = key_file(&app, "good", &format!("{K1}\n"));
    let cases: [(&[&str], &str); 4] = [
        (&["--api-key-file", &empty], "no key in it"),
        (
            &["--api-key-file", &short],
            "line 1: a key has 16 to 4096 characters",
        ),
        (
            &["--api-key-file", &missing],
            "cannot read the API key file",
        ),
        (
            &["--metrics-api-key-file", &good],
            "give --metrics-port too",
        ),
    ];
    for (args, want) in cases {
        let mut s = Server::spawn(&app, args, &[]);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(2), "{args:?}");
        let log = s.log_text();
        assert!(log.contains(want), "{args:?}: {log}");
        assert!(!log.contains("tooshort"), "a key is never told: {log}");
    }
}
