//! A collector that is dead, refuses, or comes back costs no request; an export that cannot
//! work is a start-up error, a bad sampler a warning.

use super::*;

/// A collector that never answers, and one that answers 503: every request is answered
/// 200 as before, and the spans are dropped and counted.
#[test]
fn a_dead_or_refusing_collector_costs_no_request() {
    for mode in ["hang", "503"] {
        let rx = Receiver::start(mode);
        let app = mlp();
        let s = Server::start_env(
            &app,
            &["--production", "--workers", "1", "--metrics-port", "0"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
            ],
        );
        s.wait_workers(1);
        let mport = s.metrics_port();
        for i in 0..40 {
            let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
            assert_eq!(r.status, 200, "{mode}: request {i}");
        }
        let n = s.poll(&format!("{mode}: spans dropped and counted"), || {
            let d = dropped(&scrape(mport));
            (d > 0).then_some(d)
        });
        assert!(n <= 160, "{mode}: {n} dropped of 160 spans");
        if mode == "503" {
            assert!(
                rx.all().iter().any(|l| l["refused"].is_u64()),
                "the receiver was asked"
            );
        }
        let warned = s.poll(&format!("{mode}: the warning"), || {
            s.all_events()
                .into_iter()
                .find(|e| e.name == "trace_export_failing")
        });
        assert!(
            warned.message().contains("dropped and counted"),
            "{:?}",
            warned.fields
        );
    }
}

/// A collector that refused an export and then takes them again: after the first refusal
/// (its spans dropped and counted, `trace_export_failing` logged) the exporter pauses, then
/// its next export goes through: newer requests' spans arrive and `trace_export_recovered`
/// says how many were dropped meanwhile.
#[test]
fn a_collector_that_comes_back_gets_spans_again_and_the_recovery_is_logged() {
    let rx = Receiver::start("503-once");
    let app = mlp();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint())],
    );
    s.wait_workers(1);
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert_eq!(r.status, 200);
    let warned = s.poll("the refusal", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "trace_export_failing")
    });
    assert!(warned.message().contains("503"), "{:?}", warned.fields);
    // Requests go on being answered; once the exporter tries again, their spans arrive.
    let arrived = s.poll("spans after the refusal", || {
        let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
        assert_eq!(r.status, 200);
        let spans = rx.all();
        spans.iter().any(|l| l["name"] == "POST /").then_some(spans)
    });
    assert_eq!(
        rx.all().iter().filter(|l| l["refused"].is_u64()).count(),
        1,
        "one refusal: {arrived:#?}"
    );
    let recovered = s.poll("the recovery", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "trace_export_recovered")
    });
    let dropped_then = recovered.u64("dropped").expect("dropped");
    assert!(
        dropped_then >= 4,
        "the refused export's spans: {:?}",
        recovered.fields
    );
    assert!(
        dropped(&scrape(s.metrics_port())) >= dropped_then,
        "the counter holds them"
    );
}

/// What cannot be exported to stops the start (exit 2) naming the variable; what the
/// standard makes a warning is logged, and the server starts.
#[test]
fn an_export_that_cannot_work_is_a_start_up_error_and_a_bad_sampler_a_warning() {
    let app = mlp();
    let junk = app.dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let junk = junk.display().to_string();
    let empty = app.dir.path().join("no-certs");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.display().to_string();
    let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318");
    for (env, want) in [
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "OTLP/HTTP with protobuf only".to_string(),
        ),
        (
            vec![
                https,
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
            ],
            "OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem: cannot be read".to_string(),
        ),
        (
            vec![https, ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &junk)],
            format!("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE={junk}: holds no PEM certificate"),
        ),
        (
            vec![https, ("SSL_CERT_DIR", "/nonexistent/certs")],
            "SSL_CERT_DIR=/nonexistent/certs: cannot be read".to_string(),
        ),
        (
            vec![https, ("SSL_CERT_DIR", &empty)],
            format!("SSL_CERT_DIR={empty}: holds no PEM certificate"),
        ),
    ] {
        let mut s = Server::spawn(&app, &["--production", "--workers", "1"], &env);
        let st = s.wait_exit(PATIENCE);
        assert_eq!(st.code(), Some(2), "{env:?}: {}", s.log_text());
        assert!(s.log_text().contains(&want), "{env:?}: {}", s.log_text());
    }
    let rx = Receiver::start("ok");
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
        ],
    );
    let w = s.wait_event("trace_export_setting_ignored", |_| true);
    assert!(
        w.message().contains("OTEL_TRACES_SAMPLER=sometimes"),
        "{:?}",
        w.fields
    );
    s.wait_workers(1);
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert!(
        r.status == 200 && r.header("traceparent").unwrap().ends_with("-01"),
        "the default sampler"
    );
}
