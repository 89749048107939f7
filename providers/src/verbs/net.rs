//! The verbs transport under the engine: one RC queue pair per connection, set up through a
//! side channel (a TCP connection between the endpoints' listening addresses carries each
//! side's QP number, PSN and GID, and stays open so that a peer's death shows at once), and
//! the engine's frames carried as a byte stream cut into chunks of registered buffers sent
//! with `IBV_WR_SEND`.
//!
//! Flow control: each connection posts `RQ` receive buffers; a sender holds one credit per
//! buffer the receiver has posted for it (`RQ - RESERVE` for data chunks, `RESERVE` for
//! credit-only chunks), and every chunk's header returns the credits its sender freed since
//! the last. A receiver therefore never runs out of posted buffers: RNR is not a path this
//! relies on (the QP's RNR retry is kept small so that a bug would show as an error).
//!
//! Credit-only chunks spend reserve credits, which come back in the peer's chunks. A peer
//! may send none of its own (all it sends may be the NIC's writes, each taking one of our
//! data buffers), so it returns reserve credits in a credit-only chunk of its own once
//! `RESERVE_RETURN_AT` pile up; it keeps its last reserve credit for that (data credits go
//! back only while two are left), so that two peers returning to each other at once cannot
//! both end at zero, each owing the other all of its reserve. Each such return answers at
//! least `RESERVE_RETURN_AT` (2) chunks with one, so returns of returns die out.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};
use xfabric_core::rdm::wire::{self, Prefix, PREFIX};
use xfabric_core::rdm::{Body, CopyReq, Native, PeerId, Sink, Transmit};
use xfabric_core::{EpCore, Error, Result};

use super::ib::{Cq, Mr, Nic, Qp, QpInfo};
use super::sys;
use crate::rdm::{Handler, PeerName};

pub mod claim;
pub mod native;
pub mod pieces;
pub mod pull;
use claim::{Claims, Hello, HELLO, HELLO_EVENTS};
use native::{Inflight, Shared, NATIVE_MAX};
use pieces::{Owner, Transfer};

/// Bytes of every chunk buffer (header included).
pub const CHUNK: usize = 16 * 1024;
/// Chunk header: data credits returned (u16), reserve credits returned (u16), kind (u8), 3
/// bytes zero.
const HDR: usize = 8;
/// Receive buffers each connection posts.
const RQ: u32 = 64;
/// Completions one progress round takes at most (the rest the next).
const COMPLETIONS_MAX: usize = 4 * RQ as usize;
/// Of those, how many only credit-only chunks may use.
const RESERVE: u32 = 4;
/// Send buffers per connection.
const SQ: usize = 64;
/// Data credits pending return that make a credit-only chunk worth sending.
const RETURN_AT: u32 = (RQ - RESERVE) / 2;
/// Reserve credits pending return that make a credit-only chunk worth sending (more than
/// one, so that two peers cannot keep returning one credit to each other forever).
const RESERVE_RETURN_AT: u32 = RESERVE / 2;
/// CQ entries per endpoint (rxe's most; hardware allows more).
pub const CQ_DEPTH: i32 = 32767;

const KIND_DATA: u8 = 0;
const KIND_CREDIT: u8 = 1;

/// The connector's last word once its QP is ready to receive.
const READY: u8 = 0x52;
/// Most connections one endpoint holds. A connection can have `RQ` receives, `SQ` signaled
/// sends and `NATIVE_MAX` one-sided operations completing at once, and they must all fit in
/// the one CQ (an overflow would break every QP on it); this also keeps strangers from making
/// an endpoint register memory without bound (each connection costs `(RQ + SQ) * CHUNK`
/// bytes registered, 2 MiB, and a QP).
const MAX_LINKS: usize = CQ_DEPTH as usize / (RQ as usize + SQ + NATIVE_MAX);
/// `Link::held`'s slot for a peer's write with immediate data: (IMM, immediate, length).
const IMM: usize = usize::MAX;
/// How long a connection may take to finish its hellos (and an accepted one, the proof of
/// its claim) before it is dropped.
const HELLO_TIME: Duration = Duration::from_secs(10);

/// Connection state.
enum State {
    /// Our side channel's TCP connect is in progress (non-blocking: posting never waits on
    /// an unreachable peer); the hello goes once it is connected.
    Dialing,
    /// We connected and sent our hello; the peer's hello is awaited.
    Connecting,
    /// We accepted, its claim proven (`claim`), and answered the hello; the connector's READY is awaited before sending.
    Answered,
    Up,
}

/// A stream of frames being read out of chunks.
enum Rx {
    /// Collecting a prefix and control part.
    Head(Vec<u8>),
    /// The engine answered `sink` for a body of `p.body_len`, `got` bytes of it in.
    Body {
        p: Prefix,
        sink: Sink,
        got: u64,
        keep: u64,
    },
}

/// What waits to go to a peer, in order.
// Frames are the common case and are not boxed (an allocation per frame), as in `Transmit`.
#[allow(clippy::large_enum_variant)]
enum Out {
    /// A transmit being cut into chunks.
    Frame {
        t: Transmit,
        /// Bytes of ctrl and body already copied.
        pos: usize,
    },
    /// A one-sided operation for the NIC.
    Native(Native),
    /// A copy of the peer's memory (or into it) the engine asked for.
    Copy(CopyReq),
}

/// One RC connection (a peer has one it sends on, and may receive on another too).
struct Link {
    peer: PeerId,
    state: State,
    /// The peer connected to us (we answered its hello): a peer has one such at a time.
    accepted: bool,
    stream: TcpStream,
    /// Side-channel bytes read so far.
    hello: Vec<u8>,
    /// Our hello's nonce on this connection (a connector's: the acceptor's call-back asks
    /// for it, `Net::vouch`).
    nonce: u64,
    // Drop order: the QP, then the registration, then the memory.
    qp: Qp,
    mr: Mr,
    /// Receive buffers, then send buffers, in one registered block.
    buf: Vec<u8>,
    psn: u32,
    free_tx: Vec<usize>,
    credits: u32,
    reserve: u32,
    /// Credits freed here, to return to the peer.
    owe: u32,
    owe_reserve: u32,
    /// Received chunks not yet consumed (slot, start offset, end offset), oldest first; a
    /// peer's write with immediate data among them as (`IMM`, immediate, length).
    held: VecDeque<(usize, usize, usize)>,
    rx: Rx,
    /// Sends posted and not completed.
    inflight: usize,
    /// One-sided operations posted and not completed, by number.
    natives: HashMap<u32, Inflight>,
    next_native: u32,
    /// Of those, reads and atomics: what is posted after them waits for them
    /// (`IBV_SEND_FENCE`), so that nothing later changes memory they have yet to read. At
    /// most `pieces::READ_DEPTH`.
    reads_out: usize,
    /// Of those, atomics: a read posted after them waits for them.
    atomics_out: usize,
    /// Bytes the outstanding reads move (`pieces::READ_WINDOW`).
    read_bytes: u64,
    /// A transfer whose pieces are not all posted yet: nothing else goes before them.
    posting: Option<Owner>,
    /// When the connection started (for `HELLO_TIME`).
    born: std::time::Instant,
    /// When its side channel was seen closed while one-sided operations were outstanding.
    closing: Option<std::time::Instant>,
}

/// The peers: an address and, once there is one, the connection it sends on.
struct Peer {
    addr: SocketAddr,
    tx: Option<usize>,
    out: VecDeque<Out>,
    queued: usize,
    /// Losses of this peer not yet reported (`lose_peer`, then `flush`): until the engine
    /// hears of them, frames to it are refused (`Transport::send`), so that none can leave on
    /// a later connection after the engine failed its operation.
    losing: u32,
}

/// Every connection of one endpoint.
pub struct Net {
    nic: Arc<Nic>,
    listener: TcpListener,
    name: SocketAddr,
    /// Accepted side channels until their claims are proven.
    claims: Claims,
    // Drop order: links (QPs, MRs) before the CQ. Numbers are never reused, so that a
    // completion of a connection gone cannot be taken for one of its successor.
    links: HashMap<usize, Link>,
    next_link: usize,
    peers: Vec<Peer>,
    cq: Cq,
    wc: Vec<sys::ibv_wc>,
    /// Connections lost this round, with their errno, reported at the end of progress.
    lost: Vec<(PeerId, i32)>,
    /// `super::stats::faults()` last acted on.
    faults: u64,
    /// The last round stopped at `COMPLETIONS_MAX` with completions left in the CQ: busy
    /// (a sleep on the CQ's event would not see them; it fires for new ones only).
    cq_more: bool,
    /// The endpoint (whether it reports remote reads: the hello's flag).
    core: Arc<EpCore>,
    /// What the engine's `native` decisions read: registrations, peers' flags.
    shared: Arc<Shared>,
    /// Transfers of several work requests under way (large reads, copies), by owner.
    transfers: HashMap<Owner, Transfer>,
    /// Copies that ended with their connection or could not start: reported at the next
    /// `flush` or `push` (errno).
    copy_failed: Vec<(u64, i32)>,
}

fn wr_id(link: usize, slot: usize) -> u64 {
    ((link as u64) << 32) | slot as u64
}

/// The engine's frames go into the peers' queues, which take everything but frames to a peer
/// lost and not yet reported (`seam::unless_losing`).
impl xfabric_core::rdm::Transport for Net {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        let losing = self.peers.get(t.peer).is_some_and(|p| p.losing > 0);
        crate::rdm::seam::unless_losing(losing, t, |t| Net::send(self, t))
    }

    fn detach(&mut self, peer: PeerId, token: u64, more: usize) -> Option<usize> {
        let p = self.peers.get_mut(peer)?;
        let frames = p.out.iter_mut().filter_map(|o| match o {
            Out::Frame { t, .. } => Some(t),
            _ => None,
        });
        crate::rdm::seam::detach_queued(p.queued, more, frames, token)
    }
}

impl Net {
    /// Listens on `ip:port` of the device's address.
    pub fn bind(
        nic: &Arc<Nic>,
        bind: SocketAddr,
        core: Arc<EpCore>,
        shared: Arc<Shared>,
    ) -> Result<Net> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::from_io(format!("verbs endpoint: listen on {bind}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::from_io("verbs endpoint: listener", e))?;
        let name = listener
            .local_addr()
            .map_err(|e| Error::from_io("verbs endpoint: local address", e))?;
        let cq = Cq::new(nic, CQ_DEPTH)?;
        Ok(Net {
            nic: nic.clone(),
            listener,
            name,
            claims: Claims::new(HELLO_TIME),
            links: HashMap::new(),
            next_link: 0,
            peers: Vec::new(),
            cq,
            wc: vec![sys::ibv_wc::default(); 64],
            lost: Vec::new(),
            faults: super::stats::faults(),
            cq_more: false,
            core,
            shared,
            transfers: HashMap::new(),
            copy_failed: Vec::new(),
        })
    }

    /// The endpoint's name.
    pub fn local_addr(&self) -> SocketAddr {
        self.name
    }

    /// Descriptors that become readable when there is work: the CQ channel, the listener and
    /// every side channel.
    pub fn fds(&self) -> Vec<(i32, i16)> {
        let mut v = vec![(self.cq.fd(), libc::POLLIN)];
        // Not while no connection would be accepted (its backlog would wake a sleeper at once,
        // again and again): the claims' own descriptors wake it when one ends.
        if self.claims.room() {
            v.push((self.listener.as_raw_fd(), libc::POLLIN));
        }
        v.extend(self.links.values().map(|l| {
            // A dialing side channel becomes writable when its connect is done.
            let ev = if matches!(l.state, State::Dialing) {
                libc::POLLOUT
            } else {
                libc::POLLIN
            };
            (l.stream.as_raw_fd(), ev)
        }));
        self.claims.fds(&mut v);
        v
    }

    /// Arms the CQ's event for the next completion (before sleeping on `fds`).
    pub fn arm(&mut self) {
        self.cq.arm();
    }

    /// The peer number of `addr` (a new one if unknown).
    pub fn peer(&mut self, addr: SocketAddr) -> PeerId {
        if let Some(i) = self.peers.iter().position(|p| p.addr == addr) {
            return i;
        }
        self.peers.push(Peer {
            addr,
            tx: None,
            out: VecDeque::new(),
            queued: 0,
            losing: 0,
        });
        self.peers.len() - 1
    }

    /// Bytes queued toward `peer`.
    pub fn queued(&self, peer: PeerId) -> usize {
        self.peers.get(peer).map_or(0, |p| p.queued)
    }

    /// Whether anything waits to be sent or completed, or a claim to be proven (which ends
    /// by time too, a call-back that never answers waking no one: a sleep lasts at most
    /// 1 ms then).
    pub fn busy(&self) -> bool {
        self.cq_more
            || !self.claims.is_empty()
            || self.peers.iter().any(|p| !p.out.is_empty())
            || self.links.values().any(|l| {
                l.inflight > 0 || !l.natives.is_empty() || !l.held.is_empty() || l.posting.is_some()
            })
    }

    fn new_link(&mut self, peer: PeerId, stream: TcpStream, state: State) -> Result<usize> {
        if self.links.len() >= MAX_LINKS {
            return Err(Error::Again("verbs: connection table full"));
        }
        // A PSN and a nonce nobody can guess: the first is what a forged packet into the QP
        // would have to match, the second what a stranger claiming this connection would.
        let (Some(psn), Some(nonce)) = (claim::nonce(), claim::nonce()) else {
            return Err(Error::from_io(
                "verbs: random numbers for a connection",
                std::io::Error::other("the OS gave none"),
            ));
        };
        let qp = Qp::new(&self.nic, &self.cq, RQ)?;
        let mut buf = vec![0u8; (RQ as usize + SQ) * CHUNK];
        // SAFETY: the Vec's heap block moves into the Link with the MR, and Link's field
        // order drops the QP, then the MR, then the memory.
        let mr = unsafe {
            Mr::new(
                &self.nic,
                buf.as_mut_ptr(),
                buf.len(),
                sys::IBV_ACCESS_LOCAL_WRITE,
            )?
        };
        let link = Link {
            peer,
            accepted: matches!(state, State::Answered),
            state,
            stream,
            hello: Vec::new(),
            nonce,
            qp,
            psn: psn as u32 & 0xff_ffff,
            mr,
            buf,
            free_tx: (0..SQ).map(|i| RQ as usize + i).collect(),
            credits: RQ - RESERVE,
            reserve: RESERVE,
            owe: 0,
            owe_reserve: 0,
            held: VecDeque::new(),
            rx: Rx::Head(Vec::new()),
            inflight: 0,
            natives: HashMap::new(),
            next_native: 0,
            reads_out: 0,
            atomics_out: 0,
            read_bytes: 0,
            posting: None,
            born: std::time::Instant::now(),
            closing: None,
        };
        let id = self.next_link;
        self.next_link += 1;
        let l = self.links.entry(id).or_insert(link);
        for s in 0..RQ as usize {
            if let Err(e) = post_recv(l, id, s) {
                self.links.remove(&id);
                return Err(e);
            }
        }
        Ok(id)
    }

    fn hello_bytes(&self, l: &Link) -> [u8; HELLO] {
        Hello {
            qp: QpInfo {
                qpn: l.qp.num(),
                psn: l.psn,
                gid: self.nic.gid,
            },
            name: self.name,
            flags: if native::reports_remote(&self.core) {
                HELLO_EVENTS
            } else {
                0
            },
            nonce: l.nonce,
        }
        .encode()
    }

    /// A call-back's question: whether our connection from `src` said a hello with `nonce`
    /// (and waits for its answer).
    fn vouch(links: &HashMap<usize, Link>, src: &SocketAddr, nonce: u64) -> bool {
        links.values().any(|l| {
            matches!(l.state, State::Connecting)
                && l.nonce == nonce
                && l.stream.local_addr().ok().as_ref() == Some(src)
        })
    }

    /// Starts a connection toward `peer`.
    fn connect(&mut self, peer: PeerId) -> std::result::Result<(), i32> {
        let to = self.peers[peer].addr;
        // A non-blocking connect: its outcome is seen by `side_channels` (`dial`). From our
        // name's address: the acceptor takes a claim only from the address it names.
        let stream = crate::inet::connect_from(self.name.ip(), to).map_err(|e| {
            debug!("verbs: connect to {to}: {e}");
            e.raw_os_error().unwrap_or(libc::ECONNREFUSED)
        })?;
        let _ = stream.set_nodelay(true);
        let id = self.new_link(peer, stream, State::Dialing).map_err(|e| {
            warn!("verbs: {e}");
            libc::ENOMEM
        })?;
        self.peers[peer].tx = Some(id);
        Ok(())
    }

    /// A dialing side channel: once its connect is done, send our hello. Returns whether
    /// something changed.
    fn dial(&mut self, id: usize) -> bool {
        let l = &self.links[&id];
        let err = match l.stream.take_error() {
            Ok(None) => match l.stream.peer_addr() {
                Ok(_) => None,
                Err(e) if e.kind() == ErrorKind::NotConnected => {
                    if l.born.elapsed() > HELLO_TIME {
                        self.fail_link(id, libc::ETIMEDOUT, "connect took too long");
                        return true;
                    }
                    return false;
                }
                Err(e) => Some(e),
            },
            Ok(Some(e)) | Err(e) => Some(e),
        };
        if let Some(e) = err {
            let errno = e.raw_os_error().unwrap_or(libc::ECONNREFUSED);
            self.fail_link(id, errno, "connect");
            return true;
        }
        let h = self.hello_bytes(&self.links[&id]);
        let l = self.links.get_mut(&id).expect("listed");
        // A hello into a fresh connection's empty socket buffer: written whole at once.
        match l.stream.write(&h) {
            Ok(n) if n == h.len() => {
                l.state = State::Connecting;
            }
            Ok(_) => self.fail_link(id, libc::EIO, "side channel: hello cut short"),
            Err(e) => self.fail_link(
                id,
                e.raw_os_error().unwrap_or(libc::ECONNRESET),
                "side channel: hello",
            ),
        }
        true
    }

    /// Queues a frame; it goes out as credits and buffers allow. The engine hands frames over
    /// through `Transport::send`, which refuses those to a peer whose loss is not yet reported.
    pub fn send(&mut self, t: Transmit) {
        let peer = t.peer;
        let Some(p) = self.peers.get_mut(peer) else {
            return;
        };
        let len = t.ctrl.len() + t.body.len();
        tracing::trace!(peer, len, tx = ?p.tx, "verbs: frame queued");
        p.queued += len;
        p.out.push_back(Out::Frame { t, pos: 0 });
        self.connect_if_idle(peer);
    }

    /// Starts a connection to `peer` if it has none; a failure loses it.
    fn connect_if_idle(&mut self, peer: PeerId) {
        if self.peers[peer].tx.is_none() {
            if let Err(e) = self.connect(peer) {
                self.lose_peer(peer, e);
            }
        }
    }

    /// Drops a connection (its QP with it).
    fn drop_link(&mut self, id: usize) {
        self.end_link_transfers(id, libc::ECONNRESET);
        if let Some(l) = self.links.remove(&id) {
            let _ = l.qp.to_error();
            if let Some(p) = self.peers.get_mut(l.peer) {
                if p.tx == Some(id) {
                    p.tx = None;
                }
            }
        }
    }

    /// Forgets what was queued toward `peer` and reports its loss.
    fn lose_peer(&mut self, peer: PeerId, errno: i32) {
        if let Some(p) = self.peers.get_mut(peer) {
            for o in p.out.drain(..) {
                if let Out::Copy(c) = o {
                    self.copy_failed.push((c.token, errno));
                }
            }
            p.queued = 0;
            p.losing += 1;
            if let Some(id) = p.tx.take() {
                self.drop_link(id);
            }
        }
        // Every other connection of that peer goes too: one still bringing the rest of a frame
        // would write it into a receive the loss fails (a stream is not picked up mid-body).
        let others: Vec<usize> = self
            .links
            .iter()
            .filter(|(_, l)| l.peer == peer)
            .map(|(&id, _)| id)
            .collect();
        for id in others {
            self.drop_link(id);
        }
        self.lost.push((peer, errno));
    }

    /// Drops a connection that failed; its peer (if it named itself) is lost: whatever it
    /// owed us, on this connection or another, will not come.
    fn fail_link(&mut self, id: usize, errno: i32, why: &str) {
        let Some(l) = self.links.get(&id) else {
            return;
        };
        let peer = l.peer;
        debug!(peer, errno, "verbs: connection lost: {why}");
        self.drop_link(id);
        if peer < self.peers.len() {
            self.lose_peer(peer, errno);
        }
    }

    fn link_ids(&self) -> Vec<usize> {
        self.links.keys().copied().collect()
    }

    /// One round: accept, side channels, completions, sends. Returns events handled.
    pub fn progress<H: Handler>(&mut self, h: &mut H) -> usize {
        let f = super::stats::faults();
        if f != self.faults {
            self.faults = f;
            for l in self.links.values() {
                let _ = l.qp.to_error();
            }
        }
        let mut n = self.accept();
        // Completions before side channels: a peer whose NIC refused our access closes its
        // side channel after it answered, and the operation's own error comes first.
        n += self.completions(h);
        n += self.side_channels();
        // Losses found so far reach the engine before any frame is read: a peer's new
        // connection must not bring a frame while its old one's half-arrived body is still
        // expected (the engine refuses that as a second stream).
        self.report(h);
        for id in self.link_ids() {
            n += self.consume(id, h);
        }
        self.flush(h);
        n
    }

    /// Posts what queued frames credits and buffers allow, and reports connections lost.
    pub fn flush<H: Handler>(&mut self, h: &mut H) {
        self.pump_all(h);
        self.report(h);
    }

    /// Reports copies that ended, then the peers lost, since the last report: a lost peer's
    /// failed copies before its loss.
    fn report<H: Handler>(&mut self, h: &mut H) {
        self.report_copies(h);
        for (peer, errno) in std::mem::take(&mut self.lost) {
            let addr = self.peers.get(peer).map(|p| p.addr);
            h.on_lost(peer, addr.as_ref().map(|a| a as &dyn PeerName), errno);
            if let Some(p) = self.peers.get_mut(peer) {
                p.losing = p.losing.saturating_sub(1);
            }
        }
    }

    fn accept(&mut self) -> usize {
        let mut n = 0;
        // A bounded number per round: a flood of connections cannot starve the rest. None
        // while every pending place holds a claim being proven: the rest wait in the backlog.
        for _ in 0..16 {
            if !self.claims.room() {
                break;
            }
            match self.listener.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(true);
                    let _ = s.set_nodelay(true);
                    // No queue pair until its hello's claim is proven (`claims`).
                    self.claims.add(s);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// Advances every side channel: claims, hellos, READY, EOF.
    fn side_channels(&mut self) -> usize {
        let links = &self.links;
        let (proven, mut n) = self
            .claims
            .poll(|src, nonce| Self::vouch(links, src, nonce));
        for (stream, hello) in proven {
            // The peer is known once its proven hello names it; usize::MAX until then.
            let id = match self.new_link(usize::MAX, stream, State::Answered) {
                Ok(id) => id,
                Err(e) => {
                    warn!("verbs: cannot accept a connection: {e}");
                    continue;
                }
            };
            if let Err(why) = self.on_hello(id, &hello) {
                warn!("verbs: {why}");
                self.fail_link(id, libc::EPROTO, why);
            }
        }
        for id in self.link_ids() {
            let want = match self.links[&id].state {
                State::Dialing => {
                    n += usize::from(self.dial(id));
                    continue;
                }
                State::Connecting => HELLO,
                State::Answered => 1,
                State::Up => 1,
            };
            let l = self.links.get_mut(&id).expect("listed");
            let mut tmp = [0u8; HELLO];
            let have = l.hello.len().min(want);
            let r = l.stream.read(&mut tmp[..want - have]);
            if matches!(r, Ok(0) | Err(_))
                && !matches!(&r, Err(e) if e.kind() == ErrorKind::WouldBlock)
                && native::nak_pending(l)
            {
                // One-sided operations are outstanding: give their completions (a refused
                // access names the operation that caused the close) a moment first.
                continue;
            }
            match r {
                Ok(0) => {
                    self.fail_link(id, libc::ECONNRESET, "side channel closed");
                    n += 1;
                    continue;
                }
                Ok(k) => l.hello.extend_from_slice(&tmp[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !matches!(l.state, State::Up) && l.born.elapsed() > HELLO_TIME {
                        self.fail_link(id, libc::ETIMEDOUT, "hellos took too long");
                        n += 1;
                    }
                    continue;
                }
                Err(e) => {
                    self.fail_link(
                        id,
                        e.raw_os_error().unwrap_or(libc::ECONNRESET),
                        "side channel",
                    );
                    n += 1;
                    continue;
                }
            }
            if l.hello.len() < want {
                continue;
            }
            n += 1;
            let got = std::mem::take(&mut l.hello);
            let r = match l.state {
                State::Connecting => self.on_answer(id, &got),
                State::Answered if got[0] == READY => {
                    debug!(link = id, peer = l.peer, "verbs: connected (acceptor)");
                    l.state = State::Up;
                    Ok(())
                }
                _ => Err("unexpected bytes on the side channel"),
            };
            if let Err(why) = r {
                warn!("verbs: {why}");
                self.fail_link(id, libc::EPROTO, why);
            }
        }
        n
    }

    /// Connector: the acceptor's answer came: connect the QP, say READY, start sending.
    fn on_answer(&mut self, id: usize, h: &[u8]) -> std::result::Result<(), &'static str> {
        // Whoever answers at the address we dialed is the peer of that name.
        let h = Hello::parse(h)?;
        let l = self.links.get_mut(&id).expect("listed");
        self.shared.set_quiet(l.peer, h.flags & HELLO_EVENTS == 0);
        l.qp.connect(l.psn, &h.qp).map_err(|e| {
            warn!("verbs: {e}");
            "cannot connect the queue pair"
        })?;
        l.stream
            .write_all(&[READY])
            .map_err(|_| "side channel: cannot send READY")?;
        l.state = State::Up;
        debug!(link = id, peer = l.peer, "verbs: connected (connector)");
        Ok(())
    }

    /// Acceptor: a hello came and its claim is proven (`claim`): name the peer, connect our
    /// QP, answer.
    fn on_hello(&mut self, id: usize, h: &Hello) -> std::result::Result<(), &'static str> {
        let peer = self.peer(h.name);
        // One connection a peer made to us at a time: a second, proven, is a peer that
        // restarted or reconnected, and the first is dead to it (as tcp's). Else one
        // proven peer could open connections (each a QP and its pinned buffers) until the
        // table is full and nobody else can connect. Its loss drops its other connections,
        // not this one, whose peer is not set yet.
        if self
            .links
            .iter()
            .any(|(&o, l)| o != id && l.accepted && l.peer == peer)
        {
            debug!(
                peer,
                "verbs: peer reconnected; its earlier connections are lost"
            );
            self.lose_peer(peer, libc::ECONNRESET);
        }
        self.shared.set_quiet(peer, h.flags & HELLO_EVENTS == 0);
        let answer = self.hello_bytes(&self.links[&id]);
        let l = self.links.get_mut(&id).expect("listed");
        l.peer = peer;
        l.qp.connect(l.psn, &h.qp).map_err(|e| {
            warn!("verbs: {e}");
            "cannot connect the queue pair"
        })?;
        // A hello on a connection that has carried one: the socket buffer has room.
        let _ = l.stream.set_nonblocking(false);
        let w = l.stream.write_all(&answer);
        let _ = l.stream.set_nonblocking(true);
        w.map_err(|_| "side channel: cannot answer")?;
        l.state = State::Answered;
        debug!(link = id, peer, "verbs: answered a connection");
        if self.peers[peer].tx.is_none() {
            self.peers[peer].tx = Some(id);
        }
        Ok(())
    }

    fn completions<H: Handler>(&mut self, h: &mut H) -> usize {
        let mut total = 0;
        self.cq_more = false;
        loop {
            // A round ends after so many, whatever still comes: a NIC fed faster than we
            // poll must not keep the caller (holding the endpoint) here.
            if total >= COMPLETIONS_MAX {
                self.cq_more = true;
                break;
            }
            let n = self.cq.poll(&mut self.wc);
            if n == 0 {
                break;
            }
            total += n;
            for i in 0..n {
                let wc = self.wc[i];
                let id = (wc.wr_id >> 32) as usize;
                let slot = (wc.wr_id & 0xffff_ffff) as usize;
                let Some(l) = self.links.get_mut(&id) else {
                    continue;
                };
                if slot & native::NATIVE_BIT != 0 {
                    self.native_done(id, slot, &wc, h);
                    continue;
                }
                if wc.status != sys::IBV_WC_SUCCESS {
                    let errno = match wc.status {
                        sys::IBV_WC_REM_ACCESS_ERR => libc::EACCES,
                        // The first error of a QP names the cause; a flush first means the QP
                        // was moved to the error state here.
                        sys::IBV_WC_WR_FLUSH_ERR => libc::ECANCELED,
                        // Retry or RNR retry exceeded, and the rest: the peer is gone.
                        _ => libc::ECONNRESET,
                    };
                    self.fail_link(id, errno, "work completion error");
                    continue;
                }
                if wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM {
                    // A peer's NIC wrote into our memory: its receive carried no bytes; the
                    // buffer goes back at once, the report in order with the chunks.
                    // Its data credit comes back once the engine took the report
                    // (`consume`), as a chunk's does: a peer writing past the credits it
                    // holds is found out below, not held for without end.
                    let imm = u32::from_be(wc.imm_data) as usize;
                    l.held.push_back((IMM, imm, wc.byte_len as usize));
                    if l.held.len() > (RQ - RESERVE) as usize {
                        self.fail_link(id, libc::EPROTO, "a peer wrote past its credits");
                        continue;
                    }
                    if let Err(e) = post_recv(l, id, slot) {
                        warn!("verbs: {e}");
                        self.fail_link(id, libc::EIO, "cannot repost a receive");
                    }
                    continue;
                }
                if wc.opcode & sys::IBV_WC_RECV != 0 {
                    let len = wc.byte_len as usize;
                    if !(HDR..=CHUNK).contains(&len) {
                        self.fail_link(id, libc::EPROTO, "chunk of a bad length");
                        continue;
                    }
                    let base = slot * CHUNK;
                    let hd = &l.buf[base..base + HDR];
                    let dc = u32::from(u16::from_le_bytes([hd[0], hd[1]]));
                    let rc = u32::from(u16::from_le_bytes([hd[2], hd[3]]));
                    let kind = hd[4];
                    l.credits = l.credits.saturating_add(dc).min(RQ - RESERVE);
                    l.reserve = l.reserve.saturating_add(rc).min(RESERVE);
                    if kind == KIND_CREDIT {
                        l.owe_reserve += 1;
                        // A peer holds at most RESERVE reserve credits; one sending more
                        // credit-only chunks than those (each reposted at once) would keep
                        // this loop busy without end.
                        if l.owe_reserve > RESERVE {
                            self.fail_link(id, libc::EPROTO, "a peer sent past its credits");
                            continue;
                        }
                        if let Err(e) = post_recv(l, id, slot) {
                            warn!("verbs: {e}");
                            self.fail_link(id, libc::EIO, "cannot repost a receive");
                        }
                    } else {
                        tracing::trace!(link = id, len, "verbs: chunk in");
                        l.held.push_back((slot, base + HDR, base + len));
                    }
                } else {
                    l.inflight -= 1;
                    l.free_tx.push(slot);
                }
            }
        }
        total
    }

    /// Feeds a connection's held chunks to the engine until done or the engine waits.
    fn consume<H: Handler>(&mut self, id: usize, h: &mut H) -> usize {
        let mut frames = 0;
        let Some(l) = self.links.get_mut(&id) else {
            return 0;
        };
        let peer = l.peer;
        let Some(addr) = self.peers.get(peer).map(|p| p.addr) else {
            return 0;
        };
        let bad = loop {
            // A whole head: ask the engine where the body goes.
            if let Rx::Head(v) = &l.rx {
                let need = match head_need(v) {
                    Ok(n) => n,
                    Err(e) => break Some(format!("garbage from a peer: {e}")),
                };
                if v.len() >= PREFIX && v.len() == need {
                    let p = match wire::prefix(v) {
                        Ok(p) => p,
                        Err(e) => break Some(format!("garbage from a peer: {e}")),
                    };
                    let sink = match h.on_ctrl(peer, &addr, &p, &v[PREFIX..]) {
                        Ok(s) => s,
                        Err(e) => break Some(format!("refused frame: {e}")),
                    };
                    tracing::trace!(
                        link = id,
                        kind = p.kind,
                        body = p.body_len,
                        "verbs: frame in"
                    );
                    if matches!(sink, Sink::Wait) {
                        // Flow control: the head stays, and so do the chunks behind it.
                        break None;
                    }
                    let keep = match &sink {
                        Sink::Discard | Sink::Wait => 0,
                        Sink::Buffer(b) => b.len() as u64,
                        Sink::Iov(i) => i.total() as u64,
                    }
                    .min(p.body_len);
                    l.rx = Rx::Body {
                        p,
                        sink,
                        got: 0,
                        keep,
                    };
                }
            }
            if let Rx::Body { p, got, .. } = &l.rx {
                if *got == p.body_len {
                    if let Rx::Body { sink, .. } =
                        std::mem::replace(&mut l.rx, Rx::Head(Vec::new()))
                    {
                        h.on_body(peer, sink);
                    }
                    tracing::trace!(link = id, "verbs: body in");
                    frames += 1;
                    continue;
                }
            }
            let Some(&(slot, at, end)) = l.held.front() else {
                break None;
            };
            if slot == IMM {
                l.held.pop_front();
                l.owe += 1;
                super::stats::NATIVE_WRITES_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                h.on_native_write(peer, end, native::imm_data(at as u32));
                frames += 1;
                continue;
            }
            let avail = end - at;
            let took = match &mut l.rx {
                Rx::Head(v) => {
                    let need = match head_need(v) {
                        Ok(n) => n,
                        Err(e) => break Some(format!("garbage from a peer: {e}")),
                    };
                    let k = (need - v.len()).min(avail);
                    v.extend_from_slice(&l.buf[at..at + k]);
                    k
                }
                Rx::Body { p, sink, got, keep } => {
                    let take = (avail as u64).min(p.body_len - *got) as usize;
                    if *got < *keep {
                        let n = (take as u64).min(*keep - *got) as usize;
                        let off = *got as usize;
                        let src = &l.buf[at..at + n];
                        match sink {
                            Sink::Discard | Sink::Wait => {}
                            Sink::Buffer(b) => b[off..off + n].copy_from_slice(src),
                            // SAFETY: the engine keeps the sink's memory writable until
                            // on_body; it is application memory, not our buffer.
                            Sink::Iov(i) => unsafe {
                                i.copy_in(off, src);
                            },
                        }
                    }
                    *got += take as u64;
                    take
                }
            };
            if at + took < end {
                l.held[0].1 = at + took;
            } else {
                l.held.pop_front();
                l.owe += 1;
                if let Err(e) = post_recv(l, id, slot) {
                    break Some(format!("cannot repost a receive: {e}"));
                }
            }
        };
        if let Some(why) = bad {
            warn!("verbs: {why}");
            self.fail_link(id, libc::EPROTO, "bad data");
        }
        frames
    }

    fn pump_all<H: Handler>(&mut self, h: &mut H) {
        for peer in 0..self.peers.len() {
            self.pump(peer, h);
        }
        // Credit-only chunks where credits pile up and nothing else carries them: data
        // credits while two reserve credits are left, reserve credits with the last one
        // (the module's flow control).
        for id in self.link_ids() {
            let l = self.links.get_mut(&id).expect("listed");
            if !matches!(l.state, State::Up) || l.free_tx.is_empty() {
                continue;
            }
            if !credit_only_due(l.owe, l.owe_reserve, l.reserve) {
                continue;
            }
            tracing::trace!(
                link = id,
                data = l.owe,
                reserve = l.owe_reserve,
                "verbs: credit-only chunk out"
            );
            l.reserve -= 1;
            let slot = l.free_tx.pop().expect("checked");
            let base = slot * CHUNK;
            write_hdr(l, base, KIND_CREDIT);
            if let Err(e) = post_send(l, id, slot, HDR) {
                warn!("verbs: {e}");
                self.fail_link(id, libc::EIO, "cannot post a send");
            }
        }
    }

    /// Moves `peer`'s queued frames into chunks while its connection has buffers and credits.
    fn pump<H: Handler>(&mut self, peer: PeerId, h: &mut H) {
        let Some(id) = self.peers[peer].tx else {
            return;
        };
        let Some(mut l) = self.links.get_mut(&id) else {
            return;
        };
        if !matches!(l.state, State::Up) {
            return;
        }
        loop {
            if l.posting.is_some() {
                // The rest of a transfer's pieces go first.
                match self.post_pieces(id) {
                    native::Posted::Yes => {}
                    native::Posted::NoRoom => return,
                    native::Posted::Failed(_) | native::Posted::Broken(_) => {
                        self.fail_link(id, libc::EIO, "cannot post a one-sided transfer");
                        return;
                    }
                }
                l = match self.links.get_mut(&id) {
                    Some(l) => l,
                    None => return,
                };
            }
            let p = &mut self.peers[peer];
            match p.out.front() {
                None => return,
                Some(Out::Native(n)) if native::in_pieces(n) => {
                    let n = *n;
                    p.out.pop_front();
                    match native::read_transfer(id, &n, &self.shared) {
                        Ok(t) => match self.start_transfer(id, Owner::Native(n.token), t, h) {
                            native::Posted::Yes | native::Posted::NoRoom => {}
                            native::Posted::Failed(errno) => h.on_native(n.token, errno),
                            native::Posted::Broken(e) => {
                                warn!("verbs: {e}");
                                self.fail_link(id, libc::EIO, "cannot post a one-sided read");
                                return;
                            }
                        },
                        Err(errno) => h.on_native(n.token, errno),
                    }
                    l = match self.links.get_mut(&id) {
                        Some(l) => l,
                        None => return,
                    };
                    continue;
                }
                Some(Out::Native(n)) => {
                    let n = *n;
                    match native::post(l, id, &n, &self.shared) {
                        native::Posted::Yes => {}
                        native::Posted::NoRoom => return,
                        native::Posted::Failed(errno) => h.on_native(n.token, errno),
                        native::Posted::Broken(e) => {
                            p.out.pop_front();
                            warn!("verbs: {e}");
                            self.fail_link(id, libc::EIO, "cannot post a one-sided operation");
                            return;
                        }
                    }
                    p.out.pop_front();
                    continue;
                }
                Some(Out::Copy(c)) => {
                    let c = *c;
                    p.out.pop_front();
                    match self.post_copy(id, &c, h) {
                        native::Posted::Yes | native::Posted::NoRoom => {}
                        native::Posted::Failed(errno) => {
                            h.on_copied(c.token, xfabric_core::rdm::Copied::Failed(errno))
                        }
                        native::Posted::Broken(e) => {
                            // Its transfer ends with the connection (`end_link_transfers`).
                            warn!("verbs: {e}");
                            self.fail_link(id, libc::EIO, "cannot post a copy");
                            return;
                        }
                    }
                    l = match self.links.get_mut(&id) {
                        Some(l) => l,
                        None => return,
                    };
                    continue;
                }
                Some(Out::Frame { .. }) => {}
            }
            if l.credits == 0 || l.free_tx.is_empty() {
                return;
            }
            let slot = l.free_tx.pop().expect("checked");
            let base = slot * CHUNK;
            let mut fill = HDR;
            while fill < CHUNK {
                // Frames up to the next one-sided operation, which goes after this chunk.
                let Some(Out::Frame { t, pos }) = p.out.front_mut() else {
                    break;
                };
                let clen = t.ctrl.len();
                let total = clen + t.body.len();
                let k = (total - *pos).min(CHUNK - fill);
                let dst = &mut l.buf[base + fill..base + fill + k];
                let mut done = 0;
                if *pos < clen {
                    let c = (clen - *pos).min(k);
                    dst[..c].copy_from_slice(&t.ctrl[*pos..*pos + c]);
                    done = c;
                }
                if done < k {
                    let boff = *pos + done - clen;
                    let dst = &mut dst[done..];
                    match (&t.body, t.body.held()) {
                        (_, Some(v)) => dst.copy_from_slice(&v[boff..boff + dst.len()]),
                        // SAFETY: the engine keeps a body's memory readable until on_sent or
                        // on_lost (the Body::Iov contract).
                        (Body::Iov(i), None) => unsafe {
                            i.copy_out(boff, dst);
                        },
                        (_, None) => {}
                    }
                }
                *pos += k;
                fill += k;
                p.queued = p.queued.saturating_sub(k);
                if *pos == total {
                    let token = t.token;
                    p.out.pop_front();
                    if let Some(tok) = token {
                        h.on_sent(peer, tok);
                    }
                }
            }
            l.credits -= 1;
            write_hdr(l, base, KIND_DATA);
            tracing::trace!(
                link = id,
                len = fill,
                credits = l.credits,
                "verbs: chunk out"
            );
            if let Err(e) = post_send(l, id, slot, fill) {
                warn!("verbs: {e}");
                self.fail_link(id, libc::EIO, "cannot post a send");
                return;
            }
        }
    }

    /// A registered region `addr..addr + len` closes (`Wire::cut_region`): the framed body
    /// now arriving from each of `cut.sinks` is dropped from here on; the queued answers to
    /// reads of its memory fail, or, one begun, keep a copy (`rdm::cut_frame`); the copies in
    /// `cut.copies` (a peer's RMA this endpoint serves with its NIC) are not posted, or no
    /// more of their pieces, and fail (`FI_EACCES`) once the pieces already posted, which the
    /// NIC finishes in bounded time, are done.
    pub fn cut_region<H: Handler>(
        &mut self,
        h: &mut H,
        addr: usize,
        len: usize,
        cut: &xfabric_core::rdm::Cut,
    ) {
        for l in self.links.values_mut() {
            if !cut.sinks.contains(&l.peer) {
                continue;
            }
            if let Rx::Body {
                sink, got, keep, ..
            } = &mut l.rx
            {
                crate::rdm::seam::drop_rest(sink, *got, keep);
            }
        }
        let mut failed = Vec::new();
        for (peer, p) in self.peers.iter_mut().enumerate() {
            let mut ended = Vec::new();
            p.out.retain_mut(|o| match o {
                Out::Frame { t, pos } => {
                    let queued = &mut p.queued;
                    ended.extend(crate::rdm::seam::cut_queued(t, *pos > 0, addr, len, queued));
                    true
                }
                Out::Copy(c) if cut.copies.contains(&c.token) => {
                    failed.push(c.token);
                    false
                }
                _ => true,
            });
            for token in ended {
                h.on_sent(peer, token);
            }
        }
        for token in failed {
            h.on_copied(
                token,
                xfabric_core::rdm::Copied::Failed(xfabric_core::consts::errno::FI_EACCES),
            );
        }
        self.cut_transfers(&cut.copies, h);
    }

    /// Ends every connection: sends already posted get a moment to complete.
    pub fn shutdown(&mut self, until: std::time::Instant) {
        while self
            .links
            .values()
            .any(|l| l.inflight > 0 || !l.natives.is_empty())
            && std::time::Instant::now() < until
        {
            let n = self.cq.poll(&mut self.wc);
            for i in 0..n {
                let wc = self.wc[i];
                let id = (wc.wr_id >> 32) as usize;
                if let Some(l) = self.links.get_mut(&id) {
                    let slot = (wc.wr_id & 0xffff_ffff) as usize;
                    if slot & native::NATIVE_BIT != 0 {
                        l.natives.remove(&((slot & !native::NATIVE_BIT) as u32));
                    } else if wc.opcode & sys::IBV_WC_RECV == 0 {
                        l.inflight = l.inflight.saturating_sub(1);
                    }
                }
            }
            if n == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        for id in self.link_ids() {
            self.end_link_transfers(id, libc::ECANCELED);
        }
        self.links.clear();
        // Copies never posted end too; `push` reports them all.
        for p in &mut self.peers {
            for o in p.out.drain(..) {
                if let Out::Copy(c) = o {
                    self.copy_failed.push((c.token, libc::ECANCELED));
                }
            }
        }
    }
}

/// Whether a connection that owes `owe` data credits and `owe_reserve` reserve credits and
/// holds `reserve` sends a credit-only chunk: data credits once `RETURN_AT` pile up while two
/// reserve credits are left, reserve credits once `RESERVE_RETURN_AT` do, with the last one
/// (the module's flow control).
fn credit_only_due(owe: u32, owe_reserve: u32, reserve: u32) -> bool {
    (owe >= RETURN_AT && reserve >= 2) || (owe_reserve >= RESERVE_RETURN_AT && reserve >= 1)
}

fn write_hdr(l: &mut Link, base: usize, kind: u8) {
    let dc = l.owe.min(u32::from(u16::MAX));
    let rc = l.owe_reserve.min(u32::from(u16::MAX));
    l.owe -= dc;
    l.owe_reserve -= rc;
    let hd = &mut l.buf[base..base + HDR];
    hd[0..2].copy_from_slice(&(dc as u16).to_le_bytes());
    hd[2..4].copy_from_slice(&(rc as u16).to_le_bytes());
    hd[4] = kind;
    hd[5..8].fill(0);
}

fn post_recv(l: &mut Link, id: usize, slot: usize) -> Result<()> {
    let mut sge = sys::ibv_sge {
        addr: l.buf[slot * CHUNK..].as_mut_ptr() as u64,
        length: CHUNK as u32,
        lkey: l.mr.lkey(),
    };
    // SAFETY: the slot lies in the link's registered buffer, which outlives its QP.
    unsafe { l.qp.post_recv(wr_id(id, slot), &mut sge) }
}

fn post_send(l: &mut Link, id: usize, slot: usize, len: usize) -> Result<()> {
    let mut sge = sys::ibv_sge {
        addr: l.buf[slot * CHUNK..].as_mut_ptr() as u64,
        length: len as u32,
        lkey: l.mr.lkey(),
    };
    let mut wr = sys::ibv_send_wr {
        wr_id: wr_id(id, slot),
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::IBV_WR_SEND,
        send_flags: sys::IBV_SEND_SIGNALED | native::fence(l),
        ..Default::default()
    };
    // SAFETY: as post_recv; the slot is not reused before its completion (free_tx).
    unsafe { l.qp.post_send(&mut wr) }?;
    l.inflight += 1;
    Ok(())
}

/// Bytes of head (prefix and control part) a frame has, as far as `v` tells.
fn head_need(v: &[u8]) -> std::result::Result<usize, wire::WireError> {
    if v.len() < PREFIX {
        return Ok(PREFIX);
    }
    Ok(PREFIX + wire::prefix(v)?.ctrl_len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two connected peers that send nothing but credit-only chunks (their other traffic the
    /// NIC's writes, which need data credits only), explored exhaustively: every order of
    /// sends and arrivals, either side owing data credits or not at any moment. Nowhere does
    /// a peer that owes data credits wait forever: once nothing is in flight, it can return
    /// them, or one side returns reserve credits. And with no data credits owed, returns of
    /// reserve credits die out (each answers `RESERVE_RETURN_AT` chunks or more).
    #[test]
    fn credit_only_chunks_never_leave_both_peers_without_reserve() {
        use std::collections::HashSet;
        // Per side: reserve credits held, reserve credits owed; per direction: the reserve
        // credits each chunk in flight returns, oldest first.
        type State = ([u32; 2], [u32; 2], [Vec<u32>; 2]);
        let start: State = ([RESERVE; 2], [0; 2], [Vec::new(), Vec::new()]);
        let mut seen = HashSet::from([start.clone()]);
        let mut todo = vec![start];
        while let Some((r, o, flight)) = todo.pop() {
            let mut next = Vec::new();
            for s in 0..2 {
                // A credit-only chunk, whether or not data credits are owed.
                let due = [RETURN_AT, 0]
                    .iter()
                    .any(|&owe| credit_only_due(owe, o[s], r[s]));
                if due {
                    assert!(r[s] >= 1, "a chunk without a reserve credit");
                    let (mut r2, mut o2, mut w2) = (r, o, flight.clone());
                    r2[s] -= 1;
                    w2[s].push(o2[s]);
                    o2[s] = 0;
                    next.push((r2, o2, w2));
                }
                // The oldest chunk toward the other side arrives.
                if let Some(&back) = flight[s].first() {
                    let (mut r2, mut o2, mut w2) = (r, o, flight.clone());
                    w2[s].remove(0);
                    r2[1 - s] += back;
                    o2[1 - s] += 1;
                    assert!(r2[1 - s] <= RESERVE, "more reserve credits than buffers");
                    next.push((r2, o2, w2));
                }
            }
            if flight.iter().all(Vec::is_empty) {
                for s in 0..2 {
                    let can = credit_only_due(RETURN_AT, o[s], r[s]);
                    let returns = (0..2).any(|p| credit_only_due(0, o[p], r[p]));
                    assert!(can || returns, "side {s} stuck: reserve {r:?}, owed {o:?}");
                }
            }
            for n in next {
                if seen.insert(n.clone()) {
                    todo.push(n);
                }
            }
        }
        assert!(seen.len() > 100, "explored {} states", seen.len());
        const { assert!(RESERVE_RETURN_AT >= 2 && RESERVE_RETURN_AT < RESERVE) };
    }

    #[test]
    fn head_need_reads_the_prefix_and_refuses_garbage() {
        assert_eq!(head_need(&[]).unwrap(), PREFIX);
        assert_eq!(head_need(&[0u8; 3]).unwrap(), PREFIX);
        let prefix = |magic: u16, ctrl: u32| {
            let mut v = magic.to_le_bytes().to_vec();
            v.extend_from_slice(&[1, 0]);
            v.extend_from_slice(&ctrl.to_le_bytes());
            v.extend_from_slice(&5u64.to_le_bytes());
            v
        };
        assert_eq!(head_need(&prefix(wire::MAGIC, 24)).unwrap(), PREFIX + 24);
        assert!(head_need(&prefix(wire::MAGIC, u32::MAX)).is_err());
        assert!(head_need(&prefix(0, 24)).is_err());
    }
}
