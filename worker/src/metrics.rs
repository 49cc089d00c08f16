//! What this worker counts for `/metrics` (when `--metrics-port` is given): answers by
//! endpoint and status, bytes, request, queue-wait and forward-pass durations. Recording is a few
//! relaxed atomic adds and one uncontended lock per answer; the figures leave the process
//! with the heartbeat (only when they changed) and once more before it exits (`report.rs`).
//! A leaf: it knows nothing of the request context.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use vramfork::auth::AuthFailure;
use vramfork::metrics::histogram::AtomicHist;
use vramfork::metrics::traffic::{EndpointTraffic, Traffic, ENDPOINTS};

/// The `endpoint` label of an answer (index into [`ENDPOINTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Infer = 0,
    Metadata = 1,
    Health = 2,
    Other = 3,
    /// `POST /v2/models/…/infer`.
    V2Infer = 4,
    /// The other v2 endpoints (health, metadata).
    V2 = 5,
    /// gRPC `ModelInfer`, and each request of a `ModelStreamInfer` stream.
    GrpcInfer = 6,
    /// The other gRPC methods (health, metadata, the ones not served).
    Grpc = 7,
    /// `POST /v1/embeddings`.
    Embeddings = 8,
    /// The rerank, score and classify doors (`/v2/rerank`, `/v1/rerank`, `/rerank`,
    /// `/predict`, `/score`, `/v1/classify`).
    Rerank = 9,
    /// TorchServe's inference, `POST`/`PUT /predictions/…`.
    TorchServe = 10,
    /// KServe v1's `POST /v1/models/{name}:predict`.
    KServeV1 = 11,
}

/// Why the worker closed a connection on its client's account (`closes.rs`): the `reason`
/// label of `vramfork_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// h2 sent GOAWAY `ENHANCE_YOUR_CALM`: the client passed one of its limits.
    Abuse = 0,
    /// h2 sent GOAWAY for another protocol error of the client's.
    ProtocolError = 1,
    /// The client read nothing of its answers for `timeouts::UNREAD`.
    Unread = 2,
}

impl Closed {
    pub const ALL: [Closed; 3] = [Closed::Abuse, Closed::ProtocolError, Closed::Unread];

    pub fn reason(self) -> &'static str {
        match self {
            Closed::Abuse => "abuse",
            Closed::ProtocolError => "protocol_error",
            Closed::Unread => "unread",
        }
    }
}

#[derive(Default)]
struct Counts {
    /// `(status, answers)`; a handful of statuses, so a short vector.
    codes: Mutex<Vec<(u16, u64)>>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    duration: AtomicHist,
}

#[derive(Default)]
pub struct Recorder {
    endpoints: [Counts; ENDPOINTS.len()],
    forward: AtomicHist,
    preprocess: AtomicHist,
    queue_wait: AtomicHist,
    /// Token-auth refusals by [`AuthFailure`] (missing, malformed, invalid).
    auth: [AtomicU64; 3],
    /// Connections closed on their client's account, by [`Closed`].
    closed: [AtomicU64; Closed::ALL.len()],
}

impl Recorder {
    /// An answer: its status, body size and time since the request arrived.
    pub fn answered(&self, ep: Endpoint, code: u16, bytes_out: usize, took: Duration) {
        let c = &self.endpoints[ep as usize];
        {
            let mut codes = c.codes.lock().unwrap_or_else(|p| p.into_inner());
            match codes.iter_mut().find(|(k, _)| *k == code) {
                Some((_, n)) => *n += 1,
                None => codes.push((code, 1)),
            }
        }
        c.bytes_out.fetch_add(bytes_out as u64, Ordering::Relaxed);
        c.duration.observe(took);
    }

    /// Request body bytes read.
    pub fn bytes_in(&self, ep: Endpoint, n: usize) {
        self.endpoints[ep as usize]
            .bytes_in
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A request token auth refused.
    pub fn auth_failure(&self, f: AuthFailure) {
        self.auth[f as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed on its client's account.
    pub fn connection_closed(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A forward pass that produced an answer.
    pub fn forward(&self, took: Duration) {
        self.forward.observe(took);
    }

    /// A request's pass started after it waited this long for a worker and the model
    /// (the access log's `wait_ms`).
    pub fn waited(&self, wait: Duration) {
        self.queue_wait.observe(wait);
    }

    /// A request's documents pre-processed.
    pub fn preprocessed(&self, took: Duration) {
        self.preprocess.observe(took);
    }

    /// Everything so far.
    pub fn traffic(&self) -> Traffic {
        let mut t = Traffic {
            forward: self.forward.load(),
            preprocess: self.preprocess.load(),
            queue_wait: self.queue_wait.load(),
            ..Traffic::default()
        };
        for f in [
            AuthFailure::Missing,
            AuthFailure::Malformed,
            AuthFailure::Invalid,
        ] {
            let n = self.auth[f as usize].load(Ordering::Relaxed);
            if n > 0 {
                t.auth_failures.insert(format!("serving/{}", f.reason()), n);
            }
        }
        for why in Closed::ALL {
            let n = self.closed[why as usize].load(Ordering::Relaxed);
            if n > 0 {
                t.connections_closed.insert(why.reason().to_string(), n);
            }
        }
        for (name, c) in ENDPOINTS.iter().zip(&self.endpoints) {
            let codes = c.codes.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if codes.is_empty() {
                continue;
            }
            t.endpoints.insert(
                name.to_string(),
                EndpointTraffic {
                    codes: codes.into_iter().collect(),
                    bytes_in: c.bytes_in.load(Ordering::Relaxed),
                    bytes_out: c.bytes_out.load(Ordering::Relaxed),
                    duration: c.duration.load(),
                },
            );
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_counts_by_endpoint_and_status() {
        let r = Recorder::default();
        let ms = Duration::from_millis(1);
        r.answered(Endpoint::Infer, 200, 10, ms);
        r.answered(Endpoint::Infer, 200, 10, ms);
        r.answered(Endpoint::Infer, 400, 5, ms);
        r.bytes_in(Endpoint::Infer, 7);
        r.answered(Endpoint::Health, 200, 2, ms);
        r.forward(ms);
        r.waited(ms);
        r.connection_closed(Closed::Unread);
        r.connection_closed(Closed::Abuse);
        r.connection_closed(Closed::Abuse);
        let t = r.traffic();
        assert_eq!(t.connections_closed["abuse"], 2);
        assert_eq!(t.connections_closed["unread"], 1);
        assert!(!t.connections_closed.contains_key("protocol_error"));
        assert_eq!(t.endpoints["infer"].codes[&200], 2);
        assert_eq!(t.endpoints["infer"].codes[&400], 1);
        assert_eq!(t.endpoints["infer"].bytes_out, 25);
        assert_eq!(t.endpoints["infer"].bytes_in, 7);
        assert_eq!(t.endpoints["infer"].duration.count(), 3);
        assert_eq!(t.endpoints["health"].answers(), 1);
        assert!(!t.endpoints.contains_key("metadata"));
        assert_eq!(t.forward.count(), 1);
        assert_eq!(t.queue_wait.count(), 1);
    }
}
