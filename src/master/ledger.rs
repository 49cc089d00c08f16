//! The GPU-memory ledger the servers of one host share (`--ledger DIR`, default
//! `/run/vramfork`): each server that plans workers on GPUs reserves, under one exclusive
//! lock (`flock` on `gpu-ledger.lock`), the memory its plan gives them — per GPU (or MIG
//! instance) UUID, in `gpu-ledger.json` — and plans against what is usable **less the live
//! reservations of the others**, so servers started together do not plan on the same free
//! memory. The lock is held from the moment a server reads the ledger until its plan is
//! written (profiling included: what it measures is its own).
//!
//! A reservation is a lease: it expires [`LEASE`] after it was last written, and a serving
//! master renews it every [`RENEW_EVERY`] (and rewrites it when its workers change). A
//! master killed with SIGKILL blocks nothing for longer than the lease, in containers too:
//! expiry is by the host's clock, never by pid (pids of other pid namespaces mean nothing
//! here). A file that cannot be read as a ledger is said once and rebuilt; the live
//! servers write their entries again at their next renewal.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Where servers share their ledger unless `--ledger` says otherwise.
pub const DEFAULT_DIR: &str = "/run/vramfork";
/// How long a reservation lives without being renewed.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a serving master renews its reservation.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);

const FILE_NAME: &str = "gpu-ledger.json";
const LOCK_NAME: &str = "gpu-ledger.lock";

/// One server's reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its master's pid in its own pid namespace (for people: never used for expiry).
    pub pid: u32,
    /// Its app's name, for `app plan` and messages.
    pub app: String,
    /// When it expires, milliseconds since the Unix epoch.
    pub expires_ms: u64,
    /// MB reserved per device UUID.
    pub gpus: BTreeMap<String, u64>,
    /// Where it serves (host name, address and metadata), when that names one server:
    /// a server started again there (after a crash, say) replaces its predecessor's entry
    /// at once instead of waiting for its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
}

/// The file's contents: every server's entry by its id.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Book {
    servers: BTreeMap<String, Entry>,
}

/// The other servers' live reservations on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Others {
    pub mb: u64,
    pub servers: u32,
}

/// This server's place in a ledger directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
    id: String,
    app: String,
    seat: Option<String>,
}

/// The ledger read under its lock (held until this is dropped).
#[derive(Debug)]
pub struct Locked {
    ledger: Ledger,
    _lock: File,
    book: Book,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ledger {
    /// The ledger in `dir` (made when missing, writable by every user as `/tmp` is: servers
    /// of several users share it), for a server of app `app` serving at `seat` (see
    /// [`Entry::seat`]).
    pub fn open(dir: &Path, app: &str, seat: Option<String>) -> std::io::Result<Ledger> {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))?;
        }
        let id = format!("{}-{:x}", std::process::id(), now_ms() ^ random());
        Ok(Ledger {
            dir: dir.to_path_buf(),
            id,
            app: app.to_string(),
            seat,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the lock (waiting for another server that holds it) and reads the ledger.
    pub fn lock(&self) -> std::io::Result<Locked> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o666)
            .open(self.dir.join(LOCK_NAME))?;
        // SAFETY: flock(2) on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = self.dir.join(FILE_NAME);
        let book = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => return Err(e),
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(
                    event = "ledger_rebuilt",
                    file = %path.display(),
                    "the GPU-memory ledger {} is not a ledger ({e}): rebuilt empty; the other servers write their reservations again within {} s",
                    path.display(),
                    RENEW_EVERY.as_secs()
                );
                Book::default()
            }),
        };
        Ok(Locked {
            ledger: self.clone(),
            _lock: lock,
            book,
        })
    }

    /// Writes this server's reservation (`mb` per device UUID), renewing its lease.
    pub fn reserve(&self, gpus: &BTreeMap<String, u64>) -> std::io::Result<()> {
        self.lock()?.reserve(gpus)
    }

    /// Removes this server's reservation.
    pub fn release(&self) -> std::io::Result<()> {
        let mut l = self.lock()?;
        l.book.servers.remove(&self.id);
        l.write()
    }
}

impl Locked {
    /// Whether entry `id` is another live server's (not this one's, nor a predecessor's at
    /// this server's seat, nor expired).
    fn other(&self, id: &str, e: &Entry, now: u64) -> bool {
        let predecessor = self.ledger.seat.is_some() && e.seat == self.ledger.seat;
        id != self.ledger.id && !predecessor && e.expires_ms > now
    }

    /// The live reservations of the other servers, per device UUID.
    pub fn others(&self) -> BTreeMap<String, Others> {
        let now = now_ms();
        let mut out: BTreeMap<String, Others> = BTreeMap::new();
        let live = self
            .book
            .servers
            .iter()
            .filter(|(id, e)| self.other(id, e, now));
        for (_, e) in live {
            for (uuid, mb) in &e.gpus {
                let o = out.entry(uuid.clone()).or_default();
                o.mb += mb;
                o.servers += 1;
            }
        }
        out
    }

    /// Writes this server's reservation with a fresh lease (dropping expired entries).
    pub fn reserve(&mut self, gpus: &BTreeMap<String, u64>) -> std::io::Result<()> {
        let entry = Entry {
            pid: std::process::id(),
            app: self.ledger.app.clone(),
            expires_ms: now_ms() + LEASE.as_millis() as u64,
            gpus: gpus.clone(),
            seat: self.ledger.seat.clone(),
        };
        if self.ledger.seat.is_some() {
            let seat = &self.ledger.seat;
            self.book.servers.retain(|_, e| e.seat != *seat);
        }
        self.book.servers.insert(self.ledger.id.clone(), entry);
        self.write()
    }

    /// Replaces the file (a new file renamed over it: a reader never sees half of one).
    fn write(&mut self) -> std::io::Result<()> {
        let now = now_ms();
        self.book.servers.retain(|_, e| e.expires_ms > now);
        let path = self.ledger.dir.join(FILE_NAME);
        let tmp = self
            .ledger
            .dir
            .join(format!(".{FILE_NAME}.{}", self.ledger.id));
        let text = serde_json::to_string_pretty(&self.book).map_err(std::io::Error::other)?;
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o666)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    }
}

/// A few random bits for the server's id (two servers of the same pid in two containers
/// must not share one).
fn random() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(u, m)| (u.to_string(), *m)).collect()
    }

    #[test]
    fn each_server_sees_the_others_reservations_not_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let a = Ledger::open(dir.path(), "a", None).unwrap();
        let b = Ledger::open(dir.path(), "b", None).unwrap();
        let c = Ledger::open(dir.path(), "c", None).unwrap();
        a.reserve(&gpus(&[("GPU-1", 3000), ("GPU-2", 1000)]))
            .unwrap();
        b.reserve(&gpus(&[("GPU-1", 2000)])).unwrap();
        let seen = c.lock().unwrap().others();
        assert_eq!(
            seen["GPU-1"],
            Others {
                mb: 5000,
                servers: 2
            }
        );
        assert_eq!(
            seen["GPU-2"],
            Others {
                mb: 1000,
                servers: 1
            }
        );
        assert_eq!(a.lock().unwrap().others()["GPU-1"].mb, 2000);
        // A reservation rewritten replaces the last one; one released is gone.
        a.reserve(&gpus(&[("GPU-1", 500)])).unwrap();
        assert_eq!(c.lock().unwrap().others()["GPU-1"].mb, 2500);
        b.release().unwrap();
        assert_eq!(c.lock().unwrap().others()["GPU-1"].mb, 500);
        assert_eq!(c.lock().unwrap().others()["GPU-1"].servers, 1);
    }

    #[test]
    fn an_expired_reservation_counts_for_nothing_and_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = Ledger::open(dir.path(), "a", None).unwrap();
        let b = Ledger::open(dir.path(), "b", None).unwrap();
        let mut l = a.lock().unwrap();
        l.reserve(&gpus(&[("GPU-1", 3000)])).unwrap();
        l.book.servers.get_mut(&a.id).unwrap().expires_ms = now_ms() - 1;
        l.write().unwrap();
        drop(l);
        assert!(b.lock().unwrap().others().is_empty());
        b.reserve(&gpus(&[("GPU-1", 1)])).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert!(!text.contains(&a.id), "{text}");
    }

    #[test]
    fn a_file_that_is_no_ledger_is_rebuilt_never_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for junk in [
            "",
            "{\"servers\": {\"x\": {\"pid\": 1",
            "[1, 2]",
            "\u{0}\u{1}",
        ] {
            std::fs::write(dir.path().join(FILE_NAME), junk).unwrap();
            let a = Ledger::open(dir.path(), "a", None).unwrap();
            assert!(a.lock().unwrap().others().is_empty(), "{junk:?}");
            a.reserve(&gpus(&[("GPU-1", 7)])).unwrap();
            let b = Ledger::open(dir.path(), "b", None).unwrap();
            assert_eq!(b.lock().unwrap().others()["GPU-1"].mb, 7, "{junk:?}");
        }
    }

    #[test]
    fn a_server_started_again_at_its_seat_replaces_its_predecessors_entry() {
        let dir = tempfile::tempdir().unwrap();
        let seat = || Some("host 0.0.0.0:5000 /srv/app.json".to_string());
        let crashed = Ledger::open(dir.path(), "a", seat()).unwrap();
        crashed.reserve(&gpus(&[("GPU-1", 3000)])).unwrap();
        let neighbour = Ledger::open(dir.path(), "n", None).unwrap();
        neighbour.reserve(&gpus(&[("GPU-1", 1000)])).unwrap();
        let again = Ledger::open(dir.path(), "a", seat()).unwrap();
        let mut l = again.lock().unwrap();
        assert_eq!(
            l.others()["GPU-1"].mb,
            1000,
            "the predecessor is not another server"
        );
        l.reserve(&gpus(&[("GPU-1", 2000)])).unwrap();
        drop(l);
        assert_eq!(neighbour.lock().unwrap().others()["GPU-1"].mb, 2000);
        // Servers without a seat (port 0) never replace each other.
        let other = Ledger::open(dir.path(), "x", None).unwrap();
        assert_eq!(other.lock().unwrap().others()["GPU-1"].mb, 3000);
    }

    #[test]
    fn the_lock_is_exclusive_between_servers() {
        let dir = tempfile::tempdir().unwrap();
        let a = Ledger::open(dir.path(), "a", None).unwrap();
        let held = a.lock().unwrap();
        let f = File::open(dir.path().join(LOCK_NAME)).unwrap();
        // SAFETY: flock(2) on a descriptor this test owns.
        let busy = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(busy, -1, "another open file description cannot take it");
        drop(held);
        // SAFETY: as above.
        let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(free, 0, "once the holder let go");
    }
}
