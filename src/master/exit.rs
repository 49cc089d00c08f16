//! The exit statuses of `app`, in one table (SPEC section 5). A systemd unit lists 2, 3
//! and 5 in `RestartPreventExitStatus=` (they do not heal by restarting).

/// Clean stop (TERM, INT, QUIT; `app plan`).
pub const OK: i32 = 0;
/// Usage or configuration error before any worker starts: bad flag, bad environment value,
/// bad metadata, port in use, model does not fit; a plan that puts workers on GPUs with
/// PyTorch's caching allocator turned off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: no cap).
pub const CONFIG: i32 = 2;
/// The model could not be loaded by the first workers.
pub const MODEL_LOAD: i32 = 3;
/// Workers kept dying (or none was ready for `--boot-timeout`) and the service gave up.
pub const GAVE_UP: i32 = 4;
/// A worker the plan placed on a GPU came up without CUDA: the machine cannot serve on its
/// GPUs as planned (driver, container devices, libtorch build). Serving on the CPU instead
/// is never done silently: `--device cpu` says so. (A worker whose allocator cap cannot be
/// set fails its load — worker exit 3, a failed boot — and never runs uncapped: with no
/// worker ever ready that is [`MODEL_LOAD`].)
pub const NO_CUDA: i32 = 5;
