//! vramfork: a GPU-memory-aware pre-fork supervisor that serves PyTorch models (TorchScript,
//! `torch.export` programs and AOTInductor packages) over HTTP and gRPC.
//!
//! Nothing here links libtorch. The library has two roles, and its layout shows them:
//!
//! - **the contract the worker shares** — the modules at the top: the master↔worker
//!   [`protocol`], the app [`metadata`] and its parts ([`schema`], [`documents`], [`labels`],
//!   [`near_miss`]), the idle [`board`], [`hwline`], [`auth`], [`tls`], [`secrets`],
//!   [`files`], [`sockopt`], [`logging`], [`metrics`], a process's [`own_memory`] and whether NVML's pids are ours ([`pid_namespace`]). The worker binary (`worker/`)
//!   depends on them.
//! - **the master** — [`master`]: the command line and its validation, resource probing, the
//!   plan, the bootstrap and the supervisor. Only the `app` binary uses it; no module at the
//!   top imports it (`scripts/check-layout` checks).

pub mod auth;
pub mod board;
pub mod documents;
pub mod files;
pub mod hwline;
pub mod labels;
pub mod lanes;
pub mod logging;
pub mod master;
pub mod metadata;
pub mod metrics;
pub mod near_miss;
pub mod otel;
pub mod otel_tls;
pub mod own_memory;
pub mod pid_namespace;
pub mod protocol;
pub mod schema;
pub mod secrets;
pub mod sockopt;
pub mod tls;
pub mod torchserve;
pub mod unpacked;
