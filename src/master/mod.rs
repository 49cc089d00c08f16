//! The master of `app --production`: it plans, starts workers on the socket it bound, and
//! supervises them (one loop, per-slot state, pure decisions). It never serves traffic, never
//! initialises CUDA and never loads libtorch.

pub mod activation;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod decide;
pub mod develop;
pub mod events;
pub mod exit;
pub mod footprint;
pub mod host;
pub mod listen;
pub mod measured;
pub mod metrics;
pub mod notify;
pub mod oom;
pub mod plan;
pub mod profile;
pub mod resources;
pub mod rules;
pub mod signals;
pub mod slot;
pub mod spawn;
pub mod supervisor;
pub mod template;
pub mod worker_config;
