//! Atomic operations on an endpoint: fi_atomic(3). atomic / atomicmsg / inject_atomic,
//! fetch_atomic / fetch_atomicmsg and compare_atomic / compare_atomicmsg are reduced to one
//! provider operation, `EndpointOps::atomic`; the valid-queries answer from `atomic`'s tables.
//!
//! On an endpoint opened with `FI_HMEM`, operand, compare and result buffers in device memory
//! go through one host bounce buffer (`hmem_stage`, like sends and RMA): operand and compare
//! values are copied out of the device when the atomic is posted, and fetched values are
//! copied into the device before the completion is written.

use crate::atomic::{self, AtomicOp, Datatype};
use crate::consts::*;
use crate::entry::{Context, FiAddr};
use crate::ep::{Endpoint, EpCore, INJECT_CALL};
use crate::error::{Error, Result};
use crate::hmem_stage::{self, Staged};
use crate::mr::MrDesc;
pub use crate::op::AtomicReq;
use crate::rxq::{IovList, RawIov};

/// Largest operand of one atomic request, in bytes (so `count * datatype size` at most this).
pub const ATOMIC_MAX: usize = 4096;

/// Stages `req` if any of its buffers is device memory: `Ok(None)` for host memory (post as
/// is), else the record whose bounce holds [result space | operand | compare] and lands the
/// result space in the application's result buffer.
///
/// # Safety
/// The request's operand and compare buffers must be readable for the duration of the call.
pub(crate) unsafe fn stage(core: &EpCore, req: &AtomicReq) -> Result<Option<Staged>> {
    let Some(hmem) = core.stager() else {
        return Ok(None);
    };
    let bufs = req.buffers();
    let iov = IovList::from_segs(bufs).expect("three segments fit an iov");
    let Some(segs) = hmem_stage::owners(hmem, &iov)? else {
        return Ok(None);
    };
    let mut bounce = vec![0u8; bufs[0].len];
    // SAFETY: the caller's contract covers operand and compare; the result is not read.
    bounce.extend(unsafe { hmem_stage::gather(hmem, &segs[1..]) }?);
    let land = if bufs[0].len > 0 {
        vec![segs[0]]
    } else {
        Vec::new()
    };
    let user_iov = IovList::one(bufs[0].addr, bufs[0].len);
    Ok(Some(Staged::exchange(req.ctx, user_iov, bounce, land)))
}

/// `struct fi_msg_atomic` less its vectors: the peer, the remote `struct fi_rma_ioc` (address
/// and key), the datatype and operation, and the context; the `*msg` calls take the local
/// buffers (`struct fi_ioc`) beside it.
#[derive(Clone, Copy, Debug)]
pub struct MsgAtomic {
    /// The peer.
    pub addr: FiAddr,
    /// Target address and key.
    pub rma_addr: u64,
    /// The region's key.
    pub key: u64,
    /// Element type.
    pub datatype: Datatype,
    /// Operation.
    pub op: AtomicOp,
    /// Completion context.
    pub context: Context,
}

impl MsgAtomic {
    /// The message form of the plain calls' arguments.
    pub fn new(
        addr: FiAddr,
        rma_addr: u64,
        key: u64,
        datatype: Datatype,
        op: AtomicOp,
        context: Context,
    ) -> Self {
        MsgAtomic {
            addr,
            rma_addr,
            key,
            datatype,
            op,
            context,
        }
    }
}

/// Operation flags the atomic message calls accept. The completion levels are all met: an
/// atomic completes when the target's answer comes, after it executed the operation (and,
/// with `FI_COMMIT_COMPLETE`, made the range durable), which is past what `FI_INJECT_COMPLETE`
/// and `FI_TRANSMIT_COMPLETE` ask.
const ATOMIC_FLAGS: u64 = FI_COMPLETION
    | FI_MORE
    | FI_INJECT
    | FI_FENCE
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE
    | FI_COMMIT_COMPLETE;

impl Endpoint {
    fn post_atomic(&self, what: &'static str, req: AtomicReq) -> Result<()> {
        self.not_triggered_by_default(what, req.flags)?;
        self.check_atomic(what, &req)?;
        // SAFETY: forwarded from the public call's contract (operand and compare are readable
        // now).
        unsafe { self.core().start_atomic(&**self.ops(), &req) }.map_err(Error::from)
    }

    /// Checks an atomic request against the endpoint's state, capabilities and the
    /// operation's definition.
    pub(crate) fn check_atomic(&self, what: &'static str, req: &AtomicReq) -> Result<()> {
        self.check_live(what)?;
        if self.core().caps & FI_ATOMIC == 0 {
            return Err(Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_ATOMIC"
            )));
        }
        let family_ok = match (req.compare != 0, req.flags & FI_READ != 0) {
            (true, _) => atomic::compare_valid(req.op, req.dt),
            (false, true) => atomic::fetch_valid(req.op, req.dt),
            (false, false) => atomic::valid(req.op, req.dt),
        };
        if !family_ok {
            return Err(Error::OpNotSupp(format!(
                "{what}: {} on {} is not defined for this call",
                req.op.c_name(),
                req.dt.c_name()
            )));
        }
        if req.count == 0 {
            return Err(Error::Inval(format!("{what}: count 0")));
        }
        if req.flags & FI_COMMIT_COMPLETE != 0 && self.core().caps & FI_RMA_PMEM == 0 {
            return Err(Error::BadFlags(format!(
                "{what}: FI_COMMIT_COMPLETE needs an endpoint opened with FI_RMA_PMEM"
            )));
        }
        if req.bytes() > ATOMIC_MAX {
            return Err(Error::MsgSize(format!(
                "{what}: count {} of {} (at most {} elements)",
                req.count,
                req.dt.c_name(),
                ATOMIC_MAX / req.dt.size()
            )));
        }
        Ok(())
    }

    fn req(&self, m: &MsgAtomic, count: usize, operand: usize, flags: u64) -> AtomicReq {
        AtomicReq {
            ctx: m.context,
            dest: m.addr,
            addr: m.rma_addr,
            key: m.key,
            dt: m.datatype,
            op: m.op,
            count,
            operand,
            compare: 0,
            result: 0,
            flags: flags | FI_ATOMIC | (self.tx_op_flags() & !FI_INJECT),
        }
    }

    /// `b` holds `count` elements of `dt` at an address (a null one, which a deferred or
    /// triggered operation would follow only when it fires, is refused now).
    fn check_buf(what: &'static str, b: RawIov, count: usize, dt: Datatype) -> Result<()> {
        let need = count.saturating_mul(dt.size());
        if b.len < need {
            return Err(Error::Inval(format!(
                "{what}: buffer of {} bytes for {count} x {}",
                b.len,
                dt.c_name()
            )));
        }
        if b.addr == 0 && need > 0 {
            return Err(Error::Inval(format!(
                "{what}: a buffer of {count} x {} has a null address",
                dt.c_name()
            )));
        }
        Ok(())
    }

    /// The request `atomicmsg` describes.
    pub(crate) fn atomic_req(
        &self,
        what: &'static str,
        m: &MsgAtomic,
        operand: RawIov,
        count: usize,
        flags: u64,
    ) -> Result<AtomicReq> {
        if flags & !ATOMIC_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: flags {}",
                caps_str(flags & !ATOMIC_FLAGS)
            )));
        }
        Self::check_buf(what, operand, count, m.datatype)?;
        Ok(self.req(m, count, operand.addr, flags | FI_WRITE))
    }

    /// The request `fetch_atomicmsg` describes.
    pub(crate) fn fetch_req(
        &self,
        what: &'static str,
        m: &MsgAtomic,
        operand: RawIov,
        result: RawIov,
        count: usize,
        flags: u64,
    ) -> Result<AtomicReq> {
        // FI_INJECT covers the operand and compare buffers (copied before return); the result
        // is still written when the operation completes, and a completion is still reported.
        if flags & !ATOMIC_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: flags {}",
                caps_str(flags & !ATOMIC_FLAGS)
            )));
        }
        if m.op != AtomicOp::Read {
            Self::check_buf(what, operand, count, m.datatype)?;
        }
        Self::check_buf(what, result, count, m.datatype)?;
        let mut r = self.req(m, count, operand.addr, flags | FI_READ);
        r.result = result.addr;
        Ok(r)
    }

    /// The request `compare_atomicmsg` describes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compare_req(
        &self,
        what: &'static str,
        m: &MsgAtomic,
        operand: RawIov,
        compare: RawIov,
        result: RawIov,
        count: usize,
        flags: u64,
    ) -> Result<AtomicReq> {
        // FI_INJECT covers the operand and compare buffers (copied before return); the result
        // is still written when the operation completes, and a completion is still reported.
        if flags & !ATOMIC_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: flags {}",
                caps_str(flags & !ATOMIC_FLAGS)
            )));
        }
        for b in [operand, compare, result] {
            Self::check_buf(what, b, count, m.datatype)?;
        }
        let mut r = self.req(m, count, operand.addr, flags | FI_READ);
        r.compare = compare.addr;
        r.result = result.addr;
        Ok(r)
    }

    /// `fi_atomicmsg` (one segment): target = target OP operand, element-wise.
    ///
    /// # Safety
    /// `operand` must stay valid until the completion (during the call with `FI_INJECT`).
    pub unsafe fn atomicmsg(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        count: usize,
        flags: u64,
    ) -> Result<()> {
        let r = self.atomic_req("atomicmsg", m, RawIov::of(operand), count, flags)?;
        self.post_atomic("atomicmsg", r)
    }

    /// `fi_atomic`.
    ///
    /// # Safety
    /// As `atomicmsg`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn atomic(
        &self,
        operand: &[u8],
        count: usize,
        _desc: Option<MrDesc>,
        dest: FiAddr,
        addr: u64,
        key: u64,
        datatype: Datatype,
        op: AtomicOp,
        ctx: Context,
    ) -> Result<()> {
        let m = MsgAtomic::new(dest, addr, key, datatype, op, ctx);
        // SAFETY: forwarded contract.
        unsafe { self.atomicmsg(&m, operand, count, 0) }
    }

    /// `fi_inject_atomic`: the operand is copied before return; no completion entry.
    #[allow(clippy::too_many_arguments)]
    pub fn inject_atomic(
        &self,
        operand: &[u8],
        count: usize,
        dest: FiAddr,
        addr: u64,
        key: u64,
        datatype: Datatype,
        op: AtomicOp,
    ) -> Result<()> {
        let m = MsgAtomic::new(dest, addr, key, datatype, op, 0);
        Self::check_buf("inject_atomic", RawIov::of(operand), count, datatype)?;
        let mut r = self.req(&m, count, operand.as_ptr() as usize, FI_WRITE | FI_INJECT);
        r.flags |= INJECT_CALL;
        self.post_atomic("inject_atomic", r)
    }

    /// `fi_fetch_atomicmsg`: as `atomicmsg`, and the original target values land in `result`.
    ///
    /// # Safety
    /// `operand` and `result` must stay valid until the completion (the operand only during the
    /// call with `FI_INJECT`); `result` is written.
    pub unsafe fn fetch_atomicmsg(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        result: &mut [u8],
        count: usize,
        flags: u64,
    ) -> Result<()> {
        let (operand, result) = (RawIov::of(operand), RawIov::of_mut(result));
        let r = self.fetch_req("fetch_atomicmsg", m, operand, result, count, flags)?;
        self.post_atomic("fetch_atomicmsg", r)
    }

    /// `fi_fetch_atomic`.
    ///
    /// # Safety
    /// As `fetch_atomicmsg`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fetch_atomic(
        &self,
        operand: &[u8],
        count: usize,
        result: &mut [u8],
        dest: FiAddr,
        addr: u64,
        key: u64,
        datatype: Datatype,
        op: AtomicOp,
        ctx: Context,
    ) -> Result<()> {
        let m = MsgAtomic::new(dest, addr, key, datatype, op, ctx);
        // SAFETY: forwarded contract.
        unsafe { self.fetch_atomicmsg(&m, operand, result, count, 0) }
    }

    /// `fi_compare_atomicmsg`: element-wise, if the compare holds the target becomes the
    /// operand (or the masked swap, for `FI_MSWAP`); `result` gets the original values.
    ///
    /// # Safety
    /// `operand`, `compare` and `result` must stay valid until the completion (operand and
    /// compare only during the call with `FI_INJECT`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_atomicmsg(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        compare: &[u8],
        result: &mut [u8],
        count: usize,
        flags: u64,
    ) -> Result<()> {
        let (operand, compare) = (RawIov::of(operand), RawIov::of(compare));
        let result = RawIov::of_mut(result);
        let r = self.compare_req(
            "compare_atomicmsg",
            m,
            operand,
            compare,
            result,
            count,
            flags,
        )?;
        self.post_atomic("compare_atomicmsg", r)
    }

    /// `fi_compare_atomic`.
    ///
    /// # Safety
    /// As `compare_atomicmsg`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_atomic(
        &self,
        operand: &[u8],
        count: usize,
        compare: &[u8],
        result: &mut [u8],
        dest: FiAddr,
        addr: u64,
        key: u64,
        datatype: Datatype,
        op: AtomicOp,
        ctx: Context,
    ) -> Result<()> {
        let m = MsgAtomic::new(dest, addr, key, datatype, op, ctx);
        // SAFETY: forwarded contract.
        unsafe { self.compare_atomicmsg(&m, operand, compare, result, count, 0) }
    }

    /// `fi_atomicvalid`: the most elements one `atomic` may carry, or `OpNotSupp`.
    pub fn atomicvalid(&self, datatype: Datatype, op: AtomicOp) -> Result<usize> {
        self.valid_count(atomic::valid(op, datatype), datatype, op)
    }

    /// `fi_fetch_atomicvalid`.
    pub fn fetch_atomicvalid(&self, datatype: Datatype, op: AtomicOp) -> Result<usize> {
        self.valid_count(atomic::fetch_valid(op, datatype), datatype, op)
    }

    /// `fi_compare_atomicvalid`.
    pub fn compare_atomicvalid(&self, datatype: Datatype, op: AtomicOp) -> Result<usize> {
        self.valid_count(atomic::compare_valid(op, datatype), datatype, op)
    }

    fn valid_count(&self, ok: bool, dt: Datatype, op: AtomicOp) -> Result<usize> {
        if self.core().caps & FI_ATOMIC == 0 {
            return Err(Error::OpNotSupp(
                "endpoint was opened without FI_ATOMIC".into(),
            ));
        }
        if !ok {
            return Err(Error::OpNotSupp(format!(
                "{} on {}",
                op.c_name(),
                dt.c_name()
            )));
        }
        Ok(ATOMIC_MAX / dt.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_request_finds_its_buffers_in_the_bounce() {
        let req = AtomicReq {
            ctx: 1,
            dest: 0,
            addr: 0,
            key: 0,
            dt: Datatype::UInt64,
            op: AtomicOp::Cswap,
            count: 2,
            operand: 0x100,
            compare: 0x200,
            result: 0x300,
            flags: FI_ATOMIC | FI_READ,
        };
        let r = req.in_bounce(9, 0x1000);
        assert_eq!(
            (r.ctx, r.result, r.operand, r.compare),
            (9, 0x1000, 0x1010, 0x1020)
        );
        // An atomic read has no operand: it keeps the caller's (ignored) pointer.
        let read = AtomicReq {
            op: AtomicOp::Read,
            compare: 0,
            ..req
        };
        let r = read.in_bounce(9, 0x1000);
        assert_eq!((r.result, r.operand, r.compare), (0x1000, 0x100, 0));
        let plain = AtomicReq {
            op: AtomicOp::Sum,
            compare: 0,
            result: 0,
            ..req
        };
        let r = plain.in_bounce(9, 0x1000);
        assert_eq!((r.result, r.operand, r.compare), (0, 0x1000, 0));
    }
}
