//! Under NVIDIA MPS with no per-client memory limit known, the server fails safe
//! (`src/master/plan/mps.rs`): the Kubernetes device plugin's MPS sharing sets each client's
//! limit (total ÷ replicas) and thread share (100 ÷ replicas) on the daemon and passes only
//! `CUDA_MPS_PIPE_DIRECTORY` to the pod, so a plan over the whole GPU would take its
//! neighbours' memory. Serving refuses to start (exit 2, naming what to set) unless the
//! share is stated, as `--gpu-memory-utilization` or `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`;
//! `app plan` shows the plan with that refusal. The plan's text counts each worker's thread
//! share (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`): N workers are N clients.
//!
//! On one simulated A100 40 GB in exclusive-process mode behind a stand-in MPS control
//! daemon (`tests/common/host.rs`).

mod common;

use common::host::Host;
use common::nvml_sim::{self, MpsDaemon, SimGpu};
use common::*;
use serde_json::Value;

/// The device plugin's view from inside the pod: an exclusive-process GPU whose MPS daemon
/// answers at the pipe directory, and nothing else (`more`: further variables).
fn device_plugin_pod(more: &[(&str, &str)]) -> (MpsDaemon, Host) {
    let daemon = MpsDaemon::start();
    let exclusive = SimGpu::a100_40gb()
        .compute_mode(nvml_sim::SimComputeMode::ExclusiveProcess)
        .mps(4_242, 300);
    let mut host =
        Host::with_gpu(exclusive).with_env("CUDA_MPS_PIPE_DIRECTORY", &daemon.pipe_dir());
    for (k, v) in more {
        host = host.with_env(k, v);
    }
    (daemon, host)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn under_mps_with_no_share_stated_serving_refuses_to_start_naming_what_to_set() {
    let (_daemon, host) = device_plugin_pod(&[]);
    let app = host.app(4000);
    let mut s = host.spawn(&app, &["--production", "--profile-memory", "off"]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(2), "fail safe, exit 2:\n{log}");
    for want in [
        "this server's share of them is unknown",
        "--gpu-memory-utilization 1/replicas",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "--mps off",
    ] {
        assert!(log.contains(want), "{want}:\n{log}");
    }
    assert!(
        s.events_named("worker_started").is_empty(),
        "no worker may start:\n{log}"
    );
    // `app plan` shows the plan, and why serving would refuse it.
    let p = host.plan(&app, &[]);
    let why = p["mps_share_unknown"]
        .as_str()
        .unwrap_or_else(|| panic!("{p:#}"));
    assert!(why.contains("--gpu-memory-utilization 1/replicas"), "{why}");
    assert!(strings(&p["warnings"]).iter().any(|w| w == why), "{p:#}");
}

#[test]
fn under_mps_a_share_stated_by_gpu_memory_utilization_serves_within_it() {
    let (_daemon, host) = device_plugin_pod(&[]);
    let app = host.app(2000);
    let args = [
        "--gpu-memory-utilization",
        "0.25",
        "--profile-memory",
        "off",
    ];
    let p = host.plan(&app, &args);
    assert!(p["mps_share_unknown"].is_null(), "{p:#}");
    let g = &p["gpus"][0];
    // 0.25 of 40,960 MB, less the 500 MB reserve: 9,740 MB, four workers of 2,000 MB.
    assert_eq!(g["usable_mb"], 9_740, "{p:#}");
    assert_eq!(g["fits"], 4, "{p:#}");
    assert!(
        strings(&p["warnings"])
            .iter()
            .any(|w| w.contains("the plan takes 0.25 of each GPU") && w.contains("1 ÷ replicas")),
        "{p:#}"
    );
    let mut serve = vec!["--workers", "2"];
    serve.extend_from_slice(&args);
    let (s, n) = host.serving(&app, &serve);
    assert_eq!(n, 2, "{}", s.log_text());
}

#[test]
fn under_mps_the_plan_counts_each_workers_thread_share() {
    let (_daemon, host) = device_plugin_pod(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")]);
    let app = host.app(2000);
    let p = host.plan(&app, &["--gpu-memory-utilization", "0.5", "--workers", "3"]);
    let why = strings(&p["why"]);
    assert!(
        why.iter().any(|w| w.contains(
            "GPU 0: 3 workers are 3 MPS clients, each with 25 % of its SMs \
             (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): together up to 75 %"
        )),
        "{p:#}"
    );
    // Without the variable: the daemon's default share, counted per worker all the same.
    let (_daemon, host) = device_plugin_pod(&[]);
    let p = host.plan(&app, &["--gpu-memory-utilization", "0.5", "--workers", "3"]);
    assert!(
        strings(&p["why"]).iter().any(|w| w.contains(
            "GPU 0: 3 workers are 3 MPS clients, each with the daemon's default share of its SMs"
        ) && w.contains("together 3 times that share")),
        "{p:#}"
    );
    // A value MPS would not read is refused, naming the variable.
    let (_daemon, host) = device_plugin_pod(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "most")]);
    let mut s = host.spawn(&app, &["plan"]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(2), "{}", s.log_text());
    assert!(
        s.log_text()
            .contains("invalid value 'most' for CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "{}",
        s.log_text()
    );
}

/// A socket that is not the daemon's in the pipe directory: under `--mps auto` the reason
/// MPS was not detected is said at start, not dropped.
#[test]
fn under_mps_auto_a_failed_detection_says_why_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let _stream = std::os::unix::net::UnixListener::bind(dir.path().join("control")).unwrap();
    let pipe = dir.path().display().to_string();
    let host = Host::with_gpu(SimGpu::a100_40gb()).with_env("CUDA_MPS_PIPE_DIRECTORY", &pipe);
    let app = host.app(4000);
    let mut s = host.spawn(&app, &["plan"]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
    let e = s.wait_event("mps_not_detected", |_| true);
    assert!(
        e.message()
            .contains("but not as the MPS control daemon does (SOCK_SEQPACKET)"),
        "{e:?}"
    );
}
