//! Messages, and the eager protocol: a message up to `eager_max` goes as one `Msg` frame with
//! its data as the body (a larger one is announced instead: `rndv`, as is one whose memory
//! the transports copy cheaply, from the size the transport says: `OneSided::offer_min`).
//!
//! The commonest frames, small messages, take a short path at both ends. Sending: the bytes
//! are copied into the frame and the send completes when the transport takes it, with no
//! request kept (nothing answers it). Receiving: a frame the transport holds whole (a ring
//! slot, a received chunk, a stream's buffer holding all of it) is handed over in one call,
//! and a message a posted receive matches goes straight into it, without the two-step
//! control / body exchange.

use super::*;
use crate::rdm::Inline;

/// The token of a small message's frame (`Engine::send_small`): the engine completes the
/// send when the transport takes the frame, and clears the token before it does, so no
/// transport ever sees it.
pub(super) const ON_TAKE: u64 = u64::MAX - 1;

/// What a message that a receive took says about itself.
pub(super) struct Landed {
    pub id: u32,
    pub fl: u8,
    pub tag: u64,
    pub data: Option<u64>,
    pub src: FiAddr,
    /// Its length (more than landed when the receive was shorter).
    pub len: usize,
}

/// A message whose body is arriving: into the receive that matched it (`slot`), or into a
/// buffer, unexpected.
pub(super) struct MsgBody {
    pub slot: Option<RecvSlot>,
    pub tagged: bool,
    pub m: Landed,
}

impl Engine {
    /// Starts a send to `peer`.
    ///
    /// # Safety
    /// `op.iov` stays readable until the operation completes (during the call only with
    /// `FI_INJECT`).
    pub unsafe fn post_send(&mut self, peer: PeerId, op: &TxOp) -> Result<()> {
        self.check_room("send")?;
        let inject = op.flags & (FI_INJECT | INJECT_CALL) != 0;
        // SAFETY: the caller's contract keeps the iov readable during the call.
        let copy = || unsafe { inject_copy(inject, &op.iov) };
        if self.fence(peer, op.flags, || Fenced::Send(*op, copy())) {
            return Ok(());
        }
        let c = copy();
        // SAFETY: forwarded.
        unsafe { self.send_now(peer, op, c) }.map_err(|(_, _, e)| e)
    }

    /// Sends a message that nothing holds back, by the protocol its size and flags call for.
    ///
    /// # Safety
    /// As `post_send`; `copy` is the inject data, copied already.
    pub(super) unsafe fn send_now(
        &mut self,
        peer: PeerId,
        op: &TxOp,
        copy: Option<Body>,
    ) -> std::result::Result<(), (Context, u64, Error)> {
        let len = op.iov.total();
        let (fl, ack) = msg_flags(op.flags);
        match copy {
            // Device memory offered to the peer's transport: never read here.
            None if op.flags & DEVICE_OFFER != 0 => self.send_device_offer(peer, op, fl),
            Some(body) if !ack => self.send_inject(peer, op, fl, body),
            None if self.cfg.delivered_on_take && !ack && len <= crate::rdm::INLINE_BODY => {
                // SAFETY: the caller's contract keeps the iov readable during the call.
                unsafe { self.send_small(peer, op, fl) }
            }
            // Memory the transports copy cheaply is offered rather than copied twice.
            None if len <= self.cfg.eager_max => match self.early_offer(peer, &op.iov) {
                Some(desc) => self.send_rts(peer, op, fl, desc),
                None => self.send_eager(peer, op, fl, ack, None),
            },
            copy if len <= self.cfg.eager_max || copy.is_some() => {
                self.send_eager(peer, op, fl, ack, copy)
            }
            _ => {
                let desc = self.offer(peer, &op.iov, true);
                self.send_rts(peer, op, fl, desc)
            }
        }
        Ok(())
    }

    /// An inject awaiting no answer: its copy goes as the body, and it completes now, with
    /// no request to keep.
    fn send_inject(&mut self, peer: PeerId, op: &TxOp, fl: u8, body: Body) {
        let f = Frame::Msg {
            id: 0,
            tag: op.tag,
            data: op.data,
            flags: fl,
        };
        self.frame(peer, f, body, None);
        self.done.push(Done::Tx {
            ctx: op.ctx,
            flags: op.flags,
        });
    }

    /// An eager message kept as a request until the transport has sent its body (when that
    /// is the application's memory) and, where `ack` is asked, the peer has answered.
    fn send_eager(&mut self, peer: PeerId, op: &TxOp, fl: u8, ack: bool, copy: Option<Body>) {
        let body = copy.unwrap_or(Body::Iov(op.iov));
        let owned = !matches!(body, Body::Iov(_));
        let (id, gen) = self.new_tx(TxReq {
            unsent: u8::from(!owned),
            answer: (!ack).then_some(0),
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let f = Frame::Msg {
            id: id as u32,
            tag: op.tag,
            data: op.data,
            flags: fl,
        };
        self.frame(peer, f, body, (!owned).then(|| token(id, gen)));
        self.maybe_complete(id);
    }

    /// Writes an eager message that nothing to `peer` waits ahead of straight into `tr`'s
    /// memory (`Transport::send_in_place`, which refuses what it cannot take whole now), and
    /// completes it at once, where taking a frame delivers it: no frame is queued or moved,
    /// no request kept. `Ok(false)`: not sent (post it with `post_send`).
    ///
    /// # Safety
    /// `op.iov` is readable during the call.
    pub unsafe fn send_in_place(
        &mut self,
        peer: PeerId,
        op: &TxOp,
        tr: &mut impl Transport,
    ) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        let sent = unsafe { self.write_in_place(peer, op, tr) }?;
        if sent {
            self.done.push(Done::Tx {
                ctx: op.ctx,
                flags: op.flags,
            });
        }
        Ok(sent)
    }

    /// `send_in_place` without its completion: `Ok(true)` when written, and then the
    /// message is complete and the caller reports it (`EpCore::complete_tx` with `op`'s
    /// context and flags), ahead of anything the engine gathers after this call. A provider
    /// that reports it straight after its lock saves the completion's trip through the
    /// engine's list.
    ///
    /// # Safety
    /// As `send_in_place`.
    pub unsafe fn write_in_place(
        &mut self,
        peer: PeerId,
        op: &TxOp,
        tr: &mut impl Transport,
    ) -> Result<bool> {
        let len = op.iov.total();
        let (fl, ack) = msg_flags(op.flags);
        let direct = self.cfg.delivered_on_take
            && !ack
            && op.flags & DEVICE_OFFER == 0
            && len <= self.cfg.eager_max
            && op.flags & FI_FENCE == 0
            && self.out.is_empty()
            && self.peers.get(peer).is_none_or(|ps| {
                ps.blocked.is_empty() && ps.fenced.is_empty() && ps.untaken.is_empty()
            });
        if !direct {
            return Ok(false);
        }
        self.check_room("send")?;
        let ctrl = Frame::msg_ctrl(0, op.tag, op.data, fl, len as u64);
        let cl = ctrl.len();
        let sent = tr.send_in_place(peer, cl + len, |b| {
            b[..cl].copy_from_slice(&ctrl);
            // SAFETY: the caller's contract keeps the iov readable during the call.
            unsafe { op.iov.copy_out(0, &mut b[cl..]) };
        });
        Ok(sent)
    }

    /// Sends a message of at most `INLINE_BODY` bytes that wants no acknowledgement: its
    /// bytes go into the frame now, and it completes when the transport takes the frame (as
    /// a larger one completes once sent), in order with the others to `peer`.
    ///
    /// # Safety
    /// `op.iov` is readable now.
    unsafe fn send_small(&mut self, peer: PeerId, op: &TxOp, fl: u8) {
        let mut b = Inline::zeroed(op.iov.total()).expect("at most INLINE_BODY bytes");
        // SAFETY: forwarded from the caller.
        unsafe { op.iov.copy_out(0, &mut b) };
        self.peer(peer).untaken.push_back((op.ctx, op.flags));
        let f = Frame::Msg {
            id: 0,
            tag: op.tag,
            data: op.data,
            flags: fl,
        };
        self.frame(peer, f, Body::Inline(b), Some(ON_TAKE));
    }

    /// The transport took the frame of `peer`'s oldest small message not yet taken: it
    /// completes.
    pub(super) fn taken(&mut self, peer: PeerId) {
        if let Some((ctx, flags)) = self.peer(peer).untaken.pop_front() {
            self.done.push(Done::Tx { ctx, flags });
        }
    }

    /// Small messages to `peer` the transport never took fail with `err` (the peer was lost,
    /// the endpoint closed).
    pub(super) fn fail_untaken(&mut self, peer: PeerId, err: i32) {
        while let Some((ctx, flags)) = self.peer(peer).untaken.pop_front() {
            self.done.push(Done::TxErr { ctx, flags, err });
        }
    }

    /// A message taken by a posted receive, straight into it (`on_frame`). False: not taken
    /// here (no receive matches, or its peer's requests wait): `on_ctrl` decides.
    pub(super) fn take_msg(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        prefix: &Prefix,
        ctrl: &[u8],
        body: &[u8],
    ) -> std::result::Result<bool, WireError> {
        let Frame::Msg {
            id,
            tag,
            data,
            flags: fl,
        } = wire::decode_msg(prefix, ctrl)?
        else {
            return Ok(false);
        };
        if body.len() > EAGER_LIMIT {
            return Err(WireError::Malformed(Kind::Msg));
        }
        if self.must_wait(peer, Kind::Msg) {
            return Ok(false);
        }
        let tagged = fl & flags::TAGGED != 0;
        let Some(slot) = self.rxq.match_arrival(src, tag, tagged, body.len()) else {
            return Ok(false);
        };
        // SAFETY: a matched receive's buffer is the engine's until it completes, below.
        let got = unsafe { slot.iov.copy_in(0, body) };
        let m = Landed {
            id,
            fl,
            tag,
            data: (fl & flags::CQ_DATA != 0).then_some(data),
            src,
            len: body.len(),
        };
        self.msg_landed(peer, slot, got, m);
        Ok(true)
    }

    /// A `Msg` announced: its body goes into the receive it matches, or into a buffer while
    /// the unexpected bounds allow (`Sink::Wait` past them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_msg(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        id: u32,
        tag: u64,
        data: u64,
        fl: u8,
        body: u64,
    ) -> std::result::Result<Sink, WireError> {
        if body > EAGER_LIMIT as u64 {
            return Err(WireError::Malformed(Kind::Msg));
        }
        let len = body as usize;
        let tagged = fl & flags::TAGGED != 0;
        let data = (fl & flags::CQ_DATA != 0).then_some(data);
        let slot = self.rxq.match_arrival(src, tag, tagged, len);
        let sink = match slot {
            Some(s) => Sink::Iov(s.iov),
            None if self.unexpected_full(peer, len) => return Ok(Sink::Wait),
            None => {
                self.start_inflight(peer, len);
                Sink::Buffer(vec![0; len])
            }
        };
        let m = Landed {
            id,
            fl,
            tag,
            data,
            src,
            len,
        };
        Ok(self.expect(peer, sink, Pending::Msg(MsgBody { slot, tagged, m })))
    }

    /// A message's body arrived: into its receive, or into a buffer to keep unexpected.
    pub(super) fn msg_arrived(&mut self, peer: PeerId, b: MsgBody, sink: Sink) {
        match b.slot {
            Some(slot) => {
                let got = b.m.len.min(slot.iov.total());
                self.msg_landed(peer, slot, got, b.m);
            }
            None => {
                self.end_inflight(peer);
                let Sink::Buffer(bytes) = sink else { return };
                // A receive posted while the body was arriving found nothing unexpected then:
                // it takes the message now (kept unexpected, it would have waited for the
                // sender's next one). A whole message that arrived meanwhile may still have
                // taken an earlier-posted receive first: the header does not hold a place.
                match self.rxq.match_arrival(b.m.src, b.m.tag, b.tagged, b.m.len) {
                    Some(slot) => {
                        // SAFETY: the receive's buffer is ours until it completes.
                        let got = unsafe { slot.iov.copy_in(0, &bytes) };
                        self.msg_landed(peer, slot, got, b.m);
                    }
                    None => self.keep_unexpected(peer, b.tagged, b.m, bytes),
                }
            }
        }
    }

    /// A message no receive took yet is buffered until one does.
    fn keep_unexpected(&mut self, peer: PeerId, tagged: bool, m: Landed, bytes: Vec<u8>) {
        // Delivery complete, like match complete, is acknowledged once a receive takes the
        // message: a bounce buffer is not the receive's memory.
        let ack = m.fl & flags::ACK != 0;
        let held = bytes.len() + UNEXP_OVERHEAD;
        let epoch = self.peer(peer).epoch;
        self.rxq.push_unexpected(
            tagged,
            Unexpected {
                src: m.src,
                tag: m.tag,
                data: m.data.unwrap_or(0),
                has_data: m.data.is_some(),
                len: m.len,
                held,
                owner: peer,
                payload: Unexp::Eager {
                    bytes,
                    from: peer,
                    ack: ack.then_some((peer, m.id, epoch)),
                },
            },
        );
    }

    /// A message landed in `slot` (`got` of its bytes): acknowledged if its sender asked,
    /// and completed.
    #[inline]
    pub(super) fn msg_landed(&mut self, peer: PeerId, mut slot: RecvSlot, got: usize, m: Landed) {
        if m.fl & flags::ACK != 0 {
            let status = self.sink_status(&slot, got);
            self.ack(peer, m.id, status);
        }
        // As `push_rx`, the completion written straight into the vector.
        self.rxq.finish_slot(&mut slot);
        let raw = self.raw_of(peer, m.src);
        self.done.push(Done::Rx {
            slot,
            len: got,
            olen: m.len - got,
            tag: m.tag,
            data: m.data,
            src: m.src,
            raw,
        });
    }
}

/// A message's frame flags for a send with `op_flags`, and whether it asks for an `Ack`.
#[inline]
pub(super) fn msg_flags(op_flags: u64) -> (u8, bool) {
    let mut fl = 0u8;
    if op_flags & FI_TAGGED != 0 {
        fl |= flags::TAGGED;
    }
    if op_flags & FI_REMOTE_CQ_DATA != 0 {
        fl |= flags::CQ_DATA;
    }
    let ack =
        op_flags & INJECT_CALL == 0 && op_flags & (FI_DELIVERY_COMPLETE | FI_MATCH_COMPLETE) != 0;
    if ack {
        fl |= flags::ACK;
        if op_flags & FI_MATCH_COMPLETE != 0 {
            fl |= flags::ACK_MATCH;
        }
    }
    (fl, ack)
}
