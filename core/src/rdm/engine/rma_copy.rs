//! RMA served through the transport's one-sided copies (`transport::OneSided`): a write whose
//! initiator offered its memory is pulled by the target's transport, a read is pushed into
//! the initiator's offered memory; where the transport refuses, a write's data is asked for
//! with `Cts` (it comes as `Data`) and a read is answered with the bytes as a body.
//!
//! Ordering: while the transport copies for a peer's RMA request (or a served write waits
//! for its `Data`, or a read's answer still carries the memory read), that peer's next
//! requests wait (`Sink::Wait`, `order`), so that nothing it asks later sees memory before
//! the write landed, or changes it under a read.

use super::*;
use crate::rdm::transport::{Copied, CopyReq, Dir};

/// Set in the transfer id of a `Cts` / `Data` for a served write (not a receive), and in
/// the low word of a served copy's token.
pub(super) const SERVE: u32 = 1 << 31;

/// A peer's RMA request this endpoint serves through its transport's copies.
pub(super) struct Serve {
    pub peer: PeerId,
    gen: u32,
    /// The transport has the copy (asked for or under way).
    pub copying: bool,
    /// The peer was lost or the endpoint closed while copying: drop it when it reports.
    pub ended: bool,
    /// 0, or why it fails however its copy ends (its region closed: `cut_region`).
    pub failed: i32,
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

impl Engine {
    /// The region with key `key`, `addr..addr + len`, closes: the peers' writes into it and
    /// reads of it that copies serve fail however their copy ends (`Serve::failed`). Returns
    /// the tokens of their copies, which the transport may hold (or be doing).
    pub(super) fn cut_served(&mut self, key: u64, addr: usize, len: usize) -> Vec<u64> {
        let mut tokens = Vec::new();
        for (i, s) in self.served.iter_mut() {
            let uses = match &s.op {
                ServeOp::Write { segs, .. } => segs.segs().iter().any(|g| g.key == key),
                ServeOp::Read { local, .. } => local.overlaps(addr, len),
            };
            if uses && !s.ended {
                s.failed = FI_EACCES;
                if s.copying {
                    tokens.push(token(i | SERVE as usize, s.gen));
                }
            }
        }
        tokens
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
            failed: 0,
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
                ctx: 0,
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
        let (dest, device) = match self.resolve(peer, &segs, FI_REMOTE_WRITE) {
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
    ) -> std::result::Result<Sink, WireError> {
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
                Ok(self.write_frame(peer, id, data, fl, &segs, body, s.failed))
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

    /// The transport performed (or could not perform) the copy of served request `i`: the
    /// write lands, the read is answered; a refused one goes through frames instead.
    pub(super) fn served_copied(&mut self, i: usize, gen: u32, how: Copied) {
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
        let how = match s.failed {
            0 => how,
            e => Copied::Failed(e),
        };
        if matches!(how, Copied::Refused | Copied::Declined) {
            if how == Copied::Refused {
                if let Some(ps) = self.peers.get_mut(peer) {
                    ps.pull_refused = true;
                }
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
                // A copy that failed leaves nothing to land.
                let staged = match staged {
                    Some(ctx) if status != 0 => {
                        self.core.drop_remote(ctx);
                        None
                    }
                    s => s,
                };
                let w = WriteBody {
                    id,
                    fl,
                    data: (fl & flags::CQ_DATA != 0).then_some(data),
                    status,
                    len: segs.total(),
                    dest,
                    segs,
                    staged,
                };
                self.write_landed(peer, w);
            }
            ServeOp::Read { id, local } => {
                let body = match how {
                    Copied::Refused | Copied::Declined => Body::Iov(local),
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
}
