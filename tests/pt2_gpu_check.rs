//! The `.pt2` part of the GPU check (`scripts/gpu-check.d/pt2check.py`, docs/gpu-checks.md)
//! in its dry mode, so that it is not first run on a GPU: on the CPU, with this build's `app`
//! and `app-worker` and the test environment's torch, it exports the MLP, compiles its
//! AOTInductor package (dynamic threads), serves each with `app --production`, and writes
//! one PASS row per artifact: a first and a second request (another size) equal to eager
//! PyTorch's, the large request (no cap on the CPU: 200) and a next one. Each row is appended
//! to `pt2.txt` as it finishes (read here while the script runs); its own deadline holds
//! (rows out of time are TIME, and it exits at once); a missing C++ compiler makes the
//! package's row SKIP, naming it; and without a GPU it stops at once, naming the dry mode.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/gpu-check.d/pt2check.py")
        .display()
        .to_string()
}

fn bin_dir() -> String {
    let bin = app_bin();
    bin.parent().unwrap().to_str().unwrap().to_string()
}

/// The table's rows (not its head), in the order written.
fn rows(table: &str) -> Vec<&str> {
    table
        .lines()
        .filter(|l| l.starts_with("| ExportedProgram") || l.starts_with("| AOTInductor"))
        .collect()
}

/// One cell of a row, by its column's position (0: the artifact).
fn cell(row: &str, i: usize) -> &str {
    row.trim_matches('|').split(" | ").nth(i).unwrap().trim()
}

/// `pt2check.py ARGS --out OUT --work WORK`, its exit status, its output, how long it took,
/// and the tables seen while it ran: each time `pt2.txt`'s row count changed, the rows then
/// and whether the script was still running.
fn run(
    args: &[&str],
    env: &[(&str, &str)],
    out: &Path,
) -> (Option<i32>, String, Duration, Vec<(usize, bool)>) {
    let work = out.parent().unwrap().join("work");
    // Its output to a file, not a pipe: nothing can block it while it is watched.
    let said = out.parent().unwrap().join("said.txt");
    let file = std::fs::File::create(&said).unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(python())
        .arg(script())
        .args(args)
        .arg("--out")
        .arg(out)
        .arg("--work")
        .arg(&work)
        .envs(env.iter().copied())
        .env_remove("VRAMFORK_NVML_LIBRARY")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    let table = out.join("pt2.txt");
    let mut seen: Vec<(usize, bool)> = Vec::new();
    let status = loop {
        let running = child.try_wait().unwrap().is_none();
        let n = std::fs::read_to_string(&table).map_or(0, |t| rows(&t).len());
        if seen.last().map(|s| s.0) != Some(n) {
            seen.push((n, running));
        }
        if !running {
            break child.wait().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "pt2check.py still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t0.elapsed();
    let log = std::fs::read_to_string(&said).unwrap();
    (status.code(), log, took, seen)
}

#[test]
fn the_pt2_check_runs_here_in_its_dry_mode_writing_each_row_as_it_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let out: PathBuf = tmp.path().join("out");
    let bin = bin_dir();
    let (status, log, _, seen) = run(&["--bin", &bin, "--cpu", "--deadline", "400"], &[], &out);
    assert_eq!(status, Some(0), "{log}");
    let table = std::fs::read_to_string(out.join("pt2.txt")).unwrap();
    let rows = rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    // Row by row: the program's row was there, alone, while the package was still being made.
    assert!(
        seen.contains(&(1, true)),
        "the first row was not written before the run ended: {seen:?}\n{table}"
    );
    for (row, artifact) in rows
        .iter()
        .zip(["ExportedProgram (Native Runtime)", "AOTInductor package"])
    {
        assert_eq!(cell(row, 0), artifact, "{table}");
        assert_eq!(cell(row, 1), "cpu", "{row}");
        assert_eq!(cell(row, 8), "PASS", "{row}");
        assert_eq!(cell(row, 6), "64 rows: 200", "{row}");
        assert!(cell(row, 7).starts_with("200, diff "), "{row}");
        for i in [4, 5] {
            let d: f64 = cell(row, i).parse().unwrap_or_else(|_| panic!("{row}"));
            assert!(d <= 1e-4, "{row}");
        }
    }
    let at = |r: &str| cell(r, 9).parse::<f64>().unwrap();
    assert!(at(rows[0]) < at(rows[1]), "{table}");
}

#[test]
fn the_pt2_check_keeps_its_own_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let bin = bin_dir();
    // Too short for torch to load: both rows run out of their shares, and it ends at once.
    let (status, log, took, _) = run(&["--bin", &bin, "--cpu", "--deadline", "2"], &[], &out);
    assert_eq!(status, Some(1), "{log}");
    assert!(took < Duration::from_secs(12), "took {took:?}:\n{log}");
    let table = std::fs::read_to_string(out.join("pt2.txt")).unwrap();
    let rows = rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    for row in rows {
        assert_eq!(cell(row, 8), "TIME", "{row}");
        assert!(cell(row, 10).starts_with("out of time: "), "{row}");
    }
}

#[test]
fn without_a_compiler_the_package_row_skips_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let bin = bin_dir();
    let (status, log, _, _) = run(
        &["--bin", &bin, "--cpu", "--only", "package"],
        &[("CXX", "/nonexistent/c++")],
        &out,
    );
    assert_eq!(status, Some(0), "a SKIP is no failure:\n{log}");
    let table = std::fs::read_to_string(out.join("pt2.txt")).unwrap();
    let rows = rows(&table);
    assert_eq!(rows.len(), 1, "{table}");
    assert_eq!(cell(rows[0], 8), "SKIP", "{table}");
    assert!(
        cell(rows[0], 10).contains("no C++ compiler (CXX=/nonexistent/c++"),
        "{table}"
    );
}

#[test]
fn without_a_gpu_it_stops_in_its_first_seconds_naming_the_dry_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let bin = bin_dir();
    let (status, log, took, _) = run(&["--bin", &bin], &[("LD_LIBRARY_PATH", "")], &out);
    assert_eq!(status, Some(2), "{log}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(
        log.contains("pt2check: no NVIDIA GPU here (run with --cpu for the dry mode)"),
        "{log}"
    );
    let table = std::fs::read_to_string(out.join("pt2.txt")).unwrap();
    for row in rows(&table) {
        assert_eq!(cell(row, 8), "SKIP", "{row}");
        assert!(
            cell(row, 10).starts_with("cannot run here: no NVIDIA GPU"),
            "{row}"
        );
    }
}
