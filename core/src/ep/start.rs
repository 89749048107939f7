//! Starting an operation through the provider: the one path that immediate posts (`send`,
//! `recv`, `write`...) and fired operations (threshold triggers, deferred work, XPU triggers)
//! both take, so that an `FI_HMEM` endpoint stages device memory the same way whenever an
//! operation starts.
//!
//! Outgoing data is gathered into its bounce buffer here, when the operation starts: for a
//! triggered send that is when its trigger fires, which is when its data is ready. Incoming
//! data lands when the completion calls of `EpCore` see the staging context.
//!
//! Under `FI_RM_ENABLED` an operation reserves its CQ entry here first (`credit`), so a
//! full CQ refuses immediate posts with `Again` and makes fired operations wait their turn.

use crate::consts::*;
use crate::ep::atomic::AtomicReq;
use crate::ep::rma::RmaOp;
use crate::ep::{Dir, EndpointOps, EpCore, TxOp};
use crate::error::Result;
use crate::hmem_stage::Staged;
use crate::rxq::PostedRecv;
pub(crate) use crate::trigger::StartError;

impl EpCore {
    /// Runs `start` (one operation handed to the provider) once the operation's CQ entry in
    /// direction `dir` is reserved (`credit`); a refused start gives the reservation back.
    /// Every start below goes through here: reserve, provider, release written once.
    /// Always inlined: a call of its own would copy the operation into the closure and the
    /// result out of it on every post.
    #[inline(always)]
    fn reserved(
        &self,
        dir: Dir,
        flags: u64,
        start: impl FnOnce() -> Result<(), StartError>,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(dir, flags)
            .map_err(StartError::Refused)?;
        let r = start();
        if r.is_err() && reserved {
            self.release_entry(dir);
        }
        r
    }

    /// Fires an armed send (`Action::Armed`, `EndpointOps::xpu_prearm`) with its CQ entry
    /// reserved now: a full CQ makes it wait its turn (`Again`), as any fired operation. One
    /// that had ended before its firing (reported then, as a lost peer's) gives the entry
    /// back: no completion will take it.
    pub(crate) fn start_armed(
        &self,
        ops: &dyn EndpointOps,
        a: &crate::trigger::Armed,
    ) -> Result<(), StartError> {
        let reserved = self
            .reserve_entry(Dir::Tx, a.flags)
            .map_err(StartError::Refused)?;
        if !ops.xpu_fired(a.token) && reserved {
            self.release_entry(Dir::Tx);
        }
        Ok(())
    }

    /// `start_send_provider` with its CQ entry reserved.
    ///
    /// # Safety
    /// As `start_send_provider`.
    #[inline(always)]
    pub(crate) unsafe fn start_send(
        &self,
        ops: &dyn EndpointOps,
        op: &TxOp,
    ) -> Result<(), StartError> {
        // SAFETY: forwarded.
        self.reserved(Dir::Tx, op.flags, || unsafe {
            self.start_send_provider(ops, op)
        })
    }

    /// `start_recv_provider` with its CQ entry reserved.
    ///
    /// # Safety
    /// As `start_recv_provider`.
    #[inline(always)]
    pub(crate) unsafe fn start_recv(
        &self,
        ops: &dyn EndpointOps,
        r: PostedRecv,
    ) -> Result<(), StartError> {
        // SAFETY: forwarded.
        self.reserved(Dir::Rx, r.flags, || unsafe {
            self.start_recv_provider(ops, r)
        })
    }

    /// `start_rma_provider` with its CQ entry reserved.
    ///
    /// # Safety
    /// As `start_rma_provider`.
    #[inline]
    pub(crate) unsafe fn start_rma(
        &self,
        ops: &dyn EndpointOps,
        op: &RmaOp,
    ) -> Result<(), StartError> {
        // SAFETY: forwarded.
        self.reserved(Dir::Tx, op.flags, || unsafe {
            self.start_rma_provider(ops, op)
        })
    }

    /// `start_atomic_provider` with its CQ entry reserved.
    ///
    /// # Safety
    /// As `start_atomic_provider`.
    #[inline]
    pub(crate) unsafe fn start_atomic(
        &self,
        ops: &dyn EndpointOps,
        req: &AtomicReq,
    ) -> Result<(), StartError> {
        // SAFETY: forwarded.
        self.reserved(Dir::Tx, req.flags, || unsafe {
            self.start_atomic_provider(ops, req)
        })
    }

    /// Starts a send; device memory in `op.iov` is gathered into a bounce buffer first.
    ///
    /// Endpoints without `FI_HMEM` go straight to the provider: one flag test.
    ///
    /// # Safety
    /// As `EndpointOps::send`; the data must also be readable now.
    #[inline(always)]
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
        if let Some(hm) = self.stager() {
            if self.device_offer(hm, op.flags, &op.iov) {
                crate::hmem_stage::count_offered();
                let op = TxOp {
                    flags: op.flags | crate::ep::DEVICE_OFFER,
                    ..*op
                };
                // SAFETY: forwarded; the engine never reads the device memory itself.
                return unsafe { ops.send(&op) }.map_err(StartError::Refused);
            }
        }
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
    #[inline(always)]
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
    /// through one bounce buffer (`atomic::stage`), fetched values landing before the
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
        let r = match unsafe { crate::ep::atomic::stage(self, req) }.map_err(StartError::Stage)? {
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
