//! Lending GPU room to neighbours, and waiting for theirs (`master::host::lending`), on the
//! supervisor's loop. As a lender: a server idle for `--evictable-after` (nothing in
//! flight, not `--pin`ned) that a neighbour's want names gives its workers' room back as an
//! idle release does (`idle.rs`); its next request re-admits it. As an asker: a request
//! arriving while this server holds no room waits in the listen queue — the wait shows in
//! the queue gauge — while the server asks the least valuable idle neighbours for room,
//! until its deadline (`--request-timeout`) would pass (counting the measured reload time):
//! then, or at once when no neighbour can become lendable by then, it is answered 503 with
//! `Retry-After`. What the server says of itself in its ledger entry (`ledger::Status`) is
//! made here each turn.

use std::time::{Duration, Instant};

use super::Supervisor;
use crate::master::host::ledger::{boot_ms, State, Status};
use crate::master::host::lending;

/// How often a lendable server reads the wants in the ledger.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// Where lending stands for this server.
#[derive(Debug)]
pub(super) struct Lend {
    evictable_after: Option<Duration>,
    pin: bool,
    /// How long a worker took to be ready: the last re-admission (request to ready), else
    /// the first boot.
    reload_ms: Option<u64>,
    /// A request waits for room: since when, and whom the want last written asked.
    waiting: Option<Waiting>,
    /// The asker this server lends to while its workers exit.
    lending_to: Option<String>,
    looked: Option<Instant>,
    /// What the entry last said (state, lending to, live workers, reload time): a change is
    /// written at once.
    said: Option<(State, Option<String>, u32, Option<u64>)>,
}

#[derive(Debug)]
struct Waiting {
    since: Instant,
    asked: Option<(Vec<String>, Instant)>,
}

impl Lend {
    pub fn new(evictable_after: Option<Duration>, pin: bool) -> Lend {
        Lend {
            evictable_after,
            pin,
            reload_ms: None,
            waiting: None,
            lending_to: None,
            looked: None,
            said: None,
        }
    }

    /// Whether this server may give its room when idle.
    pub fn lends(&self) -> bool {
        !self.pin && self.evictable_after.is_some()
    }

    /// A worker was ready `ms` after it started: the reload time, until a re-admission
    /// measures one.
    pub fn booted(&mut self, ms: f64) {
        self.reload_ms.get_or_insert(ms as u64);
    }

    /// A re-admission took `ms` from the request to a worker ready.
    pub fn reloaded(&mut self, ms: f64) {
        self.reload_ms = Some(ms as u64);
    }

    /// Whether a request waits for room now (the listening socket is then not polled).
    pub fn waiting(&self) -> bool {
        self.waiting.is_some()
    }
}

impl Supervisor {
    /// Whether this server lends now: lending on, idle for `--evictable-after` with nothing
    /// in flight, workers to give, nothing under way.
    fn lendable_now(&self, now: Instant) -> bool {
        let (Some(after), Some(idle)) = (self.lend.evictable_after, self.idle.as_ref()) else {
            return false;
        };
        !self.lend.pin
            && self.stopping.is_none()
            && !self.reload.under_way
            && self.target > 0
            && !self.idle_owns_target()
            && now.duration_since(idle.last_request()) >= after
    }

    /// A lendable server reads the wants: one naming it takes its room (an idle release
    /// for that asker).
    pub(super) fn lend_turn(&mut self, now: Instant) {
        if !self.lendable_now(now) || self.lend.looked.is_some_and(|t| now - t < LOOK_EVERY) {
            return;
        }
        self.lend.looked = Some(now);
        let Some(res) = &self.reservation else {
            return;
        };
        let me = res.id().to_string();
        let Some(want) = res.wants().into_iter().find(|w| w.from.contains(&me)) else {
            return;
        };
        tracing::info!(
            event = "lent",
            to = want.app.as_str(),
            to_id = want.id.as_str(),
            workers = self.target,
            short_mb = want.short_mb.values().sum::<u64>(),
            "{} (server {}) needs {:?} MB of GPU memory and this server is the least valuable idle one it found: retiring its {} workers to give their room; its next request waits for room again",
            want.app,
            want.id,
            want.short_mb,
            self.target
        );
        self.lend.lending_to = Some(want.id);
        self.idle_release(now);
    }

    /// The released workers have all exited: the room is given.
    pub(super) fn lent_given(&mut self) {
        self.lend.lending_to = None;
    }

    /// A request waits while this server holds no room and none is free: asks idle
    /// neighbours for it. `true`: keep waiting; `false`: the deadline would pass first (or
    /// nothing can make room by then), answer 503.
    pub(super) fn wait_for_room(&mut self, now: Instant) -> bool {
        let Some(res) = &self.reservation else {
            return false;
        };
        let Some(need) = res.need(&self.plan, self.cfg.gpu.gpu_reserve_mb) else {
            return false;
        };
        let w = self.lend.waiting.get_or_insert(Waiting {
            since: now,
            asked: None,
        });
        let deadline = w.since + self.cfg.limits.request_timeout;
        let reload = Duration::from_millis(self.lend.reload_ms.unwrap_or(0));
        let by = deadline.checked_sub(reload).unwrap_or(now);
        let choice = res.choose(&need, by);
        let possible = need.short_mb() == 0 || choice.as_ref().is_some_and(|c| c.possible_by);
        if now >= by || !possible {
            let waited = now.duration_since(w.since).as_secs_f64();
            tracing::warn!(
                event = "room_wait",
                outcome = "deadline",
                waited_s = waited,
                short_mb = need.short_mb(),
                "a request waited {waited:.1} s for {} MB of GPU room; no idle neighbour can give it before its deadline (--request-timeout {:?}, less the reload time {:?}): answered 503",
                need.short_mb(),
                self.cfg.limits.request_timeout,
                reload
            );
            self.stop_waiting();
            return false;
        }
        let Some(choice) = choice else {
            return true;
        };
        let due = match &w.asked {
            None => true,
            Some((from, at)) => {
                *from != choice.from || now.duration_since(*at) >= super::idle::RENEW
            }
        };
        if due {
            if w.asked
                .as_ref()
                .is_none_or(|(from, _)| *from != choice.from)
            {
                tracing::info!(
                    event = "room_asked",
                    short_mb = need.short_mb(),
                    lenders = choice.from.len(),
                    "a request waits for {} MB of GPU room on {}: asking {:?} (least valuable idle first; {} MB already coming)",
                    need.short_mb(),
                    need.domain,
                    choice.from,
                    choice.coming_mb
                );
            }
            w.asked = Some((choice.from.clone(), now));
            res.ask(&self.cfg.app.metadata.name, Some((&need, &choice)));
        }
        true
    }

    /// TTIN found no room for one more worker (`need_mb` with the reserve) on `gpu`, where
    /// the ledger leaves `room_mb`: the least valuable idle neighbours there are asked for
    /// it once (the want is not renewed: it lapses with its lease), so that a TTIN sent
    /// once they have given it grows the pool. Not while a request waits for room.
    pub(super) fn ask_to_grow(&self, gpu: u32, room_mb: u64, need_mb: u64) {
        let Some(res) = &self.reservation else {
            return;
        };
        let Some(need) = res.need_on(&self.plan, gpu, room_mb, need_mb) else {
            return;
        };
        let Some(choice) = res
            .choose(&need, Instant::now())
            .filter(|c| !c.from.is_empty() && self.lend.waiting.is_none())
        else {
            return;
        };
        tracing::info!(
            event = "room_asked",
            short_mb = need.short_mb(),
            lenders = choice.from.len(),
            "asking {:?} (least valuable idle first) for {} MB on {} to grow by one worker: send TTIN again once they have given it",
            choice.from,
            need.short_mb(),
            need.domain
        );
        res.ask(&self.cfg.app.metadata.name, Some((&need, &choice)));
    }

    /// The wait is over (room found, or refused): the want goes.
    pub(super) fn stop_waiting(&mut self) {
        if self.lend.waiting.take().is_some() {
            if let Some(res) = &self.reservation {
                res.ask("", None);
            }
        }
    }

    /// Room found for a waiting request: said with the time it waited.
    pub(super) fn room_found(&mut self, now: Instant) {
        if let Some(w) = &self.lend.waiting {
            let waited = now.duration_since(w.since).as_secs_f64();
            tracing::info!(
                event = "room_wait",
                outcome = "given",
                waited_s = waited,
                "a request waited {waited:.1} s for GPU room: found, a worker starts"
            );
        }
        self.stop_waiting();
    }

    /// What this server says of itself in its ledger entry now, and whether that changed
    /// since the last write.
    pub(super) fn ledger_status(&mut self, now: Instant) -> (Status, bool) {
        let port = self
            .listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port());
        let state = if self.lend.waiting.is_some() {
            State::Waiting
        } else if self.idle_released() {
            State::Lent
        } else if self.lend.pin {
            State::Pinned
        } else if self.lendable_now(now) {
            State::Idle
        } else {
            State::Serving
        };
        let boot = boot_ms();
        let last = self.idle.as_ref().map(|i| i.last_request());
        let last_ms = last.map(|t| boot.saturating_sub(now.duration_since(t).as_millis() as u64));
        let lendable_from = match (self.lend.lends(), self.lend.evictable_after, last_ms) {
            (true, Some(after), Some(l)) => Some(l + after.as_millis() as u64),
            _ => None,
        };
        let served = self.idle.as_ref().map_or(0, |i| i.served());
        let idle_s = last.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let reserved: u64 = self.live_reserved().iter().map(|w| w.mb).sum();
        let live_workers = self.workers.len() as u32;
        let status = Status {
            state,
            port,
            live_workers,
            served,
            last_request_boot_ms: last_ms,
            lendable_from_boot_ms: lendable_from,
            reload_ms: self.lend.reload_ms,
            value: lending::value(served, idle_s, self.lend.reload_ms, reserved),
            lending_to: self.lend.lending_to.clone(),
        };
        let key = (
            state,
            status.lending_to.clone(),
            live_workers,
            status.reload_ms,
        );
        let news = self.lend.said.as_ref() != Some(&key);
        self.lend.said = Some(key);
        (status, news)
    }
}
