//! A worker's start-up, as library calls: [`exec`] for a worker started by exec (its
//! configuration from the environment), [`boot`] for either kind (a forked one brings its
//! model, loaded on the CPU by the template). Start-up order matters: logging and the process
//! name, the inherited descriptors ([`Inherited`]), torch's threads, the model ([`load`]),
//! then serving ([`serve`]).

use std::sync::Arc;
use std::time::Duration;

use vramfork::master::worker_config::WorkerConfig;
use vramfork::metadata::AppMetadata;
use vramfork::protocol::{worker_exit, BootTimes};

use crate::{
    app, control, cuda, documents, heap, hw, lifecycle, listener, memory, process, runner,
    siblings, state,
};

/// A worker started by exec: its configuration and metadata from the environment, then
/// [`boot`]; the exit status, with one line on stderr when it could not start.
pub fn exec(process_ms: f64) -> i32 {
    let booted = crate::config::from_env()
        .map_err(|m| (worker_exit::CONFIG, m))
        .and_then(|(cfg, metadata)| boot(cfg, metadata, process_ms, None));
    status(booted)
}

/// The exit status of a boot, saying why on stderr when it failed.
pub fn status(booted: Result<i32, (i32, String)>) -> i32 {
    match booted {
        Ok(code) => code,
        Err((code, msg)) => {
            vramfork::logging::say(&format!("app-worker: {msg}"));
            code
        }
    }
}

/// Boots a worker from its configuration (exec'd, or forked by the template with the model
/// already loaded on the CPU) and serves until it retires; returns the exit status. In the
/// order the module's doc gives: logging and the process name, the inherited descriptors
/// ([`Inherited`]), torch's threads, the model ([`load`]), then serving ([`serve`]).
pub fn boot(
    cfg: WorkerConfig,
    metadata: AppMetadata,
    process_ms: f64,
    preloaded: Option<crate::model::Model>,
) -> Result<i32, (i32, String)> {
    vramfork::logging::init(cfg.log.json);
    heap::configure();
    let span = tracing::info_span!(
        "worker",
        slot = cfg.slot,
        pid = std::process::id(),
        generation = cfg.generation
    );
    let _entered = span.enter();
    process::set_name(cfg.slot);
    memory::set_oom_score_adj(cfg.oom_score_adj);
    let fds = Inherited::take(&cfg).map_err(|m| (worker_exit::CONFIG, m))?;
    if preloaded.is_none() {
        process::set_torch_threads(cfg.torch_threads);
    } else {
        // Forked from the template: the inter-op setting is inherited.
        process::set_intra_threads(cfg.torch_threads);
        memory::forked();
    }
    let model = load(&cfg, &metadata, preloaded, &fds.control)?;
    serve(cfg, metadata, fds, model, process_ms)
}

/// What a worker inherits besides its configuration: the listening socket (fd 3), its seat
/// on the idle board, the control channel (fd 4), the keys and TLS material (fd 7), and a
/// development-mode worker's metrics listener (fd 5).
pub struct Inherited {
    listener: std::net::TcpListener,
    board: Option<(vramfork::board::Board, u32)>,
    control: control::Control,
    api_keys: Option<vramfork::auth::ApiKeys>,
    tls: Option<Arc<vramfork::tls::Reloading>>,
    serve_metrics: Option<lifecycle::ServeMetrics>,
}

impl Inherited {
    fn take(cfg: &WorkerConfig) -> Result<Inherited, String> {
        let listener = listener::inherit()?;
        let board = cfg.board_seat.and_then(|seat| {
            vramfork::board::Board::attach(vramfork::protocol::BOARD_FD)
                .map(|b| (b, seat))
                .map_err(|e| tracing::warn!("cannot map the idle board: {e}; accepting without it"))
                .ok()
        });
        let control = control::Control::inherit(cfg.has_control)?;
        // The keys and TLS material the master last accepted (never the files as they are
        // now: one emptied or half-written since cannot stop this worker), else, for a worker
        // started by hand, the files.
        let access = &cfg.access;
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let secrets = vramfork::secrets::Secrets::for_worker(
            cfg.secrets,
            path(&access.api_key_file).as_deref(),
            path(&access.metrics_api_key_file).as_deref(),
            access.tls.as_ref(),
        )?;
        let api_keys = secrets.api_keys()?;
        let tls_of = || {
            secrets
                .tls(access.tls.as_ref())
                .map_err(|e| format!("TLS: {e}"))
        };
        // The serving port offers HTTP/2 (gRPC) beside HTTP/1.1; the metrics port does not.
        let tls = tls_of()?.map(|t| Arc::new(t.offering_h2()));
        let serve_metrics = match cfg.metrics.clone().filter(|m| m.serve) {
            Some(config) => Some(lifecycle::ServeMetrics {
                listener: listener::inherit_metrics()?,
                config,
                key_file: access.metrics_api_key_file.clone(),
                keys: secrets.metrics_keys()?,
                tls: tls_of()?.map(Arc::new),
            }),
            None => None,
        };
        Ok(Inherited {
            listener,
            board,
            control,
            api_keys,
            tls,
            serve_metrics,
        })
    }
}

/// The model, loaded and warmed up on its thread.
struct Model {
    runner: runner::Runner,
    info: runner::ModelInfo,
    /// `cuda:N`, `cpu` or `cpu (simulated GPU)`.
    device: String,
    documents: Option<documents::Documents>,
}

/// Loads the operator libraries, the tokenizers and the model (on its device, capped,
/// batching as configured), profiles it when the master asks (the figures go over
/// `control` before `Ready`), and says how it went.
fn load(
    cfg: &WorkerConfig,
    metadata: &AppMetadata,
    preloaded: Option<crate::model::Model>,
    control: &control::Control,
) -> Result<Model, (i32, String)> {
    // The cap in bytes, which the worker turns into a fraction of CUDA's own total.
    let cap_bytes = cfg.gpu.as_ref().and_then(|g| g.cap_mb.map(|mb| mb << 20));
    // `--simulated-gpus`: the GPU is NVML's stand-in; the model honestly runs on the CPU.
    let wanted = if cfg.simulated_gpu {
        vramfork::protocol::Device::Cpu
    } else {
        cfg.device
    };
    let batch = &cfg.batch;
    let batching = (batch.max_batch_size > 0).then_some(runner::Batching {
        max_rows: batch.max_batch_size as usize,
        timeout: batch.batch_timeout,
    });
    let profile = match (
        cfg.profile,
        &metadata.inputs,
        metadata.profile_shapes(batch.max_batch_size),
    ) {
        (true, Some(specs), Some(shapes)) => Some(runner::Profile {
            specs: specs.clone(),
            shapes,
        }),
        _ => None,
    };
    if preloaded.is_none() {
        // Forked from the template: loaded there already, and inherited.
        runner::load_op_libraries(&metadata.op_libraries, &cfg.model_path)
            .map_err(|e| (e.exit_code(), e.to_string()))?;
    }
    // The tokenizers of text inputs, read before the model so that a bad one fails the boot
    // at once, naming the input and the file.
    let documents = documents::Documents::load(metadata.inputs.as_deref(), cfg.torch_threads)
        .map_err(|e| {
            (
                worker_exit::CONFIG,
                format!("app metadata {}: {e}", metadata.path.display()),
            )
        })?;
    configure_parts(metadata, batch.max_batch_size, documents.as_ref());
    let (runner, info, profiled) = runner::Runner::start(runner::Setup {
        path: cfg.model_path.clone(),
        wanted,
        cap_bytes,
        preloaded,
        declared: crate::model::Declared::of(metadata, batch.max_batch_size)
            .placed(cfg.gpu.as_ref()),
        batching,
        profile,
        warm: runner::Warmup::plan(metadata, batch.warmup_passes, batch.max_batch_size),
        threads: cfg.torch_threads,
        inline: batch.inline_passes,
    })
    .map_err(|e| (e.exit_code(), e.to_string()))?;
    crate::model_archive::loaded(&cfg.model_path);
    let device = match info.cuda {
        Some(i) => format!("cuda:{i}"),
        None if cfg.simulated_gpu => "cpu (simulated GPU)".to_string(),
        None => "cpu".to_string(),
    };
    if cfg.profile {
        report_profile(info.cuda, profiled, control);
    }
    if let Some(b) = batching {
        tracing::info!(
            max_batch_size = b.max_rows,
            batch_timeout_ms = batch.batch_timeout.as_millis() as u64,
            "batching on"
        );
    }
    tracing::info!(
        device,
        model_ms = info.model_ms,
        warmup_ms = info.warmup_ms,
        warmup_passes = info.warmup_passes,
        torch_threads = info.intra_threads,
        "model loaded"
    );

    Ok(Model {
        runner,
        info,
        device,
        documents,
    })
}

/// The token budget a request's text rows run within (`runner::parts`): the smallest of
/// the text inputs' budgets; and the `forward` arguments their tokens become, with where
/// their real tokens show (`runner::pass_tokens`).
fn configure_parts(
    metadata: &AppMetadata,
    max_batch_size: u32,
    docs: Option<&documents::Documents>,
) {
    use runner::pass_tokens::{Real, TextArgs};
    use vramfork::documents::{Document, Feed};
    let budgets = metadata.token_budgets(max_batch_size);
    let Some(tokens) = budgets.iter().map(|(_, b)| b.tokens).min() else {
        return;
    };
    let (mut at, mut texts) = (0, Vec::new());
    for (i, spec) in metadata
        .inputs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let Some(Document::Text(t)) = &spec.document else {
            at += 1;
            continue;
        };
        let arg = |f: Feed| t.feeds.iter().position(|&g| g == f).map(|k| at + k);
        let pad = docs.and_then(|d| d.text(i)).map_or(0, |d| d.pad_id());
        let real = match (arg(Feed::AttentionMask), arg(Feed::InputIds)) {
            (Some(mask), _) => Some(Real::Mask(mask)),
            (None, Some(ids)) => Some(Real::NotPad { ids, pad }),
            (None, None) => None,
        };
        if let Some(real) = real {
            texts.push(TextArgs {
                args: at..at + t.feeds.len(),
                real,
            });
        }
        at += t.feeds.len();
    }
    runner::parts::configure(tokens);
    runner::pass_tokens::configure(texts);
}

/// What the profiling pass used (allocator figures of CUDA device `device`), sent to the master's
/// profiler before `Ready`: it waits for both.
fn report_profile(device: Option<usize>, profiled: runner::Profiled, control: &control::Control) {
    let stats = device.and_then(|i| cuda::memory_stats(i).ok());
    let (pass_ms, error) = match profiled {
        Some(Ok(ms)) => (Some(ms), None),
        Some(Err(e)) => (None, Some(e)),
        None => (
            None,
            Some("the metadata declares no input shape to profile with".to_string()),
        ),
    };
    if let Some(e) = &error {
        tracing::warn!("profiling pass failed: {e}");
    }
    control.send(&vramfork::protocol::ControlMsg::Footprint {
        allocator_peak: stats.map(|s| s.peak_reserved),
        allocator_reserved: stats.map(|s| s.reserved),
        pass_ms,
        error,
    });
}

/// Serves with the model until the worker retires (`lifecycle::run`); its exit status.
fn serve(
    cfg: WorkerConfig,
    metadata: AppMetadata,
    fds: Inherited,
    model: Model,
    process_ms: f64,
) -> Result<i32, (i32, String)> {
    let Inherited {
        listener,
        board,
        control,
        api_keys,
        tls,
        serve_metrics,
    } = fds;
    let Model {
        runner,
        info,
        device,
        documents,
    } = model;
    let shared = Arc::new(
        state::Shared::new(control, cfg.max_requests, cfg.batch.max_batch_size.max(1))
            .with_board(board),
    );
    let hw = hw::Hw::new(info.cuda, cfg.gpu.as_ref(), cfg.nvml_library.clone());
    // Requests are handed between workers that share an idle board (`siblings/`).
    let siblings = shared
        .board()
        .map(|(board, seat)| siblings::Siblings::new(shared.clone(), seat, board.id()));
    let app = Arc::new(app::App {
        tls,
        siblings,
        ..app::App::new(shared, runner, metadata, hw, &cfg, api_keys, documents)
    });
    let plan = lifecycle::Plan {
        listener,
        app,
        boot: BootTimes {
            process_ms,
            model_ms: info.model_ms,
            warmup_ms: info.warmup_ms,
        },
        device,
        heartbeat: Duration::from_millis(cfg.heartbeat_ms),
        graceful: cfg.limits.graceful_timeout,
        metrics: serve_metrics,
    };
    lifecycle::run(plan).map_err(|e| (worker_exit::CONFIG, format!("{e:#}")))
}
