//! `--idle-release SECONDS` (`src/master/supervisor/idle.rs`): a server whose
//! workers on GPUs got no request for that long retires them and gives its reservation in
//! the GPU-memory ledger back; the next request starts them again through the ledger, or is
//! answered 503 with `Retry-After` when the ledger has no room. Real `app` servers against
//! one simulated A100 (the NVML stand-in, `--simulated-gpus`) sharing one ledger, as in
//! `tests/ledger.rs`.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::host::{mps_limits, Host, A100_SHARE_MB};
use common::*;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

const INPUT: &str = r#"{"inputs": [[1.0, 2.0, 3.0, 4.0]]}"#;

/// Requests to `port` one after another until `stop` is set: a server kept busy.
fn keep_busy(
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let r = http(port, "POST", "/", Some(INPUT));
            assert_eq!(r.status, 200, "{}", r.body);
        }
    })
}

/// An idle server gives its reservation back within the seconds set (the release begins no
/// sooner than `--idle-release` after the last answer, and no later than a heartbeat and a
/// loop turn after that), a busy neighbour's TTIN then takes the room it freed, and the
/// idle server's next request is answered 200 by a worker started again through the ledger.
#[test]
fn an_idle_server_gives_its_memory_to_a_busy_neighbour_and_answers_its_next_request() {
    const TYP_MB: u64 = 4000;
    const IDLE_S: f64 = 2.0;
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (idle, n_idle) = host.serving(&a, &["--idle-release", "2"]);
    // Kept busy while its neighbour starts (booting takes longer than its idle time here).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = keep_busy(idle.port, stop.clone());
    let (busy, n_busy) = host.serving(&b, &[]);
    assert_eq!(host.reserved(), (n_idle + n_busy) * TYP_MB);
    // The neighbour planned around the idle server's reservation: it has no room to grow.
    busy.signal(libc::SIGTTIN);
    let refused = busy.wait_event("ttin_refused", |_| true);
    assert!(refused.message().contains("fill"), "{refused:?}");

    assert!(
        idle.events_named("idle_release").is_empty(),
        "released while busy"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().unwrap();
    let answered_s = now_ms() as f64 / 1e3;
    let release = idle.wait_event("idle_release", |_| true);
    assert_eq!(release.u64("workers"), Some(n_idle), "{release:?}");
    let after = release.secs() - answered_s;
    assert!(
        (IDLE_S - 0.05..=IDLE_S + 3.0).contains(&after),
        "released {after:.2} s after the last answer, with --idle-release {IDLE_S}"
    );
    idle.wait_event("idle_released", |_| true);
    let left = idle.poll("the idle server's reservation given back", || {
        let r = host.reserved();
        (r == n_busy * TYP_MB).then_some(r)
    });
    assert_eq!(left, n_busy * TYP_MB);
    assert!(worker_pids(idle.pid()).is_empty(), "its workers are gone");

    // The busy neighbour takes the room.
    busy.signal(libc::SIGTTIN);
    let grown = busy.wait_event("ledger_grown", |_| true);
    assert_eq!(grown.u64("gpu"), Some(0), "{grown:?}");
    busy.wait_workers(n_busy as usize + 1);

    // The idle server's next request: re-admitted with what the ledger leaves, answered.
    let r = idle.post("/", INPUT);
    assert_eq!(r.status, 200, "{}", r.body);
    let e = idle.wait_event("idle_readmission", |_| true);
    assert_eq!(e.str("outcome"), Some("admitted"), "{e:?}");
    let back = e.u64("workers").unwrap();
    assert!(back >= 1 && back <= n_idle, "{e:?}");
    idle.wait_event("idle_readmitted", |_| true);
    // One worker starts first; the others admitted follow once it is ready.
    idle.wait_workers(back as usize);
    let total = idle.poll("both reservations in the ledger", || {
        let r = host.reserved();
        (r == (back + n_busy + 1) * TYP_MB).then_some(r)
    });
    assert!(total as f64 <= 40_960.0 * 0.9, "{total} MB reserved");
}

/// A released server whose GPU a neighbour has filled answers its next request 503 with
/// `Retry-After` (starting no worker that would not fit); readiness on its metrics port
/// says it is released; once the neighbour has gone, the next request is answered 200.
#[test]
fn a_request_with_no_room_to_readmit_is_answered_503_with_retry_after() {
    // One worker of this size fits the GPU's share once, not twice.
    const TYP_MB: u64 = 20_000;
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (idle, n_idle) = host.serving(&a, &["--idle-release", "1", "--metrics-port", "0"]);
    assert_eq!(n_idle, 1);
    idle.wait_event("idle_released", |_| true);
    idle.poll("the reservation given back", || {
        (host.reserved() == 0).then_some(())
    });
    let ready = http(idle.metrics_port(), "GET", "/health/ready", None);
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert!(ready.body.contains("released"), "{}", ready.body);

    let (neighbour, n) = host.serving(&b, &[]);
    assert_eq!(n, 1);
    let r = idle.post("/", INPUT);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("5"), "{:?}", r.headers);
    assert_eq!(r.json()["type"], "idle_no_room", "{}", r.body);
    let e = idle.wait_event("idle_readmission", |_| true);
    assert_eq!(e.str("outcome"), Some("no_room"), "{e:?}");
    assert!(worker_pids(idle.pid()).is_empty(), "no worker was started");
    assert_eq!(host.reserved(), TYP_MB, "only the neighbour's reservation");

    neighbour.signal(libc::SIGTERM);
    let mut neighbour = neighbour;
    neighbour.wait_exit(PATIENCE);
    let r = idle.post("/", INPUT);
    assert_eq!(r.status, 200, "{}", r.body);
    let lines = [
        "vramfork_idle_readmissions_total{outcome=\"no_room\"} 1",
        "vramfork_idle_readmissions_total{outcome=\"admitted\"} 1",
        "vramfork_idle_readmission_duration_seconds_count 1",
    ];
    // The master counts the re-admission's duration once it has seen the worker ready.
    idle.poll("the re-admission in the metrics", || {
        let scrape = http(idle.metrics_port(), "GET", "/metrics", None).body;
        lines.iter().all(|l| scrape.contains(l)).then_some(())
    });
}

/// "MPS: per-client limits follow the reservation", on re-admission: a server
/// released for being idle whose room a neighbour has since taken in part is re-admitted
/// with as many workers as that room holds at the figure per worker, each with that figure
/// as its MPS per-client limit, and their limits sum to its reservation (with limits of
/// usable ÷ the workers that fit, 4040 MB here, two admitted workers held 80 MB more than
/// the 8000 reserved for them).
#[test]
fn under_mps_a_readmitted_server_gets_the_workers_the_room_holds_at_the_reserved_limit() {
    const TYP_MB: u64 = 4000;
    let (_daemon, host) = Host::under_mps();
    let shared = A100_SHARE_MB;
    let (a, b) = (host.app(TYP_MB), host.app(14_000));
    let (idle, n) = host.serving(&a, &["--workers", "3", "--idle-release", "1"]);
    assert_eq!(n, 3);
    assert_eq!(mps_limits(&idle.wait_workers(3)), vec![TYP_MB; 3]);
    idle.wait_event("idle_released", |_| true);
    idle.poll("the reservation given back", || {
        (host.reserved_by(idle.pid()) == 0).then_some(())
    });
    // The neighbour takes 28,000 MB: 8,864 are left, which hold two workers and the reserve.
    let (neighbour, _) = host.serving(&b, &["--workers", "2"]);
    assert_eq!(host.reserved_by(neighbour.pid()), 28_000);
    let r = idle.post("/", INPUT);
    assert_eq!(r.status, 200, "{}", r.body);
    let e = idle.wait_event("idle_readmission", |_| true);
    assert_eq!(e.u64("workers"), Some(2), "{e:?}");
    let limits = mps_limits(&idle.wait_workers(2));
    assert_eq!(
        limits,
        vec![TYP_MB; 2],
        "each at the figure reserved for it"
    );
    let ours = idle.poll("the re-admitted reservation", || {
        let r = host.reserved_by(idle.pid());
        (r == 2 * TYP_MB).then_some(r)
    });
    assert!(limits.iter().sum::<u64>() <= ours);
    assert!(host.reserved() <= shared, "{:?}", host.reservations());
}

/// `--idle-release` is checked (a bad value is exit 2 naming the flag), and on a plan with
/// no worker on a GPU it is said to do nothing: only GPU memory is given back.
#[test]
fn idle_release_is_checked_and_does_nothing_on_the_cpu() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    let mut bad = Server::spawn(&app, &["--idle-release", "soon"], &[]);
    assert_eq!(
        bad.wait_exit(PATIENCE).code(),
        Some(2),
        "{}",
        bad.log_text()
    );
    assert!(
        bad.log_text().contains("--idle-release"),
        "{}",
        bad.log_text()
    );
    let cpu = Server::spawn(
        &app,
        &[
            "--production",
            "--device",
            "cpu",
            "--workers",
            "1",
            "--idle-release",
            "1",
        ],
        &[],
    )
    .wait_listening();
    let off = cpu.wait_event("idle_release_off", |_| true);
    assert!(
        off.message().contains("no worker is planned on a GPU"),
        "{off:?}"
    );
    cpu.wait_workers(1);
    let r = cpu.post("/", INPUT);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Sends `P` on a new connection (its first byte wakes the released master), then one more
/// byte of a request every 150 ms for up to `for_s` seconds, or until the server closes.
fn dripping(port: u16, for_s: u64) -> std::thread::JoinHandle<()> {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut c, b"P").unwrap();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        for b in b"OST / HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
            if t0.elapsed().as_secs() >= for_s || std::io::Write::write_all(&mut c, &[*b]).is_err()
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
    })
}

/// A released server with no room answers its 503s on the master: a client that sends its
/// request a byte every 150 ms must hold neither another client's 503 (answered within a
/// second) nor a TERM (acted on within a few seconds: the master exits).
#[test]
fn a_dripping_client_holds_neither_another_clients_503_nor_a_term() {
    const TYP_MB: u64 = 20_000;
    const DRIP_S: u64 = 12;
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (idle, _) = host.serving(&a, &["--idle-release", "1"]);
    idle.wait_event("idle_released", |_| true);
    idle.poll("the reservation given back", || {
        (host.reserved() == 0).then_some(())
    });
    let (_neighbour, _) = host.serving(&b, &[]);
    let refusals = || idle.events_named("idle_readmission").len();

    let drip = dripping(idle.port, DRIP_S);
    idle.poll("the dripping client taken", || {
        (refusals() >= 1).then_some(())
    });
    let t0 = std::time::Instant::now();
    let r = idle.post("/", INPUT);
    let waited = t0.elapsed();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        waited < std::time::Duration::from_secs(1),
        "a good client waited {waited:?} for its 503 while another dripped its request"
    );

    let before = refusals();
    let drip2 = dripping(idle.port, DRIP_S);
    idle.poll("the second dripping client taken", || {
        (refusals() > before).then_some(())
    });
    let t0 = std::time::Instant::now();
    idle.signal(libc::SIGTERM);
    let mut idle = idle;
    let status = idle.wait_exit(PATIENCE);
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(0), "{}", idle.log_text());
    assert!(
        took < std::time::Duration::from_secs(3),
        "TERM acted on {took:?} after it was sent, while a client dripped"
    );
    drip.join().unwrap();
    drip2.join().unwrap();
}

/// Keep-alive connections across an idle release: the retiring workers close each idle one
/// the standard way, with a FIN and no byte of an answer (never a reset, never a request
/// taken and dropped), so a client that checks a pooled connection before reusing it, as
/// urllib3, Go and curl do, finds it closed and opens a new one — whose request re-admits
/// the server and is answered 200, every time.
#[test]
fn kept_alive_connections_across_a_release_are_closed_gracefully() {
    const TYP_MB: u64 = 4000;
    let host = Host::new();
    let a = host.app(TYP_MB);
    let (idle, _) = host.serving(&a, &["--idle-release", "1", "--workers", "1"]);
    for round in 0..3 {
        let mut kept: Vec<std::net::TcpStream> = (0..4)
            .map(|_| {
                let mut c = std::net::TcpStream::connect(("127.0.0.1", idle.port)).unwrap();
                c.set_read_timeout(Some(PATIENCE)).unwrap();
                let req = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{INPUT}",
                    INPUT.len()
                );
                std::io::Write::write_all(&mut c, req.as_bytes()).unwrap();
                let r = read_one(&mut c).unwrap();
                assert_eq!(r.status, 200, "round {round}: {}", r.body);
                assert_ne!(r.header("connection"), Some("close"), "kept alive");
                c
            })
            .collect();
        let released = idle.events_named("idle_released").len();
        idle.poll("released", || {
            (idle.events_named("idle_released").len() > released).then_some(())
        });
        // Every kept connection was closed: an end of stream, no byte of an answer, no reset.
        for c in &mut kept {
            let mut buf = [0u8; 64];
            let n = std::io::Read::read(c, &mut buf);
            assert!(
                matches!(n, Ok(0)),
                "round {round}: a kept connection after the release read {n:?}"
            );
        }
        // The checking client opens a new connection: re-admitted, answered.
        let r = idle.post("/", INPUT);
        assert_eq!(r.status, 200, "round {round}: {}", r.body);
    }
}
