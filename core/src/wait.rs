//! Waiting: the progress hook objects expose, timeouts in libfabric's milliseconds, wait sets,
//! and the eventfd behind `FI_WAIT_FD`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, Weak};

use arc_swap::ArcSwap;
use std::time::{Duration, Instant};

use crate::consts::WaitObj;
use crate::error::{Error, Result};

/// Something that moves data when asked: an endpoint under manual progress. Queues and counters
/// hold these (weakly) so that reading them drives the endpoints bound to them.
pub trait ProgressSource: Send + Sync {
    /// Do whatever work is ready without blocking; returns how many events were handled.
    fn progress(&self) -> usize;
    /// Block for at most `timeout` until there may be work (a peer posted something). The
    /// default yields; a provider with a cross-process doorbell sleeps on it.
    fn idle_wait(&self, timeout: Duration) {
        let _ = timeout;
        std::thread::yield_now();
    }
    /// Ends an `idle_wait` in progress (new work appeared that no peer will ring for, such as
    /// an operation armed on an XPU doorbell). The default does nothing: its waits are short.
    fn wake(&self) {}
    /// How soon this source must be looked at again whatever its doorbell says (something it
    /// waits for rings no doorbell, such as an XPU's store): zero at once; `None` when its
    /// doorbell tells. An idle thread driving several sources sleeps no longer than the
    /// soonest.
    fn next_look(&self) -> Option<Duration> {
        None
    }
}

/// The endpoints (or other progress sources) that a queue, counter or domain drives. Read on
/// every poll of a queue, changed only when an endpoint is enabled or closed: the list is an
/// immutable snapshot swapped whole, so a poll takes no lock and no reference count. Entries
/// are strong references, counted: a source added twice (a domain's list, registered by each
/// of its endpoints bound to one queue) is driven once and stays until removed as often. An
/// endpoint removes what it added when it closes (which it always does, on drop at the
/// latest), so no cycle outlives it.
#[derive(Default)]
pub struct ProgressList {
    sources: ArcSwap<Vec<(Arc<dyn ProgressSource>, usize)>>,
}

fn same(a: &Arc<dyn ProgressSource>, b: &Arc<dyn ProgressSource>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl ProgressList {
    /// Adds a source, or counts it once more.
    pub fn add(&self, p: Arc<dyn ProgressSource>) {
        self.sources.rcu(|v| {
            let mut v = Vec::clone(v);
            match v.iter_mut().find(|(x, _)| same(x, &p)) {
                Some((_, n)) => *n += 1,
                None => v.push((p.clone(), 1)),
            }
            v
        });
    }

    /// Undoes one `add` of a source.
    pub fn remove(&self, p: &Arc<dyn ProgressSource>) {
        self.sources.rcu(|v| {
            v.iter()
                .filter_map(|(x, n)| match same(x, p) {
                    false => Some((x.clone(), *n)),
                    true if *n > 1 => Some((x.clone(), n - 1)),
                    true => None,
                })
                .collect::<Vec<_>>()
        });
    }

    /// Drives every source once.
    #[inline(always)]
    pub fn run(&self) -> usize {
        let v = self.sources.load();
        let mut n = 0;
        for (p, _) in v.iter() {
            n += p.progress();
        }
        n
    }

    /// Sleeps until a source may have work, at most `timeout`.
    pub fn idle_wait(&self, timeout: Duration) {
        // One source: sleep on its doorbell for the whole timeout. Several: on the first's for
        // at most a millisecond, so the others are looked at again soon. None: just sleep.
        let v = self.sources.load();
        // A source that must be looked at by a time: the soonest sets the sleep, on its own
        // doorbell (`EpLink`'s wait ends at that time, or at a CPU XPU's ring).
        let soonest = v
            .iter()
            .filter_map(|(p, _)| p.next_look().map(|d| (d, p)))
            .min_by_key(|(d, _)| *d);
        if let Some((d, p)) = soonest {
            // Zero: the source spins (for a slice of its own choosing) rather than sleeps.
            let d = if d.is_zero() { timeout } else { timeout.min(d) };
            return p.idle_wait(d.min(Duration::from_millis(1)));
        }
        match v.first() {
            Some((p, _)) if v.len() > 1 => p.idle_wait(timeout.min(Duration::from_millis(1))),
            Some((p, _)) => p.idle_wait(timeout),
            None => std::thread::sleep(timeout.min(Duration::from_millis(1))),
        }
    }

    /// The soonest any source must be looked at again whatever its doorbell says (an XPU
    /// doorbell with something armed on it); `None` when their doorbells tell.
    pub fn next_look(&self) -> Option<Duration> {
        self.sources
            .load()
            .iter()
            .filter_map(|(p, _)| p.next_look())
            .min()
    }

    /// Number of sources.
    pub fn len(&self) -> usize {
        self.sources.load().len()
    }

    /// True when no source is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A domain's list of endpoints is itself a source: under manual progress a queue or counter
/// drives every endpoint of its domain (as libfabric's providers progress a domain), so an
/// application that reads only one endpoint's queue still moves the others' transfers — a
/// connection another endpoint of the process opened completes its handshake, and what that
/// endpoint queued behind it goes out.
impl ProgressSource for ProgressList {
    fn progress(&self) -> usize {
        self.run()
    }

    fn idle_wait(&self, timeout: Duration) {
        ProgressList::idle_wait(self, timeout)
    }

    fn wake(&self) {
        for (p, _) in self.sources.load().iter() {
            p.wake();
        }
    }

    fn next_look(&self) -> Option<Duration> {
        ProgressList::next_look(self)
    }
}

/// A libfabric timeout in milliseconds (negative: wait forever) as a deadline.
pub fn deadline(timeout_ms: i32) -> Option<Instant> {
    if timeout_ms < 0 {
        None
    } else {
        Some(Instant::now() + Duration::from_millis(timeout_ms as u64))
    }
}

/// Time left until `deadline`, capped at `cap`; `None` once it has passed.
pub fn remaining(deadline: Option<Instant>, cap: Duration) -> Option<Duration> {
    match deadline {
        None => Some(cap),
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                None
            } else {
                Some((d - now).min(cap))
            }
        }
    }
}

/// An eventfd, for `FI_WAIT_FD`: signaled on each new event so the fd can be put in an epoll set.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates a non-blocking eventfd.
    pub fn new() -> Result<Self> {
        // SAFETY: eventfd has no pointer arguments; a negative return is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own fd; failure (counter full) is harmless.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the readable state.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking fd.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The raw descriptor, for poll/epoll.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Something a wait set watches: it says whether it has events ready.
pub trait Waitable: Send + Sync {
    /// True when a read would return something (an entry, an error, a counter change).
    fn ready(&self) -> bool;
    /// Drives the progress sources behind it.
    fn drive(&self);
    /// Called when `fi_wait` returns because of this member: a member whose readiness is an
    /// edge (a counter's new events) marks them reported. Queues are level: their entries
    /// stay until read.
    fn consume(&self) {}
}

/// `fid_wait`: one place to block until any of several queues or counters has events.
#[derive(Clone)]
pub struct WaitSet {
    inner: Arc<WaitSetInner>,
}

pub(crate) struct WaitSetInner {
    lock: Mutex<u64>,
    cond: Condvar,
    members: Mutex<Vec<Weak<dyn Waitable>>>,
}

/// Attributes of a wait set (`struct fi_wait_attr`).
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitAttr {
    /// The kind of wait object; `Unspec` and `MutexCond` are supported.
    pub wait_obj: WaitObj,
    /// Reserved; must be 0.
    pub flags: u64,
}

impl WaitSet {
    /// `fi_wait_open`.
    pub fn open(attr: &WaitAttr) -> Result<Self> {
        if attr.flags != 0 {
            return Err(Error::BadFlags(format!(
                "wait set flags must be 0, got {:#x}",
                attr.flags
            )));
        }
        match attr.wait_obj {
            WaitObj::None | WaitObj::Unspec | WaitObj::MutexCond | WaitObj::Yield => {}
            other => {
                return Err(Error::OpNotSupp(format!(
                "wait set of kind {}: only FI_WAIT_UNSPEC, FI_WAIT_MUTEX_COND and FI_WAIT_YIELD",
                other.c_name()
            )))
            }
        }
        Ok(WaitSet {
            inner: Arc::new(WaitSetInner {
                lock: Mutex::new(0),
                cond: Condvar::new(),
                members: Mutex::new(Vec::new()),
            }),
        })
    }

    pub(crate) fn add(&self, w: Weak<dyn Waitable>) {
        self.inner
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(w);
    }

    pub(crate) fn signal(&self) {
        let mut g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        self.inner.cond.notify_all();
    }

    /// `fi_wait`: returns once any member has events, or `TimedOut` (timeout in ms, -1 forever).
    pub fn wait(&self, timeout_ms: i32) -> Result<()> {
        let dl = deadline(timeout_ms);
        loop {
            let members: Vec<Arc<dyn Waitable>> = self
                .inner
                .members
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter_map(|w| w.upgrade())
                .collect();
            // Taken before looking, so a signal after the look is not slept through.
            let seen = *self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            for m in &members {
                m.drive();
            }
            let mut any = false;
            for m in &members {
                if m.ready() {
                    m.consume();
                    any = true;
                }
            }
            if any {
                return Ok(());
            }
            let Some(left) = remaining(dl, Duration::from_millis(1)) else {
                return Err(Error::TimedOut("fi_wait"));
            };
            let g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            if *g == seen {
                let _ = self.inner.cond.wait_timeout(g, left);
            }
        }
    }
}
