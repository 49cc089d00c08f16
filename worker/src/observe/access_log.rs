//! The access log (`--access-log`): one line per answered request, as text or as a JSON line
//! in the shape of the other log lines (`--log-format`), written to stderr.
//!
//! Off the request path: an answer only pushes its [`Record`] into a bounded buffer (one
//! uncontended lock, no system call, no formatting); a thread of its own formats what has
//! gathered every [`FLUSH_EVERY`] and hands the lines to the process's log path
//! (`vramfork::logging`), which writes whole lines of at most 4,096 bytes (`PIPE_BUF`, a
//! longer line's path cut to fit) and never waits on stderr. When stderr is slow (a full
//! pipe, a stalled journal) the log path's queue fills, and further lines are dropped and
//! counted (`vramfork_access_log_dropped_total`) rather than ever making a request, or
//! another log line, wait.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::runner::SharedPass;
use vramfork::lanes::{Lane, LANES};

/// How often the writer thread writes what has gathered.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Records held at most while the writer is behind; more are dropped and counted.
pub const CAPACITY: usize = 16_384;

/// What the pipeline learns about a model request, for its access-log line: set in the
/// request's extensions by dispatch when the log is on, filled in as the request goes.
#[derive(Debug)]
pub struct Trace {
    bytes_in: AtomicU64,
    /// Microseconds from arrival to the start of its pass (listen queue + model queue);
    /// `u64::MAX` until known.
    wait_us: AtomicU64,
    /// Microseconds from arrival to the start of its pass (all of it: reading, parsing,
    /// pre-processing the body too); `u64::MAX` until known.
    began_us: AtomicU64,
    /// Microseconds of its pass; `u64::MAX` until known.
    model_us: AtomicU64,
    /// Requests in the pass it ran in (1: alone); 0 until known.
    batch: AtomicU32,
    /// The tokens of its pass's text rows, real and padded (`u64::MAX`: not a text pass).
    tokens: [AtomicU64; 2],
    /// Its pass ran on the event loop's thread (`runner/inline.rs`).
    inline: std::sync::atomic::AtomicBool,
    /// The priority lane its passes waited in: 1 + its index in [`LANES`]; 0 until one ran.
    lane: AtomicU8,
    /// The pass it shared with other requests, when it was batched.
    pass: Mutex<Option<Arc<SharedPass>>>,
    /// Its passes before the last, when it ran in several (`/v1/embeddings` with more
    /// inputs than one pass takes).
    earlier: Mutex<Vec<Timing>>,
    /// Its inputs' tokenizing, when its handler tokenized them (`/v1/embeddings`).
    tokenized: std::sync::OnceLock<Tokenize>,
    /// Its documents' pre-processing, when the pipeline did it (`POST /`, v2 REST, gRPC).
    preprocessed: std::sync::OnceLock<Preprocess>,
}

/// From a request's arrival to the start of work that took `took` and has just ended (its
/// `tokenize` or `preprocess` span's start: after any wait for a pool slot).
pub fn work_began_after(arrived: Instant, took: Duration) -> Duration {
    Instant::now()
        .checked_sub(took)
        .unwrap_or(arrived)
        .saturating_duration_since(arrived)
}

/// A request's documents pre-processed by the pipeline (texts tokenized, images decoded),
/// for its `preprocess` span: counts, never the documents.
#[derive(Debug, Clone, Copy)]
pub struct Preprocess {
    /// From the request's arrival to the start of the work (after its wait for a slot).
    pub after: Duration,
    pub took: Duration,
    /// Documents given to text inputs, and to image inputs.
    pub texts: u32,
    pub images: u32,
}

/// A request's tokenizing (`/v1/embeddings`), for its `tokenize` span: counts, never text.
#[derive(Debug, Clone, Copy)]
pub struct Tokenize {
    /// From the request's arrival to the start of its tokenizing.
    pub after: Duration,
    pub took: Duration,
    /// Inputs tokenized, their tokens, and how many were cut to `max_length`.
    pub inputs: u32,
    pub tokens: u64,
    pub truncated: u32,
}

impl Default for Trace {
    fn default() -> Trace {
        Trace {
            bytes_in: AtomicU64::new(0),
            wait_us: AtomicU64::new(u64::MAX),
            began_us: AtomicU64::new(u64::MAX),
            model_us: AtomicU64::new(u64::MAX),
            batch: AtomicU32::new(0),
            inline: std::sync::atomic::AtomicBool::new(false),
            lane: AtomicU8::new(0),
            pass: Mutex::new(None),
            earlier: Mutex::new(Vec::new()),
            tokens: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            tokenized: std::sync::OnceLock::new(),
            preprocessed: std::sync::OnceLock::new(),
        }
    }
}

impl Trace {
    pub fn bytes_in(&self, n: usize) {
        self.bytes_in.store(n as u64, Ordering::Relaxed);
    }

    /// Its pass started after it waited `waited` (listen queue and model queue), `began`
    /// after the request arrived. A pass after one that ran keeps that one's timing among
    /// its earlier passes (its spans).
    pub fn started(&self, waited: Duration, began: Duration) {
        if let Some(done) = self.timing() {
            self.model_us.store(u64::MAX, Ordering::Relaxed);
            for t in &self.tokens {
                t.store(u64::MAX, Ordering::Relaxed);
            }
            *self.pass.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.earlier
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(done);
        }
        self.began_us
            .store(began.as_micros() as u64, Ordering::Relaxed);
        self.wait_us
            .store(waited.as_micros() as u64, Ordering::Relaxed);
    }

    /// Its passes wait in `lane`.
    pub fn lane(&self, lane: Lane) {
        self.lane.store(1 + lane.index() as u8, Ordering::Relaxed);
    }

    /// The lane its passes waited in (`None`: it reached no pass).
    pub fn lane_name(&self) -> Option<&'static str> {
        let i = usize::from(self.lane.load(Ordering::Relaxed));
        i.checked_sub(1)
            .and_then(|i| LANES.get(i))
            .map(|l| l.name())
    }

    /// Its inputs were tokenized (by its handler).
    pub fn tokenized(&self, t: Tokenize) {
        let _ = self.tokenized.set(t);
    }

    /// Its tokenizing, when its handler tokenized its inputs.
    pub fn tokenize(&self) -> Option<Tokenize> {
        self.tokenized.get().copied()
    }

    /// Its documents were pre-processed (by the pipeline).
    pub fn preprocessed(&self, p: Preprocess) {
        let _ = self.preprocessed.set(p);
    }

    /// Its documents' pre-processing, when the pipeline did it.
    pub fn preprocess(&self) -> Option<Preprocess> {
        self.preprocessed.get().copied()
    }

    /// Its wait, its pass and the pass's size, once its pass ran (for its spans).
    pub fn timing(&self) -> Option<Timing> {
        let (wait, model) = (
            self.wait_us.load(Ordering::Relaxed),
            self.model_us.load(Ordering::Relaxed),
        );
        let began = match self.began_us.load(Ordering::Relaxed) {
            u64::MAX => wait,
            b => b,
        };
        (wait != u64::MAX && model != u64::MAX).then(|| Timing {
            waited: Duration::from_micros(wait),
            began: Duration::from_micros(began),
            took: Duration::from_micros(model),
            batch: self.batch.load(Ordering::Relaxed),
            inline: self.inline.load(Ordering::Relaxed),
            pass: self.pass.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            tokens: match self.tokens.each_ref().map(|t| t.load(Ordering::Relaxed)) {
                [u64::MAX, _] | [_, u64::MAX] => None,
                [real, padded] => Some((real, padded)),
            },
        })
    }

    /// The waits and the passes of its passes before the last, in µs (0, 0: one pass).
    fn earlier_us(&self) -> (u64, u64) {
        let earlier = self.earlier.lock().unwrap_or_else(|p| p.into_inner());
        earlier.iter().fold((0, 0), |(w, m), t| {
            (
                w + t.waited.as_micros() as u64,
                m + t.took.as_micros() as u64,
            )
        })
    }

    /// How many of its passes ran, and how many of those ran alone (not batched), without
    /// building their timings (on the request's path: its spans' count).
    pub fn pass_counts(&self) -> (usize, usize) {
        let earlier = self.earlier.lock().unwrap_or_else(|p| p.into_inner());
        let alone = earlier.iter().filter(|t| t.pass.is_none()).count();
        let mut n = (earlier.len(), alone);
        drop(earlier);
        if let Some(t) = self.timing() {
            n.0 += 1;
            n.1 += usize::from(t.pass.is_none());
        }
        n
    }

    /// The timing of each of its passes that ran, in order (one, but for a request run in
    /// several passes).
    pub fn passes(&self) -> Vec<Timing> {
        let mut all = self
            .earlier
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        all.extend(self.timing());
        all
    }

    /// Its last pass (a text pass) held `real` tokens, `padded` once padded.
    pub fn pass_tokens(&self, real: u64, padded: u64) {
        self.tokens[0].store(real, Ordering::Relaxed);
        self.tokens[1].store(padded, Ordering::Relaxed);
    }

    /// Its pass took `took` and ran `batch` requests, on the event loop's thread if `inline`;
    /// `pass`: the pass, when it was batched.
    pub fn ran(&self, took: Duration, batch: u32, inline: bool, pass: Option<&Arc<SharedPass>>) {
        if let Some(p) = pass {
            *self.pass.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.clone());
        }
        self.inline.store(inline, Ordering::Relaxed);
        self.model_us
            .store(took.as_micros() as u64, Ordering::Relaxed);
        self.batch.store(batch, Ordering::Relaxed);
    }
}

/// What the pipeline learnt of a model request's time (`Trace::timing`), for its spans.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Its wait: the listen queue and the model queue.
    pub waited: Duration,
    /// From arrival to the start of its pass.
    pub began: Duration,
    /// Its pass.
    pub took: Duration,
    /// Requests in its pass.
    pub batch: u32,
    /// The pass ran on the event loop's thread.
    pub inline: bool,
    /// The pass, when it was batched: its span is the pass's own (`spans/pass.rs`).
    pub pass: Option<Arc<SharedPass>>,
    /// A text pass's tokens, real and padded (`infer::text_passes`).
    pub tokens: Option<(u64, u64)>,
}

/// One answered request.
#[derive(Debug, Clone)]
pub struct Record {
    pub time: SystemTime,
    pub request_id: String,
    /// The W3C trace it belongs to (`crate::observe::trace_context`): its trace id is logged.
    pub context: crate::observe::trace_context::TraceContext,
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    pub status: u16,
    pub bytes_out: usize,
    /// From its arrival to its answer.
    pub total: Duration,
    /// What the pipeline learnt (none for requests that are not model requests).
    pub trace: Option<Arc<Trace>>,
}

/// The log: a bounded buffer and the thread that writes it.
pub struct AccessLog {
    pending: Mutex<Vec<Record>>,
    /// Records dropped because the buffer was full.
    dropped: AtomicU64,
    /// Serialises flushes (the thread's and the final one), so lines keep their order.
    out: Mutex<()>,
    json: bool,
    slot: u32,
    pid: u32,
}

impl AccessLog {
    /// Starts the writer thread.
    pub fn start(json: bool, slot: u32) -> Arc<AccessLog> {
        let log = Arc::new(AccessLog {
            pending: Mutex::new(Vec::with_capacity(256)),
            dropped: AtomicU64::new(0),
            out: Mutex::new(()),
            json,
            slot,
            pid: std::process::id(),
        });
        let writer = log.clone();
        let spawned = std::thread::Builder::new()
            .name("vf-access-log".into())
            .spawn(move || loop {
                std::thread::sleep(FLUSH_EVERY);
                writer.flush();
            });
        if let Err(e) = spawned {
            tracing::warn!("the access log's writer thread could not start ({e}); lines are written at exit only");
        }
        log
    }

    /// Takes one record (the request path: never blocks on output).
    pub fn push(&self, r: Record) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.len() >= CAPACITY {
            drop(p);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        p.push(r);
    }

    /// Lines dropped so far: records the buffer had no room for, and lines the log path
    /// dropped (no room in its queue, or left unwritten when the worker exited).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
            + vramfork::logging::dropped(vramfork::logging::Kind::Access)
    }

    /// Hands what is left to the log path: the worker calls it before it exits (which then
    /// writes it, for a bounded time: `vramfork::logging::flush`).
    pub fn flush_at_exit(&self) {
        self.flush();
    }

    /// Hands everything gathered so far to the log path, one line per record (which counts
    /// what it has no room for). Never waits on stderr.
    fn flush(&self) {
        let _out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            return;
        }
        let lines = batch.iter().map(|r| {
            let mut text = String::with_capacity(256 + r.target.len());
            self.line(r, &mut text);
            text.into_bytes()
        });
        vramfork::logging::submit(lines, vramfork::logging::Kind::Access);
    }

    /// Appends one line for `r`.
    fn line(&self, r: &Record, out: &mut String) {
        let t = r.trace.as_deref();
        let us = |a: Option<u64>| a.filter(|v| *v != u64::MAX);
        let bytes_in = t.map_or(0, |t| t.bytes_in.load(Ordering::Relaxed));
        // A request of several passes: its waits and its passes summed.
        let (wait_before, model_before) = t.map_or((0, 0), Trace::earlier_us);
        let wait = us(t.map(|t| t.wait_us.load(Ordering::Relaxed))).map(|w| w + wait_before);
        let model = us(t.map(|t| t.model_us.load(Ordering::Relaxed))).map(|m| m + model_before);
        let batch = t.map_or(0, |t| t.batch.load(Ordering::Relaxed));
        let inline = t.is_some_and(|t| t.inline.load(Ordering::Relaxed));
        let lane = t.and_then(Trace::lane_name);
        let ms = |v: u64| v as f64 / 1e3;
        let total = r.total.as_micros() as u64;
        let time = rfc3339(r.time);
        if self.json {
            let s = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into());
            let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| format!("{:.3}", ms(v)));
            let _ = writeln!(
                out,
                "{{\"timestamp\":\"{time}\",\"level\":\"INFO\",\"fields\":{{\"message\":\"access\",\"event\":\"access\",\"request_id\":{},\"trace_id\":{},\"method\":{},\"path\":{},\"status\":{},\"bytes_in\":{bytes_in},\"bytes_out\":{},\"wait_ms\":{},\"model_ms\":{},\"total_ms\":{:.3},\"batch\":{batch},\"inline\":{inline},\"lane\":{},\"slot\":{},\"pid\":{}}},\"target\":\"vramfork::access\"}}",
                s(&r.request_id),
                s(r.context.trace_id()),
                s(&r.method),
                s(&r.target),
                r.status,
                r.bytes_out,
                opt(wait),
                opt(model),
                ms(total),
                lane.map_or("null".into(), s),
                self.slot,
                self.pid,
            );
        } else {
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{:.3}", ms(v)));
            let target = printable(&r.target);
            // The fields after a long target are kept: the target is what gets cut (a
            // JSON line's longest string, the path, is cut by the log path itself).
            let start = out.len();
            let rest = |target: &str, out: &mut String| {
                let _ = writeln!(
                    out,
                    "{time}  INFO access: {} {target} {} request_id={} trace_id={} bytes_in={bytes_in} bytes_out={} wait_ms={} model_ms={} total_ms={:.3} batch={batch} inline={inline} lane={} slot={} pid={}",
                    r.method,
                    r.status,
                    r.request_id,
                    r.context.trace_id(),
                    r.bytes_out,
                    opt(wait),
                    opt(model),
                    ms(total),
                    lane.unwrap_or("-"),
                    self.slot,
                    self.pid,
                );
            };
            rest(&target, out);
            let excess = (out.len() - start).saturating_sub(vramfork::logging::PIPE_BUF);
            if excess > 0 {
                out.truncate(start);
                let mark = vramfork::logging::marker(target.len());
                let mut keep = target.len().saturating_sub(excess + mark.len());
                while !target.is_char_boundary(keep) {
                    keep -= 1;
                }
                let cut = format!(
                    "{}{}",
                    &target[..keep],
                    vramfork::logging::marker(target.len() - keep)
                );
                rest(&cut, out);
            }
        }
    }
}

/// A request target with spaces as `%20` and control characters escaped (`\n`), so that a
/// text line stays one line with space-separated fields.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ' ' => out.push_str("%20"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// `2026-11-23T21:50:00.123456Z` (UTC, microseconds), as the other log lines write time.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = String::with_capacity(27);
    let _ = write!(
        s,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_rfc3339_utc_with_microseconds() {
        let t = UNIX_EPOCH + Duration::new(1_795_470_600, 123_456_000);
        assert_eq!(rfc3339(t), "2026-11-23T21:50:00.123456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000000Z");
    }

    fn record(target: &str, trace: Option<Arc<Trace>>) -> Record {
        Record {
            time: UNIX_EPOCH,
            request_id: "id-1".into(),
            context: {
                let mut h = hyper::header::HeaderMap::new();
                h.insert(
                    &crate::observe::trace_context::HEADER,
                    hyper::header::HeaderValue::from_static(
                        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    ),
                );
                crate::observe::trace_context::TraceContext::of(&h)
            },
            method: "POST".into(),
            target: target.into(),
            status: 200,
            bytes_out: 12,
            total: Duration::from_micros(2500),
            trace,
        }
    }

    fn log(json: bool) -> AccessLog {
        AccessLog {
            pending: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            out: Mutex::new(()),
            json,
            slot: 3,
            pid: 42,
        }
    }

    #[test]
    fn a_json_line_is_one_json_object_with_every_field() {
        let t = Arc::new(Trace::default());
        t.bytes_in(100);
        t.started(Duration::from_micros(1500), Duration::from_micros(2000));
        t.ran(Duration::from_micros(900), 4, true, None);
        t.lane(Lane::Low);
        let mut s = String::new();
        log(true).line(&record("/v2/models/m\"x/infer?a=b", Some(t)), &mut s);
        assert!(s.ends_with('\n') && s.matches('\n').count() == 1, "{s:?}");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let f = &v["fields"];
        assert_eq!(f["event"], "access");
        assert_eq!(f["path"], "/v2/models/m\"x/infer?a=b");
        assert_eq!(f["status"], 200);
        assert_eq!(f["bytes_in"], 100);
        assert_eq!(f["bytes_out"], 12);
        assert_eq!(f["wait_ms"], 1.5);
        assert_eq!(f["model_ms"], 0.9);
        assert_eq!(f["total_ms"], 2.5);
        assert_eq!(f["batch"], 4);
        assert_eq!(f["inline"], true);
        assert_eq!(f["lane"], "low");
        assert_eq!((f["slot"].as_u64(), f["pid"].as_u64()), (Some(3), Some(42)));
        assert_eq!(v["target"], "vramfork::access");
        // A request that never reached the model: no wait, no model time.
        let mut s = String::new();
        log(true).line(&record("/healthz", None), &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert!(v["fields"]["model_ms"].is_null() && v["fields"]["wait_ms"].is_null());
        assert!(v["fields"]["lane"].is_null());
    }

    #[test]
    fn a_text_line_stays_one_line() {
        let mut s = String::new();
        log(false).line(&record("/a b\nc", None), &mut s);
        assert_eq!(s.matches('\n').count(), 1, "{s:?}");
        assert!(s.contains(" POST /a%20b\\nc 200 request_id=id-1 "), "{s:?}");
        assert!(s.contains(
            "wait_ms=- model_ms=- total_ms=2.500 batch=0 inline=false lane=- slot=3 pid=42"
        ));
    }

    #[test]
    fn a_long_target_is_cut_so_that_the_line_fits_with_all_its_fields() {
        let target = format!("/a b/{}", "é".repeat(5000));
        let mut s = String::new();
        log(false).line(&record(&target, None), &mut s);
        assert!(s.len() <= vramfork::logging::PIPE_BUF, "{} bytes", s.len());
        assert!(s.contains(" POST /a%20b/éé"), "{s:.80}");
        assert!(s.contains("-bytes-cut] 200 request_id=id-1 "), "{s}");
        assert!(s.ends_with(" slot=3 pid=42\n"));
        // A short one is left as it is.
        let mut s = String::new();
        log(false).line(&record("/short", None), &mut s);
        assert!(s.contains(" POST /short 200 ") && !s.contains("cut]"));
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let l = log(true);
        for _ in 0..CAPACITY + 5 {
            l.push(record("/", None));
        }
        assert_eq!(l.dropped(), 5);
        assert_eq!(l.pending.lock().unwrap().len(), CAPACITY);
    }
}
