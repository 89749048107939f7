//! Sleeping until a peer writes (a futex in the segment header) and the coarse clock the
//! liveness sweeps run by: shared by both shm protocols.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sleeps until `word` no longer holds `expected`, a wake, or `timeout`.
pub fn wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared (non-private) futex wait on a live, aligned u32 with a valid timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// futex wake calls this process has made: a diagnostic (`shm::futex_wakes`). A sender pays
/// a syscall only while a peer's thread sleeps; a count that grows while every peer busy-polls
/// is a sleep flag left standing, a syscall on every send.
static FUTEX_WAKES: AtomicU64 = AtomicU64::new(0);

/// See `FUTEX_WAKES`.
pub fn wakes() -> u64 {
    FUTEX_WAKES.load(Ordering::Relaxed)
}

/// Wakes every thread sleeping on `word`.
pub fn wake(word: &std::sync::atomic::AtomicU32) {
    FUTEX_WAKES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: a shared futex wake on a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0,
            0,
            0,
        );
    }
}
