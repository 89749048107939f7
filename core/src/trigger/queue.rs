//! The threshold queue of one counter: operations waiting for the counter to reach a value,
//! kept in a binary heap keyed by (threshold, posting sequence), so that queueing and starting
//! are O(log n) each and they start in threshold order, equal thresholds in posting order,
//! however far one change moves the counter.
//!
//! Starting an operation may complete another one at once and change a counter again (this
//! one or another) from inside the notification. Two rules keep that safe: no lock is held
//! while an operation starts, and a thread that is already draining a queue only notes further
//! queues to drain (`LATER`) instead of recursing, so a chain of any length runs as a loop.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::cntr_port::CntrPort;
use super::job::Job;

/// Which value of the counter a waiting operation compares with its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watch {
    /// The success value: operations posted with `FI_TRIGGER` and `FI_TRIGGER_THRESHOLD`.
    Success,
    /// The success plus the error value: deferred work (`struct fi_deferred_work`).
    Total,
}

/// Children per node of the heaps: a 4-ary heap is half as deep as a binary one, and the
/// children of a node share one or two cache lines, which is what a million waiting
/// operations make the cost of.
const D: usize = 4;

/// A heap entry: the key operations start in, and where the operation is stored.
#[derive(Clone, Copy)]
struct Slot {
    threshold: u64,
    seq: u64,
    job: u32,
}

impl Slot {
    fn key(&self) -> (u64, u64) {
        (self.threshold, self.seq)
    }
}

/// A D-ary min-heap of slots, by (threshold, sequence).
#[derive(Default)]
struct MinHeap {
    v: Vec<Slot>,
}

impl MinHeap {
    fn peek(&self) -> Option<&Slot> {
        self.v.first()
    }

    fn push(&mut self, s: Slot) {
        let mut i = self.v.len();
        self.v.push(s);
        while i > 0 {
            let p = (i - 1) / D;
            if self.v[p].key() <= s.key() {
                break;
            }
            self.v[i] = self.v[p];
            i = p;
        }
        self.v[i] = s;
    }

    fn pop(&mut self) -> Option<Slot> {
        let last = self.v.pop()?;
        if self.v.is_empty() {
            return Some(last);
        }
        let top = self.v[0];
        self.sift_down(0, last);
        Some(top)
    }

    /// Places `s` at `i` or below, moving smaller children up.
    fn sift_down(&mut self, mut i: usize, s: Slot) {
        let n = self.v.len();
        loop {
            let first = i * D + 1;
            if first >= n {
                break;
            }
            let mut m = first;
            for c in first + 1..(first + D).min(n) {
                if self.v[c].key() < self.v[m].key() {
                    m = c;
                }
            }
            if self.v[m].key() >= s.key() {
                break;
            }
            self.v[i] = self.v[m];
            i = m;
        }
        self.v[i] = s;
    }

    /// Restores the heap order after arbitrary removals.
    fn rebuild(&mut self) {
        for i in (0..self.v.len() / D + 1).rev() {
            if i < self.v.len() {
                self.sift_down(i, self.v[i]);
            }
        }
    }
}

/// The waiting operations themselves, by slot number, reusing freed slots: no allocation per
/// operation once the queue has grown.
#[derive(Default)]
struct Slab {
    jobs: Vec<Option<Job>>,
    free: Vec<u32>,
}

impl Slab {
    fn put(&mut self, j: Job) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.jobs[i as usize] = Some(j);
                i
            }
            None => {
                self.jobs.push(Some(j));
                (self.jobs.len() - 1) as u32
            }
        }
    }

    fn get(&self, i: u32) -> &Job {
        self.jobs[i as usize]
            .as_ref()
            .expect("a queued slot holds its job")
    }

    fn take(&mut self, i: u32) -> Job {
        let j = self.jobs[i as usize]
            .take()
            .expect("a queued slot holds its job");
        self.free.push(i);
        if self.free.len() == self.jobs.len() && self.jobs.capacity() > 4096 {
            // Empty after a large burst: give the memory back.
            *self = Slab::default();
        }
        j
    }
}

#[derive(Default)]
struct Heaps {
    success: MinHeap,
    total: MinHeap,
    slab: Slab,
    /// Next posting sequence number; shared by both heaps so they interleave in posting order.
    seq: u64,
}

/// The operations waiting on one counter (the counter holds it: `CntrInner::trigger_queue`).
pub struct TriggerQueue {
    heaps: Mutex<Heaps>,
    /// Smallest threshold in each heap (`u64::MAX` when empty), readable without the lock:
    /// a counter change that reaches nothing costs a fence and a few loads.
    min_success: AtomicU64,
    min_total: AtomicU64,
    len: AtomicUsize,
    /// Non-zero while a thread drains this queue. Others add one and leave; the drainer goes
    /// around again until it can reset the value it last saw, so no change is missed.
    requests: AtomicUsize,
    /// Set while this queue sits on some thread's `LATER` list.
    later: AtomicBool,
}

impl Default for TriggerQueue {
    fn default() -> Self {
        TriggerQueue {
            heaps: Mutex::default(),
            min_success: AtomicU64::new(u64::MAX),
            min_total: AtomicU64::new(u64::MAX),
            len: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            later: AtomicBool::new(false),
        }
    }
}

/// A counter dropped (its last handle gone, not closed) with operations still waiting on it:
/// they can never start, so they are released as canceled rather than silently lost.
impl Drop for TriggerQueue {
    fn drop(&mut self) {
        for job in self.remove(|_| true, false) {
            job.cancel();
        }
    }
}

/// A queue to drain later, and the counter it waits on.
type Later = (Arc<TriggerQueue>, Arc<dyn CntrPort>);

thread_local! {
    /// Whether this thread is inside `kick` already.
    static DRAINING: Cell<bool> = const { Cell::new(false) };
    /// Queues this thread was told about while draining, drained when the current one is done.
    static LATER: RefCell<Vec<Later>> = const { RefCell::new(Vec::new()) };
}

/// Clears `DRAINING` when the outermost `kick` returns (or unwinds).
struct DrainScope;

impl Drop for DrainScope {
    fn drop(&mut self) {
        DRAINING.with(|d| d.set(false));
        if std::thread::panicking() {
            // Each queue left here had its `later` flag set, which would turn every later
            // kick of it from a drain into a no-op: cleared with the list.
            for (q, _) in LATER.with(|l| std::mem::take(&mut *l.borrow_mut())) {
                q.later.store(false, Ordering::Release);
            }
        }
    }
}

/// Resets the drain requests if a started operation panics, so the queue keeps working.
struct RequestScope<'a>(&'a AtomicUsize);

impl Drop for RequestScope<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(0, Ordering::SeqCst);
        }
    }
}

impl TriggerQueue {
    fn lock(&self) -> MutexGuard<'_, Heaps> {
        self.heaps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Operations waiting.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn publish(&self, h: &Heaps) {
        let min = |b: &MinHeap| b.peek().map_or(u64::MAX, |e| e.threshold);
        // Plain release stores: `kick`'s fence orders them against counter updates.
        self.min_success.store(min(&h.success), Ordering::Release);
        self.min_total.store(min(&h.total), Ordering::Release);
        self.len
            .store(h.success.v.len() + h.total.v.len(), Ordering::Release);
    }

    /// Queues `job` until the counter's `watch` value reaches `threshold`. The caller then
    /// calls `kick`, which starts it at once if the threshold is already met.
    pub(crate) fn push(&self, watch: Watch, threshold: u64, job: Job) {
        let mut h = self.lock();
        let seq = h.seq;
        h.seq += 1;
        let s = Slot {
            threshold,
            seq,
            job: h.slab.put(job),
        };
        match watch {
            Watch::Success => h.success.push(s),
            Watch::Total => h.total.push(s),
        }
        self.publish(&h);
    }

    fn ready(&self, cntr: &impl CntrPort) -> bool {
        let v = cntr.value();
        self.min_success.load(Ordering::Acquire) <= v
            || self.min_total.load(Ordering::Acquire) <= v.saturating_add(cntr.err_value())
    }

    /// `cntr`, the counter this queue waits on, changed (or an operation was queued):
    /// starts every operation whose threshold is now met, in order.
    pub(crate) fn kick<C: CntrPort>(q: &Arc<Self>, cntr: &Arc<C>) {
        // Pairs with the fence a poster passes between queueing and reading the counter (and
        // the counter's own update before this call): one side always sees the other.
        fence(Ordering::SeqCst);
        if q.requests.load(Ordering::Acquire) == 0 && !q.ready(&**cntr) {
            return;
        }
        if DRAINING.with(Cell::get) {
            if !q.later.swap(true, Ordering::AcqRel) {
                let cntr: Arc<dyn CntrPort> = cntr.clone();
                LATER.with(|l| l.borrow_mut().push((q.clone(), cntr)));
            }
            return;
        }
        DRAINING.with(|d| d.set(true));
        let _scope = DrainScope;
        q.drain(&**cntr);
        while let Some((q, c)) = LATER.with(|l| l.borrow_mut().pop()) {
            // A swap, not a store: reading the flag another thread set (when it left this queue
            // to us) orders its counter update before the drain below.
            q.later.swap(false, Ordering::AcqRel);
            q.drain(&*c);
        }
    }

    fn drain(&self, cntr: &dyn CntrPort) {
        if self.requests.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let _scope = RequestScope(&self.requests);
        loop {
            let seen = self.requests.load(Ordering::Acquire);
            loop {
                let (job, more) = self.pop_ready(cntr);
                match job {
                    Some(j) => j.fire(),
                    None => break,
                }
                if !more {
                    break;
                }
            }
            // A change since `seen` (another thread's update or post) means another round.
            if self
                .requests
                .compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
        }
    }

    /// Which heap holds the next operation to start at success value `v` and total `total`
    /// (`true`: the success heap), if any is due.
    fn next_due(h: &Heaps, v: u64, total: u64) -> Option<bool> {
        let s = h.success.peek().filter(|e| e.threshold <= v).map(Slot::key);
        let t = h
            .total
            .peek()
            .filter(|e| e.threshold <= total)
            .map(Slot::key);
        match (s, t) {
            (None, None) => None,
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (Some(a), Some(b)) => Some(a <= b),
        }
    }

    /// Takes the operation due first (smallest (threshold, sequence) across both heaps), and
    /// says whether another one is due too, so that the last one costs no second look.
    fn pop_ready(&self, cntr: &dyn CntrPort) -> (Option<Job>, bool) {
        let v = cntr.value();
        let total = v.saturating_add(cntr.err_value());
        let mut h = self.lock();
        let Some(from_success) = Self::next_due(&h, v, total) else {
            return (None, false);
        };
        let e = if from_success {
            h.success.pop()
        } else {
            h.total.pop()
        };
        let job = e.map(|e| h.slab.take(e.job));
        let more = Self::next_due(&h, v, total).is_some();
        self.publish(&h);
        (job, more)
    }

    /// Takes the waiting operations `pred` selects (only the first one found with
    /// `first_only`), in the order they would have started. O(n): cancellation, not the
    /// common path.
    pub(crate) fn remove(&self, mut pred: impl FnMut(&Job) -> bool, first_only: bool) -> Vec<Job> {
        let mut h = self.lock();
        let h = &mut *h;
        let mut out: Vec<Slot> = Vec::new();
        for heap in [&mut h.success, &mut h.total] {
            let before = out.len();
            heap.v.retain(|s| {
                let hit = (!first_only || out.is_empty()) && pred(h.slab.get(s.job));
                if hit {
                    out.push(*s);
                }
                !hit
            });
            if out.len() != before {
                heap.rebuild();
            }
        }
        out.sort_by_key(Slot::key);
        let jobs = out.iter().map(|s| h.slab.take(s.job)).collect();
        self.publish(h);
        jobs
    }
}
