//! Two (or more) Nets in one process, joined over loopback. Every wait is a progress loop
//! bounded by `LIMIT`, failing with a message, never a sleep that must be long enough.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::time::{Duration, Instant};

use xfabric_core::rdm::wire::{Frame, Prefix, WireError};
use xfabric_core::rdm::{Body, PeerId, Sink, Transmit};
use xfabric_core::IovList;

use super::hello::{self, Hs};
use super::{Handler, Net, PeerName, St};

const LIMIT: Duration = Duration::from_secs(10);

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// How a test handler answers `on_ctrl`.
#[derive(Clone, Copy, Default, PartialEq)]
enum Mode {
    /// A buffer of the body's length.
    #[default]
    Buffer,
    Discard,
    /// Raw memory of `min(body, cap)` bytes (owned by the handler until on_body).
    Iov {
        cap: usize,
    },
    /// Flow control: `Sink::Wait` to every offer while `Rec::held` is set, then a buffer.
    Hold,
}

#[derive(Default)]
struct Rec {
    mode: Mode,
    /// (peer, frame id, body length announced, body bytes kept).
    got: Vec<(PeerId, u32, u64, Vec<u8>)>,
    /// Control parts seen and not yet finished by on_body.
    open: VecDeque<(u32, u64)>,
    /// Memory handed out as Sink::Iov, in order.
    iov_mem: VecDeque<Vec<u8>>,
    sent: Vec<(PeerId, u64)>,
    lost: Vec<(PeerId, i32)>,
    /// With `Mode::Hold`: answer `Wait`, counting the offers in `offers`.
    held: bool,
    offers: usize,
    /// Losses and control parts in the order they came: ("lost", peer) and ("ctrl", id).
    events: Vec<(&'static str, u64)>,
}

impl Rec {
    /// Flow control from the start: every offer answered `Sink::Wait` until `held` is unset.
    fn holding() -> Rec {
        Rec {
            mode: Mode::Hold,
            held: true,
            ..Rec::default()
        }
    }

    /// Frames 0, 1, ... arrived, in order, each with its body.
    fn assert_got_in_order(&self, bodies: &[Vec<u8>]) {
        for (i, (_, id, _, bytes)) in self.got.iter().enumerate() {
            assert_eq!(*id as usize, i);
            assert!(*bytes == bodies[i], "frame {i}'s bytes");
        }
    }
}

impl Handler for Rec {
    fn on_ctrl(
        &mut self,
        _: PeerId,
        _: &dyn PeerName,
        p: &Prefix,
        ctrl: &[u8],
    ) -> Result<Sink, WireError> {
        let f = xfabric_core::rdm::wire::decode(p, ctrl)?;
        let Frame::Msg { id, .. } = f else {
            return Err(WireError::Kind(p.kind));
        };
        self.events.push(("ctrl", u64::from(id)));
        if self.mode == Mode::Hold && self.held {
            self.offers += 1;
            return Ok(Sink::Wait);
        }
        self.open.push_back((id, p.body_len));
        Ok(match self.mode {
            Mode::Buffer | Mode::Hold => Sink::Buffer(vec![0; p.body_len as usize]),
            Mode::Discard => Sink::Discard,
            Mode::Iov { cap } => {
                let mut v = vec![0u8; (p.body_len as usize).min(cap)];
                let l = IovList::one(v.as_mut_ptr() as usize, v.len());
                self.iov_mem.push_back(v);
                Sink::Iov(l)
            }
        })
    }
    fn on_body(&mut self, peer: PeerId, sink: Sink) {
        let (id, len) = self.open.pop_front().expect("on_body without on_ctrl");
        let bytes = match sink {
            Sink::Buffer(v) => v,
            Sink::Discard => Vec::new(),
            Sink::Wait => panic!("a waiting frame's body handed over"),
            Sink::Iov(l) => {
                let v = self.iov_mem.pop_front().expect("iov memory");
                assert_eq!(l.first_addr(), v.as_ptr() as usize, "the sink handed back");
                v
            }
        };
        self.got.push((peer, id, len, bytes));
    }
    fn on_sent(&mut self, peer: PeerId, token: u64) {
        self.sent.push((peer, token));
    }
    fn on_lost(&mut self, peer: PeerId, _: Option<&dyn PeerName>, errno: i32) {
        self.lost.push((peer, errno));
        self.events.push(("lost", peer as u64));
    }
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

fn msg(peer: PeerId, id: u32, body: Body, token: Option<u64>) -> Transmit {
    let ctrl = Frame::Msg {
        id,
        tag: 0,
        data: 0,
        flags: 0,
    }
    .ctrl(body.len() as u64);
    Transmit {
        peer,
        ctrl,
        body,
        token,
    }
}

/// Progresses every (net, handler) pair until `done` holds; panics with `what` after LIMIT.
fn drive(nets: &mut [(&mut Net, &mut Rec)], what: &str, mut done: impl FnMut(&[&Rec]) -> bool) {
    let start = Instant::now();
    loop {
        for (n, h) in nets.iter_mut() {
            n.progress(*h);
        }
        let hs: Vec<&Rec> = nets.iter().map(|(_, h)| &**h).collect();
        if done(&hs) {
            return;
        }
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
    }
}

fn up_conns(n: &Net) -> usize {
    n.conns.iter().filter(|(_, c)| c.st == St::Up).count()
}

fn hello(addr: SocketAddr, nonce: u64) -> [u8; hello::LEN] {
    Hs::Hello {
        addr,
        nonce,
        rand: [7; hello::RAND],
        keyed: false,
    }
    .encode()
}

/// Reads one handshake message from a raw socket while `a` progresses.
fn read_hs(a: &mut Net, ha: &mut Rec, s: &mut StdStream) -> Hs {
    read_hs_all(&mut [(a, ha)], s)
}

/// A raw peer that `a` accepts: it listens (at the address it returns) and answers the
/// call-back that proves its HELLO, as a real endpoint does. Returns its greeted connection.
fn raw_peer(a: &mut Net, ha: &mut Rec, nonce: u64) -> (StdStream, SocketAddr) {
    let l = StdListener::bind(lo()).unwrap();
    let me = l.local_addr().unwrap();
    let mut s = StdStream::connect(a.local_addr()).unwrap();
    let src = s.local_addr().unwrap();
    let a_addr = a.local_addr();
    s.write_all(&hello(me, nonce)).unwrap();
    let vouch = std::thread::spawn(move || {
        // Bounded: an `a` that refuses without calling back fails the test, not hangs it.
        l.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let mut c = loop {
            match l.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(start.elapsed() < LIMIT, "no call-back");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(LIMIT)).unwrap();
        let mut b = [0u8; hello::LEN];
        c.read_exact(&mut b).unwrap();
        let to = a_addr;
        assert_eq!(Hs::decode(&b), Ok(Hs::Verify { src, to, nonce }));
        c.write_all(&Hs::Vouch { yes: true }.encode()).unwrap();
    });
    assert!(matches!(read_hs(a, ha, &mut s), Hs::Accept { .. }));
    vouch.join().unwrap();
    (s, me)
}

#[test]
fn net_is_send() {
    fn send<T: Send>() {}
    send::<Net>();
}

#[test]
fn frames_both_ways_small_and_large_owned_and_iov() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    let pa = b.peer(a.local_addr());
    assert_eq!(a.peer_addr(pb), Some(b.local_addr()));
    let big = pattern(7, 16 << 20);
    let mut want = Vec::new();
    for i in 0..200u32 {
        let body = pattern(i, (i as usize * 37) % 3000);
        want.push((i, body.clone()));
        a.send(msg(pb, i, Body::Owned(body), Some(i as u64)));
        if i == 100 {
            a.send(msg(
                pb,
                1000,
                Body::Iov(IovList::one(big.as_ptr() as usize, big.len())),
                Some(1000),
            ));
            want.push((1000, big.clone()));
        }
    }
    assert!(a.queued(pb) > 16 << 20);
    // The other way: Iov bodies, some without a token, and empty ones.
    let small: Vec<Vec<u8>> = (0..50u32).map(|i| pattern(i, i as usize * 3)).collect();
    for (i, s) in small.iter().enumerate() {
        let body = Body::Iov(IovList::one(s.as_ptr() as usize, s.len()));
        b.send(msg(pa, i as u32, body, (i % 2 == 0).then_some(i as u64)));
    }
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "all frames",
        |h| h[1].got.len() == want.len() && h[0].got.len() == small.len() && h[0].sent.len() == 201,
    );
    for ((peer, id, len, bytes), (wid, wbody)) in hb.got.iter().zip(&want) {
        assert_eq!((*peer, *id, *len as usize), (pa, *wid, wbody.len()));
        assert!(bytes == wbody, "body of frame {id}");
    }
    for (i, (peer, id, _, bytes)) in ha.got.iter().enumerate() {
        assert_eq!((*peer, *id as usize), (pb, i));
        assert_eq!(bytes, &small[i]);
    }
    let mut tokens: Vec<u64> = (0..=100).collect();
    tokens.push(1000);
    tokens.extend(101..200);
    assert_eq!(ha.sent, tokens.iter().map(|&t| (pb, t)).collect::<Vec<_>>());
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's tokens",
        |h| h[1].sent.len() == 25,
    );
    assert_eq!(
        hb.sent,
        (0..50).step_by(2).map(|t| (pa, t)).collect::<Vec<_>>()
    );
    assert_eq!((a.queued(pb), b.queued(pa)), (0, 0));
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
    assert_eq!((up_conns(&a), up_conns(&b)), (1, 1));
    // Nothing to do: progress says so.
    assert_eq!(a.progress(&mut ha) + b.progress(&mut hb), 0);
}

/// On an established connection, frames with nothing queued before them are written from
/// `send`; once the peer stops reading, the socket takes part of one (or none) and the rest
/// queues behind it. Everything arrives whole and in order, every token once, in order.
#[test]
fn frames_written_from_send_then_queued_behind_a_full_socket() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    let pa = b.peer(a.local_addr());
    a.send(msg(pb, 0, Body::Owned(pattern(0, 10)), Some(0)));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "the connection",
        |h| h[1].got.len() == 1 && h[0].sent.len() == 1,
    );
    // b does not read while a sends: a's socket (and b's) fill up.
    let bodies: Vec<Vec<u8>> = (1..=200u32).map(|i| pattern(i, 64 << 10)).collect();
    for (i, body) in bodies.iter().enumerate() {
        let id = i as u32 + 1;
        let body = if i % 2 == 0 {
            Body::Owned(body.clone())
        } else {
            Body::Iov(IovList::one(body.as_ptr() as usize, body.len()))
        };
        a.send(msg(pb, id, body, Some(id as u64)));
        a.progress(&mut ha);
    }
    assert!(a.queued(pb) > 0, "the socket never filled");
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "every frame",
        |h| h[1].got.len() == 201 && h[0].sent.len() == 201,
    );
    for (i, (peer, id, len, bytes)) in hb.got.iter().enumerate().skip(1) {
        assert_eq!((*peer, *id as usize, *len as usize), (pa, i, 64 << 10));
        assert!(bytes == &bodies[i - 1], "body of frame {id}");
    }
    assert_eq!(ha.sent, (0..=200).map(|t| (pb, t)).collect::<Vec<_>>());
    assert_eq!(a.queued(pb), 0);
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

/// A frame answered `Sink::Wait` stays at the head: nothing behind it is read (the sender's
/// bytes stay in the socket), it is offered again on every progress call, and once taken it
/// and everything behind it arrive in order.
#[test]
fn a_waiting_frame_holds_its_connection_until_taken() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let mut hb = Rec::holding();
    let pb = a.peer(b.local_addr());
    let bodies: Vec<Vec<u8>> = (0..64u32).map(|i| pattern(i, 1000)).collect();
    for (i, body) in bodies.iter().enumerate() {
        a.send(msg(pb, i as u32, Body::Owned(body.clone()), None));
    }
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "offers of the held frame",
        |h| h[1].offers >= 1000,
    );
    assert!(
        hb.got.is_empty(),
        "nothing behind a waiting frame is handed over"
    );
    hb.held = false;
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "every frame",
        |h| h[1].got.len() == bodies.len(),
    );
    hb.assert_got_in_order(&bodies);
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

#[test]
fn sinks_iov_zero_copy_short_and_discard() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    let bodies: Vec<Vec<u8>> = [16 << 20, 100, 1 << 20, 0, 70_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u32 + 3, n))
        .collect();
    for (mode, cap) in [
        (Mode::Iov { cap: usize::MAX }, usize::MAX),
        (Mode::Iov { cap: 1000 }, 1000),
        (Mode::Discard, 0),
    ] {
        hb.mode = mode;
        hb.got.clear();
        for (i, v) in bodies.iter().enumerate() {
            a.send(msg(pb, i as u32, Body::Owned(v.clone()), None));
        }
        drive(&mut [(&mut a, &mut ha), (&mut b, &mut hb)], "bodies", |h| {
            h[1].got.len() == bodies.len()
        });
        for (i, (_, id, len, bytes)) in hb.got.iter().enumerate() {
            assert_eq!((*id as usize, *len as usize), (i, bodies[i].len()));
            let kept = bodies[i].len().min(cap);
            assert!(bytes[..] == bodies[i][..kept], "frame {i}, cap {cap}");
        }
    }
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

#[test]
fn simultaneous_connect_leaves_one_connection_and_loses_nothing() {
    for round in 0..10 {
        let mut a = Net::bind(lo()).unwrap();
        let mut b = Net::bind(lo()).unwrap();
        let (mut ha, mut hb) = (Rec::default(), Rec::default());
        let pb = a.peer(b.local_addr());
        let pa = b.peer(a.local_addr());
        for i in 0..20u32 {
            a.send(msg(pb, i, Body::Owned(pattern(i, 100)), Some(i as u64)));
            b.send(msg(pa, i, Body::Owned(pattern(i + 1, 50)), Some(i as u64)));
        }
        // Alternate who goes first.
        let mut pair = [(&mut a, &mut ha), (&mut b, &mut hb)];
        if round % 2 == 1 {
            pair.swap(0, 1);
        }
        drive(&mut pair, "frames both ways", |h| {
            h.iter().all(|h| h.got.len() == 20 && h.sent.len() == 20)
        });
        for (h, seed_off, len) in [(&ha, 1, 50), (&hb, 0, 100)] {
            let ids: Vec<u32> = h.got.iter().map(|g| g.1).collect();
            assert_eq!(ids, (0..20).collect::<Vec<_>>(), "round {round}");
            for g in &h.got {
                assert_eq!(g.3, pattern(g.1 + seed_off, len));
            }
            assert!(h.lost.is_empty(), "round {round}: {:?}", h.lost);
        }
        // The losing connection closes on both sides.
        drive(
            &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
            "one connection",
            |_| true,
        );
        let start = Instant::now();
        while a.conns.len() + b.conns.len() != 2 {
            a.progress(&mut ha);
            b.progress(&mut hb);
            assert!(
                start.elapsed() < LIMIT,
                "round {round}: extra connections linger"
            );
        }
        assert_eq!((up_conns(&a), up_conns(&b)), (1, 1));
        // The survivor was opened by the lower address.
        let lower_is_a = hello::key_of(&a.local_addr()) < hello::key_of(&b.local_addr());
        let (_, ca) = a.conns.iter().next().unwrap();
        assert_eq!(ca.outbound, lower_is_a, "round {round}");
    }
}

#[test]
fn ipv6_loopback() {
    let v6: SocketAddr = "[::1]:0".parse().unwrap();
    let (mut a, mut b) = match (Net::bind(v6), Net::bind(v6)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("skipped: no IPv6 loopback here ({e})");
            return;
        }
    };
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    a.send(msg(pb, 5, Body::Owned(pattern(5, 5000)), Some(5)));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "v6 frame",
        |h| h[1].got.len() == 1 && h[0].sent.len() == 1,
    );
    assert_eq!(hb.got[0].3, pattern(5, 5000));
    // b learnt a's address from the HELLO.
    assert_eq!(b.peer_addr(hb.got[0].0), Some(a.local_addr()));
}

/// True once the other end closed `s` (EOF or reset); false while it is open.
fn closed(s: &mut StdStream) -> bool {
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn strangers_are_dropped_and_others_unaffected() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = b.peer(a.local_addr());
    // 1: random bytes.
    let mut s1 = StdStream::connect(a.local_addr()).unwrap();
    s1.write_all(&pattern(99, 1000)).unwrap();
    // 2: a HELLO with a bad length field.
    let mut s2 = StdStream::connect(a.local_addr()).unwrap();
    let mut bad = hello("127.0.0.1:9".parse().unwrap(), 1);
    bad[8] = 200;
    s2.write_all(&bad).unwrap();
    b.send(msg(pb, 1, Body::Owned(pattern(1, 10)), Some(1)));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's frame",
        |h| h[0].got.len() == 1,
    );
    // 3: a peer that greets properly (and proves it), then sends a garbage frame.
    let (mut s3, fake) = raw_peer(&mut a, &mut ha, 3);
    let mut garbage = Frame::Ack { id: 1, status: 0 }.to_vec(0);
    garbage[0] = 0;
    s3.write_all(&garbage).unwrap();
    for s in [&mut s1, &mut s2, &mut s3] {
        s.set_nonblocking(true).unwrap();
    }
    let start = Instant::now();
    loop {
        a.progress(&mut ha);
        b.progress(&mut hb);
        if closed(&mut s1) && closed(&mut s2) && closed(&mut s3) {
            break;
        }
        assert!(start.elapsed() < LIMIT, "strangers still connected");
    }
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "the fake peer lost",
        |h| !h[0].lost.is_empty(),
    );
    let fake_id = a.peer(fake);
    assert_eq!(ha.lost, vec![(fake_id, libc::EPROTO)]);
    // b and a still talk.
    b.send(msg(pb, 2, Body::Owned(pattern(2, 10)), Some(2)));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's 2nd frame",
        |h| h[0].got.len() == 2,
    );
    assert!(hb.lost.is_empty());
}

#[test]
fn silent_connections_time_out() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_handshake_timeout(Duration::from_millis(100));
    let mut ha = Rec::default();
    let mut s = StdStream::connect(a.local_addr()).unwrap();
    s.set_nonblocking(true).unwrap();
    let start = Instant::now();
    while !closed(&mut s) {
        a.progress(&mut ha);
        assert!(start.elapsed() < LIMIT, "silent connection kept");
    }
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(a.conns.len(), 0);
}

/// A stranger's HELLO claims an address that takes the call-back's connection and never
/// answers it; both the stranger's connection and the call-back time out together. Two
/// connections opened and closed first leave the call-back a lower key than the connection it
/// checks, so that failing the call-back (which refuses the stranger) comes first: the
/// stranger's connection, already gone, is passed over, not looked up.
#[test]
fn a_call_back_and_its_claimant_timing_out_together() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_handshake_timeout(Duration::from_millis(100));
    let mut ha = Rec::default();
    // Whether both are late in one look depends on the timing: tried ten times.
    for _ in 0..10 {
        let mut dummies: Vec<StdStream> = (0..2)
            .map(|_| StdStream::connect(a.local_addr()).unwrap())
            .collect();
        let start = Instant::now();
        while a.conns.len() < 2 {
            a.progress(&mut ha);
            assert!(start.elapsed() < LIMIT, "dummies not accepted");
        }
        // Closed in order, each gone before the next: the last freed key is taken first.
        for d in dummies.drain(..) {
            let before = a.conns.len();
            drop(d);
            while a.conns.len() == before {
                a.progress(&mut ha);
                assert!(start.elapsed() < LIMIT, "a dummy kept");
            }
        }
        // A listener that takes the call-back's connection (the kernel does) and says
        // nothing.
        let mute = StdListener::bind(lo()).unwrap();
        let mut s = StdStream::connect(a.local_addr()).unwrap();
        s.write_all(&hello(mute.local_addr().unwrap(), 99)).unwrap();
        s.set_nonblocking(true).unwrap();
        while !closed(&mut s) {
            a.progress(&mut ha);
            assert!(start.elapsed() < LIMIT, "the stranger kept");
        }
        let start = Instant::now();
        while !a.conns.is_empty() {
            a.progress(&mut ha);
            assert!(start.elapsed() < LIMIT, "the call-back kept");
        }
    }
}

/// A write that finds the peer reset loses it; until the loss is handed to the engine, the
/// transport takes no frame for that peer (the engine keeps it, and fails it with the rest),
/// so that nothing goes out on a new connection after its operation was reported failed.
#[test]
fn no_frame_is_taken_for_a_peer_lost_and_not_yet_reported() {
    use xfabric_core::rdm::Transport;
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    a.send(msg(pb, 0, Body::Owned(vec![1; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "first frame",
        |h| h[1].got.len() == 1,
    );
    drop(b);
    let start = Instant::now();
    let mut id = 1;
    while a.peers[pb].losing == 0 {
        // Written at once on the connection (nothing queued): the write finds the reset.
        assert!(Transport::send(&mut a, msg(pb, id, Body::Owned(vec![2; 64 << 10]), None)).is_ok());
        id += 1;
        assert!(start.elapsed() < LIMIT, "the reset never found");
    }
    let back = Transport::send(&mut a, msg(pb, id, Body::Owned(vec![3; 10]), None));
    assert!(
        back.is_err(),
        "a frame taken for a peer lost and not yet reported"
    );
    assert!(a.peers[pb].queue.is_empty(), "frames kept for a lost peer");
    a.progress(&mut ha);
    assert!(ha.lost.iter().any(|&(p, _)| p == pb), "the loss reported");
    assert_eq!(a.peers[pb].losing, 0);
    assert!(Transport::send(&mut a, msg(pb, id + 1, Body::Owned(vec![4; 10]), None)).is_ok());
}

/// A listening socket whose accept queue is full: a connection to it hangs (its SYNs are
/// dropped), as to an address that black-holes them. Its address, and what keeps it full.
fn black_hole() -> (SocketAddr, Vec<StdStream>, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; `sa` is a valid
    // sockaddr_in for 127.0.0.1, port 0.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        let mut got: libc::sockaddr_in = std::mem::zeroed();
        let mut glen = len;
        assert_eq!(
            libc::getsockname(fd, (&mut got as *mut libc::sockaddr_in).cast(), &mut glen),
            0
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], u16::from_be(got.sin_port)));
        // A backlog of 0 takes one connection; a second fills the queue past it.
        let fill = (0..2)
            .filter_map(|_| StdStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
            .collect();
        (addr, fill, owned)
    }
}

/// A stranger whose claim is being checked closes its connection while the call-back to
/// the address it named still hangs: the call-back goes with it, at once, not when the
/// handshake's time runs out (a stranger coming back again and again would otherwise leave
/// one more each time).
#[test]
fn a_call_back_goes_with_the_connection_it_checks() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_handshake_timeout(Duration::from_secs(600));
    let mut ha = Rec::default();
    let (hole, _fill, _keep) = black_hole();
    for round in 0..3 {
        let mut s = StdStream::connect(a.local_addr()).unwrap();
        s.write_all(&hello(hole, 99)).unwrap();
        let start = Instant::now();
        // The stranger's connection and its call-back.
        while a.conns.len() < 2 {
            a.progress(&mut ha);
            assert!(start.elapsed() < LIMIT, "round {round}: no call-back");
        }
        drop(s);
        while !a.conns.is_empty() {
            a.progress(&mut ha);
            assert!(
                start.elapsed() < LIMIT,
                "round {round}: {} connection(s) left",
                a.conns.len()
            );
        }
        assert_eq!(a.settling, 0);
    }
}

/// A burst of connections waiting in the listen queue is taken a bounded number per call:
/// one progress call is not held by a flood, and the rest are taken by the next calls.
#[test]
fn accepts_are_bounded_per_call() {
    let mut a = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let clients: Vec<StdStream> = (0..100)
        .map(|_| StdStream::connect(a.local_addr()).unwrap())
        .collect();
    let first = a.accept(&mut ha);
    assert!(first <= 64, "one call admitted {first}");
    assert!(a.accept_retry.is_some(), "the rest is not looked at again");
    let start = Instant::now();
    while a.accept_retry.is_some() {
        a.progress(&mut ha);
        assert!(start.elapsed() < LIMIT, "the listen queue never drained");
    }
    drop(clients);
}

#[test]
fn refused_then_reconnects() {
    let gone = Net::bind(lo()).unwrap().local_addr();
    let mut a = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let p = a.peer(gone);
    for round in 1..=2 {
        a.send(msg(p, 1, Body::Owned(vec![1; 10]), Some(1)));
        drive(&mut [(&mut a, &mut ha)], "on_lost", |h| {
            h[0].lost.len() == round
        });
        assert_eq!(ha.lost[round - 1], (p, libc::ECONNREFUSED));
        assert_eq!(a.queued(p), 0);
    }
    assert!(ha.sent.is_empty());
}

#[test]
fn peer_dropped_mid_transfer() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = a.peer(b.local_addr());
    let big = pattern(1, 64 << 20);
    a.send(msg(
        pb,
        1,
        Body::Iov(IovList::one(big.as_ptr() as usize, big.len())),
        Some(1),
    ));
    // b takes some of it, then goes away.
    let start = Instant::now();
    while a.queued(pb) > 48 << 20 || hb.open.is_empty() {
        a.progress(&mut ha);
        b.progress(&mut hb);
        assert!(start.elapsed() < LIMIT, "transfer never started");
    }
    drop(b);
    drive(&mut [(&mut a, &mut ha)], "on_lost", |h| {
        !h[0].lost.is_empty()
    });
    assert_eq!(ha.lost.len(), 1);
    assert!(
        [libc::ECONNRESET, libc::EPIPE].contains(&ha.lost[0].1),
        "{:?}",
        ha.lost
    );
    assert!(ha.sent.is_empty());
    assert_eq!(a.queued(pb), 0);
    // A later send connects again (and is refused: nobody listens there now).
    a.send(msg(pb, 2, Body::Owned(vec![0; 8]), None));
    drive(&mut [(&mut a, &mut ha)], "2nd on_lost", |h| {
        h[0].lost.len() == 2
    });
    assert_eq!(ha.lost[1], (pb, libc::ECONNREFUSED));
}

#[test]
fn port_in_use() {
    let a = Net::bind(lo()).unwrap();
    let e = Net::bind(a.local_addr()).err().expect("second bind");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
}

#[test]
fn a_stranger_claiming_a_peer_is_refused_and_the_peer_keeps_its_connection() {
    // A stranger's HELLO claims b's address (with a nonce of its own, and with b's real one)
    // while a is connected to b: the call-back to b's listener does not vouch for it.
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pa = b.peer(a.local_addr());
    b.send(msg(pa, 1, Body::Owned(vec![1; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "first frame",
        |h| h[0].got.len() == 1,
    );
    let pb = ha.got[0].0;
    for nonce in [12345, b.nonce] {
        let mut s = StdStream::connect(a.local_addr()).unwrap();
        s.write_all(&hello(b.local_addr(), nonce)).unwrap();
        // b must progress to answer the call-back.
        let mut got = None;
        s.set_nonblocking(true).unwrap();
        let mut ans = [0u8; hello::LEN];
        let mut n = 0;
        let start = Instant::now();
        while got.is_none() {
            a.progress(&mut ha);
            b.progress(&mut hb);
            match s.read(&mut ans[n..]) {
                Ok(0) => panic!("closed without an answer"),
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            if n == ans.len() {
                got = Some(Hs::decode(&ans));
            }
            assert!(start.elapsed() < LIMIT, "no answer to the stranger");
        }
        assert_eq!(
            got,
            Some(Ok(Hs::Reject {
                reason: hello::reason::UNVERIFIED
            }))
        );
        assert!(ha.lost.is_empty(), "the live connection was displaced");
    }
    // a's frames still go to b, and nowhere else.
    for i in 0..100 {
        a.send(msg(pb, 10 + i, Body::Owned(vec![2; 10]), None));
    }
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "a's frames at b",
        |h| h[1].got.len() == 100,
    );
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

/// A stranger's HELLO claims a listener of another host than its connection comes from
/// (127.0.0.2 stands for one: the whole of 127/8 is this machine's loopback): it is refused
/// without a call-back, so the listener it names is never dialed.
#[test]
fn a_claim_naming_another_host_is_refused_without_a_call_back() {
    let mut a = Net::bind(lo()).unwrap();
    // Long: the refusal must come from the check, not from a call-back's time running out.
    a.set_handshake_timeout(Duration::from_secs(600));
    let mut ha = Rec::default();
    let elsewhere = StdListener::bind("127.0.0.2:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let mut s = StdStream::connect(a.local_addr()).unwrap();
    assert_eq!(s.local_addr().unwrap().ip(), a.local_addr().ip());
    s.write_all(&hello(elsewhere.local_addr().unwrap(), 99))
        .unwrap();
    assert_eq!(
        read_hs(&mut a, &mut ha, &mut s),
        Hs::Reject {
            reason: hello::reason::UNVERIFIED
        }
    );
    for _ in 0..100 {
        a.progress(&mut ha);
    }
    match elsewhere.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the named listener was dialed: {other:?}"),
    }
    assert_eq!(a.settling, 0, "a call-back under way");
}

/// An endpoint named by one loopback address reaches one named by another: its connections
/// leave from its name's address, whatever the route (which picks 127.0.0.1 toward
/// 127.0.0.1), so the acceptor's check that a claim names the host it comes from passes.
#[test]
fn connections_leave_from_the_names_address() {
    // And between the host's own address (where endpoints listen by default) and the
    // loopback's, both ways: the route between them is the loopback's either way.
    let host = std::net::SocketAddr::new(crate::inet::default_ip(), 0);
    for (a, b) in [
        (lo(), "127.0.0.2:0".parse().unwrap()),
        (lo(), host),
        (host, lo()),
    ] {
        exchange_from(a, b);
    }
}

/// A frame from an endpoint named by `from` to one named by `to`, and one back.
fn exchange_from(to: SocketAddr, from: SocketAddr) {
    let mut a = Net::bind(to).unwrap();
    let mut b = Net::bind(from).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pa = b.peer(a.local_addr());
    b.send(msg(pa, 1, Body::Owned(vec![5; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's frame at a",
        |h| h[0].got.len() == 1,
    );
    let pb = ha.got[0].0;
    a.send(msg(pb, 2, Body::Owned(vec![6; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "a's answer at b",
        |h| h[1].got.len() == 1,
    );
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

#[test]
fn restarted_peer_replaces_its_old_connection() {
    // b goes away and a new endpoint comes up at its address: it reconnects, proven by the
    // call-back, and is the same peer to a.
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pa = b.peer(a.local_addr());
    b.send(msg(pa, 1, Body::Owned(vec![1; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "first frame",
        |h| h[0].got.len() == 1,
    );
    let pb = ha.got[0].0;
    let addr = b.local_addr();
    drop(b);
    let mut b2 = Net::bind(addr).expect("the address again (SO_REUSEADDR)");
    let mut hb2 = Rec::default();
    let pa2 = b2.peer(a.local_addr());
    b2.send(msg(pa2, 9, Body::Owned(vec![3; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b2, &mut hb2)],
        "frame from the restarted peer",
        |h| h[0].got.len() == 2,
    );
    assert_eq!((ha.got[1].0, ha.got[1].1), (pb, 9));
    assert_eq!(ha.lost, vec![(pb, libc::ECONNRESET)]);
    assert!(hb2.lost.is_empty());
}

#[test]
fn sending_to_oneself() {
    let mut a = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let me = a.peer(a.local_addr());
    for i in 0..5 {
        a.send(msg(me, i, Body::Owned(pattern(i, 10)), Some(i as u64)));
    }
    drive(&mut [(&mut a, &mut ha)], "own frames", |h| {
        h[0].got.len() == 5 && h[0].sent.len() == 5
    });
    assert!(ha.got.iter().all(|g| g.0 == me));
    assert!(ha.lost.is_empty());
}

/// A handler for measurements: bodies go straight into one reused buffer.
struct Bench {
    dst: Vec<u8>,
    got: usize,
    sent: usize,
    lost: usize,
}

impl Bench {
    /// Receives bodies of up to `size` bytes.
    fn new(size: usize) -> Bench {
        Bench {
            dst: vec![0; size],
            got: 0,
            sent: 0,
            lost: 0,
        }
    }
}

impl Handler for Bench {
    fn on_ctrl(
        &mut self,
        _: PeerId,
        _: &dyn PeerName,
        p: &Prefix,
        _: &[u8],
    ) -> Result<Sink, WireError> {
        let n = (p.body_len as usize).min(self.dst.len());
        Ok(Sink::Iov(IovList::one(self.dst.as_mut_ptr() as usize, n)))
    }
    fn on_body(&mut self, _: PeerId, _: Sink) {
        self.got += 1;
    }
    fn on_sent(&mut self, _: PeerId, _: u64) {
        self.sent += 1;
    }
    fn on_lost(&mut self, _: PeerId, _: Option<&dyn PeerName>, _: i32) {
        self.lost += 1;
    }
}

fn bench_pair() -> (Net, Net, PeerId, PeerId) {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    let pb = a.peer(b.local_addr());
    let pa = b.peer(a.local_addr());
    (a, b, pb, pa)
}

/// Ping-pong of `size`-byte messages between two threads: microseconds per one-way transfer.
fn pingpong(size: usize, iters: usize) -> f64 {
    let (mut a, mut b, pb, pa) = bench_pair();
    let src = vec![7u8; size];
    let echo = std::thread::spawn(move || {
        let src = vec![9u8; size];
        let mut h = Bench::new(size);
        let start = Instant::now();
        while h.got < iters + 1 {
            let before = h.got;
            b.progress(&mut h);
            for _ in before..h.got {
                let body = Body::Iov(IovList::one(src.as_ptr() as usize, size));
                b.send(msg(pa, 0, body, None));
            }
            assert!(
                start.elapsed() < 4 * LIMIT && h.lost == 0,
                "echo side stuck"
            );
        }
        b
    });
    let mut h = Bench::new(size);
    let mut t0 = Instant::now();
    for i in 0..=iters {
        if i == 1 {
            t0 = Instant::now(); // the first round trip includes connecting
        }
        a.send(msg(
            pb,
            0,
            Body::Iov(IovList::one(src.as_ptr() as usize, size)),
            None,
        ));
        while h.got <= i {
            a.progress(&mut h);
            assert!(h.lost == 0, "lost");
        }
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
    echo.join().unwrap();
    us
}

/// Ping-pong with both Nets in one thread: the cost of the calls themselves, free of
/// scheduling noise (loopback TCP delivers inside the sender's syscall).
fn pingpong1(size: usize, iters: usize) -> f64 {
    let (mut a, mut b, pb, pa) = bench_pair();
    let src = vec![7u8; size];
    let (mut ha, mut hb) = (Bench::new(size), Bench::new(size));
    let mut t0 = Instant::now();
    let start = Instant::now();
    for i in 0..=iters {
        if i == 1 {
            t0 = Instant::now();
        }
        let body = || Body::Iov(IovList::one(src.as_ptr() as usize, size));
        a.send(msg(pb, 0, body(), None));
        while hb.got <= i {
            b.progress(&mut hb);
            if i == 0 {
                a.progress(&mut ha);
            }
            assert!(start.elapsed() < LIMIT, "stuck");
        }
        b.send(msg(pa, 0, body(), None));
        while ha.got <= i {
            a.progress(&mut ha);
            assert!(start.elapsed() < LIMIT, "stuck");
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64
}

/// The floor for `pingpong1`: plain sockets, one write and one read per transfer.
fn raw_pingpong1(size: usize, iters: usize) -> f64 {
    let l = std::net::TcpListener::bind(lo()).unwrap();
    let mut a = StdStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut b, _) = l.accept().unwrap();
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    let src = vec![7u8; size];
    let mut dst = vec![0u8; size];
    let t0 = Instant::now();
    for _ in 0..iters {
        a.write_all(&src).unwrap();
        b.read_exact(&mut dst).unwrap();
        b.write_all(&src).unwrap();
        a.read_exact(&mut dst).unwrap();
    }
    t0.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64
}

/// `count` messages of `size` bytes one way, at most `window` not yet handed to the kernel:
/// GB/s at the receiver.
fn stream(size: usize, count: usize, window: usize) -> f64 {
    let (mut a, mut b, pb, _pa) = bench_pair();
    let src = vec![7u8; size];
    // Connect first.
    a.send(msg(pb, 0, Body::None, None));
    let rx = std::thread::spawn(move || {
        let mut h = Bench::new(size);
        let mut t0 = Instant::now();
        while h.got < count + 1 {
            b.progress(&mut h);
            if h.got == 1 && t0.elapsed() > Duration::ZERO {
                t0 = Instant::now();
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        (b, dt)
    });
    let mut h = Bench::new(0);
    let mut posted = 0;
    while posted < count || a.queued(pb) > 0 {
        while posted < count && posted - h.sent < window {
            let body = Body::Iov(IovList::one(src.as_ptr() as usize, size));
            a.send(msg(pb, 1, body, Some(posted as u64)));
            posted += 1;
        }
        a.progress(&mut h);
    }
    let (_b, dt) = rx.join().unwrap();
    (size * count) as f64 / dt / 1e9
}

/// The floor for `stream`: plain blocking sockets, two threads.
fn raw_stream(size: usize, count: usize) -> f64 {
    let l = std::net::TcpListener::bind(lo()).unwrap();
    let mut a = StdStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut b, _) = l.accept().unwrap();
    let rx = std::thread::spawn(move || {
        let mut dst = vec![0u8; size];
        let t0 = Instant::now();
        for _ in 0..count {
            b.read_exact(&mut dst).unwrap();
        }
        t0.elapsed().as_secs_f64()
    });
    let src = vec![7u8; size];
    for _ in 0..count {
        a.write_all(&src).unwrap();
    }
    let dt = rx.join().unwrap();
    (size * count) as f64 / dt / 1e9
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "min {:.2} median {:.2} max {:.2}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

/// `cargo test --release -p xfabric-providers --lib tcp::net::tests::measure -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a test: run on demand in release"]
fn measure() {
    let iters: usize = std::env::var("XF_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let runs: usize = std::env::var("XF_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for size in [8usize, 4096] {
        let v: Vec<f64> = (0..runs).map(|_| pingpong1(size, iters)).collect();
        println!("pingpong {size} B, one thread: us per one-way {}", stats(v));
        let v: Vec<f64> = (0..runs).map(|_| raw_pingpong1(size, iters)).collect();
        println!("  plain sockets, one thread: us per one-way {}", stats(v));
        if std::env::var("XF_ONE").is_ok() {
            continue;
        }
        let v: Vec<f64> = (0..runs).map(|_| pingpong(size, iters)).collect();
        println!("pingpong {size} B: us per one-way {}", stats(v));
    }
    if std::env::var("XF_NO_BW").is_ok() {
        return;
    }
    for (size, count) in [(64usize << 10, 40_000usize), (4 << 20, 1000)] {
        let v: Vec<f64> = (0..runs).map(|_| stream(size, count, 64)).collect();
        println!("stream {} KiB: GB/s {}", size >> 10, stats(v));
        let v: Vec<f64> = (0..runs).map(|_| raw_stream(size, count)).collect();
        println!("  plain blocking sockets: GB/s {}", stats(v));
    }
}

/// Floods `a` through `s`, a greeted raw peer that never reads, with 8-byte messages, each of
/// which the handler answers with `answer(peer)`, until the peer's socket takes nothing more
/// (we stopped reading it). Returns the peer and one request's length.
fn flood_unread(
    a: &mut Net,
    h: &mut Rec,
    s: &mut StdStream,
    answer: impl Fn(PeerId) -> Transmit,
) -> (PeerId, usize) {
    let start = Instant::now();
    s.set_nonblocking(true).unwrap();
    // Requests (Msg frames), as many as the sockets take; each one we read is answered.
    let frame = msg(0, 1, Body::Owned(pattern(1, 8)), None).ctrl;
    let req: Vec<u8> = [frame.to_vec(), pattern(1, 8)].concat();
    let mut pending: Vec<u8> = Vec::new();
    let mut stuck = 0u32;
    let mut answered = 0usize;
    loop {
        if pending.is_empty() {
            for _ in 0..256 {
                pending.extend_from_slice(&req);
            }
        }
        match s.write(&pending) {
            Ok(n) => {
                pending.drain(..n);
                stuck = 0;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stuck += 1,
            Err(e) => panic!("write: {e}"),
        }
        a.progress(h);
        while answered < h.got.len() {
            a.send(answer(h.got[answered].0));
            answered += 1;
        }
        // Settled: the peer's socket takes nothing more, and we owe it the bound.
        if stuck > 2000 {
            return (h.got[0].0, req.len());
        }
        assert!(
            start.elapsed() < 3 * LIMIT,
            "never held back ({} read)",
            h.got.len()
        );
    }
}

/// A peer that sends requests and never reads our answers: once it owes `max_owed` answers
/// we read nothing more from it (its frames stay in its socket), our queue stops growing, and
/// another peer is served meanwhile; when it reads again, everything it sent is handled.
#[test]
fn a_peer_that_never_reads_its_answers_is_not_read_either() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_max_owed(100);
    let mut h = Rec::default();
    // The hostile peer: a raw socket that greets properly, then only writes.
    let (mut s, _) = raw_peer(&mut a, &mut h, 77);
    let ack = |p| Transmit {
        peer: p,
        ctrl: Frame::Ack { id: 1, status: 0 }.ctrl(0),
        body: Body::None,
        token: None,
    };
    let (peer, req_len) = flood_unread(&mut a, &mut h, &mut s, ack);
    // At the bound, plus at most what the one progress call that crossed it handed over
    // (answers are queued after it returns): up to PUMP_FRAMES, then the rest of that read.
    let owed = a.owed(peer);
    let most = 100 + super::PUMP_FRAMES + super::RBUF / req_len + 1;
    assert!(
        (100..=most).contains(&owed),
        "{owed} answers owed (bound 100, {most} at most)"
    );
    let read = h.got.len();
    for _ in 0..10_000 {
        a.progress(&mut h);
    }
    assert_eq!(h.got.len(), read, "nothing more is read from it");
    assert_eq!(a.owed(peer), owed);
    // Another peer is served meanwhile.
    let mut b = Net::bind(lo()).unwrap();
    let mut hb = Rec::default();
    let pa = b.peer(a.local_addr());
    b.send(msg(pa, 9, Body::Owned(pattern(9, 100)), None));
    drive(
        &mut [(&mut a, &mut h), (&mut b, &mut hb)],
        "the other peer",
        |x| x[0].got.iter().any(|g| g.1 == 9),
    );
    // It reads again: our answers drain and its requests are read again.
    let mut sink = vec![0u8; 1 << 20];
    let before = h.got.len();
    let start = Instant::now();
    while h.got.len() < before + 1000 {
        let _ = s.read(&mut sink);
        a.progress(&mut h);
        assert!(start.elapsed() < LIMIT, "not read again");
    }
}

/// The same peer asking for answers we must hold bytes of (4 KiB of an atomic's original
/// values each, as a fetching atomic of 48 bytes asks): it is no longer read once those bytes
/// reach the bound, long before the count of answers would stop it.
#[test]
fn a_peer_that_never_reads_large_answers_is_held_by_their_bytes() {
    const BOUND: usize = 256 << 10;
    const RESULT: usize = 4096;
    let mut a = Net::bind(lo()).unwrap();
    a.set_max_owed_bytes(BOUND);
    let mut h = Rec::default();
    let (mut s, _) = raw_peer(&mut a, &mut h, 78);
    let result = |p| Transmit {
        peer: p,
        ctrl: Frame::AtomicResp { id: 1, status: 0 }.ctrl(RESULT as u64),
        body: Body::Owned(vec![0x5a; RESULT]),
        token: None,
    };
    let charge = result(0).ctrl.len() + RESULT;
    let (peer, req_len) = flood_unread(&mut a, &mut h, &mut s, result);
    // As above: the bound, plus what the progress call that crossed it handed over. What the
    // kernel took before the peer's window closed is not ours to hold.
    let owed = a.owed_bytes(peer);
    let most = BOUND + (super::PUMP_FRAMES + super::RBUF / req_len + 1) * charge;
    assert!(
        (BOUND..=most).contains(&owed),
        "{owed} bytes of answers owed (bound {BOUND}, {most} at most)"
    );
    assert_eq!(
        owed,
        a.owed(peer) * charge,
        "every answer queued is charged"
    );
    assert!(
        a.owed(peer) < xfabric_core::rdm::OWED_MAX / 8,
        "held by the count instead"
    );
    let read = h.got.len();
    for _ in 0..10_000 {
        a.progress(&mut h);
    }
    assert_eq!(h.got.len(), read, "nothing more is read from it");
    // It reads again: the answers drain, every byte of them uncharged, and it is read again.
    let mut sink = vec![0u8; 1 << 20];
    let start = Instant::now();
    while h.got.len() < read + 1000 {
        let _ = s.read(&mut sink);
        a.progress(&mut h);
        assert!(start.elapsed() < LIMIT, "not read again");
    }
    while a.owed(peer) > 0 {
        let _ = s.read(&mut sink);
        a.progress(&mut h);
        assert!(start.elapsed() < LIMIT, "answers not drained");
    }
    assert_eq!(a.owed_bytes(peer), 0);
}

/// Time from a first frame to a peer never met to its arrival (connect, handshake, the frame),
/// `n` fresh pairs: what proving a claim costs. Without a key (`key` None) the acceptor calls
/// the connector back; with one, the challenge and proof go both ways.
fn first_contact(n: usize, key: Option<&[u8]>) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let mut a = Net::bind(lo()).unwrap();
            let mut b = Net::bind(lo()).unwrap();
            a.set_auth_key(key.map(<[u8]>::to_vec));
            b.set_auth_key(key.map(<[u8]>::to_vec));
            let (mut ha, mut hb) = (Rec::default(), Rec::default());
            let pa = b.peer(a.local_addr());
            let t0 = Instant::now();
            b.send(msg(pa, 1, Body::Owned(vec![1; 8]), None));
            drive(
                &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
                "first frame",
                |h| h[0].got.len() == 1,
            );
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

#[test]
#[ignore = "a measurement, not a test: run on demand in release"]
fn handshake_cost() {
    for round in 0..3 {
        eprintln!(
            "round {round}: first contact usec min/median/max: call-back {}, keyed {}",
            stats(first_contact(200, None)),
            stats(first_contact(200, Some(b"key")))
        );
    }
}

/// A peer that announces a body and stops in the middle of it, its connection kept alive (the
/// kernel answers keepalives for it): the receive it matched and the bytes charged to it were
/// held for as long as the connection lived. Now it is lost once it has sent nothing of the
/// frame for `stall_after`, and a peer that finishes its frames slowly, but within it, is not.
#[test]
fn a_peer_stopping_mid_frame_is_lost_after_stall_after() {
    let mut a = Net::bind(lo()).unwrap();
    // Far above the pauses of the slow part below, so that a loaded machine cannot make them
    // look like a stall.
    a.set_stall_after(Some(Duration::from_secs(3)));
    a.set_look_every(Duration::from_millis(100));
    let mut h = Rec::default();
    let (mut s, _) = raw_peer(&mut a, &mut h, 78);
    s.set_nonblocking(true).unwrap();
    let body = pattern(3, 64 << 10);
    // The control part announces the whole body.
    let ctrl = msg(0, 1, Body::Owned(body.clone()), None).ctrl;
    let frame = [ctrl.to_vec(), body].concat();
    let half = frame.len() / 2;
    // Slow but steady: a piece every 100 ms, a thirtieth of the limit, is never a stall.
    let pieces = 10;
    let step = half / pieces;
    for i in 0..pieces {
        s.write_all(&frame[i * step..(i + 1) * step]).unwrap();
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            a.progress(&mut h);
        }
    }
    assert!(h.lost.is_empty(), "a slow peer was lost: {:?}", h.lost);
    assert!(h.got.is_empty());
    // Then nothing more of the frame: lost, by time.
    let start = Instant::now();
    while h.lost.is_empty() {
        a.progress(&mut h);
        assert!(start.elapsed() < LIMIT, "a peer stalled mid-frame was kept");
    }
    assert!(start.elapsed() >= Duration::from_secs(2), "lost too early");
    assert_eq!(h.lost[0].1, libc::ETIMEDOUT);
    assert!(h.got.is_empty(), "no frame is handed over half");
    let start = Instant::now();
    while !closed(&mut s) {
        a.progress(&mut h);
        assert!(start.elapsed() < LIMIT, "the connection was kept");
    }
}

#[test]
fn a_peer_that_reads_none_of_its_answers_is_lost_after_stall_after() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_max_owed(100);
    let mut h = Rec::default();
    let (mut s, _) = raw_peer(&mut a, &mut h, 80);
    let ack = |p| Transmit {
        peer: p,
        ctrl: Frame::Ack { id: 1, status: 0 }.ctrl(0),
        body: Body::None,
        token: None,
    };
    let (peer, _) = flood_unread(&mut a, &mut h, &mut s, ack);
    assert!(a.owed(peer) >= 100);
    // Held back for it, and it reads nothing: past the stall bound it is lost, which ends
    // whatever of its frames was half here (it would hold its receive for good otherwise).
    a.set_stall_after(Some(Duration::from_millis(300)));
    a.set_look_every(Duration::from_millis(20));
    let start = Instant::now();
    while h.lost.is_empty() {
        a.progress(&mut h);
        assert!(
            start.elapsed() < LIMIT,
            "a peer reading none of its answers was kept"
        );
    }
    assert_eq!(h.lost[0].1, libc::ETIMEDOUT);
}

/// Reads one handshake message from a raw socket while every net of `nets` progresses.
fn read_hs_all(nets: &mut [(&mut Net, &mut Rec)], s: &mut StdStream) -> Hs {
    s.set_nonblocking(true).unwrap();
    let mut ans = [0u8; hello::LEN];
    let mut got = 0;
    let start = Instant::now();
    while got < ans.len() {
        for (n, h) in nets.iter_mut() {
            n.progress(*h);
        }
        match s.read(&mut ans[got..]) {
            Ok(0) => panic!("closed before an answer ({got} bytes)"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("handshake: {e}"),
        }
        assert!(start.elapsed() < LIMIT, "no answer to the handshake");
    }
    s.set_nonblocking(false).unwrap();
    Hs::decode(&ans).expect("a handshake message")
}

/// A holder of the key that claims another holder's address, before that one ever connected:
/// its proof of the key says it is one of the holders, not which. The call-back to the
/// address it claims (whose endpoint opened no such connection) refuses it; the real holder
/// then connects, and its frames arrive.
#[test]
fn a_key_holder_claiming_another_holders_address_is_refused() {
    let key = b"a key both holders and the impostor have".to_vec();
    let mut a = Net::bind(lo()).unwrap();
    let mut c = Net::bind(lo()).unwrap();
    a.set_auth_key(Some(key.clone()));
    c.set_auth_key(Some(key.clone()));
    let (mut ha, mut hc) = (Rec::default(), Rec::default());
    let claimed = c.local_addr();
    let (nonce, rand) = (4242, [5u8; hello::RAND]);
    let mut s = StdStream::connect(a.local_addr()).unwrap();
    let greet = Hs::Hello {
        addr: claimed,
        nonce,
        rand,
        keyed: true,
    };
    s.write_all(&greet.encode()).unwrap();
    let Hs::Challenge {
        nonce: a_nonce,
        rand: a_rand,
        ..
    } = read_hs_all(&mut [(&mut a, &mut ha), (&mut c, &mut hc)], &mut s)
    else {
        panic!("no challenge");
    };
    let mac = hello::Transcript {
        conn_rand: &rand,
        acc_rand: &a_rand,
        conn_addr: claimed,
        acc_addr: a.local_addr(),
        conn_nonce: nonce,
        acc_nonce: a_nonce,
    }
    .mac(&key, hello::Side::Connector);
    s.write_all(&Hs::Proof { mac }.encode()).unwrap();
    let ans = read_hs_all(&mut [(&mut a, &mut ha), (&mut c, &mut hc)], &mut s);
    assert_eq!(
        ans,
        Hs::Reject {
            reason: hello::reason::UNVERIFIED
        }
    );
    assert_eq!(up_conns(&a), 0, "the impostor's connection is up");
    // The real holder of that address.
    let pa = c.peer(a.local_addr());
    c.send(msg(pa, 1, Body::Owned(vec![1; 10]), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut c, &mut hc)],
        "the real holder's frame",
        |h| h[0].got.len() == 1,
    );
    assert!(ha.lost.is_empty() && hc.lost.is_empty());
}

/// Many peers that connect once and go quiet would each hold a 64 KiB read buffer for as long
/// as their connection lives. A connection idle since the last look, with nothing buffered,
/// gives its buffer back; its next frame arrives whole all the same.
#[test]
fn an_idle_connection_gives_its_read_buffer_back() {
    let mut a = Net::bind(lo()).unwrap();
    let mut b = Net::bind(lo()).unwrap();
    a.set_look_every(Duration::from_millis(20));
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pa = b.peer(a.local_addr());
    b.send(msg(pa, 1, Body::Owned(pattern(1, 100)), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "the first frame",
        |h| h[0].got.len() == 1,
    );
    let held = |n: &Net| n.conns.iter().map(|(_, c)| c.rbuf.len()).sum::<usize>();
    assert_eq!(held(&a), super::RBUF);
    // Quiet: two looks at least (the first sees the frame's read), by time.
    let start = Instant::now();
    while held(&a) > 0 {
        a.progress(&mut ha);
        b.progress(&mut hb);
        assert!(
            start.elapsed() < LIMIT,
            "an idle connection kept its buffer"
        );
    }
    b.send(msg(pa, 2, Body::Owned(pattern(2, 3000)), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "a frame after the buffer went",
        |h| h[0].got.len() == 2,
    );
    assert_eq!(ha.got[1].3, pattern(2, 3000));
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}

/// A restarted peer (a new nonce) replaces a connection that stopped in the middle of a
/// frame, and sends a frame right after its call-back vouched for it: the old connection's
/// loss reaches the handler before that frame. Read first, the new frame came while the old
/// one's body was still expected, and took its place (the engine now refuses that as a
/// second stream; the order is what keeps a restarted peer's first frame).
#[test]
fn a_replaced_connections_loss_comes_before_the_new_ones_frames() {
    let mut a = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let (mut s1, me) = raw_peer(&mut a, &mut ha, 1);
    // Half a frame on the first connection.
    let half = Frame::Msg {
        id: 7,
        tag: 0,
        data: 0,
        flags: 0,
    }
    .ctrl(1 << 16);
    s1.write_all(half.as_bytes()).unwrap();
    s1.write_all(&[1; 100]).unwrap();
    drive(&mut [(&mut a, &mut ha)], "the first frame's start", |h| {
        h[0].open.len() == 1
    });
    // The same address again with a new nonce; its call-back answered by hand, so that the
    // frame behind the VOUCH is in the socket before `a` reads either.
    let l = StdListener::bind(me).expect("the raw peer's address again");
    l.set_nonblocking(true).unwrap();
    let mut s2 = StdStream::connect(a.local_addr()).unwrap();
    let src = s2.local_addr().unwrap();
    s2.write_all(&hello(me, 2)).unwrap();
    let start = Instant::now();
    let mut c = loop {
        a.progress(&mut ha);
        if let Ok((c, _)) = l.accept() {
            break c;
        }
        assert!(start.elapsed() < LIMIT, "no call-back");
    };
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; hello::LEN];
    let mut got = 0;
    while got < b.len() {
        a.progress(&mut ha);
        match c.read(&mut b[got..]) {
            Ok(0) => panic!("the call-back closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("call-back: {e}"),
        }
        assert!(start.elapsed() < LIMIT, "no VERIFY");
    }
    let to = a.local_addr();
    assert_eq!(Hs::decode(&b), Ok(Hs::Verify { src, to, nonce: 2 }));
    let whole = Frame::Msg {
        id: 9,
        tag: 0,
        data: 0,
        flags: 0,
    }
    .ctrl(10);
    c.write_all(&Hs::Vouch { yes: true }.encode()).unwrap();
    s2.write_all(whole.as_bytes()).unwrap();
    s2.write_all(&[2; 10]).unwrap();
    drive(
        &mut [(&mut a, &mut ha)],
        "the new connection's frame",
        |h| h[0].events.contains(&("ctrl", 9)),
    );
    let lost = ha.events.iter().position(|e| e.0 == "lost");
    let new = ha.events.iter().position(|&e| e == ("ctrl", 9));
    assert!(
        lost.is_some() && lost < new,
        "the old connection's loss first: {:?}",
        ha.events
    );
    drop(s1);
}

/// A peer that keeps a frame coming a few bytes at a time, never silent for `stall_after`,
/// is lost all the same once the frame has taken `FRAME_STALLS` times that: before, each byte
/// restarted the stall, and one byte every few minutes held the receive it matched for ever.
#[test]
fn a_frame_trickling_in_is_lost_after_frame_stalls_times_stall_after() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_stall_after(Some(Duration::from_millis(200)));
    a.set_look_every(Duration::from_millis(20));
    let mut h = Rec::default();
    let (mut s, _) = raw_peer(&mut a, &mut h, 79);
    s.set_nonblocking(true).unwrap();
    let body = pattern(4, 64 << 10);
    let ctrl = msg(0, 1, Body::Owned(body.clone()), None).ctrl;
    let frame = [ctrl.to_vec(), body].concat();
    // A few bytes every 50 ms, a quarter of the stall: never a stall, and the frame is never
    // finished (it would take minutes).
    let start = Instant::now();
    let mut off = 0;
    while h.lost.is_empty() {
        s.write_all(&frame[off..off + 8]).unwrap();
        off += 8;
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until && h.lost.is_empty() {
            a.progress(&mut h);
        }
        assert!(start.elapsed() < LIMIT, "a trickling peer was kept");
    }
    assert_eq!(h.lost[0].1, libc::ETIMEDOUT);
    assert!(h.got.is_empty(), "no frame is handed over half");
}

/// A receiver that holds its sender back (it answers `Sink::Wait`, stops reading, and its
/// kernel shrinks the window to zero) for four times `dead_after` is alive: its kernel
/// answers every zero-window probe. Nothing is lost. With `TCP_USER_TIMEOUT` armed, the
/// sender's kernel ended the connection after `dead_after` of probing, and the frames it
/// had already taken (their sends complete) were gone with it.
#[test]
fn a_receiver_holding_us_back_past_dead_after_loses_nothing() {
    let dead = Duration::from_millis(500);
    let net = || {
        let mut n = Net::bind(lo()).unwrap();
        n.set_dead_after(Some(dead));
        n.set_look_every(Duration::from_millis(20));
        n
    };
    let (mut a, mut b) = (net(), net());
    let mut ha = Rec::default();
    let mut hb = Rec::holding();
    let pb = a.peer(b.local_addr());
    // More than both kernels' buffers hold: the sender's queue stays full.
    let bodies: Vec<Vec<u8>> = (0..400u32).map(|i| pattern(i, 64 << 10)).collect();
    for (i, body) in bodies.iter().enumerate() {
        a.send(msg(
            pb,
            i as u32,
            Body::Owned(body.clone()),
            Some(u64::from(i as u32)),
        ));
    }
    let start = Instant::now();
    while start.elapsed() < dead * 4 {
        a.progress(&mut ha);
        b.progress(&mut hb);
        assert!(
            ha.lost.is_empty() && hb.lost.is_empty(),
            "{:?} {:?}",
            ha.lost,
            hb.lost
        );
    }
    assert!(
        hb.got.is_empty() && hb.offers > 0,
        "the receiver held the first frame"
    );
    assert!(a.queued(pb) > 0, "the sender was held back");
    hb.held = false;
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "every frame",
        |h| h[1].got.len() == bodies.len() || !h[0].lost.is_empty(),
    );
    assert!(
        ha.lost.is_empty() && hb.lost.is_empty(),
        "{:?} {:?}",
        ha.lost,
        hb.lost
    );
    hb.assert_got_in_order(&bodies);
}

/// `a` connects to `b` with a first frame (`token` on it), driven until `b` has it: the
/// connection is up. Returns `a`'s peer id for `b`.
fn first_frame(a: &mut Net, ha: &mut Rec, b: &mut Net, hb: &mut Rec, token: Option<u64>) -> PeerId {
    let pb = a.peer(b.local_addr());
    a.send(msg(pb, 0, Body::Owned(pattern(0, 100)), token));
    drive(&mut [(a, ha), (b, hb)], "the first frame", |h| {
        h[1].got.len() == 1
    });
    pb
}

/// Two Nets, `a` lower-addressed (it wins a simultaneous connect), with `a`'s connection
/// to `b` up and `b`'s frame 1 held back by `a` (flow control: `a` reads on no further).
struct HeldBack {
    a: Net,
    b: Net,
    ha: Rec,
    hb: Rec,
    pa: PeerId,
    pb: PeerId,
}

fn held_back(handshake: Option<Duration>) -> HeldBack {
    let (mut a, mut b) = (Net::bind(lo()).unwrap(), Net::bind(lo()).unwrap());
    if a.key > b.key {
        std::mem::swap(&mut a, &mut b);
    }
    if let Some(d) = handshake {
        b.set_handshake_timeout(d);
    }
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = first_frame(&mut a, &mut ha, &mut b, &mut hb, None);
    let pa = b.peer(a.local_addr());
    ha.mode = Mode::Hold;
    ha.held = true;
    b.send(msg(pa, 1, Body::Owned(pattern(1, 100)), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's frame held",
        |h| h[0].offers >= 1,
    );
    HeldBack {
        a,
        b,
        ha,
        hb,
        pa,
        pb,
    }
}

impl HeldBack {
    /// `a` replaces its old connection, lets the held frame go, and takes `b`'s frame 2
    /// (sent on the new connection), frame 1 gone with the old one; `b` lost only that.
    fn replaced_and_frame_2_taken(&mut self) {
        let HeldBack {
            a, b, ha, hb, pb, ..
        } = self;
        drive(
            &mut [(&mut *a, &mut *ha), (&mut *b, &mut *hb)],
            "a replacing its old connection",
            |h| !h[0].lost.is_empty() || h[1].lost.len() > 1,
        );
        ha.held = false;
        drive(
            &mut [(&mut *a, &mut *ha), (&mut *b, &mut *hb)],
            "b's new frame",
            |h| h[0].got.iter().any(|g| g.1 == 2) || h[1].lost.len() > 1,
        );
        assert_eq!(
            hb.lost.len(),
            1,
            "b lost only the connection it dropped: {:?}",
            hb.lost
        );
        assert_eq!(ha.lost, [(*pb, libc::ECONNRESET)]);
        let got: Vec<u32> = ha.got.iter().map(|g| g.1).collect();
        assert_eq!(got, [2], "the frame of the dropped connection went with it");
        assert!(ha.got[0].3 == pattern(2, 100));
    }
}

/// A loss only one side saw: `a` holds `b`'s frame back on the connection `a` opened (so it
/// does not read on, and does not see `b` close it), `b` drops that connection and
/// connects again to send more. `b`'s claim is a reconnect: `a` replaces its old connection
/// and takes the new frame. It used to be refused as the losing half of a simultaneous
/// connect (`a` addresses lower), and `b` lost everything it sent meanwhile after the
/// handshake timeout.
#[test]
fn a_reconnect_after_a_loss_only_one_side_saw_replaces_the_old_connection() {
    let mut t = held_back(None);
    let k = t.b.peers[t.pa].conn.expect("b's connection to a");
    t.b.fail_conn(k, libc::ECONNRESET, "dropped by the test");
    t.b.send(msg(t.pa, 2, Body::Owned(pattern(2, 100)), None));
    t.replaced_and_frame_2_taken();
}

/// As above, when the old connection still looks established as the claim is proven (its
/// FIN not yet arrived, or its RST lost: here b's socket is kept open behind its back by a
/// second descriptor, so none is sent): `a` refuses the claim as a duplicate, and `b`,
/// whose wait for `a`'s connection then ends with none, dials once more, by when the old
/// connection is seen closed and is replaced. It used to lose everything it had posted.
#[test]
fn a_reconnect_refused_before_the_old_connection_closed_is_tried_again() {
    let mut t = held_back(Some(Duration::from_millis(1500)));
    let k = t.b.peers[t.pa].conn.expect("b's connection to a");
    // SAFETY: dup of a socket b owns; the copy is closed below.
    let kept = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&t.b.conns[k].sock)) };
    assert!(kept >= 0);
    t.b.fail_conn(k, libc::ECONNRESET, "dropped by the test");
    t.b.send(msg(t.pa, 2, Body::Owned(pattern(2, 100)), None));
    let start = Instant::now();
    while t.b.peers[t.pa].wait_until.is_none() && start.elapsed() < LIMIT {
        t.a.progress(&mut t.ha);
        t.b.progress(&mut t.hb);
    }
    assert!(
        t.b.peers[t.pa].wait_until.is_some(),
        "a refused b's claim as a duplicate"
    );
    // SAFETY: the copy made above, closed once: the old connection's FIN goes now.
    unsafe { libc::close(kept) };
    t.replaced_and_frame_2_taken();
}

/// The one connection `progress` reads directly leaves epoll (its arrivals then cost the
/// sender's kernel no epoll callback), and is back in before anyone sleeps on the set: an
/// arrival after `arm` makes epoll ready. Never out while a sleeper is counted, nor once the
/// set was handed to the application.
#[test]
fn the_connection_read_directly_leaves_epoll_only_while_no_one_sleeps_on_it() {
    let (mut a, mut b) = (Net::bind(lo()).unwrap(), Net::bind(lo()).unwrap());
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    first_frame(&mut a, &mut ha, &mut b, &mut hb, None);
    let pa = b.peer(a.local_addr());
    // Within EPOLL_EVERY_MS of the last epoll look, a's progress reads the connection itself.
    let start = Instant::now();
    while a.parked.is_none() && start.elapsed() < LIMIT {
        a.progress(&mut ha);
    }
    let k = a.parked.expect("a took its connection out of epoll");
    assert!(a.conns.contains(k) && a.gate.out());
    // A sleeper arms first: the connection is back, and an arrival wakes epoll.
    a.arm();
    assert!(a.parked.is_none() && !a.gate.out());
    b.send(msg(pa, 1, Body::Owned(pattern(1, 100)), None));
    let mut events = mio::Events::with_capacity(8);
    let woke = (0..100).any(|_| {
        b.progress(&mut hb);
        a.poll
            .poll(&mut events, Some(Duration::from_millis(100)))
            .unwrap();
        events.iter().any(|e| e.token() == mio::Token(k + 1))
    });
    assert!(woke, "an arrival after arm made epoll ready");
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "b's frame",
        |h| h[0].got.len() == 1,
    );
    // While a sleeper is counted, it stays in.
    a.gate.enter();
    for _ in 0..10_000 {
        a.progress(&mut ha);
    }
    assert!(a.parked.is_none(), "taken out under a sleeper");
    a.gate.leave();
    // A thread that sleeps between arrivals (arming every 64 reads, as fi_cq_sread does)
    // never takes it out: each sleep would cost an epoll_ctl out and another back in.
    for _ in 0..100 {
        a.arm();
        for _ in 0..64 {
            a.progress(&mut ha);
        }
        assert!(a.parked.is_none(), "taken out between two sleeps");
    }
    // Parked, then its peer goes: the direct read sees it, and nothing stays out.
    let start = Instant::now();
    while a.parked.is_none() && start.elapsed() < LIMIT {
        a.progress(&mut ha);
    }
    assert!(a.parked.is_some());
    drop(b);
    drive(&mut [(&mut a, &mut ha)], "b's loss", |h| {
        !h[0].lost.is_empty()
    });
    assert!(
        a.parked.is_none() && !a.gate.out(),
        "a gone connection left the gate out"
    );
    // Handed to the application: in for good.
    let mut c = Net::bind(lo()).unwrap();
    let mut hc = Rec::default();
    let pc = a.peer(c.local_addr());
    a.send(msg(pc, 0, Body::Owned(pattern(0, 100)), None));
    drive(
        &mut [(&mut a, &mut ha), (&mut c, &mut hc)],
        "a's frame to c",
        |h| h[1].got.len() == 1,
    );
    a.keep_in_epoll();
    for _ in 0..10_000 {
        a.progress(&mut ha);
    }
    assert!(
        a.parked.is_none(),
        "taken out of a set the application sleeps on"
    );
}

/// `shutdown` writes out answers, and the request it had begun: the requests still queued
/// were ended `FI_ECANCELED` by the engine's close, and must not arrive (an application that
/// sends them again would deliver them twice). What arrives is exactly what was reported
/// written.
#[test]
fn shutdown_drops_the_requests_not_yet_written() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut a, mut b) = (Net::bind(lo()).unwrap(), Net::bind(lo()).unwrap());
    let (mut ha, mut hb) = (Rec::default(), Rec::default());
    let pb = first_frame(&mut a, &mut ha, &mut b, &mut hb, Some(0));
    // b reads as fast as it can, in a thread of its own, from when a shuts down until a
    // is gone.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let go = std::sync::Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, go) = (stop.clone(), go.clone());
        std::thread::spawn(move || {
            while !go.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            while hb.lost.is_empty() && !stop.load(Ordering::Relaxed) {
                b.progress(&mut hb);
            }
            hb
        })
    };
    // Far more than the kernels hold: most stay queued in a.
    let n = 400u32;
    for i in 1..=n {
        a.send(msg(
            pb,
            i,
            Body::Owned(pattern(i, 64 << 10)),
            Some(u64::from(i)),
        ));
    }
    go.store(true, Ordering::Release);
    a.shutdown(Instant::now() + Duration::from_secs(5));
    a.progress(&mut ha);
    let start = Instant::now();
    while !reader.is_finished() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let hb = reader.join().unwrap();
    let written: Vec<u64> = ha.sent.iter().map(|s| s.1).filter(|&t| t > 0).collect();
    let got: Vec<u64> = hb
        .got
        .iter()
        .map(|g| u64::from(g.1))
        .filter(|&i| i > 0)
        .collect();
    assert!(written.len() < n as usize, "every request was written");
    assert_eq!(got, written, "what arrived is what was reported written");
    for (_, id, _, bytes) in &hb.got {
        assert!(*bytes == pattern(*id, if *id == 0 { 100 } else { 64 << 10 }));
    }
}

/// A large frame from a healthy sender that we do not read for longer than the frame bound
/// (an application computing between progress calls) is not cut: the first read after the
/// pause brings a socket's worth, which restarts the bound.
#[test]
fn a_large_frame_we_kept_waiting_is_not_cut() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_stall_after(Some(Duration::from_millis(100)));
    a.set_look_every(Duration::from_millis(10));
    let mut h = Rec::default();
    let (mut s, _) = raw_peer(&mut a, &mut h, 80);
    let body = pattern(5, 8 << 20);
    let ctrl = msg(0, 1, Body::Owned(body.clone()), None).ctrl;
    let frame = [ctrl.to_vec(), body.clone()].concat();
    let writer = std::thread::spawn(move || {
        s.write_all(&frame).unwrap();
        s
    });
    drive(&mut [(&mut a, &mut h)], "the frame's start", |h| {
        h[0].open.len() == 1
    });
    // Five times the stall bound, more than the frame bound (four), with no progress call.
    std::thread::sleep(Duration::from_millis(500));
    drive(&mut [(&mut a, &mut h)], "the whole frame", |h| {
        h[0].got.len() == 1 || !h[0].lost.is_empty()
    });
    assert!(
        h.lost.is_empty(),
        "a frame we kept waiting was cut: {:?}",
        h.lost
    );
    assert!(h.got[0].3 == body, "the frame's bytes");
    drop(writer.join().unwrap());
}

/// Accepts one connection `a` makes to raw listener `l`, driving `a` meanwhile.
fn accept_from(l: &StdListener, a: &mut Net, ha: &mut Rec) -> StdStream {
    l.set_nonblocking(true).unwrap();
    let start = Instant::now();
    loop {
        a.progress(ha);
        match l.accept() {
            Ok((c, _)) => {
                c.set_nonblocking(false).unwrap();
                c.set_read_timeout(Some(LIMIT)).unwrap();
                return c;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        assert!(start.elapsed() < LIMIT, "no connection");
    }
}

/// A raw listener `a` is made to send a frame to: the listener, its address, the peer it is
/// to `a`, `a`'s connection as the listener accepted it, and the HELLO read from it.
fn hello_to_raw_listener(
    a: &mut Net,
    ha: &mut Rec,
) -> (StdListener, SocketAddr, PeerId, StdStream, Hs) {
    let l = StdListener::bind(lo()).unwrap();
    let me = l.local_addr().unwrap();
    let p = a.peer(me);
    a.send(msg(p, 1, Body::Owned(pattern(1, 10)), Some(1)));
    let mut s = accept_from(&l, a, ha);
    let hs = read_hs(a, ha, &mut s);
    (l, me, p, s, hs)
}

/// Connections in bring-up and peers waited for: what `settling` must count.
fn unsettled(a: &Net) -> usize {
    a.conns.iter().filter(|(_, c)| c.st != St::Up).count()
        + a.peers.iter().filter(|p| p.wait_until.is_some()).count()
}

/// Closes `s` with a reset (no linger), as a peer that vanishes does.
fn reset(s: StdStream) {
    let off = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid option of the right size on a socket we own.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&off as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// A connection of ours to a stranger hands it our nonce and our source port (our HELLO),
/// and a stranger on our host may open a connection from that same port to a third endpoint
/// and claim to be us there. The call-back from that endpoint names itself: ours went to the
/// stranger, not to it, so we vouch no; asked by the stranger, whose it is, yes.
#[test]
fn a_connection_to_a_stranger_vouches_only_for_where_it_went() {
    let mut e = Net::bind(lo()).unwrap();
    let mut he = Rec::default();
    let (_stranger, q, _, s, hs) = hello_to_raw_listener(&mut e, &mut he);
    let src = s.peer_addr().unwrap();
    let Hs::Hello { nonce, .. } = hs else {
        panic!("no HELLO: {hs:?}");
    };
    // The stranger stays silent: our connection to it waits in its handshake.
    let elsewhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    // A listener on a wildcard with the stranger's port: not where ours went either.
    let wildcard = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), q.port());
    for (to, yes) in [(elsewhere, false), (wildcard, false), (q, true)] {
        let mut v = StdStream::connect(e.local_addr()).unwrap();
        v.set_read_timeout(Some(LIMIT)).unwrap();
        v.write_all(&Hs::Verify { src, to, nonce }.encode())
            .unwrap();
        let ans = read_hs(&mut e, &mut he, &mut v);
        assert_eq!(ans, Hs::Vouch { yes }, "asked for {to}");
    }
}

/// A peer that answers our connection REJECT DUPLICATE, then proves a connection of its own
/// and resets it before our ACCEPT, again and again: each round we connect again, and what
/// we count as unsettled stays what is; then our connection is accepted and stays up past
/// the handshake timeout a wait left over would have ended it at.
#[test]
fn a_peer_that_rejects_and_resets_in_turn_leaves_nothing_counted_twice() {
    let mut a = Net::bind(lo()).unwrap();
    a.set_handshake_timeout(Duration::from_millis(400));
    let mut ha = Rec::default();
    let (l, me, p, mut s, hs) = hello_to_raw_listener(&mut a, &mut ha);
    assert!(matches!(hs, Hs::Hello { .. }));
    s.write_all(
        &Hs::Reject {
            reason: hello::reason::DUPLICATE,
        }
        .encode(),
    )
    .unwrap();
    for round in 0..20 {
        // Ours to it, proven by its call-back, reset before it is accepted.
        let mut c = StdStream::connect(a.local_addr()).unwrap();
        c.write_all(&hello(me, 42)).unwrap();
        let mut v = accept_from(&l, &mut a, &mut ha);
        assert!(matches!(
            read_hs(&mut a, &mut ha, &mut v),
            Hs::Verify { .. }
        ));
        v.write_all(&Hs::Vouch { yes: true }.encode()).unwrap();
        reset(c);
        // `a` connects again; the peer rejects again, except the last time.
        let mut s = accept_from(&l, &mut a, &mut ha);
        assert!(
            matches!(read_hs(&mut a, &mut ha, &mut s), Hs::Hello { .. }),
            "round {round}"
        );
        if round < 19 {
            s.write_all(
                &Hs::Reject {
                    reason: hello::reason::DUPLICATE,
                }
                .encode(),
            )
            .unwrap();
            let start = Instant::now();
            while a.peers[p].conn.is_some() {
                a.progress(&mut ha);
                assert!(start.elapsed() < LIMIT, "the REJECT was not read");
            }
            assert_eq!(a.settling, unsettled(&a), "round {round}");
            continue;
        }
        s.write_all(&Hs::Accept { nonce: 42 }.encode()).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1200) {
            a.progress(&mut ha);
        }
        assert!(ha.lost.is_empty(), "lost: {:?}", ha.lost);
        assert_eq!(up_conns(&a), 1);
        assert_eq!(a.settling, unsettled(&a));
        assert_eq!(a.settling, 0);
    }
}

/// An endpoint listening on a wildcard address asks its call-back about the concrete address
/// the claim's connection reached, which the honest claimant's connection went to: reached,
/// vouched for, and the frame delivered.
#[test]
fn a_peer_listening_on_a_wildcard_is_reached_and_vouches_for_the_address_dialled() {
    let mut b = Net::bind("0.0.0.0:0".parse().unwrap()).unwrap();
    let mut hb = Rec::default();
    let port = b.local_addr().port();
    let mut a = Net::bind(lo()).unwrap();
    let mut ha = Rec::default();
    let p = a.peer(SocketAddr::new(lo().ip(), port));
    a.send(msg(p, 1, Body::Owned(pattern(1, 10)), Some(1)));
    drive(
        &mut [(&mut a, &mut ha), (&mut b, &mut hb)],
        "the frame",
        |h| !h[1].got.is_empty(),
    );
    assert!(ha.lost.is_empty() && hb.lost.is_empty());
}
