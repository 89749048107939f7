//! Ordering across protocols. The target runs one peer's requests in ring order, but a large RMA
//! write lands later (fragments, or a split copy's second half) and a split read's initiator
//! copies its part after the target has moved on: while either is in flight, that peer's later
//! requests are held, in order, and replayed once it is done. Replies and the transfer's own
//! traffic are never held.

use super::*;

impl ShmEndpoint {
    /// Whether message `h` from peer `p` must wait: `h` is a request that could see or touch
    /// memory while `p`'s large RMA write is still landing or `p` is still copying its part of
    /// a split read (`holding`), or something of `p`'s already waits (order is kept). Replies
    /// and the transfers' own traffic go through.
    pub(super) fn must_hold(&self, st: &State, p: usize, h: &Header) -> bool {
        let request = matches!(
            h.kind,
            kind::EAGER
                | kind::RTS
                | kind::RMA_WRITE
                | kind::RMA_WRITE1
                | kind::RMA_READ
                | kind::ATOMIC
        );
        request && (!st.peers[p].held.is_empty() || holding(st, p))
    }

    /// Runs held requests of peers whose large RMA writes have landed.
    pub(super) fn replay_held(&self, st: &mut State) {
        for p in 0..st.peers.len() {
            if let Some(lane) = st.peers[p].rx_lane {
                self.replay_peer(st, lane, p);
            }
        }
    }

    /// Runs peer `p`'s held requests (arrived on `lane`) while nothing holds them.
    pub(super) fn replay_peer(&self, st: &mut State, lane: usize, p: usize) {
        while !st.peers[p].held.is_empty() && !holding(st, p) {
            let (h, pl) = st.peers[p].held.pop_front().expect("not empty");
            self.handle_msg_now(st, lane, p, h, &pl);
        }
    }

    /// `handle_msg` for a message already past the hold check.
    pub(super) fn handle_msg_now(
        &self,
        st: &mut State,
        lane: usize,
        p: usize,
        h: Header,
        pl: &[u8],
    ) -> bool {
        let held = std::mem::take(&mut st.peers[p].held);
        let r = self.handle_msg(st, lane, h, pl);
        // Anything `handle_msg` held again sits behind what was already waiting.
        let again = std::mem::replace(&mut st.peers[p].held, held);
        st.peers[p].held.extend(again);
        r
    }
}

/// Whether a large RMA write from peer `p` is still landing in our memory.
pub(super) fn rma_write_landing(st: &State, p: usize) -> bool {
    st.rxp
        .iter()
        .any(|(_, r)| r.peer == p && r.slot.flags & FI_RMA != 0)
}

/// Whether peer `p`'s later requests must wait: one of its large RMA writes is still landing,
/// or it is still copying its part of a split read from our memory.
pub(super) fn holding(st: &State, p: usize) -> bool {
    st.peers[p].reads_out > 0 || rma_write_landing(st, p)
}
