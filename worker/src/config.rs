//! The worker's configuration: [`WorkerConfig`] from `VRAMFORK_WORKER_CONFIG`, checked, plus
//! the app metadata it carries (a TorchServe archive's model unpacked, `model_archive.rs`).
//! Any problem is one message; the worker exits with `worker_exit::CONFIG`.

use std::path::Path;

use vramfork::master::worker_config::WorkerConfig;
use vramfork::metadata::AppMetadata;
use vramfork::protocol::ENV_WORKER_CONFIG;

/// Reads and checks the configuration from the environment.
pub fn from_env() -> Result<(WorkerConfig, AppMetadata), String> {
    let text = std::env::var(ENV_WORKER_CONFIG).map_err(|_| {
        format!("{ENV_WORKER_CONFIG} is not set (the master passes the worker's configuration as JSON there)")
    })?;
    let (mut cfg, metadata) = parse(&text)?;
    if let Some(file) = crate::model_archive::unpacked(&cfg.model_path, metadata.archive.as_ref())?
    {
        cfg.model_path = file;
    }
    Ok((cfg, metadata))
}

pub fn parse(text: &str) -> Result<(WorkerConfig, AppMetadata), String> {
    let cfg: WorkerConfig = serde_json::from_str(text)
        .map_err(|e| format!("{ENV_WORKER_CONFIG} is not a valid worker configuration: {e}"))?;
    let positive = [
        ("torch_threads", cfg.torch_threads as u64),
        ("limits.max_body_bytes", cfg.limits.max_body_bytes),
        (
            "limits.request_timeout",
            cfg.limits.request_timeout.as_millis() as u64,
        ),
        ("heartbeat_ms", cfg.heartbeat_ms),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(format!("{ENV_WORKER_CONFIG}: `{name}` must be at least 1"));
        }
    }
    if cfg.model_path.is_empty() {
        return Err(format!("{ENV_WORKER_CONFIG}: `model_path` is empty"));
    }
    if let Some(f) = cfg.gpu.as_ref().and_then(|g| g.memory_fraction) {
        if !(f > 0.0 && f <= 1.0) {
            return Err(format!(
                "{ENV_WORKER_CONFIG}: `gpu.memory_fraction` must be in (0, 1], got {f}"
            ));
        }
    }
    let metadata = AppMetadata::parse(Path::new(&cfg.metadata_path), &cfg.metadata_json)
        .map_err(|e| e.to_string())?;
    Ok((cfg, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> serde_json::Value {
        let secs = |s: u64| json!({"secs": s, "nanos": 0});
        json!({
            "slot": 1, "generation": 0,
            "metadata_json": "{\"name\": \"t\"}", "metadata_path": "/x/app-metadata.json",
            "model_path": "/x/m.pt", "device": "cpu", "gpu": null,
            "max_requests": 0, "max_worker_gpu_mb": null, "heartbeat_ms": 500,
            "torch_threads": 1, "nvml_library": null, "has_control": false,
            "limits": {
                "max_requests": 0, "max_requests_jitter": 0, "timeout": secs(30),
                "boot_timeout": secs(60), "graceful_timeout": secs(1),
                "request_timeout": secs(1), "max_queue_wait": null, "max_body_bytes": 1000
            },
            "batch": {
                "max_batch_size": 0, "max_batch_size_override": null,
                "batch_timeout": secs(0), "warmup_passes": 2, "inline_passes": true
            },
            "host_memory": {"max_worker_memory_mb": null, "memory_cgroup": null},
            "access": {"api_key_file": null, "metrics_api_key_file": null, "tls": null},
            "log": {"json": false, "access_log": false},
            "tracing": {"export": null}
        })
    }

    #[test]
    fn a_complete_config_parses() {
        let (cfg, md) = parse(&base().to_string()).unwrap();
        assert_eq!(cfg.slot, 1);
        assert_eq!(md.name, "t");
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        assert!(parse("nope")
            .unwrap_err()
            .contains("not a valid worker configuration"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("slot");
        assert!(parse(&v.to_string()).unwrap_err().contains("slot"));
        let mut v = base();
        v["torch_threads"] = json!(0);
        assert!(parse(&v.to_string())
            .unwrap_err()
            .contains("`torch_threads` must be at least 1"));
        let mut v = base();
        v["metadata_json"] = json!("{}");
        assert!(parse(&v.to_string())
            .unwrap_err()
            .contains("`name` is missing"));
        let mut v = base();
        v["limits"]["request_timeout"] = json!({"secs": 0, "nanos": 500_000});
        assert!(parse(&v.to_string())
            .unwrap_err()
            .contains("`limits.request_timeout` must be at least 1"));
        let mut v = base();
        v["gpu"] = json!({"index": 0, "uuid": "GPU-x", "memory_fraction": 1.5});
        assert!(parse(&v.to_string())
            .unwrap_err()
            .contains("memory_fraction"));
    }
}
