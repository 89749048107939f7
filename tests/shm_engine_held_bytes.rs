//! The frames an shm endpoint holds from one peer past its unexpected bounds are bounded in
//! bytes (`XFABRIC_SHM_HELD_BYTES`), not only in count: with the unexpected bound reached (4
//! here), a raw peer's 16 KiB messages are held until 256 KiB of them are, then stay in its
//! ring, which fills. Before, one peer could have 1,024 frames of 64 KiB held (64 MiB), and
//! each of the 64 lanes as many. The bound is each peer's: a second peer's message is still
//! held. Once receives are posted every message arrives, in order, with its bytes.
//!
//! This file holds one test: it sets the bounds in its environment before the first endpoint
//! opens, which no other test in the process may race.

mod common;

use common::*;
use xfabric::*;
use xfabric_providers::shm::raw::{RawPeer, FRAME};

const UNEXP: usize = 4;
const HELD_BYTES: usize = 256 << 10;
const LEN: usize = 16 << 10;

#[test]
fn held_frames_stay_within_the_byte_bound_and_arrive_in_order() {
    std::env::set_var("XFABRIC_SHM_UNEXP_MSGS", UNEXP.to_string());
    std::env::set_var("XFABRIC_SHM_HELD_BYTES", HELD_BYTES.to_string());
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let mut raw = RawPeer::connect(&n.ep.getname().unwrap(), None).expect("raw peer");
    let progress = || {
        for _ in 0..16 {
            let _ = n.cq.read(&mut [CqTaggedEntry::default(); 8]);
        }
    };
    let message = |i: u64| tagged_frame(i, &pattern(LEN, i));
    // Tagged 16 KiB messages until the endpoint takes no more: the ring is full and stays so
    // through progress calls (each message is one ring message: nothing is half written).
    let mut sent = 0u64;
    let mut refused = 0;
    while refused < 3 {
        if raw.send_raw(FRAME, &message(sent), 64) {
            sent += 1;
            refused = 0;
        } else {
            refused += 1;
        }
        progress();
        let held = n.ep.buffered().held;
        assert!(
            held * LEN <= HELD_BYTES,
            "{held} frames of {LEN} bytes held after {sent} messages"
        );
        assert!(sent < 10_000, "the ring never filled");
    }
    let b = n.ep.buffered();
    assert_eq!(b.unexpected, UNEXP, "{b:?}");
    assert!(
        b.held * LEN > HELD_BYTES - 2 * LEN,
        "the bound was not reached: the test proves nothing ({b:?})"
    );
    // Another peer's message is held all the same: the first one's flood holds back no one
    // else's frames.
    let mut other = RawPeer::connect(&n.ep.getname().unwrap(), None).expect("raw peer");
    const OTHER: u64 = 1 << 40;
    assert!(other.send_raw(FRAME, &message(OTHER), 64));
    let deadline = std::time::Instant::now() + BOUND;
    while n.ep.buffered().held == b.held {
        progress();
        assert!(
            std::time::Instant::now() < deadline,
            "the second peer's message was not held: {:?}",
            n.ep.buffered()
        );
    }
    // Every message, in order, once receives come.
    let mut got = vec![0u8; LEN];
    for i in 0..sent {
        // SAFETY: got outlives the completion waited for below.
        unsafe { n.ep.trecv(&mut got, None, FI_ADDR_UNSPEC, i, 0, 1) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.tag, c.len), (i, LEN), "message {i}");
        assert!(got == pattern(LEN, i), "message {i}'s bytes");
    }
    // SAFETY: got outlives the completion waited for below.
    unsafe { n.ep.trecv(&mut got, None, FI_ADDR_UNSPEC, OTHER, 0, 2) }.unwrap();
    assert_eq!(n.wait_one().tag, OTHER);
    assert!(got == pattern(LEN, OTHER), "the second peer's bytes");
    assert_eq!(n.ep.buffered().held, 0);
    drop((raw, other));
}
