//! A peer that begins a message in pieces and writes nothing more of it, alive, is lost after
//! `XFABRIC_SHM_STALL_MS` (300 ms here), and the receive the message matched fails with
//! `FI_ETIMEDOUT`: before, the receive was held as long as the peer lived. A peer whose
//! pieces this endpoint left unread while it was not progressed is not lost for it.
//!
//! This file holds one test: it sets the bound in its environment before the first endpoint
//! opens, which no other test in the process may race.

mod common;

use common::*;
use xfabric::errno::*;
use xfabric::*;
use xfabric_core::rdm::wire::Frame;
use xfabric_providers::shm::raw::{RawPeer, FRAME, PIECE, PIECE_LEN};

/// The start of a message of `len` body bytes: its FRAME with the first piece of `body`.
fn start(len: usize, body: &[u8], tag: u64) -> Vec<u8> {
    let f = Frame::Msg {
        id: 1,
        tag,
        data: 0,
        flags: xfabric_core::rdm::wire::flags::TAGGED,
    };
    let mut v = f.ctrl(len as u64).as_bytes().to_vec();
    v.extend_from_slice(&body[..PIECE_LEN]);
    v
}

#[test]
fn a_peer_that_stops_mid_message_is_lost_after_the_stall_bound() {
    std::env::set_var("XFABRIC_SHM_STALL_MS", "300");
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let addr = n.ep.getname().unwrap();
    const LEN: usize = 4 * PIECE_LEN;
    let body = pattern(LEN, 3);
    let (mut r1, mut r2) = (vec![0u8; LEN], vec![0u8; LEN]);
    // SAFETY: both buffers outlive the receives (each ends below).
    unsafe { n.ep.trecv(&mut r1, None, FI_ADDR_UNSPEC, 1, 0, 1) }.unwrap();
    // SAFETY: as above.
    unsafe { n.ep.trecv(&mut r2, None, FI_ADDR_UNSPEC, 2, 0, 2) }.unwrap();
    // A peer whose pieces wait in the ring while this endpoint is not progressed for longer
    // than the bound: its message arrives whole.
    let mut slow = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(slow.send_raw(FRAME, &start(LEN, &body, 2), 0));
    let _ = n.cq.read(&mut [CqTaggedEntry::default(); 1]);
    for piece in body[PIECE_LEN..].chunks(PIECE_LEN) {
        assert!(slow.send_raw(PIECE, piece, 0));
    }
    std::thread::sleep(std::time::Duration::from_millis(700));
    // The one that stops.
    let mut stops = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(stops.send_raw(FRAME, &start(LEN, &body, 1), 0));
    let deadline = std::time::Instant::now() + BOUND;
    let (mut ok, mut err) = (Vec::new(), Vec::new());
    while ok.len() + err.len() < 2 {
        let mut buf = [CqTaggedEntry::default(); 2];
        match n.cq.read(&mut buf) {
            Ok(k) => ok.extend(buf[..k].iter().map(|e| e.op_context)),
            Err(Error::Avail) => {
                let e = n.cq.readerr().expect("an error entry");
                err.push((e.op_context, e.err));
            }
            Err(_) => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled receive never ended: {ok:?} {err:?}"
        );
    }
    assert_eq!(ok, vec![2], "the slow peer's message");
    assert!(r2 == body, "the slow peer's bytes");
    assert_eq!(err, vec![(1, FI_ETIMEDOUT)], "the stalled peer's receive");
    drop((slow, stops));
}
