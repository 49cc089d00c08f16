//! The command line: every option is a long flag and an environment variable
//! `VRAMFORK_<NAME>` (a flag beats the variable). Values arrive here as text and are
//! validated in `config/`, so that every bad value gets one message naming the option,
//! the value and what is allowed. An option's default is written once, beside its check in
//! `config/<group>.rs` (`DEFAULTS`), and `config::command` renders it into `--help`; the
//! `[default: …]` written here are those that are not a value (off, planned, by GPU size).

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// Serve a PyTorch model (torch.export or TorchScript) over HTTP with GPU-memory-aware
/// pre-forked workers.
///
/// `app` serves in one process (development); `app --production` starts a master that plans,
/// starts and supervises workers; `app plan` prints the plan and exits.
#[derive(Debug, Parser)]
#[command(name = "app", version, about, long_about = None, allow_negative_numbers = true, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Run the master: plan, pre-fork and supervise workers.
    #[arg(long, global = true, env = "VRAMFORK_PRODUCTION",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub production: bool,

    /// App metadata file (name, model, est_gpu_mem_min, est_gpu_mem_typ, input or inputs,
    /// outputs, max_batch_size, profile_input, warmup_inputs, op_libraries;
    /// app-metadata.example.json).
    #[arg(long, global = true, env = "VRAMFORK_METADATA", value_name = "FILE")]
    pub metadata: Option<OsString>,

    /// Model file (a torch.export archive, `.pt2`, or TorchScript); overrides the metadata's
    /// `model`.
    #[arg(long, global = true, env = "VRAMFORK_MODEL", value_name = "FILE")]
    pub model: Option<OsString>,

    /// The model's name in the v2 protocol (/v2/models/NAME/...); KServe's serving runtime
    /// passes the InferenceService's name. [default: the metadata's name]
    #[arg(long, global = true, env = "VRAMFORK_MODEL_NAME", value_name = "NAME")]
    pub model_name: Option<String>,

    /// Address to listen on (use 0.0.0.0 in containers).
    #[arg(long, global = true, env = "VRAMFORK_HOST")]
    pub host: Option<String>,

    /// Port to listen on; 0 picks a free one.
    #[arg(long, global = true, env = "VRAMFORK_PORT")]
    pub port: Option<String>,

    /// Serve Prometheus metrics at GET /metrics on this port (same host as --host); 0 picks
    /// a free one. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_METRICS_PORT",
        value_name = "PORT"
    )]
    pub metrics_port: Option<String>,

    /// Fixed worker count, overriding the plan (also VRAMFORK_WORKERS, then
    /// CLAMS_GUNICORN_WORKERS).
    #[arg(long, global = true, env = "VRAMFORK_WORKERS", value_name = "N")]
    pub workers: Option<String>,

    /// Recycle a worker after N model requests (POST / and v2 inferences); 0 = never, 1 =
    /// after every request.
    #[arg(long, global = true, env = "VRAMFORK_MAX_REQUESTS", value_name = "N")]
    pub max_requests: Option<String>,

    /// Add 0..N requests at random to each worker's limit so workers do not recycle together.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_MAX_REQUESTS_JITTER",
        value_name = "N"
    )]
    pub max_requests_jitter: Option<String>,

    /// Kill and replace a worker silent (no heartbeat) for S seconds.
    #[arg(long, global = true, env = "VRAMFORK_TIMEOUT", value_name = "S")]
    pub timeout: Option<String>,

    /// Kill a worker that has not loaded its model in S seconds; exit when none has been
    /// ready for S seconds.
    #[arg(long, global = true, env = "VRAMFORK_BOOT_TIMEOUT", value_name = "S")]
    pub boot_timeout: Option<String>,

    /// On stop, recycle and reload, in-flight requests get S seconds.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_GRACEFUL_TIMEOUT",
        value_name = "S"
    )]
    pub graceful_timeout: Option<String>,

    /// A request still running after S seconds gets 504 and its worker is replaced.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_REQUEST_TIMEOUT",
        value_name = "S"
    )]
    pub request_timeout: Option<String>,

    /// A request that waited more than S seconds before a worker could take it (in the
    /// listen queue, then for the model) gets 503 with Retry-After instead of being served;
    /// 0 = wait without bound.
    #[arg(long, global = true, env = "VRAMFORK_MAX_QUEUE_WAIT", value_name = "S")]
    pub max_queue_wait: Option<String>,

    /// Rows a worker may stack into one forward pass (dynamic batching); 0 = one request per
    /// pass. Overrides the metadata's `max_batch_size`. [default: the metadata's, else 0]
    #[arg(long, global = true, env = "VRAMFORK_MAX_BATCH_SIZE", value_name = "N")]
    pub max_batch_size: Option<String>,

    /// With batching, how long (ms) the model thread may wait for more requests to fill a
    /// batch; 0 = run what is queued now.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_BATCH_TIMEOUT_MS",
        value_name = "MS"
    )]
    pub batch_timeout_ms: Option<String>,

    /// Forward passes on zeros a process that loads the model runs before it serves (the
    /// template, and workers that are exec'd), at the metadata's `warmup_inputs` or declared
    /// input shapes, and with batching at max_batch_size rows too; 0 = none (and no check of
    /// the declared inputs at boot).
    #[arg(long, global = true, env = "VRAMFORK_WARMUP_PASSES", value_name = "N")]
    pub warmup_passes: Option<String>,

    /// Small CPU passes on the worker's event loop: auto (on the CPU with --torch-threads 1
    /// and no batching, once a worker's last 8 passes each took under 1 ms, for inputs no
    /// larger than theirs; no hop to the model thread), off (every pass on the model
    /// thread).
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_INLINE_PASSES",
        value_name = "auto|off"
    )]
    pub inline_passes: Option<String>,

    /// Measure a worker's GPU memory before planning: auto (on when the workers go on a GPU
    /// and the metadata declares an input shape), on or off.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_PROFILE_MEMORY",
        value_name = "WHEN"
    )]
    pub profile_memory: Option<String>,

    /// Plan from the measured footprint × F (at least est_gpu_mem_min).
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_MEMORY_HEADROOM",
        value_name = "F"
    )]
    pub memory_headroom: Option<String>,

    /// When workers are seen using more GPU memory than the plan assumed, retire workers
    /// one at a time down to what fits (never below one). [default: off]
    #[arg(long, global = true, env = "VRAMFORK_ADAPT_WORKERS",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub adapt_workers: bool,

    /// Keep the highest GPU footprint seen per model file (by SHA-256) in this JSON file,
    /// and plan from it at the next start. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_FOOTPRINT_FILE",
        value_name = "FILE"
    )]
    pub footprint_file: Option<OsString>,

    /// Where the model runs: auto, cpu or cuda.
    #[arg(long, global = true, env = "VRAMFORK_DEVICE")]
    pub device: Option<String>,

    /// Request bodies larger than N MB get 413.
    #[arg(long, global = true, env = "VRAMFORK_MAX_BODY_MB", value_name = "N")]
    pub max_body_mb: Option<String>,

    /// Share (0..1] of each GPU's memory the server may plan for. [default: by GPU size]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_GPU_MEMORY_UTILIZATION",
        value_name = "F"
    )]
    pub gpu_memory_utilization: Option<String>,

    /// Per GPU, memory (MB) kept free for CUDA contexts and transients.
    #[arg(long, global = true, env = "VRAMFORK_GPU_RESERVE_MB", value_name = "N")]
    pub gpu_reserve_mb: Option<String>,

    /// Recycle a worker (after its current request) whose GPU memory grew past N MB, as
    /// nvidia-smi shows it: its allocator's memory plus its CUDA context. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_MAX_WORKER_GPU_MB",
        value_name = "N"
    )]
    pub max_worker_gpu_mb: Option<String>,

    /// NVIDIA MPS: auto (detected by its control socket in CUDA_MPS_PIPE_DIRECTORY, else
    /// /tmp/nvidia-mps: workers are MPS clients, an exclusive-process GPU takes as many as
    /// a shared one, each gets a per-client memory limit, and a fatal CUDA error retires
    /// that GPU's workers together), on (as if detected), off (plan without MPS: one
    /// worker per exclusive-process GPU).
    #[arg(long, global = true, env = "VRAMFORK_MPS", value_name = "auto|on|off")]
    pub mps: Option<String>,
    /// Recycle a worker (after its current request) whose own host memory — what it alone
    /// holds (smaps_rollup's Private_Dirty + SwapPss), not the weights it shares with the
    /// template — grew past N MB. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_MAX_WORKER_MEMORY_MB",
        value_name = "N"
    )]
    pub max_worker_memory_mb: Option<String>,

    /// The memory cgroup directory to read the limit, the usage and the OOM kills from
    /// (cgroup v2's memory.max or v1's memory.limit_in_bytes in it). [default: this
    /// process's own, from /proc/self/cgroup]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_MEMORY_CGROUP",
        value_name = "DIR"
    )]
    pub memory_cgroup: Option<OsString>,

    /// The directory of the GPU-memory ledger the servers of this host share: each
    /// reserves what its workers on GPUs take and plans around the others'
    /// reservations; off plans alone.
    #[arg(long, global = true, env = "VRAMFORK_LEDGER", value_name = "DIR")]
    pub ledger: Option<OsString>,

    /// A server on GPUs whose workers got no request for this many seconds retires them
    /// and gives its reservation in the ledger back; the next request starts them again
    /// (or is answered 503 with Retry-After when the GPU has no room). 0 or off: never.
    /// [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_IDLE_RELEASE",
        value_name = "SECONDS"
    )]
    pub idle_release: Option<String>,

    /// A server on GPUs whose workers got no request for this many seconds gives their
    /// room back when a neighbour on the same GPU asks for room through the ledger (least
    /// valuable first); its next request waits for room again. 0 or off: never lends.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_EVICTABLE_AFTER",
        value_name = "SECONDS"
    )]
    pub evictable_after: Option<String>,

    /// Keep this server's GPU room whatever its neighbours need: it never lends (also the
    /// metadata's "pin": true). [default: off]
    #[arg(long, global = true, env = "VRAMFORK_PIN",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub pin: bool,

    /// Load NVML from this file instead of the system's libnvidia-ml.so.1.
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_NVML_LIBRARY",
        value_name = "PATH"
    )]
    pub nvml_library: Option<OsString>,

    /// For tests with a simulated NVML (tests/nvml-mock) only: workers placed on a
    /// simulated GPU load the model on the CPU and report it as such, instead of being
    /// refused for coming up without CUDA. [default: off]
    #[arg(long, global = true, env = "VRAMFORK_SIMULATED_GPUS",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub simulated_gpus: bool,

    /// Torch intra-op threads per worker. [default: max(1, cores / workers)]
    #[arg(long, global = true, env = "VRAMFORK_TORCH_THREADS", value_name = "N")]
    pub torch_threads: Option<String>,

    /// The worker binary. [default: app-worker beside this executable]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_WORKER_BINARY",
        value_name = "FILE"
    )]
    pub worker_binary: Option<OsString>,

    /// Log format: text or json. The filter is VRAMFORK_LOG (e.g. `info`, `debug`).
    #[arg(long, global = true, env = "VRAMFORK_LOG_FORMAT")]
    pub log_format: Option<String>,

    /// Require `Authorization: Bearer <key>` on the serving port (all but /healthz and
    /// /v2/health/*): the keys, one per line, re-read on HUP. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_API_KEY_FILE",
        value_name = "FILE"
    )]
    pub api_key_file: Option<OsString>,

    /// Require `Authorization: Bearer <key>` for GET /metrics on --metrics-port (its
    /// /health/* stay open): the keys, one per line, read at every scrape. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_METRICS_API_KEY_FILE",
        value_name = "FILE"
    )]
    pub metrics_api_key_file: Option<OsString>,

    /// Serve HTTPS: the server's certificate chain (PEM, leaf first), on the serving port
    /// and on --metrics-port. Needs --tls-key. Re-read when the files change. [default: off]
    #[arg(long, global = true, env = "VRAMFORK_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<OsString>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[arg(long, global = true, env = "VRAMFORK_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<OsString>,

    /// Mutual TLS: CA certificates (PEM); every client must present a certificate signed by
    /// one of them. Needs --tls-cert. [default: off]
    #[arg(
        long,
        global = true,
        env = "VRAMFORK_TLS_CLIENT_CA",
        value_name = "FILE"
    )]
    pub tls_client_ca: Option<OsString>,

    /// Write one access-log line per answered request to stderr (in --log-format): time,
    /// request id, method, path, status, bytes in and out, time waiting, time in the model,
    /// total, batch, worker slot and pid. [default: off]
    #[arg(long, global = true, env = "VRAMFORK_ACCESS_LOG",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub access_log: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the plan (what was measured, each bound, the worker count, where each worker
    /// goes) and exit.
    Plan {
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
        /// Start one worker, measure its GPU memory after a forward pass, and print the
        /// measured footprint, the plan it gives and the metadata values to use.
        #[arg(long)]
        measure: bool,
    },
    /// Print the host's GPU-memory ledger: each server sharing it (name, port, id, GPU,
    /// reserved MB, live workers, state, last request, measured reload time), read
    /// without its lock, and exit.
    Ledger {
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Each option's flag and environment variable, as the command line above declares them
/// (for the check of set-but-empty values, and to name a value's origin in messages).
pub fn option_env() -> Vec<(String, String)> {
    use clap::CommandFactory;
    Cli::command()
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_string();
            Some((format!("--{}", a.get_long()?), env))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_option_has_its_variable_named_after_it() {
        let cmd = Cli::command();
        let flags: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help" && l != "--version")
            .collect();
        let listed = option_env();
        assert!(listed.len() >= 40, "{listed:?}");
        assert_eq!(flags.len(), listed.len(), "an option without a variable");
        for (flag, env) in listed {
            let want = format!("VRAMFORK_{}", flag[2..].replace('-', "_").to_uppercase());
            assert_eq!(env, want, "{flag}");
        }
    }
}
