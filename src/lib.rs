//! vramfork: a GPU-memory-aware pre-fork supervisor for TorchScript models served over HTTP.
//!
//! This library holds everything the master (`app`) needs and nothing that links libtorch:
//! the command line and its validation, the app metadata, resource probing (CPU, NVML), the
//! worker plan, the master↔worker protocol and the supervisor. The worker binary
//! (`worker/`) depends on it for the protocol and the metadata types.

pub mod auth;
pub mod board;
pub mod documents;
pub mod files;
pub mod hwline;
pub mod labels;
pub mod logging;
pub mod master;
pub mod metadata;
pub mod metrics;
pub mod near_miss;
pub mod protocol;
pub mod schema;
pub mod secrets;
pub mod sockopt;
pub mod tls;
