//! What a start decides and says around the ledger: each device's memory domain, this
//! server's seat, the others' reservations marked on the GPUs, and the words for a ledger
//! that is missing, busy or refused.

use std::collections::BTreeMap;
use std::path::Path;

use crate::master::config::Config;
use crate::master::host::ledger::{
    Domain, Domains, NotTaken, Others, Unusable, DEFAULT_DIR, START_WAIT,
};
use crate::master::resources::{GpuInfo, Resources};

/// Each device's memory domain in the ledger: a GPU's own UUID, or for a MIG device of a
/// known GPU instance, that instance (`<GPU UUID>/gi<N>`): the compute instances of one GPU
/// instance share its memory, so what servers reserve on any of them adds up.
pub fn domains(gpus: &[GpuInfo], parent_uuid: impl Fn(u32) -> Option<String>) -> Domains {
    let domain = |g: &GpuInfo| match (g.mig, g.gpu_instance) {
        (Some(m), Some(gi)) => {
            let parent = parent_uuid(m.parent).unwrap_or_else(|| format!("nvml-{}", m.parent));
            format!("{parent}/gi{gi}")
        }
        _ => g.uuid.clone(),
    };
    let each = gpus.iter().map(|g| {
        let d = Domain {
            key: domain(g),
            total_mb: g.total_mb(),
        };
        (g.uuid.clone(), d)
    });
    each.collect()
}

/// `by_uuid` summed by memory domain.
pub(super) fn by_domain(
    domains: &Domains,
    by_uuid: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (uuid, mb) in by_uuid {
        let key = domains.get(&uuid).map_or(uuid, |d| d.key.clone());
        let v = out.entry(key).or_default();
        *v = v.saturating_add(mb);
    }
    out
}

/// The refusal of a ledger that is there but cannot be used, or whose lock stays busy.
pub(super) fn busy(path: &Path, n: &NotTaken, within: std::time::Duration) -> String {
    match n {
        NotTaken::Busy(_) => format!(
            "the GPU-memory ledger's lock {} stayed busy for {} s ({n}): a server holds it only for the moment it plans; find the holder (fuser {}) or plan alone with --ledger off",
            path.display(),
            within.as_secs(),
            path.display()
        ),
        NotTaken::Failed(e) => format!(
            "the GPU-memory ledger's lock cannot be used ({e}); --ledger off plans alone"
        ),
    }
}

/// Says that the lock is busy and a start waits for it (`ledger_wait`).
pub(super) fn say_wait(path: &Path, holder: Option<u32>) {
    let who = holder.map_or("a process this one cannot see".to_string(), |p| {
        format!("pid {p}")
    });
    tracing::warn!(
        target: "app",
        event = "ledger_wait",
        holder = holder.unwrap_or(0),
        "the GPU-memory ledger's lock {} is held by {who}: waiting up to {} s for it",
        path.display(),
        START_WAIT.as_secs()
    );
}

/// Where this server serves, when that names one server of this host (a port of 0 names
/// none): its host name, address and metadata file.
pub(super) fn seat(cfg: &Config) -> Option<String> {
    (cfg.address.port != 0).then(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let meta = cfg.app.metadata.path.display();
        format!(
            "{} {}:{} {meta}",
            host.trim(),
            cfg.address.host,
            cfg.address.port
        )
    })
}

/// A ledger directory that is missing and cannot be made: nobody reserves there.
pub(super) fn say_unavailable(dir: &Path, e: &Unusable) {
    let default = if dir.as_os_str() == DEFAULT_DIR {
        " (the default; --ledger DIR names another, --ledger off plans alone without this warning)"
    } else {
        ""
    };
    tracing::warn!(
        target: "app",
        event = "ledger_unavailable",
        "the GPU-memory ledger cannot be used{default}: {e}; no server can be reserving there, so this one plans alone, as if no other server used these GPUs",
    );
}

/// Marks each GPU of `res` with the others' reservations on its memory domain (said).
pub(super) fn mark(
    res: &mut Resources,
    domains: &Domains,
    others: &BTreeMap<String, Others>,
    dir: &Path,
) {
    for g in &mut res.gpus {
        let key = domains
            .get(&g.uuid)
            .map_or(g.uuid.as_str(), |d| d.key.as_str());
        if let Some(o) = others.get(key) {
            g.ledger_mb = o.mb;
            tracing::info!(
                target: "app",
                event = "ledger_others",
                gpu = g.index,
                reserved_mb = o.mb,
                servers = o.servers,
                "{}: {} other server(s) reserved {} MB in the GPU-memory ledger ({}): planned as used",
                g.label(),
                o.servers,
                o.mb,
                dir.display()
            );
        }
    }
}
