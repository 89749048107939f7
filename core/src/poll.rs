//! Poll sets: fi_poll(3). Completion queues and counters gathered so that one call drives
//! their progress and says which of them have something: a queue with entries or errors to
//! read (level: it says so until they are read), a counter whose value or error count changed
//! since the set last said so (an edge, as for a wait set). Each member comes back as the
//! context it was added with.
//!
//! A member is held weakly: closing a queue or counter that is still in a set is allowed, and
//! the set forgets it.

use std::sync::{Arc, Mutex, Weak};

use crate::cntr::Counter;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::wait::Waitable;

/// `struct fi_poll_attr`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PollAttr {
    /// Reserved; must be 0.
    pub flags: u64,
}

struct Member {
    object: Weak<dyn Waitable>,
    context: usize,
}

/// `fid_poll`.
#[derive(Clone)]
pub struct PollSet {
    members: Arc<Mutex<Vec<Member>>>,
}

impl PollSet {
    /// `fi_poll_open` (`Domain::poll_open` calls this).
    pub fn open(attr: &PollAttr) -> Result<PollSet> {
        if attr.flags != 0 {
            return Err(Error::Inval(format!(
                "poll set flags must be 0, got {:#x}",
                attr.flags
            )));
        }
        Ok(PollSet {
            members: Arc::default(),
        })
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `fi_poll_add` of a completion queue or counter, reported as `context`.
    pub fn add(&self, member: &dyn Pollable, context: usize) -> Result<()> {
        let object = member.waitable();
        let mut m = self.members();
        m.retain(|x| x.object.strong_count() > 0);
        if m.iter().any(|x| Weak::ptr_eq(&x.object, &object)) {
            return Err(Error::Inval("fi_poll_add: already in the set".into()));
        }
        m.push(Member { object, context });
        Ok(())
    }

    /// `fi_poll_del` of a completion queue or counter; `NoEntry` if it is not in the set.
    pub fn del(&self, member: &dyn Pollable) -> Result<()> {
        let object = member.waitable();
        let mut m = self.members();
        let before = m.len();
        m.retain(|x| !Weak::ptr_eq(&x.object, &object));
        if m.len() == before {
            return Err(Error::NoEntry("fi_poll_del: not in the set".into()));
        }
        Ok(())
    }

    /// `fi_poll`: drives every member's progress, then writes the contexts of those with
    /// something into `out`, in the order they were added, at most `out.len()` of them (a
    /// counter's change not written stays to report); how many.
    pub fn poll(&self, out: &mut [usize]) -> usize {
        // Looked at outside the lock: a member's progress may complete work that reaches
        // another member.
        let live: Vec<(Arc<dyn Waitable>, usize)> = {
            let mut m = self.members();
            m.retain(|x| x.object.strong_count() > 0);
            m.iter()
                .filter_map(|x| Some((x.object.upgrade()?, x.context)))
                .collect()
        };
        for (w, _) in &live {
            w.drive();
        }
        let mut n = 0;
        for (w, context) in &live {
            if n == out.len() {
                break;
            }
            if w.ready() {
                w.consume();
                out[n] = *context;
                n += 1;
            }
        }
        n
    }

    /// Members alive.
    pub fn len(&self) -> usize {
        self.members()
            .iter()
            .filter(|x| x.object.strong_count() > 0)
            .count()
    }

    /// Whether no member is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a poll set takes: a completion queue or a counter.
pub trait Pollable {
    /// The object a set holds weakly.
    fn waitable(&self) -> Weak<dyn Waitable>;
}

impl Pollable for CompletionQueue {
    fn waitable(&self) -> Weak<dyn Waitable> {
        let a: Arc<dyn Waitable> = self.inner().clone();
        Arc::downgrade(&a)
    }
}

impl Pollable for Counter {
    fn waitable(&self) -> Weak<dyn Waitable> {
        let a: Arc<dyn Waitable> = self.inner().clone();
        Arc::downgrade(&a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cntr::CntrAttr;
    use crate::cq::CqAttr;
    use crate::entry::CqTaggedEntry;

    #[test]
    fn a_poll_set_reports_queues_with_entries_and_counters_that_changed() {
        let ps = PollSet::open(&PollAttr::default()).unwrap();
        let cq = CompletionQueue::open(&CqAttr::default()).unwrap();
        let c = Counter::open(&CntrAttr::default()).unwrap();
        ps.add(&cq, 11).unwrap();
        ps.add(&c, 22).unwrap();
        assert!(matches!(ps.add(&cq, 11), Err(Error::Inval(_))));
        let mut out = [0usize; 4];
        assert_eq!(ps.poll(&mut out), 0);
        cq.inner().push(CqTaggedEntry::default(), 0);
        c.add(1).unwrap();
        assert_eq!(ps.poll(&mut out), 2);
        assert_eq!(out[..2], [11, 22]);
        // The queue's entry is still there; the counter's change was said.
        assert_eq!(ps.poll(&mut out), 1);
        assert_eq!(out[0], 11);
        // Room for one: the counter's next change waits for the next poll.
        c.add(1).unwrap();
        assert_eq!(ps.poll(&mut out[..1]), 1);
        assert_eq!(out[0], 11);
        ps.del(&cq).unwrap();
        assert!(matches!(ps.del(&cq), Err(Error::NoEntry(_))));
        assert_eq!(ps.poll(&mut out), 1);
        assert_eq!(out[0], 22);
        // A member closed while in the set is forgotten.
        drop(c);
        assert_eq!(ps.len(), 0);
        assert_eq!(ps.poll(&mut out), 0);
        assert!(PollSet::open(&PollAttr { flags: 1 }).is_err());
    }
}
