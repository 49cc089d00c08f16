//! Process tests of how connections are shared between workers (the idle board,
//! `src/board.rs`): while a worker is idle, no request waits behind another worker's. The
//! real `app --production`, the slow fixture, HTTP over loopback; bounded loops.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::*;

/// Tries per case: a dispatch that put two requests on one worker half of the time would
/// pass all of them with a chance of 2^-25.
const TRIES: usize = 25;

/// slow.pt iterations per request (~22 µs each on an idle build machine: a few hundred ms).
const SLOW_N: u64 = 8000;

/// One POST on a new connection, sent the way common HTTP clients send it: the head, then
/// the body in a second write a moment later (Python's `http.client` does two sends; with
/// Nagle and delayed ACKs the body can trail the head by tens of milliseconds). Returns the
/// answering worker's pid.
fn post_in_two_parts(port: u16, body: &str) -> u32 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send the head");
    thread::sleep(Duration::from_millis(20));
    s.write_all(body.as_bytes()).expect("send the body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let r = parse_response(&raw).expect("an HTTP answer");
    assert_eq!(r.status, 200, "{}", r.body);
    r.pid()
}

/// Sends `k` slow requests at the same moment, each on its own connection, `TRIES` times,
/// and asserts that every time they were answered by `k` different workers.
fn k_requests_land_on_k_workers(s: &Server, k: usize) {
    let body = format!(r#"{{"inputs": [[{SLOW_N}]]}}"#);
    let mut shared = Vec::new();
    for t in 0..TRIES {
        let barrier = Arc::new(Barrier::new(k));
        let handles: Vec<_> = (0..k)
            .map(|_| {
                let (barrier, body, port) = (barrier.clone(), body.clone(), s.port);
                thread::spawn(move || {
                    barrier.wait();
                    post_in_two_parts(port, &body)
                })
            })
            .collect();
        let pids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let distinct: BTreeSet<u32> = pids.iter().copied().collect();
        if distinct.len() < k {
            shared.push(format!("try {t}: {pids:?}"));
        }
    }
    assert!(
        shared.is_empty(),
        "{} of {TRIES} tries put two of {k} simultaneous requests on one worker while another was idle: {shared:?}\n{}",
        shared.len(),
        s.log_text()
    );
}

fn start(workers: &str, extra: &[&str]) -> (App, Server) {
    let app = App::new("slow.pt", "");
    let mut args = vec!["--production", "--workers", workers];
    args.extend_from_slice(extra);
    let s = Server::start(&app, &args);
    s.wait_workers(workers.parse().unwrap());
    (app, s)
}

#[test]
fn two_simultaneous_requests_go_to_two_idle_workers() {
    let (_app, s) = start("2", &[]);
    k_requests_land_on_k_workers(&s, 2);
}

#[test]
fn four_simultaneous_requests_go_to_four_idle_workers() {
    let (_app, s) = start("4", &[]);
    k_requests_land_on_k_workers(&s, 4);
}

/// Keep-alive connections do not stay where they first landed while a worker idles: two
/// clients kept alive on one worker (the only one when they connected) are spread over two
/// once a second worker is free — the worker answers one of them with `Connection: close`
/// while the other's request waits behind, and the client reconnects to the free one — and
/// are served side by side from then on. (Before, both stayed on the first worker for as
/// long as their connections lived, each request waiting behind the other's.)
#[test]
fn keep_alive_clients_sharing_a_worker_move_to_an_idle_one() {
    let (_app, s) = start("1", &["--torch-threads", "1"]);
    let body = format!(r#"{{"inputs": [[{SLOW_N}]]}}"#);
    let first = s.ready_pids()[0];
    let mut clients: Vec<KeepAlive> = (0..2).map(|_| KeepAlive::new(s.port)).collect();
    for c in &mut clients {
        let r = c.post("/", &body).expect("an answer");
        assert_eq!((r.status, r.pid()), (200, first), "{}", r.body);
    }
    s.signal(libc::SIGTTIN);
    s.wait_workers(2);
    let handles: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let body = body.clone();
            thread::spawn(move || {
                (0..10)
                    .map(|_| {
                        let r = c.post("/", &body).expect("an answer");
                        assert_eq!(r.status, 200, "{}", r.body);
                        r.pid()
                    })
                    .collect::<Vec<u32>>()
            })
        })
        .collect();
    let answered: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let settled: Vec<BTreeSet<u32>> = answered
        .iter()
        .map(|pids| pids[5..].iter().copied().collect())
        .collect();
    assert!(
        settled.iter().all(|p| p.len() == 1) && settled[0] != settled[1],
        "each client's last five answers come from one worker, a different one for each \
         client: {answered:?}"
    );
}

/// With batching a worker accepts up to `max_batch_size` requests, but an idle sibling
/// still gets a request before a busy worker queues it.
#[test]
fn with_batching_an_idle_worker_still_gets_the_next_request() {
    let (_app, s) = start("2", &["--max-batch-size", "4"]);
    k_requests_land_on_k_workers(&s, 2);
}

/// The same with every core busy: a worker woken late is still waited for.
#[test]
fn under_a_cpu_hog_requests_still_go_to_idle_workers() {
    let (_app, s) = start("2", &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..num_cpus())
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    k_requests_land_on_k_workers(&s, 2);
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
}

/// Recycling replaces workers (new seats on the board, old ones cleared): dispatch still
/// finds the idle one; and a worker that died showing free is not waited for.
#[test]
fn after_recycling_and_a_killed_worker_requests_still_go_to_idle_workers() {
    // Each worker answers one request per try, so both reach --max-requests on the last.
    let max = TRIES.to_string();
    let (_app, s) = start("2", &["--max-requests", &max]);
    let first = s.wait_workers(2);
    k_requests_land_on_k_workers(&s, 2);
    let second = s.wait_workers_where(2, |pids| pids.iter().all(|p| !first.contains(p)));
    // SAFETY: kill(2) on a worker's pid; the worst a wrong pid could do is fail.
    unsafe { libc::kill(second[0] as i32, libc::SIGKILL) };
    s.wait_workers_where(2, |pids| {
        !pids.contains(&second[0]) && pids.iter().all(|p| !first.contains(p))
    });
    k_requests_land_on_k_workers(&s, 2);
}

fn num_cpus() -> usize {
    thread::available_parallelism().map_or(2, |n| n.get())
}
