//! The export: a bounded queue the request path pushes what its spans are made of into (one
//! uncontended lock, never a wait: an answered request's record, [`Build`]), drained by a
//! thread of its own that writes the spans straight into protobuf (`otlp.rs`) and POSTs them
//! to the collector as OTLP/HTTP protobuf over one connection kept open between exports (over TLS for an
//! `https://` endpoint: [`super::transport`]). A collector that is slow, down or answering errors
//! costs spans, never a request: when the queue is full a span is dropped and counted, and
//! a batch the collector did not take is dropped and counted (no retry: the next batch is
//! newer). The counter is `vramfork_trace_spans_dropped_total`; a warning is logged when
//! exports start failing and an event (`trace_export_recovered`, with what was dropped) when
//! they work again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::otlp;
use super::transport::Transport;
use vramfork::otel::OtelConfig;

/// Spans held at most while the exporter is behind (the specification's
/// `OTEL_BSP_MAX_QUEUE_SIZE` default).
pub const QUEUE: usize = 2048;
/// Spans in one POST at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`'s default).
const BATCH: usize = 512;
/// How long the exporter waits for more spans before it sends what it has
/// (`OTEL_BSP_SCHEDULE_DELAY` is 5 s by default; spans of a served request are wanted sooner).
const DELAY: Duration = Duration::from_millis(500);
/// After an export failed, how long the exporter waits before it tries the next one: the
/// queue fills meanwhile and further records are dropped as they come, unbuilt (a collector
/// that is down costs neither the building of spans nobody takes nor a connection attempt
/// per batch).
const PAUSE: Duration = Duration::from_secs(1);

/// What becomes spans on the exporter thread: an answered request's record.
pub trait Build: Send {
    /// How many spans it makes (what it takes of the queue's room).
    fn count(&self) -> usize;
    /// Its spans (on the exporter thread), written into `into` as an export's
    /// `ScopeSpans.spans` entries (`otlp::span`); how many.
    fn build(self: Box<Self>, into: &mut Vec<u8>) -> usize;
}

/// One entry of the queue: a span written already (a batched pass's, as `Span`'s message
/// body: `otlp::span_body`), or a record to build.
enum Entry {
    Built(Vec<u8>),
    Later(Box<dyn Build>, usize),
}

impl Entry {
    fn count(&self) -> usize {
        match self {
            Entry::Built(_) => 1,
            Entry::Later(_, n) => *n,
        }
    }
}

/// The queue and its counters, shared by the request path and the exporter thread.
pub struct Exporter {
    queue: Mutex<Queue>,
    more: Condvar,
    dropped: AtomicU64,
}

/// The entries, and the spans they make.
#[derive(Default)]
struct Queue {
    entries: VecDeque<Entry>,
    spans: usize,
}

impl Exporter {
    /// Starts the exporter thread for `config`; `resource`: the attributes of this worker.
    pub fn start(config: OtelConfig, resource: Vec<(&'static str, i64)>) -> Arc<Exporter> {
        let e = Arc::new(Exporter {
            queue: Mutex::new(Queue::default()),
            more: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let worker = e.clone();
        let spawned = std::thread::Builder::new()
            .name("vf-span-export".into())
            .spawn(move || worker.run(&config, resource));
        if let Err(err) = spawned {
            tracing::warn!(
                event = "trace_export_failing",
                "the span exporter thread could not start ({err}); spans are dropped and counted"
            );
        }
        e
    }

    /// Takes a finished span, its message body written (never waits on the collector).
    pub fn push(&self, span: Vec<u8>) {
        self.add(Entry::Built(span));
    }

    /// Takes a record whose spans the exporter thread builds (the request path: never waits
    /// on the collector; dropped and counted whole when the queue has no room for them).
    pub fn later(&self, b: Box<dyn Build>) {
        let n = b.count();
        self.add(Entry::Later(b, n));
    }

    fn add(&self, e: Entry) {
        let n = e.count();
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let before = q.spans;
        let fits = before + n <= QUEUE;
        if fits {
            q.spans += n;
            q.entries.push_back(e);
        }
        // The thread is woken once, when a batch is first waiting (a wake is a system call:
        // not one per request while it is busy; when busy it finds the batch on its return).
        let full = before < BATCH && q.spans >= BATCH;
        drop(q);
        if !fits {
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
        }
        if full {
            self.more.notify_one();
        }
    }

    /// Spans dropped so far (queue full, or not taken by the collector).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The exporter thread: a batch when BATCH spans are waiting or DELAY passed.
    fn run(&self, config: &OtelConfig, resource: Vec<(&'static str, i64)>) {
        // What had been dropped when the failures began.
        let mut failing: Option<u64> = None;
        // An https endpoint's certificates are read here, off every request's path.
        let mut transport = Transport::new(config);
        let head = head(config, &resource);
        // The spans and the body are kept from export to export (a body of 512 spans is
        // tens of kB: allocated anew, each could be mapped and unmapped).
        let (mut spans, mut body) = (Vec::new(), Vec::new());
        loop {
            let entries: Vec<Entry> = {
                let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                let (mut q, _) = self
                    .more
                    .wait_timeout_while(q, DELAY, |q| q.spans < BATCH)
                    .unwrap_or_else(|p| p.into_inner());
                let mut taken = Vec::new();
                let mut n = 0;
                while n < BATCH {
                    let Some(e) = q.entries.pop_front() else {
                        break;
                    };
                    n += e.count();
                    taken.push(e);
                }
                q.spans -= n;
                taken
            };
            // Built here, with no lock held: a record's building may queue a pass's span.
            spans.clear();
            let mut n = 0u64;
            for e in entries {
                n += match e {
                    Entry::Built(s) => {
                        otlp::span_written(&mut spans, &s);
                        1
                    }
                    Entry::Later(b, _) => b.build(&mut spans) as u64,
                };
            }
            if n == 0 {
                continue;
            }
            otlp::request(&mut body, &head, &spans);
            match transport.post(config, &body) {
                Ok(()) => {
                    if let Some(before) = failing.take() {
                        tracing::info!(
                            event = "trace_export_recovered",
                            dropped = self.dropped() - before,
                            "the collector at {} takes spans again; {} were dropped meanwhile",
                            config.endpoint,
                            self.dropped() - before
                        );
                    }
                }
                Err(why) => {
                    if failing.is_none() {
                        failing = Some(self.dropped());
                        tracing::warn!(
                            event = "trace_export_failing",
                            endpoint = %config.endpoint,
                            "spans could not be exported ({why}); they are dropped and counted (vramfork_trace_spans_dropped_total) until the collector takes them again"
                        );
                    }
                    self.dropped.fetch_add(n, Ordering::Relaxed);
                    std::thread::sleep(PAUSE);
                }
            }
        }
    }
}

/// What every export of this worker repeats: its resource (`service.name`, the
/// `OTEL_RESOURCE_ATTRIBUTES`, then `resource`) and the instrumentation scope.
fn head(config: &OtelConfig, resource: &[(&'static str, i64)]) -> otlp::Head {
    let mut attributes = vec![("service.name", otlp::Value::Str(&config.service_name))];
    attributes.extend(
        config
            .resource
            .iter()
            .map(|(k, v)| (k.as_str(), otlp::Value::Str(v))),
    );
    attributes.extend(resource.iter().map(|(k, v)| (*k, otlp::Value::Int(*v))));
    otlp::Head::new(&attributes, "vramfork", env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Three;

    impl Build for Three {
        fn count(&self) -> usize {
            3
        }

        fn build(self: Box<Self>, _: &mut Vec<u8>) -> usize {
            0
        }
    }

    #[test]
    fn a_record_is_queued_or_dropped_whole_and_counted_as_its_spans() {
        let e = Exporter {
            queue: Mutex::new(Queue::default()),
            more: Condvar::new(),
            dropped: AtomicU64::new(0),
        };
        let fit = QUEUE / 3;
        for _ in 0..fit + 5 {
            e.later(Box::new(Three));
        }
        let q = e.queue.lock().unwrap();
        assert_eq!((q.entries.len(), q.spans), (fit, 3 * fit));
        assert_eq!(e.dropped(), 15, "five records of three spans");
    }
}
