//! The Kubernetes manifests (`deploy/kubernetes/`): valid against a current Kubernetes
//! schema in strict mode (PyPI `kubernetes-validate`), and consistent with the server they
//! deploy: the probes, the scrape annotations and the autoscaler's metric are checked
//! against the real `app` started with the ConfigMap's settings.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{App, Server};
use serde_json::Value;

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn venv_tool(name: &str) -> PathBuf {
    let venv = std::env::var("VRAMFORK_TORCH_VENV")
        .expect("VRAMFORK_TORCH_VENV is not set: run the tests through scripts/test");
    Path::new(&venv).join("bin").join(name)
}

/// Runs `kubernetes-validate --strict` on `files`: (success, output).
fn validate(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(venv_tool("kubernetes-validate"))
        .arg("--strict")
        .args(files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every document of the manifests, as JSON.
fn documents() -> Vec<Value> {
    let files: Vec<String> = manifests()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    serde_json::from_value(common::python_json("yaml_to_json.py", &args, b"")).unwrap()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes"))
}

#[test]
fn manifests_pass_strict_validation_against_a_current_kubernetes() {
    let files = manifests();
    assert!(files.len() >= 6, "{files:?}");
    let (ok, out) = validate(&files);
    assert!(ok, "kubernetes-validate --strict:\n{out}");
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(
            out.lines()
                .any(|l| l.contains(&*name) && l.contains("passed")),
            "{name} not reported as passed:\n{out}"
        );
    }
    // Strict mode rejects what the schema does not know: a misspelt field fails.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("deployment.yaml");
    let text = std::fs::read_to_string(
        files
            .iter()
            .find(|f| f.ends_with("deployment.yaml"))
            .unwrap(),
    )
    .unwrap()
    .replace(
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecond:",
    );
    std::fs::write(&bad, text).unwrap();
    let (ok, out) = validate(&[bad]);
    assert!(!ok, "a misspelt field passed:\n{out}");
}

#[test]
fn manifests_agree_with_the_server_they_deploy() {
    let docs = documents();
    let config = &kind(&docs, "ConfigMap")["data"];
    let deployment = kind(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let num = |v: &Value| -> u64 { v.as_str().unwrap().parse().unwrap() };
    let metrics_port = num(&config["VRAMFORK_METRICS_PORT"]);
    let graceful = num(&config["VRAMFORK_GRACEFUL_TIMEOUT"]);

    // Ports, by name.
    let port_of = |name: &str| -> u64 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    assert_eq!(port_of("metrics"), metrics_port);
    assert_eq!(port_of("http"), num(&config["VRAMFORK_PORT"]));
    let ann = &pod["metadata"]["annotations"];
    assert_eq!(
        ann["prometheus.io/port"].as_str(),
        Some(metrics_port.to_string().as_str())
    );
    assert_eq!(ann["prometheus.io/path"], "/metrics");

    // Stopping: preStop, then TERM with the graceful timeout, all inside the grace period.
    let pre_stop: u64 = container["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > pre_stop + graceful,
        "{grace} s ≤ {pre_stop} + {graceful} s"
    );

    // GPUs and the image.
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], 1);
    assert!(container["image"].as_str().unwrap().ends_with(":cuda"));
    assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 10001);

    // The probes and the autoscaler's metric, against the real server run with the
    // ConfigMap's settings (ports and paths made local to the test).
    let ready = &container["readinessProbe"]["httpGet"];
    let live = &container["livenessProbe"]["httpGet"];
    assert_eq!(
        (&ready["port"], &live["port"]),
        (&Value::from("metrics"), &Value::from("metrics"))
    );
    let hpa = kind(&docs, "HorizontalPodAutoscaler");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    let metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        .as_str()
        .unwrap();

    let app = App::new("mlp.pt", "");
    let mut env: Vec<(String, String)> = config
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .filter(|(k, _)| k != "VRAMFORK_METADATA" && k != "VRAMFORK_PORT")
        .collect();
    for (k, v) in &mut env {
        if k == "VRAMFORK_METRICS_PORT" {
            *v = "0".into();
        }
        if k == "VRAMFORK_LOG_FORMAT" {
            *v = "json".into();
        }
    }
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = Server::start_env(&app, &["--production", "--workers", "2"], &env_refs);
    s.wait_workers(2);
    let e = s.wait_event("metrics_listening", |_| true);
    let mport: u16 = e
        .str("addr")
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for probe in [ready, live] {
        let path = probe["path"].as_str().unwrap();
        let r = common::http(mport, "GET", path, None);
        assert_eq!(r.status, 200, "{path}: {r:?}");
    }
    let scrape = common::http(mport, "GET", "/metrics", None);
    assert!(
        scrape
            .body
            .lines()
            .any(|l| l.starts_with(&format!("{metric} "))),
        "the HPA's metric {metric} is not exported:\n{}",
        scrape.body
    );
}
