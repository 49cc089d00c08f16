//! The KServe v2 gRPC messages (package `inference`), generated at build time from
//! `worker/proto/inference.proto` by `worker/build.rs` (`protox` + `prost-build`).

#![allow(clippy::all, clippy::pedantic, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/inference.rs"));
