//! The tcp provider's socket layer: moves the RDM engine's frames between endpoints over TCP,
//! event-driven (mio, epoll). It knows nothing of messages, tags or RMA: a frame is a
//! [`Prefix`], a control part and a body, and where a body goes is the [`Handler`]'s answer.
//!
//! One connection per pair of endpoints, whichever side opened it. Before any frame, a
//! handshake of our own (`hello`): the connector names its listen address and incarnation;
//! the acceptor proves that claim (an authentication key's challenge, or a call-back to the
//! claimed listener) and answers ACCEPT or REJECT. A claim never displaces a working
//! connection unless it is proven. When two endpoints connect to each other at once,
//! the connection opened by the one with the lower listen address (`hello::key`) survives on
//! both sides. Frames wait in a per-peer queue, not on a connection, and nothing is written
//! on a connection before its handshake is done, so the loser's queue simply drains on the
//! survivor: nothing lost, nothing duplicated.
//!
//! Small frames are read through a per-connection buffer (many per `read`); a large body
//! goes straight from the socket into its sink with `readv`. Writes coalesce queued frames
//! into one `sendmsg` (up to [`MAX_IOV`] segments), bodies written from application memory
//! directly.

pub mod hello;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use tracing::{debug, warn};
use xfabric_core::rdm::wire::{self, Prefix, WireError, MAX_CTRL, PREFIX};
use xfabric_core::rdm::{
    answer_charge, kept_at_close, Body, PeerId, Sink, Transmit, OWED_BYTES_MAX, OWED_MAX,
};

use crate::rdm::{Gate, Handler, PeerName};
use hello::{reason, Hs, HsError, Side, Transcript, RAND};

/// A frame may bring less than `FRAME_PROGRESS` bytes for this many times `stall_after`,
/// however steadily they come: a peer sending one byte a minute never stalls, and held its
/// receive for ever.
const FRAME_STALLS: u64 = 4;
/// What a frame must bring, each `FRAME_STALLS` times `stall_after`: a read buffer's worth.
/// A healthy sender we did not read for a while brings at least that at our next read (its
/// socket filled meanwhile), or the rest of its frame.
const FRAME_PROGRESS: usize = 64 << 10;

/// Bytes of each connection's read buffer.
const RBUF: usize = 64 * 1024;
/// What one read asks for after a frame with a large body: the next frame is likely large
/// too, and its body should go to its sink, not through the buffer.
const SMALL_READ: usize = 4096;
/// A body at least this large makes the next read small (`SMALL_READ`).
const LARGE_BODY: u64 = 16 * 1024;
/// Most segments one `sendmsg` carries.
pub const MAX_IOV: usize = 64;
// A frame's segments (its control part and body) fit one sendmsg (`Net::send_now`).
const _: () = assert!(xfabric_core::rxq::IOV_LIMIT < MAX_IOV);
/// Most peers an inbound HELLO may add: strangers cannot grow the table without bound.
const MAX_PEERS: usize = 1 << 16;
/// Most connections in bring-up (connecting, or accepted and not yet greeted) at once; at the
/// bound, the oldest inbound one is dropped for a new one.
const MAX_UNSETTLED: usize = 256;
/// Most inbound connections in bring-up from one source address; at the bound, that source's
/// oldest is dropped for its new one, so strangers at one address cannot crowd out others.
const PER_SOURCE: usize = 32;
/// How long a connection may take from accept or connect to a finished handshake, and how
/// long the loser of a simultaneous connect waits for the winner's connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an accepted connection may stay silent before its HELLO (a real connector sends
/// it as soon as it is connected): strangers holding connections open are dropped fast.
pub const GREET_TIMEOUT: Duration = Duration::from_secs(3);
/// After `accept` failed for lack of descriptors (with nothing in bring-up to make room),
/// when the listener is looked at again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Least time between two warnings about running out of descriptors.
const FD_WARN_EVERY: Duration = Duration::from_secs(5);
/// See `Net::last_epoll`, in milliseconds of the coarse clock (`clock::coarse_ms`, which
/// moves by the kernel's tick, 1 to 10 ms): what only epoll hears of (an accept, a second
/// connection) is noticed within a tick or two, and a sleep always asks first (`arm`). Each
/// ask is a system call an arrival may wait behind: every 50 us made 0.5 of them per 8-byte
/// round trip here.
const EPOLL_EVERY_MS: u64 = 1;

/// Direct reads of the one connection, since a sleep was last prepared, after which it
/// leaves epoll (`Net::direct_reads`).
const PARK_AFTER: u32 = 256;
/// How often `Net::look_at_connections` looks, at most (ms of the coarse clock).
const LOOK_EVERY_MS: u64 = 1000;
/// Frames one `progress` call hands over from one connection at most, then reads the next
/// one: a flooding peer neither starves the others nor, since answers are queued only after
/// `progress` returns, gets more than this past the bound of answers it may owe.
pub const PUMP_FRAMES: usize = 1024;
/// The listener's token; connection `k` of the slab is `Token(k + 1)`.
const LISTENER: Token = Token(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// Outbound, TCP connect in progress.
    Connecting,
    /// Outbound, HELLO sent, waiting for ACCEPT or REJECT (and, keyed, CHALLENGE first).
    Hello,
    /// Inbound, waiting for HELLO (or a call-back's VERIFY).
    Greet,
    /// Inbound, keyed: CHALLENGE sent, waiting for the connector's PROOF.
    Proof,
    /// Inbound: its claim is being checked by a call-back to the claimed address.
    Vetting,
    /// Outbound call-back: VERIFY sent, waiting for VOUCH.
    Asking,
    /// Handshake done: frames flow.
    Up,
}

/// What an inbound connection's HELLO claimed, until proven.
#[derive(Clone, Copy)]
struct Claim {
    addr: SocketAddr,
    nonce: u64,
    rand: [u8; RAND],
}

/// Where the frame being read stands.
enum Rx {
    /// Between frames: the next prefix and control part go through the buffer.
    Head,
    /// `got` of the `p.body_len` body bytes arrived; the first `keep` go to `sink`.
    Body {
        p: Prefix,
        sink: Sink,
        got: u64,
        keep: u64,
    },
}

struct Conn {
    sock: TcpStream,
    /// Set from the start for outbound connections, once proven for inbound ones.
    peer: Option<PeerId>,
    st: St,
    outbound: bool,
    /// Tells this connection from a later one at the same slab key.
    serial: u64,
    /// Inbound: the address it comes from (the per-source bound, and what a call-back asks).
    from: Option<SocketAddr>,
    /// Inbound: what its HELLO claimed, while that is being proven.
    claim: Option<Claim>,
    /// An outbound call-back: the inbound connection (key, serial) whose claim it checks.
    vouch_for: Option<(usize, u64)>,
    /// Our random challenge on it (HELLO's, or CHALLENGE's).
    rand: [u8; RAND],
    /// Outbound, keyed: the acceptor proved it holds the key (its CHALLENGE checked).
    proved: bool,
    /// When bring-up began (for `HANDSHAKE_TIMEOUT`).
    since: Instant,
    /// Invariant: `rs <= re <= rbuf.len()`; `rbuf[rs..re]` arrived and is not consumed.
    /// Room for two handshake messages until the connection is up, `RBUF` bytes from then on
    /// while it is read, none once it has been idle and empty a while (`look_at_connections`:
    /// what many peers' idle connections hold stays small): a stranger that never finishes
    /// its handshake makes us hold little, and so do peers that connected and went quiet.
    rbuf: Box<[u8]>,
    rs: usize,
    re: usize,
    rx: Rx,
    /// WRITABLE interest is registered (only while frames are queued behind a full socket).
    writable: bool,
    /// The last frame had a large body.
    big: bool,
    /// The handler answered the frame at the buffer's head `Sink::Wait` (flow control):
    /// nothing more is read from this connection until a later `progress` offers that frame
    /// again and gets another answer.
    waiting: bool,
    /// The last read stopped at `PUMP_FRAMES` with bytes left in the socket: read again on
    /// the next `progress` (they raise no new edge).
    more: bool,
    /// Coarse time (`clock::coarse_ms`) of the last byte that came while a frame was only
    /// partly here and we wanted the rest: `None` between frames and while we hold back
    /// ourselves. A peer that stops mid-frame for `stall_after` loses the connection
    /// (`look_at_connections`); until then it holds a receive and the bytes charged to it.
    stalled_since: Option<u64>,
    /// Coarse time since which the frame now partly here has brought less than
    /// `FRAME_PROGRESS` bytes (`None` between frames and while we hold back): a frame whose
    /// bytes trickle in slower than that over `FRAME_STALLS` times `stall_after` loses the
    /// connection too, however steadily they come.
    frame_since: Option<u64>,
    /// Bytes read since `frame_since` was set.
    frame_fed: usize,
    /// Bytes came since `note_stall` last looked.
    fed: bool,
    /// Bytes came since `look_at_connections` last looked.
    read_lately: bool,
    /// Coarse time since which the peer has read none of our answers while we hold back its
    /// frames for them (`owes`): past `stall_after` it is lost, as a peer that stopped
    /// writing is (we stopped reading it, so its half-arrived frame would otherwise hold its
    /// receive for good). Moved on whenever some of our bytes go out.
    owed_since: Option<u64>,
}

/// A queued frame, `off` of its `len` bytes (control part, then body) written.
struct Out {
    t: Transmit,
    off: usize,
    len: usize,
    /// An answer to the peer's request (`owes`).
    answer: bool,
    /// What that answer makes us hold for the peer (`charge`): counted in `Peer::owed_bytes`
    /// until it is written.
    charge: usize,
}

/// How much a peer may owe us before it is no longer read (`Net::set_max_owed`,
/// `Net::set_max_owed_bytes`).
#[derive(Clone, Copy, Debug)]
struct OwedMax {
    answers: usize,
    bytes: usize,
}

struct Peer {
    addr: SocketAddr,
    key: [u8; hello::KEY],
    /// Its incarnation, learned in a handshake (tells a restarted peer from a duplicate).
    nonce: Option<u64>,
    /// The connection frames to it go on (in bring-up or up).
    conn: Option<usize>,
    queue: VecDeque<Out>,
    /// Invariant: the sum of `len - off` over `queue`.
    queued: usize,
    /// Invariant: the number of answers (`Out::answer`) in `queue`.
    owed: usize,
    /// Invariant: the sum of `Out::charge` over `queue`.
    owed_bytes: usize,
    /// Lost a simultaneous connect: its connection to us should arrive before this.
    wait_until: Option<Instant>,
    /// Dialed again once after such a wait ended with no connection (`expire`); cleared
    /// when a connection of it comes up, or it is lost.
    redialed: bool,
    /// Losses reported to the handler's queue (`Report::Lost`) and not yet handed to it:
    /// until then the engine still counts frames to this peer as its own to fail, so none
    /// is taken (a frame taken now would go out on a new connection after the engine
    /// reported its operation failed, its memory maybe the application's again).
    losing: u32,
}

/// What `progress` reports through the handler, in the order it happened.
enum Report {
    Sent(PeerId, u64),
    Lost(PeerId, i32),
}

/// An endpoint's TCP transport: a listener, a connection per peer, per-peer send queues.
pub struct Net {
    poll: Poll,
    events: Events,
    /// Scratch copy of the last poll's events (token, readable, writable).
    ready: Vec<(Token, bool, bool)>,
    listener: TcpListener,
    local: SocketAddr,
    key: [u8; hello::KEY],
    nonce: u64,
    peers: Vec<Peer>,
    by_addr: HashMap<SocketAddr, PeerId>,
    conns: Slab<Conn>,
    /// Invariant: connections not `Up` plus peers with `wait_until` (timers to check).
    settling: usize,
    reports: VecDeque<Report>,
    timeout: Duration,
    /// The connection that came up last: with no other connection, `progress` reads it
    /// directly instead of asking epoll first (one syscall per arrival instead of two).
    last_up: usize,
    /// The connection `progress` took out of epoll to read it directly, if any: each
    /// arrival then costs the sender's kernel no epoll callback (on loopback, a tenth of a
    /// small message's one-way time). Back in before anything asks epoll (`unpark`). Taken
    /// out only through `gate`, which the endpoint's sleepers share.
    parked: Option<usize>,
    gate: Arc<Gate>,
    /// Direct reads since the last `arm`: the connection leaves epoll only past
    /// `PARK_AFTER` of them, as a thread that sleeps between arrivals (`fi_cq_sread` spins
    /// 64 reads first) would otherwise pay for each an epoll_ctl out and another back in,
    /// far more than the callback saved.
    direct_reads: u32,
    /// The epoll set was handed to the application (`keep_in_epoll`): no connection leaves
    /// it any more.
    no_park: bool,
    /// When `progress` last asked epoll (`clock::coarse_ms`). Reading the one connection
    /// directly, it still asks once `EPOLL_EVERY_MS` has passed, busy or idle: accepts and
    /// other events are noticed by time, however often (or rarely) the application polls.
    /// `u64::MAX` (`arm`, or a clock read that failed): the next `progress` asks.
    last_epoll: u64,
    /// What one peer may owe before it is no longer read (`OWED_MAX`, `OWED_BYTES_MAX`).
    max_owed: OwedMax,
    /// How long a peer may stay silent to the kernel (no ACK for our data, no answer to
    /// keepalive probes) before its connection is declared dead (`set_dead_after`).
    dead_after: Option<Duration>,
    /// How long a peer may send nothing more of a frame it began before it is lost
    /// (`set_stall_after`, `look_at_connections`).
    stall_after: Option<Duration>,
    /// When `look_at_connections` is next due (coarse ms), and how often it looks at most.
    next_look: u64,
    look_every: u64,
    /// The authentication key peers must prove they hold (`set_auth_key`); without one,
    /// claims are proven by calling the claimed address back.
    auth: Option<Vec<u8>>,
    /// Inbound connections in bring-up, by source address (`PER_SOURCE`).
    by_src: HashMap<IpAddr, usize>,
    /// The next connection's `serial`.
    serial: u64,
    /// `accept` ran out of descriptors: when the listener is looked at again.
    accept_retry: Option<Instant>,
    /// When running out of descriptors was last logged.
    fd_warned: Option<Instant>,
}

/// Arms the kernel's keepalive on a connection, so that a peer whose host vanished (powered
/// off, cable pulled: no RST ever comes) is noticed by time on an idle connection: probes
/// after half the time idle, then three over the other half; unanswered, the kernel ends the
/// connection with `ETIMEDOUT`, which the event loop reports as a lost peer. A connection
/// with data to send is watched by `silent_too_long` instead: `TCP_USER_TIMEOUT` is not used,
/// as since Linux 5.11 it also ends a connection whose receiver answers every zero-window
/// probe, that is, one that holds the sender back on purpose (flow control) or computes
/// between progress calls; the sends the sender's application already saw complete were
/// then lost with it.
fn arm_liveness(sock: &TcpStream, d: Duration) {
    let fd = sock.as_raw_fd();
    let ms = u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
    let secs = |v: u32| i32::try_from(v / 1000).unwrap_or(i32::MAX).max(1);
    let opts: [(i32, i32, i32); 4] = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(ms / 2)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(ms / 6)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ];
    for (level, name, v) in opts {
        // SAFETY: setsockopt on a socket we own, with a pointer to an int and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &v as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            warn!(
                "tcp: cannot arm liveness option {name}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// The kernel's view of a connection (`TCP_INFO`), if it answers.
fn tcp_info(fd: RawFd) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain integers, valid zeroed.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which has them.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

/// `TCP_ESTABLISHED` of linux/tcp_states.h (`tcpi_state`), which libc does not name.
const TCP_ESTABLISHED: u8 = 1;

/// Whether connection `fd` is still established in both directions to the kernel: false once
/// the peer closed it (FIN: `CLOSE_WAIT`) or reset it.
fn established(fd: RawFd) -> bool {
    tcp_info(fd).is_some_and(|i| i.tcpi_state == TCP_ESTABLISHED)
}

/// Whether the peer of connection `fd` has left something of ours unanswered for
/// `dead_ms`: data retransmitted, or zero-window or keepalive probes sent, and no
/// acknowledgement at all for that long, nor for a whole interval between two of the
/// kernel's tries plus a second. A receiver that holds us back answers each try (a
/// zero-window probe, or a retransmission into its closed window), which moves the last
/// acknowledgement and resets the probe count, so it is never taken for dead however long it
/// holds, though the tries back off to two minutes apart; a vanished host answers nothing.
/// The second of margin covers the kernel's answers to probes, sent at most once every
/// 500 ms (`tcp_invalid_ratelimit`): one of two early probes close together goes unanswered.
fn silent_too_long(fd: RawFd, dead_ms: u64) -> bool {
    /// `TCP_RTO_MAX`: the longest interval between two tries.
    const TRY_MAX_MS: u64 = 120_000;
    tcp_info(fd).is_some_and(|i| {
        let rto_ms = u64::from(i.tcpi_rto) / 1000;
        // Retransmissions double the timeout itself; probes shift it by their backoff.
        let interval = if i.tcpi_retransmits > 0 {
            rto_ms
        } else if i.tcpi_probes > 0 {
            rto_ms.saturating_mul(
                1u64.checked_shl(u32::from(i.tcpi_backoff))
                    .unwrap_or(u64::MAX),
            )
        } else {
            return false;
        };
        let silence = u64::from(i.tcpi_last_ack_recv);
        silence >= dead_ms && silence >= interval.min(TRY_MAX_MS) + 1000
    })
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The calling thread's `errno` (read directly: an `io::Error` made and dropped for it cost
/// a fifth of an empty poll).
#[inline]
fn last_errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() }
}

/// A listening socket with SO_REUSEADDR: a port whose last connections linger in TIME_WAIT
/// (an endpoint closed, or its process killed, a moment ago) can be listened on again at
/// once, as a restarted endpoint at its old address must. Linux still refuses a second live
/// listener on the port (that would take SO_REUSEPORT), so a port in use is an error.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let (family, len) = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (libc::AF_INET, std::mem::size_of::<libc::sockaddr_in>())
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (libc::AF_INET6, std::mem::size_of::<libc::sockaddr_in6>())
        }
    };
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns; the listener closes it (also on error).
    let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on our socket with a pointer to an int and its size.
    if unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ss holds a sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len as u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a bound socket.
    if unsafe { libc::listen(fd, 1024) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from_std(l))
}

/// A number that differs between two Nets with the same address (a restarted peer), and that
/// a stranger cannot guess: a call-back asks for it. From the OS's CSPRNG.
fn incarnation() -> io::Result<u64> {
    getrandom::u64().map_err(|e| io::Error::other(format!("no random number from the OS: {e}")))
}

/// `send(2)` of a small control message, without SIGPIPE. `Ok(false)`: not all of it fit.
fn send_small(fd: RawFd, b: &[u8]) -> io::Result<bool> {
    // SAFETY: b is valid for reads of b.len() bytes.
    let n = unsafe {
        libc::send(
            fd,
            b.as_ptr().cast(),
            b.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize == b.len())
}

impl Peer {
    /// It owes us as much as we hold for a peer that does not read: read nothing more from it.
    fn owes(&self, max: OwedMax) -> bool {
        self.owed >= max.answers || self.owed_bytes >= max.bytes
    }
}

/// The engine's frames go into the peers' queues, which take everything (a peer that stops
/// reading holds back its senders through `queued`, not here) but frames to a peer lost and
/// not yet reported (`seam::unless_losing`).
impl xfabric_core::rdm::Transport for Net {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        let losing = self.peers.get(t.peer).is_some_and(|p| p.losing > 0);
        crate::rdm::seam::unless_losing(losing, t, |t| Net::send(self, t))
    }

    fn detach(&mut self, peer: PeerId, token: u64, more: usize) -> Option<usize> {
        // The peer's frame that waited for these is offered again at the next progress call
        // (`progress_epoll` reads waiting connections on every call).
        let p = self.peers.get_mut(peer)?;
        let frames = p.queue.iter_mut().map(|o| &mut o.t);
        crate::rdm::seam::detach_queued(p.queued, more, frames, token)
    }
}

impl Net {
    /// Listens on `addr` (port 0: any free port; IPv4 or IPv6), non-blocking; a port in use
    /// is an error (`io::ErrorKind::AddrInUse`).
    pub fn bind(addr: SocketAddr) -> io::Result<Net> {
        let mut listener = listen(addr)?;
        let local = listener.local_addr()?;
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Net {
            poll,
            events: Events::with_capacity(256),
            ready: Vec::with_capacity(256),
            listener,
            local,
            key: hello::key_of(&local),
            nonce: incarnation()?,
            peers: Vec::new(),
            by_addr: HashMap::new(),
            conns: Slab::new(),
            settling: 0,
            reports: VecDeque::new(),
            timeout: HANDSHAKE_TIMEOUT,
            last_up: usize::MAX,
            last_epoll: crate::clock::coarse_ms(),
            parked: None,
            gate: Arc::default(),
            direct_reads: 0,
            no_park: false,
            max_owed: OwedMax {
                answers: OWED_MAX,
                bytes: OWED_BYTES_MAX,
            },
            dead_after: None,
            stall_after: None,
            next_look: 0,
            look_every: LOOK_EVERY_MS,
            auth: None,
            by_src: HashMap::new(),
            serial: 0,
            accept_retry: None,
            fd_warned: None,
        })
    }

    /// The authentication key peers must prove they hold (`None` or empty: none). With one,
    /// a peer that has none, or another, is refused before anything it sends is taken, and we
    /// refuse to talk to it. Applies to connections made from now on.
    pub fn set_auth_key(&mut self, key: Option<Vec<u8>>) {
        self.auth = key.filter(|k| !k.is_empty());
    }

    /// Whether timers are running (connections in bring-up, a listener to look at again): a
    /// sleep should be short, since no descriptor announces a deadline.
    pub fn busy(&self) -> bool {
        self.settling > 0 || self.accept_retry.is_some()
    }

    /// The address peers reach this endpoint at (the bound one, with the real port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// How long connection bring-up may take (default [`HANDSHAKE_TIMEOUT`]).
    pub fn set_handshake_timeout(&mut self, d: Duration) {
        self.timeout = d;
    }

    /// The id of the endpoint listening at `addr` (created on first use; no I/O yet).
    /// Stable for the Net's life.
    pub fn peer(&mut self, addr: SocketAddr) -> PeerId {
        if let Some(&p) = self.by_addr.get(&addr) {
            return p;
        }
        let p = self.peers.len();
        self.peers.push(Peer {
            addr,
            key: hello::key_of(&addr),
            nonce: None,
            conn: None,
            queue: VecDeque::new(),
            queued: 0,
            owed: 0,
            owed_bytes: 0,
            wait_until: None,
            redialed: false,
            losing: 0,
        });
        self.by_addr.insert(addr, p);
        p
    }

    /// The listen address of peer `p`, if `p` exists.
    pub fn peer_addr(&self, p: PeerId) -> Option<SocketAddr> {
        self.peers.get(p).map(|x| x.addr)
    }

    /// Bytes queued for peer `p` and not yet written.
    pub fn queued(&self, p: PeerId) -> usize {
        self.peers.get(p).map_or(0, |x| x.queued)
    }

    /// A registered region `addr..addr + len` closes (`Wire::cut_region`): the body now
    /// arriving from each of `sinks` is read and dropped from here on, and the queued answers
    /// to reads of its memory fail, or, one begun, keep a copy (`rdm::cut_frame`).
    pub fn cut_region<H: Handler>(
        &mut self,
        h: &mut H,
        addr: usize,
        len: usize,
        cut: &xfabric_core::rdm::Cut,
    ) {
        let sinks = &cut.sinks;
        for (_, c) in self.conns.iter_mut() {
            if !c.peer.is_some_and(|p| sinks.contains(&p)) {
                continue;
            }
            if let Rx::Body {
                sink, got, keep, ..
            } = &mut c.rx
            {
                crate::rdm::seam::drop_rest(sink, *got, keep);
            }
        }
        for (peer, p) in self.peers.iter_mut().enumerate() {
            for o in &mut p.queue {
                let (t, begun) = (&mut o.t, o.off > 0);
                if let Some(token) =
                    crate::rdm::seam::cut_queued(t, begun, addr, len, &mut p.queued)
                {
                    o.len = o.t.ctrl.len() + o.t.body.len();
                    h.on_sent(peer, token);
                }
            }
        }
    }

    /// Answers to peer `p`'s requests (acknowledgements, read data, atomic results,
    /// clear-to-send) queued and not yet written.
    pub fn owed(&self, p: PeerId) -> usize {
        self.peers.get(p).map_or(0, |x| x.owed)
    }

    /// How many answers a peer may owe us before we stop reading it (`OWED_MAX`, 65,536):
    /// a peer that sends requests and never reads the answers is held back in its own socket
    /// instead of growing our queue. An honest peer owes at most its outstanding requests
    /// (`tx_attr.size`), so two of them never wait on each other this way.
    pub fn set_max_owed(&mut self, n: usize) {
        self.max_owed.answers = n.max(1);
    }

    /// Bytes of answers to peer `p`'s requests that we hold for it (`charge`) until they are
    /// written.
    pub fn owed_bytes(&self, p: PeerId) -> usize {
        self.peers.get(p).map_or(0, |x| x.owed_bytes)
    }

    /// How many bytes of answers a peer may owe us before we stop reading it
    /// (`OWED_BYTES_MAX`, 16 MiB): the count alone let a peer asking 4 KiB fetching atomics
    /// and never reading have us queue 65,536 of them, 272 MiB.
    pub fn set_max_owed_bytes(&mut self, n: usize) {
        self.max_owed.bytes = n.max(1);
    }

    /// How long a connected peer may stay silent to the kernel before it is declared lost
    /// (`None`: only when the kernel gives up by itself, which for a vanished host may be
    /// never on an idle connection and ~15 minutes with unacknowledged data): keepalive on an
    /// idle connection (armed on connections made from now on), the last acknowledgement
    /// (`look_at_connections`) on one with data to send. A peer that holds our data back
    /// while answering the kernel's probes is alive, however long it holds.
    pub fn set_dead_after(&mut self, d: Option<Duration>) {
        self.dead_after = d;
    }

    /// How long a peer may send nothing more of a frame it began before it is lost (`None`:
    /// never). Far longer than `dead_after` is right: a peer under manual progress writes the
    /// rest of a frame only when its application calls progress.
    pub fn set_stall_after(&mut self, d: Option<Duration>) {
        self.stall_after = d;
    }

    /// How often, at most, connections are looked at (`look_at_connections`; tests).
    #[cfg(test)]
    pub fn set_look_every(&mut self, d: Duration) {
        self.look_every = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    }

    /// Whether a connection has bytes left that no event will announce (read on the next
    /// `progress`): sleeping on `wait_fd` now would not wake for them.
    pub fn backlog(&self) -> bool {
        // Asked after every locked call: with one connection, that one is looked at alone.
        if self.conns.len() == 1 {
            if let Some(c) = self.conns.get(self.last_up) {
                return c.more;
            }
        }
        self.conns.iter().any(|(_, c)| c.more)
    }

    /// Before a sleep on `wait_fd`: the next `progress` asks epoll, draining its ready list
    /// (edge-triggered events `progress` took by reading directly would otherwise leave the
    /// descriptor readable, and the sleep would end at once until `EPOLL_EVERY_MS` passed).
    pub fn arm(&mut self) {
        self.last_epoll = u64::MAX;
        self.direct_reads = 0;
        // A sleeper waits on epoll: it must hear of every connection.
        self.unpark();
    }

    /// What the endpoint's bell shares with this Net: a sleeper on `wait_fd` and `progress`
    /// taking a connection out of epoll never overlap.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// The epoll set is handed to the application, which may sleep on it unknown to the
    /// gate: every connection stays in it from now on.
    pub fn keep_in_epoll(&mut self) {
        self.no_park = true;
        self.unpark();
    }

    /// Puts the connection `progress` took out of epoll back in (registering a socket
    /// reports what it already has to read: nothing that arrived meanwhile is missed).
    fn unpark(&mut self) {
        let Some(k) = self.parked.take() else { return };
        let Some(c) = self.conns.get_mut(k) else {
            self.gate.unparked();
            return;
        };
        let i = if c.writable {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match self.poll.registry().register(&mut c.sock, Token(k + 1), i) {
            Ok(()) => self.gate.unparked(),
            Err(e) => {
                warn!("tcp: epoll_ctl failed: {e}");
                self.parked = Some(k);
            }
        }
    }

    /// A file descriptor (mio's epoll fd) that becomes readable when `progress` has
    /// something to do, for a thread to poll(2) on without holding the Net.
    pub fn wait_fd(&self) -> RawFd {
        self.poll.as_raw_fd()
    }

    /// Queues a frame, in order with earlier ones to the same peer; connects on first use
    /// (non-blocking); writes right away when the connection is up and nothing is queued
    /// before it. A frame to an unknown peer is reported lost (`EINVAL`) by `progress`.
    pub fn send(&mut self, t: Transmit) {
        let p = t.peer;
        let Some(peer) = self.peers.get_mut(p) else {
            warn!(peer = p, "tcp: send to an unknown peer");
            self.reports.push_back(Report::Lost(p, libc::EINVAL));
            return;
        };
        // Nothing queued before it on an established connection: written from here, and
        // queued only if the socket does not take all of it.
        let mut tried = None;
        if peer.queue.is_empty() {
            if let Some(k) = peer.conn {
                let c = &self.conns[k];
                if c.st == St::Up && !c.writable {
                    match self.send_now(p, k, &t) {
                        None => return,
                        Some(n) => tried = Some((k, n)),
                    }
                }
            }
        }
        let peer = &mut self.peers[p];
        let off = tried.map_or(0, |(_, n)| n);
        let len = t.ctrl.len() + t.body.len();
        let charge = answer_charge(&t);
        let answer = charge.is_some();
        let charge = charge.unwrap_or(0);
        peer.owed += usize::from(answer);
        peer.owed_bytes += charge;
        peer.queue.push_back(Out {
            t,
            off,
            len,
            answer,
            charge,
        });
        peer.queued += len - off;
        if let Some((k, _)) = tried {
            // The socket is full: the rest goes when it is writable.
            self.set_writable(k, true);
            return;
        }
        match peer.conn {
            None if peer.wait_until.is_none() => self.connect(p),
            Some(c) if peer.queue.len() == 1 && self.conns[c].st == St::Up => {
                self.flush(p);
            }
            _ => {}
        }
    }

    /// `send` of frame `t` with nothing queued before it on established connection `k` (no
    /// WRITABLE interest): written from here in one `sendmsg`, as `flush` would write it had
    /// it been queued. `None`: done (all of it written, its token reported; or the peer lost
    /// on an error, the frame dropped unreported as a queued one's would be); `Some(n)`: the
    /// socket took only its first `n` bytes (0: none, it was full), the rest is to be queued.
    fn send_now(&mut self, p: PeerId, k: usize, t: &Transmit) -> Option<usize> {
        let fd = self.conns[k].sock.as_raw_fd();
        let mut v = Iovecs::default();
        v.push_frame(t, 0);
        let n = loop {
            // SAFETY: as in `flush`: the iovecs point at `t`'s bytes, which outlive the call,
            // or at application memory the engine keeps readable until on_sent/on_lost (the
            // Body::Iov contract).
            let n = unsafe { v.sendmsg(fd) };
            if n >= 0 {
                break n as usize;
            }
            match last_errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Some(0),
                e => {
                    self.lose_peer(p, e, "write");
                    return None;
                }
            }
        };
        // One frame's segments (its control part and at most IOV_LIMIT) all fit one sendmsg,
        // so `want` is the frame's length.
        if n >= v.want {
            if let Some(tok) = t.token {
                self.reports.push_back(Report::Sent(p, tok));
            }
            return None;
        }
        Some(n)
    }

    /// Non-blocking progress: accepts, finishes connects and handshakes, reads whole frames
    /// into the handler, writes queued frames, reports sent tokens and lost peers. Returns
    /// how many things it handled (0: idle).
    ///
    /// Inline, as its callers poll it in a loop: the common case (one established connection,
    /// epoll asked recently) reads that connection; the rest is `progress_epoll`'s.
    #[inline(always)]
    pub fn progress<H: Handler>(&mut self, h: &mut H) -> usize {
        let mut n = self.report(h);
        if self.accept_retry.is_some() {
            n += self.retry_accept(h);
        }
        // One established connection and nothing else going on: read it directly. epoll
        // still hears of accepts: asked once EPOLL_EVERY_MS has passed.
        let now = crate::clock::coarse_ms();
        // Armed, or a clock that failed (u64::MAX) or went back: epoll is asked, and the next
        // reading that makes sense starts the interval again.
        let recent =
            now != u64::MAX && now >= self.last_epoll && now - self.last_epoll < EPOLL_EVERY_MS;
        if self.conns.len() == 1 && self.settling == 0 && recent {
            let k = self.last_up;
            if let Some(c) = self.conns.get_mut(k) {
                let owing = c.peer.is_some_and(|p| self.peers[p].owes(self.max_owed));
                if let (St::Up, false, Some(p), false) = (c.st, c.writable, c.peer, owing) {
                    self.direct_reads = self.direct_reads.saturating_add(1);
                    if self.parked.is_none()
                        && self.direct_reads >= PARK_AFTER
                        && !self.no_park
                        && self.gate.try_park()
                    {
                        // Read here until epoll is next asked: it need not hear of arrivals.
                        if self.poll.registry().deregister(&mut c.sock).is_ok() {
                            self.parked = Some(k);
                        } else {
                            self.gate.unparked();
                        }
                    }
                    let (m, err) = c.pump(p, &self.peers[p].addr, h);
                    if let Some(e) = err {
                        self.fail_conn(k, e, "read");
                    }
                    return n + m + self.report(h);
                }
            }
        }
        n + self.progress_epoll(now, h)
    }

    /// `accept` again once `accept_retry` has come.
    #[inline(never)]
    fn retry_accept<H: Handler>(&mut self, h: &mut H) -> usize {
        if self.accept_retry.is_some_and(|t| Instant::now() >= t) {
            self.accept(h)
        } else {
            0
        }
    }

    /// `progress` through epoll (at coarse time `now`): every event, then the connections no
    /// event announces.
    #[inline(never)]
    fn progress_epoll<H: Handler>(&mut self, now: u64, h: &mut H) -> usize {
        self.last_epoll = now;
        self.unpark();
        let mut n = self.step(h, Some(Duration::ZERO));
        if now >= self.next_look {
            n += self.look_at_connections(now);
        }
        // Connections held back by flow control, or left unread at `PUMP_FRAMES`, raise no
        // new event: read them again.
        let waiting: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.waiting || c.more)
            .map(|(k, _)| k)
            .collect();
        for k in waiting {
            n += self.read_frames(k, h);
        }
        n + self.report(h)
    }

    /// Tries, until `deadline`, to write out the answers queued (frames arriving meanwhile
    /// are dropped), then closes every connection. The requests queued and not begun are
    /// dropped: the engine's close ended their operations `FI_ECANCELED`, so they must not
    /// arrive. One already begun is finished, as the answers behind it would otherwise be
    /// lost with the connection (the peer's operations failing though they took effect
    /// here): it arrives though reported canceled (docs/security.md). Reports still pending
    /// stay for a later `progress`.
    pub fn shutdown(&mut self, deadline: Instant) {
        self.unpark();
        for peer in &mut self.peers {
            peer.queue.retain(|o| o.off > 0 || kept_at_close(&o.t));
            peer.queued = peer.queue.iter().map(|o| o.len - o.off).sum();
            peer.owed = peer.queue.iter().filter(|o| o.answer).count();
            peer.owed_bytes = peer.queue.iter().map(|o| o.charge).sum();
        }
        struct Drain;
        impl Handler for Drain {
            fn on_ctrl(
                &mut self,
                _: PeerId,
                _: &dyn PeerName,
                _: &Prefix,
                _: &[u8],
            ) -> Result<Sink, WireError> {
                Ok(Sink::Discard)
            }
            fn on_body(&mut self, _: PeerId, _: Sink) {}
            fn on_sent(&mut self, _: PeerId, _: u64) {}
            fn on_lost(&mut self, _: PeerId, _: Option<&dyn PeerName>, _: i32) {}
        }
        while self.peers.iter().any(|p| !p.queue.is_empty()) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.step(
                &mut Drain,
                Some((deadline - now).min(Duration::from_millis(10))),
            );
        }
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.remove_conn(k);
        }
        for p in &mut self.peers {
            p.conn = None;
            p.queue.clear();
            p.queued = 0;
            p.owed = 0;
            p.owed_bytes = 0;
            p.wait_until = None;
        }
        self.settling = 0;
    }

    /// Hands what happened to the handler (`report_all`); inline, as most calls find nothing.
    #[inline]
    fn report<H: Handler>(&mut self, h: &mut H) -> usize {
        if self.reports.is_empty() {
            return 0;
        }
        self.report_all(h)
    }

    #[inline(never)]
    fn report_all<H: Handler>(&mut self, h: &mut H) -> usize {
        let mut n = 0;
        while let Some(r) = self.reports.pop_front() {
            match r {
                Report::Sent(p, t) => h.on_sent(p, t),
                Report::Lost(p, e) => {
                    let addr = self.peers.get(p).map(|x| &x.addr as &dyn PeerName);
                    h.on_lost(p, addr, e);
                    if let Some(x) = self.peers.get_mut(p) {
                        x.losing = x.losing.saturating_sub(1);
                    }
                }
            }
            n += 1;
        }
        n
    }

    /// One poll (`timeout` as epoll_wait's) and the work its events call for.
    fn step<H: Handler>(&mut self, h: &mut H, timeout: Option<Duration>) -> usize {
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                warn!("tcp: epoll_wait failed: {e}");
            }
            return 0;
        }
        self.ready.clear();
        for ev in self.events.iter() {
            let err = ev.is_error();
            self.ready.push((
                ev.token(),
                ev.is_readable() || ev.is_read_closed() || err,
                ev.is_writable() || ev.is_write_closed() || err,
            ));
        }
        let mut n = 0;
        for i in 0..self.ready.len() {
            let (tok, r, w) = self.ready[i];
            n += if tok == LISTENER {
                self.accept(h)
            } else {
                self.on_event(tok.0 - 1, r, w, h)
            };
        }
        if self.settling > 0 {
            n += self.expire();
        }
        n
    }

    fn on_event<H: Handler>(&mut self, k: usize, r: bool, w: bool, h: &mut H) -> usize {
        let Some(c) = self.conns.get(k) else {
            return 0;
        };
        match c.st {
            St::Connecting => self.finish_connect(k, h),
            St::Hello | St::Greet | St::Proof | St::Vetting | St::Asking if r => {
                self.read_handshake(k, h)
            }
            St::Up => {
                let mut n = 0;
                if let (true, Some(p)) = (w, c.peer) {
                    if self.peers[p].conn == Some(k) {
                        n += self.flush(p);
                    }
                }
                if r && self.conns.contains(k) {
                    n += self.read_frames(k, h);
                }
                n
            }
            _ => 0,
        }
    }

    /// Takes what waits in the listen queue. Each new connection is read at once (a real
    /// connector's HELLO is usually there already), so a flood of strangers that makes room
    /// for itself by dropping the oldest in bring-up rarely drops a real peer.
    fn accept<H: Handler>(&mut self, h: &mut H) -> usize {
        /// Most connections one call accepts.
        const ACCEPT_BATCH: usize = 64;
        self.accept_retry = None;
        let mut n = 0;
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((s, from)) => n += self.admit(s, from, h),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    // Out of descriptors: the oldest stranger in bring-up makes room.
                    if fds && self.evict(None) {
                        continue;
                    }
                    // Nothing to drop (or another failure): the listener raises no new
                    // edge for what waits in its queue, so it is looked at again by time.
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    let now = Instant::now();
                    if self
                        .fd_warned
                        .is_none_or(|t| now.duration_since(t) >= FD_WARN_EVERY)
                    {
                        self.fd_warned = Some(now);
                        warn!(
                            "tcp: accept failed: {e}; new connections wait in the listen queue \
                             and are looked at again every {ACCEPT_RETRY:?}"
                        );
                    }
                    return n;
                }
            }
        }
        // A flood keeps the queue full: the rest waits for the next call (the listener raises
        // no new edge for it, so it is looked at again by time, at once), and one call stays
        // bounded.
        self.accept_retry = Some(Instant::now());
        n
    }

    /// One accepted connection: within the bounds on bring-up (dropping the oldest inbound
    /// one in bring-up, from its source first, to make room), registered, and read.
    fn admit<H: Handler>(&mut self, mut s: TcpStream, from: SocketAddr, h: &mut H) -> usize {
        if self.by_src.get(&from.ip()).copied().unwrap_or(0) >= PER_SOURCE
            && !self.evict(Some(from.ip()))
        {
            return 0;
        }
        if self.settling >= MAX_UNSETTLED && !self.evict(None) {
            warn!(%from, "tcp: too many connections in bring-up; dropping a new one");
            return 0;
        }
        let _ = s.set_nodelay(true);
        if let Some(d) = self.dead_after {
            arm_liveness(&s, d);
        }
        let e = self.conns.vacant_entry();
        let k = e.key();
        if let Err(err) = self
            .poll
            .registry()
            .register(&mut s, Token(k + 1), Interest::READABLE)
        {
            warn!(%from, "tcp: cannot register an accepted connection: {err}");
            return 0;
        }
        self.serial += 1;
        let mut c = Conn::new(s, None, St::Greet, self.serial);
        c.from = Some(from);
        e.insert(c);
        self.settling += 1;
        *self.by_src.entry(from.ip()).or_insert(0) += 1;
        1 + self.read_handshake(k, h)
    }

    /// Drops the oldest inbound connection in bring-up (from `ip`, if given), one that has
    /// not said HELLO first. False: there is none.
    fn evict(&mut self, ip: Option<IpAddr>) -> bool {
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.st != St::Up && c.from.is_some_and(|f| ip.is_none_or(|ip| f.ip() == ip))
            })
            .min_by_key(|(_, c)| (c.st != St::Greet, c.since))
            .map(|(k, c)| (k, c.from));
        let Some((k, from)) = victim else {
            return false;
        };
        // debug: a flood would write a line per connection.
        debug!(
            ?from,
            "tcp: too many connections in bring-up; dropping the oldest"
        );
        self.remove_conn(k);
        true
    }

    fn connect(&mut self, p: PeerId) {
        let addr = self.peers[p].addr;
        match self.dial(addr) {
            Ok(k) => {
                self.conns[k].peer = Some(p);
                self.peers[p].conn = Some(k);
            }
            Err(e) => self.lose_peer(p, errno(&e), "connect"),
        }
    }

    /// Starts a non-blocking connection to `addr` (in bring-up until its handshake is done).
    fn dial(&mut self, addr: SocketAddr) -> io::Result<usize> {
        let mut s = self.connect_to(addr)?;
        let _ = s.set_nodelay(true);
        if let Some(d) = self.dead_after {
            arm_liveness(&s, d);
        }
        let e = self.conns.vacant_entry();
        let k = e.key();
        self.poll.registry().register(
            &mut s,
            Token(k + 1),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.serial += 1;
        let mut c = Conn::new(s, None, St::Connecting, self.serial);
        c.outbound = true;
        c.writable = true;
        e.insert(c);
        self.settling += 1;
        Ok(k)
    }

    /// A non-blocking connect to `addr` that leaves from our name's address (any port),
    /// whatever the route, where the name has one of `addr`'s family: an acceptor takes a
    /// claim only from the host it names (`vet`). A name without one (unspecified, or of the
    /// other family) connects from where the kernel routes it, and is refused.
    fn connect_to(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let ip = self.local.ip();
        if ip.is_unspecified() || ip.is_ipv4() != addr.is_ipv4() {
            return TcpStream::connect(addr);
        }
        crate::inet::connect_from(ip, addr).map(TcpStream::from_std)
    }

    fn finish_connect<H: Handler>(&mut self, k: usize, h: &mut H) -> usize {
        let c = &self.conns[k];
        let err = match c.sock.take_error() {
            Ok(None) => match c.sock.peer_addr() {
                Ok(_) => None,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return 0,
                Err(e) => Some(e),
            },
            Ok(Some(e)) | Err(e) => Some(e),
        };
        if let Some(e) = err {
            self.fail_conn(k, errno(&e), "connect");
            return 1;
        }
        let (msg, st) = match self.conns[k].vouch_for {
            // A call-back: ask about the claimant's source and nonce.
            Some((ck, serial)) => match self.claimant(ck, serial) {
                Some((from, claim)) => (
                    Hs::Verify {
                        src: from,
                        to: self.reached(ck),
                        nonce: claim.nonce,
                    },
                    St::Asking,
                ),
                None => {
                    self.remove_conn(k);
                    return 1;
                }
            },
            None => (
                Hs::Hello {
                    addr: self.local,
                    nonce: self.nonce,
                    rand: self.conns[k].rand,
                    keyed: self.auth.is_some(),
                },
                St::Hello,
            ),
        };
        if !self.send_hs(k, &msg) {
            return 1;
        }
        self.conns[k].st = st;
        self.set_writable(k, false);
        // The answer may already be there (edge-triggered: its event may have come with this one).
        1 + self.read_handshake(k, h)
    }

    /// Sends a handshake message on connection `k`; false: it failed, and the connection with
    /// it.
    fn send_hs(&mut self, k: usize, m: &Hs) -> bool {
        match send_small(self.conns[k].sock.as_raw_fd(), &m.encode()) {
            Ok(true) => true,
            Ok(false) => {
                self.fail_conn(k, libc::EIO, "handshake write");
                false
            }
            Err(e) => {
                self.fail_conn(k, errno(&e), "handshake write");
                false
            }
        }
    }

    /// Reads handshake messages on connection `k` and acts on each, until it is up (what
    /// follows in the buffer is frames), gone, or waits for more bytes.
    fn read_handshake<H: Handler>(&mut self, k: usize, h: &mut H) -> usize {
        let mut n = 0;
        loop {
            let Some(c) = self.conns.get_mut(k) else {
                return n;
            };
            if matches!(c.st, St::Up | St::Connecting) {
                return n;
            }
            if c.re - c.rs < hello::LEN {
                if c.rs > 0 {
                    c.rbuf.copy_within(c.rs..c.re, 0);
                    c.re -= c.rs;
                    c.rs = 0;
                }
                let free = &mut c.rbuf[c.re..];
                // SAFETY: free is valid for writes of its length.
                let got =
                    unsafe { libc::read(c.sock.as_raw_fd(), free.as_mut_ptr().cast(), free.len()) };
                if got < 0 {
                    match last_errno() {
                        libc::EINTR => continue,
                        libc::EAGAIN => return n,
                        e => {
                            self.fail_conn(k, e, "handshake read");
                            return n + 1;
                        }
                    }
                }
                if got == 0 {
                    self.fail_conn(k, libc::ECONNRESET, "EOF in handshake");
                    return n + 1;
                }
                c.re += got as usize;
                if let Err(e) = Hs::check_start(&c.rbuf[c.rs..c.re]) {
                    self.garbage(k, e);
                    return n + 1;
                }
                continue;
            }
            let mut b = [0u8; hello::LEN];
            b.copy_from_slice(&c.rbuf[c.rs..c.rs + hello::LEN]);
            c.rs += hello::LEN;
            let msg = match Hs::decode(&b) {
                Ok(m) => m,
                Err(e) => {
                    self.garbage(k, e);
                    return n + 1;
                }
            };
            n += 1;
            match (c.st, msg) {
                (
                    St::Greet,
                    Hs::Hello {
                        addr,
                        nonce,
                        rand,
                        keyed,
                    },
                ) => {
                    let claim = Claim { addr, nonce, rand };
                    n += self.on_hello(k, claim, keyed, h);
                }
                (St::Greet, Hs::Verify { src, to, nonce }) => self.on_verify(k, src, to, nonce),
                (St::Proof, Hs::Proof { mac }) => n += self.on_proof(k, &mac, h),
                (St::Hello, Hs::Challenge { nonce, rand, mac }) => {
                    self.on_challenge(k, nonce, &rand, &mac)
                }
                (St::Hello, Hs::Accept { nonce }) => n += self.on_accept(k, nonce, h),
                (St::Hello, Hs::Reject { reason }) => self.on_reject(k, reason),
                (St::Asking, Hs::Vouch { yes }) => n += self.on_vouch(k, yes, h),
                (St::Proof, Hs::Reject { reason }) => {
                    let from = self.conns[k].from;
                    warn!(?from, reason, "tcp: a connector refused our proof of the authentication key (another key?)");
                    self.remove_conn(k);
                }
                (st, m) => {
                    warn!(?st, ?m, "tcp: handshake message out of place");
                    self.fail_conn(k, libc::EPROTO, "handshake");
                }
            }
        }
    }

    fn garbage(&mut self, k: usize, e: HsError) {
        let from = self.conns[k].sock.peer_addr().ok();
        warn!(?from, "tcp: dropping a connection: {e}");
        self.fail_conn(k, libc::EPROTO, "handshake");
    }

    /// Refuses inbound connection `k` with `why`, and closes it.
    fn reject(&mut self, k: usize, why: u32) -> usize {
        let fd = self.conns[k].sock.as_raw_fd();
        let _ = send_small(fd, &Hs::Reject { reason: why }.encode());
        self.remove_conn(k);
        1
    }

    /// An inbound connection claims to be the endpoint listening at `claim.addr`. Keyed, it
    /// must first prove the key (CHALLENGE); either way the claim is then vetted.
    fn on_hello<H: Handler>(&mut self, k: usize, claim: Claim, keyed: bool, h: &mut H) -> usize {
        let from = self.conns[k].from;
        match (&self.auth, keyed) {
            (Some(_), false) => {
                warn!(?from, claimed = %claim.addr, "tcp: refusing a connection without the authentication key this endpoint requires");
                return self.reject(k, reason::AUTH_REQUIRED);
            }
            (None, true) => {
                warn!(?from, claimed = %claim.addr, "tcp: refusing a connection that offers an authentication key: this endpoint has none");
                return self.reject(k, reason::AUTH_UNEXPECTED);
            }
            _ => {}
        }
        self.conns[k].claim = Some(claim);
        let Some(key) = self.auth.clone() else {
            return self.vet(k, h);
        };
        let Some(rand) = hello::random() else {
            warn!("tcp: the OS gives no random challenge; refusing a connection");
            return self.reject(k, reason::AUTH_FAILED);
        };
        let mac = Transcript {
            conn_rand: &claim.rand,
            acc_rand: &rand,
            conn_addr: claim.addr,
            acc_addr: self.local,
            conn_nonce: claim.nonce,
            acc_nonce: self.nonce,
        }
        .mac(&key, Side::Acceptor);
        self.conns[k].rand = rand;
        let m = Hs::Challenge {
            nonce: self.nonce,
            rand,
            mac,
        };
        if self.send_hs(k, &m) {
            self.conns[k].st = St::Proof;
        }
        1
    }

    /// A keyed connector's proof of the key.
    fn on_proof<H: Handler>(&mut self, k: usize, mac: &[u8; hello::MAC], h: &mut H) -> usize {
        let (Some(key), Some(claim)) = (self.auth.as_deref(), self.conns[k].claim) else {
            self.fail_conn(k, libc::EPROTO, "handshake");
            return 1;
        };
        let ok = Transcript {
            conn_rand: &claim.rand,
            acc_rand: &self.conns[k].rand,
            conn_addr: claim.addr,
            acc_addr: self.local,
            conn_nonce: claim.nonce,
            acc_nonce: self.nonce,
        }
        .check(key, Side::Connector, mac);
        if !ok {
            let from = self.conns[k].from;
            warn!(?from, claimed = %claim.addr, "tcp: refusing a connection whose proof of the authentication key does not check (another key?)");
            return self.reject(k, reason::AUTH_FAILED);
        }
        self.vet(k, h)
    }

    /// Checks inbound connection `k`'s claim with a call-back to the address it claims, with
    /// a key as without one: proving the key says the connector is one of the key's holders,
    /// not which one, and a holder claiming another's address (before that one ever
    /// connected) would otherwise receive what is sent to it. A claim to be this very
    /// endpoint is checked here, against our own connections.
    fn vet<H: Handler>(&mut self, k: usize, h: &mut H) -> usize {
        let c = &self.conns[k];
        let (Some(claim), Some(from)) = (c.claim, c.from) else {
            self.fail_conn(k, libc::EPROTO, "handshake");
            return 1;
        };
        if claim.addr == self.local {
            if claim.nonce == self.nonce && self.opened_by_us(from, self.reached(k)) {
                // Our own connection to ourselves: this end receives, the other sends.
                let p = self.peer(claim.addr);
                return self.accept_hello(k, p, false, h);
            }
            warn!(%from, "tcp: refusing a connection that claims to be this endpoint");
            return self.reject(k, reason::UNVERIFIED);
        }
        // Endpoints connect from their names' addresses (`connect_to`): a claim naming another
        // host than the connection comes from is refused before any call-back, so that a
        // stranger can have us dial only listeners of its own host.
        if claim.addr.ip().to_canonical() != from.ip().to_canonical() {
            warn!(%from, claimed = %claim.addr, "tcp: refusing a connection that claims an address of another host than it comes from");
            return self.reject(k, reason::UNVERIFIED);
        }
        // Vetting from here: out of descriptors, silent strangers are dropped first.
        self.conns[k].st = St::Vetting;
        let serial = self.conns[k].serial;
        let mut dialed = self.dial(claim.addr);
        while matches!(&dialed, Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
            && self.evict(None)
        {
            // Out of descriptors: a silent stranger makes room for the call-back.
            dialed = self.dial(claim.addr);
        }
        if self.conns.get(k).is_none_or(|c| c.serial != serial) {
            // Dropped itself to make that room (it was the oldest in bring-up).
            if let Ok(v) = dialed {
                self.remove_conn(v);
            }
            return 1;
        }
        match dialed {
            Ok(v) => {
                self.conns[v].vouch_for = Some((k, serial));
                1
            }
            Err(e) => {
                warn!(%from, claimed = %claim.addr, "tcp: refusing a connection: its claimed address cannot be called back ({e})");
                self.reject(k, reason::UNVERIFIED)
            }
        }
    }

    /// Where inbound connection `k` reached us: the concrete address its peer dialled, also
    /// where we listen on a wildcard (whose port alone would vouch, in `opened_by_us`, for a
    /// connection of the claimant's to any address with that port).
    fn reached(&self, k: usize) -> SocketAddr {
        self.conns[k].sock.local_addr().unwrap_or(self.local)
    }

    /// Whether one of our outbound connections still in its handshake leaves from `src` for
    /// `to`. Both: a connection of ours to a stranger gives the stranger its source port and
    /// our nonce (our HELLO), and the stranger, on our host, can open a connection of its own
    /// from that very port (two connections to different places may share one) and claim to
    /// be us there; the listener asking names where the claim reached it (`reached`), so our
    /// connection to the stranger vouches for nothing but what it reaches.
    fn opened_by_us(&self, src: SocketAddr, to: SocketAddr) -> bool {
        let reaches = |a: SocketAddr| {
            a.port() == to.port() && a.ip().to_canonical() == to.ip().to_canonical()
        };
        self.conns.iter().any(|(_, c)| {
            c.outbound
                && c.vouch_for.is_none()
                && c.st == St::Hello
                && c.sock.local_addr().is_ok_and(|a| a == src)
                && c.sock.peer_addr().is_ok_and(reaches)
        })
    }

    /// A call-back asks whether our incarnation `nonce` opened a connection from `src` to
    /// `to` (where that connection reached the listener asking).
    fn on_verify(&mut self, k: usize, src: SocketAddr, to: SocketAddr, nonce: u64) {
        let yes = nonce == self.nonce && self.opened_by_us(src, to);
        if !yes {
            debug!(%src, "tcp: a call-back asks about a connection this endpoint did not open");
        }
        let fd = self.conns[k].sock.as_raw_fd();
        let _ = send_small(fd, &Hs::Vouch { yes }.encode());
        self.remove_conn(k);
    }

    /// The inbound connection (key, serial) a call-back is for, if it still waits for it:
    /// where it came from and what it claims.
    fn claimant(&self, k: usize, serial: u64) -> Option<(SocketAddr, Claim)> {
        let c = self.conns.get(k)?;
        if c.serial != serial || c.st != St::Vetting {
            return None;
        }
        Some((c.from?, c.claim?))
    }

    /// The answer to call-back `v`.
    fn on_vouch<H: Handler>(&mut self, v: usize, yes: bool, h: &mut H) -> usize {
        let target = self.conns[v].vouch_for;
        self.remove_conn(v);
        let Some((k, serial)) = target else { return 1 };
        let Some((from, claim)) = self.claimant(k, serial) else {
            return 1;
        };
        if yes {
            return self.settle(k, claim, h);
        }
        warn!(%from, claimed = %claim.addr, "tcp: refusing a connection: the address it claims does not vouch for it");
        self.reject(k, reason::UNVERIFIED)
    }

    /// A call-back ended without an answer: its claimant is refused.
    fn unvouched(&mut self, target: (usize, u64), why: &str) {
        if let Some((from, claim)) = self.claimant(target.0, target.1) {
            warn!(%from, claimed = %claim.addr, "tcp: refusing a connection: its call-back failed ({why})");
            self.reject(target.0, reason::UNVERIFIED);
        }
    }

    /// Inbound connection `k`'s claim is proven: it becomes the peer's connection, unless
    /// both connected at once and ours wins.
    fn settle<H: Handler>(&mut self, k: usize, claim: Claim, h: &mut H) -> usize {
        let (addr, nonce) = (claim.addr, claim.nonce);
        let p = match self.by_addr.get(&addr) {
            Some(&p) => p,
            None if self.peers.len() >= MAX_PEERS => {
                warn!(%addr, "tcp: peer table full; refusing a connection");
                return self.reject(k, reason::FULL);
            }
            None => self.peer(addr),
        };
        if let Some(old) = self.peers[p].conn {
            let (out, up) = (self.conns[old].outbound, self.conns[old].st == St::Up);
            // The peer dropped the connection we hold up (we may not have read its FIN yet:
            // we hold it back, or it came just now): its claim is a reconnect, not the other
            // half of a simultaneous connect (whose claimant keeps ours).
            let dropped = up && !established(self.conns[old].sock.as_raw_fd());
            if out && !(up && (self.peers[p].nonce != Some(nonce) || dropped)) {
                // Both connected at once: the connection opened by the lower address wins.
                if self.key < self.peers[p].key {
                    debug!(%addr, "tcp: simultaneous connect; ours wins");
                    return self.reject(k, reason::DUPLICATE);
                }
                debug!(%addr, "tcp: simultaneous connect; theirs wins");
                if up {
                    self.lose_peer(p, libc::ECONNRESET, "replaced");
                } else {
                    // Nothing was written on it: the queue moves to the new connection.
                    self.peers[p].conn = None;
                    self.remove_conn(old);
                }
            } else {
                // A restarted peer, or one that reconnects, proven above: the old
                // connection is dead to it.
                self.lose_peer(p, libc::ECONNRESET, "peer reconnected");
            }
        }
        self.peers[p].nonce = Some(nonce);
        self.accept_hello(k, p, true, h)
    }

    fn accept_hello<H: Handler>(&mut self, k: usize, p: PeerId, sends: bool, h: &mut H) -> usize {
        let fd = self.conns[k].sock.as_raw_fd();
        let ok = send_small(fd, &Hs::Accept { nonce: self.nonce }.encode());
        if !matches!(ok, Ok(true)) {
            warn!(
                peer = p,
                "tcp: cannot answer a HELLO; dropping the connection"
            );
            self.remove_conn(k);
            if self.peers[p].conn.is_none() && !self.peers[p].queue.is_empty() {
                // Its connection failed before it carried anything: no longer waited for
                // (a wait left set would be counted again by the next REJECT, and end a
                // connection that came up meanwhile when it expires).
                self.stop_waiting(p);
                self.connect(p);
            }
            return 1;
        }
        self.conns[k].peer = Some(p);
        if sends {
            self.stop_waiting(p);
            self.peers[p].conn = Some(k);
        }
        self.set_up(k);
        // The loss of the connection this one replaces reaches the engine before any frame of
        // this one: a frame read first would find the old connection's half-arrived body
        // still expected (and its charge still held), and be taken for a second stream.
        let mut n = 1 + self.report(h);
        if sends {
            n += self.flush(p);
        }
        if self.conns.contains(k) {
            n += self.read_frames(k, h);
        }
        n
    }

    /// A keyed acceptor's challenge: its proof checked, ours sent.
    fn on_challenge(&mut self, k: usize, nonce: u64, rand: &[u8; RAND], mac: &[u8; hello::MAC]) {
        let p = self.conns[k].peer;
        let (Some(key), Some(p)) = (self.auth.clone(), p) else {
            self.fail_conn(k, libc::EPROTO, "unexpected CHALLENGE");
            return;
        };
        let t = Transcript {
            conn_rand: &self.conns[k].rand,
            acc_rand: rand,
            conn_addr: self.local,
            acc_addr: self.peers[p].addr,
            conn_nonce: self.nonce,
            acc_nonce: nonce,
        };
        if !t.check(&key, Side::Acceptor, mac) {
            let proof = Hs::Reject {
                reason: reason::AUTH_FAILED,
            };
            let _ = send_small(self.conns[k].sock.as_raw_fd(), &proof.encode());
            warn!(addr = %self.peers[p].addr, "tcp: the peer's proof of the authentication key does not check (another key?)");
            self.fail_conn(k, libc::EACCES, "authentication failed");
            return;
        }
        let mac = t.mac(&key, Side::Connector);
        if self.send_hs(k, &Hs::Proof { mac }) {
            self.conns[k].proved = true;
        }
    }

    fn on_accept<H: Handler>(&mut self, k: usize, nonce: u64, h: &mut H) -> usize {
        let Some(p) = self.conns[k].peer else {
            self.remove_conn(k);
            return 1;
        };
        if self.peers[p].conn != Some(k) {
            self.remove_conn(k);
            return 1;
        }
        if self.auth.is_some() && !self.conns[k].proved {
            warn!(addr = %self.peers[p].addr, "tcp: the peer accepted without proving the authentication key");
            self.fail_conn(k, libc::EACCES, "authentication skipped");
            return 1;
        }
        self.peers[p].nonce = Some(nonce);
        // Ours came up after all: a wait for theirs (an earlier REJECT) is over.
        self.stop_waiting(p);
        self.set_up(k);
        // As in `accept_hello`: a replaced connection's loss first.
        let mut n = 1 + self.report(h) + self.flush(p);
        if self.conns.contains(k) {
            n += self.read_frames(k, h);
        }
        n
    }

    /// Ends our wait for `p`'s own connection (after its REJECT DUPLICATE), if we wait.
    fn stop_waiting(&mut self, p: PeerId) {
        if self.peers[p].wait_until.take().is_some() {
            self.settling -= 1;
        }
    }

    fn on_reject(&mut self, k: usize, why: u32) {
        let p = self.conns[k].peer;
        let ours = p.is_some_and(|p| self.peers[p].conn == Some(k));
        let Some(p) = p.filter(|_| ours) else {
            self.remove_conn(k);
            return;
        };
        let addr = self.peers[p].addr;
        match why {
            reason::DUPLICATE => {
                // The peer's own connection to us wins; wait for it (bounded).
                self.remove_conn(k);
                self.peers[p].conn = None;
                let until = Instant::now() + self.timeout;
                if self.peers[p].wait_until.replace(until).is_none() {
                    self.settling += 1;
                }
            }
            reason::AUTH_REQUIRED => {
                warn!(%addr, "tcp: the peer requires an authentication key; this endpoint has none (XFABRIC_AUTH_KEY, domain_attr->auth_key)");
                self.lose_peer(p, libc::EACCES, "authentication required");
            }
            reason::AUTH_UNEXPECTED => {
                warn!(%addr, "tcp: the peer takes no authentication key; this endpoint has one");
                self.lose_peer(p, libc::EACCES, "peer has no authentication key");
            }
            reason::AUTH_FAILED => {
                warn!(%addr, "tcp: the peer refused our proof of the authentication key (another key?)");
                self.lose_peer(p, libc::EACCES, "authentication failed");
            }
            _ => {
                warn!(%addr, reason = why, "tcp: the peer refused the connection");
                self.lose_peer(p, libc::ECONNREFUSED, "rejected");
            }
        }
    }

    /// Reads what arrived on an established connection and hands whole frames over.
    fn read_frames<H: Handler>(&mut self, k: usize, h: &mut H) -> usize {
        let c = &mut self.conns[k];
        let Some(p) = c.peer else { return 0 };
        if self.peers[p].owes(self.max_owed) {
            // It does not read our answers: read nothing more from it until they are written
            // (its requests stay in its socket); looked at again on every progress call.
            c.waiting = true;
            if c.owed_since.is_none() {
                c.owed_since = Some(crate::clock::coarse_ms());
            }
            return 0;
        }
        c.owed_since = None;
        // Offered again below; consume sets it anew if the head frame still waits.
        c.waiting = false;
        let (n, err) = c.pump(p, &self.peers[p].addr, h);
        if let Some(e) = err {
            self.fail_conn(k, e, "read");
        }
        n
    }

    /// Writes as much of peer `p`'s queue as the socket takes.
    fn flush(&mut self, p: PeerId) -> usize {
        let Some(k) = self.peers[p].conn else {
            return 0;
        };
        if self.conns[k].st != St::Up {
            return 0;
        }
        let fd = self.conns[k].sock.as_raw_fd();
        let mut done = 0;
        loop {
            let peer = &mut self.peers[p];
            let mut v = Iovecs::default();
            for o in peer.queue.iter() {
                v.push_frame(&o.t, o.off);
                if v.cnt == MAX_IOV {
                    break;
                }
            }
            let (cnt, want) = (v.cnt, v.want);
            if cnt == 0 {
                done += self.advance(p, 0);
                self.set_writable(k, false);
                return done;
            }
            // SAFETY: each iovec points at a live Vec we own or at application memory the
            // engine keeps readable until on_sent/on_lost (the Body::Iov contract).
            let n = unsafe { v.sendmsg(fd) };
            if n < 0 {
                match last_errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => {
                        self.set_writable(k, true);
                        return done;
                    }
                    e => {
                        self.lose_peer(p, e, "write");
                        return done + 1;
                    }
                }
            }
            let n = n as usize;
            if n > 0 {
                // The peer reads: a wait for it to take our answers starts again.
                if let Some(t) = self.conns[k].owed_since.as_mut() {
                    *t = crate::clock::coarse_ms();
                }
            }
            done += self.advance(p, n);
            if n < want {
                self.set_writable(k, true);
                return done;
            }
            if self.peers[p].queue.is_empty() {
                self.set_writable(k, false);
                return done;
            }
        }
    }

    /// Accounts `n` more bytes of peer `p`'s queue written; reports finished tokens.
    fn advance(&mut self, p: PeerId, mut n: usize) -> usize {
        let peer = &mut self.peers[p];
        let mut done = 0;
        while let Some(o) = peer.queue.front_mut() {
            let rem = o.len - o.off;
            if n < rem {
                o.off += n;
                peer.queued -= n;
                break;
            }
            n -= rem;
            peer.queued -= rem;
            done += 1;
            let Some(o) = peer.queue.pop_front() else {
                break;
            };
            peer.owed -= usize::from(o.answer);
            peer.owed_bytes -= o.charge;
            if let Some(t) = o.t.token {
                self.reports.push_back(Report::Sent(p, t));
            }
        }
        done
    }

    fn set_writable(&mut self, k: usize, on: bool) {
        if self.parked == Some(k) {
            // Registered again with the interest it needs now.
            self.conns[k].writable = on;
            self.unpark();
            return;
        }
        let c = &mut self.conns[k];
        if c.writable == on {
            return;
        }
        let i = if on {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match self
            .poll
            .registry()
            .reregister(&mut c.sock, Token(k + 1), i)
        {
            Ok(()) => c.writable = on,
            Err(e) => warn!("tcp: epoll_ctl failed: {e}"),
        }
    }

    fn set_up(&mut self, k: usize) {
        if let Some(p) = self.conns[k].peer {
            self.peers[p].redialed = false;
        }
        let c = &mut self.conns[k];
        if c.st != St::Up {
            c.st = St::Up;
            c.claim = None;
            self.settling -= 1;
            if let Some(from) = c.from {
                unsource(&mut self.by_src, from.ip());
            }
        }
        self.last_up = k;
        // Bytes after the handshake message are frames, read through the full buffer.
        if c.rbuf.len() < RBUF {
            let mut b = vec![0u8; RBUF].into_boxed_slice();
            b[..c.re - c.rs].copy_from_slice(&c.rbuf[c.rs..c.re]);
            c.re -= c.rs;
            c.rs = 0;
            c.rbuf = b;
        }
        c.rx = Rx::Head;
    }

    fn remove_conn(&mut self, k: usize) {
        let Some(mut c) = self.conns.try_remove(k) else {
            return;
        };
        if c.st != St::Up {
            self.settling -= 1;
            if let Some(from) = c.from {
                unsource(&mut self.by_src, from.ip());
            }
        }
        if self.parked == Some(k) {
            self.parked = None;
            self.gate.unparked();
        } else {
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
        if c.st == St::Vetting {
            // Its call-back goes with it: a stranger closing (or evicted) while its claim is
            // checked must not leave our connection to the address it named behind, one more
            // each time it comes back.
            let target = Some((k, c.serial));
            let orphans: Vec<usize> = self
                .conns
                .iter()
                .filter(|(_, x)| x.vouch_for == target)
                .map(|(v, _)| v)
                .collect();
            for v in orphans {
                self.remove_conn(v);
            }
        }
    }

    /// A connection failed: its peer is lost if it carried the peer's frames either way.
    fn fail_conn(&mut self, k: usize, e: i32, what: &str) {
        let Some(c) = self.conns.get(k) else { return };
        if let Some(target) = c.vouch_for {
            self.remove_conn(k);
            self.unvouched(target, what);
            return;
        }
        match c.peer {
            Some(p) if c.st == St::Up || self.peers[p].conn == Some(k) => {
                self.lose_peer(p, e, what)
            }
            _ => {
                let from = c.sock.peer_addr().ok();
                warn!(
                    ?from,
                    errno = e,
                    "tcp: dropping a connection in bring-up ({what})"
                );
                self.remove_conn(k);
            }
        }
    }

    /// Peer `p` is gone: every connection to it closes, its queue is dropped, and the
    /// handler hears it once.
    fn lose_peer(&mut self, p: PeerId, e: i32, what: &str) {
        warn!(peer = p, addr = %self.peers[p].addr, errno = e, "tcp: peer lost ({what})");
        let keys: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.peer == Some(p))
            .map(|(k, _)| k)
            .collect();
        for k in keys {
            self.remove_conn(k);
        }
        let peer = &mut self.peers[p];
        peer.conn = None;
        peer.queue.clear();
        peer.queued = 0;
        peer.owed = 0;
        peer.owed_bytes = 0;
        peer.losing += 1;
        peer.redialed = false;
        self.stop_waiting(p);
        self.reports.push_back(Report::Lost(p, e));
    }

    /// Looks at every connection, at most every `LOOK_EVERY_MS`: ends those whose peer
    /// acknowledged none of our data or probes for `dead_after` (`silent_too_long`), those
    /// whose peer sent nothing more of a frame it began for `stall_after`
    /// (a body it announced and never finished holds the receive it matched, and the bytes
    /// charged to it, for as long as the connection lives: a peer that keeps its connection
    /// alive could hold them forever), and takes back the read buffer of those idle since the
    /// last look with nothing in it (64 KiB each: many peers that connected once and went
    /// quiet would otherwise hold it all; the next read makes it again).
    #[inline(never)]
    fn look_at_connections(&mut self, now: u64) -> usize {
        let limit = self
            .stall_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let dead_ms = self
            .dead_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // A failed clock read (u64::MAX) looks again at the next call.
        self.next_look = if now == u64::MAX {
            0
        } else {
            now.saturating_add(self.look_every)
        };
        let mut stalled = Vec::new();
        let mut unread = Vec::new();
        let mut silent = Vec::new();
        for (k, c) in self.conns.iter_mut() {
            if let Some(dead) = dead_ms {
                if c.st == St::Up && silent_too_long(c.sock.as_raw_fd(), dead) {
                    silent.push(k);
                    continue;
                }
            }
            if c.st == St::Up
                && !c.read_lately
                && c.rs == c.re
                && matches!(c.rx, Rx::Head)
                && !c.rbuf.is_empty()
            {
                c.rbuf = Box::default();
                c.rs = 0;
                c.re = 0;
            }
            c.read_lately = false;
            // It reads none of what we owe it, and we read nothing of it meanwhile.
            if let (Some(limit), Some(since)) = (limit, c.owed_since) {
                if now != u64::MAX && c.waiting && now.saturating_sub(since) >= limit {
                    unread.push(k);
                    continue;
                }
            }
            if c.waiting || c.more {
                // We hold back, not the peer.
                c.stalled_since = None;
                c.frame_since = None;
                continue;
            }
            let (Some(limit), Some(since)) = (limit, c.stalled_since) else {
                continue;
            };
            let frame_limit = limit.saturating_mul(FRAME_STALLS);
            let trickled = c
                .frame_since
                .is_some_and(|f| now.saturating_sub(f) >= frame_limit);
            if now != u64::MAX && (now.saturating_sub(since) >= limit || trickled) {
                stalled.push(k);
            }
        }
        let n = stalled.len() + unread.len() + silent.len();
        for k in silent {
            self.fail_conn(
                k,
                libc::ETIMEDOUT,
                "the peer acknowledged nothing for XFABRIC_TCP_DEAD_MS",
            );
        }
        for k in unread {
            self.fail_conn(
                k,
                libc::ETIMEDOUT,
                "the peer stopped reading the answers we owe it",
            );
        }
        for k in stalled {
            self.fail_conn(
                k,
                libc::ETIMEDOUT,
                "the peer stopped in the middle of a frame",
            );
        }
        n
    }

    /// Drops what took too long to come up.
    fn expire(&mut self) -> usize {
        let now = Instant::now();
        let timeout = self.timeout;
        let is_late = |c: &Conn| {
            let limit = if c.st == St::Greet {
                GREET_TIMEOUT.min(timeout)
            } else {
                timeout
            };
            c.st != St::Up && now.duration_since(c.since) >= limit
        };
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| is_late(c))
            .map(|(k, _)| k)
            .collect();
        let mut n = 0;
        for k in late {
            // Failing one connection may have removed another of the list (a call-back
            // failing rejects the connection it checked), and its key may hold a new one by
            // now: each is looked at again.
            let Some(c) = self.conns.get(k).filter(|c| is_late(c)) else {
                continue;
            };
            n += 1;
            if c.st == St::Greet {
                warn!(from = ?c.sock.peer_addr().ok(), "tcp: no HELLO in time; dropping the connection");
            }
            self.fail_conn(k, libc::ETIMEDOUT, "handshake timeout");
        }
        for p in 0..self.peers.len() {
            if self.peers[p].wait_until.is_none_or(|t| now < t) {
                continue;
            }
            n += 1;
            if !self.peers[p].redialed && !self.peers[p].queue.is_empty() {
                // The connection it kept may be one it had dropped, its FIN or RST not yet
                // seen (or lost) when our claim was proven (`settle`): asked once more, it
                // is seen closed by now and replaced.
                self.peers[p].redialed = true;
                self.stop_waiting(p);
                self.connect(p);
                continue;
            }
            self.lose_peer(p, libc::ETIMEDOUT, "its connection never came");
        }
        n
    }
}

/// One inbound connection from `ip` left bring-up.
fn unsource(by_src: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = by_src.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            by_src.remove(&ip);
        }
    }
}

/// The segments of one `sendmsg`: the first `cnt` are set. Left uninitialised past them, as
/// zeroing all `MAX_IOV` (1 KiB) cost more than the rest of a small frame's write.
struct Iovecs {
    iov: [MaybeUninit<libc::iovec>; MAX_IOV],
    cnt: usize,
    want: usize,
}

impl Default for Iovecs {
    fn default() -> Self {
        Iovecs {
            iov: [const { MaybeUninit::uninit() }; MAX_IOV],
            cnt: 0,
            want: 0,
        }
    }
}

impl Iovecs {
    fn push(&mut self, addr: usize, len: usize) {
        if len > 0 && self.cnt < MAX_IOV {
            self.iov[self.cnt] = MaybeUninit::new(libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            });
            self.cnt += 1;
            self.want += len;
        }
    }

    /// The bytes of frame `t` from its byte `off` on (control part, then body), as far as
    /// the segments go.
    fn push_frame(&mut self, t: &Transmit, off: usize) {
        if off == 0 {
            // A frame not yet begun (nearly every one): its parts whole, nothing to slice.
            self.push(t.ctrl.as_ptr() as usize, t.ctrl.len());
            match &t.body {
                Body::Iov(l) => {
                    for s in l.segs() {
                        self.push(s.addr, s.len);
                    }
                }
                b => {
                    if let Some(b) = b.held() {
                        self.push(b.as_ptr() as usize, b.len());
                    }
                }
            }
            return;
        }
        let cl = t.ctrl.len();
        if off < cl {
            self.push(t.ctrl[off..].as_ptr() as usize, cl - off);
        }
        let boff = off.saturating_sub(cl);
        match t.body.held() {
            Some(b) => {
                if boff < b.len() {
                    self.push(b[boff..].as_ptr() as usize, b.len() - boff);
                }
            }
            None => {
                if let Body::Iov(l) = &t.body {
                    for s in l.slice(boff, usize::MAX).segs() {
                        self.push(s.addr, s.len);
                    }
                }
            }
        }
    }

    /// One `sendmsg` of the set segments, without SIGPIPE or blocking: its return value.
    ///
    /// # Safety
    /// Every segment set must be readable for its length.
    unsafe fn sendmsg(&mut self, fd: RawFd) -> isize {
        // SAFETY: all-zero is a valid msghdr; the fields set below describe `iov`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = self.iov.as_mut_ptr().cast();
        msg.msg_iovlen = self.cnt as _;
        // SAFETY: the first `cnt` iovecs are set (`push`), readable as the caller promised.
        unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) }
    }
}

impl Conn {
    fn new(sock: TcpStream, peer: Option<PeerId>, st: St, serial: u64) -> Conn {
        Conn {
            sock,
            peer,
            st,
            outbound: false,
            serial,
            from: None,
            claim: None,
            vouch_for: None,
            // A connection whose challenge the OS cannot make random fails its handshake
            // (all zeros is refused by no check, but a keyed peer's proof binds its own).
            rand: hello::random().unwrap_or_default(),
            proved: false,
            since: Instant::now(),
            rbuf: vec![0u8; 2 * hello::LEN].into_boxed_slice(),
            rs: 0,
            re: 0,
            rx: Rx::Head,
            writable: false,
            big: false,
            waiting: false,
            more: false,
            stalled_since: None,
            frame_since: None,
            frame_fed: 0,
            fed: false,
            read_lately: false,
            owed_since: None,
        }
    }

    /// Reads until the socket is drained or `PUMP_FRAMES` frames were handed to `h` (then
    /// `more` is set); the error (an errno) ends the connection.
    #[inline(never)]
    fn pump<H: Handler>(
        &mut self,
        peer: PeerId,
        addr: &SocketAddr,
        h: &mut H,
    ) -> (usize, Option<i32>) {
        let r = self.pump_frames(peer, addr, h);
        self.note_stall(r.0 > 0);
        r
    }

    /// Keeps `stalled_since` after a read: cleared between frames (the common case of small
    /// messages: no clock is read) and while we hold back ourselves, restarted when bytes of
    /// a partial frame came.
    /// `frame_since` likewise, restarted when a frame was finished (`finished`) or
    /// `FRAME_PROGRESS` bytes came since it was set: a few bytes at a time do not restart it,
    /// and a sender we kept waiting (not reading) brings a socket's worth at our next read.
    #[inline(always)]
    fn note_stall(&mut self, finished: bool) {
        let mid = !matches!(self.rx, Rx::Head) || self.re > self.rs;
        if !mid || self.waiting || self.more {
            self.stalled_since = None;
            self.frame_since = None;
        } else if self.fed || self.stalled_since.is_none() {
            let now = crate::clock::coarse_ms();
            self.stalled_since = Some(now);
            if finished || self.frame_since.is_none() || self.frame_fed >= FRAME_PROGRESS {
                self.frame_since = Some(now);
                self.frame_fed = 0;
            }
        }
        self.fed = false;
    }

    fn pump_frames<H: Handler>(
        &mut self,
        peer: PeerId,
        addr: &SocketAddr,
        h: &mut H,
    ) -> (usize, Option<i32>) {
        let fd = self.sock.as_raw_fd();
        let mut frames = 0;
        self.more = false;
        loop {
            // Between frames with less than a prefix buffered, `consume` would find nothing
            // (the common case of a poll: straight to the read).
            if !matches!(self.rx, Rx::Head) || self.re - self.rs >= PREFIX {
                match self.consume(peer, addr, h) {
                    Ok(n) => frames += n,
                    Err(e) => return (frames, Some(e)),
                }
            }
            if frames >= PUMP_FRAMES && !self.waiting {
                self.more = true;
                return (frames, None);
            }
            if self.waiting {
                // Flow control: what the peer sends stays in the socket (and its sends
                // back up) until the frame at our head is taken.
                return (frames, None);
            }
            let (n, asked) = match self.read_more(fd) {
                Ok(x) => x,
                Err(libc::EINTR) => continue,
                Err(libc::EAGAIN) => return (frames, None),
                Err(e) => return (frames, Some(e)),
            };
            if n == 0 {
                return (frames, Some(libc::ECONNRESET));
            }
            if n < asked {
                // Drained: later bytes raise a new edge.
                return match self.consume(peer, addr, h) {
                    Ok(m) => (frames + m, None),
                    Err(e) => (frames, Some(e)),
                };
            }
        }
    }

    /// One read or readv: the rest of a body's kept part straight into its sink, then the
    /// buffer. Returns (bytes read, bytes asked) or an errno.
    #[inline(always)]
    fn read_more(&mut self, fd: RawFd) -> Result<(usize, usize), i32> {
        if self.rs == self.re {
            self.rs = 0;
            self.re = 0;
            if self.rbuf.len() < RBUF {
                // Given back while the connection was idle (`look_at_connections`).
                self.rbuf = vec![0u8; RBUF].into_boxed_slice();
            }
        } else if RBUF - self.re < PREFIX + MAX_CTRL {
            self.rbuf.copy_within(self.rs..self.re, 0);
            self.re -= self.rs;
            self.rs = 0;
        }
        let head = match &self.rx {
            Rx::Head => true,
            Rx::Body { got, keep, .. } if got < keep => return self.read_into_sink(fd),
            Rx::Body { .. } => false,
        };
        // Only the buffer: one read(2). After a large body the next frame is likely large too
        // (a small read, so that its body goes to its sink); dropping the rest of a body, as
        // much at a time as the buffer takes.
        let tail = if self.big && head { SMALL_READ } else { RBUF }.min(RBUF - self.re);
        let free = &mut self.rbuf[self.re..self.re + tail];
        // SAFETY: free is our buffer's free part, valid for writes of its length.
        let n = unsafe { libc::read(fd, free.as_mut_ptr().cast(), free.len()) };
        if n < 0 {
            return Err(last_errno());
        }
        self.re += n as usize;
        self.fed |= n > 0;
        self.read_lately |= n > 0;
        self.frame_fed = self.frame_fed.saturating_add(n as usize);
        Ok((n as usize, tail))
    }

    /// `read_more` while a body's kept part is coming: one readv, straight into its sink,
    /// then the buffer.
    #[inline(never)]
    fn read_into_sink(&mut self, fd: RawFd) -> Result<(usize, usize), i32> {
        let iov_zero = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [iov_zero; 1 + xfabric_core::rxq::IOV_LIMIT];
        let mut cnt = 0;
        let mut direct = 0usize;
        // The body's kept part straight into its sink, then the buffer.
        if let Rx::Body {
            sink, got, keep, ..
        } = &mut self.rx
        {
            if *got < *keep {
                let (off, len) = (*got as usize, (*keep - *got) as usize);
                match sink {
                    Sink::Discard | Sink::Wait => {}
                    Sink::Buffer(v) => {
                        iov[0] = libc::iovec {
                            iov_base: v[off..].as_mut_ptr().cast(),
                            iov_len: len,
                        };
                        cnt = 1;
                    }
                    Sink::Iov(l) => {
                        for s in l.slice(off, len).segs() {
                            iov[cnt] = libc::iovec {
                                iov_base: s.addr as *mut libc::c_void,
                                iov_len: s.len,
                            };
                            cnt += 1;
                        }
                    }
                }
                direct = len;
            }
        }
        let tail = if self.big { SMALL_READ } else { RBUF }.min(RBUF - self.re);
        iov[cnt] = libc::iovec {
            iov_base: self.rbuf[self.re..].as_mut_ptr().cast(),
            iov_len: tail,
        };
        cnt += 1;
        // SAFETY: the iovecs describe our buffer's free part and the sink's unfilled part:
        // a Vec we hold, or memory the engine keeps writable until on_body (the Sink::Iov
        // contract), not overlapping each other.
        let n = unsafe { libc::readv(fd, iov.as_ptr(), cnt as i32) };
        if n < 0 {
            return Err(last_errno());
        }
        let n = n as usize;
        let into_sink = n.min(direct);
        if let Rx::Body { got, .. } = &mut self.rx {
            *got += into_sink as u64;
        }
        self.re += n - into_sink;
        self.fed |= n > 0;
        self.read_lately |= n > 0;
        self.frame_fed = self.frame_fed.saturating_add(n);
        Ok((n, direct + tail))
    }

    /// Hands over every whole frame the buffer holds and moves buffered body bytes to their
    /// sink. Returns frames finished, or an errno (EPROTO: garbage).
    fn consume<H: Handler>(
        &mut self,
        peer: PeerId,
        addr: &SocketAddr,
        h: &mut H,
    ) -> Result<usize, i32> {
        let mut frames = 0;
        loop {
            if let Rx::Body { p, got, .. } = &self.rx {
                if *got == p.body_len {
                    if let Rx::Body { sink, .. } = std::mem::replace(&mut self.rx, Rx::Head) {
                        h.on_body(peer, sink);
                    }
                    frames += 1;
                    continue;
                }
            }
            let avail = self.re - self.rs;
            let buf = &self.rbuf[self.rs..self.re];
            match &mut self.rx {
                Rx::Head => {
                    if avail < PREFIX {
                        break;
                    }
                    let p = wire::prefix(buf).map_err(|e| {
                        warn!(peer, "tcp: garbage from a peer: {e}");
                        libc::EPROTO
                    })?;
                    let need = PREFIX + p.ctrl_len as usize;
                    if avail < need {
                        break;
                    }
                    // The whole frame is here (small frames usually are): handed over in
                    // one call.
                    if let Some(whole) =
                        (p.body_len <= (avail - need) as u64).then(|| need + p.body_len as usize)
                    {
                        let taken = h
                            .on_frame(peer, addr, &p, &buf[PREFIX..need], &buf[need..whole])
                            .map_err(|e| {
                                warn!(peer, "tcp: refused frame from a peer: {e}");
                                libc::EPROTO
                            })?;
                        self.waiting = !taken;
                        if !taken {
                            break;
                        }
                        self.rs += whole;
                        frames += 1;
                        continue;
                    }
                    let sink = h.on_ctrl(peer, addr, &p, &buf[PREFIX..need]).map_err(|e| {
                        warn!(peer, "tcp: refused frame from a peer: {e}");
                        libc::EPROTO
                    })?;
                    if matches!(sink, Sink::Wait) {
                        self.waiting = true;
                        break;
                    }
                    self.waiting = false;
                    self.rs += need;
                    let keep = match &sink {
                        Sink::Discard | Sink::Wait => 0,
                        Sink::Buffer(v) => v.len() as u64,
                        Sink::Iov(l) => l.total() as u64,
                    }
                    .min(p.body_len);
                    self.big = p.body_len >= LARGE_BODY;
                    self.rx = Rx::Body {
                        p,
                        sink,
                        got: 0,
                        keep,
                    };
                }
                Rx::Body { p, sink, got, keep } => {
                    if avail == 0 {
                        break;
                    }
                    let take = (avail as u64).min(p.body_len - *got) as usize;
                    if *got < *keep {
                        let n = (take as u64).min(*keep - *got) as usize;
                        let off = *got as usize;
                        match sink {
                            Sink::Discard | Sink::Wait => {}
                            Sink::Buffer(v) => v[off..off + n].copy_from_slice(&buf[..n]),
                            // SAFETY: the engine keeps the sink's memory writable until
                            // on_body; it is application memory, not our buffer.
                            Sink::Iov(l) => unsafe {
                                l.copy_in(off, &buf[..n]);
                            },
                        }
                    }
                    *got += take as u64;
                    self.rs += take;
                }
            }
        }
        if self.rs == self.re {
            self.rs = 0;
            self.re = 0;
        }
        Ok(frames)
    }
}
