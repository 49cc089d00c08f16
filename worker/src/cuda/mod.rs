//! The CUDA caching allocator, through the small C++ shim `worker/shim/cuda.cpp`: statistics (peak
//! and current allocated/reserved bytes, allocations failed for lack of memory), the
//! device's free memory, resetting the peak, `empty_cache` and the per-process
//! memory-fraction cap. Safe wrappers; without a GPU every call reports
//! [`CudaError::NoCuda`]. How libtorch says a GPU allocation failed is `out_of_memory.rs`.

mod out_of_memory;

use std::ffi::c_int;

pub use out_of_memory::is_out_of_memory;

mod ffi {
    use std::ffi::c_int;

    extern "C" {
        pub fn vf_cuda_device_count(out: *mut c_int) -> c_int;
        pub fn vf_cuda_memory_stats(
            device: c_int,
            allocated: *mut i64,
            peak_allocated: *mut i64,
            reserved: *mut i64,
            peak_reserved: *mut i64,
        ) -> c_int;
        pub fn vf_cuda_num_ooms(device: c_int, num_ooms: *mut i64) -> c_int;
        pub fn vf_cuda_mem_get_info(device: c_int, free: *mut i64, total: *mut i64) -> c_int;
        #[cfg_attr(not(test), allow(dead_code))]
        pub fn vf_cuda_reset_peak(device: c_int) -> c_int;
        pub fn vf_cuda_empty_cache() -> c_int;
        pub fn vf_cuda_set_memory_fraction(device: c_int, fraction: f64) -> c_int;
        pub fn vf_cuda_init() -> c_int;
        pub fn vf_cuda_total_memory(device: c_int, total: *mut i64) -> c_int;
        pub fn vf_cuda_memory_fraction(device: c_int, fraction: *mut f64) -> c_int;
        pub fn vf_cuda_operator_fraction(fraction: *mut f64) -> c_int;
        pub fn vf_cuda_synchronize() -> c_int;
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA device")]
    NoCuda,
    #[error("CUDA allocator: {0}")]
    C10(String),
}

/// The caching allocator's counters for one device, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub allocated: u64,
    pub peak_allocated: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
}

/// Turns a shim status code into a result, fetching the message for code 2.
fn check(rc: c_int) -> Result<(), CudaError> {
    match rc {
        0 => Ok(()),
        1 => Err(CudaError::NoCuda),
        _ => Err(CudaError::C10(crate::shim::last_error())),
    }
}

/// CUDA devices this process sees; 0 without a GPU or driver.
pub fn device_count() -> usize {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer for the call's duration; the shim catches all
    // C++ exceptions.
    let rc = unsafe { ffi::vf_cuda_device_count(&mut n) };
    if rc == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

pub fn is_available() -> bool {
    device_count() > 0
}

/// The allocator's counters for `device` (a CUDA index, i.e. after `CUDA_VISIBLE_DEVICES`).
pub fn memory_stats(device: usize) -> Result<MemoryStats, CudaError> {
    let (mut a, mut pa, mut r, mut pr) = (0i64, 0i64, 0i64, 0i64);
    // SAFETY: the four out-pointers are valid, distinct locals; the shim catches all C++
    // exceptions and only writes them on success.
    let rc = unsafe { ffi::vf_cuda_memory_stats(index(device), &mut a, &mut pa, &mut r, &mut pr) };
    check(rc)?;
    let b = |v: i64| v.max(0) as u64;
    Ok(MemoryStats {
        allocated: b(a),
        peak_allocated: b(pa),
        reserved: b(r),
        peak_reserved: b(pr),
    })
}

/// How many allocations the caching allocator has failed on `device` for lack of memory.
pub fn num_ooms(device: usize) -> Result<u64, CudaError> {
    let mut n = 0i64;
    // SAFETY: `n` is a valid out-pointer for the call; the shim catches all C++ exceptions
    // and only writes it on success.
    check(unsafe { ffi::vf_cuda_num_ooms(index(device), &mut n) })?;
    Ok(n.max(0) as u64)
}

/// The device's free memory now as the driver reports it (`cudaMemGetInfo`), in bytes: it
/// falls with allocations outside the caching allocator too.
pub fn free_memory(device: usize) -> Result<u64, CudaError> {
    let (mut free, mut total) = (0i64, 0i64);
    // SAFETY: two valid, distinct out-pointers; the shim catches all C++ exceptions and only
    // writes them on success.
    check(unsafe { ffi::vf_cuda_mem_get_info(index(device), &mut free, &mut total) })?;
    Ok(free.max(0) as u64)
}

/// Starts a new peak window (not used by the worker yet: its hwFetch peak covers its life).
#[cfg_attr(not(test), allow(dead_code))]
pub fn reset_peak(device: usize) -> Result<(), CudaError> {
    // SAFETY: plain value argument; the shim catches all C++ exceptions.
    check(unsafe { ffi::vf_cuda_reset_peak(index(device)) })
}

/// Returns cached, unused blocks to the driver.
pub fn empty_cache() -> Result<(), CudaError> {
    // SAFETY: no arguments; the shim catches all C++ exceptions.
    check(unsafe { ffi::vf_cuda_empty_cache() })
}

/// Caps this process's caching allocator at `fraction` (0..1] of the device's memory; an
/// allocation past it fails as out-of-memory.
pub fn set_memory_fraction(device: usize, fraction: f64) -> Result<(), CudaError> {
    // SAFETY: plain value arguments; the shim validates the fraction and catches all C++
    // exceptions.
    check(unsafe { ffi::vf_cuda_set_memory_fraction(index(device), fraction) })
}

/// Initialises CUDA and the caching allocator in this process (what the first CUDA tensor
/// would do); needed before [`set_memory_fraction`]. Idempotent.
pub fn init() -> Result<(), CudaError> {
    // SAFETY: no arguments; the shim catches all C++ exceptions.
    check(unsafe { ffi::vf_cuda_init() })
}

/// The device's memory as the allocator's fraction counts it (`totalGlobalMem`), in bytes.
pub fn total_memory(device: usize) -> Result<u64, CudaError> {
    let mut total: i64 = 0;
    // SAFETY: `total` is a valid out-pointer for the call; the shim catches all C++
    // exceptions and only writes it on success.
    check(unsafe { ffi::vf_cuda_total_memory(index(device), &mut total) })?;
    Ok(total.max(0) as u64)
}

/// The allocator's cap now, as a fraction of [`total_memory`] (1.0: none), read back.
pub fn memory_fraction(device: usize) -> Result<f64, CudaError> {
    let mut fraction: f64 = 0.0;
    // SAFETY: `fraction` is a valid out-pointer for the call; the shim catches all C++
    // exceptions and only writes it on success.
    check(unsafe { ffi::vf_cuda_memory_fraction(index(device), &mut fraction) })?;
    Ok(fraction)
}

/// The operator's `per_process_memory_fraction` as torch parsed it from its allocator
/// variable (1.0 when not set): a share of `totalGlobalMem`, as the cap's fraction is.
pub fn operator_fraction() -> Result<f64, CudaError> {
    let mut fraction: f64 = 1.0;
    // SAFETY: `fraction` is a valid out-pointer for the call; the shim catches all C++
    // exceptions.
    check(unsafe { ffi::vf_cuda_operator_fraction(&mut fraction) })?;
    Ok(fraction)
}

/// Waits for the device's queued work; an asynchronous CUDA error comes back here.
pub fn synchronize() -> Result<(), CudaError> {
    // SAFETY: no arguments; the shim catches all C++ exceptions.
    check(unsafe { ffi::vf_cuda_synchronize() })
}

/// The cap the allocator holds, read back after setting it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cap {
    /// The fraction set, of `total`.
    pub fraction: f64,
    /// `totalGlobalMem`, what torch takes the fraction of, bytes.
    pub total: u64,
    /// The allowed maximum the allocator reports now (its fraction read back × `total`).
    pub allowed: u64,
}

/// Caps the caching allocator at `cap_bytes` on `device`: initialises the allocator first
/// (a model with nothing on the GPU at load has not), sets the fraction of the total the
/// allocator itself multiplies by (`totalGlobalMem`), and reads the cap back. Any failure —
/// a cap read back that is not the one asked for included — is returned: a worker must not
/// run uncapped, or capped elsewhere, where the plan counted on a cap.
pub fn cap_allocator(device: usize, cap_bytes: u64) -> Result<Cap, CudaError> {
    init()?;
    let total = total_memory(device)?;
    // Never above the operator's own cap, of the same total (the plan
    // took it of NVML's total, which is larger on most drivers).
    let fraction = cap_fraction(cap_bytes, total)?.min(operator_fraction()?);
    set_memory_fraction(device, fraction)?;
    let read = memory_fraction(device)?;
    read_back(cap_bytes, fraction, read, total)
}

/// The fraction of `total` (torch's `totalGlobalMem`) that caps at `cap_bytes`; below 1.0
/// (torch 2.11 takes 1.0 as "no cap").
fn cap_fraction(cap_bytes: u64, total: u64) -> Result<f64, CudaError> {
    if total == 0 {
        return Err(CudaError::C10(
            "the device reports 0 bytes of memory".into(),
        ));
    }
    Ok((cap_bytes as f64 / total as f64).min(0.9999))
}

/// The cap read back (`read` of `total`), checked against the one asked for: within 1 MB
/// (the fraction's rounding), else an error naming both.
fn read_back(cap_bytes: u64, fraction: f64, read: f64, total: u64) -> Result<Cap, CudaError> {
    let allowed = (read * total as f64) as u64;
    let want = (fraction * total as f64) as u64;
    if allowed.abs_diff(want) > 1 << 20 || read >= 1.0 {
        return Err(CudaError::C10(format!(
            "the allocator's cap reads back as {} MB ({read} of {} MB), not the {} MB asked for",
            allowed >> 20,
            total >> 20,
            cap_bytes >> 20
        )));
    }
    Ok(Cap {
        fraction,
        total,
        allowed,
    })
}

fn index(device: usize) -> c_int {
    c_int::try_from(device).unwrap_or(c_int::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a GPU the shim answers "no CUDA" everywhere, never crashes; on
    /// a GPU machine the counters are consistent.
    #[test]
    fn shim_answers_without_crashing() {
        if is_available() {
            let s = memory_stats(0).unwrap();
            assert!(s.peak_allocated >= s.allocated);
            assert!(s.peak_reserved >= s.reserved);
            assert!(set_memory_fraction(0, 1.5).is_err());
            assert!(memory_stats(1000).is_err());
        } else {
            assert_eq!(device_count(), 0);
            assert_eq!(memory_stats(0), Err(CudaError::NoCuda));
            assert_eq!(reset_peak(0), Err(CudaError::NoCuda));
            assert_eq!(empty_cache(), Err(CudaError::NoCuda));
            assert_eq!(set_memory_fraction(0, 0.5), Err(CudaError::NoCuda));
            assert_eq!(init(), Err(CudaError::NoCuda));
            assert_eq!(total_memory(0), Err(CudaError::NoCuda));
            assert_eq!(memory_fraction(0), Err(CudaError::NoCuda));
            assert_eq!(synchronize(), Err(CudaError::NoCuda));
            assert_eq!(num_ooms(0), Err(CudaError::NoCuda));
            assert_eq!(free_memory(0), Err(CudaError::NoCuda));
            assert_eq!(cap_allocator(0, 1 << 30), Err(CudaError::NoCuda));
        }
    }

    /// The operator's `per_process_memory_fraction` is read as torch
    /// parsed it (and the cap is never set above it, of the same `totalGlobalMem`). The
    /// variable is read once per process, at first use: nothing else here uses it first.
    #[test]
    fn the_operators_fraction_is_torchs_own_reading_of_its_variable() {
        std::env::set_var(
            "PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True,per_process_memory_fraction:0.35",
        );
        assert_eq!(operator_fraction(), Ok(0.35));
    }

    /// The fraction is taken of torch's own base (`totalGlobalMem`), so
    /// the cap is the plan's to the byte, and a cap read back otherwise (or none) is an
    /// error rather than a worker capped elsewhere.
    #[test]
    fn the_cap_is_a_fraction_of_total_global_mem_and_is_read_back() {
        let mb = 1u64 << 20;
        // An H100: totalGlobalMem 79.19 GiB, while cudaMemGetInfo's total may differ.
        let total = 85_031_714_816;
        let f = cap_fraction(4_000 * mb, total).unwrap();
        let cap = read_back(4_000 * mb, f, f, total).unwrap();
        assert!(cap.allowed.abs_diff(4_000 * mb) <= mb, "{cap:?}");
        // A cap as large as the device is still a cap (1.0 would be none in torch 2.11).
        assert!(cap_fraction(total, total).unwrap() < 1.0);
        // Read back as none, or as another cap: refused, naming both.
        let none = read_back(4_000 * mb, f, 1.0, total).unwrap_err();
        assert!(
            none.to_string().contains("not the 4000 MB asked for"),
            "{none}"
        );
        assert!(read_back(4_000 * mb, f, f / 2.0, total).is_err());
        assert!(cap_fraction(mb, 0).is_err());
    }
}
