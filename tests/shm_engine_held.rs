//! Flow control over shm's rings is bounded and loses nothing: with the unexpected-message
//! bound reached (4 here), the engine answers the next message `Sink::Wait`; that one and
//! those behind it are copied into the sender's held queue, at most `HELD_MAX` (1,024) of
//! them, and the rest stay in the sender's ring, which fills. Once receives are posted every
//! message arrives, in order, with its bytes. The sender is a raw peer writing well-formed
//! frames, so nothing but the target's bounds holds it back.
//!
//! This file holds one test: it sets the bound in its environment before the first endpoint
//! opens, which no other test in the process may race.

mod common;

use common::*;
use xfabric::*;
use xfabric_providers::shm::raw::{RawPeer, FRAME, HELD_MAX};

const UNEXP: usize = 4;

#[test]
fn held_frames_stay_within_the_bound_and_arrive_in_order() {
    std::env::set_var("XFABRIC_SHM_UNEXP_MSGS", UNEXP.to_string());
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let mut raw = RawPeer::connect(&n.ep.getname().unwrap(), None).expect("raw peer");
    let progress = || {
        for _ in 0..16 {
            let _ = n.cq.read(&mut [CqTaggedEntry::default(); 8]);
        }
    };
    // Tagged 8-byte messages, the tag and the bytes naming their number, until the ring is
    // full (leaving the 64 slots a sender keeps for answers).
    let mut sent = 0u64;
    loop {
        let b = tagged_frame(sent, &sent.to_le_bytes());
        if !raw.send_raw(FRAME, &b, 64) {
            break;
        }
        sent += 1;
        if sent.is_multiple_of(64) {
            progress();
            let held = n.ep.buffered().held;
            assert!(held <= HELD_MAX, "{held} held after {sent} messages");
        }
        assert!(sent < 100_000, "the ring never filled");
    }
    progress();
    let b = n.ep.buffered();
    assert_eq!(b.unexpected, UNEXP, "{b:?}");
    assert_eq!(b.held, HELD_MAX, "{b:?}");
    assert!(
        sent as usize > UNEXP + HELD_MAX + 100,
        "only {sent} messages fitted: the test proves nothing"
    );
    // Every message, in order, once receives come.
    let mut got = [0u8; 8];
    for i in 0..sent {
        // SAFETY: got outlives the completion waited for below.
        unsafe { n.ep.trecv(&mut got, None, FI_ADDR_UNSPEC, i, 0, 1) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.tag, c.len), (i, 8), "message {i}");
        assert_eq!(u64::from_le_bytes(got), i, "message {i}'s bytes");
    }
    assert_eq!(n.ep.buffered().held, 0);
    drop(raw);
}
