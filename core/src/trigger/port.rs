//! The endpoint as the trigger machinery sees it. A waiting operation starts, fails and is
//! counted through this trait, which the endpoint implements (`ep::trigger`), so that the
//! machinery sits below the endpoint instead of importing it back; what it starts is an
//! `Action`.

use std::sync::Arc;

use super::cntr_port::CntrPort;
use super::deferred::DeferredRegistry;
use crate::entry::Context;
use crate::error::Error;
use crate::op::{AtomicReq, RmaOp, TxOp};
use crate::rxq::PostedRecv;
use crate::wait::ProgressSource;

/// What a waiting operation does when it starts.
pub(crate) enum Action {
    Send(TxOp),
    Recv(PostedRecv),
    Rma(Box<RmaOp>),
    Atomic(Box<AtomicReq>),
    CntrSet(Arc<dyn CntrPort>, u64),
    CntrAdd(Arc<dyn CntrPort>, u64),
    /// A send the endpoint armed in advance (`Port::prearm`): starting it fires it.
    Armed(Armed),
}

/// A send armed in the endpoint's provider (`Port::prearm`), as its trigger holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Armed {
    /// The provider's name for it.
    pub(crate) token: u64,
    pub(crate) ctx: Context,
    pub(crate) flags: u64,
}

/// Why an operation did not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Staging its device memory failed (an owner lookup or the copy out of the device);
    /// the provider never saw the operation. A fired operation reports it as `FI_EIO`.
    Stage(Error),
    /// The provider refused it (`Again`: no room now), or it cannot be staged as asked.
    Refused(Error),
}

impl From<StartError> for Error {
    #[inline]
    fn from(e: StartError) -> Error {
        match e {
            StartError::Stage(e) | StartError::Refused(e) => e,
        }
    }
}

/// A trigger-able endpoint: its core and its provider. As a `ProgressSource` it is the
/// provider's (`progress`, `idle_wait`, `wake`).
pub(crate) trait Port: ProgressSource {
    /// Hands a transfer to the provider as an immediate post of it would: its CQ entry
    /// reserved, device memory staged now. Counter updates are not transfers: `Ok`.
    ///
    /// # Safety
    /// The buffers it names must be valid as the posting call's contract states.
    unsafe fn start(&self, action: &Action) -> Result<(), StartError>;

    /// Marks reports under way outside the provider's lock (`EpCore::reporting`): the
    /// endpoint's close waits them out.
    fn reporting(&self) -> crate::ep::Reporting<'_>;

    /// Reports a transmit operation (send, RMA, atomic) that did not start (canceled, or its
    /// start refused) failed with `err`: it reserved no CQ entry.
    fn fail_tx(&self, ctx: Context, flags: u64, err: i32);

    /// Reports a receive that did not start failed with `err` (as `fail_tx`).
    fn fail_rx(&self, ctx: Context, flags: u64, tag: u64, err: i32);

    /// Keeps the reason a fired operation's staging failed (`take_staging_errors`).
    fn staging_failed(&self, e: Error);

    /// Started deferred transfers of this endpoint.
    fn deferred(&self) -> &DeferredRegistry;

    /// The endpoint runs under `FI_PROGRESS_AUTO`.
    fn auto_progress(&self) -> bool;

    /// The operation a descriptor an XPU posted on this endpoint's ring asks for, checked as
    /// the host call would check it, or what is wrong with it. `seen`: what this ring's
    /// watcher validated before (`xpu::Checked`).
    fn xpu_action(
        &self,
        d: &crate::xpu::XpuDesc,
        seen: &mut crate::xpu::Checked,
    ) -> Result<Action, crate::xpu::Fault>;

    /// Reports a descriptor that did not start (refused, or canceled by close): an error
    /// entry under `ctx` on the CQ of its direction (`opcode`), `prov_errno` the fault's code
    /// and the reason as error data, and the error value of its counter.
    fn xpu_fault(&self, ctx: Context, opcode: u32, f: &crate::xpu::Fault);

    /// Whether a CQ faults are reported to holds as many unread errors as its size: the
    /// XPU's rings are then not drained until the application reads them (its ring fills
    /// and its posts are answered `-FI_EAGAIN`), so that faulty descriptors posted at any
    /// rate cannot make the host keep error entries without bound.
    fn xpu_faults_full(&self) -> bool;

    /// `xpu_faults_full` of the one CQ a descriptor of `opcode` is reported to (its
    /// direction's): a close reports each left descriptor under its own context wherever its
    /// own CQ has room, whatever the other's state.
    fn xpu_faults_full_for(&self, opcode: u32) -> bool {
        let _ = opcode;
        self.xpu_faults_full()
    }

    /// An XPU misused a doorbell: an error entry (`FI_EINVAL`, flags `FI_TRIGGER`, no
    /// context, `prov_errno` saying which misuse, `data` the value stored) on the transmit
    /// CQ, or an error on the send counter without one.
    fn xpu_misuse(&self, prov_errno: i32, value: u64);

    /// Arms `action`, an XPU-triggered operation just armed, in the provider where it can
    /// be made ready ahead (`EndpointOps::xpu_prearm`): its CQ entry reserved now, and what
    /// the trigger then starts is `Action::Armed`. `None`: it stays as it is.
    fn prearm(&self, action: &Action) -> Option<Armed> {
        let _ = action;
        None
    }

    /// Ends an armed operation that has not fired (a cancel, a close): `true` if it ended
    /// so (nothing started; the caller reports `FI_ECANCELED`), `false` if it is under way
    /// or has ended already (its completion is or was reported).
    fn disarm(&self, a: &Armed) -> bool {
        let _ = a;
        false
    }

    /// Whether a failure this endpoint reports for an operation of `flags` (a receive where
    /// `rx`) counts on `c`: it is the endpoint's own counter for that class.
    fn fails_count_on(&self, rx: bool, flags: u64, c: &Arc<dyn CntrPort>) -> bool {
        let _ = (rx, flags, c);
        false
    }

    /// Keeps `block`, shared memory an XPU may still reach after the endpoint closed (a
    /// descriptor ring), until the endpoint's domain closes (`xpu::Retired`); by default it
    /// goes with its last owner.
    fn retire(&self, block: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = block;
    }
}
