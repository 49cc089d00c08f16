//! The GPU-memory ledger the servers of one host share (`--ledger DIR`, default
//! `/run/vramfork`): each server that plans workers on GPUs reserves the memory its plan
//! gives them — per memory domain (a GPU, or the GPU instance a MIG device belongs to), in
//! a file of its own, `server-<id>.json`, that only it writes — and plans against what is
//! usable **less the live reservations of the others**, so servers started together do not
//! plan on the same free memory.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`Ledger`]: this server's place in the directory; reading the others, writing its own |
//! | `book.rs` | the entry format, leases by `CLOCK_BOOTTIME`, what an entry must be to count |
//! | `files.rs` | the directory check, opening only regular files, bounded reads, atomic replacement |
//! | `lock.rs` | the lock that serialises starts, only ever tried for a bounded time |
//!
//! The lock (`flock` on `gpu-ledger.lock`) is taken only around "read the others, plan,
//! write one's own" at start (profiling runs without it, under a provisional reservation of
//! the estimate) and around a re-admission after `--idle-release`; never to renew: a server
//! renews by rewriting its own file, so nothing another process does to the lock can hold a
//! serving master. Reading needs no lock: each file is replaced whole (renamed over).
//!
//! A reservation is a lease: it expires [`LEASE`] after it was last written, and a serving
//! master renews it every [`RENEW_EVERY`] (and rewrites it when its workers change). A
//! master killed with SIGKILL blocks nothing for longer than the lease, in containers too:
//! expiry is by the host's boot clock, never by pid (pids of other pid namespaces mean
//! nothing here).

mod book;
mod files;
mod lock;
mod wants;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use book::{boot_ms, Domain, Domains, Entry, Others, State, Status};
use book::{Now, Verdict};
pub use files::Unusable;
pub use lock::{Held, NotTaken};
pub use wants::Want;

/// Where servers share their ledger unless `--ledger` says otherwise.
pub const DEFAULT_DIR: &str = "/run/vramfork";
/// How long a reservation lives without being renewed.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a serving master renews its reservation.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long a starting server waits for the lock before it refuses to start.
pub const START_WAIT: Duration = Duration::from_secs(10);
/// How long the supervisor's loop tries the lock (a re-admission) before it gives up for
/// this turn.
pub const LOOP_WAIT: Duration = Duration::from_millis(100);

const LOCK_NAME: &str = "gpu-ledger.lock";
/// The earlier release's one shared file: read (its live entries count), never written.
const OLD_NAME: &str = "gpu-ledger.json";
const PREFIX: &str = "server-";
const SUFFIX: &str = ".json";
/// More than any entry a server writes (a few hundred bytes).
const MAX_ENTRY_BYTES: u64 = 64 << 10;
const MAX_OLD_BYTES: u64 = 1 << 20;
/// More entry files than any host's servers: a directory holding more is not a ledger.
const MAX_ENTRIES: usize = 4096;

/// This server's place in a ledger directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
    id: String,
    app: String,
    seat: Option<String>,
    /// What was said of other files already (each is said once).
    said: Arc<Mutex<BTreeSet<String>>>,
    /// Whether a predecessor's entry at this seat was removed already.
    seat_cleared: Arc<AtomicBool>,
    /// What this server says of itself in its entry (`None`: nothing), written with its
    /// reservation.
    status: Arc<Mutex<Option<Status>>>,
}

impl Ledger {
    /// The ledger in `dir`, checked ([`files::check_dir`]; made when missing and `write`),
    /// for a server of app `app` serving at `seat` (see [`book::Entry::seat`]); `write`:
    /// to reserve, else only to read. `Ok(None)`: reading, and there is no directory.
    pub fn open(
        dir: &Path,
        app: &str,
        seat: Option<String>,
        write: bool,
    ) -> Result<Option<Ledger>, Unusable> {
        let Some(state) = files::check_dir(dir, write, write)? else {
            return Ok(None);
        };
        if state.world_writable && write {
            tracing::warn!(
                target: "app",
                event = "ledger_world_writable",
                dir = %dir.display(),
                "the GPU-memory ledger's directory {} is writable by every user: any local user can delay or refuse this server's start and claim GPU memory in it (never hold a serving server); give it to the servers' group instead (docs/security.md, \"The GPU ledger\")",
                dir.display()
            );
        }
        let id = format!("{}-{:016x}", std::process::id(), random());
        Ok(Some(Ledger {
            dir: dir.to_path_buf(),
            id,
            app: app.to_string(),
            seat,
            said: Arc::default(),
            seat_cleared: Arc::default(),
            status: Arc::default(),
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This server's id in the ledger: `<pid>-<random>`, unique across pid namespaces.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn own_name(&self) -> String {
        format!("{PREFIX}{}{SUFFIX}", self.id)
    }

    /// Tries the lock for up to `within`, calling `waiting(holder)` once if it is busy.
    pub fn lock(
        &self,
        within: Duration,
        waiting: impl FnOnce(Option<u32>),
    ) -> Result<Held, NotTaken> {
        lock::take(&self.dir.join(LOCK_NAME), within, waiting)
    }

    pub fn lock_path(&self) -> PathBuf {
        self.dir.join(LOCK_NAME)
    }

    /// The other servers' live reservations by memory domain, for a server whose devices
    /// are `domains`. `Err`: the ledger cannot be read (the message names what).
    pub fn others(&self, domains: &Domains) -> Result<BTreeMap<String, Others>, String> {
        let now = Now::read();
        let mut out = BTreeMap::new();
        for (name, e) in self.entries()? {
            if name == self.own_name() || (self.seat.is_some() && e.seat == self.seat) {
                continue;
            }
            match book::judge(&e, &now, domains) {
                Verdict::Live => book::add(&mut out, &e.gpus),
                Verdict::Expired => {}
                Verdict::Dropped(why) => self.drop_said(&name, &why),
            }
        }
        self.old_entries(&now, domains, &mut out)?;
        Ok(out)
    }

    /// Every entry file's entry (by file name); one that is not an entry is said and left
    /// out. `Err`: the directory cannot be listed, holds too many, or holds something other
    /// than a regular file under an entry's name.
    fn entries(&self) -> Result<Vec<(String, Entry)>, String> {
        let list =
            std::fs::read_dir(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let mut names = Vec::new();
        for d in list {
            let d = d.map_err(|e| format!("{}: {e}", self.dir.display()))?;
            let name = d.file_name().to_string_lossy().into_owned();
            if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
                names.push(name);
            }
            if names.len() > MAX_ENTRIES {
                return Err(format!(
                    "{} holds more than {MAX_ENTRIES} entry files: not a ledger",
                    self.dir.display()
                ));
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = self.dir.join(&name);
            let Some(f) = files::open_regular(&path, None).map_err(|e| e.to_string())? else {
                continue; // removed since it was listed
            };
            let parsed = files::read_bounded(f, &path, MAX_ENTRY_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Entry>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(e) => out.push((name, e)),
                Err(why) => self.drop_said(&name, &format!("it is not a ledger entry ({why})")),
            }
        }
        Ok(out)
    }

    /// The earlier release's shared file's live entries, added to `out`.
    fn old_entries(
        &self,
        now: &Now,
        domains: &Domains,
        out: &mut BTreeMap<String, Others>,
    ) -> Result<(), String> {
        let path = self.dir.join(OLD_NAME);
        let Some(f) = files::open_regular(&path, None).map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let read = files::read_bounded(f, &path, MAX_OLD_BYTES).map_err(|e| e.to_string());
        match read.and_then(|b| book::old_entries(&b, now, domains)) {
            Ok(live) => live.iter().for_each(|g| book::add(out, g)),
            Err(why) => self.drop_said(
                OLD_NAME,
                &format!("it is not the earlier release's ledger ({why}); what servers of that release reserve there is not counted"),
            ),
        }
        Ok(())
    }

    /// Says once that file `name` counts for nothing, and why.
    fn drop_said(&self, name: &str, why: &str) {
        let key = format!("{name}: {why}");
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.insert(key) {
            tracing::warn!(
                target: "app",
                event = "ledger_entry_dropped",
                file = %self.dir.join(name).display(),
                "the GPU-memory ledger's {} counts for nothing: {why}",
                self.dir.join(name).display()
            );
        }
    }

    /// Writes this server's reservation (`mb` per memory domain) with a fresh lease,
    /// replacing its own file; needs no lock. The first write also removes a predecessor's
    /// entry at this server's seat, where this user may.
    pub fn reserve(&self, gpus: &BTreeMap<String, u64>) -> std::io::Result<()> {
        let now = Now::read();
        let status = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let entry = Entry {
            status,
            version: book::VERSION,
            pid: std::process::id(),
            app: self.app.clone(),
            boot_id: now.boot_id,
            expires_boot_ms: now.boot_ms + LEASE.as_millis() as u64,
            gpus: gpus.clone(),
            seat: self.seat.clone(),
        };
        let text = serde_json::to_vec_pretty(&entry).map_err(std::io::Error::other)?;
        files::replace(&self.dir, &self.own_name(), &text, files::ENTRY_MODE)?;
        if self.seat.is_some() && !self.seat_cleared.swap(true, Ordering::Relaxed) {
            let mine = self.own_name();
            for (name, e) in self.entries().unwrap_or_default() {
                if name != mine && e.seat == self.seat {
                    let _ = std::fs::remove_file(self.dir.join(name));
                }
            }
        }
        Ok(())
    }

    /// Removes this server's reservation (and its want, if it has one).
    pub fn release(&self) -> std::io::Result<()> {
        let _ = self.ask(None);
        match std::fs::remove_file(self.dir.join(self.own_name())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// What this server says of itself from its next write on.
    pub fn set_status(&self, status: Option<Status>) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = status;
    }

    /// Every live entry, this server's own too, by server id (for `app ledger` and for
    /// choosing lenders); entries that are not believable are said and left out.
    pub fn servers(&self) -> Result<Vec<(String, Entry)>, String> {
        let now = Now::read();
        let none = Domains::new();
        let mut out = Vec::new();
        for (name, e) in self.entries()? {
            match book::judge(&e, &now, &none) {
                Verdict::Live => {
                    let id = name.trim_start_matches(PREFIX).trim_end_matches(SUFFIX);
                    out.push((id.to_string(), e));
                }
                Verdict::Expired => {}
                Verdict::Dropped(why) => self.drop_said(&name, &why),
            }
        }
        Ok(out)
    }

    /// Writes this server's want (`None`: removes it); needs no lock.
    pub fn ask(&self, want: Option<&Want>) -> std::io::Result<()> {
        let name = format!("{}{}{SUFFIX}", wants::WANT_PREFIX, self.id);
        match want {
            Some(w) => {
                let text = serde_json::to_vec_pretty(w).map_err(std::io::Error::other)?;
                files::replace(&self.dir, &name, &text, files::ENTRY_MODE)
            }
            None => match std::fs::remove_file(self.dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }

    /// The live wants of every server.
    pub fn wants(&self) -> Result<Vec<Want>, String> {
        wants::read(&self.dir)
    }
}

/// A few random bits for the server's id (two servers of the same pid in two containers
/// must not share one).
fn random() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b) ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests;
