//! `Config::from_cli`'s checks, one option or group at a time, as `app` would be called.

use super::*;
use crate::master::cli::option_env;
use crate::protocol::Device;
use clap::Parser;
use std::collections::HashMap;
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
    vars: HashMap<String, String>,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("meta.json"),
            r#"{"name": "t", "model": "m.pt", "est_gpu_mem_typ": 10}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("app-worker"), "").unwrap();
        Env {
            dir,
            vars: HashMap::new(),
        }
    }

    fn var(mut self, k: &str, v: &str) -> Env {
        self.vars.insert(k.into(), v.into());
        self
    }

    fn run(&self, args: &[&str]) -> Result<Config, String> {
        let meta = self.dir.path().join("meta.json");
        let mut argv: Vec<String> = vec![
            "app".into(),
            "--metadata".into(),
            meta.display().to_string(),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        // clap reads the real environment for `env = …`; tests pass variables by hand.
        let mut cli = Cli::try_parse_from(&argv).map_err(|e| e.to_string())?;
        let get = |k: &str| self.vars.get(k).cloned();
        for (flag, var) in option_env() {
            if let Some(v) = get(&var) {
                apply_env(&mut cli, &flag, v, &argv);
            }
        }
        Config::from_cli(cli, &get, &argv, Some(self.dir.path())).map_err(|e| e.0)
    }
}

/// What clap's `env = …` does, for the few options these tests set through variables.
fn apply_env(cli: &mut Cli, flag: &str, v: String, argv: &[String]) {
    if argv.iter().any(|a| a == flag) {
        return;
    }
    match flag {
        "--workers" => cli.workers = Some(v),
        "--port" => cli.port = Some(v),
        "--device" => cli.device = Some(v),
        "--timeout" => cli.timeout = Some(v),
        "--max-batch-size" => cli.max_batch_size = Some(v),
        "--profile-memory" => cli.profile_memory = Some(v),
        "--memory-headroom" => cli.memory_headroom = Some(v),
        "--batch-timeout-ms" => cli.batch_timeout_ms = Some(v),
        "--torch-threads" => cli.torch_threads = Some(v),
        "--model-name" => cli.model_name = Some(v),
        _ => {}
    }
}

#[test]
fn defaults_follow_the_spec() {
    let c = Env::new().run(&[]).unwrap();
    assert_eq!(c.mode, Mode::Develop);
    assert_eq!(
        (c.address.host.as_str(), c.address.port),
        ("127.0.0.1", 5000)
    );
    assert_eq!(c.limits.max_requests, 0);
    assert_eq!(c.limits.timeout, Duration::from_secs(30));
    assert_eq!(c.limits.boot_timeout, Duration::from_secs(300));
    assert_eq!(c.limits.graceful_timeout, Duration::from_secs(30));
    assert_eq!(c.limits.request_timeout, Duration::from_secs(120));
    assert_eq!(c.limits.max_queue_wait, Some(Duration::from_secs(10)));
    assert_eq!(c.gpu.device, Device::Auto);
    assert_eq!(c.limits.max_body_bytes, 64 << 20);
    assert_eq!(c.gpu.gpu_reserve_mb, 500);
    assert!(c.workers.count.is_none() && c.gpu.max_worker_gpu_mb.is_none());
    assert!(c.app.model_path.unwrap().ends_with("m.pt"));
}

/// Each default is written once (a group's `DEFAULTS`): every one names an option, is
/// rendered into that option's help, and is what the check reads when the option is absent
/// (`defaults_follow_the_spec`); the worker protocol's own default agrees.
#[test]
fn each_default_names_an_option_and_is_rendered_into_its_help() {
    let cmd = command();
    let mut seen = 0;
    for group in DEFAULTS {
        for (flag, default) in *group {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(&flag[2..]))
                .unwrap_or_else(|| panic!("{flag}: a default for no option"));
            let help = arg.get_help().unwrap().to_string();
            assert!(
                help.ends_with(&format!("[default: {default}]")),
                "{flag}: {help}"
            );
            assert_eq!(help.matches("[default:").count(), 1, "{flag}: {help}");
            seen += 1;
        }
    }
    assert!(seen >= 20, "{seen}");
    assert_eq!(
        default_of("--warmup-passes"),
        Some(crate::protocol::DEFAULT_WARMUP_PASSES.to_string().as_str())
    );
}

#[test]
fn the_model_name_is_a_path_segment() {
    let e = Env::new();
    assert_eq!(
        e.run(&[]).unwrap().app.model_name,
        None,
        "the metadata's name"
    );
    let c = e.run(&["--model-name", "cifar10-cnn"]).unwrap();
    assert_eq!(c.app.model_name.as_deref(), Some("cifar10-cnn"));
    let c = Env::new()
        .var("VRAMFORK_MODEL_NAME", "from-env")
        .run(&[])
        .unwrap();
    assert_eq!(c.app.model_name.as_deref(), Some("from-env"));
    let long = "n".repeat(254);
    for bad in ["a/b", "tab\there", " ", long.as_str()] {
        let err = e.run(&["--model-name", bad]).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "invalid value '{bad}' for --model-name: expected a name of 1 to 253 characters"
            )),
            "{err}"
        );
    }
    let err = Env::new()
        .var("VRAMFORK_MODEL_NAME", "x/y")
        .run(&[])
        .unwrap_err();
    assert!(
        err.contains("VRAMFORK_MODEL_NAME (for --model-name)"),
        "{err}"
    );
}

#[test]
fn profiling_options_are_checked() {
    let e = Env::new();
    let c = e.run(&[]).unwrap();
    assert_eq!(
        (c.footprint.profile_memory, c.footprint.memory_headroom),
        (None, 1.2)
    );
    let c = e
        .run(&["--profile-memory", "off", "--memory-headroom", "1.5"])
        .unwrap();
    assert_eq!(
        (c.footprint.profile_memory, c.footprint.memory_headroom),
        (Some(false), 1.5)
    );
    assert_eq!(
        e.run(&["--profile-memory", "on"])
            .unwrap()
            .footprint
            .profile_memory,
        Some(true)
    );
    for (args, want) in [
        (
            &["--profile-memory", "yes"][..],
            "invalid value 'yes' for --profile-memory: expected auto, on or off",
        ),
        (
            &["--memory-headroom", "0.9"][..],
            "invalid value '0.9' for --memory-headroom: expected a factor from 1 to 10",
        ),
        (&["--memory-headroom", "x"][..], "'x' for --memory-headroom"),
    ] {
        let err = e.run(args).unwrap_err();
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn batching_comes_from_the_metadata_or_the_flag() {
    let e = Env::new();
    let c = e.run(&[]).unwrap();
    assert_eq!(
        (c.batch.max_batch_size, c.batch.batch_timeout),
        (0, Duration::ZERO)
    );
    std::fs::write(
        e.dir.path().join("meta.json"),
        r#"{"name": "t", "model": "m.pt", "max_batch_size": 8, "input": {"shape": [-1, 4]}}"#,
    )
    .unwrap();
    assert_eq!(e.run(&[]).unwrap().batch.max_batch_size, 8);
    let c = e
        .run(&["--max-batch-size", "32", "--batch-timeout-ms", "5"])
        .unwrap();
    assert_eq!(
        (c.batch.max_batch_size, c.batch.batch_timeout),
        (32, Duration::from_millis(5))
    );
    assert_eq!(
        e.run(&["--max-batch-size", "0"])
            .unwrap()
            .batch
            .max_batch_size,
        0
    );
    for (args, want) in [
        (
            &["--max-batch-size", "-1"][..],
            "invalid value '-1' for --max-batch-size: expected a whole number 0..=4096",
        ),
        (
            &["--max-batch-size", "5000"][..],
            "'5000' for --max-batch-size",
        ),
        (
            &["--batch-timeout-ms", "0.5"][..],
            "invalid value '0.5' for --batch-timeout-ms",
        ),
        (
            &["--batch-timeout-ms", "60001"][..],
            "'60001' for --batch-timeout-ms: at most 60000 ms",
        ),
        (
            &["--max-batch-size", "0", "--batch-timeout-ms", "5"][..],
            "--batch-timeout-ms 5 has no effect without batching",
        ),
        (
            &["--batch-timeout-ms", "2000", "--max-queue-wait", "2"][..],
            "--batch-timeout-ms 2000 is not shorter than --max-queue-wait (2 s)",
        ),
    ] {
        let err = e.run(args).unwrap_err();
        assert!(err.contains(want), "{args:?}: {err}");
    }
    std::fs::write(
        e.dir.path().join("meta.json"),
        r#"{"name": "t", "model": "m.pt", "input": {"shape": []}}"#,
    )
    .unwrap();
    let err = e.run(&["--max-batch-size", "4"]).unwrap_err();
    assert!(
        err.contains(
            "--max-batch-size: batching (max_batch_size 4) needs a leading batch dimension"
        ),
        "{err}"
    );
}

#[test]
fn inline_passes_are_auto_by_default_off_when_asked_and_bad_ones_are_named() {
    let e = Env::new();
    assert!(e.run(&[]).unwrap().batch.inline_passes);
    assert!(
        e.run(&["--inline-passes", "auto"])
            .unwrap()
            .batch
            .inline_passes
    );
    assert!(
        !e.run(&["--inline-passes", "off"])
            .unwrap()
            .batch
            .inline_passes
    );
    for v in ["on", "no", ""] {
        let err = e.run(&["--inline-passes", v]).unwrap_err();
        assert!(
            err.contains(&format!(
                "invalid value '{v}' for --inline-passes: expected auto or off"
            )),
            "{v}: {err}"
        );
    }
}

#[test]
fn warmup_passes_default_to_2_and_bad_ones_are_named() {
    let e = Env::new();
    assert_eq!(e.run(&[]).unwrap().batch.warmup_passes, 2);
    assert_eq!(
        e.run(&["--warmup-passes", "0"])
            .unwrap()
            .batch
            .warmup_passes,
        0
    );
    assert_eq!(
        e.run(&["--warmup-passes", "100"])
            .unwrap()
            .batch
            .warmup_passes,
        100
    );
    for v in ["-1", "101", "two", "1.5", ""] {
        let err = e.run(&["--warmup-passes", v]).unwrap_err();
        assert!(
            err.contains(&format!(
                "invalid value '{v}' for --warmup-passes: expected a whole number 0..=100 (0 = no warm-up pass)"
            )),
            "{v}: {err}"
        );
    }
}

#[test]
fn max_queue_wait_is_seconds_or_0_for_off() {
    let e = Env::new();
    let c = e.run(&["--max-queue-wait", "2.5"]).unwrap();
    assert_eq!(c.limits.max_queue_wait, Some(Duration::from_millis(2500)));
    assert_eq!(
        e.run(&["--max-queue-wait", "0"])
            .unwrap()
            .limits
            .max_queue_wait,
        None
    );
    assert_eq!(
        e.run(&["--max-queue-wait", "0.0"])
            .unwrap()
            .limits
            .max_queue_wait,
        None
    );
    for bad in ["-1", "soon", "inf"] {
        let err = e.run(&["--max-queue-wait", bad]).unwrap_err();
        assert!(
            err.contains("--max-queue-wait") && err.contains(bad) && err.contains("0 = no limit"),
            "{err}"
        );
    }
}

#[test]
fn modes() {
    let e = Env::new();
    assert_eq!(e.run(&["--production"]).unwrap().mode, Mode::Production);
    assert_eq!(
        e.run(&["plan", "--json"]).unwrap().mode,
        Mode::Plan {
            json: true,
            measure: false
        }
    );
    assert_eq!(
        e.run(&["plan"]).unwrap().mode,
        Mode::Plan {
            json: false,
            measure: false
        }
    );
}

#[test]
fn worker_override_precedence() {
    let e = Env::new()
        .var("VRAMFORK_WORKERS", "3")
        .var("CLAMS_GUNICORN_WORKERS", "5");
    let o = e.run(&["--workers", "2"]).unwrap().workers.count.unwrap();
    assert_eq!((o.count, o.source), (2, "--workers"));
    let o = e.run(&[]).unwrap().workers.count.unwrap();
    assert_eq!((o.count, o.source), (3, "VRAMFORK_WORKERS"));
    let e = Env::new().var("CLAMS_GUNICORN_WORKERS", "5");
    let o = e.run(&[]).unwrap().workers.count.unwrap();
    assert_eq!((o.count, o.source), (5, "CLAMS_GUNICORN_WORKERS"));
}

#[test]
fn torch_threads_precedence_follows_the_flag_then_torchs_own_variables() {
    let t = |e: &Env, args: &[&str]| {
        e.run(args)
            .unwrap()
            .workers
            .torch_threads
            .map(|t| (t.count, t.source))
    };
    let all = Env::new()
        .var("VRAMFORK_TORCH_THREADS", "3")
        .var("MKL_NUM_THREADS", "5")
        .var("OMP_NUM_THREADS", "7");
    assert_eq!(
        t(&all, &["--torch-threads", "2"]),
        Some((2, "--torch-threads"))
    );
    assert_eq!(t(&all, &[]), Some((3, "VRAMFORK_TORCH_THREADS")));
    let libs = Env::new()
        .var("MKL_NUM_THREADS", "5")
        .var("OMP_NUM_THREADS", "7");
    assert_eq!(t(&libs, &[]), Some((5, "MKL_NUM_THREADS")));
    let omp = Env::new().var("OMP_NUM_THREADS", "4,2");
    assert_eq!(t(&omp, &[]), Some((4, "OMP_NUM_THREADS")));
    assert_eq!(t(&Env::new(), &[]), None);
    for bad in ["0", "two", "", "-1"] {
        let e = Env::new().var("OMP_NUM_THREADS", bad).run(&[]).unwrap_err();
        assert!(
            e.contains("OMP_NUM_THREADS") && e.contains(&format!("'{bad}'")),
            "{e}"
        );
    }
}

#[test]
fn invalid_worker_overrides_are_errors_naming_their_source() {
    for bad in ["0", "-1", "two", "1.5"] {
        let e = Env::new().run(&["--workers", bad]).unwrap_err();
        assert!(e.contains("--workers") && e.contains(bad), "{e}");
        let e = Env::new()
            .var("VRAMFORK_WORKERS", bad)
            .run(&[])
            .unwrap_err();
        assert!(e.contains("VRAMFORK_WORKERS") && e.contains(bad), "{e}");
        let e = Env::new()
            .var("CLAMS_GUNICORN_WORKERS", bad)
            .run(&[])
            .unwrap_err();
        assert!(
            e.contains("CLAMS_GUNICORN_WORKERS") && e.contains(bad),
            "{e}"
        );
    }
    let e = Env::new().var("VRAMFORK_WORKERS", "").run(&[]).unwrap_err();
    assert!(e.contains("VRAMFORK_WORKERS") && e.contains("empty"), "{e}");
    let e = Env::new()
        .var("CLAMS_GUNICORN_WORKERS", " ")
        .run(&[])
        .unwrap_err();
    assert!(e.contains("CLAMS_GUNICORN_WORKERS"), "{e}");
}

#[test]
fn invalid_values_name_option_value_and_allowed() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--port", "70000"],
            "'70000' for --port: expected a port number",
        ),
        (&["--port", "http"], "'http' for --port"),
        (
            &["--timeout", "0"],
            "'0' for --timeout: expected a number of seconds > 0",
        ),
        (&["--boot-timeout", "-5"], "'-5' for --boot-timeout"),
        (
            &["--request-timeout", "soon"],
            "'soon' for --request-timeout",
        ),
        (
            &["--graceful-timeout", "inf"],
            "'inf' for --graceful-timeout",
        ),
        (
            &["--max-requests", "-1"],
            "'-1' for --max-requests: expected a whole number ≥ 0",
        ),
        (
            &["--max-requests-jitter", "x"],
            "'x' for --max-requests-jitter",
        ),
        (
            &["--device", "tpu"],
            "'tpu' for --device: expected auto, cpu or cuda",
        ),
        (
            &["--max-body-mb", "0"],
            "'0' for --max-body-mb: expected a whole number ≥ 1",
        ),
        (
            &["--gpu-memory-utilization", "1.5"],
            "'1.5' for --gpu-memory-utilization",
        ),
        (
            &["--gpu-memory-utilization", "0"],
            "'0' for --gpu-memory-utilization",
        ),
        (&["--gpu-reserve-mb", "lots"], "'lots' for --gpu-reserve-mb"),
        (&["--max-worker-gpu-mb", "0"], "'0' for --max-worker-gpu-mb"),
        (&["--torch-threads", "0"], "'0' for --torch-threads"),
        (
            &["--log-format", "xml"],
            "'xml' for --log-format: expected text or json",
        ),
        (
            &["--nvml-library", "/nonexistent/libnvml.so"],
            "for --nvml-library: no such file",
        ),
        (&["--host", ""], "for --host"),
    ];
    for (args, want) in cases {
        let e = Env::new().run(args).unwrap_err();
        assert!(e.contains(want), "{args:?}: got {e:?}, want {want:?}");
    }
}

#[test]
fn env_values_are_named_by_variable() {
    let e = Env::new().var("VRAMFORK_PORT", "x").run(&[]).unwrap_err();
    assert!(e.contains("VRAMFORK_PORT (for --port)"), "{e}");
    let e = Env::new()
        .var("VRAMFORK_DEVICE", "gpu")
        .run(&[])
        .unwrap_err();
    assert!(e.contains("VRAMFORK_DEVICE (for --device)"), "{e}");
    // a flag beats the variable
    let c = Env::new()
        .var("VRAMFORK_PORT", "x")
        .run(&["--port", "8080"])
        .unwrap();
    assert_eq!(c.address.port, 8080);
}

#[test]
fn missing_model_and_worker_binary_are_errors() {
    let e = Env::new();
    std::fs::write(e.dir.path().join("meta.json"), r#"{"name": "t"}"#).unwrap();
    let err = e.run(&[]).unwrap_err();
    assert!(
        err.contains("no model to serve") && err.contains("--model"),
        "{err}"
    );
    assert!(e.run(&["plan"]).is_ok(), "plan needs no model");
    let e = Env::new();
    let err = e
        .run(&["--worker-binary", "/nonexistent/app-worker"])
        .unwrap_err();
    assert!(
        err.contains("worker binary /nonexistent/app-worker not found"),
        "{err}"
    );
}

#[test]
fn metadata_errors_are_config_errors() {
    let e = Env::new();
    std::fs::write(e.dir.path().join("meta.json"), r#"{"name": 1}"#).unwrap();
    let err = e.run(&[]).unwrap_err();
    assert!(err.contains("field `name` must be a string"), "{err}");
    std::fs::remove_file(e.dir.path().join("meta.json")).unwrap();
    let err = e.run(&[]).unwrap_err();
    assert!(
        err.contains("cannot read app metadata") && err.contains("meta.json"),
        "{err}"
    );
}
