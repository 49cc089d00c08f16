//! The model thread's loop with batching on: it takes the first queued request by lane
//! (`lanes.rs`: the highest lane, the oldest within it), adds the queued requests of its
//! lane that can be stacked with it (in the same order, while the rows and the token budget
//! fit), waits up to the batch timeout for more, runs them as one forward pass and cuts the
//! outputs back. Requests of another shape
//! stay queued in order; the first of them by lane leads the next batch, and a request past
//! its age limit ranks as high, so none waits forever.
//!
//! One request's failure never fails the others: when a batched pass raises (or its output
//! cannot be cut), the requests run again one by one and each gets its own outcome. Running
//! out of GPU memory is the exception: every request of the batch gets the 507, and the
//! worker recycles as it does without batching.
//!
//! A request is claimed (and its start written where its ticket reads it) only when its
//! pass begins, so a request waiting in a forming batch can still be withdrawn
//! (`--max-queue-wait`, a stuck model) and then never runs.
//!
//! Batches can form only because the worker takes several requests at once when batching
//! is on: the accept rule (`Counters::can_accept` in `state.rs`) lets a worker work on up
//! to `max_batch_size` requests (one without batching, so an idle sibling is never passed
//! over). What may be stacked together (same trailing shape and dtype, rows within the
//! limit) and how outputs are cut back is `batch.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use tch::Device;

use crate::model::Model;
use tokio::sync::mpsc;

use super::batch::{self, ArgKey, Batching};
use super::lanes;
use super::{encode, guarded, pass, reserved, Job, Outputs, RunError, RunOutput, Taken};
use crate::args::Inputs;
use vramfork::lanes::Lane;

/// Forward passes by rows, as `/metrics` reports them.
pub type BatchCounts = Arc<Mutex<BTreeMap<u32, u64>>>;

/// A job taken off the channel, not yet claimed.
struct Queued {
    job: Job,
    /// Its stacking key and rows (`None`: it runs alone).
    key: Option<(Vec<ArgKey>, usize)>,
    /// Its text rows and their padded length, when it has text rows (`parts.rs`).
    text: Option<(usize, usize)>,
}

/// A pass being formed: what its members share, its rows, its text rows' padded length, and
/// its head's lane (lower lanes do not join it: a larger pass would make the head wait).
struct Forming {
    key: Vec<ArgKey>,
    rows: usize,
    width: usize,
    lane: Lane,
}

impl Forming {
    /// Whether `q` may join it: the same key, the rows within `max`, and the text rows,
    /// padded to the longest of them, within the token budget (`max_batch_tokens`).
    fn admits(&self, q: &Queued, max: usize, budget: Option<usize>, now: Instant) -> bool {
        q.job.place.lane_at(now) <= self.lane
            && q.joins(&self.key, self.rows, max)
            && match (budget, q.text) {
                (Some(tokens), Some((r, w))) => (self.rows + r) * self.width.max(w) <= tokens,
                _ => true,
            }
    }

    fn add(&mut self, q: &Queued) {
        self.rows += q.rows();
        self.width = self.width.max(q.width());
    }

    /// Moves the queued requests that may join it into `members`: by lane, and within one
    /// the rows nearest its length first.
    fn take_queued(
        &mut self,
        pending: &mut VecDeque<Queued>,
        members: &mut Vec<Queued>,
        max: usize,
        budget: Option<usize>,
        now: Instant,
    ) {
        let width = self.width;
        let near = |q: &Queued| q.width().abs_diff(width);
        let mut joining = Vec::new();
        for i in lanes::order_by(pending, |q| q.job.place, now, near) {
            if self.rows >= max {
                break;
            }
            if self.admits(&pending[i], max, budget, now) {
                self.add(&pending[i]);
                joining.push(i);
            }
        }
        // Taken out from the back, so that the indices left stay valid.
        joining.sort_unstable();
        for i in joining.into_iter().rev() {
            members.push(pending.remove(i).expect("an index of the queue"));
        }
    }

    /// Waits up to the batch timeout for requests that may join it (the others queue).
    fn wait_for_more(
        &mut self,
        rt: &tokio::runtime::Runtime,
        rx: &mut mpsc::Receiver<Job>,
        b: Batching,
        budget: Option<usize>,
        pending: &mut VecDeque<Queued>,
        members: &mut Vec<Queued>,
    ) {
        let deadline = tokio::time::Instant::now() + b.timeout;
        while self.rows < b.max_rows {
            let next = rt.block_on(async { tokio::time::timeout_at(deadline, rx.recv()).await });
            match next {
                Ok(Some(job)) => {
                    let q = Queued::new(job);
                    if self.admits(&q, b.max_rows, budget, std::time::Instant::now()) {
                        self.add(&q);
                        members.push(q);
                    } else {
                        pending.push_back(q);
                    }
                }
                // Every sender gone, or the timeout: run what there is.
                Ok(None) | Err(_) => break,
            }
        }
    }
}

impl Queued {
    fn new(job: Job) -> Queued {
        let key = batch::key_of(&job.input);
        let text = super::pass_tokens::text_rows(&job.input.args);
        Queued { job, key, text }
    }

    /// Its text rows' padded length (0: none).
    fn width(&self) -> usize {
        self.text.map_or(0, |t| t.1)
    }

    fn rows(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.1)
    }

    fn joins(&self, key: &[ArgKey], rows: usize, max: usize) -> bool {
        self.key
            .as_ref()
            .is_some_and(|(k, r)| k.as_slice() == key && rows + r <= max)
    }
}

pub fn serve(
    module: Model,
    device: Device,
    mut rx: mpsc::Receiver<Job>,
    b: Batching,
    counts: BatchCounts,
) {
    // Waiting for more requests with a deadline needs a timer: a small runtime of this
    // thread's own (the channel is tokio's).
    let timer = if b.timeout.is_zero() {
        None
    } else {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!("batching: no timer ({e}); batches take what is queued");
                None
            }
        }
    };
    let cap = b.max_rows.max(super::QUEUE);
    let mut pending: VecDeque<Queued> = VecDeque::new();
    // Cleared for good once the model's output cannot be cut into requests: every batch
    // would run twice (batched, then one by one), so requests run alone from then on.
    let mut stacking = true;
    loop {
        if !lanes::refill(&mut rx, &mut pending, cap, Queued::new) {
            return;
        }
        pending.retain(|q| q.job.live());
        let now = Instant::now();
        let head = lanes::first(&pending, |q| q.job.place, now).and_then(|i| pending.remove(i));
        let Some(head) = head else {
            continue;
        };
        let key = head.key.as_ref().filter(|_| stacking).map(|k| k.0.clone());
        let mut forming = key.map(|key| Forming {
            key,
            rows: head.rows(),
            width: head.width(),
            lane: head.job.place.lane_at(now),
        });
        let budget = super::parts::token_budget();
        let mut members = vec![head];
        if let Some(pass) = &mut forming {
            pass.take_queued(&mut pending, &mut members, b.max_rows, budget, now);
            if let Some(rt) = &timer {
                pass.wait_for_more(rt, &mut rx, b, budget, &mut pending, &mut members);
            }
        }
        let taken: Vec<Taken> = members
            .into_iter()
            .filter_map(|q| {
                let rows = q.rows();
                q.job.take().map(|t| Taken { rows, ..t })
            })
            .collect();
        if !run(&module, device, taken, &counts) {
            stacking = false;
        }
    }
}

fn count(counts: &BatchCounts, rows: usize) {
    let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
    *c.entry(rows.max(1) as u32).or_default() += 1;
}

/// Runs claimed requests: as one pass when there are several, each answered. `false` when
/// the model's output could not be cut into requests.
fn run(module: &Model, device: Device, jobs: Vec<Taken>, counts: &BatchCounts) -> bool {
    match jobs.len() {
        0 => true,
        1 => {
            let mut jobs = jobs;
            one(module, device, jobs.pop().expect("one job"), counts);
            true
        }
        _ => together(module, device, jobs, counts),
    }
}

/// One request on its own pass (its `--request-timeout` counts from now).
fn one(module: &Model, device: Device, job: Taken, counts: &BatchCounts) {
    job.restart();
    count(counts, job.rows);
    job.run_alone(module, device);
}

/// Several requests stacked into one pass; run one by one when the pass fails or its
/// output cannot be cut (then `false`).
fn together(module: &Model, device: Device, jobs: Vec<Taken>, counts: &BatchCounts) -> bool {
    let start = Instant::now();
    let wall = SystemTime::now();
    // The first few ids, space-separated (ids may hold commas), and how many in all.
    let ids: Vec<&str> = jobs.iter().take(8).map(|j| &*j.id).collect();
    let _span =
        tracing::info_span!("batch", requests = jobs.len(), request_ids = %ids.join(" ")).entered();
    let rows: Vec<usize> = jobs.iter().map(|j| j.rows).collect();
    count(counts, rows.iter().sum());
    let out = guarded(|| {
        let inputs: Vec<&Inputs> = jobs.iter().map(|j| &j.input).collect();
        let args = batch::stack(&inputs).map_err(RunError::Model)?;
        pass(module, device, &args)
    });
    let out = match out {
        Ok(out) => out,
        Err(e @ (RunError::OutOfMemory(_) | RunError::CudaFatal(_))) => {
            tracing::warn!(requests = jobs.len(), "a batched pass failed: {e}");
            for job in jobs {
                job.answer(Err(e.clone()));
            }
            return true;
        }
        Err(e) => {
            tracing::debug!(
                requests = jobs.len(),
                "a batched pass failed ({e}); running its requests one by one"
            );
            each(module, device, jobs, counts);
            return true;
        }
    };
    let parts = match batch::split(&out, &rows) {
        Ok(parts) => parts,
        Err(why) => {
            tracing::warn!(
                "batching off: the model's output cannot be cut into requests ({why}); from now on every request runs alone. Does the model return its outputs with the batch as their first dimension?"
            );
            drop(out);
            each(module, device, jobs, counts);
            return false;
        }
    };
    let written: Vec<Result<Outputs, RunError>> = jobs
        .iter()
        .zip(&parts)
        .map(|(job, part)| guarded(|| encode(part, &job.encoding)))
        .collect();
    drop(parts);
    drop(out);
    let gpu_reserved = reserved(device);
    let forward = start.elapsed();
    tracing::debug!(
        ms = forward.as_secs_f64() * 1e3,
        requests = jobs.len(),
        rows = rows.iter().sum::<usize>(),
        "batched forward"
    );
    let batch = jobs.len() as u32;
    // The pass, each member's outputs holding it (the last one moved, not cloned: the model
    // thread keeps none of it).
    let pass = super::SharedPass::new(wall, forward, batch, rows.iter().sum::<usize>() as u32);
    let passes = std::iter::repeat_n(pass, jobs.len());
    for ((job, w), pass) in jobs.into_iter().zip(written).zip(passes) {
        job.answer(w.map(|outputs| RunOutput {
            outputs,
            gpu_reserved,
            forward,
            batch,
            inline: false,
            preprocess: None,
            pass: Some(pass),
        }));
    }
    true
}

/// The requests of a failed batch, each on its own pass: only the one that causes the
/// error gets it.
fn each(module: &Model, device: Device, jobs: Vec<Taken>, counts: &BatchCounts) {
    for job in jobs {
        one(module, device, job, counts);
    }
}
