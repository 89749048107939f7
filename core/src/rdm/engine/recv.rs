//! Posted receives and the unexpected buffer: matching (core's `RecvQueue`), messages that
//! arrived before their receive (an eager one's bytes, a large one's announcement), the
//! bounds on what is buffered, and a receive's completion.

use super::*;

/// Bookkeeping charged per buffered unexpected message on top of its payload: its entry in
/// the receive queue's list twice over (a `VecDeque` grown by doubling holds up to as much
/// again unused), and the payload's allocation header. Was a flat 128 bytes, under the entry's
/// own size (208 bytes on x86-64; found by a read-only review).
pub(crate) const UNEXP_OVERHEAD: usize =
    2 * std::mem::size_of::<crate::rxq::Unexpected<Unexp>>() + 16;

/// A buffered unexpected message.
pub(super) enum Unexp {
    Eager {
        bytes: Vec<u8>,
        /// Who sent it (for `FI_SOURCE_ERR`'s raw address).
        from: PeerId,
        /// Acknowledge to this peer's request once a receive takes it (`FI_MATCH_COMPLETE`,
        /// `FI_DELIVERY_COMPLETE`), if the peer is still in the epoch it was then (ids are
        /// reused across a loss).
        ack: Option<(PeerId, u32, u64)>,
    },
    Rts {
        peer: PeerId,
        id: u32,
        /// The peer's epoch when it arrived: a later loss fails it on match.
        epoch: u64,
        desc: Desc,
    },
}

impl Engine {
    /// Posts a receive.
    ///
    /// # Safety
    /// `r.iov` stays writable, and untouched by anyone else, until the receive completes.
    pub unsafe fn post_recv(&mut self, r: PostedRecv) -> Result<()> {
        self.check_open("recv")?;
        // A context names one claimed message: a second claim under it would lose the first
        // (and the room it holds) for good.
        if r.flags & (FI_PEEK | FI_CLAIM | FI_DISCARD) == FI_PEEK | FI_CLAIM
            && self.rxq.claimed_by(r.ctx)
        {
            return Err(Error::Busy(format!(
                "recv: a message is already claimed under context {:#x}",
                r.ctx
            )));
        }
        // A claim into device memory comes staged, under the staging key: the message the
        // application claimed under its own context is looked up as that key's.
        if r.flags & (FI_PEEK | FI_CLAIM) == FI_CLAIM && r.ctx & crate::entry::INTERNAL_CTX != 0 {
            if let Some(user) = self.core.staging.user_of(r.ctx) {
                self.rxq.rekey_claim(user, r.ctx);
            }
        }
        let (ctx, flags, tag) = (r.ctx, r.flags, r.tag);
        match self.rxq.post(r) {
            PostResult::Queued => {}
            PostResult::Matched(list) => {
                for (slot, u) in list {
                    self.deliver_unexpected(slot, u);
                }
            }
            PostResult::Peeked {
                ctx,
                len,
                tag,
                data,
                has_data,
                src,
                discarded,
            } => {
                if let Some(u) = discarded {
                    self.drop_unexpected(u);
                }
                self.done.push(Done::Peek {
                    ctx,
                    len,
                    tag,
                    data: has_data.then_some(data),
                    src,
                });
            }
            PostResult::NoMessage => self.done.push(Done::RxErr {
                ctx,
                flags: FI_RECV | (flags & (FI_MSG | FI_TAGGED)),
                tag,
                err: FI_ENOMSG,
            }),
        }
        Ok(())
    }

    /// Cancels a posted receive, or an operation still held behind a fence.
    pub fn cancel(&mut self, ctx: Context) -> Result<()> {
        if let Some((r, released)) = self.rxq.cancel(ctx) {
            let release = if released { r.flags & FI_MULTI_RECV } else { 0 };
            self.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)) | release,
                tag: r.tag,
                err: FI_ECANCELED,
            });
            return Ok(());
        }
        if self.cancel_held(ctx) {
            return Ok(());
        }
        Err(Error::NoEntry(format!(
            "cancel: no posted receive or held operation with context {ctx:#x}"
        )))
    }

    /// A discarded unexpected message: its sender still hears that it was taken.
    fn drop_unexpected(&mut self, u: Unexpected<Unexp>) {
        match u.payload {
            Unexp::Eager {
                ack: Some((p, id, epoch)),
                ..
            } => self.ack_in(p, id, epoch, 0),
            Unexp::Eager { .. } => {}
            Unexp::Rts {
                peer, id, epoch, ..
            } => {
                if self.peer(peer).epoch == epoch {
                    self.frame(peer, Frame::Cts { id, rx: NO_RX }, Body::None, None);
                }
            }
        }
    }

    /// A receive took a buffered message: an eager one's bytes are copied in and it
    /// completes; a large one starts on its way (`rts_taken`).
    fn deliver_unexpected(&mut self, slot: RecvSlot, u: Unexpected<Unexp>) {
        let data = u.has_data.then_some(u.data);
        let discard = slot.op_flags & FI_DISCARD != 0;
        match u.payload {
            Unexp::Eager { bytes, from, ack } => {
                let got = if discard {
                    0
                } else {
                    // SAFETY: the receive's buffer is ours until it completes.
                    unsafe { slot.iov.copy_in(0, &bytes) }
                };
                if let Some((p, id, epoch)) = ack {
                    let status = if discard {
                        0
                    } else {
                        self.sink_status(&slot, got)
                    };
                    self.ack_in(p, id, epoch, status);
                }
                self.push_rx(Done::Rx {
                    slot,
                    len: got,
                    olen: if discard { 0 } else { u.len - got },
                    tag: u.tag,
                    data,
                    src: u.src,
                    raw: self.raw_of(from, u.src),
                });
            }
            Unexp::Rts {
                peer,
                id,
                epoch,
                desc,
            } => {
                let pipe = RxPipe {
                    slot,
                    peer,
                    tx_id: id,
                    len: u.len,
                    tag: u.tag,
                    data,
                    src: u.src,
                    desc,
                    gen: 0,
                    copying: false,
                    ended: 0,
                };
                self.rts_taken(pipe, epoch);
            }
        }
    }

    /// A receive's completion (or failure), its slot finished with the receive queue first:
    /// the last message of an exhausted multi-receive buffer carries `FI_MULTI_RECV`.
    pub(super) fn push_rx(&mut self, mut d: Done) {
        if let Done::Rx { slot, .. } | Done::SlotErr { slot, .. } = &mut d {
            self.rxq.finish_slot(slot);
        }
        self.done.push(d);
    }

    /// The status to acknowledge a message with once its `len` bytes are in `slot`
    /// (`EpCore::land_before_ack`: where that fails, the sender hears `FI_EIO`).
    pub(super) fn sink_status(&self, slot: &RecvSlot, len: usize) -> i32 {
        // SAFETY: the slot is ours until the completion pushed after this acknowledgement,
        // and it holds the received bytes.
        if !unsafe { self.core.land_before_ack(slot, len) } {
            FI_EIO
        } else {
            0
        }
    }

    /// Names `peer`'s address (as raw bytes), for the completions of its messages when the
    /// address vector does not know it and the endpoint reports those (`FI_SOURCE_ERR`).
    pub fn name_peer(&mut self, peer: PeerId, raw: Vec<u8>) {
        if self.core.caps & FI_SOURCE_ERR != 0 {
            self.peer(peer).raw = Some(raw);
        }
    }

    /// Messages buffered from senders the AV did not hold when they came (`FI_ADDR_NOTAVAIL`):
    /// each takes the source `now` gives for its sender, where it gives one (the sender was
    /// inserted since).
    pub fn resolve_sources(&mut self, now: impl Fn(PeerId) -> Option<FiAddr>) {
        for u in self.rxq.unexpected_mut() {
            if u.src == FI_ADDR_NOTAVAIL {
                if let Some(a) = now(u.owner) {
                    u.src = a;
                }
            }
        }
        // A message whose body is still arriving, matched to no receive yet, is buffered or
        // matched when it ends, as the source its header was given.
        for (p, ps) in self.peers.iter_mut().enumerate() {
            if let Some(Pending::Msg(MsgBody { slot: None, m, .. })) = &mut ps.pending {
                if m.src == FI_ADDR_NOTAVAIL {
                    if let Some(a) = now(p) {
                        m.src = a;
                    }
                }
            }
        }
    }

    /// The raw address a completion from `peer` known as `src` carries.
    pub(super) fn raw_of(&self, peer: PeerId, src: FiAddr) -> Option<Vec<u8>> {
        if src != FI_ADDR_NOTAVAIL {
            return None;
        }
        self.peers.get(peer).and_then(|ps| ps.raw.clone())
    }

    /// Whether one more unexpected message of `len` bytes from `peer` would pass the bounds:
    /// the endpoint's, counting bodies still arriving, and the peer's share, of the bytes and
    /// of the messages (as `unexp_peer_bytes` is of `unexp_bytes`: else one peer's empty
    /// messages, `UNEXP_OVERHEAD` bytes each, take every message's place from the others).
    pub(super) fn unexpected_full(&self, peer: PeerId, len: usize) -> bool {
        let c = len.saturating_add(UNEXP_OVERHEAD);
        let mine = self.peers.get(peer).map_or(0, |ps| ps.inflight);
        let msg_share = (self.cfg.unexp_msgs as u128 * self.cfg.unexp_peer_bytes as u128
            / self.cfg.unexp_bytes.max(1) as u128)
            .clamp(1, self.cfg.unexp_msgs.max(1) as u128) as usize;
        self.rxq.unexpected_len() >= self.cfg.unexp_msgs
            || self.rxq.msgs_by(peer) >= msg_share
            || self
                .rxq
                .unexpected_bytes()
                .saturating_add(self.inflight)
                .saturating_add(c)
                > self.cfg.unexp_bytes
            || self
                .rxq
                .held_by(peer)
                .saturating_add(mine)
                .saturating_add(c)
                > self.cfg.unexp_peer_bytes
    }

    /// An unexpected body of `len` bytes starts arriving from `peer` into a buffer: charged
    /// now, before the buffer exists, so that a body that never finishes holds no more than
    /// the bounds allow.
    pub(super) fn start_inflight(&mut self, peer: PeerId, len: usize) {
        let c = len + UNEXP_OVERHEAD;
        self.inflight += c;
        self.peer(peer).inflight = c;
    }

    /// The unexpected body `peer` was sending ended (arrived, or was abandoned): its charge
    /// leaves `inflight` (an arrived one is charged to the receive queue from then on).
    pub(super) fn end_inflight(&mut self, peer: PeerId) {
        let c = std::mem::take(&mut self.peer(peer).inflight);
        self.inflight -= c;
    }

    /// What the endpoint buffers for messages no receive took yet.
    pub fn buffered(&self) -> crate::ep::Buffered {
        crate::ep::Buffered {
            unexpected: self.rxq.unexpected_len(),
            unexpected_bytes: self.rxq.unexpected_bytes() + self.inflight,
            held: 0,
        }
    }

    /// Sets `FI_OPT_MIN_MULTI_RECV`.
    pub fn set_min_multi_recv(&mut self, v: usize) {
        self.rxq.min_multi_recv = v;
    }
}
