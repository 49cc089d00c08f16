//! The tests' stand-in for an OTLP collector (`tests/support/otlp_receiver.py`, run in one of
//! its modes): its port, and every JSON line it printed (the spans it decoded, the
//! connections it accepted, the exports it refused or answered as its mode says).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, PATIENCE};

/// The receiver: its port and every line it printed (spans, refusals).
pub struct Receiver {
    child: Child,
    pub port: u16,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    pub fn start(mode: &str) -> Receiver {
        Receiver::start_with(mode, &[])
    }

    /// With more arguments (`--tls CERT KEY [CLIENT_CA]`).
    pub fn start_with(mode: &str, more: &[String]) -> Receiver {
        let script = common::fixtures()
            .parent()
            .unwrap()
            .join("support/otlp_receiver.py");
        let mut child = Command::new(common::python())
            .arg(script)
            .arg(mode)
            .args(more)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let hello: Value = serde_json::from_str(&first)
            .unwrap_or_else(|e| panic!("the receiver's first line {first:?}: {e}"));
        let port = hello["listening"].as_u64().expect("listening PORT") as u16;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Receiver { child, port, lines }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans of `trace` once `n` have arrived.
    pub fn spans_of(&self, trace: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let got: Vec<Value> = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l["trace_id"] == trace)
                .cloned()
                .collect();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans of {trace}: {got:#?}",
                got.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The spans `pick` keeps, once there are `n` of them.
    pub fn wait(&self, what: &str, n: usize, pick: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let got: Vec<Value> = self.all().into_iter().filter(|l| pick(l)).collect();
            if got.len() >= n {
                return got;
            }
            assert!(Instant::now() < deadline, "{what}: {got:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn all(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
