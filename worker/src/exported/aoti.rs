//! An AOTInductor package loaded and run (through `shim.cpp`, with the runner
//! `torch::inductor::AOTIModelPackageLoader` itself builds). The loader unpacks each package
//! into a fresh `/tmp/XXXXXX` of its own naming (torch 2.11 reads no `TMPDIR`), which a
//! killed process leaves behind; so the worker unpacks the model's files itself, into
//! `<server's unpack directory>/<pid>/` ([`vramfork::unpacked`]), loads the
//! compiled model from there, and removes the directory as soon as it is loaded (the
//! library stays mapped). The master removes `<pid>/` of a worker that died mid-load, and
//! every server's directory it finds of a dead server at start.
//!
//! Before the load, the package is checked ([`super::package`]): one model, compiled for
//! the device the plan put the worker on (on the CPU: an instruction set this CPU has; on a
//! GPU: kernels its compute capability runs, [`super::placement`]), its kernels' threads not
//! fixed at compile time, and its inputs read from the wrapper's generated checks.
//!
//! On a GPU the runner is the registry's `cuda` one, given the device string `cuda:0`
//! (`AOTIModelContainerRunnerCuda`, whose header takes "cuda" or "cuda:0"; what
//! `AOTIModelPackageLoader` builds for a `device_index` ≥ 0): the worker's one GPU is device 0
//! to it (`CUDA_VISIBLE_DEVICES` = its UUID). Inputs reach it on that device and outputs
//! leave it as for TorchScript (`runner::tensors::to_ivalue`, the encoders' copy to the CPU).

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use tch::{IValue, Tensor};

use super::package::{self, Contents};
use super::signature::Dim;
use super::{archive, PassError, Placement, Signature};

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn vf_aoti_load(
            so_path: *const c_char,
            device: *const c_char,
            bin_dir: *const c_char,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn vf_aoti_free(runner: *mut c_void);
        pub fn vf_aoti_call_spec(
            runner: *mut c_void,
            out: *mut *mut c_char,
            len: *mut usize,
        ) -> c_int;
        pub fn vf_aoti_run(
            runner: *mut c_void,
            inputs: *const *const c_void,
            n: usize,
            outputs: *mut *mut *mut c_void,
            n_out: *mut usize,
        ) -> c_int;
        pub fn vf_export_free_bytes(bytes: *mut c_void);
    }
}

/// A loaded package.
pub struct Package {
    handle: NonNull<c_void>,
    pub signature: Signature,
    /// The model returns one tensor (its output spec is a leaf), not a tuple.
    single: bool,
    /// Batches of fewer rows than the package's minimum are padded up to it (and the
    /// answers cut back): only with batching on, whose requests are independent rows.
    pad_rows: Option<i64>,
}

// SAFETY: as `Program`: owned by this value alone, moved to the model thread.
unsafe impl Send for Package {}
// SAFETY: as `Program`: passes are never concurrent (the model thread, or the pass lock).
unsafe impl Sync for Package {}

/// What a package is, checked, before its load.
pub struct Checked {
    contents: Contents,
    signature: Signature,
}

/// Reads and checks the package at `path` for a worker placed `at`: `names` are the
/// metadata's declared input names (for messages).
pub fn check(path: &str, at: &Placement, names: &[String]) -> Result<Checked, String> {
    let records = archive::records(path)?;
    let contents = package::contents(&records)?;
    let meta = match contents.metadata() {
        Some(file) => package::parse_metadata(&read(path, &contents, file)?)?,
        None => Default::default(),
    };
    package::check_metadata(&meta, at)?;
    contents.library()?;
    let wrapper = contents.wrapper_source()?.to_string();
    for file in contents.sources() {
        let text = read(path, &contents, file)?;
        package::check_threads(file, &String::from_utf8_lossy(&text))?;
    }
    let wrapper = String::from_utf8_lossy(&read(path, &contents, &wrapper)?).into_owned();
    let mut signature = package::parse_inputs(&wrapper, names)?;
    signature.device = if at.gpu { "cuda" } else { "cpu" }.into();
    Ok(Checked {
        contents,
        signature,
    })
}

impl Checked {
    /// The package's inputs, as its wrapper checks them.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }
}

fn read(path: &str, contents: &Contents, file: &str) -> Result<Vec<u8>, String> {
    archive::read(path, &format!("{}{file}", contents.prefix))
}

/// The server's directory for unpacked packages (the master's, or beside it when the worker
/// runs alone).
pub fn unpack_root() -> PathBuf {
    match std::env::var_os(vramfork::unpacked::ENV) {
        Some(d) => PathBuf::from(d),
        None => vramfork::unpacked::dir(&std::env::temp_dir(), std::process::id()),
    }
}

impl Package {
    /// Unpacks the checked package's model into `<root>/<pid>/`, loads it for `device`
    /// (`cpu`, or `cuda:0`: a worker sees its one GPU as device 0), removes the files.
    /// `pad` enables padding a short batch to the package's minimum rows.
    pub fn load(
        path: &str,
        checked: Checked,
        device: &str,
        pad: bool,
        root: &Path,
    ) -> Result<Package, String> {
        let dir = root.join(std::process::id().to_string());
        let loaded = unpack_and_load(path, &checked.contents, device, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        let mine = vramfork::unpacked::dir(&std::env::temp_dir(), std::process::id());
        if root == mine {
            // The server's root is this process's own (development mode, where `app`
            // becomes the worker by exec, or a worker run alone): nobody else removes it.
            let _ = std::fs::remove_dir(root);
        }
        let handle = loaded?;
        let single = match call_spec(handle) {
            Ok(spec) => output_is_leaf(&spec),
            Err(e) => {
                // SAFETY: the handle came from vf_aoti_load and is freed once, here.
                unsafe { ffi::vf_aoti_free(handle.as_ptr()) };
                return Err(e);
            }
        };
        let pad_rows = match checked
            .signature
            .inputs
            .first()
            .and_then(|i| i.dims.first())
        {
            Some(Dim::Dynamic { min, .. }) if pad && *min > 1 => Some(*min),
            _ => None,
        };
        Ok(Package {
            handle,
            signature: checked.signature,
            single,
            pad_rows,
        })
    }

    /// One pass: rows padded to the package's minimum where batching allows, the tensors
    /// checked against its inputs, run, the answers cut back to the rows sent.
    pub fn run(&self, args: &[Tensor]) -> Result<IValue, PassError> {
        let rows = args.first().and_then(|t| t.size().first().copied());
        let padded: Vec<Tensor>;
        let args = match (self.pad_rows, rows) {
            (Some(min), Some(n)) if n > 0 && n < min => {
                padded = args.iter().map(|t| pad(t, min)).collect();
                &padded[..]
            }
            _ => args,
        };
        self.signature.check(args).map_err(|e| {
            PassError::Input(match (self.pad_rows, rows) {
                (None, Some(n)) if n < self.min_rows() => format!(
                    "{e}: an AOTInductor package's dynamic batch starts at {} rows; set max_batch_size in the metadata (its rows are then independent, and the server pads a shorter batch), or send at least {} rows",
                    self.min_rows(),
                    self.min_rows()
                ),
                _ => e,
            })
        })?;
        let mut tensors = self.pass(args)?;
        if let (Some(n), true) = (rows, args.first().map(|t| t.size()[0]) != rows) {
            tensors = tensors.into_iter().map(|t| t.narrow(0, 0, n)).collect();
        }
        let mut tensors = tensors.into_iter();
        Ok(match (self.single, tensors.len()) {
            (true, 1) => IValue::Tensor(tensors.next().expect("one output")),
            _ => IValue::Tuple(tensors.map(IValue::Tensor).collect()),
        })
    }

    fn min_rows(&self) -> i64 {
        match self.signature.inputs.first().and_then(|i| i.dims.first()) {
            Some(Dim::Dynamic { min, .. }) => *min,
            _ => 0,
        }
    }

    fn pass(&self, args: &[Tensor]) -> Result<Vec<Tensor>, PassError> {
        let inputs: Vec<*const c_void> = args.iter().map(|t| t.as_ptr().cast()).collect();
        let mut outputs: *mut *mut c_void = std::ptr::null_mut();
        let mut n_out = 0usize;
        // SAFETY: `handle` is a live runner; `inputs` holds `args.len()` borrowed
        // `at::Tensor*`; the out-pointers are valid; the shim catches every C++ exception.
        let rc = unsafe {
            ffi::vf_aoti_run(
                self.handle.as_ptr(),
                inputs.as_ptr(),
                inputs.len(),
                &mut outputs,
                &mut n_out,
            )
        };
        if rc != 0 {
            return Err(PassError::Runtime(super::last_error()));
        }
        // SAFETY: on success `outputs` is a malloc'ed array of `n_out` owned `at::Tensor*`,
        // each taken over once by a tch `Tensor`.
        let tensors = (0..n_out)
            .map(|i| unsafe { Tensor::from_ptr((*outputs.add(i)).cast()) })
            .collect();
        // SAFETY: the array came from the shim's malloc and is freed once, here.
        unsafe { ffi::vf_export_free_bytes(outputs.cast()) };
        Ok(tensors)
    }
}

impl Drop for Package {
    fn drop(&mut self) {
        // SAFETY: the handle came from vf_aoti_load and is freed once, here.
        unsafe { ffi::vf_aoti_free(self.handle.as_ptr()) };
    }
}

/// `t` with its last row repeated up to `rows` rows.
fn pad(t: &Tensor, rows: i64) -> Tensor {
    let n = t.size()[0];
    let last = t.narrow(0, n - 1, 1);
    let mut parts = vec![t.shallow_clone()];
    parts.extend((n..rows).map(|_| last.shallow_clone()));
    Tensor::cat(&parts, 0)
}

/// Writes the model's files into `dir` (a CUDA package's kernels, `.cubin`, beside its
/// library: the runner's `cubin_dir`) and loads its library for `device`.
fn unpack_and_load(
    path: &str,
    contents: &Contents,
    device: &str,
    dir: &Path,
) -> Result<NonNull<c_void>, String> {
    if let Some(root) = dir.parent() {
        vramfork::unpacked::private_dir(root)?;
    }
    // Left by an earlier process of this pid (the root is ours alone: nobody else's).
    let _ = std::fs::remove_dir_all(dir);
    vramfork::unpacked::private_dir(dir)?;
    for file in &contents.files {
        if !safe_relative(file) {
            continue;
        }
        let to = dir.join(file);
        if let Some(parent) = to.parent().filter(|p| *p != dir) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot unpack {file} into {}: {e}", dir.display()))?;
        }
        let bytes = read(path, contents, file)?;
        std::fs::write(&to, bytes)
            .map_err(|e| format!("cannot unpack {file} into {}: {e}", dir.display()))?;
    }
    let so = dir.join(contents.library()?);
    let c = |p: &Path| {
        CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| "a path with a NUL byte".to_string())
    };
    let device = CString::new(device).map_err(|_| "a device with a NUL byte".to_string())?;
    let (so, bin) = (c(&so)?, c(dir)?);
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and alive for the call; `out` is a valid
    // out-pointer; the shim catches every C++ exception.
    let rc = unsafe { ffi::vf_aoti_load(so.as_ptr(), device.as_ptr(), bin.as_ptr(), &mut out) };
    match NonNull::new(out) {
        Some(h) if rc == 0 => Ok(h),
        _ => Err(super::last_error()),
    }
}

/// A record path that stays inside the directory it is unpacked into: relative, no `..`,
/// no hidden component.
fn safe_relative(file: &str) -> bool {
    !file.is_empty()
        && !file.starts_with('/')
        && file
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.'))
}

/// The runner's call spec (input spec, output spec), as text.
fn call_spec(handle: NonNull<c_void>) -> Result<Vec<String>, String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: a live runner; valid out-pointers; the shim catches every C++ exception.
    let rc: c_int = unsafe { ffi::vf_aoti_call_spec(handle.as_ptr(), &mut out, &mut len) };
    if rc != 0 {
        return Err(super::last_error());
    }
    // SAFETY: on success the shim set `out` to a malloc'ed buffer of `len` bytes.
    let text = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), len) };
    let text = String::from_utf8_lossy(text).into_owned();
    // SAFETY: `out` came from the shim's malloc and is freed once, here.
    unsafe { ffi::vf_export_free_bytes(out.cast()) };
    Ok(text.lines().map(str::to_string).collect())
}

/// Whether the output spec (`[1, {"type": null, …}]`) is a single tensor, not a tuple.
fn output_is_leaf(spec: &[String]) -> bool {
    let Some(out) = spec.get(1) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(out)
        .map(|v| v[1]["type"].is_null())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_output_spec_is_one_tensor() {
        let leaf = r#"[1, {"type": null, "context": null, "children_spec": []}]"#;
        let tuple = r#"[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]"#;
        assert!(output_is_leaf(&["in".into(), leaf.into()]));
        assert!(!output_is_leaf(&["in".into(), tuple.into()]));
        assert!(!output_is_leaf(&[]));
    }

    #[test]
    fn only_paths_inside_the_directory_are_unpacked() {
        assert!(safe_relative("a.wrapper.so"));
        assert!(safe_relative("triton/k.cubin"));
        for bad in ["", "/etc/x", "../x", "a/../x", ".hidden", "a//b"] {
            assert!(!safe_relative(bad), "{bad}");
        }
    }

    #[test]
    fn padding_repeats_the_last_row() {
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([1, 4]);
        let p = pad(&t, 3);
        assert_eq!(p.size(), vec![3, 4]);
        assert_eq!(
            Vec::<f32>::try_from(p.flatten(0, -1)).unwrap(),
            [1.0, 2.0, 3.0, 4.0].repeat(3)
        );
    }
}
