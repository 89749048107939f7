//! The engine's side of one-sided copies (`transport::OneSided`): large messages the
//! receiver's transport pulls, RMA writes the target's transport pulls, RMA reads it pushes;
//! their fallback to frames where the transport refuses, and their end on loss or close.
//!
//! Ordering: while the transport copies for a peer's RMA request (or a served write waits
//! for its `Data`, or a read's answer still carries the memory read), that peer's next
//! requests wait (`Sink::Wait`), so that nothing it asks later sees memory before the write
//! landed, or changes it under a read.

use super::*;
use crate::rdm::transport::{Copied, CopyReq, Dir};

/// Set in the transfer id of a `Cts` / `Data` for a served write (not a receive), and in
/// the low word of a served copy's token.
pub const SERVE: u32 = 1 << 31;

/// A peer's RMA request this endpoint serves through its transport's copies.
pub(super) struct Serve {
    peer: PeerId,
    gen: u32,
    /// The transport has the copy (asked for or under way).
    copying: bool,
    /// The peer was lost or the endpoint closed while copying: drop it when it reports.
    ended: bool,
    op: ServeOp,
}

enum ServeOp {
    /// A write of `len` bytes into `dest` (the checked `segs`); where `dest` is device
    /// memory, copied into the bounce buffer of `staged` and landed from there.
    Write {
        id: u32,
        fl: u8,
        data: u64,
        segs: RmaIovList,
        dest: IovList,
        staged: Option<Context>,
    },
    /// A read of `local`.
    Read { id: u32, local: IovList },
}

fn split(token: u64) -> (usize, u32) {
    ((token & 0xffff_ffff) as usize, (token >> 32) as u32)
}

impl Engine {
    /// Whether the transport can be asked for a copy with `peer`.
    fn can_copy(&self, peer: PeerId) -> bool {
        self.one_sided.is_some() && !self.peers.get(peer).is_some_and(|ps| ps.pull_refused)
    }

    /// A descriptor of `iov` for `peer`'s transport to copy from or into, where the transport
    /// copies one-sidedly and `iov` is large enough to be worth it; empty otherwise.
    pub(super) fn offer(&self, peer: PeerId, iov: &IovList) -> Desc {
        match &self.one_sided {
            Some(t) if iov.total() >= t.pull_min() => t.describe(peer, iov).unwrap_or_default(),
            _ => Desc::default(),
        }
    }

    /// The memory this endpoint offered `peer` to copy from for its request `offer` (a
    /// `CopyReq::offer` the peer's transport names: a large message's data, a write's
    /// source), while that request is outstanding; `None` for anything else, a read's
    /// destination included (offered to be written, not read).
    pub fn offered(&self, peer: PeerId, offer: u32) -> Option<IovList> {
        self.tx
            .get(offer as usize)
            .filter(|t| t.peer == peer && t.pull && t.answer.is_none())
            .filter(|t| t.flags & (FI_RMA | FI_READ) != FI_RMA | FI_READ)
            .map(|t| t.iov)
    }

    /// Whether copies are still asked for or under way (a closing transport finishes them
    /// and reports them before it goes).
    pub fn copying(&self) -> bool {
        self.rx.iter().any(|(_, r)| r.copying) || self.served.iter().any(|(_, s)| s.copying)
    }

    /// Whether frames from `peer` that this endpoint asked for are awaited: answers to its
    /// requests, the data of a large message or of a served write. A transport that holds a
    /// peer's requests back (flow control) gives way further while they are, since such
    /// frames may come behind what it holds.
    pub fn awaits(&self, peer: PeerId) -> bool {
        self.peers.get(peer).is_some_and(|ps| ps.outstanding > 0)
            || self.rx.iter().any(|(_, r)| r.peer == peer && !r.copying)
            || self
                .served
                .iter()
                .any(|(_, s)| s.peer == peer && !s.copying)
    }

    /// Whether `peer`'s next requests wait for copies serving its earlier ones.
    pub(super) fn holding(&self, peer: PeerId) -> bool {
        !self.served.is_empty() && self.served.iter().any(|(_, s)| s.peer == peer)
    }

    /// Whether `peer`'s next request of `kind` waits: behind copies serving its earlier
    /// ones, and a write or atomic also behind the answers to its reads that still carry
    /// the memory read.
    pub(super) fn must_wait(&self, peer: PeerId, kind: wire::Kind) -> bool {
        if kind.is_answer() {
            return false;
        }
        self.holding(peer)
            || (matches!(kind, wire::Kind::Write | wire::Kind::Atomic)
                && self.peers.get(peer).is_some_and(|ps| ps.reading > 0))
    }

    fn serve(&mut self, peer: PeerId, op: ServeOp, copy: Option<(Dir, Desc, IovList, usize)>) {
        self.gen = self.gen.wrapping_add(1);
        let gen = self.gen;
        let offer = match op {
            ServeOp::Write { id, .. } | ServeOp::Read { id, .. } => id,
        };
        let i = self.served.insert(Serve {
            peer,
            gen,
            copying: copy.is_some(),
            ended: false,
            op,
        });
        match copy {
            Some((dir, remote, local, len)) => self.copies.push_back(CopyReq {
                peer,
                token: token(i | SERVE as usize, gen),
                dir,
                remote,
                local,
                len,
                offer,
                holds: true,
            }),
            None => self.ask_data(peer, i),
        }
    }

    /// Asks the initiator of served write `i` for its data through frames.
    fn ask_data(&mut self, peer: PeerId, i: usize) {
        if let ServeOp::Write { id, .. } = self.served[i].op {
            let rx = i as u32 | SERVE;
            self.frame(peer, Frame::Cts { id, rx }, Body::None, None);
        }
    }

    /// A write whose initiator offered its memory (`desc`): the transport copies it into
    /// the checked ranges (device memory: into a bounce buffer, landed from there when the
    /// copy is done), or, where it cannot (refused), the data is asked for.
    ///
    /// Device memory is copied through a bounce buffer rather than asked for: the peer's
    /// later requests wait behind this write (`holding`), and a transport with one ordered
    /// stream per peer keeps them at its head, so a `Data` behind them would never be read.
    pub(super) fn serve_write(
        &mut self,
        peer: PeerId,
        id: u32,
        data: u64,
        fl: u8,
        segs: RmaIovList,
        desc: Desc,
    ) {
        let (dest, device) = match target::resolve(&self.core, &segs, FI_REMOTE_WRITE) {
            Err(e) => return self.ack(peer, id, e),
            Ok(r) => r,
        };
        let (into, staged) = match device {
            None => (Some(dest), None),
            Some(owned) if self.can_copy(peer) && self.core.hmem().is_some() => {
                let (ctx, bounce) = self.core.stage_remote(owned);
                (Some(bounce), Some(ctx))
            }
            Some(_) => (None, None),
        };
        let op = ServeOp::Write {
            id,
            fl,
            data,
            segs,
            dest,
            staged,
        };
        let copy = into
            .filter(|_| self.can_copy(peer))
            .map(|into| (Dir::Read, desc, into, segs.total()));
        self.serve(peer, op, copy);
    }

    /// The `Data` of served write `rx`: the write proceeds as if it had come with it.
    pub(super) fn write_data(
        &mut self,
        peer: PeerId,
        rx: u32,
        body: u64,
    ) -> std::result::Result<(Sink, Pending), WireError> {
        let i = (rx & !SERVE) as usize;
        match self.served.get(i) {
            Some(s) if s.peer == peer && !s.copying => {
                let s = self.served.remove(i);
                let ServeOp::Write {
                    id, fl, data, segs, ..
                } = s.op
                else {
                    return Err(WireError::Malformed(wire::Kind::Data));
                };
                Ok(self.write_frame(id, data, fl, &segs, body))
            }
            _ => Err(WireError::Malformed(wire::Kind::Data)),
        }
    }

    /// A read whose initiator offered its memory (`desc`): the transport copies the checked
    /// ranges there (true), or the read is answered with the bytes as a body (false).
    pub(super) fn serve_read(
        &mut self,
        peer: PeerId,
        id: u32,
        segs: &RmaIovList,
        desc: Desc,
    ) -> bool {
        if !self.can_copy(peer) {
            return false;
        }
        match target::resolve(&self.core, segs, FI_REMOTE_READ) {
            Ok((local, None)) => {
                let copy = Some((Dir::Write, desc, local, local.total()));
                self.serve(peer, ServeOp::Read { id, local }, copy);
                true
            }
            _ => false,
        }
    }

    /// A large message matched: the transport copies it where the sender offered its memory
    /// and the transport can, else the sender is asked for its data (`Cts`).
    pub(super) fn start_pipe(&mut self, mut pipe: RxPipe) {
        let (peer, id) = (pipe.peer, pipe.tx_id);
        self.gen = self.gen.wrapping_add(1);
        pipe.gen = self.gen;
        pipe.copying = !pipe.desc.is_empty() && self.can_copy(pipe.peer);
        let (copying, remote, local, len, gen) = (
            pipe.copying,
            pipe.desc,
            pipe.slot.iov,
            pipe.len.min(pipe.slot.iov.total()),
            pipe.gen,
        );
        let rx = self.rx.insert(pipe);
        if copying {
            self.copies.push_back(CopyReq {
                peer,
                token: token(rx, gen),
                dir: Dir::Read,
                remote,
                local,
                len,
                offer: id,
                holds: false,
            });
        } else {
            self.frame(peer, Frame::Cts { id, rx: rx as u32 }, Body::None, None);
        }
    }

    /// The transport performed (or could not perform) the copy with `token`.
    pub fn on_copied(&mut self, token: u64, how: Copied) {
        let (i, gen) = split(token);
        if i & SERVE as usize != 0 {
            return self.served_copied(i & !(SERVE as usize), gen, how);
        }
        let Some(r) = self.rx.get_mut(i).filter(|r| r.gen == gen && r.copying) else {
            return;
        };
        r.copying = false;
        let (peer, id, ended) = (r.peer, r.tx_id, r.ended);
        let err = match how {
            _ if ended != 0 => ended,
            Copied::Done => 0,
            Copied::Refused => {
                // Never again with this peer; this message goes through frames.
                self.peer(peer).pull_refused = true;
                self.frame(peer, Frame::Cts { id, rx: i as u32 }, Body::None, None);
                return;
            }
            Copied::Failed(e) => peer_status(e),
        };
        let r = self.rx.remove(i);
        if err != 0 {
            if ended == 0 {
                self.ack(peer, id, err);
            }
            return self.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err,
            });
        }
        self.pipe_done(r);
    }

    fn served_copied(&mut self, i: usize, gen: u32, how: Copied) {
        let Some(s) = self.served.get_mut(i).filter(|s| s.gen == gen && s.copying) else {
            return;
        };
        s.copying = false;
        if s.ended {
            if let ServeOp::Write {
                staged: Some(ctx), ..
            } = self.served.remove(i).op
            {
                self.core.drop_remote(ctx);
            }
            return;
        }
        let peer = s.peer;
        if how == Copied::Refused {
            if let Some(ps) = self.peers.get_mut(peer) {
                ps.pull_refused = true;
            }
            if let ServeOp::Write { staged, .. } = &mut s.op {
                // The data comes through frames (staged again there, as any write's); later
                // requests keep waiting for it.
                if let Some(ctx) = staged.take() {
                    self.core.drop_remote(ctx);
                }
                return self.ask_data(peer, i);
            }
        }
        let status = match how {
            Copied::Failed(e) => peer_status(e),
            _ => 0,
        };
        match self.served.remove(i).op {
            ServeOp::Write {
                id,
                fl,
                data,
                segs,
                dest,
                staged,
            } => {
                let data = (fl & flags::CQ_DATA != 0).then_some(data);
                // A copy that failed leaves nothing to land.
                let staged = match staged {
                    Some(ctx) if status != 0 => {
                        self.core.drop_remote(ctx);
                        None
                    }
                    s => s,
                };
                self.write_landed(peer, id, fl, data, status, segs.total(), &dest, staged);
            }
            ServeOp::Read { id, local } => {
                let body = match how {
                    Copied::Refused => Body::Iov(local),
                    _ => Body::None,
                };
                self.read_resp(peer, id, status, body);
                if status == 0 {
                    self.done.push(Done::Remote {
                        flags: FI_RMA | FI_READ,
                        len: local.total(),
                        data: None,
                    });
                }
            }
        }
    }

    /// A large message is in its receive's buffer: acknowledged, completed.
    pub(super) fn pipe_done(&mut self, r: RxPipe) {
        let got = r.len.min(r.slot.iov.total());
        let status = self.sink_status(&r.slot, got);
        self.ack(r.peer, r.tx_id, status);
        self.push_rx(Done::Rx {
            slot: r.slot,
            len: got,
            olen: r.len - got,
            tag: r.tag,
            data: r.data,
            src: r.src,
            raw: self.raw_of(r.peer, r.src),
        });
    }

    /// Ends the copies and large messages of `peer` (every peer: `None`): receives fail with
    /// `err`, served requests are dropped unanswered; at once, or, where the transport has
    /// the copy, when it reports it.
    pub(super) fn end_copies(&mut self, peer: Option<PeerId>, err: i32) {
        let of = |p: PeerId| peer.is_none_or(|q| q == p);
        // Copies the transport never took will not be reported.
        let untaken: Vec<u64> = self
            .copies
            .iter()
            .filter(|c| of(c.peer))
            .map(|c| c.token)
            .collect();
        self.copies.retain(|c| !of(c.peer));
        for t in untaken {
            let (i, _) = split(t);
            if i & SERVE as usize != 0 {
                if let Some(s) = self.served.get_mut(i & !(SERVE as usize)) {
                    s.copying = false;
                }
            } else if let Some(r) = self.rx.get_mut(i) {
                r.copying = false;
            }
        }
        let ids: Vec<usize> = self
            .rx
            .iter()
            .filter(|(_, r)| of(r.peer))
            .map(|(i, _)| i)
            .collect();
        for i in ids {
            if self.rx[i].copying {
                self.rx[i].ended = err;
                continue;
            }
            let r = self.rx.remove(i);
            self.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err,
            });
        }
        self.served.retain(|_, s| {
            if !of(s.peer) {
                return true;
            }
            s.ended = true;
            s.copying
        });
    }
}
