//! An AOTInductor package (a `.pt2` of `torch._inductor.aoti_compile_and_package`): checked
//! (device, CPU, threads, inputs against the metadata), unpacked and loaded
//! (`crate::exported::aoti`); on CUDA, its weights allocated outside the caching allocator
//! lower the allocator's cap.

use tch::Device;

use super::declared::Declared;
use super::load_error::{too_big, LoadError};
use super::Model;
use crate::{cuda, exported};

/// An AOTInductor package: checked (device, CPU, threads, inputs against the metadata),
/// then unpacked and loaded; a short batch is padded to its minimum rows only with batching.
pub fn load(path: &str, device: Device, declared: &Declared) -> Result<Model, String> {
    let names: Vec<String> = declared
        .inputs
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    let at = exported::Placement {
        gpu: declared.plan_gpu || device.is_cuda(),
        capability: declared.capability.clone(),
        cuda: device.is_cuda(),
    };
    let checked = exported::aoti::check(path, &at, &names)?;
    let signature = checked.signature();
    signature.check_compiled_batch(declared.max_batch_size)?;
    signature.check_declared(declared.inputs.as_deref(), declared.max_batch_size)?;
    let pad = declared.max_batch_size > 0;
    let root = exported::aoti::unpack_root();
    let on = match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    };
    exported::Package::load(checked, &on, pad, &root).map(Model::Aoti)
}

/// The device's free memory and the caching allocator's reserved bytes now (`None` on the
/// CPU, or when either cannot be read): taken before a package's load, for [`cap`].
pub fn device_room(device: Device) -> Option<(u64, u64)> {
    let Device::Cuda(i) = device else {
        return None;
    };
    let free = cuda::free_memory(i).ok()?;
    let reserved = cuda::memory_stats(i).ok()?.reserved;
    Some((free, reserved))
}

/// What a package's weights allocated outside the caching allocator leave of its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutsideCap {
    /// Nothing (to speak of) outside: the cap stands.
    Within,
    /// The cap, lowered by what was allocated outside it, so that both together stay
    /// within what the plan gave the worker.
    Lower { cap: u64 },
    /// What was allocated outside leaves too little of the cap for any pass.
    TooBig,
}

/// Below this, what the device lost across a load is noise (the context's own growth).
const OUTSIDE_NOISE: u64 = 4 << 20;

/// A package's weights against the allocator's `cap`: `raw` is what the device lost across
/// the load beyond what the caching allocator reserved. A package compiled with its weights
/// in the allocator (`in_allocator`) is checked by the allocator's own count instead.
fn outside_cap(cap: u64, raw: u64, in_allocator: bool) -> OutsideCap {
    if in_allocator || raw < OUTSIDE_NOISE {
        OutsideCap::Within
    } else if too_big(raw, cap) {
        OutsideCap::TooBig
    } else {
        OutsideCap::Lower { cap: cap - raw }
    }
}

/// After a package's load on CUDA device `i`: by default torch 2.11 `cudaMalloc`s a
/// package's weights (`RAII_gpuMalloc` in `aoti_runtime/model_base.h`), outside the caching
/// allocator and its cap, so the cap that bounds everything else is lowered by them (or the
/// worker refused as too big); `room` is the device's free memory and the allocator's
/// reservation before the load. Returns the cap in force.
pub fn cap(
    path: &str,
    i: usize,
    cap: u64,
    room: Option<(u64, u64)>,
    in_allocator: bool,
) -> Result<u64, LoadError> {
    let Some(((free, reserved), (free_after, reserved_after))) =
        room.zip(device_room(Device::Cuda(i)))
    else {
        return Ok(cap);
    };
    let raw = free
        .saturating_sub(free_after)
        .saturating_sub(reserved_after.saturating_sub(reserved));
    let hint = "compile the package with AOT_INDUCTOR_WEIGHT_USE_CACHING_ALLOCATOR=1 (aot_inductor.weight_use_caching_allocator) to keep its weights under the cap";
    match outside_cap(cap, raw, in_allocator) {
        OutsideCap::Within => Ok(cap),
        OutsideCap::TooBig => {
            tracing::warn!(
                outside_mb = raw >> 20,
                cap_mb = cap >> 20,
                "the package's weights took {} MB outside the CUDA allocator: {hint}",
                raw >> 20
            );
            Err(LoadError::TooBig {
                path: path.into(),
                weights_mb: Some(raw >> 20),
                cap_mb: cap >> 20,
            })
        }
        OutsideCap::Lower { cap: lowered } => {
            let set = cuda::cap_allocator(i, lowered).map_err(|e| LoadError::Cap {
                path: path.into(),
                cap_mb: lowered >> 20,
                reason: e.to_string(),
            })?;
            tracing::warn!(
                event = "package_weights_outside_cap",
                outside_mb = raw >> 20,
                cap_mb = cap >> 20,
                lowered_mb = set.allowed >> 20,
                "the package's weights took {} MB outside the CUDA allocator; its cap is lowered from {} MB to {} MB so that both stay within the plan: {hint}",
                raw >> 20,
                cap >> 20,
                set.allowed >> 20
            );
            Ok(lowered)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A package's weights allocated outside the caching allocator lower its cap by as
    /// much, or refuse the worker when they leave too little; compiled into the allocator,
    /// or nothing outside, the cap stands.
    #[test]
    fn a_packages_weights_outside_the_allocator_lower_its_cap() {
        let mb = 1u64 << 20;
        assert_eq!(
            outside_cap(4000 * mb, 1000 * mb, false),
            OutsideCap::Lower { cap: 3000 * mb }
        );
        assert_eq!(outside_cap(4000 * mb, 3900 * mb, false), OutsideCap::TooBig);
        assert_eq!(outside_cap(4000 * mb, 5000 * mb, false), OutsideCap::TooBig);
        assert_eq!(outside_cap(4000 * mb, 1000 * mb, true), OutsideCap::Within);
        assert_eq!(outside_cap(4000 * mb, mb, false), OutsideCap::Within);
    }
}
