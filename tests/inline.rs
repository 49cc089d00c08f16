//! Small CPU passes on the worker's event loop (`--inline-passes`): the real `app`,
//! each request's access line saying where its pass ran (`inline`). A pass runs there only
//! after a streak of fast passes, only with `--torch-threads 1`, never with
//! `--inline-passes off`; a pass over 1 ms there ends the streak, one over 100 ms turns it
//! off for that worker; and a pass
//! stuck there keeps the worker's heartbeats going and retires it at `--request-timeout`, as
//! a pass stuck on the model thread does.

mod common;

use std::thread;

use common::{raw, App, Event, Server};

const STREAK: usize = 8;

fn mlp() -> App {
    App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#)
}

fn slow_app() -> App {
    App::new("slow.pt", "")
}

/// slow.pt's input: `n` iterations of a 64×64 product (about 22 µs each).
fn slow(n: u64) -> String {
    format!(r#"{{"inputs": [[{n}]]}}"#)
}

const MLP_INPUT: &str = r#"{"inputs": [[0.5, -1.0, 2.0, 0.25]]}"#;

/// Sends `body` as request `id`; returns the answer's status and body.
fn send(s: &Server, id: &str, body: &str) -> (u16, String) {
    let r = raw(
        s.port,
        "POST",
        "/",
        &format!("X-Request-Id: {id}\r\n"),
        body.as_bytes(),
    );
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// The access line of request `id` (waiting for it).
fn line_of(s: &Server, id: &str) -> Event {
    s.poll(&format!("the access line of {id}"), || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "access" && e.str("request_id") == Some(id))
    })
}

/// Whether request `id`'s pass ran on the event loop, as its access line says.
fn inline(s: &Server, id: &str) -> bool {
    let e = line_of(s, id);
    e.fields["inline"]
        .as_bool()
        .unwrap_or_else(|| panic!("{id}: no `inline` field in {:?}", e.fields))
}

/// Sends `body` (200 expected) until a request's pass runs on the event loop; returns how
/// many were sent. Each id is `{prefix}-{k}`.
fn until_inline(s: &Server, prefix: &str, body: &str) -> usize {
    let mut k = 0;
    s.poll("a pass run on the event loop", || {
        k += 1;
        let id = format!("{prefix}-{k}");
        let (status, text) = send(s, &id, body);
        assert_eq!(status, 200, "{id}: {text}");
        inline(s, &id).then_some(k)
    })
}

/// One worker with one torch thread and the access log, `extra` added; once it is ready.
fn one_worker(app: &App, extra: &[&str]) -> Server {
    let mut args = vec![
        "--production",
        "--workers",
        "1",
        "--torch-threads",
        "1",
        "--access-log",
    ];
    args.extend_from_slice(extra);
    let s = Server::start(app, &args);
    s.wait_workers(1);
    s
}

#[test]
fn small_passes_run_on_the_event_loop_after_a_fast_streak_only_where_allowed() {
    let app = mlp();
    let s = one_worker(&app, &[]);
    // The first passes run on the model thread: no streak yet.
    let mut first = None;
    for k in 0..STREAK {
        let id = format!("early-{k}");
        let (status, text) = send(&s, &id, MLP_INPUT);
        assert_eq!(status, 200, "{id}: {text}");
        assert!(
            !inline(&s, &id),
            "{id} ran on the event loop before {STREAK} passes"
        );
        first.get_or_insert(text);
    }
    let k = until_inline(&s, "late", MLP_INPUT);
    // The same input gives the same answer on either thread.
    let (status, text) = send(&s, "late-again", MLP_INPUT);
    assert_eq!(status, 200);
    let again = inline(&s, "late-again");
    assert_eq!(Some(&text), first.as_ref(), "late-{k}: inline {again}");
    drop(s);

    // Off, and with two torch threads (a second OpenMP team on the event loop): never.
    for args in [
        &["--inline-passes", "off", "--torch-threads", "1"][..],
        &["--torch-threads", "2"][..],
    ] {
        let mut all = vec!["--production", "--workers", "1", "--access-log"];
        all.extend_from_slice(args);
        let s = Server::start(&app, &all);
        s.wait_workers(1);
        for k in 0..4 * STREAK {
            let id = format!("never-{k}");
            let (status, text) = send(&s, &id, MLP_INPUT);
            assert_eq!(status, 200, "{args:?} {id}: {text}");
            assert_eq!(text, *first.as_ref().unwrap(), "{args:?} {id}");
            assert!(!inline(&s, &id), "{args:?}: {id} ran on the event loop");
        }
    }
}

#[test]
fn a_slow_pass_on_the_event_loop_ends_its_streak_and_a_very_slow_one_turns_it_off() {
    let app = slow_app();
    let s = one_worker(&app, &[]);
    // Same size as the fast passes, 200 iterations (over 1 ms of CPU): run on the event loop
    // (once the streak is unbroken just before it), it ends the streak: the next pass goes
    // to the model thread.
    until_inline(&s, "fast", &slow(1));
    let (status, text) = send(&s, "slow", &slow(200));
    assert_eq!(status, 200, "{text}");
    if inline(&s, "slow") {
        let (status, text) = send(&s, "next", &slow(1));
        assert_eq!(status, 200, "{text}");
        assert!(
            !inline(&s, "next"),
            "a pass over 1 ms should end the streak"
        );
    }
    // 20,000 iterations (about half a second): the first such pass run on the event loop
    // turns it off for this worker (on a busy machine a fast pass can take over 1 ms of CPU
    // too, and then the slow one goes to the model thread: try again).
    let mut round = 0;
    s.poll("a very slow pass run on the event loop", || {
        round += 1;
        until_inline(&s, &format!("fast{round}"), &slow(1));
        let id = format!("very-slow-{round}");
        let (status, text) = send(&s, &id, &slow(20_000));
        assert_eq!(status, 200, "{id}: {text}");
        inline(&s, &id).then_some(())
    });
    let off = s.poll("the inline_passes_off event", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "inline_passes_off")
    });
    assert!(off.f64("ms").unwrap() >= 100.0, "{off:?}");
    for k in 0..4 * STREAK {
        let id = format!("after-{k}");
        let (status, text) = send(&s, &id, &slow(1));
        assert_eq!(status, 200, "{id}: {text}");
        assert!(
            !inline(&s, &id),
            "{id} ran on the event loop after it was turned off"
        );
    }
}

#[test]
fn a_pass_stuck_on_the_event_loop_keeps_heartbeats_and_retires_at_the_request_timeout() {
    let app = slow_app();
    // The master kills a worker silent for 3 s; the pass is stuck for 5 s before
    // --request-timeout: only the watchdog's heartbeats keep it from being killed first.
    let s = one_worker(&app, &["--timeout", "3", "--request-timeout", "5"]);
    let mut worker = s.wait_workers(1)[0];
    let mut round = 0;
    let stuck = s.poll("a pass stuck on the event loop", || {
        round += 1;
        until_inline(&s, &format!("fast{round}"), &slow(1));
        let port = s.port;
        // About an hour of iterations: stuck, as far as the server can tell.
        let client = thread::spawn(move || {
            std::panic::catch_unwind(|| {
                raw(
                    port,
                    "POST",
                    "/",
                    "X-Request-Id: stuck\r\n",
                    slow(150_000_000).as_bytes(),
                )
            })
        });
        let retiring = s.wait_event("worker_retiring", |e| e.u64("pid") == Some(worker.into()));
        assert_eq!(
            retiring.str("reason"),
            Some("request_timeout"),
            "{retiring:?}"
        );
        let answer = client.join().unwrap();
        let replaced = s.wait_workers_where(1, |p| p != [worker])[0];
        let stuck_here = s.all_events().into_iter().find(|e| {
            e.name == "inline_pass_stuck" && e.u64("pid").is_none_or(|p| p == worker as u64)
        });
        let old = worker;
        worker = replaced;
        match stuck_here {
            // Stuck on the event loop: its client got no answer (the worker is gone).
            Some(e) => {
                if let Ok(r) = &answer {
                    panic!("the stuck request was answered {}: {:?}", r.status, r.body);
                }
                Some((old, e))
            }
            // It went to the model thread (a fast pass before it was slow): 504, again.
            None => {
                let r = answer.expect("the model thread's path answers");
                assert_eq!(r.status, 504, "{:?}", String::from_utf8_lossy(&r.body));
                None
            }
        }
    });
    let (old, e) = stuck;
    assert!(e.f64("seconds").unwrap() >= 5.0, "{e:?}");
    let killed: Vec<Event> = s
        .events_named("worker_killed")
        .into_iter()
        .filter(|k| k.u64("pid") == Some(old.into()))
        .collect();
    assert!(killed.is_empty(), "killed instead of retired: {killed:?}");
    let (status, text) = send(&s, "after", &slow(1));
    assert_eq!(status, 200, "{text}");
}
