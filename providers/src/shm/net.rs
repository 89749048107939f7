//! The rings as the transport of core's RDM engine for shm endpoints: frames go from
//! one endpoint to another through the sender's lane in the receiver's segment (`ring`), the
//! engine's encoded prefix and control part carried verbatim, so nothing is parsed twice.
//!
//! ```text
//! FRAME: 0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8 prefix and control part
//!        (wire::Prefix then ctrl_len bytes) | first min(body_len, PIECE) body bytes
//! PIECE: 0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8 the next min(left, PIECE)
//!        body bytes of the lane's current frame
//! ```
//!
//! An 8-byte message (16-byte prefix, 24-byte control part, 8 body bytes after the 8-byte
//! slot header) and an acknowledgement take one 64-byte slot each. A lane starts with a CONNECT
//! (the sender's name) and ends with a BYE (`ring::Header`).
//!
//! Flow control: a frame the engine answers `Sink::Wait` (no room for an unexpected message,
//! ordering behind a copy) and every later request from the same peer are copied into that
//! peer's held queue, so that answers behind them (`Kind::is_answer`) still arrive; past
//! `HELD_MAX` frames, or for a frame whose body is larger than `HELD_BODY_MAX`, the frame
//! stays at the head of the lane and the lane is not read further until the engine takes it.
//! A sender keeps `CTRL_SPARE` slots of every ring free for answers.
//!
//! Everything in a lane is the peer's: a frame that does not parse, or a message of a kind
//! that cannot come there, drops the lane (with a log line) and the engine loses the peer.
//!
//! Besides the engine's frames a lane carries the transport's own messages (`split`: the
//! split copy of large messages), told apart by the slot's kind.
//!
//! The engine's one-sided copies are cross-memory attach (`cma`, split between the two
//! processes when large: `split`), or, for memory the sender allocated to be shared (hmem's
//! device-visible host memory), plain loads from a mapping of it (`mapped`).

mod armed;
pub(super) mod fdpass;
pub(super) mod ipc;
pub(super) mod mapped;
pub(super) mod split;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use xfabric_core::consts::errno::*;
use xfabric_core::copy::copy_slice;
use xfabric_core::rdm::wire::{self, Kind, Prefix, PREFIX};
use xfabric_core::rdm::{Body, Copied, CopyReq, Desc, Dir, Engine, OneSided, PeerId, Sink};
use xfabric_core::rdm::{Transmit, Transport};
use xfabric_core::{Error, IovList, Result};

use super::addr::ADDR_PREFIX;
use super::cma::{self, CmaResult, CmaState};
use super::ring::{self, kind, Consumer, Header, Producer, CTRL_SPARE, LANES};
use super::segment::Segment;
use crate::rdm::{Glue, Handler, PeerName};

pub use armed::{counts as armed_counts, Counts as ArmedCounts, RELEASE};
pub use ipc::{counts as ipc_counts, desc_of as ipc_desc, Counts as IpcCounts};
pub use mapped::{counts as mapped_counts, desc_of as mapped_desc, Counts as MappedCounts};
pub use split::{counts as split_counts, Counts as SplitCounts, SPLIT, SPLIT_DONE};

/// Kind of a message that starts a frame.
pub const FRAME: u8 = 20;
/// Kind of a message that continues the current frame's body.
pub const PIECE: u8 = 21;
/// Body bytes per message.
pub const PIECE_LEN: usize = 16384;
/// Frames one peer may have in its held queue.
pub const HELD_MAX: usize = 1024;
/// Largest body a held frame is copied out of the ring with; larger ones stay there.
const HELD_BODY_MAX: usize = 64 << 10;
/// Messages taken per lane per progress call, so one busy sender cannot starve the rest.
const BATCH: usize = 16;
/// Control bytes `fits` allows for a request: a message's or an atomic's prefix and control
/// part (an RMA request's ranges may take more; it is queued by the engine then).
const REQUEST_CTRL: usize = 64;
/// Milliseconds between looks for dead peers while anything could wait on one.
pub const SWEEP_EVERY_MS: u64 = 20;

/// Most peers' segments an endpoint maps at once (a dead peer's is unmapped). Far past the
/// processes of one host; a bound on what CONNECTs naming ever new segments can make us map.
pub const MAX_LINKS: usize = 4096;

/// How long a lane may stay claimed with no CONNECT taken from it: a sender that died between
/// claiming a lane and naming itself, or a process that claims lanes and never says who it
/// is, holds no lane longer (a live sender names itself right after it claims).
pub const NAMELESS_LANE_MS: u64 = 1000;

/// A frame copied out of a lane, waiting for the engine to take it.
struct Held {
    prefix: Prefix,
    ctrl: Vec<u8>,
    body: Vec<u8>,
    /// Its bytes, counted against `XFABRIC_SHM_HELD_BYTES` until it goes.
    _charge: Charge,
}

/// Bytes of one peer's held frames: taken before a frame's copy is allocated, given back when
/// the frame goes (taken by the engine, or dropped with its lane or its peer).
struct Charge {
    pool: Arc<AtomicUsize>,
    bytes: usize,
}

impl Charge {
    /// `bytes` more from `pool`, if it stays within `max`.
    fn take(pool: &Arc<AtomicUsize>, bytes: usize, max: usize) -> Option<Charge> {
        // Under the endpoint's lock: one thread charges at a time.
        let now = pool.load(Ordering::Relaxed);
        if now.checked_add(bytes)? > max {
            return None;
        }
        pool.fetch_add(bytes, Ordering::Relaxed);
        Some(Charge {
            pool: pool.clone(),
            bytes,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.pool.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Where the body of the frame arriving on a lane goes.
enum To {
    Engine(Sink),
    Hold(Held),
}

/// What became of a CONNECT (`Net::on_connect`).
enum Connect {
    /// The lane is its peer's.
    Taken,
    /// The lane was dropped.
    Dropped,
    /// The peer's segment cannot be mapped now (descriptors, memory or mapping slots short):
    /// the CONNECT stays at the lane's head until after the next sweep.
    Later,
}

/// A frame whose body is still arriving in pieces.
struct InFrame {
    to: To,
    /// Body bytes taken so far, of `len`.
    off: usize,
    len: usize,
}

/// One peer: our lane in its segment, its lane in ours.
struct Link {
    name: String,
    /// Its segment; `None` for a peer already gone when its CONNECT was read
    /// (`never_mapped`), or dead and unmapped since.
    seg: Option<Segment>,
    /// Already gone when its CONNECT was read: never mapped.
    never_mapped: bool,
    prod: Option<Producer>,
    rx_lane: Option<usize>,
    /// Its pid, once cross-memory attach through it was shown to reach it.
    pid: Option<i32>,
    /// The descriptor its owner holds its segment's lock through, as verified with `pid`
    /// (read from its header once, then: a peer's later word is not trusted).
    owner_fd: u32,
    /// Coarse time the lock was last seen to be `pid`'s own (`owner_alive`).
    lock_seen: u64,
    dead: bool,
    /// A frame whose body is partly written, and how much of it.
    out: Option<(Transmit, usize)>,
    /// Whether we wrote to its ring since we last looked for a sleeper there.
    wrote: bool,
    held: VecDeque<Held>,
    /// The engine's `wait_stamp` for this peer when its first held frame was last offered
    /// and still had to wait: while the engine's stamp reads the same, offering it again is
    /// pointless, and the held frames keep the endpoint from sleeping only once it moved.
    held_stamp: Option<xfabric_core::rdm::WaitStamp>,
    /// Their bytes, and those of a frame being held as it arrives (`Charge`): per peer, so
    /// that one peer's flood holds back no other peer's frames.
    held_bytes: Arc<AtomicUsize>,
    /// When `check` last looked at its lock.
    checked: Option<std::time::Instant>,
    /// Its transport answered a split copy with `FI_EPERM` (its kernel will not let it
    /// write to us): copies from it are not split any more.
    no_split: bool,
    /// A copy from it was refused, after which the engine asks none of it: the descriptors
    /// it passes with its VMM offers (`fdpass`) would never be used, and are not kept.
    no_fds: bool,
    /// Our armed sends released to it, answered by its count (`armed`).
    tx_acks: armed::TxAcks,
    /// Its armed sends released to us that we took, answered by our count (`armed`).
    rx_acks: armed::RxAcks,
}

impl Link {
    fn new(name: &str, seg: Option<Segment>, owner: Option<(i32, u32)>) -> Link {
        Link {
            name: name.to_string(),
            // Even a peer whose segment is gone is not dead yet: what it wrote into our
            // ring is still read, and the next sweep loses it (`sweep`), failing whatever
            // that left waiting on it.
            dead: false,
            never_mapped: seg.is_none(),
            seg,
            prod: None,
            rx_lane: None,
            pid: owner.map(|o| o.0),
            owner_fd: owner.map_or(0, |o| o.1),
            lock_seen: 0,
            out: None,
            wrote: false,
            held: VecDeque::new(),
            held_stamp: None,
            held_bytes: Arc::default(),
            checked: None,
            no_split: false,
            no_fds: false,
            tx_acks: armed::TxAcks::default(),
            rx_acks: armed::RxAcks::default(),
        }
    }
}

/// What the lock-free progress check reads (mirrors of the locked state).
pub struct Idle {
    /// Work this side can advance by itself is pending.
    pub busy: AtomicBool,
    /// A peer's CONNECT waits for its segment to map (`Net::connect_later`): only a sweep
    /// reads it again, so no sleep without a timeout may begin (`ShmBell::quiet`).
    pub connect_waits: AtomicBool,
    /// Lanes stalled behind held frames that cannot move until the engine's state does
    /// (`Net::held_state`), and lanes whose CONNECT waits for the next sweep
    /// (`Net::connect_later`): what they hold is no work yet.
    quiet_lanes: AtomicU64,
    /// Something could wait on a dead peer: sweeps are due by time.
    pub watch: AtomicBool,
    /// When the next sweep is due (`coarse_ms`).
    pub next_sweep: AtomicU64,
    /// A progress call took messages in without looking at the clock: the next look is owed
    /// (any, the bell's idle one included).
    pub clock_owed: AtomicBool,
    pos: [AtomicU64; LANES],
    known_active: AtomicU64,
    /// Lanes whose producer's count of our released armed sends is awaited (`armed`), and
    /// the count each was last applied at.
    count_lanes: AtomicU64,
    count_seen: [AtomicU32; LANES],
}

/// The transport of one endpoint.
pub struct Net {
    pub seg: Segment,
    id: u64,
    pub name: String,
    pub cma: Arc<CmaState>,
    links: Vec<Link>,
    by_name: HashMap<String, PeerId>,
    lane_peer: [Option<PeerId>; LANES],
    cons: [Consumer; LANES],
    rx: [Option<InFrame>; LANES],
    /// Lanes whose head frame waits for the engine (flow control): not read further.
    stalled: u64,
    /// Lanes whose CONNECT waits for its peer's segment to map (`Connect::Later`): not read
    /// again, nor counted as work, until the next sweep.
    connect_later: u64,
    known_active: u64,
    /// When each lane was first seen claimed with no CONNECT taken from it (coarse ms; 0:
    /// not such a lane): one left so for `NAMELESS_LANE_MS` is released by a sweep.
    nameless_since: [u64; LANES],
    /// Our own segment's truncation was logged (`sweep`).
    own_fault_said: bool,
    /// Peers with a partly written frame.
    pumping: Vec<PeerId>,
    /// Tokens of frames handed over whole, for `Engine::on_sent`.
    sent: Vec<(PeerId, u64)>,
    /// Gone peers a go-ahead (`Cts`) was dropped for: their loss is reported again once the
    /// engine's frames are handed over, ending the large messages of theirs a receive took.
    relost: Vec<PeerId>,
    /// Some link's `wrote` is set.
    wrote: bool,
    /// Frames held, every link's together (`Link::held`): counted where they are held and
    /// let go, so that each locked call's `publish` and each receive need not add them up.
    held_frames: usize,
    /// `XFABRIC_SHM_HELD_BYTES`: a link's held frames' bytes at most (`Link::held_bytes`).
    held_max: usize,
    /// How many links there were at the last `publish` (`published_current`).
    links_published: std::cell::Cell<usize>,
    directed: bool,
    pub idle: Arc<Idle>,
    /// Split copies waiting for the peer's answer (`split`).
    splits: Vec<split::Pending>,
    /// Copies of at least this many bytes are split (`XFABRIC_SHM_SPLIT_MIN`; only copies
    /// from `XFABRIC_SHM_CMA_MIN` on are asked for).
    split_min: usize,
    /// Cross-memory attach as this endpoint writes peers' parts of their splits: a kernel
    /// that forbids that (Yama's ptrace_scope lets a parent reach its child, not the other
    /// way) must not stop this endpoint's own reads.
    split_cma: CmaState,
    /// Peers' shared allocations mapped for copies (`mapped`).
    maps: mapped::Cache,
    /// Peers' CUDA allocations opened by IPC, and the copies from them under way (`ipc`).
    ipc: ipc::Cache,
    /// The endpoint's core, for landing staged device receives directly (`ipc`).
    pub core: Option<Arc<xfabric_core::EpCore>>,
    /// Where peers pass descriptors of their VMM allocations (`fdpass`), for an endpoint
    /// that takes CUDA IPC.
    pub fds: Option<fdpass::Inbox>,
    /// Peers are verified with a pidfd kept (one descriptor each): this endpoint passes them
    /// its CUDA VMM allocations' descriptors, which must reach the very process verified.
    pub keep_pidfds: bool,
    /// Each peer's segment name and verified pid, for describing VMM memory to it (`ipc`).
    pub book: ipc::PeerBook,
    /// Armed sends' announcements in our segment's armed slots (`armed`).
    armed: armed::Slots,
    /// Each lane's producer's count of our released sends it finished, as last applied
    /// (`armed`; 0 from its CONNECT on).
    count_seen: [u32; LANES],
    /// Each lane's (count, head) read and not applied yet: kept until the lane is read up to
    /// that head, rather than replaced by a later pair whose head keeps moving away.
    count_pending: [Option<(u32, u64)>; LANES],
}

/// The descriptor socket of the endpoint whose segment is `seg` (`fdpass`).
pub fn fdpass_inbox(seg: &str) -> std::result::Result<fdpass::Inbox, String> {
    fdpass::Inbox::bind(seg)
}

/// A peer named by its segment (the AV holds `fi_shm://` and the name).
pub struct Seg<'a>(pub &'a str);

impl PeerName for Seg<'_> {
    fn raw(&self) -> Vec<u8> {
        format!("{ADDR_PREFIX}{}", self.0).into_bytes()
    }
}

/// A lane-claim id unique per segment name, never 0.
pub fn ident(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
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

/// Copies `dst.len()` bytes of `body` from `off` into `dst`.
fn body_out(body: &Body, off: usize, dst: &mut [u8]) {
    match body {
        // SAFETY: the engine keeps a frame's application memory valid until it is reported
        // sent or its peer lost.
        Body::Iov(iov) => unsafe {
            iov.copy_out(off, dst);
        },
        b => {
            if let Some(src) = b.held().and_then(|h| h.get(off..off + dst.len())) {
                copy_slice(dst, src);
            }
        }
    }
}

/// Puts `b`, the body bytes from `off`, where `to` says.
fn body_in(to: &mut To, off: usize, b: &[u8]) {
    match to {
        To::Engine(sink) => sink_in(sink, off, b),
        To::Hold(Held { body, .. }) => buf_in(body, off, b),
    }
}

/// Puts `b`, the body bytes from `off`, into `sink` (what does not fit is dropped).
fn sink_in(sink: &mut Sink, off: usize, b: &[u8]) {
    match sink {
        Sink::Buffer(v) => buf_in(v, off, b),
        Sink::Iov(iov) => {
            // SAFETY: a sink's memory is the engine's to hand out until `on_body`.
            unsafe { iov.copy_in(off, b) };
        }
        Sink::Discard | Sink::Wait => {}
    }
}

fn buf_in(v: &mut [u8], off: usize, b: &[u8]) {
    if let Some(d) = v.get_mut(off..) {
        let n = d.len().min(b.len());
        copy_slice(&mut d[..n], &b[..n]);
    }
}

impl Net {
    /// The transport of a new endpoint: creates its segment.
    pub fn open(directed: bool) -> Result<Net> {
        let name = super::segment::fresh_name();
        let seg = Segment::create(&name, ring::SEG_BYTES)?;
        ring::init_header(
            &seg,
            ident(&format!("{name}/{:?}", std::time::Instant::now())) ^ 0x9e37_79b9_7f4a_7c15,
        );
        Ok(Net {
            id: ident(&name),
            name,
            seg,
            cma: Arc::new(CmaState::new()),
            links: Vec::new(),
            by_name: HashMap::new(),
            lane_peer: [None; LANES],
            cons: [Consumer::default(); LANES],
            rx: std::array::from_fn(|_| None),
            stalled: 0,
            connect_later: 0,
            known_active: 0,
            nameless_since: [0; LANES],
            own_fault_said: false,
            pumping: Vec::new(),
            sent: Vec::new(),
            relost: Vec::new(),
            wrote: false,
            held_frames: 0,
            held_max: xfabric_core::settings::SHM_HELD_BYTES.usize(),
            links_published: std::cell::Cell::new(usize::MAX),
            directed,
            splits: Vec::new(),
            split_min: xfabric_core::settings::SHM_SPLIT_MIN.usize(),
            split_cma: CmaState::new(),
            maps: mapped::Cache::default(),
            ipc: ipc::Cache::default(),
            core: None,
            fds: None,
            keep_pidfds: false,
            book: ipc::PeerBook::default(),
            armed: armed::Slots::default(),
            count_seen: [0; LANES],
            count_pending: [None; LANES],
            idle: Arc::new(Idle {
                busy: AtomicBool::new(false),
                quiet_lanes: AtomicU64::new(0),
                connect_waits: AtomicBool::new(false),
                watch: AtomicBool::new(false),
                next_sweep: AtomicU64::new(0),
                clock_owed: AtomicBool::new(false),
                pos: std::array::from_fn(|_| AtomicU64::new(0)),
                known_active: AtomicU64::new(0),
                count_lanes: AtomicU64::new(0),
                count_seen: std::array::from_fn(|_| AtomicU32::new(0)),
            }),
        })
    }

    /// The peer whose segment is `name`, mapping it on first use.
    pub fn peer_by_name(&mut self, name: &str) -> Result<PeerId> {
        if let Some(&p) = self.by_name.get(name) {
            return Ok(p);
        }
        let (seg, who) = self.map_peer(name).map_err(|e| {
            if passing(&e) {
                // Short of descriptors or memory now: the caller may try again.
                Error::Again("shm: the peer's segment cannot be mapped now (descriptors, memory or mapping slots short)")
            } else {
                e
            }
        })?;
        Ok(self.add_link(name, Some(seg), who))
    }

    /// Maps the segment of the peer named `name` and verifies who holds it.
    fn map_peer(&mut self, name: &str) -> Result<(Segment, Option<fdpass::Verified>)> {
        if self.links.iter().filter(|l| l.seg.is_some()).count() >= MAX_LINKS {
            // A process naming new segments over and over must not make us map without end
            // (a peer that goes is unmapped: room comes back as peers go).
            return Err(Error::Again(
                "shm: as many peers' segments mapped as allowed",
            ));
        }
        let seg = Segment::open(name, ring::SEG_BYTES)?;
        if !ring::check_header(&seg) {
            return Err(Error::PeerLost(format!(
                "segment {name} is not an xfabric shm endpoint"
            )));
        }
        let who = if self.cma.usable() {
            ring::verified(&seg, self.keep_pidfds)
                .map(|(pid, fd, pidfd)| fdpass::Verified::new(pid, fd, pidfd))
        } else {
            None
        };
        if who.is_some() {
            // The check read the peer's memory by cross-memory attach.
            self.cma.seen_working();
        }
        Ok((seg, who))
    }

    fn add_link(
        &mut self,
        name: &str,
        seg: Option<Segment>,
        who: Option<fdpass::Verified>,
    ) -> PeerId {
        self.links.push(Link::new(
            name,
            seg,
            who.as_ref().map(|v| (v.pid, v.owner_fd)),
        ));
        let p = self.links.len() - 1;
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        // Indexed as the links are (both only grow).
        if book.len() == p {
            book.push((name.to_string(), who));
        }
        drop(book);
        self.by_name.insert(name.to_string(), p);
        p
    }

    /// Whether `p` is known gone.
    pub fn dead(&self, p: PeerId) -> bool {
        self.links.get(p).is_none_or(|l| l.dead)
    }

    /// The peer's name, for messages.
    pub fn peer_name(&self, p: PeerId) -> &str {
        self.links.get(p).map_or("?", |l| &l.name)
    }

    /// Frames held back for ordering or flow control, all peers.
    pub fn held(&self) -> usize {
        debug_assert_eq!(
            self.held_frames,
            self.links.iter().map(|l| l.held.len()).sum::<usize>()
        );
        self.held_frames
    }

    /// Makes sure we own a lane in `p`'s segment (the CONNECT written).
    #[inline]
    pub fn ensure_lane(&mut self, p: PeerId) -> Result<()> {
        // Every operation to a peer after its first: the lane is there.
        if self.links[p].prod.is_some() {
            return Ok(());
        }
        self.claim_lane(p)
    }

    /// `ensure_lane`'s first time for `p`: claims a lane in its segment and says who we are.
    #[inline(never)]
    fn claim_lane(&mut self, p: PeerId) -> Result<()> {
        let id = self.id;
        let me = self.name.as_bytes();
        let link = &mut self.links[p];
        let Some(seg) = link.seg.as_ref() else {
            return Err(Error::PeerLost(format!("peer {} is gone", link.name)));
        };
        let lane = ring::claim_lane(seg, id).ok_or_else(|| {
            Error::Busy(format!(
                "peer {} has no free lane ({LANES} senders)",
                link.name
            ))
        })?;
        // Its pages mapped in now, in one call, rather than a fault every 4 KiB of the
        // lane's first lap.
        let (off, len) = ring::lane_span(lane);
        seg.populate(off, len, true);
        let mut prod = Producer::new(seg, lane);
        // Our count of its released sends we finished starts again with the lane: zeroed
        // before the CONNECT, which publishes it, and from which the peer counts (`armed`).
        ring::store_count(seg, lane, id, 0, 0);
        let h = Header {
            kind: kind::CONNECT,
            len: me.len() as u32,
        };
        // A freshly claimed lane is drained, so the connect message fits.
        if !prod.write(seg, &h, me.len(), |b| b.copy_from_slice(me)) {
            ring::release_lane(seg, lane);
            return Err(Error::Again("shm connect"));
        }
        // A receiver releases a lane left nameless for a second (`NAMELESS_LANE_MS`), never
        // one with a message at its head: still ours once the CONNECT is there, it stays so.
        // Not ours any more (we stalled that long between the claim and the write): claimed
        // again on the next call.
        if ring::claim(seg, lane).load(Ordering::Acquire) != id {
            return Err(Error::Again("shm connect: the lane was released meanwhile"));
        }
        link.prod = Some(prod);
        link.wrote = true;
        self.wrote = true;
        self.count_from_zero(p);
        Ok(())
    }

    /// Whether a frame to `p` is partly written (its body still going out in pieces).
    pub fn writing_to(&self, p: PeerId) -> bool {
        self.links.get(p).is_some_and(|l| l.out.is_some())
    }

    /// Whether a new request of `len` body bytes (and a control part of at most
    /// `REQUEST_CTRL` bytes) to `p` fits its ring now.
    pub fn fits(&mut self, p: PeerId, len: usize) -> bool {
        let link = &mut self.links[p];
        match (link.prod.as_mut(), link.seg.as_ref()) {
            (Some(prod), Some(seg)) => {
                prod.fits_raw(seg, REQUEST_CTRL + len.min(PIECE_LEN), CTRL_SPARE)
            }
            _ => false,
        }
    }

    /// Whether our lane in `p`'s segment holds garbage the peer wrote over its tail.
    pub fn broken(&self, p: PeerId) -> bool {
        self.links[p].prod.as_ref().is_some_and(Producer::broken)
    }

    /// Rings `seg`'s doorbell if one of its owner's threads sleeps, and its wake socket if
    /// its owner may sleep on a descriptor.
    #[inline]
    pub fn wake(seg: &Segment) {
        fence(Ordering::SeqCst);
        if ring::sleeping(seg).load(Ordering::Relaxed) != 0 {
            let db = ring::doorbell(seg);
            db.fetch_add(1, Ordering::SeqCst);
            super::futex::wake(db);
        }
        let fd_sleeping = ring::fd_sleeping(seg);
        if fd_sleeping.load(Ordering::Acquire) & !ring::FD_UNREACHABLE != 0 {
            let nonce = ring::wake_nonce(seg).load(Ordering::Relaxed);
            if nonce != 0 && !super::fdwake::ring(seg.name(), nonce) {
                fd_sleeping.fetch_or(ring::FD_UNREACHABLE, Ordering::Relaxed);
            }
        }
    }

    /// Hands the engine's frames and copies over, and reports what that finished.
    #[inline(always)]
    pub fn push(&mut self, g: &mut Glue<'_>) {
        // After most calls (a receive, a send written in place) there is nothing to do but,
        // after a send, ring the peer's doorbell: both without the frame of the whole round.
        if self.pumping.is_empty() && !g.engine.has_output() && self.sent.is_empty() {
            if self.wrote {
                self.wake_written();
            }
            return;
        }
        self.push_some(g);
    }

    #[inline(never)]
    fn push_some(&mut self, g: &mut Glue<'_>) {
        if !self.pumping.is_empty() {
            self.pump();
        }
        if g.engine.has_output() {
            g.engine.transmit(self);
            while let Some(c) = g.engine.poll_copy() {
                // A gone peer's memory is not copied by any way: not by its pid, which another
                // process may have by now, its mappings or its CUDA IPC handles. What it
                // offered ended with it (a peer that closed canceled it and has its buffers
                // back).
                if self.dead(c.peer) {
                    g.engine
                        .on_copied(c.token, Copied::Failed(libc::ECONNRESET));
                    g.engine.transmit(self);
                    continue;
                }
                let how = match self.split(&c) {
                    // Reported when the peer's part is done too.
                    split::Taken::Pending => continue,
                    split::Taken::Done(how) => how,
                    split::Taken::Alone => match ipc::decode(&c.remote) {
                        // A device's memory named for a peer's RMA (a served write or read):
                        // honest initiators stage those through host memory and never name
                        // it so. Refused: a region's close cannot stop a device copy under
                        // way (`cut_region`), which would go on into, or out of, its memory.
                        Some(_) if c.holds => Copied::Failed(FI_EINVAL),
                        // Reported by `poll_ipc` once its event completes.
                        Some(named) => match self.copy_ipc(&c, named) {
                            None => continue,
                            Some(how) => how,
                        },
                        None => self.copy(&c),
                    },
                };
                if how == Copied::Refused {
                    self.copies_refused(c.peer);
                }
                g.engine.on_copied(c.token, how);
                // A copy's end sends an acknowledgement or a read's answer.
                g.engine.transmit(self);
            }
        }
        while !self.sent.is_empty() || !self.relost.is_empty() {
            // Reporting may send more (what completing these released): those tokens come
            // in the next round. The vector's allocation is kept.
            let mut sent = std::mem::take(&mut self.sent);
            for (p, t) in sent.drain(..) {
                g.engine.on_sent(p, t);
            }
            if self.sent.is_empty() {
                self.sent = sent;
            }
            // Go-aheads dropped for gone peers (`Transport::send`), from any transmit of this
            // push: the large messages they were for end.
            for p in std::mem::take(&mut self.relost) {
                // A body of it half arrived into a receive that this loss fails: its pieces
                // still to come land nowhere (the receive's buffer is the application's again).
                if let Some(lane) = self.links[p].rx_lane {
                    if let Some(InFrame {
                        to: To::Engine(sink @ Sink::Iov(_)),
                        ..
                    }) = &mut self.rx[lane]
                    {
                        *sink = Sink::Discard;
                    }
                }
                g.on_lost(p, Some(&Seg(&self.links[p].name)), libc::ECONNRESET);
            }
            if g.engine.has_output() {
                // What completing those queued (a fenced operation released).
                g.engine.transmit(self);
            }
        }
        if self.wrote {
            self.wake_written();
        }
    }

    /// Rings the doorbell of every peer written to since the last ring.
    fn wake_written(&mut self) {
        self.wrote = false;
        for l in &mut self.links {
            if l.wrote {
                l.wrote = false;
                if let Some(seg) = &l.seg {
                    Self::wake(seg);
                }
            }
        }
    }

    /// Writes what is left of partly written frames, as far as the rings take it.
    fn pump(&mut self) {
        let mut i = 0;
        while i < self.pumping.len() {
            let p = self.pumping[i];
            if self.pump_one(p) {
                self.pumping.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// True once `p` has no partly written frame.
    fn pump_one(&mut self, p: PeerId) -> bool {
        let link = &mut self.links[p];
        let (Some((t, off)), Some(prod), Some(seg)) =
            (link.out.as_mut(), link.prod.as_mut(), link.seg.as_ref())
        else {
            link.out = None;
            return true;
        };
        let total = t.body.len();
        let spare = spare_for(t.ctrl.as_bytes());
        while *off < total {
            let n = (total - *off).min(PIECE_LEN);
            let at = *off;
            if !prod.write_raw(seg, PIECE, 0, n, spare, |b| body_out(&t.body, at, b)) {
                return false;
            }
            link.wrote = true;
            self.wrote = true;
            *off += n;
        }
        let (t, _) = link.out.take().expect("checked above");
        if let Some(tok) = t.token {
            self.sent.push((p, tok));
        }
        true
    }

    /// Performs a copy the engine asked for: from a mapping of the peer's memory where it
    /// described a shared allocation and the mapping serves, else by cross-memory attach.
    fn copy(&mut self, c: &CopyReq) -> Copied {
        let remote = match mapped::decode(&c.remote) {
            Some(named) => match self.copy_mapped(c, named) {
                Ok(how) => return how,
                Err(Some(remote)) => Some(remote),
                Err(None) => return Copied::Refused,
            },
            None => None,
        };
        let Some(pid) = self.links.get(c.peer).and_then(|l| l.pid) else {
            return Copied::Refused;
        };
        if !self.cma.usable() {
            return Copied::Refused;
        }
        let Some(remote) = remote.or_else(|| c.remote.to_iov()) else {
            return Copied::Failed(FI_EINVAL);
        };
        if c.len > remote.total() || c.len > c.local.total() {
            return Copied::Failed(FI_EINVAL);
        }
        let r = match c.dir {
            Dir::Read => cma::read(&self.cma, pid, &c.local, remote.segs(), c.len),
            Dir::Write => cma::write(&self.cma, pid, &c.local, remote.segs(), c.len),
        };
        match r {
            CmaResult::Done => Copied::Done,
            CmaResult::Refused => Copied::Refused,
            CmaResult::PeerGone => Copied::Failed(FI_ECONNRESET),
            CmaResult::Failed(e) => Copied::Failed(e),
        }
    }

    /// Takes in what arrived on every lane; how many messages.
    pub fn progress(&mut self, g: &mut Glue<'_>) -> usize {
        let mask = ring::active(&self.seg).load(Ordering::Acquire);
        let fresh = mask & !self.known_active;
        for i in bits(fresh) {
            self.cons[i] = Consumer::attach(&self.seg, i);
            self.lane_peer[i] = None;
            self.rx[i] = None;
            self.stalled &= !(1 << i);
            self.connect_later &= !(1 << i);
        }
        self.known_active = mask;
        // Before the lanes are read: see `armed`'s answers by count.
        self.look_at_counts();
        let mut n = 0;
        // The links are walked only while one holds frames (`held_frames` counts them all).
        if self.held_frames > 0 {
            for p in 0..self.links.len() {
                // Not while a body from the peer is under way: the engine takes one frame of
                // a peer at a time, from its control part to its body.
                let l = &self.links[p];
                if !l.held.is_empty() && l.rx_lane.is_none_or(|lane| self.rx[lane].is_none()) {
                    n += self.replay(g, p);
                }
            }
        }
        for lane in bits(mask) {
            n += self.poll_lane(g, lane, BATCH);
            self.release_if_gone(lane);
        }
        if !self.armed_counts_empty() {
            n += self.apply_counts(g);
        }
        if self.splits.iter().any(|s| !s.spun) {
            self.spin_splits(g);
        }
        if self.ipc.busy() {
            n += self.poll_ipc(g.engine);
        }
        n
    }

    /// CUDA IPC copies are under way (a closing endpoint lets them finish).
    pub fn ipc_busy(&self) -> bool {
        self.ipc.busy()
    }

    /// Frees the lane of a dead peer once everything it wrote there was taken.
    fn release_if_gone(&mut self, lane: usize) {
        let Some(p) = self.lane_peer[lane] else {
            return;
        };
        let c = self.cons[lane];
        if self.links[p].dead
            && self.rx[lane].is_none()
            && self.stalled & (1 << lane) == 0
            && c.raw_at(&self.seg, lane, c.pos()).is_none()
        {
            self.drop_lane(lane);
            self.unmap_dead(p);
        }
    }

    /// Unmaps the segment of `p`, dead, once nothing it wrote is left to read: a peer that
    /// died (or closed) pins no memory here until our endpoint closes.
    fn unmap_dead(&mut self, p: PeerId) {
        let l = &mut self.links[p];
        if l.dead && l.rx_lane.is_none() {
            l.prod = None;
            l.seg = None;
            // Nor a descriptor: the pidfd its verification kept (CUDA IPC endpoints) closes
            // with the last copy of it (a descriptor pass under way may hold one a moment).
            if let Some(entry) = self
                .book
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(p)
            {
                entry.1 = None;
            }
        }
    }

    /// A registered region `addr..addr + len` closes (`Wire::cut_region`): the body now
    /// arriving in pieces from each of `sinks` is dropped from here on, and the answer to a
    /// read of its memory partly written to a peer keeps a copy of the rest.
    pub fn cut_region(&mut self, addr: usize, len: usize, sinks: &[PeerId]) {
        for &p in sinks {
            let Some(lane) = self.links.get(p).and_then(|l| l.rx_lane) else {
                continue;
            };
            if let Some(InFrame {
                to: To::Engine(sink @ Sink::Iov(_)),
                ..
            }) = &mut self.rx[lane]
            {
                *sink = Sink::Discard;
            }
        }
        // A frame partly written: begun, its body is copied (`rdm::cut_frame`).
        for l in &mut self.links {
            if let Some((t, _)) = &mut l.out {
                let _ = xfabric_core::rdm::cut_frame(t, true, addr, len);
            }
        }
    }

    /// Offers `p`'s held frames to the engine again, in order, until one must still wait.
    fn replay(&mut self, g: &mut Glue<'_>, p: PeerId) -> usize {
        let mut n = 0;
        while let Some(h) = self.links[p].held.front() {
            match g.on_ctrl(p, &Seg(&self.links[p].name), &h.prefix, &h.ctrl) {
                Ok(Sink::Wait) => {
                    self.links[p].held_stamp = Some(g.engine.wait_stamp(p));
                    break;
                }
                Ok(sink) => {
                    let h = self.links[p].held.pop_front().expect("front exists");
                    self.links[p].held_stamp = None;
                    self.held_frames -= 1;
                    let mut to = To::Engine(sink);
                    body_in(&mut to, 0, &h.body);
                    if let To::Engine(sink) = to {
                        g.on_body(p, sink);
                    }
                    n += 1;
                }
                Err(e) => {
                    let lane = self.links[p].rx_lane;
                    self.garbage(g, p, lane, &format!("held frame: {e}"));
                    break;
                }
            }
        }
        if self.links[p].held.is_empty() {
            // Lanes that waited on the queue may go on.
            if let Some(l) = self.links[p].rx_lane {
                self.stalled &= !(1 << l);
            }
        }
        n
    }

    /// Drops `p`'s lane in our segment: it sent garbage.
    #[cold]
    fn garbage(&mut self, g: &mut Glue<'_>, p: PeerId, lane: Option<usize>, why: &str) {
        tracing::warn!(
            peer = %self.links[p].name,
            "shm: dropping the lane of a peer that sent garbage ({why}); its operations fail"
        );
        if let Some(l) = lane {
            self.drop_lane(l);
        }
        let link = &mut self.links[p];
        self.held_frames -= link.held.len();
        link.held.clear();
        link.rx_lane = None;
        // Nor is the rest of a frame to it written: the engine fails its operation with the
        // peer, and its memory is the application's again.
        link.out = None;
        self.pumping.retain(|&q| q != p);
        self.maps.drop_peer(p);
        self.ipc.drop_peer(p);
        if let (Some(f), Some(pid)) = (self.fds.as_mut(), self.links[p].pid) {
            f.drop_pid(pid);
        }
        self.forget_acks(p);
        // Named, as `gone` names it: receives directed at it alone end too.
        g.on_lost(p, Some(&Seg(&self.links[p].name)), libc::EPROTO);
        // Its answers would come on the lane just dropped.
        self.end_splits(g.engine, Some(p), libc::EPROTO);
        // Lost before, its lane now dropped: nothing of it is left to read.
        self.unmap_dead(p);
    }

    fn drop_lane(&mut self, lane: usize) {
        if let Some(p) = self.lane_peer[lane].take() {
            if self.links[p].rx_lane == Some(lane) {
                self.links[p].rx_lane = None;
            }
        }
        self.rx[lane] = None;
        self.stalled &= !(1 << lane);
        self.connect_later &= !(1 << lane);
        if self.armed.unanswered > 0 {
            self.refresh_counts();
        }
        // A lap on, past whatever the lane still holds (a bad message never taken, frames
        // after it): its next claimer starts where no old message's sequence matches, so its
        // first message read is its own CONNECT, not the garbage its predecessor left.
        let mut c = self.cons[lane];
        c.advance_slots(&self.seg, lane, ring::SLOTS);
        self.cons[lane] = c;
        ring::release_lane(&self.seg, lane);
        self.known_active &= !(1 << lane);
    }

    /// Takes up to `batch` messages from `lane`; how many.
    fn poll_lane(&mut self, g: &mut Glue<'_>, lane: usize, batch: usize) -> usize {
        if self.connect_later & (1 << lane) != 0 {
            return 0;
        }
        let mut n = 0;
        while n < batch {
            if self.stalled & (1 << lane) != 0 && !self.retry_head(lane) {
                break;
            }
            let c = self.cons[lane];
            let Some(v) = c.raw_at(&self.seg, lane, c.pos()) else {
                break;
            };
            let slots = v.slots();
            let take = match (v.kind, self.lane_peer[lane]) {
                // The common case, kept short: a frame from the lane's peer.
                (FRAME, Some(p)) => {
                    let link = &self.links[p];
                    if let Some(prod) = link.prod.as_ref().filter(|q| q.wants_tail()) {
                        if let Some(seg) = &link.seg {
                            prod.prefetch_tail(seg);
                        }
                    }
                    // SAFETY: read before the consumer advances past the message.
                    let bytes = unsafe { v.bytes() };
                    match self.on_frame(g, lane, p, bytes) {
                        Ok(t) => t,
                        Err(why) => {
                            self.garbage(g, p, Some(lane), &why);
                            return n;
                        }
                    }
                }
                _ => match self.on_message(g, lane, &v) {
                    Ok(t) => t,
                    Err(taken) => return n + taken,
                },
            };
            if !take {
                // The head frame waits: the lane is not read further for now.
                self.stalled |= 1 << lane;
                break;
            }
            let mut c = self.cons[lane];
            c.advance_slots(&self.seg, lane, slots);
            self.cons[lane] = c;
            n += 1;
        }
        n
    }

    /// Every other message at a lane's head: pieces, pads, split copy messages, CONNECT,
    /// BYE, garbage. `Ok(take)` as for a frame; `Err(n)`: stop reading the lane (garbage
    /// dropped it, or its peer said goodbye), `n` messages consumed.
    #[inline(never)]
    fn on_message(
        &mut self,
        g: &mut Glue<'_>,
        lane: usize,
        v: &ring::RawView,
    ) -> std::result::Result<bool, usize> {
        Ok(match v.kind {
            kind::PAD => true,
            RELEASE => match self.lane_peer[lane] {
                // SAFETY: read before the consumer advances past the message.
                Some(p) => match self.on_release(g, lane, p, unsafe { v.bytes() }) {
                    Ok(t) => t,
                    Err(why) => {
                        self.garbage(g, p, Some(lane), &why);
                        return Err(0);
                    }
                },
                None => {
                    self.lane_garbage(g, lane, "a release before CONNECT");
                    return Err(0);
                }
            },
            FRAME | PIECE => {
                let Some(p) = self.lane_peer[lane] else {
                    self.lane_garbage(g, lane, "a frame before CONNECT");
                    return Err(0);
                };
                // SAFETY: read before the consumer advances past the message.
                let bytes = unsafe { v.bytes() };
                let r = if v.kind == FRAME {
                    self.on_frame(g, lane, p, bytes)
                } else {
                    self.on_piece(g, lane, p, bytes).map(|()| true)
                };
                match r {
                    Ok(t) => t,
                    Err(why) => {
                        self.garbage(g, p, Some(lane), &why);
                        return Err(0);
                    }
                }
            }
            SPLIT | SPLIT_DONE => {
                let Some(p) = self.lane_peer[lane] else {
                    self.lane_garbage(g, lane, "a split copy message before CONNECT");
                    return Err(0);
                };
                if v.kind == SPLIT {
                    self.serve_split(g.engine, p, v);
                } else {
                    // SAFETY: read before the consumer advances past the message.
                    self.split_done(g.engine, p, unsafe { v.bytes() });
                }
                true
            }
            kind::CONNECT => {
                let (h, pl, cap) = v.header();
                let len = (h.len as usize).min(cap);
                // SAFETY: the message's slots, before the consumer advances.
                let name = unsafe { std::slice::from_raw_parts(pl, len) };
                let name = String::from_utf8_lossy(name).into_owned();
                match self.on_connect(g, lane, &name) {
                    Connect::Taken => true,
                    Connect::Dropped => return Err(0),
                    Connect::Later => {
                        self.connect_later |= 1 << lane;
                        false
                    }
                }
            }
            kind::BYE => {
                let mut c = self.cons[lane];
                c.advance_slots(&self.seg, lane, v.slots());
                self.cons[lane] = c;
                let p = self.lane_peer[lane];
                if let Some(p) = p {
                    self.last_count(g, p, lane);
                }
                self.drop_lane(lane);
                if let Some(p) = p {
                    // Its endpoint closed: nothing more comes from it, nothing goes to it.
                    self.gone(g, p, libc::ECONNRESET);
                }
                return Err(1);
            }
            k => {
                self.lane_garbage(g, lane, &format!("a message of kind {k}"));
                return Err(0);
            }
        })
    }

    #[cold]
    fn lane_garbage(&mut self, g: &mut Glue<'_>, lane: usize, why: &str) {
        match self.lane_peer[lane] {
            Some(p) => self.garbage(g, p, Some(lane), why),
            None => {
                tracing::warn!("shm: dropping a lane that sent garbage ({why})");
                self.drop_lane(lane);
            }
        }
    }

    /// A stalled lane's head may be looked at again (false while frames before it wait).
    fn retry_head(&mut self, lane: usize) -> bool {
        if let Some(p) = self.lane_peer[lane] {
            if !self.links[p].held.is_empty() {
                return false;
            }
        }
        self.stalled &= !(1 << lane);
        true
    }

    /// A CONNECT on `lane` naming segment `name`: the lane is that peer's from now on
    /// (`Taken`); or the lane was dropped instead (a second CONNECT on a lane already named);
    /// or the peer's segment cannot be mapped now, and the CONNECT waits (`Later`).
    fn on_connect(&mut self, g: &mut Glue<'_>, lane: usize, name: &str) -> Connect {
        // Only names of xfabric segments: a peer must not make us open arbitrary paths.
        let valid = super::addr::seg_name(format!("{ADDR_PREFIX}{name}").as_bytes())
            .is_ok_and(|n| n == name);
        if !valid {
            return Connect::Taken;
        }
        // A lane names its peer once: renamed, a frame half read from one peer would be
        // finished by another.
        if self.lane_peer[lane].is_some() {
            self.lane_garbage(g, lane, "a second CONNECT on a lane already named");
            return Connect::Dropped;
        }
        // One peer writes us on one lane. A second lane naming it would interleave its frames
        // with the first's (a body half arrived on one lane finished by the other's, into a
        // receive that already completed): the first lane goes, with the peer's operations,
        // as for a peer lost, and the peer starts afresh on this one (as a peer that lost us
        // and came back does).
        if let Some(&p) = self.by_name.get(name) {
            if let Some(old) = self.links[p].rx_lane.filter(|&l| l != lane) {
                self.garbage(
                    g,
                    p,
                    Some(old),
                    "a second lane claimed for a peer that has one",
                );
            }
        }
        let p = match self.peer_by_name(name) {
            Ok(p) => {
                self.links[p].dead = false;
                p
            }
            // Short of descriptors, memory or mapping slots now is no sign it is gone: the
            // CONNECT stays at the lane's head, and the lane is read again after the next
            // sweep (its frames wait in it meanwhile, the peer held back by its ring).
            Err(Error::Again(_)) => return Connect::Later,
            Err(_) => match self.by_name.get(name) {
                Some(&p) => p,
                // At most one gone peer per lane is remembered: CONNECTs naming no segment
                // cannot grow the table.
                None if self.links.iter().filter(|l| l.never_mapped).count() < LANES => {
                    self.add_link(name, None, None)
                }
                None => return Connect::Taken,
            },
        };
        self.links[p].rx_lane = Some(lane);
        self.lane_peer[lane] = Some(p);
        // The lane we read it on, and the armed slots of its segment we read its released
        // sends from, mapped in now rather than by a fault every 4 KiB on their first lap.
        let (off, len) = ring::lane_span(lane);
        self.seg.populate(off, len, false);
        if let Some(seg) = self.links[p].seg.as_ref() {
            let (off, len) = ring::armed_span();
            seg.populate(off, len, false);
        }
        // Its count of our released sends, zeroed before this CONNECT (`armed`).
        self.count_seen[lane] = 0;
        self.count_pending[lane] = None;
        if self.armed.unanswered > 0 {
            self.refresh_counts();
        }
        Connect::Taken
    }

    /// A FRAME message: true when taken (its body under way or done), false when it stays at
    /// the head of the lane; `Err`: garbage.
    fn on_frame(
        &mut self,
        g: &mut Glue<'_>,
        lane: usize,
        p: PeerId,
        bytes: &[u8],
    ) -> std::result::Result<bool, String> {
        if self.rx[lane].is_some() {
            return Err("a frame inside another's body".into());
        }
        let pre = wire::prefix(bytes).map_err(|e| e.to_string())?;
        let cl = pre.ctrl_len as usize;
        let len = usize::try_from(pre.body_len).map_err(|_| "body length")?;
        let first = len.min(PIECE_LEN);
        let end = PREFIX + cl + first;
        let (Some(ctrl), Some(piece)) =
            (bytes.get(PREFIX..PREFIX + cl), bytes.get(PREFIX + cl..end))
        else {
            return Err(format!(
                "a frame of {end} bytes in {} slot bytes",
                bytes.len()
            ));
        };
        let link = &self.links[p];
        let behind =
            !link.held.is_empty() && !Kind::from_raw(pre.kind).is_some_and(Kind::is_answer);
        let sink = if behind {
            // Behind frames that wait: in order, without asking the engine yet.
            Sink::Wait
        } else if first == len {
            if self.armed.unanswered > 0 {
                self.frame_answered(p, &pre, ctrl);
            }
            // The whole frame is in the slots (every small one): handed over in one call.
            if g.on_frame(p, &Seg(&self.links[p].name), &pre, ctrl, piece)
                .map_err(|e| e.to_string())?
            {
                return Ok(true);
            }
            Sink::Wait
        } else {
            g.on_ctrl(p, &Seg(&self.links[p].name), &pre, ctrl)
                .map_err(|e| e.to_string())?
        };
        let to = match sink {
            Sink::Wait => {
                if self.links[p].held.len() >= HELD_MAX || len > HELD_BODY_MAX {
                    return Ok(false);
                }
                let pool = &self.links[p].held_bytes;
                let Some(charge) = Charge::take(pool, cl + len, self.held_max) else {
                    return Ok(false);
                };
                let mut body = vec![0; len];
                copy_slice(&mut body[..first], piece);
                To::Hold(Held {
                    prefix: pre,
                    ctrl: ctrl.to_vec(),
                    body,
                    _charge: charge,
                })
            }
            mut sink => {
                sink_in(&mut sink, 0, piece);
                To::Engine(sink)
            }
        };
        self.arrived(g, lane, p, to, first, len);
        Ok(true)
    }

    /// A PIECE message for the lane's current frame.
    fn on_piece(
        &mut self,
        g: &mut Glue<'_>,
        lane: usize,
        p: PeerId,
        bytes: &[u8],
    ) -> std::result::Result<(), String> {
        let Some(mut f) = self.rx[lane].take() else {
            return Err("a piece with no frame".into());
        };
        let n = (f.len - f.off).min(PIECE_LEN);
        let Some(b) = bytes.get(..n) else {
            return Err(format!(
                "a piece of {n} bytes in {} slot bytes",
                bytes.len()
            ));
        };
        body_in(&mut f.to, f.off, b);
        self.arrived(g, lane, p, f.to, f.off + n, f.len);
        Ok(())
    }

    /// `off` of a frame's `len` body bytes went to `to`: finished, or more pieces to come.
    fn arrived(
        &mut self,
        g: &mut Glue<'_>,
        lane: usize,
        p: PeerId,
        to: To,
        off: usize,
        len: usize,
    ) {
        if off < len {
            self.rx[lane] = Some(InFrame { to, off, len });
            return;
        }
        match to {
            To::Engine(sink) => g.on_body(p, sink),
            To::Hold(h) => {
                let l = &mut self.links[p];
                if l.held.is_empty() {
                    // A new first frame: the engine's answer to it is not known yet.
                    l.held_stamp = None;
                }
                l.held.push_back(h);
                self.held_frames += 1;
            }
        }
    }

    /// Whether a look for dead peers is due.
    pub fn sweep_due(&self) -> bool {
        crate::clock::coarse_ms() >= self.idle.next_sweep.load(Ordering::Relaxed)
    }

    /// Whether a progress call that took in `n` messages looks at the clock for a sweep: one
    /// that took some leaves it to the next look (the next call's, whatever it finds, or an
    /// idle poll's), so the clock is not read between a message's arrival and its completion,
    /// and of two calls one at least still looks, however often (or seldom) the application
    /// polls.
    pub fn sweep_look(&mut self, n: usize) -> bool {
        let owed = self.idle.clock_owed.load(Ordering::Relaxed);
        if n > 0 && !owed {
            self.idle.clock_owed.store(true, Ordering::Relaxed);
            return false;
        }
        if owed {
            self.idle.clock_owed.store(false, Ordering::Relaxed);
        }
        self.sweep_due()
    }

    /// Looks for peers that died: what they wrote before is taken in, then the engine loses
    /// them (their operations fail with `FI_ECONNRESET`).
    pub fn sweep(&mut self, g: &mut Glue<'_>) {
        // A failed clock read (u64::MAX) leaves the next sweep due at once, not never.
        let now = crate::clock::coarse_ms();
        let next = if now == u64::MAX {
            0
        } else {
            now.saturating_add(SWEEP_EVERY_MS)
        };
        self.idle.next_sweep.store(next, Ordering::Relaxed);
        if self.seg.faulted() && !self.own_fault_said {
            // Another process of this user truncated our own segment: the guard kept us
            // alive, but nothing a peer writes reaches us any more.
            self.own_fault_said = true;
            tracing::error!(
                segment = %self.name,
                "shm: this endpoint's own segment was truncated by another process; it receives nothing more (close it and open another)"
            );
        }
        self.drain_fds();
        self.release_nameless(now);
        // Lanes whose CONNECT waits for the peer's segment to map are read again.
        self.connect_later = 0;
        for p in 0..self.links.len() {
            let l = &mut self.links[p];
            // A peer whose segment could not be opened when it connected (gone already, say)
            // is lost too: nothing can answer it, and what waits on it must end.
            if l.dead || owner_alive(l, now) {
                continue;
            }
            let why = if l.seg.is_some() {
                "its segment's lock is free"
            } else {
                "its segment is gone"
            };
            self.lose(g, p, why);
        }
    }

    /// Whether a message waits at the head of `lane` (a CONNECT just written, say).
    fn head_published(&self, lane: usize) -> bool {
        let c = self.cons[lane];
        c.raw_at(&self.seg, lane, c.pos()).is_some()
    }

    /// Releases the lanes claimed for `NAMELESS_LANE_MS` with no CONNECT taken from them
    /// (`now`: the coarse clock; u64::MAX when it could not be read, and nothing is released).
    fn release_nameless(&mut self, now: u64) {
        if now == u64::MAX {
            return;
        }
        for lane in 0..LANES {
            let nameless = self.known_active & (1 << lane) != 0 && self.lane_peer[lane].is_none();
            if !nameless {
                self.nameless_since[lane] = 0;
            } else if self.nameless_since[lane] == 0 {
                self.nameless_since[lane] = now.max(1);
            } else if now.saturating_sub(self.nameless_since[lane]) >= NAMELESS_LANE_MS
                && !self.head_published(lane)
            {
                tracing::warn!(lane, "shm: releasing a lane claimed without a CONNECT");
                self.nameless_since[lane] = 0;
                self.drop_lane(lane);
            }
        }
    }

    /// Looks whether `p` died, at most once a millisecond (a sender finding its ring full);
    /// true when it did (and is now lost).
    pub fn check(&mut self, g: &mut Glue<'_>, p: PeerId) -> bool {
        let l = &mut self.links[p];
        if l.dead {
            return true;
        }
        let now = std::time::Instant::now();
        if l.checked
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_millis(1))
        {
            return false;
        }
        l.checked = Some(now);
        if owner_alive(l, crate::clock::coarse_ms()) {
            return false;
        }
        self.lose(g, p, "its segment's lock is free or gone");
        true
    }

    /// Peer `p` is gone (or broke its ring): what it wrote before is taken in, then the
    /// engine loses it (its operations fail with `FI_ECONNRESET`).
    pub fn lose(&mut self, g: &mut Glue<'_>, p: PeerId, why: &str) {
        let l = &self.links[p];
        if l.dead {
            return;
        }
        tracing::warn!(
            peer = %l.name,
            "shm: peer is gone ({why}); its operations fail with FI_ECONNRESET"
        );
        // Answers it wrote before it died come first: an operation it did complete
        // completes here too. At most what the lane holds: a peer still writing as it goes
        // must not keep this call reading.
        if let Some(lane) = l.rx_lane {
            self.poll_lane(g, lane, ring::SLOTS);
            if self.links[p].rx_lane == Some(lane) {
                self.last_count(g, p, lane);
            }
        }
        self.gone(g, p, FI_ECONNRESET);
    }

    /// Peer `p` will neither send nor take anything more: the engine loses it.
    fn gone(&mut self, g: &mut Glue<'_>, p: PeerId, err: i32) {
        let link = &mut self.links[p];
        if link.dead {
            // Lost before (a sweep, while its lane was stalled): its goodbye, read now, drops
            // the last lane from it, and nothing of it is left to read.
            self.unmap_dead(p);
            return;
        }
        link.dead = true;
        link.out = None;
        self.pumping.retain(|&q| q != p);
        self.maps.drop_peer(p);
        self.ipc.drop_peer(p);
        if let (Some(f), Some(pid)) = (self.fds.as_mut(), self.links[p].pid) {
            f.drop_pid(pid);
        }
        self.forget_acks(p);
        g.on_lost(p, Some(&Seg(&self.links[p].name)), err);
        // A frame of it half arrived goes with it: the engine failed the receive its body was
        // going to, and a piece written after must find no memory to land in.
        if let Some(lane) = self.links[p].rx_lane {
            self.rx[lane] = None;
        }
        self.end_splits(g.engine, Some(p), err);
        // With no lane from it, nothing of it is left to read (one still being read is
        // unmapped once drained: `release_if_gone`).
        self.unmap_dead(p);
    }

    /// Whether the mirrors `publish` last refreshed are still current after a send written
    /// in place, once `push` has run (`Wire::published_current`). Such a send takes nothing
    /// in, holds nothing and keeps no request: what it may change that the mirrors show is a
    /// new link (a peer first named, which `watch` counts when receives are directed), and
    /// whatever the push hands over (partly written frames, queued frames and copies, tokens
    /// of frames sent). With none of those, the push only rings doorbells.
    pub fn published_current(&self, eng: &Engine) -> bool {
        self.pumping.is_empty()
            && !eng.has_output()
            && self.sent.is_empty()
            && self.links.len() == self.links_published.get()
    }

    /// Refreshes the lock-free mirrors (at the end of each locked call). True when held
    /// frames that waited may move now, or a quiet lane has messages to read again: a thread
    /// asleep on the bell is to be woken for them (whatever else made the endpoint busy
    /// before may wake no one).
    pub fn publish(&self, eng: &Engine) -> bool {
        self.links_published.set(self.links.len());
        for l in bits(self.known_active) {
            self.idle.pos[l].store(self.cons[l].pos(), Ordering::Relaxed);
        }
        self.idle
            .known_active
            .store(self.known_active, Ordering::Relaxed);
        let held = || self.held() > 0;
        // Held frames make work only while offering them again may change something: not
        // while they wait on receives the application has not posted (a blocking read would
        // spin until it did). A post runs progress itself (`RdmEndpoint::recv`).
        let (held_moved, quiet) = if held() {
            self.held_state(eng)
        } else {
            (false, 0)
        };
        // A lane stalled behind held frames that cannot move has nothing to read either, nor
        // one whose CONNECT waits for the next sweep. One that stops being quiet is work a
        // sleeper is woken for.
        let quiet = quiet | self.connect_later;
        self.idle
            .connect_waits
            .store(self.connect_later != 0, Ordering::Relaxed);
        let was_quiet = self.idle.quiet_lanes.load(Ordering::Relaxed);
        self.idle.quiet_lanes.store(quiet, Ordering::Relaxed);
        // A split just started: the next progress call spins for its answer.
        let busy = !self.pumping.is_empty()
            || eng.has_output()
            || held_moved
            || self.splits.iter().any(|s| !s.spun)
            || self.ipc.busy();
        self.idle.busy.store(busy, Ordering::Release);
        let watch = busy
            || !self.splits.is_empty()
            || self.known_active != 0
            || self.connect_later != 0
            || eng.busy()
            || held()
            || (self.directed && self.links.iter().any(|l| !l.dead));
        self.idle.watch.store(watch, Ordering::Relaxed);
        held_moved || was_quiet & !quiet != 0
    }

    /// Whether some peer's held frames may be taken if offered again (none offered since
    /// they were held, or the engine's state they wait on moved since the last offer), and
    /// the stalled lanes of the peers whose held frames may not: nothing on those can be read
    /// until they move.
    fn held_state(&self, eng: &Engine) -> (bool, u64) {
        let (mut moved, mut quiet) = (false, 0);
        for (p, l) in self.links.iter().enumerate() {
            if l.held.is_empty() {
                continue;
            }
            if l.held_stamp != Some(eng.wait_stamp(p)) {
                moved = true;
            } else if let Some(lane) = l.rx_lane.filter(|&lane| self.stalled & (1 << lane) != 0) {
                quiet |= 1 << lane;
            }
        }
        (moved, quiet)
    }

    /// Lock-free: whether a progress call may find something to do.
    pub fn has_work(seg: &Segment, idle: &Idle) -> bool {
        if idle.busy.load(Ordering::Acquire) {
            return true;
        }
        let mask = ring::active(seg).load(Ordering::Acquire);
        if mask != idle.known_active.load(Ordering::Relaxed) {
            return true;
        }
        let quiet = idle.quiet_lanes.load(Ordering::Relaxed);
        bits(mask & !quiet).any(|l| ring::published(seg, l, idle.pos[l].load(Ordering::Relaxed)))
            || armed::counted(seg, idle)
    }

    /// Whether frames are still being written out.
    pub fn writing(&self) -> bool {
        !self.pumping.is_empty()
    }

    /// Says goodbye on every lane we hold in a peer's segment. A frame still being written
    /// whose body is application memory (handed back at close) is abandoned: the peer drops
    /// it with the lane when it reads the goodbye.
    pub fn bye(&mut self) {
        self.pumping.clear();
        for l in &mut self.links {
            if l.out
                .as_ref()
                .is_some_and(|(t, _)| !matches!(t.body, Body::Iov(_)))
            {
                // Bytes of its own: they may still go out, but not after a goodbye.
                continue;
            }
            l.out = None;
            if l.dead {
                continue;
            }
            if let (Some(prod), Some(seg)) = (l.prod.as_mut(), l.seg.as_ref()) {
                let h = Header {
                    kind: kind::BYE,
                    ..Default::default()
                };
                // Best effort: if the ring is full the peer notices our segment's lock go.
                if prod.write(seg, &h, 0, |_| {}) {
                    Self::wake(seg);
                }
            }
        }
    }
}

/// Milliseconds between looks at whether a verified peer's lock is still its own process's
/// (a read of its `fdinfo`, some microseconds): a dead owner whose lock passed to another
/// holder is lost within this.
const LOCK_OWNER_EVERY_MS: u64 = 1000;

/// Whether `l`'s owner is alive at coarse time `now`: its segment's lock is held and its file
/// backs the mapping, and, where its pid was verified, the lock was its process's own when
/// last looked at, within `LOCK_OWNER_EVERY_MS` (`ring::still_owned_by`).
fn owner_alive(l: &mut Link, now: u64) -> bool {
    let Some(seg) = l.seg.as_ref() else {
        return false;
    };
    if !seg.owner_alive() {
        return false;
    }
    let Some(pid) = l.pid else {
        return true;
    };
    if now.saturating_sub(l.lock_seen) < LOCK_OWNER_EVERY_MS {
        return true;
    }
    if !ring::still_owned_by(seg, pid, l.owner_fd) {
        return false;
    }
    // (A clock that could not be read, u64::MAX, would stop the looks for good.)
    if now != u64::MAX {
        l.lock_seen = now;
    }
    true
}

/// Whether mapping a peer's segment failed for a reason that passes (descriptors, memory or
/// mapping slots short), not because the segment is gone or is none of ours.
fn passing(e: &Error) -> bool {
    matches!(e, Error::Again(_)) || matches!(e.errno(), libc::EMFILE | libc::ENFILE | libc::ENOMEM)
}

/// Whether an encoded frame (`ctrl`, from its prefix) answers a peer's request.
fn is_answer(ctrl: &[u8]) -> bool {
    kind_of(ctrl).is_some_and(Kind::is_answer)
}

/// The kind of an encoded frame (`ctrl`, from its prefix), if it names one.
fn kind_of(ctrl: &[u8]) -> Option<Kind> {
    ctrl.get(2).and_then(|&k| Kind::from_raw(k))
}

/// Slots a frame leaves free in the peer's ring: none for an answer, `CTRL_SPARE` otherwise.
fn spare_for(ctrl: &[u8]) -> usize {
    if is_answer(ctrl) {
        0
    } else {
        CTRL_SPARE
    }
}

impl Transport for Net {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        let p = t.peer;
        if self.links.get(p).is_none_or(|l| l.dead) {
            // Its operations failed with its loss; nothing more goes to it. What still comes
            // is an answer to a request it made before (a read among its held frames): dropped,
            // and its token reported as the frame's end, or the engine would count the answer
            // as carrying the memory read for good (and hold that peer's later writes). A
            // request's token is not: no post reaches a peer known gone (`Wire::alive`), and
            // reporting it would complete an operation that never went.
            if let (Some(tok), true) = (t.token, is_answer(t.ctrl.as_bytes())) {
                self.sent.push((p, tok));
            }
            // A go-ahead for a large message of its that was held until after its loss: the
            // data will not come, and the receive that took it must end (`push_some` reports
            // the loss again, which ends the peer's large messages).
            if kind_of(t.ctrl.as_bytes()) == Some(Kind::Cts) && !self.relost.contains(&p) {
                self.relost.push(p);
            }
            return Ok(());
        }
        // The oldest released send taken from it, answered: by the count (`armed`).
        if t.body.is_empty() && self.count_answer(p, t.ctrl.as_bytes()) {
            return Ok(());
        }
        let link = &self.links[p];
        if link.out.is_some() {
            return Err(t);
        }
        if link.prod.is_none() && self.ensure_lane(p).is_err() {
            return Err(t);
        }
        let link = &mut self.links[p];
        let (Some(prod), Some(seg)) = (link.prod.as_mut(), link.seg.as_ref()) else {
            return Err(t);
        };
        let ctrl = t.ctrl.as_bytes();
        let cl = ctrl.len();
        let total = t.body.len();
        let first = total.min(PIECE_LEN);
        let ok = prod.write_raw(seg, FRAME, 0, cl + first, spare_for(ctrl), |b| {
            b[..cl].copy_from_slice(ctrl);
            body_out(&t.body, 0, &mut b[cl..]);
        });
        if !ok {
            return Err(t);
        }
        link.wrote = true;
        self.wrote = true;
        if first < total {
            link.out = Some((t, first));
            self.pumping.push(p);
            self.pump();
        } else {
            if total == 0 {
                self.answered_by_frame(p, t.ctrl.as_bytes());
            }
            if let Some(tok) = t.token {
                self.sent.push((p, tok));
            }
        }
        Ok(())
    }

    fn send_in_place(&mut self, p: PeerId, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let Some(link) = self.links.get_mut(p) else {
            return false;
        };
        let (Some(prod), Some(seg)) = (link.prod.as_mut(), link.seg.as_ref()) else {
            return false;
        };
        if link.dead || link.out.is_some() || len > PIECE_LEN {
            return false;
        }
        // Only requests come this way (small messages): they leave the answers' room.
        if !prod.write_raw(seg, FRAME, 0, len, CTRL_SPARE, fill) {
            return false;
        }
        link.wrote = true;
        self.wrote = true;
        true
    }
}

/// shm's one-sided copies for the engine: large messages and RMA by cross-memory attach, and
/// messages from shared host allocations from a mapping of them (`mapped`).
pub struct ShmOneSided {
    pub cma: Arc<CmaState>,
    /// `XFABRIC_SHM_CMA_MIN`.
    pub pull_min: usize,
    /// `XFABRIC_SHM_MAP_MIN`.
    pub map_min: usize,
    /// Finds the shared allocation holding a buffer.
    pub sys: xfabric_hmem::System,
    /// CUDA device memory is described by IPC handles (an `FI_HMEM` endpoint where CUDA is
    /// available: `ipc`).
    pub cuda_ipc: bool,
    /// The endpoint's peers, for passing VMM allocations' descriptors to them (`ipc`).
    pub book: ipc::PeerBook,
    /// The VMM allocations whose descriptors went to each peer already (`ipc`).
    pub passed: ipc::Passed,
}

impl ShmOneSided {
    /// The copies of an endpoint whose cross-memory attach is `cma`, with the thresholds the
    /// settings say.
    pub fn new(cma: Arc<CmaState>) -> Self {
        ShmOneSided {
            cma,
            pull_min: xfabric_core::settings::SHM_CMA_MIN.usize(),
            map_min: xfabric_core::settings::SHM_MAP_MIN.usize(),
            sys: xfabric_hmem::System::new(),
            cuda_ipc: false,
            book: ipc::PeerBook::default(),
            passed: ipc::Passed::default(),
        }
    }
}

impl OneSided for ShmOneSided {
    fn pull_min(&self) -> usize {
        self.pull_min
    }

    fn describe(&self, peer: PeerId, iov: &IovList, dir: Dir) -> Option<Desc> {
        if self.cuda_ipc {
            let who = || {
                let book = self.book.lock().unwrap_or_else(|e| e.into_inner());
                book.get(peer).cloned()
            };
            if let Some(d) = ipc::describe(iov, peer, &self.passed, who) {
                // Device memory: by IPC, or staged (never a cross-memory attach descriptor,
                // which cannot read it).
                return d;
            }
        }
        if !self.cma.usable() {
            return None;
        }
        // Cross-memory attach reaches either way; a mapping of ours, only to be read.
        let mapped = (dir == Dir::Read)
            .then(|| mapped::describe(&self.sys, iov))
            .flatten();
        mapped.or_else(|| Some(Desc::of_iov(iov)))
    }

    fn offer_declined(&self, peer: PeerId, iov: &IovList) {
        if let [s] = iov.segs() {
            self.passed.forget(peer, s.addr as u64);
        }
    }

    fn offer_min(&self, iov: &IovList) -> Option<usize> {
        // Only where this endpoint reached a peer by cross-memory attach: the receiver maps
        // only for a peer whose pid it verified that way, and otherwise gets the message
        // through frames after a round trip an eager message does not pay.
        if iov.total() < self.map_min || !self.cma.known_working() {
            return None;
        }
        let [s] = iov.segs() else {
            return None;
        };
        self.sys
            .exportable(s.addr as *const u8, s.len)
            .then_some(self.map_min)
    }
}
