//! The exit statuses of `app`, in one table (SPEC section 5). A systemd unit can list 2, 3
//! and 4 in `RestartPreventExitStatus=`.

/// Clean stop (TERM, INT, QUIT; `app plan`).
pub const OK: i32 = 0;
/// Usage or configuration error before any worker starts: bad flag, bad environment value,
/// bad metadata, port in use, model does not fit.
pub const CONFIG: i32 = 2;
/// The model could not be loaded by the first workers.
pub const MODEL_LOAD: i32 = 3;
/// Workers kept dying (or none was ready for `--boot-timeout`) and the service gave up.
pub const GAVE_UP: i32 = 4;
