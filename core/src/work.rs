//! The deferred work queue of a domain (`struct fi_deferred_work`, `fi_control` with
//! `FI_QUEUE_WORK`, `FI_CANCEL_WORK` and `FI_FLUSH_WORK`).
//!
//! A request waits until its triggering counter's success plus error value reaches the
//! threshold. A transfer then starts on its endpoint; when it completes, its completion counter
//! gains one (its error value, if it failed), and the endpoint's CQ and counters hear of it only
//! if it carries `FI_COMPLETION`. A counter operation sets or adds to its own counter and to
//! nothing else. Requests are checked when queued, exactly as the transfer's own call checks
//! them; nothing they point at is read before they start.
//!
//! This is the domain's half: the request types and `Domain::queue_work`, `cancel_work` and
//! `flush_work`, above both the endpoint (whose calls check a transfer) and the trigger
//! machinery (where a request waits, `trigger::DomainWork`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cntr::Counter;
use crate::consts::*;
use crate::ep::atomic::MsgAtomic;
use crate::ep::rma::MsgRma;
use crate::ep::{Endpoint, Msg};
use crate::error::{Error, Result};
use crate::object::Domain;
use crate::rxq::RawIov;
use crate::trigger::{Action, CntrPort, EpLink, Job, Owner, TriggerQueue, Watch, WorkId, WorkTag};

/// `struct fi_deferred_work`.
pub struct DeferredWork<'a> {
    /// The triggering counter's success plus error value it waits for.
    pub threshold: u64,
    /// The counter it watches.
    pub triggering_cntr: &'a Counter,
    /// Gains one when a transfer completes; must be `None` for counter operations.
    pub completion_cntr: Option<&'a Counter>,
    /// What it does.
    pub op: WorkOp<'a>,
}

/// The `op_type` and `op` union of `struct fi_deferred_work`.
pub enum WorkOp<'a> {
    /// `FI_OP_RECV` (`struct fi_op_msg`).
    Recv(OpMsg<'a>),
    /// `FI_OP_SEND` (`struct fi_op_msg`).
    Send(OpMsg<'a>),
    /// `FI_OP_TRECV` (`struct fi_op_tagged`: the message's tag and ignore are used).
    TRecv(OpMsg<'a>),
    /// `FI_OP_TSEND` (`struct fi_op_tagged`).
    TSend(OpMsg<'a>),
    /// `FI_OP_READ` (`struct fi_op_rma`).
    Read(OpRma<'a>),
    /// `FI_OP_WRITE` (`struct fi_op_rma`).
    Write(OpRma<'a>),
    /// `FI_OP_ATOMIC` (`struct fi_op_atomic`).
    Atomic(OpAtomic<'a>),
    /// `FI_OP_FETCH_ATOMIC` (`struct fi_op_fetch_atomic`).
    FetchAtomic(OpFetchAtomic<'a>),
    /// `FI_OP_COMPARE_ATOMIC` (`struct fi_op_compare_atomic`).
    CompareAtomic(OpCompareAtomic<'a>),
    /// `FI_OP_CNTR_SET` (`struct fi_op_cntr`).
    CntrSet(OpCntr<'a>),
    /// `FI_OP_CNTR_ADD` (`struct fi_op_cntr`).
    CntrAdd(OpCntr<'a>),
}

impl WorkOp<'_> {
    /// The C `op_type`.
    pub fn op_type(&self) -> WorkOpType {
        match self {
            WorkOp::Recv(_) => WorkOpType::Recv,
            WorkOp::Send(_) => WorkOpType::Send,
            WorkOp::TRecv(_) => WorkOpType::TRecv,
            WorkOp::TSend(_) => WorkOpType::TSend,
            WorkOp::Read(_) => WorkOpType::Read,
            WorkOp::Write(_) => WorkOpType::Write,
            WorkOp::Atomic(_) => WorkOpType::Atomic,
            WorkOp::FetchAtomic(_) => WorkOpType::FetchAtomic,
            WorkOp::CompareAtomic(_) => WorkOpType::CompareAtomic,
            WorkOp::CntrSet(_) => WorkOpType::CntrSet,
            WorkOp::CntrAdd(_) => WorkOpType::CntrAdd,
        }
    }
}

/// `struct fi_op_msg` / `struct fi_op_tagged`.
#[derive(Clone, Copy)]
pub struct OpMsg<'a> {
    /// The endpoint (of this domain, opened with `FI_TRIGGER`).
    pub ep: &'a Endpoint,
    /// The message, as `sendmsg` / `recvmsg` / `tsendmsg` / `trecvmsg` take it.
    pub msg: Msg<'a>,
    /// Operation flags, as those calls take them (`FI_COMPLETION` asks for endpoint
    /// completions).
    pub flags: u64,
}

/// `struct fi_op_rma`.
#[derive(Clone, Copy)]
pub struct OpRma<'a> {
    /// The endpoint.
    pub ep: &'a Endpoint,
    /// The transfer, as `readmsg` / `writemsg` take it.
    pub msg: MsgRma<'a>,
    /// Operation flags.
    pub flags: u64,
}

/// `struct fi_op_atomic`.
#[derive(Clone, Copy)]
pub struct OpAtomic<'a> {
    /// The endpoint.
    pub ep: &'a Endpoint,
    /// Target and operation.
    pub msg: MsgAtomic,
    /// `count` operand elements.
    pub operand: RawIov,
    /// Elements.
    pub count: usize,
    /// Operation flags.
    pub flags: u64,
}

/// `struct fi_op_fetch_atomic`.
#[derive(Clone, Copy)]
pub struct OpFetchAtomic<'a> {
    /// The endpoint.
    pub ep: &'a Endpoint,
    /// Target and operation.
    pub msg: MsgAtomic,
    /// `count` operand elements (unused by `FI_ATOMIC_READ`).
    pub operand: RawIov,
    /// Where the original target values land (`struct fi_msg_fetch`).
    pub result: RawIov,
    /// Elements.
    pub count: usize,
    /// Operation flags.
    pub flags: u64,
}

/// `struct fi_op_compare_atomic`.
#[derive(Clone, Copy)]
pub struct OpCompareAtomic<'a> {
    /// The endpoint.
    pub ep: &'a Endpoint,
    /// Target and operation.
    pub msg: MsgAtomic,
    /// `count` operand elements.
    pub operand: RawIov,
    /// `count` compare elements (`struct fi_msg_compare`).
    pub compare: RawIov,
    /// Where the original target values land.
    pub result: RawIov,
    /// Elements.
    pub count: usize,
    /// Operation flags.
    pub flags: u64,
}

/// `struct fi_op_cntr`.
#[derive(Clone, Copy)]
pub struct OpCntr<'a> {
    /// The counter to set or add to.
    pub cntr: &'a Counter,
    /// The value.
    pub value: u64,
}

/// Flags a deferred transfer cannot carry: it reads its data when it starts, completes once,
/// and is not itself triggered again.
const NOT_DEFERRABLE: u64 =
    FI_INJECT | FI_MULTI_RECV | FI_PEEK | FI_CLAIM | FI_DISCARD | FI_TRIGGER;

impl Domain {
    /// The endpoint of a deferred transfer, checked: of this domain, trigger-able, and with
    /// flags a deferred transfer can carry.
    fn work_ep(&self, what: &'static str, ep: &Endpoint, flags: u64) -> Result<Arc<EpLink>> {
        if !Arc::ptr_eq(&ep.core().mr, self.mr_map()) {
            return Err(Error::Inval(format!(
                "queue_work {what}: the endpoint belongs to another domain"
            )));
        }
        let link = ep.link().ok_or_else(|| {
            Error::OpNotSupp(format!(
                "queue_work {what}: endpoint was opened without FI_TRIGGER"
            ))
        })?;
        if flags & NOT_DEFERRABLE != 0 {
            return Err(Error::NoSys(format!(
                "queue_work {what}: {} not supported for deferred work",
                caps_str(flags & NOT_DEFERRABLE)
            )));
        }
        Ok(link.clone())
    }

    /// What a request does, checked as its own call would check it.
    fn work_action(&self, op: &WorkOp<'_>) -> Result<(Action, Option<Arc<EpLink>>)> {
        Ok(match op {
            WorkOp::CntrSet(c) => (Action::CntrSet(c.cntr.inner().clone(), c.value), None),
            WorkOp::CntrAdd(c) => (Action::CntrAdd(c.cntr.inner().clone(), c.value), None),
            WorkOp::Send(o) | WorkOp::TSend(o) => {
                let (what, kind) = match op {
                    WorkOp::Send(_) => ("send", FI_MSG),
                    _ => ("tsend", FI_TAGGED),
                };
                let link = self.work_ep(what, o.ep, o.flags)?;
                let t = o.ep.msg_tx(what, &o.msg, o.flags, kind)?;
                o.ep.check_tx(what, &t)?;
                (Action::Send(t), Some(link))
            }
            WorkOp::Recv(o) => {
                let link = self.work_ep("recv", o.ep, o.flags)?;
                let r = o.ep.msg_rx(&o.msg, o.flags)?;
                o.ep.check_rx("recv", &r)?;
                (Action::Recv(r), Some(link))
            }
            WorkOp::TRecv(o) => {
                let link = self.work_ep("trecv", o.ep, o.flags)?;
                let r = o.ep.msg_trx(&o.msg, o.flags)?;
                o.ep.check_rx("trecv", &r)?;
                (Action::Recv(r), Some(link))
            }
            WorkOp::Read(o) | WorkOp::Write(o) => {
                let (what, dir) = match op {
                    WorkOp::Read(_) => ("read", FI_READ),
                    _ => ("write", FI_WRITE),
                };
                let link = self.work_ep(what, o.ep, o.flags)?;
                let r = o.ep.msg_rma(what, &o.msg, o.flags, dir)?;
                o.ep.check_rma(what, &r)?;
                (Action::Rma(Box::new(r)), Some(link))
            }
            WorkOp::Atomic(o) => {
                let link = self.work_ep("atomic", o.ep, o.flags)?;
                let r =
                    o.ep.atomic_req("atomic", &o.msg, o.operand, o.count, o.flags)?;
                o.ep.check_atomic("atomic", &r)?;
                (Action::Atomic(Box::new(r)), Some(link))
            }
            WorkOp::FetchAtomic(o) => {
                let what = "fetch_atomic";
                let link = self.work_ep(what, o.ep, o.flags)?;
                let r =
                    o.ep.fetch_req(what, &o.msg, o.operand, o.result, o.count, o.flags)?;
                o.ep.check_atomic(what, &r)?;
                (Action::Atomic(Box::new(r)), Some(link))
            }
            WorkOp::CompareAtomic(o) => {
                let what = "compare_atomic";
                let link = self.work_ep(what, o.ep, o.flags)?;
                let (m, c) = (&o.msg, o.count);
                let r =
                    o.ep.compare_req(what, m, o.operand, o.compare, o.result, c, o.flags)?;
                o.ep.check_atomic(what, &r)?;
                (Action::Atomic(Box::new(r)), Some(link))
            }
        })
    }

    /// `fi_control(FI_QUEUE_WORK)`: queues `work`; it starts at once if its threshold is
    /// already met. Errors say what is wrong with the request: `Inval` (an endpoint of
    /// another domain, a completion counter given with a counter operation, bad sizes),
    /// `NoSys` (flags a deferred transfer cannot carry), and whatever the transfer's own call
    /// would return.
    ///
    /// # Safety
    /// Every buffer the transfer names must stay valid (readable for what it sends, writable
    /// and otherwise untouched for what it receives) until it completes or is canceled. They
    /// are not accessed before the trigger.
    pub unsafe fn queue_work(&self, work: &DeferredWork<'_>) -> Result<WorkId> {
        let counter_op = matches!(work.op, WorkOp::CntrSet(_) | WorkOp::CntrAdd(_));
        if counter_op && work.completion_cntr.is_some() {
            return Err(Error::Inval(format!(
                "queue_work: {} updates only its own counter; completion_cntr must be None",
                work.op.op_type().c_name()
            )));
        }
        let dom = self.id();
        let counters = [
            Some(("triggering counter", work.triggering_cntr)),
            work.completion_cntr.map(|c| ("completion counter", c)),
            match &work.op {
                WorkOp::CntrSet(c) | WorkOp::CntrAdd(c) => Some(("counter it updates", c.cntr)),
                _ => None,
            },
        ];
        for (kind, c) in counters.into_iter().flatten() {
            c.inner().domain.check("queue_work", kind, dom)?;
        }
        let (action, link) = self.work_action(&work.op)?;
        let dw = self.work();
        let id = dw.next.fetch_add(1, Ordering::Relaxed);
        let completion = work
            .completion_cntr
            .map(|c| c.inner().clone() as Arc<dyn CntrPort>);
        let alive = Arc::new(());
        let job = Job {
            action,
            ep: link.clone().map(|l| l as Arc<dyn Owner>),
            work: Some(Box::new(WorkTag {
                domain: dw.id,
                id,
                completion,
                alive: alive.clone(),
            })),
        };
        let cntr = work.triggering_cntr.inner();
        let q = cntr.trigger_queue();
        dw.note(q);
        let wid = WorkId {
            queue: Arc::downgrade(q),
            id,
            alive: Arc::downgrade(&alive),
        };
        match link {
            Some(l) => {
                if let Some(c) = work.completion_cntr {
                    l.drive_with(c.inner());
                }
                l.arm(q, cntr, Watch::Total, work.threshold, job)
            }
            None => {
                q.push(Watch::Total, work.threshold, job);
                TriggerQueue::kick(q, cntr);
            }
        }
        Ok(wid)
    }

    /// `fi_control(FI_CANCEL_WORK)`: releases a request that has not started; a transfer
    /// that asked for endpoint completions (`FI_COMPLETION`) reports `FI_ECANCELED`.
    /// `NoEntry` if it has started (or was canceled) already.
    pub fn cancel_work(&self, id: &WorkId) -> Result<()> {
        let dw = self.work();
        let job = id.queue.upgrade().and_then(|q| {
            q.remove(
                |j| {
                    j.work
                        .as_ref()
                        .is_some_and(|w| w.domain == dw.id && w.id == id.id)
                },
                true,
            )
            .pop()
        });
        match job {
            Some(j) => {
                j.cancel();
                Ok(())
            }
            None => Err(Error::NoEntry(
                "cancel_work: the request has started or was canceled already".into(),
            )),
        }
    }

    /// `fi_control(FI_FLUSH_WORK)`: cancels every request of this domain that has not
    /// started (only those waiting on `triggering_cntr` if given), as `cancel_work` does.
    /// Returns how many were released.
    pub fn flush_work(&self, triggering_cntr: Option<&Counter>) -> Result<usize> {
        let dw = self.work();
        Ok(match triggering_cntr {
            Some(c) => match c.inner().existing_trigger_queue() {
                Some(q) => dw.flush(Some(q)),
                None => 0,
            },
            None => dw.flush(None),
        })
    }
}
