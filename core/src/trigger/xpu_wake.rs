//! Waking a sleeping XPU watcher when a CPU XPU rings.
//!
//! A doorbell an XPU stores to rings nothing by itself, so past its spin window the watcher
//! must either keep looking (a GPU's store reaches host memory and nothing more; the watcher
//! looks every `XFABRIC_XPU_POLL_US`) or be told. A CPU XPU can make a system call: after its
//! stores it calls [`notify_xpu_ring`], which bumps one process-wide sequence word and, only if
//! a watcher sleeps on it, wakes it with a futex. A watcher sleeps on that word with the value
//! it read before its last look at the doorbells, so a ring after that look either changes
//! the word before the sleep (the kernel's compare fails and it returns at once) or wakes it.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// An endpoint whose XPU doorbells a CPU ring should look at at once (`EpLink`).
pub(crate) trait RingTarget: Send + Sync {
    /// Looks at the endpoint's doorbells and starts what they reached (never blocks: a
    /// watcher looking at that moment is left to it).
    fn rung(&self);
    /// Ends a watcher's sleep on the endpoint's own doorbell (`sleep_with`).
    fn wake_watcher(&self);
}

/// Every endpoint with XPU doorbells in this process, weakly.
static TARGETS: Mutex<Vec<Weak<dyn RingTarget>>> = Mutex::new(Vec::new());

/// Adds an endpoint for CPU rings to look at (dead ones are dropped on the way).
pub(crate) fn register(t: Weak<dyn RingTarget>) {
    let mut v = TARGETS.lock().unwrap_or_else(|e| e.into_inner());
    v.retain(|w| w.strong_count() > 0);
    v.push(t);
    // Under the lock: a thread that reads the new generation copies a list holding `t`.
    TARGETS_GEN.fetch_add(1, Ordering::Release);
}

/// Bumped by every `register`: a ringing thread's copy of `TARGETS` older than this is
/// refreshed before it is used.
static TARGETS_GEN: AtomicU64 = AtomicU64::new(1);

/// Bumped by every CPU ring; the futex word watchers sleep on.
static RING_SEQ: AtomicU32 = AtomicU32::new(0);
/// Watchers asleep (or about to be) on `RING_SEQ`: a ring makes the system call only then.
static SLEEPERS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's copy of `TARGETS` and the generation it was copied at (0: never). Its
    /// dead entries hold only their allocation, until the next `register` refreshes it.
    static SEEN_TARGETS: std::cell::RefCell<(u64, Vec<Weak<dyn RingTarget>>)> =
        const { std::cell::RefCell::new((0, Vec::new())) };
    /// `RING_SEQ` as this thread read it before the first doorbell look since it last slept:
    /// the oldest view it has, so that no ring after any of its looks is slept through.
    static LOOKED_AT: Cell<Option<u32>> = const { Cell::new(None) };
    /// This thread's timer slack was made fine (`fine_timer_slack`).
    static FINE_SLACK: Cell<bool> = const { Cell::new(false) };
}

/// Makes this thread's timed sleeps end when asked, not up to 50 us later (Linux's default
/// timer slack for a normal thread): a watcher sleeps until shortly before a predicted ring
/// and the margin it keeps should not pay for the slack. Once per thread; only threads that
/// sleep as a watcher are changed.
fn fine_timer_slack() {
    if FINE_SLACK.with(|c| c.replace(true)) {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's slack; an
    // error (none is documented for a positive value) leaves the default.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Tells sleeping watchers in this process that a CPU XPU stored to a doorbell. Call it after
/// the stores (`xfabric_kernels::cpu::ring` does). Costs an atomic add, and a system call only
/// while a watcher sleeps.
pub fn notify_xpu_ring() {
    // A CPU XPU is a host thread: it starts what it rang itself, now, instead of waking a
    // watcher (a futex wake of a sleeping thread costs tens of microseconds on a VM, and the
    // watcher may have no core to run on). A watcher looking at the same moment holds the
    // doorbells and starts it instead; the wake below covers a watcher about to sleep.
    // The endpoints from this thread's copy of the list, refreshed only when an endpoint
    // was added since: a ring takes no lock shared with other XPU threads and allocates
    // nothing. A ring from inside a ring (none today) reads the list under its lock.
    let gen = TARGETS_GEN.load(Ordering::Acquire);
    let done = SEEN_TARGETS.with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return false;
        };
        if c.0 != gen {
            let v = TARGETS.lock().unwrap_or_else(|e| e.into_inner());
            c.1.clone_from(&v);
            c.0 = gen;
        }
        for t in c.1.iter().filter_map(Weak::upgrade) {
            t.rung();
        }
        true
    });
    if !done {
        let live: Vec<Arc<dyn RingTarget>> = TARGETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for t in live {
            t.rung();
        }
    }
    // The bump and the read of SLEEPERS below, both SeqCst, against the sleeper's SeqCst
    // increment then re-read of RING_SEQ: a Dekker pair, so one of the two sees the other
    // (the four are in one total order; no fence is needed besides). The doorbell stores come
    // before the bump, which releases them to a watcher that reads it.
    RING_SEQ.fetch_add(1, Ordering::SeqCst);
    // The watcher is woken all the same: an operation the ringing thread could not start
    // (the provider said Again) is the watcher's to retry.
    if SLEEPERS.load(Ordering::SeqCst) > 0 {
        futex_wake(&RING_SEQ);
        // And those asleep on their provider's doorbell (`sleep_with`).
        let done = SEEN_TARGETS.with(|c| {
            let Ok(c) = c.try_borrow() else {
                return false;
            };
            for t in c.1.iter().filter_map(Weak::upgrade) {
                t.wake_watcher();
            }
            true
        });
        if !done {
            let live: Vec<Arc<dyn RingTarget>> = TARGETS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for t in live {
                t.wake_watcher();
            }
        }
    }
}

/// Called before a watcher reads its doorbells.
pub(crate) fn before_look() {
    LOOKED_AT.with(|c| {
        if c.get().is_none() {
            c.set(Some(RING_SEQ.load(Ordering::SeqCst)));
        }
    });
}

/// Whether this thread has recorded a look since it last slept (tests: a look that records
/// nothing leaves every sleep returning at once).
#[cfg(test)]
pub(crate) fn looked() -> bool {
    LOOKED_AT.with(|c| c.get().is_some())
}

/// Called when a watcher could not read its doorbells (another thread held them): what that
/// thread read may predate a ring this thread's view already counts, so the next sleep must
/// not happen; the caller looks again first.
pub(crate) fn look_missed() {
    LOOKED_AT.with(|c| c.set(Some(RING_SEQ.load(Ordering::SeqCst).wrapping_sub(1))));
}

/// Sleeps at most `timeout`, or until a CPU XPU rings after this thread's looks at its
/// doorbells. Returns at once if one already did.
pub(crate) fn sleep_until_ring(timeout: Duration) {
    let Some(seen) = LOOKED_AT.with(Cell::take) else {
        // No look recorded (a caller that did not poll first): do not sleep past a ring
        // nobody would see; the caller comes back after looking.
        return;
    };
    fine_timer_slack();
    SLEEPERS.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if RING_SEQ.load(Ordering::SeqCst) == seen {
        futex_wait(&RING_SEQ, seen, timeout);
    }
    SLEEPERS.fetch_sub(1, Ordering::SeqCst);
}

/// As `sleep_until_ring`, but the sleep is `sleep` (the provider's own, on its doorbell, so
/// that a peer's message ends it too), for at most `timeout`; a CPU XPU's ring after this
/// thread's looks ends it through `RingTarget::wake_watcher`. A ring that comes after the
/// check here but before the provider counts its sleeper may find no one to wake: the sleep
/// then lasts its timeout, and only what the ringing thread could not start itself (it starts
/// what it rang) waits that long.
pub(crate) fn sleep_with(timeout: Duration, sleep: impl FnOnce(Duration)) {
    if let Some(seen) = LOOKED_AT.with(Cell::take) {
        sleep_counted(seen, timeout, sleep);
    }
}

/// A sleep on several sources at once (`ProgressList`'s joint sleep): as `sleep_with` where
/// an XPU watcher among them recorded a look, so that a CPU XPU's ring after it wakes the
/// sources; otherwise (no watcher looked: nothing a ring could start) `sleep` as it is.
pub(crate) fn sleep_joined(timeout: Duration, sleep: impl FnOnce(Duration)) {
    match LOOKED_AT.with(Cell::take) {
        Some(seen) => sleep_counted(seen, timeout, sleep),
        None => sleep(timeout),
    }
}

/// `sleep`, counted among the watchers a CPU XPU's ring wakes, unless a ring came since the
/// looks that read `seen`.
fn sleep_counted(seen: u32, timeout: Duration, sleep: impl FnOnce(Duration)) {
    fine_timer_slack();
    SLEEPERS.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if RING_SEQ.load(Ordering::SeqCst) == seen {
        sleep(timeout);
    }
    SLEEPERS.fetch_sub(1, Ordering::SeqCst);
}

/// Waits, at most `max`, until `word` no longer reads `seen`: on the word's cache line with
/// UMONITOR/UMWAIT or MONITORX/MWAITX where the CPU offers them (the thread stays on its core
/// but the core idles until a store to the line, by a CPU or by a device's PCIe write, or the
/// deadline), otherwise by reading it with a pause between reads. No system call either way:
/// to the OS the thread is running.
pub(crate) fn wait_for_store(word: &AtomicU64, seen: u64, max: Duration) {
    let until = Instant::now() + max;
    #[cfg(target_arch = "x86_64")]
    if let Some(how) = monitor_wait() {
        while word.load(Ordering::Acquire) == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let left = until - now;
            // SAFETY: `word` is a live, aligned atomic for the whole call; the instructions
            // only watch its line and idle the core (the CPU offers them: `monitor_wait`).
            unsafe { how.wait(word, seen, left) };
        }
        return;
    }
    loop {
        for _ in 0..64 {
            if word.load(Ordering::Acquire) != seen {
                return;
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= until {
            return;
        }
    }
}

/// A user-level monitor/wait pair, with which a thread idles its core until a line is written.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MonitorWait {
    /// Intel's WAITPKG: UMONITOR / UMWAIT (deadline in TSC ticks, C0.2 requested).
    Waitpkg,
    /// AMD's MONITORX / MWAITX (a timer in TSC ticks, C1).
    Monitorx,
}

#[cfg(target_arch = "x86_64")]
impl MonitorWait {
    /// Idles until `word`'s line is written, about `left` passes, or an interrupt; returns at
    /// once if `word` already changed from `seen` after the monitor was armed.
    ///
    /// # Safety
    /// The CPU must offer the instructions (`monitor_wait` said so).
    unsafe fn wait(self, word: &AtomicU64, seen: u64, left: Duration) {
        use std::arch::asm;
        use std::arch::x86_64::_rdtsc;
        // Ticks are nanoseconds at 1 GHz or more: waking early only means one more pass.
        let ticks = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX).max(1);
        let addr = word.as_ptr();
        match self {
            MonitorWait::Waitpkg => {
                // SAFETY: reading the TSC has no preconditions.
                let deadline = unsafe { _rdtsc() }.saturating_add(ticks);
                // SAFETY: UMONITOR arms on the line of a valid address (the caller's live
                // word). The CPU has WAITPKG (the caller's contract).
                unsafe { asm!("umonitor {0}", in(reg) addr, options(nostack, preserves_flags)) };
                // Armed before the re-check: a store after it wakes the UMWAIT below.
                if word.load(Ordering::Acquire) != seen {
                    return;
                }
                // SAFETY: UMWAIT with ECX = 0 (C0.2) and EDX:EAX the TSC deadline; the OS
                // caps the wait (IA32_UMWAIT_CONTROL). It sets CF, clobbered here.
                unsafe {
                    asm!(
                        "umwait {0:e}",
                        in(reg) 0u32,
                        in("edx") (deadline >> 32) as u32,
                        in("eax") deadline as u32,
                        options(nostack),
                    )
                };
            }
            MonitorWait::Monitorx => {
                // SAFETY: MONITORX arms on the line of RAX, a valid address (the caller's
                // live word), with ECX = EDX = 0 (no extensions, no hints). The CPU has
                // MONITORX (the caller's contract).
                unsafe {
                    asm!(
                        "monitorx",
                        in("rax") addr,
                        in("ecx") 0u32,
                        in("edx") 0u32,
                        options(nostack, preserves_flags),
                    )
                };
                if word.load(Ordering::Acquire) != seen {
                    return;
                }
                let timer = u64::from(u32::try_from(ticks).unwrap_or(u32::MAX));
                // SAFETY: MWAITX with ECX bit 1 (EBX holds a timer in TSC ticks) and EAX =
                // 0 (C1 hint); it wakes on a write to the monitored line, the timer or an
                // interrupt. RBX belongs to LLVM: swapped in and back out around it.
                unsafe {
                    asm!(
                        "xchg {t}, rbx",
                        "mwaitx",
                        "xchg {t}, rbx",
                        t = inout(reg) timer => _,
                        in("eax") 0u32,
                        in("ecx") 2u32,
                        options(nostack, preserves_flags),
                    )
                };
            }
        }
    }
}

/// The monitor/wait pair the watcher uses, detected once by cpuid.
#[cfg(target_arch = "x86_64")]
fn monitor_wait() -> Option<MonitorWait> {
    static V: std::sync::OnceLock<Option<MonitorWait>> = std::sync::OnceLock::new();
    *V.get_or_init(|| match user_monitor_wait() {
        Some("waitpkg") => Some(MonitorWait::Waitpkg),
        Some("monitorx") => Some(MonitorWait::Monitorx),
        _ => None,
    })
}

/// A user-level monitor/wait instruction pair this CPU offers, which could sleep a watcher until
/// a device's write to a doorbell line: `"waitpkg"` (Intel UMONITOR/UMWAIT), `"monitorx"` (AMD
/// MONITORX/MWAITX), or `None`. Detected by cpuid.
pub fn user_monitor_wait() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // Leaves above the maximum the CPU reports are not read.
        let (max, max_ext) = (__cpuid(0).eax, __cpuid(0x8000_0000).eax);
        if max >= 7 && __cpuid_count(7, 0).ecx & (1 << 5) != 0 {
            return Some("waitpkg");
        }
        if max_ext >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 29) != 0 {
            return Some("monitorx");
        }
    }
    None
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic for the whole call (a static); `ts` is a
    // valid relative timeout; the other arguments are unused by FUTEX_WAIT. Any error
    // (EAGAIN: the word changed; EINTR; ETIMEDOUT) just ends the sleep.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic (a static); FUTEX_WAKE reads nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_ring_after_the_look_ends_the_sleep_and_one_before_it_prevents_it() {
        // A ring between the look and the sleep: the sleep returns without waiting.
        before_look();
        notify_xpu_ring();
        let t = Instant::now();
        sleep_until_ring(Duration::from_secs(30));
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "slept through a ring"
        );

        // A ring while asleep wakes the sleeper: it is woken long before its hour-long
        // timeout, so the test ends (bounded by the harness, not by a time assertion).
        let asleep = Arc::new(AtomicBool::new(false));
        let a = asleep.clone();
        let t = std::thread::spawn(move || {
            before_look();
            a.store(true, Ordering::SeqCst);
            sleep_until_ring(Duration::from_secs(3600));
        });
        while !asleep.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // Ring until it returns: a ring before it registered is caught by the compare.
        while !t.is_finished() {
            notify_xpu_ring();
            std::thread::yield_now();
        }
        t.join().unwrap();
    }

    #[test]
    fn monitor_wait_detection_agrees_with_the_kernel() {
        let found = user_monitor_wait();
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        match found {
            Some(f) => assert!(flags.contains(&f), "cpuid says {f}, the kernel does not"),
            None => assert!(!flags.contains(&"waitpkg") && !flags.contains(&"monitorx")),
        }
    }

    #[test]
    fn waiting_for_a_store_ends_on_a_change_or_at_its_bound() {
        // Already changed: returns at once (bounded by the harness, not asserted in time).
        let w = AtomicU64::new(5);
        wait_for_store(&w, 4, Duration::from_secs(3600));
        // Unchanged: returns at its bound.
        wait_for_store(&w, 5, Duration::from_millis(1));
        // A store from another thread, as a device's, ends it.
        let w = Arc::new(AtomicU64::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || wait_for_store(&w2, 0, Duration::from_secs(3600)));
        while !t.is_finished() {
            w.store(1, Ordering::Release);
            std::thread::yield_now();
        }
        t.join().unwrap();
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_monitor_wait_used_is_the_one_cpuid_reports() {
        // This VM hides both: only the mapping is checked here, the instructions never ran.
        match (user_monitor_wait(), monitor_wait()) {
            (Some("waitpkg"), Some(MonitorWait::Waitpkg))
            | (Some("monitorx"), Some(MonitorWait::Monitorx))
            | (None, None) => {}
            other => panic!("cpuid and the watcher disagree: {other:?}"),
        }
    }

    /// A target whose watcher sleeps on a doorbell of its own (as `sleep_with` over a
    /// provider's): `wake_watcher` rings it.
    struct OwnBell(AtomicBool);

    impl RingTarget for OwnBell {
        fn rung(&self) {}

        fn wake_watcher(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_ring_ends_a_sleep_on_the_providers_doorbell() {
        let t = Arc::new(OwnBell(AtomicBool::new(false)));
        let weak: Weak<dyn RingTarget> = Arc::downgrade(&t) as _;
        register(weak);
        let asleep = Arc::new(AtomicBool::new(false));
        let (a, bell) = (asleep.clone(), t.clone());
        let sleeper = std::thread::spawn(move || {
            before_look();
            sleep_with(Duration::from_secs(3600), |_| {
                a.store(true, Ordering::SeqCst);
                // The provider's sleep: until its doorbell rings (bounded by the harness).
                while !bell.0.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            });
        });
        // (A ring from a test running beside this one may come before the sleep and prevent
        // it: the sleeper then ends on its own.)
        while !asleep.load(Ordering::SeqCst) && !sleeper.is_finished() {
            std::thread::yield_now();
        }
        // Asleep on its own doorbell, not on the ring word: only `wake_watcher` ends it.
        notify_xpu_ring();
        sleeper.join().unwrap();
        assert!(t.0.load(Ordering::SeqCst) || !asleep.load(Ordering::SeqCst));

        // A ring between the look and the sleep: no sleep at all.
        before_look();
        notify_xpu_ring();
        sleep_with(Duration::from_secs(3600), |_| {
            panic!("slept through a ring")
        });
    }

    #[test]
    fn a_missed_look_does_not_sleep() {
        before_look();
        look_missed();
        sleep_until_ring(Duration::from_secs(3600));
    }

    #[test]
    fn without_a_look_it_does_not_sleep() {
        LOOKED_AT.with(|c| c.set(None));
        sleep_until_ring(Duration::from_secs(3600));
    }
}
