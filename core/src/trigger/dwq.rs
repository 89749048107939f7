//! A domain's deferred work as the trigger machinery keeps it: which counter queues hold the
//! domain's requests, and how one is found again (`WorkId`). Queueing, checking and the
//! request types are the domain's (`crate::work`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::job::Job;
use super::queue::TriggerQueue;

/// A queued request, for `Domain::cancel_work` (C identifies it by its structure's address).
#[derive(Clone, Debug)]
pub struct WorkId {
    pub(crate) queue: Weak<TriggerQueue>,
    pub(crate) id: u64,
    /// The request's `WorkTag::alive`.
    pub(crate) alive: Weak<()>,
}

impl WorkId {
    /// Whether the request no longer waits: started (handed to its endpoint or applied to
    /// its counter), canceled, flushed, or gone with its domain. `cancel_work` then answers
    /// `NoEntry`, so a handle kept for it can be forgotten.
    pub fn ended(&self) -> bool {
        self.alive.strong_count() == 0
    }
}

static DOMAIN_IDS: AtomicU64 = AtomicU64::new(1);

/// A domain's deferred work: which counter queues hold some of it. Dropping it (closing the
/// domain) releases all of it.
pub(crate) struct DomainWork {
    pub(crate) id: u64,
    pub(crate) next: AtomicU64,
    queues: Mutex<Vec<Weak<TriggerQueue>>>,
}

impl Default for DomainWork {
    fn default() -> Self {
        DomainWork {
            id: DOMAIN_IDS.fetch_add(1, Ordering::Relaxed),
            next: AtomicU64::new(1),
            queues: Mutex::default(),
        }
    }
}

impl DomainWork {
    /// The domain's number, unique in the process.
    pub(crate) fn domain_id(&self) -> u64 {
        self.id
    }

    pub(crate) fn note(&self, q: &Arc<TriggerQueue>) {
        let mut qs = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if !qs.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(q))) {
            qs.retain(|w| w.strong_count() > 0);
            qs.push(Arc::downgrade(q));
        }
    }

    pub(crate) fn mine(&self, j: &Job) -> bool {
        j.work.as_ref().is_some_and(|w| w.domain == self.id)
    }

    /// Cancels this domain's work in `only`, or in every queue.
    pub(crate) fn flush(&self, only: Option<&Arc<TriggerQueue>>) -> usize {
        self.flush_as(only, false)
    }

    /// `flush`; `closing`: the domain closes, which the application did not ask to cancel
    /// its work by, so each item's completion counter also counts an error (`cancel_closed`):
    /// a wait on it ends instead of lasting forever.
    fn flush_as(&self, only: Option<&Arc<TriggerQueue>>, closing: bool) -> usize {
        let queues: Vec<Arc<TriggerQueue>> = match only {
            Some(q) => vec![q.clone()],
            None => {
                let qs = self.queues.lock().unwrap_or_else(|e| e.into_inner());
                qs.iter().filter_map(Weak::upgrade).collect()
            }
        };
        // Every queue's first, then canceled: a cancel counts an error on a counter (the
        // endpoint's), whose queue would start the work waiting there were it still queued.
        let jobs: Vec<Job> = queues
            .iter()
            .flat_map(|q| q.remove(|j| self.mine(j), false))
            .collect();
        let n = jobs.len();
        for j in jobs {
            if closing {
                j.cancel_closed();
            } else {
                j.cancel();
            }
        }
        n
    }
}

impl Drop for DomainWork {
    fn drop(&mut self) {
        self.flush_as(None, true);
    }
}
