//! The families `/metrics` exposes, encoded by `fastmetrics` from one [`Snapshot`]: in the
//! Prometheus text format 0.0.4, or OpenMetrics 1.0.0 when the scraper's `Accept` asks for
//! it. The snapshot is built at scrape time (by the master from what its workers reported,
//! or by the single worker in development mode), so the families here are plain rows of
//! values rather than live metric objects.

use std::collections::BTreeMap;

use fastmetrics::encoder::{EncodeMetric, MetricEncoder};
use fastmetrics::format::text::{self, TextProfile};
use fastmetrics::raw::bucket::Bucket;
use fastmetrics::raw::{MetricLabelSet, MetricType, TypedMetric, Unit};
use fastmetrics::registry::Registry;

use super::histogram::Hist;
use super::traffic::Traffic;

/// Why a worker exited (`reason` label of `vramfork_worker_exits_total`); all are exposed
/// from the start, at 0.
pub const EXIT_REASONS: [&str; 14] = [
    "max-requests",
    "gpu-memory",
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
    pub served: u64,
}

/// The numbers behind the worker count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PlanGauges {
    pub cpu_bound: u32,
    /// `None` when GPU memory does not bound the count (CPU, or no estimate).
    pub gpu_bound: Option<u32>,
    pub workers: u32,
    /// A worker's GPU footprint in MB: as declared (`est_gpu_mem_typ`), as measured
    /// (profiling, or remembered), as the plan assumes it, and the highest seen serving.
    pub footprint_declared_mb: u64,
    pub footprint_measured_mb: Option<u64>,
    pub footprint_planned_mb: u64,
    pub footprint_observed_mb: Option<u64>,
}

/// Everything `/metrics` shows, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub traffic: Traffic,
    pub in_flight: u64,
    /// By [`STATES`].
    pub workers: [u32; 3],
    pub planned: u32,
    pub starts: BTreeMap<String, u64>,
    pub boot: BTreeMap<String, Hist>,
    pub exits: BTreeMap<String, u64>,
    pub gpus: Vec<GpuRow>,
    pub per_worker: Vec<WorkerRow>,
    pub plan: PlanGauges,
}

/// The exposition format, from the scraper's `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4` (the default).
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `Accept` lists `application/openmetrics-text` with a non-zero
    /// quality at least as high as any `text/plain`; else the Prometheus text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut om, mut plain) = (0.0f32, 0.0f32);
        for item in accept.split(',') {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => om = om.max(q),
                "text/plain" | "*/*" => plain = plain.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om >= plain {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    fn profile(self) -> TextProfile {
        match self {
            Format::Prometheus => TextProfile::PrometheusV0_0_4,
            Format::OpenMetrics => TextProfile::default(),
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// A family read off rows of `R`: name, help, and the value of one row.
type Family<R, V> = (&'static str, &'static str, fn(&R) -> V);

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Hist),
}

struct Point<'a>(&'a Value);

impl EncodeMetric for Point<'_> {
    fn encode(&self, e: &mut dyn MetricEncoder) -> fastmetrics::error::Result<()> {
        match self.0 {
            Value::Counter(n) => e.encode_counter(n, None, None),
            Value::Gauge(g) => e.encode_gauge(g),
            Value::Histogram(h) => {
                let buckets: Vec<Bucket> = h.buckets().map(|(le, n)| Bucket::new(le, n)).collect();
                e.encode_histogram(&buckets, None, h.count(), h.sum, None)
            }
        }
    }
}

/// One family's rows; `KIND` picks the metric type (0 counter, 1 gauge, 2 histogram).
struct Rows<const KIND: u8>(Vec<(Labels, Value)>);

impl<const KIND: u8> TypedMetric for Rows<KIND> {
    const TYPE: MetricType = match KIND {
        0 => MetricType::Counter,
        1 => MetricType::Gauge,
        _ => MetricType::Histogram,
    };
}

impl<const KIND: u8> MetricLabelSet for Rows<KIND> {
    type LabelSet = ();
}

impl<const KIND: u8> EncodeMetric for Rows<KIND> {
    fn encode(&self, e: &mut dyn MetricEncoder) -> fastmetrics::error::Result<()> {
        for (labels, v) in &self.0 {
            e.encode(labels, &Point(v))?;
        }
        Ok(())
    }

    /// A family is declared (`# HELP`, `# TYPE`) even with no rows yet (no GPU, no CUDA
    /// worker), so that every scrape lists every family.
    fn is_empty(&self) -> bool {
        false
    }
}

/// Registers families under the `vramfork_` prefix for one format.
struct Families {
    reg: Registry,
    format: Format,
}

impl Families {
    /// A counter: `name` without `_total`. The Prometheus text format wants the family
    /// named with its `_total` sample; OpenMetrics names the family without it and adds it
    /// to the sample.
    fn counter(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, u64)>) {
        let name = match self.format {
            Format::Prometheus => format!("{name}_total"),
            Format::OpenMetrics => name.to_string(),
        };
        let rows = rows
            .into_iter()
            .map(|(l, n)| (l, Value::Counter(n)))
            .collect();
        self.add(name, help, None, Rows::<0>(rows));
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &'static str,
        unit: Option<Unit>,
        rows: Vec<(Labels, f64)>,
    ) {
        let rows = rows
            .into_iter()
            .map(|(l, g)| (l, Value::Gauge(g)))
            .collect();
        self.add(name.to_string(), help, unit, Rows::<1>(rows));
    }

    fn histogram(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, Hist)>) {
        let rows = rows
            .into_iter()
            .map(|(l, h)| (l, Value::Histogram(h)))
            .collect();
        self.add(name.to_string(), help, Some(Unit::Seconds), Rows::<2>(rows));
    }

    fn add<const K: u8>(
        &mut self,
        name: String,
        help: &'static str,
        unit: Option<Unit>,
        rows: Rows<K>,
    ) {
        // Names are this module's constants: a failure is a bug caught by the tests.
        self.reg
            .register_metric(name, help, unit, rows)
            .expect("metric families are registered once with valid names");
    }
}

/// Strips a unit suffix that fastmetrics adds back from the unit (`_bytes`, `_seconds`).
fn unit_name(name: &str, unit: &Unit) -> String {
    let suffix = format!("_{}", unit.as_str());
    name.strip_suffix(&suffix).unwrap_or(name).to_string()
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

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
    let t = &s.traffic;
    let per_endpoint =
        |get: &dyn Fn(&super::traffic::EndpointTraffic) -> u64| -> Vec<(Labels, u64)> {
            t.endpoints
                .iter()
                .map(|(e, et)| (l(&[("endpoint", e)]), get(et)))
                .collect()
        };

    // Requests.
    let requests = t
        .endpoints
        .iter()
        .flat_map(|(e, et)| {
            et.codes
                .iter()
                .map(move |(code, n)| (l(&[("endpoint", e), ("code", &code.to_string())]), *n))
        })
        .collect();
    f.counter(
        "requests",
        "HTTP answers by endpoint and status code.",
        requests,
    );
    f.counter(
        "request_bytes",
        "Request body bytes read, by endpoint.",
        per_endpoint(&|et| et.bytes_in),
    );
    f.counter(
        "response_bytes",
        "Response body bytes written, by endpoint.",
        per_endpoint(&|et| et.bytes_out),
    );
    f.counter(
        "out_of_memory_responses",
        "Answers 507 (Insufficient Storage): the model ran out of GPU memory.",
        vec![(vec![], t.with_code(507))],
    );
    f.histogram(
        "request_duration",
        "From a request's arrival (its connection's entry in the listen queue, for a first request) to its answer.",
        t.endpoints
            .iter()
            .map(|(e, et)| (l(&[("endpoint", e)]), et.duration.clone()))
            .collect(),
    );
    f.histogram(
        "forward_duration",
        "Model forward passes that produced an answer.",
        vec![(vec![], t.forward.clone())],
    );
    if t.preprocess.count() > 0 {
        f.histogram(
            "preprocess_duration",
            "Document pre-processing (text tokenized, images decoded) per request, on the worker's pool.",
            vec![(vec![], t.preprocess.clone())],
        );
    }
    f.counter(
        "batches",
        "With batching on: forward passes by the rows stacked into them (size: 1, 2, 3-4, 5-8, ...).",
        batch_sizes(&t.batches)
            .into_iter()
            .map(|(size, n)| (l(&[("size", &size)]), n))
            .collect(),
    );
    f.counter(
        "batch_rows",
        "With batching on: rows run in the passes counted in vramfork_batches_total.",
        vec![(vec![], t.batch_rows())],
    );
    f.counter(
        "auth_failures",
        "Requests refused by token auth (--api-key-file, --metrics-api-key-file), by port (serving, metrics) and reason (missing, malformed, invalid).",
        t.auth_failures
            .iter()
            .filter_map(|(k, n)| {
                let (port, reason) = k.split_once('/')?;
                Some((l(&[("port", port), ("reason", reason)]), *n))
            })
            .collect(),
    );
    f.counter(
        "access_log_dropped",
        "Access-log lines dropped because stderr could not keep up (--access-log); the requests were answered.",
        vec![(vec![], t.access_log_dropped)],
    );
    f.counter(
        "log_lines_dropped",
        "Log lines (access-log lines apart) the master and the workers dropped because stderr could not keep up (a pipe nobody reads, a stalled journal); nothing waited for them.",
        vec![(vec![], t.log_lines_dropped)],
    );
    f.gauge(
        "requests_in_flight",
        "Requests being handled now (as of the workers' last heartbeats).",
        None,
        vec![(vec![], s.in_flight as f64)],
    );

    // Workers.
    f.gauge(
        "workers",
        "Worker processes by state.",
        None,
        STATES
            .iter()
            .zip(s.workers)
            .map(|(st, n)| (l(&[("state", st)]), f64::from(n)))
            .collect(),
    );
    f.gauge(
        "workers_planned",
        "Workers the master keeps (the plan, changed by TTIN/TTOU).",
        None,
        vec![(vec![], f64::from(s.planned))],
    );
    let by = |m: &BTreeMap<String, u64>,
              keys: &[&'static str],
              label: &'static str|
     -> Vec<(Labels, u64)> {
        let mut rows: Vec<(Labels, u64)> = keys
            .iter()
            .map(|k| (l(&[(label, k)]), m.get(*k).copied().unwrap_or(0)))
            .collect();
        rows.extend(
            m.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .map(|(k, n)| (l(&[(label, k)]), *n)),
        );
        rows
    };
    f.counter(
        "worker_starts",
        "Workers started, by method (fork from the template, or exec).",
        by(&s.starts, &START_METHODS, "method"),
    );
    f.histogram(
        "worker_boot_duration",
        "From a worker's start to its first ready, by start method.",
        START_METHODS
            .iter()
            .map(|m| {
                (
                    l(&[("method", m)]),
                    s.boot.get(*m).cloned().unwrap_or_default(),
                )
            })
            .collect(),
    );
    f.counter(
        "worker_exits",
        "Workers that exited, by reason.",
        by(&s.exits, &EXIT_REASONS, "reason"),
    );

    // GPUs and per-worker memory.
    let gpu_rows = |get: fn(&GpuRow) -> u64| -> Vec<(Labels, f64)> {
        s.gpus
            .iter()
            .map(|g| {
                (
                    l(&[
                        ("index", &g.index.to_string()),
                        ("uuid", &g.uuid),
                        ("name", &g.name),
                    ]),
                    get(g) as f64,
                )
            })
            .collect()
    };
    let per_gpu: [Family<GpuRow, u64>; 3] = [
        ("gpu_memory_total_bytes", "GPU memory (NVML).", |g| g.total),
        ("gpu_memory_free_bytes", "Free GPU memory (NVML).", |g| {
            g.free
        }),
        ("gpu_memory_used_bytes", "Used GPU memory (NVML).", |g| {
            g.used
        }),
    ];
    for (name, help, get) in per_gpu {
        f.gauge_bytes(name, help, gpu_rows(get));
    }
    let worker_rows = |get: fn(&WorkerRow) -> Option<u64>| -> Vec<(Labels, f64)> {
        s.per_worker
            .iter()
            .filter_map(|w| get(w).map(|v| (l(&[("slot", &w.slot.to_string())]), v as f64)))
            .collect()
    };
    let per_worker: [Family<WorkerRow, Option<u64>>; 3] = [
        (
            "worker_gpu_memory_used_bytes",
            "GPU memory NVML reports for the worker's process.",
            |w| w.gpu_used,
        ),
        (
            "worker_gpu_allocator_peak_bytes",
            "Peak bytes reserved by the worker's CUDA caching allocator.",
            |w| w.allocator_peak,
        ),
        (
            "worker_resident_memory_bytes",
            "Resident memory of the worker's process.",
            |w| w.rss,
        ),
    ];
    for (name, help, get) in per_worker {
        f.gauge_bytes(name, help, worker_rows(get));
    }
    f.gauge(
        "worker_requests_served",
        "Model requests the slot's current worker has taken (resets when it is recycled).",
        None,
        worker_rows(|w| Some(w.served)),
    );

    // The plan.
    f.gauge(
        "plan_cpu_bound",
        "2 x CPUs + 1: the most workers the CPUs allow.",
        None,
        vec![(vec![], f64::from(s.plan.cpu_bound))],
    );
    f.gauge(
        "plan_gpu_bound",
        "The most workers GPU memory allows (absent when it does not bound the count).",
        None,
        s.plan
            .gpu_bound
            .map(|g| vec![(vec![], f64::from(g))])
            .unwrap_or_default(),
    );
    f.gauge(
        "plan_workers",
        "Workers the plan chose (or the override).",
        None,
        vec![(vec![], f64::from(s.plan.workers))],
    );
    let p = &s.plan;
    let footprint: Vec<(Labels, f64)> = [
        ("declared", Some(p.footprint_declared_mb)),
        ("measured", p.footprint_measured_mb),
        ("planned", Some(p.footprint_planned_mb)),
        ("observed", p.footprint_observed_mb),
    ]
    .into_iter()
    .filter_map(|(src, mb)| mb.map(|mb| (l(&[("source", src)]), (mb << 20) as f64)))
    .collect();
    f.gauge_bytes(
        "worker_gpu_footprint_bytes",
        "One worker's GPU memory: declared (est_gpu_mem_typ), measured before planning, planned (what the plan assumes per worker) and observed (the highest any worker reached serving).",
        footprint,
    );
    f.gauge(
        "build_info",
        "The vramfork build serving, as labels; always 1.",
        None,
        vec![(l(&[("version", env!("CARGO_PKG_VERSION"))]), 1.0)],
    );

    let mut out = String::with_capacity(16 << 10);
    text::encode_with(&mut out, &f.reg, format.profile(), || ()).map_err(|e| e.to_string())?;
    Ok(out)
}

impl Families {
    /// A gauge in bytes: `name` ends in `_bytes`, which fastmetrics adds back from the unit.
    fn gauge_bytes(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, f64)>) {
        let unit = Unit::Bytes;
        let base = unit_name(name, &unit);
        self.gauge(&base, help, Some(unit), rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
