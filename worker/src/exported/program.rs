//! One ExportedProgram loaded with libtorch's Native Runtime (`torch::nativert::ModelRunnerHandle`,
//! through `worker/shim/export.cpp`): loaded from its archive, run on a list of tensors after
//! [`Signature::check`], its outputs named by its output spec ([`Outputs`]: a dict's keys),
//! freed on drop.

use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;

use tch::{IValue, Tensor};

use super::outputs::{unknown_type, Outputs};
use super::Signature;

/// The pytree types libtorch 2.11's Native Runtime loads in an output spec (its registry in
/// `torch/nativert/detail/ITree.cpp`); any other fails its load.
const RUNTIME_TYPES: [&str; 6] = [
    "builtins.tuple",
    "collections.namedtuple",
    "builtins.list",
    "torch.fx.immutable_collections.immutable_list",
    "builtins.dict",
    "torch.fx.immutable_collections.immutable_dict",
];

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn vf_export_load(
            path: *const c_char,
            name: *const c_char,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn vf_export_free(program: *mut c_void);
        pub fn vf_export_run(
            program: *mut c_void,
            inputs: *const *const c_void,
            n: usize,
            outputs: *mut *mut *mut c_void,
            n_out: *mut usize,
            single: *mut c_int,
        ) -> c_int;
        pub fn vf_export_free_bytes(bytes: *mut c_void);
    }
}

/// Why a pass did not run or failed.
#[derive(Debug, Clone, PartialEq)]
pub enum PassError {
    /// The request's tensors are not what the program takes (the request's fault: 400).
    Input(String),
    /// The runtime raised (libtorch's message).
    Runtime(String),
    /// An AOTInductor package failed on CUDA: the runner's own text (which says nothing of
    /// the cause: the CUDA error went to stderr), and whether the caching allocator counted
    /// an allocation that failed during the pass.
    Device {
        message: String,
        out_of_memory: bool,
    },
}

/// A loaded program, its inputs' signature and what its outputs are.
pub struct Program {
    handle: NonNull<c_void>,
    pub signature: Signature,
    outputs: Outputs,
}

// SAFETY: the handle is owned by this value alone; it moves to the model thread (from the
// template, or from where it was loaded) as a tch `CModule` does.
unsafe impl Send for Program {}
// SAFETY: passes are never concurrent: the worker runs them on the model thread, or under
// `runner::Inline`'s pass lock on the event loop, one at a time (as with a `CModule`).
unsafe impl Sync for Program {}

impl Program {
    /// Loads the program `name` of the archive at `path`, whose output spec is `out_spec`
    /// (`None`: none recorded, the outputs numbered); a spec the Native Runtime cannot load
    /// is refused first, naming the way out ([`runtime_refusal`]).
    pub fn load(
        path: &str,
        name: &str,
        signature: Signature,
        out_spec: Option<&str>,
    ) -> Result<Program, String> {
        if let Some(refusal) = out_spec.and_then(runtime_refusal) {
            return Err(refusal);
        }
        let outputs = out_spec.map(Outputs::read_logged).unwrap_or_default();
        let p = CString::new(path).map_err(|_| "a path with a NUL byte".to_string())?;
        let n = CString::new(name).map_err(|_| "a name with a NUL byte".to_string())?;
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: both strings are NUL-terminated and alive for the call; `out` is a valid
        // out-pointer; the shim catches every C++ exception.
        let rc = unsafe { ffi::vf_export_load(p.as_ptr(), n.as_ptr(), &mut out) };
        match NonNull::new(out) {
            Some(handle) if rc == 0 => Ok(Program {
                handle,
                signature,
                outputs,
            }),
            _ => Err(super::last_error()),
        }
    }

    /// One pass: the tensors checked against the signature, then run; a tensor output as
    /// itself, a dict's as a dict of them (named by the output spec), others as a tuple.
    pub fn run(&self, args: &[Tensor]) -> Result<IValue, PassError> {
        self.signature.check(args).map_err(PassError::Input)?;
        let inputs: Vec<*const c_void> = args.iter().map(|t| t.as_ptr().cast()).collect();
        let mut outputs: *mut *mut c_void = std::ptr::null_mut();
        let (mut n_out, mut single) = (0usize, 0 as c_int);
        // SAFETY: `handle` is a live program; `inputs` holds `args.len()` pointers to
        // tensors (`at::Tensor*`, as tch holds them) borrowed for the call; the out-pointers
        // are valid; the shim catches every C++ exception.
        let rc = unsafe {
            ffi::vf_export_run(
                self.handle.as_ptr(),
                inputs.as_ptr(),
                inputs.len(),
                &mut outputs,
                &mut n_out,
                &mut single,
            )
        };
        if rc != 0 {
            return Err(PassError::Runtime(super::last_error()));
        }
        // SAFETY: on success `outputs` is a malloc'ed array of `n_out` owned `at::Tensor*`
        // (`new at::Tensor`), each taken over once by a tch `Tensor` (which deletes it).
        let tensors: Vec<Tensor> = (0..n_out)
            .map(|i| unsafe { Tensor::from_ptr((*outputs.add(i)).cast()) })
            .collect();
        // SAFETY: the array itself came from the shim's malloc and is freed once, here.
        unsafe { ffi::vf_export_free_bytes(outputs.cast()) };
        let outputs = match single {
            1 => &Outputs::Leaf,
            _ => &self.outputs,
        };
        Ok(outputs.assemble(tensors))
    }
}

/// Why the Native Runtime would fail to load a program of this output spec, as a refusal
/// that names the way out (`None`: it loads). torchvision's segmentation models return an
/// `OrderedDict`, which torch 2.11's Native Runtime does not know ("Unknown pytree node
/// type"), while a plain `dict` it does.
fn runtime_refusal(out_spec: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_str(out_spec).ok()?;
    let kind = unknown_type(&doc[1], &RUNTIME_TYPES)?;
    let dict = kind == "collections.OrderedDict";
    Some(format!(
        "its output is a {kind}{}, a type libtorch's Native Runtime cannot load in an output (it loads tensors, and tuples, lists and dicts of them): {}",
        if dict { " (as torchvision's segmentation models return)" } else { "" },
        if dict {
            "export a module that returns a plain dict of the model's outputs (forward returning `dict(self.model(x))`), whose keys then name the outputs; or compile it into an AOTInductor package, which is served with its keys as they are"
        } else {
            "export a module that returns a tensor, or a tuple or dict of tensors"
        }
    ))
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from vf_export_load and is freed once, here.
        unsafe { ffi::vf_export_free(self.handle.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output spec the Native Runtime cannot load is refused before it tries, naming the
    /// way out; the types it loads pass.
    #[test]
    fn an_output_the_native_runtime_cannot_load_is_refused_naming_the_way_out() {
        let leaf = r#"{"type": null, "context": null, "children_spec": []}"#;
        let spec = |kind: &str| {
            format!(
                r#"[1, {{"type": "{kind}", "context": "[\"out\"]", "children_spec": [{leaf}]}}]"#
            )
        };
        let e = runtime_refusal(&spec("collections.OrderedDict")).unwrap();
        assert!(
            e.contains("torchvision's segmentation models") && e.contains("dict(self.model(x))"),
            "{e}"
        );
        let e = runtime_refusal(&spec("collections.defaultdict")).unwrap();
        assert!(e.contains("a tuple or dict of tensors"), "{e}");
        assert_eq!(runtime_refusal(&spec("builtins.dict")), None);
        assert_eq!(runtime_refusal(&format!("[1, {leaf}]")), None);
        assert_eq!(runtime_refusal("not json"), None);
    }
}
