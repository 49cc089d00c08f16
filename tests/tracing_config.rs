//! Trace export configuration that cannot work is refused at start (the real `app`): an
//! endpoint that could not be sent as written (no host, a bracket left open, whitespace or
//! a line break in it), a header that would not be one header on the wire (a name that is
//! not a token, a value with a line break once decoded, a header the exporter writes
//! itself), and a certificate variable naming a FIFO or a device. Each is exit 2 with a line
//! naming the variable, at once, and nothing reaches the collector.

mod common;
mod otlp;

use std::path::Path;
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{App, Server};
use otlp::Receiver;

fn mlp() -> App {
    App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

/// How long a refused start may take: the master checks the variables before anything
/// else, so this is the start of a process on a busy machine, generously.
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

/// Starts `app` with `env` and expects exit 2 within [`REFUSED_WITHIN`], its log naming
/// every one of `want`; returns the log.
fn refused(app: &App, env: &[(&str, &str)], want: &[&str]) -> String {
    refused_under(&[], app, env, want)
}

/// [`refused`], the app started through `launcher` (which ends by executing it).
fn refused_under(launcher: &[&str], app: &App, env: &[(&str, &str)], want: &[&str]) -> String {
    let started = Instant::now();
    let mut args = vec!["--production", "--workers", "1"];
    if !launcher.is_empty() {
        args.extend(["--port", "0"]);
    }
    let mut s = Server::spawn_under(launcher, app, &args, env);
    let st = s.wait_exit(REFUSED_WITHIN);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "{env:?}: {st}\n{log}");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{env:?}: {:?}",
        started.elapsed()
    );
    for w in want {
        assert!(log.contains(w), "{env:?}: no {w:?} in\n{log}");
    }
    log
}

/// An endpoint that is not a URL the exporter could send as written: exit 2 naming the
/// variable and the value (a line break in it shown escaped, never written into the log).
#[test]
fn an_endpoint_that_could_not_be_sent_as_written_is_refused_at_start() {
    let app = mlp();
    for (var, url, want) in [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://:4318/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://:4318/v1/traces: expected a host (and port) after the scheme: the host is empty",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://[::1",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://[::1: not a URL",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://[::1",
            "OTEL_EXPORTER_OTLP_ENDPOINT=https://[::1/v1/traces: not a URL",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/my traces",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/my traces: a space at byte 27",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces\r\nX-Evil: 1",
            // Escaped in the message: the line break itself is never written to the log.
            r"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces\r\nX-Evil: 1: a carriage return (CR) at byte 31",
        ),
    ] {
        let log = refused(&app, &[(var, url)], &[want]);
        assert!(!log.contains("X-Evil: 1\n"), "{log}");
    }
}

/// Headers that would not be one header each on the wire, or that the exporter writes
/// itself: exit 2 naming the variable and the header, never its value (headers carry
/// credentials), and the collector is never reached.
#[test]
fn a_header_that_would_not_be_one_header_is_refused_and_never_sent() {
    let app = mlp();
    let rx = Receiver::start("ok");
    let endpoint = rx.endpoint();
    for (var, headers, want) in [
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "bad key=v",
            "OTEL_EXPORTER_OTLP_HEADERS: 'bad key' is not a header name: a space",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "k:x=v",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'k:x' is not a header name: ':'",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20secret,x-tenant=a%0D%0AX-Injected:%20yes",
            "OTEL_EXPORTER_OTLP_HEADERS: the value of 'x-tenant' holds a carriage return (CR) once percent-decoded",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-tenant=a%00b",
            "the value of 'x-tenant' holds a NUL",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Content-Length=0",
            "OTEL_EXPORTER_OTLP_HEADERS: 'Content-Length' is written by the exporter itself",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "host=collector.evil",
            "'host' is written by the exporter itself",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Content-Type=text/plain",
            "'Content-Type' is written by the exporter itself",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "TRANSFER-ENCODING=chunked",
            "'TRANSFER-ENCODING' is written by the exporter itself",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "connection=close",
            "'connection' is written by the exporter itself",
        ),
    ] {
        let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), (var, headers)];
        let log = refused(&app, &env, &[want]);
        for secret in ["secret", "Injected", "collector.evil"] {
            assert!(!log.contains(secret), "{headers}: the log quotes a value:\n{log}");
        }
    }
    let reached: Vec<_> = rx
        .all()
        .into_iter()
        .filter(|l| l.get("connection").is_some())
        .collect();
    assert!(reached.is_empty(), "the collector was reached: {reached:?}");
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A certificate variable naming a FIFO (whose open would wait for a writer forever) is
/// refused at once naming the variable; one naming `/dev/zero` (endless) is refused as a
/// device, without being read: the app runs under a 2 GiB address-space limit, so that a
/// read of it stops at the limit ("out of memory") instead of growing until the OOM killer.
#[test]
fn a_certificate_variable_naming_a_fifo_or_a_device_is_refused_at_once() {
    let app = mlp();
    let pki = Pki::new(app.dir.path(), "ca");
    pki.issue("ca", "exporter");
    let fifo = app.dir.path().join("ca.fifo");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("exporter.pem"),
        pki.path("exporter.key"),
    );
    let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:9");
    let client = |cert_var: &'static str, cert: &str, key: &str| {
        vec![
            https,
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            (cert_var, cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect::<Vec<_>>()
    };
    // The launcher: a shell that limits the address space, then executes the app (it is
    // given the environment already; the --setenv arguments are passed over).
    let limited = [
        "sh",
        "-c",
        r#"ulimit -v 2097152 && while [ "${1#--setenv=}" != "$1" ]; do shift; done && exec "$@""#,
        "sh",
    ];
    let cases: Vec<(Vec<(&str, String)>, String)> = vec![
        (
            vec![https, ("OTEL_EXPORTER_OTLP_CERTIFICATE", fifo)]
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
            format!("OTEL_EXPORTER_OTLP_CERTIFICATE={fifo}: cannot be read: it is a FIFO"),
        ),
        (
            vec![https, ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", fifo)]
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
            format!("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE={fifo}: cannot be read: it is a FIFO"),
        ),
        (
            vec![https, ("SSL_CERT_FILE", fifo)]
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
            format!("SSL_CERT_FILE={fifo}: cannot be read: it is a FIFO"),
        ),
        (
            vec![https, ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/dev/zero")]
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
            "OTEL_EXPORTER_OTLP_CERTIFICATE=/dev/zero: cannot be read: it is a device".into(),
        ),
        (
            vec![https, ("SSL_CERT_FILE", "/dev/zero")]
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect(),
            "SSL_CERT_FILE=/dev/zero: cannot be read: it is a device".into(),
        ),
        (
            client("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", fifo, &key),
            format!("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={fifo}: cannot be read: it is a FIFO"),
        ),
        (
            client(
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                &cert,
                "/dev/zero",
            ),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY=/dev/zero: cannot be read: it is a device".into(),
        ),
    ];
    for (env, want) in cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        refused_under(&limited, &app, &env, &[&want]);
    }
}
