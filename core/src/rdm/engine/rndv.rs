//! Large messages (rendezvous): the sender announces one (`Rts`), and once a receive matches
//! it the data comes over (`Cts`, then `Data` from the sender's buffer into the receive's)
//! or, where the transports copy one-sidedly and the sender offered its memory, the
//! receiver's transport pulls it (`poll_copy`, `on_copied`); a refused copy falls back to
//! frames. No large message is ever buffered unexpected: only its announcement is.
//!
//! The one-sided copies themselves (what is offered, what the transport is asked for) are
//! here too; RMA served through them is `rma_copy`.

use super::*;
use crate::rdm::transport::{Copied, CopyReq, Dir};

/// `Cts::rx` of a discarding receive: complete, send nothing.
pub(super) const NO_RX: u32 = u32::MAX;

/// A matched large message waiting for its `Data`, or for the transport's copy of it.
pub(super) struct RxPipe {
    pub slot: RecvSlot,
    pub peer: PeerId,
    pub tx_id: u32,
    pub len: usize,
    pub tag: u64,
    pub data: Option<u64>,
    pub src: FiAddr,
    /// The sender's descriptor of its memory (empty: frames only).
    pub desc: Desc,
    /// Bumped per slot reuse, like `TxReq::gen`, for the copy's token.
    pub gen: u32,
    /// A copy of it is asked for or under way: the receive's buffer is the transport's until
    /// `on_copied`.
    pub copying: bool,
    /// It ended (the peer was lost, the endpoint closed) while copying: the errno its receive
    /// fails with once the copy reports.
    pub ended: i32,
}

impl Engine {
    /// Announces a message (`Rts`) larger than `eager_max`, or one whose memory the
    /// transports copy cheaply (`early_offer`), offering its memory (`desc`, where not empty)
    /// for the receiver's transport to copy; it waits for `Cts`, or an `Ack` once copied.
    pub(super) fn send_rts(&mut self, peer: PeerId, op: &TxOp, fl: u8, desc: Desc) {
        let (id, _) = self.new_tx(TxReq {
            rts: true,
            pull: !desc.is_empty(),
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let f = Frame::Rts {
            id: id as u32,
            tag: op.tag,
            data: op.data,
            len: op.iov.total() as u64,
            flags: fl & (flags::TAGGED | flags::CQ_DATA),
            desc,
        };
        self.frame(peer, f, Body::None, None);
    }

    /// Announces a send from device memory (`DEVICE_OFFER`), whatever its size, offering the
    /// memory where the transport describes it (CUDA IPC) and the peer copies with us; its
    /// data is staged only if the peer answers `Cts` (`on_cts`).
    pub(super) fn send_device_offer(&mut self, peer: PeerId, op: &TxOp, fl: u8) {
        let desc = match &self.one_sided {
            Some(t) if self.can_copy(peer) => {
                t.describe(peer, &op.iov, Dir::Read).unwrap_or_default()
            }
            _ => Desc::default(),
        };
        let (id, _) = self.new_tx(TxReq {
            rts: true,
            pull: !desc.is_empty(),
            device: true,
            ..TxReq::new(op.ctx, op.flags & !DEVICE_OFFER, peer, op.iov)
        });
        let f = Frame::Rts {
            id: id as u32,
            tag: op.tag,
            data: op.data,
            len: op.iov.total() as u64,
            flags: fl & (flags::TAGGED | flags::CQ_DATA),
            desc,
        };
        self.frame(peer, f, Body::None, None);
    }

    /// An `Rts`: the message starts on its way if a receive matches, else its announcement
    /// is kept unexpected (while the bounds allow: `Sink::Wait` past them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_rts(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        id: u32,
        tag: u64,
        data: u64,
        len: u64,
        fl: u8,
        desc: Desc,
    ) -> std::result::Result<Sink, WireError> {
        let len = usize::try_from(len).map_err(|_| WireError::Malformed(Kind::Rts))?;
        let tagged = fl & flags::TAGGED != 0;
        let data = (fl & flags::CQ_DATA != 0).then_some(data);
        if !self.rxq.would_match(src, tag, tagged) && self.unexpected_full(peer, 0) {
            return Ok(Sink::Wait);
        }
        if self.peers.get(peer).is_some_and(|ps| ps.pipes >= PIPES_MAX) {
            return Ok(Sink::Wait);
        }
        match self.rxq.match_arrival(src, tag, tagged, len) {
            Some(slot) => self.start_pipe(RxPipe {
                slot,
                peer,
                tx_id: id,
                len,
                tag,
                data,
                src,
                desc,
                gen: 0,
                copying: false,
                ended: 0,
            }),
            None => {
                let epoch = self.peer(peer).epoch;
                self.rxq.push_unexpected(
                    tagged,
                    Unexpected {
                        src,
                        tag,
                        data: data.unwrap_or(0),
                        has_data: data.is_some(),
                        len,
                        held: UNEXP_OVERHEAD,
                        owner: peer,
                        payload: Unexp::Rts {
                            peer,
                            id,
                            epoch,
                            desc,
                        },
                    },
                );
            }
        }
        Ok(self.no_body(peer))
    }

    /// A receive took a large message announced earlier, in the peer's `epoch`: it fails if
    /// the peer was lost since, completes empty if the receive discards it, else starts.
    pub(super) fn rts_taken(&mut self, pipe: RxPipe, epoch: u64) {
        let (peer, id) = (pipe.peer, pipe.tx_id);
        if self.peer(peer).epoch != epoch {
            return self.push_rx(Done::SlotErr {
                slot: pipe.slot,
                tag: pipe.tag,
                err: FI_ECONNRESET,
            });
        }
        if pipe.slot.op_flags & FI_DISCARD != 0 {
            self.frame(peer, Frame::Cts { id, rx: NO_RX }, Body::None, None);
            return self.push_rx(Done::Rx {
                slot: pipe.slot,
                len: 0,
                olen: 0,
                tag: pipe.tag,
                data: pipe.data,
                src: pipe.src,
                raw: self.raw_of(peer, pipe.src),
            });
        }
        self.start_pipe(pipe);
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
        let ctx = pipe.slot.ctx;
        let rx = self.rx.insert(pipe);
        self.peer(peer).pipes += 1;
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
                ctx,
            });
        } else {
            self.frame(peer, Frame::Cts { id, rx: rx as u32 }, Body::None, None);
        }
    }

    /// A `Cts`: the receiver of our large message (`id`) is ready for its data (`Data` from
    /// the application's buffer), or took it with a discarding receive (`NO_RX`).
    pub(super) fn on_cts(&mut self, peer: PeerId, id: u32, rx: u32) -> Sink {
        if let Some(i) = self.answered(peer, id).filter(|&i| self.tx[i].rts) {
            let t = &mut self.tx[i];
            t.rts = false;
            if rx == NO_RX {
                t.answer = Some(0);
                t.peer_answered = true;
                self.maybe_complete(i);
            } else if t.device {
                // Offered from device memory and not copied by the peer (it could not open
                // the memory, or copies no more with us): its data is staged now, counted
                // and logged (`hmem_stage::offer_counts`), and goes through frames.
                let iov = t.iov;
                if let Some(os) = self.one_sided.as_ref() {
                    os.offer_declined(peer, &iov);
                }
                match self.stage_device_data(&iov) {
                    Ok(body) => {
                        hmem_stage::count_offer_staged();
                        tracing::info!(
                            peer,
                            len = iov.total(),
                            "a device-memory send its peer did not copy goes staged"
                        );
                        self.frame(peer, Frame::Data { rx }, body, None);
                    }
                    Err(e) => {
                        // The device did not give its bytes: the send fails here. The
                        // receiver has no frame to learn it by; its receive waits until this
                        // endpoint closes or is lost (docs/hmem.md).
                        tracing::warn!(peer, "staging a device-memory send failed: {e}");
                        self.core.staging.record_error(e);
                        self.tx[i].answer = Some(FI_EIO);
                        self.maybe_complete(i);
                    }
                }
            } else {
                t.unsent = 1;
                let iov = t.iov;
                let gen = t.gen;
                self.frame(
                    peer,
                    Frame::Data { rx },
                    Body::Iov(iov),
                    Some(token(i, gen)),
                );
            }
        }
        self.no_body(peer)
    }

    /// The bytes of `iov`, device memory gathered through the hmem layer, in a buffer the
    /// frame owns.
    fn stage_device_data(&self, iov: &IovList) -> Result<Body> {
        let hm = self.core.hmem().ok_or_else(|| {
            Error::Inval("a device-memory send on an endpoint without hmem".into())
        })?;
        let v = match hmem_stage::owners(hm, iov)? {
            // SAFETY: the send's memory is readable until it completes (`post_send`).
            Some(segs) => unsafe { hmem_stage::gather(hm, &segs) }?,
            None => {
                let mut v = vec![0u8; iov.total()];
                // SAFETY: as above: host memory after all.
                unsafe { iov.copy_out(0, &mut v) };
                v
            }
        };
        Ok(Body::Owned(v))
    }

    /// A `Data`: a large message's bytes, straight into its receive; or, marked `SERVE`, the
    /// data of a write this endpoint serves (`rma_copy`).
    pub(super) fn on_data(
        &mut self,
        peer: PeerId,
        rx: u32,
        body: u64,
    ) -> std::result::Result<Sink, WireError> {
        if rx & SERVE != 0 {
            return self.write_data(peer, rx, body);
        }
        match self.rx.get(rx as usize) {
            Some(r) if r.peer == peer && body == r.len as u64 && !r.copying => {
                let sink = Sink::Iov(r.slot.iov);
                Ok(self.expect(peer, sink, Pending::Data { rx: rx as usize }))
            }
            _ => Err(WireError::Malformed(Kind::Data)),
        }
    }

    /// A receive pipe of `peer` left `Engine::rx`.
    pub(super) fn pipe_gone(&mut self, peer: PeerId) {
        if let Some(ps) = self.peers.get_mut(peer) {
            ps.pipes = ps.pipes.saturating_sub(1);
        }
    }

    /// A large message's `Data` arrived into its receive.
    pub(super) fn data_arrived(&mut self, rx: usize) {
        if let Some(r) = self.rx.try_remove(rx) {
            self.pipe_gone(r.peer);
            self.pipe_done(r);
        }
    }

    /// A large message is in its receive's buffer: acknowledged, completed.
    fn pipe_done(&mut self, r: RxPipe) {
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

    /// The next copy the transport is to perform, if any (see [`CopyReq`]).
    pub fn poll_copy(&mut self) -> Option<CopyReq> {
        self.copies.pop_front()
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
            Copied::Refused | Copied::Declined => {
                // This message goes through frames; refused, never again with this peer.
                if how == Copied::Refused {
                    self.peer(peer).pull_refused = true;
                }
                self.frame(peer, Frame::Cts { id, rx: i as u32 }, Body::None, None);
                return;
            }
            Copied::Failed(e) => peer_status(e),
        };
        let r = self.rx.remove(i);
        self.pipe_gone(r.peer);
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

    /// Whether copies are still asked for or under way (a closing transport finishes them
    /// and reports them before it goes).
    pub fn copying(&self) -> bool {
        self.rx.iter().any(|(_, r)| r.copying) || self.served.iter().any(|(_, s)| s.copying)
    }

    /// Whether the transport can be asked for a copy with `peer`.
    pub(super) fn can_copy(&self, peer: PeerId) -> bool {
        self.one_sided.is_some() && !self.peers.get(peer).is_some_and(|ps| ps.pull_refused)
    }

    /// A descriptor of `iov` for `peer`'s transport to copy from (`pulled`) or into, where
    /// the transport copies one-sidedly and `iov` is large enough to be worth it; empty
    /// otherwise. Memory the peer pulls is worth offering from the transport's `offer_min`
    /// too, where it has one for it (`early_offer`).
    pub(super) fn offer(&self, peer: PeerId, iov: &IovList, pulled: bool) -> Desc {
        match &self.one_sided {
            Some(t) if iov.total() >= t.pull_min() => {
                let dir = if pulled { Dir::Read } else { Dir::Write };
                t.describe(peer, iov, dir).unwrap_or_default()
            }
            Some(_) if pulled => self.early_offer(peer, iov).unwrap_or_default(),
            _ => Desc::default(),
        }
    }

    /// A descriptor of `iov` for `peer`'s transport to pull from, where the transport copies
    /// such memory cheaply from `iov`'s size on (`OneSided::offer_min`) and can copy with
    /// that peer: the message is then announced, whatever its size, rather than sent eagerly.
    pub(super) fn early_offer(&self, peer: PeerId, iov: &IovList) -> Option<Desc> {
        let t = self.one_sided.as_ref()?;
        let min = t.offer_min(iov)?;
        if iov.total() < min || !self.can_copy(peer) {
            return None;
        }
        t.describe(peer, iov, Dir::Read).filter(|d| !d.is_empty())
    }

    /// The memory this endpoint offered `peer` to copy from for its request `offer` (a
    /// `CopyReq::offer` the peer's transport names: a large message's data, a write's
    /// source), while that request is outstanding; `None` for anything else, a read's
    /// destination included (offered to be written, not read).
    pub fn offered(&self, peer: PeerId, offer: u32) -> Option<IovList> {
        self.tx
            .get(offer as usize)
            .filter(|t| t.peer == peer && t.pull && t.answer.is_none() && !t.armed)
            .filter(|t| t.flags & (FI_RMA | FI_READ) != FI_RMA | FI_READ)
            .map(|t| t.iov)
    }

    /// Tells the transport that `t`'s offer of its memory (if it made one) has ended.
    pub(super) fn offer_ended(&self, t: &TxReq) {
        if let (true, Some(os)) = (t.pull, &self.one_sided) {
            // An RMA read's offer is its destination, which the peer writes (`offer`).
            let dir = if t.flags & (FI_RMA | FI_READ) == FI_RMA | FI_READ {
                Dir::Write
            } else {
                Dir::Read
            };
            os.offer_ended(t.peer, &t.iov, dir);
        }
    }
}
