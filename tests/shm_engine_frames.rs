//! Frames from a hostile peer over shm's engine framing (`XFABRIC_SHM_ENGINE=1`): a raw sender
//! writes crafted and random messages into an endpoint's ring (bad prefixes, control and body
//! lengths past the slots, pieces with no frame, unknown kinds, frames the engine refuses).
//! The endpoint must neither panic (overflow checks are on) nor hang: it drops that sender's
//! lane with a log line, and still serves a well-behaved peer afterwards.

mod common;

use std::io::Write;
use std::sync::{Mutex, Once};

use common::*;
use xfabric::*;
use xfabric_core::rdm::wire::{self, Frame, Prefix};
use xfabric_providers::shm::raw::{RawPeer, FRAME, PIECE};

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV;

/// What xfabric logged, captured by this test's own subscriber.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The engine framing for every endpoint of this process, and warnings captured.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("XFABRIC_SHM_ENGINE", "1");
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
    });
}

fn drops_logged() -> usize {
    let log = LOG.lock().unwrap();
    String::from_utf8_lossy(&log)
        .matches("dropping the lane")
        .count()
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

    // A well-behaved peer is still served.
    let good = node(CAPS, Progress::Manual);
    let dst = good.add_peer(&addr);
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
    drop(raw);
}
