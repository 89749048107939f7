//! Large messages read by the receiver's NIC: the engine's one-sided pulls (`OneSided`,
//! `CopyReq`) over RDMA. A sender offering a message registers its memory for remote reads
//! (`Offers::describe`: one registration per segment and direction, its rkey in the
//! descriptor; a source is only readable remotely, an RMA read's destination only writable,
//! so a receiver's NIC cannot write into what it was offered to read) and
//! deregisters it when the engine says the offer ended (`Offers::ended`); the receiver's
//! connection reads it into the receive's buffer with `IBV_WR_RDMA_READ` (one work request per
//! piece of at most `pieces::PIECE` where the two sides' segments overlap, posted as the
//! connection's read depth allows: `pieces`) and reports the copy once every piece is in.
//! The same path serves an RMA write the target pulls (a read) and an RMA read it pushes (an
//! `IBV_WR_RDMA_WRITE` into the initiator's offered buffer).
//!
//! A descriptor from a peer is untrusted: its segments are parsed with checked arithmetic,
//! and the peer's NIC checks the rkeys and ranges; a refusal fails that message at both ends.

use std::sync::Mutex;

use xfabric_core::consts::errno::*;
use xfabric_core::rdm::{Copied, CopyReq, Desc, Dir};
use xfabric_core::rxq::{IovList, IOV_LIMIT};

use super::native::Posted;
use super::pieces::{Owner, Piece, Transfer, PIECE};
use super::*;

/// Bytes a descriptor gives one segment: address, length, rkey, 4 spare.
const SEG: usize = 24;
/// The registrations of this endpoint's live offers, by segment and the access the peer is
/// given (`Dir::Read`: it reads the segment): one per segment and direction however many
/// offers name it at once (their descriptors carry the same rkey), with the count of those
/// offers.
pub struct Offers {
    /// `None` only in tests without a device: nothing is offered.
    nic: Option<Arc<Nic>>,
    regs: Mutex<HashMap<Seg, (Mr, usize)>>,
}

/// An offered segment: address, length, and whether the peer writes it (`Dir::Write`).
type Seg = (usize, usize, bool);

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

    /// Registers `iov` for the peer's NIC to read (`Dir::Read`) or, an RMA read's
    /// destination, to write (`Dir::Write`), and not the other, and describes it; `None`:
    /// the NIC would not register it.
    pub fn describe(&self, iov: &IovList, dir: Dir) -> Option<Desc> {
        let nic = self.nic.as_ref()?;
        let mut d = Desc::default();
        let mut made = Vec::new();
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        for s in iov.segs() {
            let at = (s.addr, s.len, dir == Dir::Write);
            let rkey = match regs.get_mut(&at) {
                Some((mr, n)) => {
                    *n += 1;
                    mr.rkey()
                }
                None => {
                    // Remote write needs local write too (verbs' rule).
                    let access = match dir {
                        Dir::Read => sys::IBV_ACCESS_REMOTE_READ,
                        Dir::Write => sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE,
                    };
                    let addr = s.addr as *mut u8;
                    // SAFETY: the engine keeps an offered buffer valid until the offer ends
                    // (`ended`), and the last offer of it ending drops the registration.
                    let mr = unsafe { Mr::new(nic, addr, s.len, access) };
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

    /// The offer of `iov` made for `dir` ended: its segments' registrations go with their
    /// last offer.
    pub fn ended(&self, iov: &IovList, dir: Dir) {
        let w = dir == Dir::Write;
        let segs: Vec<Seg> = iov.segs().iter().map(|s| (s.addr, s.len, w)).collect();
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        release(&mut regs, &segs);
    }
}

/// One offer fewer of each of `segs`; a registration no offer names any more is dropped.
fn release(regs: &mut HashMap<Seg, (Mr, usize)>, segs: &[Seg]) {
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
type Span = (u64, u64, u32, u64, usize);

/// The pieces moving the first `len` bytes between `local` and the remote segments, where
/// they overlap; `None` when either side is shorter than `len`.
pub fn pieces(local: &IovList, remote: &[(u64, u64, u32)], len: usize) -> Option<Vec<Span>> {
    let mut out = Vec::new();
    let (mut li, mut lo, mut ri, mut ro) = (0usize, 0u64, 0usize, 0u64);
    let mut left = len as u64;
    let ls = local.segs();
    let most = PIECE;
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

impl Net {
    /// Queues a copy the engine asks for, in order with what goes to its peer.
    pub fn copy(&mut self, c: CopyReq) {
        // A peer lost and not yet reported takes nothing more (see `Transport::send`).
        let Some(p) = self.peers.get_mut(c.peer).filter(|p| p.losing == 0) else {
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

    /// Starts copy `c` on connection `id`: its pieces are posted as the connection's read
    /// depth allows (`pieces`).
    pub(super) fn post_copy<H: Handler>(&mut self, id: usize, c: &CopyReq, h: &mut H) -> Posted {
        let Some(remote) = parse_desc(&c.remote) else {
            return Posted::Failed(libc::EPROTO);
        };
        let Some(spans) = pieces(&c.local, &remote, c.len) else {
            return Posted::Failed(libc::EPROTO);
        };
        // Local memory: registered with the NIC already, or registered for this copy.
        let mut mrs = Vec::new();
        let mut lkeys = Vec::new();
        for s in c.local.segs() {
            if let Some(k) = self.shared.reg.lkey(s.addr, s.len) {
                lkeys.push(k);
                continue;
            }
            // SAFETY: the engine keeps a copy's local memory valid until on_copied; the
            // registration lives in the copy's transfer until then.
            let access = sys::IBV_ACCESS_LOCAL_WRITE;
            match unsafe { Mr::new(&self.nic, s.addr as *mut u8, s.len, access) } {
                Ok(mr) => {
                    lkeys.push(mr.lkey());
                    mrs.push(mr);
                }
                Err(_) => return Posted::Failed(FI_EFAULT),
            }
        }
        let pieces = spans
            .iter()
            .map(|&(laddr, raddr, rkey, n, li)| Piece {
                laddr,
                lkey: lkeys[li],
                raddr,
                rkey,
                // At most `PIECE`.
                len: n as u32,
            })
            .collect();
        let read = matches!(c.dir, Dir::Read);
        let t = Transfer::new(id, read, pieces, mrs);
        self.start_transfer(id, Owner::Copy(c.token), t, h)
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
