//! The coarse clock the providers' polling paths read: things that must happen by time (a
//! sweep for dead peers, a look at epoll) are checked on every progress call, which an
//! application may make a million times a second.

/// Milliseconds of a coarse monotonic clock (the kernel's tick, read from the vDSO without a
/// TSC read): cheap enough for every idle progress call, fine enough for shm's 20 ms sweep
/// and tcp's look at epoll each millisecond (a tick is 1 to 10 ms).
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        // Never fails for this clock on Linux; if it did, sweeping every time is the safe side.
        return u64::MAX;
    }
    // A monotonic clock's seconds (time since boot) are far from overflowing here: no
    // saturation checks, which this call, made on every idle poll, would pay for.
    (ts.tv_sec as u64)
        .wrapping_mul(1000)
        .wrapping_add(ts.tv_nsec as u64 / 1_000_000)
}
