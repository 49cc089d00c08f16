//! The ledger's contents: one entry per server (its own file, `server-<id>.json`, written by
//! that server alone), leases by `CLOCK_BOOTTIME`, and what an entry must be to count.
//!
//! An entry's lease is a point on the host's boot clock (`CLOCK_BOOTTIME`: one clock for
//! every process and container of the host, never stepped by NTP or an operator, still
//! running through a suspend) together with the boot's id (`/proc/sys/kernel/random/boot_id`),
//! so that an entry of an earlier boot — a ledger kept on a disk — counts for nothing. An
//! entry counts when it is live (this boot, not expired) and believable: it expires no later
//! than one lease and a little slack from now, and reserves no more on a device than the
//! device has. Anything else is dropped and said: a hand-made entry can neither make a GPU
//! look full forever nor wrap a sum. Sums saturate.
//!
//! The format before this one (one shared `gpu-ledger.json`, leases by the wall clock) is
//! still read, never written: its live, believable entries count, so servers of the earlier
//! release on the same host are planned around until they stop.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// This format's version, written in every entry.
pub const VERSION: u32 = 2;
/// How far beyond one lease an entry's expiry may lie before it is not believed (a server
/// writes `now + lease`; this covers a write and a read a moment apart).
pub const SLACK: Duration = Duration::from_secs(5);

/// One server's reservation, as its file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// [`VERSION`].
    pub version: u32,
    /// Its master's pid in its own pid namespace (for people: never used for expiry).
    pub pid: u32,
    /// Its app's name, for `app plan` and messages.
    pub app: String,
    /// The boot it was written in.
    pub boot_id: String,
    /// When it expires: milliseconds of `CLOCK_BOOTTIME`.
    pub expires_boot_ms: u64,
    /// MB reserved per memory domain: a GPU's UUID, or for a MIG device its GPU instance
    /// (`<GPU UUID>/gi<N>`), which its compute instances share.
    pub gpus: BTreeMap<String, u64>,
    /// Where it serves (host name, address and metadata), when that names one server: a
    /// server started again there replaces its predecessor's entry at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    /// What the server is doing, for `app ledger` and for lending (`master::host::lending`);
    /// absent in entries of servers that do not lend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A server's state as the ledger shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Serving, or idle for less than its `--evictable-after`.
    Serving,
    /// Idle for at least its `--evictable-after`, nothing in flight: it lends when asked.
    Idle,
    /// Its workers' room given back (lent to a neighbour, or released when idle).
    Lent,
    /// `--pin`: it keeps its room.
    Pinned,
    /// A request waits for room it has asked the ledger for.
    Waiting,
}

/// What a server says of itself in its entry, beside its reservation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    /// The port it serves on.
    pub port: u16,
    /// Workers alive now.
    pub live_workers: u32,
    /// Model requests its workers answered.
    pub served: u64,
    /// When it last had a request in hand, ms of `CLOCK_BOOTTIME` (`None`: never).
    pub last_request_boot_ms: Option<u64>,
    /// From when it lends when asked, ms of `CLOCK_BOOTTIME` (its last request plus its
    /// `--evictable-after`); `None`: never (pinned, or lending off).
    pub lendable_from_boot_ms: Option<u64>,
    /// How long its last start of a worker took, from the request that woke it to a worker
    /// ready (a fork of the warm template and the model's upload to the GPU), ms.
    pub reload_ms: Option<u64>,
    /// What losing its room costs, per MB freed (`master::host::lending::value`): the
    /// least valuable lend first.
    pub value: f64,
    /// The asking server whose want this one is lending to, while its workers exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_to: Option<String>,
}

/// Now, on the clocks the ledger uses.
#[derive(Debug, Clone)]
pub struct Now {
    pub boot_id: String,
    pub boot_ms: u64,
    /// The wall clock, for entries of the earlier format only.
    pub wall_ms: u64,
}

impl Now {
    pub fn read() -> Now {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Now {
            boot_id,
            boot_ms: boot_ms(),
            wall_ms,
        }
    }
}

/// `CLOCK_BOOTTIME` in milliseconds.
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into `ts`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A device as the ledger counts it: its memory domain and its total memory, MB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub key: String,
    pub total_mb: u64,
}

/// The devices of this server by UUID.
pub type Domains = BTreeMap<String, Domain>;

/// Whether an entry counts.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Live,
    /// Expired, or written in an earlier boot: counts for nothing, said nowhere.
    Expired,
    /// Not believable (the reason): counts for nothing, said.
    Dropped(String),
}

/// The totals by domain key.
fn totals(domains: &Domains) -> BTreeMap<&str, u64> {
    domains
        .values()
        .map(|d| (d.key.as_str(), d.total_mb))
        .collect()
}

/// Whether `e` counts now, given the devices this server knows.
pub fn judge(e: &Entry, now: &Now, domains: &Domains) -> Verdict {
    if e.version != VERSION {
        return Verdict::Dropped(format!("format version {}, not {VERSION}", e.version));
    }
    if e.boot_id != now.boot_id || e.expires_boot_ms <= now.boot_ms {
        return Verdict::Expired;
    }
    let latest = now.boot_ms + (super::LEASE + SLACK).as_millis() as u64;
    if e.expires_boot_ms > latest {
        let s = (e.expires_boot_ms - now.boot_ms) / 1000;
        return Verdict::Dropped(format!(
            "it expires in {s} s, beyond one lease ({} s)",
            super::LEASE.as_secs()
        ));
    }
    too_much(&e.gpus, &totals(domains)).map_or(Verdict::Live, Verdict::Dropped)
}

/// The first reservation above its device's total memory, said.
fn too_much(gpus: &BTreeMap<String, u64>, totals: &BTreeMap<&str, u64>) -> Option<String> {
    gpus.iter().find_map(|(k, mb)| {
        let total = totals.get(k.as_str())?;
        (mb > total).then(|| format!("it reserves {mb} MB on {k}, which has {total} MB"))
    })
}

/// The other servers' live reservations on one memory domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Others {
    pub mb: u64,
    pub servers: u32,
}

/// Adds `gpus` (by domain key) to `out`, saturating.
pub fn add(out: &mut BTreeMap<String, Others>, gpus: &BTreeMap<String, u64>) {
    for (k, mb) in gpus {
        let o = out.entry(k.clone()).or_default();
        o.mb = o.mb.saturating_add(*mb);
        o.servers = o.servers.saturating_add(1);
    }
}

/// An entry of the earlier format (one shared file, keyed by device UUID, the wall clock).
#[derive(Debug, Deserialize)]
struct OldEntry {
    expires_ms: u64,
    gpus: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
struct OldBook {
    servers: BTreeMap<String, OldEntry>,
}

/// The live, believable entries of an earlier release's `gpu-ledger.json`, by domain key
/// (its keys are device UUIDs); `Err`: the text is not such a file.
pub fn old_entries(
    text: &[u8],
    now: &Now,
    domains: &Domains,
) -> Result<Vec<BTreeMap<String, u64>>, String> {
    let book: OldBook = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let latest = now.wall_ms + (super::LEASE + SLACK).as_millis() as u64;
    let live = book
        .servers
        .into_values()
        .filter(|e| e.expires_ms > now.wall_ms && e.expires_ms <= latest);
    let by_domain = live.map(|e| {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for (uuid, mb) in e.gpus {
            if let Some(d) = domains.get(&uuid) {
                let v = out.entry(d.key.clone()).or_default();
                *v = v.saturating_add(mb);
            }
        }
        out
    });
    let t = totals(domains);
    Ok(by_domain.filter(|g| too_much(g, &t).is_none()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Now {
        Now {
            boot_id: "b".into(),
            boot_ms: 1_000_000,
            wall_ms: 5_000_000,
        }
    }

    fn domains() -> Domains {
        let d = |k: &str, mb| Domain {
            key: k.into(),
            total_mb: mb,
        };
        [
            ("GPU-1".to_string(), d("GPU-1", 40_960)),
            ("MIG-a".to_string(), d("GPU-2/gi1", 19_968)),
            ("MIG-b".to_string(), d("GPU-2/gi1", 19_968)),
        ]
        .into()
    }

    fn entry(expires: u64, gpus: &[(&str, u64)]) -> Entry {
        Entry {
            version: VERSION,
            pid: 1,
            app: "a".into(),
            boot_id: "b".into(),
            expires_boot_ms: expires,
            gpus: gpus.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            seat: None,
            status: None,
        }
    }

    #[test]
    fn leases_run_on_the_boot_clock_of_this_boot_and_no_further_than_one_lease() {
        let (n, d) = (now(), domains());
        let lease = (super::super::LEASE).as_millis() as u64;
        assert_eq!(
            judge(&entry(n.boot_ms + lease, &[("GPU-1", 1)]), &n, &d),
            Verdict::Live
        );
        assert_eq!(
            judge(&entry(n.boot_ms, &[("GPU-1", 1)]), &n, &d),
            Verdict::Expired
        );
        let mut other_boot = entry(n.boot_ms + lease, &[("GPU-1", 1)]);
        other_boot.boot_id = "earlier".into();
        assert_eq!(judge(&other_boot, &n, &d), Verdict::Expired);
        // Never-expiring, or a day ahead: not believed.
        for far in [u64::MAX, n.boot_ms + 86_400_000] {
            let v = judge(&entry(far, &[("GPU-1", 1)]), &n, &d);
            assert!(
                matches!(v, Verdict::Dropped(ref w) if w.contains("beyond one lease")),
                "{v:?}"
            );
        }
    }

    #[test]
    fn an_entry_reserving_more_than_a_device_has_is_dropped_and_sums_saturate() {
        let (n, d) = (now(), domains());
        let soon = n.boot_ms + 1000;
        let v = judge(&entry(soon, &[("GPU-1", u64::MAX)]), &n, &d);
        assert!(
            matches!(v, Verdict::Dropped(ref w) if w.contains("40960 MB")),
            "{v:?}"
        );
        // A device this server does not know is not judged (it is no part of its sums).
        assert_eq!(
            judge(&entry(soon, &[("GPU-9", u64::MAX)]), &n, &d),
            Verdict::Live
        );
        let mut out = BTreeMap::new();
        add(&mut out, &entry(soon, &[("GPU-9", u64::MAX)]).gpus);
        add(&mut out, &entry(soon, &[("GPU-9", 7)]).gpus);
        assert_eq!(
            out["GPU-9"],
            Others {
                mb: u64::MAX,
                servers: 2
            }
        );
        let mut old = entry(soon, &[("GPU-1", 1)]);
        old.version = 1;
        assert!(matches!(judge(&old, &n, &d), Verdict::Dropped(_)));
    }

    #[test]
    fn the_earlier_formats_live_entries_count_by_domain_and_never_forever() {
        let (n, d) = (now(), domains());
        let w = n.wall_ms;
        let text = format!(
            r#"{{"servers": {{
              "live": {{"pid": 1, "app": "a", "expires_ms": {}, "gpus": {{"MIG-a": 3000, "GPU-1": 10}}}},
              "gone": {{"pid": 2, "app": "b", "expires_ms": {}, "gpus": {{"GPU-1": 3000}}}},
              "forever": {{"pid": 3, "app": "c", "expires_ms": 18446744073709551615, "gpus": {{"GPU-1": 5}}}},
              "huge": {{"pid": 4, "app": "d", "expires_ms": {}, "gpus": {{"GPU-1": 99999999}}}}
            }}}}"#,
            w + 10_000,
            w - 1,
            w + 10_000
        );
        let live = old_entries(text.as_bytes(), &n, &d).unwrap();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(live[0]["GPU-2/gi1"], 3000);
        assert_eq!(live[0]["GPU-1"], 10);
        assert!(old_entries(b"garbage", &n, &d).is_err());
    }
}
