//! Starting an operation through the provider: the one path that immediate posts (`send`,
//! `recv`, `write`...) and fired operations (threshold triggers, deferred work, XPU triggers)
//! both take, so that an `FI_HMEM` endpoint stages device memory the same way whenever an
//! operation starts.
//!
//! Outgoing data is gathered into its bounce buffer here, when the operation starts: for a
//! triggered send that is when its trigger fires, which is when its data is ready. Incoming
//! data lands when the completion calls of `EpCore` see the staging context.
//!
//! Under `FI_RM_ENABLED` an operation reserves its CQ entry here first (`ep_credit`), so a
//! full CQ refuses immediate posts with `Again` and makes fired operations wait their turn.

use crate::consts::*;
use crate::ep::{EndpointOps, EpCore, TxOp};
use crate::ep_atomic::AtomicReq;
use crate::ep_credit::Dir;
use crate::ep_rma::RmaOp;
use crate::error::{Error, Result};
use crate::hmem_stage::Staged;
use crate::rxq::PostedRecv;

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

impl EpCore {
    /// `start_send_provider` once the operation's CQ entry is reserved (`ep_credit`); a refused
    /// start gives the reservation back.
    ///
    /// # Safety
    /// As `start_send_provider`.
    #[inline]
    pub(crate) unsafe fn start_send(
        &self,
        ops: &dyn EndpointOps,
        op: &TxOp,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(Dir::Tx, op.flags)
            .map_err(StartError::Refused)?;
        // SAFETY: forwarded.
        let r = unsafe { self.start_send_provider(ops, op) };
        if r.is_err() && reserved {
            self.release_entry(Dir::Tx);
        }
        r
    }

    /// `start_recv_provider` once the operation's CQ entry is reserved (`ep_credit`); a refused
    /// start gives the reservation back.
    ///
    /// # Safety
    /// As `start_recv_provider`.
    #[inline]
    pub(crate) unsafe fn start_recv(
        &self,
        ops: &dyn EndpointOps,
        r: PostedRecv,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(Dir::Rx, r.flags)
            .map_err(StartError::Refused)?;
        // SAFETY: forwarded.
        let r = unsafe { self.start_recv_provider(ops, r) };
        if r.is_err() && reserved {
            self.release_entry(Dir::Rx);
        }
        r
    }

    /// `start_rma_provider` once the operation's CQ entry is reserved (`ep_credit`); a refused
    /// start gives the reservation back.
    ///
    /// # Safety
    /// As `start_rma_provider`.
    #[inline]
    pub(crate) unsafe fn start_rma(
        &self,
        ops: &dyn EndpointOps,
        op: &RmaOp,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(Dir::Tx, op.flags)
            .map_err(StartError::Refused)?;
        // SAFETY: forwarded.
        let r = unsafe { self.start_rma_provider(ops, op) };
        if r.is_err() && reserved {
            self.release_entry(Dir::Tx);
        }
        r
    }

    /// `start_atomic_provider` once the operation's CQ entry is reserved (`ep_credit`); a refused
    /// start gives the reservation back.
    ///
    /// # Safety
    /// As `start_atomic_provider`.
    #[inline]
    pub(crate) unsafe fn start_atomic(
        &self,
        ops: &dyn EndpointOps,
        req: &AtomicReq,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(Dir::Tx, req.flags)
            .map_err(StartError::Refused)?;
        // SAFETY: forwarded.
        let r = unsafe { self.start_atomic_provider(ops, req) };
        if r.is_err() && reserved {
            self.release_entry(Dir::Tx);
        }
        r
    }

    /// Starts a send; device memory in `op.iov` is gathered into a bounce buffer first.
    ///
    /// Endpoints without `FI_HMEM` go straight to the provider: one flag test.
    ///
    /// # Safety
    /// As `EndpointOps::send`; the data must also be readable now.
    #[inline]
    unsafe fn start_send_provider(
        &self,
        ops: &dyn EndpointOps,
        op: &TxOp,
    ) -> Result<(), StartError> {
        if self.stager().is_none() {
            // SAFETY: forwarded.
            return unsafe { ops.send(op) }.map_err(StartError::Refused);
        }
        // SAFETY: forwarded.
        unsafe { self.start_send_staged(ops, op) }
    }

    /// `start_send` on an `FI_HMEM` endpoint.
    ///
    /// # Safety
    /// As `start_send`.
    #[inline(never)]
    unsafe fn start_send_staged(&self, ops: &dyn EndpointOps, op: &TxOp) -> Result<(), StartError> {
        // SAFETY: the caller's contract: the data is readable now.
        let staged = unsafe { self.stage_out(op.ctx, &op.iov) }.map_err(StartError::Stage)?;
        let r = match staged {
            // SAFETY: forwarded.
            None => unsafe { ops.send(op) },
            Some(s) => self.post_staged(s, op.flags & FI_INJECT != 0, |ctx, iov| {
                // SAFETY: the bounce buffer lives until the operation completes.
                unsafe { ops.send(&TxOp { ctx, iov, ..*op }) }
            }),
        };
        r.map_err(StartError::Refused)
    }

    /// Starts a receive; device memory in `r.iov` is received into a bounce buffer and lands
    /// before the completion is reported.
    ///
    /// Endpoints without `FI_HMEM` go straight to the provider: one flag test.
    ///
    /// # Safety
    /// As `EndpointOps::recv`.
    #[inline]
    unsafe fn start_recv_provider(
        &self,
        ops: &dyn EndpointOps,
        r: PostedRecv,
    ) -> Result<(), StartError> {
        if self.stager().is_none() {
            // SAFETY: forwarded.
            return unsafe { ops.recv(r) }.map_err(StartError::Refused);
        }
        // SAFETY: forwarded.
        unsafe { self.start_recv_staged(ops, r) }
    }

    /// `start_recv` on an `FI_HMEM` endpoint.
    ///
    /// # Safety
    /// As `start_recv`.
    #[inline(never)]
    unsafe fn start_recv_staged(
        &self,
        ops: &dyn EndpointOps,
        r: PostedRecv,
    ) -> Result<(), StartError> {
        let multi = r.flags & FI_MULTI_RECV != 0;
        let staged = self
            .stage_in(r.ctx, &r.iov, multi)
            .map_err(StartError::Stage)?;
        let res = match staged {
            // SAFETY: forwarded.
            None => unsafe { ops.recv(r) },
            Some(s) => self.post_staged(s, false, |ctx, iov| {
                // SAFETY: the bounce buffer lives until the receive completes.
                unsafe { ops.recv(PostedRecv { ctx, iov, ..r }) }
            }),
        };
        res.map_err(StartError::Refused)
    }

    /// Starts an RMA read or write, staging its local memory by direction.
    ///
    /// Endpoints without `FI_HMEM` go straight to the provider: one flag test.
    ///
    /// # Safety
    /// As `EndpointOps::rma`; a write's data must also be readable now.
    #[inline]
    unsafe fn start_rma_provider(
        &self,
        ops: &dyn EndpointOps,
        op: &RmaOp,
    ) -> Result<(), StartError> {
        if self.stager().is_none() {
            // SAFETY: forwarded.
            return unsafe { ops.rma(op) }.map_err(StartError::Refused);
        }
        // SAFETY: forwarded.
        unsafe { self.start_rma_staged(ops, op) }
    }

    /// `start_rma` on an `FI_HMEM` endpoint.
    ///
    /// # Safety
    /// As `start_rma`.
    #[inline(never)]
    unsafe fn start_rma_staged(&self, ops: &dyn EndpointOps, op: &RmaOp) -> Result<(), StartError> {
        let staged: Result<Option<Staged>> = if op.flags & FI_READ != 0 {
            self.stage_in(op.ctx, &op.iov, false)
        } else {
            // SAFETY: the caller's contract: a write's data is readable now.
            unsafe { self.stage_out(op.ctx, &op.iov) }
        };
        let r = match staged.map_err(StartError::Stage)? {
            // SAFETY: forwarded.
            None => unsafe { ops.rma(op) },
            Some(s) => self.post_staged(s, op.flags & FI_INJECT != 0, |ctx, iov| {
                // SAFETY: the bounce buffer lives until the operation completes.
                unsafe { ops.rma(&RmaOp { ctx, iov, ..*op }) }
            }),
        };
        r.map_err(StartError::Refused)
    }

    /// Starts an atomic; device memory among its operand, compare and result buffers goes
    /// through one bounce buffer (`ep_atomic::stage`), fetched values landing before the
    /// completion is reported.
    ///
    /// Endpoints without `FI_HMEM` go straight to the provider: one flag test.
    ///
    /// # Safety
    /// As `EndpointOps::atomic`; operand and compare must also be readable now.
    #[inline]
    unsafe fn start_atomic_provider(
        &self,
        ops: &dyn EndpointOps,
        req: &AtomicReq,
    ) -> Result<(), StartError> {
        if self.stager().is_none() {
            // SAFETY: forwarded.
            return unsafe { ops.atomic(req) }.map_err(StartError::Refused);
        }
        // SAFETY: forwarded.
        unsafe { self.start_atomic_staged(ops, req) }
    }

    /// `start_atomic` on an `FI_HMEM` endpoint.
    ///
    /// # Safety
    /// As `start_atomic`.
    #[inline(never)]
    unsafe fn start_atomic_staged(
        &self,
        ops: &dyn EndpointOps,
        req: &AtomicReq,
    ) -> Result<(), StartError> {
        // SAFETY: the caller's contract: operand and compare are readable now.
        let r = match unsafe { crate::ep_atomic::stage(self, req) }.map_err(StartError::Stage)? {
            // SAFETY: forwarded.
            None => unsafe { ops.atomic(req) },
            // An inject's bounce may go when the call returns, unless a fetched result is
            // still to land in it (FI_INJECT on a fetching atomic covers only the operands).
            Some(s) => self.post_staged(
                s,
                req.flags & FI_INJECT != 0 && req.result == 0,
                |ctx, bounce| {
                    let req = req.in_bounce(ctx, bounce.first_addr());
                    // SAFETY: the bounce buffer lives until the operation completes (a non-fetching
                    // inject's during the call, which is all it needs).
                    unsafe { ops.atomic(&req) }
                },
            ),
        };
        r.map_err(StartError::Refused)
    }
}
