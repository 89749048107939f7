//! One-sided operations on an endpoint: fi_rma(3). Like the message calls in `ep`, every
//! variant (read, readv, readmsg, write, writev, writemsg, writedata, inject_write,
//! inject_writedata) is reduced to one provider operation, `EndpointOps::rma`.

use crate::consts::*;
use crate::entry::{Context, FiAddr};
use crate::ep::{Endpoint, INJECT_CALL};
use crate::error::{Error, Result};
use crate::mr::MrDesc;
pub use crate::op::{RmaIov, RmaIovList, RmaOp};
use crate::rxq::{IovList, RawIov, IOV_LIMIT};

/// `struct fi_msg_rma`.
#[derive(Clone, Copy, Debug)]
pub struct MsgRma<'a> {
    /// Local segments.
    pub iov: &'a [RawIov],
    /// Their descriptors (or none).
    pub desc: &'a [MrDesc],
    /// The peer.
    pub addr: FiAddr,
    /// The peer's ranges; their total length must equal the local one.
    pub rma_iov: &'a [RmaIov],
    /// Completion context.
    pub context: Context,
    /// Remote CQ data.
    pub data: u64,
}

/// Operation flags `readmsg` / `writemsg` accept.
const RMA_FLAGS: u64 = FI_REMOTE_CQ_DATA
    | FI_COMPLETION
    | FI_MORE
    | FI_INJECT
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE
    | FI_COMMIT_COMPLETE
    | FI_FENCE;

impl Endpoint {
    fn post_rma(&self, what: &'static str, op: RmaOp) -> Result<()> {
        self.not_triggered_by_default(what, op.flags)?;
        self.check_rma(what, &op)?;
        // SAFETY: forwarded from the public call's contract (a write's data is readable now).
        unsafe { self.core().start_rma(&**self.ops(), &op) }.map_err(Error::from)
    }

    /// Checks an RMA operation against the endpoint's state, sizes and capabilities.
    pub(crate) fn check_rma(&self, what: &'static str, op: &RmaOp) -> Result<()> {
        self.check_live(what)?;
        let caps = self.core().caps;
        if caps & FI_RMA == 0 {
            return Err(Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_RMA"
            )));
        }
        let dir = op.flags & (FI_READ | FI_WRITE);
        if caps & (FI_READ | FI_WRITE) != 0 && caps & dir == 0 {
            return Err(Error::OpNotSupp(format!(
                "{what}: endpoint was opened without {}",
                caps_str(dir)
            )));
        }
        let local = op.iov.total();
        let remote = op.rma.total();
        if local != remote {
            return Err(Error::Inval(format!(
                "{what}: {local} local bytes but {remote} remote bytes"
            )));
        }
        if local > self.core().max_msg_size {
            return Err(Error::MsgSize(format!(
                "{what}: {local} bytes is over max_msg_size"
            )));
        }
        if op.flags & FI_INJECT != 0 && local > self.core().inject_size {
            return Err(Error::MsgSize(format!(
                "{what}: inject of {local} bytes, inject_size is {}",
                self.core().inject_size
            )));
        }
        if op.flags & FI_COMMIT_COMPLETE != 0 && caps & FI_RMA_PMEM == 0 {
            return Err(Error::BadFlags(format!(
                "{what}: FI_COMMIT_COMPLETE needs an endpoint opened with FI_RMA_PMEM"
            )));
        }
        Ok(())
    }

    /// One operation on the single remote range (`addr`, `key`) as long as the local iov.
    #[allow(clippy::too_many_arguments)]
    fn rma_op(
        &self,
        ctx: Context,
        iov: IovList,
        peer: FiAddr,
        addr: u64,
        key: u64,
        data: u64,
        flags: u64,
    ) -> RmaOp {
        let rma = RmaIov {
            addr,
            len: iov.total(),
            key,
        };
        RmaOp {
            ctx,
            iov,
            dest: peer,
            rma: RmaIovList::from_segs(&[rma]).expect("one segment"),
            data,
            flags: flags | (self.tx_op_flags() & !FI_INJECT),
        }
    }

    /// `fi_read`: copies `buf.len()` bytes of the peer's memory at (`addr`, `key`) into `buf`.
    ///
    /// # Safety
    /// `buf` must stay valid and untouched by anything else until the completion.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn read(
        &self,
        buf: &mut [u8],
        _desc: Option<MrDesc>,
        src: FiAddr,
        addr: u64,
        key: u64,
        ctx: Context,
    ) -> Result<()> {
        let iov = IovList::one(buf.as_mut_ptr() as usize, buf.len());
        self.post_rma(
            "read",
            self.rma_op(ctx, iov, src, addr, key, 0, FI_RMA | FI_READ),
        )
    }

    /// `fi_readv`.
    ///
    /// # Safety
    /// As `read`, for every segment.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn readv(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        src: FiAddr,
        addr: u64,
        key: u64,
        ctx: Context,
    ) -> Result<()> {
        let l = self.iov("readv", iov)?;
        self.post_rma(
            "readv",
            self.rma_op(ctx, l, src, addr, key, 0, FI_RMA | FI_READ),
        )
    }

    /// `fi_readmsg`.
    ///
    /// # Safety
    /// As `read`, for every segment.
    pub unsafe fn readmsg(&self, msg: &MsgRma<'_>, flags: u64) -> Result<()> {
        self.rma_msg("readmsg", msg, flags, FI_READ)
    }

    /// `fi_write`: copies `buf` into the peer's memory at (`addr`, `key`).
    ///
    /// # Safety
    /// `buf` must stay valid and unmodified until the completion.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: Context,
    ) -> Result<()> {
        let iov = IovList::one(buf.as_ptr() as usize, buf.len());
        self.post_rma(
            "write",
            self.rma_op(ctx, iov, dest, addr, key, 0, FI_RMA | FI_WRITE),
        )
    }

    /// `fi_writev`.
    ///
    /// # Safety
    /// As `write`, for every segment.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn writev(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: Context,
    ) -> Result<()> {
        let l = self.iov("writev", iov)?;
        self.post_rma(
            "writev",
            self.rma_op(ctx, l, dest, addr, key, 0, FI_RMA | FI_WRITE),
        )
    }

    /// `fi_writedata`: a write that also delivers 64 bits of CQ data to the peer's receive CQ.
    ///
    /// # Safety
    /// As `write`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn writedata(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        data: u64,
        dest: FiAddr,
        addr: u64,
        key: u64,
        ctx: Context,
    ) -> Result<()> {
        let iov = IovList::one(buf.as_ptr() as usize, buf.len());
        let op = self.rma_op(
            ctx,
            iov,
            dest,
            addr,
            key,
            data,
            FI_RMA | FI_WRITE | FI_REMOTE_CQ_DATA,
        );
        self.post_rma("writedata", op)
    }

    /// `fi_writemsg`, with flags from `FI_REMOTE_CQ_DATA`, `FI_COMPLETION`, `FI_INJECT`,
    /// `FI_FENCE`, `FI_MORE` and the completion levels including `FI_COMMIT_COMPLETE`.
    ///
    /// # Safety
    /// As `write`, for every segment (during the call only with `FI_INJECT`).
    pub unsafe fn writemsg(&self, msg: &MsgRma<'_>, flags: u64) -> Result<()> {
        self.rma_msg("writemsg", msg, flags, FI_WRITE)
    }

    fn rma_msg(&self, what: &'static str, msg: &MsgRma<'_>, flags: u64, dir: u64) -> Result<()> {
        let op = self.msg_rma(what, msg, flags, dir)?;
        self.post_rma(what, op)
    }

    /// The read (`dir` `FI_READ`) or write (`FI_WRITE`) that `readmsg` / `writemsg` describes.
    pub(crate) fn msg_rma(
        &self,
        what: &'static str,
        msg: &MsgRma<'_>,
        flags: u64,
        dir: u64,
    ) -> Result<RmaOp> {
        if flags & !RMA_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: flags {} are not RMA flags",
                caps_str(flags & !RMA_FLAGS)
            )));
        }
        if dir == FI_READ && flags & (FI_INJECT | FI_REMOTE_CQ_DATA) != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: FI_INJECT and FI_REMOTE_CQ_DATA do not apply to reads"
            )));
        }
        let iov = self.iov(what, msg.iov)?;
        let rma = RmaIovList::from_segs(msg.rma_iov).ok_or_else(|| {
            Error::Inval(format!(
                "{what}: {} remote segments, the limit is {IOV_LIMIT}",
                msg.rma_iov.len()
            ))
        })?;
        Ok(RmaOp {
            ctx: msg.context,
            iov,
            dest: msg.addr,
            rma,
            data: msg.data,
            flags: flags | FI_RMA | dir,
        })
    }

    /// `fi_inject_write`: the data is copied before return; no completion entry is written.
    pub fn inject_write(&self, buf: &[u8], dest: FiAddr, addr: u64, key: u64) -> Result<()> {
        let iov = IovList::one(buf.as_ptr() as usize, buf.len());
        let mut op = self.rma_op(0, iov, dest, addr, key, 0, FI_RMA | FI_WRITE | FI_INJECT);
        op.flags |= FI_INJECT | INJECT_CALL;
        self.post_rma("inject_write", op)
    }

    /// `fi_inject_writedata`.
    pub fn inject_writedata(
        &self,
        buf: &[u8],
        data: u64,
        dest: FiAddr,
        addr: u64,
        key: u64,
    ) -> Result<()> {
        let iov = IovList::one(buf.as_ptr() as usize, buf.len());
        let mut op = self.rma_op(
            0,
            iov,
            dest,
            addr,
            key,
            data,
            FI_RMA | FI_WRITE | FI_INJECT | FI_REMOTE_CQ_DATA,
        );
        op.flags |= FI_INJECT | INJECT_CALL;
        self.post_rma("inject_writedata", op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn rma_iov_layout_and_lists() {
        assert_eq!(size_of::<RmaIov>(), 24);
        assert_eq!(offset_of!(RmaIov, key), 16);
        let segs = [RmaIov {
            addr: 1,
            len: 2,
            key: 3,
        }; 4];
        assert_eq!(RmaIovList::from_segs(&segs).unwrap().total(), 8);
        assert!(RmaIovList::from_segs(&[RmaIov::default(); 5]).is_none());
    }
}
