//! The `.pt2` step of the short GPU window (`scripts/gpu-check.d/pt2check.py`,
//! docs/gpu-checks.md) in its dry mode, so that it is not first run on a GPU: on the CPU, with
//! this build's `app` and `app-worker` and the test environment's torch, it exports the MLP,
//! compiles its AOTInductor package (dynamic threads), serves each with `app --production`,
//! and writes one PASS row per artifact whose answers match eager PyTorch within 1e-5. Then
//! what it says without CUDA and without --cpu: exit 2, naming the dry mode.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/gpu-check.d/pt2check.py")
        .display()
        .to_string()
}

#[test]
fn the_pt2_gpu_step_runs_here_in_its_dry_mode() {
    let bin = app_bin();
    let bin = bin.parent().unwrap().to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (out, work) = (tmp.path().join("out"), tmp.path().join("work"));
    let run = Command::new(python())
        .args([&script(), "--bin", bin, "--cpu"])
        .arg("--out")
        .arg(&out)
        .arg("--work")
        .arg(&work)
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(run.status.code(), Some(0), "{log}");
    let table = std::fs::read_to_string(out.join("pt2.txt")).unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.ends_with("| PASS |")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].starts_with("| ExportedProgram (Native Runtime) | cpu |"),
        "{table}"
    );
    assert!(
        rows[1].starts_with("| AOTInductor package | cpu |"),
        "{table}"
    );
    // Without --cpu on a machine whose torch sees no GPU: exit 2, naming the dry mode.
    let no_gpu = Command::new(python())
        .args([&script(), "--bin", bin])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&no_gpu.stdout);
    assert_eq!(no_gpu.status.code(), Some(2), "{said}");
    assert!(
        said.contains("sees no CUDA device here (run with --cpu"),
        "{said}"
    );
}
