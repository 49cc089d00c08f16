//! `http-floor`: the HTTP floor that `scripts/bench` compares served small-model throughput
//! with — what answering a POST costs on these cores with no model at all. Bare hyper, the
//! worker's own settings (HTTP/1.1 keep-alive, one current-thread tokio runtime per process,
//! `TCP_NODELAY`), pre-forked on one listening socket like vramfork's workers, reading each
//! request's body and answering a fixed small JSON (the small MLP's answer).
//!
//! Usage: `http-floor WORKERS` — binds 127.0.0.1 on a free port, prints `{"port": N}`, forks
//! WORKERS processes that serve until the parent dies (`PR_SET_PDEATHSIG`), and waits.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;

const ANSWER: &[u8] = br#"{"outputs":[[-0.11241218,0.8298131,0.25520408]]}"#;

fn main() {
    let workers: u32 = match std::env::args().nth(1).map(|s| s.parse()) {
        Some(Ok(n)) if (1..=64).contains(&n) => n,
        _ => {
            eprintln!("usage: http-floor WORKERS (1-64)");
            std::process::exit(2);
        }
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let parent = std::process::id() as libc::pid_t;
    for _ in 0..workers {
        // SAFETY: fork in a single-threaded process (no runtime has started yet); the child
        // only builds its own runtime and serves.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: prctl/getppid have no memory-safety preconditions.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            }
            serve(listener);
            std::process::exit(0);
        }
        assert!(pid > 0, "fork failed");
    }
    println!("{{\"port\": {port}}}");
    // Serve until killed; the children die with us.
    loop {
        // SAFETY: pause(2) only waits for a signal.
        unsafe { libc::pause() };
    }
}

fn serve(listener: std::net::TcpListener) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let mut r = Response::new(Full::new(Bytes::from_static(ANSWER)));
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}
