//! A newcomer's first hour, as process tests: the README's "Serve your own
//! model" run as written — its Python export of a real ResNet-18 and a BERT encoder, its two
//! metadata files, its `app --production` command, its curl call and its tritonclient
//! call — and the mistakes a newcomer makes on the way: the object form of `inputs` for a
//! one-input model, an image model declared channels-last, the CPU recipe, CLAMS metadata
//! kept as it was.

mod common;

use std::path::Path;
use std::process::Command;

use common::{python, App, Server, PATIENCE};

/// The README's fenced blocks in the section headed `section`, as (language, text).
fn blocks(section: &str) -> Vec<(String, String)> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme
        .find(&format!("\n## {section}\n"))
        .unwrap_or_else(|| panic!("the README has no section {section:?}"));
    let rest = &readme[start + 4..];
    let body = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in body.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.to_string(), String::new())),
            (Some(_), Some("")) => out.push(open.take().unwrap()),
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Runs `script` with the test environment's Python in `dir`; its standard output.
fn run_python(dir: &Path, script: &str) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The README's two models, exported by its own Python block into `dir`, each in an app
/// directory of its own with the README's metadata beside it: (ResNet-18, text encoder).
fn readme_apps() -> (App, App) {
    let blocks = blocks("Serve your own model");
    let dir = tempfile::tempdir().unwrap();
    // Its export blocks: torch.export for the image model, TorchScript for the encoder.
    let exports: Vec<_> = blocks
        .iter()
        .filter(|(l, t)| l == "python" && t.contains(".save("))
        .collect();
    assert_eq!(exports.len(), 2, "the README's export blocks: {exports:?}");
    for export in exports {
        run_python(dir.path(), &export.1);
    }
    let mut apps = Vec::new();
    for model in ["resnet18.pt2", "encoder.pt"] {
        let meta = blocks
            .iter()
            .find(|(l, t)| l == "json" && t.contains(&format!("\"model\": \"{model}\"")))
            .unwrap_or_else(|| panic!("the README's metadata for {model}"));
        let app = App {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::rename(dir.path().join(model), app.dir.path().join(model)).unwrap();
        std::fs::write(app.metadata(), &meta.1).unwrap();
        apps.push(app);
    }
    let encoder = apps.pop().unwrap();
    (apps.pop().unwrap(), encoder)
}

/// The README's `app --production` command, its flags less `--metadata` and `--port`
/// (the test gives its own), plus `more`.
fn readme_flags(more: &[&'static str]) -> Vec<String> {
    let cmd = blocks("Serve your own model")
        .into_iter()
        .find(|(l, t)| l == "sh" && t.starts_with("app --production"))
        .expect("the README's start command")
        .1;
    let mut words = cmd.split_whitespace().skip(1).map(str::to_string);
    let mut flags = Vec::new();
    while let Some(w) = words.next() {
        if w == "--metadata" || w == "--port" {
            words.next();
        } else {
            flags.push(w);
        }
    }
    flags.extend(more.iter().map(|s| s.to_string()));
    flags
}

fn start(app: &App, flags: &[String]) -> Server {
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    Server::start(app, &args)
}

/// Every step of the README's "Serve your own model", as written — the export,
/// the metadata, the start command, the curl call and the tritonclient call — gives the
/// answers the README shows; and its CPU recipe (no `est_gpu_mem_*`, or both 0) starts.
#[test]
fn the_readmes_serve_your_own_model_runs_as_written() {
    let (resnet, encoder) = readme_apps();
    // Two workers: the README's plan (2 × cores + 1) would do too, at more memory.
    let flags = readme_flags(&["--workers", "2"]);
    let text = start(&encoder, &flags);
    let curl = blocks("Serve your own model")
        .into_iter()
        .find(|(l, t)| l == "sh" && t.starts_with("curl"))
        .expect("the README's curl call")
        .1
        .replace("localhost:5000", &format!("127.0.0.1:{}", text.port));
    let out = Command::new("sh").arg("-c").arg(&curl).output().unwrap();
    assert!(out.status.success(), "{curl}: {out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            text.log_text()
        )
    });
    let outputs = answer["outputs"].as_array().expect("outputs");
    // (last_hidden_state [1, 4, 128], pooler_output [1, 128]), as the README says.
    assert_eq!(outputs.len(), 2, "{answer}");
    assert_eq!(outputs[0][0].as_array().unwrap().len(), 4, "{answer}");
    assert_eq!(outputs[0][0][0].as_array().unwrap().len(), 128, "{answer}");
    assert_eq!(outputs[1][0].as_array().unwrap().len(), 128, "{answer}");
    assert!(
        answer["hwFetch"]
            .as_str()
            .is_some_and(|h| h.starts_with("CPU only (no NVIDIA GPU), ")),
        "{answer}"
    );
    drop(text);

    let image = start(&resnet, &flags);
    let client = blocks("Serve your own model")
        .into_iter()
        .find(|(l, t)| l == "python" && t.contains("tritonclient"))
        .expect("the README's tritonclient call")
        .1
        .replace("localhost:5000", &format!("127.0.0.1:{}", image.port));
    let printed = run_python(resnet.dir.path(), &client);
    // `print(r.as_numpy("logits").argmax(1), …hwFetch)`: a class index, then the line.
    assert!(printed.starts_with('['), "{printed}");
    assert!(printed.contains("CPU only (no NVIDIA GPU), "), "{printed}");
    drop(image);

    // The CPU recipe: a CPU-only app leaves the GPU figures out, or writes both as 0.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(resnet.metadata()).unwrap()).unwrap();
    for cpu in [None, Some(0)] {
        let mut m = meta.clone();
        for key in ["est_gpu_mem_min", "est_gpu_mem_typ"] {
            match cpu {
                None => drop(m.as_object_mut().unwrap().remove(key)),
                Some(v) => m[key] = v.into(),
            }
        }
        std::fs::write(resnet.metadata(), m.to_string()).unwrap();
        let s = start(&resnet, &readme_flags(&["--workers", "1"]));
        // Its worker ready first: on a busy machine its warm-up (16 images on one thread)
        // can outlast --max-queue-wait, which a request sent at once would wait through.
        s.wait_workers(1);
        let r = s.post(
            "/",
            &format!("{{\"inputs\": {{\"image\": {}}}}}", zeros_image()),
        );
        assert_eq!(r.status, 200, "{cpu:?}: {}\n{}", r.body, s.log_text());
        assert_eq!(r.json()["outputs"][0].as_array().unwrap().len(), 1000);
    }
}

/// One image of zeros, `[1, 3, 224, 224]`, as JSON.
fn zeros_image() -> String {
    let row = format!("[{}]", vec!["0"; 224].join(","));
    let plane = format!("[{}]", vec![row.as_str(); 224].join(","));
    format!("[[{}]]", [plane.as_str(); 3].join(","))
}

/// An image model declared channels-last (NHWC) for an NCHW model
/// booted "ready" and answered 500 to every request; now the start fails (exit 3), naming
/// the shape, what the program takes and the fix — in production (the template loads it)
/// and in development mode (the worker does). The README's image model is a `torch.export`
/// program, whose signature is checked before any pass (a TorchScript model's is found by
/// the warm-up pass: `tests/warmup.rs`).
#[test]
fn an_image_model_declared_channels_last_is_refused_at_start_naming_the_fix() {
    let (resnet, _) = readme_apps();
    let text = std::fs::read_to_string(resnet.metadata())
        .unwrap()
        .replace("[-1, 3, 224, 224]", "[-1, 224, 224, 3]");
    std::fs::write(resnet.metadata(), text).unwrap();
    for args in [&["--production", "--workers", "1"][..], &[][..]] {
        let mut s = Server::spawn(&resnet, args, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(3), "{args:?}: {log}");
        for want in [
            "input image (the program's x): declared [-1, 224, 224, 3], but the program takes [",
            "3, 224, 224]: dimension 1 was fixed at 3 at export. Declare [-1, 3, 224, 224]",
        ] {
            assert!(log.contains(want), "{args:?}: missing {want:?} in:\n{log}");
        }
    }
    // The same model traced (TorchScript, the legacy path), declared the same way: the
    // warm-up pass on the declared shape finds it.
    let export = blocks("Serve your own model")
        .into_iter()
        .find(|(l, t)| l == "python" && t.contains("torch.export.save"))
        .expect("the README's torch.export block")
        .1;
    let trace = "torch.jit.trace(model, example[0]).save(\"resnet18.pt\")";
    run_python(resnet.dir.path(), &format!("{export}\n{trace}\n"));
    let text = std::fs::read_to_string(resnet.metadata()).unwrap();
    std::fs::write(
        resnet.metadata(),
        text.replace("resnet18.pt2", "resnet18.pt"),
    )
    .unwrap();
    for args in [&["--production", "--workers", "1"][..], &[][..]] {
        let mut s = Server::spawn(&resnet, args, &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(3), "{args:?}: {log}");
        for want in [
            "the warm-up pass on the declared input shapes (image [16, 224, 224, 3]) failed",
            "expected input[16, 224, 224, 3] to have 3 channels",
            "declare [-1, 3, 224, 224], not [-1, 224, 224, 3]",
        ] {
            assert!(log.contains(want), "{args:?}: missing {want:?} in:\n{log}");
        }
    }
}

/// The object form the docs lead with (`{"inputs": {"<name>": …}}`)
/// works for a model with one numeric input, answering as the bare array does.
#[test]
fn one_numeric_input_is_accepted_by_name_as_the_docs_say() {
    let app = App::new(
        "mlp.pt",
        r#""inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]"#,
    );
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let bare = s.post("/", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    let named = s.post("/", r#"{"inputs": {"features": [[1, 2, 3, 4]]}}"#);
    assert_eq!(bare.status, 200, "{}", bare.body);
    assert_eq!(named.status, 200, "{}", named.body);
    assert_eq!(named.json()["outputs"], bare.json()["outputs"]);
    let wrong = s.post("/", r#"{"inputs": {"image": [[1, 2, 3, 4]]}}"#);
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    assert!(
        wrong.body.contains("`inputs` lacks input \\\"features\\\""),
        "{}",
        wrong.body
    );
}

/// The two metadata mistakes a newcomer from CLAMS makes stop
/// the start (exit 2) with the fix named: the GPU figures of a CPU app half-zeroed, and
/// CLAMS's `input` list kept.
#[test]
fn clams_metadata_mistakes_stop_the_start_naming_the_fix() {
    let cases = [
        (
            r#""est_gpu_mem_min": 700, "est_gpu_mem_typ": 0"#,
            "for a CPU-only app set both to 0 (or leave both out)",
        ),
        (
            r#""input": [{"@type": "http://mmif.clams.ai/vocabulary/VideoDocument/v1", "required": true}]"#,
            "a list here is CLAMS's `input`",
        ),
    ];
    for (extra, want) in cases {
        let app = App::new("mlp.pt", extra);
        let mut s = Server::spawn(&app, &["--production"], &[]);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(2), "{extra}: {log}");
        assert!(log.contains(want), "{extra}: missing {want:?} in:\n{log}");
    }
}
