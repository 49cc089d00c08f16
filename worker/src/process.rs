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

/// Torch's intra-op threads. Setting more than one may start the thread pool, so the
/// template leaves this to each forked worker.
pub fn set_intra_threads(n: usize) {
    let n = i32::try_from(n).unwrap_or(i32::MAX).max(1);
    if std::panic::catch_unwind(|| tch::set_num_threads(n)).is_err() {
        tracing::warn!("could not set torch's intra-op thread count");
    }
}

/// Exits now with `code`, without C++ static destructors (the model thread may still be
/// inside libtorch, e.g. after a request timeout).
pub fn exit_now(code: i32) -> ! {
    let _ = std::io::stderr().flush();
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
