//! A lane's pages are mapped in when it connects, by its writer and by its reader: the
//! traffic of its first lap (128 KiB, 2,048 small messages) takes no page fault every 4 KiB
//! (one took 3-14 us on the 2-core VM this project is measured on, where that first lap was
//! most of a short run).

mod common;

use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_SEND | FI_RECV;
/// Messages per batch (receives posted, then as many sends).
const BATCH: usize = 64;

/// Minor page faults taken by this thread so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage fills the struct it is given, nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    ru.ru_minflt
}

fn shm_node() -> Node {
    node_custom(
        CAPS,
        Progress::Manual,
        |i| i.fabric_attr.prov_name = Some("shm".into()),
        4 * BATCH,
        |_, _| {},
    )
}

/// `n` messages of 8 bytes from `a` to `b`, each received; every completion of both read.
fn exchange(a: &Node, to_b: FiAddr, b: &Node, from_a: FiAddr, n: usize, rx: &mut [[u8; 8]]) {
    let msg = [7u8; 8];
    for buf in rx[..n].iter_mut() {
        // SAFETY: `rx` outlives the receive, waited for below.
        unsafe { b.ep.recv(buf, None, from_a, 1) }.expect("recv");
    }
    for _ in 0..n {
        loop {
            // SAFETY: `msg` outlives the send, waited for below.
            match unsafe { a.ep.send(&msg, None, to_b, 2) } {
                Ok(()) => break,
                Err(Error::Again(_)) => {
                    let _ = b.cq.read::<CqTaggedEntry>(&mut []);
                    let _ = a.cq.read::<CqTaggedEntry>(&mut []);
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    let (mut sent, mut got) = (0, 0);
    let mut buf = [CqTaggedEntry::default(); BATCH];
    let deadline = std::time::Instant::now() + completion_bound();
    while sent < n || got < n {
        match a.cq.read(&mut buf) {
            Ok(k) => sent += k,
            Err(Error::Again(_)) => {}
            Err(e) => panic!("sender's cq: {e}: {:?}", a.cq.readerr()),
        }
        match b.cq.read(&mut buf) {
            Ok(k) => got += k,
            Err(Error::Again(_)) => {}
            Err(e) => panic!("receiver's cq: {e}: {:?}", b.cq.readerr()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sent} sends and {got} receives of {n} completed"
        );
    }
}

#[test]
fn a_lanes_first_lap_takes_no_page_faults() {
    let (a, b) = (shm_node(), shm_node());
    let to_b = a.add_peer(&b.ep.getname().expect("getname"));
    let from_a = b.add_peer(&a.ep.getname().expect("getname"));
    let mut rx = [[0u8; 8]; BATCH];
    // The first message claims and connects the lane (and maps its pages in); a batch more
    // sizes every list the two endpoints keep.
    exchange(&a, to_b, &b, from_a, 1, &mut rx);
    exchange(&a, to_b, &b, from_a, BATCH, &mut rx);
    let before = minor_faults();
    // 40 batches of 64 one-slot messages: past the lane's 2,048 slots.
    for _ in 0..40 {
        exchange(&a, to_b, &b, from_a, BATCH, &mut rx);
    }
    let faults = minor_faults() - before;
    // Unmapped, the writer alone takes one per 4 KiB of the lap (32).
    assert!(
        faults < 16,
        "{faults} page faults while 2,560 small messages went once round the lane"
    );
}
