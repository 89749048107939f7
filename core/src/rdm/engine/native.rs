//! RMA and atomics the transport's NIC carries out itself (`transport::Native`): the engine
//! decides, per operation, whether one goes to the NIC or through frames, keeps it as an
//! outstanding request like any other (so `FI_FENCE`, `tx_max` and a lost peer treat both
//! alike), and completes it when the transport reports it.
//!
//! Ordering. A native operation is executed by the peer's NIC when it arrives, a framed one
//! by the peer's engine when it takes the frame in, which may be later (a full unexpected
//! buffer holds a peer's frames back). So an operation goes native only when nothing framed
//! toward that peer is outstanding or queued: then everything before it has been executed
//! already, or is native too and ordered by the NIC. The other way round (native, then
//! framed) the transport keeps the order: it posts both on one ordered channel and the NIC
//! places a write before it delivers what follows it (a transport whose channel does not
//! order reads before later requests fences them there).

use super::*;
use crate::atomic::{AtomicOp, Datatype};
use crate::rdm::transport::{Native, NativeKind};

impl Engine {
    /// The next operation for the transport's NIC, if any (see [`Native`]).
    pub fn poll_native(&mut self) -> Option<Native> {
        self.natives.pop_front()
    }

    /// The transport's NIC finished operation `token` (`status` 0, or the errno it failed
    /// with). A stale token (its peer lost since, the engine closed) changes nothing.
    pub fn on_native(&mut self, token: u64, status: i32) {
        let id = (token & 0xffff_ffff) as usize;
        let gen = (token >> 32) as u32;
        let Some(t) = self
            .tx
            .get_mut(id)
            .filter(|t| t.gen == gen && t.native && t.answer.is_none())
        else {
            return;
        };
        t.answer = Some(peer_status(status));
        t.peer_answered = true;
        self.maybe_complete(id);
    }

    /// A peer's NIC wrote `len` bytes into our memory and told us (remote CQ data, or none):
    /// reported as a write the engine executed would be.
    pub fn on_native_write(&mut self, len: usize, data: Option<u64>) {
        self.done.push(Done::Remote {
            flags: FI_RMA | FI_WRITE,
            len,
            data,
        });
    }

    /// Whether `peer` may get a native operation now: nothing framed toward it is
    /// outstanding or waiting to be sent (see the module's ordering note).
    fn native_ready(&self, peer: PeerId) -> bool {
        let Some(ps) = self.peers.get(peer) else {
            return self.out.iter().all(|t| t.peer != peer);
        };
        ps.outstanding == ps.natives
            && ps.blocked.is_empty()
            && ps.fenced.is_empty()
            && self.out.iter().all(|t| t.peer != peer)
    }

    /// Hands `n` to the transport's NIC if it takes it; true: the operation is under way.
    fn go_native(&mut self, n: Native, ctx: Context) -> bool {
        let Some(t) = &self.one_sided else {
            return false;
        };
        if !self.native_ready(n.peer) || !t.native(n.peer, &n) {
            return false;
        }
        let (id, gen) = self.new_tx(TxReq {
            native: true,
            ..TxReq::new(ctx, n.flags, n.peer, n.local)
        });
        self.peer(n.peer).natives += 1;
        self.natives.push_back(Native {
            token: token(id, gen),
            ..n
        });
        true
    }

    /// An RMA read or write through the NIC, where it can be: one remote range of the
    /// local length, no commit to persistent memory (the target's engine makes that durable).
    pub(super) fn native_rma(&mut self, peer: PeerId, op: &RmaOp) -> bool {
        if self.one_sided.is_none() {
            return false;
        }
        let [seg] = op.rma.segs() else {
            return false;
        };
        if seg.len != op.iov.total() || op.flags & FI_COMMIT_COMPLETE != 0 {
            return false;
        }
        if self.core.caps & FI_RMA_PMEM != 0 {
            return false;
        }
        let kind = if op.flags & FI_READ != 0 {
            NativeKind::Read
        } else {
            NativeKind::Write {
                data: (op.flags & FI_REMOTE_CQ_DATA != 0).then_some(op.data),
            }
        };
        let n = Native {
            peer,
            token: 0,
            kind,
            local: op.iov,
            addr: seg.addr,
            key: seg.key,
            len: seg.len,
            flags: op.flags,
        };
        self.go_native(n, op.ctx)
    }

    /// An atomic through the NIC, where it is one the NIC has: one 64-bit integer, added
    /// (`FI_SUM`), read (an add of 0) or compared and swapped (`FI_CSWAP`).
    ///
    /// # Safety
    /// As `post_atomic`: operand and compare are readable during the call.
    pub(super) unsafe fn native_atomic(&mut self, peer: PeerId, req: &AtomicReq) -> bool {
        // What persistent memory needs (a commit, or the record of what changed for the next
        // one) is the target engine's, as for a write.
        if self.one_sided.is_none()
            || req.count != 1
            || req.flags & FI_COMMIT_COMPLETE != 0
            || self.core.caps & FI_RMA_PMEM != 0
        {
            return false;
        }
        if !matches!(req.dt, Datatype::UInt64 | Datatype::Int64) {
            return false;
        }
        // SAFETY: the caller's contract: `count` (1) elements of 8 bytes, readable now.
        let word = |p: usize| unsafe { (p as *const u64).read_unaligned() };
        let kind = match req.op {
            AtomicOp::Sum if req.operand != 0 => NativeKind::FetchAdd {
                add: word(req.operand),
            },
            AtomicOp::Read => NativeKind::FetchAdd { add: 0 },
            AtomicOp::Cswap if req.operand != 0 && req.compare != 0 => NativeKind::CompareSwap {
                compare: word(req.compare),
                swap: word(req.operand),
            },
            _ => return false,
        };
        let local = if req.result != 0 {
            IovList::one(req.result, 8)
        } else {
            IovList::default()
        };
        let n = Native {
            peer,
            token: 0,
            kind,
            local,
            addr: req.addr,
            key: req.key,
            len: 8,
            flags: req.flags,
        };
        self.go_native(n, req.ctx)
    }
}
