//! A `.pt2` file's records, read with libtorch's own archive reader (through `shim.cpp`),
//! and what they say it is: an ExportedProgram archive (`torch.export.save`: the program as
//! `models/<name>.json`, its weights under `data/`), or an AOTInductor package
//! (`torch._inductor.aoti_compile_and_package`: compiled code under `data/aotinductor/`).

use std::ffi::{c_char, c_int, c_void, CString};

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn vf_archive_records(
            path: *const c_char,
            out: *mut *mut c_char,
            len: *mut usize,
        ) -> c_int;
        pub fn vf_archive_read(
            path: *const c_char,
            record: *const c_char,
            out: *mut *mut c_char,
            len: *mut usize,
        ) -> c_int;
        pub fn vf_export_free_bytes(bytes: *mut c_void);
    }
}

/// What a `.pt2` file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A `torch.export.save` archive; its one program is `models/<name>.json`.
    Program { name: String },
    /// An AOTInductor package (compiled code: `aoti.rs`).
    Aoti,
}

/// The archive's record names (without its top folder), e.g. `models/model.json`.
pub fn records(path: &str) -> Result<Vec<String>, String> {
    let bytes = call(|out, len| {
        let p = c_path(path)?;
        // SAFETY: `p` is a NUL-terminated string alive for the call; `out` and `len` are
        // valid out-pointers; the shim catches every C++ exception.
        Ok(unsafe { ffi::vf_archive_records(p.as_ptr(), out, len) })
    })?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(text.lines().map(str::to_string).collect())
}

/// One record of the archive, whole.
pub fn read(path: &str, record: &str) -> Result<Vec<u8>, String> {
    call(|out, len| {
        let p = c_path(path)?;
        let r = CString::new(record).map_err(|_| "a record name with a NUL byte".to_string())?;
        // SAFETY: both strings are NUL-terminated and alive for the call; `out` and `len`
        // are valid out-pointers; the shim catches every C++ exception.
        Ok(unsafe { ffi::vf_archive_read(p.as_ptr(), r.as_ptr(), out, len) })
    })
}

/// What the archive at `path` is, from its records; an error for a file that is neither.
pub fn kind(path: &str) -> Result<Kind, String> {
    let names = records(path)?;
    kind_of(&names)
}

fn kind_of(names: &[String]) -> Result<Kind, String> {
    if names.iter().any(|n| n.starts_with("data/aotinductor/")) {
        return Ok(Kind::Aoti);
    }
    let programs: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("models/")?.strip_suffix(".json"))
        .filter(|n| !n.contains('/'))
        .collect();
    match programs[..] {
        [name] => Ok(Kind::Program { name: name.into() }),
        [] => Err(
            "a zip archive, but neither a torch.export program (no models/<name>.json) nor an AOTInductor package (no data/aotinductor/): save the model with torch.export.save(torch.export.export(model, example_inputs), path)"
                .into(),
        ),
        _ => Err(format!(
            "the archive holds {} programs ({}); vramfork serves one: save one ExportedProgram per file",
            programs.len(),
            programs.join(", ")
        )),
    }
}

fn c_path(path: &str) -> Result<CString, String> {
    CString::new(path).map_err(|_| "a path with a NUL byte".to_string())
}

/// Calls a shim function that hands back a malloc'ed buffer, and copies it out.
fn call(
    f: impl FnOnce(*mut *mut c_char, *mut usize) -> Result<c_int, String>,
) -> Result<Vec<u8>, String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    let mut len = 0usize;
    let rc = f(&mut out, &mut len)?;
    if rc != 0 {
        return Err(super::last_error());
    }
    // SAFETY: on success the shim set `out` to a malloc'ed buffer of `len` bytes (plus a NUL).
    let bytes = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), len) }.to_vec();
    // SAFETY: `out` came from the shim's malloc and is freed once, here.
    unsafe { ffi::vf_export_free_bytes(out.cast::<c_void>()) };
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_archive_is_told_by_its_records() {
        let program = names(&[
            "data/weights/weight_0",
            "models/model.json",
            "archive_format",
        ]);
        assert_eq!(
            kind_of(&program),
            Ok(Kind::Program {
                name: "model".into()
            })
        );
        let aoti = names(&["data/aotinductor/model/x.wrapper.so", "archive_format"]);
        assert_eq!(kind_of(&aoti), Ok(Kind::Aoti));
        let neither = kind_of(&names(&["data.pkl", "code/__torch__.py"])).unwrap_err();
        assert!(neither.contains("torch.export.save"), "{neither}");
        let two = kind_of(&names(&["models/a.json", "models/b.json"])).unwrap_err();
        assert!(two.contains("holds 2 programs (a, b)"), "{two}");
    }
}
