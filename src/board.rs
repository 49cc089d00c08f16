//! The idle board: one page of memory shared by the master and every worker, where each
//! worker shows whether it is **free** — accepting, with nothing in hand (no request being
//! worked on, no connection it took in the last moments still on its way to the model) —
//! **taking** a connection (about to be busy, or free again if a sibling took it first), or
//! **busy** ([`Seat`]).
//!
//! Why: workers share one listening socket, and the kernel hands a new connection to
//! whichever worker calls `accept` first. A worker that has just taken a connection cannot
//! yet tell whether a request is coming on it (its body may still be on the wire), so
//! without the board it would take the next connection too and queue two requests while a
//! sibling sits idle. With it, a worker with work in hand leaves new connections in the
//! listen queue while the board shows a free (or taking) sibling, and still takes them (to read their
//! headers off the model's path) when no sibling is free — so slow or silent clients cost
//! nothing more than before. See `worker/src/server.rs` for the accept rule.
//!
//! Mechanics: the master creates the page (`memfd_create`) before any worker starts and
//! hands it to every process it execs on [`crate::protocol::BOARD_FD`] (the template too,
//! so forked workers inherit it). Each worker gets a **seat** (an index, unique among the
//! live workers) in its configuration and writes only its own seat; the master clears a
//! seat when it reaps the worker that held it, so a worker that dies showing "free" is not
//! waited for. No message per request reaches the master.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Seats on the board: the most workers that take part at once.
pub const SEATS: u32 = 128;

/// `u32`s from one seat to the next: a cache line each, so that a worker writing its seat
/// does not evict its neighbours' from other cores.
const STRIDE: usize = 64 / std::mem::size_of::<AtomicU32>();

const BYTES: usize = SEATS as usize * STRIDE * std::mem::size_of::<AtomicU32>();

/// What a worker shows on its seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Seat {
    /// Not accepting, or something in hand (and what a cleared seat reads as).
    Busy = 0,
    /// Accepting, nothing in hand.
    Free = 1,
    /// A free worker in the middle of an `accept`: it is about to be busy, or free again if
    /// a sibling took the connection first. Siblings wait for it as for a free one, so that
    /// two connections do not both go to a busy worker while this one looks away.
    Taking = 2,
}

/// `CLOCK_MONOTONIC` in milliseconds, wrapping at 2^32 (about 49 days): the same clock in
/// every process of the machine.
fn now_ms() -> u32 {
    // SAFETY: timespec is plain old data; all-zero is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1000)
        .wrapping_add(ts.tv_nsec as u64 / 1_000_000) as u32
}

/// A mapping of the board.
pub struct Board {
    seats: NonNull<AtomicU32>,
    /// The master keeps the descriptor to hand it to the processes it starts.
    fd: Option<OwnedFd>,
    /// The page's inode number: the same in every process that maps this board, different
    /// for every board (another master's, another pod's), so it names what belongs to this
    /// one (the workers' sibling sockets, `worker/src/siblings/`).
    id: u64,
}

// SAFETY: the mapping is only ever accessed through atomics, and lives as long as `Board`.
unsafe impl Send for Board {}
// SAFETY: as above: every access is an atomic operation on shared memory.
unsafe impl Sync for Board {}

impl Board {
    /// Creates a new, all-clear board (the master, before any worker starts). Its
    /// descriptor is close-on-exec; [`crate::master::spawn`] places it on `BOARD_FD` in
    /// each child it starts.
    pub fn create() -> io::Result<Board> {
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"vf-board".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on the descriptor we own; a new memfd reads as zeros.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seats = map(fd.as_raw_fd())?;
        Ok(Board {
            seats,
            id: inode(fd.as_raw_fd())?,
            fd: Some(fd),
        })
    }

    /// Maps the board inherited on `fd` (a worker), then closes `fd`: the mapping stays.
    pub fn attach(fd: RawFd) -> io::Result<Board> {
        // SAFETY: libc::stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on an fd only writes its metadata into `st`; a bad fd gives -1.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as usize) < BYTES {
            return Err(io::Error::other(format!(
                "fd {fd} is not the idle board ({} bytes, expected {BYTES})",
                st.st_size
            )));
        }
        let seats = map(fd)?;
        // SAFETY: the inherited descriptor is this process's to close; the mapping keeps the
        // memory alive without it.
        unsafe { libc::close(fd) };
        Ok(Board {
            seats,
            fd: None,
            id: st.st_ino,
        })
    }

    /// What tells this board from any other (see the field).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The descriptor to hand to children (the master's board only).
    pub fn fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    fn seat(&self, i: u32) -> Option<&AtomicU32> {
        self.word(i, 0)
    }

    /// When the worker on seat `i` last began to show free (the second word of its line):
    /// milliseconds of `CLOCK_MONOTONIC`, which every process reads alike, wrapping.
    fn free_since(&self, i: u32) -> Option<&AtomicU32> {
        self.word(i, 1)
    }

    fn word(&self, i: u32, k: usize) -> Option<&AtomicU32> {
        // SAFETY: `i` is below SEATS and `k` below STRIDE, so the pointer stays inside the
        // mapping, which lives as long as `self`; AtomicU32 has the layout of u32 and the
        // mapping is page-aligned.
        (i < SEATS && k < STRIDE)
            .then(|| unsafe { &*self.seats.as_ptr().add(i as usize * STRIDE + k) })
    }

    /// Shows what the worker on `seat` is doing (its own seat only). Call it on a change:
    /// showing free marks when the free spell began.
    pub fn show(&self, seat: u32, state: Seat) {
        if let (Some(s), Some(since)) = (self.seat(seat), self.free_since(seat)) {
            if state == Seat::Free {
                since.store(now_ms(), Ordering::SeqCst);
            }
            s.store(state as u32, Ordering::SeqCst);
        }
    }

    /// Whether a worker other than the one on `mine` has shown free for at least `spell`:
    /// idle, not between two requests of its own kept-alive clients (under load a busy
    /// worker shows free for microseconds at a time).
    pub fn other_free_for(&self, mine: u32, spell: std::time::Duration) -> bool {
        let now = now_ms();
        let spell = spell.as_millis().min(u128::from(u32::MAX / 2)) as u32;
        (0..SEATS).any(|i| {
            i != mine
                && self
                    .seat(i)
                    .is_some_and(|s| s.load(Ordering::SeqCst) == Seat::Free as u32)
                && self
                    .free_since(i)
                    .is_some_and(|t| now.wrapping_sub(t.load(Ordering::SeqCst)) >= spell)
        })
    }

    /// Clears a seat whose worker is gone (the master, after reaping it).
    pub fn clear(&self, seat: u32) {
        self.show(seat, Seat::Busy);
    }

    /// Whether a worker other than the one on `mine` shows free or taking.
    pub fn other_free(&self, mine: u32) -> bool {
        (0..SEATS).any(|i| {
            i != mine
                && self
                    .seat(i)
                    .is_some_and(|s| s.load(Ordering::SeqCst) != Seat::Busy as u32)
        })
    }

    /// The seats other than `mine` that show free (not taking), from the one after `mine`
    /// round: siblings that would start a request handed to them at once.
    pub fn free_others(&self, mine: u32) -> impl Iterator<Item = u32> + '_ {
        (1..SEATS)
            .map(move |k| (mine.wrapping_add(k)) % SEATS)
            .filter(move |i| {
                self.seat(*i)
                    .is_some_and(|s| s.load(Ordering::SeqCst) == Seat::Free as u32)
            })
    }

    /// The lowest seat not in `taken` (the master, for a new worker); `None` when all are.
    pub fn free_seat(taken: impl Iterator<Item = u32> + Clone) -> Option<u32> {
        (0..SEATS).find(|i| !taken.clone().any(|t| t == *i))
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing refers to it after drop.
        unsafe { libc::munmap(self.seats.as_ptr().cast(), BYTES) };
    }
}

/// The inode number of the file open on `fd`.
fn inode(fd: RawFd) -> io::Result<u64> {
    // SAFETY: libc::stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on an fd only writes its metadata into `st`; a bad fd gives -1.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_ino)
}

fn map(fd: RawFd) -> io::Result<NonNull<AtomicU32>> {
    // SAFETY: a shared read-write mapping of BYTES bytes of `fd`, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seat_shown_free_is_seen_through_another_mapping_and_cleared_by_the_master() {
        let master = Board::create().unwrap();
        // A second mapping of the same page, as a worker makes it (from a duplicate, since
        // attach closes the descriptor it is given).
        // SAFETY: dup of a descriptor we own; the result is checked.
        let dup = unsafe { libc::dup(master.fd().unwrap()) };
        assert!(dup >= 0);
        let worker = Board::attach(dup).unwrap();
        assert_eq!(worker.id(), master.id(), "one board, one id");
        assert_ne!(Board::create().unwrap().id(), master.id());
        assert!(!master.other_free(0), "a new board is all clear");
        worker.show(3, Seat::Free);
        assert!(master.other_free(0));
        assert!(!worker.other_free(3), "its own seat does not count");
        worker.show(5, Seat::Taking);
        assert!(
            worker.other_free(3),
            "a sibling taking a connection is waited for"
        );
        worker.show(7, Seat::Free);
        assert_eq!(
            worker.free_others(5).collect::<Vec<_>>(),
            [7, 3],
            "free ones only, from the seat after its own round"
        );
        assert_eq!(worker.free_others(3).collect::<Vec<_>>(), [7]);
        worker.show(7, Seat::Busy);
        master.clear(5);
        assert!(!worker.other_free(3));
        worker.show(3, Seat::Busy);
        assert!(!master.other_free(0));
        // Out of range: ignored, never written past the page.
        worker.show(SEATS, Seat::Free);
        assert!(!master.other_free(0));
    }

    #[test]
    fn a_free_spell_is_timed_from_when_it_began() {
        let master = Board::create().unwrap();
        let spell = std::time::Duration::from_millis(30);
        // An hour stands for a spell not yet passed, whatever the machine's pace.
        let hour = std::time::Duration::from_secs(3600);
        master.show(2, Seat::Free);
        assert!(master.other_free(0));
        assert!(
            !master.other_free_for(0, hour),
            "free for less than the spell"
        );
        assert!(master.other_free_for(0, std::time::Duration::ZERO));
        // Wait on the clock the board reads, until the spell has passed.
        let began = now_ms();
        while now_ms().wrapping_sub(began) <= 30 {
            std::thread::yield_now();
        }
        assert!(master.other_free_for(0, spell));
        assert!(
            !master.other_free_for(2, spell),
            "its own seat does not count"
        );
        // Busy, then free again: a new spell (30 ms past the old one's start already).
        master.show(2, Seat::Busy);
        assert!(!master.other_free_for(0, std::time::Duration::ZERO));
        let again = now_ms();
        master.show(2, Seat::Free);
        let since = master.free_since(2).unwrap().load(Ordering::SeqCst);
        assert!(
            since.wrapping_sub(again) < u32::MAX / 2 && since.wrapping_sub(began) > 30,
            "the new spell begins when it was shown, not with the old one"
        );
        // Taking is not free.
        master.show(2, Seat::Taking);
        assert!(!master.other_free_for(0, std::time::Duration::ZERO));
    }

    #[test]
    fn seats_are_handed_out_lowest_first() {
        assert_eq!(Board::free_seat([].into_iter()), Some(0));
        assert_eq!(Board::free_seat([0, 1, 3].into_iter()), Some(2));
        assert_eq!(Board::free_seat(0..SEATS), None);
    }

    #[test]
    fn a_descriptor_that_is_not_a_board_is_refused() {
        let f = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: dup of an open file's descriptor; attach closes it or we do below.
        let dup = unsafe { libc::dup(f.as_raw_fd()) };
        assert!(Board::attach(dup).is_err());
        // SAFETY: attach failed before closing it.
        unsafe { libc::close(dup) };
    }
}
