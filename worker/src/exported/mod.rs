//! `torch.export` archives (`.pt2`), through a small C++ shim (`worker/shim/export.cpp`) over what
//! tch does not reach in libtorch: the archive's records, the program's signature, and the Native
//! Runtime that runs an ExportedProgram.
//!
//! | file | owns |
//! |---|---|
//! | `archive.rs` | the archive opened once: its records and their sizes, bounded before any is read; what kind of `.pt2` it is |
//! | `signature.rs` | the program's inputs, their bounds, and the checks made with them |
//! | `program.rs` | a program loaded with the Native Runtime, its passes |
//! | `outputs.rs` | what a program's or package's flat outputs are, by its output spec: one tensor, numbered ones, a dict's named by its keys |
//! | `package.rs` | an AOTInductor package's records, and the checks made with them |
//! | `aoti.rs` | an AOTInductor package unpacked, loaded and run |
//! | `placement.rs` | where the plan put the worker (CPU, a GPU and its compute capability) |
//! | `testzip.rs` | (tests) zip archives in the layout torch's reader opens |

pub mod aoti;
pub mod archive;
mod outputs;
mod package;
mod placement;
mod program;
mod signature;
#[cfg(test)]
mod testzip;

pub use aoti::Package;
pub use placement::Placement;
pub use program::{PassError, Program};
pub use signature::Signature;

use crate::shim::last_error;

/// Opens the archive at `path`: its program's name, signature and output spec (the
/// serialized treespec `torch.export` recorded; not loaded yet).
pub fn open(path: &str) -> Result<(String, Signature, Option<String>), String> {
    let archive = archive::Archive::open(path)?;
    let name = match archive.kind()? {
        archive::Kind::Program { name } => name,
        archive::Kind::Aoti => {
            return Err("an AOTInductor package, not an ExportedProgram archive".into())
        }
    };
    let json = archive.read(&format!("models/{name}.json"))?;
    let signature = Signature::parse(&json)?;
    Ok((name, signature, out_spec(&json)))
}

/// A program's output spec: its JSON's first module call's `signature.out_spec`.
fn out_spec(json: &[u8]) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_slice(json).ok()?;
    let calls = &doc["graph_module"]["module_call_graph"];
    Some(calls[0]["signature"]["out_spec"].as_str()?.to_string())
}
