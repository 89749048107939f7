//! The tcp provider under hostile use, with real processes: a flood of unexpected messages
//! held back by flow control (never more than the receiver's bound buffered, nothing lost), a
//! stranger writing garbage into an endpoint's listener while it talks to a real peer, and an
//! address that refuses connections.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;
const LIMIT: usize = 100;
const MESSAGES: usize = 5000;
const LEN: usize = 64;

fn tcp(caps: u64) -> Node {
    node_with(caps, Progress::Manual, |h| {
        h.fabric_attr.prov_name = Some("tcp".into())
    })
}

fn message(i: usize) -> Vec<u8> {
    let mut m = pattern(LEN, i as u64);
    m[..8].copy_from_slice(&(i as u64).to_le_bytes());
    m
}

/// Receiver, bounded at `LIMIT` unexpected messages by its environment: polls while the
/// flood comes, never holding more than the bound, then takes every message in order.
fn flood_receiver() {
    let n = tcp(CAPS);
    let parent = connect_parent(&n);
    let mut most = 0;
    let mut buf = [CqTaggedEntry::default(); 4];
    // Until the bound is reached (the flood is far larger), then 100,000 polls more: the
    // bound holds however long the receiver keeps polling.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut after = 0u64;
    while after < 100_000 {
        let _ = n.cq.read(&mut buf);
        let now = n.ep.buffered().unexpected;
        assert!(
            now <= LIMIT,
            "{now} unexpected messages buffered (bound {LIMIT})"
        );
        most = most.max(now);
        if most == LIMIT {
            after += 1;
        }
        assert!(
            Instant::now() < deadline,
            "the flood never reached the bound ({most})"
        );
    }
    let mut bufs = vec![vec![0u8; LEN]; MESSAGES];
    // In batches the CQ has room for (resource management reserves an entry per receive).
    for (c, chunk) in bufs.chunks_mut(1000).enumerate() {
        for (j, b) in chunk.iter_mut().enumerate() {
            // SAFETY: bufs outlives the completions waited for below.
            n.retry(|| unsafe { n.ep.trecv(b, None, parent, 0, 0, c * 1000 + j) });
        }
        let got = n.wait_n(chunk.len());
        for (j, e) in got.iter().enumerate() {
            assert_eq!(e.op_context, c * 1000 + j, "in order");
            assert_eq!(e.len, LEN);
        }
    }
    for (i, b) in bufs.iter().enumerate() {
        assert!(*b == message(i), "message {i} arrived changed");
    }
    say(&format!("most {most}"));
}

#[test]
fn a_flood_is_held_back_by_flow_control_and_nothing_is_lost() {
    if role().is_some() {
        return flood_receiver();
    }
    let t = "a_flood_is_held_back_by_flow_control_and_nothing_is_lost";
    let limit = LIMIT.to_string();
    // The endpoint's bound, which its one peer may take whole: a peer's share of the places
    // is what its share of the bytes is of the endpoint's, so the share is the endpoint's.
    let mut child = spawn(
        t,
        "rx",
        &[
            ("XFABRIC_TCP_UNEXP_MSGS", limit.as_str()),
            ("XFABRIC_TCP_UNEXP_PEER_BYTES", "33554432"),
            ("XFABRIC_TCP_UNEXP_BYTES", "33554432"),
        ],
    );
    let n = tcp(CAPS);
    let peer = connect(&mut child, &n);
    let msgs: Vec<Vec<u8>> = (0..MESSAGES).map(message).collect();
    let mut done = 0usize;
    let mut buf = [CqTaggedEntry::default(); 64];
    for (i, m) in msgs.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // SAFETY: msgs outlives every completion waited for below.
            match unsafe { n.ep.tsend(m, None, peer, 0, i) } {
                Ok(()) => break,
                Err(Error::Again(_)) => {
                    if let Ok(k) = n.cq.read(&mut buf) {
                        done += k;
                    }
                    assert!(Instant::now() < deadline, "send {i} refused for 60 s");
                }
                Err(e) => panic!("tsend {i}: {e}"),
            }
        }
    }
    n.wait_n(MESSAGES - done);
    let most: usize = child
        .hear()
        .strip_prefix("most ")
        .and_then(|s| s.parse().ok())
        .expect("the receiver's report");
    assert_eq!(most, LIMIT);
    child.join();
}

/// Child: talks to its parent while a stranger writes garbage into its listener.
fn steady_peer() {
    let n = tcp(CAPS);
    let parent = connect_parent(&n);
    for round in 0..3 {
        let mut b = vec![0u8; 32];
        // SAFETY: b outlives the completion waited for.
        unsafe { n.ep.trecv(&mut b, None, parent, 0, 0, 1) }.unwrap();
        n.wait_one();
        assert!(b == pattern(32, round));
        say("got");
        // SAFETY: b outlives the completion waited for.
        n.retry(|| unsafe { n.ep.tsend(&b, None, parent, 0, 2) });
        n.wait_one();
    }
}

#[test]
fn a_stranger_writing_garbage_leaves_real_peers_alone() {
    if role().is_some() {
        return steady_peer();
    }
    let t = "a_stranger_writing_garbage_leaves_real_peers_alone";
    let mut child = spawn(t, "peer", &[]);
    let n = tcp(CAPS);
    let raw = unhex(&child.hear());
    let peer = n.add_peer(&raw);
    child.tell(&hex(&n.ep.getname().unwrap()));
    let listener =
        n.av.straddr(&raw)
            .trim_start_matches("fi_sockaddr_in://")
            .trim_start_matches("fi_sockaddr_in6://")
            .parse::<SocketAddr>()
            .expect("the peer's address");
    for round in 0..3u64 {
        // A stranger connects and writes bytes that are no xfabric handshake.
        let mut s = TcpStream::connect(listener).expect("connect as a stranger");
        let junk: Vec<u8> = pattern(4096, 1000 + round);
        let _ = s.write_all(&junk);
        let out = pattern(32, round);
        // SAFETY: out outlives the completion waited for.
        n.retry(|| unsafe { n.ep.tsend(&out, None, peer, 0, 10) });
        n.wait_one();
        assert_eq!(child.hear(), "got");
        let mut back = vec![0u8; 32];
        // SAFETY: back outlives the completion waited for.
        unsafe { n.ep.trecv(&mut back, None, peer, 0, 0, 11) }.unwrap();
        n.wait_one();
        assert!(back == out);
        drop(s);
    }
    child.join();
}

#[test]
fn an_address_that_refuses_connections_fails_the_send() {
    // A port nothing listens on: bound and closed again.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let n = node_with(CAPS, Progress::Manual, |h| {
        h.fabric_attr.prov_name = Some("tcp".into());
        h.src_addr = None;
    });
    let dead = n.add_peer(format!("fi_sockaddr_in://127.0.0.1:{port}\0").as_bytes());
    let b = [7u8; 16];
    // SAFETY: b outlives the completion waited for.
    unsafe { n.ep.tsend(&b, None, dead, 0, 5) }.unwrap();
    let e = n.wait_err();
    assert_eq!(e.op_context, 5);
    assert_eq!(e.err, errno::FI_ECONNREFUSED, "{e:?}");
}
