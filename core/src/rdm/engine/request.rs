//! Requests: the operations this endpoint initiated, from post to completion. A request is
//! kept until the transport has sent its frames' memory (`unsent`) and the peer has answered
//! (`answer`), then it settles: its completion is pushed and, once its peer has none left,
//! the operations fenced behind it start.

use super::*;

/// An operation this endpoint initiated, until its peer has answered.
pub(super) struct TxReq {
    pub ctx: Context,
    pub flags: u64,
    pub peer: PeerId,
    /// The send's data, the write's source, the read's destination, the fetch's result.
    pub iov: IovList,
    /// Bytes expected back (a read's length, a fetch's result length).
    pub want: usize,
    /// Bumped per slot reuse, so a stale token or id from a peer cannot reach a newer request.
    pub gen: u32,
    /// Frames of it still with the transport (their memory in use).
    pub unsent: u8,
    /// `Some(status)` once the peer answered (or no answer is awaited: `Some(0)` at post).
    pub answer: Option<i32>,
    /// `answer` came from the peer (or the NIC): the operation took effect there, so a loss
    /// or a close that ends it before its frames are reported sent ends it with that
    /// status, not as failed (an application would retry a write or an atomic applied).
    pub peer_answered: bool,
    /// A large message waiting for the receiver's `Cts`.
    pub rts: bool,
    /// Its `Rts` offered a descriptor: the receiver may copy the data itself and answer
    /// `Ack` instead of `Cts`.
    pub pull: bool,
    /// The transport's NIC carries it out (`transport::Native`): only the transport
    /// answers it (`on_native`), never a peer's frame.
    pub native: bool,
    /// A send from device memory offered unstaged (`DEVICE_OFFER`): its data never goes
    /// into a frame from `iov` itself; where the peer does not copy it, it is staged then.
    pub device: bool,
    /// An armed send (`armed`) that has not fired: its `Rts` waits in the transport (and in
    /// `Engine::armed`); not outstanding till then, and no answer is taken for it.
    pub armed: bool,
}

impl TxReq {
    /// A request with nothing awaited yet beyond its answer: no bytes back, no frame with
    /// the transport, no large message.
    pub fn new(ctx: Context, flags: u64, peer: PeerId, iov: IovList) -> TxReq {
        TxReq {
            ctx,
            flags,
            peer,
            iov,
            want: 0,
            gen: 0,
            unsent: 0,
            answer: None,
            peer_answered: false,
            rts: false,
            pull: false,
            native: false,
            device: false,
            armed: false,
        }
    }

    /// Whether an `Ack` answers it: not a read or a fetch (their answers carry data), not a
    /// large message still waiting for `Cts`, not one answered already.
    pub fn takes_ack(&self) -> bool {
        self.answer.is_none()
            && (!self.rts || self.pull)
            && self.want == 0
            && self.flags & (FI_RMA | FI_READ) != FI_RMA | FI_READ
    }
}

/// A peer's status as an errno: 0, or positive; a negative one (no engine sends it) is a
/// failure too, never a success.
pub(super) fn peer_status(status: i32) -> i32 {
    if status < 0 {
        FI_EIO
    } else {
        status
    }
}

/// `check_open`'s refusal, out of line so that the check inlines into each post.
#[cold]
#[inline(never)]
fn closed(what: &'static str) -> Error {
    Error::OpBadState(format!("{what}: endpoint is closed"))
}

impl Engine {
    /// Keeps `t` as outstanding toward its peer: its slot and generation (see `token`).
    pub(super) fn new_tx(&mut self, t: TxReq) -> (usize, u32) {
        self.gen = self.gen.wrapping_add(1);
        let gen = self.gen;
        let peer = t.peer;
        let id = self.tx.insert(TxReq { gen, ..t });
        self.peer(peer).outstanding += 1;
        (id, gen)
    }

    /// Completes request `id` if both its frames are sent and its answer is in.
    pub(super) fn maybe_complete(&mut self, id: usize) {
        let Some(t) = self.tx.get(id) else { return };
        let (Some(status), 0) = (t.answer, t.unsent) else {
            return;
        };
        let t = self.tx.remove(id);
        self.settle(t, status);
    }

    /// The peer answered request `id` (if still there) with `status`, its data (a read's,
    /// a fetch's) already in place.
    pub(super) fn answer(&mut self, id: usize, status: i32) {
        if let Some(t) = self.tx.get_mut(id).filter(|t| !t.armed) {
            t.answer = Some(peer_status(status));
            t.peer_answered = true;
            self.maybe_complete(id);
        }
    }

    /// How request `t` ends when its peer is lost (`err`) or the endpoint closes before
    /// its frames are reported sent: with the peer's answer if it gave one.
    pub(super) fn ended_status(t: &TxReq, err: i32) -> i32 {
        match t.answer {
            Some(status) if t.peer_answered => status,
            _ => err,
        }
    }

    pub(super) fn settle(&mut self, t: TxReq, status: i32) {
        let ps = self.peer(t.peer);
        ps.outstanding = ps.outstanding.saturating_sub(1);
        if t.native {
            ps.natives = ps.natives.saturating_sub(1);
        }
        self.offer_ended(&t);
        let (ctx, flags) = (t.ctx, t.flags);
        self.done.push(if status == 0 {
            Done::Tx { ctx, flags }
        } else {
            Done::TxErr {
                ctx,
                flags,
                err: status,
            }
        });
        if self.peers[t.peer].outstanding == 0 && !self.peers[t.peer].fenced.is_empty() {
            self.release_fenced(t.peer);
        }
    }

    #[inline]
    pub(super) fn check_open(&self, what: &'static str) -> Result<()> {
        if self.closed {
            return Err(closed(what));
        }
        Ok(())
    }

    /// `check_open`, and room for one more outstanding operation.
    #[inline]
    pub(super) fn check_room(&self, what: &'static str) -> Result<()> {
        self.check_open(what)?;
        debug_assert_eq!(
            self.held,
            self.peers
                .iter()
                .flat_map(|p| &p.fenced)
                .filter(|f| !matches!(f, Fenced::Armed(_)))
                .count()
        );
        if self.tx.len() + self.held >= self.cfg.tx_max {
            return Err(Error::Again(what));
        }
        Ok(())
    }

    /// The request a peer's answer names, if it is that peer's and still outstanding. (A
    /// peer can only name its own requests; answers come once per request, so a slot reused
    /// after its request completed is never named by a well-behaved peer.)
    pub(super) fn answered(&self, peer: PeerId, id: u32) -> Option<usize> {
        let i = id as usize;
        self.tx
            .get(i)
            .filter(|t| t.peer == peer && !t.native && !t.armed)
            .map(|_| i)
    }

    /// An answer that brings data back (`ReadResp`, `AtomicResp`, as `kind`) to our request
    /// `id`, if `asked` says that request is one it answers: its body, the bytes read or a
    /// fetch's original values, goes into the request's memory when the status is 0. A body
    /// of another length than the request wants back is garbage, but for an empty one where
    /// the request offered its memory for the target's transport to copy into (`pull`).
    pub(super) fn on_data_answer(
        &mut self,
        peer: PeerId,
        kind: Kind,
        id: u32,
        status: i32,
        body: u64,
        asked: impl Fn(&TxReq) -> bool,
    ) -> std::result::Result<Sink, WireError> {
        let (sink, p) = match self.answered(peer, id) {
            Some(i) if asked(&self.tx[i]) => {
                let t = &self.tx[i];
                if status == 0 && body != t.want as u64 && !(body == 0 && t.pull) {
                    return Err(WireError::Malformed(kind));
                }
                let sink = if status == 0 {
                    Sink::Iov(t.iov)
                } else {
                    Sink::Discard
                };
                (sink, Pending::Answer { id: i, status })
            }
            _ => (Sink::Discard, Pending::Nothing),
        };
        Ok(self.expect(peer, sink, p))
    }

    /// An `Ack`: the peer's answer to a send (delivery, match complete), a large message, a
    /// write or an atomic without fetch.
    pub(super) fn on_ack(&mut self, peer: PeerId, id: u32, status: i32) -> Sink {
        if let Some(i) = self.answered(peer, id).filter(|&i| self.tx[i].takes_ack()) {
            self.tx[i].answer = Some(peer_status(status));
            self.tx[i].peer_answered = true;
            self.maybe_complete(i);
        }
        self.no_body(peer)
    }
}
