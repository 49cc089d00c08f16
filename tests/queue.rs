//! The waiting queue in `/metrics`: the real `app` serving slow.pt, its workers
//! held busy by passes that outlast the test, clients waiting behind them. The gauge
//! `vramfork_requests_waiting` reads them — in the listening socket's accept queue, read
//! from the kernel by the master (also on a socket handed over by systemd), and in a
//! worker's model queue — and `vramfork_queue_wait_seconds` counts how long each waited
//! once a worker takes it. Every wait here is on a state the server reports.

mod common;
#[path = "support/queue.rs"]
mod queue;

use std::time::Instant;

use common::{free_port, skip, App, Server};
use queue::{busy, clients, sum, wait_scrape, waiting};

/// Clients held waiting.
const N: usize = 5;

/// One torch thread (two make slow.pt crawl on a machine busy with other tests), and no
/// `--max-queue-wait`: the clients must wait as long as the test holds them.
const SLOW_ARGS: [&str; 4] = ["--torch-threads", "1", "--max-queue-wait", "0"];

fn start(app: &App, args: &[&str]) -> (Server, u16) {
    let mut all = vec!["--production", "--metrics-port", "0"];
    all.extend_from_slice(args);
    all.extend_from_slice(&SLOW_ARGS);
    let s = Server::start(app, &all);
    let port = s.metrics_port();
    (s, port)
}

/// Within one of `n`.
fn about(x: f64, n: usize) -> bool {
    (x - n as f64).abs() <= 1.0
}

#[test]
fn clients_held_behind_busy_workers_read_in_the_gauge_and_their_wait_in_the_histogram() {
    let app = App::new("slow.pt", "");
    let (s, mport) = start(&app, &["--workers", "2"]);
    let pids = s.wait_workers(2);
    let (_, idle) = wait_scrape(&s, mport, "an empty queue", |f| waiting(f) == (0.0, 0.0));
    assert!(sum(&idle, "vramfork_listen_queue_limit", &[]) >= 128.0);
    let before = sum(&idle, "vramfork_queue_wait_seconds_count", &[]);

    // Both workers busy, each with one pass that outlasts the test.
    let hogs = [busy(s.port), busy(s.port)];
    s.wait_pool(|p| p.u64("in_flight") == Some(2));
    let waiters = clients(s.port, N);
    let (_, held) = wait_scrape(&s, mport, &format!("{N} requests waiting"), |f| {
        let (listen, model) = waiting(f);
        about(listen + model, N)
    });
    let seen = Instant::now();
    let (listen, model) = waiting(&held);
    eprintln!("held {N}: the gauge reads listen {listen}, model {model}");
    assert_eq!(
        sum(&held, "vramfork_queue_wait_seconds_count", &[]),
        before,
        "nobody has been taken yet"
    );

    // The busy workers die (their clients see a reset); the replacements take the waiting
    // clients, who have waited at least from `seen` to now.
    let killed = Instant::now();
    for pid in &pids {
        // SAFETY: kill(2) on a worker pid of this test's server; no memory is involved.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    let held_for = killed.duration_since(seen).as_secs_f64();
    for w in waiters {
        assert_eq!(w.join().unwrap(), Ok(200), "a waiting client is served");
    }
    for h in hogs {
        assert!(h.join().unwrap().is_err(), "its worker was killed under it");
    }
    let (_, after) = wait_scrape(&s, mport, "the waits counted", |f| {
        sum(f, "vramfork_queue_wait_seconds_count", &[]) == before + N as f64
    });
    assert_eq!(waiting(&after), (0.0, 0.0), "nobody waits any more");
    // Each wait ran from its request's arrival, not from the accept: at least as long as
    // the test held it (the kernel counts in milliseconds and jiffies: 10 ms of slack).
    let waited = sum(&after, "vramfork_queue_wait_seconds_sum", &[])
        - sum(&idle, "vramfork_queue_wait_seconds_sum", &[]);
    assert!(
        waited >= N as f64 * (held_for - 0.01),
        "{N} waits summing {waited:.3} s, each held {held_for:.3} s at least"
    );
    let under = |le: &str| sum(&after, "vramfork_queue_wait_seconds_bucket", &[("le", le)]);
    assert_eq!(under("+Inf"), before + N as f64);
}

#[test]
fn requests_a_busy_worker_took_but_has_not_started_wait_in_its_model_queue() {
    // With batching, a worker takes up to max_batch_size requests while one pass runs:
    // three (or four) wait for the model in the worker, the others in the listen queue.
    let app = App::new("slow.pt", "");
    let (s, mport) = start(&app, &["--workers", "1", "--max-batch-size", "4"]);
    s.wait_workers(1);
    let _hog = busy(s.port);
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    let _waiters = clients(s.port, N);
    // The accept loop checks for room before a request it took has been read, so it may
    // take one more than the batch holds.
    let (_, f) = wait_scrape(&s, mport, "3 or more in the model queue", |f| {
        let (listen, model) = waiting(f);
        listen + model == N as f64 && model >= 3.0
    });
    let (listen, model) = waiting(&f);
    eprintln!("the gauge reads listen {listen}, model {model}");
    assert_eq!(
        sum(&f, "vramfork_requests_in_flight", &[]),
        model + 1.0,
        "in flight: the running pass and the queued requests"
    );
}

#[test]
fn the_queue_of_a_socket_handed_over_by_systemd_is_read_too() {
    if std::process::Command::new("systemd-socket-activate")
        .arg("--help")
        .output()
        .is_err()
    {
        skip(
            "queue::the_queue_of_a_socket_handed_over_by_systemd_is_read_too",
            "systemd-socket-activate not found: install Debian's systemd package (scripts/test does)",
        );
        return;
    }
    let app = App::new("slow.pt", "");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["--production", "--workers", "1", "--metrics-port", "0"];
    args.extend_from_slice(&SLOW_ARGS);
    let s = Server::spawn_under(&["systemd-socket-activate", "-l", &addr], &app, &args, &[]);
    // The first connection starts the master (retried until the launcher listens); its
    // request keeps the one worker busy.
    s.poll("systemd-socket-activate to listen", || {
        std::net::TcpStream::connect(&addr).ok().map(drop)
    });
    let _hog = busy(port);
    s.wait_event("listening", |e| e.str("socket") == Some("systemd"));
    let mport = s.metrics_port();
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    let _waiters = clients(port, N);
    wait_scrape(
        &s,
        mport,
        &format!("{N} waiting on systemd's socket"),
        |f| waiting(f) == (N as f64, 0.0),
    );
}
