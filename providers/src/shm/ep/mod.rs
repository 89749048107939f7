//! The shm endpoint: moves messages between processes through the rings in `ring`, and large
//! messages by cross-memory attach or by fragments through the ring. Matching, completions and
//! counters are core's (`RecvQueue`, `EpCore`); this file is transport and its bookkeeping.
//!
//! Protocols (per message):
//! - eager (<= `EAGER_MAX`): data inline in the ring; the send completes when written, or on
//!   the receiver's ACK for delivery/match complete.
//! - rendezvous (larger): RTS carries the sender's pid and iov; on a match the receiver copies
//!   with `process_vm_readv` and ACKs. Where the kernel refuses, the receiver answers CTS and the
//!   sender streams DATA fragments through the ring; the receiver ACKs after the last one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use slab::Slab;
use xfabric_core::consts::errno::*;
use xfabric_core::consts::*;
use xfabric_core::ep::{TxOp, INJECT_CALL};
use xfabric_core::rdm::Done;
use xfabric_core::rxq::{PostResult, PostedRecv, RecvQueue, RecvSlot, Unexpected};
use xfabric_core::settings;
use xfabric_core::{
    Context, EndpointOps, EpCore, Error, FiAddr, IovList, ProgressSource, RawIov, Result,
};

use super::cma::{self, CmaResult, CmaState};
use super::ring::{self, flag, kind, Consumer, Header, Producer, LANES};
use super::segment::Segment;
use super::ADDR_PREFIX;

mod liveness;
mod order;
mod rma;
mod rndv;
use order::holding;
use rma::Fenced;
use rndv::parse_rts;

/// Largest message sent inline through the ring. At 16 KiB two memcpys through the ring (1.3 us
/// one way here) beat a rendezvous (RTS, a cross-memory-attach syscall that pins the sender's
/// pages, ACK: 3.7-4.2 us); at 32 KiB the two are even, so larger messages go by rendezvous.
pub const EAGER_MAX: usize = 16384;
/// Largest inject (copied into the ring during the call).
pub const INJECT_SIZE: usize = 4096;
/// Fragment size of the pipelined large-message path.
pub const FRAG: usize = 16384;
// Messages from `settings::SHM_SPLIT_MIN` on are copied by both sides at once (split copy),
// where cross-memory attach works. Splitting from 32 KiB would be faster there (7.9 GB/s
// against 6.1-6.7), but a split needs the sender to make progress, where a receiver copying
// alone does not: under manual progress a sender that stops polling stalls it. The 64 KiB
// default keeps that dependence to the sizes where it pays most. Of those, the ones below
// `settings::SHM_CMA_MIN` (512 KiB) stream through the ring instead, which needs the sender
// just the same and moves more (see `start_rndv`).
//
// An endpoint buffers at most `settings::SHM_UNEXP_MSGS` unexpected messages holding at most
// `settings::SHM_UNEXP_BYTES`. Past that, a new message that no posted receive takes stays in
// its sender's ring: that ring fills and the sender's posts answer `Again` until receives are
// posted. Nothing is dropped. The cost is head-of-line blocking: what the same sender wrote
// after it (replies to our own operations included) waits too, so an application that floods a
// peer and waits for that peer's replies before posting receives can stall itself.
/// Bookkeeping charged per buffered message on top of its payload (measured: 168 bytes a
/// 64-byte message cost before the bound).
const UNEXP_OVERHEAD: usize = 128;
/// Requests one peer may have held behind its landing writes (ordering holds) before its ring
/// is left unread, as for unexpected messages.
const HELD_MAX: usize = 1024;
/// How far the bounds give while a pipelined transfer from the same peer needs fragments
/// that sit behind what would wait (see `must_wait`).
const PIPELINED_SLACK: usize = 16;
/// Messages handled per lane per progress call, so one busy sender cannot starve the rest.
const BATCH: usize = 16;
/// Polls of the lanes while a split copy waits for its sender (a few microseconds).
const SPLIT_SPIN: usize = 20000;
/// How often to look for dead peers while work is outstanding.
const SWEEP_EVERY: Duration = Duration::from_millis(20);

struct Peer {
    name: String,
    /// The peer's segment; `None` for a peer whose segment was gone when we read its first
    /// message (it closed or exited after sending): what it wrote is still delivered, but
    /// nothing goes back to it (it is `dead` from the start).
    seg: Option<Segment>,
    /// Our lane in the peer's segment, claimed on first use.
    prod: Option<Producer>,
    /// The peer's lane in our segment.
    rx_lane: Option<usize>,
    src: FiAddr,
    src_gen: u64,
    /// Control messages (ACK, CTS) waiting for ring space, in order.
    backlog: VecDeque<(Header, Vec<u8>)>,
    dead: bool,
    last_check: Option<Instant>,
    /// Ranges this peer wrote since its last commit (`FI_RMA_PMEM` endpoints).
    dirty: Vec<(usize, usize)>,
    /// The peer's pid, once cross-memory attach through it was shown to reach the peer
    /// (`ring::verified_pid`); `None`: never copy through a pid, use the ring.
    cma_pid: Option<i32>,
    /// Requests from this peer that arrived while one of its large RMA writes was still
    /// landing, in order: they run once it has (so reads, atomics and messages see it).
    held: VecDeque<(Header, Vec<u8>)>,
    /// Split reads this peer is still copying its part of (until its RDONE).
    reads_out: u32,
    /// Host copies of device memory those split reads copy from, by the peer's request id.
    read_copies: Vec<(u32, Vec<u8>)>,
}

impl Peer {
    /// Whether the peer's process still holds its segment.
    fn owner_alive(&self) -> bool {
        self.seg.as_ref().is_some_and(Segment::owner_alive)
    }
}

enum Payload {
    Eager {
        bytes: Vec<u8>,
        ack_on_match: Option<u32>,
        peer: usize,
    },
    Rndv(Rndv),
}

#[derive(Clone, Debug)]
struct Rndv {
    peer: usize,
    tx_id: u32,
    len: usize,
    pid: i32,
    iov: Vec<RawIov>,
}

struct TxReq {
    ctx: Context,
    flags: u64,
    iov: IovList,
    len: usize,
    peer: usize,
    /// Pipelined: the receiver's id and the bytes sent so far.
    stream: Option<(u32, usize)>,
    /// A failure of this side's own part (a split read's copy): reported when the ACK comes,
    /// so the buffer is not handed back while the peer may still write into it.
    status: i32,
}

/// A matched large message still arriving: through fragments (`split` is `None`), or by a
/// split copy whose first `got` bytes the receiver has read and the rest the sender writes.
struct RxPipe {
    slot: RecvSlot,
    peer: usize,
    tx_id: u32,
    total: usize,
    got: usize,
    tag: u64,
    data: Option<u64>,
    src: FiAddr,
    split: Option<Split>,
}

struct Split {
    pid: i32,
    remote: Vec<RawIov>,
    /// Our own read failed: the message fails, but only once the sender has reported, so
    /// that nothing writes into the buffer after the application got it back.
    err: i32,
}

// Completions are core's `rdm::Done`, gathered under the lock and reported after it is
// released (`finish`), so that a completion's observers (counters triggering operations) may
// post to this endpoint.

struct State {
    rxq: RecvQueue<Payload>,
    peers: Vec<Peer>,
    by_name: HashMap<String, usize>,
    av_cache: xfabric_core::av::PeerCache,
    lane_peer: [Option<usize>; LANES],
    cons: [Consumer; LANES],
    known_active: u64,
    /// Per lane: how far `handle_transfers_ahead` has looked past a waiting message (frames
    /// before this are handled or stay for the consumer), so each frame is looked at once.
    scanned: [u64; LANES],
    tx: Slab<TxReq>,
    rxp: Slab<RxPipe>,
    streaming: Vec<u32>,
    /// Operations held back by `FI_FENCE`, with their peers, in posting order.
    fenced: VecDeque<(usize, Fenced)>,
    /// Set while the head of `fenced` is being posted, so it is not held again.
    releasing: bool,
    done: Vec<Done>,
    closed: bool,
}

impl State {
    /// Queues a receive's completion (`Rx` or `SlotErr`), letting the matching engine mark
    /// the last completion of a multi-receive buffer.
    fn push_rx(&mut self, mut d: Done) {
        // A large RMA write lands through the receive machinery in a slot marked FI_RMA: it
        // is reported as a remote write, and a failure only the initiator hears about.
        match d {
            Done::Rx {
                slot, len, data, ..
            } if slot.flags & FI_RMA != 0 => {
                d = if slot.ctx != 0 {
                    Done::RemoteStaged {
                        ctx: slot.ctx,
                        len,
                        data,
                    }
                } else {
                    Done::Remote {
                        flags: FI_RMA | FI_WRITE,
                        len,
                        data,
                    }
                }
            }
            Done::SlotErr { slot, .. } if slot.flags & FI_RMA != 0 => {
                if slot.ctx != 0 {
                    self.done.push(Done::DropStaged { ctx: slot.ctx });
                }
                return;
            }
            _ => {}
        }
        if let Done::Rx { slot, .. } | Done::SlotErr { slot, .. } = &mut d {
            self.rxq.finish_slot(slot);
        }
        self.done.push(d);
    }
}

/// An shm endpoint.
pub struct ShmEndpoint {
    core: Arc<EpCore>,
    seg: Segment,
    id: u64,
    name: String,
    cma: CmaState,
    /// Messages from `split_min` up to this stream through the ring (`settings::SHM_CMA_MIN`).
    cma_min: usize,
    split_min: usize,
    /// The unexpected-message bounds (messages, bytes).
    unexp_max: (usize, usize),
    st: Mutex<State>,
    /// Mirrors of the locked state, so that a poll with nothing to do takes no lock: the
    /// consumer position of each lane, the lanes known active, and whether anything is in
    /// flight that needs the full progress path (fragments, backlog, sends awaiting an ACK,
    /// receives in progress).
    idle: IdleHint,
}

struct IdleHint {
    /// Whether anything is outstanding that a dead peer would leave hanging (so the idle path
    /// must look at the clock for the next sweep).
    watch: AtomicBool,
    /// When the next sweep is due, in `liveness::coarse_ms` time.
    next_sweep: AtomicU64,
    pos: [AtomicU64; LANES],
    known_active: AtomicU64,
    busy: AtomicBool,
}

fn ident(name: &str) -> u64 {
    // FNV-1a: a lane-claim id that is unique per segment name and never 0.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

impl ShmEndpoint {
    /// Creates the endpoint's segment.
    pub fn open(core: Arc<EpCore>) -> Result<Arc<Self>> {
        let name = super::segment::fresh_name();
        let seg = Segment::create(&name, ring::SEG_BYTES)?;
        ring::init_header(
            &seg,
            ident(&format!("{name}/{:?}", Instant::now())) ^ 0x9e37_79b9_7f4a_7c15,
        );
        let directed = core.caps & FI_DIRECTED_RECV != 0;
        Ok(Arc::new(ShmEndpoint {
            core,
            id: ident(&name),
            name,
            seg,
            cma: CmaState::new(),
            idle: IdleHint {
                watch: AtomicBool::new(false),
                next_sweep: AtomicU64::new(0),
                pos: std::array::from_fn(|_| AtomicU64::new(0)),
                known_active: AtomicU64::new(0),
                busy: AtomicBool::new(false),
            },
            cma_min: settings::SHM_CMA_MIN.usize(),
            split_min: settings::SHM_SPLIT_MIN.usize(),
            unexp_max: (
                settings::SHM_UNEXP_MSGS.usize(),
                settings::SHM_UNEXP_BYTES.usize(),
            ),
            st: Mutex::new(State {
                rxq: RecvQueue::new(directed),
                peers: Vec::new(),
                by_name: HashMap::new(),
                av_cache: Default::default(),
                lane_peer: [None; LANES],
                cons: [Consumer::default(); LANES],
                known_active: 0,
                scanned: [0; LANES],
                tx: Slab::new(),
                rxp: Slab::new(),
                streaming: Vec::new(),
                fenced: VecDeque::new(),
                releasing: false,
                done: Vec::new(),
                closed: false,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports gathered completions after the lock is released, then hands the buffer back.
    fn finish(&self, mut st: MutexGuard<'_, State>) {
        self.publish_idle(&st);
        if st.done.is_empty() {
            return;
        }
        let mut done = std::mem::take(&mut st.done);
        drop(st);
        // In order; the vector's allocation is kept for the next round.
        xfabric_core::rdm::report(&self.core, &mut done);
        if let Ok(mut st) = self.st.try_lock() {
            if st.done.is_empty() {
                st.done = done;
            }
        }
    }

    /// Rings the peer's doorbell if one of its threads sleeps waiting for messages.
    fn wake(seg: &Segment) {
        fence(Ordering::SeqCst);
        if ring::sleeping(seg).load(Ordering::Relaxed) != 0 {
            let db = ring::doorbell(seg);
            db.fetch_add(1, Ordering::SeqCst);
            super::futex::wake(db);
        }
    }

    /// The peer an `fi_addr_t` names, mapping its segment on first use.
    fn peer_for(&self, st: &mut State, dest: FiAddr) -> Result<usize> {
        let b = self
            .core
            .bound()
            .ok_or_else(|| Error::OpBadState("endpoint is not enabled".into()))?;
        let mut cache = std::mem::take(&mut st.av_cache);
        let p = cache.lookup(b.av.as_ref(), dest, |raw| {
            let name = seg_name(raw)?;
            self.peer_by_name(st, &name)
        });
        st.av_cache = cache;
        let p = p?;
        if st.peers[p].dead {
            return Err(Error::PeerLost(format!(
                "peer {} is gone",
                st.peers[p].name
            )));
        }
        Ok(p)
    }

    fn peer_by_name(&self, st: &mut State, name: &str) -> Result<usize> {
        if let Some(&p) = st.by_name.get(name) {
            return Ok(p);
        }
        // Sending to ourselves maps our own segment a second time; that is fine.
        let seg = Segment::open(name, ring::SEG_BYTES)?;
        if !ring::check_header(&seg) {
            return Err(Error::PeerLost(format!(
                "segment {name} is not an xfabric shm endpoint"
            )));
        }
        let seg_for_probe = &seg;
        let cma_pid = if self.cma.usable() {
            ring::verified_pid(seg_for_probe)
        } else {
            None
        };
        Ok(Self::add_peer(st, name, Some(seg), cma_pid))
    }

    /// Records a peer (`seg` `None`: one already gone, see `Peer::seg`).
    fn add_peer(st: &mut State, name: &str, seg: Option<Segment>, cma_pid: Option<i32>) -> usize {
        st.peers.push(Peer {
            name: name.to_string(),
            dead: seg.is_none(),
            seg,
            prod: None,
            rx_lane: None,
            src: FI_ADDR_NOTAVAIL,
            src_gen: u64::MAX,
            backlog: VecDeque::new(),
            last_check: None,
            dirty: Vec::new(),
            cma_pid,
            held: VecDeque::new(),
            reads_out: 0,
            read_copies: Vec::new(),
        });
        let p = st.peers.len() - 1;
        st.by_name.insert(name.to_string(), p);
        p
    }

    /// The source `fi_addr_t` of peer `p` (reverse AV lookup, cached per AV generation).
    fn src_of(&self, st: &mut State, p: usize) -> FiAddr {
        let Some(av) = self.core.bound().and_then(|b| b.av.as_ref()) else {
            return FI_ADDR_NOTAVAIL;
        };
        let gen = av.generation();
        let peer = &mut st.peers[p];
        if peer.src_gen != gen {
            peer.src = av
                .reverse(format!("{ADDR_PREFIX}{}", peer.name).as_bytes())
                .unwrap_or(FI_ADDR_NOTAVAIL);
            peer.src_gen = gen;
        }
        peer.src
    }

    fn raw_src(&self, st: &State, p: usize, src: FiAddr) -> Option<Vec<u8>> {
        (src == FI_ADDR_NOTAVAIL && self.core.caps & FI_SOURCE_ERR != 0)
            .then(|| format!("{ADDR_PREFIX}{}", st.peers[p].name).into_bytes())
    }

    /// Makes sure we own a lane in peer `p`'s segment.
    fn ensure_lane(&self, st: &mut State, p: usize) -> Result<()> {
        let peer = &mut st.peers[p];
        if peer.prod.is_some() {
            return Ok(());
        }
        let Some(seg) = peer.seg.as_ref() else {
            return Err(Error::PeerLost(format!("peer {} is gone", peer.name)));
        };
        let lane = ring::claim_lane(seg, self.id).ok_or_else(|| {
            Error::Busy(format!(
                "peer {} has no free lane ({LANES} senders)",
                peer.name
            ))
        })?;
        let mut prod = Producer::new(seg, lane);
        let me = self.name.as_bytes();
        let h = Header {
            kind: kind::CONNECT,
            len: me.len() as u32,
            ..Default::default()
        };
        // A freshly claimed lane is drained, so the connect message fits.
        if !prod.write(seg, &h, me.len(), |b| b.copy_from_slice(me)) {
            ring::release_lane(seg, lane);
            return Err(Error::Again("shm connect"));
        }
        peer.prod = Some(prod);
        Ok(())
    }

    /// `Again`, or `PeerLost` if the peer whose ring is full has died.
    fn full(&self, st: &mut State, p: usize, what: &'static str) -> Error {
        if st.peers[p].prod.as_ref().is_some_and(|prod| prod.broken()) {
            self.peer_died(st, p);
            return Error::PeerLost(format!("peer {}'s ring is corrupt", st.peers[p].name));
        }
        let peer = &mut st.peers[p];
        let due = peer
            .last_check
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(1));
        if due {
            peer.last_check = Some(Instant::now());
            if !peer.owner_alive() {
                self.peer_died(st, p);
                return Error::PeerLost(format!("peer {} died", st.peers[p].name));
            }
        }
        Error::Again(what)
    }

    /// Sends a control message, queueing it behind earlier ones if the ring is full.
    fn send_ctrl(&self, st: &mut State, p: usize, h: Header, payload: &[u8]) {
        if st.peers[p].dead {
            return;
        }
        if self.ensure_lane(st, p).is_err() {
            st.peers[p].backlog.push_back((h, payload.to_vec()));
            return;
        }
        let peer = &mut st.peers[p];
        if peer.backlog.is_empty() {
            let prod = peer.prod.as_mut().expect("lane ensured");
            let seg = peer.seg.as_ref().expect("a lane implies a segment");
            if prod.write(seg, &h, payload.len(), |b| b.copy_from_slice(payload)) {
                Self::wake(seg);
                return;
            }
        }
        peer.backlog.push_back((h, payload.to_vec()));
    }

    fn ack(&self, st: &mut State, p: usize, tx_id: u32, status: i32) {
        let h = Header {
            kind: kind::ACK,
            aux: tx_id,
            len: status as u32,
            ..Default::default()
        };
        self.send_ctrl(st, p, h, &[]);
    }

    fn flush_backlog(&self, st: &mut State, p: usize) -> bool {
        if st.peers[p].backlog.is_empty() {
            return true;
        }
        if self.ensure_lane(st, p).is_err() {
            return false;
        }
        let peer = &mut st.peers[p];
        let prod = peer.prod.as_mut().expect("lane ensured");
        let seg = peer.seg.as_ref().expect("a lane implies a segment");
        let mut sent = false;
        while let Some((h, pl)) = peer.backlog.front() {
            if !prod.write(seg, h, pl.len(), |b| b.copy_from_slice(pl)) {
                break;
            }
            peer.backlog.pop_front();
            sent = true;
        }
        if sent {
            Self::wake(seg);
        }
        peer.backlog.is_empty()
    }

    /// The peer an operation goes to, ready for a request: endpoint open, lane claimed,
    /// earlier control messages to it flushed.
    fn sendable_peer(&self, st: &mut State, dest: FiAddr, what: &'static str) -> Result<usize> {
        if st.closed {
            return Err(Error::OpBadState(format!("{what}: endpoint is closed")));
        }
        let p = self.peer_for(st, dest)?;
        self.ensure_lane(st, p)?;
        if !self.flush_backlog(st, p) {
            return Err(self.full(st, p, what));
        }
        Ok(p)
    }

    fn post_send(&self, st: &mut State, op: &TxOp) -> Result<()> {
        let p = self.sendable_peer(st, op.dest, "send")?;
        let Some(Fenced::Send(op, _)) = self.fence(st, p, Fenced::Send(*op, None)) else {
            return Ok(());
        };
        let op = &op;
        let len = op.iov.total();
        let mut fl = 0u8;
        if op.flags & FI_TAGGED != 0 {
            fl |= flag::TAGGED;
        }
        if op.flags & FI_REMOTE_CQ_DATA != 0 {
            fl |= flag::CQ_DATA;
        }
        if len <= EAGER_MAX || op.flags & FI_INJECT != 0 {
            let ack = op.flags & INJECT_CALL == 0
                && op.flags & (FI_DELIVERY_COMPLETE | FI_MATCH_COMPLETE) != 0;
            let id = if ack {
                fl |= if op.flags & FI_MATCH_COMPLETE != 0 {
                    flag::ACK_MATCH
                } else {
                    flag::ACK_DELIVERY
                };
                st.tx.insert(TxReq {
                    ctx: op.ctx,
                    flags: op.flags,
                    iov: op.iov,
                    len,
                    peer: p,
                    stream: None,
                    status: 0,
                }) as u32
            } else {
                0
            };
            let h = Header {
                kind: kind::EAGER,
                flags: fl,
                len: len as u32,
                aux: id,
                tag: op.tag,
                data: op.data,
            };
            let peer = &mut st.peers[p];
            let prod = peer.prod.as_mut().expect("lane ensured");
            let seg = peer.seg.as_ref().expect("a lane implies a segment");
            // SAFETY: the caller's contract keeps the iov readable during the call.
            let ok = prod.write_request(seg, &h, len, |b| unsafe {
                op.iov.copy_out(0, b);
            });
            if ok {
                Self::wake(seg);
            } else {
                if ack {
                    st.tx.remove(id as usize);
                }
                return Err(self.full(st, p, "send"));
            }
            if !ack {
                st.done.push(Done::Tx {
                    ctx: op.ctx,
                    flags: op.flags,
                });
            }
            return Ok(());
        }
        let id = st.tx.insert(TxReq {
            ctx: op.ctx,
            flags: op.flags,
            iov: op.iov,
            len,
            peer: p,
            stream: None,
            status: 0,
        }) as u32;
        let mut pl = Vec::with_capacity(16 + 16 * op.iov.segs().len());
        pl.extend_from_slice(&(len as u64).to_le_bytes());
        pl.extend_from_slice(&(std::process::id() as i32).to_le_bytes());
        pl.extend_from_slice(&(op.iov.segs().len() as u32).to_le_bytes());
        for s in op.iov.segs() {
            pl.extend_from_slice(&(s.addr as u64).to_le_bytes());
            pl.extend_from_slice(&(s.len as u64).to_le_bytes());
        }
        let h = Header {
            kind: kind::RTS,
            flags: fl,
            len: pl.len() as u32,
            aux: id,
            tag: op.tag,
            data: op.data,
        };
        self.post_request(st, p, id, &h, &pl, "send")
    }

    /// Writes request `h` (payload `pl`) for pending operation `id` to peer `p`; on a full
    /// ring the operation is dropped again and `Again` (or `PeerLost`) returned.
    fn post_request(
        &self,
        st: &mut State,
        p: usize,
        id: u32,
        h: &Header,
        pl: &[u8],
        what: &'static str,
    ) -> Result<()> {
        let peer = &mut st.peers[p];
        let prod = peer.prod.as_mut().expect("lane ensured");
        let seg = peer.seg.as_ref().expect("a lane implies a segment");
        if !prod.write_request(seg, h, pl.len(), |b| b.copy_from_slice(pl)) {
            st.tx.remove(id as usize);
            return Err(self.full(st, p, what));
        }
        Self::wake(seg);
        Ok(())
    }

    /// Handles everything readable on our lanes; returns messages handled.
    fn poll_lanes(&self, st: &mut State) -> usize {
        let mask = ring::active(&self.seg).load(Ordering::Acquire);
        let fresh = mask & !st.known_active;
        if fresh != 0 {
            for i in bits(fresh) {
                st.cons[i] = Consumer::attach(&self.seg, i);
                st.lane_peer[i] = None;
            }
        }
        st.known_active = mask;
        let mut n = 0;
        for lane in bits(mask) {
            for _ in 0..BATCH {
                let mut c = st.cons[lane];
                let Some(v) = c.peek(&self.seg, lane) else {
                    st.cons[lane] = c;
                    break;
                };
                if self.must_wait(st, lane, &v.h) {
                    // Flow control: it stays in the ring until there is room for it; what
                    // the sender wrote after it for transfers already under way is handled.
                    st.cons[lane] = c;
                    n += self.handle_transfers_ahead(st, lane, c.pos() + v.slots() as u64);
                    break;
                }
                let released = self.handle(st, lane, &v);
                c.advance(&self.seg, lane, v);
                st.cons[lane] = c;
                n += 1;
                if released {
                    ring::release_lane(&self.seg, lane);
                    st.known_active &= !(1u64 << lane);
                    break;
                }
            }
            // A dead sender's lane that flow control left unfinished: go on with it, and free
            // it once empty.
            if let Some(p) = st.lane_peer[lane].filter(|&p| st.peers[p].dead) {
                self.drain_gone(st, lane, p);
            }
        }
        n
    }

    /// Whether the message at the head of `lane` must stay in the ring for now: a request to
    /// hold behind a landing write while the peer already has `HELD_MAX` held, or a new
    /// message no posted receive takes while the unexpected queue is at its bound.
    fn must_wait(&self, st: &mut State, lane: usize, h: &Header) -> bool {
        let Some(p) = st.lane_peer[lane] else {
            return false;
        };
        // A transfer from this peer pipelined through the ring (cross-memory attach refused)
        // needs its fragments, which cannot get past a waiting message: while one is under
        // way the bounds give, up to `PIPELINED_SLACK` times, rather than deadlock the peers.
        let slack = st.rxp.iter().any(|(_, r)| r.peer == p && r.split.is_none());
        let k = if slack { PIPELINED_SLACK } else { 1 };
        if self.must_hold(st, p, h) {
            return st.peers[p].held.len() >= HELD_MAX * k;
        }
        if !matches!(h.kind, kind::EAGER | kind::RTS) {
            return false;
        }
        let (msgs, bytes) = self.unexp_max;
        let (msgs, bytes) = (msgs.saturating_mul(k), bytes.saturating_mul(k));
        let full = st.rxq.unexpected_len() >= msgs
            || st
                .rxq
                .unexpected_bytes()
                .saturating_add(h.len as usize)
                .saturating_add(UNEXP_OVERHEAD)
                > bytes;
        if !full {
            return false;
        }
        let src = self.src_of(st, p);
        !st.rxq.would_match(src, h.tag, h.flags & flag::TAGGED != 0)
    }

    /// With the message at the head of `lane` waiting (flow control), handles in place the
    /// frames behind it that belong to transfers already under way -- acknowledgements, CTS,
    /// data fragments, split-copy and read results -- and marks them done. Their order
    /// against the waiting message does not matter, and the transfers they finish may be
    /// what frees room for it: a receive whose data or WDONE sits behind a flood of
    /// unexpected messages, a landing write whose fragments sit behind held requests.
    /// New messages and requests stay where they are, in order; a BYE ends the look.
    fn handle_transfers_ahead(&self, st: &mut State, lane: usize, pos: u64) -> usize {
        let c = st.cons[lane];
        let mut pos = pos.max(st.scanned[lane]);
        let mut n = 0;
        for _ in 0..ring::SLOTS {
            let Some((v, next)) = c.view_at(&self.seg, lane, pos) else {
                break;
            };
            match v.h.kind {
                kind::BYE => break,
                kind::ACK
                | kind::CTS
                | kind::DATA
                | kind::WDONE
                | kind::RDATA
                | kind::ARESULT
                | kind::RSPLIT
                | kind::RDONE => {
                    // SAFETY: the slots stay ours until the consumer passes them.
                    let pl = unsafe { v.payload(v.h.len as usize) };
                    self.handle_msg(st, lane, v.h, pl);
                    c.mark_handled(&self.seg, lane, pos);
                    n += 1;
                }
                _ => {}
            }
            pos = next;
        }
        st.scanned[lane] = pos;
        n
    }

    /// Handles one message; returns true when the lane is to be released (the sender left).
    fn handle(&self, st: &mut State, lane: usize, v: &ring::View) -> bool {
        // SAFETY: the payload is read before the consumer advances past the message.
        let pl = unsafe { v.payload(v.h.len as usize) };
        self.handle_msg(st, lane, v.h, pl)
    }

    /// The status to acknowledge a transfer of `len` bytes into `slot` with, once the bytes
    /// are where the acknowledgement promises: staged for device memory, they are copied in
    /// first (the sender's FI_DELIVERY_COMPLETE means the device sees them); an RMA write
    /// with FI_COMMIT_COMPLETE is flushed.
    fn sink_status(&self, slot: &RecvSlot, len: usize) -> i32 {
        // SAFETY: the slot is ours until the completion pushed after this acknowledgement,
        // and it holds the received bytes.
        if !unsafe { self.core.land_before_ack(slot, len) } {
            FI_EIO
        } else if slot.flags & FI_RMA != 0 && slot.op_flags & FI_COMMIT_COMPLETE != 0 {
            rma::commit(&slot.iov)
        } else {
            0
        }
    }

    /// Handles one message (`pl`: its payload); returns true when the lane is to be released.
    fn handle_msg(&self, st: &mut State, lane: usize, h: Header, pl: &[u8]) -> bool {
        if h.kind == kind::CONNECT {
            let name = String::from_utf8_lossy(pl).into_owned();
            // Only names of xfabric segments: a peer must not make us open arbitrary paths.
            let valid =
                seg_name(format!("{ADDR_PREFIX}{name}").as_bytes()).is_ok_and(|n| n == name);
            if !valid {
                return false;
            }
            let p = match self.peer_by_name(st, &name) {
                Ok(p) => {
                    st.peers[p].dead = false;
                    p
                }
                // Its segment is gone: it closed or exited after writing what follows, whose
                // sends completed there. It is delivered all the same; nothing goes back.
                Err(_) => match st.by_name.get(&name) {
                    Some(&p) => p,
                    // A name costs a writer nothing: at most one gone peer per lane is
                    // remembered, so CONNECTs naming no segment cannot grow the table.
                    None if st.peers.iter().filter(|p| p.seg.is_none()).count() < LANES => {
                        Self::add_peer(st, &name, None, None)
                    }
                    None => {
                        tracing::warn!(
                            peer = %name,
                            "shm: a lane names a segment that is gone, past the bound of gone \
                             peers; its messages are dropped"
                        );
                        return false;
                    }
                },
            };
            st.peers[p].rx_lane = Some(lane);
            st.lane_peer[lane] = Some(p);
            return false;
        }
        let Some(p) = st.lane_peer[lane] else {
            // A message before CONNECT cannot happen with a well-behaved sender; drop it.
            return false;
        };
        if self.must_hold(st, p, &h) {
            st.peers[p].held.push_back((h, pl.to_vec()));
            return false;
        }
        let tagged = h.flags & flag::TAGGED != 0;
        let data = (h.flags & flag::CQ_DATA != 0).then_some(h.data);
        match h.kind {
            kind::EAGER => {
                let len = h.len as usize;
                let src = self.src_of(st, p);
                let bytes = &pl[..len.min(pl.len())];
                if let Some(slot) = st.rxq.match_arrival(src, h.tag, tagged, len) {
                    // SAFETY: a matched receive's buffer is ours to write until it completes.
                    let got = unsafe { slot.iov.copy_in(0, bytes) };
                    let raw = self.raw_src(st, p, src);
                    st.push_rx(Done::Rx {
                        slot,
                        len: got,
                        olen: len - got,
                        tag: h.tag,
                        data,
                        src,
                        raw,
                    });
                    if h.flags & (flag::ACK_DELIVERY | flag::ACK_MATCH) != 0 {
                        let status = self.sink_status(&slot, got);
                        self.ack(st, p, h.aux, status);
                    }
                } else {
                    let ack_on_match = (h.flags & flag::ACK_MATCH != 0).then_some(h.aux);
                    let held = bytes.len() + UNEXP_OVERHEAD;
                    let payload = Payload::Eager {
                        bytes: bytes.to_vec(),
                        ack_on_match,
                        peer: p,
                    };
                    st.rxq.push_unexpected(
                        tagged,
                        Unexpected {
                            src,
                            tag: h.tag,
                            data: h.data,
                            has_data: data.is_some(),
                            len,
                            held,
                            payload,
                        },
                    );
                    if h.flags & flag::ACK_DELIVERY != 0 {
                        self.ack(st, p, h.aux, 0);
                    }
                }
            }
            kind::RTS => {
                let Some(r) = parse_rts(pl, p, h.aux) else {
                    return false;
                };
                let src = self.src_of(st, p);
                if let Some(slot) = st.rxq.match_arrival(src, h.tag, tagged, r.len) {
                    self.start_rndv(st, slot, r, h.tag, data, src);
                } else {
                    st.rxq.push_unexpected(
                        tagged,
                        Unexpected {
                            src,
                            tag: h.tag,
                            data: h.data,
                            has_data: data.is_some(),
                            len: r.len,
                            held: UNEXP_OVERHEAD + r.iov.len() * 16,
                            payload: Payload::Rndv(r),
                        },
                    );
                }
            }
            kind::CTS if h.flags & flag::SPLIT != 0 => {
                self.write_split(st, p, h.aux as usize, h.tag, pl);
            }
            kind::CTS => {
                let id = h.aux as usize;
                if let Some(t) = st
                    .tx
                    .get_mut(id)
                    .filter(|t| t.peer == p && t.stream.is_none())
                {
                    t.stream = Some((h.tag as u32, 0));
                    st.streaming.push(id as u32);
                }
            }
            kind::WDONE if st.rxp.get(h.aux as usize).is_some_and(|r| r.peer == p) => {
                self.split_written(st, h.aux as usize, h.len as i32)
            }
            kind::DATA => {
                let id = h.aux as usize;
                let off = h.tag as usize;
                let len = h.len as usize;
                if let Some(r) = st
                    .rxp
                    .get_mut(id)
                    .filter(|r| r.peer == p && r.split.is_none())
                {
                    // SAFETY: the pipe's buffer is ours until completion.
                    unsafe { r.slot.iov.copy_in(off, &pl[..len.min(pl.len())]) };
                    r.got += len;
                    if r.got >= r.total {
                        let r = st.rxp.remove(id);
                        let got = r.total.min(r.slot.iov.total());
                        let status = self.sink_status(&r.slot, got);
                        self.ack(st, r.peer, r.tx_id, status);
                        let raw = self.raw_src(st, r.peer, r.src);
                        st.push_rx(Done::Rx {
                            slot: r.slot,
                            len: got,
                            olen: r.total - got,
                            tag: r.tag,
                            data: r.data,
                            src: r.src,
                            raw,
                        });
                    }
                }
            }
            kind::ACK => {
                let id = h.aux as usize;
                if st.tx.contains(id) && st.tx[id].peer == p {
                    let t = st.tx.remove(id);
                    st.streaming.retain(|&s| s as usize != id);
                    let status = if h.len != 0 { h.len as i32 } else { t.status };
                    st.done.push(if status == 0 {
                        Done::Tx {
                            ctx: t.ctx,
                            flags: t.flags,
                        }
                    } else {
                        Done::TxErr {
                            ctx: t.ctx,
                            flags: t.flags,
                            err: status,
                        }
                    });
                }
            }
            kind::RMA_WRITE
            | kind::RMA_WRITE1
            | kind::RMA_READ
            | kind::RDATA
            | kind::RSPLIT
            | kind::ATOMIC
            | kind::ARESULT => match h.kind {
                kind::RMA_WRITE | kind::RMA_WRITE1 => self.handle_rma_write(st, p, &h, pl),
                kind::RMA_READ => self.handle_rma_read(st, p, &h, pl),
                kind::RDATA => self.handle_rdata(st, p, &h, pl),
                kind::RSPLIT => self.handle_rsplit(st, p, &h, pl),
                kind::ATOMIC => self.handle_atomic(st, p, &h, pl),
                _ => self.handle_aresult(st, p, &h, pl),
            },
            kind::BYE => {
                // Its endpoint is gone: what it still had landing never will; what it sent
                // before leaving is handled now; then nothing more goes to it or comes from it.
                self.fail_pipes_from(st, p, FI_ECONNRESET);
                st.peers[p].forget_reads();
                self.replay_peer(st, lane, p);
                st.peers[p].held.clear();
                st.lane_peer[lane] = None;
                st.peers[p].rx_lane = None;
                self.peer_died(st, p);
                return true;
            }
            kind::RDONE => self.read_done(st, p, h.aux),
            _ => {}
        }
        false
    }

    fn deliver_unexpected(&self, st: &mut State, slot: RecvSlot, u: Unexpected<Payload>) {
        let data = u.has_data.then_some(u.data);
        let discard = slot.op_flags & FI_DISCARD != 0;
        match u.payload {
            Payload::Eager {
                bytes,
                ack_on_match,
                peer,
            } => {
                let got = if discard {
                    0
                } else {
                    // SAFETY: the receive's buffer is ours until it completes.
                    unsafe { slot.iov.copy_in(0, &bytes) }
                };
                if let Some(id) = ack_on_match {
                    self.ack(st, peer, id, 0);
                }
                let raw = self.raw_src(st, peer, u.src);
                st.push_rx(Done::Rx {
                    slot,
                    len: got,
                    olen: if discard { 0 } else { u.len - got },
                    tag: u.tag,
                    data,
                    src: u.src,
                    raw,
                });
            }
            Payload::Rndv(r) => {
                if discard {
                    self.ack(st, r.peer, r.tx_id, 0);
                    st.push_rx(Done::Rx {
                        slot,
                        len: 0,
                        olen: 0,
                        tag: u.tag,
                        data,
                        src: u.src,
                        raw: None,
                    });
                } else {
                    self.start_rndv(st, slot, r, u.tag, data, u.src);
                }
            }
        }
    }

    fn do_progress(&self, st: &mut State) -> usize {
        let mut n = 0;
        if !st.streaming.is_empty() {
            n += self.pump_streams(st);
        }
        for p in 0..st.peers.len() {
            if !st.peers[p].backlog.is_empty() {
                self.flush_backlog(st, p);
            }
        }
        n += self.poll_lanes(st);
        if st.peers.iter().any(|p| !p.held.is_empty()) {
            self.replay_held(st);
        }
        if !st.fenced.is_empty() {
            self.release_fenced(st);
        }
        if st.rxp.iter().any(|(_, r)| r.split.is_some()) {
            // A split copy waits only for the sender's WDONE, which is moments away: watch
            // the lanes here rather than going back out through the application's poll loop.
            for _ in 0..SPLIT_SPIN {
                if bits(st.known_active).any(|l| st.cons[l].ready_at(&self.seg, l)) {
                    n += self.poll_lanes(st);
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if self.sweep_due() {
            self.sweep(st);
        }
        n
    }

    /// Lock-free: whether a progress call may find something to do.
    fn has_work(&self) -> bool {
        if self.idle.busy.load(Ordering::Acquire) {
            return true;
        }
        let mask = ring::active(&self.seg).load(Ordering::Acquire);
        if mask != self.idle.known_active.load(Ordering::Relaxed) {
            return true;
        }
        bits(mask).any(|l| ring::published(&self.seg, l, self.idle.pos[l].load(Ordering::Relaxed)))
    }

    /// Refreshes the lock-free mirrors (under the lock, at the end of each locked call).
    fn publish_idle(&self, st: &State) {
        for l in bits(st.known_active) {
            self.idle.pos[l].store(st.cons[l].pos(), Ordering::Relaxed);
        }
        self.idle
            .known_active
            .store(st.known_active, Ordering::Relaxed);
        // Only work this side can advance by itself keeps it busy (fragments to push, control
        // messages to flush, held operations, a split copy's short spin). Replies it waits for
        // (ACK, CTS, DATA) ring its doorbell when they come.
        let busy = !st.streaming.is_empty()
            || !st.fenced.is_empty()
            || (0..st.peers.len()).any(|p| !st.peers[p].held.is_empty() && !holding(st, p))
            || st.rxp.iter().any(|(_, r)| r.split.is_some())
            || st.peers.iter().any(|p| !p.backlog.is_empty());
        self.idle.busy.store(busy, Ordering::Release);
        // Only while an operation could wait on a dead peer (a posted receive may wait on what
        // a dead sender left in its lane, delivered by the sweep): an idle endpoint with
        // nothing posted costs no clock reads and no early wake-ups.
        let watch = !st.tx.is_empty()
            || !st.rxp.is_empty()
            || (st.rxq.posted_len() > 0
                && (st.known_active != 0 || self.core.caps & FI_DIRECTED_RECV != 0));
        self.idle.watch.store(watch, Ordering::Relaxed);
    }
}

impl ProgressSource for ShmEndpoint {
    fn wake(&self) {
        Self::wake(&self.seg);
    }

    fn progress(&self) -> usize {
        // Idle, take the full path only when a sweep is due and something waits on a peer: a
        // dead one must be noticed by time, however slowly (or fast) the application polls.
        let sweep = || self.idle.watch.load(Ordering::Relaxed) && self.sweep_due();
        if !self.has_work() && !sweep() {
            return 0;
        }
        let Ok(mut st) = self.st.try_lock() else {
            return 0;
        };
        let n = self.do_progress(&mut st);
        self.finish(st);
        n
    }

    fn idle_wait(&self, timeout: Duration) {
        let sleepers = ring::sleeping(&self.seg);
        let db = ring::doorbell(&self.seg);
        let seen = db.load(Ordering::SeqCst);
        // A dead peer rings no doorbell: while work waits on peers, wake in time to sweep.
        let timeout = if self.idle.watch.load(Ordering::Relaxed) {
            timeout.min(SWEEP_EVERY)
        } else {
            timeout
        };
        sleepers.fetch_add(1, Ordering::SeqCst);
        if !self.has_work() {
            super::futex::wait(db, seen, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut st) = self.st.try_lock() {
            if self.sweep_due() {
                self.sweep(&mut st);
            }
            self.finish(st);
        }
    }
}

impl EndpointOps for ShmEndpoint {
    fn enable(&self) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> Vec<u8> {
        format!("{ADDR_PREFIX}{}", self.name).into_bytes()
    }

    unsafe fn send(&self, op: &TxOp) -> Result<()> {
        let mut st = self.lock();
        let r = self.post_send(&mut st, op);
        self.finish(st);
        r
    }

    unsafe fn rma(&self, op: &xfabric_core::RmaOp) -> Result<()> {
        let mut st = self.lock();
        let r = self.post_rma(&mut st, op);
        self.finish(st);
        r
    }

    unsafe fn atomic(&self, req: &xfabric_core::AtomicReq) -> Result<()> {
        let mut st = self.lock();
        let r = self.post_atomic(&mut st, req);
        self.finish(st);
        r
    }

    unsafe fn recv(&self, r: PostedRecv) -> Result<()> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::OpBadState("recv: endpoint is closed".into()));
        }
        // A peek looks only at buffered messages: take in what has already arrived first.
        if r.flags & FI_PEEK != 0 {
            self.poll_lanes(&mut st);
        }
        if self.core.caps & FI_DIRECTED_RECV != 0 && r.src != FI_ADDR_UNSPEC {
            // Know the source as a peer, so that its death fails this receive.
            self.peer_for(&mut st, r.src)?;
        }
        let (ctx, flags, tag) = (r.ctx, r.flags, r.tag);
        match st.rxq.post(r) {
            PostResult::Queued => {}
            PostResult::Matched(list) => {
                for (slot, u) in list {
                    self.deliver_unexpected(&mut st, slot, u);
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
                    match u.payload {
                        Payload::Rndv(r) => self.ack(&mut st, r.peer, r.tx_id, 0),
                        Payload::Eager {
                            ack_on_match: Some(id),
                            peer,
                            ..
                        } => self.ack(&mut st, peer, id, 0),
                        _ => {}
                    }
                }
                st.done.push(Done::Peek {
                    ctx,
                    len,
                    tag,
                    data: has_data.then_some(data),
                    src,
                });
            }
            PostResult::NoMessage => st.done.push(Done::RxErr {
                ctx,
                flags: FI_RECV | (flags & (FI_MSG | FI_TAGGED)),
                tag,
                err: FI_ENOMSG,
            }),
        }
        self.finish(st);
        Ok(())
    }

    fn cancel(&self, ctx: Context) -> Result<()> {
        let mut st = self.lock();
        let Some((r, released)) = st.rxq.cancel(ctx) else {
            return Err(Error::NoEntry(format!(
                "cancel: no posted receive with context {ctx:#x}"
            )));
        };
        // A multi-receive buffer is handed back (FI_MULTI_RECV) only if nothing still lands in it.
        let release = if released { r.flags & FI_MULTI_RECV } else { 0 };
        st.done.push(Done::RxErr {
            ctx: r.ctx,
            flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)) | release,
            tag: r.tag,
            err: FI_ECANCELED,
        });
        self.finish(st);
        Ok(())
    }

    fn buffered(&self) -> xfabric_core::Buffered {
        let st = self.lock();
        xfabric_core::Buffered {
            unexpected: st.rxq.unexpected_len(),
            unexpected_bytes: st.rxq.unexpected_bytes(),
            held: st.peers.iter().map(|p| p.held.len()).sum(),
        }
    }

    fn setopt(&self, name: i32, value: usize) -> Result<()> {
        match name {
            FI_OPT_MIN_MULTI_RECV => {
                self.lock().rxq.min_multi_recv = value;
                Ok(())
            }
            _ => Err(Error::NoSys(format!(
                "setopt: option {name} is not supported by shm"
            ))),
        }
    }

    fn close(&self) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        st.closed = true;
        // Acknowledgements and other replies still queued for live peers go out first, for a
        // bounded time: a peer waiting for them would otherwise see only our BYE or our
        // death, and fail operations that did complete here.
        let until = Instant::now() + Duration::from_secs(1);
        loop {
            let mut queued = false;
            for p in 0..st.peers.len() {
                if !st.peers[p].dead && !self.flush_backlog(&mut st, p) && st.peers[p].owner_alive()
                {
                    queued = true;
                }
            }
            if !queued || Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
        for p in 0..st.peers.len() {
            let peer = &mut st.peers[p];
            if !peer.backlog.is_empty() {
                // BYE must not overtake what is queued; the peer notices our lock go instead.
                continue;
            }
            if let Some(prod) = peer.prod.as_mut() {
                let h = Header {
                    kind: kind::BYE,
                    ..Default::default()
                };
                let seg = peer.seg.as_ref().expect("a lane implies a segment");
                // Best effort: if the ring is full the peer notices our segment's lock go.
                if prod.write(seg, &h, 0, |_| {}) {
                    Self::wake(seg);
                }
            }
        }
        let txs: Vec<TxReq> = st.tx.drain().collect();
        for t in txs {
            st.done.push(Done::TxErr {
                ctx: t.ctx,
                flags: t.flags,
                err: FI_ECANCELED,
            });
        }
        st.streaming.clear();
        for (_, f) in std::mem::take(&mut st.fenced) {
            let (ctx, flags) = match f {
                Fenced::Send(op, _) => (op.ctx, op.flags),
                Fenced::Rma(op, _) => (op.ctx, op.flags),
            };
            st.done.push(Done::TxErr {
                ctx,
                flags,
                err: FI_ECANCELED,
            });
        }
        // A split copy's sender may still be writing into its buffer, and a read's target may
        // still push into ours: wait (bounded) for their WDONE / ACK before handing buffers
        // back, unless the peer is gone.
        let until = Instant::now() + Duration::from_secs(5);
        let pushing = |st: &State| {
            st.rxp
                .iter()
                .any(|(_, r)| r.split.is_some() && !st.peers[r.peer].dead)
                || st.tx.iter().any(|(_, t)| {
                    t.flags & FI_RMA != 0 && t.flags & FI_READ != 0 && !st.peers[t.peer].dead
                })
        };
        while pushing(&st) && Instant::now() < until {
            if self.poll_lanes(&mut st) == 0 {
                if self.sweep_due() {
                    self.sweep(&mut st);
                }
                std::hint::spin_loop();
            }
        }
        let pipes: Vec<RxPipe> = st.rxp.drain().collect();
        for r in pipes {
            st.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err: FI_ECANCELED,
            });
        }
        for r in st.rxq.drain_posted() {
            st.done.push(Done::RxErr {
                ctx: r.ctx,
                flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED | FI_MULTI_RECV)),
                tag: r.tag,
                err: FI_ECANCELED,
            });
        }
        st.rxq.drain_unexpected();
        self.finish(st);
    }
}

fn bits(mask: u64) -> impl Iterator<Item = usize> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        Some(i)
    })
}

/// The segment name inside a raw shm address.
pub fn seg_name(raw: &[u8]) -> Result<String> {
    let s =
        std::str::from_utf8(raw).map_err(|_| Error::Inval("shm address is not UTF-8".into()))?;
    let s = s.trim_end_matches('\0');
    let name = s.strip_prefix(ADDR_PREFIX).ok_or_else(|| {
        Error::Inval(format!(
            "shm address {s:?} does not start with {ADDR_PREFIX}"
        ))
    })?;
    if !name.starts_with(super::segment::PREFIX) || name.contains('/') || name.len() > 200 {
        return Err(Error::Inval(format!(
            "shm address {s:?} does not name an xfabric segment"
        )));
    }
    Ok(name.to_string())
}
