//! Where the plan put a worker, as the checks of an AOTInductor package see it: on the CPU,
//! or on a GPU (a simulated one too) whose CUDA compute capability the master's NVML read
//! (`nvmlDeviceGetCudaComputeCapability`), and whether the model really runs on CUDA there.
//!
//! A CUDA package holds kernels compiled for one GPU kind: torch 2.11 records it as
//! `AOTI_COMPUTE_CAPABILITY`, `major × 10 + minor` (`torch/_inductor/codecache.py`,
//! `get_device_information`, through `torch/_dynamo/device_interface.py`'s
//! `CudaInterface.get_compute_capability`), and its Triton kernels are cubins for
//! `sm_<cc>`, with the arch-specific `a` suffix from 9.0 on (`triton/backends/nvidia/
//! compiler.py`, `sm_arch_from_capability`). CUDA runs a cubin of `sm_XY` on a GPU of
//! compute capability X.Z with Z ≥ Y only; an `sm_90a`/`sm_100a` cubin on exactly its own.
//!
//! The worker requires the exact compute capability below 9.0 too: a later minor version
//! runs the binary but may have less shared memory per block (163 KB on 8.0, 99 KB on 8.6
//! and 8.9), and Triton configurations tuned on the compiling GPU then fail at their first
//! launch (`cuFuncSetAttribute`), inside the package, with a message that does not say
//! why. A package compiled with `aot_inductor.emit_multi_arch_kernel` (PTX beside the
//! cubins) is held to the same rule: its PTX carries the same tuned configurations.

/// Where this worker's model runs, for the package checks (`default()`: on the CPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// The plan placed it on a GPU (`--simulated-gpus` included).
    pub gpu: bool,
    /// That GPU's compute capability, `major.minor` (`None`: not told).
    pub capability: Option<String>,
    /// The model runs on CUDA (not on the CPU of a simulated GPU).
    pub cuda: bool,
}

/// `major.minor` (`9.0`) or torch's `major × 10 + minor` (`90`) as (major, minor).
fn parse(cc: &str) -> Option<(u32, u32)> {
    let cc = cc.trim();
    if let Some((major, minor)) = cc.split_once('.') {
        return Some((major.parse().ok()?, minor.parse().ok()?));
    }
    let n: u32 = cc.parse().ok()?;
    Some((n / 10, n % 10))
}

/// Why kernels compiled for `package` (the package's `AOTI_COMPUTE_CAPABILITY`) cannot run
/// on a GPU of compute capability `gpu` (NVML's `major.minor`); `None` when they can, or when
/// either is unknown (left to the load).
pub fn capability_mismatch(package: &str, gpu: &str) -> Option<String> {
    let ((pm, pn), (gm, gn)) = (parse(package)?, parse(gpu)?);
    let runs = (pm, pn) == (gm, gn);
    (!runs).then(|| {
        let cubin = if pm >= 9 { "a" } else { "" };
        let why = if pm == gm && gn > pn && pm < 9 {
            "would run with less shared memory than they were tuned for (their first launch can fail inside the package), so a package is served on its own compute capability only"
        } else {
            "cannot run"
        };
        format!(
            "it was compiled for GPUs of compute capability {pm}.{pn} (AOTI_COMPUTE_CAPABILITY {package}: its kernels are cubins for sm_{pm}{pn}{cubin}, tuned to that GPU's shared memory), which this worker's GPU, of compute capability {gm}.{gn} (as NVML reports it), {why}: compile the package on a GPU of this kind with this torch, or serve the ExportedProgram (torch.export.save), which compiles nothing"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_run_on_their_own_gpu_kind_only() {
        assert_eq!(parse("90"), Some((9, 0)));
        assert_eq!(parse("8.6"), Some((8, 6)));
        assert_eq!(parse(""), None);
        assert_eq!(capability_mismatch("90", "9.0"), None);
        let later = capability_mismatch("80", "8.6").expect("exact match below 9.0 too");
        assert!(
            later.contains("less shared memory than they were tuned for"),
            "{later}"
        );
        assert_eq!(capability_mismatch("86", "8.6"), None);
        assert_eq!(
            capability_mismatch("", "9.0"),
            None,
            "unknown: left to the load"
        );
        let e = capability_mismatch("90", "8.0").unwrap();
        assert!(
            e.contains("compute capability 9.0 (AOTI_COMPUTE_CAPABILITY 90"),
            "{e}"
        );
        assert!(
            e.contains("sm_90a") && e.contains("of compute capability 8.0"),
            "{e}"
        );
        assert!(
            capability_mismatch("86", "8.0").is_some(),
            "sm_86 needs 8.6 or later"
        );
        assert!(capability_mismatch("80", "9.0").is_some(), "another major");
        assert!(
            capability_mismatch("90", "10.0").is_some(),
            "sm_90a runs on 9.0 only"
        );
    }
}
