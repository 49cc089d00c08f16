//! `torch.export` archives (`.pt2`), through a small C++ shim (`shim.cpp`) over what tch
//! does not reach in libtorch: the archive's records, the program's signature, and the
//! Native Runtime that runs an ExportedProgram.
//!
//! | file | owns |
//! |---|---|
//! | `archive.rs` | the archive opened once: its records and their sizes, bounded before any is read; what kind of `.pt2` it is |
//! | `signature.rs` | the program's inputs, their bounds, and the checks made with them |
//! | `program.rs` | a program loaded with the Native Runtime, its passes |
//! | `package.rs` | an AOTInductor package's records, and the checks made with them |
//! | `aoti.rs` | an AOTInductor package unpacked, loaded and run |
//! | `placement.rs` | where the plan put the worker (CPU, a GPU and its compute capability) |
//! | `testzip.rs` | (tests) zip archives in the layout torch's reader opens |

pub mod aoti;
pub mod archive;
mod package;
mod placement;
mod program;
mod signature;
#[cfg(test)]
mod testzip;

use std::ffi::{c_char, CStr};

pub use aoti::Package;
pub use placement::Placement;
pub use program::{PassError, Program};
pub use signature::Signature;

extern "C" {
    fn vf_export_last_error(buf: *mut c_char, len: usize);
}

/// This thread's last shim error message.
fn last_error() -> String {
    let mut buf = [0 as c_char; 2048];
    // SAFETY: the buffer is valid for `buf.len()` bytes; the shim writes at most `len - 1`
    // bytes plus a NUL terminator and never throws.
    unsafe { vf_export_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: the shim always NUL-terminates inside the buffer (see above).
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) };
    msg.to_string_lossy().into_owned()
}

/// Opens the archive at `path`: its program's name and signature (not loaded yet).
pub fn open(path: &str) -> Result<(String, Signature), String> {
    let archive = archive::Archive::open(path)?;
    let name = match archive.kind()? {
        archive::Kind::Program { name } => name,
        archive::Kind::Aoti => {
            return Err("an AOTInductor package, not an ExportedProgram archive".into())
        }
    };
    let json = archive.read(&format!("models/{name}.json"))?;
    let signature = Signature::parse(&json)?;
    Ok((name, signature))
}
