//! The rehearsal of the GPU check: runs the command `docs/gpu-checks.md` gives for a GPU
//! machine, the way it is run there, so that it does not rot between the rare runs on a GPU.
//!
//! As there: a working tree holding a copy of the pack (`scripts/gpu-pack`, here from the
//! binaries under test, `target/debug`: stripped, their RUNPATH cleared), the command run by
//! `bash -c` from that tree's root with a clean environment, `python3` = the venv of
//! `$VRAMFORK_PYTHON` (torch 2.11.0+cu130, as there) first on `PATH`, no `LD_LIBRARY_PATH`
//! (the check sets it from that torch), no Rust on `PATH`, results in the folder the command
//! names. Instead of the GPU: the simulated NVML (`tests/nvml-mock`, through
//! `VRAMFORK_NVML_LIBRARY` and `NVML_MOCK_FILE`: an H100 80GB, driver 580.159.04, CUDA 13.0,
//! whose workers NVML reports at 1536 MiB each) and a stand-in `nvidia-smi` over it
//! (`tests/support/nvidia_smi.py`), plus `GPU_CHECK_SIMULATED=1`, which gives the servers
//! `--simulated-gpus` (CPU workers placed on the simulated GPU) and the `.pt2` steps
//! pt2check.py's dry mode (`--cpu`) — the one difference.
//!
//! Without CUDA the steps that need CUDA's allocator SKIP; the rest run, so what is checked
//! is the plumbing a short window cannot afford to debug: every step ends PASS, FAIL, SKIP or
//! TIME within its limit, each row is in the tables as soon as its step ends (read while the
//! check runs), the whole run keeps its own deadline, the four files are written, nothing
//! asks the stand-in a query it does not know, and another torch is refused.

mod common;
use common::nvml_sim;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nvml_sim::{MpsDaemon, SimComputeMode, SimGpu, SimGpus};

/// The one command `docs/gpu-checks.md` gives for a GPU window (part 1, the `.pt2` steps
/// included), and the optional second part, exactly as written there.
const PART_1: &str = "timeout 540 bash gpu-pack/gpu-check --part 1 --out gpu-check-out";
const PART_2: &str = "timeout 280 bash gpu-pack/gpu-check --part 2 --out gpu-check-out";
/// Each part's own deadline; the `timeout` around it is a backstop a few seconds later: the
/// whole check within 9 minutes.
const PART_1_DEADLINE_S: u32 = 525;
const PART_2_DEADLINE_S: u32 = 260;
/// Where the commands put their results, from the tree's root.
const OUT: &str = "tree/gpu-check-out";
/// A guard only: the check stops itself within its budget; past this the test kills it.
const GUARD: Duration = Duration::from_secs(600);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folder of the binaries under test (`app`, and `app-worker`, `forward-loop` beside it:
/// `cargo build --workspace` builds them before the tests, as scripts/test does).
fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_app"))
        .parent()
        .unwrap()
        .to_path_buf();
    for b in ["app-worker", "forward-loop"] {
        assert!(
            dir.join(b).is_file(),
            "{} is missing: run `cargo build --workspace` first (scripts/test does)",
            dir.join(b).display()
        );
    }
    dir
}

/// The venv whose `python3` plays the GPU machine's (torch 2.11.0+cu130).
fn venv_bin() -> PathBuf {
    let python = std::env::var("VRAMFORK_PYTHON")
        .expect("VRAMFORK_PYTHON is not set: run the tests through scripts/test");
    let bin = Path::new(&python).parent().unwrap().to_path_buf();
    assert!(
        bin.join("python3").is_file(),
        "no python3 in {}",
        bin.display()
    );
    bin
}

/// The GPU machine, rehearsed: its working tree with the pack, the scratch folder, the
/// simulated GPU and a `bin/` with the stand-in `nvidia-smi`.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    /// With one simulated H100 80GB (driver 580.159.04, CUDA 13.0) whose workers NVML
    /// reports at 1536 MiB each, under a UUID of this test's own, so that workers of other
    /// tests (which the mock finds by their CUDA_VISIBLE_DEVICES) are never counted as ours.
    fn new() -> Machine {
        Machine::with_gpus(1)
    }

    fn uuid(index: usize) -> String {
        format!(
            "GPU-41ea5e00-{index:04x}-4000-8000-{:012x}",
            std::process::id()
        )
    }

    fn with_gpus(n: usize) -> Machine {
        Machine::with_gpus_as(n, |g| g)
    }

    /// As [`Machine::with_gpus`], each simulated GPU changed by `f` (a compute mode).
    fn with_gpus_as(n: usize, f: impl Fn(SimGpu) -> SimGpu) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let m = Machine { dir };
        // The pack, made here as the build machine makes it, then copied as it is copied there.
        let packed = m.path("packed");
        let out = Command::new("bash")
            .arg(root().join("scripts/gpu-pack"))
            .arg("--bin")
            .arg(bin_dir())
            .arg("--out")
            .arg(&packed)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/gpu-pack failed:\n{}",
            text(&out)
        );
        let size = dir_size(&packed);
        assert!(
            size <= 64 << 20,
            "the pack is {size} bytes: binaries not stripped?"
        );
        std::fs::create_dir_all(m.path("tree")).unwrap();
        let cp = Command::new("cp")
            .arg("-a")
            .arg(&packed)
            .arg(m.path("tree/gpu-pack"))
            .status()
            .unwrap();
        assert!(cp.success());
        // Whatever folder the build's RUNPATH named, the packed binaries must not look there:
        // libtorch comes from LD_LIBRARY_PATH, as on the GPU machine.
        for b in ["app-worker", "forward-loop"] {
            let d = Command::new("readelf")
                .arg("-d")
                .arg(m.path(&format!("tree/gpu-pack/{b}")))
                .output()
                .unwrap();
            let d = text(&d);
            for l in d
                .lines()
                .filter(|l| l.contains("RUNPATH") || l.contains("RPATH"))
            {
                assert!(l.contains("runpath-cleared-by-gpu-pack"), "packed {b}: {l}");
            }
        }
        let gpu = |i| {
            f(SimGpu::h100_80gb()
                .uuid(&Machine::uuid(i))
                .reserved_mb(535)
                .free_follows_processes()
                .workers_use(1536))
        };
        SimGpus::new((0..n).map(gpu).collect())
            .driver("580.159.04")
            .cuda_driver_version(13000)
            .write(&m.path("gpus.json"));
        std::fs::create_dir_all(m.path("bin")).unwrap();
        let smi = root().join("tests/support/nvidia_smi.py");
        write_exec(
            &m.path("bin/nvidia-smi"),
            &format!("#!/bin/sh\nexec python3 '{}' \"$@\"\n", smi.display()),
        );
        m
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs `command` as the GPU machine would (`bash -c` in the tree's root, a clean
    /// environment, the results' folder emptied first); `first_on_path` goes before
    /// everything on PATH (a fake python3). Returns the exit status and the output.
    fn run(&self, command: &str, first_on_path: Option<&Path>) -> (Option<i32>, String) {
        self.run_with(command, first_on_path, &[])
    }

    /// As [`Machine::run`], with more variables in the clean environment.
    fn run_with(
        &self,
        command: &str,
        first_on_path: Option<&Path>,
        env: &[(&str, &str)],
    ) -> (Option<i32>, String) {
        self.run_without(command, first_on_path, env, &[])
    }

    /// As [`Machine::run_with`], without the variables named in `unset` (which the rehearsal
    /// sets by default).
    fn run_without(
        &self,
        command: &str,
        first_on_path: Option<&Path>,
        env: &[(&str, &str)],
        unset: &[&str],
    ) -> (Option<i32>, String) {
        let child = self.spawn(command, first_on_path, env, unset);
        let pid = child.id() as i32;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(GUARD) {
            Ok(out) => {
                let out = out.unwrap();
                (out.status.code(), text(&out))
            }
            Err(_) => {
                // SAFETY: kill(2) on the process group this test started; no memory involved.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                panic!("`{command}` still ran after {GUARD:?}: a step hung past its limit");
            }
        }
    }

    /// `command` started as [`Machine::run_without`] runs it, in a process group of its own.
    fn spawn(
        &self,
        command: &str,
        first_on_path: Option<&Path>,
        env: &[(&str, &str)],
        unset: &[&str],
    ) -> std::process::Child {
        let _ = std::fs::remove_dir_all(self.path(OUT));
        let mut path = String::new();
        if let Some(p) = first_on_path {
            path = format!("{}:", p.display());
        }
        path += &format!(
            "{}:{}:/usr/bin:/bin",
            self.path("bin").display(),
            venv_bin().display()
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(command)
            .current_dir(self.path("tree"))
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.path("."))
            .env("TMPDIR", self.dir.path())
            .env("VRAMFORK_NVML_LIBRARY", nvml_sim::mock_library())
            .env(nvml_sim::ENV_FILE, self.path("gpus.json"))
            .env("NVIDIA_SMI_STANDIN_LOG", self.path("nvidia-smi.log"))
            .env("GPU_CHECK_SIMULATED", "1")
            .env("GPU_CHECK_WORK", self.path("work"))
            .env("GPU_CHECK_SECONDS", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for v in unset {
            cmd.env_remove(v);
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.spawn().unwrap()
    }

    /// The results' folder, `rel` in it.
    fn out(&self, rel: &str) -> PathBuf {
        self.path(OUT).join(rel)
    }

    /// `results.tsv`: step -> (result, seconds, limit, figures).
    fn results(&self) -> BTreeMap<String, (String, f64, f64, String)> {
        self.rows()
            .into_iter()
            .map(|(step, result, secs, limit, _, figures)| (step, (result, secs, limit, figures)))
            .collect()
    }

    /// `results.tsv`'s rows in the order written: (step, result, seconds, limit, the second
    /// of the run it ended at, figures).
    fn rows(&self) -> Vec<(String, String, f64, f64, f64, String)> {
        let tsv = std::fs::read_to_string(self.out("results.tsv")).unwrap();
        let mut lines = tsv.lines();
        assert_eq!(
            lines.next(),
            Some("step\tresult\tseconds\tlimit\tat\tfigures")
        );
        lines
            .map(|l| {
                let f: Vec<&str> = l.splitn(6, '\t').collect();
                assert_eq!(f.len(), 6, "results.tsv line {l:?}");
                let n = |s: &str| {
                    s.parse::<f64>()
                        .unwrap_or_else(|_| panic!("{s:?} in {l:?}"))
                };
                let text = |s: &str| s.to_string();
                (
                    text(f[0]),
                    text(f[1]),
                    n(f[2]),
                    n(f[3]),
                    n(f[4]),
                    text(f[5]),
                )
            })
            .collect()
    }

    /// What every run must leave in its results' folder, whatever happened: the four files,
    /// plain files with plain names, and the table with one row for each of `steps`, in
    /// order, each ended within its limit, at seconds of the run that never go back.
    fn check_out(&self, steps: &[&str], log: &str) {
        let mut names: Vec<String> = std::fs::read_dir(self.path(OUT))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                assert!(e.file_type().unwrap().is_file(), "{:?}", e.path());
                e.file_name().into_string().unwrap()
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "environment.txt",
                "logs.tar.gz",
                "results.tsv",
                "summary.txt"
            ],
            "{log}"
        );
        for n in &names {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)));
        }
        let results = self.results();
        let summary = std::fs::read_to_string(self.out("summary.txt")).unwrap();
        let mut rows = summary
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| step"));
        for step in steps {
            let (result, secs, limit, figures) = results
                .get(*step)
                .unwrap_or_else(|| panic!("no result for step {step}:\n{log}"));
            assert!(
                ["PASS", "FAIL", "SKIP", "TIME"].contains(&result.as_str()),
                "{step}: {result}"
            );
            assert!(result != "TIME", "{step} ran out of time: {figures}\n{log}");
            assert!(
                secs <= limit,
                "{step} took {secs} s, its limit is {limit} s"
            );
            let row = rows
                .next()
                .unwrap_or_else(|| panic!("summary.txt lacks {step}:\n{summary}"));
            assert!(row.starts_with(&format!("| {step} | {result} |")), "{row}");
        }
        assert_eq!(results.len(), steps.len(), "{results:?}");
        let at: Vec<f64> = self.rows().iter().map(|r| r.4).collect();
        assert!(
            at.windows(2).all(|w| w[0] <= w[1]),
            "rows' seconds go back: {at:?}"
        );
        let listing = Command::new("tar")
            .arg("-tzf")
            .arg(self.out("logs.tar.gz"))
            .output()
            .unwrap();
        let listing = text(&listing);
        for (i, step) in steps.iter().enumerate() {
            let figures = &results[*step].3;
            let skipped = figures.starts_with("not run")
                || figures.starts_with("out of time: not started")
                || figures.starts_with("cannot run here");
            assert!(
                skipped || listing.contains(&format!("logs/{:02}-{step}.log", i + 1)),
                "logs.tar.gz lacks {step}'s log:\n{listing}"
            );
        }
    }

    /// Every nvidia-smi call the check made was one the stand-in knows (and so one whose
    /// answer in driver 580's format it was tested against).
    fn check_smi_queries(&self) {
        let log = std::fs::read_to_string(self.path("nvidia-smi.log")).unwrap();
        assert!(log.lines().any(|l| l.starts_with("--query-gpu=")), "{log}");
        assert!(
            log.lines().any(|l| l.starts_with("--query-compute-apps=")),
            "{log}"
        );
        assert!(
            !log.contains("REFUSED"),
            "the check asked nvidia-smi what it does not answer:\n{log}"
        );
        assert!(
            !log.contains("-i MIG-") && !log.contains("--id=MIG-"),
            "{log}"
        );
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                dir_size(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

fn write_exec(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The step names of part `n`, and the sum of their limits, from `--help`.
fn part_plan(n: u32) -> (Vec<String>, f64) {
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-check"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = text(&out);
    let line = help
        .lines()
        .find(|l| l.starts_with(&format!("Part {n} (")))
        .unwrap_or_else(|| panic!("--help names no part {n}:\n{help}"));
    let steps = line[line.find('(').unwrap() + 1..line.find(')').unwrap()]
        .split(' ')
        .map(String::from)
        .collect();
    let sum = line
        .split("limits add up to ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no sum in {line:?}"));
    (steps, sum)
}

#[test]
fn the_docs_give_the_commands_this_test_rehearses() {
    let docs = std::fs::read_to_string(root().join("docs/gpu-checks.md")).unwrap();
    for cmd in [PART_1, PART_2] {
        assert!(
            docs.contains(&format!("{cmd}\n")),
            "docs/gpu-checks.md lacks the command: {cmd}"
        );
    }
    let help = Command::new("bash")
        .arg(root().join("scripts/gpu-check"))
        .arg("--help")
        .output()
        .unwrap();
    let help = text(&help);
    // Each part's own deadline, and the `timeout` around it a backstop within 9 minutes.
    for (n, deadline, cmd) in [
        (1, PART_1_DEADLINE_S, PART_1),
        (2, PART_2_DEADLINE_S, PART_2),
    ] {
        assert!(
            help.contains(&format!("its own deadline is {deadline} s")),
            "part {n}:\n{help}"
        );
        let backstop: u32 = cmd.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(backstop > deadline && backstop <= 540, "{cmd}");
    }
    // The .pt2 steps come first, after libs: their share is theirs whatever the rest takes.
    let (steps1, _) = part_plan(1);
    let (steps2, _) = part_plan(2);
    assert_eq!(steps1[..3], ["libs", "pt2-program", "pt2-package"]);
    assert_eq!(steps2[0], "libs");
}

/// The rows of `results.tsv` as they were seen while `command` ran, read every 20 ms: each
/// time their count changed, the count; then, once `rows` were there and `also` exists,
/// the run is stopped with TERM to its process group (as `timeout` stops it). The exit
/// status and the output.
fn run_until_rows(
    m: &Machine,
    command: &str,
    rows: usize,
    also: &Path,
) -> (Vec<usize>, Option<i32>, String) {
    let child = m.spawn(command, None, &[], &[]);
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let tsv = m.out("results.tsv");
    let (mut seen, t0) = (vec![0], std::time::Instant::now());
    loop {
        let n = std::fs::read_to_string(&tsv).map_or(0, |t| t.lines().count().saturating_sub(1));
        if *seen.last().unwrap() != n {
            seen.push(n);
        }
        if n >= rows && also.exists() {
            // SAFETY: kill(2) on the process group this test started; no memory involved.
            unsafe { libc::kill(-pid, libc::SIGTERM) };
            break;
        }
        assert!(
            t0.elapsed() < GUARD,
            "no {rows} rows after {GUARD:?}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("it ended after TERM")
        .unwrap();
    (seen, out.status.code(), text(&out))
}

/// Whether a process whose command line names `path` still runs (not a zombie): its
/// command line, if one does.
fn runs_under(path: &Path) -> Option<String> {
    let want = path.display().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z'));
        if cmd.contains(&want) && !zombie {
            return Some(cmd);
        }
    }
    None
}

/// A row is in both tables as soon as its step ends, while the run goes on: stopped after
/// its second row (as `timeout` stops it, TERM to the group) while the package is being
/// compiled, the run keeps those rows whole, adds the step it was in as interrupted, writes
/// the four files, and leaves no process behind (the compile included).
#[test]
fn each_row_is_written_as_its_step_ends_and_a_stopped_run_keeps_them() {
    let m = Machine::new();
    // After the second row, once the package's compile has begun (its log is there).
    let making = m.path("work/pt2-package/make-package.log");
    let (seen, status, log) = run_until_rows(&m, PART_1, 2, &making);
    assert_eq!(seen[..3], [0, 1, 2], "one row at a time: {seen:?}\n{log}");
    assert_eq!(status, Some(130), "{log}");
    let rows = m.rows();
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names[..2], ["libs", "pt2-program"], "{rows:?}");
    assert_eq!(rows[0].1, "PASS", "{rows:?}\n{log}");
    assert_eq!(rows[1].1, "PASS", "{rows:?}\n{log}");
    // The step it was in is the last row.
    assert_eq!(rows.len(), 3, "{rows:?}");
    let r = &rows[2];
    let r = (r.0.as_str(), r.1.as_str(), r.5.as_str());
    assert_eq!(r, ("pt2-package", "FAIL", "interrupted"), "{rows:?}");
    let t0 = std::time::Instant::now();
    while let Some(cmd) = runs_under(m.dir.path()) {
        assert!(t0.elapsed() < Duration::from_secs(15), "still runs: {cmd}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let summary = std::fs::read_to_string(m.out("summary.txt")).unwrap();
    for r in &rows {
        assert!(
            summary.contains(&format!("| {} | {} |", r.0, r.1)),
            "{summary}"
        );
    }
    for f in ["environment.txt", "logs.tar.gz"] {
        assert!(m.out(f).is_file(), "{f}:\n{log}");
    }
}

/// The whole run keeps its own deadline: with one too short for any step, every step is
/// out of time (TIME, saying so, none started) and the run ends within it, exit 1.
#[test]
fn the_check_keeps_its_own_deadline() {
    let m = Machine::new();
    let t0 = std::time::Instant::now();
    let (status, log) = m.run(&format!("{PART_1} --deadline 25"), None);
    let took = t0.elapsed();
    assert_eq!(status, Some(1), "{log}");
    assert!(took < Duration::from_secs(25 + 5), "took {took:?}:\n{log}");
    let (steps, _) = part_plan(1);
    let rows = m.rows();
    assert_eq!(rows.len(), steps.len(), "{rows:?}");
    for r in rows {
        assert_eq!(r.1, "TIME", "{r:?}");
        assert!(r.5.starts_with("out of time: not started, "), "{r:?}");
    }
    assert!(log.contains("TIME in "), "{log}");
}

#[test]
fn part_1_runs_here_on_the_simulated_gpu() {
    let m = Machine::new();
    let (steps, _) = part_plan(1);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let (status, log) = m.run(PART_1, None);
    m.check_out(&steps, &log);
    let r = m.results();
    let result = |s: &str| r[s].0.as_str();
    // Without CUDA, the allocator's steps say so; the others run on the simulated GPU and,
    // with the mock's fixed figures, pass.
    for s in ["cap", "hwfetch"] {
        assert_eq!(result(s), "SKIP", "{s}: {}", r[s].3);
        assert!(r[s].3.contains("CUDA"), "{s} must say why: {}", r[s].3);
    }
    for s in [
        "libs",
        "pt2-program",
        "pt2-package",
        "models",
        "plan",
        "footprint",
        "recycle",
        "kill9",
        "served",
        "production",
        "budget",
    ] {
        assert_eq!(result(s), "PASS", "{s}: {}\n{log}", r[s].3);
    }
    assert_eq!(status, Some(0), "{log}");
    // The .pt2 rows: pt2check.py's dry mode, its four requests answered.
    for s in ["pt2-program", "pt2-package"] {
        assert!(r[s].3.contains("; cpu; "), "{s}: {}", r[s].3);
        assert!(
            r[s].3.contains("; 64 rows: 200; 200, diff "),
            "{s}: {}",
            r[s].3
        );
    }
    // What the figures must say: the exact torch; libtorch from that torch's lib/ (not the
    // build's RUNPATH); NVML's figure for the worker (the mock's 1536 MiB) and our pids seen;
    // the kill timed from NVML; three production workers.
    assert!(
        r["libs"].3.contains("python3's torch is 2.11.0+cu130"),
        "{}",
        r["libs"].3
    );
    assert!(r["libs"].3.contains("libtorch from "), "{}", r["libs"].3);
    assert!(
        r["footprint"]
            .3
            .contains("1536 MiB (NVML's figure for worker"),
        "{}",
        r["footprint"].3
    );
    assert!(
        r["kill9"].3.contains("GPU memory released after"),
        "{}",
        r["kill9"].3
    );
    assert!(
        r["production"].3.starts_with("3 workers running (3 asked"),
        "{}",
        r["production"].3
    );
    // The burst of the longest documents: every pass within the small encoder's budget
    // of 2,048 tokens (16 documents of 128), and no allocator here to compare.
    assert!(
        r["budget"].3.contains("largest pass 2048 tokens")
            && r["budget"].3.contains("peaks not compared; 0 failures"),
        "{}",
        r["budget"].3
    );
    // Every step that started workers says how long each took to boot.
    for s in ["footprint", "recycle", "kill9", "served", "production"] {
        assert!(r[s].3.contains("worker boots "), "{s}: {}", r[s].3);
    }
    let env = std::fs::read_to_string(m.out("environment.txt")).unwrap();
    assert!(env.contains("driver 580.159.04"), "{env}");
    // NVML held open by one process for the whole run, and the preflight's findings.
    assert!(env.contains(", held open by pid "), "{env}");
    let logs = all_logs(&m);
    assert_eq!(
        logs.matches("NVML still held open by pid ").count(),
        steps.len(),
        "every step starts with NVML held open:\n{logs}"
    );
    assert!(env.contains("libraries (LD_LIBRARY_PATH="), "{env}");
    assert!(env.contains("this machine: glibc 2."), "{env}");
    assert!(env.contains("NVML sees the server's pids: yes"), "{env}");
    m.check_smi_queries();

    // The second part reuses the first one's scratch folder: what it needs is not redone.
    let (steps, _) = part_plan(2);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let (status, log) = m.run(PART_2, None);
    m.check_out(&steps, &log);
    let r = m.results();
    for s in &steps {
        assert_eq!(r[*s].0, "PASS", "{s}: {}\n{log}", r[*s].3);
    }
    // libtorch's whole multi-line text for the CUDA error: the answer names the error.
    assert!(
        r["errors"]
            .3
            .contains("the error names it ('invalid configuration argument')"),
        "{}",
        r["errors"].3
    );
    assert_eq!(status, Some(0), "{log}");
    m.check_smi_queries();
}

#[test]
fn a_python3_with_another_torch_is_refused_naming_both_versions() {
    let m = Machine::new();
    // A python3 whose `import torch` finds a torch that says 2.7.1+cu126.
    let fake = m.path("fake-torch/torch");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(
        fake.join("__init__.py"),
        "__version__ = '2.7.1+cu126'\n\
         class version:\n    cuda = '12.6'\n\
         class cuda:\n    @staticmethod\n    def is_available():\n        return True\n",
    )
    .unwrap();
    std::fs::create_dir_all(m.path("fake-bin")).unwrap();
    write_exec(
        &m.path("fake-bin/python3"),
        &format!(
            "#!/bin/sh\nPYTHONPATH='{}' exec '{}' \"$@\"\n",
            m.path("fake-torch").display(),
            venv_bin().join("python3").display()
        ),
    );
    let (steps, _) = part_plan(1);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let (status, log) = m.run(PART_1, Some(&m.path("fake-bin")));
    assert_eq!(status, Some(2), "a refusal exits 2:\n{log}");
    m.check_out(&steps, &log);
    let r = m.results();
    let libs = &r["libs"];
    assert_eq!(libs.0, "FAIL", "{libs:?}");
    assert!(
        libs.3
            .starts_with("refused: python3's torch is 2.7.1+cu126")
            && libs.3.contains("built against 2.11.0+cu130"),
        "the refusal must name both versions: {}",
        libs.3
    );
    for s in &steps[1..] {
        assert_eq!(r[*s].0, "SKIP", "{s} ran after the refusal: {:?}", r[*s]);
        assert!(r[*s].3.contains("refused"), "{:?}", r[*s]);
    }
    // No server was started, so nothing could have loaded the wrong libtorch.
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(m.out("logs.tar.gz"))
        .output()
        .unwrap();
    assert!(!text(&listing).contains(".app-"), "{}", text(&listing));
}

/// Where the operator's CUDA_VISIBLE_DEVICES hides a GPU, the plan leaves it
/// out (as CUDA does), and step plan must compare only the GPUs the plan may use — not flag
/// the hidden one as missing from the plan.
#[test]
fn the_plan_step_compares_only_the_gpus_cuda_visible_devices_leaves() {
    let m = Machine::with_gpus(2);
    // By index: the mock would count every process of the check whose CUDA_VISIBLE_DEVICES is
    // exactly a GPU's UUID as a worker using memory on it.
    let (status, log) = m.run_with(
        "bash gpu-pack/gpu-check --only plan --out gpu-check-out",
        None,
        &[("CUDA_VISIBLE_DEVICES", "1")],
    );
    m.check_out(&["libs", "models", "plan"], &log);
    let r = m.results();
    let plan = &r["plan"];
    assert_eq!(plan.0, "PASS", "{}\n{log}", plan.3);
    assert!(
        plan.3.contains("1 GPU(s) hidden by CUDA_VISIBLE_DEVICES"),
        "{}",
        plan.3
    );
    assert!(
        plan.3.starts_with("mlp.pt declared at 2000 MiB: GPU 1 "),
        "{}",
        plan.3
    );
    assert_eq!(status, Some(0), "{log}");
    m.check_smi_queries();
}

/// How long a preflight refusal may take, start to end (the check's own limit is 10 s; the
/// rest is this machine's load).
const FIRST_SECONDS: Duration = Duration::from_secs(20);

/// A run that the preflight stopped: exit 2 within [`FIRST_SECONDS`], one line on stderr
/// naming what is missing (every piece of `want`), every step SKIP with that reason, the four
/// files written, and no server started.
fn stopped_before_any_step(m: &Machine, run: (Option<i32>, String), took: Duration, want: &[&str]) {
    let (status, log) = run;
    assert_eq!(
        status,
        Some(2),
        "a machine that cannot run the check exits 2:\n{log}"
    );
    assert!(
        took <= FIRST_SECONDS,
        "the check took {took:?} to stop, not its first seconds:\n{log}"
    );
    let line = log
        .lines()
        .find(|l| {
            l.starts_with(&format!("gpu-check: {}", want[0])) && want.iter().all(|w| l.contains(w))
        })
        .unwrap_or_else(|| panic!("no line naming {want:?}:\n{log}"));
    assert!(line.contains("build them on an older system"), "{line}");
    let (steps, _) = part_plan(1);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    m.check_out(&steps, &log);
    for (step, (result, _, _, figures)) in m.results() {
        assert_eq!(result, "SKIP", "{step} ran: {figures}");
        assert!(
            figures.starts_with("cannot run here: ") && want.iter().all(|w| figures.contains(w)),
            "{step}: {figures}"
        );
    }
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(m.out("logs.tar.gz"))
        .output()
        .unwrap();
    assert!(!text(&listing).contains(".app-"), "{}", text(&listing));
    eprintln!("stopped after {took:?}: {line}");
}

/// Rewrites, in place, every `GLIBC_2.NN` version name an ELF file's string table holds to
/// `GLIBC_2.99` (same length, nothing moves): the file then needs a glibc no system has, as
/// one built on a newer system needs a newer glibc than an older image gives. Returns how
/// many names it rewrote.
fn need_glibc_2_99(bytes: &mut [u8]) -> usize {
    let pat = b"GLIBC_2.";
    let mut n = 0;
    let mut i = 0;
    while i + pat.len() + 3 <= bytes.len() {
        let at = i + pat.len();
        if &bytes[i..at] == pat
            && bytes[at].is_ascii_digit()
            && bytes[at + 1].is_ascii_digit()
            && bytes[at + 2] == 0
        {
            bytes[at] = b'9';
            bytes[at + 1] = b'9';
            n += 1;
            i = at + 3;
        } else {
            i += 1;
        }
    }
    n
}

/// On a machine whose glibc is older than the packed binaries need, the check stops
/// in its first seconds, before any step, naming what is missing — instead of letting every
/// step fail one by one. Here the packed app-worker needs GLIBC_2.99.
#[test]
fn a_glibc_older_than_the_binaries_need_stops_the_check_in_its_first_seconds() {
    let m = Machine::new();
    let worker = m.path("tree/gpu-pack/app-worker");
    let mut bytes = std::fs::read(&worker).unwrap();
    assert!(
        need_glibc_2_99(&mut bytes) > 0,
        "app-worker names no GLIBC_2.NN version"
    );
    std::fs::write(&worker, &bytes).unwrap();
    let t0 = std::time::Instant::now();
    let run = m.run(PART_1, None);
    let took = t0.elapsed();
    stopped_before_any_step(
        &m,
        run,
        took,
        &[
            "this machine's glibc is 2.",
            "the packed binaries need 2.99 (app-worker needs GLIBC_2.99 from lib",
            "built on ",
        ],
    );
}

/// A libstdc++.so.6 as an old system has it: it defines GLIBCXX_3.4 up to GLIBCXX_3.4.9 and
/// CXXABI_1.3, and nothing newer (built here with the C compiler and a version script).
fn old_libstdcxx(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("old.c"),
        "int vf_old_a(void) { return 1; }\nint vf_old_b(void) { return 2; }\nint vf_old_c(void) { return 3; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("old.map"),
        "GLIBCXX_3.4 { global: vf_old_a; local: *; };\n\
         GLIBCXX_3.4.9 { global: vf_old_b; } GLIBCXX_3.4;\n\
         CXXABI_1.3 { global: vf_old_c; };\n",
    )
    .unwrap();
    let out = Command::new("cc")
        .current_dir(dir)
        .args([
            "-shared",
            "-fPIC",
            "-o",
            "libstdc++.so.6",
            "-Wl,-soname,libstdc++.so.6",
            "-Wl,--version-script,old.map",
            "old.c",
        ])
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc failed:\n{}", text(&out));
}

/// The same for a libstdc++ older than the binaries need: the one the loader would
/// pick (here, an old one first on LD_LIBRARY_PATH) is read, and the run stops naming it.
#[test]
fn a_libstdcxx_older_than_the_binaries_need_stops_the_check_in_its_first_seconds() {
    let m = Machine::new();
    let old = m.path("old-libstdc++");
    old_libstdcxx(&old);
    let t0 = std::time::Instant::now();
    let run = m.run_with(PART_1, None, &[("LD_LIBRARY_PATH", old.to_str().unwrap())]);
    let took = t0.elapsed();
    let lib = format!(
        "this machine's libstdc++ ({}/libstdc++.so.6) provides GLIBCXX up to 3.4.9",
        old.display()
    );
    stopped_before_any_step(
        &m,
        run,
        took,
        &[&lib, "the packed binaries need GLIBCXX_3.4.", "built on "],
    );
}

/// The text of every log in `logs.tar.gz`.
fn all_logs(m: &Machine) -> String {
    let out = Command::new("tar")
        .arg("-xzOf")
        .arg(m.out("logs.tar.gz"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// On a GPU in compute mode Exclusive_Process (one CUDA process at a time) the steps
/// that put several workers on it SKIP, saying why, instead of failing; the others run. And
/// the libnvidia-ml.so.1 the check's NVML process found (here only through the loader's path:
/// no VRAMFORK_NVML_LIBRARY given) is the one every server is told to load.
#[test]
fn an_exclusive_process_gpu_skips_the_steps_with_several_workers() {
    let m = Machine::with_gpus_as(1, |g| g.compute_mode(SimComputeMode::ExclusiveProcess));
    let driver = m.path("driver");
    std::fs::create_dir_all(&driver).unwrap();
    std::os::unix::fs::symlink(nvml_sim::mock_library(), driver.join("libnvidia-ml.so.1")).unwrap();
    // Part 1's steps but the .pt2 ones (they need no GPU sharing and take minutes here).
    let steps = [
        "libs",
        "models",
        "plan",
        "footprint",
        "cap",
        "hwfetch",
        "recycle",
        "kill9",
        "served",
        "production",
    ];
    let only = format!(
        "bash gpu-pack/gpu-check --out gpu-check-out --only {}",
        steps.join(",")
    );
    let (status, log) = m.run_without(
        &only,
        None,
        &[("LD_LIBRARY_PATH", driver.to_str().unwrap())],
        &["VRAMFORK_NVML_LIBRARY"],
    );
    m.check_out(&steps, &log);
    let r = m.results();
    for s in ["kill9", "served", "production"] {
        assert_eq!(r[s].0, "SKIP", "{s}: {}\n{log}", r[s].3);
        assert!(
            r[s].3
                .contains("GPU 0 is in compute mode Exclusive_Process: one CUDA process at a time"),
            "{s} must say why: {}",
            r[s].3
        );
    }
    for s in ["libs", "models", "plan", "footprint", "recycle"] {
        assert_eq!(r[s].0, "PASS", "{s}: {}\n{log}", r[s].3);
    }
    assert_eq!(status, Some(0), "{log}");
    // The path the loader opened it under (dladdr), as on a GPU machine.
    let found = driver.join("libnvidia-ml.so.1");
    let env = std::fs::read_to_string(m.out("environment.txt")).unwrap();
    assert!(
        env.contains(&format!(
            "VRAMFORK_NVML_LIBRARY for every server: {}",
            found.display()
        )),
        "{env}"
    );
    // Each server's own environment, read from /proc by the check, says so.
    let logs = all_logs(&m);
    let said: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("'s environment: VRAMFORK_NVML_LIBRARY="))
        .collect();
    assert!(!said.is_empty(), "{logs}");
    for l in said {
        assert!(
            l.ends_with(&format!("VRAMFORK_NVML_LIBRARY={}", found.display())),
            "{l}"
        );
    }
    m.check_smi_queries();
}

/// Where an MPS control daemon answers, workers would be its clients (NVML reports
/// their memory under the MPS server): the steps with several workers on one GPU SKIP, saying
/// so; the one-worker steps run.
#[test]
fn an_mps_daemon_skips_the_steps_with_several_workers() {
    let m = Machine::new();
    let mps = MpsDaemon::start();
    let (status, log) = m.run_with(
        "bash gpu-pack/gpu-check --only kill9 --out gpu-check-out",
        None,
        &[("CUDA_MPS_PIPE_DIRECTORY", &mps.pipe_dir())],
    );
    m.check_out(&["libs", "models", "footprint", "kill9"], &log);
    let r = m.results();
    assert_eq!(r["footprint"].0, "PASS", "{}\n{log}", r["footprint"].3);
    assert_eq!(r["kill9"].0, "SKIP", "{}\n{log}", r["kill9"].3);
    assert!(
        r["kill9"].3.contains(&format!(
            "an MPS control daemon answers at {}/control",
            mps.pipe_dir()
        )),
        "{}",
        r["kill9"].3
    );
    assert_eq!(status, Some(0), "{log}");
}
