//! A domain's auto-progress thread driving several endpoints: idle, it sleeps on all of them
//! at once (each provider's descriptors: shm's wake socket, tcp's epoll set and eventfd), and
//! a message to any of them ends that sleep. Before, it slept on the first endpoint's doorbell
//! a millisecond at a time, and a message to another waited for the next look.
//!
//! Real processes: the child's domain is under auto progress with two endpoints, and its CQ
//! reads drive nothing (under auto progress): only the thread's waking delivers. Before each
//! message the child's own thread drives both endpoints once, as an application retrying a
//! post does; over shm that once cleared the flag that makes a sender ring the sleeping
//! thread's wake socket, and the message waited for the sleep's timeout. Over the provider `XFABRIC_TEST_PROVIDER` names (shm by default; scripts/test.sh
//! runs it over tcp too).

mod common;

use common::*;
use std::time::{Duration, Instant};
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_SEND | FI_RECV;
/// Rounds at the least; over shm, more until one send has ended a sleep on the wake socket.
const ROUNDS: usize = 20;
const ROUNDS_MAX: usize = 400;

/// The receiver: two endpoints of one auto-progress domain; for each "A" or "B" the parent
/// says, a receive on that endpoint, waited for by reading its CQ (which, under auto
/// progress, drives nothing).
fn receiver() {
    let n = node(CAPS, Progress::Auto);
    let attr = CqAttr {
        format: CqFormat::Tagged,
        ..Default::default()
    };
    let (cq_b, av_b, ep_b) = enabled_ep(&n.domain, &n.info, &attr);
    say(&hex(&n.ep.getname().unwrap()));
    say(&hex(&ep_b.getname().unwrap()));
    let parent = unhex(&listen());
    let from_a = n.add_peer(&parent);
    let from_b = av_b.insert_one(&parent).expect("av insert");
    let mut rx = [0u8; 8];
    for k in 0.. {
        let which = listen();
        let (ep, cq, from) = match which.as_str() {
            "A" => (&n.ep, &n.cq, from_a),
            "B" => (&ep_b, &cq_b, from_b),
            _ => break,
        };
        // SAFETY: `rx` outlives the completion waited for below.
        unsafe { ep.recv(&mut rx, None, from, k) }.expect("recv");
        say("ready");
        // While the domain's thread sleeps, this thread drives both endpoints once, as an
        // application that retries a post does: that must not stop the peer's send from
        // ending the thread's sleep.
        assert_eq!(listen(), "poke");
        n.ep.progress();
        ep_b.progress();
        say("poked");
        let mut e = [CqTaggedEntry::default(); 1];
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match cq.read(&mut e) {
                Ok(1) => break,
                Ok(_) | Err(Error::Again(_)) => {
                    assert!(Instant::now() < until, "message {k} to {which} never came");
                    std::thread::yield_now();
                }
                Err(err) => panic!("cq read: {err}"),
            }
        }
        assert_eq!((e[0].op_context, rx), (k, (k as u64).to_le_bytes()));
        say("got");
    }
}

#[test]
fn a_progress_thread_driving_two_endpoints_wakes_for_a_message_to_either() {
    if role().is_some() {
        return receiver();
    }
    let mut peer = spawn(
        "a_progress_thread_driving_two_endpoints_wakes_for_a_message_to_either",
        "recv",
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let (name_a, name_b) = (unhex(&peer.hear()), unhex(&peer.hear()));
    let (to_a, to_b) = (n.add_peer(&name_a), n.add_peer(&name_b));
    peer.tell(&hex(&n.ep.getname().unwrap()));
    let shm = test_provider() == "shm";
    let wakes_before = xfabric_providers::shm::fd_wakes();
    let mut k = 0;
    while k < ROUNDS || (shm && xfabric_providers::shm::fd_wakes() == wakes_before) {
        assert!(
            k < ROUNDS_MAX,
            "{k} messages, and not one ended a sleep on the receiver's wake socket: its progress \
             thread never slept on both endpoints at once, or another thread's progress call \
             kept senders from ringing it"
        );
        let (which, to, name) = if k % 2 == 0 {
            ("B", to_b, &name_b)
        } else {
            ("A", to_a, &name_a)
        };
        peer.tell(which);
        assert_eq!(peer.hear(), "ready");
        // Over shm, the message goes once the receiver's thread sleeps on both endpoints (as
        // their headers show a sender). Elsewhere nothing shows it: the message goes at once,
        // and must arrive whether the thread sleeps by then or not.
        if shm {
            let until = Instant::now() + Duration::from_secs(30);
            while xfabric_providers::shm::raw::joint_sleeps(name).expect("header") == 0 {
                assert!(
                    Instant::now() < until,
                    "the receiver's progress thread never slept on both endpoints at once"
                );
                std::thread::yield_now();
            }
        }
        peer.tell("poke");
        assert_eq!(peer.hear(), "poked");
        let body = (k as u64).to_le_bytes();
        n.retry(|| unsafe { n.ep.send(&body, None, to, 1) });
        n.wait_one();
        assert_eq!(peer.hear(), "got");
        k += 1;
    }
    peer.tell("stop");
    peer.join();
}
