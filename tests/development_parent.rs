//! Development mode (`app` without `--production`: one process, the worker itself) stops
//! when the process that started it is gone, as on SIGTERM: a wrapper stopped (a script,
//! `cargo run`, a test harness) no longer leaves it serving, re-parented to init.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{app_bin, App, Server, PATIENCE};

fn alive(pid: u32) -> bool {
    // A zombie is gone for this purpose (its parent, init, reaps it).
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn a_development_server_stops_when_what_started_it_is_gone() {
    let app = App::new("mlp.pt", r#""input": {"shape": [-1, 4]}"#);
    // A shell that starts the server and waits for it: what a script or `cargo run` is.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#""$@" & wait"#)
        .arg("sh")
        .arg(app_bin())
        .arg("--metadata")
        .arg(app.metadata())
        .args(["--port", "0"])
        .current_dir(app.dir.path())
        .env("VRAMFORK_LOG_FORMAT", "json");
    let mut s = Server::spawn_command(cmd).wait_listening();
    let pid = s.get("/healthz").pid();
    assert_ne!(pid, s.pid(), "the server is the shell's child");
    // The shell is killed (SIGKILL: it cannot pass anything on).
    s.child.as_mut().unwrap().kill().unwrap();
    s.child.as_mut().unwrap().wait().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the server (pid {pid}) serves on without what started it:\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = s.log_text();
    assert!(log.contains("is gone: stopping, as on SIGTERM"), "{log}");
}
