//! KServe: the real `app` started as KServe starts the serving runtime's container
//! for the example InferenceService (`deploy/kserve/`) — the image's entrypoint
//! (`deploy/container/Containerfile`) with the runtime's arguments, `{{.Name}}` filled in as
//! KServe's ReplacePlaceholders does, the image's environment, the runtime's, and the
//! `INFERENCE_SERVICE_NAME` KServe adds — over a model laid out in `/mnt/models` as the
//! storage initializer lays out a `storageUri` prefix (each object at its key under the
//! prefix), mounted read-only. Then KServe's and NVIDIA's v2 clients call it by the
//! InferenceService's name (`tests/support/kserve_runtime.py`), and the runtime's readiness
//! probe and scrape annotations are tried.
//!
//! As root, the server runs in network and mount namespaces of its own (`unshare`), so that
//! the arguments stay exactly the runtime's — port 8080 on 0.0.0.0, metrics on 9100,
//! `/mnt/models` — without taking those ports or that path from the machine; the clients
//! join its network namespace. Elsewhere the ports become free ones and `/mnt/models` a
//! temporary directory, and the test says so.

mod common;
#[path = "support/queue.rs"]
mod queue;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{app_bin, close, fixtures, Server};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(file: &str) -> Value {
    let path = root().join(file).display().to_string();
    common::python_json("yaml_to_json.py", &[path.as_str()], b"")[0].clone()
}

/// The image's entrypoint and environment for `target`: the Containerfile's ENTRYPOINT and
/// the ENV of the stages `target` is built from (`FROM runtime AS cuda`: runtime's, then its
/// own).
fn image(target: &str) -> (Vec<String>, Vec<(String, String)>) {
    let text = std::fs::read_to_string(root().join("deploy/container/Containerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    let mut stage = String::new();
    let mut parents: Vec<(String, String)> = Vec::new();
    let mut env: Vec<(String, String, String)> = Vec::new();
    let mut entrypoint: Vec<(String, Vec<String>)> = Vec::new();
    for line in joined.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("FROM ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            stage = words.last().unwrap().to_string();
            parents.push((stage.clone(), words[0].to_string()));
        } else if let Some(rest) = line.strip_prefix("ENV ") {
            for kv in rest.split_whitespace() {
                let (k, v) = kv.split_once('=').expect("ENV K=V");
                env.push((stage.clone(), k.to_string(), v.to_string()));
            }
        } else if let Some(rest) = line.strip_prefix("ENTRYPOINT ") {
            entrypoint.push((stage.clone(), serde_json::from_str(rest).unwrap()));
        }
    }
    // The chain of stages, base first.
    let mut chain = vec![target.to_string()];
    while let Some((_, parent)) = parents.iter().find(|(s, _)| s == chain.last().unwrap()) {
        chain.push(parent.clone());
    }
    chain.reverse();
    let vars = env
        .into_iter()
        .filter(|(s, _, _)| chain.contains(s))
        .map(|(_, k, v)| (k, v))
        .collect();
    let entry = entrypoint
        .into_iter()
        .rfind(|(s, _)| chain.contains(s))
        .expect("an ENTRYPOINT")
        .1;
    (entry, vars)
}

/// What KServe runs in the predictor's kserve-container for `isvc` on `runtime`: the
/// entrypoint's arguments (less the program), then the container's, and the environment.
fn launch(runtime: &Value, isvc: &Value) -> (Vec<String>, Vec<(String, String)>) {
    let container = &runtime["spec"]["containers"][0];
    assert_eq!(container["name"], "kserve-container");
    let model = &isvc["spec"]["predictor"]["model"];
    // The InferenceService adds no arguments or variables of its own to merge.
    assert!(model.get("args").is_none() && model.get("env").is_none());
    let tag = container["image"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    let (entry, mut env) = image(tag);
    assert!(entry[0].ends_with("/app"), "{entry:?}");
    let name = isvc["metadata"]["name"].as_str().unwrap();
    let ns = isvc["metadata"]["namespace"].as_str().unwrap_or("default");
    let mut args: Vec<String> = entry[1..].to_vec();
    args.extend(container["args"].as_array().unwrap().iter().map(|a| {
        a.as_str()
            .unwrap()
            .replace("{{.Name}}", name)
            .replace("{{.Namespace}}", ns)
    }));
    for e in container["env"].as_array().unwrap() {
        let k = e["name"].as_str().unwrap().to_string();
        env.retain(|(n, _)| *n != k);
        env.push((k, e["value"].as_str().unwrap().to_string()));
    }
    env.push(("INFERENCE_SERVICE_NAME".into(), name.into()));
    (args, env)
}

/// The `storageUri` prefix's objects: the app's metadata (named otherwise than the
/// InferenceService, so that the served name must come from it) and its model.
fn bucket() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures().join("mlp.pt"), dir.path().join("model.pt")).unwrap();
    std::fs::write(
        dir.path().join("app-metadata.json"),
        r#"{"name": "mlp as the app calls it", "model": "model.pt", "version": "3",
            "input": {"shape": [-1, 4], "dtype": "float32"}}"#,
    )
    .unwrap();
    dir
}

/// Whether this test may give the server namespaces of its own.
fn namespaces() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/mnt").is_dir()
        && Command::new("unshare")
            .args(["--net", "--mount", "--", "ip", "link", "set", "lo", "up"])
            .status()
            .is_ok_and(|s| s.success())
}

/// Runs `f` on a thread inside the network namespace of process `pid` (or here, without
/// namespaces).
fn in_net<T: Send + 'static>(pid: Option<u32>, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        if let Some(pid) = pid {
            let ns = File::open(format!("/proc/{pid}/ns/net")).unwrap();
            // SAFETY: setns(2) with a descriptor of a network namespace; it changes only
            // this thread's namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .unwrap()
}

#[test]
fn the_serving_runtime_serves_the_inference_service_name_to_kserve_and_triton_clients() {
    let runtime = yaml("deploy/kserve/servingruntime.yaml");
    let isvc = yaml("deploy/kserve/inferenceservice.yaml");
    let name = isvc["metadata"]["name"].as_str().unwrap().to_string();
    assert!(isvc["spec"]["predictor"]["model"]["storageUri"]
        .as_str()
        .unwrap()
        .ends_with('/'));
    let (mut args, env) = launch(&runtime, &isvc);
    let container = &runtime["spec"]["containers"][0];
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert!(args.contains(&format!("--port={port}")), "{args:?}");
    assert!(args.contains(&"--metadata=/mnt/models/app-metadata.json".to_string()));
    let probe = &container["readinessProbe"]["httpGet"];
    assert_eq!(
        probe["port"].as_u64(),
        Some(port),
        "the probe asks the serving port"
    );
    let ann = &runtime["spec"]["annotations"];
    let metrics_port: u16 = ann["prometheus.io/port"].as_str().unwrap().parse().unwrap();
    assert!(args.contains(&format!("--metrics-port={metrics_port}")));

    let store = bucket();
    let isolated = namespaces();
    let mut cmd;
    if isolated {
        // The storage initializer's download into the pod's /mnt/models (an emptyDir the
        // kserve-container mounts read-only), in a mount namespace of the server's own.
        let script = "set -e; ip link set lo up; mount -t tmpfs vramfork-kserve-test /mnt; \
                      mkdir /mnt/models; cp -R \"$1\"/. /mnt/models/; \
                      mount --bind /mnt/models /mnt/models; \
                      mount -o remount,bind,ro /mnt/models; shift; exec \"$@\"";
        cmd = Command::new("unshare");
        cmd.args(["--net", "--mount", "--propagation", "private", "--"])
            .args(["/bin/sh", "-c", script, "sh"])
            .arg(store.path())
            .arg(app_bin());
    } else {
        eprintln!(
            "not root (or no unshare): the runtime's ports become free ones and /mnt/models {}",
            store.path().display()
        );
        for a in &mut args {
            *a = a
                .replace(&format!("--port={port}"), "--port=0")
                .replace(
                    &format!("--metrics-port={metrics_port}"),
                    "--metrics-port=0",
                )
                .replace("/mnt/models", &store.path().display().to_string());
        }
        cmd = Command::new(app_bin());
    }
    cmd.args(&args).env_clear().envs(env.iter().cloned());
    // The test's own: its log filter (the master's pool events are debug) and a PATH for
    // the namespace's set-up.
    cmd.env("VRAMFORK_LOG", "info,vramfork::master=debug")
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    let mut s = Server::spawn_command(cmd);
    let listening = s.wait_event("listening", |_| true);
    let addr = listening.str("addr").unwrap().to_string();
    s.port = addr.rsplit(':').next().unwrap().parse().unwrap();
    let mport = s.metrics_port();
    if isolated {
        assert_eq!(addr, format!("0.0.0.0:{port}"));
        assert_eq!(mport, metrics_port);
    }
    s.wait_pool(|p| {
        p.u64("ready").is_some()
            && p.u64("ready") == p.u64("workers")
            && p.u64("booting") == Some(0)
    });
    let pid = isolated.then(|| s.pid());

    // The readiness probe, as the kubelet sends it.
    let (sport, path) = (s.port, probe["path"].as_str().unwrap().to_string());
    let ready = in_net(pid, move || common::http(sport, "GET", &path, None));
    assert_eq!(ready.status, 200, "{ready:?}");

    // Both v2 clients, by the InferenceService's name.
    let python = common::python();
    let script = root().join("tests/support/kserve_runtime.py");
    let cases = fixtures().join("mlp_expected.json");
    let mut client = match pid {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/proc/{pid}/ns/net"))
                .arg("--")
                .arg(&python);
            c
        }
        None => Command::new(&python),
    };
    let out = client
        .arg(script)
        .arg(format!("127.0.0.1:{}", s.port))
        .arg(&name)
        .arg(cases)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kserve_runtime.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = r["expected"].as_array().unwrap();
    for who in ["kserve", "triton"] {
        let seen = &r[who];
        for k in ["live", "ready", "model_ready"] {
            assert_eq!(seen[k], true, "{who} {k}: {seen}");
        }
        let outs = seen["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), expected.len());
        for (o, e) in outs.iter().zip(expected) {
            assert_eq!(o["model_name"], name.as_str(), "{who}: {o}");
            assert!(
                close(&o["output"], e),
                "{who}: {} vs torch's {e}",
                o["output"]
            );
        }
    }
    assert_eq!(r["triton"]["metadata_name"], name.as_str());
    assert_eq!(r["triton"]["other_name_ready"], false);
    assert_eq!(r["triton"]["other_name_metadata"], "404");

    // The metadata's own name is not a second name; GET / still shows the metadata.
    let sport = s.port;
    let (by_app_name, root_doc) = in_net(pid, move || {
        (
            common::http(
                sport,
                "GET",
                "/v2/models/mlp%20as%20the%20app%20calls%20it",
                None,
            ),
            common::http(sport, "GET", "/", None),
        )
    });
    assert_eq!(by_app_name.status, 404, "{by_app_name:?}");
    assert_eq!(root_doc.json()["name"], "mlp as the app calls it");

    // The scrape the runtime's annotations point Prometheus at counts the inferences (as
    // of the workers' next heartbeat).
    let mpath = ann["prometheus.io/path"].as_str().unwrap().to_string();
    let inferences = 2.0 * expected.len() as f64;
    s.poll("the v2 inferences in /metrics", || {
        let mpath = mpath.clone();
        let body = in_net(pid, move || common::http(mport, "GET", &mpath, None).body);
        let f = queue::parse(&body);
        let ok = [("endpoint", "v2-infer"), ("code", "200")];
        (queue::sum(&f, "vramfork_requests_total", &ok) == inferences).then_some(())
    });
}

/// An InferenceService as TorchServe's users write it (`modelFormat: pytorch`, no runtime
/// named, a storageUri holding a TorchServe model store) is given this runtime (the format
/// it declares at the highest priority), and the store is served as it is, on KServe v1
/// under the InferenceService's name and the archive's. Run with free ports and the store in
/// a temporary directory in place of `/mnt/models` (the namespaces of the test above are
/// about the ports and the mount, which this one does not change).
#[test]
fn a_torchserve_inference_service_is_served_unchanged_by_the_pytorch_format() {
    let runtime = yaml("deploy/kserve/servingruntime.yaml");
    let isvc = yaml("deploy/kserve/inferenceservice-torchserve.yaml");
    let model = &isvc["spec"]["predictor"]["model"];
    assert!(
        model.get("runtime").is_none(),
        "the runtime is chosen by format"
    );
    let format = model["modelFormat"]["name"].as_str().unwrap();
    let declared = runtime["spec"]["supportedModelFormats"].as_array().unwrap();
    let ours = declared.iter().find(|f| f["name"] == format).unwrap();
    assert_eq!(ours["autoSelect"], true);
    // Above Triton's 1, as KServe's TorchServe runtime declares it.
    assert!(ours["priority"].as_u64() >= Some(2), "{ours}");
    let protocols = runtime["spec"]["protocolVersions"].as_array().unwrap();
    assert!(protocols.contains(&Value::from("v1")), "{protocols:?}");

    // The store, as TorchServe's KServe examples lay it out.
    let art = common::made_once("make_torchserve.py", &[], "torchserve");
    let store = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(store.path().join("model-store")).unwrap();
    std::fs::create_dir_all(store.path().join("config")).unwrap();
    std::fs::copy(
        art.join("classifier.mar"),
        store.path().join("model-store/small.mar"),
    )
    .unwrap();
    std::fs::write(
        store.path().join("config/config.properties"),
        "inference_address=http://0.0.0.0:8085\nenable_envvars_config=true\n",
    )
    .unwrap();
    let (mut args, env) = launch(&runtime, &isvc);
    for a in &mut args {
        *a = a
            .replace("--port=8080", "--port=0")
            .replace("--metrics-port=9100", "--metrics-port=0")
            .replace("/mnt/models", &store.path().display().to_string());
    }
    let mut cmd = Command::new(app_bin());
    cmd.args(&args).env_clear().envs(env.iter().cloned());
    cmd.env("VRAMFORK_LOG", "info,vramfork::master=debug")
        .env("VRAMFORK_WORKERS", "1")
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    let mut s = Server::spawn_command(cmd);
    let listening = s.wait_event("listening", |_| true);
    let addr = listening.str("addr").unwrap().to_string();
    s.port = addr.rsplit(':').next().unwrap().parse().unwrap();
    s.wait_workers(1);
    let png = std::fs::read(art.join("wide.png")).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let body = serde_json::json!({"instances": [{"data": b64}]}).to_string();
    let isvc_name = isvc["metadata"]["name"].as_str().unwrap();
    for name in [isvc_name, "small"] {
        let r = common::raw(
            s.port,
            "POST",
            &format!("/v1/models/{name}:predict"),
            "Content-Type: application/json\r\n",
            body.as_bytes(),
        );
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let p = &r.json()["predictions"][0];
        assert_eq!(p.as_object().map(|o| o.len()), Some(5), "{name}: {p}");
        let ready = s.get(&format!("/v1/models/{name}"));
        assert_eq!(ready.json()["ready"], true, "{name}: {ready:?}");
    }
}
