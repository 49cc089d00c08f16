use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

fn gpus(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(u, m)| (u.to_string(), *m)).collect()
}

fn domains() -> Domains {
    let d = |k: &str| Domain {
        key: k.into(),
        total_mb: 40_960,
    };
    [
        ("GPU-1".to_string(), d("GPU-1")),
        ("GPU-2".to_string(), d("GPU-2")),
    ]
    .into()
}

fn open(dir: &Path, app: &str, seat: Option<String>) -> Ledger {
    Ledger::open(dir, app, seat, true).unwrap().unwrap()
}

fn others(l: &Ledger) -> BTreeMap<String, Others> {
    l.others(&domains()).unwrap()
}

#[test]
fn each_server_sees_the_others_reservations_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        open(dir.path(), "a", None),
        open(dir.path(), "b", None),
        open(dir.path(), "c", None),
    );
    a.reserve(&gpus(&[("GPU-1", 3000), ("GPU-2", 1000)]))
        .unwrap();
    b.reserve(&gpus(&[("GPU-1", 2000)])).unwrap();
    let seen = others(&c);
    assert_eq!(
        seen["GPU-1"],
        Others {
            mb: 5000,
            servers: 2
        }
    );
    assert_eq!(
        seen["GPU-2"],
        Others {
            mb: 1000,
            servers: 1
        }
    );
    assert_eq!(others(&a)["GPU-1"].mb, 2000);
    // A reservation rewritten replaces the last one; one released is gone.
    a.reserve(&gpus(&[("GPU-1", 500)])).unwrap();
    assert_eq!(others(&c)["GPU-1"].mb, 2500);
    b.release().unwrap();
    assert_eq!(
        others(&c)["GPU-1"],
        Others {
            mb: 500,
            servers: 1
        }
    );
}

#[test]
fn an_expired_or_unbelievable_reservation_counts_for_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(dir.path(), "a", None), open(dir.path(), "b", None));
    a.reserve(&gpus(&[("GPU-1", 3000)])).unwrap();
    let path = dir.path().join(a.own_name());
    let mut e: Entry = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (expires, mb) in [(1, 3000), (u64::MAX, 3000), (e.expires_boot_ms, u64::MAX)] {
        e.expires_boot_ms = expires;
        e.gpus = gpus(&[("GPU-1", mb)]);
        std::fs::write(&path, serde_json::to_vec(&e).unwrap()).unwrap();
        assert!(others(&b).is_empty(), "{e:?}");
    }
}

#[test]
fn a_file_that_is_no_entry_is_dropped_and_the_others_still_count() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), "a", None);
    a.reserve(&gpus(&[("GPU-1", 7)])).unwrap();
    let big = vec![b' '; (MAX_ENTRY_BYTES + 1) as usize];
    for junk in [
        &b""[..],
        b"{\"version\": 2, \"pid\"",
        b"[1, 2]",
        b"\x00\x01",
        &big,
    ] {
        std::fs::write(dir.path().join("server-junk.json"), junk).unwrap();
        std::fs::write(dir.path().join(OLD_NAME), junk).unwrap();
        let b = open(dir.path(), "b", None);
        assert_eq!(
            others(&b)["GPU-1"].mb,
            7,
            "{:?}",
            &junk[..junk.len().min(20)]
        );
    }
}

#[test]
fn a_server_started_again_at_its_seat_replaces_its_predecessors_entry() {
    let dir = tempfile::tempdir().unwrap();
    let seat = || Some("host 0.0.0.0:5000 /srv/app.json".to_string());
    let crashed = open(dir.path(), "a", seat());
    crashed.reserve(&gpus(&[("GPU-1", 3000)])).unwrap();
    let neighbour = open(dir.path(), "n", None);
    neighbour.reserve(&gpus(&[("GPU-1", 1000)])).unwrap();
    let again = open(dir.path(), "a", seat());
    assert_eq!(
        others(&again)["GPU-1"].mb,
        1000,
        "the predecessor is not another server"
    );
    again.reserve(&gpus(&[("GPU-1", 2000)])).unwrap();
    assert_eq!(others(&neighbour)["GPU-1"].mb, 2000);
    // Servers without a seat (port 0) never replace each other.
    let other = open(dir.path(), "x", None);
    assert_eq!(others(&other)["GPU-1"].mb, 3000);
}

#[test]
fn the_lock_is_exclusive_between_servers_and_only_tried() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(dir.path(), "a", None), open(dir.path(), "b", None));
    let held = a.lock(Duration::ZERO, |_| {}).unwrap();
    let busy = b.lock(Duration::from_millis(50), |_| {});
    assert!(matches!(busy, Err(NotTaken::Busy(_))), "{busy:?}");
    drop(held);
    assert!(
        b.lock(Duration::ZERO, |_| {}).is_ok(),
        "once the holder let go"
    );
}

/// What a local user may put in a shared directory under the ledger's names — a FIFO, a
/// link to a device or to a file elsewhere — is refused by name, at once, and nothing is
/// made through a link.
#[test]
fn fifos_links_and_devices_under_the_ledgers_names_are_refused_by_name() {
    for name in [LOCK_NAME, OLD_NAME, "server-x.json"] {
        for what in ["fifo", "link to /dev/zero", "dangling link"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
            let target = dir.path().join("elsewhere");
            match what {
                "fifo" => {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o666))
                        .unwrap()
                }
                "link to /dev/zero" => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
                _ => std::os::unix::fs::symlink(&target, &path).unwrap(),
            }
            let l = open(dir.path(), "a", None);
            let start = std::time::Instant::now();
            let e = if name == LOCK_NAME {
                l.lock(Duration::ZERO, |_| {}).unwrap_err().to_string()
            } else {
                l.others(&domains()).unwrap_err()
            };
            assert!(start.elapsed() < Duration::from_secs(1), "{name} {what}");
            let kind = if what == "fifo" {
                "a FIFO"
            } else {
                "a symbolic link"
            };
            assert!(e.contains(kind) && e.contains(name), "{name} {what}: {e}");
            assert!(!target.exists(), "{name} {what}: made through the link");
        }
    }
}

/// The directory is checked as sshd checks a user's files, and what a server makes gets
/// its mode whatever the umask.
#[test]
fn the_directory_and_files_are_checked_and_made_umask_proof() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: umask(2) has no preconditions (this test's files are its own).
    let old = unsafe { libc::umask(0) };
    let made = dir.path().join("made");
    let l = open(&made, "a", None);
    drop(l.lock(Duration::ZERO, |_| {}).unwrap());
    l.reserve(&gpus(&[("GPU-1", 1)])).unwrap();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&made) & 0o777, 0o770);
    assert_eq!(mode(&made.join(LOCK_NAME)), files::LOCK_MODE);
    assert_eq!(mode(&made.join(l.own_name())), files::ENTRY_MODE);
    // Writable by every user: only as a sticky directory.
    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Ledger::open(&made, "a", None, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("writable by every user"), "{e}");
    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(Ledger::open(&made, "a", None, true).is_ok());
    // Not a directory.
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let e = Ledger::open(&file, "a", None, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a directory"), "{e}");
    // Reading where there is none yet: nothing, nothing made.
    let none = dir.path().join("none");
    assert!(Ledger::open(&none, "a", None, false).unwrap().is_none());
    assert!(!none.exists());
}
