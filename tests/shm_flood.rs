//! A flood of unexpected messages: the receiver buffers at most its bound
//! (`XFABRIC_SHM_UNEXP_MSGS`, 100 here), the sender is held back by flow control (its posts
//! answer `Again` while its ring stays full), and once receives are posted every message
//! arrives, in order, with its bytes. Nothing is dropped. A large message sent just before the
//! flood, into a receive posted in advance, completes while the flood waits: what it needs
//! from the sender behind the flood (its data, where cross-memory attach is refused) is an
//! answer, handed over past the held messages, in room the flood leaves for answers.
//!
//! This file holds one test: the receiver sets the bound in its own environment before it
//! opens its endpoint, which no other test in the process may race.

mod common;

use std::time::Instant;

use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_SEND | FI_RECV;
const LIMIT: usize = 100;
const MESSAGES: usize = 5000;
const LEN: usize = 64;
/// The large message sent first (a split copy where cross-memory attach works).
const BIG: usize = 1 << 20;
const BIG_TAG: u64 = 7;

fn message(i: usize) -> Vec<u8> {
    let mut m = pattern(LEN, i as u64);
    m[..8].copy_from_slice(&(i as u64).to_le_bytes());
    m
}

/// Sender: floods, retrying each post until it is taken (progressing meanwhile).
fn sender() {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    let msgs: Vec<Vec<u8>> = (0..MESSAGES).map(message).collect();
    let big = pattern(BIG, 99);
    // SAFETY: big outlives its completion, waited for below.
    n.retry(|| unsafe { n.ep.tsend(&big, None, parent, BIG_TAG, usize::MAX) });
    let (mut refused, mut done) = (0usize, 0usize);
    for (i, m) in msgs.iter().enumerate() {
        loop {
            // SAFETY: msgs outlives every completion waited for below.
            match unsafe { n.ep.tsend(m, None, parent, 0, i) } {
                Ok(()) => break,
                Err(Error::Again(_)) => {
                    refused += 1;
                    let mut buf = [CqTaggedEntry::default(); 16];
                    match n.cq.read(&mut buf) {
                        Ok(k) => done += k,
                        Err(Error::Again(_)) => {}
                        Err(e) => panic!("cq read: {e}"),
                    }
                }
                Err(e) => panic!("tsend {i}: {e}"),
            }
        }
    }
    n.wait_n(MESSAGES + 1 - done);
    say(&format!("refused {refused}"));
}

#[test]
fn flood_of_unexpected_messages_stays_within_the_bound_and_loses_nothing() {
    if role().is_some() {
        return sender();
    }
    // SAFETY-free in edition 2021, and race-free here: this file's only test sets it before
    // any endpoint of this process exists.
    std::env::set_var("XFABRIC_SHM_UNEXP_MSGS", LIMIT.to_string());
    let mut peer = spawn(
        "flood_of_unexpected_messages_stays_within_the_bound_and_loses_nothing",
        "send",
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let mut big = vec![0u8; BIG];
    // SAFETY: big outlives the completion waited for below.
    unsafe { n.ep.trecv(&mut big, None, FI_ADDR_UNSPEC, BIG_TAG, 0, 777) }.expect("trecv");
    let src = connect(&mut peer, &n);

    // Phase 0: the large message completes, the flood behind it notwithstanding.
    let c = n.wait_one();
    assert_eq!((c.op_context, c.len), (777, BIG));
    assert!(big == pattern(BIG, 99), "the large message's bytes");
    assert!(n.ep.buffered().unexpected <= LIMIT);

    // Phase 1: progress with nothing posted. The queue fills to the bound and stays there.
    let mut buf = [CqTaggedEntry::default(); 8];
    let deadline = Instant::now() + BOUND;
    let mut polls_at_bound = 0u32;
    while polls_at_bound < 200_000 {
        assert!(
            Instant::now() < deadline,
            "the flood never filled the unexpected queue: {:?}",
            n.ep.buffered()
        );
        assert!(matches!(n.cq.read(&mut buf), Err(Error::Again(_))));
        let msgs = n.ep.buffered().unexpected;
        assert!(
            msgs <= LIMIT,
            "{msgs} unexpected messages buffered, bound {LIMIT}"
        );
        if msgs == LIMIT {
            polls_at_bound += 1;
        }
    }
    let bytes = n.ep.buffered().unexpected_bytes;
    assert!(
        bytes >= LIMIT * LEN,
        "{bytes} bytes held for {LIMIT} messages"
    );

    // Phase 2: receive every message, one receive at a time: each is the next in order.
    let mut rx = vec![0u8; LEN];
    for i in 0..MESSAGES {
        // SAFETY: rx outlives the completion waited for just below.
        n.retry(|| unsafe { n.ep.trecv(&mut rx, None, src, 0, 0, i) });
        let c = n.wait_one();
        assert_eq!((c.op_context, c.len), (i, LEN));
        assert!(rx == message(i), "message {i}: wrong bytes or out of order");
        assert!(
            n.ep.buffered().unexpected <= LIMIT,
            "after message {i}: {:?}",
            n.ep.buffered()
        );
    }
    let refused = peer.hear();
    say(&format!("sender: {refused}"));
    peer.join();
}
