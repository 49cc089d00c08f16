//! Process-level helpers: the `vf-worker-<slot>` name, how long exec-to-main took, torch's
//! thread pools, and leaving without running C++ static destructors.

use std::io::Write;

/// Names the process `vf-worker-<slot>` so `ps` and `top` show it.
pub fn set_name(slot: u32) {
    set_process_name(&format!("vf-worker-{slot}"));
}

/// Names the process (`PR_SET_NAME`, 15 bytes at most).
pub fn set_process_name(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from the
    // pointer; `buf` is 16 bytes and always ends in NUL.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!(
            "cannot set the process name: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Milliseconds from the process's start (as the kernel recorded it, 10 ms resolution) to
/// now; 0 when `/proc` cannot tell.
pub fn ms_since_exec() -> f64 {
    let read = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may contain spaces) start after ')'.
        let rest = &stat[stat.rfind(')')? + 2..];
        let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ((uptime - start_ticks / hz as f64) * 1e3).max(0.0))
    };
    read().unwrap_or(0.0)
}

/// This process's thread count (`Threads:` in /proc/self/status).
pub fn thread_count() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// Torch's intra-op threads for this worker, and one inter-op thread; before anything runs.
pub fn set_torch_threads(n: usize) {
    set_interop_thread();
    set_intra_threads(n);
}

/// One inter-op thread. The template sets it before it loads the model; its forked workers
/// inherit it (libtorch refuses to change it twice).
pub fn set_interop_thread() {
    // tch panics when libtorch refuses (e.g. the pool already started): keep going then.
    if std::panic::catch_unwind(|| tch::set_num_interop_threads(1)).is_err() {
        tracing::warn!("could not set torch's inter-op thread count");
    }
}

/// Torch's intra-op threads **for the calling thread** (and libtorch's process-wide count,
/// which threads that have not run a parallel op yet take up). Setting more than one may
/// start the thread pool, so the template leaves this to each forked worker.
///
/// Per thread, because libtorch 2.11's `at::set_num_threads` (read from the disassembly of
/// its `libtorch_cpu.so`, ParallelOpenMP.cpp) calls `omp_set_num_threads` and
/// `mkl_set_num_threads_local`, which both set the calling thread's value only (libgomp
/// keeps the team size among each thread's ICVs; a new thread, or a forked child's new
/// thread, starts from the library default: one per core, or `OMP_NUM_THREADS`), and
/// stores the count in a process-wide atomic. A thread applies that atomic to itself only
/// when it first calls `at::get_num_threads` or `at::parallel_for`
/// (`at::internal::lazy_init_num_threads`, thread-local) — and MKL's matrix products, most
/// of a small MLP's pass, reach neither: set on another thread, the model thread ran its
/// products on teams of one thread per core. So the model thread calls this
/// itself, first thing (`runner::Runner::start`).
pub fn set_intra_threads(n: usize) {
    let n = i32::try_from(n).unwrap_or(i32::MAX).max(1);
    if std::panic::catch_unwind(|| tch::set_num_threads(n)).is_err() {
        tracing::warn!("could not set torch's intra-op thread count");
    }
}

/// One intra-op thread for the calling thread, leaving libtorch's process-wide count (and
/// so the model thread's) as it is: for threads that run torch ops beside the model thread
/// (documents' pre-processing, at most `--torch-threads` of them at a time). Once per
/// thread: it first takes up libtorch's count (`at::get_num_threads`, so that a later
/// parallel op does not re-apply it over ours), then makes the two per-thread calls
/// `at::set_num_threads` would make, without its process-wide parts (the atomic, the
/// pthreadpool's size, oneDNN's cache). The symbols come from the libraries libtorch
/// loaded (libgomp, and MKL inside `libtorch_cpu.so`); one that is missing is skipped.
pub fn one_intra_thread_here() {
    thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if DONE.get() {
        return;
    }
    DONE.set(true);
    let _ = std::panic::catch_unwind(tch::get_num_threads);
    let lookup = |name: &std::ffi::CStr| {
        // SAFETY: dlsym only reads the loaded libraries' symbol tables; the name is a
        // NUL-terminated C string.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!f.is_null()).then_some(f)
    };
    if let Some(f) = lookup(c"omp_set_num_threads") {
        // SAFETY: libgomp's `void omp_set_num_threads(int)` (omp.h).
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
        f(1);
    }
    // mkl_service.h's `mkl_set_num_threads_local` is a macro for this C entry point (the
    // lower-case symbol is the Fortran one, which takes a pointer); libtorch calls this one.
    if let Some(f) = lookup(c"MKL_Set_Num_Threads_Local") {
        // SAFETY: MKL's C `int MKL_Set_Num_Threads_Local(int)` (mkl_service.h).
        let f: extern "C" fn(libc::c_int) -> libc::c_int = unsafe { std::mem::transmute(f) };
        f(1);
    }
}

/// Exits now with `code`, without C++ static destructors (the model thread may still be
/// inside libtorch, e.g. after a request timeout). The last log lines go first, for a
/// bounded time (`vramfork::logging::flush`: a reader that stalls does not hold the exit).
pub fn exit_now(code: i32) -> ! {
    vramfork::logging::flush();
    let _ = std::io::stdout().flush();
    // SAFETY: _exit ends the process immediately; nothing runs after it, so no Rust
    // invariant can be observed broken.
    unsafe { libc::_exit(code) }
}

/// Asks the kernel to back this process's large anonymous regions (libtorch's heap and
/// static data, ~165 MB after load) with transparent huge pages now (`MADV_COLLAPSE`,
/// Linux 6.1+). A fork then copies one page-table entry per 2 MiB instead of 512, which is
/// most of the template's fork time. Best effort: refused or unsupported ranges are left.
pub fn collapse_anonymous_memory() {
    const MADV_COLLAPSE: libc::c_int = 25;
    const HUGE: usize = 2 << 20;
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mut collapsed = 0usize;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let name = f.nth(3).unwrap_or("");
        if perms != "rw-p" || !(name.is_empty() || name == "[heap]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        let start = a.div_ceil(HUGE) * HUGE;
        let end = b / HUGE * HUGE;
        if end <= start {
            continue;
        }
        // SAFETY: madvise on a range inside one of this process's own anonymous mappings
        // changes only how it is backed, never its contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            if libc::madvise(start as *mut libc::c_void, end - start, MADV_COLLAPSE) == 0 {
                collapsed += end - start;
            }
        }
    }
    tracing::debug!(
        mb = collapsed >> 20,
        "anonymous memory collapsed into huge pages"
    );
}

/// USR1 and USR2 (gunicorn's log reopen and binary upgrade, which `systemctl kill -s USR1`
/// sends to every process of the service) would end a worker or the template by their
/// default action; the master acknowledges them, its workers ignore them. Set first thing in
/// `main`, before any thread exists; forked workers inherit it.
pub fn ignore_usr_signals() {
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What libtorch reports for a fresh thread: its own OpenMP setting after it takes up
    /// the process-wide count (`at::get_num_threads`).
    fn on_a_new_thread(f: impl FnOnce() -> i32 + Send + 'static) -> i32 {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn intra_threads_are_per_thread_and_documents_threads_get_one() {
        // The model thread sets its own count.
        assert_eq!(
            on_a_new_thread(|| {
                set_intra_threads(3);
                tch::get_num_threads()
            }),
            3
        );
        // A documents thread runs with one, whatever the process-wide count is…
        assert_eq!(
            on_a_new_thread(|| {
                one_intra_thread_here();
                tch::get_num_threads()
            }),
            1
        );
        // …and leaves that count as the model thread set it.
        assert_eq!(on_a_new_thread(tch::get_num_threads), 3);
    }
}
