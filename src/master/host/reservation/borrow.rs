//! Room borrowed from idle neighbours (`master::host::lending`): what this server lacks for
//! one worker on its first slot's GPU, the want it writes in the ledger naming the
//! neighbours it asks, and at start — when the GPU is full but idle neighbours could make
//! room — the wait for them to give it (the ledger's lock let go meanwhile).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::start::{busy, say_wait};
use super::Reservation;
use crate::master::config::Config;
use crate::master::host::ledger::{
    boot_ms, Domains, Held, Ledger, Others, Want, RENEW_EVERY, START_WAIT,
};
use crate::master::host::lending::{choose, pinned_words, Choice};
use crate::master::plan::{default_utilization, per_worker_mb, share_mb, Plan};
use crate::master::resources::Resources;

/// How long a start waits for idle neighbours to give their room (their workers finish
/// their requests and exit) before it plans with what there is.
pub const START_LEND_WAIT: Duration = Duration::from_secs(60);

/// What one worker needs on a domain, and what is free there now.
#[derive(Debug, Clone)]
pub struct Need {
    pub domain: String,
    pub need_mb: u64,
    pub room_mb: u64,
}

impl Need {
    pub fn short_mb(&self) -> u64 {
        self.need_mb.saturating_sub(self.room_mb)
    }
}

impl Reservation {
    /// What one worker of slot 0 of `plan` lacks on its GPU's domain now (`None`: no slot on
    /// a GPU, or the ledger cannot be read).
    pub fn need(&self, plan: &Plan, reserve_mb: u64) -> Option<Need> {
        let slot = plan.placement.iter().find(|p| p.slot == 0)?;
        let g = slot.gpu.as_ref()?;
        let gpu = plan.gpus.iter().find(|x| x.index == g.index)?;
        let others = self.others()?;
        let domain = self.key(&g.uuid);
        let taken = others.get(&domain).map_or(0, |o| o.mb);
        Some(Need {
            room_mb: share_mb(gpu.total_mb, gpu.fraction).saturating_sub(taken),
            need_mb: per_worker_mb(plan.planned_typ_mb).saturating_add(reserve_mb),
            domain,
        })
    }

    /// What one more worker of `per_mb` (with the reserve) lacks on GPU `gpu` of `plan`,
    /// where the ledger leaves `room_mb` to this server.
    pub fn need_on(&self, plan: &Plan, gpu: u32, room_mb: u64, per_mb: u64) -> Option<Need> {
        let g = plan.gpus.iter().find(|g| g.index == gpu)?;
        Some(Need {
            domain: self.key(&g.uuid),
            need_mb: per_mb,
            room_mb,
        })
    }

    /// Whom to ask for `need` by `deadline` (an [`Instant`]), from the ledger as it is now.
    pub fn choose(&self, need: &Need, deadline: Instant) -> Option<Choice> {
        let servers = self.ledger.servers().ok()?;
        let now = boot_ms();
        let by = now
            + deadline
                .saturating_duration_since(Instant::now())
                .as_millis() as u64;
        Some(choose(
            self.ledger.id(),
            &need.domain,
            need.short_mb(),
            &servers,
            now,
            by,
        ))
    }

    /// Writes (or with `None` removes) this server's want for room.
    pub fn ask(&self, app: &str, need: Option<(&Need, &Choice)>) {
        let want = need.map(|(n, c)| {
            let short = BTreeMap::from([(n.domain.clone(), n.short_mb())]);
            Want::new(app, self.ledger.id(), short, c.from.clone())
        });
        if let Err(e) = self.ledger.ask(want.as_ref()) {
            tracing::warn!(
                target: "app",
                event = "ledger_write_failed",
                "cannot write this server's want for room in the GPU-memory ledger ({}): {e}",
                self.ledger.dir().display()
            );
        }
    }

    /// The live wants in the ledger (none when it cannot be read).
    pub fn wants(&self) -> Vec<Want> {
        self.ledger.wants().unwrap_or_default()
    }

    /// This server's id in the ledger.
    pub fn id(&self) -> &str {
        self.ledger.id()
    }

    /// What this server says of itself in its entry from its next write on.
    pub fn set_status(&self, status: Option<crate::master::host::ledger::Status>) {
        self.ledger.set_status(status);
    }
}

/// At start, under the lock (`held`), with the others' reservations `others`: when no GPU
/// of `res` has room for one worker of the declared size, and idle neighbours hold enough,
/// asks them (a want), lets the lock go, waits until the room is there (at most
/// [`START_LEND_WAIT`]), and takes the lock and reads the others again. `Err`: the room is
/// held by pinned neighbours only (named), so no worker can start (exit 2).
pub(super) fn at_start(
    cfg: &Config,
    ledger: &Ledger,
    domains: &Domains,
    res: &Resources,
    held: Option<Held>,
    others: BTreeMap<String, Others>,
) -> Result<(Option<Held>, BTreeMap<String, Others>), String> {
    let typ = cfg.app.metadata.est_gpu_mem_typ;
    if held.is_none() || typ == 0 || res.gpus.is_empty() {
        return Ok((held, others));
    }
    let need_mb = per_worker_mb(typ).saturating_add(cfg.gpu.gpu_reserve_mb);
    let fraction = |total| {
        cfg.gpu
            .gpu_memory_utilization
            .unwrap_or_else(|| default_utilization(total))
    };
    let needs: Vec<Need> = res
        .gpus
        .iter()
        .map(|g| {
            let domain = domains
                .get(&g.uuid)
                .map_or(g.uuid.clone(), |d| d.key.clone());
            let taken = others.get(&domain).map_or(0, |o| o.mb);
            let share = share_mb(g.total_mb(), fraction(g.total_mb()));
            Need {
                room_mb: share.saturating_sub(taken),
                need_mb,
                domain,
            }
        })
        .collect();
    if needs.iter().any(|n| n.short_mb() == 0) {
        return Ok((held, others));
    }
    let servers = ledger.servers().unwrap_or_default();
    let now = boot_ms();
    let deadline = now + START_LEND_WAIT.as_millis() as u64;
    // Pinned servers are what blocks when, were every other neighbour gone, the room
    // still would not hold one worker on any GPU.
    let mut pinned = Vec::new();
    let mut blocked = true;
    let pick = needs.iter().find_map(|n| {
        let c = choose(
            ledger.id(),
            &n.domain,
            n.short_mb(),
            &servers,
            now,
            deadline,
        );
        let pinned_mb: u64 = c.pinned.iter().map(|p| p.2).sum();
        let taken = others.get(&n.domain).map_or(0, |o| o.mb);
        blocked &= n.room_mb + taken.saturating_sub(pinned_mb) < n.need_mb;
        pinned.extend(c.pinned.clone());
        c.enough.then_some((n.clone(), c))
    });
    let Some((need, choice)) = pick else {
        if blocked && !pinned.is_empty() {
            return Err(format!(
                "no GPU has room for one worker ({need_mb} MB with the reserve) and pinned servers hold it (--pin, they never lend): {}; free a GPU for this server or unpin one of them",
                pinned_words(&pinned)
            ));
        }
        return Ok((held, others));
    };
    tracing::info!(
        target: "app",
        event = "room_asked",
        short_mb = need.short_mb(),
        lenders = choice.from.len(),
        "no GPU has room for one worker: asking {} idle neighbour(s) on {} for {} MB through the ledger ({:?})",
        choice.from.len(),
        need.domain,
        need.short_mb(),
        choice.from
    );
    drop(held);
    wait_for_lenders(
        &cfg.app.metadata.name,
        ledger,
        domains,
        &need,
        &choice,
        &others,
    );
    let path = ledger.lock_path();
    let held = ledger
        .lock(START_WAIT, |h| say_wait(&path, h))
        .map_err(|n| busy(&path, &n, START_WAIT))?;
    let others = ledger.others(domains)?;
    Ok((Some(held), others))
}

/// Writes the want for `need` naming `choice`'s lenders and waits until the room is there
/// (their reservations, read in `others` before, gone), at most [`START_LEND_WAIT`]; the
/// want goes either way.
fn wait_for_lenders(
    app: &str,
    ledger: &Ledger,
    domains: &Domains,
    need: &Need,
    choice: &Choice,
    others: &BTreeMap<String, Others>,
) {
    let short = BTreeMap::from([(need.domain.clone(), need.short_mb())]);
    let t0 = Instant::now();
    let mut written = None::<Instant>;
    let got = loop {
        if written.is_none_or(|w| w.elapsed() >= RENEW_EVERY) {
            let want = Want::new(app, ledger.id(), short.clone(), choice.from.clone());
            let _ = ledger.ask(Some(&want));
            written = Some(Instant::now());
        }
        let taken = ledger
            .others(domains)
            .ok()
            .and_then(|o| o.get(&need.domain).map(|x| x.mb))
            .unwrap_or(0);
        let share = need.room_mb + others.get(&need.domain).map_or(0, |o| o.mb);
        if share.saturating_sub(taken) >= need.need_mb {
            break true;
        }
        if t0.elapsed() >= START_LEND_WAIT {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = ledger.ask(None);
    tracing::info!(
        target: "app",
        event = "room_lent",
        ms = t0.elapsed().as_secs_f64() * 1e3,
        outcome = if got { "given" } else { "timeout" },
        "{}",
        if got { "the neighbours gave their room" } else { "the neighbours did not give their room in time: planning with what there is" }
    );
}
