//! AOTInductor packages for the tests of `tests/aoti*.rs`: compiled here with the torch
//! venv's Python and cached, and hostile copies of them made at test time
//! (`tests/support/make_hostile_pt2.py`).

// Each test file uses what it needs of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use crate::common::python_json;

/// An AOTInductor package of `module` (`mlp`, `dict`, `mlp256`) compiled with `threads` (`dynamic`:
/// TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1; `default`: a team of 4 fixed in the kernels), made
/// once (about a minute) and cached in the build's temporary directory, keyed by the
/// scripts that make it.
pub fn package(module: &str, threads: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in [
        "tests/support/make_aoti_package.py",
        "scripts/make_pt2_models.py",
    ] {
        std::fs::read(root.join(f)).unwrap().hash(&mut h);
    }
    let cached = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("aoti-{module}-{threads}-{:x}.pt2", h.finish()));
    if !cached.exists() {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let fresh = dir.path().join("package.pt2");
        python_json(
            "make_aoti_package.py",
            &[fresh.to_str().unwrap(), module, threads],
            b"",
        );
        // Another test may have made it meanwhile: the rename replaces it atomically.
        std::fs::rename(&fresh, &cached).unwrap();
    }
    cached
}

/// mlp.pt's module as a package (dynamic threads: served).
pub fn mlp() -> String {
    package("mlp", "dynamic").to_str().unwrap().to_string()
}

/// A hostile copy of the archive `src` (`tests/support/make_hostile_pt2.py`'s `kind`, with
/// its argument if any) at `dst`; the name of the entry it added or changed.
pub fn hostile(kind: &str, src: &Path, dst: &Path, arg: Option<&str>) -> String {
    let mut args = vec![kind, src.to_str().unwrap(), dst.to_str().unwrap()];
    args.extend(arg);
    let made = python_json("make_hostile_pt2.py", &args, b"");
    made["entry"].as_str().unwrap().to_string()
}
