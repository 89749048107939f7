//! One-sided transfers too large for one work request: an application's RDMA read above
//! `PIECE` (`native`) and the engine's copies (`pull`) are cut into work requests of at most
//! `PIECE` bytes, posted as the connection's read depth allows, and reported once, when the
//! last piece completes.
//!
//! Why pieces: between two Soft-RoCE devices a whole 4 MiB read after a 1 MiB one never
//! completed (the responder's burst overflowed veth's backlog, rxe0 counted `send_err`, rxe1
//! `completer_retry_err`, then nothing); pieces of 256 KiB complete. Why a depth: the QP's
//! initiator depth (`ib::RD_ATOMIC`) bounds the reads and atomics outstanding on it, and
//! `READ_WINDOW` bounds the bytes of reads in flight, which is what a responder answers in one
//! burst; the pieces beyond either wait here, in order, and nothing else is posted on the
//! connection before them (a later write must not overtake a piece of an earlier read).
//!
//! Errors: the first piece to fail decides. A refused access (`FI_EACCES`, `FI_EINVAL`) ends
//! the transfer at once; the QP is then in the error state, the connection is dropped, and
//! the pieces still posted complete flushed against a transfer that is gone (ignored). Any
//! other failure is the connection's: the engine ends a native read with the peer's loss, a
//! copy ends with the connection (`end_link_transfers`). Never twice: a transfer is removed
//! from the table when it is reported.

use xfabric_core::rdm::Copied;

use super::native::{Inflight, Posted, NATIVE_BIT, NATIVE_MAX};
use super::*;

/// Largest piece one work request moves.
pub const PIECE: u64 = 256 << 10;
/// Most reads and atomics a connection has outstanding: the initiator depth its QP is
/// connected with.
pub const READ_DEPTH: usize = super::super::ib::RD_ATOMIC as usize;
/// Most bytes of reads a connection has in flight (a piece larger than this goes alone).
pub const READ_WINDOW: u64 = 4 * PIECE;

/// Whom a transfer reports to: the engine's native operation or its copy, by token (the two
/// kinds of token are counted apart, so they are kept apart here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Owner {
    Native(u64),
    Copy(u64),
}

/// One work request of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub laddr: u64,
    pub lkey: u32,
    pub raddr: u64,
    pub rkey: u32,
    pub len: u32,
}

/// A transfer under way on a connection.
pub(super) struct Transfer {
    link: usize,
    read: bool,
    pieces: Vec<Piece>,
    /// Pieces posted so far (`pieces[..next]`).
    next: usize,
    /// Of those, not completed yet.
    out: usize,
    /// The first failure's errno, 0 while none.
    status: i32,
    /// Registrations of local memory made for it, dropped with it.
    _mrs: Vec<Mr>,
}

impl Transfer {
    pub(super) fn new(link: usize, read: bool, pieces: Vec<Piece>, mrs: Vec<Mr>) -> Transfer {
        Transfer {
            link,
            read,
            pieces,
            next: 0,
            out: 0,
            status: 0,
            _mrs: mrs,
        }
    }

    fn posted_all(&self) -> bool {
        self.next == self.pieces.len()
    }
}

/// The pieces of a read of `len` bytes at `raddr` (`rkey`) into registered local memory at
/// `laddr` (`lkey`).
pub(super) fn split(laddr: u64, lkey: u32, raddr: u64, rkey: u32, len: u64) -> Vec<Piece> {
    let mut v = Vec::with_capacity(len.div_ceil(PIECE) as usize);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PIECE);
        v.push(Piece {
            laddr: laddr + off,
            lkey,
            raddr: raddr + off,
            rkey,
            len: n as u32,
        });
        off += n;
    }
    v
}

/// Whether a read of `len` bytes may be posted on `l` now: within its depth and, unless it
/// is the only one, its window.
pub(super) fn read_room(l: &Link, len: u64) -> bool {
    room(l.reads_out, l.read_bytes, len)
}

/// `read_room` for a connection with `out` reads and atomics outstanding, reading `bytes`.
fn room(out: usize, bytes: u64, len: u64) -> bool {
    out < READ_DEPTH && (out == 0 || bytes + len <= READ_WINDOW)
}

impl Net {
    /// Takes `t` on connection `id` for `owner` and posts what fits of it: nothing else goes
    /// on the connection before its last piece.
    pub(super) fn start_transfer<H: Handler>(
        &mut self,
        id: usize,
        owner: Owner,
        t: Transfer,
        h: &mut H,
    ) -> Posted {
        if t.pieces.is_empty() {
            // Nothing to move (a copy of zero bytes): done at once.
            self.transfers.insert(owner, t);
            self.piece_done(owner, 0, false, h);
            return Posted::Yes;
        }
        self.transfers.insert(owner, t);
        if let Some(l) = self.links.get_mut(&id) {
            l.posting = Some(owner);
        }
        self.post_pieces(id)
    }

    /// The copies with `tokens` post no more pieces (their region closed: `Wire::cut_region`)
    /// and end failed (`FI_EACCES`). Pieces already posted are the NIC's, and the peer paces
    /// them (a read's responses, a write's acknowledgements, each sent just inside the NIC's
    /// retry timeout): their connection is failed, its QP destroyed before this returns, so
    /// that nothing reads or writes the region once its close returned.
    pub(super) fn cut_transfers<H: Handler>(&mut self, tokens: &[u64], h: &mut H) {
        let mut idle = Vec::new();
        let mut busy = Vec::new();
        for (owner, t) in self.transfers.iter_mut() {
            if !matches!(owner, Owner::Copy(c) if tokens.contains(c)) {
                continue;
            }
            t.pieces.truncate(t.next);
            if t.status == 0 {
                t.status = libc::EACCES;
            }
            if let Some(l) = self.links.get_mut(&t.link) {
                if l.posting == Some(*owner) {
                    l.posting = None;
                }
            }
            if t.out == 0 {
                idle.push(*owner);
            } else {
                busy.push(t.link);
            }
        }
        for id in busy {
            self.fail_link(id, libc::ECANCELED, "a region closed under the NIC's copy");
        }
        for owner in idle {
            // Nothing of it is in flight: it ends now (`piece_done` counts no piece below 0).
            self.piece_done(owner, libc::EACCES, false, h);
        }
    }

    /// Posts the pieces of connection `id`'s unfinished transfer while its depth allows.
    /// `Yes`: all are posted (or there was none); `NoRoom`: some wait for completions.
    pub(super) fn post_pieces(&mut self, id: usize) -> Posted {
        let Some(l) = self.links.get_mut(&id) else {
            return Posted::Yes;
        };
        let Some(owner) = l.posting else {
            return Posted::Yes;
        };
        let Some(t) = self.transfers.get_mut(&owner) else {
            l.posting = None;
            return Posted::Yes;
        };
        while let Some(p) = t.pieces.get(t.next).copied() {
            if l.natives.len() >= NATIVE_MAX || (t.read && !read_room(l, u64::from(p.len))) {
                return Posted::NoRoom;
            }
            let mut sge = sys::ibv_sge {
                addr: p.laddr,
                length: p.len,
                lkey: p.lkey,
            };
            let seq = l.next_native & !(NATIVE_BIT as u32);
            let (opcode, flags) = if t.read {
                (sys::IBV_WR_RDMA_READ, native::read_fence(l))
            } else {
                (sys::IBV_WR_RDMA_WRITE, native::fence(l))
            };
            let mut wr = sys::ibv_send_wr {
                wr_id: wr_id(id, NATIVE_BIT | seq as usize),
                sg_list: &mut sge,
                num_sge: 1,
                opcode,
                send_flags: sys::IBV_SEND_SIGNALED | flags,
                ..Default::default()
            };
            wr.set_rdma(p.raddr, p.rkey);
            // SAFETY: the local range is registered and stays valid until the transfer is
            // reported (the engine's contract for a native operation's or a copy's memory;
            // registrations made for it live in it); the remote range is the peer's NIC's
            // to check.
            if let Err(e) = unsafe { l.qp.post_send(&mut wr) } {
                return Posted::Broken(e);
            }
            l.next_native = l.next_native.wrapping_add(1);
            if t.read {
                l.reads_out += 1;
                l.read_bytes += u64::from(p.len);
            }
            l.natives.insert(seq, Inflight::piece(owner, t.read, p.len));
            t.next += 1;
            t.out += 1;
            if matches!(owner, Owner::Native(_)) {
                super::super::stats::READ_PIECES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            tracing::trace!(
                link = id,
                ?owner,
                n = p.len,
                left = t.pieces.len() - t.next,
                "verbs: piece posted"
            );
        }
        l.posting = None;
        Posted::Yes
    }

    /// A piece of `owner`'s transfer completed (`errno` 0, or how it failed; `refused`: the
    /// peer's NIC refused the access): reported when every piece is, or at the first refusal.
    pub(super) fn piece_done<H: Handler>(
        &mut self,
        owner: Owner,
        errno: i32,
        refused: bool,
        h: &mut H,
    ) {
        let Some(t) = self.transfers.get_mut(&owner) else {
            return;
        };
        t.out = t.out.saturating_sub(1);
        if t.status == 0 {
            t.status = errno;
        }
        let ended =
            (refused && matches!(owner, Owner::Native(_))) || (t.out == 0 && t.posted_all());
        if !ended {
            return;
        }
        let t = self.transfers.remove(&owner).expect("present");
        if let Some(l) = self.links.get_mut(&t.link) {
            if l.posting == Some(owner) {
                l.posting = None;
            }
        }
        match owner {
            Owner::Copy(token) => {
                let how = match t.status {
                    0 => {
                        super::super::stats::PULLS
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Copied::Done
                    }
                    e => Copied::Failed(e),
                };
                h.on_copied(token, how);
            }
            Owner::Native(token) if t.status == 0 => {
                super::super::stats::NATIVE_DONE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                h.on_native(token, 0);
            }
            Owner::Native(token) if refused => {
                super::super::stats::NATIVE_REFUSED
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                h.on_native(token, t.status);
            }
            // Any other failure is the connection's: the engine ends the read with the
            // peer's loss (the caller drops the connection).
            Owner::Native(_) => {}
        }
    }

    /// Ends, with `errno`, the transfers on connection `id` (it is gone): copies are
    /// reported failed; native reads end with their peer's loss, which the engine reports.
    pub(super) fn end_link_transfers(&mut self, id: usize, errno: i32) {
        let gone: Vec<Owner> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.link == id)
            .map(|(o, _)| *o)
            .collect();
        for o in gone {
            let t = self.transfers.remove(&o).expect("listed");
            if let Owner::Copy(token) = o {
                let e = if t.status != 0 { t.status } else { errno };
                self.copy_failed.push((token, e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_flight_within_the_depth_and_the_window() {
        assert!(room(0, 0, PIECE), "one piece on an idle connection");
        assert!(room(0, 0, 2 * READ_WINDOW), "alone, whatever its size");
        assert!(room(3, 3 * PIECE, PIECE), "the window's last piece");
        assert!(!room(4, 4 * PIECE, PIECE), "past the window");
        assert!(room(5, 0, 8), "atomics take depth, not window");
        assert!(!room(READ_DEPTH, 0, 8), "past the depth");
    }

    #[test]
    fn reads_split_into_pieces_covering_the_range() {
        let p = split(0x1000, 1, 0x9000, 2, 2 * PIECE + 10);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].laddr, p[0].raddr, p[0].len),
            (0x1000, 0x9000, PIECE as u32)
        );
        assert_eq!(
            (p[1].laddr, p[1].raddr, p[1].len),
            (0x1000 + PIECE, 0x9000 + PIECE, PIECE as u32)
        );
        assert_eq!(
            (p[2].laddr, p[2].len, p[2].lkey, p[2].rkey),
            (0x1000 + 2 * PIECE, 10, 1, 2)
        );
        assert_eq!(split(0, 1, 0, 2, PIECE).len(), 1);
        assert!(split(0, 1, 0, 2, 0).is_empty());
        let total: u64 = split(0, 1, 0, 2, (4 << 20) + 1)
            .iter()
            .map(|p| u64::from(p.len))
            .sum();
        assert_eq!(total, (4 << 20) + 1);
    }
}
