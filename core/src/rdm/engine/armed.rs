//! Armed sends: a triggered send whose announcement (`Rts`, the sender's memory offered to
//! the receiver's transport) is made when it is armed and left with the transport, which
//! keeps it where the peer can read it (shm: a slot of the sender's segment) and, when the
//! trigger fires, only tells the peer to take it (one small message, in order with the rest
//! to that peer). What a firing costs the thread that fires it (a CPU XPU's own, between two
//! buckets of its compute) is then that message, not a post: the engine's work and the
//! announcement's bytes were spent at arming, on the host's time.
//!
//! Only a message the peer pulls can be armed so (its data is read by the peer after the
//! firing, from the sender's memory): one of the transport's offered memory, or larger than
//! `eager_max` with a descriptor. An armed request is kept with its frame (`TxReq::armed`);
//! it is not outstanding, counts against `tx_max`, and takes no answer, until it fires.
//! Firing while operations to its peer are held or queued (`FI_FENCE`, a full ring) sends the
//! kept frame behind them instead of through the transport's slot: the order is the one a
//! send started at the firing would have had. A lost peer or a close ends armed requests
//! like outstanding ones; disarming one that never fired ends it without a completion.

use super::*;

/// What became of an armed send when it fired (`Engine::fire_armed`).
#[derive(Debug, PartialEq, Eq)]
pub enum Fired {
    /// Under way: the transport tells `peer` to take the announcement it holds. If it
    /// cannot now (its ring is full), `send_armed` sends the engine's copy instead.
    Release(PeerId),
    /// The engine sends the announcement itself, behind what waits for that peer: the
    /// transport forgets the one it holds.
    Queued,
    /// No armed send has that token (it ended with its peer, or at close).
    Stale,
}

impl Engine {
    /// Arms `op` (a send to `peer`) as one whose announcement goes out before it fires: its
    /// request and the encoded `Rts` (prefix and control part, no body), for the transport
    /// to keep, with the token `fire_armed` and `disarm` take. `None` where it cannot be
    /// armed so (the engine then starts it, when it fires, as any post).
    pub fn arm_send(&mut self, peer: PeerId, op: &TxOp) -> Option<(u64, &wire::Ctrl)> {
        if op.flags & (FI_FENCE | FI_INJECT | INJECT_CALL | DEVICE_OFFER) != 0 {
            return None;
        }
        // Armed sends hold their requests from arming on: at most half of `tx_max`, so that
        // the host's own posts keep room while armed ones wait for their triggers.
        self.check_open("send").ok()?;
        if self.tx.len() + self.held >= self.cfg.tx_max / 2 {
            return None;
        }
        let len = op.iov.total();
        let desc = if len <= self.cfg.eager_max {
            self.early_offer(peer, &op.iov)?
        } else {
            Some(self.offer(peer, &op.iov, true)).filter(|d| !d.is_empty())?
        };
        let (fl, _) = eager::msg_flags(op.flags);
        self.gen = self.gen.wrapping_add(1);
        let gen = self.gen;
        let id = self.tx.insert(TxReq {
            gen,
            rts: true,
            pull: true,
            armed: true,
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let ctrl = Frame::Rts {
            id: id as u32,
            tag: op.tag,
            data: op.data,
            len: len as u64,
            flags: fl & (flags::TAGGED | flags::CQ_DATA),
            desc,
        }
        .ctrl(0);
        if self.armed.len() <= id {
            self.armed.resize_with(id + 1, || None);
        }
        Some((token(id, gen), &*self.armed[id].insert(ctrl)))
    }

    /// The armed send `token` fired: it is outstanding from now on. See [`Fired`].
    pub fn fire_armed(&mut self, token: u64) -> Fired {
        let (id, gen) = split(token);
        let Some(peer) = self
            .tx
            .get(id)
            .filter(|t| t.gen == gen && t.armed)
            .map(|t| t.peer)
        else {
            return Fired::Stale;
        };
        if !self.peer(peer).fenced.is_empty() {
            // Behind the held operations, still armed (taking no answer) until its frame goes.
            self.peers[peer].fenced.push_back(Fenced::Armed(token));
            return Fired::Queued;
        }
        self.tx[id].armed = false;
        self.peers[peer].outstanding += 1;
        if !self.peers[peer].blocked.is_empty() || self.out.iter().any(|q| q.peer == peer) {
            self.send_armed(token);
            return Fired::Queued;
        }
        Fired::Release(peer)
    }

    /// An armed send whose firing waited behind held operations (`Fenced::Armed`) starts:
    /// outstanding, its `Rts` sent as a frame. Nothing if it ended meanwhile.
    pub(super) fn release_armed(&mut self, token: u64) {
        let (id, gen) = split(token);
        let Some(t) = self.tx.get_mut(id).filter(|t| t.gen == gen && t.armed) else {
            return;
        };
        t.armed = false;
        let peer = t.peer;
        self.peers[peer].outstanding += 1;
        self.send_armed(token);
    }

    /// The `Rts` of the armed send `token`, while it has not fired.
    pub fn armed_frame(&self, token: u64) -> Option<&wire::Ctrl> {
        let (id, _) = split(token);
        self.is_armed(token)
            .then(|| self.armed.get(id)?.as_ref())
            .flatten()
    }

    /// Whether `token` names an armed send that has not fired.
    pub fn is_armed(&self, token: u64) -> bool {
        let (id, gen) = split(token);
        self.tx.get(id).is_some_and(|t| t.gen == gen && t.armed)
    }

    /// Sends the `Rts` of the armed send `token`, which fired (`Fired::Release`), as a frame
    /// behind what is queued for its peer: the transport could not release its own copy.
    pub fn send_armed(&mut self, token: u64) {
        let (id, gen) = split(token);
        let Some(peer) = self.tx.get(id).filter(|t| t.gen == gen).map(|t| t.peer) else {
            return;
        };
        let ctrl = self.armed_ctrl(id);
        self.send_ctrl(peer, ctrl);
    }

    /// The kept `Rts` of the armed send in slot `id`.
    fn armed_ctrl(&mut self, id: usize) -> wire::Ctrl {
        self.armed
            .get_mut(id)
            .and_then(Option::take)
            .expect("an armed send keeps its frame")
    }

    /// Sends an encoded frame of no body (an armed send's `Rts`) to `peer`, behind what is
    /// queued for it.
    pub(super) fn send_ctrl(&mut self, peer: PeerId, ctrl: wire::Ctrl) {
        self.out.push_back(Transmit {
            peer,
            ctrl,
            body: Body::None,
            token: None,
        });
    }

    /// The armed send `token`, released to `peer` by the transport (`Fired::Release`), was
    /// finished there: what an `Ack` of status 0 from `peer` does, told by the transport its
    /// own way (shm: a count of released sends finished in order, in place of one frame
    /// each). `false`, and nothing done, where no fired request of that generation to `peer`
    /// waits for that answer.
    pub fn armed_acked(&mut self, peer: PeerId, token: u64) -> bool {
        let (id, gen) = split(token);
        let Some(i) = u32::try_from(id)
            .ok()
            .and_then(|id| self.answered(peer, id))
            .filter(|&i| self.tx[i].gen == gen && self.tx[i].takes_ack())
        else {
            return false;
        };
        self.tx[i].answer = Some(0);
        self.tx[i].peer_answered = true;
        self.maybe_complete(i);
        true
    }

    /// Ends the armed send `token` that has not fired, with no completion: `true` if there
    /// was one (its reservations are the caller's to give back).
    pub fn disarm(&mut self, token: u64) -> bool {
        let (id, _) = split(token);
        if !self.is_armed(token) {
            return false;
        }
        let t = self.tx.remove(id);
        self.offer_ended(&t);
        true
    }
}
