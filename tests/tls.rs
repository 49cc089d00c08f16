//! TLS: `--tls-cert`, `--tls-key` and `--tls-client-ca` end to end with the real
//! `app`, certificates made on the spot by the `openssl` command: `curl --cacert` and
//! NVIDIA's tritonclient (`ssl=True`) on the serving port, the metrics port over TLS,
//! mutual TLS refusing a client without a (good) certificate, a certificate swapped by a
//! HUP while a keep-alive client goes on without a failed request, a stalled handshake that
//! delays no other client, and bad files refused at start and on HUP.

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::pki::{openssl, Pki};
use common::{App, Server, MLP_INPUT, PATIENCE};

/// `curl` against `https://127.0.0.1:PORT{path}` with `args`; (exit code, body).
fn curl(port: u16, path: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--http1.1"])
        .args(args)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("run curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The server's app and its PKI: a CA `ca` and a server certificate `server` it signed.
fn setup() -> (App, Pki) {
    let app = App::new("mlp.pt", "");
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    (app, pki)
}

fn tls_args(pki: &Pki) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        pki.path("server.pem"),
        "--tls-key".into(),
        pki.path("server.key"),
    ]
}

fn start(app: &App, pki: &Pki, more: &[&str]) -> Server {
    let mut args: Vec<String> = vec!["--production".into(), "--workers".into(), "1".into()];
    args.extend(tls_args(pki));
    args.extend(more.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(app, &args)
}

fn post_args(ca: &str) -> Vec<String> {
    vec![
        "--cacert".into(),
        ca.into(),
        "-H".into(),
        "Content-Type: application/json".into(),
        "--data".into(),
        MLP_INPUT.into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn curl_and_tritonclient_are_served_over_tls_and_plain_http_is_not() {
    let (app, pki) = setup();
    let s = start(&app, &pki, &["--metrics-port", "0"]);
    let pids = s.wait_workers(1);
    let listening = s.wait_event("listening", |_| true);
    assert!(
        listening.message().contains("https://"),
        "{}",
        listening.message()
    );
    let ca = pki.path("ca.pem");
    let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(v["outputs"].as_array().map(Vec::len), Some(1), "{out}");
    let (code, out) = curl(s.port, "/healthz", &["--cacert", &ca, "-i"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // Without the CA the client does not trust the server: the handshake is the client's to
    // refuse.
    let (code, _) = curl(s.port, "/healthz", &[]);
    assert_ne!(code, 0, "curl trusted a certificate it has no CA for");

    // NVIDIA's client, ssl=True.
    let addr = format!("127.0.0.1:{}", s.port);
    let t = common::python_json("tls_client.py", &["triton", &addr, &ca, "test app"], b"");
    assert_eq!(t["ready"], true, "{t}");
    assert_eq!(t["ok"], true, "{t}");
    assert_eq!(t["output"].as_array().map(Vec::len), Some(1), "{t}");

    // The metrics port speaks TLS too.
    let (code, out) = curl(s.metrics_port(), "/metrics", &["--cacert", &ca]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("vramfork_workers"), "{out}");

    // Plain HTTP on the TLS port gets no HTTP answer, and the worker serves on.
    let mut plain = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"HTTP/"),
        "plain HTTP was answered over a TLS port: {:?}",
        String::from_utf8_lossy(&got)
    );
    let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
    assert_eq!(code, 0, "{out}");
    assert_eq!(s.ready_pids(), pids, "the worker is the same one");
}

#[test]
fn development_mode_serves_tls_too() {
    let (app, pki) = setup();
    let args = tls_args(&pki);
    let s = Server::start(&app, &strs(&args));
    let ca = pki.path("ca.pem");
    let out = s.poll("an answer over TLS", || {
        let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
        (code == 0).then_some(out)
    });
    assert!(out.contains("\"outputs\""), "{out}");
}

#[test]
fn mutual_tls_refuses_clients_without_a_certificate_signed_by_the_client_ca() {
    let (app, pki) = setup();
    pki.issue("ca", "client");
    // A client certificate from another CA.
    Pki::new(app.dir.path(), "other");
    pki.issue("other", "stranger");
    let s = start(&app, &pki, &["--tls-client-ca", &pki.path("ca.pem")]);
    let pids = s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let post = post_args(&ca);

    let (code, out) = curl(s.port, "/", &strs(&post));
    assert_ne!(code, 0, "served a client without a certificate: {out}");
    assert!(!out.contains("\"outputs\""), "{out}");

    let mut stranger = post.clone();
    stranger.extend([
        "--cert".into(),
        pki.path("stranger.pem"),
        "--key".into(),
        pki.path("stranger.key"),
    ]);
    let (code, out) = curl(s.port, "/", &strs(&stranger));
    assert_ne!(
        code, 0,
        "served a client certificate from another CA: {out}"
    );

    // An X.509 version 1 certificate from the right CA (`openssl x509 -req` without
    // extensions makes one): refused, and the log says why.
    openssl(
        &pki.dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=v1",
            "-keyout",
            "v1.key",
            "-out",
            "v1.csr",
        ],
    );
    openssl(
        &pki.dir,
        &[
            "x509",
            "-req",
            "-in",
            "v1.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "v1.pem",
        ],
    );
    let mut v1 = post.clone();
    v1.extend([
        "--cert".into(),
        pki.path("v1.pem"),
        "--key".into(),
        pki.path("v1.key"),
    ]);
    let (code, out) = curl(s.port, "/", &strs(&v1));
    assert_ne!(code, 0, "served an X.509 v1 client certificate: {out}");
    s.poll(
        "the worker's reason for refusing the v1 certificate",
        || {
            s.log_text()
                .contains("the client's certificate is X.509 version 1")
                .then_some(())
        },
    );

    let mut good = post.clone();
    good.extend([
        "--cert".into(),
        pki.path("client.pem"),
        "--key".into(),
        pki.path("client.key"),
    ]);
    let (code, out) = curl(s.port, "/", &strs(&good));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"outputs\""), "{out}");
    assert_eq!(s.ready_pids(), pids, "refused handshakes cost no worker");
}

/// A rotated certificate goes out with a HUP: the new workers read it, while a keep-alive
/// client that never stops sending loses no request (the old worker answers its last
/// request with `Connection: close`, and the client reconnects to the new one).
#[test]
fn a_certificate_swapped_by_hup_reaches_new_connections_while_a_keep_alive_client_keeps_working() {
    let (app, pki) = setup();
    let s = start(&app, &pki, &["--metrics-port", "0"]);
    s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let python = common::python();
    let mut client = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/tls_client.py"))
        .args([
            "keepalive",
            &format!("127.0.0.1:{}", s.port),
            &ca,
            MLP_INPUT,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client says so once it has its first answer.
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    let first = lines.next().expect("the client's first line").unwrap();
    assert_eq!(first, "answered", "{first}");
    let old_fingerprint = fingerprint(&pki.path("server.pem"));
    // Rotate: a new key and certificate from the same CA, written over the old files.
    pki.issue("ca", "server");
    assert_ne!(fingerprint(&pki.path("server.pem")), old_fingerprint);
    let new_fingerprint = fingerprint(&pki.path("server.pem"));
    // The files are read again when they change: new connections get the new certificate
    // at once, on the serving port and on the metrics port, before any HUP.
    for port in [s.port, s.metrics_port()] {
        let seen = served_fingerprint(port, &ca);
        assert_eq!(seen, new_fingerprint, "port {port}");
    }
    wait_tls_event(&s, "tls_reloaded", true);
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    s.wait_event_after(mark, "reload_complete", |_| true);
    let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
    assert_eq!(code, 0, "{out}");
    assert_eq!(served_fingerprint(s.port, &ca), new_fingerprint);
    drop(client.stdin.take());
    let last = lines.next().expect("the client's summary").unwrap();
    let out = client.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(r["failures"], serde_json::json!([]), "{r}");
    assert!(r["requests"].as_u64().unwrap() > 1, "{r}");
    let seen: Vec<&str> = r["fingerprints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(seen.first(), Some(&old_fingerprint.as_str()), "{r}");
    assert_eq!(
        seen.last(),
        Some(&new_fingerprint.as_str()),
        "the client's last connection has the new certificate: {r}"
    );

    // A broken rotation is refused and the workers keep the certificate they have.
    std::fs::write(pki.dir.join("server.pem"), "not a certificate\n").unwrap();
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    let (_, e) = s.wait_event_after(mark, "reload_refused", |_| true);
    let why = e.str("error").unwrap();
    assert!(
        why.contains("--tls-cert") && why.contains("holds no PEM certificate"),
        "{why}"
    );
    let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
    assert_eq!(code, 0, "{out}");
    assert_eq!(served_fingerprint(s.port, &ca), new_fingerprint);
    // (The master reads them again only for a new metrics connection: none came since.)
    wait_tls_event(&s, "tls_reload_failed", false);
}

/// A certificate file broken on disk with no HUP: a certificate whose key is
/// another's, copied over the certificate alone (a rotation half done). The workers that
/// recycling starts afterwards begin from the certificate the master last accepted, so
/// every request is answered with it, and they say the files on disk do not load.
#[test]
fn a_certificate_broken_between_reloads_never_reaches_a_new_worker() {
    let (app, pki) = setup();
    let s = start(&app, &pki, &["--max-requests", "3"]);
    let first = s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let good = fingerprint(&pki.path("server.pem"));
    pki.issue("ca", "other");
    std::fs::copy(pki.dir.join("other.pem"), pki.dir.join("server.pem")).unwrap();
    for i in 0..12 {
        let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
        assert_eq!(code, 0, "request {i}: {out}\n{}", s.log_text());
    }
    assert_eq!(served_fingerprint(s.port, &ca), good);
    s.wait_workers_where(1, |now| now != first.as_slice());
    wait_tls_event(&s, "tls_reload_failed", false);
}

/// Waits until `name` was logged by a worker and, with `master`, by the master too (for its
/// metrics port).
fn wait_tls_event(s: &Server, name: &str, master: bool) {
    s.poll(&format!("{name} from a worker and from the master"), || {
        let log = s.log_text();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{name}\"")))
            .collect();
        let worker = lines.iter().any(|l| l.contains("\"name\":\"worker\""));
        let masters = lines.iter().any(|l| !l.contains("\"span\""));
        (worker && (masters || !master)).then_some(())
    });
}

/// The SHA-256 of the certificate the server at `port` sends.
fn served_fingerprint(port: u16, ca: &str) -> String {
    let addr = format!("127.0.0.1:{port}");
    let v = common::python_json("tls_client.py", &["fingerprint", &addr, ca], b"");
    v["fingerprint"].as_str().unwrap().to_string()
}

/// SHA-256 of a PEM certificate's DER, as the Python client reports it.
fn fingerprint(pem: &str) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-in", pem, "-noout", "-fingerprint", "-sha256"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_lowercase()
}

/// Clients that connect and stall in the handshake (nothing sent, or half a ClientHello)
/// hold up no one: with one worker, another client is served while they still wait, and
/// they are dropped at the head deadline (10 s) as a stalled plain request head is.
#[test]
fn a_stalled_handshake_delays_no_other_client() {
    let (app, pki) = setup();
    let s = start(&app, &pki, &["--metrics-port", "0"]);
    let pids = s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let mport = s.metrics_port();
    let silent = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    // A TLS record header announcing a 512-byte handshake message, and 10 bytes of it.
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
        .unwrap();
    let metrics_silent = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    // Each answer comes long before the stalled handshakes' deadline (10 s): curl gives up
    // after 20 s, but the stalled connections must still be open after it answered.
    for _ in 0..3 {
        let (code, out) = curl(s.port, "/", &strs(&post_args(&ca)));
        assert_eq!(code, 0, "{out}");
        let (code, out) = curl(mport, "/metrics", &["--cacert", &ca]);
        assert_eq!(code, 0, "{out}");
    }
    for (what, c) in [
        ("silent", &silent),
        ("half a ClientHello", &half),
        ("metrics, silent", &metrics_silent),
    ] {
        assert!(
            common::nothing_from_server(c),
            "{what}: the stalled connection was closed before its deadline, so the answers \
             above may not have been served beside it"
        );
    }
    // Then the server drops them (as it drops a stalled request head).
    for (what, mut c) in [
        ("silent", silent),
        ("half", half),
        ("metrics", metrics_silent),
    ] {
        c.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf);
        assert!(
            matches!(n, Ok(0)) || n.is_err(),
            "{what}: expected the server to close, got {n:?}"
        );
    }
    assert_eq!(s.ready_pids(), pids);
}

#[test]
fn bad_tls_options_stop_the_server_at_start() {
    let (app, pki) = setup();
    Pki::new(app.dir.path(), "other");
    let junk = app.dir.path().join("junk.pem");
    std::fs::write(&junk, "hello\n").unwrap();
    let junk = junk.display().to_string();
    let missing = app.dir.path().join("nowhere.pem").display().to_string();
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let other_key = pki.path("other.key");
    let junk_cert_env = [("VRAMFORK_TLS_CERT", junk.as_str())];
    type Case<'a> = (Vec<&'a str>, &'a [(&'a str, &'a str)], &'a str);
    let cases: Vec<Case> = vec![
        (vec!["--tls-cert", &cert], &[], "--tls-cert needs --tls-key"),
        (vec!["--tls-key", &key], &[], "--tls-key needs --tls-cert"),
        (
            vec!["--tls-client-ca", &ca],
            &[],
            "--tls-client-ca asks for client certificates",
        ),
        (
            vec!["--tls-cert", &junk, "--tls-key", &key],
            &[],
            "holds no PEM certificate",
        ),
        (
            vec!["--tls-cert", &missing, "--tls-key", &key],
            &[],
            "cannot read the certificate file",
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &junk],
            &[],
            "holds no usable PEM private key",
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &other_key],
            &[],
            "is not the key of the certificate",
        ),
        (vec!["--tls-key", &key], &junk_cert_env, "VRAMFORK_TLS_CERT"),
        (
            vec![
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &junk,
            ],
            &[],
            "the client CA file",
        ),
    ];
    for (args, env, want) in cases {
        let mut all = vec!["--production"];
        all.extend(args.iter().copied());
        let mut s = Server::spawn(&app, &all, env);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(2), "{args:?}");
        let log = s.log_text();
        assert!(log.contains(want), "{args:?}: want {want:?} in {log}");
        assert!(
            !log.contains("PRIVATE KEY"),
            "key material is never told: {log}"
        );
    }
}

/// `--max-queue-wait` works through TLS: the wait counts from the ClientHello's arrival in
/// the listen queue, less the handshake's own time. Ten clients at once on one worker, each
/// request ~0.4 s of model time: the later ones are refused with 503 and `Retry-After`.
#[test]
fn max_queue_wait_refuses_late_requests_over_tls_too() {
    let app = App::new("slow.pt", "");
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    let s = start(
        &app,
        &pki,
        &["--max-queue-wait", "1", "--torch-threads", "1"],
    );
    s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let (port, ca) = (s.port, ca.clone());
            std::thread::spawn(move || {
                curl(
                    port,
                    "/",
                    &[
                        "--cacert",
                        &ca,
                        "-i",
                        "--max-time",
                        "60",
                        "--data",
                        r#"{"inputs": [[18000]]}"#,
                    ],
                )
            })
        })
        .collect();
    let answers: Vec<(i32, String)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(answers.iter().all(|(code, _)| *code == 0), "{answers:?}");
    let ok = answers
        .iter()
        .filter(|(_, o)| o.starts_with("HTTP/1.1 200"))
        .count();
    let refused: Vec<&String> = answers
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o.starts_with("HTTP/1.1 503"))
        .collect();
    assert_eq!(ok + refused.len(), 10, "{answers:?}");
    assert!(ok >= 1, "{answers:?}");
    assert!(!refused.is_empty(), "nothing was refused: {answers:?}");
    for r in refused {
        let lower = r.to_lowercase();
        assert!(lower.contains("retry-after: 1"), "{r}");
        assert!(
            r.contains("--max-queue-wait") && r.contains("did not run"),
            "{r}"
        );
    }
}

/// Token auth over TLS, with curl: the key is required (401 + `WWW-Authenticate` without
/// it), accepted, and the health check stays open.
#[test]
fn curl_sends_its_key_over_tls() {
    let (app, pki) = setup();
    let key = "k1-aaaaaaaaaaaaaaaaaaaaaaaa";
    let keys = app.dir.path().join("keys");
    std::fs::write(&keys, format!("{key}\n")).unwrap();
    let s = start(&app, &pki, &["--api-key-file", keys.to_str().unwrap()]);
    s.wait_workers(1);
    let ca = pki.path("ca.pem");
    let mut refused = post_args(&ca);
    refused.push("-i".into());
    let (code, out) = curl(s.port, "/", &strs(&refused));
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    assert!(
        out.to_lowercase()
            .contains("www-authenticate: bearer realm=\"vramfork\""),
        "{out}"
    );
    let mut with_key = post_args(&ca);
    with_key.extend(["-H".into(), format!("Authorization: Bearer {key}")]);
    let (code, out) = curl(s.port, "/", &strs(&with_key));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"outputs\""), "{out}");
    let (code, out) = curl(s.port, "/healthz", &["--cacert", &ca, "-i"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(!s.log_text().contains(key), "the key is never logged");
}
