// vramfork worker: the shims' error channel (error.h), read back by Rust.

#include "error.h"

#include <cstddef>
#include <cstring>

namespace vf {
thread_local std::string last_error;
}

extern "C" {

// The last error message of this thread, copied into buf (NUL-terminated, truncated).
void vf_shim_last_error(char* buf, size_t len) noexcept {
  if (buf == nullptr || len == 0) {
    return;
  }
  const std::string& e = vf::last_error;
  size_t n = e.size() < len - 1 ? e.size() : len - 1;
  std::memcpy(buf, e.data(), n);
  buf[n] = '\0';
}

}  // extern "C"
