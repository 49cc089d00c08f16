//! Several servers on one GPU: the host's GPU-memory ledger (`--ledger DIR`,
//! `src/master/ledger.rs`), with real `app` processes against one simulated GPU (the NVML
//! stand-in, `--simulated-gpus`: workers run on the CPU, so NVML's free memory never falls
//! as they start — only the ledger keeps servers started together apart).

mod common;

use common::host::{mps_limits, Host, A100_SHARE_MB};
use common::*;
use serde_json::Value;

/// The per-worker figure every server here declares: the CPU bound (2 × cores + 1) caps
/// the first server's plan, so the GPU's room is shared out among the next ones.
const TYP_MB: u64 = 4000;

/// What a server started came to: its worker count once listening, or its exit status and
/// log when it refused.
enum Outcome {
    Serves(Server, u64),
    Refused(i32, String),
}

fn outcome(mut s: Server) -> Outcome {
    let deadline = std::time::Instant::now() + PATIENCE;
    let got = loop {
        if let Some(e) = s.events().into_iter().find(|e| e.name == "listening") {
            break Ok(e.u64("workers").unwrap());
        }
        if let Some(st) = s.try_exit() {
            break Err(st);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither listening nor exited:\n{}",
            s.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    match got {
        Ok(n) => {
            s.port = 0;
            Outcome::Serves(s, n)
        }
        Err(st) => {
            let log = s.log_text();
            Outcome::Refused(st.code().unwrap_or(-1), log)
        }
    }
}

/// Servers started at the same moment on one GPU never plan on the same memory: the sum of
/// what they reserve stays within what the GPU offers (`total × fraction`), and a server
/// that finds no room left exits 2 naming the ledger. Without the ledger each would plan
/// the whole GPU (`app plan --ledger off` shows it).
#[test]
fn servers_started_together_never_plan_on_the_same_memory() {
    for n in [2usize, 4] {
        let host = Host::new();
        let alone = host.plan(&host.app(TYP_MB), &["--ledger", "off", "--production"]);
        let g = &alone["gpus"][0];
        let shared = (g["total_mb"].as_f64().unwrap() * g["fraction"].as_f64().unwrap()).floor();
        let alone_workers = alone["workers"].as_u64().unwrap();
        assert!(
            alone_workers * TYP_MB * n as u64 > shared as u64,
            "alone, {n} servers would over-commit the GPU: {alone}"
        );
        let apps: Vec<App> = (0..n).map(|_| host.app(TYP_MB)).collect();
        let started: Vec<Server> = apps
            .iter()
            .map(|a| host.spawn(a, &["--production"]))
            .collect();
        let outcomes: Vec<Outcome> = started.into_iter().map(outcome).collect();
        let mut total = 0;
        for o in &outcomes {
            match o {
                Outcome::Serves(s, workers) => {
                    assert!(*workers >= 1);
                    s.wait_workers(*workers as usize);
                    total += workers * TYP_MB;
                }
                Outcome::Refused(code, log) => {
                    assert_eq!(*code, 2, "{log}");
                    assert!(log.contains("other servers reserved"), "{log}");
                }
            }
        }
        assert!(
            total as f64 <= shared,
            "{n} servers reserved {total} MB of {shared} MB"
        );
        // Each server's reservation is in the ledger while it serves.
        assert_eq!(host.reserved(), total);
    }
}

/// A master killed with SIGKILL leaves its reservation, which expires with its lease; a
/// serving neighbour's reservation is renewed and stays. A server stopped with TERM takes
/// its reservation with it at once.
#[test]
fn a_killed_servers_reservation_expires_and_a_live_ones_is_renewed() {
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (first, n_first) = host.serving(&a, &[]);
    let (second, n_second) = host.serving(&b, &[]);
    let both = (n_first + n_second) * TYP_MB;
    assert_eq!(host.reserved(), both);
    // SIGKILL the first master: nothing removes its entry but time.
    // SAFETY: kill(2) on the first server's master, a child of this test.
    unsafe { libc::kill(first.pid() as i32, libc::SIGKILL) };
    let left = first.poll("the killed server's reservation to expire", || {
        let v = host.reserved();
        (v < both).then_some(v)
    });
    assert_eq!(
        left,
        n_second * TYP_MB,
        "the live server's reservation was renewed"
    );
    drop(first);
    // TERM: gone at once.
    second.signal(libc::SIGTERM);
    let mut second = second;
    second.wait_exit(PATIENCE);
    assert_eq!(
        host.plan(&host.app(TYP_MB), &[])["gpus"][0]["ledger_mb"]
            .as_u64()
            .unwrap_or(0),
        0
    );
}

/// A shared file that is no ledger (the earlier release's `gpu-ledger.json`, truncated or
/// hand-edited) is said (`ledger_entry_dropped`) and counts for nothing; the server plans
/// as if alone, and never rebuilds or removes what it did not write.
#[test]
fn a_ledger_file_that_is_no_ledger_is_said_not_a_crash() {
    let host = Host::new();
    std::fs::create_dir_all(host.ledger()).unwrap();
    let junk = "{\"servers\": {\"x\"";
    std::fs::write(host.ledger().join("gpu-ledger.json"), junk).unwrap();
    let alone = host.plan(&host.app(TYP_MB), &["--ledger", "off"])["workers"].clone();
    let app = host.app(TYP_MB);
    let Outcome::Serves(s, n) = outcome(host.spawn(&app, &["--production"])) else {
        panic!("refused");
    };
    let e = s.wait_event("ledger_entry_dropped", |_| true);
    assert!(e.message().contains("counts for nothing"), "{e:?}");
    assert_eq!(Value::from(n), alone);
    s.wait_workers(n as usize);
    let kept = std::fs::read_to_string(host.ledger().join("gpu-ledger.json")).unwrap();
    assert_eq!(kept, junk);
}

/// `--ledger` is checked: an empty value is exit 2; a ledger directory that is missing and
/// cannot be made is a warning, and the server plans alone (nobody can be reserving there).
#[test]
fn a_ledger_that_cannot_be_used_is_a_warning_and_the_server_plans_alone() {
    let host = Host::new();
    let file = host.dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let app = host.app(TYP_MB);
    let under_a_file = file.join("ledger");
    let mut s = host.spawn(
        &app,
        &["--production", "--ledger", under_a_file.to_str().unwrap()],
    );
    let e = s.wait_event("ledger_unavailable", |_| true);
    assert!(e.message().contains("plans alone"), "{e:?}");
    drop(s);
    s = host.spawn(&app, &["plan", "--ledger", " "]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(2), "{}", s.log_text());
    assert!(s.log_text().contains("--ledger"), "{}", s.log_text());
}

/// The ledger's live entries: (pid as its server sees it, expiry in ms of CLOCK_BOOTTIME).
fn entries(host: &Host) -> Vec<(u64, u64)> {
    let now = common::host::boot_ms();
    let files = std::fs::read_dir(host.ledger()).unwrap().flatten();
    let names = files.filter(|f| f.file_name().to_string_lossy().starts_with("server-"));
    let read = names.filter_map(|f| std::fs::read_to_string(f.path()).ok());
    read.map(|text| serde_json::from_str::<Value>(&text).unwrap())
        .map(|e| {
            (
                e["pid"].as_u64().unwrap(),
                e["expires_boot_ms"].as_u64().unwrap(),
            )
        })
        .filter(|e| e.1 > now)
        .collect()
}

/// Servers in different pid namespaces (one started under `unshare --pid`, as in its own
/// container: its master is pid 1 there) share the ledger without expiring each other's
/// live entries: both are renewed past a whole lease.
#[test]
fn servers_in_different_pid_namespaces_keep_each_others_entries() {
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let lib = nvml_sim::mock_library().display().to_string();
    let env = host.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // `--setenv=NAME=VALUE` arguments (how `spawn_under` hands a launcher the environment)
    // become the environment of the `app` it executes.
    let script = r#"while [ $# -gt 0 ]; do case "$1" in --setenv=*) export "${1#--setenv=}"; shift;; *) break;; esac; done
exec "$@""#;
    let launcher = ["unshare", "--pid", "--fork", "sh", "-c", script, "sh"];
    let can = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status();
    if !can.is_ok_and(|st| st.success()) {
        skip(
            "ledger::servers_in_different_pid_namespaces_keep_each_others_entries",
            "this machine does not let the test unshare a pid namespace",
        );
        return;
    }
    let args = host.args(&lib, &["--production", "--port", "0"]);
    let inside = Server::spawn_under(&launcher, &a, &args, &env);
    let n_inside = inside
        .wait_event("listening", |_| true)
        .u64("workers")
        .unwrap();
    inside.wait_workers(n_inside as usize);
    let (outside, n_outside) = host.serving(&b, &[]);
    let pids: Vec<u64> = entries(&host).iter().map(|e| e.0).collect();
    assert!(
        pids.contains(&1),
        "the contained master is pid 1 in its namespace: {pids:?}"
    );
    // Both entries are renewed past a whole lease: renewed after the moment the first
    // lease seen now would have run out.
    let first_expiry = entries(&host).iter().map(|e| e.1).max().unwrap();
    let lease_ms = 15_000;
    let renewed = outside.poll("both entries renewed past a lease", || {
        let e = entries(&host);
        (e.len() == 2 && e.iter().all(|x| x.1 > first_expiry + lease_ms)).then_some(e)
    });
    assert_eq!(renewed.len(), 2);
    assert_eq!(host.reserved(), (n_inside + n_outside) * TYP_MB);
}

/// A server that planned fewer workers because a neighbour held the memory grows into it
/// once the neighbour gives it back: TTIN is refused while the neighbour's reservation
/// stands, and takes the room once the neighbour stopped.
#[test]
fn a_server_grows_into_the_room_a_neighbour_gave_back() {
    let host = Host::new();
    let (a, b) = (host.app(TYP_MB), host.app(TYP_MB));
    let (first, _) = host.serving(&a, &[]);
    let (second, n_second) = host.serving(&b, &[]);
    second.signal(libc::SIGTTIN);
    let refused = second.wait_event("ttin_refused", |_| true);
    assert!(refused.message().contains("fill"), "{refused:?}");
    first.signal(libc::SIGTERM);
    let mut first = first;
    first.wait_exit(PATIENCE);
    second.signal(libc::SIGTTIN);
    let grown = second.wait_event("ledger_grown", |_| true);
    assert_eq!(grown.u64("gpu"), Some(0), "{grown:?}");
    second.wait_workers(n_second as usize + 1);
    let grown = second.poll("the grown reservation", || {
        let r = host.reserved();
        (r == (n_second + 1) * TYP_MB).then_some(r)
    });
    assert_eq!(grown, (n_second + 1) * TYP_MB);
}

/// "MPS: per-client limits follow the reservation": under MPS each worker's
/// per-client limit is what the ledger reserves for it (the figure the plan fitted workers
/// by, 4000 MB here — not the GPU's usable memory ÷ the workers that fit, 36,364 ÷ 9 =
/// 4040, which left 40 MB per worker unreserved); a worker started by TTIN gets the same;
/// once a neighbour's reservation has taken the room, TTIN starts none (the plan, made
/// before the neighbour came, had room for nine); and the limits of the live workers never
/// sum above the server's reservation, nor the reservations above the GPU's share.
#[test]
fn under_mps_each_workers_limit_is_what_the_ledger_reserves_for_it() {
    let (_daemon, host) = Host::under_mps();
    let shared = A100_SHARE_MB;
    let (a, b) = (host.app(TYP_MB), host.app(12_000));
    let (mine, n) = host.serving(&a, &["--workers", "2"]);
    assert_eq!(n, 2);
    let limits = mps_limits(&mine.wait_workers(2));
    assert_eq!(
        limits,
        vec![TYP_MB; 2],
        "each worker's limit is the figure reserved"
    );
    assert_eq!(host.reserved(), limits.iter().sum::<u64>());

    // TTIN: the third worker gets the same limit, and the reservation follows.
    mine.signal(libc::SIGTTIN);
    let limits = mps_limits(&mine.wait_workers(3));
    assert_eq!(limits, vec![TYP_MB; 3]);
    mine.poll("the reservation for three workers", || {
        (host.reserved_by(mine.pid()) == 3 * TYP_MB).then_some(())
    });

    // A neighbour takes what is left: 36,864 − 12,000 hold two of its 12,000 MB workers.
    let (neighbour, n_neighbour) = host.serving(&b, &[]);
    assert_eq!(n_neighbour, 2);
    let theirs = mps_limits(&neighbour.wait_workers(2));
    assert_eq!(theirs, vec![12_000; 2]);
    assert_eq!(
        host.reserved_by(neighbour.pid()),
        theirs.iter().sum::<u64>()
    );
    assert!(
        host.reserved() <= shared,
        "{:?} > {shared}",
        host.reservations()
    );

    // 864 MB are left: TTIN starts no fourth worker, said as the ledger's refusal.
    mine.signal(libc::SIGTTIN);
    let refused = mine.wait_event("ttin_refused", |e| e.message().contains("ledger"));
    assert_eq!(
        refused.u64("room_mb"),
        Some(shared - 3 * TYP_MB - 24_000),
        "{refused:?}"
    );
    let live = mps_limits(&worker_pids(mine.pid()));
    assert_eq!(live.len(), 3, "no worker started beyond the room");
    let ours = host.reserved_by(mine.pid());
    assert!(live.iter().sum::<u64>() <= ours, "{live:?} > {ours}");
    assert!(
        host.reserved() <= shared,
        "{:?} > {shared}",
        host.reservations()
    );
}

/// `app plan` shows, on the GPU's line, what the other servers reserved and what
/// of the GPU's share is left; its plan takes no more (`free` at most that), and `--json`
/// says the same in `ledger_mb`. With `--ledger off` it shows no ledger.
#[test]
fn app_plan_shows_the_other_servers_reservations_and_what_is_left() {
    let host = Host::new();
    let shared = A100_SHARE_MB;
    let (neighbour, n) = host.serving(&host.app(TYP_MB), &["--workers", "3"]);
    assert_eq!(n, 3);
    let theirs = host.reserved_by(neighbour.pid());
    assert_eq!(theirs, 3 * TYP_MB);
    let app = host.app(TYP_MB);
    let mut s = host.spawn(&app, &["plan"]);
    assert_eq!(s.wait_exit(PATIENCE).code(), Some(0), "{}", s.log_text());
    let text = s.log_text();
    let left = shared - theirs;
    let want = format!(
        "(ledger: other servers reserved {theirs} MB of the {shared} MB share, {left} MB left)"
    );
    assert!(text.contains(&want), "{want} in:\n{text}");
    assert!(text.contains(&format!("free {left} MB")), "{text}");
    let json = host.plan(&app, &[]);
    assert_eq!(
        json["gpus"][0]["ledger_mb"].as_u64(),
        Some(theirs),
        "{json:#}"
    );
    assert_eq!(json["gpus"][0]["free_mb"].as_u64(), Some(left), "{json:#}");
    let mut alone = host.spawn(&app, &["plan", "--ledger", "off"]);
    assert_eq!(alone.wait_exit(PATIENCE).code(), Some(0));
    assert!(
        !alone.log_text().contains("ledger:"),
        "{}",
        alone.log_text()
    );
}

/// A server that profiles its model (`--profile-memory on`) reserves its estimate and lets
/// the ledger's lock go before it profiles, so that its profiling — minutes for a large
/// model — never holds another server's start or a serving master: its first
/// `ledger_reserved` comes before its `memory_profiling`, and the lock is free while it
/// profiles; the measured figure is written afterwards.
#[test]
fn a_server_profiling_its_model_holds_no_lock_and_is_reserved_meanwhile() {
    let host = Host::new();
    let app = host.app(TYP_MB);
    let s = host.spawn(&app, &["--production", "--profile-memory", "on"]);
    let (at, _) = s.wait_event_after(0, "memory_profiling", |_| true);
    let lock = std::fs::File::open(host.ledger().join("gpu-ledger.lock")).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    let free = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    // SAFETY: as above.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_UN) };
    let events = s.events();
    let first = events.iter().position(|e| e.name == "ledger_reserved");
    assert!(
        first.is_some_and(|r| r < at),
        "reserved before profiling (ledger_reserved at {first:?}, memory_profiling at {at}):\n{}",
        s.log_text()
    );
    assert_eq!(free, 0, "the lock was held while the server profiled");
    let n = s.wait_event("listening", |_| true).u64("workers").unwrap();
    s.wait_workers(n as usize);
    assert_eq!(host.reserved_by(s.pid()), n * TYP_MB);
}
