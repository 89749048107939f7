//! The commonest frames, small messages, on a short path at both ends. Sending: the bytes
//! are copied into the frame and the send completes when the transport takes it, with no
//! request kept (nothing answers it). Receiving: a frame the transport holds whole (a ring
//! slot, a received chunk, a stream's buffer holding all of it) is handed over in one call,
//! and a message a posted receive matches goes straight into it, without the two-step
//! control / body exchange.

use crate::ep::TxOp;
use crate::rdm::wire::{self, flags, Frame, Kind, Prefix, WireError};
use crate::rdm::{Body, Inline, PeerId, Sink};
use crate::rxq::RecvSlot;
use crate::FiAddr;

use crate::consts::FI_FENCE;
use crate::error::Result;
use crate::rdm::transport::Transport;

use super::{msg_flags, Done, Engine, EAGER_LIMIT};

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

impl Engine {
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
        let len = op.iov.total();
        let (fl, ack) = msg_flags(op.flags);
        let direct = self.cfg.delivered_on_take
            && !ack
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
        let ctrl = Frame::Msg {
            id: 0,
            tag: op.tag,
            data: op.data,
            flags: fl,
        }
        .ctrl(len as u64);
        let cl = ctrl.len();
        let sent = tr.send_in_place(peer, cl + len, |b| {
            b[..cl].copy_from_slice(&ctrl);
            // SAFETY: the caller's contract keeps the iov readable during the call.
            unsafe { op.iov.copy_out(0, &mut b[cl..]) };
        });
        if sent {
            self.done.push(Done::Tx {
                ctx: op.ctx,
                flags: op.flags,
            });
        }
        Ok(sent)
    }

    /// Sends a message of at most `INLINE_BODY` bytes that wants no acknowledgement: its
    /// bytes go into the frame now, and it completes when the transport takes the frame (as
    /// a larger one completes once sent), in order with the others to `peer`.
    ///
    /// # Safety
    /// `op.iov` is readable now.
    pub(super) unsafe fn send_small(&mut self, peer: PeerId, op: &TxOp, fl: u8) {
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

    /// A whole frame arrived from `peer` (known to the address vector as `src`, or
    /// `FI_ADDR_NOTAVAIL`): its prefix, exactly its control part, and its body. The same as
    /// `on_ctrl`, the body put where that answers, then `on_body`, in one call. `Ok(false)`:
    /// not now (`on_ctrl`'s `Sink::Wait`): the transport keeps the frame and offers it again
    /// on a later progress call. `Err`: the peer speaks garbage (the transport drops it).
    pub fn on_frame(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        prefix: &Prefix,
        ctrl: &[u8],
        body: &[u8],
    ) -> std::result::Result<bool, WireError> {
        if body.len() as u64 != prefix.body_len {
            let kind = Kind::from_raw(prefix.kind).ok_or(WireError::Kind(prefix.kind))?;
            return Err(WireError::Body(kind, prefix.body_len));
        }
        if prefix.kind == Kind::Msg as u8 && self.take_msg(peer, src, prefix, ctrl, body)? {
            return Ok(true);
        }
        let sink = self.on_ctrl(peer, src, prefix, ctrl)?;
        if matches!(sink, Sink::Wait) {
            return Ok(false);
        }
        // SAFETY: the engine keeps a sink's memory writable until `on_body`, just below.
        let sink = unsafe { sink.fill(body) };
        self.on_body(peer, sink);
        Ok(true)
    }

    /// A message taken by a posted receive, straight into it. False: not taken here (no
    /// receive matches, or its peer's requests wait): `on_ctrl` decides.
    fn take_msg(
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

    /// A message landed in `slot` (`got` of its bytes): acknowledged if its sender asked,
    /// and completed.
    pub(super) fn msg_landed(&mut self, peer: PeerId, slot: RecvSlot, got: usize, m: Landed) {
        if m.fl & flags::ACK != 0 {
            let status = self.sink_status(&slot, got);
            self.ack(peer, m.id, status);
        }
        self.push_rx(Done::Rx {
            slot,
            len: got,
            olen: m.len - got,
            tag: m.tag,
            data: m.data,
            src: m.src,
            raw: self.raw_of(peer, m.src),
        });
    }
}
