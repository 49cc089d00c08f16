//! The worker's request context ([`App`]): everything a request needs, shared by all
//! connections — the shared state, the model's runner, the metadata, the limits from the
//! worker's configuration, what `/metrics` counts.

use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderValue;
use vramfork::auth::ApiKeys;
use vramfork::metadata::{AppMetadata, TensorSpec};
use vramfork::metrics::traffic::Traffic;

use crate::documents::Documents;
use crate::hw::Hw;
use crate::metrics::{Endpoint, Recorder};
use crate::observe::access_log::AccessLog;
use crate::runner::Runner;
use crate::siblings::Siblings;
use crate::state::Shared;

/// Everything a request needs, shared by all connections.
pub struct App {
    pub shared: Arc<Shared>,
    pub runner: Runner,
    pub metadata: AppMetadata,
    /// The model's name in the v2 protocol: `--model-name`, else the metadata's `name`.
    pub model_name: String,
    /// Its format as v2 metadata names it (`platform`).
    pub platform: &'static str,
    pub hw: Hw,
    pub max_body_bytes: u64,
    pub request_timeout: Duration,
    /// Refuse (503) a request that waited longer than this before the model took it.
    pub max_queue_wait: Option<Duration>,
    /// Retire after a request that leaves the allocator above this many bytes.
    pub max_gpu_bytes: Option<u64>,
    /// Bytes this worker holds on its GPU besides its allocator: the plan's context
    /// figure, then NVML's figure less the allocator's reserved bytes at each heartbeat
    /// where NVML lists this process.
    pub gpu_context: std::sync::atomic::AtomicU64,
    /// Retire after a request that leaves the worker's own host memory above this many bytes
    /// (`--max-worker-memory-mb`).
    pub max_host_bytes: Option<u64>,
    /// Its own host memory, read by the heartbeat and checked after requests.
    pub own_memory: crate::memory::OwnMemory,
    /// How far its passes take its resident set once it serves (heartbeats carry it).
    pub serving_peak: crate::memory::ServingPeak,
    /// What `/metrics` counts, when it is on.
    pub metrics: Option<Recorder>,
    /// The plan's footprint figures, when it was made from a measurement (`GET /`).
    pub footprint: Option<vramfork::protocol::FootprintFigures>,
    /// `--api-key-file`'s keys: every request but the health checks needs one.
    pub api_keys: Option<ApiKeys>,
    /// `--tls-cert`/`--tls-key`: connections are TLS, with the newest good certificate.
    pub tls: Option<Arc<vramfork::tls::Reloading>>,
    /// The access log (`--access-log`), when it is on.
    pub access_log: Option<Arc<AccessLog>>,
    /// The trace export (the `OTEL_*` variables, as the master read them), when it is on.
    pub spans: Option<crate::observe::spans::Spans>,
    /// The body sizes seen, to hand memory back after an unusually large one.
    pub body_sizes: crate::heap::BodySizes,
    /// `X-Worker-Pid`, ready to send.
    pub pid: HeaderValue,
    /// The declared pre-processing of document inputs, when the model has any.
    pub documents: Option<Arc<Documents>>,
    /// The declared inputs (pre-processing names them in its messages).
    pub input_specs: Arc<Vec<TensorSpec>>,
    /// Handing gRPC requests to idle siblings, when this worker has a seat on the idle board.
    pub siblings: Option<Arc<Siblings>>,
}

impl App {
    pub fn new(
        shared: Arc<Shared>,
        runner: Runner,
        metadata: AppMetadata,
        hw: Hw,
        cfg: &vramfork::master::worker_config::WorkerConfig,
        api_keys: Option<ApiKeys>,
        documents: Option<Documents>,
    ) -> App {
        let input_specs = Arc::new(metadata.inputs.clone().unwrap_or_default());
        App {
            shared,
            runner,
            model_name: cfg
                .model_name
                .clone()
                .unwrap_or_else(|| metadata.name.clone()),
            platform: crate::model::platform(&cfg.model_path),
            metadata,
            hw,
            max_body_bytes: cfg.limits.max_body_bytes,
            request_timeout: cfg.limits.request_timeout,
            max_queue_wait: cfg.limits.max_queue_wait,
            max_gpu_bytes: cfg.max_worker_gpu_mb.map(|mb| mb.saturating_mul(1 << 20)),
            gpu_context: std::sync::atomic::AtomicU64::new(cfg.gpu_context_mb << 20),
            max_host_bytes: cfg
                .host_memory
                .max_worker_memory_mb
                .map(|mb| mb.saturating_mul(1 << 20)),
            own_memory: Default::default(),
            serving_peak: Default::default(),
            metrics: cfg.metrics.is_some().then(Recorder::default),
            footprint: cfg.footprint,
            api_keys,
            tls: None,
            access_log: cfg
                .log
                .access_log
                .then(|| AccessLog::start(cfg.log.json, cfg.slot)),
            spans: crate::observe::spans::Spans::new(cfg.tracing.export.clone(), cfg.slot),
            body_sizes: crate::heap::BodySizes::default(),
            pid: HeaderValue::from(std::process::id()),
            documents: documents.map(Arc::new),
            input_specs,
            siblings: None,
        }
    }
}

impl App {
    /// Counts a model request's body bytes for `/metrics`.
    pub fn count_bytes_in(&self, endpoint: Endpoint, n: usize) {
        if let Some(m) = &self.metrics {
            m.bytes_in(endpoint, n);
        }
    }
}

impl App {
    /// Whether an answered request is recorded (the access log, spans): what the pipeline
    /// learns of its time is kept then.
    pub fn records(&self) -> bool {
        self.access_log.is_some() || self.spans.is_some()
    }

    /// A request's trace context (sampled when spans are exported and `path` is no probe).
    pub fn trace_context(
        &self,
        headers: &hyper::header::HeaderMap,
        path: &str,
    ) -> crate::observe::trace_context::TraceContext {
        let spans = self
            .spans
            .as_ref()
            .filter(|_| !crate::observe::spans::is_probe(path));
        crate::observe::spans::Spans::context(spans, headers)
    }

    /// An answered request: its spans, when sampled, and its access-log line.
    pub fn record(&self, r: crate::observe::access_log::Record) {
        let spans = self.spans.as_ref().filter(|s| s.wants(&r));
        match (spans, &self.access_log) {
            (Some(s), Some(log)) => {
                s.record(r.clone());
                log.push(r);
            }
            (Some(s), None) => s.record(r),
            (None, Some(log)) => log.push(r),
            (None, None) => {}
        }
    }

    /// What this worker counted: its answers, and its batches from the model thread.
    pub fn traffic(&self) -> Traffic {
        let mut t = self
            .metrics
            .as_ref()
            .map(Recorder::traffic)
            .unwrap_or_default();
        t.batches = self.runner.batches();
        t.text_pass_tokens_max = crate::runner::pass_tokens::largest();
        (t.text_tokens, t.text_tokens_padded) = crate::runner::pass_tokens::totals();
        t.access_log_dropped = self.access_log.as_ref().map_or(0, |l| l.dropped());
        t.trace_spans_dropped = self.spans.as_ref().map_or(0, |s| s.dropped());
        t.log_lines_dropped = vramfork::logging::dropped(vramfork::logging::Kind::Log);
        t
    }
}
