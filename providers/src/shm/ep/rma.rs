//! One-sided operations over the rings. The target checks every access against its domain's
//! memory-region keys (`MrMap::check`: key, range, access) before touching memory, so a bad
//! key or range fails at the initiator with `FI_EACCES` and leaves the target untouched.
//!
//! - write: small data rides inline (`RMA_WRITE`); large data stays with the initiator and the
//!   target pulls it exactly like a large message (`flag::RNDV`: cross-memory attach, split
//!   copy, or fragments), into the checked ranges instead of a posted receive.
//! - read: the target pushes the data into the initiator's buffer with cross-memory attach, or
//!   where that is refused sends it back in `RDATA` chunks; an ACK ends it.
//! - `FI_COMMIT_COMPLETE`: the target makes the range durable (`msync`) before it ACKs; a
//!   zero-length write with commit flushes everything the peer wrote before.
//! - `FI_FENCE`: the operation waits at the initiator until the peer has completed every
//!   earlier operation from this endpoint.
//! - Regions registered as device memory (core's `hmem_stage` does the copies): a write lands
//!   through a synchronous copy (a large one through a host buffer, `EpCore::land_remote`); a
//!   read is served from a host copy taken when it arrives (kept until a split read's RDONE,
//!   since the initiator pulls from it); an atomic updates a host copy under core's `target::ATOMIC_LOCK` and
//!   copies it back before answering. A failed device copy answers `FI_EIO`.

use super::*;
use xfabric_core::ep::INJECT_CALL;
use xfabric_core::ep_rma::{RmaIov, RmaIovList, RmaOp};
use xfabric_core::hmem_stage;
use xfabric_core::rdm::target::{self, Resolved};

/// An operation held back by `FI_FENCE` (or queued behind one, to keep order), with a copy
/// of inject data: the caller's buffer is only valid during the call, so the copy is what the
/// operation's iov points at until it is posted.
#[allow(dead_code)] // the copies are held, never read by name
pub(super) enum Fenced {
    Send(TxOp, Option<Vec<u8>>),
    Rma(RmaOp, Option<Vec<u8>>),
}

fn put_rma(pl: &mut Vec<u8>, segs: &[RmaIov]) {
    pl.extend_from_slice(&(segs.len() as u32).to_le_bytes());
    pl.extend_from_slice(&0u32.to_le_bytes());
    for s in segs {
        pl.extend_from_slice(&s.addr.to_le_bytes());
        pl.extend_from_slice(&(s.len as u64).to_le_bytes());
        pl.extend_from_slice(&s.key.to_le_bytes());
    }
}

fn put_local(pl: &mut Vec<u8>, iov: &IovList) {
    pl.extend_from_slice(&(std::process::id() as i32).to_le_bytes());
    pl.extend_from_slice(&(iov.segs().len() as u32).to_le_bytes());
    for s in iov.segs() {
        pl.extend_from_slice(&(s.addr as u64).to_le_bytes());
        pl.extend_from_slice(&(s.len as u64).to_le_bytes());
    }
}

fn u64_at(pl: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(pl.get(o..o + 8)?.try_into().ok()?))
}

fn u32_at(pl: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(pl.get(o..o + 4)?.try_into().ok()?))
}

/// Remote ranges from a request; returns them and the bytes consumed.
fn get_rma(pl: &[u8]) -> Option<(RmaIovList, usize)> {
    let n = u32_at(pl, 0)? as usize;
    if n > xfabric_core::rxq::IOV_LIMIT {
        return None;
    }
    let mut segs = [RmaIov::default(); xfabric_core::rxq::IOV_LIMIT];
    for (i, s) in segs.iter_mut().enumerate().take(n) {
        let o = 8 + 24 * i;
        *s = RmaIov {
            addr: u64_at(pl, o)?,
            len: u64_at(pl, o + 8)? as usize,
            key: u64_at(pl, o + 16)?,
        };
    }
    Some((RmaIovList::from_segs(&segs[..n])?, 8 + 24 * n))
}

/// The initiator's pid and iov from a request.
fn get_local(pl: &[u8]) -> Option<(i32, Vec<RawIov>)> {
    let pid = u32_at(pl, 0)? as i32;
    let n = u32_at(pl, 4)? as usize;
    if n > xfabric_core::rxq::IOV_LIMIT {
        return None;
    }
    let iov = (0..n)
        .map(|i| {
            Some(RawIov {
                addr: u64_at(pl, 8 + 16 * i)? as usize,
                len: u64_at(pl, 16 + 16 * i)? as usize,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((pid, iov))
}

pub(super) use xfabric_core::rdm::target::commit;

impl ShmEndpoint {
    /// The local ranges a request's remote ranges name (core's target-side check).
    fn resolve(&self, rma: &RmaIovList, access: u64) -> std::result::Result<Resolved, i32> {
        target::resolve(&self.core, rma, access)
    }

    /// Holds `op` back if it is fenced and earlier operations to its peer are outstanding.
    pub(super) fn fence(&self, st: &mut State, p: usize, f: Fenced) -> Option<Fenced> {
        let flags = match &f {
            Fenced::Send(op, _) => op.flags,
            Fenced::Rma(op, _) => op.flags,
        };
        if st.releasing {
            // release_fenced is posting the head of the queue: it goes now.
            return Some(f);
        }
        // Anything behind a held operation to the same peer queues too, so nothing overtakes.
        let waiting = st.fenced.iter().any(|(q, _)| *q == p);
        let blocked = waiting || (flags & FI_FENCE != 0 && st.tx.iter().any(|(_, t)| t.peer == p));
        if !blocked {
            return Some(f);
        }
        let f = match f {
            Fenced::Send(mut op, _) if op.flags & FI_INJECT != 0 => {
                // SAFETY: the caller's buffer is valid during this call.
                let mut copy = vec![0u8; op.iov.total()];
                unsafe { op.iov.copy_out(0, &mut copy) };
                op.iov = IovList::one(copy.as_ptr() as usize, copy.len());
                Fenced::Send(op, Some(copy))
            }
            Fenced::Rma(mut op, _) if op.flags & FI_INJECT != 0 => {
                let mut copy = vec![0u8; op.iov.total()];
                // SAFETY: as above.
                unsafe { op.iov.copy_out(0, &mut copy) };
                op.iov = IovList::one(copy.as_ptr() as usize, copy.len());
                Fenced::Rma(op, Some(copy))
            }
            f => f,
        };
        st.fenced.push_back((p, f));
        None
    }

    /// Posts held operations in order: a fenced one once its peer has nothing outstanding,
    /// the ones queued behind it right after it.
    pub(super) fn release_fenced(&self, st: &mut State) {
        while let Some((p, f)) = st.fenced.front() {
            let p = *p;
            let fenced = match f {
                Fenced::Send(op, _) => op.flags,
                Fenced::Rma(op, _) => op.flags,
            } & FI_FENCE
                != 0;
            if fenced && st.tx.iter().any(|(_, t)| t.peer == p) {
                return;
            }
            let (_, f) = st.fenced.pop_front().expect("front exists");
            st.releasing = true;
            let (ctx, flags, r) = match &f {
                Fenced::Send(op, _) => {
                    let mut op = *op;
                    op.flags &= !FI_FENCE;
                    (op.ctx, op.flags, self.post_send(st, &op))
                }
                Fenced::Rma(op, _) => {
                    let mut op = *op;
                    op.flags &= !FI_FENCE;
                    (op.ctx, op.flags, self.post_rma(st, &op))
                }
            };
            st.releasing = false;
            match r {
                Ok(()) => {}
                Err(Error::Again(_)) => {
                    st.fenced.push_front((p, f));
                    return;
                }
                Err(e) => st.done.push(Done::TxErr {
                    ctx,
                    flags,
                    err: e.errno(),
                }),
            }
        }
    }

    /// Initiator: sends an RMA read or write request.
    pub(super) fn post_rma(&self, st: &mut State, op: &RmaOp) -> Result<()> {
        let p = self.sendable_peer(st, op.dest, "rma")?;
        let Some(op) = self.fence(st, p, Fenced::Rma(*op, None)).map(|f| match f {
            Fenced::Rma(op, _) => op,
            Fenced::Send(..) => unreachable!("an RMA stays an RMA"),
        }) else {
            return Ok(());
        };
        let len = op.iov.total();
        let write = op.flags & FI_WRITE != 0;
        // The data of an FI_INJECT operation is copied now; an inject *call* also wants no
        // completion, so no ACK either.
        let inject = op.flags & FI_INJECT != 0;
        let silent = op.flags & INJECT_CALL != 0;
        let id = st.tx.insert(TxReq {
            ctx: op.ctx,
            flags: op.flags,
            iov: op.iov,
            len,
            peer: p,
            stream: None,
            status: 0,
        }) as u32;
        let mut pl = Vec::with_capacity(if write && len <= EAGER_MAX {
            len + 104
        } else {
            200
        });
        put_rma(&mut pl, op.rma.segs());
        let mut fl = if silent { 0 } else { flag::ACK_DELIVERY };
        if op.flags & FI_REMOTE_CQ_DATA != 0 {
            fl |= flag::CQ_DATA;
        }
        if op.flags & FI_COMMIT_COMPLETE != 0 {
            fl |= flag::COMMIT;
        }
        let one = write
            && op.rma.segs().len() == 1
            && len <= EAGER_MAX
            && op.flags & FI_COMMIT_COMPLETE == 0;
        let kind = if one {
            // The compact form: address in the header, key then data in the payload.
            let seg = op.rma.segs()[0];
            pl.clear();
            pl.extend_from_slice(&seg.key.to_le_bytes());
            let at = pl.len();
            pl.resize(at + len, 0);
            // SAFETY: the caller's contract keeps the iov readable during the call.
            unsafe { op.iov.copy_out(0, &mut pl[at..]) };
            kind::RMA_WRITE1
        } else if write {
            if len <= EAGER_MAX || inject {
                let at = pl.len();
                pl.resize(at + len, 0);
                // SAFETY: the caller's contract keeps the iov readable during the call.
                unsafe { op.iov.copy_out(0, &mut pl[at..]) };
            } else {
                fl |= flag::RNDV;
                put_local(&mut pl, &op.iov);
            }
            kind::RMA_WRITE
        } else {
            put_local(&mut pl, &op.iov);
            kind::RMA_READ
        };
        let h = Header {
            kind,
            flags: fl,
            len: pl.len() as u32,
            aux: id,
            tag: if one {
                op.rma.segs()[0].addr
            } else {
                len as u64
            },
            data: op.data,
        };
        self.post_request(st, p, id, &h, &pl, "rma")?;
        if silent {
            st.tx.remove(id as usize);
            st.done.push(Done::Tx {
                ctx: op.ctx,
                flags: op.flags,
            });
        }
        Ok(())
    }

    /// Target: an RMA write request from peer `p`.
    pub(super) fn handle_rma_write(&self, st: &mut State, p: usize, h: &Header, pl: &[u8]) {
        let acked = h.flags & flag::ACK_DELIVERY != 0;
        let data = (h.flags & flag::CQ_DATA != 0).then_some(h.data);
        let nack = |this: &Self, st: &mut State, e: i32| {
            if acked {
                this.ack(st, p, h.aux, e);
            }
        };
        let parsed = if h.kind == kind::RMA_WRITE1 {
            u64_at(pl, 0).and_then(|key| {
                let seg = RmaIov {
                    addr: h.tag,
                    len: pl.len() - 8,
                    key,
                };
                Some((RmaIovList::from_segs(&[seg])?, 8))
            })
        } else {
            get_rma(pl)
        };
        let Some((rma, off)) = parsed else {
            return nack(self, st, FI_EINVAL);
        };
        let total = if h.kind == kind::RMA_WRITE1 {
            rma.total()
        } else {
            h.tag as usize
        };
        if rma.total() != total {
            return nack(self, st, FI_EINVAL);
        }
        let (iov, device) = match self.resolve(&rma, FI_REMOTE_WRITE) {
            Ok(r) => r,
            Err(e) => return nack(self, st, e),
        };
        if device.is_some() && self.core.hmem().is_none() {
            return nack(self, st, FI_EOPNOTSUPP);
        }
        let commit_all = total == 0 && h.flags & flag::COMMIT != 0;
        if h.flags & flag::RNDV == 0 {
            let Some(bytes) = off.checked_add(total).and_then(|end| pl.get(off..end)) else {
                return nack(self, st, FI_EINVAL);
            };
            match (&device, self.core.hmem()) {
                // Device memory: a synchronous copy, so the device sees the data before the
                // ACK and the remote-write completion.
                // SAFETY: the ranges passed the key check: registered memory of its owner.
                (Some(segs), Some(hm)) => match unsafe { hmem_stage::scatter(hm, segs, bytes) } {
                    Ok(()) => {}
                    Err(_) => return nack(self, st, FI_EIO),
                },
                // SAFETY: the ranges passed the key check: registered, writable memory.
                _ => unsafe {
                    iov.copy_in(0, bytes);
                },
            }
            self.note_written(st, p, &iov);
            let status = if commit_all {
                self.commit_peer(st, p)
            } else if h.flags & flag::COMMIT != 0 {
                commit(&iov)
            } else {
                0
            };
            nack(self, st, status);
            st.done.push(Done::Remote {
                flags: FI_RMA | FI_WRITE,
                len: total,
                data,
            });
            return;
        }
        let Some((pid, local)) = get_local(&pl[off..]) else {
            return nack(self, st, FI_EINVAL);
        };
        self.note_written(st, p, &iov);
        // Device memory: the data lands in a host buffer and is copied in before the write
        // is reported (`EpCore::land_remote`).
        let (ctx, iov) = match device {
            Some(segs) => self.core.stage_remote(segs),
            None => (0, iov),
        };
        let slot = RecvSlot {
            ctx,
            iov,
            flags: FI_RMA | FI_REMOTE_WRITE,
            op_flags: if h.flags & flag::COMMIT != 0 {
                FI_COMMIT_COMPLETE
            } else {
                0
            },
        };
        let r = Rndv {
            peer: p,
            tx_id: h.aux,
            len: total,
            pid,
            iov: local,
        };
        let src = self.src_of(st, p);
        self.start_rndv(st, slot, r, 0, data, src);
    }

    /// Target: an RMA read request from peer `p`.
    pub(super) fn handle_rma_read(&self, st: &mut State, p: usize, h: &Header, pl: &[u8]) {
        let total = h.tag as usize;
        let Some((rma, off)) = get_rma(pl) else {
            return self.ack(st, p, h.aux, FI_EINVAL);
        };
        let Some((pid, local)) = get_local(&pl[off..]) else {
            return self.ack(st, p, h.aux, FI_EINVAL);
        };
        if rma.total() != total {
            return self.ack(st, p, h.aux, FI_EINVAL);
        }
        let (iov, device) = match self.resolve(&rma, FI_REMOTE_READ) {
            Ok(r) => r,
            Err(e) => return self.ack(st, p, h.aux, e),
        };
        // Device memory: neither this process nor the initiator's process_vm_readv can read
        // it, so it is copied to a host buffer now (synchronously) and every path below reads
        // that copy instead. A split read's copy stays until the initiator's RDONE.
        let copy = match (device, self.core.hmem()) {
            (None, _) => None,
            (Some(_), None) => return self.ack(st, p, h.aux, FI_EOPNOTSUPP),
            // SAFETY: the ranges passed the key check: registered memory of its owner.
            (Some(segs), Some(hm)) => match unsafe { hmem_stage::gather(hm, &segs) } {
                Ok(c) => Some(c),
                Err(_) => return self.ack(st, p, h.aux, FI_EIO),
            },
        };
        let iov = copy
            .as_ref()
            .map_or(iov, |c| IovList::one(c.as_ptr() as usize, c.len()));
        let mut pushed = false;
        let _ = pid; // the request's claim; only the verified pid is used
        let cma_pid = st.peers[p]
            .cma_pid
            .filter(|_| self.cma.usable() && total > 0);
        if let Some(pid) = cma_pid.filter(|_| total >= self.split_min && self.cma.known_working()) {
            // Split: the initiator pulls the front from the checked ranges while we push the
            // back; both cores copy at once.
            let at = (total / 2) & !4095;
            let mut sp = Vec::with_capacity(8 + 16 * iov.segs().len());
            sp.extend_from_slice(&(at as u64).to_le_bytes());
            for s in iov.segs() {
                sp.extend_from_slice(&(s.addr as u64).to_le_bytes());
                sp.extend_from_slice(&(s.len as u64).to_le_bytes());
            }
            let hs = Header {
                kind: kind::RSPLIT,
                len: sp.len() as u32,
                aux: h.aux,
                ..Default::default()
            };
            self.send_ctrl(st, p, hs, &sp);
            // Until its RDONE, the initiator still reads our memory: its later requests wait,
            // and a host copy of device memory stays (moving the Vec keeps its buffer).
            st.peers[p].reads_out += 1;
            if let Some(c) = copy {
                st.peers[p].read_copies.push((h.aux, c));
            }
            let Some(local) = IovList::from_segs(local.iter().copied()) else {
                return self.ack(st, p, h.aux, FI_EINVAL);
            };
            let status = match cma::write(
                &self.cma,
                pid,
                &iov.slice(at, total - at),
                local.slice(at, total - at).segs(),
                total - at,
            ) {
                CmaResult::Done => 0,
                CmaResult::PeerGone => return,
                CmaResult::Refused => FI_EPERM,
                CmaResult::Failed(e) => e,
            };
            self.ack(st, p, h.aux, status);
            st.done.push(Done::Remote {
                flags: FI_RMA | FI_READ,
                len: total,
                data: None,
            });
            return;
        }
        if let Some(pid) = cma_pid {
            match cma::write(&self.cma, pid, &iov, &local, total) {
                CmaResult::Done => pushed = true,
                CmaResult::Refused => {}
                CmaResult::PeerGone => return,
                CmaResult::Failed(e) => return self.ack(st, p, h.aux, e),
            }
        }
        if !pushed {
            let mut buf = vec![0u8; FRAG.min(total)];
            let mut off = 0;
            while off < total {
                let n = FRAG.min(total - off);
                // SAFETY: the ranges passed the key check: registered, readable memory.
                unsafe { iov.copy_out(off, &mut buf[..n]) };
                let h = Header {
                    kind: kind::RDATA,
                    len: n as u32,
                    aux: h.aux,
                    tag: off as u64,
                    ..Default::default()
                };
                self.send_ctrl(st, p, h, &buf[..n]);
                off += n;
            }
        }
        self.ack(st, p, h.aux, 0);
        st.done.push(Done::Remote {
            flags: FI_RMA | FI_READ,
            len: total,
            data: None,
        });
    }

    /// Target: the initiator finished its part of split read `id`: its memory (or the host
    /// copy of device memory it read from) is free again.
    pub(super) fn read_done(&self, st: &mut State, p: usize, id: u32) {
        let peer = &mut st.peers[p];
        peer.reads_out = peer.reads_out.saturating_sub(1);
        if let Some(i) = peer.read_copies.iter().position(|(r, _)| *r == id) {
            peer.read_copies.swap_remove(i);
        }
    }

    /// Initiator: its part of a split read, bytes `0..at` copied from the target's ranges.
    pub(super) fn handle_rsplit(&self, st: &mut State, p: usize, h: &Header, pl: &[u8]) {
        let id = h.aux as usize;
        let Some(t) = st
            .tx
            .get(id)
            .filter(|t| t.peer == p && t.flags & FI_READ != 0)
        else {
            return;
        };
        let at = u64_at(pl, 0).unwrap_or(0) as usize;
        let segs: Option<Vec<RawIov>> = (0..(pl.len().saturating_sub(8) / 16)
            .min(xfabric_core::rxq::IOV_LIMIT))
            .map(|i| {
                Some(RawIov {
                    addr: u64_at(pl, 8 + 16 * i)? as usize,
                    len: u64_at(pl, 16 + 16 * i)? as usize,
                })
            })
            .collect();
        let status = match (segs, st.peers[p].cma_pid) {
            (Some(segs), Some(pid)) if at <= t.len => {
                match cma::read(&self.cma, pid, &t.iov.slice(0, at), &segs, at) {
                    CmaResult::Done => 0,
                    CmaResult::PeerGone => FI_ECONNRESET,
                    CmaResult::Refused => FI_EPERM,
                    CmaResult::Failed(e) => e,
                }
            }
            _ => FI_EINVAL,
        };
        st.tx[id].status = status;
        let h = Header {
            kind: kind::RDONE,
            aux: h.aux,
            ..Default::default()
        };
        self.send_ctrl(st, p, h, &[]);
    }

    /// Initiator: a chunk of read data.
    pub(super) fn handle_rdata(&self, st: &mut State, p: usize, h: &Header, bytes: &[u8]) {
        if let Some(t) = st
            .tx
            .get(h.aux as usize)
            .filter(|t| t.peer == p && t.flags & FI_READ != 0)
        {
            // SAFETY: a pending read's buffer is ours to write until it completes.
            unsafe { t.iov.copy_in(h.tag as usize, bytes) };
        }
    }

    /// Remembers ranges peer `p` wrote, for a later commit of everything (`FI_RMA_PMEM` only).
    fn note_written(&self, st: &mut State, p: usize, iov: &IovList) {
        if self.core.caps & FI_RMA_PMEM == 0 {
            return;
        }
        let dirty = &mut st.peers[p].dirty;
        dirty.extend(iov.segs().iter().map(|s| (s.addr, s.len)));
        if dirty.len() > 4096 {
            // Bound the list: make these durable now rather than remember them.
            self.commit_peer(st, p);
        }
    }

    /// Makes every range peer `p` wrote since its last commit durable.
    fn commit_peer(&self, st: &mut State, p: usize) -> i32 {
        let dirty = std::mem::take(&mut st.peers[p].dirty);
        let mut status = 0;
        for (addr, len) in dirty {
            let s = commit(&IovList::one(addr, len));
            if status == 0 {
                status = s;
            }
        }
        status
    }
}

impl Peer {
    /// The peer is gone: its split reads will never say they are done.
    pub(super) fn forget_reads(&mut self) {
        self.reads_out = 0;
        self.read_copies.clear();
    }
}

impl ShmEndpoint {
    /// Initiator: sends an atomic request.
    pub(super) fn post_atomic(&self, st: &mut State, req: &xfabric_core::AtomicReq) -> Result<()> {
        let p = self.sendable_peer(st, req.dest, "atomic")?;
        let queued = st.fenced.iter().any(|(q, _)| *q == p);
        if queued || (req.flags & FI_FENCE != 0 && st.tx.iter().any(|(_, t)| t.peer == p)) {
            // Atomics are small: a fenced one waits as Again until its peer is drained.
            return Err(Error::Again("atomic: fenced behind outstanding operations"));
        }
        let n = req.bytes();
        let inject = req.flags & INJECT_CALL != 0;
        let fetch = req.result != 0;
        let id = st.tx.insert(TxReq {
            ctx: req.ctx,
            flags: req.flags,
            iov: IovList::one(req.result, if fetch { n } else { 0 }),
            len: n,
            peer: p,
            stream: None,
            status: 0,
        }) as u32;
        let mut pl = Vec::with_capacity(16 + 2 * n);
        pl.extend_from_slice(&req.addr.to_le_bytes());
        pl.extend_from_slice(&req.key.to_le_bytes());
        let operand = req.op != xfabric_core::AtomicOp::Read;
        // SAFETY: the caller's contract keeps operand and compare readable during the call.
        unsafe {
            if operand {
                pl.extend_from_slice(std::slice::from_raw_parts(req.operand as *const u8, n));
            }
            if req.compare != 0 {
                pl.extend_from_slice(std::slice::from_raw_parts(req.compare as *const u8, n));
            }
        }
        let mut fl = if inject { 0 } else { flag::ACK_DELIVERY };
        if fetch {
            fl |= flag::FETCH;
        }
        let h = Header {
            kind: kind::ATOMIC,
            flags: fl,
            len: pl.len() as u32,
            aux: id,
            tag: req.op as u64 | (req.dt as u64) << 8 | (req.count as u64) << 16,
            data: 0,
        };
        self.post_request(st, p, id, &h, &pl, "atomic")?;
        if inject {
            st.tx.remove(id as usize);
            st.done.push(Done::Tx {
                ctx: req.ctx,
                flags: req.flags,
            });
        }
        Ok(())
    }

    /// Target: executes an atomic request from peer `p` (core's `target::atomic`) and
    /// answers with the original values (fetch, compare) or an ACK.
    pub(super) fn handle_atomic(&self, st: &mut State, p: usize, h: &Header, pl: &[u8]) {
        let acked = h.flags & flag::ACK_DELIVERY != 0;
        let reply = |this: &Self, st: &mut State, e: i32| {
            if acked {
                this.ack(st, p, h.aux, e);
            }
        };
        let (Some(addr), Some(key)) = (u64_at(pl, 0), u64_at(pl, 8)) else {
            return reply(self, st, FI_EINVAL);
        };
        let req = target::AtomicAt {
            op: (h.tag & 0xff) as i32,
            datatype: (h.tag >> 8 & 0xff) as i32,
            count: (h.tag >> 16) as usize,
            addr,
            key,
            fetch: h.flags & flag::FETCH != 0,
            args: &pl[16..],
        };
        let done = match target::atomic(&self.core, &req) {
            Ok(d) => d,
            Err(e) => return reply(self, st, e),
        };
        if req.fetch {
            let h = Header {
                kind: kind::ARESULT,
                len: done.len as u32,
                aux: h.aux,
                ..Default::default()
            };
            self.send_ctrl(st, p, h, &done.result);
        } else {
            reply(self, st, 0);
        }
        st.done.push(Done::Remote {
            flags: FI_ATOMIC | done.dir,
            len: done.len,
            data: None,
        });
    }

    /// Initiator: the original values of a fetch or compare atomic; completes it.
    pub(super) fn handle_aresult(&self, st: &mut State, p: usize, h: &Header, bytes: &[u8]) {
        let id = h.aux as usize;
        if !st
            .tx
            .get(id)
            .is_some_and(|t| t.peer == p && t.flags & FI_ATOMIC != 0)
        {
            return;
        }
        let t = st.tx.remove(id);
        // SAFETY: a pending fetch's result buffer is ours to write until it completes.
        unsafe { t.iov.copy_in(0, bytes) };
        st.done.push(Done::Tx {
            ctx: t.ctx,
            flags: t.flags,
        });
    }
}
