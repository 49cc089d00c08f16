// vramfork worker: the one error channel of the C++ shims (cuda.cpp, export.cpp). Every
// function a shim exports runs its body under `vf::guarded`, which catches every C++
// exception, keeps its message for this thread and returns a status code, so nothing
// unwinds into Rust and no error aborts the worker. Rust reads the message back with
// `vf_shim_last_error` (worker/src/shim.rs).
//
// Status codes: 0 ok, 1 no CUDA device (the allocator shim only), 2 an error.

#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

constexpr int VF_OK = 0;
constexpr int VF_NO_CUDA = 1;
constexpr int VF_ERROR = 2;

namespace vf {

// The message of this thread's last error (error.cpp).
extern thread_local std::string last_error;

// `f()`'s status; an exception becomes VF_ERROR with its message kept in `last_error`.
template <typename F>
int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const c10::Error& e) {
    // what_without_backtrace(): the message without the C++ frames after it.
    last_error = e.what_without_backtrace();
    return VF_ERROR;
  } catch (const std::exception& e) {
    last_error = e.what();
    return VF_ERROR;
  } catch (...) {
    last_error = "unknown C++ exception";
    return VF_ERROR;
  }
}

}  // namespace vf
