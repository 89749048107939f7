//! Frames from a hostile peer: a raw sender writes crafted and random messages into an
//! endpoint's ring (bad prefixes, control and body lengths past the slots, pieces with no
//! frame, unknown kinds, frames the engine refuses, descriptors and ranges that wrap the
//! address space or name memory that is not there, a segment header that lies about its
//! address). The endpoint must neither panic (overflow checks are on) nor hang: it drops that
//! sender's lane with a log line where the frame is garbage, and still serves a well-behaved
//! peer afterwards. The raw sender is `xfabric_providers::shm::raw`.

mod common;

use common::*;
use xfabric::errno::*;
use xfabric::kernels::cpu::ring;
use xfabric::*;
use xfabric_core::rdm::wire::{self, Frame, Prefix};
use xfabric_core::rdm::Desc;
use xfabric_core::{RmaIov, RmaIovList};
use xfabric_hmem::{Hmem, Iface};
use xfabric_providers::shm::raw::{
    armed_counts, NamelessClaim, RawPeer, FRAME, PIECE, PIECE_LEN, RELEASE,
};

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV;

/// Warnings captured.
fn setup() {
    warnings::capture();
}

fn drops_logged() -> usize {
    warnings::count("dropping the lane")
}

/// A small xorshift generator: the cases are reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value a hostile peer would pick: near a boundary more often than not.
    fn nasty(&mut self) -> u64 {
        const EDGES: [u64; 9] = [
            0,
            1,
            8,
            1024,
            16384,
            1 << 20,
            u32::MAX as u64,
            u64::MAX - 7,
            u64::MAX,
        ];
        match self.next() % 3 {
            0 => EDGES[(self.next() % EDGES.len() as u64) as usize],
            1 => self.next() % 70_000,
            _ => self.next(),
        }
    }
}

/// Drives the endpoint a while; what arrives is drained, errors included.
fn drain(n: &Node) {
    let mut buf = [CqTaggedEntry::default(); 16];
    for _ in 0..64 {
        match n.cq.read(&mut buf) {
            Err(Error::Avail) => {
                let _ = n.cq.readerr();
            }
            Ok(_) | Err(Error::Again(_)) | Err(Error::Overrun) => {}
            Err(e) => panic!("cq read: {e}"),
        }
    }
}

/// The bytes of a frame's message: its encoded prefix and control part, then `body`.
fn frame(f: &Frame, body: &[u8]) -> Vec<u8> {
    let mut v = f.ctrl(body.len() as u64).as_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A prefix's bytes as a peer writes them (any values).
fn prefix_bytes(p: Prefix) -> Vec<u8> {
    let mut v = Vec::with_capacity(wire::PREFIX);
    v.extend_from_slice(&p.magic.to_le_bytes());
    v.push(p.kind);
    v.push(p.flags);
    v.extend_from_slice(&p.ctrl_len.to_le_bytes());
    v.extend_from_slice(&p.body_len.to_le_bytes());
    v
}

/// A well-behaved peer's tagged message still reaches `n` (at `addr`).
fn serves_a_good_peer(n: &Node, addr: &[u8]) {
    let good = node(CAPS, Progress::Manual);
    let dst = good.add_peer(addr);
    let want = pattern(64, 3);
    let mut m = [0u8; 64];
    // SAFETY: m outlives the completion waited for below.
    n.retry(|| unsafe { n.ep.trecv(&mut m, None, FI_ADDR_UNSPEC, 0xfeed, 0, 999) });
    // SAFETY: want outlives its completion.
    good.retry(|| unsafe { good.ep.tsend(&want, None, dst, 0xfeed, 1) });
    let deadline = std::time::Instant::now() + BOUND;
    let mut buf = [CqTaggedEntry::default(); 8];
    let mut got = false;
    while !got {
        assert!(
            std::time::Instant::now() < deadline,
            "the good peer's message never came"
        );
        let _ = good.cq.read(&mut buf);
        match n.cq.read(&mut buf) {
            Ok(k) => got = buf[..k].iter().any(|e| e.op_context == 999),
            Err(Error::Avail) => {
                let _ = n.cq.readerr();
            }
            Err(_) => {}
        }
    }
    assert!(m == want[..], "the good peer's bytes");
}

/// Progresses `n` until the target dropped `raw`'s lane (bounded).
fn dropped(n: &Node, raw: &RawPeer) -> bool {
    for _ in 0..100 {
        drain(n);
        if !raw.lane_claimed() {
            return true;
        }
    }
    false
}

/// An armed send's release (`RELEASE`: take the frame in armed slot k of the sender's
/// segment) is the peer's word, and so is the slot: a good one delivers the slot's frame and
/// keeps the lane; a slot out of range, a length past the slot, garbage in it, each drop the
/// lane with a log line, and the endpoint goes on.
#[test]
fn armed_slot_releases_are_checked() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let good = frame(
        &Frame::Msg {
            id: 0,
            tag: 5,
            data: 0,
            flags: wire::flags::TAGGED,
        },
        &[7; 8],
    );
    let deliver = |slot: u32| {
        let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
        raw.put_armed(slot as usize, good.len() as u64, &good);
        assert!(raw.send_raw(RELEASE, &slot.to_le_bytes(), 0));
        drain(&n);
        assert!(raw.lane_claimed(), "a good release dropped the lane");
    };
    deliver(3);
    assert_eq!(n.ep.buffered().unexpected, 1);
    // (slot written, length word, its bytes, the release's slot number)
    let cases: Vec<(&str, usize, u64, Vec<u8>, u32)> = vec![
        ("a slot out of range", 0, 0, vec![], 9999),
        ("a slot number past u32's sign", 0, 0, vec![], u32::MAX),
        ("a length past the slot", 4, 5000, vec![], 4),
        ("a length of u64::MAX", 6, u64::MAX, vec![], 6),
        ("garbage in the slot", 5, 40, vec![0xee; 40], 5),
        ("an empty slot", 7, 0, vec![], 7),
    ];
    for (why, slot, len, bytes, rel) in cases {
        let before = drops_logged();
        let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
        raw.put_armed(slot, len, &bytes);
        assert!(
            raw.send_raw(RELEASE, &rel.to_le_bytes(), 0),
            "{why}: ring full"
        );
        assert!(dropped(&n, &raw), "{why}: the lane was not dropped");
        assert!(drops_logged() > before, "{why}: no log line");
    }
    // The endpoint goes on.
    deliver(9);
    assert_eq!(n.ep.buffered().unexpected, 2);
}

#[test]
fn garbage_drops_the_lane_with_a_log_line_and_the_endpoint_goes_on() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let msg = Frame::Msg {
        id: 0,
        tag: 5,
        data: 0,
        flags: wire::flags::TAGGED,
    };
    let good = frame(&msg, &[7; 8]);
    // A message announcing 2^40 bytes with 8 of them there.
    let mut huge = prefix_bytes(Prefix {
        magic: wire::MAGIC,
        kind: 1,
        flags: wire::flags::TAGGED,
        ctrl_len: 24,
        body_len: 1 << 40,
    });
    huge.extend_from_slice(&[0; 24 + 8]);
    let cases: Vec<(&str, u8, Vec<u8>)> = vec![
        ("bad magic", FRAME, vec![0xee; 40]),
        ("short of a prefix", FRAME, vec![]),
        (
            "control part past the slots",
            FRAME,
            prefix_bytes(Prefix {
                magic: wire::MAGIC,
                kind: 1,
                flags: 0,
                ctrl_len: 1000,
                body_len: 0,
            }),
        ),
        ("body past the slots", FRAME, huge),
        ("a piece with no frame", PIECE, vec![1; 100]),
        ("an unknown kind", 99, vec![2; 30]),
        (
            "a control part of the wrong size",
            FRAME,
            prefix_bytes(Prefix {
                magic: wire::MAGIC,
                kind: 2,
                flags: 0,
                ctrl_len: 3,
                body_len: 0,
            })
            .into_iter()
            .chain([0u8; 3])
            .collect(),
        ),
        (
            "data for no transfer",
            FRAME,
            frame(&Frame::Data { rx: 12345 }, &[1; 16]),
        ),
    ];
    for (why, kind, bytes) in cases {
        let before = drops_logged();
        let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
        // A good message first: delivered before the garbage drops the lane.
        assert!(raw.send_raw(FRAME, &good, 64));
        assert!(raw.send_raw(kind, &bytes, 0), "{why}: ring full");
        assert!(dropped(&n, &raw), "{why}: the lane was not dropped");
        assert!(drops_logged() > before, "{why}: no log line");
    }
    // The good messages were delivered (unexpected, tag 5), one per case.
    assert_eq!(n.ep.buffered().unexpected, 8);

    // Acknowledgements and answers naming nothing are ignored: the lane stays.
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    for f in [
        Frame::Ack { id: 77, status: 0 },
        Frame::Cts {
            id: u32::MAX,
            rx: 0,
        },
        Frame::ReadResp { id: 3, status: 5 },
        Frame::AtomicResp { id: 9, status: 0 },
    ] {
        assert!(raw.send_raw(FRAME, &frame(&f, &[]), 0));
    }
    drain(&n);
    assert!(
        raw.lane_claimed(),
        "answers naming nothing dropped the lane"
    );

    // Random messages: random kinds and prefixes, random bytes; a new raw peer whenever the
    // last one was dropped.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        if !raw.lane_claimed() {
            raw = RawPeer::connect(&addr, None).expect("raw peer");
        }
        for _ in 0..8 {
            let kind = [FRAME, FRAME, FRAME, PIECE, 1, 8][(rng.next() % 6) as usize];
            let p = Prefix {
                magic: if rng.next().is_multiple_of(4) {
                    rng.next() as u16
                } else {
                    wire::MAGIC
                },
                kind: (rng.next() % 12) as u8,
                flags: rng.next() as u8,
                ctrl_len: rng.nasty() as u32,
                body_len: rng.nasty(),
            };
            let mut b = if kind == FRAME {
                prefix_bytes(p)
            } else {
                Vec::new()
            };
            let extra = (rng.next() % 300) as usize;
            b.extend((0..extra).map(|_| rng.next() as u8));
            if kind == 8 {
                // BYE would end the lane the proper way; not what this looks at.
                continue;
            }
            let _ = raw.send_raw(kind, &b, 0);
        }
        drain(&n);
    }

    serves_a_good_peer(&n, &addr);
    drop(raw);
}

/// Drives the endpoint until `want` error entries came (bounded); their errnos.
fn errors(n: &Node, want: usize) -> Vec<i32> {
    let mut buf = [CqTaggedEntry::default(); 16];
    let mut errs = Vec::new();
    let deadline = std::time::Instant::now() + BOUND;
    while errs.len() < want {
        assert!(
            std::time::Instant::now() < deadline,
            "{errs:?}: fewer than {want} errors"
        );
        match n.cq.read(&mut buf) {
            Err(Error::Avail) => errs.push(n.cq.readerr().expect("an error entry").err),
            Ok(_) | Err(Error::Again(_)) | Err(Error::Overrun) => {}
            Err(e) => panic!("cq read: {e}"),
        }
    }
    errs
}

/// A descriptor of (address, length) pairs, as shm's `Desc::of_iov` writes them.
fn desc(pairs: &[(u64, u64)]) -> Desc {
    let b: Vec<u8> = pairs
        .iter()
        .flat_map(|&(a, l)| a.to_le_bytes().into_iter().chain(l.to_le_bytes()))
        .collect();
    Desc::new(&b).expect("a descriptor")
}

/// Messages, RMA requests and atomics whose descriptors and ranges wrap the address space,
/// end at its very top or name memory that is not mapped, so that the target's matching,
/// cross-memory-attach copies and range checks see them; `window` is a registered range
/// (`base`, 64 KiB, `key`); `rx` is the address of a receive buffer. Returns the messages
/// written.
fn crafted(raw: &mut RawPeer, rx: u64, base: u64, key: u64) -> usize {
    let descs = [
        desc(&[(u64::MAX - 10, 100)]),
        desc(&[(u64::MAX - 4095, 1 << 20), (rx, 64)]),
        desc(&[(u64::MAX - (1 << 20), 1 << 20)]),
        desc(&[(0x1000, 1 << 20)]),
        desc(&[(rx, u64::MAX)]),
    ];
    let ranges = |addr: u64, len: usize| {
        RmaIovList::from_segs(&[RmaIov { addr, len, key }]).expect("one range")
    };
    let window = ranges(base, 1 << 16);
    let wrapping = ranges(u64::MAX - 10, 100);
    let mut sent = 0;
    for (i, d) in descs.into_iter().enumerate() {
        let id = i as u32;
        let frames = [
            Frame::Rts {
                id,
                tag: 0,
                data: 0,
                len: [100, 1 << 20, u64::MAX][i % 3],
                flags: wire::flags::ACK,
                desc: d,
            },
            Frame::Write {
                id,
                data: 0,
                flags: wire::flags::ACK,
                segs: window,
                desc: d,
            },
            Frame::Write {
                id,
                data: 0,
                flags: wire::flags::ACK,
                segs: wrapping,
                desc: d,
            },
            Frame::Read {
                id,
                segs: window,
                desc: d,
            },
            Frame::Read {
                id,
                segs: wrapping,
                desc: d,
            },
        ];
        for f in frames {
            sent += raw.send_raw(FRAME, &frame(&f, &[]), 64) as usize;
        }
    }
    // Atomics past the window's end and at the top of the address space.
    for addr in [base + (1 << 16) - 4, u64::MAX - 3, u64::MAX] {
        let f = Frame::Atomic {
            id: 9,
            op: 0,
            datatype: 0,
            count: 2,
            addr,
            key,
            flags: wire::flags::ACK,
        };
        sent += raw.send_raw(FRAME, &frame(&f, &[1; 8]), 64) as usize;
    }
    sent
}

#[test]
fn wrapping_descriptors_and_a_lying_header_neither_panic_nor_stop_the_endpoint() {
    setup();
    // Receives for the crafted rendezvous messages to match (tag 0, any source), and a large
    // send's bytes; both outlive the endpoint.
    let mut rx = vec![0u8; 1 << 20];
    let big = vec![5u8; 1 << 20];
    let n = node(CAPS | FI_REMOTE_READ | FI_REMOTE_WRITE, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let window = vec![0u8; 1 << 16];
    // SAFETY: window outlives the registration (dropped after it at the end of the test).
    let mr = unsafe {
        n.domain
            .mr_reg(&window, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 5)
    }
    .expect("mr_reg");
    let base = n.rma_base(&window);
    for i in 0..8 {
        // SAFETY: rx outlives the endpoint.
        n.retry(|| unsafe { n.ep.recv(&mut rx, None, FI_ADDR_UNSPEC, i) });
    }
    let rx_at = rx.as_ptr() as u64;
    // A peer whose segment header claims a mapping at the very top (verifying its pid must
    // not wrap), and one with a true header, whose pid (this process) verifies, so the target
    // does try cross-memory attach on the ranges it is given.
    let mut liar = RawPeer::connect(&addr, Some(u64::MAX - 8)).expect("raw peer");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    drain(&n);
    // Each of the raw peer's five messages matches a receive, whose copy out of a range that
    // wraps (refused before any copy) or is not mapped fails it; RMA requests naming such
    // ranges are answered with errors (to a ring nobody reads).
    assert!(crafted(&mut raw, rx_at, base, mr.key()) > 0);
    let errs = errors(&n, 5);
    assert!(
        errs.iter().all(|&e| e == FI_EINVAL || e == FI_EFAULT),
        "{errs:?}"
    );
    // The liar's pid does not verify, so nothing is copied through it: its messages wait for
    // data through the ring (which never comes) instead.
    assert!(crafted(&mut liar, rx_at, base, mr.key()) > 0);
    drain(&n);

    // The raw peer as a receiver: our large send to it (a rendezvous) is answered with
    // clear-to-sends and acknowledgements naming it and naming nothing.
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    // SAFETY: big outlives the endpoint.
    n.retry(|| unsafe { n.ep.send(&big, None, to_raw, 555) });
    drain(&n);
    for id in 0..4 {
        for f in [
            Frame::Cts { id, rx: u32::MAX },
            Frame::Ack {
                id,
                status: i32::MIN,
            },
        ] {
            let _ = raw.send_raw(FRAME, &frame(&f, &[]), 0);
        }
    }
    drain(&n);
    // Well-formed frames naming bad memory are refused, not garbage: both lanes stay.
    assert!(liar.lane_claimed() && raw.lane_claimed());
    serves_a_good_peer(&n, &addr);
    drop((liar, raw));
    drop(mr);
}

/// Every lane of an endpoint claimed by a process that never names itself: new peers are
/// refused a lane meanwhile, and get one once the endpoint has released the nameless lanes
/// (after `NAMELESS_LANE_MS` of its progress, by time), while a lane that named its peer
/// stays.
#[test]
fn lanes_claimed_without_a_name_are_released_by_time() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let named = RawPeer::connect(&addr, None).expect("raw peer");
    let mut claims = Vec::new();
    while let Some(c) = NamelessClaim::claim(&addr).expect("claim") {
        claims.push(c);
    }
    assert!(!claims.is_empty());
    assert!(RawPeer::connect(&addr, None).is_err(), "a lane left free");
    let start = std::time::Instant::now();
    while claims.iter().any(NamelessClaim::claimed) {
        drain(&n);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "nameless lanes kept"
        );
    }
    assert!(named.lane_claimed(), "the named peer's lane was released");
    let again = RawPeer::connect(&addr, None).expect("a lane after the release");
    drain(&n);
    assert!(again.lane_claimed());
}

/// Mappings of this process of the segments named in `names`.
/// Peers that connect and go, one after another (a process naming a new segment each time,
/// or peers that crash): each one's segment is unmapped once what it wrote was read, so the
/// endpoint does not keep one more mapping per peer that ever came.
#[test]
fn gone_peers_segments_are_unmapped() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    const PEERS: usize = 40;
    let mut names = Vec::new();
    for _ in 0..PEERS {
        let raw = RawPeer::connect(&addr, None).expect("raw peer");
        names.push(raw.name().to_string());
        drain(&n);
        drop(raw);
    }
    let start = std::time::Instant::now();
    while shm_mappings(&names) > 0 {
        drain(&n);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{} mappings of gone peers' segments kept",
            shm_mappings(&names)
        );
    }
}

/// A message of `len` body bytes whose FRAME carries only the first piece of `body`.
fn frame_start(len: usize, body: &[u8]) -> Vec<u8> {
    let f = Frame::Msg {
        id: 1,
        tag: 0,
        data: 0,
        flags: 0,
    };
    let mut v = f.ctrl(len as u64).as_bytes().to_vec();
    v.extend_from_slice(&body[..PIECE_LEN]);
    v
}

/// Writes the pieces of `body` after its first.
fn rest(raw: &mut RawPeer, body: &[u8]) {
    for piece in body[PIECE_LEN..].chunks(PIECE_LEN) {
        assert!(raw.send_raw(PIECE, piece, 0), "room for a piece");
    }
}

/// How each receive ended (by context): Ok(len) or Err(errno).
type Ends = std::collections::HashMap<usize, std::result::Result<usize, i32>>;

/// Drives `n` a while, noting how receives ended.
fn note(n: &Node, ends: &mut Ends) {
    let mut buf = [CqTaggedEntry::default(); 8];
    for _ in 0..64 {
        match n.cq.read(&mut buf) {
            Ok(k) => {
                for e in &buf[..k] {
                    ends.insert(e.op_context, Ok(e.len));
                }
            }
            Err(Error::Avail) => {
                let e = n.cq.readerr().expect("an error entry");
                ends.insert(e.op_context, Err(e.err));
            }
            Err(_) => {}
        }
    }
}

/// Drives `n` until receive `ctx` ended; how.
fn ended(n: &Node, ends: &mut Ends, ctx: usize) -> std::result::Result<usize, i32> {
    let deadline = std::time::Instant::now() + BOUND;
    loop {
        if let Some(&r) = ends.get(&ctx) {
            return r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "receive {ctx} never ended"
        );
        note(n, ends);
    }
}

/// Two lanes naming one peer, a message half arrived on each: the second lane takes the
/// first's place (the first goes with the peer's operations, as for a peer lost), and no
/// body is finished by the other lane's pieces. Before, the second frame took the first's
/// place in the engine, the first lane's pieces completed the second's receive with 16 of
/// its 64 KiB, and the second lane's pieces then wrote into that completed receive.
#[test]
fn a_second_lane_for_one_peer_never_finishes_the_firsts_body() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut ends = Ends::new();
    const LEN: usize = 4 * PIECE_LEN;
    let (a, b) = (pattern(LEN, 1), pattern(LEN, 2));
    let mut r1 = vec![0u8; LEN];
    let mut r2 = vec![0u8; LEN];
    // SAFETY: both buffers outlive the receives (each ends below before they go).
    n.retry(|| unsafe { n.ep.recv(&mut r1, None, FI_ADDR_UNSPEC, 1) });
    // SAFETY: as above.
    n.retry(|| unsafe { n.ep.recv(&mut r2, None, FI_ADDR_UNSPEC, 2) });
    let mut l1 = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(l1.send_raw(FRAME, &frame_start(LEN, &a), 0));
    note(&n, &mut ends);
    let mut l2 = l1.another_lane().expect("a second lane");
    assert!(l2.send_raw(FRAME, &frame_start(LEN, &b), 0));
    note(&n, &mut ends);
    rest(&mut l1, &a);
    note(&n, &mut ends);
    rest(&mut l2, &b);
    // The first lane's receive fails with its lane; the second's gets its whole message.
    assert!(
        ended(&n, &mut ends, 1).is_err(),
        "the first lane's receive failed"
    );
    assert_eq!(
        ended(&n, &mut ends, 2),
        Ok(LEN),
        "the second lane's receive"
    );
    assert!(
        r2 == b,
        "the second receive holds the second lane's message, all of it"
    );
    assert!(!l1.lane_claimed(), "the first lane was dropped");
    // Nothing either lane writes now reaches a completed receive.
    let snapshot = r2.clone();
    let _ = l1.send_raw(PIECE, &a[..PIECE_LEN], 0);
    let _ = l2.send_raw(PIECE, &a[..PIECE_LEN], 0);
    note(&n, &mut ends);
    assert!(r2 == snapshot, "a completed receive changed");
    serves_a_good_peer(&n, &addr);
}

/// A second CONNECT on a lane already named drops the lane (its frames would be taken for
/// another peer's).
#[test]
fn a_second_connect_on_a_named_lane_drops_it() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    drain(&n);
    let other = RawPeer::connect(&addr, None).expect("another raw peer");
    drain(&n);
    let before = drops_logged();
    assert!(raw.connect_again(other.name()));
    assert!(dropped(&n, &raw), "the renamed lane was dropped");
    assert!(drops_logged() > before);
    assert!(other.lane_claimed(), "the peer it named keeps its own lane");
    serves_a_good_peer(&n, &addr);
}

/// A peer found gone (its lock free) while a message of it was half arrived: the receive
/// fails, and the pieces it writes afterwards land nowhere. Before, the lane kept its frame's
/// sink into the failed receive's memory and wrote each later piece there.
#[test]
fn pieces_after_a_peer_is_gone_land_nowhere() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut ends = Ends::new();
    const LEN: usize = 4 * PIECE_LEN;
    let a = pattern(LEN, 5);
    let mut r = vec![0u8; LEN];
    // SAFETY: r outlives the receive (it ends below).
    n.retry(|| unsafe { n.ep.recv(&mut r, None, FI_ADDR_UNSPEC, 7) });
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(raw.send_raw(FRAME, &frame_start(LEN, &a), 0));
    note(&n, &mut ends);
    raw.play_dead();
    let err = ended(&n, &mut ends, 7).expect_err("the receive of a gone peer's message fails");
    assert_eq!(err, FI_ECONNRESET, "errno");
    let snapshot = r.clone();
    rest(&mut raw, &a);
    for _ in 0..4 {
        note(&n, &mut ends);
    }
    assert!(
        r == snapshot,
        "pieces written after the loss reached the failed receive"
    );
    serves_a_good_peer(&n, &addr);
}

/// A peer that goes while another open file of its segment waits for the segment's lock
/// (`flock(LOCK_EX)`, which the kernel hands over the moment the owner lets go, or a child the
/// owner forked without exec sharing its open file) is still found gone: the lock is no longer
/// its owner's own. Its half-arrived message's receive fails. Before, the lock held by the
/// waiter kept the peer alive for good, and the receive never ended.
#[test]
fn a_lock_taken_after_a_peer_went_does_not_keep_it_alive() {
    use std::os::fd::AsRawFd;
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut ends = Ends::new();
    const LEN: usize = 4 * PIECE_LEN;
    let a = pattern(LEN, 6);
    let mut r = vec![0u8; LEN];
    // SAFETY: r outlives the receive (it ends below).
    n.retry(|| unsafe { n.ep.recv(&mut r, None, FI_ADDR_UNSPEC, 7) });
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(raw.send_raw(FRAME, &frame_start(LEN, &a), 0));
    note(&n, &mut ends);
    let f = std::fs::File::open(format!("/dev/shm/{}", raw.name())).expect("open the segment");
    let (took, got) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: flock on a descriptor this thread owns.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock");
        took.send(()).unwrap();
        f
    });
    raw.play_dead();
    got.recv_timeout(BOUND).expect("the waiter took the lock");
    let err = ended(&n, &mut ends, 7).expect_err("the receive of a gone peer's message fails");
    assert_eq!(err, FI_ECONNRESET, "errno");
    drop(waiter.join().unwrap());
    serves_a_good_peer(&n, &addr);
}

/// A peer's write arriving in pieces as its region closes: the pieces after the close land
/// nowhere (the application may have freed the memory) and the peer is told the write
/// failed. Before, the later pieces went on into the closed region.
#[test]
fn a_write_arriving_in_pieces_as_its_region_closes_stops_at_the_close() {
    setup();
    let n = node(CAPS | FI_REMOTE_WRITE, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    const LEN: usize = 4 * PIECE_LEN;
    let window = vec![0u8; LEN];
    // SAFETY: window outlives the registration (dropped below, before it).
    let mr = unsafe { n.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 6) }.expect("mr_reg");
    let base = n.rma_base(&window);
    let segs = RmaIovList::from_segs(&[RmaIov {
        addr: base,
        len: LEN,
        key: mr.key(),
    }])
    .expect("one range");
    let body = pattern(LEN, 9);
    let f = Frame::Write {
        id: 4,
        data: 0,
        flags: wire::flags::ACK,
        segs,
        desc: Desc::default(),
    };
    let mut first = f.ctrl(LEN as u64).as_bytes().to_vec();
    first.extend_from_slice(&body[..PIECE_LEN]);
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(raw.send_raw(FRAME, &first, 0));
    // Read as the endpoint writes it (this thread drives it, but through the raw bytes).
    let at = |i: usize| unsafe { std::ptr::read_volatile(window.as_ptr().add(i)) };
    let deadline = std::time::Instant::now() + BOUND;
    while at(PIECE_LEN - 1) != body[PIECE_LEN - 1] {
        drain(&n);
        assert!(
            std::time::Instant::now() < deadline,
            "the first piece never landed"
        );
    }
    drop(mr);
    rest(&mut raw, &body);
    let deadline = std::time::Instant::now() + BOUND;
    let answer = loop {
        drain(&n);
        if let Some((_, bytes)) = raw.recv_raw() {
            break bytes;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer to the write"
        );
    };
    let p = wire::prefix(&answer).expect("a frame");
    let end = wire::PREFIX + p.ctrl_len as usize;
    match wire::decode(&p, &answer[wire::PREFIX..end]) {
        Ok(Frame::Ack { id: 4, status }) => assert_eq!(status, FI_EACCES),
        other => panic!("not the write's answer: {other:?}"),
    }
    assert!((0..PIECE_LEN).all(|i| at(i) == body[i]), "the first piece");
    assert!(
        (PIECE_LEN..LEN).all(|i| at(i) == 0),
        "pieces landed in a closed region"
    );
    serves_a_good_peer(&n, &addr);
}

/// A peer dropped for garbage while a message to it is partly written into its ring: the rest
/// is not written. Its send failed with the peer, and its buffer is the application's again
/// (freed, reused); before, the rest was still copied from it into the peer's ring as the
/// peer read.
#[test]
fn a_send_partly_written_to_a_peer_dropped_for_garbage_reads_no_more_of_its_buffer() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    drain(&n);
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    // Two eager messages of 64 KiB into its 128 KiB ring, which it does not read: the second
    // is left partly written.
    const LEN: usize = 64 << 10;
    let mut bufs: Vec<Vec<u8>> = (0..2).map(|i| pattern(LEN, i)).collect();
    for (i, b) in bufs.iter().enumerate() {
        // SAFETY: the buffers outlive the sends (each ends below, failed or done).
        n.retry(|| unsafe { n.ep.send(b, None, to_raw, i) });
    }
    drain(&n);
    // Garbage on its lane: the peer is dropped and its operations fail.
    assert!(raw.send_raw(FRAME, &[0xff; 64], 0));
    let errs = errors(&n, 1);
    assert!(!errs.is_empty(), "the partly written send failed");
    // The application's buffer is its own again.
    bufs[1].fill(0xee);
    // The peer reads its ring while the endpoint is driven: nothing of the reused buffer.
    let mut seen = Vec::new();
    for _ in 0..64 {
        drain(&n);
        while let Some((_, bytes)) = raw.recv_raw() {
            seen.extend(bytes);
        }
    }
    let run = seen
        .windows(64)
        .filter(|w| w.iter().all(|&b| b == 0xee))
        .count();
    assert_eq!(run, 0, "bytes of a failed send's buffer reached the peer");
    drop(raw);
    serves_a_good_peer(&n, &addr);
}

/// Drives `n` until `raw` has a RELEASE from it (bounded): the armed slot it names.
fn await_release(n: &Node, raw: &mut RawPeer) -> usize {
    let start = std::time::Instant::now();
    let mut buf = [CqTaggedEntry::default(); 4];
    loop {
        let _ = n.cq.read(&mut buf);
        while let Some((k, b)) = raw.recv_raw() {
            if k == RELEASE {
                return u32::from_le_bytes(b[..4].try_into().expect("a slot number")) as usize;
            }
        }
        assert!(start.elapsed() < BOUND, "no release came");
    }
}

/// The context of the next completion of `n`, which must be a success.
fn next_ok(n: &Node) -> Context {
    match n.next() {
        Completion::Ok(e, _) => e.op_context,
        Completion::Err(e, _) => panic!("an error completion: {e:?}"),
    }
}

/// A receiver answers the armed sends released to it by a count in the header of its lane to
/// the sender (docs/shm.md), not a frame each. The count is the peer's word, as an `Ack` is:
/// moving it finishes that many released sends, oldest first; an answer frame for one (an
/// `Ack`, a discarding `Cts`) takes it out of the count's reach (the next move finishes the
/// next oldest, not it); a move waits until the lane is read up to the head that came with
/// it (and is applied once stored again with a head the lane is read up to, where the first
/// pair's head lied); one stored by another than the lane's holder counts nothing; moving it past what is
/// left drops the lane with a log line and fails what is left, and the endpoint goes on.
#[test]
fn an_armed_sends_count_is_checked() {
    setup();
    let n = node(CAPS | FI_TRIGGER | FI_XPU_TRIGGER, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let dst = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    // Shared host memory below the eager limit: offered by its mapping, so armed ahead.
    let len = 32 << 10;
    let m = Hmem::global()
        .get(Iface::System)
        .alloc_host_mapped(0, 10 * len)
        .expect("alloc_host_mapped");
    let before = armed_counts();
    let mut vars = Vec::new();
    for i in 0..10 {
        let iov = [RawIov {
            addr: m.as_ptr() as usize + i * len,
            len,
        }];
        let mut v = [TriggerVar::default()];
        // SAFETY: `m` outlives the sends (each completes or fails below, before it goes).
        let k = unsafe {
            n.ep.tsendmsg_xpu(&tmsg(&iov, dst, 10 + i, 0, 0), 0, Xpu::CPU, &mut v)
        };
        assert_eq!(k.expect("arm"), 1);
        vars.push(v[0]);
    }
    assert_eq!(armed_counts().prearmed - before.prearmed, 10, "armed ahead");
    for v in &vars {
        // SAFETY: variables the endpoint filled for the CPU XPU, its doorbell alive with it.
        unsafe { ring(&[*v]) }.expect("ring");
    }
    // The request ids of the ten, in release order, from the slots the releases name.
    let ids: Vec<u32> = (0..10)
        .map(|_| {
            let slot = await_release(&n, &mut raw);
            let f = raw.target_armed(slot).expect("the released slot's frame");
            match wire::decode_all(&f).expect("an Rts").0 {
                Frame::Rts { id, .. } => id,
                other => panic!("an armed slot holds {other:?}"),
            }
        })
        .collect();
    let mut buf = [CqTaggedEntry::default(); 4];
    assert!(
        matches!(n.cq.read(&mut buf), Err(Error::Again(_))),
        "a released send finished before its receiver said so"
    );
    // The receiver's `Ack` of status 0 for request `id`, as a frame.
    let ack = |id| frame(&Frame::Ack { id, status: 0 }, &[]);

    // A count stored by another than the lane's holder (one that lost it) counts nothing,
    // also when a frame has the endpoint look.
    raw.put_count_as(0x5eed, 1);
    let filler = frame(
        &Frame::Msg {
            id: 0,
            tag: 77,
            data: 0,
            flags: wire::flags::TAGGED,
        },
        &[1; 8],
    );
    assert!(raw.send_raw(FRAME, &filler, 0));
    for _ in 0..64 {
        assert!(
            matches!(n.cq.read(&mut buf), Err(Error::Again(_))),
            "a count another stored finished a send"
        );
    }
    assert!(raw.lane_claimed());
    raw.put_count(1);
    assert_eq!(next_ok(&n), 10, "the count finishes the oldest");
    assert!(raw.send_raw(FRAME, &ack(ids[2]), 0));
    assert_eq!(next_ok(&n), 12, "the frame finishes the one it names");
    raw.put_count(2);
    assert_eq!(
        next_ok(&n),
        11,
        "the count's next move finishes the oldest left"
    );
    raw.put_count(3);
    assert_eq!(
        next_ok(&n),
        13,
        "the next oldest left, not the one answered by frame"
    );
    assert_eq!(armed_counts().counted - before.counted, 3);

    // More frames than a progress call reads from a lane, then the oldest's answer, then the
    // count's move for the next: the count waits until the lane is read up to where the
    // receiver's head stood when it moved it.
    for _ in 0..40 {
        assert!(raw.send_raw(FRAME, &filler, 0));
    }
    assert!(raw.send_raw(FRAME, &ack(ids[4]), 0));
    raw.put_count(4);
    let mut two = [next_ok(&n), next_ok(&n)];
    two.sort_unstable();
    assert_eq!(two, [14, 15], "the frame's and the count's, each its own");

    // A `Cts` that says the receiver discarded the message answers it too (the oldest, 16):
    // the count's next move is the next one's.
    let cts = frame(
        &Frame::Cts {
            id: ids[6],
            rx: u32::MAX,
        },
        &[],
    );
    assert!(raw.send_raw(FRAME, &cts, 0));
    assert_eq!(next_ok(&n), 16, "discarded at the receiver");
    raw.put_count(5);
    assert_eq!(next_ok(&n), 17);

    // A move with a head far past what the receiver wrote waits (nothing finishes), and is
    // kept; the same move stored again with a head the lane is read up to is applied, not
    // left behind the first pair (whose head the lane never reaches).
    raw.put_count_at(6, raw.head().wrapping_add(1 << 40));
    // A frame, so that a progress call runs and reads the pair (and keeps it).
    assert!(raw.send_raw(FRAME, &filler, 0));
    for _ in 0..64 {
        assert!(
            matches!(n.cq.read(&mut buf), Err(Error::Again(_))),
            "a count whose head lies ahead finished a send"
        );
    }
    raw.put_count(6);
    assert_eq!(next_ok(&n), 18, "the move with a head reached");

    // One left (19): a move by 5 runs past it.
    let logged = drops_logged();
    raw.put_count(11);
    match n.next() {
        Completion::Err(e, _) => assert_eq!(e.op_context, 19, "what was left fails"),
        Completion::Ok(e, _) => panic!("a count past what was released finished {e:?}"),
    }
    assert!(!raw.lane_claimed(), "the lane was not dropped");
    assert!(drops_logged() > logged, "no log line");
    assert_eq!(armed_counts().counted - before.counted, 6);
    serves_a_good_peer(&n, &addr);
}

/// A peer dropped for garbage is lost by its name: a receive directed at it alone ends (it
/// waited for good, as the loss named no source).
#[test]
fn a_receive_directed_at_a_peer_dropped_for_garbage_ends() {
    setup();
    let n = node(CAPS | FI_DIRECTED_RECV, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    drain(&n);
    let from_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    let mut buf = vec![0u8; 64];
    // SAFETY: buf outlives the receive, which ends below.
    unsafe { n.ep.trecv(&mut buf, None, from_raw, 5, 0, 77) }.expect("trecv");
    drain(&n);
    assert!(raw.send_raw(FRAME, &[0xff; 64], 0));
    // (Read here: `dropped` would drain the error entry.)
    assert_eq!(errors(&n, 1), [libc::EPROTO], "the directed receive ended");
    assert!(!raw.lane_claimed(), "the lane was dropped");
}

/// A lane dropped for garbage is handed to its next claimer clean: the bad message it still
/// held (never taken) used to be read as the newcomer's first message ("a frame before
/// CONNECT"), and the newcomer lost its lane at once.
#[test]
fn a_lane_dropped_for_garbage_is_clean_for_its_next_claimer() {
    setup();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    drain(&n);
    assert!(raw.send_raw(FRAME, &[0xff; 64], 0));
    assert!(dropped(&n, &raw), "the lane was not dropped");
    // The lowest free lane: the one just dropped.
    let c = NamelessClaim::claim(&addr)
        .expect("claim")
        .expect("a free lane");
    drain(&n);
    assert!(
        c.claimed(),
        "the newcomer's lane was dropped for the old garbage"
    );
    drop(raw);
}

/// A send to a peer that the send's own look for room finds gone (a sweep in the progress it
/// runs when answers to that peer fill its ring) fails, or ends in an error completion; it
/// never completes as sent. Before, it was handed to the dead link and reported complete.
#[test]
fn a_send_whose_room_check_finds_the_peer_gone_never_completes_as_sent() {
    setup();
    let n = node(CAPS | FI_REMOTE_READ, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    const LEN: usize = 16384;
    let window = vec![7u8; LEN];
    // SAFETY: window outlives the registration (dropped below, before it).
    let mr = unsafe { n.domain.mr_reg(&window, FI_REMOTE_READ, 0, 3) }.expect("mr_reg");
    let base = n.rma_base(&window);
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    // Reads whose answers overfill the raw peer's ring: some wait in the engine.
    let segs = RmaIovList::from_segs(&[RmaIov {
        addr: base,
        len: LEN,
        key: mr.key(),
    }])
    .expect("one range");
    for id in 0..12 {
        let read = Frame::Read {
            id,
            segs,
            desc: Desc::default(),
        };
        assert!(raw.send_raw(FRAME, read.ctrl(0).as_bytes(), 64));
    }
    for _ in 0..200 {
        let _ = n.cq.read(&mut [CqTaggedEntry::default(); 4]);
    }
    // The raw peer takes what reached it and goes; no progress of ours until the send, so
    // that the send's own look is the one that finds it gone (its sweep due by then).
    while raw.recv_raw().is_some() {}
    raw.play_dead();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let buf = vec![1u8; 1000];
    // SAFETY: buf outlives the operation (it ends, or fails, below).
    match unsafe { n.ep.send(&buf, None, to_raw, 42) } {
        Err(Error::PeerLost(_)) => {}
        Ok(()) => {
            let deadline = std::time::Instant::now() + BOUND;
            let mut b = [CqTaggedEntry::default(); 1];
            loop {
                match n.cq.read(&mut b) {
                    Ok(_) => panic!("a send to a peer known gone completed as sent: {:?}", b[0]),
                    Err(Error::Avail) => break,
                    Err(_) => {}
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "a send to a peer known gone never ended"
                );
            }
        }
        Err(e) => panic!("send: {e}"),
    }
    drop(mr);
    drop(window);
}
