//! `vendor/patches/` holds our changes to h2 0.4.20 as patches ready to send upstream, each
//! with its regression test (the files of this folder's `tests/`). The vendored crate must be
//! exactly h2 0.4.20 with those patches: undone in reverse order (`git apply -R`) over a copy
//! of `vendor/h2/src` and of these tests, every patch must apply cleanly, and what remains
//! must hold none of the changes. A change made to `vendor/h2` without its patch, or a patch
//! edited without the code, fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn vendor() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn the_vendored_h2_is_h2_0_4_20_with_our_patches_and_nothing_else() {
    let work = std::env::temp_dir().join(format!("h2-patches-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    copy_tree(&vendor().join("h2/src"), &work.join("src"));
    // The regression tests, where the patches put them in h2's own tree.
    let tests = work.join("tests");
    copy_tree(&vendor().join("h2-regress/tests/raw"), &tests.join("raw"));
    for t in ["goaway_window_update.rs", "control_frame_budget.rs"] {
        std::fs::copy(vendor().join("h2-regress/tests").join(t), tests.join(t)).unwrap();
    }
    let mut patches: Vec<PathBuf> = std::fs::read_dir(vendor().join("patches"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    patches.sort();
    assert_eq!(patches.len(), 3, "vendor/patches: {patches:?}");
    for patch in patches.iter().rev() {
        let out = Command::new("git")
            .args(["apply", "-R", "--whitespace=nowarn"])
            .arg(patch)
            .current_dir(&work)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "{} does not undo cleanly over vendor/h2 and the regression tests: the vendored \
             code and its patch differ\n{}",
            patch.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut left = Vec::new();
    files_under(&tests, &mut left);
    assert!(left.is_empty(), "tests no patch adds: {left:?}");
    let mut sources = Vec::new();
    files_under(&work.join("src"), &mut sources);
    for file in sources {
        let text = std::fs::read_to_string(&file).unwrap();
        for change in [
            "control_budget",
            "ignoring WINDOW_UPDATE",
            "data_frames_sent",
            "tracing::debug!(\"recv PING ack that we never sent",
        ] {
            assert!(
                !text.contains(change),
                "{} still holds {change:?} with every patch undone",
                file.display()
            );
        }
    }
    std::fs::remove_dir_all(&work).unwrap();
}
