//! Frames a transport holds whole (a ring slot, a received chunk, a stream's buffer holding
//! all of a small frame), handed over in one call; and messages, the commonest frames, taken
//! straight into a matched receive without the two-step control / body exchange (no pending
//! state kept, no sink built and handed back).

use crate::rdm::wire::{self, flags, Frame, Kind, Prefix, WireError};
use crate::rdm::{PeerId, Sink};
use crate::rxq::RecvSlot;
use crate::FiAddr;

use super::{Done, Engine, EAGER_LIMIT};

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
        } = wire::decode(prefix, ctrl)?
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
