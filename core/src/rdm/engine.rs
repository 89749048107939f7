//! The engine proper: one per endpoint, driven by its provider under the provider's lock.
//!
//! Calls in: `post_send` / `post_recv` / `post_rma` / `post_atomic` / `cancel` from the
//! application's side; `on_ctrl` / `on_body` (or `on_frame`, for a frame the transport holds
//! whole) / `on_sent` / `on_copied` / `on_lost` from the transport; `close`. Work out: `transmit` (frames to send, in order per peer, to a
//! `Transport` that may give a frame back when its peer is full; `poll_transmit` takes them
//! one by one), `poll_copy` (one-sided copies for the transport to perform) and `take_done`
//! (completions, reported with [`report`] after the provider's lock is released, so that a
//! counter the completion bumps may start a triggered operation on this endpoint).
//!
//! Protocols (per operation):
//! - message up to `eager_max`: `Msg` with the data as its body. A matched receive takes the
//!   body straight into its buffer (`Sink::Iov`); an unexpected one is buffered. Completes
//!   when the transport has sent it, or on the target's `Ack` for delivery / match complete.
//! - larger message: `Rts`; the receiver answers `Cts` once a receive matches (or a
//!   discarding one drops it), the sender sends `Data` from the application's buffer into the
//!   receive's buffer, the receiver `Ack`s. No large message is ever buffered unexpected.
//!   Where the transports copy one-sidedly (`with_one_sided`), the `Rts` of a message from
//!   their `pull_min` carries the sender's `Desc`, and on match the receiver's transport
//!   copies it (`poll_copy`, `on_copied`) instead of `Cts`/`Data`; a refused copy falls back
//!   to them.
//! - RMA write: `Write` with the data; the target checks keys and ranges (`target::resolve`)
//!   and takes the body straight into its memory, then `Ack`s (after `msync` for commit
//!   complete). Read: `Read`; the target answers `ReadResp` with its memory as the body.
//!   Atomic: `Atomic` with the operands; `target::atomic`; `AtomicResp` with the original
//!   values, or an `Ack`.
//! - `FI_FENCE`: the operation, and every later one to the same peer, waits until the peer
//!   has answered every earlier request of this endpoint.
//! - A lost peer fails every outstanding operation toward it with the transport's errno, and
//!   every large message it was sending us; what it fully sent before is delivered.
//!
//! The transport must deliver frames to a peer in the order they were sent (a stream, or an
//! ordered channel per peer) and keep a body's memory (`Body::Iov`) until `on_sent`.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::consts::errno::*;
use crate::consts::*;
use crate::entry::Context;
use crate::ep::{EpCore, TxOp, INJECT_CALL};
use crate::ep_atomic::{AtomicReq, ATOMIC_MAX};
use crate::ep_rma::{RmaIovList, RmaOp};
use crate::error::{Error, Result};
use crate::hmem_stage;
use crate::rxq::{IovList, PostResult, PostedRecv, RecvQueue, RecvSlot, Unexpected};
use crate::FiAddr;

use super::done::Done;
use super::target;
use super::transport::{Desc, OneSided, Transport};

use super::wire::{self, flags, Frame, Prefix, WireError};
use super::{Body, PeerId, Sink, Transmit};

mod copy;
mod msg;
mod native;
mod rma;
use copy::{Serve, SERVE};
use msg::{Landed, ON_TAKE};

/// Largest eager body any engine accepts, whatever its peer's `eager_max`: a `Msg` announcing
/// more is garbage.
pub const EAGER_LIMIT: usize = 1 << 20;
/// `Cts::rx` of a discarding receive: complete, send nothing.
const NO_RX: u32 = u32::MAX;
/// The token of a read's answer whose body is the memory read (`Engine::read_resp`).
const READ_SENT: u64 = u64::MAX;
/// Bookkeeping charged per buffered unexpected message on top of its payload.
const UNEXP_OVERHEAD: usize = 128;

/// What the engine is told at creation.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Messages up to this size go eagerly (capped at [`EAGER_LIMIT`]).
    pub eager_max: usize,
    /// Most unexpected messages buffered at once; past it (or past `unexp_bytes`), a message
    /// no posted receive takes is answered `Sink::Wait`: it stays with the transport, which
    /// stops reading that peer until a receive takes it. Nothing is dropped.
    pub unexp_msgs: usize,
    /// Most bytes (payload and bookkeeping) the buffered unexpected messages may hold, with
    /// the bodies still arriving into buffers: a body is charged when its header is
    /// accepted, before its buffer is allocated.
    pub unexp_bytes: usize,
    /// Most of those bytes one peer may hold, so that one peer (or a crowd of them, each at
    /// its share) cannot take all of `unexp_bytes` from the others.
    pub unexp_peer_bytes: usize,
    /// Most operations outstanding at once (`tx_attr.size`); past it posts answer `Again`.
    pub tx_max: usize,
    /// The transport's taking a frame (`Transport::send` answering `Ok`) puts it in the
    /// peer's memory (shm's rings are in the receiver's segment): a message of at most
    /// `INLINE_BODY` bytes is then copied into its frame and completes when taken, with no
    /// request kept (`FI_TRANSMIT_COMPLETE` holds: it was delivered to the peer endpoint).
    /// Off, it completes when the transport reports it sent (`on_sent`). On, too, an eager
    /// message that `send_in_place` has the transport write in place completes at once.
    pub delivered_on_take: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            eager_max: 65536,
            unexp_msgs: 16384,
            unexp_bytes: 32 << 20,
            unexp_peer_bytes: 8 << 20,
            tx_max: 1024,
            delivered_on_take: false,
        }
    }
}

/// An operation this endpoint initiated, until its peer has answered.
struct TxReq {
    ctx: Context,
    flags: u64,
    peer: PeerId,
    /// The send's data, the write's source, the read's destination, the fetch's result.
    iov: IovList,
    /// Bytes expected back (a read's length, a fetch's result length).
    want: usize,
    /// Bumped per slot reuse, so a stale token or id from a peer cannot reach a newer request.
    gen: u32,
    /// Frames of it still with the transport (their memory in use).
    unsent: u8,
    /// `Some(status)` once the peer answered (or no answer is awaited: `Some(0)` at post).
    answer: Option<i32>,
    /// A large message waiting for the receiver's `Cts`.
    rts: bool,
    /// Its `Rts` offered a descriptor: the receiver may copy the data itself and answer
    /// `Ack` instead of `Cts`.
    pull: bool,
    /// The transport's NIC carries it out (`transport::Native`): only the transport
    /// answers it (`on_native`), never a peer's frame.
    native: bool,
}

impl TxReq {
    /// A request with nothing awaited yet beyond its answer: no bytes back, no frame with
    /// the transport, no large message.
    fn new(ctx: Context, flags: u64, peer: PeerId, iov: IovList) -> TxReq {
        TxReq {
            ctx,
            flags,
            peer,
            iov,
            want: 0,
            gen: 0,
            unsent: 0,
            answer: None,
            rts: false,
            pull: false,
            native: false,
        }
    }

    /// Whether an `Ack` answers it: not a read or a fetch (their answers carry data), not a
    /// large message still waiting for `Cts`, not one answered already.
    fn takes_ack(&self) -> bool {
        self.answer.is_none()
            && (!self.rts || self.pull)
            && self.want == 0
            && self.flags & (FI_RMA | FI_READ) != FI_RMA | FI_READ
    }
}

/// A peer's status as an errno: 0, or positive; a negative one (no engine sends it) is a
/// failure too, never a success.
fn peer_status(status: i32) -> i32 {
    if status < 0 {
        FI_EIO
    } else {
        status
    }
}

/// A buffered unexpected message.
enum Unexp {
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

/// A matched large message waiting for its `Data`, or for the transport's copy of it.
struct RxPipe {
    slot: RecvSlot,
    peer: PeerId,
    tx_id: u32,
    len: usize,
    tag: u64,
    data: Option<u64>,
    src: FiAddr,
    /// The sender's descriptor of its memory (empty: frames only).
    desc: Desc,
    /// Bumped per slot reuse, like `TxReq::gen`, for the copy's token.
    gen: u32,
    /// A copy of it is asked for or under way: the receive's buffer is the transport's until
    /// `on_copied`.
    copying: bool,
    /// It ended (the peer was lost, the endpoint closed) while copying: the errno its receive
    /// fails with once the copy reports.
    ended: i32,
}

/// What the body now arriving from a peer is for (`on_ctrl` to `on_body`).
enum Pending {
    Msg {
        slot: Option<RecvSlot>,
        tagged: bool,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
        len: usize,
        id: u32,
        fl: u8,
    },
    Data {
        rx: usize,
    },
    Write {
        id: u32,
        fl: u8,
        data: Option<u64>,
        status: i32,
        len: usize,
        dest: IovList,
        staged: Option<Context>,
    },
    ReadResp {
        id: usize,
        status: i32,
    },
    Atomic {
        id: u32,
        fl: u8,
        op: u32,
        datatype: u32,
        count: u32,
        addr: u64,
        key: u64,
    },
    AtomicResp {
        id: usize,
        status: i32,
    },
    /// A frame without a body, or one dropped.
    Nothing,
}

/// An operation held back by `FI_FENCE` (or queued behind one), with a copy of inject data.
/// (Atomics are not held: a fenced one answers `Again` until its peer is drained.)
enum Fenced {
    Send(TxOp, Option<Body>),
    Rma(RmaOp, Option<Body>),
}

#[derive(Default)]
struct PeerState {
    /// Requests to this peer not yet answered.
    outstanding: usize,
    /// Of those, the ones the transport's NIC carries out.
    natives: usize,
    fenced: VecDeque<Fenced>,
    pending: Option<Pending>,
    /// Bumped on every loss.
    epoch: u64,
    /// Ranges this peer wrote since its last commit (`FI_RMA_PMEM` endpoints).
    dirty: Vec<(usize, usize)>,
    /// Frames the transport gave back (the peer could not take them then), and those to the
    /// same peer queued after them, in order.
    blocked: VecDeque<Transmit>,
    /// Its address, where the transport named it (`Engine::name_peer`).
    raw: Option<Vec<u8>>,
    /// Bytes charged for the unexpected body now arriving from it into a buffer (0 or one
    /// message's: a peer sends one body at a time).
    inflight: usize,
    /// Answers to its reads whose bodies (the memory read) the transport has not taken yet.
    reading: usize,
    /// Small messages that complete when the transport takes their frame (`ON_TAKE`), in
    /// the order they were queued: their context and flags.
    untaken: VecDeque<(Context, u64)>,
    /// The transport refused a copy with this peer (the kernel forbids reaching its
    /// process, say): its large messages and RMA go through frames from now on. Per peer,
    /// so that one peer the transport cannot reach costs no other peer its copies.
    pull_refused: bool,
}

/// The protocol state of one endpoint.
pub struct Engine {
    core: Arc<EpCore>,
    cfg: Config,
    rxq: RecvQueue<Unexp>,
    tx: slab::Slab<TxReq>,
    gen: u32,
    rx: slab::Slab<RxPipe>,
    peers: Vec<PeerState>,
    out: VecDeque<Transmit>,
    /// Frames in the peers' `blocked` queues.
    blocked: usize,
    done: Vec<Done>,
    /// The transport's one-sided copies, if it has them.
    one_sided: Option<Box<dyn OneSided>>,
    /// Copies asked for and not yet taken by the transport.
    copies: VecDeque<super::transport::CopyReq>,
    /// Operations for the transport's NIC, not yet taken by the transport.
    natives: VecDeque<super::transport::Native>,
    /// RMA requests of peers this endpoint serves through the transport's copies (or, where
    /// it cannot copy, a write whose data it asked for with `Cts`).
    served: slab::Slab<Serve>,
    /// Set while the fenced queue is being released, so a released op is not held again.
    releasing: bool,
    /// Operations in the peers' `fenced` queues, all peers together: they count against
    /// `tx_max` like outstanding ones.
    held: usize,
    /// The peers' `inflight` bytes, all together (charged against `unexp_bytes`).
    inflight: usize,
    closed: bool,
}

fn token(id: usize, gen: u32) -> u64 {
    (gen as u64) << 32 | id as u64
}

impl Engine {
    /// An engine for the endpoint `core`.
    pub fn new(core: Arc<EpCore>, cfg: Config) -> Self {
        let directed = core.caps & FI_DIRECTED_RECV != 0;
        Engine {
            core,
            cfg: Config {
                eager_max: cfg.eager_max.min(EAGER_LIMIT),
                ..cfg
            },
            rxq: RecvQueue::new(directed),
            tx: slab::Slab::new(),
            gen: 0,
            rx: slab::Slab::new(),
            peers: Vec::new(),
            out: VecDeque::new(),
            blocked: 0,
            done: Vec::new(),
            one_sided: None,
            copies: VecDeque::new(),
            natives: VecDeque::new(),
            served: slab::Slab::new(),
            releasing: false,
            held: 0,
            inflight: 0,
            closed: false,
        }
    }

    /// Lets the engine use the transport's one-sided copies for large messages.
    pub fn with_one_sided(mut self, t: Box<dyn OneSided>) -> Self {
        self.one_sided = Some(t);
        self
    }

    /// The next copy the transport is to perform, if any (see [`CopyReq`]).
    ///
    /// [`CopyReq`]: super::transport::CopyReq
    pub fn poll_copy(&mut self) -> Option<super::transport::CopyReq> {
        self.copies.pop_front()
    }

    fn peer(&mut self, p: PeerId) -> &mut PeerState {
        if self.peers.len() <= p {
            self.peers.resize_with(p + 1, PeerState::default);
        }
        &mut self.peers[p]
    }

    /// The next frame to send, if any: frames to one peer come in the order they are to be
    /// sent.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut t = None;
        if self.blocked > 0 {
            if let Some(ps) = self.peers.iter_mut().find(|ps| !ps.blocked.is_empty()) {
                self.blocked -= 1;
                t = ps.blocked.pop_front();
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
        let mut n = 0;
        if self.blocked > 0 {
            for p in 0..self.peers.len() {
                while let Some(t) = self.peers[p].blocked.pop_front() {
                    if let Err(t) = self.hand(tr, t) {
                        self.peers[p].blocked.push_front(t);
                        break;
                    }
                    self.blocked -= 1;
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
            self.peers[p].blocked.push_back(t);
            self.blocked += 1;
        }
        n
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

    /// Completions gathered since the last call, to `report` without the provider's lock.
    pub fn take_done(&mut self) -> Vec<Done> {
        std::mem::take(&mut self.done)
    }

    /// `take_done` onto the end of `out`: a provider that keeps `out` between calls, and
    /// the engine its own vector, allocate nothing per completion.
    pub fn take_done_into(&mut self, out: &mut Vec<Done>) {
        if self.done.is_empty() {
            return;
        }
        if out.is_empty() {
            // The two vectors trade allocations: neither is lost.
            std::mem::swap(out, &mut self.done);
        } else {
            out.append(&mut self.done);
        }
    }

    /// Whether anything waits on a peer (for a provider deciding how hard to poll).
    pub fn busy(&self) -> bool {
        !self.tx.is_empty()
            || !self.rx.is_empty()
            || !self.out.is_empty()
            || self.blocked > 0
            || !self.served.is_empty()
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

    /// `fi_setopt` at the endpoint level, for a provider named `provider` (in the error): the
    /// options the engine holds, `FI_OPT_MIN_MULTI_RECV`; any other is `NoSys`.
    pub fn setopt(&mut self, name: i32, value: usize, provider: &str) -> Result<()> {
        match name {
            FI_OPT_MIN_MULTI_RECV => {
                self.set_min_multi_recv(value);
                Ok(())
            }
            _ => Err(Error::NoSys(format!(
                "setopt: option {name} is not supported by {provider}"
            ))),
        }
    }

    #[inline]
    fn frame(&mut self, peer: PeerId, f: Frame, body: Body, token: Option<u64>) {
        let ctrl = f.ctrl(body.len() as u64);
        self.out.push_back(Transmit {
            peer,
            ctrl,
            body,
            token,
        });
    }

    /// Answers a peer's read. Where the body is the memory read itself, the peer's later
    /// requests wait until the transport has taken all of it (`on_sent`): a write it sends
    /// next must not land in what is still being read.
    fn read_resp(&mut self, peer: PeerId, id: u32, status: i32, body: Body) {
        let token = if matches!(body, Body::Iov(_)) {
            self.peer(peer).reading += 1;
            Some(READ_SENT)
        } else {
            None
        };
        self.frame(peer, Frame::ReadResp { id, status }, body, token);
    }

    fn ack(&mut self, peer: PeerId, id: u32, status: i32) {
        self.frame(peer, Frame::Ack { id, status }, Body::None, None);
    }

    /// A deferred acknowledgement of a message that arrived in the peer's `epoch`: dropped
    /// if the peer was lost since (its request already failed, and its id may be reused).
    fn ack_in(&mut self, peer: PeerId, id: u32, epoch: u64, status: i32) {
        if self.peer(peer).epoch == epoch {
            self.ack(peer, id, status);
        }
    }

    fn new_tx(&mut self, t: TxReq) -> (usize, u32) {
        self.gen = self.gen.wrapping_add(1);
        let gen = self.gen;
        let peer = t.peer;
        let id = self.tx.insert(TxReq { gen, ..t });
        self.peer(peer).outstanding += 1;
        (id, gen)
    }

    /// Completes request `id` if both its frames are sent and its answer is in.
    fn maybe_complete(&mut self, id: usize) {
        let Some(t) = self.tx.get(id) else { return };
        let (Some(status), 0) = (t.answer, t.unsent) else {
            return;
        };
        let t = self.tx.remove(id);
        self.settle(t, status);
    }

    fn settle(&mut self, t: TxReq, status: i32) {
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

    /// Tells the transport that `t`'s offer of its memory (if it made one) has ended.
    fn offer_ended(&self, t: &TxReq) {
        if let (true, Some(os)) = (t.pull, &self.one_sided) {
            os.offer_ended(t.peer, &t.iov);
        }
    }

    fn check_open(&self, what: &'static str) -> Result<()> {
        if self.closed {
            return Err(Error::OpBadState(format!("{what}: endpoint is closed")));
        }
        Ok(())
    }

    /// `check_open`, and room for one more outstanding operation.
    fn check_room(&self, what: &'static str) -> Result<()> {
        self.check_open(what)?;
        debug_assert_eq!(
            self.held,
            self.peers.iter().map(|p| p.fenced.len()).sum::<usize>()
        );
        if self.tx.len() + self.held >= self.cfg.tx_max {
            return Err(Error::Again(what));
        }
        Ok(())
    }

    /// Holds an operation back if it is fenced (or others to its peer already wait).
    fn fence(&mut self, peer: PeerId, flags: u64, f: impl FnOnce() -> Fenced) -> bool {
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

    fn release_fenced(&mut self, peer: PeerId) {
        self.releasing = true;
        while let Some(f) = self.peers[peer].fenced.front() {
            let fenced = match f {
                Fenced::Send(op, _) => op.flags & FI_FENCE != 0,
                Fenced::Rma(op, _) => op.flags & FI_FENCE != 0,
            };
            if fenced && self.peers[peer].outstanding > 0 {
                break;
            }
            let f = self.peers[peer].fenced.pop_front().expect("front exists");
            self.held -= 1;
            // SAFETY: the held operation's memory is the caller's until it completes (or the
            // engine's own copy of inject data, moved into the frame's body here).
            let r = unsafe {
                match f {
                    Fenced::Send(op, copy) => self.send_now(peer, &op, copy),
                    Fenced::Rma(op, copy) => self.rma_now(peer, &op, copy),
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

    /// Starts a send to `peer`.
    ///
    /// # Safety
    /// `op.iov` stays readable until the operation completes (during the call only with
    /// `FI_INJECT`).
    pub unsafe fn post_send(&mut self, peer: PeerId, op: &TxOp) -> Result<()> {
        self.check_room("send")?;
        let inject = op.flags & (FI_INJECT | INJECT_CALL) != 0;
        // SAFETY: the caller's contract keeps the iov readable during the call.
        let copy = || unsafe { inject_copy(inject, &op.iov) };
        if self.fence(peer, op.flags, || Fenced::Send(*op, copy())) {
            return Ok(());
        }
        let c = copy();
        // SAFETY: forwarded.
        unsafe { self.send_now(peer, op, c) }.map_err(|(_, _, e)| e)
    }

    unsafe fn send_now(
        &mut self,
        peer: PeerId,
        op: &TxOp,
        copy: Option<Body>,
    ) -> std::result::Result<(), (Context, u64, Error)> {
        let len = op.iov.total();
        let (fl, ack) = msg_flags(op.flags);
        match copy {
            // An inject awaiting no answer: complete now, no request to keep.
            Some(body) if !ack => {
                let f = Frame::Msg {
                    id: 0,
                    tag: op.tag,
                    data: op.data,
                    flags: fl,
                };
                self.frame(peer, f, body, None);
                self.done.push(Done::Tx {
                    ctx: op.ctx,
                    flags: op.flags,
                });
                return Ok(());
            }
            _ => {}
        }
        if self.cfg.delivered_on_take && !ack && len <= super::INLINE_BODY {
            // SAFETY: the caller's contract keeps the iov readable during the call.
            unsafe { self.send_small(peer, op, fl) };
            return Ok(());
        }
        if len <= self.cfg.eager_max || copy.is_some() {
            let body = copy.unwrap_or(Body::Iov(op.iov));
            let owned = !matches!(body, Body::Iov(_));
            let (id, gen) = self.new_tx(TxReq {
                unsent: u8::from(!owned),
                answer: (!ack).then_some(0),
                ..TxReq::new(op.ctx, op.flags, peer, op.iov)
            });
            let f = Frame::Msg {
                id: id as u32,
                tag: op.tag,
                data: op.data,
                flags: fl,
            };
            self.frame(peer, f, body, (!owned).then(|| token(id, gen)));
            self.maybe_complete(id);
            return Ok(());
        }
        let desc = self.offer(peer, &op.iov);
        let (id, _) = self.new_tx(TxReq {
            rts: true,
            pull: !desc.is_empty(),
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let f = Frame::Rts {
            id: id as u32,
            tag: op.tag,
            data: op.data,
            len: len as u64,
            flags: fl & (flags::TAGGED | flags::CQ_DATA),
            desc,
        };
        self.frame(peer, f, Body::None, None);
        Ok(())
    }

    /// Posts a receive.
    ///
    /// # Safety
    /// `r.iov` stays writable, and untouched by anyone else, until the receive completes.
    pub unsafe fn post_recv(&mut self, r: PostedRecv) -> Result<()> {
        self.check_open("recv")?;
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
                if self.peer(peer).epoch != epoch {
                    return self.push_rx(Done::SlotErr {
                        slot,
                        tag: u.tag,
                        err: FI_ECONNRESET,
                    });
                }
                if discard {
                    self.frame(peer, Frame::Cts { id, rx: NO_RX }, Body::None, None);
                    return self.push_rx(Done::Rx {
                        slot,
                        len: 0,
                        olen: 0,
                        tag: u.tag,
                        data,
                        src: u.src,
                        raw: self.raw_of(peer, u.src),
                    });
                }
                self.start_pipe(RxPipe {
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
                });
            }
        }
    }

    fn push_rx(&mut self, mut d: Done) {
        if let Done::Rx { slot, .. } | Done::SlotErr { slot, .. } = &mut d {
            self.rxq.finish_slot(slot);
        }
        self.done.push(d);
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
        for ps in &mut self.peers {
            let at = ps.fenced.iter().position(|f| match f {
                Fenced::Send(op, _) => op.ctx == ctx,
                Fenced::Rma(op, _) => op.ctx == ctx,
            });
            if let Some(i) = at {
                let (ctx, flags) = fenced_ctx(&ps.fenced.remove(i).expect("found"));
                self.held -= 1;
                self.done.push(Done::TxErr {
                    ctx,
                    flags,
                    err: FI_ECANCELED,
                });
                return Ok(());
            }
        }
        Err(Error::NoEntry(format!(
            "cancel: no posted receive or held operation with context {ctx:#x}"
        )))
    }

    /// The request a peer's answer names, if it is that peer's and still outstanding. (A
    /// peer can only name its own requests; answers come once per request, so a slot reused
    /// after its request completed is never named by a well-behaved peer.)
    fn answered(&self, peer: PeerId, id: u32) -> Option<usize> {
        let i = id as usize;
        self.tx
            .get(i)
            .filter(|t| t.peer == peer && !t.native)
            .map(|_| i)
    }

    /// A frame's prefix and control part arrived from `peer` (known to this endpoint's
    /// address vector as `src`, or `FI_ADDR_NOTAVAIL`): where its body goes. `Err`: the peer
    /// speaks garbage; the transport drops it (and reports `on_lost`).
    pub fn on_ctrl(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> std::result::Result<Sink, WireError> {
        let f = wire::decode(prefix, ctrl)?;
        let body = prefix.body_len;
        let bad = || WireError::Malformed(f.kind());
        if self.must_wait(peer, f.kind()) {
            // Ordering: what this peer asks next waits until its copies are done.
            return Ok(Sink::Wait);
        }
        let (sink, pending) = match f {
            Frame::Msg {
                id,
                tag,
                data,
                flags: fl,
            } => {
                if body > EAGER_LIMIT as u64 {
                    return Err(bad());
                }
                let len = body as usize;
                let tagged = fl & flags::TAGGED != 0;
                let data = (fl & flags::CQ_DATA != 0).then_some(data);
                let slot = self.rxq.match_arrival(src, tag, tagged, len);
                let sink = match slot {
                    Some(s) => Sink::Iov(s.iov),
                    None if self.unexpected_full(peer, len) => return Ok(Sink::Wait),
                    None => {
                        // Charged now, before the buffer exists: a body that never finishes
                        // holds no more than the bound allows.
                        let c = len + UNEXP_OVERHEAD;
                        self.inflight += c;
                        self.peer(peer).inflight = c;
                        Sink::Buffer(vec![0; len])
                    }
                };
                let p = Pending::Msg {
                    slot,
                    tagged,
                    tag,
                    data,
                    src,
                    len,
                    id,
                    fl,
                };
                (sink, p)
            }
            Frame::Rts {
                id,
                tag,
                data,
                len,
                flags: fl,
                desc,
            } => {
                let len = usize::try_from(len).map_err(|_| bad())?;
                let tagged = fl & flags::TAGGED != 0;
                let data = (fl & flags::CQ_DATA != 0).then_some(data);
                if !self.rxq.would_match(src, tag, tagged) && self.unexpected_full(peer, 0) {
                    return Ok(Sink::Wait);
                }
                match self.rxq.match_arrival(src, tag, tagged, len) {
                    Some(slot) => self.start_pipe(RxPipe {
                        slot,
                        peer,
                        tx_id: id,
                        len,
                        tag,
                        data,
                        src,
                        desc,
                        gen: 0,
                        copying: false,
                        ended: 0,
                    }),
                    None => {
                        let epoch = self.peer(peer).epoch;
                        self.rxq.push_unexpected(
                            tagged,
                            Unexpected {
                                src,
                                tag,
                                data: data.unwrap_or(0),
                                has_data: data.is_some(),
                                len,
                                held: UNEXP_OVERHEAD,
                                owner: peer,
                                payload: Unexp::Rts {
                                    peer,
                                    id,
                                    epoch,
                                    desc,
                                },
                            },
                        );
                    }
                }
                (Sink::Discard, Pending::Nothing)
            }
            Frame::Cts { id, rx } => {
                if let Some(i) = self.answered(peer, id).filter(|&i| self.tx[i].rts) {
                    let t = &mut self.tx[i];
                    t.rts = false;
                    if rx == NO_RX {
                        t.answer = Some(0);
                        self.maybe_complete(i);
                    } else {
                        t.unsent = 1;
                        let iov = t.iov;
                        let gen = t.gen;
                        self.frame(
                            peer,
                            Frame::Data { rx },
                            Body::Iov(iov),
                            Some(token(i, gen)),
                        );
                    }
                }
                (Sink::Discard, Pending::Nothing)
            }
            Frame::Data { rx } if rx & SERVE != 0 => self.write_data(peer, rx, body)?,
            Frame::Data { rx } => match self.rx.get(rx as usize) {
                Some(r) if r.peer == peer && body == r.len as u64 && !r.copying => {
                    (Sink::Iov(r.slot.iov), Pending::Data { rx: rx as usize })
                }
                _ => return Err(bad()),
            },
            Frame::Ack { id, status } => {
                if let Some(i) = self.answered(peer, id).filter(|&i| self.tx[i].takes_ack()) {
                    self.tx[i].answer = Some(peer_status(status));
                    self.maybe_complete(i);
                }
                (Sink::Discard, Pending::Nothing)
            }
            Frame::Write {
                id,
                data,
                flags: fl,
                segs,
                desc,
            } => {
                if !desc.is_empty() && body == 0 && segs.total() > 0 {
                    self.serve_write(peer, id, data, fl, segs, desc);
                    (Sink::Discard, Pending::Nothing)
                } else {
                    self.write_frame(id, data, fl, &segs, body)
                }
            }
            Frame::Read { id, segs, desc } => {
                if !desc.is_empty() && self.serve_read(peer, id, &segs, desc) {
                    return Ok(Sink::Discard);
                }
                let (status, body) = match target::resolve(&self.core, &segs, FI_REMOTE_READ) {
                    Err(e) => (e, Body::None),
                    Ok((iov, None)) => (0, Body::Iov(iov)),
                    Ok((_, Some(segs))) => match self.core.hmem() {
                        None => (FI_EOPNOTSUPP, Body::None),
                        // SAFETY: the ranges passed the key check: registered memory of
                        // their owners.
                        Some(hm) => match unsafe { hmem_stage::gather(hm, &segs) } {
                            Ok(c) => (0, Body::Owned(c)),
                            Err(_) => (FI_EIO, Body::None),
                        },
                    },
                };
                let len = body.len();
                self.read_resp(peer, id, status, body);
                if status == 0 {
                    self.done.push(Done::Remote {
                        flags: FI_RMA | FI_READ,
                        len,
                        data: None,
                    });
                }
                (Sink::Discard, Pending::Nothing)
            }
            Frame::ReadResp { id, status } => match self.answered(peer, id) {
                Some(i) if self.tx[i].flags & (FI_RMA | FI_READ) == FI_RMA | FI_READ => {
                    let t = &self.tx[i];
                    // Empty where the target's transport copied the bytes in already.
                    if status == 0 && body != t.want as u64 && !(body == 0 && t.pull) {
                        return Err(bad());
                    }
                    let sink = if status == 0 {
                        Sink::Iov(t.iov)
                    } else {
                        Sink::Discard
                    };
                    (sink, Pending::ReadResp { id: i, status })
                }
                _ => (Sink::Discard, Pending::Nothing),
            },
            Frame::Atomic {
                id,
                op,
                datatype,
                count,
                addr,
                key,
                flags: fl,
            } => {
                if body > 2 * ATOMIC_MAX as u64 {
                    return Err(bad());
                }
                let p = Pending::Atomic {
                    id,
                    fl,
                    op,
                    datatype,
                    count,
                    addr,
                    key,
                };
                (Sink::Buffer(vec![0; body as usize]), p)
            }
            Frame::AtomicResp { id, status } => match self.answered(peer, id) {
                Some(i) if self.tx[i].flags & FI_ATOMIC != 0 => {
                    let t = &self.tx[i];
                    if status == 0 && body != t.want as u64 {
                        return Err(bad());
                    }
                    let sink = if status == 0 {
                        Sink::Iov(t.iov)
                    } else {
                        Sink::Discard
                    };
                    (sink, Pending::AtomicResp { id: i, status })
                }
                _ => (Sink::Discard, Pending::Nothing),
            },
        };
        self.peer(peer).pending = Some(pending);
        Ok(sink)
    }

    /// Names `peer`'s address (as raw bytes), for the completions of its messages when the
    /// address vector does not know it and the endpoint reports those (`FI_SOURCE_ERR`).
    pub fn name_peer(&mut self, peer: PeerId, raw: Vec<u8>) {
        if self.core.caps & FI_SOURCE_ERR != 0 {
            self.peer(peer).raw = Some(raw);
        }
    }

    /// The raw address a completion from `peer` known as `src` carries.
    fn raw_of(&self, peer: PeerId, src: FiAddr) -> Option<Vec<u8>> {
        if src != FI_ADDR_NOTAVAIL {
            return None;
        }
        self.peers.get(peer).and_then(|ps| ps.raw.clone())
    }

    /// Whether one more unexpected message of `len` bytes from `peer` would pass the bounds:
    /// the endpoint's, counting bodies still arriving, and the peer's share.
    fn unexpected_full(&self, peer: PeerId, len: usize) -> bool {
        let c = len.saturating_add(UNEXP_OVERHEAD);
        let mine = self.peers.get(peer).map_or(0, |ps| ps.inflight);
        self.rxq.unexpected_len() >= self.cfg.unexp_msgs
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

    /// The unexpected body `peer` was sending ended (arrived, or was abandoned): its charge
    /// leaves `inflight` (an arrived one is charged to the receive queue from then on).
    fn end_inflight(&mut self, peer: PeerId) {
        let c = std::mem::take(&mut self.peer(peer).inflight);
        self.inflight -= c;
    }

    fn sink_status(&self, slot: &RecvSlot, len: usize) -> i32 {
        // SAFETY: the slot is ours until the completion pushed after this acknowledgement,
        // and it holds the received bytes.
        if !unsafe { self.core.land_before_ack(slot, len) } {
            FI_EIO
        } else {
            0
        }
    }

    /// The body of the frame last announced by `peer` arrived into `sink`.
    pub fn on_body(&mut self, peer: PeerId, sink: Sink) {
        let Some(p) = self.peer(peer).pending.take() else {
            return;
        };
        match p {
            Pending::Nothing => {}
            Pending::Msg {
                slot,
                tagged,
                tag,
                data,
                src,
                len,
                id,
                fl,
            } => match slot {
                Some(slot) => {
                    let got = len.min(slot.iov.total());
                    let m = Landed {
                        id,
                        fl,
                        tag,
                        data,
                        src,
                        len,
                    };
                    self.msg_landed(peer, slot, got, m);
                }
                None => {
                    self.end_inflight(peer);
                    let Sink::Buffer(bytes) = sink else { return };
                    // Delivery complete, like match complete, is acknowledged once a receive
                    // takes the message: a bounce buffer is not the receive's memory.
                    let ack = fl & flags::ACK != 0;
                    let held = bytes.len() + UNEXP_OVERHEAD;
                    let epoch = self.peer(peer).epoch;
                    self.rxq.push_unexpected(
                        tagged,
                        Unexpected {
                            src,
                            tag,
                            data: data.unwrap_or(0),
                            has_data: data.is_some(),
                            len,
                            held,
                            owner: peer,
                            payload: Unexp::Eager {
                                bytes,
                                from: peer,
                                ack: ack.then_some((peer, id, epoch)),
                            },
                        },
                    );
                }
            },
            Pending::Data { rx } => {
                if let Some(r) = self.rx.try_remove(rx) {
                    self.pipe_done(r);
                }
            }
            Pending::Write {
                id,
                fl,
                data,
                status,
                len,
                dest,
                staged,
            } => self.write_landed(peer, id, fl, data, status, len, &dest, staged),
            Pending::ReadResp { id, status } => {
                if let Some(t) = self.tx.get_mut(id) {
                    t.answer = Some(peer_status(status));
                    self.maybe_complete(id);
                }
            }
            Pending::Atomic {
                id,
                fl,
                op,
                datatype,
                count,
                addr,
                key,
            } => {
                let Sink::Buffer(args) = sink else { return };
                let req = target::AtomicAt {
                    op: op as i32,
                    datatype: datatype as i32,
                    count: count as usize,
                    addr,
                    key,
                    fetch: fl & flags::FETCH != 0,
                    args: &args,
                };
                match target::atomic(&self.core, &req) {
                    Err(e) => {
                        self.frame(peer, Frame::AtomicResp { id, status: e }, Body::None, None)
                    }
                    Ok(d) => {
                        if req.fetch {
                            self.frame(
                                peer,
                                Frame::AtomicResp { id, status: 0 },
                                Body::Owned(d.result),
                                None,
                            );
                        } else if fl & flags::ACK != 0 {
                            self.ack(peer, id, 0);
                        }
                        self.done.push(Done::Remote {
                            flags: FI_ATOMIC | d.dir,
                            len: d.len,
                            data: None,
                        });
                    }
                }
            }
            Pending::AtomicResp { id, status } => {
                if let Some(t) = self.tx.get_mut(id) {
                    t.answer = Some(peer_status(status));
                    self.maybe_complete(id);
                }
            }
        }
    }

    /// The transport handed every byte of the frame with `token` over.
    pub fn on_sent(&mut self, peer: PeerId, token: u64) {
        if token == READ_SENT {
            let ps = self.peer(peer);
            ps.reading = ps.reading.saturating_sub(1);
            return;
        }
        let id = (token & 0xffff_ffff) as usize;
        let gen = (token >> 32) as u32;
        if let Some(t) = self
            .tx
            .get_mut(id)
            .filter(|t| t.gen == gen && t.peer == peer)
        {
            t.unsent = t.unsent.saturating_sub(1);
            self.maybe_complete(id);
        }
    }

    /// The peer known as `src` in the address vector is gone: receives posted for it alone
    /// (`FI_DIRECTED_RECV`) fail with `err`, as nothing will arrive for them.
    pub fn source_lost(&mut self, src: FiAddr, err: i32) {
        if src == FI_ADDR_NOTAVAIL || self.core.caps & FI_DIRECTED_RECV == 0 {
            return;
        }
        let err = if err > 0 { err } else { FI_ECONNRESET };
        for r in self.rxq.drain_from(src) {
            self.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED | FI_MULTI_RECV)),
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
        let fenced: Vec<Fenced> = ps.fenced.drain(..).collect();
        self.held -= fenced.len();
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
            self.settle(t, err);
        }
        for f in fenced {
            let (ctx, flags) = fenced_ctx(&f);
            self.done.push(Done::TxErr { ctx, flags, err });
        }
        self.end_copies(Some(peer), err);
        self.natives.retain(|n| n.peer != peer);
        self.peer(peer).outstanding = 0;
        self.peer(peer).natives = 0;
        self.fail_untaken(peer, err);
        self.out.retain(|t| t.peer != peer);
        self.peers[peer].reading = 0;
        let gone = std::mem::take(&mut self.peers[peer].blocked);
        self.blocked -= gone.len();
    }

    /// Ends, with `err`, what the body a peer was sending was for (a loss, close): a matched
    /// receive fails; a staged write's bounce buffer is freed.
    fn abandon(&mut self, peer: PeerId, p: Option<Pending>, err: i32) {
        self.end_inflight(peer);
        match p {
            Some(Pending::Msg {
                slot: Some(slot),
                tag,
                ..
            }) => self.push_rx(Done::SlotErr { slot, tag, err }),
            Some(Pending::Write {
                staged: Some(ctx), ..
            }) => self.core.drop_remote(ctx),
            _ => {}
        }
    }

    /// Whether frames or answers are still owed to live peers (a closing provider flushes
    /// until this is false or its deadline passes).
    pub fn owes(&self) -> bool {
        !self.out.is_empty() || self.blocked > 0
    }

    /// Whether completions wait to be taken (`take_done`).
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Whether `transmit` or `poll_copy` has anything to give (frames queued or held back,
    /// copies asked for): a provider may skip its push round when not.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.blocked > 0 || !self.copies.is_empty()
    }

    /// Closes: every outstanding operation and posted receive ends with `FI_ECANCELED`;
    /// buffered messages are dropped. Frames already queued stay for the transport to flush.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let txs: Vec<TxReq> = self.tx.drain().collect();
        for t in txs {
            self.offer_ended(&t);
            self.done.push(Done::TxErr {
                ctx: t.ctx,
                flags: t.flags,
                err: FI_ECANCELED,
            });
        }
        for p in 0..self.peers.len() {
            let fenced: Vec<Fenced> = self.peers[p].fenced.drain(..).collect();
            self.held -= fenced.len();
            for f in fenced {
                let (ctx, flags) = fenced_ctx(&f);
                self.done.push(Done::TxErr {
                    ctx,
                    flags,
                    err: FI_ECANCELED,
                });
            }
            let pending = self.peers[p].pending.take();
            self.abandon(p, pending, FI_ECANCELED);
            self.fail_untaken(p, FI_ECANCELED);
        }
        self.end_copies(None, FI_ECANCELED);
        self.natives.clear();
        for r in self.rxq.drain_posted() {
            self.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED | FI_MULTI_RECV)),
                tag: r.tag,
                err: FI_ECANCELED,
            });
        }
        self.rxq.drain_unexpected();
        // Data frames would read application memory that is being handed back.
        self.out.retain(|t| !matches!(t.body, Body::Iov(_)));
        for ps in &mut self.peers {
            ps.blocked.retain(|t| !matches!(t.body, Body::Iov(_)));
        }
        // Small messages still queued were reported canceled above; they may still go out.
        for t in self
            .out
            .iter_mut()
            .chain(self.peers.iter_mut().flat_map(|ps| &mut ps.blocked))
        {
            if t.token == Some(ON_TAKE) {
                t.token = None;
            }
        }
        self.blocked = self.peers.iter().map(|ps| ps.blocked.len()).sum();
    }
}

impl Pending {
    fn set_status(p: &mut Pending, e: i32) {
        if let Pending::Write { status, .. } = p {
            *status = e;
        }
    }
}

/// The bytes of an inject's data, copied during the call (its buffer is the caller's only
/// until the call returns); `None` when the operation is no inject.
///
/// # Safety
/// `iov` is readable now.
/// A message's frame flags for a send with `op_flags`, and whether it asks for an `Ack`.
#[inline]
fn msg_flags(op_flags: u64) -> (u8, bool) {
    let mut fl = 0u8;
    if op_flags & FI_TAGGED != 0 {
        fl |= flags::TAGGED;
    }
    if op_flags & FI_REMOTE_CQ_DATA != 0 {
        fl |= flags::CQ_DATA;
    }
    let ack =
        op_flags & INJECT_CALL == 0 && op_flags & (FI_DELIVERY_COMPLETE | FI_MATCH_COMPLETE) != 0;
    if ack {
        fl |= flags::ACK;
        if op_flags & FI_MATCH_COMPLETE != 0 {
            fl |= flags::ACK_MATCH;
        }
    }
    (fl, ack)
}

unsafe fn inject_copy(inject: bool, iov: &IovList) -> Option<Body> {
    if !inject {
        return None;
    }
    let n = iov.total();
    Some(match super::Inline::zeroed(n) {
        Some(mut b) => {
            // SAFETY: forwarded from the caller.
            unsafe { iov.copy_out(0, &mut b) };
            Body::Inline(b)
        }
        None => {
            let mut v = vec![0u8; n];
            // SAFETY: forwarded from the caller.
            unsafe { iov.copy_out(0, &mut v) };
            Body::Owned(v)
        }
    })
}

fn fenced_ctx(f: &Fenced) -> (Context, u64) {
    match f {
        Fenced::Send(op, _) => (op.ctx, op.flags),
        Fenced::Rma(op, _) => (op.ctx, op.flags),
    }
}
