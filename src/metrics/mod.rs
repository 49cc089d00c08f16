//! Prometheus metrics. Workers count what they answer ([`traffic::Traffic`], latency
//! [`histogram`]s) and report it over their control channel at heartbeat pace; the master
//! keeps the totals of workers that are gone, adds those of live ones, and serves `/metrics`
//! on its own listener ([`endpoint`]), encoded by [`exposition`] in the Prometheus text
//! format or OpenMetrics. In development mode the single worker serves the same families.
//! What waits for a worker in the listening socket's queue is read from the kernel
//! ([`listen_queue`]).
//! The README's metrics table lists every family.

pub mod endpoint;
pub mod exposition;
pub mod histogram;
pub mod listen_queue;
pub mod traffic;
