//! Libraries of TorchScript operators (the metadata's `op_libraries`): a model that calls an
//! operator libtorch does not define (`torchvision::nms`, a user's `my_ops::fused`) loads
//! only once the shared library that registers it is in the process. Each is opened with
//! `dlopen(RTLD_NOW | RTLD_GLOBAL)` before the model, in the order given, and stays loaded
//! for the life of the process (its static initialisers register the operators with
//! libtorch; closing it would unregister them under a loaded model). The template loads
//! them before it loads the model, so forked workers inherit them.
//!
//! A library's own dependencies are found as the dynamic loader finds them, and also beside
//! libtorch: a dependency it cannot find that libtorch's folder holds (torchvision's
//! `_C.so` from PyPI needs `libtorch_python.so` and carries a build machine's rpath) is
//! loaded from there first. A library built for Python — that `libtorch_python.so` takes
//! its symbols from the Python interpreter — needs `libpython3.X.so.1.0` listed before it;
//! the error says so.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::model::LoadError;

/// Opens every library of `paths`, in order; the first that fails is the error.
pub fn load_all(paths: &[impl AsRef<Path>], model: &str) -> Result<(), LoadError> {
    for (i, path) in paths.iter().enumerate() {
        open(path.as_ref()).map_err(|reason| LoadError::Model {
            path: model.to_string(),
            reason: format!(
                "cannot load operator library {} (op_libraries[{i}] in the metadata): {reason}",
                path.as_ref().display()
            ),
        })?;
        tracing::debug!(library = %path.as_ref().display(), "operator library loaded");
    }
    Ok(())
}

fn open(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("no such file".into()),
        Err(e) => {
            return Err(format!(
                "{e} (it must be readable by the user the server runs as)"
            ))
        }
        Ok(m) if !m.is_file() => return Err("not a regular file".into()),
        Ok(_) => {}
    }
    let mut tried = Vec::new();
    loop {
        let err = match dlopen(path) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        // A dependency the loader cannot find, that libtorch's folder holds: load it from
        // there (once), then try again.
        let beside = missing_dependency(&err)
            .zip(torch_lib_dir())
            .map(|(name, dir)| dir.join(name))
            .filter(|p| p.is_file() && !tried.contains(p));
        match beside {
            Some(dep) => {
                dlopen(&dep).map_err(with_hint)?;
                tried.push(dep);
            }
            None => return Err(with_hint(err)),
        }
    }
}

/// The library a "cannot open shared object file" error names.
fn missing_dependency(err: &str) -> Option<&str> {
    let (head, _) = err.split_once(": cannot open shared object file")?;
    let name = head.rsplit(": ").next().unwrap_or(head).trim();
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// The folder this process loaded libtorch from (`/proc/self/maps`).
fn torch_lib_dir() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    // address perms offset dev inode path (the path may hold spaces)
    maps.lines()
        .filter_map(|l| l.splitn(6, ' ').nth(5).map(str::trim_start))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`, never closed; dlerror's message on failure.
fn dlopen(path: &Path) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "the path holds a NUL byte")?;
    // SAFETY: `c` is a valid NUL-terminated path for the call; the handle is deliberately
    // never closed (module docs). dlopen runs the library's initialisers, which is the point.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if !handle.is_null() {
        return Ok(());
    }
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let err = unsafe { libc::dlerror() };
    let msg = if err.is_null() {
        "dlopen failed".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned()
    };
    Err(msg)
}

/// dlopen's message, with what to do when the library wants Python's symbols.
fn with_hint(msg: String) -> String {
    if msg.contains("undefined symbol: Py") || msg.contains("undefined symbol: _Py") {
        format!(
            "{msg}; this library was built for Python (it needs the interpreter's symbols, e.g. torchvision's _C.so links libtorch_python.so): list Python's shared library (libpython3.X.so.1.0, the Python its wheel was made for) before it in op_libraries"
        )
    } else {
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_broken_libraries_are_named_with_their_place() {
        let e = load_all(&["/nonexistent/libops.so"], "m.pt")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot load operator library /nonexistent/libops.so (op_libraries[0] in the metadata): no such file"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.so");
        std::fs::write(&junk, b"not an ELF file").unwrap();
        let e = load_all(&[&junk], "m.pt").unwrap_err().to_string();
        assert!(
            e.contains("op_libraries[0]") && e.contains("junk.so"),
            "{e}"
        );
        assert!(load_all(&[] as &[&Path], "m.pt").is_ok());
    }

    #[test]
    fn dependencies_beside_libtorch_are_recognised() {
        assert_eq!(
            missing_dependency("/v/torchvision/_C.so: libtorch_python.so: cannot open shared object file: No such file or directory"),
            Some("libtorch_python.so")
        );
        assert_eq!(missing_dependency("/x.so: invalid ELF header"), None);
        // This worker test binary links libtorch: its folder is found.
        let dir = torch_lib_dir().expect("libtorch is mapped");
        assert!(dir.join("libtorch_cpu.so").is_file(), "{}", dir.display());
    }

    #[test]
    fn a_library_wanting_python_says_to_list_libpython_first() {
        let m = with_hint("/x/libtorch_python.so: undefined symbol: PyInstanceMethod_Type".into());
        assert!(
            m.contains("list Python's shared library (libpython3.X.so.1.0"),
            "{m}"
        );
        assert_eq!(with_hint("file too short".into()), "file too short");
    }
}
