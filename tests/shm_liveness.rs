//! A peer SIGKILLed with work outstanding is noticed by time, whatever the progress mode and
//! however slowly the survivor polls: every operation toward it (1 MiB sends, receives matched
//! to its rendezvous sends on the cross-memory-attach and the pipelined path, receives directed
//! at it) completes with `FI_ECONNRESET`. The bound on each wait (`BOUND`) only turns a
//! regression into a failure instead of a hang: the sweep is due every 20 ms.

mod common;
use std::time::{Duration, Instant};

use common::*;
use xfabric::errno::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV;
const N: usize = 8;
const LEN: usize = 1 << 20;

/// How the survivor waits for its completions.
#[derive(Clone, Copy)]
enum Poll {
    /// One `fi_cq_read` per millisecond (manual progress: the read drives it).
    EveryMs,
    /// Blocked in `fi_cq_sread`.
    Sread,
}

/// Reads `want` completions, every one of which must be an error, pacing the reads as `how`.
fn wait_errors(n: &Node, want: usize, how: Poll) -> Vec<CqErrEntry> {
    let start = Instant::now();
    let mut errs = Vec::new();
    let mut buf = [CqTaggedEntry::default(); 4];
    while errs.len() < want {
        let r = match how {
            Poll::EveryMs => n.cq.read(&mut buf),
            Poll::Sread => n.cq.sread(&mut buf, 1, BOUND.as_millis() as i32),
        };
        match r {
            Err(Error::Avail) => errs.push(n.cq.readerr().expect("readerr after Avail")),
            Err(Error::Again(_)) | Err(Error::TimedOut(_)) => {}
            Ok(k) => panic!("expected error completions, got {:?}", &buf[..k]),
            Err(e) => panic!("cq read: {e}"),
        }
        assert!(
            start.elapsed() < BOUND,
            "{} of {want} operations toward the dead peer resolved after {BOUND:?}",
            errs.len()
        );
        if matches!(how, Poll::EveryMs) {
            // The slow poller under test (a CQ read once a millisecond), not a wait for an
            // event: the outcome is asserted whatever the timing, bounded by BOUND.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    errs
}

fn assert_reset(errs: &[CqErrEntry], ctxs: impl IntoIterator<Item = Context>) {
    let mut got: Vec<Context> = errs.iter().map(|e| e.op_context).collect();
    got.sort_unstable();
    let mut want: Vec<Context> = ctxs.into_iter().collect();
    want.sort_unstable();
    assert_eq!(got, want, "{errs:?}");
    for e in errs {
        assert_eq!(e.err, FI_ECONNRESET, "{e:?}");
    }
}

/// A child that connects, says "ready" and then makes no progress until it is killed.
fn idle_child() {
    let n = node(CAPS, Progress::Manual);
    connect_parent(&n);
    say("ready");
    listen();
    unreachable!("this child is killed");
}

/// Posts `N` 1 MiB sends and a receive directed at an idle child, kills it, and waits as `how`.
fn sends_to_killed_receiver(test: &str, progress: Progress, how: Poll) {
    let mut peer = spawn(test, "idle", &[]);
    let n = node(CAPS, progress);
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    let data = pattern(LEN, 1);
    let mut rbuf = vec![0u8; 64];
    // SAFETY: the buffers outlive the (error) completions read below.
    unsafe {
        for i in 0..N {
            n.ep.tsend(&data, None, dst, 1, 100 + i as Context).unwrap();
        }
        n.ep.trecv(&mut rbuf, None, dst, 9, 0, 200).unwrap();
    }
    let mut cq = [CqTaggedEntry::default(); 1];
    for _ in 0..10 {
        assert_eq!(n.cq.read(&mut cq), Err(Error::Again("cq read")));
    }
    let pid = peer.pid();
    peer.kill();
    let errs = wait_errors(&n, N + 1, how);
    assert_reset(&errs, (100..100 + N as Context).chain([200]));
    reclaim(pid);
}

#[test]
fn sends_to_killed_receiver_fail_under_slow_manual_polling() {
    let t = "sends_to_killed_receiver_fail_under_slow_manual_polling";
    if role().is_some() {
        return idle_child();
    }
    sends_to_killed_receiver(t, Progress::Manual, Poll::EveryMs);
}

#[test]
fn sends_to_killed_receiver_fail_under_auto_progress() {
    let t = "sends_to_killed_receiver_fail_under_auto_progress";
    if role().is_some() {
        return idle_child();
    }
    sends_to_killed_receiver(t, Progress::Auto, Poll::EveryMs);
}

#[test]
fn sends_to_killed_receiver_fail_in_sread() {
    let t = "sends_to_killed_receiver_fail_in_sread";
    if role().is_some() {
        return idle_child();
    }
    sends_to_killed_receiver(t, Progress::Manual, Poll::Sread);
}

#[test]
fn receive_directed_at_killed_peer_fails_under_slow_manual_polling() {
    if role().is_some() {
        return idle_child();
    }
    let t = "receive_directed_at_killed_peer_fails_under_slow_manual_polling";
    let mut peer = spawn(t, "idle", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "ready");
    let mut buf = [0u8; 16];
    // SAFETY: buf outlives the (error) completion read below.
    unsafe { n.ep.recv(&mut buf, None, src, 7) }.unwrap();
    let pid = peer.pid();
    peer.kill();
    assert_reset(&wait_errors(&n, 1, Poll::EveryMs), [7]);
    reclaim(pid);
}

/// Sender child: posts `N` 1 MiB sends (tags 0..N), says "posted", then makes no progress.
fn stalled_sender() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let data = pattern(LEN, 2);
    // SAFETY: data outlives the process, which is killed while the sends are pending.
    unsafe {
        for i in 0..N {
            n.ep.tsend(&data, None, peer, i as u64, i as Context)
                .unwrap();
        }
    }
    say("posted");
    listen();
    unreachable!("this child is killed");
}

/// Receives directed at the sender for tags it never sends: they can only fail.
const EXTRA: usize = 2;

/// Survivor child: once the sends are posted, posts matching receives directed at the sender
/// (and `EXTRA` it never sends), lets the rendezvous start, and once the sender is killed polls
/// once per ms. On the pipelined path every matched receive waits for the sender and fails; on
/// the cross-memory-attach path the copies need nothing from the sender and may complete first.
fn survivor_receiver() {
    let n = node(CAPS, Progress::Manual);
    let src = connect_parent(&n);
    assert_eq!(listen(), "posted");
    let mut bufs: Vec<Vec<u8>> = (0..N + EXTRA).map(|_| vec![0u8; LEN]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the completions read below.
        unsafe { n.ep.trecv(b, None, src, i as u64, 0, 300 + i as Context) }.unwrap();
    }
    let mut done = Vec::new();
    let mut cq = [CqTaggedEntry::default(); 1];
    for _ in 0..100 {
        match n.cq.read(&mut cq) {
            Ok(_) => done.push(cq[0].op_context),
            Err(Error::Again(_)) => {}
            r => panic!("before the kill: {r:?}"),
        }
    }
    say("matched");
    assert_eq!(listen(), "killed");
    let start = Instant::now();
    let mut errs = Vec::new();
    while done.len() + errs.len() < N + EXTRA {
        match n.cq.read(&mut cq) {
            Ok(_) => done.push(cq[0].op_context),
            Err(Error::Avail) => errs.push(n.cq.readerr().expect("readerr after Avail")),
            Err(Error::Again(_)) => {}
            r => panic!("after the kill: {r:?}"),
        }
        assert!(
            start.elapsed() < BOUND,
            "{} of {} receives from the dead peer resolved after {BOUND:?}",
            done.len() + errs.len(),
            N + EXTRA
        );
        // The slow poller under test, as above.
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in &done {
        let i = c - 300;
        assert!(i < N && bufs[i] == pattern(LEN, 2), "receive {c}");
    }
    let failed: Vec<Context> = (300..300 + (N + EXTRA) as Context)
        .filter(|c| !done.contains(c))
        .collect();
    assert_reset(&errs, failed);
    say("OK");
    assert_eq!(listen(), "bye");
}

fn receives_from_killed_sender(test: &str, envs: &[(&str, &str)]) {
    let mut r = spawn(test, "recv", envs);
    let mut s = spawn(test, "send", &[]);
    let (ra, sa) = (r.hear(), s.hear());
    r.tell(&sa);
    s.tell(&ra);
    assert_eq!(s.hear(), "posted");
    r.tell("posted");
    assert_eq!(r.hear(), "matched");
    let spid = s.pid();
    s.kill();
    r.tell("killed");
    assert_eq!(r.hear(), "OK");
    r.tell("bye");
    r.join_leaving_nothing();
    reclaim(spid);
}

#[test]
fn receives_from_killed_sender_fail_under_slow_manual_polling() {
    let t = "receives_from_killed_sender_fail_under_slow_manual_polling";
    match role().as_deref() {
        Some("recv") => survivor_receiver(),
        Some(_) => stalled_sender(),
        None => receives_from_killed_sender(t, &[]),
    }
}

#[test]
fn receives_from_killed_sender_fail_under_slow_manual_polling_pipelined() {
    let t = "receives_from_killed_sender_fail_under_slow_manual_polling_pipelined";
    match role().as_deref() {
        Some("recv") => survivor_receiver(),
        Some(_) => stalled_sender(),
        None => receives_from_killed_sender(t, &[("XFABRIC_SHM_CMA", "0")]),
    }
}
