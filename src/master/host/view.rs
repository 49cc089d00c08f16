//! `app ledger [--json]`: the host at a glance, as `ollama ps` is for Ollama — each server
//! sharing the GPU-memory ledger (its app, port, id, GPUs, reserved MB, live workers,
//! state, last request, measured reload time) and what servers wait for — read from the
//! ledger's directory without taking its lock, so it never delays a server.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::master::host::ledger::{boot_ms, Entry, Ledger, State, Want, DEFAULT_DIR};

/// One server as `app ledger` shows it.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Its id in the ledger (`<pid>-<random>`: unique across pid namespaces).
    pub id: String,
    pub app: String,
    /// Its master's pid in its own pid namespace.
    pub pid: u32,
    pub port: Option<u16>,
    /// MB reserved per memory domain (a GPU's UUID, or a MIG GPU instance).
    pub gpus: std::collections::BTreeMap<String, u64>,
    pub reserved_mb: u64,
    pub live_workers: Option<u32>,
    /// serving, idle, lent, pinned or waiting; `null`: a server that does not say (an
    /// earlier release).
    pub state: Option<State>,
    /// Seconds since its last request (`null`: none yet, or not said).
    pub last_request_s: Option<f64>,
    pub reload_ms: Option<u64>,
    /// Seconds until it lends when asked (0: now; `null`: never).
    pub lendable_in_s: Option<f64>,
    /// The server it is lending its room to, while its workers exit.
    pub lending_to: Option<String>,
}

/// The whole view.
#[derive(Debug, Serialize)]
pub struct View {
    pub dir: PathBuf,
    pub servers: Vec<Row>,
    /// Servers waiting for room, and whom they asked.
    pub wants: Vec<Want>,
}

fn row(id: String, e: Entry, now: u64) -> Row {
    let s = e.status.as_ref();
    let secs = |ms: u64| now.saturating_sub(ms) as f64 / 1e3;
    Row {
        id,
        app: e.app.clone(),
        pid: e.pid,
        port: s.map(|s| s.port),
        reserved_mb: e.gpus.values().fold(0u64, |a, b| a.saturating_add(*b)),
        gpus: e.gpus.clone(),
        live_workers: s.map(|s| s.live_workers),
        state: s.map(|s| s.state),
        last_request_s: s.and_then(|s| s.last_request_boot_ms).map(secs),
        reload_ms: s.and_then(|s| s.reload_ms),
        lendable_in_s: s
            .and_then(|s| s.lendable_from_boot_ms)
            .map(|f| f.saturating_sub(now) as f64 / 1e3),
        lending_to: s.and_then(|s| s.lending_to.clone()),
    }
}

/// The ledger in `dir` as it is now. `Err`: it cannot be read (the message says why).
pub fn read(dir: &Path) -> Result<View, String> {
    let ledger = match Ledger::open(dir, "", None, false) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Ok(View {
                dir: dir.to_path_buf(),
                servers: Vec::new(),
                wants: Vec::new(),
            })
        }
        Err(e) => return Err(e.to_string()),
    };
    let now = boot_ms();
    let mut servers: Vec<Row> = ledger
        .servers()?
        .into_iter()
        .map(|(id, e)| row(id, e, now))
        .collect();
    servers.sort_by(|a, b| (&a.app, a.port, &a.id).cmp(&(&b.app, b.port, &b.id)));
    Ok(View {
        dir: dir.to_path_buf(),
        servers,
        wants: ledger.wants()?,
    })
}

/// The view as a table.
pub fn text(v: &View) -> String {
    let mut out = format!("ledger: {}\n", v.dir.display());
    out += &format!(
        "{:<20} {:>6} {:<24} {:>9} {:>7} {:<8} {:>12} {:>10}\n",
        "APP", "PORT", "ID", "RESERVED", "WORKERS", "STATE", "LAST REQUEST", "RELOAD"
    );
    for r in &v.servers {
        let or = |o: Option<String>| o.unwrap_or_else(|| "-".into());
        out += &format!(
            "{:<20} {:>6} {:<24} {:>6} MB {:>7} {:<8} {:>12} {:>10}\n",
            r.app,
            or(r.port.map(|p| p.to_string())),
            r.id,
            r.reserved_mb,
            or(r.live_workers.map(|n| n.to_string())),
            or(r.state.map(|s| format!("{s:?}").to_lowercase())),
            or(r.last_request_s.map(|s| format!("{s:.0} s ago"))),
            or(r.reload_ms.map(|ms| format!("{ms} ms"))),
        );
    }
    for w in &v.wants {
        out += &format!(
            "{} ({}) waits for {:?} MB, asking {}\n",
            w.app,
            w.id,
            w.short_mb,
            if w.from.is_empty() {
                "nobody yet".to_string()
            } else {
                w.from.join(", ")
            }
        );
    }
    out
}

/// `app ledger`: prints the ledger named by `--ledger` (`VRAMFORK_LEDGER`, else the
/// default) and returns the exit status: 2 when it is off or cannot be read.
pub fn run(ledger: Option<&std::ffi::OsStr>, json: bool) -> i32 {
    let dir = ledger.map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from);
    if dir.as_os_str() == "off" {
        eprintln!("app ledger: --ledger off: there is no ledger to show");
        return 2;
    }
    match read(&dir) {
        Ok(v) if json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&v).expect("a view serializes")
            );
            0
        }
        Ok(v) => {
            print!("{}", text(&v));
            0
        }
        Err(e) => {
            eprintln!("app ledger: {e}");
            2
        }
    }
}
