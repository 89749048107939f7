//! Ordering. At the initiator, `FI_FENCE`: the operation, and every later one to the same
//! peer, is held until the peer has answered every earlier request of this endpoint. At the
//! target: a peer's next requests wait (`Sink::Wait`) behind copies serving its earlier ones
//! (`rma_copy`), and its writes and atomics behind answers to its reads that still carry the
//! memory read.

use super::*;
use crate::rdm::transport::detach_frame;
use crate::rxq::RawIov;

/// An operation held back by `FI_FENCE` (or queued behind one), with a copy of inject data.
/// (Atomics are not held: a fenced one answers `Again` until its peer is drained.)
pub(super) enum Fenced {
    Send(TxOp, Option<Body>),
    Rma(RmaOp, Option<Body>),
    /// An armed send (its request's token) that fired while operations to its peer were
    /// held (`armed`): its request stays armed (taking no answer) until its `Rts` goes. Its
    /// request counts against `tx_max` already: not in `held`.
    Armed(u64),
}

impl Engine {
    /// Holds an operation back if it is fenced (or others to its peer already wait).
    pub(super) fn fence(&mut self, peer: PeerId, flags: u64, f: impl FnOnce() -> Fenced) -> bool {
        if self.releasing {
            return false;
        }
        let ps = self.peer(peer);
        let hold = !ps.fenced.is_empty() || (flags & FI_FENCE != 0 && ps.outstanding > 0);
        if hold {
            ps.fenced.push_back(f());
            self.held += 1;
        }
        hold
    }

    /// Whether an atomic with `flags` would be held (as `fence` decides): it is not kept,
    /// the caller answers `Again` instead.
    pub(super) fn atomic_fenced(&mut self, peer: PeerId, flags: u64) -> bool {
        !self.releasing
            && (!self.peer(peer).fenced.is_empty()
                || (flags & FI_FENCE != 0 && self.peer(peer).outstanding > 0))
    }

    /// `peer` has no request outstanding any more: the operations held for it start, in
    /// order, up to the next fenced one while others are outstanding again.
    pub(super) fn release_fenced(&mut self, peer: PeerId) {
        self.releasing = true;
        while let Some(f) = self.peers[peer].fenced.front() {
            let fenced = match f {
                Fenced::Send(op, _) => op.flags & FI_FENCE != 0,
                Fenced::Rma(op, _) => op.flags & FI_FENCE != 0,
                Fenced::Armed(..) => false,
            };
            if fenced && self.peers[peer].outstanding > 0 {
                break;
            }
            let f = self.peers[peer].fenced.pop_front().expect("front exists");
            self.held -= usize::from(!matches!(f, Fenced::Armed(_)));
            // SAFETY: the held operation's memory is the caller's until it completes (or the
            // engine's own copy of inject data, moved into the frame's body here).
            let r = unsafe {
                match f {
                    Fenced::Send(op, copy) => self.send_now(peer, &op, copy),
                    Fenced::Rma(op, copy) => self.rma_now(peer, &op, copy),
                    Fenced::Armed(token) => {
                        self.release_armed(token);
                        Ok(())
                    }
                }
            };
            if let Err((ctx, flags, e)) = r {
                self.done.push(Done::TxErr {
                    ctx,
                    flags,
                    err: e.errno(),
                });
            }
        }
        self.releasing = false;
    }

    /// Cancels the held operation with context `ctx`, if there is one.
    pub(super) fn cancel_held(&mut self, ctx: Context) -> bool {
        for ps in &mut self.peers {
            // An armed send's frame is not canceled here: its request is under way.
            let at = ps.fenced.iter().position(|f| match f {
                Fenced::Send(op, _) => op.ctx == ctx,
                Fenced::Rma(op, _) => op.ctx == ctx,
                Fenced::Armed(..) => false,
            });
            if let Some(i) = at {
                let (ctx, flags) = fenced_ctx(&ps.fenced.remove(i).expect("found"));
                self.held -= 1;
                self.done.push(Done::TxErr {
                    ctx,
                    flags,
                    err: FI_ECANCELED,
                });
                return true;
            }
        }
        false
    }

    /// Takes every operation held for `peer` out of the fenced queue (the peer was lost, the
    /// endpoint closed): no later release starts them.
    pub(super) fn take_held(&mut self, peer: PeerId) -> Vec<Fenced> {
        let fenced: Vec<Fenced> = self.peers[peer].fenced.drain(..).collect();
        self.held -= fenced
            .iter()
            .filter(|f| !matches!(f, Fenced::Armed(_)))
            .count();
        fenced
    }

    /// Ends operations taken by `take_held` with `err`.
    pub(super) fn fail_held(&mut self, fenced: Vec<Fenced>, err: i32) {
        for f in fenced {
            // An armed send's request ends with the others outstanding to its peer.
            if matches!(f, Fenced::Armed(..)) {
                continue;
            }
            let (ctx, flags) = fenced_ctx(&f);
            self.done.push(Done::TxErr { ctx, flags, err });
        }
    }

    /// Whether `peer`'s next requests wait for copies serving its earlier ones.
    fn holding(&self, peer: PeerId) -> bool {
        !self.served.is_empty() && self.served.iter().any(|(_, s)| s.peer == peer)
    }

    /// Whether `peer`'s next request of `kind` waits: behind copies serving its earlier
    /// ones, behind the answers it does not read past what it may owe (`OWED_MAX`), and a
    /// write or atomic also behind the answers to its reads that still carry the memory
    /// read.
    pub(super) fn must_wait(&self, peer: PeerId, kind: Kind) -> bool {
        if kind.is_answer() {
            return false;
        }
        self.holding(peer)
            || self
                .peers
                .get(peer)
                .is_some_and(|ps| ps.owed >= OWED_MAX || ps.owed_bytes >= OWED_BYTES_MAX)
            || (matches!(kind, Kind::Write | Kind::Atomic)
                && self.peers.get(peer).is_some_and(|ps| ps.reading > 0))
    }

    /// Whether `f`, a write of `peer` that `must_wait` holds, waits only behind the answers
    /// to its reads and changes none of the memory they carry (`PeerState::answered`): it
    /// then goes ahead, and two peers that read more from each other than a transport copies
    /// (`detach_answers`) and then write elsewhere do not wait for each other. One whose
    /// ranges do not pass the key check now waits as before (a region registered meanwhile,
    /// on another thread, could pass it when the write runs); one into device memory, or an
    /// atomic, too. Ranges are this process's addresses: memory mapped at two addresses and
    /// registered at both is not seen as one.
    pub(super) fn write_clear_of_answers(&self, peer: PeerId, f: &Frame) -> bool {
        let Frame::Write { segs, .. } = f else {
            return false;
        };
        let Some(ps) = self.peers.get(peer) else {
            return false;
        };
        if self.holding(peer) || ps.answered_all {
            return false;
        }
        match target::resolve(&self.core, segs, FI_REMOTE_WRITE) {
            Err(_) | Ok((_, Some(_))) => false,
            Ok((iov, None)) => !ps.answered.iter().any(|a| overlaps(a.segs(), iov.segs())),
        }
    }

    /// `peer`'s next request of `kind` waits (`must_wait`). A write or atomic that waits
    /// only behind the answers to the peer's reads would wait for the peer to read them; but
    /// a stream transport reads nothing more from a peer while one of its frames waits, so
    /// two peers that each read from the other and then write would wait for each other for
    /// ever. Those answers' bodies are copied instead, at the next `transmit` where the
    /// transport holds them (`Transport::detach`, within its bound), and the write goes
    /// ahead.
    pub(super) fn detach_for(&mut self, peer: PeerId, kind: Kind) {
        if !matches!(kind, Kind::Write | Kind::Atomic) || self.holding(peer) {
            return;
        }
        if let Some(ps) = self.peers.get_mut(peer).filter(|ps| ps.reading > 0) {
            ps.detach = true;
            self.detaching = true;
        }
    }

    /// The answers to reads of peers whose writes wait (`detach_for`) no longer carry the
    /// memory read: each body, where the engine or the transport holds it, becomes a copy,
    /// and stops counting in `reading`.
    pub(super) fn detach_answers(&mut self, tr: &mut impl Transport) {
        self.detaching = false;
        for p in 0..self.peers.len() {
            if !std::mem::take(&mut self.peers[p].detach) {
                continue;
            }
            // What the engine would copy of its own counts against the transport's bound:
            // past it, nothing is copied and the write keeps waiting.
            let own: usize = self
                .frames_to(p)
                .filter(|t| t.token == Some(READ_SENT))
                .map(|t| t.body.len())
                .sum();
            let Some(theirs) = tr.detach(p, READ_SENT, own) else {
                continue;
            };
            let mine = self
                .frames_to(p)
                .map(|t| detach_frame(t, READ_SENT))
                .filter(|&d| d)
                .count();
            let ps = &mut self.peers[p];
            ps.answers_taken(theirs + mine);
        }
    }

    /// Whether frames from `peer` that this endpoint asked for are awaited: answers to its
    /// requests, the data of a large message or of a served write. A transport that holds a
    /// peer's requests back (flow control) gives way further while they are, since such
    /// frames may come behind what it holds.
    pub fn awaits(&self, peer: PeerId) -> bool {
        self.peers.get(peer).is_some_and(|ps| ps.outstanding > 0)
            || self.rx.iter().any(|(_, r)| r.peer == peer && !r.copying)
            || self
                .served
                .iter()
                .any(|(_, s)| s.peer == peer && !s.copying)
    }
}

/// Answers to one peer's reads whose ranges are kept (`PeerState::answered`); past it, every
/// write of that peer is taken to change what they carry.
const ANSWERED_MAX: usize = 16;

impl PeerState {
    /// An answer to this peer's read now carries `iov`, the memory read.
    pub(super) fn answering(&mut self, iov: IovList) {
        self.reading += 1;
        if self.answered.len() < ANSWERED_MAX {
            self.answered.push(iov);
        } else {
            self.answered_all = true;
        }
    }

    /// `n` answers to this peer's reads were taken, copied or dropped: once none is left,
    /// the ranges they carried are forgotten.
    pub(super) fn answers_taken(&mut self, n: usize) {
        self.reading = self.reading.saturating_sub(n);
        if self.reading == 0 {
            self.answered.clear();
            self.answered_all = false;
        }
    }
}

/// Whether any range of `a` shares a byte with any of `b`.
fn overlaps(a: &[RawIov], b: &[RawIov]) -> bool {
    a.iter().any(|x| {
        b.iter().any(|y| {
            x.len > 0
                && y.len > 0
                && x.addr < y.addr.saturating_add(y.len)
                && y.addr < x.addr.saturating_add(x.len)
        })
    })
}

/// A held operation's context and flags, for its completion.
fn fenced_ctx(f: &Fenced) -> (Context, u64) {
    match f {
        Fenced::Send(op, _) => (op.ctx, op.flags),
        Fenced::Rma(op, _) => (op.ctx, op.flags),
        Fenced::Armed(..) => (0, 0),
    }
}
