//! The model thread's queue by lane: which queued job runs next. The highest lane first
//! (`vramfork::lanes`), the oldest first within a lane; a job that has waited past its age
//! limit is served as if `high` (then among the `high` ones by when it was queued), so a
//! lower lane waits at most that long behind a stream of higher ones. Without batching the
//! loop takes [`first`]; with batching the head is [`first`] and the requests that join it
//! are tried in [`order_by`] (within a lane, the rows nearest the pass's length first).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use vramfork::lanes::Lane;

/// Where a job stands in the queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    lane: Lane,
    /// When it was queued.
    since: Instant,
    /// From when it is served as if `high`.
    aged_at: Instant,
}

impl Place {
    /// A job queued now in `lane`, served as if `high` once it waited `age_limit`.
    pub(crate) fn now(lane: Lane, age_limit: Duration) -> Place {
        let since = Instant::now();
        Place {
            lane,
            since,
            aged_at: since + age_limit,
        }
    }

    /// Its lane at `now`: `high` once aged.
    pub(super) fn lane_at(&self, now: Instant) -> Lane {
        self.rank(now).0
    }

    /// Its rank at `now` (lower is served first): its lane, `high` once aged, then its age.
    fn rank(&self, now: Instant) -> (Lane, Instant) {
        let lane = if now >= self.aged_at {
            Lane::High
        } else {
            self.lane
        };
        (lane, self.since)
    }
}

/// Takes what the channel holds into `queue` (as `make` wraps it), up to `cap`, waiting for
/// one job when `queue` is empty; `false` once every sender is gone and nothing is queued.
pub(super) fn refill<T>(
    rx: &mut tokio::sync::mpsc::Receiver<super::Job>,
    queue: &mut VecDeque<T>,
    cap: usize,
    make: impl Fn(super::Job) -> T,
) -> bool {
    if queue.is_empty() {
        match rx.blocking_recv() {
            Some(job) => queue.push_back(make(job)),
            None => return false,
        }
    }
    while queue.len() < cap {
        match rx.try_recv() {
            Ok(job) => queue.push_back(make(job)),
            Err(_) => break,
        }
    }
    true
}

/// The index of the job of `queue` served first at `now` (of equal ranks, the earlier).
pub(super) fn first<T>(
    queue: &VecDeque<T>,
    place: impl Fn(&T) -> Place,
    now: Instant,
) -> Option<usize> {
    (0..queue.len()).min_by_key(|&i| place(&queue[i]).rank(now))
}

/// The indices of `queue` by lane at `now` (the highest first), within a lane those of the
/// least `distance` first (a pass's rows grouped by length), then the oldest.
pub(super) fn order_by<T>(
    queue: &VecDeque<T>,
    place: impl Fn(&T) -> Place,
    now: Instant,
    distance: impl Fn(&T) -> usize,
) -> Vec<usize> {
    let mut at: Vec<usize> = (0..queue.len()).collect();
    at.sort_by_key(|&i| {
        let (lane, since) = place(&queue[i]).rank(now);
        (lane, distance(&queue[i]), since)
    });
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(lane: Lane, since: Instant, age_limit: Duration) -> Place {
        Place {
            lane,
            since,
            aged_at: since + age_limit,
        }
    }

    #[test]
    fn the_highest_lane_first_and_the_oldest_first_within_a_lane() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        let q: VecDeque<Place> = [
            at(Lane::Low, t, hour),
            at(Lane::Normal, t + ms(1), hour),
            at(Lane::High, t + ms(3), hour),
            at(Lane::Low, t + ms(4), hour),
            at(Lane::High, t + ms(2), hour),
        ]
        .into();
        let now = t + ms(10);
        assert_eq!(first(&q, |p| *p, now), Some(4));
        assert_eq!(order_by(&q, |p| *p, now, |_| 0), [4, 2, 1, 0, 3]);
        // Within a lane, the nearest first: the two high jobs swap by distance.
        let far = |p: &Place| usize::from(p.since == t + ms(2));
        assert_eq!(order_by(&q, |p| *p, now, far), [2, 4, 1, 0, 3]);
        assert_eq!(first(&VecDeque::<Place>::new(), |p| *p, now), None);
    }

    #[test]
    fn a_job_waiting_past_its_age_limit_is_served_as_if_high() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let q: VecDeque<Place> = [
            at(Lane::Low, t, ms(500)),
            at(Lane::High, t + ms(100), ms(500)),
            at(Lane::High, t + ms(600), ms(500)),
        ]
        .into();
        // Before its limit the low job waits behind every high one…
        assert_eq!(order_by(&q, |p| *p, t + ms(499), |_| 0), [1, 2, 0]);
        // …after it, it is high, and the oldest of the high ones.
        assert_eq!(order_by(&q, |p| *p, t + ms(500), |_| 0), [0, 1, 2]);
        assert_eq!(first(&q, |p| *p, t + ms(700)), Some(0));
    }
}
