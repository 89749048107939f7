//! Completion queues: fi_cq(3) written once for every provider. Providers push entries; the
//! application reads, reads errors, blocks with a timeout and a threshold, and signals.
//!
//! The queue stores the widest success layout (tagged) plus the source address and narrows on
//! read to the format the queue was opened with. Error entries are kept apart but in their
//! place (`ErrStored`): a read takes the successes queued before the first error, then
//! returns `Avail` until that error is read, as libfabric's queues do.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::consts::*;
use crate::entry::*;
use crate::error::{Error, Result};
use crate::wait::{deadline, remaining, FdWait, ProgressList, ProgressSource, WaitSet, Waitable};

/// Default number of entries when `CqAttr::size` is 0.
pub const DEFAULT_CQ_SIZE: usize = 1024;

/// `struct fi_cq_attr`.
#[derive(Clone, Default)]
pub struct CqAttr {
    /// Minimum number of entries; 0 picks `DEFAULT_CQ_SIZE`.
    pub size: usize,
    /// `FI_AFFINITY` is accepted (and ignored); nothing else.
    pub flags: u64,
    /// Entry layout reads return; `Unspec` means `Context`.
    pub format: CqFormat,
    /// How `sread` blocks.
    pub wait_obj: WaitObj,
    /// Interrupt affinity hint, ignored.
    pub signaling_vector: i32,
    /// `Threshold` makes `sread` wait for `threshold` entries.
    pub wait_cond: CqWaitCond,
    /// The wait set to join when `wait_obj` is `Set`.
    pub wait_set: Option<WaitSet>,
}

struct Stored {
    entry: CqTaggedEntry,
    src: FiAddr,
}

/// An error entry, with the count of success entries queued before it (`Queue::pushed_ok`
/// when it was queued): a read takes those first, as fi_cq(3) reports an error only when it
/// is the queue's topmost entry. (A multi-receive buffer released by an error entry, a
/// cancel or a truncation, must not be read as released before its earlier messages.)
struct ErrStored {
    at: u64,
    e: CqErrEntry,
    data: Option<Box<[u8]>>,
}

struct Queue {
    ring: VecDeque<Stored>,
    errs: VecDeque<ErrStored>,
    /// Success entries ever queued, and ever taken (read, or moved to an exported ring).
    pushed_ok: u64,
    read_ok: u64,
    /// Error data of the entry last returned by `readerr`: it stays valid until the next one.
    last_err_data: Option<Box<[u8]>>,
    /// Set when an entry had to be dropped; reported once the valid entries are read.
    overrun: bool,
    signaled: bool,
    /// Closed (`CompletionQueue::close`): a thread still waiting in `sread`, which holds the
    /// queue through its own handle, returns instead of sleeping on.
    closed: bool,
}

impl Queue {
    /// Success entries queued ahead of the first error entry (`usize::MAX` with none).
    #[inline]
    fn ok_ahead(&self) -> usize {
        self.errs
            .front()
            .map_or(usize::MAX, |x| x.at.wrapping_sub(self.read_ok) as usize)
    }

    /// Once the ring is empty, its next entry goes to the start of its buffer again. Left to
    /// itself a `VecDeque` writes each entry past the last one read, so a queue sized for many
    /// that holds few at a time walks its whole buffer (4 MiB for 65,536 entries or more):
    /// every entry is written to a line nothing touched for a lap, and on the first lap one
    /// entry in 64 starts a new page, a page fault (3-14 us each on this VM: most of what a
    /// batch of 64 completions cost). Rewound, the few lines in use stay in the cache.
    #[inline]
    fn rewind(&mut self) {
        if self.ring.is_empty() {
            // `clear` on an empty deque moves its head to the start and frees nothing.
            self.ring.clear();
        }
    }
}

/// The shared state of a completion queue; providers hold an `Arc` of it.
pub struct CqInner {
    format: CqFormat,
    cap: usize,
    wait_obj: WaitObj,
    wait_cond: CqWaitCond,
    q: Mutex<Queue>,
    cond: Condvar,
    sleepers: AtomicUsize,
    has_errors: AtomicBool,
    /// Success entries queued, or non-zero while overrun: lets an empty read skip the lock.
    ready_hint: AtomicUsize,
    /// Room in use: entries and error entries queued, and entries promised to started
    /// operations (`FI_RM_ENABLED`, see `ep_credit`). Kept outside the lock so that a post
    /// reserves its entry with one atomic add; changed only together with the queue's
    /// contents (under the lock) or by a reservation.
    used: AtomicUsize,
    progress: ProgressList,
    bound: AtomicUsize,
    fd: Option<FdWait>,
    wait_set: Option<WaitSet>,
    /// The domain it was opened in.
    pub domain: crate::tag::DomainTag,
    /// The ring an XPU reads this queue's entries from, once exported (`export_xpu`).
    pub(crate) xpu: std::sync::OnceLock<Arc<crate::xpu::cq::CqExport>>,
    /// Where an export to a GPU XPU takes its memory: the domain's (`Domain::cq_open`).
    pub(crate) xpu_mem: std::sync::OnceLock<Arc<dyn crate::xpu::XpuMemAlloc>>,
    /// Where the exported ring goes when the queue goes: its domain's (`xpu::Retired`).
    pub(crate) retired: std::sync::OnceLock<Arc<crate::xpu::Retired>>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // An XPU may still read through its handle: the ring outlives the queue, until the
        // domain closes.
        if let (Some(x), Some(r)) = (self.xpu.get(), self.retired.get()) {
            r.keep(x.memory());
        }
    }
}

/// `fid_cq`: a handle to a completion queue. Cloning shares the queue.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

impl CompletionQueue {
    /// Opens a queue (`fi_cq_open`); `Domain::cq_open` calls this.
    pub fn open(attr: &CqAttr) -> Result<Self> {
        if attr.flags & !(FI_AFFINITY) != 0 {
            return Err(Error::BadFlags(format!(
                "cq_open: flags {:#x} are not CQ attribute flags (only FI_AFFINITY)",
                attr.flags
            )));
        }
        if attr.wait_obj == WaitObj::Set && attr.wait_set.is_none() {
            return Err(Error::Inval(
                "cq_open: wait_obj FI_WAIT_SET needs a wait_set".into(),
            ));
        }
        if attr.wait_obj == WaitObj::PollFd {
            return Err(Error::OpNotSupp(
                "cq_open: FI_WAIT_POLLFD is not supported; use FI_WAIT_FD".into(),
            ));
        }
        let format = match attr.format {
            CqFormat::Unspec => CqFormat::Context,
            f => f,
        };
        let cap = if attr.size == 0 {
            DEFAULT_CQ_SIZE
        } else {
            attr.size
        };
        let fd = if attr.wait_obj == WaitObj::Fd {
            Some(FdWait::new()?)
        } else {
            None
        };
        let inner = Arc::new(CqInner {
            format,
            cap,
            wait_obj: attr.wait_obj,
            wait_cond: attr.wait_cond,
            q: Mutex::new(Queue {
                ring: VecDeque::with_capacity(cap.min(1 << 16)),
                errs: VecDeque::new(),
                pushed_ok: 0,
                read_ok: 0,
                last_err_data: None,
                overrun: false,
                signaled: false,
                closed: false,
            }),
            cond: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            has_errors: AtomicBool::new(false),
            ready_hint: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            progress: ProgressList::default(),
            bound: AtomicUsize::new(0),
            fd,
            wait_set: attr
                .wait_set
                .clone()
                .filter(|_| attr.wait_obj == WaitObj::Set),
            domain: Default::default(),
            xpu: std::sync::OnceLock::new(),
            xpu_mem: std::sync::OnceLock::new(),
            retired: std::sync::OnceLock::new(),
        });
        if let Some(ws) = &inner.wait_set {
            let w: Weak<dyn Waitable> = Arc::downgrade(&(inner.clone() as Arc<dyn Waitable>));
            ws.add(w);
        }
        Ok(CompletionQueue { inner })
    }

    /// The shared state, for binding to endpoints.
    pub fn inner(&self) -> &Arc<CqInner> {
        &self.inner
    }

    /// The entry format reads return.
    pub fn format(&self) -> CqFormat {
        self.inner.format
    }

    /// `fi_cq_read`: up to `buf.len()` entries. `Again` when empty, `Avail` when an error entry
    /// waits, `Overrun` once the valid entries of an overrun queue are gone. An empty `buf`
    /// (count 0) only drives progress, as fi_cq(3) allows: `Ok(0)` when entries are waiting.
    pub fn read<E: CqFormatEntry>(&self, buf: &mut [E]) -> Result<usize> {
        self.read_impl(buf, None)
    }

    /// `fi_cq_read` of no entries, as libfabric's providers answer it: progress driven, then
    /// `Ok(0)` where entries wait, `Avail` where an error entry waits, `Again` where nothing
    /// does (`Overrun` once an overrun queue is empty), whatever the queue's format.
    pub fn read_none(&self) -> Result<usize> {
        self.inner.progress.run();
        self.inner.take::<CqEntry>(&mut [], None)
    }

    /// Drives what this queue's readers drive (under manual progress the endpoints bound to
    /// it and their domain's), reading nothing: what `fi_cq_read` of no entries does, a
    /// polling loop's way to make progress for entries it leaves to others (an XPU reading
    /// the queue's exported ring). Returns how much work was found.
    pub fn progress(&self) -> usize {
        self.inner.progress.run()
    }

    /// `fi_cq_readfrom`: like `read`, also returning each entry's source address
    /// (`FI_ADDR_NOTAVAIL` where unknown). `src` must be as long as `buf`.
    pub fn readfrom<E: CqFormatEntry>(&self, buf: &mut [E], src: &mut [FiAddr]) -> Result<usize> {
        if src.len() < buf.len() {
            return Err(Error::Inval(format!(
                "cq readfrom: {} source slots for {} entries",
                src.len(),
                buf.len()
            )));
        }
        self.read_impl(buf, Some(src))
    }

    // Always inlined, `take` too: a C program's fi_cq_read is a call into libfabric.so that
    // lands here, and a poll that finds nothing should cost no more frames than the Rust
    // caller's, into which these inline anyway.
    #[inline(always)]
    fn read_impl<E: CqFormatEntry>(
        &self,
        buf: &mut [E],
        src: Option<&mut [FiAddr]>,
    ) -> Result<usize> {
        self.check_format::<E>()?;
        self.inner.progress.run();
        self.inner.take(buf, src)
    }

    #[inline]
    fn check_format<E: CqFormatEntry>(&self) -> Result<()> {
        if E::FORMAT != self.inner.format {
            return Err(self.format_mismatch(E::FORMAT));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn format_mismatch(&self, read_as: CqFormat) -> Error {
        Error::Inval(format!(
            "cq read: queue was opened with {} but read as {}",
            self.inner.format.c_name(),
            read_as.c_name()
        ))
    }

    /// `fi_cq_readerr`: the oldest error entry, or `Again` if there is none or a success entry
    /// queued before it is still to be read. `err_data` (the
    /// raw source address for `FI_EADDRNOTAVAIL`) points into the queue and stays valid until the
    /// next `readerr`; `readerr_data` returns a copy instead.
    pub fn readerr(&self) -> Result<CqErrEntry> {
        self.readerr_data().map(|(e, _)| e)
    }

    /// `readerr`, also returning a copy of the entry's error data.
    pub fn readerr_data(&self) -> Result<(CqErrEntry, Option<Vec<u8>>)> {
        self.inner.progress.run();
        let mut q = self.inner.lock();
        // A success entry queued before the first error is read first (`ErrStored`).
        if q.ok_ahead() > 0 {
            return Err(Error::Again("cq readerr"));
        }
        let ErrStored { mut e, data, .. } = q.errs.pop_front().ok_or(Error::Again("cq readerr"))?;
        self.inner.release_room(1);
        self.inner
            .has_errors
            .store(!q.errs.is_empty(), Ordering::Relaxed);
        let copy = data.as_ref().map(|d| d.to_vec());
        if let Some(d) = &data {
            e.err_data = d.as_ptr() as usize;
            e.err_data_size = d.len();
        }
        q.last_err_data = data;
        Ok((e, copy))
    }

    /// `fi_cq_sread`: blocks until an entry (or `threshold` entries with `FI_CQ_COND_THRESHOLD`)
    /// is there, an error is, the timeout (ms, -1 forever) passes, or `signal` is called.
    /// A timeout with nothing to read is `Again`, not `TimedOut`: fi_cq(3) returns -FI_EAGAIN
    /// when "the call timed out or was signaled and no data is available". A signal is
    /// `Interrupted` (also -FI_EAGAIN in C), and only when no entry is waiting.
    pub fn sread<E: CqFormatEntry>(
        &self,
        buf: &mut [E],
        threshold: usize,
        timeout_ms: i32,
    ) -> Result<usize> {
        self.sread_impl(buf, None, threshold, timeout_ms)
    }

    /// `fi_cq_sreadfrom`.
    pub fn sreadfrom<E: CqFormatEntry>(
        &self,
        buf: &mut [E],
        src: &mut [FiAddr],
        threshold: usize,
        timeout_ms: i32,
    ) -> Result<usize> {
        if src.len() < buf.len() {
            return Err(Error::Inval(
                "cq sreadfrom: fewer source slots than entries".into(),
            ));
        }
        self.sread_impl(buf, Some(src), threshold, timeout_ms)
    }

    fn sread_impl<E: CqFormatEntry>(
        &self,
        buf: &mut [E],
        mut src: Option<&mut [FiAddr]>,
        threshold: usize,
        timeout_ms: i32,
    ) -> Result<usize> {
        self.check_format::<E>()?;
        if matches!(self.inner.wait_obj, WaitObj::None | WaitObj::Set) {
            return Err(Error::OpBadState(format!(
                "cq sread on a queue opened with {}: use read, or fi_wait on the set",
                self.inner.wait_obj.c_name()
            )));
        }
        // A threshold past what the queue can hold could never be met: the wait would
        // outlast an overrun the completions beyond its size make.
        let want = match self.inner.wait_cond {
            CqWaitCond::Threshold => threshold.clamp(1, buf.len().max(1)).min(self.inner.cap()),
            CqWaitCond::None => 1,
        };
        let dl = deadline(timeout_ms);
        let mut spins = 0u32;
        loop {
            let worked = self.inner.progress.run();
            {
                let mut q = self.inner.lock();
                if !q.errs.is_empty() || q.ring.len() >= want || q.overrun {
                    drop(q);
                    match self.inner.take(buf, src.as_deref_mut()) {
                        // Another reader took them between the look and the take: the wait
                        // goes on, until its time runs out (`Again` from a wait means that, or
                        // a signal).
                        Err(Error::Again(_)) => {
                            if remaining(dl, Duration::from_millis(1)).is_none() {
                                return Err(Error::Again("cq sread"));
                            }
                            continue;
                        }
                        r => return r,
                    }
                }
                if q.closed {
                    return Err(Error::OpBadState(
                        "cq sread: the queue was closed while this thread waited".into(),
                    ));
                }
                // A signal ends the wait, but never hides data that is already there.
                if q.signaled {
                    q.signaled = false;
                    drop(q);
                    return match self.inner.take(buf, src.as_deref_mut()) {
                        Err(Error::Again(_)) => Err(Error::Interrupted("cq sread")),
                        r => r,
                    };
                }
            }
            let Some(left) = remaining(dl, Duration::from_millis(1)) else {
                // One last non-blocking look so a partial batch is not held back past the timeout.
                return match self.inner.take(buf, src.as_deref_mut()) {
                    Err(Error::Again(_)) => Err(Error::Again("cq sread")),
                    r => r,
                };
            };
            if worked > 0 {
                spins = 0;
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if self.inner.progress.is_empty() {
                self.inner.sleep(left, want);
            } else if self.inner.wait_obj == WaitObj::MutexCond {
                // An armed XPU trigger is found only by looking: a sleep on the condition
                // ends in time for the watcher's next look, and a spin is the watcher's.
                match self.inner.progress.next_look() {
                    Some(Duration::ZERO) => self.inner.progress.idle_wait(left),
                    Some(d) => self.inner.sleep(left.min(d), want),
                    None => self.inner.sleep(left, want),
                }
            } else if self.inner.wait_obj == WaitObj::Yield {
                std::thread::yield_now();
            } else {
                self.inner.progress.idle_wait(left);
            }
        }
    }

    /// `fi_cq_signal`: wakes a thread blocked in `sread`, which returns `Interrupted`, one
    /// blocked on the queue's descriptor (`FI_WAIT_FD`), which becomes readable, and one in
    /// `fi_wait` on its wait set, which returns.
    pub fn signal(&self) -> Result<()> {
        if self.inner.wait_obj == WaitObj::None {
            return Err(Error::OpBadState(
                "cq signal: queue has no wait object (FI_WAIT_NONE)".into(),
            ));
        }
        let mut q = self.inner.lock();
        q.signaled = true;
        self.inner.cond.notify_all();
        drop(q);
        if let Some(fd) = &self.inner.fd {
            fd.signal();
        }
        if let Some(ws) = &self.inner.wait_set {
            ws.wake();
        }
        Ok(())
    }

    /// `fi_control(FI_GETWAIT)` for `FI_WAIT_FD`: the descriptor that becomes readable when an
    /// entry arrives or, under manual progress, when a frame arrives for an endpoint this
    /// queue drives (an epoll set, see [`FdWait`]). Call `trywait` before blocking on it.
    pub fn wait_fd(&self) -> Result<i32> {
        crate::wait::member_wait_fd(self.inner.fd.as_ref(), self.inner.wait_set.as_ref(), "cq")
    }

    /// `fi_control(FI_GETWAITOBJ)`: the kind of wait object it waits with (a set's member,
    /// its set's).
    pub fn wait_obj(&self) -> WaitObj {
        crate::wait::member_wait_obj(self.inner.wait_obj, self.inner.wait_set.as_ref())
    }

    /// `fi_trywait`: progresses the endpoints it drives; `Ok` when it is safe to block on the
    /// wait object (nothing is pending), `Again` when entries are ready to read or progress
    /// found work.
    pub fn trywait(&self) -> Result<()> {
        let idle = match &self.inner.fd {
            Some(fd) => fd.prepare(&[&self.inner.progress]),
            None => {
                self.inner.progress.run();
                true
            }
        };
        if !idle || self.inner.ready() {
            Err(Error::Again("cq trywait"))
        } else {
            Ok(())
        }
    }

    /// `fi_cq_strerror`.
    pub fn strerror(&self, prov_errno: i32) -> String {
        crate::error::strerror(prov_errno)
    }

    /// Number of success entries waiting.
    pub fn len(&self) -> usize {
        self.inner.lock().ring.len()
    }

    /// True when no success entry waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why `close` would refuse now (an endpoint is bound), if it would.
    pub fn busy(&self) -> Option<Error> {
        let n = self.inner.bound.load(Ordering::Acquire);
        (n > 0).then(|| Error::Busy(format!("cq close: {n} endpoint binding(s) left")))
    }

    /// `fi_close`: fails with `Busy` (handing the queue back) while an endpoint is bound.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        if let Some(e) = self.busy() {
            return Err((self, e));
        }
        // A thread still in `sread` (through a handle of its own) returns rather than waiting
        // for an entry nothing will write.
        let mut q = self.inner.lock();
        q.closed = true;
        self.inner.cond.notify_all();
        Ok(())
    }
}

impl CqInner {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an enabled endpoint's progress hook. An endpoint under auto progress passes
    /// `None`: its domain's thread drives it, and readers sleep on this object's own wait
    /// instead of driving it themselves.
    pub fn bind(&self, p: Option<Arc<dyn ProgressSource>>) {
        if let Some(p) = p {
            self.progress.add(p);
        }
    }

    /// Undoes `bind` when the endpoint closes.
    pub fn unbind(&self, p: Option<&Arc<dyn ProgressSource>>) {
        if let Some(p) = p {
            self.progress.remove(p);
        }
    }

    /// Counts an endpoint's binding (`fi_ep_bind`, whether or not the endpoint is enabled
    /// yet): closing the queue answers `Busy` until it is released.
    pub(crate) fn hold(&self) {
        self.bound.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes `hold` when the endpoint closes.
    pub(crate) fn release(&self) {
        self.bound.fetch_sub(1, Ordering::AcqRel);
    }

    /// Appends a success entry. Returns false (and marks the queue overrun) when full.
    pub fn push(&self, entry: CqTaggedEntry, src: FiAddr) -> bool {
        let ok = {
            let mut q = self.lock();
            let ok = if q.overrun {
                false
            } else if self.used.load(Ordering::Acquire) >= self.cap {
                q.overrun = true;
                false
            } else {
                q.ring.push_back(Stored { entry, src });
                q.pushed_ok = q.pushed_ok.wrapping_add(1);
                self.used.fetch_add(1, Ordering::AcqRel);
                true
            };
            self.ready_hint
                .store(q.ring.len() + q.overrun as usize, Ordering::Release);
            ok
        };
        self.notify();
        ok
    }

    /// Reserves room for one entry (`FI_RM_ENABLED`); false when entries and reservations
    /// already fill the queue.
    pub fn reserve(&self) -> bool {
        if self.used.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.release_room(1);
            return false;
        }
        true
    }

    /// Gives back a reservation no entry will use.
    pub fn unreserve(&self) {
        self.release_room(1);
    }

    /// `n` entries' room is free again (read, or a reservation given back). Saturating: a
    /// bookkeeping slip must not wrap into a queue that looks full forever.
    #[inline]
    fn release_room(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// Appends a success entry under resource management: never dropped, never an overrun.
    /// `reserved`: the entry takes the place of a reservation; otherwise it is kept even
    /// when that goes beyond the queue's size.
    pub fn push_managed(&self, entry: CqTaggedEntry, src: FiAddr, reserved: bool) {
        {
            let mut q = self.lock();
            if !reserved {
                self.used.fetch_add(1, Ordering::AcqRel);
            }
            q.ring.push_back(Stored { entry, src });
            q.pushed_ok = q.pushed_ok.wrapping_add(1);
            self.ready_hint
                .store(q.ring.len() + q.overrun as usize, Ordering::Release);
        }
        self.notify();
    }

    /// Appends an error entry (errors are never dropped for space; they count towards it).
    pub fn push_err(&self, e: CqErrEntry) {
        self.push_err_data(e, None)
    }

    /// Appends an error entry with error data (e.g. an unresolved source address).
    pub fn push_err_data(&self, e: CqErrEntry, data: Option<Box<[u8]>>) {
        {
            let mut q = self.lock();
            let at = q.pushed_ok;
            q.errs.push_back(ErrStored { at, e, data });
            self.used.fetch_add(1, Ordering::AcqRel);
            self.has_errors.store(true, Ordering::Relaxed);
        }
        self.notify();
    }

    /// True when an entry of either kind can be read now.
    pub fn ready(&self) -> bool {
        let q = self.lock();
        !q.ring.is_empty() || !q.errs.is_empty() || q.overrun
    }

    /// Tells whoever waits on the queue that an entry arrived: most queues have nobody (no
    /// wait object, no sleeper, no exported ring), which is looked at here, inline.
    #[inline(always)]
    fn notify(&self) {
        if self.xpu.get().is_some()
            || self.sleepers.load(Ordering::Acquire) > 0
            || self.fd.is_some()
            || self.wait_set.is_some()
        {
            self.notify_waiters();
        }
    }

    #[inline(never)]
    fn notify_waiters(&self) {
        if self.xpu.get().is_some() {
            self.pump_xpu();
        }
        if self.sleepers.load(Ordering::Acquire) > 0 {
            let _g = self.lock();
            self.cond.notify_all();
        }
        if let Some(fd) = &self.fd {
            fd.signal();
        }
        if let Some(ws) = &self.wait_set {
            ws.signal();
        }
    }

    /// Whether as many error entries wait to be read as the queue holds entries: what an
    /// XPU's faulty descriptors may fill before its ring stops being drained. One atomic
    /// load while no error waits.
    pub(crate) fn errors_full(&self) -> bool {
        self.has_errors.load(Ordering::Relaxed) && self.lock().errs.len() >= self.cap
    }

    /// Error entries waiting to be read that `f` picks.
    pub(crate) fn errors_waiting_of(&self, f: impl Fn(&CqErrEntry) -> bool) -> usize {
        if !self.has_errors.load(Ordering::Relaxed) {
            return 0;
        }
        self.lock().errs.iter().filter(|x| f(&x.e)).count()
    }

    /// Error entries waiting to be read.
    #[cfg(test)]
    pub(crate) fn errors_waiting(&self) -> usize {
        self.lock().errs.len()
    }

    /// Entries the queue holds at most.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Whether entries may wait in the host queue (two loads; no lock): what a pump checks
    /// before it takes the lock.
    pub(crate) fn may_hold_entries(&self) -> bool {
        self.ready_hint.load(Ordering::Acquire) > 0 || self.has_errors.load(Ordering::Acquire)
    }

    /// Moves entries into the exported ring while it has room, in the order a read finds them
    /// (`ErrStored`); what does not fit stays here, in order, for the next pump. Returns
    /// whether entries stay behind.
    pub(crate) fn pump_xpu(&self) -> bool {
        let Some(x) = self.xpu.get() else {
            return false;
        };
        let mut q = self.lock();
        let mut moved = 0;
        while x.room() > 0 {
            if q.ok_ahead() == 0 {
                let Some(ErrStored { e, .. }) = q.errs.pop_front() else {
                    break;
                };
                // Error data lives in host memory an XPU may not reach: not carried.
                x.put_err(&e);
            } else if let Some(s) = q.ring.pop_front() {
                q.read_ok = q.read_ok.wrapping_add(1);
                x.put_ok(&s.entry, s.src);
            } else {
                break;
            }
            moved += 1;
        }
        if moved > 0 {
            q.rewind();
            self.release_room(moved);
            self.has_errors.store(!q.errs.is_empty(), Ordering::Relaxed);
            self.ready_hint
                .store(q.ring.len() + q.overrun as usize, Ordering::Release);
        }
        if q.overrun && q.ring.is_empty() && q.errs.is_empty() {
            // Every entry from before the overrun is in the ring: the XPU may be told.
            x.mark_overrun();
        }
        !q.ring.is_empty() || !q.errs.is_empty()
    }

    fn sleep(&self, left: Duration, want: usize) {
        let q = self.lock();
        if q.signaled || q.closed || !q.errs.is_empty() || q.ring.len() >= want {
            return;
        }
        self.sleepers.fetch_add(1, Ordering::AcqRel);
        let _ = self.cond.wait_timeout(q, left);
        self.sleepers.fetch_sub(1, Ordering::AcqRel);
    }

    #[inline(always)]
    fn take<E: CqFormatEntry>(
        &self,
        buf: &mut [E],
        mut src: Option<&mut [FiAddr]>,
    ) -> Result<usize> {
        if !self.has_errors.load(Ordering::Relaxed) && self.ready_hint.load(Ordering::Acquire) == 0
        {
            return Err(Error::Again("cq read"));
        }
        let mut q = self.lock();
        // Successes queued before the first error are read first; then the error.
        let ahead = q.ok_ahead();
        if ahead == 0 {
            return Err(Error::Avail);
        }
        if q.ring.is_empty() {
            return Err(if q.overrun {
                Error::Overrun
            } else {
                Error::Again("cq read")
            });
        }
        let n = buf.len().min(q.ring.len()).min(ahead);
        q.read_ok = q.read_ok.wrapping_add(n as u64);
        self.release_room(n);
        // Taken one by one from the front: most reads take one or two entries, for which a
        // drain's setup and teardown cost more than the entries.
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let Some(s) = q.ring.pop_front() else { break };
            *b = E::from_tagged(&s.entry);
            if let Some(src) = src.as_deref_mut() {
                src[i] = s.src;
            }
        }
        q.rewind();
        self.ready_hint
            .store(q.ring.len() + q.overrun as usize, Ordering::Release);
        Ok(n)
    }
}

impl Waitable for CqInner {
    fn ready(&self) -> bool {
        CqInner::ready(self)
    }
    fn drive(&self) {
        self.progress.run();
    }
    fn sources(&self) -> Option<&ProgressList> {
        Some(&self.progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ctx: usize) -> CqTaggedEntry {
        CqTaggedEntry {
            op_context: ctx,
            flags: FI_SEND | FI_MSG,
            ..Default::default()
        }
    }

    fn open(size: usize, format: CqFormat) -> CompletionQueue {
        CompletionQueue::open(&CqAttr {
            size,
            format,
            ..Default::default()
        })
        .unwrap()
    }

    /// Where the ring's next entry goes (its front, once one is pushed).
    fn front_at(cq: &CompletionQueue) -> *const Stored {
        let q = cq.inner().lock();
        q.ring.as_slices().0.as_ptr()
    }

    #[test]
    fn a_large_queue_holding_few_entries_reuses_the_start_of_its_buffer() {
        // 65,536 entries: a 4 MiB buffer. Read as they come, entries must not walk it (a
        // fresh line each, and a page fault every 64 on the first lap).
        let cq = open(1 << 16, CqFormat::Tagged);
        let mut buf = [CqTaggedEntry::default(); 64];
        cq.inner().push(entry(0), 0);
        let start = front_at(&cq);
        assert_eq!(cq.read(&mut buf), Ok(1));
        for round in 0..1_000 {
            for k in 0..3 {
                cq.inner().push(entry(round * 3 + k), 0);
            }
            assert_eq!(front_at(&cq), start, "round {round}: the ring moved on");
            // Two reads: the first leaves one behind (the ring is not rewound under it).
            assert_eq!(cq.read(&mut buf[..2]), Ok(2));
            assert_eq!(buf[1].op_context, round * 3 + 1);
            assert_eq!(cq.read(&mut buf), Ok(1));
            assert_eq!(buf[0].op_context, round * 3 + 2);
        }
    }

    #[test]
    fn read_narrows_and_reports_again_when_empty() {
        let cq = open(4, CqFormat::Msg);
        let mut buf = [CqMsgEntry::default(); 4];
        assert_eq!(cq.read(&mut buf), Err(Error::Again("cq read")));
        cq.inner().push(entry(7), 3);
        cq.inner().push(entry(8), FI_ADDR_NOTAVAIL);
        let mut src = [0u64; 4];
        assert_eq!(cq.readfrom(&mut buf, &mut src), Ok(2));
        assert_eq!(buf[0].op_context, 7);
        assert_eq!(buf[1].flags, FI_SEND | FI_MSG);
        assert_eq!(&src[..2], &[3, FI_ADDR_NOTAVAIL]);
        let mut wrong = [CqEntry::default(); 1];
        assert!(matches!(cq.read(&mut wrong), Err(Error::Inval(_))));
    }

    /// Entries come out in the order they were queued, errors among them: a read takes the
    /// successes queued before the first error, then answers `Avail` until that error is read
    /// (`readerr` answers `Again` while a success is ahead of it), as libfabric's queues do.
    #[test]
    fn an_error_entry_is_read_in_its_place() {
        let cq = open(8, CqFormat::Context);
        cq.inner().push(entry(1), 0);
        cq.inner().push(entry(2), 0);
        cq.inner().push_err(CqErrEntry {
            op_context: 3,
            err: errno::FI_ETRUNC,
            olen: 5,
            ..Default::default()
        });
        cq.inner().push(entry(4), 0);
        cq.inner().push_err(CqErrEntry {
            op_context: 5,
            err: errno::FI_ECANCELED,
            ..Default::default()
        });
        let mut one = [CqEntry::default(); 1];
        assert_eq!(cq.readerr(), Err(Error::Again("cq readerr")));
        assert_eq!(cq.read(&mut one), Ok(1));
        assert_eq!(one[0].op_context, 1);
        let mut buf = [CqEntry::default(); 4];
        assert_eq!(
            cq.read(&mut buf),
            Ok(1),
            "only the success before the error"
        );
        assert_eq!(buf[0].op_context, 2);
        assert_eq!(cq.read(&mut buf), Err(Error::Avail));
        let e = cq.readerr().unwrap();
        assert_eq!((e.op_context, e.err, e.olen), (3, errno::FI_ETRUNC, 5));
        assert_eq!(cq.readerr(), Err(Error::Again("cq readerr")));
        assert_eq!(cq.read(&mut buf), Ok(1));
        assert_eq!(buf[0].op_context, 4);
        assert_eq!(cq.read(&mut buf), Err(Error::Avail));
        assert_eq!(cq.readerr().map(|e| e.op_context), Ok(5));
        assert_eq!(cq.read(&mut buf), Err(Error::Again("cq read")));
        assert_eq!(cq.readerr(), Err(Error::Again("cq readerr")));
    }

    #[test]
    fn overrun_after_valid_entries_then_fatal() {
        let cq = open(2, CqFormat::Context);
        assert!(cq.inner().push(entry(1), 0));
        assert!(cq.inner().push(entry(2), 0));
        assert!(!cq.inner().push(entry(3), 0));
        let mut buf = [CqEntry::default(); 1];
        assert_eq!(cq.read(&mut buf), Ok(1));
        assert_eq!(cq.read(&mut buf), Ok(1));
        assert_eq!(buf[0].op_context, 2);
        assert_eq!(cq.read(&mut buf), Err(Error::Overrun));
        assert!(!cq.inner().push(entry(4), 0));
        assert_eq!(cq.read(&mut buf), Err(Error::Overrun));
    }

    #[test]
    fn sread_threshold_timeout_and_signal() {
        let cq = CompletionQueue::open(&CqAttr {
            format: CqFormat::Context,
            wait_obj: WaitObj::Unspec,
            wait_cond: CqWaitCond::Threshold,
            ..Default::default()
        })
        .unwrap();
        let mut buf = [CqEntry::default(); 8];
        // fi_cq(3): a timeout with no data is -FI_EAGAIN.
        assert_eq!(cq.sread(&mut buf, 2, 0), Err(Error::Again("cq sread")));
        assert_eq!(cq.sread(&mut buf, 1, 5), Err(Error::Again("cq sread")));
        cq.inner().push(entry(1), 0);
        // Below the threshold: the timeout returns what is there rather than holding it back.
        assert_eq!(cq.sread(&mut buf, 2, 5), Ok(1));
        let cq2 = cq.clone();
        let t = std::thread::spawn(move || {
            let mut b = [CqEntry::default(); 8];
            cq2.sread(&mut b, 3, -1)
        });
        for i in 0..3 {
            cq.inner().push(entry(10 + i), 0);
        }
        assert_eq!(t.join().unwrap(), Ok(3));
        let cq3 = cq.clone();
        let t = std::thread::spawn(move || {
            let mut b = [CqEntry::default(); 8];
            cq3.sread(&mut b, 1, -1)
        });
        // The waiter may not be asleep yet; the signal is latched until it looks.
        cq.signal().unwrap();
        assert_eq!(t.join().unwrap(), Err(Error::Interrupted("cq sread")));
    }

    #[test]
    fn signal_does_not_hide_queued_entries() {
        let cq = CompletionQueue::open(&CqAttr {
            format: CqFormat::Context,
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        cq.inner().push(entry(5), 0);
        cq.signal().unwrap();
        let mut buf = [CqEntry::default(); 4];
        assert_eq!(cq.sread(&mut buf, 1, 1000), Ok(1));
        assert_eq!(buf[0].op_context, 5);
        // With nothing queued a signal ends the wait at once.
        cq.signal().unwrap();
        assert_eq!(
            cq.sread(&mut buf, 1, -1),
            Err(Error::Interrupted("cq sread"))
        );
    }

    /// A progress source that completes one operation into `cq` the first time it is driven.
    struct OneShot {
        cq: Arc<CqInner>,
        fired: AtomicBool,
    }

    impl ProgressSource for OneShot {
        fn progress(&self) -> usize {
            if self.fired.swap(true, Ordering::AcqRel) {
                return 0;
            }
            self.cq.push(entry(9), 0);
            1
        }
    }

    #[test]
    fn read_with_count_zero_drives_progress() {
        let cq = open(4, CqFormat::Context);
        let src: Arc<dyn ProgressSource> = Arc::new(OneShot {
            cq: cq.inner().clone(),
            fired: AtomicBool::new(false),
        });
        cq.inner().bind(Some(src.clone()));
        let mut none: [CqEntry; 0] = [];
        // fi_cq(3): "A count value of 0 may be used to drive progress".
        assert_eq!(cq.read(&mut none), Ok(0));
        assert_eq!(cq.len(), 1);
        let mut buf = [CqEntry::default(); 1];
        assert_eq!(cq.read(&mut buf), Ok(1));
        assert_eq!(buf[0].op_context, 9);
        assert_eq!(cq.read(&mut none), Err(Error::Again("cq read")));
        cq.inner().unbind(Some(&src));
    }

    #[test]
    fn wait_none_refuses_sread_and_signal() {
        let cq = CompletionQueue::open(&CqAttr {
            wait_obj: WaitObj::None,
            ..Default::default()
        })
        .unwrap();
        let mut buf = [CqEntry::default(); 1];
        assert!(matches!(
            cq.sread(&mut buf, 1, 0),
            Err(Error::OpBadState(_))
        ));
        assert!(matches!(cq.signal(), Err(Error::OpBadState(_))));
    }

    #[test]
    fn wait_fd_becomes_readable() {
        let cq = CompletionQueue::open(&CqAttr {
            wait_obj: WaitObj::Fd,
            ..Default::default()
        })
        .unwrap();
        let fd = cq.wait_fd().unwrap();
        assert_eq!(cq.trywait(), Ok(()));
        cq.inner().push(entry(1), 0);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        assert_eq!(n, 1);
        assert_eq!(cq.trywait(), Err(Error::Again("cq trywait")));
    }

    #[test]
    fn wait_set_wakes_on_member() {
        let ws = WaitSet::open(&crate::wait::WaitAttr {
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        let cq = CompletionQueue::open(&CqAttr {
            wait_obj: WaitObj::Set,
            wait_set: Some(ws.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ws.wait(0), Err(Error::TimedOut("fi_wait")));
        cq.inner().push(entry(1), 0);
        assert_eq!(ws.wait(100), Ok(()));
    }

    /// A set that outlives many queues opened and closed on it keeps none of them.
    #[test]
    fn a_wait_set_forgets_queues_closed() {
        let ws = WaitSet::open(&crate::wait::WaitAttr {
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..100 {
            let cq = CompletionQueue::open(&CqAttr {
                wait_obj: WaitObj::Set,
                wait_set: Some(ws.clone()),
                ..Default::default()
            })
            .unwrap();
            cq.close().map_err(|(_, e)| e).unwrap();
        }
        assert!(ws.kept() <= 1, "{} kept", ws.kept());
    }

    /// A threshold past the queue's size can never be met: the wait ends with the entries
    /// the queue holds once it overruns, not at its timeout (here none: a hang guard only).
    #[test]
    fn a_threshold_past_the_queues_size_ends_at_the_overrun() {
        let cq = CompletionQueue::open(&CqAttr {
            size: 2,
            format: CqFormat::Context,
            wait_obj: WaitObj::Unspec,
            wait_cond: CqWaitCond::Threshold,
            ..Default::default()
        })
        .unwrap();
        let cq2 = cq.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut b = [CqEntry::default(); 8];
            let _ = tx.send(cq2.sread(&mut b, 8, -1));
        });
        for i in 0..3 {
            cq.inner().push(entry(i), 0);
        }
        let got = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("sread(threshold 8, no timeout) on a queue of 2 still waits");
        assert_eq!(got, Ok(2));
    }

    /// With readers racing it for the same entries, a wait with no timeout never answers
    /// `Again`: it goes on waiting when another took what it saw.
    #[test]
    fn a_wait_without_timeout_never_answers_again_when_others_take_its_entries() {
        let cq = CompletionQueue::open(&CqAttr {
            size: 1024,
            format: CqFormat::Context,
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        const N: usize = 100_000;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        let spurious = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for waiter in [true, true, false] {
            let (cq, done, taken, spurious) =
                (cq.clone(), done.clone(), taken.clone(), spurious.clone());
            threads.push(std::thread::spawn(move || {
                let mut b = [CqEntry::default(); 1];
                while !done.load(Ordering::Acquire) {
                    let r = if waiter {
                        cq.sread(&mut b, 1, -1)
                    } else {
                        cq.read(&mut b)
                    };
                    match r {
                        Ok(n) => {
                            taken.fetch_add(n, Ordering::AcqRel);
                        }
                        Err(Error::Again(_)) if waiter => {
                            spurious.fetch_add(1, Ordering::AcqRel);
                        }
                        // Woken to end (below).
                        Err(Error::Interrupted(_)) | Err(Error::Again(_)) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }));
        }
        for i in 0..N {
            // Room first (a push past the size would overrun the queue for good).
            while !cq.inner().reserve() {
                std::thread::yield_now();
            }
            cq.inner().push_managed(entry(i), 0, true);
        }
        let start = std::time::Instant::now();
        while taken.load(Ordering::Acquire) < N {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "entries left unread"
            );
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
        while threads.iter().any(|t| !t.is_finished()) {
            let _ = cq.signal();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            spurious.load(Ordering::Acquire),
            0,
            "sread(-1) answered Again"
        );
    }
}
