//! Triggered operations and deferred work: fi_trigger(3), written once for every provider.
//!
//! - `FI_TRIGGER_THRESHOLD`: a data transfer posted with a `TriggerContext` (the
//!   `*_triggered` calls of `Endpoint`, on an endpoint opened with `FI_TRIGGER`) waits until its
//!   counter's success value reaches the threshold, then starts.
//! - The deferred work queue (`Domain::queue_work`, `cancel_work`, `flush_work`): a data
//!   transfer or a counter update that waits until the triggering counter's success plus error
//!   value reaches the threshold; a finished transfer adds one to its completion counter and
//!   writes endpoint completions only if it carries `FI_COMPLETION`.
//!
//! Both wait in the counter's `TriggerQueue` and start from inside the counter's
//! notification (`CntrInner::notify_observers`), which providers call after every completion
//! without holding their locks. An operation the provider cannot take yet (`Again`: a full
//! ring) waits on its endpoint's `EpLink` and is retried, in order, when the endpoint is
//! driven. Nothing a triggered operation names is read or written before it starts; when it
//! starts, it goes through the same path as an immediate post (`EpCore::start_*`), so an
//! `FI_HMEM` endpoint stages its device memory then (a send's data is gathered at the
//! trigger), and a staging copy that fails completes the operation with `FI_EIO`.

mod dwq;
mod link;
mod port;
mod queue;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_dwq;
#[cfg(test)]
mod tests_hmem;
#[cfg(test)]
mod tests_xpu;
mod xpu;
mod xpu_abi;
mod xpu_predict;
mod xpu_wake;

use std::sync::Arc;

use crate::cntr::{CntrInner, Counter};
use crate::consts::errno::FI_ECANCELED;
use crate::consts::*;
use crate::entry::Context;
use crate::op::{AtomicReq, RmaOp, TxOp};
use crate::rxq::PostedRecv;

pub(crate) use dwq::DomainWork;
pub use dwq::WorkId;
pub(crate) use link::{DeferredRegistry, EpLink, Pending};
pub(crate) use port::{Port, StartError};
pub(crate) use queue::TriggerQueue;
pub(crate) use queue::Watch;
pub use xpu::{Doorbell, DoorbellAlloc, XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED};
pub use xpu_abi::{Signal, TriggerValue, TriggerVar, TriggerXpu, Xpu, XpuDevice};
pub use xpu_wake::{notify_xpu_ring, user_monitor_wait};

/// `struct fi_triggered_context`: the condition a triggered operation waits for.
#[derive(Clone)]
#[non_exhaustive]
pub enum TriggerContext {
    /// `FI_TRIGGER_THRESHOLD` (`struct fi_trigger_threshold`): start once `cntr`'s success
    /// value reaches `threshold`. Operations on one counter start in threshold order, equal
    /// thresholds in posting order, even when the counter moves by more than one at a time.
    Threshold {
        /// The counter to watch.
        cntr: Counter,
        /// The value it must reach.
        threshold: u64,
    },
}

impl TriggerContext {
    /// A threshold trigger on `cntr`.
    pub fn threshold(cntr: &Counter, threshold: u64) -> Self {
        TriggerContext::Threshold {
            cntr: cntr.clone(),
            threshold,
        }
    }

    /// `event_type` of the C structure.
    pub fn event_type(&self) -> TriggerEvent {
        match self {
            TriggerContext::Threshold { .. } => TriggerEvent::Threshold,
        }
    }
}

/// What a waiting operation does when it starts.
pub(crate) enum Action {
    Send(TxOp),
    Recv(PostedRecv),
    Rma(Box<RmaOp>),
    Atomic(Box<AtomicReq>),
    CntrSet(Arc<CntrInner>, u64),
    CntrAdd(Arc<CntrInner>, u64),
}

/// Deferred-work bookkeeping of a waiting operation.
pub(crate) struct WorkTag {
    /// `DomainWork::id` of the domain it was queued on.
    pub(crate) domain: u64,
    /// Its number within that domain (`WorkId`).
    pub(crate) id: u64,
    /// Incremented by one when the transfer completes (its error value if it fails).
    pub(crate) completion: Option<Arc<CntrInner>>,
}

/// A waiting operation.
pub(crate) struct Job {
    pub(crate) action: Action,
    /// The endpoint a data transfer starts on; `None` for counter operations.
    pub(crate) ep: Option<Arc<EpLink>>,
    /// Set for deferred work.
    pub(crate) work: Option<Box<WorkTag>>,
}

impl Job {
    /// Starts the operation: a counter update at once, a transfer through its endpoint.
    fn fire(self) {
        if let Some(l) = self.ep.clone() {
            l.submit(self);
            return;
        }
        match self.action {
            Action::CntrSet(c, v) => c.set_value(v),
            Action::CntrAdd(c, v) => c.add_value(v),
            // Validation gives every transfer an endpoint.
            _ => {}
        }
    }

    /// The transfer's completion context (0 for counter operations).
    pub(crate) fn ctx(&self) -> Context {
        match &self.action {
            Action::Send(o) => o.ctx,
            Action::Recv(r) => r.ctx,
            Action::Rma(o) => o.ctx,
            Action::Atomic(a) => a.ctx,
            Action::CntrSet(..) | Action::CntrAdd(..) => 0,
        }
    }

    fn set_ctx(&mut self, ctx: Context) {
        match &mut self.action {
            Action::Send(o) => o.ctx = ctx,
            Action::Recv(r) => r.ctx = ctx,
            Action::Rma(o) => o.ctx = ctx,
            Action::Atomic(a) => a.ctx = ctx,
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
            Action::CntrSet(..) | Action::CntrAdd(..) => 0,
        }
    }

    /// Reports the transfer failed with `err`, under its current context.
    fn fail(&self, port: &dyn Port, err: i32) {
        match &self.action {
            Action::Recv(r) => {
                let flags = FI_RECV | (r.flags & (FI_MSG | FI_TAGGED));
                port.fail_rx(r.ctx, flags, r.tag, err);
            }
            Action::CntrSet(..) | Action::CntrAdd(..) => {}
            _ => port.fail_tx(self.ctx(), self.flags(), err),
        }
    }

    /// Releases an operation that never started: a triggered transfer, or deferred work that
    /// asked for endpoint completions (`FI_COMPLETION`), reports `FI_ECANCELED`.
    pub(crate) fn cancel(self) {
        let wants = self.work.is_none() || self.flags() & FI_COMPLETION != 0;
        if let (Some(l), true) = (&self.ep, wants) {
            self.fail(&*l.port, FI_ECANCELED);
        }
    }
}
