//! Asking for room: a server that needs room on a memory domain and does not find it
//! writes `want-<id>.json` (its own file, replaced whole like its entry, under the same
//! lease): how much it lacks there and which servers, least valuable first, it asks to give
//! their room back (`master::host::lending` chooses them from what their entries say). A
//! server named there lends when it still may (idle long enough, nothing in flight, not
//! pinned); the asker renews its want while it waits and removes it once it has room. A
//! killed asker's want expires with its lease, as an entry does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::book::{Now, VERSION};
use super::{files, LEASE, MAX_ENTRIES, MAX_ENTRY_BYTES};

pub(super) const WANT_PREFIX: &str = "want-";

/// One server's request for room, as its file holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub version: u32,
    /// The asking server's app, for messages.
    pub app: String,
    /// The asking server's id (its entry is `server-<id>.json`).
    pub id: String,
    pub boot_id: String,
    pub expires_boot_ms: u64,
    /// MB it lacks, per memory domain.
    pub short_mb: BTreeMap<String, u64>,
    /// The servers (by id) asked to give their room back.
    pub from: Vec<String>,
}

impl Want {
    /// A want of server `id` of `app`, with a fresh lease.
    pub fn new(app: &str, id: &str, short_mb: BTreeMap<String, u64>, from: Vec<String>) -> Want {
        let now = Now::read();
        Want {
            version: VERSION,
            app: app.to_string(),
            id: id.to_string(),
            boot_id: now.boot_id,
            expires_boot_ms: now.boot_ms + LEASE.as_millis() as u64,
            short_mb,
            from,
        }
    }

    /// Whether it counts now: this boot, not expired, no further than one lease ahead.
    pub fn live(&self, now: &Now) -> bool {
        let latest = now.boot_ms + (LEASE + super::book::SLACK).as_millis() as u64;
        self.version == VERSION
            && self.boot_id == now.boot_id
            && self.expires_boot_ms > now.boot_ms
            && self.expires_boot_ms <= latest
    }
}

/// The live wants in `dir` (a file that is no want is left out).
pub(super) fn read(dir: &std::path::Path) -> Result<Vec<Want>, String> {
    let list = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let now = Now::read();
    let mut out = Vec::new();
    for (i, d) in list.enumerate() {
        if i > MAX_ENTRIES {
            return Err(format!(
                "{} holds too many files: not a ledger",
                dir.display()
            ));
        }
        let Ok(d) = d else { continue };
        let name = d.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(WANT_PREFIX) && name.ends_with(".json")) {
            continue;
        }
        let path = dir.join(&name);
        let Ok(Some(f)) = files::open_regular(&path, None) else {
            continue;
        };
        let Ok(bytes) = files::read_bounded(f, &path, MAX_ENTRY_BYTES) else {
            continue;
        };
        if let Ok(w) = serde_json::from_slice::<Want>(&bytes) {
            if w.live(&now) && name == format!("{WANT_PREFIX}{}.json", w.id) {
                out.push(w);
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}
