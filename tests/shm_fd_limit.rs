//! A peer met while this process is out of descriptors is not lost for it. Mapping its segment
//! when its CONNECT arrives fails (`EMFILE`); the CONNECT and what follows it wait in its lane
//! (read again after each sweep), a send to it answers `FI_EAGAIN` rather than failing, and
//! once descriptors are free again its segment maps and traffic goes both ways. Before, the failed open recorded it
//! as a peer whose segment is gone: the next sweep lost it, and every send to it failed for
//! the endpoint's life. Any local process holding many of our descriptors' worth of segments,
//! or a job with more peers than the descriptor limit, met it.
//!
//! This file holds one test: it lowers the process's descriptor limit, which no other test in
//! the process may meet.

mod common;

use std::time::{Duration, Instant};

use common::*;
use xfabric::*;

/// The lowest descriptor number free now: an open past a soft limit of it fails.
fn lowest_free_fd() -> u64 {
    // SAFETY: opening and closing a descriptor of our own.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        assert!(fd >= 0, "open /dev/null");
        libc::close(fd);
        fd as u64
    }
}

fn set_soft_nofile(soft: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = soft.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
}

fn soft_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit on a local struct.
    unsafe { assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0) };
    r.rlim_cur
}

/// Receives one 8-byte message on `n`, driving its progress; its bytes.
fn recv_one(n: &Node) -> u64 {
    let mut got = [0u8; 8];
    // SAFETY: got outlives the completion waited for below.
    n.retry(|| unsafe { n.ep.recv(&mut got, None, FI_ADDR_UNSPEC, 1) });
    n.wait_one();
    u64::from_le_bytes(got)
}

#[test]
fn a_peer_met_while_descriptors_are_short_is_mapped_once_they_are_not() {
    let caps = FI_MSG | FI_SEND | FI_RECV;
    let a = node(caps, Progress::Manual);
    let b = node(caps, Progress::Manual);
    let a_at_b = b.add_peer(&a.ep.getname().unwrap());
    let b_at_a = a.add_peer(&b.ep.getname().unwrap());
    // b maps a's segment and writes its CONNECT there before descriptors run out; a has not
    // read it yet.
    b.retry(|| b.ep.inject(&1u64.to_le_bytes(), a_at_b));
    let was = soft_nofile();
    set_soft_nofile(lowest_free_fd());
    // a reads b's CONNECT and cannot open b's segment; its sweeps (every 20 ms) run for a
    // good while: b is not lost (its CONNECT and message wait in its lane), and a send to b
    // asks for a retry.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let _ = a.cq.read(&mut [CqTaggedEntry::default(); 4]);
    }
    match a.ep.inject(&2u64.to_le_bytes(), b_at_a) {
        Err(Error::Again(_)) => {}
        other => panic!("a send to b while its segment cannot be mapped: {other:?}"),
    }
    set_soft_nofile(was);
    // Descriptors again: b's segment maps at a sweep, and both ways work.
    assert_eq!(recv_one(&a), 1, "b's message");
    a.retry(|| a.ep.inject(&2u64.to_le_bytes(), b_at_a));
    assert_eq!(recv_one(&b), 2, "a's message, after its send was retried");
    b.retry(|| b.ep.inject(&3u64.to_le_bytes(), a_at_b));
    assert_eq!(recv_one(&a), 3, "b's next message");
}
