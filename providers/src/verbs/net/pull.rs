//! Large messages read by the receiver's NIC: the engine's one-sided pulls (`OneSided`,
//! `CopyReq`) over RDMA. A sender offering a message registers its memory for remote reads
//! (`Offers::describe`: one registration per segment, its rkey in the descriptor) and
//! deregisters it when the engine says the offer ended (`Offers::ended`); the receiver's
//! connection reads it into the receive's buffer with `IBV_WR_RDMA_READ` (one work request per
//! piece where the two sides' segments overlap) and reports the copy once every piece is in.
//! The same path serves an RMA write the target pulls (a read) and an RMA read it pushes (an
//! `IBV_WR_RDMA_WRITE` into the initiator's offered buffer).
//!
//! A descriptor from a peer is untrusted: its segments are parsed with checked arithmetic,
//! and the peer's NIC checks the rkeys and ranges; a refusal fails that message at both ends.

use std::sync::Mutex;

use xfabric_core::consts::errno::*;
use xfabric_core::rdm::{Copied, CopyReq, Desc, Dir};
use xfabric_core::rxq::{IovList, IOV_LIMIT};

use super::native::{Inflight, Posted, NATIVE_BIT, NATIVE_MAX};
use super::*;

/// Bytes a descriptor gives one segment: address, length, rkey, 4 spare.
const SEG: usize = 24;
/// Largest piece one work request moves, where a copy's pieces allow (`piece_for`): a read
/// of several MiB answered in one burst overflows a Soft-RoCE path (veth's backlog drops
/// the responses, and rxe's requester then stalls without an error: the copy never ended).
pub const PIECE: u64 = 256 << 10;

/// The piece size for a copy of `len` bytes: `PIECE`, or larger where `NATIVE_MAX` pieces
/// of it would not cover `len`.
fn piece_for(len: usize) -> u64 {
    (len as u64).div_ceil(NATIVE_MAX as u64).max(PIECE)
}

/// The registrations of this endpoint's live offers, by segment: one per segment however
/// many offers name it at once (their descriptors carry the same rkey), with the count of
/// those offers.
pub struct Offers {
    /// `None` only in tests without a device: nothing is offered.
    nic: Option<Arc<Nic>>,
    regs: Mutex<HashMap<(usize, usize), (Mr, usize)>>,
}

impl Offers {
    pub fn new(nic: &Arc<Nic>) -> Offers {
        Offers {
            nic: Some(nic.clone()),
            regs: Mutex::default(),
        }
    }

    /// Offers without a device (tests of the decisions around them).
    #[cfg(test)]
    pub fn detached() -> Offers {
        Offers {
            nic: None,
            regs: Mutex::default(),
        }
    }

    /// Registers `iov` for the peer's NIC to read (and, for an RMA read's destination, to
    /// write) and describes it; `None`: the NIC would not register it.
    pub fn describe(&self, iov: &IovList) -> Option<Desc> {
        let nic = self.nic.as_ref()?;
        let mut d = Desc::default();
        let mut made = Vec::new();
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        for s in iov.segs() {
            let at = (s.addr, s.len);
            let rkey = match regs.get_mut(&at) {
                Some((mr, n)) => {
                    *n += 1;
                    mr.rkey()
                }
                None => {
                    let writable = sys::IBV_ACCESS_LOCAL_WRITE
                        | sys::IBV_ACCESS_REMOTE_READ
                        | sys::IBV_ACCESS_REMOTE_WRITE;
                    let addr = s.addr as *mut u8;
                    // SAFETY: the engine keeps an offered buffer valid until the offer ends
                    // (`ended`), and the last offer of it ending drops the registration.
                    let mr = unsafe { Mr::new(nic, addr, s.len, writable) }.or_else(|_| {
                        // A read-only send buffer: readable remotely is enough.
                        // SAFETY: as above.
                        unsafe { Mr::new(nic, addr, s.len, sys::IBV_ACCESS_REMOTE_READ) }
                    });
                    let Ok(mr) = mr else {
                        // What this offer took goes with it.
                        release(&mut regs, &made);
                        return None;
                    };
                    let k = mr.rkey();
                    regs.insert(at, (mr, 1));
                    k
                }
            };
            d.push(&(s.addr as u64).to_le_bytes());
            d.push(&(s.len as u64).to_le_bytes());
            d.push(&rkey.to_le_bytes());
            d.push(&[0; 4]);
            made.push(at);
        }
        Some(d)
    }

    /// The offer of `iov` ended: its segments' registrations go with their last offer.
    pub fn ended(&self, iov: &IovList) {
        let segs: Vec<(usize, usize)> = iov.segs().iter().map(|s| (s.addr, s.len)).collect();
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        release(&mut regs, &segs);
    }
}

/// One offer fewer of each of `segs`; a registration no offer names any more is dropped.
fn release(regs: &mut HashMap<(usize, usize), (Mr, usize)>, segs: &[(usize, usize)]) {
    for at in segs {
        if let Some((_, n)) = regs.get_mut(at) {
            *n -= 1;
            if *n == 0 {
                regs.remove(at);
            }
        }
    }
}

/// A peer's descriptor: (address, length, rkey) per segment, checked.
pub fn parse_desc(d: &Desc) -> Option<Vec<(u64, u64, u32)>> {
    let b = d.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(SEG) || b.len() / SEG > IOV_LIMIT {
        return None;
    }
    let u64_at = |c: &[u8], o: usize| u64::from_le_bytes(c[o..o + 8].try_into().expect("8"));
    let segs: Vec<(u64, u64, u32)> = b
        .chunks_exact(SEG)
        .map(|c| {
            let rkey = u32::from_le_bytes(c[16..20].try_into().expect("4"));
            (u64_at(c, 0), u64_at(c, 8), rkey)
        })
        .collect();
    // No segment may wrap the address space.
    if segs.iter().any(|&(a, l, _)| a.checked_add(l).is_none()) {
        return None;
    }
    Some(segs)
}

/// One work request of a copy: local address, remote address, rkey, length, and which local
/// segment it lies in.
type Piece = (u64, u64, u32, u64, usize);

/// The pieces moving the first `len` bytes between `local` and the remote segments, where
/// they overlap; `None` when either side is shorter than `len`.
pub fn pieces(local: &IovList, remote: &[(u64, u64, u32)], len: usize) -> Option<Vec<Piece>> {
    let mut out = Vec::new();
    let (mut li, mut lo, mut ri, mut ro) = (0usize, 0u64, 0usize, 0u64);
    let mut left = len as u64;
    let ls = local.segs();
    let most = piece_for(len);
    while left > 0 {
        let l = ls.get(li)?;
        let &(ra, rl, rk) = remote.get(ri)?;
        let lrem = l.len as u64 - lo;
        let rrem = rl - ro;
        if lrem == 0 {
            (li, lo) = (li + 1, 0);
            continue;
        }
        if rrem == 0 {
            (ri, ro) = (ri + 1, 0);
            continue;
        }
        let n = lrem.min(rrem).min(left).min(most);
        out.push((l.addr as u64 + lo, ra + ro, rk, n, li));
        lo += n;
        ro += n;
        left -= n;
    }
    Some(out)
}

/// A copy under way on a connection: pieces left, the first failure, and registrations of
/// local memory made for it.
pub(super) struct CopyState {
    link: usize,
    left: usize,
    status: i32,
    _mrs: Vec<Mr>,
}

impl Net {
    /// Queues a copy the engine asks for, in order with what goes to its peer.
    pub fn copy(&mut self, c: CopyReq) {
        let Some(p) = self.peers.get_mut(c.peer) else {
            self.copy_failed.push((c.token, FI_ECONNRESET));
            return;
        };
        tracing::debug!(peer = c.peer, token = c.token, len = c.len, tx = ?p.tx, "verbs: copy queued");
        p.out.push_back(Out::Copy(c));
        self.connect_if_idle(c.peer);
    }

    /// Reports copies that ended with their connection, or could not start.
    pub fn report_copies<H: Handler>(&mut self, h: &mut H) {
        for (token, errno) in std::mem::take(&mut self.copy_failed) {
            h.on_copied(token, Copied::Failed(errno));
        }
    }

    /// Ends, with `errno`, the copies under way on connection `id` (it is gone).
    pub(super) fn end_link_copies(&mut self, id: usize, errno: i32) {
        let gone: Vec<u64> = self
            .copies
            .iter()
            .filter(|(_, s)| s.link == id)
            .map(|(t, _)| *t)
            .collect();
        for t in gone {
            let s = self.copies.remove(&t).expect("listed");
            let e = if s.status != 0 { s.status } else { errno };
            self.copy_failed.push((t, e));
        }
    }

    /// Posts copy `c` on connection `id`, if it has room for all its pieces.
    pub(super) fn post_copy(&mut self, id: usize, c: &CopyReq) -> Posted {
        let Some(remote) = parse_desc(&c.remote) else {
            return Posted::Failed(libc::EPROTO);
        };
        let Some(pieces) = pieces(&c.local, &remote, c.len) else {
            return Posted::Failed(libc::EPROTO);
        };
        let l = self.links.get_mut(&id).expect("the caller's connection");
        if pieces.len() > NATIVE_MAX {
            return Posted::Failed(FI_EMSGSIZE);
        }
        if l.natives.len() + pieces.len() > NATIVE_MAX {
            return Posted::NoRoom;
        }
        // Local memory: registered with the NIC already, or registered for this copy.
        let mut mrs = Vec::new();
        let mut lkeys = Vec::new();
        for s in c.local.segs() {
            if let Some(k) = self.shared.reg.lkey(s.addr, s.len) {
                lkeys.push(k);
                continue;
            }
            // SAFETY: the engine keeps a copy's local memory valid until on_copied; the
            // registration lives in the copy's state until then.
            let access = sys::IBV_ACCESS_LOCAL_WRITE;
            match unsafe { Mr::new(&self.nic, s.addr as *mut u8, s.len, access) } {
                Ok(mr) => {
                    lkeys.push(mr.lkey());
                    mrs.push(mr);
                }
                Err(_) => return Posted::Failed(FI_EFAULT),
            }
        }
        let (opcode, read) = match c.dir {
            Dir::Read => (sys::IBV_WR_RDMA_READ, true),
            Dir::Write => (sys::IBV_WR_RDMA_WRITE, false),
        };
        let mut posted = 0;
        let mut broken = None;
        for &(laddr, raddr, rkey, n, li) in &pieces {
            let mut sge = sys::ibv_sge {
                addr: laddr,
                length: n as u32,
                lkey: lkeys[li],
            };
            let seq = l.next_native & !(NATIVE_BIT as u32);
            l.next_native = l.next_native.wrapping_add(1);
            let mut wr = sys::ibv_send_wr {
                wr_id: wr_id(id, NATIVE_BIT | seq as usize),
                sg_list: &mut sge,
                num_sge: 1,
                opcode,
                send_flags: sys::IBV_SEND_SIGNALED | native::fence(l),
                ..Default::default()
            };
            wr.set_rdma(raddr, rkey);
            tracing::trace!(
                link = id,
                qpn = l.qp.num(),
                laddr,
                raddr,
                rkey,
                n,
                read,
                "verbs: copy piece posted"
            );
            // SAFETY: the local range is registered and valid until on_copied; the remote one
            // is the peer's NIC's to check.
            if let Err(e) = unsafe { l.qp.post_send(&mut wr) } {
                broken = Some(e);
                break;
            }
            if read {
                l.reads_out += 1;
            }
            l.natives.insert(seq, Inflight::copy(c.token, read));
            posted += 1;
        }
        if posted > 0 {
            self.copies.insert(
                c.token,
                CopyState {
                    link: id,
                    left: posted,
                    status: 0,
                    _mrs: mrs,
                },
            );
        }
        match broken {
            // Its pieces posted so far end with the connection (`end_link_copies`).
            Some(e) if posted > 0 => Posted::Broken(e),
            Some(e) => {
                self.copy_failed.push((c.token, FI_EIO));
                Posted::Broken(e)
            }
            None => Posted::Yes,
        }
    }

    /// A piece of copy `token` completed (`errno` 0, or how it failed): reported once every
    /// piece is.
    pub(super) fn piece_done<H: Handler>(&mut self, token: u64, errno: i32, h: &mut H) {
        let Some(s) = self.copies.get_mut(&token) else {
            return;
        };
        s.left -= 1;
        tracing::trace!(token, errno, left = s.left, "verbs: copy piece done");
        if s.status == 0 {
            s.status = errno;
        }
        if s.left == 0 {
            let s = self.copies.remove(&token).expect("present");
            let how = match s.status {
                0 => {
                    super::super::PULLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Copied::Done
                }
                e => Copied::Failed(e),
            };
            h.on_copied(token, how);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfabric_core::rxq::RawIov;

    fn desc(segs: &[(u64, u64, u32)]) -> Desc {
        let mut d = Desc::default();
        for &(a, l, k) in segs {
            d.push(&a.to_le_bytes());
            d.push(&l.to_le_bytes());
            d.push(&k.to_le_bytes());
            d.push(&[0; 4]);
        }
        d
    }

    #[test]
    fn descriptors_parse_and_garbage_is_refused() {
        let segs = [(0x1000, 64, 7), (0x9000, 10, 8)];
        assert_eq!(parse_desc(&desc(&segs)), Some(segs.to_vec()));
        assert_eq!(parse_desc(&Desc::default()), None);
        assert_eq!(parse_desc(&Desc::new(&[0; SEG + 1]).unwrap()), None);
        assert_eq!(parse_desc(&desc(&[(u64::MAX - 4, 8, 1)])), None, "wraps");
        let many = vec![(0u64, 1u64, 1u32); IOV_LIMIT + 1];
        assert_eq!(parse_desc(&desc(&many)), None);
    }

    #[test]
    fn pieces_cover_the_overlaps() {
        let (a, b) = (vec![0u8; 100], vec![0u8; 50]);
        let local = IovList::from_segs([RawIov::of(&a), RawIov::of(&b)]).unwrap();
        let (la, lb) = (a.as_ptr() as u64, b.as_ptr() as u64);
        let remote = [(0x1000, 60, 1), (0x2000, 90, 2)];
        let p = pieces(&local, &remote, 150).unwrap();
        assert_eq!(
            p,
            vec![
                (la, 0x1000, 1, 60, 0),
                (la + 60, 0x2000, 2, 40, 0),
                (lb, 0x2000 + 40, 2, 50, 1),
            ]
        );
        // Only the first bytes asked for; either side too short: none.
        assert_eq!(
            pieces(&local, &remote, 10).unwrap(),
            vec![(la, 0x1000, 1, 10, 0)]
        );
        assert_eq!(pieces(&local, &remote, 151), None);
        assert_eq!(pieces(&local, &[(0x1000, 20, 1)], 30), None);
        assert_eq!(pieces(&local, &remote, 0).unwrap(), vec![]);
    }
}
