//! What workers count of the requests they answer, cumulative since the worker started:
//! answers by endpoint and status, bytes in and out, request and forward-pass durations.
//! Workers send it to the master over the control channel ([`ControlMsg::Metrics`]); the
//! master adds up the last figures of live workers and the final figures of gone ones.
//!
//! [`ControlMsg::Metrics`]: crate::protocol::ControlMsg::Metrics

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::histogram::Hist;

/// The endpoints requests are counted under (`endpoint` label).
pub const ENDPOINTS: [&str; 12] = [
    "infer",
    "metadata",
    "health",
    "other",
    "v2-infer",
    "v2",
    "grpc-infer",
    "grpc",
    "embeddings",
    "rerank",
    "torchserve",
    "kserve-v1",
];

/// One endpoint's answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointTraffic {
    /// Answers by HTTP status code (on the wire as `[[code, answers], …]`: the control
    /// messages are an internally tagged enum, whose maps cannot have number keys).
    #[serde(with = "pairs")]
    pub codes: BTreeMap<u16, u64>,
    /// Request body bytes read.
    pub bytes_in: u64,
    /// Response body bytes written.
    pub bytes_out: u64,
    /// From the request's arrival (the listen queue, for a connection's first request) to
    /// its answer.
    pub duration: Hist,
}

impl EndpointTraffic {
    pub fn answers(&self) -> u64 {
        self.codes.values().sum()
    }

    pub fn add(&mut self, o: &EndpointTraffic) {
        for (code, n) in &o.codes {
            *self.codes.entry(*code).or_default() += n;
        }
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.duration.add(&o.duration);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// By endpoint name ([`ENDPOINTS`]).
    pub endpoints: BTreeMap<String, EndpointTraffic>,
    /// Forward passes that produced an answer.
    pub forward: Hist,
    /// Document pre-processing (tokenizing, decoding images) of requests, per request.
    #[serde(default)]
    pub preprocess: Hist,
    /// How long requests that reached the model waited for it: from arrival (the listen
    /// queue, for a connection's first request) to the start of their pass, less the time
    /// their body took to arrive and be parsed (the access log's `wait_ms`).
    #[serde(default)]
    pub queue_wait: Hist,
    /// Tokens of the token rows given to the model in text passes (`/v1/embeddings`)…
    #[serde(default)]
    pub text_tokens: u64,
    /// …and the tokens those passes held once their rows were padded to one length.
    #[serde(default)]
    pub text_tokens_padded: u64,
    /// The most tokens one pass of a text input held (rows × padded length): at most the
    /// token budget (`max_batch_tokens`), but for a single longer document.
    #[serde(default)]
    pub text_pass_tokens_max: u64,
    /// With batching on: forward passes of the model thread by the rows stacked into them.
    #[serde(default, with = "pairs")]
    pub batches: BTreeMap<u32, u64>,
    /// Access-log lines dropped because stderr could not keep up (`--access-log`).
    #[serde(default)]
    pub access_log_dropped: u64,
    /// Log lines (not access-log lines) dropped because stderr could not keep up.
    #[serde(default)]
    pub log_lines_dropped: u64,
    /// Spans dropped because the collector could not keep up or did not take them.
    #[serde(default)]
    pub trace_spans_dropped: u64,
    /// Requests refused by token auth, by `<port>/<reason>` (`serving/missing`,
    /// `metrics/invalid`…).
    #[serde(default)]
    pub auth_failures: BTreeMap<String, u64>,
    /// Connections a worker closed on their client's account, by reason (`abuse`,
    /// `protocol_error`, `unread`).
    #[serde(default)]
    pub connections_closed: BTreeMap<String, u64>,
}

impl Traffic {
    pub fn add(&mut self, o: &Traffic) {
        for (name, t) in &o.endpoints {
            self.endpoints.entry(name.clone()).or_default().add(t);
        }
        self.forward.add(&o.forward);
        self.preprocess.add(&o.preprocess);
        self.queue_wait.add(&o.queue_wait);
        self.text_tokens += o.text_tokens;
        self.text_tokens_padded += o.text_tokens_padded;
        self.text_pass_tokens_max = self.text_pass_tokens_max.max(o.text_pass_tokens_max);
        for (rows, n) in &o.batches {
            *self.batches.entry(*rows).or_default() += n;
        }
        self.access_log_dropped += o.access_log_dropped;
        self.log_lines_dropped += o.log_lines_dropped;
        self.trace_spans_dropped += o.trace_spans_dropped;
        for (k, n) in &o.auth_failures {
            *self.auth_failures.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &o.connections_closed {
            *self.connections_closed.entry(k.clone()).or_default() += n;
        }
    }

    /// Rows run in the passes counted in `batches`.
    pub fn batch_rows(&self) -> u64 {
        self.batches.iter().map(|(r, n)| u64::from(*r) * n).sum()
    }

    /// Answers of every endpoint.
    pub fn answers(&self) -> u64 {
        self.endpoints.values().map(EndpointTraffic::answers).sum()
    }

    /// Answers with this status, whatever the endpoint.
    pub fn with_code(&self, code: u16) -> u64 {
        self.endpoints
            .values()
            .filter_map(|t| t.codes.get(&code))
            .sum()
    }
}

mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, S: Serializer>(
        m: &BTreeMap<K, u64>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        m.iter().collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, K: Deserialize<'de> + Ord, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<K, u64>, D::Error> {
        Ok(Vec::<(K, u64)>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_adds_up_and_survives_the_control_channel() {
        let mut a = Traffic::default();
        let infer = a.endpoints.entry("infer".into()).or_default();
        infer.codes.insert(200, 3);
        infer.codes.insert(507, 1);
        infer.bytes_in = 10;
        infer.duration.observe(0.002);
        a.forward.observe(0.001);
        a.queue_wait.observe(0.25);
        a.batches.insert(1, 2);
        a.batches.insert(7, 1);
        let msg = crate::protocol::ControlMsg::Metrics {
            traffic: a.clone(),
            allocator_peak: Some(1),
        };
        let crate::protocol::ControlMsg::Metrics { traffic: b, .. } =
            crate::protocol::ControlMsg::from_line(msg.to_line().trim_end()).unwrap()
        else {
            panic!("not a metrics message");
        };
        assert_eq!(a, b);
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(sum.answers(), 8);
        assert_eq!(sum.with_code(507), 2);
        assert_eq!(sum.endpoints["infer"].bytes_in, 20);
        assert_eq!(sum.forward.count(), 2);
        assert_eq!(sum.queue_wait.count(), 2);
        assert_eq!(sum.batches[&7], 2);
        assert_eq!(sum.batch_rows(), 2 * (2 + 7));
    }
}
