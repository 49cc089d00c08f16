//! A forward pass several requests shared, as the model thread ran it: when it started, how
//! long it took, how many requests and rows it carried. Every member's outputs hold it; what
//! observes passes (the trace export, `observe/spans/pass.rs`) attaches its own state to it once,
//! which lives until the last member lets go of the pass. The runner knows nothing of what is
//! attached.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

pub struct SharedPass {
    /// When the pass started (wall clock, for spans).
    pub start: SystemTime,
    /// How long it took.
    pub took: Duration,
    /// The requests it carried.
    pub requests: u32,
    /// The rows it carried.
    pub rows: u32,
    attached: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl SharedPass {
    pub fn new(start: SystemTime, took: Duration, requests: u32, rows: u32) -> Arc<SharedPass> {
        Arc::new(SharedPass {
            start,
            took,
            requests,
            rows,
            attached: OnceLock::new(),
        })
    }

    /// What an observer keeps of this pass, made by `make` the first time anything asks;
    /// dropped with the pass. One kind of attachment per pass.
    pub fn attached<T: Any + Send + Sync>(&self, make: impl FnOnce(&SharedPass) -> T) -> &T {
        self.attached
            .get_or_init(|| Box::new(make(self)))
            .downcast_ref::<T>()
            .expect("one kind of attachment per pass")
    }
}

impl std::fmt::Debug for SharedPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPass")
            .field("took", &self.took)
            .field("requests", &self.requests)
            .field("rows", &self.rows)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attachment_is_made_once_and_dropped_with_the_last_holder() {
        struct Seen(Arc<std::sync::atomic::AtomicU32>);
        impl Drop for Seen {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let pass = SharedPass::new(SystemTime::now(), Duration::from_millis(2), 3, 5);
        let member = pass.clone();
        let mut made = 0;
        pass.attached(|p| {
            made += 1;
            assert_eq!((p.requests, p.rows), (3, 5));
            Seen(dropped.clone())
        });
        member.attached(|_| {
            made += 1;
            Seen(dropped.clone())
        });
        assert_eq!(made, 1);
        drop(pass);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(member);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
