//! The bell of transports whose arrivals raise descriptors (tcp's epoll set, verbs'
//! completion channel and side channels): a sleeper polls those and an eventfd that `wake`
//! writes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xfabric_core::{Error, Join, Result};

use super::seam::Bell;

/// What a wire that takes a descriptor out of its wait set to read it directly (tcp's
/// parked connection) and the sleepers on that set agree on. A sleeper counts itself before
/// it looks whether a descriptor is out; the wire marks one out before it looks for
/// sleepers (both sequentially consistent): so either the sleeper sees the descriptor out
/// and does not sleep, or the wire sees the sleeper and leaves the descriptor in. Never a
/// sleep on a set that misses an arrival.
#[derive(Default)]
pub struct Gate {
    sleepers: AtomicUsize,
    parked: AtomicBool,
}

impl Gate {
    /// Whether a descriptor may be taken out now (no one sleeps); if so, it is marked out.
    pub fn try_park(&self) -> bool {
        self.parked.store(true, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.parked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The descriptor taken out is back in the set (or gone).
    pub fn unparked(&self) {
        self.parked.store(false, Ordering::SeqCst);
    }

    /// A sleeper is coming: counted before its wire is armed (which puts every descriptor
    /// back), so none is taken out again until it `leave`s.
    pub(crate) fn enter(&self) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn leave(&self) {
        // Never below zero: a `leave` without its `enter` would wrap the count, and the next
        // sleeper's `enter` would then count nobody.
        let left = self
            .sleepers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        debug_assert!(left.is_ok(), "a sleep left that never entered");
    }

    /// Whether a descriptor is out of the set now.
    pub(crate) fn out(&self) -> bool {
        self.parked.load(Ordering::SeqCst)
    }
}

/// Sleeping on descriptors.
pub struct FdBell {
    /// Written by `wake` to end a `sleep`.
    wake_fd: OwnedFd,
    /// Whether the last locked call left work the engine or the wire can advance without a
    /// peer (frames queued, answers awaited): a sleep then lasts at most 1 ms.
    busy: AtomicBool,
    /// Whether the last locked call left bytes no descriptor will announce: no sleep then.
    backlog: AtomicBool,
    /// Shared with the wire, which may take a descriptor out of the set slept on.
    gate: Arc<Gate>,
}

impl FdBell {
    /// A bell for an endpoint of `provider` (named in the error if the eventfd fails),
    /// whose wire takes descriptors out of its set only through `gate`.
    pub fn new(provider: &str, gate: Arc<Gate>) -> Result<FdBell> {
        // SAFETY: plain syscall; the descriptor is owned by the bell and closed with it.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(format!("{provider} endpoint: eventfd")));
        }
        Ok(FdBell {
            // SAFETY: a descriptor we just opened and own alone.
            wake_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            busy: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
            gate,
        })
    }

    /// Empties the wake eventfd (non-blocking: nothing there is no wait).
    fn take_wake(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local from our non-blocking eventfd.
        unsafe { libc::read(self.wake_fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// What the last locked call left (`Wire::publish`).
    pub fn set(&self, busy: bool, backlog: bool) {
        self.busy.store(busy, Ordering::Release);
        self.backlog.store(backlog, Ordering::Release);
    }
}

impl Bell for FdBell {
    fn nap(&self, timeout: Duration) -> Option<Duration> {
        if self.backlog.load(Ordering::Acquire) {
            // Bytes already waiting that nothing will announce: progress again at once.
            None
        } else if self.busy.load(Ordering::Acquire) {
            // While answers are awaited, sleep, but not long.
            Some(timeout.min(Duration::from_millis(1)))
        } else {
            Some(timeout)
        }
    }

    fn sleep_coming(&self) {
        self.gate.enter();
    }

    fn sleep_skipped(&self) {
        self.gate.leave();
    }

    fn sleep(&self, _ticket: u64, timeout: Duration, fds: &[(RawFd, i16)]) {
        if self.gate.out() {
            // Cannot be (the wire was armed after `sleep_coming`, and nothing is taken out
            // while a sleeper is counted); were it so, the caller progresses again instead.
            self.gate.leave();
            return;
        }
        let mut all: Vec<libc::pollfd> = std::iter::once((self.wake_fd.as_raw_fd(), libc::POLLIN))
            .chain(fds.iter().copied())
            .map(|(fd, events)| libc::pollfd {
                fd,
                events,
                revents: 0,
            })
            .collect();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: a valid pollfd array of its length. A descriptor closed since (a connection
        // dropped by another thread's progress) reports POLLNVAL and ends the wait early.
        let r = unsafe { libc::poll(all.as_mut_ptr(), all.len() as libc::nfds_t, ms) };
        if r > 0 && all[0].revents != 0 {
            self.take_wake();
        }
        self.gate.leave();
    }

    fn join_sleep(
        &self,
        timeout: Duration,
        fds: &[(RawFd, i16)],
        out: &mut Vec<(RawFd, i16)>,
    ) -> Join {
        if self.gate.out() {
            // As in `sleep`: cannot be; were it so, the caller looks again.
            return Join::Ready;
        }
        out.push((self.wake_fd.as_raw_fd(), libc::POLLIN));
        out.extend_from_slice(fds);
        Join::Joined(timeout)
    }

    fn leave_sleep(&self) {
        // A wake that ended the sleep, or came after it: either way the caller now looks.
        self.take_wake();
        self.gate.leave();
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.wake_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn quiet(&self) -> bool {
        // A connection out of the set (its re-registration failed) would miss its arrivals.
        !self.backlog.load(Ordering::Acquire) && !self.gate.out()
    }
}
