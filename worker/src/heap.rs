//! The worker's heap (glibc's malloc, which libtorch's CPU allocator uses too): settings
//! that keep a model's working set mapped from one forward pass to the next, and handing
//! memory back to the system after an unusually large request.
//!
//! Two needs pull apart. A model allocates the same activations and scratch buffers on
//! every pass; if those are mapped and unmapped each time, every pass pays a page fault per
//! 4 KiB page touched (a CIFAR-size CNN lost 40 % of its speed to this when blocks of 4 MB
//! and more were mapped per pass). A request with a large body (tens of MB of JSON) should
//! not leave the worker at its peak once answered. So:
//!
//! - blocks below [`MMAP_THRESHOLD`] (32 MiB, glibc's own upper bound for its adaptive
//!   threshold on 64-bit) come from the heap and are reused pass after pass, and freed
//!   memory at the top of the heap is kept up to [`TRIM_THRESHOLD`] rather than unmapped
//!   after each pass; larger blocks are mapped and go back when freed;
//! - one heap (arena) for every thread of the worker: glibc would give the model thread,
//!   the parsing threads and the event loop arenas of their own, and `malloc_trim` cannot
//!   shrink the top of a thread's arena, so a large request's memory stayed resident there;
//!   a thread's arena also re-creates its extra heaps (a fresh mapping, faulted in again)
//!   when a large block does not fit the freed one. The threads mostly take turns (the
//!   event loop parses and answers, the model thread runs), and small blocks come from each
//!   thread's own cache without the arena's lock;
//! - the worker's own large buffers — request bodies, parsed inputs, answers: Rust
//!   allocations of [`OWN_MAPPING`] or more — get mappings of their own ([`RequestMemory`],
//!   the worker's global allocator), so they go back to the system the moment they are
//!   freed, whatever the heap keeps;
//! - after a request whose body was unusually large for this worker ([`BodySizes`]), the
//!   free memory of the heap (libtorch's copies of a large input and output) is handed back
//!   (`malloc_trim`).
//!
//! Measured in `docs/performance.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks at least this large get their own mapping, returned to the system when freed.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of a heap is kept up to this before glibc unmaps it by itself.
const TRIM_THRESHOLD: i32 = 512 << 20;

/// Sets glibc's thresholds and one arena (see above); before the worker starts a thread.
pub fn configure() {
    // SAFETY: mallopt only changes glibc's allocation parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Hands the free memory of every heap back to the system (`malloc_trim`).
pub fn trim() {
    // SAFETY: malloc_trim has no preconditions; it only releases free memory.
    unsafe { libc::malloc_trim(0) };
}

/// The worker's own allocations at least this large get a mapping of their own.
pub const OWN_MAPPING: usize = 4 << 20;
const PAGE: usize = 4096;

/// The worker's global allocator: glibc's malloc ([`System`]) for everything but blocks of
/// [`OWN_MAPPING`] or more (page alignment at most), which are mapped (`mmap`) and unmapped
/// when freed, grown in place or moved by `mremap`. Only Rust allocations come here;
/// libtorch allocates through malloc directly, and its blocks stay in the heap.
pub struct RequestMemory;

fn own(layout: &Layout) -> bool {
    layout.size() >= OWN_MAPPING && layout.align() <= PAGE
}

fn pages(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// SAFETY: every block is either System's (small or over-aligned layouts, decided by `own`
// from the layout alone, so alloc and dealloc agree) or a page-aligned anonymous mapping of
// `pages(size)` bytes, which satisfies any alignment up to PAGE and is unmapped with the
// same length.
unsafe impl GlobalAlloc for RequestMemory {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if own(&layout) {
            map(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if own(&layout) {
            // Fresh anonymous pages read as zeros.
            map(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if own(&layout) {
            // SAFETY: `ptr` is a mapping made by `map` for this layout's size.
            unsafe { libc::munmap(ptr.cast(), pages(layout.size())) };
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees new_size, rounded to the alignment, fits an isize.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (own(&layout), own(&new)) {
            // SAFETY: forwarded with the caller's guarantees.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                // SAFETY: `ptr` is a mapping of pages(layout.size()) bytes; mremap may move it.
                let p = unsafe {
                    libc::mremap(
                        ptr.cast(),
                        pages(layout.size()),
                        pages(new_size),
                        libc::MREMAP_MAYMOVE,
                    )
                };
                if p == libc::MAP_FAILED {
                    std::ptr::null_mut()
                } else {
                    p.cast()
                }
            }
            _ => {
                // SAFETY: `new` has a non-zero size (the caller's guarantee) and valid align.
                let p = unsafe { self.alloc(new) };
                if !p.is_null() {
                    // SAFETY: both blocks are valid for the smaller size and do not overlap;
                    // the old one is then freed with its own layout.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                p
            }
        }
    }
}

/// A body smaller than this never counts as unusually large.
const UNUSUAL_MIN: u64 = 1 << 20;
/// A body this many times the typical one is unusually large.
const UNUSUAL_RATIO: u64 = 4;
/// The typical size moves by 1/this of the difference with each body.
const SMOOTHING: i64 = 8;

/// The body sizes a worker sees, to tell an unusually large one: larger than
/// [`UNUSUAL_MIN`] and than [`UNUSUAL_RATIO`] × the typical size so far (an exponentially
/// weighted mean). A worker whose every request is large keeps that memory for the next
/// one, as the model's own loop would; one large request among small ones is trimmed.
#[derive(Debug, Default)]
pub struct BodySizes {
    typical: AtomicU64,
}

impl BodySizes {
    /// Records a body of `size` bytes; says whether it was unusually large (then call
    /// [`trim`] once it is answered).
    pub fn unusual(&self, size: usize) -> bool {
        let size = size as u64;
        let typical = self.typical.load(Ordering::Relaxed);
        let next = typical as i64 + (size as i64 - typical as i64) / SMOOTHING;
        self.typical.store(next.max(0) as u64, Ordering::Relaxed);
        size > UNUSUAL_MIN && size > typical.saturating_mul(UNUSUAL_RATIO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_large_body_among_small_ones_is_unusual_a_stream_of_large_ones_is_not() {
        let b = BodySizes::default();
        for _ in 0..20 {
            assert!(!b.unusual(200 << 10), "small bodies are never unusual");
        }
        assert!(b.unusual(7 << 20), "7 MB among 200 kB bodies");
        // The same large size again and again becomes the usual.
        let unusual = (0..40).filter(|_| b.unusual(2 << 20)).count();
        assert!(
            unusual <= 3,
            "{unusual} of 40 two-MB bodies counted as unusual"
        );
        assert!(!b.unusual(2 << 20));
        assert!(b.unusual(64 << 20), "64 MB among 2 MB bodies");
        let fresh = BodySizes::default();
        assert!(fresh.unusual(2 << 20), "the first large body is unusual");
        assert!(!fresh.unusual(UNUSUAL_MIN as usize), "at the minimum: not");
    }

    #[test]
    fn large_blocks_are_mapped_and_keep_their_bytes_across_every_kind_of_growth() {
        let a = RequestMemory;
        let small = Layout::from_size_align(1000, 8).unwrap();
        let fill = |p: *mut u8, n: usize| {
            // SAFETY: called below only on blocks of at least `n` bytes.
            (0..n).for_each(|i| unsafe { *p.add(i) = i as u8 })
        };
        // SAFETY: as above.
        let check = |p: *const u8, n: usize| (0..n).all(|i| unsafe { *p.add(i) } == i as u8);
        // SAFETY: each block is used within its size and freed with its own layout.
        unsafe {
            let p = a.alloc(small);
            fill(p, 1000);
            // small -> mapped
            let p = a.realloc(p, small, OWN_MAPPING + 10);
            assert_eq!(p as usize % PAGE, 0, "a mapping is page-aligned");
            assert!(check(p, 1000));
            let big = Layout::from_size_align(OWN_MAPPING + 10, 8).unwrap();
            fill(p, OWN_MAPPING + 10);
            // mapped -> larger mapping (mremap)
            let p = a.realloc(p, big, 3 * OWN_MAPPING);
            assert!(check(p, OWN_MAPPING + 10));
            // mapped -> small
            let bigger = Layout::from_size_align(3 * OWN_MAPPING, 8).unwrap();
            let p = a.realloc(p, bigger, 500);
            assert!(check(p, 500));
            a.dealloc(p, Layout::from_size_align(500, 8).unwrap());
            // zeroed and over-aligned blocks
            let z = Layout::from_size_align(OWN_MAPPING, 64).unwrap();
            let p = a.alloc_zeroed(z);
            assert!((0..OWN_MAPPING).step_by(4093).all(|i| *p.add(i) == 0));
            a.dealloc(p, z);
            let odd = Layout::from_size_align(OWN_MAPPING, 2 * PAGE).unwrap();
            let p = a.alloc(odd);
            assert_eq!(p as usize % (2 * PAGE), 0, "over-aligned: glibc's, aligned");
            a.dealloc(p, odd);
        }
    }
}
