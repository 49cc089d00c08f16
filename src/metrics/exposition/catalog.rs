//! The families `/metrics` exposes, in the order a scrape lists them: requests and
//! traffic, workers, GPU and per-worker memory, the plan. Each function registers one
//! group from the snapshot.

use std::collections::BTreeMap;

use super::families::{l, Families, Family, Labels};
use super::{
    batch_sizes, GpuRow, Snapshot, WorkerRow, EXIT_REASONS, READMISSION_OUTCOMES, START_METHODS,
    STATES,
};

/// Requests by endpoint and code, their bytes, out-of-memory answers, their durations.
pub(super) fn requests(f: &mut Families, s: &Snapshot) {
    let t = &s.traffic;
    let per_endpoint =
        |get: &dyn Fn(&crate::metrics::traffic::EndpointTraffic) -> u64| -> Vec<(Labels, u64)> {
            t.endpoints
                .iter()
                .map(|(e, et)| (l(&[("endpoint", e)]), get(et)))
                .collect()
        };

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
        "queue_wait",
        "How long requests waited for a worker and its model before their pass started: the listen queue and the model queue, not the time their body took to arrive (the access log's wait_ms).",
        vec![(vec![], t.queue_wait.clone())],
    );
}

/// Forward passes and pre-processing: durations, batches and their rows.
pub(super) fn passes(f: &mut Families, s: &Snapshot) {
    let t = &s.traffic;
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
    if t.text_tokens_padded > 0 {
        f.counter(
            "text_tokens",
            "Tokens of the text passes given to the model (any door, each pass as it ran, batched or not): kind real the rows' own, kind padded once padded to one length; real / padded is the padding efficiency.",
            vec![
                (l(&[("kind", "real")]), t.text_tokens),
                (l(&[("kind", "padded")]), t.text_tokens_padded),
            ],
        );
    }
    if t.text_pass_tokens_max > 0 {
        f.gauge(
            "text_pass_tokens_max",
            "The most tokens one forward pass of a text input held (rows x padded length, any door, batched or not): at most the token budget (max_batch_tokens), but for a single longer document, which runs alone.",
            None,
            vec![(vec![], t.text_pass_tokens_max as f64)],
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
}

/// Refusals and losses: auth failures, dropped log lines; requests in flight and waiting.
pub(super) fn refusals(f: &mut Families, s: &Snapshot) {
    let t = &s.traffic;
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
        "connections_closed",
        "Connections the workers closed on their client's account, by reason: abuse (HTTP/2 GOAWAY ENHANCE_YOUR_CALM: too many reset streams, too many control frames), protocol_error (GOAWAY for another HTTP/2 protocol error), unread (the client read nothing of its answers for the keep-alive idle limit).",
        t.connections_closed
            .iter()
            .map(|(reason, n)| (l(&[("reason", reason)]), *n))
            .collect(),
    );
    f.counter(
        "access_log_dropped",
        "Access-log lines dropped because stderr could not keep up (--access-log); the requests were answered.",
        vec![(vec![], t.access_log_dropped)],
    );
    f.counter(
        "trace_spans_dropped",
        "Spans the workers dropped because the collector was slow, down or refused them (the OTEL_* trace export); no request waited for it.",
        vec![(vec![], t.trace_spans_dropped)],
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
    let w = &s.waiting;
    f.gauge(
        "requests_waiting",
        "Requests waiting for a model: connections with a request in the listening socket's accept queue that no worker has taken (queue=listen, read from the kernel), and requests workers have taken that wait for their model (queue=model, as of their last heartbeats).",
        None,
        vec![
            (l(&[("queue", "listen")]), w.listen as f64),
            (l(&[("queue", "model")]), w.model as f64),
        ],
    );
    let lanes =
        crate::lanes::LANES.map(|lane| (l(&[("lane", lane.name())]), w.lanes[lane.index()] as f64));
    f.gauge(
        "requests_waiting_by_lane",
        "Requests workers have taken that wait for their model, by priority lane (high, normal, low; as of their last heartbeats): the queue=model row of vramfork_requests_waiting by lane, so that scaling can leave the low lane's backlog out.",
        None,
        lanes.to_vec(),
    );
    f.gauge(
        "listen_queue_limit",
        "Connections the listening socket's accept queue may hold (the backlog as the kernel caps it, net.core.somaxconn); absent once the socket is closed.",
        None,
        w.listen_limit
            .map(|n| vec![(vec![], n as f64)])
            .unwrap_or_default(),
    );
}

/// Workers by state, planned, started, booted and exited.
pub(super) fn workers(f: &mut Families, s: &Snapshot) {
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
}

/// GPU memory (NVML) and each worker's memory and requests.
pub(super) fn memory(f: &mut Families, s: &Snapshot) {
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
    let per_worker: [Family<WorkerRow, Option<u64>>; 4] = [
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
        (
            "worker_private_memory_bytes",
            "The worker's own host memory: what it alone holds (smaps_rollup Private_Dirty + SwapPss), not the weights it shares with the template; what --max-worker-memory-mb recycles by.",
            |w| w.own,
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
}

/// The plan's bounds and worker count, one worker's GPU footprint by source, the build.
pub(super) fn plan(f: &mut Families, s: &Snapshot) {
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
        "plan_host_memory_bound",
        "The most workers host memory allows: what the server may use / one worker's measured peak (absent until measured).",
        None,
        s.plan
            .host_bound
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
    let peaks: Vec<(Labels, f64)> = [
        ("warmup", p.pass_peak_warmup),
        ("observed", p.pass_peak_observed),
    ]
    .into_iter()
    .filter_map(|(src, b)| b.map(|b| (l(&[("source", src)]), b as f64)))
    .collect();
    f.gauge_bytes(
        "worker_pass_peak_bytes",
        "How far one worker's forward passes take its resident set: warmup (the template's warm-up passes, what the host-memory plan counts per worker) and observed (the most any worker's rose serving, above its figure when ready).",
        peaks,
    );
    f.gauge(
        "build_info",
        "The vramfork build serving, as labels; always 1.",
        None,
        vec![(l(&[("version", env!("CARGO_PKG_VERSION"))]), 1.0)],
    );
}

/// `--idle-release`: released now, releases, re-admissions and how long they took.
pub(super) fn idle(f: &mut Families, s: &Snapshot) {
    let i = &s.idle;
    f.gauge(
        "idle_released",
        "1 while the server has released its GPU workers for being idle (--idle-release), else 0 (absent when neither --idle-release nor lending is on; a server that lent its room is released too).",
        None,
        i.released
            .map(|r| vec![(vec![], if r { 1.0 } else { 0.0 })])
            .unwrap_or_default(),
    );
    f.counter(
        "idle_releases",
        "Times the server released its GPU workers and its reservation for being idle.",
        vec![(vec![], i.releases)],
    );
    f.counter(
        "idle_readmissions",
        "Requests that arrived while released: admitted (workers started again) or no_room (answered 503).",
        READMISSION_OUTCOMES
            .iter()
            .map(|o| (l(&[("outcome", o)]), i.readmissions.get(*o).copied().unwrap_or(0)))
            .collect(),
    );
    f.histogram(
        "idle_readmission_duration",
        "From the request that re-admitted a released server to its first worker ready.",
        vec![(vec![], i.readmission.clone())],
    );
}

/// The GPU-memory ledger as this server sees it: each server's reservation, workers and
/// reload time, labelled by its id, app, port and state.
pub(super) fn ledger(f: &mut Families, s: &Snapshot) {
    let labels = |r: &super::LedgerRow| {
        l(&[
            ("server", &r.server),
            ("app", &r.app),
            ("port", &r.port),
            ("state", &r.state),
        ])
    };
    f.gauge_bytes(
        "ledger_reserved",
        "What each server sharing the GPU-memory ledger reserves (this one too), by its id, app, port and state (serving, idle, lent, pinned, waiting).",
        s.ledger
            .iter()
            .map(|r| (labels(r), r.reserved_mb as f64 * 1048576.0))
            .collect(),
    );
    f.gauge(
        "ledger_workers",
        "Live workers of each server sharing the GPU-memory ledger that says it.",
        None,
        s.ledger
            .iter()
            .filter_map(|r| Some((labels(r), f64::from(r.workers?))))
            .collect(),
    );
    f.gauge(
        "ledger_reload_seconds",
        "Each server's measured reload time (a request to a worker ready), as it says it in the ledger.",
        None,
        s.ledger
            .iter()
            .filter_map(|r| Some((labels(r), r.reload_ms? as f64 / 1e3)))
            .collect(),
    );
}
