//! `.pt2` files as untrusted input, served by the real `app`: a package whose library entry
//! climbs out of its folder (`../`) is refused at start naming the entry, and nothing
//! outside is mapped; zip bombs (a program JSON padded to 1 GiB, a package with a 1 GiB
//! `.bin`, each in a file of about 1 MB) are refused at start naming the record and its
//! size, quickly and without the server growing to the record's size; a package with 2,000
//! or 20,000 more entries loads with one archive reader for its check and unpack, and one
//! with more entries than a model file may hold is refused naming the count.

mod aoti_common;
mod common;

use std::path::Path;

use aoti_common::{hostile, mlp};
use common::exported::*;
use common::*;

const DECL: &str = r#""inputs": [{"name": "input__0", "datatype": "FP32", "shape": [-1, 4]}], "max_batch_size": 4"#;

/// A server of `model` (production, one worker) that must exit 3 at start (within
/// [`PATIENCE`]): run under `tests/support/peak_rss.py`, so that the largest resident set
/// of its processes is known. Returns that peak in MB.
fn refused_at_start(model: &str, decl: &str, want: &[&str]) -> u64 {
    let app = App::new(model, decl);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/peak_rss.py");
    let launcher = [python(), script.display().to_string()];
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let args = ["--port", "0", "--production", "--workers", "1"];
    let mut s = Server::spawn_under(&launcher, &app, &args, &[]);
    let st = s.wait_exit(PATIENCE);
    let log = s.log_text();
    assert_eq!(st.code(), Some(3), "{model}: {log}");
    for w in want {
        assert!(log.contains(w), "{model}: no {w:?} in\n{log}");
    }
    let peak = log
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["peak_rss_kb"].as_u64())
        .unwrap_or_else(|| panic!("no peak in\n{log}"));
    peak >> 10
}

/// An entry `data/aotinductor/model/../../…/<dir>/outside.wrapper.so` (a real library
/// placed there too) is refused naming the entry: the worker never maps a library from
/// outside the folder it unpacked into.
#[test]
fn a_package_naming_a_library_outside_itself_is_refused_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let slip = dir.path().join("slip");
    let out = dir.path().join("outside.pt2");
    let entry = hostile(
        "outside",
        Path::new(&mlp()),
        &out,
        Some(slip.to_str().unwrap()),
    );
    assert!(slip.join("outside.wrapper.so").is_file());
    let want = format!("its record {entry} names a path outside the package's folder");
    refused(out.to_str().unwrap(), DECL, &[&want]);
}

/// A 1 GiB program JSON in a file of about 1 MB: refused at start naming the record and
/// its size, and no process of the server grows anywhere near the record's size (a
/// template or worker refusing it stays near 370 MB; reading it took them past 3 GB).
#[test]
fn a_program_json_zip_bomb_is_refused_at_start_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.pt2");
    let entry = hostile("bomb_json", &fixtures().join("mlp.pt2"), &bomb, None);
    assert!(std::fs::metadata(&bomb).unwrap().len() < 2 << 20);
    let want = format!("its record {entry} unpacks to 1073741824 bytes, more than");
    let peak_mb = refused_at_start(bomb.to_str().unwrap(), MLP_INPUT_DECL, &[&want]);
    assert!(
        peak_mb < 900,
        "a process of the server reached {peak_mb} MB"
    );
}

/// A package with a 1 GiB weights file in about 1.4 MB: refused at start naming it, with
/// the same bounds.
#[test]
fn a_package_zip_bomb_is_refused_at_start_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.pt2");
    let entry = hostile("bomb_bin", Path::new(&mlp()), &bomb, None);
    assert!(std::fs::metadata(&bomb).unwrap().len() < 3 << 20);
    let want = format!("its record {entry} unpacks to 1073741824 bytes, more than");
    let peak_mb = refused_at_start(bomb.to_str().unwrap(), DECL, &[&want]);
    assert!(
        peak_mb < 900,
        "a process of the server reached {peak_mb} MB"
    );
}

/// The package's `aoti_unpacked` event, from the process that loaded it.
fn unpacked(s: &Server) -> Event {
    s.poll("the package's aoti_unpacked event", || {
        s.all_events()
            .into_iter()
            .find(|e| e.name == "aoti_unpacked")
    })
}

/// 2,000 and 20,000 more entries: each package is checked and unpacked with one archive
/// reader (the event counts them), every entry unpacked, and the server answers (20,000
/// load in about 6 s here, the time of making 20,000 files).
#[test]
fn packages_with_many_entries_load_with_one_archive_reader() {
    let dir = tempfile::tempdir().unwrap();
    for n in [2_000, 20_000] {
        let many = dir.path().join(format!("many{n}.pt2"));
        hostile("many", Path::new(&mlp()), &many, Some(&n.to_string()));
        let app = App::new(many.to_str().unwrap(), DECL);
        let s = Server::start(&app, &["--production", "--workers", "1"]);
        s.wait_workers(1);
        let e = unpacked(&s);
        assert_eq!(e.u64("archive_readers"), Some(1), "{n}: {e:?}");
        assert!(e.u64("files").unwrap() > n, "{n}: {e:?}");
        let r = s.post("/", MLP_INPUT);
        assert_eq!(r.status, 200, "{n}: {r:?}");
    }
}

/// More entries than a model file may hold: refused at start naming the count, before any
/// is read.
#[test]
fn a_package_with_too_many_entries_is_refused_naming_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many.pt2");
    hostile("many", Path::new(&mlp()), &many, Some("50000"));
    refused(
        many.to_str().unwrap(),
        DECL,
        &["records, more than the 50000 a model file may hold"],
    );
}
