//! The families `/metrics` exposes, encoded by `fastmetrics` from one [`Snapshot`]: in the
//! Prometheus text format 0.0.4, or OpenMetrics 1.0.0 when the scraper's `Accept` asks for
//! it. The snapshot is built at scrape time (by the master from what its workers reported,
//! or by the single worker in development mode), so the families here are plain rows of
//! values rather than live metric objects.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`Snapshot`] and its rows, [`encode`] |
//! | `format.rs` | [`Format`]: which exposition format the scraper asked for |
//! | `catalog.rs` | every family: its name, help and rows, in the order a scrape lists them |
//! | `families.rs` | how rows are registered with `fastmetrics` (counters' `_total`, units) |

mod catalog;
mod families;
mod format;

use std::collections::BTreeMap;

use fastmetrics::format::text;
use fastmetrics::registry::Registry;

pub use format::Format;

use super::histogram::Hist;
use super::traffic::Traffic;
use families::Families;

/// Why a worker exited (`reason` label of `vramfork_worker_exits_total`); all are exposed
/// from the start, at 0.
pub const EXIT_REASONS: [&str; 16] = [
    "max-requests",
    "gpu-memory",
    "host-memory",
    "oom-kill",
    "cuda-oom",
    "request-timeout",
    "asked",
    "heartbeat",
    "boot-timeout",
    "graceful-timeout",
    "stop-timeout",
    "superseded",
    "boot-failure",
    "cuda-fatal",
    "crash",
    "signal",
];

/// How workers are started (`method` label).
pub const START_METHODS: [&str; 2] = ["fork", "exec"];

/// Worker phases (`state` label of `vramfork_workers`).
pub const STATES: [&str; 3] = ["booting", "ready", "retiring"];

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// One worker slot (its newest worker).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerRow {
    pub slot: u32,
    /// NVML's figure for the worker's pid on its GPU.
    pub gpu_used: Option<u64>,
    /// The CUDA caching allocator's peak reserved bytes.
    pub allocator_peak: Option<u64>,
    /// Resident set size.
    pub rss: Option<u64>,
    /// Its own host memory (`crate::own_memory`).
    pub own: Option<u64>,
    pub served: u64,
}

/// The numbers behind the worker count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PlanGauges {
    pub cpu_bound: u32,
    /// `None` when GPU memory does not bound the count (CPU, or no estimate).
    pub gpu_bound: Option<u32>,
    /// `None` until the host-memory bound was measured (`master::plan::host`).
    pub host_bound: Option<u32>,
    pub workers: u32,
    /// A worker's GPU footprint in MB: as declared (`est_gpu_mem_typ`), as measured
    /// (profiling, or remembered), as the plan assumes it, and the highest seen serving.
    pub footprint_declared_mb: u64,
    pub footprint_measured_mb: Option<u64>,
    pub footprint_planned_mb: u64,
    pub footprint_observed_mb: Option<u64>,
    /// How far a worker's passes take its resident set, in bytes: as the template's warm-up
    /// measured it (what the host-memory plan is made from), and the most any worker's rose
    /// serving (above its figure when ready).
    pub pass_peak_warmup: Option<u64>,
    pub pass_peak_observed: Option<u64>,
}

/// Requests waiting for a model, now: the `queue` rows of `vramfork_requests_waiting`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Waiting {
    /// Connections with a request in the listening socket's accept queue, not taken by any
    /// worker yet (the kernel's count, [`crate::metrics::listen_queue`]).
    pub listen: u64,
    /// Requests workers have taken that wait for their model (as of their last
    /// heartbeats).
    pub model: u64,
    /// How many connections the accept queue may hold; `None` when the socket is closed.
    pub listen_limit: Option<u64>,
    /// `model` by priority lane, highest first (`crate::lanes::LANES`).
    pub lanes: [u64; 3],
}

impl Waiting {
    /// The listening socket's queue as read now (`None`: the socket is closed, as when
    /// the server stops), with the workers' model queues.
    pub fn of(backlog: Option<crate::metrics::listen_queue::Backlog>, model: u64) -> Waiting {
        Waiting {
            listen: backlog.map_or(0, |b| u64::from(b.waiting)),
            model,
            listen_limit: backlog.map(|b| u64::from(b.limit)),
            lanes: [0; 3],
        }
    }
}

/// Everything `/metrics` shows, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub traffic: Traffic,
    pub in_flight: u64,
    pub waiting: Waiting,
    /// By [`STATES`].
    pub workers: [u32; 3],
    pub planned: u32,
    pub starts: BTreeMap<String, u64>,
    pub boot: BTreeMap<String, Hist>,
    pub exits: BTreeMap<String, u64>,
    pub gpus: Vec<GpuRow>,
    pub per_worker: Vec<WorkerRow>,
    pub plan: PlanGauges,
    pub idle: IdleFigures,
    /// Every server in the GPU-memory ledger as this one sees it (itself too); empty
    /// without a ledger.
    pub ledger: Vec<LedgerRow>,
}

/// One server of the GPU-memory ledger, for `vramfork_ledger_*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerRow {
    /// Its id in the ledger (`<pid>-<random>`).
    pub server: String,
    pub app: String,
    pub port: String,
    /// serving, idle, lent, pinned, waiting (empty: it does not say).
    pub state: String,
    pub reserved_mb: u64,
    pub workers: Option<u32>,
    pub reload_ms: Option<u64>,
}

/// `--idle-release`'s figures (the master's; all empty when it is off).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdleFigures {
    /// Whether the workers are released now; `None`: `--idle-release` is off.
    pub released: Option<bool>,
    /// Releases so far.
    pub releases: u64,
    /// Re-admissions by outcome (`admitted`, `no_room`).
    pub readmissions: BTreeMap<String, u64>,
    /// From the request that re-admitted the server to its first worker ready.
    pub readmission: Hist,
}

/// The `outcome` label of `vramfork_idle_readmissions_total`.
pub const READMISSION_OUTCOMES: [&str; 2] = ["admitted", "no_room"];

/// Forward passes by rows, gathered into power-of-two ranges (`1`, `2`, `3-4`, `5-8`, …):
/// a bounded set of label values whatever `max_batch_size` is.
pub fn batch_sizes(batches: &BTreeMap<u32, u64>) -> Vec<(String, u64)> {
    let mut ranges: BTreeMap<u32, u64> = BTreeMap::new();
    for (rows, n) in batches {
        *ranges.entry(rows.max(&1).next_power_of_two()).or_default() += n;
    }
    ranges
        .into_iter()
        .map(|(top, n)| {
            let label = if top <= 2 {
                top.to_string()
            } else {
                format!("{}-{top}", top / 2 + 1)
            };
            (label, n)
        })
        .collect()
}

/// Encodes a snapshot in the given format.
pub fn encode(s: &Snapshot, format: Format) -> Result<String, String> {
    let reg = Registry::builder()
        .with_namespace("vramfork")
        .build()
        .map_err(|e| e.to_string())?;
    let mut f = Families { reg, format };
    catalog::requests(&mut f, s);
    catalog::passes(&mut f, s);
    catalog::refusals(&mut f, s);
    catalog::workers(&mut f, s);
    catalog::memory(&mut f, s);
    catalog::plan(&mut f, s);
    catalog::idle(&mut f, s);
    catalog::ledger(&mut f, s);

    let mut out = String::with_capacity(16 << 10);
    text::encode_with(&mut out, &f.reg, format.profile(), || ()).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md's table names exactly the families a scrape declares: a
    /// family added, renamed or dropped without its row fails here.
    #[test]
    fn the_metrics_page_names_exactly_the_families_a_scrape_declares() {
        // Every family, those declared only once they have something to say included.
        let mut s = Snapshot::default();
        s.traffic.preprocess.observe(0.01);
        s.traffic.text_tokens = 3;
        s.traffic.text_tokens_padded = 4;
        s.traffic.text_pass_tokens_max = 4;
        let scrape = encode(&s, Format::Prometheus).unwrap();
        let declared: std::collections::BTreeSet<String> = scrape
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        assert!(declared.len() > 20, "{scrape}");
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
        )
        .unwrap();
        let documented: std::collections::BTreeSet<String> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `vramfork_"))
            .filter_map(|l| l.split(" |").next())
            .flat_map(|cell| {
                format!("`vramfork_{cell}")
                    .split(", ")
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .map(|name| name.trim_matches('`').to_string())
            .collect();
        let undocumented: Vec<_> = declared.difference(&documented).collect();
        let stale: Vec<_> = documented.difference(&declared).collect();
        assert!(
            undocumented.is_empty() && stale.is_empty(),
            "declared by a scrape but not in docs/metrics.md's table: {undocumented:?}; in the table but never declared: {stale:?}"
        );
    }

    #[test]
    fn batch_sizes_gather_into_power_of_two_ranges() {
        let batches: BTreeMap<u32, u64> =
            [(1, 5), (2, 4), (3, 1), (4, 2), (5, 3), (16, 1), (17, 1)]
                .into_iter()
                .collect();
        let want: Vec<(String, u64)> = [
            ("1", 5),
            ("2", 4),
            ("3-4", 3),
            ("5-8", 3),
            ("9-16", 1),
            ("17-32", 1),
        ]
        .into_iter()
        .map(|(s, n)| (s.to_string(), n))
        .collect();
        assert_eq!(batch_sizes(&batches), want);
    }
}
