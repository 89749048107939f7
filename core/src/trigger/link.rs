//! An endpoint's side of triggered operations: where its operations start, wait when the
//! provider says `Again`, and are found again to be canceled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::cntr_port::CntrPort;
use super::deferred::Pending;
use super::job::{Job, Owner};
use super::port::{Action, Port, StartError};
use super::queue::{TriggerQueue, Watch};
use super::xpu::{DoorbellAlloc, Finder, XpuWatch};
use super::xpu_abi::{TriggerVar, Xpu};
use crate::consts::errno::{FI_ECANCELED, FI_EIO};
use crate::consts::FI_COMPLETION;
use crate::entry::Context;
use crate::error::{Error, Result};
use crate::wait::{Join, ProgressSource};
use crate::xpu::{Checked, XpuDesc};

/// Longest one spin on XPU doorbells lasts before the watcher yields and drives the endpoint
/// again (other traffic of the domain, and other threads of the core, wait at most this long
/// while the watcher spins).
const SPIN_SLICE: Duration = Duration::from_micros(10);

/// Shortest sleep of an XPU watcher taken on the provider's doorbell (`EpLink::idle_wait`).
const PORT_SLEEP_MIN: Duration = Duration::from_millis(1);

/// Operations waiting for room are retried at once for this long after they began waiting
/// or a retry last started one (room at a peer usually comes within it)...
pub(super) const STALL_SPIN: Duration = Duration::from_millis(1);

/// ... and then every this long at the latest (room in a CQ comes when the application reads
/// it, which may be seconds away: a spin would hold a core all that time).
const STALL_NAP: Duration = Duration::from_millis(1);

/// An operation waiting for room, with the descriptor it came from where an XPU posted it:
/// what that names (a region, a peer) is checked again before it starts, since the
/// application may have closed or removed it meanwhile, while the ring already looked empty.
struct Waiting {
    job: Job,
    desc: Option<Box<XpuDesc>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A trigger-able endpoint's link (`Endpoint::link`). It is also the endpoint's progress
/// source, so that driving the endpoint retries operations waiting for room.
pub(crate) struct EpLink {
    /// The endpoint's core and provider.
    pub(crate) port: Arc<dyn Port>,
    pub(super) closed: AtomicBool,
    /// Started operations the provider refused with `Again`, oldest first. While it is not
    /// empty, newly started operations queue behind it, so the endpoint keeps their order.
    stalled: Mutex<VecDeque<Waiting>>,
    has_stalled: AtomicBool,
    /// When operations began waiting for room, or a retry last started one (`clock::mono_ns`):
    /// retries spin for `STALL_SPIN` after it, then look every `STALL_NAP`.
    stall_moved: AtomicU64,
    retrying: AtomicBool,
    /// Counter queues that may hold this endpoint's operations (for cancel and close).
    queues: Mutex<Vec<Weak<TriggerQueue>>>,
    /// Completion counters of deferred work on this endpoint (manual progress): reading one
    /// drives the endpoint, as reading a counter bound to it does, until it closes. Weak:
    /// the counter is the application's to close and drop once its work is done.
    drives: Mutex<Vec<Weak<dyn CntrPort>>>,
    /// XPU-triggered operations and exported descriptor rings (`FI_XPU_TRIGGER` endpoints
    /// only).
    pub(crate) xpu: Option<XpuWatch>,
    /// This link, for the jobs an XPU's descriptors become.
    me: Weak<EpLink>,
}

impl EpLink {
    pub(crate) fn new(port: Arc<dyn Port>, doorbells: Option<Arc<dyn DoorbellAlloc>>) -> Arc<Self> {
        let link = Arc::new_cyclic(|me| EpLink {
            me: me.clone(),
            xpu: doorbells.map(XpuWatch::new),
            port,
            closed: AtomicBool::new(false),
            stalled: Mutex::default(),
            has_stalled: AtomicBool::new(false),
            stall_moved: AtomicU64::new(0),
            retrying: AtomicBool::new(false),
            queues: Mutex::default(),
            drives: Mutex::default(),
        });
        if link.xpu.is_some() {
            let weak: Weak<dyn super::xpu_wake::RingTarget> = Arc::downgrade(&link) as _;
            super::xpu_wake::register(weak);
        }
        link
    }

    fn owns(&self, job: &Job) -> bool {
        job.starts_on(self)
    }

    /// Queues `job` (an operation of this endpoint) on `q`, the threshold queue of `cntr`,
    /// and starts it if the threshold is already met.
    pub(crate) fn arm<C: CntrPort>(
        &self,
        q: &Arc<TriggerQueue>,
        cntr: &Arc<C>,
        watch: Watch,
        threshold: u64,
        job: Job,
    ) {
        {
            let mut qs = lock(&self.queues);
            if !qs.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(q))) {
                qs.retain(|w| w.strong_count() > 0);
                qs.push(Arc::downgrade(q));
            }
        }
        q.push(watch, threshold, job);
        TriggerQueue::kick(q, cntr);
        if self.closed.load(Ordering::Acquire) {
            // Lost a race with close: release what close may not have seen.
            for j in q.remove(|j| self.owns(j), false) {
                j.cancel_closed();
            }
        }
    }

    /// Arms `job` (an operation of this endpoint) on `xpu`'s doorbell; fills `vars`.
    pub(crate) fn arm_xpu(
        &self,
        what: &'static str,
        xpu: Xpu,
        vars: &mut [TriggerVar],
        job: Job,
    ) -> Result<usize> {
        let x = self.xpu.as_ref().ok_or_else(|| {
            Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_XPU_TRIGGER"
            ))
        })?;
        let n = x.arm(what, xpu, vars, job, self)?;
        // A progress thread asleep on the provider's doorbell must start watching this one.
        if self.port.auto_progress() {
            self.port.wake();
        }
        Ok(n)
    }

    /// The descriptor ring of (this endpoint, `xpu`) (`Endpoint::export_xpu_slots`).
    pub(crate) fn export_ring(
        &self,
        what: &'static str,
        xpu: Xpu,
        slots: usize,
    ) -> Result<Arc<crate::xpu::ring::DescRing>> {
        let x = self.xpu.as_ref().ok_or_else(|| {
            Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_XPU_TRIGGER"
            ))
        })?;
        let ring = x.export_ring(what, xpu, slots, self)?;
        // A progress thread asleep on the provider's doorbell must start watching this ring.
        if self.port.auto_progress() {
            self.port.wake();
        }
        Ok(ring)
    }

    /// The device API's part of a look: drains exported descriptor rings (this endpoint's,
    /// and every exported counter's), and moves completions into exported CQs' rings.
    /// Returns how many descriptors were taken.
    fn drain_xpu(&self, x: &XpuWatch, finder: Finder) -> usize {
        // Counted as a look before the counters' rings and the CQs' backlog are, so that a
        // watcher that has only those to watch (no doorbell, no ring of its own: `poll` and
        // `drain` record nothing then) may sleep: without it every sleep returned at once
        // and the progress thread spun a whole core while any counter was exported.
        super::xpu_wake::before_look();
        let mut n = 0;
        if x.has_rings() {
            if let Some(me) = self.me.upgrade() {
                let link: Arc<dyn Owner> = me;
                n += x.drain(self, &link, finder);
            }
        }
        n += crate::xpu::cntr::drain_all();
        x.set_cq_backlog(crate::xpu::cq::pump_all());
        n
    }

    /// Makes reading `cntr` (a deferred transfer's completion counter) drive this endpoint
    /// under manual progress, so that waiting on it cannot wait forever (under auto progress
    /// the domain's thread drives it). It does not bind the counter: the application may
    /// close it once its work is done, while this endpoint lives on (as it closes one per
    /// collective); counters gone since are forgotten here.
    pub(crate) fn drive_with<C: CntrPort>(self: &Arc<Self>, cntr: &Arc<C>) {
        if self.port.auto_progress() {
            return;
        }
        let mut d = lock(&self.drives);
        d.retain(|c| c.strong_count() > 0);
        let known = |c: &Weak<dyn CntrPort>| std::ptr::addr_eq(c.as_ptr(), Arc::as_ptr(cntr));
        if self.closed.load(Ordering::Acquire) || d.iter().any(known) {
            return;
        }
        cntr.drive_by(self.clone());
        let weak: Weak<dyn CntrPort> = Arc::downgrade(cntr) as Weak<dyn CntrPort>;
        d.push(weak);
    }

    /// Starts a job whose threshold was reached, behind any that wait for room. Inline: a
    /// job is large, and each call it went through copied it.
    #[inline]
    pub(crate) fn submit(&self, job: Job) {
        self.submit_from(job, None);
    }

    /// `submit` of a job `desc` (an XPU's descriptor) asked for, if one did.
    #[inline]
    fn submit_from(&self, job: Job, desc: Option<&XpuDesc>) {
        if self.closed.load(Ordering::SeqCst) {
            job.cancel_closed();
            return;
        }
        if self.has_stalled.load(Ordering::Acquire) {
            let s = lock(&self.stalled);
            if self.has_stalled.load(Ordering::Acquire) {
                self.stall_in(s, job, desc.map(|d| Box::new(*d)), false);
                return;
            }
        }
        if let Some(job) = self.start(job) {
            self.stall(job, desc.map(|d| Box::new(*d)), false);
        }
    }

    /// Keeps `job`, refused for want of room, to be retried (at the queue's front or back);
    /// cancels it instead where the endpoint closed meanwhile: `closed` is read under the
    /// queue's lock, which the close's last sweep takes after setting it, so a job is either
    /// there for that sweep or sees the close (a start that took long, racing `fi_close`,
    /// put it back where nothing would look again, its job holding the endpoint for good).
    fn stall(&self, job: Job, desc: Option<Box<XpuDesc>>, front: bool) {
        self.stall_in(lock(&self.stalled), job, desc, front);
    }

    /// `stall` with the queue's lock held already (`s`).
    fn stall_in(
        &self,
        mut s: std::sync::MutexGuard<'_, VecDeque<Waiting>>,
        job: Job,
        desc: Option<Box<XpuDesc>>,
        front: bool,
    ) {
        if self.closed.load(Ordering::Acquire) {
            drop(s);
            job.cancel_closed();
            return;
        }
        let w = Waiting { job, desc };
        // The first to wait starts the spin window (`has_stalled` may still be set by a
        // cancel or a close that emptied the queue); a retry putting its job back at the
        // front (`front`) continues the wait.
        if s.is_empty() && !front {
            self.stall_moved
                .store(crate::clock::mono_ns(), Ordering::Relaxed);
        }
        if front {
            s.push_front(w);
        } else {
            s.push_back(w);
        }
        self.has_stalled.store(true, Ordering::Release);
    }

    /// `submit` of a job without deferred work that is not made unless it has to wait: what
    /// an XPU's descriptors start as (`Owner::submit_action`).
    fn submit_action(&self, action: Action, desc: &XpuDesc, link: &Arc<dyn Owner>) {
        let job = |action| Job {
            action,
            ep: Some(link.clone()),
            work: None,
        };
        if self.closed.load(Ordering::Acquire) || self.has_stalled.load(Ordering::Acquire) {
            self.submit_from(job(action), Some(desc));
            return;
        }
        // SAFETY: as `start`'s: the descriptor's memory lies in regions exported to the XPU,
        // which keeps it valid until the operation completes.
        let Err(e) = (unsafe { self.port.start(&action) }) else {
            return;
        };
        let job = job(action);
        if let Some(job) = self.refused(job, None, e) {
            self.stall(job, Some(Box::new(*desc)), false);
        }
    }

    /// Hands `job` to the provider; gives it back if the provider says `Again`.
    #[inline]
    fn start(&self, mut job: Job) -> Option<Job> {
        let user_ctx = job.ctx();
        let key = job.work.as_ref().map(|w| {
            self.port.deferred().insert(Pending {
                user_ctx,
                ep_completion: job.flags() & FI_COMPLETION != 0,
                completion: w.completion.clone(),
            })
        });
        if let Some(k) = key {
            job.set_ctx(k);
        }
        // SAFETY: the contract of the call that posted the job (or queued the work) keeps its
        // buffers valid until it completes or is canceled; it has done neither yet.
        match unsafe { self.port.start(&job.action) } {
            Ok(()) => None,
            Err(e) => {
                let key = key.map(|k| (k, user_ctx));
                self.refused(job, key, e)
            }
        }
    }

    /// What follows a start the provider refused (`e`): the job back on `Again` (its deferred
    /// record `key`, with the user's context, undone), reported failed otherwise.
    fn refused(&self, mut job: Job, key: Option<(usize, Context)>, e: StartError) -> Option<Job> {
        match e {
            // Its device memory could not be staged (the copy out of the device, say): the
            // operation fails as a transfer whose data could not be read (FI_EIO), and the
            // driver's reason is kept for `take_staging_errors`.
            StartError::Stage(e) => {
                self.port.staging_failed(e);
                job.fail(&*self.port, FI_EIO);
                None
            }
            StartError::Refused(e) if e.is_again() => {
                if let Some((k, user_ctx)) = key {
                    self.port.deferred().remove(k);
                    job.set_ctx(user_ctx);
                }
                Some(job)
            }
            // Reported under the job's current context: deferred work's record routes it. An
            // endpoint that closed while the job was on its way cancels it, as close promises.
            StartError::Refused(e) => {
                let closing =
                    self.closed.load(Ordering::Acquire) && matches!(e, Error::OpBadState(_));
                let err = if closing { FI_ECANCELED } else { e.errno() };
                job.fail(&*self.port, err);
                None
            }
        }
    }

    /// Retries operations waiting for room, oldest first, until one is refused again. Jobs
    /// are taken one at a time: the queue may hold thousands (an XPU rang many at once) and
    /// only a ring's worth fit.
    fn retry(&self) -> usize {
        if self.retrying.swap(true, Ordering::AcqRel) {
            return 0;
        }
        let mut n = 0;
        // As `Job::fire`: a job held here while the close sweeps is reported before it returns.
        let _r = self.port.reporting();
        loop {
            let Some(Waiting { mut job, desc }) = lock(&self.stalled).pop_front() else {
                break;
            };
            if self.closed.load(Ordering::SeqCst) {
                // Ended by the close, as the close's own sweep ends the rest.
                job.cancel_closed();
                continue;
            }
            if let Some(d) = &desc {
                // Checked when it was taken from its ring; what it names may have gone since
                // (its region closed, its peer removed), so it is checked again, whole, and
                // starts as what the check makes of it now, or ends as a faulty descriptor.
                match self.port.xpu_action(d, &mut Checked::default()) {
                    Ok(action) => job.action = action,
                    Err(f) => {
                        self.port.xpu_fault(d.context as usize, d.opcode, &f);
                        n += 1;
                        continue;
                    }
                }
            }
            if let Some(job) = self.start(job) {
                // Back at the front: anything queued meanwhile stays behind it.
                self.stall(job, desc, true);
                break;
            }
            n += 1;
        }
        {
            let s = lock(&self.stalled);
            if s.is_empty() {
                self.has_stalled.store(false, Ordering::Release);
            }
        }
        if n > 0 {
            self.stall_moved
                .store(crate::clock::mono_ns(), Ordering::Relaxed);
        }
        self.retrying.store(false, Ordering::Release);
        n
    }

    /// While operations wait for room: how long until they are retried. At once (a spin)
    /// for `STALL_SPIN` after they began waiting or a retry last moved one; then every
    /// `STALL_NAP`. Room at a peer or in a CQ the application reads rings no doorbell of
    /// ours, so the retries go by time, and a wait for an application that reads its CQ
    /// seconds later does not spin a core meanwhile.
    fn stall_nap(&self) -> Duration {
        let since =
            crate::clock::mono_ns().saturating_sub(self.stall_moved.load(Ordering::Relaxed));
        if since < STALL_SPIN.as_nanos() as u64 {
            Duration::ZERO
        } else {
            STALL_NAP
        }
    }

    /// `fi_cancel` of a triggered operation not started yet: `true` if one had context `ctx`
    /// (it then reports `FI_ECANCELED`). Deferred work is canceled through its domain.
    pub(crate) fn cancel(&self, ctx: Context) -> bool {
        let mine = |j: &Job| self.owns(j) && j.work.is_none() && j.ctx() == ctx;
        let queues: Vec<_> = lock(&self.queues)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for q in queues {
            if let Some(j) = q.remove(mine, true).pop() {
                j.cancel();
                return true;
            }
        }
        // An armed send that ended with its peer still waits for its doorbell: taken out and
        // passed over, so that a later send under the same context is the one canceled.
        while let Some(j) = self.xpu.as_ref().and_then(|x| x.take(ctx)) {
            if j.cancel() {
                return true;
            }
        }
        // The same among those waiting for room: an armed send that fired into a full CQ
        // and ended with its peer meanwhile is passed over too.
        loop {
            let found = {
                let mut s = lock(&self.stalled);
                s.iter()
                    .position(|w| mine(&w.job))
                    .and_then(|i| s.remove(i))
                    .map(|w| w.job)
            };
            match found.map(Job::cancel) {
                Some(true) => return true,
                Some(false) => {}
                None => return false,
            }
        }
    }

    /// The endpoint is closing: every operation of it that has not started is canceled.
    pub(crate) fn close(self: &Arc<Self>) {
        // SeqCst against a reporter's count (`Job::fire`): it sees this, or the close's wait
        // sees it (`EpCore::wait_reports`).
        self.closed.store(true, Ordering::SeqCst);
        // What waited for room first: a descriptor held there was taken from its ring before
        // what is left in the ring, and is reported canceled before it.
        let stalled = std::mem::take(&mut *lock(&self.stalled));
        for w in stalled {
            w.job.cancel_closed();
        }
        if let Some(x) = &self.xpu {
            x.close_rings(&*self.port);
        }
        let queues = std::mem::take(&mut *lock(&self.queues));
        for q in queues.iter().filter_map(Weak::upgrade) {
            for j in q.remove(|j| self.owns(j), false) {
                j.cancel_closed();
            }
        }
        for j in self.xpu.iter().flat_map(XpuWatch::take_all) {
            j.cancel_closed();
        }
        if let Some(x) = &self.xpu {
            x.retire_bells(&*self.port);
        }
        // Held meanwhile by a drain or a retry that raced the close (each of them cancels what
        // it would start once it sees `closed`; this takes what it held before it looked).
        let stalled = std::mem::take(&mut *lock(&self.stalled));
        for w in stalled {
            w.job.cancel_closed();
        }
        let me: Arc<dyn ProgressSource> = self.clone();
        for c in std::mem::take(&mut *lock(&self.drives)) {
            if let Some(c) = c.upgrade() {
                c.undrive(&me);
            }
        }
    }
}

impl Owner for EpLink {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn submit(&self, job: Job) {
        EpLink::submit(self, job);
    }

    fn port(&self) -> &dyn Port {
        &*self.port
    }

    fn backlog(&self) -> bool {
        self.has_stalled.load(Ordering::Acquire)
    }

    fn submit_action(&self, action: Action, desc: &XpuDesc, link: &Arc<dyn Owner>) {
        EpLink::submit_action(self, action, desc, link);
    }
}

impl super::xpu_wake::RingTarget for EpLink {
    fn rung(&self) {
        if let Some(x) = &self.xpu {
            x.poll(&*self.port, Finder::Ringer, |j| self.submit(j));
            self.drain_xpu(x, Finder::Ringer);
        }
    }

    fn wake_watcher(&self) {
        self.port.wake();
    }
}

impl ProgressSource for EpLink {
    fn progress(&self) -> usize {
        // What an XPU posted or rang is started before the provider's own progress: its
        // operations are the ones waiting to begin, where the provider's progress only
        // finishes what began.
        let mut n = 0;
        if let Some(x) = &self.xpu {
            n += x.poll(&*self.port, Finder::Watcher, |j| self.submit(j));
            n += self.drain_xpu(x, Finder::Watcher);
        }
        n += self.port.progress();
        if !self.has_stalled.load(Ordering::Acquire) {
            return n;
        }
        n += self.retry();
        // The descriptors the waiting operations held in the ring go now, not at the
        // watcher's next look (`RingWatch::nap`).
        match &self.xpu {
            Some(x) if !self.has_stalled.load(Ordering::Acquire) => {
                n + self.drain_xpu(x, Finder::Watcher)
            }
            _ => n,
        }
    }

    fn idle_wait(&self, timeout: Duration) {
        // Room at a peer does not ring our doorbell: with operations waiting for it, only
        // yield for a while, so that the caller comes back soon to retry them; past that,
        // the wait below lasts at most `STALL_NAP`.
        let timeout = if self.has_stalled.load(Ordering::Acquire) {
            let nap = self.stall_nap();
            if nap.is_zero() {
                std::thread::yield_now();
                return;
            }
            timeout.min(nap)
        } else {
            timeout
        };
        // A producer that found its ring full is retrying, on this core as likely as not (a
        // CPU XPU on a small machine): it gets the core first, where a spin would hold it a
        // whole slice for nothing, and the caller comes back to look.
        if self
            .xpu
            .as_ref()
            .is_some_and(XpuWatch::take_producer_waited)
        {
            std::thread::yield_now();
            return;
        }
        // A doorbell an XPU stores to rings nothing: while operations are armed on one,
        // keep looking (spinning when a ring is likely, sleeps a CPU XPU's ring ends between).
        let backlog = self.has_stalled.load(Ordering::Acquire);
        match self.xpu.as_ref().and_then(|x| x.nap_with(backlog)) {
            Some(Duration::ZERO) => {
                if let Some(x) = &self.xpu {
                    x.spin(SPIN_SLICE.min(timeout), backlog);
                }
                // Between slices, the core goes to any other thread that wants it (on a small
                // machine, the very thread that is about to ring).
                std::thread::yield_now();
            }
            // A sleep of a millisecond or more is taken on the provider's doorbell, so that a
            // peer's message ends it (a watcher asleep on the ring word alone would leave an
            // exported endpoint's traffic for its next look); a CPU XPU's ring ends it too
            // (`RingTarget::wake_watcher`). Shorter ones, toward a predicted window, on the
            // ring word: a provider that sleeps in whole milliseconds (poll) would spin them.
            Some(d) if d.min(timeout) >= PORT_SLEEP_MIN => {
                super::xpu_wake::sleep_with(d.min(timeout), |t| self.port.idle_wait(t));
            }
            Some(d) => super::xpu_wake::sleep_until_ring(d.min(timeout)),
            None => self.port.idle_wait(timeout),
        }
    }

    fn wake(&self) {
        self.port.wake();
    }

    fn next_look(&self) -> Option<Duration> {
        let backlog = self.has_stalled.load(Ordering::Acquire);
        let xpu = self.xpu.as_ref().and_then(|x| x.nap_with(backlog));
        if !backlog {
            return xpu;
        }
        let stall = self.stall_nap();
        Some(xpu.map_or(stall, |d| d.min(stall)))
    }

    fn wait_fds(&self, out: &mut Vec<(std::os::fd::RawFd, i16)>) {
        self.port.wait_fds(out);
    }

    fn join_sleep(&self, timeout: Duration, out: &mut Vec<(std::os::fd::RawFd, i16)>) -> Join {
        // Operations waiting for room are retried by time, on this link's own wait.
        if self.has_stalled.load(Ordering::Acquire) {
            return Join::Cannot;
        }
        let Some(x) = &self.xpu else {
            return self.port.join_sleep(timeout, out);
        };
        // As `idle_wait`: a producer that found its ring full gets the core first.
        if x.take_producer_waited() {
            std::thread::yield_now();
            return Join::Ready;
        }
        // A last look at what XPUs stored (it records the look a CPU XPU's ring is measured
        // against: `xpu_wake::sleep_joined`), then the watcher's plan bounds the sleep.
        if x.poll(&*self.port, Finder::Watcher, |j| self.submit(j)) > 0
            || self.drain_xpu(x, Finder::Watcher) > 0
        {
            return Join::Ready;
        }
        match x.nap_with(false) {
            // In a window where a store is likely: this link spins (`idle_wait`).
            Some(Duration::ZERO) => Join::Cannot,
            Some(d) => self.port.join_sleep(timeout.min(d), out),
            None => self.port.join_sleep(timeout, out),
        }
    }

    fn leave_sleep(&self) {
        self.port.leave_sleep();
    }

    fn prepare_fd_sleep(&self) -> bool {
        // The provider readies its descriptors; what this link adds (XPU doorbells, retries
        // of stalled operations) announces itself through no descriptor.
        let mut idle = self.port.prepare_fd_sleep();
        if let Some(x) = &self.xpu {
            idle &= x.poll(&*self.port, Finder::Watcher, |j| self.submit(j)) == 0;
            idle &= self.drain_xpu(x, Finder::Watcher) == 0;
        }
        if self.has_stalled.load(Ordering::Acquire) {
            idle &= self.retry() == 0;
        }
        idle && self.next_look().is_none()
    }
}
