//! The autoscaling and KServe manifests: valid, strictly, against schemas pinned in
//! `tests/schemas/` (KServe's and KEDA's CRDs, KEDA's Prometheus scaler's parameters,
//! prometheus-adapter's configuration types; `tests/support/validate_schemas.py`), each pinned
//! file the very blob its repository has at the tag named in `tests/schemas/README.md`; and
//! the queries the autoscalers run — KEDA's, the InferenceService's, and the one
//! prometheus-adapter builds for the HPA — evaluated by `promtool test rules` over series
//! taken from real scrapes of `/metrics` while requests wait, so that each must come out as
//! the number of requests the test holds waiting.

mod common;
#[path = "support/queue.rs"]
mod queue;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{App, Server};
use queue::{busy, clients, wait_scrape, waiting};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn path(rel: &str) -> String {
    root().join(rel).display().to_string()
}

const ISVC_CRD: &str = "tests/schemas/kserve-v0.20.0/serving.kserve.io_inferenceservices.yaml.gz";
const RUNTIME_CRD: &str =
    "tests/schemas/kserve-v0.20.0/serving.kserve.io_clusterservingruntimes.yaml.gz";
const KEDA_CRD: &str = "tests/schemas/keda-v2.20.2/keda.sh_scaledobjects.yaml";
const KEDA_SCALER: &str = "tests/schemas/keda-v2.20.2/prometheus_scaler.go";
const ADAPTER_CONFIG: &str = "tests/schemas/prometheus-adapter-v0.12.0/config.go";

const RUNTIME: &str = "deploy/kserve/servingruntime.yaml";
const ISVCS: [&str; 3] = [
    "deploy/kserve/inferenceservice.yaml",
    "deploy/kserve/inferenceservice-knative.yaml",
    "deploy/kserve/inferenceservice-torchserve.yaml",
];
const SCALED_OBJECT: &str = "deploy/autoscaling/keda-scaledobject.yaml";
const ADAPTER: &str = "deploy/autoscaling/prometheus-adapter.yaml";
const HPA: &str = "deploy/kubernetes/hpa.yaml";

/// `validate_schemas.py WHAT SCHEMA FILES…`: the documents checked, each with its errors.
fn validate(what: &str, schema: &str, files: &[String]) -> Vec<Value> {
    let mut args = vec![what.to_string(), path(schema)];
    args.extend(files.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::python_json("validate_schemas.py", &args, b"");
    out["documents"].as_array().unwrap().clone()
}

/// Validates `files` and expects `n` documents checked, none with an error.
fn valid(what: &str, schema: &str, files: &[&str], n: usize) {
    let files: Vec<String> = files.iter().map(|f| path(f)).collect();
    let docs = validate(what, schema, &files);
    assert_eq!(docs.len(), n, "{what} {schema}: {docs:#?}");
    for d in &docs {
        assert_eq!(d["errors"], json!([]), "{what} against {schema}: {d:#}");
    }
}

/// A copy of `file` with `from` replaced by `to` fails `what` with an error naming `names`.
fn refused(what: &str, schema: &str, file: &str, from: &str, to: &str, names: &str) {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    let bad = dir.path().join(Path::new(file).file_name().unwrap());
    std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
    let docs = validate(what, schema, &[bad.display().to_string()]);
    let errors = docs[0]["errors"].to_string();
    assert!(
        errors.contains(names),
        "{file} with {from:?} → {to:?} passed {what} (or failed for another reason): {errors}"
    );
}

#[test]
fn the_pinned_schemas_are_the_upstream_blobs_named_in_their_readme() {
    let readme = std::fs::read_to_string(root().join("tests/schemas/README.md")).unwrap();
    // Rows: | `file` | repository | tag | commit | `path` | `blob` |
    let rows: Vec<(String, String)> = readme
        .lines()
        .filter(|l| l.starts_with("| `tests/schemas/"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(|c| c.trim().trim_matches('`')).collect();
            (cells[1].to_string(), cells[6].to_string())
        })
        .collect();
    assert_eq!(rows.len(), 5, "{rows:?}");
    let files: Vec<String> = rows.iter().map(|(f, _)| path(f)).collect();
    let args: Vec<&str> = std::iter::once("blob")
        .chain(files.iter().map(String::as_str))
        .collect();
    let blobs = common::python_json("validate_schemas.py", &args, b"")["blobs"].clone();
    for ((file, blob), full) in rows.iter().zip(&files) {
        assert_eq!(blobs[full], *blob, "{file} is not the pinned upstream blob");
    }
}

#[test]
fn kserve_keda_and_adapter_objects_pass_strict_validation_against_the_pinned_schemas() {
    valid("crd", RUNTIME_CRD, &[RUNTIME], 1);
    valid("crd", ISVC_CRD, &ISVCS, 3);
    valid("crd", KEDA_CRD, &[SCALED_OBJECT], 1);
    valid("keda-prometheus", KEDA_SCALER, &[SCALED_OBJECT], 1);
    valid("adapter-config", ADAPTER_CONFIG, &[ADAPTER], 1);
    // The adapter's ConfigMap and the HPA are Kubernetes' own kinds.
    let venv = std::env::var("VRAMFORK_TORCH_VENV")
        .expect("VRAMFORK_TORCH_VENV is not set: run the tests through scripts/test");
    let out = Command::new(Path::new(&venv).join("bin/kubernetes-validate"))
        .arg("--strict")
        .args([path(ADAPTER), path(HPA)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubernetes-validate --strict: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Strictness: a misspelt field, an unknown scaler parameter or adapter key is refused.
    refused(
        "crd",
        RUNTIME_CRD,
        RUNTIME,
        "readinessProbe:",
        "readinesProbe:",
        "readinesProbe",
    );
    refused(
        "crd",
        ISVC_CRD,
        ISVCS[1],
        "containerConcurrency:",
        "containerConcurency:",
        "containerConcurency",
    );
    refused(
        "crd",
        ISVC_CRD,
        ISVCS[0],
        "backend: prometheus",
        "backend: prometeus",
        "prometeus",
    );
    refused(
        "crd",
        KEDA_CRD,
        SCALED_OBJECT,
        "pollingInterval:",
        "pollingIntervall:",
        "pollingIntervall",
    );
    refused(
        "keda-prometheus",
        KEDA_SCALER,
        SCALED_OBJECT,
        "threshold: \"4\"",
        "treshold: \"4\"",
        "missing 'threshold'",
    );
    refused(
        "adapter-config",
        ADAPTER_CONFIG,
        ADAPTER,
        "metricsQuery:",
        "metricQuery:",
        "unknown key 'metricQuery'",
    );
}

/// Every document of the YAML files, as JSON.
fn yaml(files: &[&str]) -> Vec<Value> {
    let files: Vec<String> = files.iter().map(|f| path(f)).collect();
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    serde_json::from_value(common::python_json("yaml_to_json.py", &args, b"")).unwrap()
}

/// The query prometheus-adapter runs for an HPA asking for `metric` of `pods` in
/// `namespace` (its `metricsQuery` template with `.Series`, `.LabelMatchers`, `.GroupBy`
/// filled in as pkg/naming/metrics_query.go's Build does), and the metric's name in the
/// custom metrics API.
fn adapter_query(namespace: &str, pods: &[&str]) -> (String, String) {
    let cm = &yaml(&[ADAPTER])[0];
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let config = config.display().to_string();
    let rules = common::python_json("yaml_to_json.py", &[config.as_str()], b"");
    let rule = &rules[0]["rules"][0];
    let series_query = rule["seriesQuery"].as_str().unwrap();
    let series = series_query
        .split('{')
        .next()
        .unwrap()
        .trim_matches('\'')
        .to_string();
    assert_eq!(
        rule["name"]["matches"].as_str(),
        Some(format!("^{series}$").as_str())
    );
    let ns_label = "namespace";
    let pod_label = "pod";
    assert_eq!(
        rule["resources"]["overrides"][ns_label]["resource"],
        "namespace"
    );
    assert_eq!(rule["resources"]["overrides"][pod_label]["resource"], "pod");
    let pod_matcher = if pods.len() > 1 {
        format!("{pod_label}=~\"{}\"", pods.join("|"))
    } else {
        format!("{pod_label}=\"{}\"", pods[0])
    };
    let matchers = format!("{ns_label}=\"{namespace}\",{pod_matcher}");
    let query = rule["metricsQuery"]
        .as_str()
        .unwrap()
        .replace("<<.Series>>", &series)
        .replace("<<.LabelMatchers>>", &matchers)
        .replace("<<.GroupBy>>", pod_label);
    assert!(!query.contains("<<"), "a template field left: {query}");
    (query, rule["name"]["as"].as_str().unwrap().to_string())
}

/// `vramfork_requests_waiting` series of a scrape as promtool input series of one pod.
fn series_of(scrape: &Value, namespace: &str, pod: &str) -> Vec<Value> {
    scrape["vramfork_requests_waiting"]["samples"]
        .as_array()
        .expect("the scrape has vramfork_requests_waiting")
        .iter()
        .map(|s| {
            let mut labels: Vec<String> = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            labels.push(format!("namespace=\"{namespace}\""));
            labels.push(format!("pod=\"{pod}\""));
            labels.push("job=\"kubernetes-pods\"".into());
            let v = s[2].as_f64().unwrap();
            json!({
                "series": format!("{}{{{}}}", s[0].as_str().unwrap(), labels.join(",")),
                "values": format!("{v}x8"),
            })
        })
        .collect()
}

#[test]
fn the_autoscalers_queries_count_the_requests_waiting_in_a_real_scrape() {
    const HELD: usize = 3;
    let app = App::new("slow.pt", "");
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--metrics-port",
            "0",
            "--torch-threads",
            "1",
            "--max-queue-wait",
            "0",
        ],
    );
    let mport = s.metrics_port();
    s.wait_workers(1);
    let (_, idle) = wait_scrape(&s, mport, "an idle pod", |f| waiting(f) == (0.0, 0.0));
    let _hog = busy(s.port);
    s.wait_pool(|p| p.u64("in_flight") == Some(1));
    let _waiters = clients(s.port, HELD);
    let (_, loaded) = wait_scrape(&s, mport, "3 waiting", |f| waiting(f) == (HELD as f64, 0.0));

    // Pods as Prometheus's kubernetes-pods job labels them: two of the Deployment (one with
    // the queue, one idle), the InferenceService's, and another InferenceService's.
    let (a, b) = ("vramfork-6d4cf56db6-x7k2p", "vramfork-6d4cf56db6-9zq4m");
    let (isvc_pod, other) = (
        "cifar10-cnn-predictor-5b8d7c9f4-h2xkq",
        "other-model-predictor-7f9c58d6b-q4w8e",
    );
    let mut input = series_of(&loaded, "default", a);
    input.extend(series_of(&idle, "default", b));
    input.extend(series_of(&loaded, "models", isvc_pod));
    input.extend(series_of(&loaded, "models", other));

    let keda = yaml(&[SCALED_OBJECT]);
    let trigger = &keda[0]["spec"]["triggers"][0]["metadata"];
    let isvc = yaml(&[ISVCS[0]]);
    let external = &isvc[0]["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"];
    let (adapter, metric) = adapter_query("default", &[a, b]);
    let hpa = yaml(&[HPA]);
    assert_eq!(
        hpa[0]["spec"]["metrics"][0]["pods"]["metric"]["name"], metric,
        "the HPA asks for the adapter's metric"
    );
    let held = HELD as f64;
    let one = |v: f64| json!([{"labels": "{}", "value": v}]);
    let tests = json!({
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "15s",
            "input_series": input,
            "promql_expr_test": [
                // KEDA: all the Deployment's pods; the HPA it makes divides by the pods.
                {"expr": trigger["query"], "eval_time": "1m", "exp_samples": one(held)},
                // KServe's ScaledObject: only this InferenceService's pods.
                {"expr": external["metric"]["query"], "eval_time": "1m", "exp_samples": one(held)},
                // prometheus-adapter: one value per pod, which the HPA averages.
                {"expr": adapter, "eval_time": "1m", "exp_samples": [
                    {"labels": format!("{{pod=\"{a}\"}}"), "value": held},
                    {"labels": format!("{{pod=\"{b}\"}}"), "value": 0.0},
                ]},
            ],
        }],
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("queries.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&tests).unwrap()).unwrap();
    match Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg(&file)
        .output()
    {
        Err(e) => panic!(
            "promtool not found ({e}): install Debian's prometheus package (scripts/test does)"
        ),
        Ok(out) => assert!(
            out.status.success(),
            "promtool test rules on a real scrape:\n{}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            serde_json::to_string_pretty(&tests).unwrap()
        ),
    }
    // The thresholds the objects hold the queue to.
    assert_eq!(trigger["threshold"], "4");
    assert_eq!(external["target"]["value"], "4");
    assert_eq!(
        hpa[0]["spec"]["metrics"][0]["pods"]["target"]["averageValue"],
        "4"
    );
}
