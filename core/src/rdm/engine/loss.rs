//! A lost peer, and close. A loss fails every operation toward the peer with the
//! transport's errno, every large message it was sending us, and the copies serving it;
//! what it fully sent before is delivered, and later posts to it start afresh (a new
//! epoch). Close ends everything with `FI_ECANCELED`.

use super::*;

impl Engine {
    /// The peer known as `src` in the address vector is gone: receives posted for it alone
    /// (`FI_DIRECTED_RECV`) fail with `err`, as nothing will arrive for them.
    pub fn source_lost(&mut self, src: FiAddr, err: i32) {
        if src == FI_ADDR_NOTAVAIL || self.core.caps & FI_DIRECTED_RECV == 0 {
            return;
        }
        let err = if err > 0 { err } else { FI_ECONNRESET };
        for (r, released) in self.rxq.drain_from(src) {
            // A buffer with messages still landing is released by the last of them.
            let release = if released { r.flags & FI_MULTI_RECV } else { 0 };
            self.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)) | release,
                tag: r.tag,
                err,
            });
        }
    }

    /// The transport lost `peer` (errno `err`): its queued frames are gone. Every request
    /// toward it fails, every large message from it that was still arriving fails; later
    /// posts to it start afresh (the transport reconnects).
    pub fn on_lost(&mut self, peer: PeerId, err: i32) {
        let err = if err > 0 { err } else { FI_ECONNRESET };
        let ps = self.peer(peer);
        ps.epoch += 1;
        let pending = ps.pending.take();
        // Taken before the requests settle, so that none of them releases what is held.
        let fenced = self.take_held(peer);
        self.abandon(peer, pending, err);
        // Requests in flight (their frames may have gone out: the transport keeps none).
        let ids: Vec<usize> = self
            .tx
            .iter()
            .filter(|(_, t)| t.peer == peer)
            .map(|(i, _)| i)
            .collect();
        for i in ids {
            let t = self.tx.remove(i);
            let status = Self::ended_status(&t, err);
            self.settle(t, status);
        }
        self.fail_held(fenced, err);
        self.end_copies(Some(peer), err);
        self.natives.retain(|n| n.peer != peer);
        self.peer(peer).outstanding = 0;
        self.peer(peer).natives = 0;
        self.fail_untaken(peer, err);
        self.out.retain(|t| t.peer != peer);
        self.peers[peer].answers_taken(usize::MAX);
        let gone = std::mem::take(&mut self.peers[peer].blocked);
        self.blocked -= gone.len();
        // What it wrote is no longer for its commit to flush: a commit comes from a peer
        // still connected.
        self.peers[peer].dirty.clear();
        self.peers[peer].owed = 0;
        self.peers[peer].owed_bytes = 0;
    }

    /// Ends, with `err`, what the body a peer was sending was for (a loss, close): a matched
    /// receive fails; a staged write's bounce buffer is freed.
    fn abandon(&mut self, peer: PeerId, p: Option<Pending>, err: i32) {
        self.end_inflight(peer);
        match p {
            Some(Pending::Msg(MsgBody {
                slot: Some(slot),
                m,
                ..
            })) => self.push_rx(Done::SlotErr {
                slot,
                tag: m.tag,
                err,
            }),
            Some(Pending::Write(WriteBody {
                staged: Some(ctx), ..
            })) => self.core.drop_remote(ctx),
            _ => {}
        }
    }

    /// Ends the copies and large messages of `peer` (every peer: `None`): receives fail with
    /// `err`, served requests are dropped unanswered; at once, or, where the transport has
    /// the copy, when it reports it.
    fn end_copies(&mut self, peer: Option<PeerId>, err: i32) {
        let of = |p: PeerId| peer.is_none_or(|q| q == p);
        // Copies the transport never took will not be reported.
        let untaken: Vec<u64> = self
            .copies
            .iter()
            .filter(|c| of(c.peer))
            .map(|c| c.token)
            .collect();
        self.copies.retain(|c| !of(c.peer));
        for t in untaken {
            let (i, _) = split(t);
            if i & SERVE as usize != 0 {
                if let Some(s) = self.served.get_mut(i & !(SERVE as usize)) {
                    s.copying = false;
                }
            } else if let Some(r) = self.rx.get_mut(i) {
                r.copying = false;
            }
        }
        let ids: Vec<usize> = self
            .rx
            .iter()
            .filter(|(_, r)| of(r.peer))
            .map(|(i, _)| i)
            .collect();
        for i in ids {
            if self.rx[i].copying {
                self.rx[i].ended = err;
                continue;
            }
            let r = self.rx.remove(i);
            self.pipe_gone(r.peer);
            self.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err,
            });
        }
        self.served.retain(|_, s| {
            if !of(s.peer) {
                return true;
            }
            s.ended = true;
            s.copying
        });
    }

    /// Closes: every outstanding operation and posted receive ends with `FI_ECANCELED`;
    /// buffered messages are dropped, and so are the frames of our own requests not yet
    /// handed to the transport. Answers already queued stay for the transport to flush
    /// (a transport does the same with frames it was handed and has not begun writing:
    /// those that `answer_charge` finds no answer).
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let txs: Vec<TxReq> = self.tx.drain().collect();
        for t in txs {
            self.offer_ended(&t);
            let (ctx, flags) = (t.ctx, t.flags);
            self.done.push(match Self::ended_status(&t, FI_ECANCELED) {
                0 => Done::Tx { ctx, flags },
                err => Done::TxErr { ctx, flags, err },
            });
        }
        for p in 0..self.peers.len() {
            let fenced = self.take_held(p);
            self.fail_held(fenced, FI_ECANCELED);
            let pending = self.peers[p].pending.take();
            self.abandon(p, pending, FI_ECANCELED);
            self.fail_untaken(p, FI_ECANCELED);
        }
        self.end_copies(None, FI_ECANCELED);
        self.natives.clear();
        for (r, released) in self.rxq.drain_posted() {
            let release = if released { r.flags & FI_MULTI_RECV } else { 0 };
            self.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)) | release,
                tag: r.tag,
                err: FI_ECANCELED,
            });
        }
        self.rxq.drain_unexpected();
        // Only answers the peers wait for go out still (`answer_charge`: acknowledgements,
        // go-aheads, read and atomic answers): every request of ours ended `FI_ECANCELED`
        // above, so none of its frames may reach the peer (a message delivered after its
        // send was reported canceled arrives twice when the application sends it again; an
        // atomic is applied twice). Nor may a frame read application memory being handed back.
        let keep = |t: &Transmit| kept_at_close(t);
        self.out.retain(keep);
        for ps in &mut self.peers {
            ps.blocked.retain(keep);
            (ps.owed, ps.owed_bytes) = ps
                .blocked
                .iter()
                .filter_map(answer_charge)
                .fold((0, 0), |(n, b), c| (n + 1, b + c));
        }
        self.blocked = self.peers.iter().map(|ps| ps.blocked.len()).sum();
    }
}
