//! The Kubernetes manifests (`deploy/kubernetes/`): valid against a current Kubernetes
//! schema in strict mode (PyPI `kubernetes-validate`), and consistent with the server they
//! deploy: the probes, the scrape annotations and the autoscaler's metric are checked
//! against the real `app` started with the ConfigMap's settings, and the NetworkPolicy
//! selects the Deployment's pods and admits exactly its two ports, each from its own peers.

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
    // Exported (with or without labels); what the adapter's query makes of it is checked by
    // tests/autoscaling.rs.
    let scrape = common::http(mport, "GET", "/metrics", None);
    assert!(
        scrape
            .body
            .lines()
            .any(|l| l.starts_with(&format!("{metric} ")) || l.starts_with(&format!("{metric}{{"))),
        "the HPA's metric {metric} is not exported:\n{}",
        scrape.body
    );
}

/// A NetworkPolicy port (a name or a number) as the container port it means.
fn container_port_named<'a>(container: &'a Value, port: &Value) -> &'a Value {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| match port {
            Value::String(name) => p["name"] == name.as_str(),
            n => p["containerPort"] == *n,
        })
        .unwrap_or_else(|| panic!("the NetworkPolicy's port {port} is no container port"))
}

#[test]
fn the_network_policy_selects_the_pods_and_admits_each_port_from_its_own_peers() {
    let docs = documents();
    let deployment = kind(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let policy = kind(&docs, "NetworkPolicy");
    let spec = &policy["spec"];

    // The pod selector matches the Deployment's pods: every label it asks for is on the pod
    // template, and it asks for at least one (an empty selector would pick every pod of the
    // namespace).
    let wanted = spec["podSelector"]["matchLabels"].as_object().unwrap();
    assert!(!wanted.is_empty(), "an empty podSelector selects every pod");
    let labels = &pod["metadata"]["labels"];
    for (k, v) in wanted {
        assert_eq!(&labels[k], v, "pod label {k}");
    }
    assert!(spec.get("podSelector").unwrap()["matchExpressions"].is_null());
    let types: Vec<&str> = spec["policyTypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(types.contains(&"Ingress"), "{types:?}");
    // Egress is listed with no rule: no outbound connection at all.
    if types.contains(&"Egress") {
        assert_eq!(spec["egress"], serde_json::json!([]), "egress rules");
    }

    // Each ingress rule names its ports (a rule without ports admits every port) and its
    // peers (a rule without `from`, or with an empty selector, admits everyone); together
    // they admit the container's ports, each port by one rule.
    let mut admitted: Vec<(String, Vec<Value>)> = Vec::new();
    for rule in spec["ingress"].as_array().unwrap() {
        let from = rule["from"].as_array().expect("every rule names its peers");
        assert!(!from.is_empty(), "a rule with no peers admits everyone");
        for peer in from {
            assert!(peer.get("ipBlock").is_none(), "peers by label only: {peer}");
            for sel in ["podSelector", "namespaceSelector"] {
                if let Some(s) = peer.get(sel) {
                    assert!(
                        s["matchLabels"].as_object().is_some_and(|m| !m.is_empty()),
                        "an empty {sel} admits every pod or namespace: {peer}"
                    );
                }
            }
        }
        let ports = rule["ports"]
            .as_array()
            .expect("every rule names its ports");
        assert!(!ports.is_empty());
        for p in ports {
            assert_eq!(p["protocol"], "TCP", "{p}");
            let c = container_port_named(container, &p["port"]);
            admitted.push((c["name"].as_str().unwrap().to_string(), from.clone()));
        }
    }
    let mut names: Vec<&str> = admitted.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    let mut container_ports: Vec<&str> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    container_ports.sort();
    assert_eq!(names, container_ports, "each container port admitted once");
    let peers =
        |port: &str| -> &Vec<Value> { &admitted.iter().find(|(n, _)| n == port).unwrap().1 };

    // The serving port: client pods, or pods of client namespaces.
    let client = serde_json::json!({"vramfork-client": "true"});
    assert_eq!(
        peers("http"),
        &vec![
            serde_json::json!({"podSelector": {"matchLabels": client}}),
            serde_json::json!({"namespaceSelector": {"matchLabels": client}}),
        ]
    );
    // The metrics port (scrapes, and the probes the kubelet sends from the node, which
    // NetworkPolicy always allows): the monitoring namespace only.
    assert_eq!(
        peers("metrics"),
        &vec![serde_json::json!({"namespaceSelector": {"matchLabels":
            {"kubernetes.io/metadata.name": "monitoring"}}})]
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }

    // The Service sends only to ports the policy admits.
    let service = kind(&docs, "Service");
    for p in service["spec"]["ports"].as_array().unwrap() {
        let target = container_port_named(container, &p["targetPort"]);
        assert!(
            names.contains(&target["name"].as_str().unwrap()),
            "Service port {p} goes to a port the policy does not admit"
        );
    }
}
