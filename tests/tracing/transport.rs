//! The export's transport: https verified by the given CA or `SSL_CERT_DIR`, with a client
//! certificate; a certificate that cannot be verified costs no request; one connection kept
//! over http and https; a collector closing its connections still gets every batch.

use super::*;

/// The receiver over TLS with a certificate `ca` signed (`server`), in `app`'s directory;
/// `client_ca`: a client certificate signed by it is required.
fn tls_receiver(pki: &Pki, client_ca: Option<&str>) -> Receiver {
    tls_receiver_in("ok", pki, client_ca)
}

/// [`tls_receiver`] in another mode of the receiver's.
fn tls_receiver_in(mode: &str, pki: &Pki, client_ca: Option<&str>) -> Receiver {
    let mut args = vec![
        "--tls".into(),
        pki.path("server.pem"),
        pki.path("server.key"),
    ];
    args.extend(client_ca.map(|ca| pki.path(&format!("{ca}.pem"))));
    Receiver::start_with(mode, &args)
}

/// An https endpoint whose CA is given by the variable, with a client certificate (mutual
/// TLS): a traced request's spans arrive, sent by the client certificate's owner.
#[test]
fn spans_go_over_https_verified_by_the_given_ca_with_a_client_certificate() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    pki.issue("ca", "exporter");
    let rx = tls_receiver(&pki, Some("ca"));
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("exporter.pem"),
        pki.path("exporter.key"),
    );
    let endpoint = format!("https://127.0.0.1:{}", rx.port);
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{endpoint}/v1/traces"),
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ],
    );
    s.wait_workers(1);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    post_traced(s.port, trace);
    let spans = rx.spans_of(trace, 1);
    let server = by_name(&spans, "POST /");
    assert_eq!(server["parent_span_id"], CALLER_SPAN, "{server:#?}");
    assert_eq!(
        server["client"], "exporter",
        "the client certificate was sent"
    );
}

/// A collector whose certificate the given CA did not sign, and one whose certificate is
/// for another host: every request is still answered 200, the spans are dropped and
/// counted, and the warning names the certificate problem.
#[test]
fn a_collector_certificate_that_cannot_be_verified_costs_no_request_and_is_named() {
    for (case, want) in [
        ("another CA", "invalid peer certificate: UnknownIssuer"),
        (
            "another host",
            "invalid peer certificate: certificate not valid for name",
        ),
    ] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        let ca = if case == "another CA" {
            pki.issue("ca", "server");
            Pki::new(app.dir.path(), "other");
            pki.path("other.pem")
        } else {
            pki.issue_for("ca", "server", "DNS:collector.example");
            pki.path("ca.pem")
        };
        let rx = tls_receiver(&pki, None);
        let endpoint = format!("https://127.0.0.1:{}", rx.port);
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
            ],
        );
        s.wait_workers(1);
        for i in 0..20 {
            let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
            assert_eq!(r.status, 200, "{case}: request {i}");
        }
        let mport = s.metrics_port();
        s.poll(&format!("{case}: spans dropped and counted"), || {
            let d = dropped(&scrape(mport));
            (d > 0).then_some(d)
        });
        let warned = s.poll(&format!("{case}: the warning"), || {
            s.all_events()
                .into_iter()
                .find(|e| e.name == "trace_export_failing")
        });
        let why = warned.message();
        assert!(
            why.contains("TLS handshake") && why.contains(want),
            "{case}: {why}"
        );
        assert!(
            rx.all().iter().all(|l| l["trace_id"].is_null()),
            "{case}: a span reached a collector the exporter cannot trust: {:?}",
            rx.all()
        );
    }
}

/// Three traced requests one after another, each one's spans waited for: three exports.
fn three_exports(s: &Server, rx: &Receiver, case: &str) {
    for i in 0..3 {
        let trace = format!("5bf92f3577b34da6a3ce929d0e0e47{i:02}");
        let r = raw(
            s.port,
            "POST",
            "/",
            &traceparent(&trace, "01"),
            INPUT.as_bytes(),
        );
        assert_eq!(r.status, 200, "{case}: request {i}");
        rx.spans_of(&trace, 4);
    }
}

/// The receiver's lines with `key` (`connection`: one per connection it accepted).
fn lines_with(rx: &Receiver, key: &str) -> Vec<Value> {
    rx.all().into_iter().filter(|l| l[key].is_u64()).collect()
}

/// Exports keep their connection (HTTP/1.1 keep-alive): three exports one after another
/// reach the collector over ONE connection, over http and over https (one TLS handshake).
#[test]
fn exports_keep_one_connection_over_http_and_https() {
    for scheme in ["http", "https"] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        pki.issue("ca", "server");
        let ca = pki.path("ca.pem");
        let (rx, mut env) = if scheme == "http" {
            (Receiver::start("ok"), vec![])
        } else {
            (
                tls_receiver(&pki, None),
                vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
            )
        };
        let endpoint = format!("{scheme}://127.0.0.1:{}", rx.port);
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
        let s = Server::start_env(&app, &["--production", "--workers", "1"], &env);
        s.wait_workers(1);
        three_exports(&s, &rx, scheme);
        let connections = lines_with(&rx, "connection");
        assert_eq!(connections.len(), 1, "{scheme}: {connections:?}");
    }
}

/// A collector that closes its connections — after every answer, unannounced (`close`), or
/// just as the next export arrives on it, unanswered (`once`, an idle connection closed at
/// the wrong moment) — still gets every batch: the exporter finds the connection closed and
/// opens a new one at once; nothing is dropped, nothing is logged as failing. Over http and
/// over https (where the closed connection reads as TLS's end, without close_notify).
#[test]
fn a_collector_closing_its_connections_still_gets_every_batch() {
    for (mode, scheme) in [
        ("close", "http"),
        ("once", "http"),
        ("close", "https"),
        ("once", "https"),
    ] {
        let app = mlp();
        let pki = Pki::new(app.dir.path(), "ca");
        pki.issue("ca", "server");
        let ca = pki.path("ca.pem");
        let (rx, mut env) = if scheme == "http" {
            (Receiver::start(mode), vec![])
        } else {
            (
                tls_receiver_in(mode, &pki, None),
                vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
            )
        };
        let endpoint = format!("{scheme}://127.0.0.1:{}", rx.port);
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &env,
        );
        s.wait_workers(1);
        let mode = &format!("{mode} over {scheme}");
        three_exports(&s, &rx, mode);
        assert_eq!(
            lines_with(&rx, "connection").len(),
            3,
            "{mode}: a connection per export"
        );
        if mode.starts_with("once") {
            // The second and third exports were each sent on a connection the receiver
            // then closed unanswered, and sent again on a new one.
            assert_eq!(lines_with(&rx, "unanswered").len(), 2, "{mode}");
        }
        assert_eq!(dropped(&scrape(s.metrics_port())), 0, "{mode}");
        let failing: Vec<_> = s
            .all_events()
            .into_iter()
            .filter(|e| e.name == "trace_export_failing")
            .map(|e| e.message().to_string())
            .collect();
        assert!(failing.is_empty(), "{mode}: {failing:?}");
    }
}

/// With no OTLP certificate, the collector's is verified by the CAs of `SSL_CERT_DIR` (a
/// directory as `openssl rehash` makes it: the CA under the name `HASH.0`, the second of a
/// `:` list as OpenSSL reads the variable).
#[test]
fn spans_go_over_https_verified_by_a_ca_of_ssl_cert_dir() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "server");
    let certs = app.dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let hash = Command::new("openssl")
        .args(["x509", "-hash", "-noout", "-in", &pki.path("ca.pem")])
        .output()
        .unwrap();
    assert!(hash.status.success());
    let hash = String::from_utf8(hash.stdout).unwrap();
    std::fs::copy(pki.path("ca.pem"), certs.join(format!("{}.0", hash.trim()))).unwrap();
    // The collector's CA is in the second directory of OpenSSL's `:` list; the first holds
    // another CA only.
    Pki::new(app.dir.path(), "other");
    let first = app.dir.path().join("other-certs");
    std::fs::create_dir(&first).unwrap();
    std::fs::copy(pki.path("other.pem"), first.join("other.pem")).unwrap();
    let rx = tls_receiver(&pki, None);
    let endpoint = format!("https://127.0.0.1:{}", rx.port);
    let certs = certs.display().to_string();
    let list = format!("{}:{certs}", first.display());
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("SSL_CERT_DIR", &list),
        ],
    );
    let e = s.wait_event("trace_export", |_| true);
    assert!(
        e.message().contains(&format!("{certs} (SSL_CERT_DIR)")),
        "{}",
        e.message()
    );
    s.wait_workers(1);
    let trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    post_traced(s.port, trace);
    rx.spans_of(trace, 4);
}
