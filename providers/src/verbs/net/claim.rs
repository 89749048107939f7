//! The side channel's hello, and the proof of the name it claims.
//!
//! A connector's hello names the endpoint it says it is (its listening address): its queue
//! pair then becomes that peer's, so that what arrives on it is that peer's and what we send
//! to that peer may go on it. A claim is not an identity: before an accepted side channel
//! gets a queue pair, the acceptor calls the claimed address back and asks whether a
//! connection of its own, from the address the hello came from, sent a hello with this nonce
//! (a random number the connector drew for it); only a yes makes the claim a peer. A stranger
//! cannot answer for an endpoint it is not, nor guess the nonce of a real one's connection.
//! Until then an accepted connection holds a socket and a few bytes, no queue pair and no
//! registered memory, and at most `MAX_PENDING` of them wait at once.
//!
//! On the wire, every first message on a side channel is `HELLO` bytes: a hello (`MAGIC`) or
//! a call-back's question (`VERIFY_MAGIC`: the source address and the nonce), answered with
//! one byte, `YES` or `NO`, after which the call-back closes.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::super::ib::QpInfo;
use crate::inet;

/// A side channel's first message: magic, version, flags, QP number, PSN, GID, the sender's
/// own name, the hello's nonce.
pub const HELLO: usize = 56;
/// A hello's magic ("XFVB").
pub const MAGIC: u32 = 0x5846_5642;
/// A call-back's question's magic ("XFVV").
pub const VERIFY_MAGIC: u32 = 0x5846_5656;
/// 2: writes with immediate data (the peer's NIC writes and tells), and the flags byte.
/// 3: the nonce, and the call-back that proves the name.
pub const VERSION: u16 = 3;
/// Hello flag: the sender reports remote reads and atomics (`FI_RMA_EVENT`, a remote
/// counter): a peer's NIC must not read or add to its memory unseen.
pub const HELLO_EVENTS: u8 = 1;
/// The call-back's answer: the hello was ours.
pub const YES: u8 = b'Y';
/// The call-back's answer: it was not.
pub const NO: u8 = b'N';
/// Accepted side channels waiting for their hello or its proof, at most (more than the
/// connections an endpoint holds, so that all of them may come at once). Past it the oldest
/// that has not said its hello goes (a real connector says it as soon as it is connected); one
/// being proven never does: with every place taken by those, no more are accepted until one
/// ends (`Claims::room`), the rest waiting in the listener's backlog.
pub const MAX_PENDING: usize = 256;

/// Claims one host may have being proven at once (32 of `MAX_PENDING`): a stranger naming
/// listeners of its own that take the call-back and never answer holds that many places, not
/// every one. Its further claims wait with their hellos read (`Stage::First`, so a newcomer
/// past `MAX_PENDING` may take their place) until one of its host's ends; claims from other
/// hosts are taken in and proven meanwhile, and a burst from one honest host (an endpoint
/// holds up to 170 connections) is proven 32 at a time.
pub const PER_HOST: usize = MAX_PENDING / 8;

/// What a hello says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's queue pair for this connection.
    pub qp: QpInfo,
    /// The sender's listening address: the name it claims.
    pub name: SocketAddr,
    /// `HELLO_EVENTS` or 0.
    pub flags: u8,
    /// Drawn by its sender for this connection (`nonce`).
    pub nonce: u64,
}

impl Hello {
    /// Its `HELLO` bytes.
    pub fn encode(&self) -> [u8; HELLO] {
        let mut h = [0u8; HELLO];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6] = self.flags;
        h[8..12].copy_from_slice(&self.qp.qpn.to_le_bytes());
        h[12..16].copy_from_slice(&self.qp.psn.to_le_bytes());
        h[16..32].copy_from_slice(&self.qp.gid);
        put_addr(&mut h[32..48], &self.name);
        h[48..56].copy_from_slice(&self.nonce.to_le_bytes());
        h
    }

    /// Parses a hello; what is not one, from another version, or names no address is refused.
    pub fn parse(h: &[u8]) -> Result<Hello, &'static str> {
        if h.len() != HELLO || u32_at(h, 0) != MAGIC {
            return Err("side channel: not an xfabric verbs hello");
        }
        if u16::from_le_bytes([h[4], h[5]]) != VERSION {
            return Err("side channel: unknown version");
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&h[16..32]);
        let name = inet::decode(&h[32..48]).map_err(|_| "side channel: bad name")?;
        // An endpoint's name is its NIC's address, whose RoCE v2 GID is that address mapped
        // (`ib::open_one`, the provider's `src_addr` rule): a GID naming another address
        // would point our queue pair's traffic at whatever host it names.
        if gid != gid_of(&name) {
            return Err("side channel: the GID is not the name's address");
        }
        Ok(Hello {
            qp: QpInfo {
                qpn: u32_at(h, 8) & 0xff_ffff,
                psn: u32_at(h, 12) & 0xff_ffff,
                gid,
            },
            name,
            flags: h[6],
            nonce: u64::from_le_bytes(h[48..56].try_into().expect("8 bytes")),
        })
    }
}

/// The RoCE v2 GID of the address of `name`: IPv4-mapped (all zero for an IPv6 name, which
/// no verbs endpoint here has).
pub fn gid_of(name: &SocketAddr) -> [u8; 16] {
    match name.ip() {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(_) => [0; 16],
    }
}

/// The call-back's question: did a connection of yours from `src` send a hello with `nonce`?
pub fn verify_msg(src: &SocketAddr, nonce: u64) -> [u8; HELLO] {
    let mut v = [0u8; HELLO];
    v[0..4].copy_from_slice(&VERIFY_MAGIC.to_le_bytes());
    v[4..6].copy_from_slice(&VERSION.to_le_bytes());
    v[8..16].copy_from_slice(&nonce.to_le_bytes());
    put_addr(&mut v[16..32], src);
    v
}

fn parse_verify(v: &[u8]) -> Option<(SocketAddr, u64)> {
    if v.len() != HELLO
        || u32_at(v, 0) != VERIFY_MAGIC
        || u16::from_le_bytes([v[4], v[5]]) != VERSION
    {
        return None;
    }
    let src = inet::decode(&v[16..32]).ok()?;
    Some((src, u64::from_le_bytes(v[8..16].try_into().ok()?)))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// An address into a 16-byte field (IPv4, as RoCE v2's GIDs are: a longer encoding is cut,
/// and then does not parse back, so such a name is refused rather than taken for another).
fn put_addr(out: &mut [u8], a: &SocketAddr) {
    let e = inet::encode(a);
    let n = e.len().min(out.len());
    out[..n].copy_from_slice(&e[..n]);
}

/// A fresh nonce from the OS's CSPRNG; `None` when it gives none (the connection is then not
/// made rather than made with a guessable one).
pub fn nonce() -> Option<u64> {
    getrandom::u64().ok()
}

impl Pending {
    fn first(&self) -> bool {
        matches!(self.stage, Stage::First)
    }

    /// Its hello read whole, it waits its host's turn to be proven (`PER_HOST`).
    fn waits_turn(&self) -> bool {
        self.first() && self.got.len() == HELLO
    }
}

/// An accepted side channel whose claim is not yet proven.
struct Pending {
    stream: TcpStream,
    /// The host it comes from (its share of the places: `PER_HOST`).
    host: IpAddr,
    /// Its first message so far.
    got: Vec<u8>,
    /// When it was accepted (which goes first at `MAX_PENDING`).
    born: Instant,
    /// When it last moved (bytes of its hello, the call-back connected, its question asked):
    /// the time limit runs from here, so a slow side loses nothing it has done.
    moved: Instant,
    stage: Stage,
}

enum Stage {
    /// Its first message is awaited (or, read whole, its host's share of claims being
    /// proven: `PER_HOST`).
    First,
    /// It said `hello`; our call-back to the name it claims (connecting until `asked`)
    /// awaits the answer.
    Proving {
        hello: Hello,
        back: TcpStream,
        asked: bool,
    },
}

/// Accepted side channels until their claims are proven (or they answered a call-back).
pub struct Claims {
    pending: Vec<Pending>,
    /// How long one may stay without moving (`Pending::moved`).
    limit: Duration,
    /// `MAX_PENDING` (fewer in tests).
    max: usize,
    /// `PER_HOST` (other values in tests).
    per_host: usize,
}

/// Why a pending side channel went.
enum Verdict {
    Wait,
    Drop(&'static str),
    /// Answered a call-back: closes, no claim made.
    Answered,
    Proven,
}

impl Claims {
    /// None pending; each may stay `limit` without moving.
    pub fn new(limit: Duration) -> Claims {
        Claims {
            pending: Vec::new(),
            limit,
            max: MAX_PENDING,
            per_host: PER_HOST,
        }
    }

    /// Side channels pending.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether a connection may be accepted now: a place is free, or one that has not said
    /// its hello can be given up for it.
    pub fn room(&self) -> bool {
        self.pending.len() < self.max || self.pending.iter().any(|p| p.first())
    }

    /// A connection just accepted (non-blocking); past `MAX_PENDING`, in place of the oldest
    /// that has said nothing, or else the oldest that has not finished its hello or waits for
    /// its host's share (none being proven: `room` said whether there is one).
    pub fn add(&mut self, stream: TcpStream) {
        let Ok(from) = stream.peer_addr() else {
            // Gone already (reset between the accept and here).
            return;
        };
        if self.pending.len() >= self.max {
            // The oldest that said nothing, or else the oldest with part of its hello, or
            // else the oldest of those waiting their host's turn of the host holding the
            // most places (a stranger's partial hellos cannot push out honest claims that
            // wait behind their host's share while it holds more places than they do).
            let oldest = |of: &dyn Fn(&Pending) -> bool| {
                self.pending
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.first() && of(p))
                    .min_by_key(|(_, p)| p.born)
                    .map(|(i, _)| i)
            };
            let mut held: HashMap<IpAddr, usize> = HashMap::new();
            for p in &self.pending {
                *held.entry(p.host).or_default() += 1;
            }
            let most = self
                .pending
                .iter()
                .filter(|p| p.first())
                .max_by_key(|p| held[&p.host])
                .map(|p| p.host);
            let Some(i) = oldest(&|p| p.got.is_empty())
                .or_else(|| oldest(&|p| p.got.len() < HELLO))
                .or_else(|| oldest(&|p| Some(p.host) == most))
            else {
                debug!("verbs: every side channel pending is being proven; refusing another");
                return;
            };
            debug!("verbs: too many side channels pending; dropping the oldest silent one");
            self.pending.swap_remove(i);
        }
        let host = from.ip().to_canonical();
        let now = Instant::now();
        self.pending.push(Pending {
            stream,
            host,
            got: Vec::with_capacity(HELLO),
            born: now,
            moved: now,
            stage: Stage::First,
        });
    }

    /// The descriptors a sleeping progress thread waits on for these.
    pub fn fds(&self, out: &mut Vec<(i32, i16)>) {
        for p in &self.pending {
            match &p.stage {
                // Its hello read whole, it waits its host's turn: nothing more is read from
                // it (bytes or an end coming would wake a sleeper again and again).
                Stage::First if p.waits_turn() => {}
                Stage::First => out.push((p.stream.as_raw_fd(), libc::POLLIN)),
                Stage::Proving { back, asked, .. } => {
                    let ev = if *asked { libc::POLLIN } else { libc::POLLOUT };
                    out.push((back.as_raw_fd(), ev));
                }
            }
        }
    }

    /// Whether a claim of the same host as `i`'s, older than it, waits its host's turn with
    /// its hello read whole.
    fn older_waiting(&self, i: usize) -> bool {
        let me = &self.pending[i];
        self.pending
            .iter()
            .any(|p| p.host == me.host && p.born < me.born && p.waits_turn())
    }

    /// Advances every pending side channel. `vouch(src, nonce)`: whether a connection of
    /// ours from `src` sent a hello with `nonce` (a call-back's question). Returns the side
    /// channels proven, with their hellos, and how many changed.
    pub fn poll(
        &mut self,
        vouch: impl Fn(&SocketAddr, u64) -> bool,
    ) -> (Vec<(TcpStream, Hello)>, usize) {
        let mut proven = Vec::new();
        let mut changed = 0;
        // Claims being proven, per host (kept as they start and end in this look).
        let mut proving: HashMap<IpAddr, usize> = HashMap::new();
        for p in self.pending.iter().filter(|p| !p.first()) {
            *proving.entry(p.host).or_default() += 1;
        }
        // Claims being proven first: those that end free their host's share for the claims
        // waiting for it, in the same look.
        for firsts in [false, true] {
            let mut i = 0;
            while i < self.pending.len() {
                if self.pending[i].first() != firsts {
                    i += 1;
                    continue;
                }
                let host = self.pending[i].host;
                // Its host's turns go to its oldest claims first.
                let may_prove = proving.get(&host).copied().unwrap_or(0) < self.per_host
                    && !self.older_waiting(i);
                let v = match step(&mut self.pending[i], &vouch, may_prove) {
                    Verdict::Wait if self.pending[i].moved.elapsed() > self.limit => {
                        Verdict::Drop("side channel: the hello or its proof took too long")
                    }
                    v => v,
                };
                let ends = !matches!(v, Verdict::Wait);
                if ends && !firsts {
                    if let Some(n) = proving.get_mut(&host) {
                        *n = n.saturating_sub(1);
                    }
                } else if !ends && firsts && !self.pending[i].first() {
                    *proving.entry(host).or_default() += 1;
                }
                match v {
                    Verdict::Wait => i += 1,
                    Verdict::Drop(why) => {
                        let p = self.pending.swap_remove(i);
                        warn!(from = ?p.stream.peer_addr().ok(), "verbs: {why}");
                        changed += 1;
                    }
                    Verdict::Answered => {
                        self.pending.swap_remove(i);
                        changed += 1;
                    }
                    Verdict::Proven => {
                        let p = self.pending.swap_remove(i);
                        let Stage::Proving { hello, .. } = p.stage else {
                            unreachable!("proven only while proving")
                        };
                        debug!(name = %hello.name, "verbs: a side channel's claim proven");
                        proven.push((p.stream, hello));
                        changed += 1;
                    }
                }
            }
        }
        (proven, changed)
    }
}

/// One pending side channel's next step. `may_prove`: its host has fewer than its share of
/// claims being proven (`PER_HOST`); if not, a hello read whole waits.
fn step(p: &mut Pending, vouch: &impl Fn(&SocketAddr, u64) -> bool, may_prove: bool) -> Verdict {
    match &mut p.stage {
        Stage::First => {
            if p.got.len() < HELLO {
                let mut tmp = [0u8; HELLO];
                let want = HELLO - p.got.len();
                match p.stream.read(&mut tmp[..want]) {
                    Ok(0) => return Verdict::Drop("side channel closed before its hello"),
                    Ok(k) => {
                        p.got.extend_from_slice(&tmp[..k]);
                        p.moved = Instant::now();
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Verdict::Wait,
                    Err(_) => return Verdict::Drop("side channel failed before its hello"),
                }
                if p.got.len() < HELLO {
                    return Verdict::Wait;
                }
            }
            if let Some((src, nonce)) = parse_verify(&p.got) {
                let yes = vouch(&src, nonce);
                // One byte into a fresh connection's empty socket buffer.
                let _ = p.stream.write(&[if yes { YES } else { NO }]);
                return Verdict::Answered;
            }
            let hello = match Hello::parse(&p.got) {
                Ok(h) => h,
                Err(why) => return Verdict::Drop(why),
            };
            if !may_prove {
                // Its host has its share being proven: this one waits its turn.
                return Verdict::Wait;
            }
            // An endpoint connects from its name's address (`inet::connect_from`): a claim
            // from elsewhere is no endpoint's, and is not called back (a stranger cannot
            // have us dial hosts other than its own).
            match p.stream.peer_addr() {
                Ok(src) if src.ip() == hello.name.ip() => {}
                Ok(_) => return Verdict::Drop("side channel: a hello naming another host"),
                Err(_) => return Verdict::Drop("side channel closed"),
            }
            // The call-back, non-blocking: its outcome is seen on later steps.
            let back = match mio::net::TcpStream::connect(hello.name) {
                // SAFETY: the descriptor moves from mio's stream, which gives it up.
                Ok(s) => unsafe { TcpStream::from_raw_fd(s.into_raw_fd()) },
                Err(_) => return Verdict::Drop("side channel: cannot call the claimed name back"),
            };
            // The time limit runs from the call-back: waiting its host's turn took none of it.
            p.moved = Instant::now();
            p.stage = Stage::Proving {
                hello,
                back,
                asked: false,
            };
            Verdict::Wait
        }
        Stage::Proving { hello, back, asked } => {
            if !*asked {
                match back.take_error() {
                    Ok(None) => {}
                    _ => return Verdict::Drop("side channel: the claimed name does not answer"),
                }
                match back.peer_addr() {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::NotConnected => return Verdict::Wait,
                    Err(_) => {
                        return Verdict::Drop("side channel: the claimed name does not answer")
                    }
                }
                let Ok(src) = p.stream.peer_addr() else {
                    return Verdict::Drop("side channel closed");
                };
                let q = verify_msg(&src, hello.nonce);
                // Into a fresh connection's empty socket buffer: written whole at once.
                if back.write(&q).ok() != Some(HELLO) {
                    return Verdict::Drop("side channel: cannot ask the claimed name");
                }
                *asked = true;
                p.moved = Instant::now();
            }
            let mut b = [0u8; 1];
            match back.read(&mut b) {
                Ok(1) if b[0] == YES => Verdict::Proven,
                Ok(1) => Verdict::Drop("side channel: the claimed name says the hello is not its"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Verdict::Wait,
                _ => Verdict::Drop("side channel: the claimed name did not answer"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn hello(qpn: u32, name: &SocketAddr, nonce: u64) -> Hello {
        Hello {
            qp: QpInfo {
                qpn,
                psn: 7,
                gid: gid_of(name),
            },
            name: *name,
            flags: HELLO_EVENTS,
            nonce,
        }
    }

    #[test]
    fn hello_round_trip_and_hostile_ones() {
        let name: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let h = hello(0x1234, &name, 0x0102_0304_0506_0708);
        assert_eq!(Hello::parse(&h.encode()), Ok(h));
        // A QP number wider than 24 bits is cut to what the wire can name.
        assert_eq!(
            Hello::parse(&hello(u32::MAX, &name, 1).encode())
                .unwrap()
                .qp
                .qpn,
            0xff_ffff
        );
        let good = hello(1, &name, 1).encode();
        let mut bad = good;
        bad[0] ^= 1;
        assert!(Hello::parse(&bad).is_err());
        let mut bad = good;
        bad[4] = 2;
        assert!(Hello::parse(&bad).is_err(), "the version before the nonce");
        let mut bad = good;
        bad[32..48].fill(0xff);
        assert!(Hello::parse(&bad).is_err());
        // A GID of another address than the name's: our traffic would go there.
        let mut bad = good;
        bad[16..32].copy_from_slice(&gid_of(&"198.51.100.7:4000".parse().unwrap()));
        assert!(Hello::parse(&bad).is_err(), "a GID not the name's");
        assert!(Hello::parse(&good[..HELLO - 1]).is_err());
        assert!(Hello::parse(&[]).is_err());
        // A question is not a hello, nor a hello a question.
        let q = verify_msg(&name, 9);
        assert!(Hello::parse(&q).is_err());
        assert_eq!(parse_verify(&q), Some((name, 9)));
        assert_eq!(parse_verify(&good), None);
    }

    const LIMIT: Duration = Duration::from_secs(10);

    /// An endpoint's side of the exchange: its listener and its claims, and the hellos its
    /// own connections sent (source address, nonce), which it vouches for.
    struct Side {
        l: TcpListener,
        claims: Claims,
        mine: Vec<(SocketAddr, u64)>,
        proven: Vec<Hello>,
        accepted: usize,
    }

    impl Side {
        fn new(limit: Duration) -> Side {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            Side {
                l,
                claims: Claims::new(limit),
                mine: Vec::new(),
                proven: Vec::new(),
                accepted: 0,
            }
        }

        fn name(&self) -> SocketAddr {
            self.l.local_addr().unwrap()
        }

        /// Dials `to` and says a hello naming `name` (ours, or another's), with a fresh
        /// nonce; remembered as ours (vouched for) when `ours`.
        fn dial(&mut self, to: SocketAddr, name: SocketAddr, ours: bool) -> TcpStream {
            let mut s = TcpStream::connect(to).unwrap();
            let n = nonce().unwrap();
            s.write_all(&hello(5, &name, n).encode()).unwrap();
            if ours {
                self.mine.push((s.local_addr().unwrap(), n));
            }
            s
        }

        /// Accepts as `Net::accept` does (while there is room), then advances the claims.
        fn step(&mut self) {
            while self.claims.room() {
                let Ok((s, _)) = self.l.accept() else { break };
                s.set_nonblocking(true).unwrap();
                self.claims.add(s);
                self.accepted += 1;
            }
            let mine = self.mine.clone();
            let (p, _) = self
                .claims
                .poll(|src, n| mine.iter().any(|m| m == &(*src, n)));
            self.proven.extend(p.into_iter().map(|(_, h)| h));
        }
    }

    /// A connection to `to` from `ip`, once connected, and its source address.
    fn connected_from(ip: IpAddr, to: SocketAddr) -> (TcpStream, SocketAddr) {
        let s = crate::inet::connect_from(ip, to).unwrap();
        let start = Instant::now();
        loop {
            match s.local_addr() {
                Ok(src) if s.peer_addr().is_ok() => return (s, src),
                _ => assert!(start.elapsed() < LIMIT, "never connected"),
            }
            std::thread::yield_now();
        }
    }

    /// `n` claims to `a` from 127.0.0.1 naming a listener that takes the call-back and never
    /// answers; the listener and the claims' connections.
    fn mute_claims(a: &Side, n: usize) -> (TcpListener, Vec<TcpStream>) {
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = mute.local_addr().unwrap();
        let claims = (0..n as u64)
            .map(|i| {
                let mut s = TcpStream::connect(a.name()).unwrap();
                s.write_all(&hello(1, &at, i).encode()).unwrap();
                s
            })
            .collect();
        (mute, claims)
    }

    fn run(sides: &mut [&mut Side], until: impl Fn(&[&mut Side]) -> bool) {
        let start = Instant::now();
        while !until(sides) {
            for s in sides.iter_mut() {
                s.step();
            }
            assert!(start.elapsed() < LIMIT, "never settled");
            std::thread::yield_now();
        }
    }

    /// A real connector's hello is proven by calling its listener back; a stranger's claim to
    /// be it is called back the same way and refused; neither ever got a queue pair before.
    #[test]
    fn a_real_connector_is_proven_and_a_stranger_claiming_it_is_not() {
        let (mut a, mut b) = (Side::new(LIMIT), Side::new(LIMIT));
        let _real = b.dial(a.name(), b.name(), true);
        run(&mut [&mut a, &mut b], |s| s[0].proven.len() == 1);
        assert_eq!(a.proven[0].name, b.name());
        assert_eq!(b.claims.len(), 0, "the call-back answered and closed");
        // A stranger (here, any socket) claims b's name with a nonce of its own.
        let mut stranger = Side::new(LIMIT);
        let bname = b.name();
        let _fake = stranger.dial(a.name(), bname, false);
        run(&mut [&mut a, &mut b], |s| {
            s[0].accepted == 2 && s[0].claims.is_empty()
        });
        assert_eq!(a.proven.len(), 1, "the stranger's claim was not taken");
        // Nor does a real connection's nonce, replayed from another connection, pass.
        let (src, n) = b.mine[0];
        let mut replay = TcpStream::connect(a.name()).unwrap();
        replay.write_all(&hello(5, &bname, n).encode()).unwrap();
        assert_ne!(replay.local_addr().unwrap(), src);
        run(&mut [&mut a, &mut b], |s| {
            s[0].accepted == 3 && s[0].claims.is_empty()
        });
        assert_eq!(a.proven.len(), 1, "the replayed nonce was not taken");
    }

    /// Claims that cannot be proven go: a name nobody listens at, a name whose listener never
    /// answers (by the time limit), garbage, a closed connection.
    #[test]
    fn unprovable_claims_go() {
        let limit = Duration::from_millis(300);
        let mut a = Side::new(limit);
        let nobody = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s1 = TcpStream::connect(a.name()).unwrap();
        s1.write_all(&hello(1, &nobody, 1).encode()).unwrap();
        let mut s2 = TcpStream::connect(a.name()).unwrap();
        s2.write_all(&hello(1, &mute.local_addr().unwrap(), 2).encode())
            .unwrap();
        let mut s3 = TcpStream::connect(a.name()).unwrap();
        s3.write_all(&[0x5a; HELLO]).unwrap();
        let s4 = TcpStream::connect(a.name()).unwrap();
        drop(s4);
        run(&mut [&mut a], |s| {
            s[0].accepted == 4 && s[0].claims.is_empty()
        });
        assert!(a.proven.is_empty());
    }

    /// A hello naming an address on another host than the one it came from is refused at
    /// once, and that address is not called back; an endpoint connects from its name's
    /// address (`inet::connect_from`), whatever the route, so its claims pass.
    #[test]
    fn a_claim_from_another_host_is_not_called_back() {
        let mut a = Side::new(LIMIT);
        // 127.0.0.2 stands for another host (the whole of 127/8 is this machine's loopback).
        let elsewhere = TcpListener::bind("127.0.0.2:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let named = elsewhere.local_addr().unwrap();
        let mut s = TcpStream::connect(a.name()).unwrap();
        assert_eq!(s.local_addr().unwrap().ip(), a.name().ip());
        s.write_all(&hello(1, &named, 1).encode()).unwrap();
        run(&mut [&mut a], |s| {
            s[0].accepted == 1 && s[0].claims.is_empty()
        });
        assert!(a.proven.is_empty());
        assert!(
            elsewhere.accept().is_err(),
            "the claimed address was called back"
        );
        // From that address, the same claim is called back (and proven by its answer).
        let mut b = Side {
            l: elsewhere,
            ..Side::new(LIMIT)
        };
        let (real, src) = connected_from(named.ip(), a.name());
        assert_eq!(src.ip(), named.ip());
        (&real).write_all(&hello(1, &named, 7).encode()).unwrap();
        b.mine.push((src, 7));
        run(&mut [&mut a, &mut b], |s| s[0].proven.len() == 1);
    }

    /// A flood of silent connections stays within the bound, each new one in place of the
    /// oldest silent one, and a real connector behind it is still proven. Claims being proven
    /// are never given up for newcomers: with every place theirs, no more is accepted (the
    /// rest wait in the backlog) until they end.
    #[test]
    fn floods_stay_bounded_and_claims_being_proven_keep_their_place() {
        const MAX: usize = 8;
        // No claim ends by time while the assertions look (however slow the machine); the
        // limit is taken to zero at the end, to see them go.
        let (mut a, mut b) = (Side::new(LIMIT), Side::new(LIMIT));
        // Every connection here comes from one host: its share is the whole (the shares
        // have their own test).
        a.claims.max = MAX;
        a.claims.per_host = MAX;
        let mut silent = Vec::new();
        for _ in 0..4 {
            silent.extend((0..MAX).map(|_| TcpStream::connect(a.name()).unwrap()));
            a.step();
            assert!(a.claims.len() <= MAX, "{} pending", a.claims.len());
        }
        let _real = b.dial(a.name(), b.name(), true);
        run(&mut [&mut a, &mut b], |s| s[0].proven.len() == 1);
        drop(silent);
        // Claims that wait on a listener that never answers, filling every place.
        let (_mute, waiting) = mute_claims(&a, MAX);
        let start = Instant::now();
        while a.claims.len() < MAX || a.claims.pending.iter().any(Pending::first) {
            a.step();
            assert!(
                start.elapsed() < LIMIT,
                "the claims never all reached their proof"
            );
        }
        assert!(!a.claims.room());
        let before = a.accepted;
        let _late = TcpStream::connect(a.name()).unwrap();
        for _ in 0..100 {
            a.step();
        }
        assert!(
            a.accepted == before && a.claims.len() == MAX,
            "a claim being proven was given up ({} accepted, {} pending)",
            a.accepted - before,
            a.claims.len()
        );
        // Offered one anyway, the claims refuse it rather than give up one of theirs.
        let (late, _) = a.l.accept().unwrap();
        late.set_nonblocking(true).unwrap();
        a.claims.add(late);
        assert_eq!(a.claims.len(), MAX);
        assert!(
            !a.claims.pending.iter().any(Pending::first),
            "the newcomer took a place"
        );
        // They end by the time limit; then a newcomer is taken.
        a.claims.limit = Duration::ZERO;
        let _later = TcpStream::connect(a.name()).unwrap();
        run(&mut [&mut a], |s| s[0].accepted == before + 1);
        drop(waiting);
    }

    /// One host has at most its share of claims being proven (`PER_HOST`): a stranger whose
    /// claims name listeners of its own that take the call-back and never answer holds that
    /// many places; its other claims wait with their hellos read, and a newcomer from another
    /// host takes a waiting one's place when every place is taken, and is proven.
    #[test]
    fn one_hosts_claims_being_proven_hold_only_its_share() {
        const MAX: usize = 8;
        const SHARE: usize = 2;
        let mut a = Side::new(LIMIT);
        a.claims.max = MAX;
        a.claims.per_host = SHARE;
        let (_mute, waiting) = mute_claims(&a, MAX);
        let proving = |a: &Side| a.claims.pending.iter().filter(|p| !p.first()).count();
        let read = |a: &Side| a.claims.pending.iter().all(|p| p.got.len() == HELLO);
        let start = Instant::now();
        while a.accepted < MAX || !read(&a) || proving(&a) < SHARE {
            a.step();
            assert!(
                start.elapsed() < LIMIT,
                "the stranger's claims never settled"
            );
        }
        for _ in 0..100 {
            a.step();
        }
        assert_eq!(a.claims.len(), MAX);
        assert_eq!(
            proving(&a),
            SHARE,
            "one host has more claims being proven than its share"
        );
        // Those waiting their turn are not polled (nothing more is read from them).
        let mut fds = Vec::new();
        a.claims.fds(&mut fds);
        let parked: Vec<i32> = a
            .claims
            .pending
            .iter()
            .filter(|p| p.first())
            .map(|p| p.stream.as_raw_fd())
            .collect();
        assert_eq!(parked.len(), MAX - SHARE);
        assert!(fds.iter().all(|(fd, _)| !parked.contains(fd)));
        // A real connector on another host (127.0.0.2: the whole of 127/8 is this machine's
        // loopback), connecting from its name's address: every place is taken, and it takes
        // the place of one of the stranger's waiting claims.
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let mut b = Side {
            l,
            ..Side::new(LIMIT)
        };
        let named = b.name();
        let (real, src) = connected_from(named.ip(), a.name());
        (&real).write_all(&hello(1, &named, 9).encode()).unwrap();
        b.mine.push((src, 9));
        run(&mut [&mut a, &mut b], |s| s[0].proven.len() == 1);
        assert_eq!(a.proven[0].name, named);
        assert_eq!(proving(&a), SHARE);
        drop(waiting);
    }

    /// A burst of real claims from one host, more than its share: they are proven a share at
    /// a time, every one of them.
    #[test]
    fn a_burst_from_one_host_is_proven_a_share_at_a_time() {
        let (mut a, mut b) = (Side::new(LIMIT), Side::new(LIMIT));
        a.claims.per_host = 2;
        let name = b.name();
        let _real: Vec<TcpStream> = (0..7).map(|_| b.dial(a.name(), name, true)).collect();
        run(&mut [&mut a, &mut b], |s| {
            assert!(s[0].claims.pending.iter().filter(|p| !p.first()).count() <= 2);
            s[0].proven.len() == 7
        });
    }

    /// Past every place, a newcomer takes the place of a claim that said nothing or part of
    /// its hello before one waiting its host's turn, and of those, one of the host holding
    /// the most places: a stranger's partial hellos do not push out an honest host's claims.
    #[test]
    fn partial_hellos_do_not_push_out_claims_waiting_their_turn() {
        const MAX: usize = 8;
        let mut a = Side::new(LIMIT);
        a.claims.max = MAX;
        a.claims.per_host = 1;
        // An honest host (127.0.0.2) with three claims: one being proven (its listener does
        // not answer yet: never stepped), two waiting their turn.
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        let named = l.local_addr().unwrap();
        let honest: Vec<TcpStream> = (0..3u64)
            .map(|i| {
                let (s, _) = connected_from(named.ip(), a.name());
                (&s).write_all(&hello(1, &named, i).encode()).unwrap();
                s
            })
            .collect();
        let start = Instant::now();
        while a.accepted < 3 || a.claims.pending.iter().any(|p| p.got.len() < HELLO) {
            a.step();
            assert!(start.elapsed() < LIMIT, "the honest claims never read");
        }
        let host2: IpAddr = named.ip();
        let honest_left = |a: &Side| a.claims.pending.iter().filter(|p| p.host == host2).count();
        assert_eq!(honest_left(&a), 3);
        // A stranger on 127.0.0.1 fills every place with one byte of a hello each, and goes
        // on connecting.
        let mut partial = Vec::new();
        for _ in 0..3 * MAX {
            let mut s = TcpStream::connect(a.name()).unwrap();
            s.write_all(&[0x58]).unwrap();
            partial.push(s);
            let start = Instant::now();
            let before = a.accepted;
            while a.accepted == before || a.claims.pending.iter().any(|p| p.got.is_empty()) {
                a.step();
                assert!(start.elapsed() < LIMIT, "a partial hello never read");
            }
        }
        assert_eq!(a.claims.len(), MAX);
        assert_eq!(
            honest_left(&a),
            3,
            "a partial hello took an honest claim's place"
        );
        drop((honest, partial, l));
    }
}
