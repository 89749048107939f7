//! Peers that die: a sender's outstanding rendezvous and a full ring to a killed receiver end
//! in errors, not hangs; segments of killed owners are reclaimed; closed endpoints leave none.

mod common;
use std::time::Instant;

use common::*;
use xfabric::errno::*;
use xfabric::providers::shm::raw::guard_faults;
use xfabric::providers::shm::segment::{reclaim_stale, PREFIX, SHM_DIR};
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;

/// A child that connects, says "ready" and then does nothing at all (no progress) until it
/// is killed or told "bye".
fn idle_child() {
    let n = node(CAPS, Progress::Manual);
    connect_parent(&n);
    say("ready");
    assert_eq!(listen(), "bye");
}

#[test]
fn killed_receiver_fails_outstanding_rendezvous_send() {
    if role().is_some() {
        return idle_child();
    }
    let mut peer = spawn(
        "killed_receiver_fails_outstanding_rendezvous_send",
        "idle",
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    let data = pattern(1 << 20, 1);
    let small = pattern(100, 2);
    let iov = [RawIov::of(&small)];
    // SAFETY: both buffers outlive the (error) completions read below.
    unsafe {
        n.ep.tsend(&data, None, dst, 1, 42).unwrap();
        // An eager send that completes only once the receiver has processed it.
        n.ep.tsendmsg(&tmsg(&iov, dst, 43, 2, 0), FI_DELIVERY_COMPLETE)
            .unwrap();
    }
    // The receiver makes no progress, so neither send can complete while it lives.
    let mut buf = [CqTaggedEntry::default(); 1];
    for _ in 0..100 {
        assert_eq!(n.cq.read(&mut buf), Err(Error::Again("cq read")));
    }
    let pid = peer.pid();
    peer.kill();
    let t = Instant::now();
    let mut errs = [n.wait_err(), n.wait_err()];
    assert!(t.elapsed() < BOUND);
    errs.sort_by_key(|e| e.op_context);
    for (e, ctx) in errs.iter().zip([42, 43]) {
        assert_eq!(e.op_context, ctx, "{e:?}");
        assert_eq!(e.err, FI_ECONNRESET, "{e:?}");
        assert_eq!(e.flags, FI_SEND | FI_TAGGED);
    }
    // Later sends to the dead peer fail at once.
    let r = n.ep.tinject(&[1, 2, 3], dst, 2);
    assert!(matches!(r, Err(Error::PeerLost(_))), "{r:?}");
    reclaim(pid);
}

#[test]
fn full_ring_to_killed_receiver_turns_again_into_peer_lost() {
    if role().is_some() {
        return idle_child();
    }
    let mut peer = spawn(
        "full_ring_to_killed_receiver_turns_again_into_peer_lost",
        "idle",
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    let data = pattern(8192, 7);
    let mut accepted = 0;
    let full = loop {
        // SAFETY: eager sends copy the data into the ring during the call.
        match unsafe { n.ep.tsend(&data, None, dst, 7, accepted) } {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 10_000, "the ring never filled");
    };
    assert!(matches!(full, Error::Again(_)), "{full:?}");
    assert!(accepted > 0);
    // Top the ring up with small injects until not even one slot is free.
    let mut topped = 0;
    while n.ep.tinject(&[0u8; 16], dst, 8).is_ok() {
        topped += 1;
        assert!(topped < 10_000, "the ring never filled");
    }
    // While the receiver lives, a full ring stays Again.
    for _ in 0..10 {
        let r = n.ep.tinject(&[0u8; 16], dst, 8);
        assert!(matches!(r, Err(Error::Again(_))), "{r:?}");
        n.ep.progress();
    }
    let pid = peer.pid();
    peer.kill();
    let deadline = Instant::now() + BOUND;
    let lost = loop {
        match n.ep.tinject(&[0u8; 16], dst, 8) {
            Err(Error::Again(_)) => n.ep.progress(),
            r => break r,
        };
        assert!(
            Instant::now() < deadline,
            "still Again after the receiver died"
        );
    };
    assert!(matches!(lost, Err(Error::PeerLost(_))), "{lost:?}");
    // The eager sends accepted before were complete already; nothing is left hanging.
    assert_eq!(n.wait_n(accepted).len(), accepted);
    let mut buf = [CqTaggedEntry::default(); 1];
    assert_eq!(n.cq.read(&mut buf), Err(Error::Again("cq read")));
    reclaim(pid);
}

/// A child that opens an endpoint, says its pid, and waits for "close" (then closes it and
/// says "closed") or "bye".
fn segment_child() {
    let n = node(CAPS, Progress::Manual);
    connect_parent(&n);
    say(&std::process::id().to_string());
    match listen().as_str() {
        "close" => {
            let Node { ep, .. } = n;
            ep.close().unwrap();
            say("closed");
            assert_eq!(listen(), "bye");
        }
        "bye" => {}
        l => panic!("unexpected line {l:?}"),
    }
}

#[test]
fn killed_owner_segment_is_reclaimed_live_one_is_not() {
    if role().is_some() {
        return segment_child();
    }
    let name = "killed_owner_segment_is_reclaimed_live_one_is_not";
    let mut doomed = spawn(name, "seg", &[]);
    let mut live = spawn(name, "seg", &[]);
    let n = node(CAPS, Progress::Manual);
    let d_addr = connect(&mut doomed, &n);
    connect(&mut live, &n);
    let dpid: u32 = doomed.hear().parse().unwrap();
    let lpid: u32 = live.hear().parse().unwrap();
    assert_eq!((dpid, lpid), (doomed.pid(), live.pid()));
    // Map the doomed child's segment here too, as a sender does.
    n.ep.tinject(b"hello", d_addr, 1).unwrap();
    assert!(segments_of(dpid) > 0 && segments_of(lpid) > 0);

    doomed.kill();
    // SIGKILL leaves the segment in /dev/shm. (Any process opening an shm domain reclaims
    // stale segments, so with other tests running beside this one, one of them may have
    // removed it already; that removal is the behavior under test too.)
    if segments_of(dpid) == 0 {
        eprintln!("note: the killed child's segment was reclaimed by another process");
    }
    reclaim(dpid);
    reclaim_stale();
    assert!(
        segments_of(lpid) > 0,
        "a live owner's segment was reclaimed"
    );
    live.tell("bye");
    live.join();
    assert_eq!(segments_of(lpid), 0, "an exiting owner leaves its segment");
}

#[test]
fn closed_endpoint_leaves_no_segment() {
    if role().is_some() {
        return segment_child();
    }
    let mut peer = spawn("closed_endpoint_leaves_no_segment", "seg", &[]);
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    let pid: u32 = peer.hear().parse().unwrap();
    n.ep.tinject(b"hello", dst, 1).unwrap();
    assert!(segments_of(pid) > 0);
    peer.tell("close");
    assert_eq!(peer.hear(), "closed");
    // Checked while the child still runs: closing, not exiting, removed it.
    assert_eq!(
        segments_of(pid),
        0,
        "closed endpoint left its segment behind"
    );
    peer.tell("bye");
    peer.join();
}

/// Introduces two children to each other through the parent: each says its address (as
/// `connect_parent` does) and is told the other's.
fn introduce(a: &mut Peer, b: &mut Peer) {
    let (ra, rb) = (a.hear(), b.hear());
    a.tell(&rb);
    b.tell(&ra);
}

/// Sender that posts an eager message (tag 1) and a 1 MiB rendezvous one (tag 2), says
/// "posted", and then makes no progress until it is killed.
fn doomed_sender() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let small = pattern(1000, 1);
    let large = pattern(1 << 20, 2);
    // SAFETY: both buffers outlive the process, which is killed while the sends are pending.
    unsafe {
        n.ep.tsend(&small, None, peer, 1, 1).unwrap();
        n.ep.tsend(&large, None, peer, 2, 2).unwrap();
    }
    say("posted");
    listen();
    unreachable!("this child is killed");
}

/// Receiver that, once told its sender is dead, still gets the eager message (it is in our
/// ring) and an error, not a hang, for the rendezvous one whose data died with the sender.
fn orphan_receiver() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let mut small = vec![0u8; 1000];
    let mut large = vec![0u8; 1 << 20];
    assert_eq!(listen(), "killed");
    // SAFETY: both buffers outlive the completions read below.
    unsafe { n.ep.trecv(&mut small, None, peer, 1, 0, 1) }.unwrap();
    let c = n.wait_one();
    assert_eq!((c.op_context, c.len), (1, 1000));
    assert!(small == pattern(1000, 1));
    // SAFETY: as above.
    unsafe { n.ep.trecv(&mut large, None, peer, 2, 0, 2) }.unwrap();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (2, FI_ECONNRESET), "{e:?}");
    say("ok");
    assert_eq!(listen(), "bye");
}

/// Kills the sender once it posted, then has the receiver take what it left. With
/// `reclaimed`, the dead sender's segment is removed first (as any endpoint opened on the
/// host may do to a dead owner's segment): the receiver reads the sender's messages without
/// ever having mapped its segment, and must still find it dead.
fn killed_sender(test: &str, envs: &[(&str, &str)], reclaimed: bool) {
    let mut r = spawn(test, "recv", envs);
    let mut s = spawn(test, "send", &[]);
    introduce(&mut r, &mut s);
    assert_eq!(s.hear(), "posted");
    let pid = s.pid();
    s.kill();
    if reclaimed {
        reclaim(pid);
    }
    r.tell("killed");
    assert_eq!(r.hear(), "ok");
    r.tell("bye");
    r.join();
    reclaim(pid);
}

#[test]
fn killed_sender_leaves_eager_data_and_fails_rendezvous() {
    match role().as_deref() {
        Some("send") => return doomed_sender(),
        Some(_) => return orphan_receiver(),
        None => {}
    }
    killed_sender(
        "killed_sender_leaves_eager_data_and_fails_rendezvous",
        &[],
        false,
    );
}

#[test]
fn killed_sender_whose_segment_is_gone_still_fails_rendezvous() {
    match role().as_deref() {
        Some("send") => return doomed_sender(),
        Some(_) => return orphan_receiver(),
        None => {}
    }
    killed_sender(
        "killed_sender_whose_segment_is_gone_still_fails_rendezvous",
        &[("XFABRIC_SHM_CMA", "0")],
        true,
    );
}

#[test]
fn killed_sender_leaves_eager_data_and_fails_rendezvous_pipelined() {
    match role().as_deref() {
        Some("send") => return doomed_sender(),
        Some(_) => return orphan_receiver(),
        None => {}
    }
    killed_sender(
        "killed_sender_leaves_eager_data_and_fails_rendezvous_pipelined",
        &[("XFABRIC_SHM_CMA", "0")],
        false,
    );
}

#[test]
fn killed_sender_fails_matched_pipelined_receive() {
    const LEN: usize = 8 << 20;
    match role().as_deref() {
        Some("send") => {
            // Posts a large send, then makes no progress: the receiver's CTS is never served.
            let n = node(CAPS, Progress::Manual);
            let peer = connect_parent(&n);
            let data = pattern(LEN, 3);
            // SAFETY: data outlives the process, which is killed while the send is pending.
            unsafe { n.ep.tsend(&data, None, peer, 3, 3) }.unwrap();
            say("posted");
            listen();
            unreachable!("this child is killed");
        }
        Some(_) => {
            let n = node(CAPS, Progress::Manual);
            let peer = connect_parent(&n);
            assert_eq!(listen(), "go");
            let mut buf = vec![0u8; LEN];
            // SAFETY: buf outlives the completion read below.
            unsafe { n.ep.trecv(&mut buf, None, peer, 3, 0, 3) }.unwrap();
            // The receive is matched (the RTS was in our ring) and waits for fragments.
            let mut cq = [CqTaggedEntry::default(); 1];
            assert_eq!(n.cq.read(&mut cq), Err(Error::Again("cq read")));
            say("matched");
            assert_eq!(listen(), "killed");
            let e = n.wait_err();
            assert_eq!((e.op_context, e.err), (3, FI_ECONNRESET), "{e:?}");
            say("ok");
            assert_eq!(listen(), "bye");
            return;
        }
        None => {}
    }
    let test = "killed_sender_fails_matched_pipelined_receive";
    let mut r = spawn(test, "recv", &[("XFABRIC_SHM_CMA", "0")]);
    let mut s = spawn(test, "send", &[]);
    introduce(&mut r, &mut s);
    assert_eq!(s.hear(), "posted");
    r.tell("go");
    assert_eq!(r.hear(), "matched");
    let pid = s.pid();
    s.kill();
    r.tell("killed");
    assert_eq!(r.hear(), "ok");
    r.tell("bye");
    r.join();
    reclaim(pid);
}

#[test]
fn killed_receiver_fails_streaming_send() {
    const LEN: usize = 8 << 20;
    if role().is_some() {
        // Matches the send (answering CTS: no cross-memory attach), then stops progressing.
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        assert_eq!(listen(), "sent");
        let mut buf = vec![0u8; LEN];
        // SAFETY: buf outlives the process, which is killed while the receive is pending.
        unsafe { n.ep.trecv(&mut buf, None, parent, 4, 0, 4) }.unwrap();
        say("matched");
        listen();
        unreachable!("this child is killed");
    }
    let mut peer = spawn(
        "killed_receiver_fails_streaming_send",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    let data = pattern(LEN, 4);
    // SAFETY: data outlives the (error) completion read below.
    unsafe { n.ep.tsend(&data, None, dst, 4, 44) }.unwrap();
    peer.tell("sent");
    assert_eq!(peer.hear(), "matched");
    // Stream until the receiver's ring is full: the send cannot complete.
    let mut cq = [CqTaggedEntry::default(); 1];
    for _ in 0..1000 {
        assert_eq!(n.cq.read(&mut cq), Err(Error::Again("cq read")));
    }
    let pid = peer.pid();
    peer.kill();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (44, FI_ECONNRESET), "{e:?}");
    reclaim(pid);
}

#[test]
fn receive_directed_at_a_killed_peer_fails() {
    if role().is_some() {
        return idle_child();
    }
    let mut peer = spawn("receive_directed_at_a_killed_peer_fails", "idle", &[]);
    let n = node(FI_MSG | FI_DIRECTED_RECV, Progress::Manual);
    let src = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    let mut buf = [0u8; 16];
    // SAFETY: buf outlives the (error) completion read below.
    unsafe { n.ep.recv(&mut buf, None, src, 7) }.unwrap();
    let pid = peer.pid();
    peer.kill();
    // The receive can only ever be satisfied by the dead peer: it fails instead of hanging.
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (7, FI_ECONNRESET), "{e:?}");
    reclaim(pid);
}

/// A child that connects, then on "shrink" truncates its own segment to nothing while it lives
/// on (holding its lock, so it looks alive), says "shrunk", and waits for "bye".
fn shrinking_child() {
    let n = node(CAPS, Progress::Manual);
    connect_parent(&n);
    say("ready");
    assert_eq!(listen(), "shrink");
    let mine = format!("{PREFIX}{}-", std::process::id());
    let mut shrunk = 0;
    for e in std::fs::read_dir(SHM_DIR).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&mine) {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(e.path())
                .unwrap();
            f.set_len(0).unwrap();
            shrunk += 1;
        }
    }
    assert!(shrunk > 0, "no segment of mine in {SHM_DIR}");
    say("shrunk");
    assert_eq!(listen(), "bye");
    drop(n);
}

/// A peer that truncates its segment after we mapped it: the next write into its ring would
/// be a SIGBUS, which killed this process. Now the write lands in memory no one shares, the
/// peer is lost (later sends fail with `PeerLost`) although its process lives on, and another
/// peer goes on working.
#[test]
fn a_peer_truncating_its_segment_neither_kills_us_nor_takes_our_sends() {
    if role().is_some() {
        return shrinking_child();
    }
    let mut peer = spawn(
        "a_peer_truncating_its_segment_neither_kills_us_nor_takes_our_sends",
        "shrink",
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    // Maps the child's segment and claims a lane in it.
    n.ep.tinject(b"hello", dst, 1).unwrap();
    peer.tell("shrink");
    assert_eq!(peer.hear(), "shrunk");
    let faults = guard_faults();
    let deadline = Instant::now() + BOUND;
    let lost = loop {
        match n.ep.tinject(b"after", dst, 2) {
            Ok(()) | Err(Error::Again(_)) => n.ep.progress(),
            r => break r,
        };
        assert!(Instant::now() < deadline, "the shrunk peer was never lost");
    };
    assert!(matches!(lost, Err(Error::PeerLost(_))), "{lost:?}");
    assert!(guard_faults() > faults, "no fault was taken");
    // Another peer, in this process, is untouched.
    let other = node(CAPS, Progress::Manual);
    let to_other = n.add_peer(&other.ep.getname().unwrap());
    let mut buf = [0u8; 5];
    // SAFETY: `buf` outlives the receive, which completes before it is read.
    unsafe { other.ep.trecv(&mut buf, None, FI_ADDR_UNSPEC, 3, 0, 9) }.unwrap();
    n.ep.tinject(b"still", to_other, 3).unwrap();
    let deadline = Instant::now() + BOUND;
    let got = loop {
        n.ep.progress();
        let mut e = [CqTaggedEntry::default(); 1];
        if let Ok(1) = other.cq.read(&mut e) {
            break e[0];
        }
        assert!(Instant::now() < deadline, "the other peer got nothing");
    };
    assert_eq!((got.len, &buf), (5, b"still"));
    let pid = peer.pid();
    peer.tell("bye");
    peer.join();
    assert_eq!(segments_of(pid), 0);
}
