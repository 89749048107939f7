//! Waiting: the progress hook objects expose, timeouts in libfabric's milliseconds, wait sets,
//! and the eventfd behind `FI_WAIT_FD`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, Weak};

use std::time::{Duration, Instant};

use crate::consts::WaitObj;
use crate::error::{Error, Result};
use crate::rcu::Rcu;

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
    /// Adds the descriptors, each with the poll(2) events it waits for, that become ready
    /// when this source has work (a frame arrived) to `out`, for a thread sleeping on an
    /// `FI_WAIT_FD` wait object to watch. The default has none: such a source's work must be
    /// announced otherwise (its completions signal the object's own eventfd, or `next_look`
    /// says it must be looked at by time).
    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        let _ = out;
    }
    /// Before a sleep on those descriptors (`fi_trywait`): takes in what is ready and readies
    /// the descriptors to announce what comes next. True when nothing was ready and nothing is
    /// due by time, so that a sleep until one of them is readable misses nothing.
    fn prepare_fd_sleep(&self) -> bool {
        self.progress() == 0 && self.next_look().is_none()
    }
    /// The list this source is, if it is one: a list added to another is flattened into it
    /// (`ProgressList`).
    fn as_list(&self) -> Option<&ProgressList> {
        None
    }
    /// For a thread that sleeps on several sources at once (a domain's progress thread
    /// driving several endpoints): looks for work a last time, readies what ends the sleep
    /// (as [`idle_wait`](Self::idle_wait) does before its own) and adds its descriptors to
    /// `out`. [`Join::Joined`] carries how long the sleep may last for this source (at most
    /// `timeout`), and binds the caller to [`leave_sleep`](Self::leave_sleep) once the
    /// sleep has ended. The default cannot: its wait is its own `idle_wait`.
    fn join_sleep(&self, timeout: Duration, out: &mut Vec<(RawFd, i16)>) -> Join {
        let _ = (timeout, out);
        Join::Cannot
    }
    /// Ends what a [`Join::Joined`] began.
    fn leave_sleep(&self) {}
}

/// A source's answer to [`ProgressSource::join_sleep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Readied: one of the descriptors it added becomes readable when it has work, or is
    /// woken; the sleep lasts at most this long.
    Joined(Duration),
    /// Work is ready (or a wake came): no sleep; the caller looks again.
    Ready,
    /// This source sleeps only its own way (no descriptor announces its work).
    Cannot,
}

/// The endpoints (or other progress sources) that a queue, counter or domain drives. Read on
/// every poll of a queue, changed only when an endpoint is enabled or closed: what a poll
/// drives is an immutable snapshot replaced whole ([`Rcu`]), so a poll takes no lock, no
/// reference count and no thread-local (a call in libfabric.so), only the snapshot's count
/// of readers. Entries are strong references, counted: a source added twice (a domain's list,
/// registered by each of its endpoints bound to one queue) is driven once and stays until
/// removed as often. An endpoint removes what it added when it closes (which it always does,
/// on drop at the latest), so no cycle outlives it.
///
/// A list added to another (a domain's list to a queue's) is flattened into it: the queue's
/// snapshot holds the domain's endpoints themselves, rebuilt whenever the domain's list
/// changes, so that a poll loads one snapshot rather than one per level. Lists are only ever
/// added to lists that are not themselves added anywhere (queues' and counters'), so the
/// nesting is one level deep and never circular.
pub struct ProgressList(Arc<ListInner>);

struct ListInner {
    /// What `run` drives: every source added and every source of the lists added, once each.
    flat: Rcu<Vec<Arc<dyn ProgressSource>>>,
    /// What was added, counted; `flat` is rebuilt from it under this lock.
    added: Mutex<Added>,
    /// The lists this one was added to: each change here rebuilds theirs.
    parents: Mutex<Vec<Weak<ListInner>>>,
}

#[derive(Default)]
struct Added {
    sources: Vec<(Arc<dyn ProgressSource>, usize)>,
    /// Lists, kept as the sources they were added as (which keeps them alive).
    lists: Vec<(Arc<dyn ProgressSource>, usize)>,
}

impl Default for ProgressList {
    fn default() -> Self {
        ProgressList(Arc::new(ListInner {
            flat: Rcu::default(),
            added: Mutex::new(Added::default()),
            parents: Mutex::new(Vec::new()),
        }))
    }
}

fn same(a: &Arc<dyn ProgressSource>, b: &Arc<dyn ProgressSource>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ListInner {
    /// Rebuilds `flat` from what was added, then the lists this one was added to. No lock is
    /// held across the parents' rebuilds; each loads this list's newest snapshot, so the
    /// last rebuild after a change sees it.
    fn rebuild(&self) {
        // The sources a thread may be asleep on (`ProgressList::idle_wait` sleeps on one of
        // them for as long as it was asked): woken once the new list is in place, so that it
        // looks at a source added meanwhile now, not when that sleep ends (up to 100 ms), nor
        // sleeps on, for its whole timeout, a source removed meanwhile.
        let old: Vec<Arc<dyn ProgressSource>> = self.flat.read_holding_locks().to_vec();
        let children = {
            let added = lock(&self.added);
            let mut flat: Vec<Arc<dyn ProgressSource>> = Vec::new();
            let mut put = |p: &Arc<dyn ProgressSource>| {
                if !flat.iter().any(|x| same(x, p)) {
                    flat.push(p.clone());
                }
            };
            added.sources.iter().for_each(|(p, _)| put(p));
            for (l, _) in &added.lists {
                if let Some(l) = l.as_list() {
                    // Under this list's lock: what the child retired is freed below.
                    l.0.flat.read_holding_locks().iter().for_each(&mut put);
                }
            }
            self.flat.replace(flat);
            added
                .lists
                .iter()
                .map(|(l, _)| l.clone())
                .collect::<Vec<_>>()
        };
        // With no lock held: a snapshot freed here may hold the last reference to an endpoint,
        // whose close takes these lists' locks.
        self.flat.reclaim();
        for l in children.iter().filter_map(|l| l.as_list()) {
            l.0.flat.reclaim();
        }
        let parents: Vec<Arc<ListInner>> = lock(&self.parents)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for p in parents {
            p.rebuild();
        }
        // With no lock held, as the snapshot freed above: these may be the last references.
        for p in old {
            p.wake();
        }
    }
}

impl ProgressList {
    /// Adds a source, or counts it once more.
    pub fn add(&self, p: Arc<dyn ProgressSource>) {
        if let Some(child) = p.as_list() {
            if Arc::ptr_eq(&child.0, &self.0) {
                return;
            }
            // Known as a parent first: a change of the child from now on rebuilds this list,
            // and the rebuild below sees what changed before.
            let mut parents = lock(&child.0.parents);
            parents.retain(|w| w.strong_count() > 0);
            if !parents
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.0)))
            {
                parents.push(Arc::downgrade(&self.0));
            }
        }
        {
            let mut added = lock(&self.0.added);
            let v = if p.as_list().is_some() {
                &mut added.lists
            } else {
                &mut added.sources
            };
            match v.iter_mut().find(|(x, _)| same(x, &p)) {
                Some((_, n)) => *n += 1,
                None => v.push((p, 1)),
            }
        }
        self.0.rebuild();
    }

    /// Undoes one `add` of a source.
    pub fn remove(&self, p: &Arc<dyn ProgressSource>) {
        let gone = {
            let mut added = lock(&self.0.added);
            let v = if p.as_list().is_some() {
                &mut added.lists
            } else {
                &mut added.sources
            };
            let Some(i) = v.iter().position(|(x, _)| same(x, p)) else {
                return;
            };
            v[i].1 -= 1;
            (v[i].1 == 0).then(|| v.remove(i))
        };
        if let Some(child) = gone.as_ref().and_then(|(l, _)| l.as_list()) {
            lock(&child.0.parents).retain(|w| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.0)));
        }
        self.0.rebuild();
    }

    /// Drives every source once.
    #[inline(always)]
    pub fn run(&self) -> usize {
        let v = self.0.flat.read();
        let mut n = 0;
        for p in v.iter() {
            n += p.progress();
        }
        n
    }

    /// Sleeps until a source may have work, at most `timeout`.
    pub fn idle_wait(&self, timeout: Duration) {
        // One source: sleep on its doorbell for the whole timeout. Several: on all their
        // descriptors at once where each can (`join_sleep`), otherwise on the first's doorbell
        // for at most a millisecond, so the others are looked at again soon. None: just sleep.
        let v = self.0.flat.read();
        // A source that must be looked at by a time: the soonest sets the sleep, on its own
        // doorbell (`EpLink`'s wait ends at that time, or at a CPU XPU's ring).
        let soonest = v
            .iter()
            .filter_map(|p| p.next_look().map(|d| (d, p)))
            .min_by_key(|(d, _)| *d);
        if v.len() > 1 && soonest.is_none_or(|(d, _)| !d.is_zero()) {
            let cap = soonest.map_or(timeout, |(d, _)| timeout.min(d));
            if sleep_joined(&v, cap) {
                return;
            }
        }
        if let Some((d, p)) = soonest {
            // Zero: the source spins (for a slice of its own choosing) rather than sleeps.
            let d = if d.is_zero() { timeout } else { timeout.min(d) };
            // Alone, it sleeps as long as it said (an XPU watcher's looks space out after a
            // long quiet); with others, no longer than a millisecond on its doorbell.
            let d = if v.len() > 1 {
                d.min(Duration::from_millis(1))
            } else {
                d
            };
            return p.idle_wait(d);
        }
        match v.first() {
            Some(p) if v.len() > 1 => p.idle_wait(timeout.min(Duration::from_millis(1))),
            Some(p) => p.idle_wait(timeout),
            None => std::thread::sleep(timeout.min(Duration::from_millis(1))),
        }
    }

    /// The soonest any source must be looked at again whatever its doorbell says (an XPU
    /// doorbell with something armed on it); `None` when their doorbells tell.
    pub fn next_look(&self) -> Option<Duration> {
        self.0
            .flat
            .read()
            .iter()
            .filter_map(|p| p.next_look())
            .min()
    }

    /// Number of sources (those of the lists added counted one by one).
    pub fn len(&self) -> usize {
        self.0.flat.read().len()
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
        for p in self.0.flat.read().iter() {
            p.wake();
        }
    }

    fn next_look(&self) -> Option<Duration> {
        ProgressList::next_look(self)
    }

    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        for p in self.0.flat.read().iter() {
            p.wait_fds(out);
        }
    }

    fn prepare_fd_sleep(&self) -> bool {
        // Every source is readied, even after one says no: the next sleep needs them all.
        let mut idle = true;
        for p in self.0.flat.read().iter() {
            idle &= p.prepare_fd_sleep();
        }
        idle
    }

    fn as_list(&self) -> Option<&ProgressList> {
        Some(self)
    }
}

/// The wait object of `FI_WAIT_FD` on a CQ or counter, as libfabric's util wait makes it: an
/// epoll set holding the object's own eventfd (signaled by each completion or change) and the
/// descriptors of the endpoints that feed it, so that under manual progress the descriptor an
/// application sleeps on becomes readable when a frame arrives, although nothing progresses
/// while it sleeps. `prepare` (called by `fi_trywait`) brings the set up to date with the
/// object's progress sources and readies them.
pub struct FdWait {
    own: EventFd,
    epoll: OwnedFd,
    /// The sources' descriptors now in the set, with their poll(2) events.
    watched: Mutex<Vec<(RawFd, i16)>>,
}

impl FdWait {
    /// An epoll set holding a fresh eventfd.
    pub fn new() -> Result<Self> {
        let own = EventFd::new()?;
        // SAFETY: no pointer arguments; a negative return is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("epoll_create1"));
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let w = FdWait {
            own,
            epoll,
            watched: Mutex::new(Vec::new()),
        };
        w.ctl(libc::EPOLL_CTL_ADD, w.own.raw(), libc::POLLIN)
            .map_err(|e| Error::from_io("epoll_ctl(eventfd)", e))?;
        Ok(w)
    }

    /// `epoll_ctl` with poll(2) `events` (Linux gives POLLIN/POLLOUT the EPOLL values).
    fn ctl(&self, op: i32, fd: RawFd, events: i16) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: events as u16 as u32,
            u64: fd as u64,
        };
        // SAFETY: our epoll descriptor and a valid event; a bad `fd` is an error return.
        let r = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// The descriptor the application sleeps on (`fi_control(FI_GETWAIT)`).
    pub fn raw(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Makes the descriptor readable: the object has something.
    pub fn signal(&self) {
        self.own.signal();
    }

    /// For `fi_trywait`: watches what `sources` name now (descriptors of endpoints gone
    /// leave the set), readies them, and clears the object's own signal. True when the
    /// sources have nothing ready; the caller then checks its own contents, which a
    /// completion after this call signals anew.
    pub fn prepare(&self, sources: &[&dyn ProgressSource]) -> bool {
        let mut now = Vec::new();
        for s in sources {
            s.wait_fds(&mut now);
        }
        now.sort_unstable();
        now.dedup();
        {
            let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
            for &(fd, _) in watched.iter() {
                if !now.iter().any(|&(f, _)| f == fd) {
                    // A descriptor already closed left the set by itself.
                    let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
                }
            }
            for &(fd, events) in &now {
                // Added anew each time (a number closed and reused since names another
                // file); one still there has its events brought up to date.
                let r = match self.ctl(libc::EPOLL_CTL_ADD, fd, events) {
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        self.ctl(libc::EPOLL_CTL_MOD, fd, events)
                    }
                    r => r,
                };
                if let Err(e) = r {
                    tracing::warn!("fi_trywait: watching descriptor {fd}: {e}");
                }
            }
            *watched = now;
        }
        // Every source is readied, even after one says no: the next sleep needs them all.
        let mut idle = true;
        for s in sources {
            idle &= s.prepare_fd_sleep();
        }
        self.own.drain();
        idle
    }
}

/// Sleeps at most `timeout` on every source of `sources` at once, each joined through
/// `join_sleep`. False where one cannot join: the caller sleeps another way. Without this, a
/// thread driving several endpoints slept on one's doorbell a millisecond at a time, and an
/// idle domain with two endpoints cost its progress thread 1.9-2.3% of a core (0.06% with
/// one).
fn sleep_joined(sources: &[Arc<dyn ProgressSource>], timeout: Duration) -> bool {
    let mut fds = Vec::new();
    let mut left = timeout;
    let mut joined = 0;
    let mut outcome = Join::Joined(timeout);
    for p in sources {
        match p.join_sleep(left, &mut fds) {
            Join::Joined(d) => {
                left = left.min(d);
                joined += 1;
            }
            other => {
                outcome = other;
                break;
            }
        }
    }
    if outcome != Join::Cannot && joined == sources.len() {
        // An XPU watcher among them looked at its rings and doorbells: a CPU XPU's ring after
        // that look wakes the sources (`RingTarget::wake_watcher`).
        crate::trigger::sleep_joined(left, |t| poll_fds(&fds, t));
    }
    for p in &sources[..joined] {
        p.leave_sleep();
    }
    outcome != Join::Cannot
}

/// poll(2) on `fds` for at most `timeout`, to the nanosecond (`ppoll`): a sleep toward an
/// XPU's predicted post may be shorter than poll's millisecond.
fn poll_fds(fds: &[(RawFd, i16)], timeout: Duration) {
    let mut all: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a valid pollfd array of its length and a valid timespec; no signal mask. A
    // descriptor closed since (a connection another thread dropped) reports POLLNVAL and ends
    // the sleep early, which only costs a look.
    unsafe {
        libc::ppoll(
            all.as_mut_ptr(),
            all.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
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
    /// The progress sources it drives, whose descriptors a wait set's `FI_WAIT_FD`
    /// descriptor watches.
    fn sources(&self) -> Option<&ProgressList> {
        None
    }
}

/// `fi_control(FI_GETWAIT)` of a CQ or counter: its own descriptor (`FI_WAIT_FD`), or, a
/// member of a set waited on through one, the set's, which its events ring (libfabric's
/// answer).
pub(crate) fn member_wait_fd(
    fd: Option<&FdWait>,
    set: Option<&WaitSet>,
    what: &str,
) -> Result<i32> {
    match (fd, set) {
        (Some(f), _) => Ok(f.raw()),
        (None, Some(ws)) => ws.wait_fd(),
        (None, None) => Err(Error::OpBadState(format!(
            "{what} wait_fd: not opened with FI_WAIT_FD"
        ))),
    }
}

/// `fi_control(FI_GETWAITOBJ)` of a CQ or counter: what it was opened with, or its set's.
pub(crate) fn member_wait_obj(own: WaitObj, set: Option<&WaitSet>) -> WaitObj {
    set.map_or(own, WaitSet::wait_obj)
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
    /// A member was signaled (`fi_cq_signal`): the next `wait` returns at once.
    woken: std::sync::atomic::AtomicBool,
    /// `FI_WAIT_FD`: signaled with every member's change; holds the members' endpoints'
    /// descriptors.
    fd: Option<FdWait>,
    /// What it was opened with (`fi_control(FI_GETWAITOBJ)`).
    wait_obj: WaitObj,
    /// Closed (`WaitSet::close`): a thread still in `wait`, holding the set through a handle
    /// of its own, returns instead of sleeping on.
    closed: std::sync::atomic::AtomicBool,
}

/// Attributes of a wait set (`struct fi_wait_attr`).
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitAttr {
    /// The kind of wait object; `Unspec`, `MutexCond`, `Yield` and `Fd` are supported.
    pub wait_obj: WaitObj,
    /// Reserved; must be 0.
    pub flags: u64,
}

impl WaitSet {
    /// `fi_close`: a thread still in `wait` (through a handle of its own) returns rather than
    /// waiting for members it may never hear from.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        {
            let _g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.inner.cond.notify_all();
        }
        self.wake_sources();
        Ok(())
    }

    /// Ends the waits of the members' sources: a thread in `wait` may be waiting in one of
    /// them rather than on the set's condition (a source that must be looked at now).
    fn wake_sources(&self) {
        for m in self.members() {
            if let Some(l) = m.sources() {
                ProgressSource::wake(l);
            }
        }
    }

    /// `fi_wait_open`.
    pub fn open(attr: &WaitAttr) -> Result<Self> {
        // libfabric answers -FI_EINVAL to both: a set that cannot wait, and flags.
        if attr.flags != 0 {
            return Err(Error::Inval(format!(
                "wait set flags must be 0, got {:#x}",
                attr.flags
            )));
        }
        match attr.wait_obj {
            WaitObj::None => {
                return Err(Error::Inval(
                    "wait set of kind FI_WAIT_NONE: nothing to wait with".into(),
                ))
            }
            WaitObj::Unspec | WaitObj::MutexCond | WaitObj::Yield => {}
            WaitObj::Fd => {}
            other => {
                return Err(Error::OpNotSupp(format!(
                    "wait set of kind {}: only FI_WAIT_UNSPEC, FI_WAIT_MUTEX_COND, \
                     FI_WAIT_YIELD and FI_WAIT_FD",
                    other.c_name()
                )))
            }
        }
        let fd = if attr.wait_obj == WaitObj::Fd {
            Some(FdWait::new()?)
        } else {
            None
        };
        Ok(WaitSet {
            inner: Arc::new(WaitSetInner {
                lock: Mutex::new(0),
                cond: Condvar::new(),
                members: Mutex::new(Vec::new()),
                woken: std::sync::atomic::AtomicBool::new(false),
                fd,
                wait_obj: attr.wait_obj,
                closed: Default::default(),
            }),
        })
    }

    /// `fi_control(FI_GETWAIT)` on a wait set opened with `FI_WAIT_FD`: a descriptor that
    /// becomes readable when a member has something or, under manual progress, a frame
    /// arrives for an endpoint a member drives. Call `trywait` before blocking on it.
    pub fn wait_fd(&self) -> Result<i32> {
        self.inner.fd.as_ref().map(|f| f.raw()).ok_or_else(|| {
            Error::OpBadState("wait set wait_fd: set was not opened with FI_WAIT_FD".into())
        })
    }

    /// `fi_control(FI_GETWAITOBJ)`: the kind of wait object it was opened with.
    pub fn wait_obj(&self) -> WaitObj {
        self.inner.wait_obj
    }

    /// `fi_trywait` on a wait set: progresses its members' endpoints; `Ok` when it is safe
    /// to block on its wait object, `Again` when a member has something (a counter's change
    /// is reported once) or progress found work.
    pub fn trywait(&self) -> Result<()> {
        let members = self.members();
        let idle = match &self.inner.fd {
            Some(fd) => {
                let lists: Vec<&dyn ProgressSource> = members
                    .iter()
                    .filter_map(|m| m.sources())
                    .map(|l| l as &dyn ProgressSource)
                    .collect();
                fd.prepare(&lists)
            }
            None => {
                members.iter().for_each(|m| m.drive());
                true
            }
        };
        let mut ready = false;
        for m in &members {
            if m.ready() {
                m.consume();
                ready = true;
            }
        }
        if ready || !idle {
            Err(Error::Again("wait set trywait"))
        } else {
            Ok(())
        }
    }

    fn members(&self) -> Vec<Arc<dyn Waitable>> {
        self.inner
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|w| w.upgrade())
            .collect()
    }

    pub(crate) fn add(&self, w: Weak<dyn Waitable>) {
        let mut m = self.inner.members.lock().unwrap_or_else(|e| e.into_inner());
        // Members closed since go: a set that outlives many queues does not keep them all.
        m.retain(|w| w.strong_count() > 0);
        m.push(w);
    }

    /// Members kept, closed ones included.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.inner
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// A member was signaled: the waiter returns, as from an event.
    pub(crate) fn wake(&self) {
        self.inner
            .woken
            .store(true, std::sync::atomic::Ordering::Release);
        self.signal();
        self.wake_sources();
    }

    pub(crate) fn signal(&self) {
        let mut g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        self.inner.cond.notify_all();
        if let Some(fd) = &self.inner.fd {
            fd.signal();
        }
    }

    /// `fi_wait`: returns once any member has events, or `TimedOut` (timeout in ms, -1 forever).
    pub fn wait(&self, timeout_ms: i32) -> Result<()> {
        let dl = deadline(timeout_ms);
        loop {
            let members = self.members();
            // Taken before looking, so a signal after the look is not slept through.
            let seen = *self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            if self
                .inner
                .woken
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                return Ok(());
            }
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
            if self.inner.closed.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::OpBadState(
                    "fi_wait: the set was closed while this thread waited".into(),
                ));
            }
            let Some(mut left) = remaining(dl, Duration::from_millis(1)) else {
                return Err(Error::TimedOut("fi_wait"));
            };
            // A member's source that must be looked at by a time (under manual progress, an
            // XPU watcher in its spin window or before a predicted doorbell) sets the sleep.
            // Zero: that source waits as it chooses (a slice of spinning, or its doorbell)
            // instead of the set's condition, as a progress thread would, and the set looks
            // again after. Before, the set slept a millisecond whatever the plan said, and a
            // descriptor stored in the watcher's spin window waited that millisecond.
            let soonest = members
                .iter()
                .filter_map(|m| m.sources().and_then(|l| Some((l.next_look()?, l))))
                .min_by_key(|(d, _)| *d);
            if let Some((d, list)) = soonest {
                if d.is_zero() {
                    list.idle_wait(left);
                    continue;
                }
                left = left.min(d);
            }
            let g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            if *g == seen && !self.inner.closed.load(std::sync::atomic::Ordering::Acquire) {
                let _ = self.inner.cond.wait_timeout(g, left);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A source whose "transport" is a pipe: readable when written, progress drains it.
    struct PipeSource {
        rd: OwnedFd,
        wr: OwnedFd,
        prepared: AtomicUsize,
    }

    impl PipeSource {
        fn new() -> Arc<Self> {
            let mut fds = [0; 2];
            // SAFETY: a writable array of two descriptors; the result is checked.
            assert_eq!(
                unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
                0
            );
            // SAFETY: fresh descriptors we own.
            let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            Arc::new(PipeSource {
                rd,
                wr,
                prepared: AtomicUsize::new(0),
            })
        }

        fn frame(&self) {
            // SAFETY: one byte from a local to our pipe.
            assert_eq!(
                unsafe { libc::write(self.wr.as_raw_fd(), [1u8].as_ptr().cast(), 1) },
                1
            );
        }
    }

    impl ProgressSource for PipeSource {
        fn progress(&self) -> usize {
            let mut b = [0u8; 64];
            // SAFETY: reads into a local buffer of its length from our non-blocking pipe.
            let n = unsafe { libc::read(self.rd.as_raw_fd(), b.as_mut_ptr().cast(), 64) };
            n.max(0) as usize
        }
        fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
            out.push((self.rd.as_raw_fd(), libc::POLLIN));
        }
        fn prepare_fd_sleep(&self) -> bool {
            self.prepared.fetch_add(1, Ordering::Relaxed);
            self.progress() == 0
        }
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn fd_wait_watches_its_sources_and_its_own_signal() {
        let w = FdWait::new().unwrap();
        let list = ProgressList::default();
        let src = PipeSource::new();
        list.add(src.clone());
        // Not watched before the first prepare; idle, nothing readable after it.
        src.frame();
        assert!(!readable(w.raw()));
        assert!(!w.prepare(&[&list]), "the frame is progressed: no sleep");
        assert!(w.prepare(&[&list]));
        assert!(!readable(w.raw()));
        // A frame while "asleep" makes the set readable; prepare takes it and says so.
        src.frame();
        assert!(readable(w.raw()));
        assert!(!w.prepare(&[&list]));
        assert!(!readable(w.raw()));
        // The object's own signal, cleared by prepare.
        w.signal();
        assert!(readable(w.raw()));
        assert!(w.prepare(&[&list]));
        assert!(!readable(w.raw()));
        // A source removed leaves the set.
        list.remove(&(src.clone() as Arc<dyn ProgressSource>));
        assert!(w.prepare(&[&list]));
        src.frame();
        assert!(!readable(w.raw()));
        assert_eq!(src.prepared.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_list_added_to_another_is_driven_through_it_as_it_changes() {
        let domain = Arc::new(ProgressList::default());
        let queue = ProgressList::default();
        let (a, b) = (PipeSource::new(), PipeSource::new());
        domain.add(a.clone());
        // Added twice (two endpoints bound to the queue), driven once.
        queue.add(domain.clone());
        queue.add(domain.clone());
        a.frame();
        assert_eq!(queue.run(), 1);
        // A source the domain gains after is driven through the queue too, once although the
        // queue also has it as its own.
        domain.add(b.clone());
        queue.add(b.clone());
        assert_eq!(queue.len(), 2);
        b.frame();
        a.frame();
        assert_eq!(queue.run(), 2);
        // One the domain drops is held by the queue no more (an endpoint's last reference goes
        // when it closes), unless the queue has it as its own.
        domain.remove(&(a.clone() as Arc<dyn ProgressSource>));
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(queue.len(), 1);
        queue.remove(&(b.clone() as Arc<dyn ProgressSource>));
        assert_eq!(queue.len(), 1, "still the domain's");
        // The domain leaves the queue only when removed as often as added.
        let d = domain.clone() as Arc<dyn ProgressSource>;
        queue.remove(&d);
        assert_eq!(queue.len(), 1);
        queue.remove(&d);
        assert!(queue.is_empty());
        domain.remove(&(b.clone() as Arc<dyn ProgressSource>));
        assert_eq!(Arc::strong_count(&b), 1);
        drop(d);
        assert_eq!(Arc::strong_count(&domain), 1);
    }

    /// A source whose doorbell sleep ends only when woken (or at its timeout).
    #[derive(Default)]
    struct Sleepy {
        woken: std::sync::Mutex<bool>,
        cv: std::sync::Condvar,
    }

    impl ProgressSource for Sleepy {
        fn progress(&self) -> usize {
            0
        }
        fn idle_wait(&self, timeout: Duration) {
            let g = self.woken.lock().unwrap();
            let (mut g, _) = self.cv.wait_timeout_while(g, timeout, |w| !*w).unwrap();
            *g = false;
        }
        fn wake(&self) {
            *self.woken.lock().unwrap() = true;
            self.cv.notify_all();
        }
    }

    /// A thread asleep on the one source of a list is woken when another is added (it would
    /// look at the newcomer only when its sleep ended), and when its source is removed.
    #[test]
    fn a_change_of_the_list_wakes_the_thread_asleep_on_it() {
        let list = Arc::new(ProgressList::default());
        let a: Arc<dyn ProgressSource> = Arc::new(Sleepy::default());
        let b: Arc<dyn ProgressSource> = Arc::new(Sleepy::default());
        list.add(a.clone());
        for change in ["add", "remove"] {
            let (tx, rx) = std::sync::mpsc::channel();
            let sleeper = {
                let list = list.clone();
                std::thread::spawn(move || {
                    list.idle_wait(Duration::from_secs(30));
                    tx.send(()).unwrap();
                })
            };
            // Asleep on `a` alone before the change (or the change comes first and the sleep
            // returns at once all the same: `a`'s wake is kept until it sleeps).
            std::thread::sleep(Duration::from_millis(50));
            match change {
                "add" => list.add(b.clone()),
                _ => list.remove(&a),
            }
            rx.recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("a list {change} left the thread asleep"));
            sleeper.join().unwrap();
            if change == "add" {
                // Back to `a` alone for the next round.
                list.remove(&b);
                // Its wake of `a` is kept: taken here by a sleep that ends at once.
                a.idle_wait(Duration::from_millis(1));
            }
        }
    }

    /// A source whose plan says "look again now" (an XPU watcher in its spin window): `fi_wait`
    /// lets it wait its own way (its `idle_wait`: a spin, or its doorbell) and looks again,
    /// rather than sleeping a millisecond on the set's condition. The member is ready once its
    /// source was asked to wait 100 times, which a set sleeping on its condition never does.
    #[test]
    fn a_wait_set_lets_a_source_that_must_be_looked_at_now_wait_its_own_way() {
        #[derive(Default)]
        struct Spinning(AtomicUsize);
        impl ProgressSource for Spinning {
            fn progress(&self) -> usize {
                0
            }
            fn idle_wait(&self, _timeout: Duration) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            fn next_look(&self) -> Option<Duration> {
                Some(Duration::ZERO)
            }
        }
        struct Member {
            src: Arc<Spinning>,
            list: ProgressList,
        }
        impl Waitable for Member {
            fn ready(&self) -> bool {
                self.src.0.load(Ordering::Relaxed) >= 100
            }
            fn drive(&self) {
                self.list.run();
            }
            fn sources(&self) -> Option<&ProgressList> {
                Some(&self.list)
            }
        }
        let src = Arc::new(Spinning::default());
        let list = ProgressList::default();
        list.add(src.clone());
        let m: Arc<dyn Waitable> = Arc::new(Member { src, list });
        let ws = WaitSet::open(&WaitAttr {
            wait_obj: WaitObj::MutexCond,
            flags: 0,
        })
        .unwrap();
        ws.add(Arc::downgrade(&m));
        ws.wait(10_000)
            .expect("the source that must be looked at now was never let wait its own way");
    }

    /// A signal reaches a thread in `fi_wait` that waits in a member's source (one that must
    /// be looked at now): the source is woken, as the set's condition is. The source here
    /// waits until woken whatever its timeout, so a signal that only notified the condition
    /// would leave the waiter there.
    #[test]
    fn a_signal_reaches_a_wait_set_waiting_in_a_members_source() {
        #[derive(Default)]
        struct Doorbell {
            rung: Mutex<bool>,
            cond: Condvar,
            entered: AtomicUsize,
        }
        impl ProgressSource for Doorbell {
            fn progress(&self) -> usize {
                0
            }
            fn idle_wait(&self, _timeout: Duration) {
                let mut g = self.rung.lock().unwrap();
                self.entered.fetch_add(1, Ordering::Release);
                while !*g {
                    g = self.cond.wait(g).unwrap();
                }
                *g = false;
            }
            fn wake(&self) {
                *self.rung.lock().unwrap() = true;
                self.cond.notify_all();
            }
            fn next_look(&self) -> Option<Duration> {
                Some(Duration::ZERO)
            }
        }
        struct Member(ProgressList);
        impl Waitable for Member {
            fn ready(&self) -> bool {
                false
            }
            fn drive(&self) {
                self.0.run();
            }
            fn sources(&self) -> Option<&ProgressList> {
                Some(&self.0)
            }
        }
        let bell = Arc::new(Doorbell::default());
        let list = ProgressList::default();
        list.add(bell.clone());
        let m: Arc<dyn Waitable> = Arc::new(Member(list));
        let ws = WaitSet::open(&WaitAttr {
            wait_obj: WaitObj::MutexCond,
            flags: 0,
        })
        .unwrap();
        ws.add(Arc::downgrade(&m));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let ws = ws.clone();
            std::thread::spawn(move || tx.send(ws.wait(-1)).unwrap())
        };
        while bell.entered.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        ws.wake();
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the signal left the waiter in the member's source");
        assert!(r.is_ok(), "{r:?}");
        waiter.join().unwrap();
    }

    /// A pipe source that joins sleeps shared with others, counting what was asked of it.
    struct Joining {
        pipe: Arc<PipeSource>,
        /// False: it cannot join (its sleep is its own `idle_wait`).
        can: bool,
        joined: AtomicUsize,
        left: AtomicUsize,
        waited: AtomicUsize,
    }

    impl Joining {
        fn new(can: bool) -> Arc<Self> {
            Arc::new(Joining {
                pipe: PipeSource::new(),
                can,
                joined: AtomicUsize::new(0),
                left: AtomicUsize::new(0),
                waited: AtomicUsize::new(0),
            })
        }

        fn counts(&self) -> (usize, usize, usize) {
            (
                self.joined.load(Ordering::Acquire),
                self.left.load(Ordering::Acquire),
                self.waited.load(Ordering::Acquire),
            )
        }
    }

    impl ProgressSource for Joining {
        fn progress(&self) -> usize {
            self.pipe.progress()
        }
        fn idle_wait(&self, _timeout: Duration) {
            self.waited.fetch_add(1, Ordering::AcqRel);
        }
        fn join_sleep(&self, timeout: Duration, out: &mut Vec<(RawFd, i16)>) -> Join {
            if !self.can {
                return Join::Cannot;
            }
            if self.progress() > 0 {
                return Join::Ready;
            }
            self.pipe.wait_fds(out);
            self.joined.fetch_add(1, Ordering::AcqRel);
            Join::Joined(timeout)
        }
        fn leave_sleep(&self) {
            self.left.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A thread driving several sources sleeps on all of them at once, for as long as it was
    /// asked, and a frame at any of them ends the sleep. It slept on the first one's doorbell
    /// a millisecond at a time: an idle domain with two endpoints cost its progress thread
    /// about 2% of a core, thirty times one endpoint's.
    #[test]
    fn a_thread_driving_several_sources_sleeps_on_all_of_them_at_once() {
        let (a, b) = (Joining::new(true), Joining::new(true));
        let list = Arc::new(ProgressList::default());
        list.add(a.clone());
        list.add(b.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = {
            let list = list.clone();
            std::thread::spawn(move || {
                list.idle_wait(Duration::from_secs(60));
                tx.send(()).unwrap();
            })
        };
        // Both joined (the sleep has begun, or is about to: a frame from now on ends it).
        let until = Instant::now() + Duration::from_secs(20);
        while a.counts().0 == 0 || b.counts().0 == 0 {
            assert!(
                Instant::now() < until,
                "the sleep never joined both sources: {:?} {:?}",
                a.counts(),
                b.counts()
            );
            std::thread::yield_now();
        }
        // Asleep, not returned at once: nothing ends a sleep of 60 s before the frame.
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the joint sleep ended with nothing to end it"
        );
        b.pipe.frame();
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a frame at the second source left the thread asleep");
        sleeper.join().unwrap();
        // Joined once, left once, and neither slept its own way.
        assert_eq!(a.counts(), (1, 1, 0));
        assert_eq!(b.counts(), (1, 1, 0));
    }

    /// A source with work ready ends the joint sleep before it begins, and those that had
    /// joined are left; one that cannot join sends the thread back to the old way (a
    /// millisecond on the first one's doorbell), the others left all the same.
    #[test]
    fn a_joint_sleep_is_skipped_when_one_source_has_work_or_cannot_join() {
        let (a, b) = (Joining::new(true), Joining::new(true));
        let list = ProgressList::default();
        list.add(a.clone());
        list.add(b.clone());
        b.pipe.frame();
        // Ends at once (were it to sleep, only the 60 s timeout would end it).
        list.idle_wait(Duration::from_secs(60));
        assert_eq!(a.counts(), (1, 1, 0));
        assert_eq!(b.counts(), (0, 0, 0));

        let (c, d) = (Joining::new(true), Joining::new(false));
        let list = ProgressList::default();
        list.add(c.clone());
        list.add(d.clone());
        list.idle_wait(Duration::from_secs(60));
        assert_eq!(c.counts(), (1, 1, 1), "left, then its own wait");
        assert_eq!(d.counts(), (0, 0, 0));
    }
}
