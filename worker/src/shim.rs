//! The C++ shims' one error channel (`worker/shim/error.h`): every shim function returns a
//! status code and keeps the message of its error for this thread; here it becomes a
//! Rust string.

use std::ffi::{c_char, CStr};

extern "C" {
    fn vf_shim_last_error(buf: *mut c_char, len: usize);
}

/// This thread's last shim error message.
pub fn last_error() -> String {
    let mut buf = [0 as c_char; 2048];
    // SAFETY: the buffer is valid for `buf.len()` bytes; the shim writes at most `len - 1`
    // bytes plus a NUL terminator and never throws.
    unsafe { vf_shim_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: the shim always NUL-terminates inside the buffer (see above).
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) };
    msg.to_string_lossy().into_owned()
}
