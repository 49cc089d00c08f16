//! Which neighbours give their room to a server that needs it, and what each one's room is
//! worth. Every server says in its ledger entry ([`Status`]) whether and from when it lends
//! and what losing its room costs per MB; the server that lacks room reads those entries and
//! chooses ([`choose`]): the neighbours lendable now on that memory domain, least valuable
//! first, only as many as cover what it lacks. The choice is the asker's alone (written in
//! its want, `ledger::Want`), so two lenders never both give for one shortfall.
//!
//! A server waiting for room holds none (it was released, or has not started), so two
//! servers waiting on each other's room cannot deadlock: whichever takes the room first
//! serves, goes idle, and lends to the other.

use crate::master::host::ledger::{Entry, State, Status};

/// What losing a server's room costs, per MB it frees: how much and how recently it was
/// used (requests answered, on a log scale, over the minutes since the last one) × its
/// measured reload time in seconds (a server that comes back fast costs little), ÷ the
/// GB it frees. Unmeasured reload times count as 1 s.
pub fn value(served: u64, idle_s: f64, reload_ms: Option<u64>, reserved_mb: u64) -> f64 {
    let use_ = (1.0 + (served as f64).ln_1p()) / (1.0 + idle_s.max(0.0) / 60.0);
    let reload_s = reload_ms.map_or(1.0, |ms| ms as f64 / 1e3).max(0.001);
    use_ * reload_s / (reserved_mb.max(1) as f64 / 1024.0)
}

/// What a server that lacks `short_mb` on memory domain `domain` can ask for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Choice {
    /// The servers to ask now (by id), least valuable first.
    pub from: Vec<String>,
    /// MB already coming: neighbours lending to this server, their workers still exiting.
    pub coming_mb: u64,
    /// Whether what is lendable now (and coming) covers the shortfall.
    pub enough: bool,
    /// Whether it could be covered by `by_boot_ms`: neighbours that become lendable by then
    /// counted too (they have not had a request for long enough by then).
    pub possible_by: bool,
    /// The pinned neighbours holding room there: (app, port, MB).
    pub pinned: Vec<(String, u16, u64)>,
}

/// The neighbours `me` asks for `short_mb` on `domain`, from the live `servers` (by id),
/// at `now_boot_ms`; `by_boot_ms`: the asker's deadline.
pub fn choose(
    me: &str,
    domain: &str,
    short_mb: u64,
    servers: &[(String, Entry)],
    now_boot_ms: u64,
    by_boot_ms: u64,
) -> Choice {
    let mut c = Choice::default();
    let mut lendable: Vec<(f64, &str, u64)> = Vec::new();
    let mut later_mb = 0u64;
    for (id, e) in servers.iter().filter(|(id, _)| id != me) {
        let mb = e.gpus.get(domain).copied().unwrap_or(0);
        let Some(s) = e.status.as_ref().filter(|_| mb > 0) else {
            continue;
        };
        if s.lending_to.as_deref() == Some(me) {
            c.coming_mb = c.coming_mb.saturating_add(mb);
            continue;
        }
        match (s.state, s.lendable_from_boot_ms) {
            (State::Pinned, _) => c.pinned.push((e.app.clone(), s.port, mb)),
            (_, None) => {}
            // Holding room while it says lent or waiting: its entry was written by a
            // re-admission a moment before its state follows; it may lend later.
            (State::Lent | State::Waiting, Some(from)) if from <= by_boot_ms => {
                later_mb = later_mb.saturating_add(mb)
            }
            (State::Lent | State::Waiting, _) => {}
            (_, Some(from)) if from <= now_boot_ms && lends_now(s) => {
                lendable.push((s.value, id, mb));
            }
            (_, Some(from)) if from <= by_boot_ms => later_mb = later_mb.saturating_add(mb),
            _ => {}
        }
    }
    lendable.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    let mut got = c.coming_mb;
    for (_, id, mb) in lendable {
        if got >= short_mb {
            break;
        }
        got = got.saturating_add(mb);
        c.from.push(id.to_string());
    }
    c.enough = got >= short_mb;
    c.possible_by = got.saturating_add(later_mb) >= short_mb;
    c
}

/// Whether a server lends when asked: idle (its state says it went past its
/// `--evictable-after` with nothing in flight).
fn lends_now(s: &Status) -> bool {
    s.state == State::Idle
}

/// The pinned neighbours, in words: `app (port P, N MB)`, comma-separated.
pub fn pinned_words(pinned: &[(String, u16, u64)]) -> String {
    let each = pinned
        .iter()
        .map(|(app, port, mb)| format!("{app} (port {port}, {mb} MB)"));
    each.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn server(state: State, mb: u64, value: f64, from: Option<u64>) -> Entry {
        Entry {
            version: 2,
            pid: 1,
            app: "a".into(),
            boot_id: "b".into(),
            expires_boot_ms: 0,
            gpus: BTreeMap::from([("GPU-1".to_string(), mb)]),
            seat: None,
            status: Some(Status {
                state,
                port: 8000,
                live_workers: 1,
                served: 0,
                last_request_boot_ms: None,
                lendable_from_boot_ms: from,
                reload_ms: None,
                value,
                lending_to: None,
            }),
        }
    }

    #[test]
    fn the_least_valuable_idle_neighbours_lend_only_as_much_as_is_needed() {
        let s = |id: &str, e| (id.to_string(), e);
        let servers = vec![
            s("dear", server(State::Idle, 8000, 9.0, Some(0))),
            s("cheap", server(State::Idle, 4000, 1.0, Some(0))),
            s("mid", server(State::Idle, 4000, 2.0, Some(0))),
            s("busy", server(State::Serving, 20_000, 0.1, Some(50_000))),
            s("pin", server(State::Pinned, 4000, 0.0, None)),
        ];
        let c = choose("me", "GPU-1", 6000, &servers, 1000, 10_000);
        assert_eq!(c.from, vec!["cheap", "mid"]);
        assert!(c.enough && c.possible_by);
        assert_eq!(c.pinned, vec![("a".to_string(), 8000, 4000)]);
        // More than every idle one holds: not enough now, and the busy one cannot become
        // lendable before the deadline.
        let c = choose("me", "GPU-1", 40_000, &servers, 1000, 10_000);
        assert!(!c.enough && !c.possible_by, "{c:?}");
        // ... but it can by a later deadline.
        assert!(choose("me", "GPU-1", 30_000, &servers, 1000, 60_000).possible_by);
        // What a neighbour lends to me already counts first.
        let mut lending = server(State::Lent, 6000, 0.0, None);
        lending.status.as_mut().unwrap().lending_to = Some("me".into());
        let mut with = servers.clone();
        with.push(s("giving", lending));
        let c = choose("me", "GPU-1", 6000, &with, 1000, 10_000);
        assert_eq!((c.from.len(), c.coming_mb, c.enough), (0, 6000, true));
    }

    #[test]
    fn value_grows_with_use_and_reload_time_and_falls_with_idle_time_and_room_freed() {
        let base = value(10, 60.0, Some(2000), 4096);
        assert!(value(100, 60.0, Some(2000), 4096) > base);
        assert!(value(10, 600.0, Some(2000), 4096) < base);
        assert!(value(10, 60.0, Some(8000), 4096) > base);
        assert!(value(10, 60.0, Some(2000), 16_384) < base);
    }
}
