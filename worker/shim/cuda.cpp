// vramfork worker: a tiny C ABI over c10's CUDA caching allocator, for what tch does not
// expose (allocator statistics, the memory-fraction cap, empty_cache). Errors go through the
// shims' one channel (error.h): status 0 ok, 1 no CUDA device, 2 a c10/CUDA error.

#ifndef VF_NO_CUDA_BUILD
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

// libtorch_cuda's own (ATen/cuda/CUDAContextLight.h, whose other includes — cuSPARSE,
// cuBLAS — the wheel's headers cannot all satisfy here): the device's properties, cached.
namespace at::cuda {
cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
}
#endif

#include "error.h"

#include <cstdint>
#include <string>

namespace {

using vf::guarded;
using vf::last_error;

#ifdef VF_NO_CUDA_BUILD
// A CPU-only libtorch: there is never a device.
int cuda_device_count() { return 0; }
#else
int cuda_device_count() { return static_cast<int>(c10::cuda::device_count()); }
#endif

int check_device(int device) {
  int n = cuda_device_count();
  if (n <= 0) {
    return VF_NO_CUDA;
  }
  if (device < 0 || device >= n) {
    last_error = "CUDA device index " + std::to_string(device) + " out of range (" +
                 std::to_string(n) + " visible)";
    return VF_ERROR;
  }
  return VF_OK;
}

}  // namespace

extern "C" {

// Number of CUDA devices this process sees (0 without a driver or GPU). Never fails.
int vf_cuda_device_count(int* out) noexcept {
  return guarded([&] {
    *out = cuda_device_count();
    return VF_OK;
  });
}

// Allocator statistics for one device, in bytes (aggregate over pools).
int vf_cuda_memory_stats(int device, int64_t* allocated, int64_t* peak_allocated,
                         int64_t* reserved, int64_t* peak_reserved) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[agg].current;
    *peak_allocated = stats.allocated_bytes[agg].peak;
    *reserved = stats.reserved_bytes[agg].current;
    *peak_reserved = stats.reserved_bytes[agg].peak;
#endif
    return VF_OK;
  });
}

// How many allocations the caching allocator has failed on `device` for lack of memory
// (DeviceStats::num_ooms, c10/core/CachingDeviceAllocator.h): read around a pass whose own
// error text does not say why it failed.
int vf_cuda_num_ooms(int device, int64_t* num_ooms) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    *num_ooms = stats.num_ooms;
#endif
    return VF_OK;
  });
}

// The device's free and total memory as the driver reports them now (cudaMemGetInfo on
// `device`): what the process allocates outside the caching allocator (a raw cudaMalloc)
// shows only here.
int vf_cuda_mem_get_info(int device, int64_t* free_bytes, int64_t* total_bytes) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    // The allocator's own cudaMemGetInfo under a device guard (libc10_cuda's: the worker
    // does not link the CUDA runtime itself).
    auto [f, t] = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(
        static_cast<c10::DeviceIndex>(device));
    *free_bytes = static_cast<int64_t>(f);
    *total_bytes = static_cast<int64_t>(t);
#endif
    return VF_OK;
  });
}

int vf_cuda_reset_peak(int device) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
#endif
    return VF_OK;
  });
}

int vf_cuda_empty_cache() noexcept {
  return guarded([&] {
    if (cuda_device_count() <= 0) {
      return VF_NO_CUDA;
    }
#ifndef VF_NO_CUDA_BUILD
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    return VF_OK;
  });
}

// Caps the caching allocator at `fraction` (0..1] of the device's memory.
int vf_cuda_set_memory_fraction(int device, double fraction) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      last_error = "memory fraction must be in (0, 1], got " + std::to_string(fraction);
      return VF_ERROR;
    }
#ifndef VF_NO_CUDA_BUILD
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       static_cast<c10::DeviceIndex>(device));
#endif
    return VF_OK;
  });
}

// Initialises CUDA in this process the way the first CUDA tensor would
// (at::globalContext().lazyInitDevice(kCUDA): the CUDA hooks, then the caching allocator's
// per-device state). Until then setMemoryFraction throws "Allocator not initialized for
// device ?: did you call init?" (c10/cuda/CUDACachingAllocator.cpp in 2.11). Idempotent.
int vf_cuda_init() noexcept {
  return guarded([&] {
    if (cuda_device_count() <= 0) {
      return VF_NO_CUDA;
    }
#ifndef VF_NO_CUDA_BUILD
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#endif
    return VF_OK;
  });
}

// The device's memory as the allocator's fraction counts it: torch 2.11's
// DeviceCachingAllocator::setMemoryFraction sets its allowed maximum to fraction ×
// device_prop.totalGlobalMem, and getMemoryFraction divides by the same
// (c10/cuda/CUDACachingAllocator.cpp), so the fraction is taken of totalGlobalMem
// (at::cuda::getDeviceProperties, ATen/cuda/CUDAContextLight.h) — not of cudaMemGetInfo's
// total, which may differ from it.
int vf_cuda_total_memory(int device, int64_t* total) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    auto* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    *total = static_cast<int64_t>(prop->totalGlobalMem);
#endif
    return VF_OK;
  });
}

// The operator's own cap, `per_process_memory_fraction` in PYTORCH_CUDA_ALLOC_CONF (else
// PYTORCH_ALLOC_CONF), as torch 2.11 parsed it (c10/cuda/CUDAAllocatorConfig.h: 1.0 when
// not set). Torch takes it of totalGlobalMem, as setMemoryFraction does. Never fails.
int vf_cuda_operator_fraction(double* fraction) noexcept {
  return guarded([&] {
    *fraction = 1.0;
#ifndef VF_NO_CUDA_BUILD
    *fraction = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::per_process_memory_fraction();
#endif
    return VF_OK;
  });
}

// The allocator's cap as it holds it now, as a fraction of totalGlobalMem (1.0: none):
// what setMemoryFraction left, read back.
int vf_cuda_memory_fraction(int device, double* fraction) noexcept {
  return guarded([&] {
    int rc = check_device(device);
    if (rc != VF_OK) {
      return rc;
    }
#ifndef VF_NO_CUDA_BUILD
    *fraction = c10::cuda::CUDACachingAllocator::getMemoryFraction(
        static_cast<c10::DeviceIndex>(device));
#endif
    return VF_OK;
  });
}

// Waits for the device's queued work; a kernel's asynchronous error (device-side assert,
// illegal address) surfaces here, as a c10 error with its "CUDA error: …" text.
int vf_cuda_synchronize() noexcept {
  return guarded([&] {
    if (cuda_device_count() <= 0) {
      return VF_NO_CUDA;
    }
#ifndef VF_NO_CUDA_BUILD
    c10::cuda::device_synchronize();
#endif
    return VF_OK;
  });
}

}  // extern "C"
