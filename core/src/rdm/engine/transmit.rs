//! Frames going out: queued in order per peer, handed to the transport, and held back per
//! peer where the transport gives one back (its peer is full), so that one slow peer holds
//! up no other.

use super::*;

impl Engine {
    #[inline]
    pub(super) fn frame(&mut self, peer: PeerId, f: Frame, body: Body, token: Option<u64>) {
        let ctrl = f.ctrl(body.len() as u64);
        self.out.push_back(Transmit {
            peer,
            ctrl,
            body,
            token,
        });
    }

    pub(super) fn ack(&mut self, peer: PeerId, id: u32, status: i32) {
        self.frame(peer, Frame::Ack { id, status }, Body::None, None);
    }

    /// A deferred acknowledgement of a message that arrived in the peer's `epoch`: dropped
    /// if the peer was lost since (its request already failed, and its id may be reused).
    pub(super) fn ack_in(&mut self, peer: PeerId, id: u32, epoch: u64, status: i32) {
        if self.peer(peer).epoch == epoch {
            self.ack(peer, id, status);
        }
    }

    /// The next frame to send, if any: frames to one peer come in the order they are to be
    /// sent.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut t = None;
        if self.blocked > 0 {
            if let Some(p) = self.peers.iter().position(|ps| !ps.blocked.is_empty()) {
                t = self.unhold(p);
            }
        }
        let mut t = t.or_else(|| self.out.pop_front())?;
        // The caller takes it now.
        if t.token == Some(ON_TAKE) {
            t.token = None;
            self.taken(t.peer);
        }
        Some(t)
    }

    /// Hands every frame it can to `tr`, in order per peer: a frame `tr` gives back stays
    /// with the engine, with the later ones to the same peer, until a later call gets it
    /// through (other peers' frames go on meanwhile). How many were handed over.
    pub fn transmit(&mut self, tr: &mut impl Transport) -> usize {
        if self.detaching {
            self.detach_answers(tr);
        }
        let mut n = 0;
        if self.blocked > 0 {
            for p in 0..self.peers.len() {
                while let Some(t) = self.unhold(p) {
                    if let Err(t) = self.hand(tr, t) {
                        self.hold(p, t, true);
                        break;
                    }
                    n += 1;
                }
            }
        }
        while let Some(t) = self.out.pop_front() {
            let p = t.peer;
            let ps = self.peer(p);
            let t = if ps.blocked.is_empty() {
                match self.hand(tr, t) {
                    Ok(()) => {
                        n += 1;
                        continue;
                    }
                    Err(t) => t,
                }
            } else {
                t
            };
            self.hold(p, t, false);
        }
        n
    }

    /// Keeps `t`, which the transport gave back, for `peer` (at the front: it was first),
    /// charging an answer to what the peer owes.
    fn hold(&mut self, peer: PeerId, t: Transmit, front: bool) {
        let ps = &mut self.peers[peer];
        if let Some(c) = answer_charge(&t) {
            ps.owed += 1;
            ps.owed_bytes += c;
        }
        if front {
            ps.blocked.push_front(t);
        } else {
            ps.blocked.push_back(t);
        }
        self.blocked += 1;
    }

    /// The first frame kept for `peer`, no longer charged.
    fn unhold(&mut self, peer: PeerId) -> Option<Transmit> {
        let ps = &mut self.peers[peer];
        let t = ps.blocked.pop_front()?;
        if let Some(c) = answer_charge(&t) {
            ps.owed = ps.owed.saturating_sub(1);
            ps.owed_bytes = ps.owed_bytes.saturating_sub(c);
        }
        self.blocked -= 1;
        Some(t)
    }

    /// Offers `t` to the transport; a small message it takes completes (`ON_TAKE`).
    #[allow(clippy::result_large_err)]
    fn hand(
        &mut self,
        tr: &mut impl Transport,
        mut t: Transmit,
    ) -> std::result::Result<(), Transmit> {
        let on_take = t.token == Some(ON_TAKE);
        if on_take {
            t.token = None;
        }
        let p = t.peer;
        match tr.send(t) {
            Ok(()) => {
                if on_take {
                    self.taken(p);
                }
                Ok(())
            }
            Err(mut t) => {
                if on_take {
                    t.token = Some(ON_TAKE);
                }
                Err(t)
            }
        }
    }

    /// Frames to `peer` the transport could not take yet (for a provider that answers
    /// `Again` to posts toward a peer that stopped taking frames).
    pub fn blocked(&self, peer: PeerId) -> usize {
        self.peers.get(peer).map_or(0, |ps| ps.blocked.len())
    }

    /// Whether frames or answers are still owed to live peers (a closing provider flushes
    /// until this is false or its deadline passes).
    pub fn owes(&self) -> bool {
        !self.out.is_empty() || self.blocked > 0
    }

    /// The frames to `peer` the engine holds: those the transport gave back, then those not
    /// yet offered.
    pub(super) fn frames_to(&mut self, peer: PeerId) -> impl Iterator<Item = &mut Transmit> {
        self.peers[peer]
            .blocked
            .iter_mut()
            .chain(self.out.iter_mut().filter(move |t| t.peer == peer))
    }

    /// Whether `transmit` or `poll_copy` has anything to give (frames queued or held back,
    /// copies asked for, answers to detach): a provider may skip its push round when not.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.blocked > 0 || !self.copies.is_empty() || self.detaching
    }
}
