//! AOTInductor packages (`torch._inductor.aoti_compile_and_package`) served by the real
//! `app`, compiled here by `scripts/make_pt2_models.py`'s `aoti_package` (through
//! `tests/support/make_aoti_package.py`) and cached: answers equal to the TorchScript export
//! of the same module and weights on `POST /`, v2 and gRPC (a one-row batch padded to the
//! package's two-row minimum); concurrent requests sharing passes; requests outside the
//! package's bounds refused with 400 naming the bound; forked workers answering on teams of
//! two threads; the refusals at boot (exit 3): a thread count compiled into the kernels, a
//! CPU instruction set this CPU lacks, a CUDA package on a CPU worker, `max_batch_size` past
//! the bound, a one-row warm-up without batching; and nothing left in the temporary
//! directory by recycled or killed workers, by a server that is gone, or in development
//! mode.

mod aoti_common;
mod common;

use std::path::{Path, PathBuf};

use aoti_common::{mlp, package};
use common::exported::*;
use common::nvml_sim;
use common::*;
use serde_json::{json, Value};

/// mlp.pt's module served as a package and as TorchScript: the same answers (≤ 1e-5) for
/// every case of mlp_expected.json (one-row cases padded to the package's two rows, the
/// padding cut from the answer), and on v2.
#[test]
fn a_package_answers_as_the_torchscript_export_on_post_and_v2() {
    let decl = format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#);
    let (aoti, scripted) = (App::new(&mlp(), &decl), App::new("mlp.pt", &decl));
    let a = Server::start(&aoti, &["--production", "--workers", "1"]);
    let t = Server::start(&scripted, &["--production", "--workers", "1"]);
    a.wait_workers(1);
    t.wait_workers(1);
    let expected = fixture_json("mlp_expected.json");
    for (i, (x, y)) in mlp_answers(&a).iter().zip(&mlp_answers(&t)).enumerate() {
        assert!(within_1e5(x, y), "case {i}: package {x} vs .pt {y}");
        let torch = &expected["cases"][i]["outputs"];
        assert!(within_1e5(x, torch), "case {i}: {x} vs torch's {torch}");
    }
    let one = a.post("/", MLP_INPUT);
    assert_eq!(one.status, 200, "{one:?}");
    assert_eq!(one.json()["outputs"].as_array().map(Vec::len), Some(1));
    let v2 = json!({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [3, 4],
                    "data": [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.5, -3.0, 0.0, 0.0, 1.0, 1.0]}]})
    .to_string();
    let url = "/v2/models/test%20app/infer";
    let (ra, rt) = (a.post(url, &v2), t.post(url, &v2));
    assert_eq!(ra.status, 200, "{ra:?}\n{}", a.log_text());
    assert_eq!(rt.status, 200, "{rt:?}");
    let (oa, ot) = (&ra.json()["outputs"][0], &rt.json()["outputs"][0]);
    assert_eq!(oa["shape"], json!([3, 3]), "{oa}");
    assert!(within_1e5(&oa["data"], &ot["data"]), "{oa} vs {ot}");
    // Its v2 metadata names the format as Triton's platform for AOTInductor packages does.
    let meta = a.get("/v2/models/test%20app").json();
    assert_eq!(meta["platform"], "torch_aoti", "{meta}");
}

/// A package whose model returns a dict (an OrderedDict of `scores` and `probs`, mlp.pt's
/// module and weights) names its outputs by the dict's keys, read from its output spec, as
/// a TorchScript model's dict does: `POST /` an object of them (the scores mlp.pt's, rows
/// padded to the package's two cut back), v2 the keys as output names.
#[test]
fn a_package_returning_a_dict_names_its_outputs() {
    let decl = format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#);
    let dict = package("dict", "dynamic");
    let (aoti, scripted) = (
        App::new(dict.to_str().unwrap(), &decl),
        App::new("mlp.pt", &decl),
    );
    let a = Server::start(&aoti, &["--production", "--workers", "1"]);
    let t = Server::start(&scripted, &["--production", "--workers", "1"]);
    a.wait_workers(1);
    t.wait_workers(1);
    let (ra, rt) = (a.post("/", MLP_INPUT), t.post("/", MLP_INPUT));
    assert_eq!(ra.status, 200, "{ra:?}\n{}", a.log_text());
    let outputs = ra.json()["outputs"].clone();
    let names: Vec<&String> = outputs.as_object().unwrap().keys().collect();
    assert_eq!(names, ["scores", "probs"], "{outputs}");
    assert!(
        within_1e5(&outputs["scores"], &rt.json()["outputs"]),
        "{outputs} vs .pt {:?}",
        rt.json()
    );
    let probs: Vec<f64> = outputs["probs"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert_eq!(probs.len(), 3, "{outputs}");
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{outputs}");
    let v2 = json!({"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [3, 4],
                    "data": [1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 2.5, -3.0, 0.0, 0.0, 1.0, 1.0]}]});
    let r = a.post("/v2/models/test%20app/infer", &v2.to_string());
    assert_eq!(r.status, 200, "{r:?}");
    let got: Vec<(Value, Value)> = r.json()["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].clone(), o["shape"].clone()))
        .collect();
    let shape = json!([3, 3]);
    assert_eq!(
        got,
        [(json!("scores"), shape.clone()), (json!("probs"), shape)]
    );
}

/// NVIDIA's gRPC client (`tests/support/triton_grpc.py basics`) gets torch's answers from a
/// package, raw and typed, and its metadata's platform `torch_aoti`.
#[test]
fn tritonclient_grpc_gets_torchs_answers_from_a_package() {
    let app = App::new(&mlp(), &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#));
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    s.wait_workers(1);
    let cases = fixtures().join("mlp_expected.json");
    let url = format!("127.0.0.1:{}", s.port);
    let r = python_json(
        "triton_grpc.py",
        &["basics", &url, "test app", cases.to_str().unwrap()],
        b"",
    );
    assert_eq!(r["model_metadata"]["platform"], "torch_aoti", "{r}");
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 3, "{r}");
    for c in cases {
        for how in ["raw", "typed"] {
            let got = &c["seen"][how]["output"];
            assert!(
                within_1e5(got, &c["expected"]),
                "{how}: {got} vs torch's {}",
                c["expected"]
            );
        }
    }
}

#[test]
fn concurrent_requests_share_passes_of_a_package() {
    let app = App::new(&mlp(), &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#));
    let s = Server::start(
        &app,
        &[
            "--production",
            "--workers",
            "1",
            "--metrics-port",
            "0",
            "--batch-timeout-ms",
            "5000",
        ],
    );
    s.wait_workers(1);
    let mport = s.metrics_port();
    four_mlp_rows_at_once(s.port);
    s.poll("a forward pass of more than one row", || {
        let r = http(mport, "GET", "/metrics", None);
        (multi_row_passes(&r.body) > 0.0).then_some(())
    });
}

/// Without batching nothing is padded: a one-row request is below the package's bound, and
/// the 400 names the way out; above the bound, or the wrong width, 400 naming it.
#[test]
fn requests_outside_the_packages_bounds_get_400_naming_the_bound() {
    let app = App::new(&mlp(), "");
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let pid = s.wait_workers(1)[0];
    let cases = [
        (
            json!({ "inputs": vec![vec![1.0; 4]; 65] }),
            "input__0: dimension 0 is 65, above the export's bound of 64",
        ),
        (
            json!({"inputs": [[1.0, 2.0, 3.0, 4.0]]}),
            "dynamic batch starts at 2 rows; set max_batch_size",
        ),
        (
            json!({"inputs": [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]}),
            "dimension 1 is 3, the program takes 4 there",
        ),
    ];
    for (body, want) in cases {
        let r = s.post("/", &body.to_string());
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.body.contains(want), "{want:?} not in {}", r.body);
    }
    let r = s.post(
        "/",
        r#"{"inputs": [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.pid(), pid, "the same worker serves on");
}

/// The template loads the package and forks: each worker's passes (2 and 512 rows, the
/// latter on an OpenMP team) are answered, on a team of two threads per model thread.
#[test]
fn forked_workers_of_a_package_answer_on_teams_of_two_threads() {
    let mlp256 = package("mlp256", "dynamic");
    let app = App::new(
        mlp256.to_str().unwrap(),
        r#""inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}], "warmup_inputs": {"x": [2, 64]}"#,
    );
    forked_workers_answer_on_teams_of_two(&app, 2);
}

#[test]
fn a_package_with_a_thread_count_compiled_in_is_refused_naming_the_variable() {
    let fixed = package("mlp256", "default");
    refused(
        fixed.to_str().unwrap(),
        "",
        &[
            "fix their thread count at 4",
            "compile it with TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1 set",
        ],
    );
}

/// `mlp`'s package with its metadata changed (`tests/support/aoti_edit_metadata.py`).
fn edited(dir: &Path, name: &str, pairs: &[&str]) -> String {
    let out = dir.join(name);
    let mut args = vec![mlp(), out.to_str().unwrap().to_string()];
    args.extend(pairs.iter().map(|p| p.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    python_json("aoti_edit_metadata.py", &args, b"");
    out.to_str().unwrap().to_string()
}

#[test]
fn packages_for_another_cpu_or_device_and_unfit_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let neon = edited(dir.path(), "neon.pt2", &["AOTI_CPU_ISA=NEON"]);
    refused(
        &neon,
        "",
        &[
            "compiled for NEON (AOTI_CPU_ISA",
            "compile the package on a machine",
        ],
    );
    let cuda = edited(dir.path(), "cuda.pt2", &["AOTI_DEVICE_KEY=cuda"]);
    refused(
        &cuda,
        "",
        &["compiled for CUDA (AOTI_DEVICE_KEY cuda), but this worker runs on the CPU"],
    );
    refused(
        &mlp(),
        &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 128"#),
        &[
            "the package takes 2..64 rows in input input__0's dimension 0",
            "Set max_batch_size to at most 64, or serve the torch.export program itself",
        ],
    );
    // Without batching, the warm-up's one row is below the package's two: the fix named.
    refused(
        &mlp(),
        MLP_INPUT_DECL,
        &["dynamic batch starts at 2 rows; set max_batch_size"],
    );
}

/// On a GPU the plan chose (simulated: `tests/nvml-mock`, whose compute capability the
/// master reads through NVML and tells the worker): a CPU package is refused naming
/// `--device cpu`; a CUDA package for compute capability 9.0 is refused on an A100 (8.0),
/// naming both, and on an H100 (9.0) passes that check and is refused only because a
/// simulated GPU's worker runs on the CPU. No CUDA compiler here: the "CUDA package" is
/// mlp's CPU package with its metadata saying `AOTI_DEVICE_KEY cuda` and
/// `AOTI_COMPUTE_CAPABILITY 90` (`tests/support/aoti_edit_metadata.py`), which is all the
/// checks before the load read.
#[test]
fn packages_are_checked_against_the_gpu_the_plan_chose() {
    use nvml_sim::{SimGpu, SimGpus};
    let dir = tempfile::tempdir().unwrap();
    let cuda = edited(
        dir.path(),
        "cuda90.pt2",
        &["AOTI_DEVICE_KEY=cuda", "AOTI_COMPUTE_CAPABILITY=90"],
    );
    let cases = [
        (
            mlp(),
            SimGpu::h100_80gb(),
            vec![
                "compiled for the CPU (AOTI_DEVICE_KEY cpu), but this worker runs on a GPU",
                "serve it with --device cpu",
            ],
        ),
        (
            cuda.clone(),
            SimGpu::a100_40gb(),
            vec![
                "compiled for GPUs of compute capability 9.0 (AOTI_COMPUTE_CAPABILITY 90",
                "of compute capability 8.0 (as NVML reports it)",
            ],
        ),
        (
            cuda,
            SimGpu::h100_80gb(),
            vec!["compiled for CUDA, and --simulated-gpus runs the model on the CPU"],
        ),
    ];
    let lib = nvml_sim::mock_library().display().to_string();
    for (model, gpu, want) in cases {
        let meta = r#""max_batch_size": 4, "est_gpu_mem_min": 500, "est_gpu_mem_typ": 1000"#;
        let app = App::new(&model, &format!("{MLP_INPUT_DECL}, {meta}"));
        let file = app.dir.path().join("gpus.json");
        SimGpus::new(vec![gpu.clone()]).write(&file);
        let args = [
            "--production",
            "--workers",
            "1",
            "--nvml-library",
            &lib,
            "--simulated-gpus",
        ];
        let env = [(nvml_sim::ENV_FILE, file.to_str().unwrap())];
        let mut s = Server::spawn(&app, &args, &env);
        let st = s.wait_exit(PATIENCE);
        let log = s.log_text();
        assert_eq!(st.code(), Some(3), "{} on {}: {log}", model, gpu.name);
        for w in want {
            assert!(
                log.contains(w),
                "{model} on {}: no {w:?} in\n{log}",
                gpu.name
            );
        }
    }
}

/// Stops `s` as an operator does (SIGTERM) and waits for it.
fn terminate(s: &mut Server) {
    let pid = s.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    s.wait_exit(PATIENCE);
}

/// The unpack directory of the server whose master is `master`, under `tmp`: named
/// `vramfork-unpack-<master>-<16 hex digits>`, mode 0700.
fn own_unpack_dir(tmp: &Path, master: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let prefix = format!("vramfork-unpack-{master}-");
    let found: Vec<PathBuf> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.strip_prefix(&prefix)
                .is_some_and(|hex| hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .collect();
    assert_eq!(found.len(), 1, "{:?}", listing(tmp));
    let mode = std::fs::metadata(&found[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", found[0].display());
    found[0].clone()
}

/// Entries under `dir`, for messages.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir)
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// With its own temporary directory: a gone server's unpack directory is swept at start;
/// workers recycled after every request (as many as fit in about 20 s) leave nothing; what
/// a worker killed with SIGKILL left under `<pid>/` is removed when it is reaped; and after
/// the server stops, the directory is empty.
#[test]
fn unpacked_packages_leave_nothing_in_the_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let stale = tmp.path().join("vramfork-unpack-4999999/123");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.wrapper.so"), b"left by a killed server").unwrap();
    let app = App::new(&mlp(), &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#));
    let tmpdir = tmp.path().to_str().unwrap();
    let mut s = Server::start_env(
        &app,
        &["--production", "--workers", "1", "--max-requests", "1"],
        &[("TMPDIR", tmpdir)],
    );
    let first = s.wait_workers(1)[0];
    assert!(
        !tmp.path().join("vramfork-unpack-4999999").exists(),
        "{:?}",
        listing(tmp.path())
    );
    let start = std::time::Instant::now();
    let mut served = std::collections::BTreeSet::new();
    while start.elapsed() < std::time::Duration::from_secs(20) {
        let r = s.post("/", MLP_INPUT);
        if r.status == 200 {
            served.insert(r.pid());
        }
    }
    assert!(served.len() >= 5, "recycled workers: {served:?}");
    // A worker killed: what it had unpacked under <pid>/ goes when it is reaped.
    // The server's directory: its master's pid and a random suffix (no other user can make
    // it first), private to this user.
    let master = s.child.as_ref().unwrap().id();
    let own = own_unpack_dir(tmp.path(), master);
    let pid = s.wait_workers_where(1, |p| p[0] != first)[0];
    let left = own.join(pid.to_string());
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(left.join("model.wrapper.so"), b"unpacked when killed").unwrap();
    // SAFETY: kill(2) on a worker of our server.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    s.poll("the killed worker's files removed", || {
        (!left.exists()).then_some(())
    });
    terminate(&mut s);
    assert_eq!(listing(tmp.path()), Vec::<String>::new());
}

/// Development mode (`app` without `--production` becomes the worker by exec, so no master
/// outlives it to sweep): the worker removes what it unpacked, its directory too, once the
/// package is loaded; serving TorchScript makes no directory at all.
#[test]
fn development_mode_leaves_nothing_in_the_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let app = App::new(&mlp(), &format!(r#"{MLP_INPUT_DECL}, "max_batch_size": 4"#));
    let s = Server::start_env(&app, &[], &[("TMPDIR", tmp.path().to_str().unwrap())]);
    let r = s.poll("an answer", || {
        let r = s.post("/", MLP_INPUT);
        (r.status == 200).then_some(r)
    });
    assert_eq!(r.json()["outputs"].as_array().map(Vec::len), Some(1));
    assert_eq!(listing(tmp.path()), Vec::<String>::new());
    // A TorchScript model unpacks nothing, and no directory is made for it.
    let other = tempfile::tempdir().unwrap();
    let scripted = App::new("mlp.pt", MLP_INPUT_DECL);
    let env = [("TMPDIR", other.path().to_str().unwrap())];
    let s = Server::start_env(&scripted, &[], &env);
    s.poll("an answer", || {
        (s.post("/", MLP_INPUT).status == 200).then_some(())
    });
    assert_eq!(listing(other.path()), Vec::<String>::new());
}
