//! Peers that die or leave: outstanding work with them fails with `FI_ECONNRESET`, what they
//! sent before is still delivered, and their lanes in our segment go back. A peer is dead when
//! its segment's flock is free (`Segment::owner_alive`), which needs no pid bookkeeping.

use super::*;

const SWEEP_EVERY_MS: u64 = SWEEP_EVERY.as_millis() as u64;

pub(super) use super::super::futex::coarse_ms;

impl ShmEndpoint {
    pub(super) fn fail_pipes_from(&self, st: &mut State, p: usize, err: i32) {
        let ids: Vec<usize> = st
            .rxp
            .iter()
            .filter(|(_, r)| r.peer == p)
            .map(|(i, _)| i)
            .collect();
        for id in ids {
            let r = st.rxp.remove(id);
            st.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err,
            });
        }
    }

    pub(super) fn peer_died(&self, st: &mut State, p: usize) {
        if st.peers[p].dead {
            return;
        }
        st.peers[p].dead = true;
        let outstanding = st.tx.iter().filter(|(_, t)| t.peer == p).count();
        tracing::warn!(
            peer = %st.peers[p].name,
            outstanding,
            backlog = st.peers[p].backlog.len(),
            "shm: peer is gone (its segment's lock is free); its operations fail with FI_ECONNRESET"
        );
        st.peers[p].backlog.clear();
        let ids: Vec<usize> = st
            .tx
            .iter()
            .filter(|(_, t)| t.peer == p)
            .map(|(i, _)| i)
            .collect();
        for id in ids {
            let t = st.tx.remove(id);
            st.done.push(Done::TxErr {
                ctx: t.ctx,
                flags: t.flags,
                err: FI_ECONNRESET,
            });
        }
        st.streaming.retain(|&id| st.tx.contains(id as usize));
        self.fail_pipes_from(st, p, FI_ECONNRESET);
        // Receives directed at this peer alone can never complete now.
        if self.core.caps & FI_DIRECTED_RECV != 0 {
            let src = self.src_of(st, p);
            if src != FI_ADDR_NOTAVAIL {
                for r in st.rxq.drain_from(src) {
                    st.done.push(Done::RxErr {
                        ctx: r.ctx,
                        flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)),
                        tag: r.tag,
                        err: FI_ECONNRESET,
                    });
                }
            }
        }
    }

    /// Whether the next look for dead peers is due.
    pub(super) fn sweep_due(&self) -> bool {
        coarse_ms() >= self.idle.next_sweep.load(Ordering::Relaxed)
    }

    /// Looks for peers that died with work outstanding (or that hold a lane in our segment).
    pub(super) fn sweep(&self, st: &mut State) {
        self.idle.next_sweep.store(
            coarse_ms().saturating_add(SWEEP_EVERY_MS),
            Ordering::Relaxed,
        );
        let directed = self.core.caps & FI_DIRECTED_RECV != 0;
        for p in 0..st.peers.len() {
            if st.peers[p].dead {
                continue;
            }
            let awaited = directed && {
                let src = self.src_of(st, p);
                src != FI_ADDR_NOTAVAIL && st.rxq.has_posted_from(src)
            };
            let peer = &st.peers[p];
            let busy = awaited
                || peer.rx_lane.is_some()
                || st.tx.iter().any(|(_, t)| t.peer == p)
                || st.rxp.iter().any(|(_, r)| r.peer == p);
            if !busy || peer.owner_alive() {
                continue;
            }
            // Replies it wrote before it died are handled before its outstanding work fails:
            // the acknowledgement of an operation it did complete may still sit in its lane.
            if let Some(lane) = st.peers[p].rx_lane {
                let pos = st.cons[lane].pos();
                self.handle_transfers_ahead(st, lane, pos);
            }
            self.peer_died(st, p);
            // Its requests held behind a transfer that will never land run now, in order.
            st.peers[p].forget_reads();
            if let Some(lane) = st.peers[p].rx_lane {
                self.replay_peer(st, lane, p);
            }
            if let Some(lane) = st.peers[p].rx_lane {
                self.drain_gone(st, lane, p);
            }
        }
    }

    /// Delivers what a dead peer `p` left in `lane`, under the flow control a live sender
    /// meets (a message that must wait keeps the lane until receives make room), and frees
    /// the lane once it is empty.
    pub(super) fn drain_gone(&self, st: &mut State, lane: usize, p: usize) {
        let mut c = st.cons[lane];
        while let Some(v) = c.peek(&self.seg, lane) {
            if self.must_wait(st, lane, &v.h) {
                st.cons[lane] = c;
                return;
            }
            self.handle(st, lane, &v);
            c.advance(&self.seg, lane, v);
        }
        st.cons[lane] = c;
        st.peers[p].rx_lane = None;
        st.lane_peer[lane] = None;
        ring::release_lane(&self.seg, lane);
        st.known_active &= !(1u64 << lane);
    }
}
