//! [`Reload`]: where a reload (HUP) stands. Each accepted HUP starts a new configuration
//! generation; the configuration to go back to is the last one a worker has been ready
//! with; a worker of the new generation that fails to boot rolls back to it; the reload
//! ends once no worker of an older generation holds a slot. The supervisor keeps the
//! configurations and the workers; this type keeps the generations and decides, so that
//! its tests drive it by value (`C` is any configuration, `&str` in the tests).

/// Where a reload stands.
#[derive(Debug)]
pub(super) struct Reload<C> {
    /// The configuration generation workers are started with now.
    pub gen: u64,
    /// A reload is under way: workers of older generations are being replaced.
    pub under_way: bool,
    /// The configuration (and its generation) to go back to if a worker of the new one
    /// fails to boot: the last one a worker has been ready with.
    fallback: Option<(C, u64)>,
    /// A worker of the current generation has been ready.
    proven: bool,
    /// The reload under way went back to the last configuration that served.
    rolled_back: bool,
}

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Every worker runs the new configuration.
    Reloaded,
    /// Every worker runs the last configuration that served.
    RolledBack,
}

impl<C> Reload<C> {
    pub fn new() -> Reload<C> {
        Reload {
            gen: 0,
            under_way: false,
            fallback: None,
            proven: false,
            rolled_back: false,
        }
    }

    /// A HUP was accepted: `old` is the configuration it replaces. Returns whether it
    /// supersedes a reload under way (whose configuration becomes the one to go back to
    /// only if a worker has been ready with it).
    pub fn started(&mut self, old: C) -> bool {
        let superseded = self.under_way;
        if !self.under_way || self.proven {
            self.fallback = Some((old, self.gen));
        }
        self.under_way = true;
        self.rolled_back = false;
        self.gen += 1;
        self.proven = false;
        superseded
    }

    /// A worker of generation `gen` is ready.
    pub fn ready(&mut self, gen: u64) {
        if gen == self.gen {
            self.proven = true;
        }
    }

    /// A worker of generation `gen` failed to boot. When it is of the current generation and
    /// there is a configuration to go back to, that configuration becomes the current one
    /// (a new generation, proven): returned with the generation its workers had, whose
    /// workers are now of the current one.
    pub fn boot_failed(&mut self, gen: u64) -> Option<(C, u64)> {
        if gen != self.gen {
            return None;
        }
        let (good, good_gen) = self.fallback.take()?;
        self.gen += 1;
        self.proven = true;
        self.rolled_back = true;
        Some((good, good_gen))
    }

    /// No worker of an older generation holds a slot any more (`settled`): the reload under
    /// way, if any, ends, and how.
    pub fn settle(&mut self, settled: bool) -> Option<Outcome> {
        if !self.under_way || !settled {
            return None;
        }
        self.under_way = false;
        self.fallback = None;
        Some(if self.rolled_back {
            Outcome::RolledBack
        } else {
            Outcome::Reloaded
        })
    }

    /// The configuration to go back to, and its generation.
    #[cfg(test)]
    pub fn fallback(&self) -> Option<&(C, u64)> {
        self.fallback.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_ends_when_the_old_workers_are_gone() {
        let mut r = Reload::new();
        assert_eq!(r.settle(true), None, "no reload under way");
        assert!(!r.started("a"));
        assert_eq!((r.gen, r.under_way), (1, true));
        assert_eq!(r.fallback(), Some(&("a", 0)));
        assert_eq!(r.settle(false), None, "old workers still hold slots");
        r.ready(1);
        assert_eq!(r.settle(true), Some(Outcome::Reloaded));
        assert_eq!((r.under_way, r.fallback()), (false, None));
    }

    #[test]
    fn a_failed_boot_of_the_new_generation_rolls_back_once() {
        let mut r = Reload::new();
        r.started("a");
        // A worker of the old generation failing is no reason to roll back.
        assert_eq!(r.boot_failed(0), None);
        assert_eq!(r.boot_failed(1), Some(("a", 0)));
        assert_eq!(
            r.gen, 2,
            "the restored configuration is a generation of its own"
        );
        // Nothing left to go back to.
        assert_eq!(r.boot_failed(2), None);
        assert_eq!(r.settle(true), Some(Outcome::RolledBack));
    }

    #[test]
    fn a_hup_during_a_reload_keeps_the_last_configuration_that_served() {
        let mut r = Reload::new();
        r.started("a");
        // No worker of "b" (generation 1) was ever ready: "a" stays the one to go back to.
        assert!(r.started("b"));
        assert_eq!((r.gen, r.fallback()), (2, Some(&("a", 0))));
        // Once one of "c" (generation 2) is ready, "c" is the one to go back to.
        r.ready(2);
        assert!(r.started("c"));
        assert_eq!((r.gen, r.fallback()), (3, Some(&("c", 2))));
        assert_eq!(r.boot_failed(3), Some(("c", 2)));
    }
}
