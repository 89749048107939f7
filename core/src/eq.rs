//! Event queues: fi_eq(3). Control-path events (`FI_AV_COMPLETE`, `FI_NOTIFY`, ...) and
//! asynchronous errors, read, peeked, waited on, or written by the application.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::consts::{WaitObj, FI_PEEK};
use crate::entry::Context;
use crate::error::{Error, Result};
use crate::wait::{deadline, remaining, EventFd};

/// `struct fi_eq_attr`.
#[derive(Clone, Debug, Default)]
pub struct EqAttr {
    /// Capacity; 0 picks 256.
    pub size: usize,
    /// Reserved flags (`FI_WRITE` allows `write`; it is accepted either way).
    pub flags: u64,
    /// How `sread` blocks.
    pub wait_obj: WaitObj,
}

/// `struct fi_eq_entry`, with the event code beside it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EqEntry {
    /// The event (`FI_AV_COMPLETE`, `FI_NOTIFY`, ...).
    pub event: u32,
    /// Identifies the object the event is about (0 when none).
    pub fid: usize,
    /// The context given to the call that caused it.
    pub context: Context,
    /// Event data, e.g. the number of addresses inserted.
    pub data: u64,
    /// What the application wrote, byte for byte, where it wrote the event (`fi_eq_write`
    /// takes any event structure of any length, and a read gives it back whole); `None` for
    /// the provider's own events, whose structure is the fields above.
    pub bytes: Option<Arc<[u8]>>,
}

/// `struct fi_eq_err_entry`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EqErrEntry {
    /// The object in error.
    pub fid: usize,
    /// The context of the failed call.
    pub context: Context,
    /// Event data.
    pub data: u64,
    /// Positive libfabric error number.
    pub err: i32,
    /// Provider-specific error number.
    pub prov_errno: i32,
}

/// One queued entry: events and errors in one order, as they were queued (fi_eq(3): a read
/// answers `-FI_EAVAIL` when the entry at the head is an error).
enum Item {
    Event(EqEntry),
    Err(EqErrEntry),
}

struct Q {
    items: VecDeque<Item>,
    /// Of `items`, the events (the queue's size bounds them; errors are never dropped).
    events: usize,
    /// Closed (`EventQueue::close`): a thread still in `sread`, holding the queue through a
    /// handle of its own, returns instead of sleeping on.
    closed: bool,
}

/// Shared state of an event queue.
pub struct EqInner {
    cap: usize,
    wait_obj: WaitObj,
    q: Mutex<Q>,
    cond: Condvar,
    /// `FI_WAIT_FD`: readable after an event or error is queued.
    fd: Option<EventFd>,
    /// Objects bound to it (an AV opened with `FI_EVENT`): it does not close while any is,
    /// as their events would go where nothing reads them.
    bound: std::sync::atomic::AtomicUsize,
}

/// An object's binding to an event queue (`EqInner::bind`): counted until dropped.
pub struct EqBinding(Arc<EqInner>);

impl EqBinding {
    /// The queue.
    pub fn eq(&self) -> &Arc<EqInner> {
        &self.0
    }
}

impl Drop for EqBinding {
    fn drop(&mut self) {
        self.0
            .bound
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// `fid_eq`.
#[derive(Clone)]
pub struct EventQueue {
    inner: Arc<EqInner>,
}

impl EventQueue {
    /// `fi_eq_open`; `Fabric::eq_open` calls this.
    pub fn open(attr: &EqAttr) -> Result<Self> {
        if matches!(attr.wait_obj, WaitObj::Set | WaitObj::PollFd) {
            return Err(Error::OpNotSupp(format!(
                "eq_open: wait object {} is not supported for event queues",
                attr.wait_obj.c_name()
            )));
        }
        let fd = if attr.wait_obj == WaitObj::Fd {
            Some(EventFd::new()?)
        } else {
            None
        };
        Ok(EventQueue {
            inner: Arc::new(EqInner {
                cap: if attr.size == 0 { 256 } else { attr.size },
                wait_obj: attr.wait_obj,
                q: Mutex::new(Q {
                    items: VecDeque::new(),
                    events: 0,
                    closed: false,
                }),
                cond: Condvar::new(),
                fd,
                bound: Default::default(),
            }),
        })
    }

    /// `fi_control(FI_GETWAIT)` for `FI_WAIT_FD`: a descriptor that becomes readable when an
    /// event arrives. Call `trywait` before blocking on it.
    pub fn wait_fd(&self) -> Result<i32> {
        self.inner.fd.as_ref().map(|f| f.raw()).ok_or_else(|| {
            Error::OpBadState("eq wait_fd: queue was not opened with FI_WAIT_FD".into())
        })
    }

    /// `fi_control(FI_GETWAITOBJ)`: the kind of wait object it was opened with.
    pub fn wait_obj(&self) -> WaitObj {
        self.inner.wait_obj
    }

    /// `fi_trywait`: `Ok` when it is safe to block on the wait object (nothing is queued),
    /// `Again` when events are ready to read.
    pub fn trywait(&self) -> Result<()> {
        if let Some(fd) = &self.inner.fd {
            fd.drain();
        }
        let q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.items.is_empty() {
            Ok(())
        } else {
            Err(Error::Again("eq trywait"))
        }
    }

    /// The shared state.
    pub fn inner(&self) -> &Arc<EqInner> {
        &self.inner
    }

    /// `fi_eq_read`: the next event (`FI_PEEK` leaves it queued); `Avail` when the next entry
    /// is an error (events queued before it are read first).
    pub fn read(&self, flags: u64) -> Result<EqEntry> {
        if flags & !FI_PEEK != 0 {
            return Err(Error::BadFlags(format!(
                "eq read: flags {flags:#x}; only FI_PEEK"
            )));
        }
        let mut q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        match q.items.front() {
            None => return Err(Error::Again("eq read")),
            Some(Item::Err(_)) => return Err(Error::Avail),
            Some(Item::Event(e)) if flags & FI_PEEK != 0 => return Ok(e.clone()),
            Some(Item::Event(_)) => {}
        }
        let Some(Item::Event(e)) = q.items.pop_front() else {
            return Err(Error::Again("eq read"));
        };
        q.events -= 1;
        Ok(e)
    }

    /// `fi_eq_readerr`: the error at the head of the queue; `Again` when the head is an event
    /// (or nothing).
    pub fn readerr(&self) -> Result<EqErrEntry> {
        let mut q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        match q.items.front() {
            Some(Item::Err(e)) => {
                let e = *e;
                q.items.pop_front();
                Ok(e)
            }
            _ => Err(Error::Again("eq readerr")),
        }
    }

    /// `fi_eq_sread`: blocks up to `timeout_ms` (-1 forever) for an event. A timeout is `Again`:
    /// fi_eq(3) returns -FI_EAGAIN when "the timeout expires ... and no data is available".
    pub fn sread(&self, flags: u64, timeout_ms: i32) -> Result<EqEntry> {
        if self.inner.wait_obj == WaitObj::None {
            // libfabric: -FI_ENOSYS, "EQ not configured for sread".
            return Err(Error::NoSys(
                "eq sread: queue opened with FI_WAIT_NONE".into(),
            ));
        }
        let dl = deadline(timeout_ms);
        loop {
            match self.read(flags) {
                Err(Error::Again(_)) => {}
                r => return r,
            }
            let Some(left) = remaining(dl, Duration::from_millis(100)) else {
                return Err(Error::Again("eq sread"));
            };
            let q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
            if q.closed {
                return Err(Error::OpBadState(
                    "eq sread: the queue was closed while this thread waited".into(),
                ));
            }
            if q.items.is_empty() {
                let _ = self.inner.cond.wait_timeout(q, left);
            }
        }
    }

    /// `fi_close`: a thread still in `sread` (through a handle of its own) returns rather
    /// than waiting for an event nothing will queue.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        let n = self.inner.bound.load(std::sync::atomic::Ordering::Acquire);
        if n > 0 {
            return Err((
                self,
                Error::Busy(format!("eq close: {n} object(s) bound to it")),
            ));
        }
        let mut q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        q.closed = true;
        self.inner.cond.notify_all();
        Ok(())
    }

    /// `fi_eq_write`: the application inserts an event.
    pub fn write(&self, e: EqEntry) -> Result<()> {
        if self.inner.push(e) {
            Ok(())
        } else {
            Err(Error::Again("eq write: queue full"))
        }
    }
}

impl EqInner {
    /// Binds an object to this queue until the binding drops.
    pub fn bind(self: &Arc<Self>) -> EqBinding {
        self.bound.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        EqBinding(self.clone())
    }

    /// Provider side: queues an event; false when the queue is full.
    pub fn push(&self, e: EqEntry) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.events >= self.cap {
            return false;
        }
        q.events += 1;
        q.items.push_back(Item::Event(e));
        self.cond.notify_all();
        if let Some(fd) = &self.fd {
            fd.signal();
        }
        true
    }

    /// Provider side: queues an event that must not be lost (an AV insert's completion),
    /// past the capacity if the queue is full.
    pub fn push_past_cap(&self, e: EqEntry) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        q.events += 1;
        q.items.push_back(Item::Event(e));
        self.cond.notify_all();
        if let Some(fd) = &self.fd {
            fd.signal();
        }
    }

    /// Provider side: queues an asynchronous error (never dropped).
    pub fn push_err(&self, e: EqErrEntry) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        q.items.push_back(Item::Err(e));
        self.cond.notify_all();
        if let Some(fd) = &self.fd {
            fd.signal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::FI_NOTIFY;

    #[test]
    fn write_peek_read_errors() {
        let eq = EventQueue::open(&EqAttr {
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(eq.read(0), Err(Error::Again("eq read")));
        let e = EqEntry {
            event: FI_NOTIFY,
            context: 9,
            ..Default::default()
        };
        eq.write(e.clone()).unwrap();
        assert_eq!(eq.read(FI_PEEK), Ok(e.clone()));
        assert_eq!(eq.sread(0, 10), Ok(e));
        eq.inner().push_err(EqErrEntry {
            err: 5,
            ..Default::default()
        });
        assert_eq!(eq.read(0), Err(Error::Avail));
        assert_eq!(eq.readerr().unwrap().err, 5);
        assert_eq!(eq.sread(0, 0), Err(Error::Again("eq sread")));
        // Events and errors come out in the order they were queued: an error does not
        // overtake an event queued before it, nor an event one queued before it.
        let ev = |c| EqEntry {
            event: FI_NOTIFY,
            context: c,
            ..Default::default()
        };
        eq.write(ev(10)).unwrap();
        eq.inner().push_err(EqErrEntry {
            context: 20,
            err: 5,
            ..Default::default()
        });
        eq.write(ev(30)).unwrap();
        assert_eq!(eq.readerr(), Err(Error::Again("eq readerr")));
        assert_eq!(eq.read(0).map(|e| e.context), Ok(10));
        assert_eq!(eq.read(FI_PEEK), Err(Error::Avail));
        assert_eq!(eq.read(0), Err(Error::Avail));
        assert_eq!(eq.readerr().map(|e| e.context), Ok(20));
        assert_eq!(eq.read(0).map(|e| e.context), Ok(30));
    }
}
