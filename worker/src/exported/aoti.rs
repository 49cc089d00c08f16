//! An AOTInductor package loaded and run (through `worker/shim/export.cpp`, with the runner
//! `torch::inductor::AOTIModelPackageLoader` itself builds). The loader unpacks each package
//! into a fresh `/tmp/XXXXXX` of its own naming (torch 2.11 reads no `TMPDIR`), which a
//! killed process leaves behind; so the worker unpacks the model's files itself, with one
//! archive reader for the whole check and unpack ([`Archive`]), into
//! `<server's unpack directory>/<pid>/` ([`vramfork::unpacked`]), and loads the compiled
//! model from there. A CPU package's files are removed as soon as it is loaded (the library
//! stays mapped); a CUDA package's stay for the worker's life, because torch 2.11 loads each
//! Triton kernel's `.cubin` from that folder at the kernel's first launch
//! (`loadKernel(cubin_dir_/…)` in the generated wrapper). The master removes `<pid>/` of a
//! worker when it is reaped, and every server's directory it finds of a dead server at start.
//!
//! Before the load, the package is checked ([`super::package`]): its records' count and
//! sizes against the file's ([`super::archive`]), every name inside its own folder, one
//! model, compiled for the device the plan put the worker on (on the CPU: an instruction set
//! this CPU has; on a GPU: kernels its compute capability runs, [`super::placement`]), its
//! kernels' threads not fixed at compile time, and its inputs read from the wrapper's
//! generated checks. The library loaded is checked to resolve inside the unpack folder.
//!
//! On a GPU the runner is the registry's `cuda` one (the registry is keyed by device type),
//! given the device string `cuda:0` (`AOTIModelContainerRunnerCuda`, whose header takes
//! "cuda" or "cuda:0"; what `AOTIModelPackageLoader` builds for a `device_index` ≥ 0): the
//! worker's one GPU is device 0 to it (`CUDA_VISIBLE_DEVICES` = its UUID). Inputs reach it on
//! that device and outputs leave it as for TorchScript (`runner::tensors::to_ivalue`, the
//! encoders' copy to the CPU). A failed pass on CUDA is told out-of-memory or not by the
//! caching allocator's count of allocations that failed, read around the pass: the package's
//! own text (`run_func_(…) API call failed`) says neither; its CUDA message went to stderr.
//!
//! A CUDA package is never freed: its constants' deleter is a `cudaFree` that throws when
//! the context has failed, from a destructor that may not throw (`std::terminate`), so
//! dropping it after a sticky error would abort the worker instead of letting it exit with
//! its CUDA status; the process's end frees everything anyway.

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use tch::{IValue, Tensor};

use super::archive::Archive;
use super::outputs::Outputs;
use super::package::{self, Contents};
use super::signature::Dim;
use super::{PassError, Placement, Signature};

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
    /// What its flat outputs are, by its output spec: one tensor, a dict's named by its
    /// keys, or numbered.
    outputs: Outputs,
    /// Batches of fewer rows than the package's minimum are padded up to it (and the
    /// answers cut back): only with batching on, whose requests are independent rows.
    pad_rows: Option<i64>,
    /// The CUDA device index it runs on (`None`: the CPU).
    cuda: Option<usize>,
    /// Its weights are in the caching allocator (compiled so), not `cudaMalloc`ed.
    weights_in_allocator: bool,
}

// SAFETY: as `Program`: owned by this value alone, moved to the model thread.
unsafe impl Send for Package {}
// SAFETY: as `Program`: passes are never concurrent (the model thread, or the pass lock).
unsafe impl Sync for Package {}

/// What a package is, checked, before its load (with the archive still open, for the
/// unpack).
pub struct Checked {
    archive: Archive,
    contents: Contents,
    signature: Signature,
    weights_in_allocator: bool,
    /// This process's archive readers before the check opened its one.
    readers_before: usize,
}

/// Reads and checks the package at `path` for a worker placed `at`: `names` are the
/// metadata's declared input names (for messages).
pub fn check(path: &str, at: &Placement, names: &[String]) -> Result<Checked, String> {
    let readers_before = super::archive::opened();
    let archive = Archive::open(path)?;
    let contents = package::contents(&archive.names())?;
    let read = |file: &str| archive.read(&format!("{}{file}", contents.prefix));
    let meta = match contents.metadata() {
        Some(file) => package::parse_metadata(&read(file)?)?,
        None => Default::default(),
    };
    package::check_metadata(&meta, at)?;
    contents.library()?;
    let wrapper = contents.wrapper_source()?.to_string();
    for file in contents.sources() {
        let text = read(file)?;
        package::check_threads(file, &String::from_utf8_lossy(&text))?;
    }
    let wrapper = String::from_utf8_lossy(&read(&wrapper)?).into_owned();
    let mut signature = package::parse_inputs(&wrapper, names)?;
    signature.device = if at.gpu { "cuda" } else { "cpu" }.into();
    Ok(Checked {
        archive,
        contents,
        signature,
        weights_in_allocator: package::weights_in_allocator(&wrapper),
        readers_before,
    })
}

impl Checked {
    /// The package's inputs, as its wrapper checks them.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }
}

/// The server's directory for unpacked packages (the master's), or one of this process's
/// own, of an unpredictable name, when the worker runs alone.
pub fn unpack_root() -> PathBuf {
    match std::env::var_os(vramfork::unpacked::ENV) {
        Some(d) => PathBuf::from(d),
        None => vramfork::unpacked::fresh(&std::env::temp_dir(), std::process::id()),
    }
}

/// Whether a package loaded on `device` needs its unpacked files for as long as it runs: a
/// CUDA package's kernels are loaded from them at their first launch.
fn keeps_files(device: &str) -> bool {
    device != "cpu"
}

/// The CUDA device index in `cuda:N` (`None`: the CPU).
fn cuda_index(device: &str) -> Option<usize> {
    match device.split_once(':') {
        Some(("cuda", i)) => i.parse().ok(),
        None if device == "cuda" => Some(0),
        _ => None,
    }
}

impl Package {
    /// Unpacks the checked package's model into `<root>/<pid>/` and loads it for `device`
    /// (`cpu`, or `cuda:0`: a worker sees its one GPU as device 0); a CPU package's files
    /// are removed once it is loaded, a CUDA package's kept ([`keeps_files`]). `pad`
    /// enables padding a short batch to the package's minimum rows.
    pub fn load(checked: Checked, device: &str, pad: bool, root: &Path) -> Result<Package, String> {
        let dir = root.join(std::process::id().to_string());
        let loaded = unpack_and_load(&checked, device, &dir);
        let Checked {
            archive,
            signature,
            weights_in_allocator,
            readers_before,
            ..
        } = checked;
        drop(archive);
        if !keeps_files(device) {
            let _ = std::fs::remove_dir_all(&dir);
            if vramfork::unpacked::is_own(root, std::process::id()) {
                // The root is this process's own (development mode, where `app` becomes the
                // worker by exec, or a worker run alone): nobody else removes it.
                let _ = std::fs::remove_dir(root);
            }
        }
        let cuda = cuda_index(device);
        let (handle, unpacked) = loaded?;
        tracing::info!(
            event = "aoti_unpacked",
            files = unpacked.files,
            bytes = unpacked.bytes,
            archive_readers = super::archive::opened() - readers_before,
            kept = keeps_files(device),
            "AOTInductor package checked and unpacked ({} files, {} bytes; archive readers opened: {}) and loaded for {device}",
            unpacked.files,
            unpacked.bytes,
            super::archive::opened() - readers_before
        );
        let outputs = match call_spec(handle) {
            Ok(spec) => output_spec(&spec),
            Err(e) => {
                release(handle, cuda.is_some());
                return Err(e);
            }
        };
        let pad_rows = match signature.inputs.first().and_then(|i| i.dims.first()) {
            Some(Dim::Dynamic { min, .. }) if pad && *min > 1 => Some(*min),
            _ => None,
        };
        Ok(Package {
            handle,
            signature,
            outputs,
            pad_rows,
            cuda,
            weights_in_allocator,
        })
    }

    /// Its weights are in the CUDA caching allocator, under its cap (compiled with
    /// `AOT_INDUCTOR_WEIGHT_USE_CACHING_ALLOCATOR=1`), rather than `cudaMalloc`ed beside it.
    pub fn weights_in_allocator(&self) -> bool {
        self.weights_in_allocator
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
        Ok(self.outputs.assemble(tensors))
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
        let ooms = self.cuda.and_then(|i| crate::cuda::num_ooms(i).ok());
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
            let message = super::last_error();
            return Err(match self.cuda {
                None => PassError::Runtime(message),
                Some(i) => PassError::Device {
                    message,
                    out_of_memory: rose(ooms, crate::cuda::num_ooms(i).ok()),
                },
            });
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
        release(self.handle, self.cuda.is_some());
    }
}

/// Whether the caching allocator's count of failed allocations rose across a pass.
fn rose(before: Option<u64>, after: Option<u64>) -> bool {
    matches!((before, after), (Some(b), Some(a)) if a > b)
}

/// Frees a runner, unless it runs on CUDA: see the module's doc (a CUDA package is left to
/// the process's end). Returns whether it was freed.
fn release(handle: NonNull<c_void>, cuda: bool) -> bool {
    if cuda {
        return false;
    }
    // SAFETY: the handle came from vf_aoti_load and is freed once, here (its owner is gone).
    unsafe { ffi::vf_aoti_free(handle.as_ptr()) };
    true
}

/// `t` with its last row repeated up to `rows` rows.
fn pad(t: &Tensor, rows: i64) -> Tensor {
    let n = t.size()[0];
    let last = t.narrow(0, n - 1, 1);
    let mut parts = vec![t.shallow_clone()];
    parts.extend((n..rows).map(|_| last.shallow_clone()));
    Tensor::cat(&parts, 0)
}

/// What was unpacked: files and bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Unpacked {
    files: usize,
    bytes: u64,
}

/// Writes the model's files into `dir` (a CUDA package's kernels, `.cubin`, beside its
/// library: the runner's `cubin_dir`), from the archive the check opened, and loads its
/// library for `device` once its path is known to resolve inside `dir`.
fn unpack_and_load(
    checked: &Checked,
    device: &str,
    dir: &Path,
) -> Result<(NonNull<c_void>, Unpacked), String> {
    if let Some(root) = dir.parent() {
        vramfork::unpacked::private_dir(root)?;
    }
    // Left by an earlier process of this pid (the root is ours alone: nobody else's).
    let _ = std::fs::remove_dir_all(dir);
    vramfork::unpacked::private_dir(dir)?;
    let contents = &checked.contents;
    let mut unpacked = Unpacked::default();
    for file in &contents.files {
        let to = dir.join(file);
        if let Some(parent) = to.parent().filter(|p| *p != dir) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot unpack {file} into {}: {e}", dir.display()))?;
        }
        let record = format!("{}{file}", contents.prefix);
        unpacked.bytes += checked.archive.extract(&record, &to)?;
        unpacked.files += 1;
    }
    let so = inside(dir, contents.library()?)?;
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
        Some(h) if rc == 0 => Ok((h, unpacked)),
        _ => Err(super::last_error()),
    }
}

/// `dir/name` resolved (links followed), refused unless it is a regular file inside `dir`
/// (itself resolved): the library `dlopen` maps must be one this process unpacked.
fn inside(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let real = dir
        .join(name)
        .canonicalize()
        .map_err(|e| format!("the package's library {name} is not where it was unpacked: {e}"))?;
    if !real.starts_with(&real_dir) || !real.is_file() {
        return Err(format!(
            "the package's library {name} resolves to {}, outside the folder it was unpacked into ({}): refused",
            real.display(),
            real_dir.display()
        ));
    }
    Ok(real)
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

/// What the outputs are by the call spec's second line, the output spec (`[1, {"type":
/// null, …}]` a single tensor; a dict's keys name its tensors); numbered without one.
fn output_spec(spec: &[String]) -> Outputs {
    spec.get(1)
        .map(|out| Outputs::read_logged(out))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_output_spec_is_one_tensor() {
        let leaf = r#"[1, {"type": null, "context": null, "children_spec": []}]"#;
        let tuple = r#"[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]"#;
        assert_eq!(output_spec(&["in".into(), leaf.into()]), Outputs::Leaf);
        assert_eq!(output_spec(&["in".into(), tuple.into()]), Outputs::Flat);
        assert_eq!(output_spec(&[]), Outputs::Flat);
    }

    /// A package of `files` under `data/aotinductor/model/`, with a library that is not one
    /// (its load fails at `dlopen`), a wrapper source and metadata for `device`.
    fn fake_package(dir: &Path, device: &str, extra: &[(&str, &[u8])]) -> String {
        let meta = format!(r#"{{"AOTI_DEVICE_KEY": "{device}"}}"#);
        let m = "data/aotinductor/model/";
        let (so, cpp, json) = (
            format!("{m}a.wrapper.so"),
            format!("{m}a.wrapper.cpp"),
            format!("{m}a.wrapper_metadata.json"),
        );
        let mut records: Vec<(&str, &[u8])> = vec![
            (&so, b"not a library"),
            (&cpp, b"// no inputs\n"),
            (&json, meta.as_bytes()),
        ];
        records.extend_from_slice(extra);
        let path = dir.join(format!("{device}.pt2"));
        super::super::testzip::write(&path, "fake", &records);
        path.to_str().unwrap().to_string()
    }

    /// The runner registry is keyed by device type: `cuda:0` finds the CUDA runner (this
    /// worker links libtorch_cuda, so it is registered without a GPU too), and the load
    /// fails at the library, not for want of a runner.
    #[test]
    fn a_cuda_package_reaches_the_cuda_runner() {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("bogus.wrapper.so");
        std::fs::write(&so, b"not a library").unwrap();
        let c = |p: &Path| CString::new(p.to_str().unwrap()).unwrap();
        let (so_c, bin) = (c(&so), c(dir.path()));
        for device in ["cuda:0", "cuda", "cpu"] {
            let d = CString::new(device).unwrap();
            let mut out: *mut c_void = std::ptr::null_mut();
            // SAFETY: NUL-terminated strings alive for the call; a valid out-pointer.
            let rc =
                unsafe { ffi::vf_aoti_load(so_c.as_ptr(), d.as_ptr(), bin.as_ptr(), &mut out) };
            let e = super::super::last_error();
            assert_ne!(rc, 0, "{device}");
            assert!(!e.contains("no AOTInductor runner"), "{device}: {e}");
            assert!(e.contains("bogus.wrapper.so"), "{device}: {e}");
        }
    }

    /// A CUDA package's unpacked files (its kernels' `.cubin`s, loaded at their first
    /// launch) are still there after its load; a CPU package's are gone.
    #[test]
    fn a_cuda_packages_kernels_stay_after_its_load() {
        let dir = tempfile::tempdir().unwrap();
        let cubin: &[(&str, &[u8])] = &[("data/aotinductor/model/k0.cubin", b"kernel")];
        let at = Placement {
            gpu: true,
            capability: None,
            cuda: true,
        };
        let cuda = check(&fake_package(dir.path(), "cuda", cubin), &at, &[]).unwrap();
        let root = dir.path().join("root");
        let e = Package::load(cuda, "cuda:0", false, &root).err().unwrap();
        assert!(!e.contains("no AOTInductor runner"), "{e}");
        let unpacked = root.join(std::process::id().to_string());
        assert!(unpacked.join("k0.cubin").is_file(), "{e}");
        assert!(unpacked.join("a.wrapper.so").is_file());
        let cpu = fake_package(dir.path(), "cpu", cubin);
        let cpu = check(&cpu, &Placement::default(), &[]).unwrap();
        let root = dir.path().join("cpu-root");
        assert!(Package::load(cpu, "cpu", false, &root).is_err());
        assert!(!root.join(std::process::id().to_string()).exists());
    }

    /// A library name that resolves outside the unpack folder (through `..` or a link) is
    /// never handed to `dlopen`.
    #[test]
    fn only_a_library_inside_the_folder_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let unpack = dir.path().join("unpack");
        std::fs::create_dir(&unpack).unwrap();
        std::fs::write(dir.path().join("outside.so"), b"x").unwrap();
        std::fs::write(unpack.join("inside.so"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.so"), unpack.join("link.so")).unwrap();
        assert!(inside(&unpack, "inside.so").is_ok());
        for bad in ["../outside.so", "link.so"] {
            let e = inside(&unpack, bad).unwrap_err();
            assert!(e.contains("outside the folder it was unpacked into"), "{e}");
        }
    }

    /// A CUDA package is never freed (its destructor may `std::terminate` after a sticky
    /// error): the release of a CUDA runner never reaches the runner at all.
    #[test]
    fn a_cuda_package_is_never_freed() {
        // A dangling handle: freeing it would crash this test.
        assert!(!release(NonNull::dangling(), true));
        assert_eq!(cuda_index("cuda:0"), Some(0));
        assert_eq!(cuda_index("cuda:1"), Some(1));
        assert_eq!(cuda_index("cpu"), None);
        assert!(keeps_files("cuda:0") && !keeps_files("cpu"));
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
