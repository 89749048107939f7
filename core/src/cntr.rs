//! Counters: fi_cntr(3). A success value and an error value, both 64-bit, with waiters.
//! Endpoints bind a counter per class of operation (send, recv, read, write, remote read,
//! remote write); providers bump it through `CntrInner::inc`.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::consts::{CntrEvents, WaitObj};
use crate::error::{Error, Result};
use crate::trigger::{CntrPort, TriggerQueue};
use crate::wait::{deadline, remaining, FdWait, ProgressList, ProgressSource, WaitSet, Waitable};

/// `struct fi_cntr_attr`.
#[derive(Clone, Default)]
pub struct CntrAttr {
    /// Only `FI_CNTR_EVENTS_COMP`.
    pub events: CntrEvents,
    /// How `wait` blocks.
    pub wait_obj: WaitObj,
    /// The set to join when `wait_obj` is `Set`.
    pub wait_set: Option<WaitSet>,
    /// Reserved; must be 0.
    pub flags: u64,
}

/// Something to run when a counter changes: the threshold-trigger queue hooks in here.
pub trait CntrObserver: Send + Sync {
    /// Called after the success or error value changed.
    fn changed(&self, cntr: &Arc<CntrInner>);
}

/// Shared state of a counter.
pub struct CntrInner {
    value: AtomicU64,
    err: AtomicU64,
    wait_obj: WaitObj,
    lock: Mutex<()>,
    cond: Condvar,
    sleepers: AtomicUsize,
    progress: ProgressList,
    bound: AtomicUsize,
    /// Closed (`Counter::close`): a thread still in `wait`, holding the counter through its
    /// own handle, returns instead of sleeping on.
    closed: std::sync::atomic::AtomicBool,
    wait_set: Option<WaitSet>,
    observers: Mutex<Vec<Weak<dyn CntrObserver>>>,
    has_observers: std::sync::atomic::AtomicBool,
    /// Changes so far (success or error value, by completion or by the application) and the
    /// number a wait set last reported: a counter wakes a wait set when an event is added,
    /// not for as long as its value is non-zero, else a waiter on a counter that ever counted
    /// would spin (fi_poll(3): a counter has events when it "changed since the last time").
    events: AtomicU64,
    /// `FI_WAIT_FD`: readable after a change (success or error).
    fd: Option<FdWait>,
    /// `events` as the last `trywait` found it.
    tried: AtomicU64,
    events_seen: AtomicU64,
    /// The domain it was opened in.
    pub domain: crate::tag::DomainTag,
    /// Operations waiting for this counter's thresholds (triggered operations and deferred
    /// work); created by the first one queued.
    triggers: OnceLock<Arc<TriggerQueue>>,
    /// The device-readable mirror of the values, once exported (`export_xpu`).
    pub(crate) xpu: OnceLock<Arc<crate::xpu::cntr::CntrExport>>,
    /// Where an export to a GPU XPU takes its memory: the domain's (`Domain::cntr_open`).
    pub(crate) xpu_mem: OnceLock<Arc<dyn crate::xpu::XpuMemAlloc>>,
    /// Where the exported mirror and ring go when the counter goes: its domain's
    /// (`xpu::Retired`).
    pub(crate) retired: OnceLock<Arc<crate::xpu::Retired>>,
}

impl Drop for CntrInner {
    fn drop(&mut self) {
        // An XPU may still read or add through its handle: its memory outlives the counter,
        // until the domain closes (a counter opened outside a domain: while the handle
        // lives). Its ring is closed either way: a late add answers `-FI_ESHUTDOWN`, and a
        // wait ends so.
        if let Some(x) = self.xpu.get() {
            let blocks = x.retire();
            if let Some(r) = self.retired.get() {
                for block in blocks {
                    r.keep(block);
                }
            }
        }
    }
}

/// `fid_cntr`: a handle to a counter. Cloning shares it.
#[derive(Clone)]
pub struct Counter {
    inner: Arc<CntrInner>,
}

impl Counter {
    /// `fi_cntr_open`; `Domain::cntr_open` calls this.
    pub fn open(attr: &CntrAttr) -> Result<Self> {
        if attr.flags != 0 {
            return Err(Error::BadFlags(format!(
                "cntr_open: flags must be 0, got {:#x}",
                attr.flags
            )));
        }
        if attr.wait_obj == WaitObj::Set && attr.wait_set.is_none() {
            return Err(Error::Inval(
                "cntr_open: FI_WAIT_SET needs a wait_set".into(),
            ));
        }
        if attr.wait_obj == WaitObj::PollFd {
            return Err(Error::OpNotSupp(
                "cntr_open: FI_WAIT_POLLFD is not supported; use FI_WAIT_FD".into(),
            ));
        }
        let fd = if attr.wait_obj == WaitObj::Fd {
            Some(FdWait::new()?)
        } else {
            None
        };
        let inner = Arc::new(CntrInner {
            value: AtomicU64::new(0),
            err: AtomicU64::new(0),
            wait_obj: attr.wait_obj,
            lock: Mutex::new(()),
            cond: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            progress: ProgressList::default(),
            bound: AtomicUsize::new(0),
            closed: Default::default(),
            wait_set: attr
                .wait_set
                .clone()
                .filter(|_| attr.wait_obj == WaitObj::Set),
            observers: Mutex::new(Vec::new()),
            has_observers: Default::default(),
            events: AtomicU64::new(0),
            events_seen: AtomicU64::new(0),
            fd,
            tried: AtomicU64::new(0),
            domain: Default::default(),
            triggers: OnceLock::new(),
            xpu: OnceLock::new(),
            xpu_mem: OnceLock::new(),
            retired: OnceLock::new(),
        });
        if let Some(ws) = &inner.wait_set {
            ws.add(Arc::downgrade(&(inner.clone() as Arc<dyn Waitable>)));
        }
        Ok(Counter { inner })
    }

    /// `fi_control(FI_GETWAIT)` for `FI_WAIT_FD`: a descriptor that becomes readable when the
    /// counter changes or, under manual progress, when a frame arrives for an endpoint it
    /// drives (an epoll set, see [`FdWait`]). Call `trywait` before blocking on it.
    pub fn wait_fd(&self) -> Result<i32> {
        crate::wait::member_wait_fd(self.inner.fd.as_ref(), self.inner.wait_set.as_ref(), "cntr")
    }

    /// `fi_control(FI_GETWAITOBJ)`: as a CQ's.
    pub fn wait_obj(&self) -> WaitObj {
        crate::wait::member_wait_obj(self.inner.wait_obj, self.inner.wait_set.as_ref())
    }

    /// `fi_trywait`: progresses the endpoints it drives; `Ok` when it is safe to block on the
    /// wait object (no change since the last `trywait`), `Again` when the counter changed
    /// meanwhile (read it first) or progress found work.
    pub fn trywait(&self) -> Result<()> {
        let idle = match &self.inner.fd {
            Some(fd) => fd.prepare(&[&self.inner.progress]),
            None => {
                self.inner.progress.run();
                true
            }
        };
        let now = self.inner.events.load(Ordering::Acquire);
        if self.inner.tried.swap(now, Ordering::AcqRel) != now || !idle {
            Err(Error::Again("cntr trywait"))
        } else {
            Ok(())
        }
    }

    /// The shared state, for binding.
    pub fn inner(&self) -> &Arc<CntrInner> {
        &self.inner
    }

    /// `fi_cntr_read`: the success value (drives progress first).
    pub fn read(&self) -> u64 {
        self.inner.progress.run();
        self.inner.value.load(Ordering::Acquire)
    }

    /// `fi_cntr_readerr`.
    pub fn readerr(&self) -> u64 {
        self.inner.progress.run();
        self.inner.err.load(Ordering::Acquire)
    }

    /// `fi_cntr_add`.
    pub fn add(&self, v: u64) -> Result<()> {
        self.inner.add_value(v);
        Ok(())
    }

    /// `fi_cntr_set`.
    pub fn set(&self, v: u64) -> Result<()> {
        self.inner.set_value(v);
        Ok(())
    }

    /// `fi_cntr_adderr`.
    pub fn adderr(&self, v: u64) -> Result<()> {
        self.inner.err.fetch_add(v, Ordering::AcqRel);
        self.inner.changed();
        self.inner.notify_observers();
        Ok(())
    }

    /// `fi_cntr_seterr`.
    pub fn seterr(&self, v: u64) -> Result<()> {
        self.inner.err.store(v, Ordering::Release);
        self.inner.changed();
        self.inner.notify_observers();
        Ok(())
    }

    /// `fi_cntr_wait`: until the value reaches `threshold` (`Ok`), the error value changes
    /// (`Avail`), or the timeout in ms passes (`TimedOut`; -1 waits forever).
    pub fn wait(&self, threshold: u64, timeout_ms: i32) -> Result<()> {
        // FI_WAIT_NONE counters are waited on by polling: the caller asked to block, and
        // refusing would only make every caller write the same loop.
        let err0 = self.inner.err.load(Ordering::Acquire);
        let dl = deadline(timeout_ms);
        let mut spins = 0u32;
        loop {
            let worked = self.inner.progress.run();
            if self.inner.value.load(Ordering::Acquire) >= threshold {
                return Ok(());
            }
            if self.inner.err.load(Ordering::Acquire) != err0 {
                return Err(Error::Avail);
            }
            if self.inner.closed.load(Ordering::Acquire) {
                return Err(Error::OpBadState(
                    "cntr wait: the counter was closed while this thread waited".into(),
                ));
            }
            let Some(left) = remaining(dl, Duration::from_millis(1)) else {
                return Err(Error::TimedOut("cntr wait"));
            };
            if worked > 0 {
                spins = 0;
                continue;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if self.inner.progress.is_empty() && self.inner.wait_obj != WaitObj::None {
                self.inner.sleep(left, threshold, err0);
            } else if self.inner.progress.is_empty() {
                std::thread::yield_now();
            } else {
                self.inner.progress.idle_wait(left);
            }
        }
    }

    /// Why `close` would refuse now (an endpoint is bound, or operations wait on its
    /// thresholds), if it would.
    pub fn busy(&self) -> Option<Error> {
        let n = self.inner.bound.load(Ordering::Acquire);
        if n > 0 {
            return Some(Error::Busy(format!(
                "cntr close: {n} endpoint binding(s) left"
            )));
        }
        let queued = self.inner.triggers.get().map_or(0, |q| q.len());
        (queued > 0).then(|| {
            Error::Busy(format!(
                "cntr close: {queued} triggered operation(s) wait on it (cancel or flush them)"
            ))
        })
    }

    /// `fi_close`: `Busy` (handing the counter back) while an endpoint is bound to it or
    /// triggered operations or deferred work wait on its thresholds.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        if let Some(e) = self.busy() {
            return Err((self, e));
        }
        // A thread still in `wait` (through a handle of its own) returns rather than waiting
        // for a change nothing will make.
        self.inner.closed.store(true, Ordering::Release);
        let _g = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.cond.notify_all();
        Ok(())
    }
}

impl CntrInner {
    /// Registers an enabled endpoint's progress hook. An endpoint under auto progress passes
    /// `None`: its domain's thread drives it, and readers sleep on this object's own wait
    /// instead of driving it themselves.
    pub fn bind(&self, p: Option<Arc<dyn ProgressSource>>) {
        if let Some(p) = p {
            self.progress.add(p);
        }
    }

    /// Undoes `bind`.
    pub fn unbind(&self, p: Option<&Arc<dyn ProgressSource>>) {
        if let Some(p) = p {
            self.progress.remove(p);
        }
    }

    /// Counts an endpoint's binding (`fi_ep_bind`, whether or not the endpoint is enabled
    /// yet): closing the counter answers `Busy` until it is released.
    pub(crate) fn hold(&self) {
        self.bound.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes `hold` when the endpoint closes.
    pub(crate) fn release(&self) {
        self.bound.fetch_sub(1, Ordering::AcqRel);
    }

    /// Provider side: one more successful completion.
    pub fn inc(&self) {
        self.value.fetch_add(1, Ordering::AcqRel);
        self.changed();
    }

    /// Provider side: one more failed completion.
    pub fn inc_err(&self) {
        self.err.fetch_add(1, Ordering::AcqRel);
        self.changed();
    }

    /// `fi_cntr_add` on the shared state (also what a deferred `FI_OP_CNTR_ADD` does).
    pub(crate) fn add_value(self: &Arc<Self>, v: u64) {
        self.value.fetch_add(v, Ordering::AcqRel);
        self.changed();
        self.notify_observers();
    }

    /// `fi_cntr_set` on the shared state (also what a deferred `FI_OP_CNTR_SET` does).
    pub(crate) fn set_value(self: &Arc<Self>, v: u64) {
        self.value.store(v, Ordering::Release);
        self.changed();
        self.notify_observers();
    }

    /// `fi_cntr_adderr` on the shared state (an XPU's `fi_xpu_cntr_adderr`).
    pub(crate) fn add_err_value(self: &Arc<Self>, v: u64) {
        self.err.fetch_add(v, Ordering::AcqRel);
        self.changed();
        self.notify_observers();
    }

    /// `fi_cntr_seterr` on the shared state (an XPU's `fi_xpu_cntr_seterr`).
    pub(crate) fn set_err_value(self: &Arc<Self>, v: u64) {
        self.err.store(v, Ordering::Release);
        self.changed();
        self.notify_observers();
    }

    /// The success value without driving progress.
    pub fn value(&self) -> u64 {
        self.value.load(Ordering::Acquire)
    }

    /// The error value without driving progress.
    pub fn err_value(&self) -> u64 {
        self.err.load(Ordering::Acquire)
    }

    /// Adds an observer told of every change (used by triggered operations).
    pub fn observe(&self, o: Weak<dyn CntrObserver>) {
        let mut v = self.observers.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(o);
        self.has_observers.store(true, Ordering::Release);
    }

    fn changed(self: &CntrInner) {
        self.events.fetch_add(1, Ordering::AcqRel);
        if let Some(x) = self.xpu.get() {
            x.mirror(|| (self.value(), self.err_value()));
        }
        // The value's update (before the call) and this read of `sleepers`, against a
        // sleeper's count then read of the value (`sleep`): with a SeqCst fence between each
        // pair one of the two sees the other, so no sleeper misses the change.
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cond.notify_all();
        }
        if let Some(ws) = &self.wait_set {
            ws.signal();
        }
        if let Some(fd) = &self.fd {
            fd.signal();
        }
    }

    /// The queue of operations waiting on this counter's thresholds, created on first use.
    pub(crate) fn trigger_queue(&self) -> &Arc<TriggerQueue> {
        self.triggers
            .get_or_init(|| Arc::new(TriggerQueue::default()))
    }

    /// The queue of waiting operations, if one was ever created.
    pub(crate) fn existing_trigger_queue(&self) -> Option<&Arc<TriggerQueue>> {
        self.triggers.get()
    }

    /// Tells observers of a change, and starts triggered operations whose threshold the
    /// change reached; providers call it after `inc` (the `Counter` calls do it themselves).
    pub fn notify_observers(self: &Arc<Self>) {
        if let Some(q) = self.triggers.get() {
            TriggerQueue::kick(q, self);
        }
        if !self.has_observers.load(Ordering::Acquire) {
            return;
        }
        let obs: Vec<_> = self
            .observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|w| w.upgrade())
            .collect();
        for o in obs {
            o.changed(self);
        }
    }

    fn sleep(&self, left: Duration, threshold: u64, err0: u64) {
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Counted before the look (see `changed`): a change the look misses finds the count
        // and wakes the wait, under the lock it holds until it sleeps.
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.value.load(Ordering::Acquire) < threshold
            && self.err.load(Ordering::Acquire) == err0
            && !self.closed.load(Ordering::Acquire)
        {
            let _ = self.cond.wait_timeout(g, left);
        }
        self.sleepers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The trigger machinery updates counters and reads their values through `CntrPort`, below
/// the counter that holds its queue.
impl CntrPort for CntrInner {
    fn value(&self) -> u64 {
        CntrInner::value(self)
    }

    fn err_value(&self) -> u64 {
        CntrInner::err_value(self)
    }

    fn set(self: Arc<Self>, v: u64) {
        self.set_value(v);
    }

    fn add(self: Arc<Self>, v: u64) {
        self.add_value(v);
    }

    fn count(self: Arc<Self>, ok: bool) {
        if ok {
            self.inc();
        } else {
            self.inc_err();
        }
        self.notify_observers();
    }

    fn drive_by(&self, p: Arc<dyn ProgressSource>) {
        self.progress.add(p);
    }

    fn undrive(&self, p: &Arc<dyn ProgressSource>) {
        self.progress.remove(p);
    }
}

impl Waitable for CntrInner {
    fn ready(&self) -> bool {
        self.events.load(Ordering::Acquire) != self.events_seen.load(Ordering::Acquire)
    }
    fn consume(&self) {
        self.events_seen
            .store(self.events.load(Ordering::Acquire), Ordering::Release);
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

    #[test]
    fn values_and_errors() {
        let c = Counter::open(&Default::default()).unwrap();
        c.add(3).unwrap();
        c.inner().inc();
        assert_eq!(c.read(), 4);
        c.set(10).unwrap();
        assert_eq!(c.read(), 10);
        c.adderr(2).unwrap();
        c.inner().inc_err();
        assert_eq!(c.readerr(), 3);
        c.seterr(0).unwrap();
        assert_eq!(c.readerr(), 0);
    }

    #[test]
    fn wait_threshold_timeout_and_error() {
        let c = Counter::open(&Default::default()).unwrap();
        assert_eq!(c.wait(1, 0), Err(Error::TimedOut("cntr wait")));
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.wait(5, -1));
        for _ in 0..5 {
            c.inner().inc();
        }
        assert_eq!(t.join().unwrap(), Ok(()));
        let c3 = c.clone();
        let t = std::thread::spawn(move || c3.wait(100, 10_000));
        std::thread::yield_now();
        c.adderr(1).unwrap();
        // Either the waiter saw the error change, or it started after it and waits on; in the
        // second case the threshold is reached below and it returns Ok.
        c.set(100).unwrap();
        let r = t.join().unwrap();
        assert!(r == Err(Error::Avail) || r == Ok(()), "{r:?}");
    }

    #[test]
    fn wait_set_wakes_on_new_events_not_on_a_non_zero_value() {
        let ws = WaitSet::open(&crate::wait::WaitAttr {
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        let c = Counter::open(&CntrAttr {
            wait_obj: WaitObj::Set,
            wait_set: Some(ws.clone()),
            ..Default::default()
        })
        .unwrap();
        c.add(5).unwrap();
        assert_eq!(
            ws.wait(0),
            Ok(()),
            "the additions are events nobody saw yet"
        );
        // Reported once: the value stays 5, but nothing new happened.
        assert_eq!(ws.wait(20), Err(Error::TimedOut("fi_wait")));
        assert_eq!(c.read(), 5);
        let ws2 = ws.clone();
        let t = std::thread::spawn(move || ws2.wait(10_000));
        c.inner().inc();
        assert_eq!(t.join().unwrap(), Ok(()));
        assert_eq!(ws.wait(0), Err(Error::TimedOut("fi_wait")));
        c.inner().inc_err();
        assert_eq!(ws.wait(0), Ok(()));
    }
}
