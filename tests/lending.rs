//! Lending GPU room between the servers of one host (`src/master/host/lending.rs`,
//! `src/master/supervisor/lend.rs`): an idle server gives its room to a neighbour that
//! asks through the ledger, a pinned one never does, a request arriving at a server that
//! holds no room waits for it up to its deadline, and `app ledger` shows it all. Real `app`
//! servers against one simulated A100 (the NVML stand-in) sharing one ledger, as in
//! `tests/idle_release.rs`.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::host::Host;
use common::*;
use serde_json::Value;

/// One worker of this size fits the A100's share once, not twice.
const BIG_MB: u64 = 20_000;
const INPUT: &str = r#"{"inputs": [[1.0, 2.0, 3.0, 4.0]]}"#;

/// `app ledger --json` of `host`'s ledger.
fn ledger(host: &Host) -> Value {
    let out = Command::new(app_bin())
        .args(["ledger", "--json", "--ledger"])
        .arg(host.ledger())
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The row of the server whose master is `pid`.
fn row(host: &Host, pid: u32) -> Option<Value> {
    let v = ledger(host);
    let rows = v["servers"].as_array().unwrap().clone();
    rows.into_iter().find(|r| r["pid"] == pid)
}

/// Waits until the server of `pid` shows `state` in the ledger.
fn wait_state(host: &Host, s: &Server, state: &str) -> Value {
    s.poll(&format!("state {state} in the ledger"), || {
        row(host, s.pid()).filter(|r| r["state"] == state)
    })
}

/// Requests to `port` one after another until `stop` is set: a server kept busy.
fn keep_busy(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let r = http(port, "POST", "/", Some(INPUT));
            assert_eq!(r.status, 200, "{}", r.body);
        }
    })
}

/// `app ledger --json` lists every server sharing the ledger with its port, id, reserved
/// MB, live workers and state (read without the ledger's lock), and a pinned server says so.
#[test]
fn app_ledger_lists_every_server_with_its_state() {
    const TYP_MB: u64 = 4000;
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (pinned, n_p) = host.serving(&a, &["--workers", "1", "--pin"]);
    let (other, n_o) = host.serving(&b, &["--workers", "2", "--metrics-port", "0"]);
    let p = wait_state(&host, &pinned, "pinned");
    assert_eq!(p["port"], pinned.port, "{p}");
    assert_eq!(p["reserved_mb"], n_p * TYP_MB, "{p}");
    assert_eq!(p["live_workers"], 1, "{p}");
    let o = wait_state(&host, &other, "serving");
    assert_eq!(o["port"], other.port, "{o}");
    assert_eq!(o["reserved_mb"], n_o * TYP_MB, "{o}");
    assert_eq!(o["live_workers"], 2, "{o}");
    assert!(
        o["reload_ms"].as_u64().is_some(),
        "a worker's boot measured: {o}"
    );
    assert_ne!(p["id"], o["id"]);
    assert_eq!(ledger(&host)["servers"].as_array().unwrap().len(), 2);
    // Each server's /metrics shows the ledger it sees, its neighbours too.
    let pinned_line = other.poll("the pinned neighbour in /metrics", || {
        let scrape = http(other.metrics_port(), "GET", "/metrics", None).body;
        scrape
            .lines()
            .find(|l| {
                l.starts_with("vramfork_ledger_reserved_bytes{")
                    && l.contains(&format!("port=\"{}\"", pinned.port))
                    && l.contains("state=\"pinned\"")
            })
            .map(str::to_string)
    });
    let bytes: f64 = pinned_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(bytes, (n_p * TYP_MB * 1024 * 1024) as f64, "{pinned_line}");
    // A request is seen as the last one.
    assert_eq!(other.post("/", INPUT).status, 200);
    other.poll("the last request in the ledger", || {
        row(&host, other.pid()).filter(|r| r["last_request_s"].as_f64().is_some_and(|s| s < 10.0))
    });
}

/// Two servers that cannot both fit on the GPU: the idle one lends its room to the newcomer
/// (its workers retire), its own next request waits for room and is answered 200 once the
/// newcomer is idle in turn and lends it back.
#[test]
fn an_idle_server_lends_to_a_newcomer_and_its_next_request_waits_for_room() {
    let host = Host::new();
    let (a, b) = (host.app(BIG_MB), host.app(BIG_MB));
    let (first, n) = host.serving(&a, &["--evictable-after", "1", "--access-log"]);
    assert_eq!(n, 1);
    wait_state(&host, &first, "idle");
    let (newcomer, n) = host.serving(&b, &["--evictable-after", "1"]);
    assert_eq!(n, 1);
    let lent = first.wait_event("lent", |_| true);
    assert_eq!(lent.u64("workers"), Some(1), "{lent:?}");
    newcomer.wait_event("room_lent", |e| e.str("outcome") == Some("given"));
    assert_eq!(host.reserved(), BIG_MB, "{:?}", host.reservations());
    wait_state(&host, &first, "lent");

    let t0 = Instant::now();
    let r = first.post("/", INPUT);
    assert_eq!(r.status, 200, "{}", r.body);
    let waited = first.wait_event("room_wait", |_| true);
    assert_eq!(waited.str("outcome"), Some("given"), "{waited:?}");
    assert!(t0.elapsed() < PATIENCE);
    // The wait is the request's wait in the access log (it sat in the listen queue).
    let access = first.poll("the access line", || {
        first.all_events().into_iter().find(|e| e.name == "access")
    });
    let (wait_ms, room_ms) = (
        access.f64("wait_ms").unwrap(),
        waited.f64("waited_s").unwrap() * 1e3,
    );
    assert!(
        wait_ms + 50.0 >= room_ms,
        "{access:?} waited {room_ms} ms for room"
    );
    let lent_back = newcomer.wait_event("lent", |_| true);
    assert_eq!(lent_back.u64("workers"), Some(1), "{lent_back:?}");
    first.poll("only the first server's room reserved", || {
        (host.reserved() == BIG_MB && host.reserved_by(first.pid()) == BIG_MB).then_some(())
    });
}

/// A pinned server keeps its room: a newcomer that finds no room for one worker because
/// of it exits 2 naming it, and the pinned server still serves.
#[test]
fn a_pinned_server_keeps_its_room() {
    let host = Host::new();
    let b = host.app(BIG_MB);
    // Pinned by its metadata (`--pin` is the same: `app_ledger_lists_every_server_...`).
    let a = App::new(
        "mlp.pt",
        &format!(
            r#""input": {{"shape": [-1, 4]}}, "est_gpu_mem_min": 1000, "est_gpu_mem_typ": {BIG_MB}, "pin": true"#
        ),
    );
    let (pinned, _) = host.serving(&a, &["--evictable-after", "1"]);
    wait_state(&host, &pinned, "pinned");
    std::thread::sleep(Duration::from_millis(1500)); // idle past its --evictable-after
    let mut refused = host.spawn(&b, &["--production", "--evictable-after", "1"]);
    let st = refused.wait_exit(PATIENCE);
    let log = refused.log_text();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains("pinned"), "{log}");
    assert!(log.contains(&format!("port {}", pinned.port)), "{log}");
    assert!(pinned.events_named("lent").is_empty());
    assert_eq!(host.reserved_by(pinned.pid()), BIG_MB);
    assert_eq!(pinned.post("/", INPUT).status, 200);
}

/// A request at a server holding no room waits while its neighbour is busy, and is
/// answered 503 with Retry-After when its deadline (--request-timeout) would pass.
#[test]
fn a_request_whose_deadline_passes_while_waiting_gets_503_with_retry_after() {
    let host = Host::new();
    let (a, b) = (host.app(BIG_MB), host.app(BIG_MB));
    let (first, _) = host.serving(&a, &["--evictable-after", "1", "--request-timeout", "8"]);
    wait_state(&host, &first, "idle");
    let (busy, _) = host.serving(&b, &["--evictable-after", "2"]);
    first.wait_event("lent", |_| true);
    wait_state(&host, &first, "lent");
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = keep_busy(busy.port, stop.clone());
    let t0 = Instant::now();
    let r = first.post("/", INPUT);
    let waited = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(12),
        "answered after {waited:?} with a deadline of 8 s"
    );
    let e = first.wait_event("room_wait", |_| true);
    assert_eq!(e.str("outcome"), Some("deadline"), "{e:?}");
    assert!(busy.events_named("lent").is_empty(), "the busy server lent");
}

/// Two released servers whose requests arrive together, with room for one: neither holds
/// room while it waits, so the one that gets it serves, goes idle and lends to the other:
/// both are answered 200.
#[test]
fn two_waiting_servers_never_deadlock() {
    let host = Host::new();
    let (a, b) = (host.app(BIG_MB), host.app(BIG_MB));
    let args = ["--idle-release", "2", "--evictable-after", "1"];
    let (one, _) = host.serving(&a, &args);
    one.wait_event("idle_released", |_| true);
    let (two, _) = host.serving(&b, &args);
    two.wait_event("idle_released", |_| true);
    one.poll("both released", || (host.reserved() == 0).then_some(()));
    let (p1, p2) = (one.port, two.port);
    let t1 = std::thread::spawn(move || http(p1, "POST", "/", Some(INPUT)));
    let t2 = std::thread::spawn(move || http(p2, "POST", "/", Some(INPUT)));
    let (r1, r2) = (t1.join().unwrap(), t2.join().unwrap());
    assert_eq!(r1.status, 200, "{}", r1.body);
    assert_eq!(r2.status, 200, "{}", r2.body);
    let waited = [&one, &two]
        .iter()
        .filter(|s| !s.events_named("room_wait").is_empty())
        .count();
    assert!(waited >= 1, "one of them waited for the other's room");
}

/// A server killed while it waits for room leaves nothing stuck: its want (and its entry)
/// expire with their lease, and `app ledger` shows no one waiting.
#[test]
fn a_server_killed_while_waiting_for_room_leaves_nothing_stuck() {
    let host = Host::new();
    let (a, b) = (host.app(BIG_MB), host.app(BIG_MB));
    let (first, _) = host.serving(&a, &["--evictable-after", "1", "--request-timeout", "120"]);
    wait_state(&host, &first, "idle");
    let (busy, _) = host.serving(&b, &["--evictable-after", "5"]);
    first.wait_event("lent", |_| true);
    wait_state(&host, &first, "lent");
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = keep_busy(busy.port, stop.clone());
    let port = first.port;
    let waiting = std::thread::spawn(move || try_http(port, "POST", "/", Some(INPUT)));
    wait_state(&host, &first, "waiting");
    first.poll("its want in the ledger", || {
        let wants = ledger(&host)["wants"].as_array().unwrap().len();
        (wants == 1).then_some(())
    });
    first.signal(libc::SIGKILL);
    let _ = waiting.join();
    let t0 = Instant::now();
    first.poll("its want and entry expired", || {
        let v = ledger(&host);
        let gone = v["wants"].as_array().unwrap().is_empty()
            && v["servers"].as_array().unwrap().len() == 1;
        gone.then_some(())
    });
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    assert_eq!(host.reserved(), BIG_MB, "only the busy server's room");
}

/// Growing by TTIN asks too: a server whose TTIN finds no room left in the ledger asks the
/// idle neighbour holding it, which lends; the next TTIN grows the pool into that room.
#[test]
fn a_ttin_without_room_asks_an_idle_neighbour_and_the_next_one_grows() {
    const SMALL_MB: u64 = 9000;
    let host = Host::new();
    let (a, b) = (host.app(BIG_MB), host.app(SMALL_MB));
    let (idle, _) = host.serving(&a, &["--evictable-after", "1", "--workers", "1"]);
    wait_state(&host, &idle, "idle");
    let (growing, n) = host.serving(&b, &[]);
    assert_eq!(
        n, 1,
        "the room left holds one worker of {SMALL_MB} MB and the reserve"
    );
    growing.signal(libc::SIGTTIN);
    growing.wait_event("ttin_refused", |_| true);
    let asked = growing.wait_event("room_asked", |_| true);
    assert_eq!(asked.u64("lenders"), Some(1), "{asked:?}");
    idle.wait_event("lent", |_| true);
    idle.poll("the idle server's room given", || {
        (host.reserved_by(idle.pid()) == 0).then_some(())
    });
    growing.signal(libc::SIGTTIN);
    growing.wait_workers(2);
    assert_eq!(host.reserved_by(growing.pid()), 2 * SMALL_MB);
}
