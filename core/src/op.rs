//! What an operation is once an endpoint call has checked it: the descriptors a provider is
//! handed (`EndpointOps::send`, `rma`, `atomic`; a receive is `rxq::PostedRecv`) and that a
//! triggered operation waits as. They sit below both the endpoint, which builds them, and the
//! trigger machinery, which holds them until they start, so that neither imports the other to
//! name them. Their public paths are the endpoint's (`ep::TxOp`, `ep_rma::RmaOp`,
//! `ep_atomic::AtomicReq`).

use crate::atomic::{AtomicOp, Datatype};
use crate::entry::{Context, FiAddr};
use crate::rxq::{IovList, RawIov, IOV_LIMIT};

/// One transmit operation, reduced from whichever call posted it.
#[derive(Clone, Copy, Debug)]
pub struct TxOp {
    /// Completion context.
    pub ctx: Context,
    /// The data (raw; valid until completion, or only during the call with `FI_INJECT`).
    pub iov: IovList,
    /// Destination.
    pub dest: FiAddr,
    /// Tag (`FI_TAGGED`).
    pub tag: u64,
    /// Remote CQ data (`FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// `FI_MSG` or `FI_TAGGED`, plus operation flags.
    pub flags: u64,
}

/// `struct fi_rma_iov`: a range of a peer's registered memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmaIov {
    /// Virtual address with `FI_MR_VIRT_ADDR`, else an offset into the region.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// The region's key.
    pub key: u64,
}

/// Up to `IOV_LIMIT` remote ranges; copying one never allocates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmaIovList {
    segs: [RmaIov; IOV_LIMIT],
    n: u8,
}

impl RmaIovList {
    /// The list of `segs`, or `None` past `IOV_LIMIT`.
    pub fn from_segs(segs: &[RmaIov]) -> Option<Self> {
        if segs.len() > IOV_LIMIT {
            return None;
        }
        let mut l = RmaIovList::default();
        l.segs[..segs.len()].copy_from_slice(segs);
        l.n = segs.len() as u8;
        Some(l)
    }

    /// The ranges.
    pub fn segs(&self) -> &[RmaIov] {
        &self.segs[..self.n as usize]
    }

    /// Total length.
    pub fn total(&self) -> usize {
        // Saturating: lengths can come from a peer, and a sum that wrapped must not pass a check.
        self.segs()
            .iter()
            .fold(0usize, |a, s| a.saturating_add(s.len))
    }
}

/// One RMA operation, reduced from whichever call posted it.
#[derive(Clone, Copy, Debug)]
pub struct RmaOp {
    /// Completion context.
    pub ctx: Context,
    /// Local memory: the source of a write, the destination of a read.
    pub iov: IovList,
    /// The peer.
    pub dest: FiAddr,
    /// The peer's memory.
    pub rma: RmaIovList,
    /// Remote CQ data (`FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// `FI_RMA | FI_READ` or `FI_RMA | FI_WRITE`, plus operation flags.
    pub flags: u64,
}

/// One atomic request, reduced from whichever call posted it.
#[derive(Clone, Copy, Debug)]
pub struct AtomicReq {
    /// Completion context.
    pub ctx: Context,
    /// The peer.
    pub dest: FiAddr,
    /// Target address (virtual, or offset) and key.
    pub addr: u64,
    /// The region's key.
    pub key: u64,
    /// Element type.
    pub dt: Datatype,
    /// Operation.
    pub op: AtomicOp,
    /// Elements.
    pub count: usize,
    /// Operand values (`count` elements; absent for `FI_ATOMIC_READ`).
    pub operand: usize,
    /// Compare values for compare atomics, else 0.
    pub compare: usize,
    /// Where the original target values go for fetch and compare atomics, else 0.
    pub result: usize,
    /// `FI_ATOMIC | FI_WRITE` (plain) or `FI_ATOMIC | FI_READ` (fetch, compare), plus
    /// operation flags.
    pub flags: u64,
}

impl AtomicReq {
    /// Bytes of operand (and of compare and result values).
    pub fn bytes(&self) -> usize {
        self.count * self.dt.size()
    }

    /// The result, operand and compare buffers, in that order; an absent one (no result, no
    /// operand for `FI_ATOMIC_READ`, no compare) is empty. A staged request's bounce holds
    /// them in this order, so that landing its first bytes lands exactly the fetched values.
    pub(crate) fn buffers(&self) -> [RawIov; 3] {
        let n = self.bytes();
        let buf = |addr: usize, present: bool| RawIov {
            addr,
            len: if present { n } else { 0 },
        };
        [
            buf(self.result, self.result != 0),
            buf(self.operand, self.op != AtomicOp::Read),
            buf(self.compare, self.compare != 0),
        ]
    }

    /// This request posted as `ctx` with its buffers in the bounce at `base` (laid out as
    /// `buffers` says).
    pub(crate) fn in_bounce(&self, ctx: Context, base: usize) -> AtomicReq {
        let [result, operand, compare] = self.buffers();
        let mut at = base;
        let mut place = |b: RawIov, unstaged: usize| {
            if b.len == 0 {
                return unstaged;
            }
            at += b.len;
            at - b.len
        };
        AtomicReq {
            ctx,
            result: place(result, self.result),
            operand: place(operand, self.operand),
            compare: place(compare, self.compare),
            ..*self
        }
    }
}
