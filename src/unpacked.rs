//! Where a server's processes unpack AOTInductor packages: one directory per server under
//! the temporary directory, named by the master's pid ([`dir`]), told to every child in
//! [`ENV`]; each process unpacks into `<pid>/` under it. The master sweeps it
//! (`master::unpack`); the worker writes into it (`worker/src/exported/aoti.rs`).

use std::path::{Path, PathBuf};

/// Environment: the server's directory ([`dir`] of the master's pid).
pub const ENV: &str = "VRAMFORK_UNPACK_DIR";

/// Every server's directory is this, then the master's pid.
pub const PREFIX: &str = "vramfork-unpack-";

/// The directory of the server whose master is `pid`, under the temporary directory `base`.
pub fn dir(base: &Path, pid: u32) -> PathBuf {
    base.join(format!("{PREFIX}{pid}"))
}
