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
//!   to them. A message in memory the transports copy cheaply (`OneSided::offer_min`: shm
//!   maps the sender's allocation) is announced so from that size on, below `eager_max` too.
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
//!
//! Where each protocol's steps are: this file holds the state and the transport's entry
//! points (`on_ctrl` and `on_body` only decode and dispatch, one call per frame kind).
//! `request`: an operation this endpoint initiated, until it completes. `eager`: messages
//! and the eager protocol. `recv`: posted receives and the unexpected buffer. `rndv`: large
//! messages and the one-sided copies. `rma`: reads and writes at both ends; `rma_copy`: those
//! the target's transport copies. `atomic`: atomics. `native`: what the transport's NIC
//! carries out. `armed`: sends made ready when armed, released when they fire. `order`:
//! fences, and what a peer's requests wait behind. `loss`: a lost peer, and close.
//! `transmit`: the frames going out.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::consts::errno::*;
use crate::consts::*;
use crate::entry::Context;
use crate::ep::atomic::{AtomicReq, ATOMIC_MAX};
use crate::ep::rma::{RmaIovList, RmaOp};
use crate::ep::{EpCore, TxOp, DEVICE_OFFER, INJECT_CALL};
use crate::error::{Error, Result};
use crate::hmem_stage;
use crate::rxq::{IovList, PostResult, PostedRecv, RecvQueue, RecvSlot, Unexpected};
use crate::FiAddr;

use super::done::Done;
use super::target;
use super::transport::{Desc, OneSided, Transport};

use super::wire::{self, flags, Frame, Kind, Prefix, WireError};
use super::{Body, PeerId, Sink, Transmit};

mod armed;
mod atomic;
mod cut;
mod eager;
mod loss;
mod native;
mod order;
mod recv;
mod request;
mod rma;
mod rma_copy;
mod rndv;
mod transmit;
pub use armed::Fired;
use atomic::AtomicBody;
pub use cut::Cut;
use eager::{MsgBody, ON_TAKE};
use order::Fenced;
use recv::Unexp;
pub(crate) use recv::UNEXP_OVERHEAD;
use request::{peer_status, TxReq};
use rma::WriteBody;
pub(crate) use rma::READ_SENT;
use rma_copy::{Serve, SERVE};
use rndv::{RxPipe, NO_RX};

/// Largest eager body any engine accepts, whatever its peer's `eager_max`: a `Msg` announcing
/// more is garbage.
pub const EAGER_LIMIT: usize = 1 << 20;

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

/// What the body now arriving from a peer is for (`on_ctrl` to `on_body`).
enum Pending {
    Msg(MsgBody),
    Data {
        rx: usize,
    },
    Write(WriteBody),
    Atomic(AtomicBody),
    /// The answer with data (`ReadResp`, `AtomicResp`) to request `id`.
    Answer {
        id: usize,
        status: i32,
    },
    /// A frame without a body, or one dropped.
    Nothing,
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
    /// The memory those answers carry, as far as known: each answer's ranges, kept until
    /// `reading` is 0 (so also some already taken: never less than what is still carried),
    /// or `answered_all` past `ANSWERED_MAX` of them. What a write of this peer must not
    /// change before they are sent (`Engine::write_clear_of_answers`).
    answered: Vec<IovList>,
    answered_all: bool,
    /// Small messages that complete when the transport takes their frame (`ON_TAKE`), in
    /// the order they were queued: their context and flags.
    untaken: VecDeque<(Context, u64)>,
    /// The transport refused a copy with this peer (the kernel forbids reaching its
    /// process, say): its large messages and RMA go through frames from now on. Per peer,
    /// so that one peer the transport cannot reach costs no other peer its copies.
    pull_refused: bool,
    /// A write or atomic of this peer waits behind the answers to its reads: at the next
    /// `transmit`, their bodies are copied where they wait (`detach_answers`).
    detach: bool,
    /// The regions it named that it may not reach (keys refused).
    refusals: Refusals,
    /// Answers to its requests among `blocked` (the transport gave them back: it does not
    /// read), and the bytes they hold (`answer_charge`). Past `OWED_MAX` or `OWED_BYTES_MAX`
    /// its requests wait (`must_wait`): a peer that asks without reading the answers makes
    /// us queue no more of them.
    owed: usize,
    owed_bytes: usize,
    /// Its large messages matched to a receive and not yet arrived (`Engine::rx`): past
    /// `PIPES_MAX`, its next announcement waits.
    pipes: usize,
}

/// Large messages of one peer on their way into receives at once. An honest peer has at most
/// its outstanding sends (its `tx_size`) on their way; a peer announcing empty messages into
/// a multi-receive buffer (which never fills with them) and sending no data made a receive
/// pipe each, without end.
pub const PIPES_MAX: usize = 65536;

/// Answers one peer may owe us unwritten before its requests wait (the engine's, for the
/// answers a transport gives back; tcp's, for those it queues). An honest peer owes at most
/// its outstanding requests (its `tx_size`, 1,024 by default): far below.
pub const OWED_MAX: usize = 65536;

/// Bytes of answers one peer may owe us unwritten before its requests wait (`answer_charge`).
/// At the default `tx_size` of fetching atomics of `ATOMIC_MAX` (4 KiB) each, an honest peer
/// makes us hold 4 MiB. (Two peers each with more than 4,000 such atomics outstanding toward
/// the other, and neither reading, would wait on each other as the count alone made them past
/// 65,536.)
pub const OWED_BYTES_MAX: usize = 16 << 20;

/// What an answer to a peer's request (an acknowledgement, read data, an atomic's result, a
/// clear-to-send: what a peer that never reads can make us queue) makes us hold for it: its
/// control part and, for an atomic's, the original values it carries (up to 4 KiB for a
/// request of 48 bytes); `None` for a frame that answers nothing. Read data is not charged:
/// its body is the application's memory, or one staged from device memory for the whole read
/// (a single honest read of a GPU buffer may stage more than the bound, and two peers reading
/// each other's would then each stop reading the other), bounded by the region; a copy of it
/// taken so that a write need not wait behind it, or at a region's close, is bounded apart
/// (charging it made two peers reading 32 MiB from each other, then writing, each stop
/// reading the other: `reads_both_ways_then_writes_both_ways_finish` in tests/rma.rs).
pub fn answer_charge(t: &Transmit) -> Option<usize> {
    // Not `Kind::is_answer`: a `Data` is our own send's, bounded by our sends.
    let kind = Kind::from_raw(*t.ctrl.as_bytes().get(2)?)?;
    matches!(
        kind,
        Kind::Ack | Kind::ReadResp | Kind::AtomicResp | Kind::Cts
    )
    .then(|| {
        let values = if kind == Kind::AtomicResp {
            t.body.len()
        } else {
            0
        };
        t.ctrl.as_bytes().len() + values
    })
}

/// Whether a frame still goes out once its endpoint closed: an answer the peer waits for
/// (an acknowledgement, a read's or an atomic's answer, the `Cts` that tells a sender a
/// discarding receive took its message), not a request of ours (each ended `FI_ECANCELED`),
/// not a go-ahead asking for data (the receive or served write it asks data for ended too),
/// and not one that reads application memory being handed back.
pub fn kept_at_close(t: &Transmit) -> bool {
    if answer_charge(t).is_none() || matches!(t.body, Body::Iov(_)) {
        return false;
    }
    match wire::decode_all(t.ctrl.as_bytes()) {
        Ok((Frame::Cts { rx, .. }, _)) => rx == rndv::NO_RX,
        _ => true,
    }
}

/// Keys a peer's frames name that the key check refuses: a burst is an application's
/// mistake (a window closed under its peers), a steady stream is a peer guessing keys
/// through frames, which no key survives for ever (a NIC's rkeys are an index and a few
/// bits). Allowed `REFUSALS_BURST` at once, refilled by time at `REFUSALS_PER_SEC`; past
/// that, the peer's next remote access is refused as garbage and its transport drops it.
#[derive(Default)]
struct Refusals {
    /// Refusals not yet paid back by time.
    level: f64,
    at: Option<std::time::Instant>,
}

const REFUSALS_BURST: f64 = 1024.0;
const REFUSALS_PER_SEC: f64 = 128.0;

impl Refusals {
    fn note(&mut self) {
        let now = std::time::Instant::now();
        let back = self.at.map_or(0.0, |t| {
            now.duration_since(t).as_secs_f64() * REFUSALS_PER_SEC
        });
        self.level = (self.level - back).max(0.0) + 1.0;
        self.at = Some(now);
    }

    fn exhausted(&self) -> bool {
        self.level > REFUSALS_BURST
    }
}

/// Completions' room an engine (and a provider's list of them, `report_unlocked`) keeps
/// between batches: a burst larger than this is not kept resident for good.
pub(crate) const DONE_KEPT: usize = 1024;

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
    /// The `Rts` of each armed send, by its request's slot (`armed`): sent by the engine
    /// where the transport cannot release its own copy. Kept past the firing (dropped when
    /// the slot is armed again, or with the engine), so that no firing frees memory.
    armed: Vec<Option<wire::Ctrl>>,
    closed: bool,
    /// Some peer's `detach` is set.
    detaching: bool,
}

/// A request's slot and generation as one token (`TxReq::gen`), for the transport or the
/// peer to name it by.
fn token(id: usize, gen: u32) -> u64 {
    (gen as u64) << 32 | id as u64
}

/// A `token`'s slot and generation.
fn split(token: u64) -> (usize, u32) {
    ((token & 0xffff_ffff) as usize, (token >> 32) as u32)
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
            armed: Vec::new(),
            closed: false,
            detaching: false,
        }
    }

    /// Lets the engine use the transport's one-sided copies for large messages.
    pub fn with_one_sided(mut self, t: Box<dyn OneSided>) -> Self {
        self.one_sided = Some(t);
        self
    }

    #[inline]
    fn peer(&mut self, p: PeerId) -> &mut PeerState {
        if self.peers.len() <= p {
            self.grow_peers(p);
        }
        &mut self.peers[p]
    }

    /// `peer`'s first look at `p`: room for its state.
    #[cold]
    #[inline(never)]
    fn grow_peers(&mut self, p: PeerId) {
        self.peers.resize_with(p + 1, PeerState::default);
    }

    /// Completions gathered since the last call, to `report` without the provider's lock.
    pub fn take_done(&mut self) -> Vec<Done> {
        std::mem::take(&mut self.done)
    }

    /// `take_done` onto the end of `out`: a provider that keeps `out` between calls, and
    /// the engine its own vector, allocate nothing per completion.
    ///
    /// The engine keeps room for its largest batch (up to `DONE_KEPT`), so a batch as large
    /// again grows nothing: the two vectors are traded only where `out` has as much room,
    /// otherwise the completions are moved. Always traded, the engine was handed whatever
    /// `out` had, often a small vector, and 64 armed sends answered by one count regrew it
    /// 16 -> 32 -> 64 every round: each step a reallocation into memory the heap had given
    /// back, 2-14 thousand cycles apiece (page faults), most of what applying the count cost.
    #[inline]
    pub fn take_done_into(&mut self, out: &mut Vec<Done>) {
        if self.done.is_empty() {
            return;
        }
        if out.is_empty() && out.capacity() >= self.done.capacity() {
            std::mem::swap(out, &mut self.done);
        } else {
            out.append(&mut self.done);
        }
        if self.done.capacity() > DONE_KEPT {
            self.done.shrink_to(DONE_KEPT);
        }
    }

    /// Where the engine's list of completions lies and how many it has room for.
    #[cfg(test)]
    pub(crate) fn done_room(&self) -> (*const Done, usize) {
        (self.done.as_ptr(), self.done.capacity())
    }

    /// Receives posted by XPUs' descriptors and not yet matched (`PostedRecv::from_xpu`).
    pub fn xpu_recvs_posted(&self) -> usize {
        self.rxq.xpu_posted()
    }

    /// Whether posting `r` now would take a buffered message (nothing changes).
    pub fn takes_buffered(&self, r: &PostedRecv) -> bool {
        self.rxq.takes_buffered(r)
    }

    /// Whether completions wait to be taken (`take_done`).
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Whether anything waits on a peer (for a provider deciding how hard to poll).
    pub fn busy(&self) -> bool {
        !self.tx.is_empty()
            || !self.rx.is_empty()
            || !self.out.is_empty()
            || self.blocked > 0
            || !self.served.is_empty()
    }

    /// What decides whether a request of `peer` that the engine answered `Sink::Wait` would
    /// still wait: while it reads the same, offering the frame again gets the same answer. A
    /// transport holding such frames looks again (and keeps its endpoint from sleeping) only
    /// once it moved: held frames that wait on receives the application has not posted must
    /// not make a blocking read spin.
    pub fn wait_stamp(&self, peer: PeerId) -> WaitStamp {
        let ps = self.peers.get(peer);
        let served = self.served.iter().filter(|(_, s)| s.peer == peer).count();
        WaitStamp([
            served,
            ps.map_or(0, |p| p.owed),
            ps.map_or(0, |p| p.owed_bytes),
            ps.map_or(0, |p| p.reading),
            ps.map_or(0, |p| p.inflight),
            ps.map_or(0, |p| p.pipes),
            self.inflight,
            self.rxq.unexpected_len(),
            self.rxq.unexpected_bytes(),
            self.rxq.msgs_by(peer),
            self.rxq.held_by(peer),
            self.rxq.posted_len(),
        ])
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

    /// `fi_getopt` at the endpoint level, of what `setopt` sets.
    pub fn getopt(&self, name: i32, provider: &str) -> Result<usize> {
        match name {
            FI_OPT_MIN_MULTI_RECV => Ok(self.rxq.min_multi_recv),
            _ => Err(Error::NoSys(format!(
                "getopt: option {name} is not supported by {provider}"
            ))),
        }
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
        self.not_inside_a_body(peer)?;
        self.ctrl_in_turn(peer, src, prefix, ctrl)
    }

    /// `on_ctrl` once `not_inside_a_body` has passed (`on_frame` checks it before its fast
    /// path).
    fn ctrl_in_turn(
        &mut self,
        peer: PeerId,
        src: FiAddr,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> std::result::Result<Sink, WireError> {
        let f = wire::decode(prefix, ctrl)?;
        // Memory offered for a copy (a descriptor) only between engines whose transports
        // copy one-sidedly: ours never offers it otherwise, and a peer that does would have
        // us ask for its data and then wait for it behind frames that hold the stream.
        if self.one_sided.is_none() {
            if let Frame::Rts { desc, .. } | Frame::Write { desc, .. } | Frame::Read { desc, .. } =
                &f
            {
                if !desc.is_empty() {
                    return Err(WireError::Malformed(f.kind()));
                }
            }
        }
        if matches!(
            f,
            Frame::Write { .. } | Frame::Read { .. } | Frame::Atomic { .. }
        ) && self.peers.get(peer).is_some_and(|p| p.refusals.exhausted())
        {
            return Err(WireError::Refused(f.kind()));
        }
        let body = prefix.body_len;
        if self.must_wait(peer, f.kind()) && !self.write_clear_of_answers(peer, &f) {
            // Ordering: what this peer asks next waits until its copies are done.
            self.detach_for(peer, f.kind());
            return Ok(Sink::Wait);
        }
        match f {
            Frame::Msg {
                id,
                tag,
                data,
                flags: fl,
            } => self.on_msg(peer, src, id, tag, data, fl, body),
            Frame::Rts {
                id,
                tag,
                data,
                len,
                flags: fl,
                desc,
            } => self.on_rts(peer, src, id, tag, data, len, fl, desc),
            Frame::Cts { id, rx } => Ok(self.on_cts(peer, id, rx)),
            Frame::Data { rx } => self.on_data(peer, rx, body),
            Frame::Ack { id, status } => Ok(self.on_ack(peer, id, status)),
            Frame::Write {
                id,
                data,
                flags: fl,
                segs,
                desc,
            } => Ok(self.on_write(peer, id, data, fl, segs, desc, body)),
            Frame::Read { id, segs, desc } => Ok(self.on_read(peer, id, &segs, desc)),
            Frame::ReadResp { id, status } => self.on_read_resp(peer, id, status, body),
            Frame::Atomic {
                id,
                op,
                datatype,
                count,
                addr,
                key,
                flags: fl,
            } => {
                let a = AtomicBody {
                    id,
                    fl,
                    op,
                    datatype,
                    count,
                    addr,
                    key,
                };
                self.on_atomic(peer, a, body)
            }
            Frame::AtomicResp { id, status } => self.on_atomic_resp(peer, id, status, body),
        }
    }

    /// `target::resolve` of a remote access `peer` asked for, a refused key counted against
    /// it (`Refusals`).
    pub(super) fn resolve(
        &mut self,
        peer: PeerId,
        segs: &crate::ep::rma::RmaIovList,
        access: u64,
    ) -> std::result::Result<target::Resolved, i32> {
        let r = target::resolve(&self.core, segs, access);
        if r.as_ref().is_err_and(|&e| e == FI_EACCES) {
            self.refused(peer);
        }
        r
    }

    /// A key `peer` named was refused.
    pub(super) fn refused(&mut self, peer: PeerId) {
        self.peer(peer).refusals.note();
    }

    /// `Err` while the body of `peer`'s previous frame is still expected (`on_body` not yet
    /// called): a second frame now would take the first one's place, and the first's sink
    /// (a receive's memory) would be written after that receive completed. A transport
    /// hands each peer's frames over one at a time; only a peer writing two streams at once
    /// (two shm lanes naming one segment) or a transport's own mistake gets here.
    #[inline]
    fn not_inside_a_body(&self, peer: PeerId) -> std::result::Result<(), WireError> {
        match self.peers.get(peer) {
            Some(p) if p.pending.is_some() => Err(WireError::Interleaved),
            _ => Ok(()),
        }
    }

    /// The body now arriving from `peer` goes into `sink`, for `p` (`on_body`).
    fn expect(&mut self, peer: PeerId, sink: Sink, p: Pending) -> Sink {
        self.peer(peer).pending = Some(p);
        sink
    }

    /// A frame from `peer` whose body, if any, nothing takes.
    fn no_body(&mut self, peer: PeerId) -> Sink {
        self.expect(peer, Sink::Discard, Pending::Nothing)
    }

    /// The body of the frame last announced by `peer` arrived into `sink`.
    pub fn on_body(&mut self, peer: PeerId, sink: Sink) {
        let Some(p) = self.peer(peer).pending.take() else {
            return;
        };
        match p {
            Pending::Nothing => {}
            Pending::Msg(m) => self.msg_arrived(peer, m, sink),
            Pending::Data { rx } => self.data_arrived(rx),
            Pending::Write(w) => self.write_landed(peer, w),
            Pending::Atomic(a) => self.atomic_arrived(peer, a, sink),
            Pending::Answer { id, status } => self.answer(id, status),
        }
    }

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
        // The commonest frame, a message a posted receive takes, skips the sink's round trip.
        self.not_inside_a_body(peer)?;
        if prefix.kind == Kind::Msg as u8 && self.take_msg(peer, src, prefix, ctrl, body)? {
            return Ok(true);
        }
        let sink = self.ctrl_in_turn(peer, src, prefix, ctrl)?;
        if matches!(sink, Sink::Wait) {
            return Ok(false);
        }
        // A frame with no body (an acknowledgement, most answers) has nothing to fill in.
        let sink = if body.is_empty() {
            sink
        } else {
            // SAFETY: the engine keeps a sink's memory writable until `on_body`, just below.
            unsafe { sink.fill(body) }
        };
        self.on_body(peer, sink);
        Ok(true)
    }

    /// The transport handed every byte of the frame with `token` over.
    pub fn on_sent(&mut self, peer: PeerId, token: u64) {
        if token == READ_SENT {
            return self.read_sent(peer);
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
}

/// The bytes of an inject's data, copied during the call (its buffer is the caller's only
/// until the call returns); `None` when the operation is no inject.
///
/// # Safety
/// `iov` is readable now.
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

/// `Engine::wait_stamp`: the counts a waiting request of a peer depends on, compared whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitStamp([usize; 12]);
