//! A collector that never finishes its answer cannot hold the exporter (the real `app`, the
//! receiver of `tests/support/otlp_receiver.py` in a mode that never ends an answer):
//! endless `100 Continue` answers, endless trailers after a chunked 200, and an answer
//! dripped a byte every half second. Each export fails within its timeout with the reason
//! logged (`trace_export_failing`) and its spans counted as dropped; every request is still
//! answered, and the exporter thread (`vf-span-export`) stays nearly idle instead of
//! spinning on the answer.

mod common;
mod otlp;

use std::time::{Duration, Instant};

use common::{raw, App, Server};
use otlp::Receiver;

const INPUT: &str = r#"{"inputs": [[0.5, -1.0, 2.0, 0.25]]}"#;

/// The export's timeout the server runs with.
const TIMEOUT_MS: u64 = 1500;

fn mlp() -> App {
    App::new(
        "mlp.pt",
        r#""input": {"shape": [-1, 4], "dtype": "float32"}"#,
    )
}

fn dropped(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("vramfork_trace_spans_dropped_total "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// The CPU seconds the thread named `name` of `pid` has used (user and system), from
/// `/proc/PID/task/TID/stat`.
fn thread_cpu(pid: u32, name: &str) -> f64 {
    // SAFETY: sysconf reads a configuration value; no pointer is involved.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // The fields after the command's closing parenthesis: state is the 3rd field of the
        // line, utime and stime the 14th and 15th.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        return ticks as f64 / hz;
    }
    panic!("no thread {name} in {pid}");
}

/// The exports the receiver has taken and is answering without end (one line each).
fn answering(rx: &Receiver) -> usize {
    rx.all()
        .iter()
        .filter(|l| l.get("answering").is_some())
        .count()
}

/// Runs a server exporting to the receiver in `mode` and checks what the module says: the
/// export fails within the timeout with `reason` logged, requests are answered, the
/// exporter thread stays nearly idle, the spans are counted.
fn cannot_hold_the_exporter(mode: &str, reason: &str) {
    let rx = Receiver::start(mode);
    let app = mlp();
    let timeout = TIMEOUT_MS.to_string();
    let s = Server::start_env(
        &app,
        &["--production", "--workers", "1", "--metrics-port", "0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.endpoint()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", &timeout),
        ],
    );
    let worker = s.wait_workers(1)[0];
    let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
    assert_eq!(r.status, 200, "{mode}");
    let asked = Instant::now();
    // The export starts within the exporter's 0.5 s delay, and fails within its timeout
    // (the first two modes sooner: at their bound); generously for a busy machine.
    let warned = s.poll(&format!("{mode}: the failed export"), || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "trace_export_failing")
    });
    let took = asked.elapsed();
    assert!(
        warned.message().contains(reason),
        "{mode}: {:?}",
        warned.fields
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(8),
        "{mode}: the export failed {took:?} after the request"
    );
    // Requests go on being answered while exports go on failing; the exporter thread's
    // CPU over the next two exports the receiver takes.
    let (cpu0, t0, seen) = (
        thread_cpu(worker, "vf-span-export"),
        Instant::now(),
        answering(&rx),
    );
    s.poll(&format!("{mode}: two more exports"), || {
        let r = raw(s.port, "POST", "/", "", INPUT.as_bytes());
        assert_eq!(r.status, 200, "{mode}");
        (answering(&rx) >= seen + 2).then_some(())
    });
    let rate = (thread_cpu(worker, "vf-span-export") - cpu0) / t0.elapsed().as_secs_f64();
    eprintln!("{mode}: failed {took:?} after the request; the exporter thread then used {rate:.3} CPU-s/s");
    assert!(
        rate < 0.2,
        "{mode}: the exporter thread used {rate:.3} CPU-s/s"
    );
    let metrics = common::http(s.metrics_port(), "GET", "/metrics", None).body;
    assert!(
        dropped(&metrics) > 0,
        "{mode}: the spans counted as dropped"
    );
}

/// `100 Continue` after `100 Continue`, as fast as they are read: at most 4 are taken.
#[test]
fn endless_interim_answers_cannot_hold_the_exporter() {
    cannot_hold_the_exporter(
        "continue-forever",
        "more than 4 interim (1xx) answers before the answer",
    );
}

/// A chunked 200 whose trailers never end: they count against the head's 64 KiB.
#[test]
fn endless_trailers_cannot_hold_the_exporter() {
    cannot_hold_the_exporter(
        "trailers-forever",
        "trailers over 65536 bytes (with the head)",
    );
}

/// An answer dripped a byte every half second (each read well within the timeout): the
/// timeout is the export's whole.
#[test]
fn an_answer_dripped_a_byte_at_a_time_cannot_hold_the_exporter() {
    cannot_hold_the_exporter(
        "drip",
        &format!("not done within the export's timeout of {TIMEOUT_MS} ms"),
    );
}
