//! A waiting operation (`Job`): what it does when it starts, the endpoint it starts on, and
//! for deferred work, the request it was queued as. The threshold queues and the XPU
//! watchers hold jobs and start them; the endpoint they start on is reached through `Owner`.

use std::sync::Arc;

use super::cntr_port::CntrPort;
use super::port::{Action, Port};
use crate::consts::errno::FI_ECANCELED;
use crate::consts::*;
use crate::entry::Context;

/// The endpoint's link as its jobs and its XPU watcher see it (`EpLink`): whether it closed,
/// where a job whose condition was met starts, and whom failures and misuse are reported to.
pub(crate) trait Owner: Send + Sync {
    /// The endpoint is closing: nothing may be armed any more.
    fn closed(&self) -> bool;
    /// Starts an operation (behind any waiting for room).
    fn submit(&self, job: Job);
    /// The endpoint.
    fn port(&self) -> &dyn Port;
    /// Operations wait for room at the endpoint: an XPU's ring is not drained meanwhile.
    fn backlog(&self) -> bool;
    /// Starts an operation an XPU's descriptor asked for, as `submit` would start it as a job
    /// on `link` (this owner as an `Arc`); an owner may start it without making the job
    /// unless it has to wait.
    /// `desc` is the descriptor it came from, already checked into `action`.
    fn submit_action(&self, action: Action, desc: &crate::xpu::XpuDesc, link: &Arc<dyn Owner>) {
        let _ = desc;
        self.submit(Job {
            action,
            ep: Some(link.clone()),
            work: None,
        });
    }
}

/// Deferred-work bookkeeping of a waiting operation.
pub(crate) struct WorkTag {
    /// `DomainWork::id` of the domain it was queued on.
    pub(crate) domain: u64,
    /// Its number within that domain (`WorkId`).
    pub(crate) id: u64,
    /// Incremented by one when the transfer completes (its error value if it fails).
    pub(crate) completion: Option<Arc<dyn CntrPort>>,
    /// Held while the request waits: its `WorkId`s see it gone once the request started
    /// or ended otherwise (`WorkId::ended`). Never read: its drop is the signal.
    #[allow(dead_code)]
    pub(crate) alive: Arc<()>,
}

/// A waiting operation.
pub(crate) struct Job {
    pub(crate) action: Action,
    /// The endpoint a data transfer starts on; `None` for counter operations.
    pub(crate) ep: Option<Arc<dyn Owner>>,
    /// Set for deferred work.
    pub(crate) work: Option<Box<WorkTag>>,
}

impl Job {
    /// Starts the operation: a counter update at once, a transfer through its endpoint.
    pub(super) fn fire(self) {
        if let Some(l) = self.ep.clone() {
            // Taken out of its queue outside the queue's lock, so a close can miss it: what
            // it reports (its start's failure, or its cancel when it finds the endpoint
            // closed) is counted before `closed` is read, and the close waits it out.
            let _r = l.port().reporting();
            l.submit(self);
            return;
        }
        match self.action {
            Action::CntrSet(c, v) => c.set(v),
            Action::CntrAdd(c, v) => c.add(v),
            // Validation gives every transfer an endpoint.
            _ => {}
        }
    }

    /// Whether it starts on the endpoint whose link is `owner`.
    pub(super) fn starts_on(&self, owner: &dyn Owner) -> bool {
        self.ep
            .as_ref()
            .is_some_and(|l| std::ptr::addr_eq(Arc::as_ptr(l), owner))
    }

    /// The transfer's completion context (0 for counter operations).
    pub(crate) fn ctx(&self) -> Context {
        match &self.action {
            Action::Send(o) => o.ctx,
            Action::Recv(r) => r.ctx,
            Action::Rma(o) => o.ctx,
            Action::Atomic(a) => a.ctx,
            Action::Armed(a) => a.ctx,
            Action::CntrSet(..) | Action::CntrAdd(..) => 0,
        }
    }

    pub(super) fn set_ctx(&mut self, ctx: Context) {
        match &mut self.action {
            Action::Send(o) => o.ctx = ctx,
            Action::Recv(r) => r.ctx = ctx,
            Action::Rma(o) => o.ctx = ctx,
            Action::Atomic(a) => a.ctx = ctx,
            Action::Armed(a) => a.ctx = ctx,
            Action::CntrSet(..) | Action::CntrAdd(..) => {}
        }
    }

    /// The transfer's operation flags.
    pub(crate) fn flags(&self) -> u64 {
        match &self.action {
            Action::Send(o) => o.flags,
            Action::Recv(r) => r.flags,
            Action::Rma(o) => o.flags,
            Action::Atomic(a) => a.flags,
            Action::Armed(a) => a.flags,
            Action::CntrSet(..) | Action::CntrAdd(..) => 0,
        }
    }

    /// Reports the transfer failed with `err`, under its current context.
    pub(super) fn fail(&self, port: &dyn Port, err: i32) {
        match &self.action {
            Action::Recv(r) => {
                let flags = FI_RECV | (r.flags & (FI_MSG | FI_TAGGED));
                port.fail_rx(r.ctx, flags, r.tag, err);
            }
            Action::CntrSet(..) | Action::CntrAdd(..) => {}
            _ => port.fail_tx(self.ctx(), self.flags(), err),
        }
    }

    /// `cancel` of an operation its endpoint's close ends, which the application did not ask
    /// to cancel: deferred work also counts an error on its completion counter, as a transfer
    /// that failed would, so that a wait on that counter ends instead of waiting forever.
    pub(crate) fn cancel_closed(self) -> bool {
        if let Some(c) = self.work.as_ref().and_then(|w| w.completion.clone()) {
            // Counted once: where the work asked for endpoint completions and its completion
            // counter is the endpoint's own for its class, the cancel's report counts it
            // there (as `Pending::finish` does for one that ran).
            let rx = matches!(self.action, Action::Recv(_));
            let ep_counts = self.flags() & FI_COMPLETION != 0
                && self
                    .ep
                    .as_ref()
                    .is_some_and(|l| l.port().fails_count_on(rx, self.flags(), &c));
            if !ep_counts {
                c.count(false);
            }
        }
        self.cancel()
    }

    /// Releases an operation that never started: a triggered transfer, or deferred work that
    /// asked for endpoint completions (`FI_COMPLETION`), reports `FI_ECANCELED`. False for an
    /// armed send that had ended already (its peer lost): nothing was left to cancel.
    pub(crate) fn cancel(self) -> bool {
        let wants = self.work.is_none() || self.flags() & FI_COMPLETION != 0;
        if let (Some(l), true) = (&self.ep, wants) {
            // An armed send ends in its provider first; one that ended already was
            // reported then.
            if let Action::Armed(a) = &self.action {
                if !l.port().disarm(a) {
                    return false;
                }
            }
            self.fail(l.port(), FI_ECANCELED);
        }
        true
    }
}
