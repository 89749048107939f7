//! shm's split copy: a large message the receiver would pull alone by cross-memory attach is
//! copied half by the receiver, half by the sender (a transport message asks the sender's
//! transport to write its half). Checked here between
//! real processes: every byte lands, tagged and untagged, at odd sizes and over several
//! segments at both ends; a sender killed with a split outstanding fails the receive with
//! `FI_ECONNRESET` (no hang); and split requests from a hostile peer, naming no offer or a
//! range outside one, are answered with an error and write nothing.
//!
//! Whether a copy was split is read from the process's split counters, never timed. Where
//! the kernel forbids cross-memory attach no copy splits: the tests say so and check the
//! bytes alone.

mod common;
use std::time::{Duration, Instant};

use common::*;
use xfabric::errno::*;
use xfabric::*;
use xfabric_core::rdm::wire::{self, Frame};
use xfabric_core::rdm::Desc;
use xfabric_core::IovList;
use xfabric_providers::shm::raw::{
    armed_counts, split_counts, RawPeer, ARMED_SLOTS, FRAME, RELEASE, SPLIT, SPLIT_DONE,
};

const CAPS: u64 = FI_MSG | FI_TAGGED;
/// Enough to hold a split off until a test has looked: no copy below this splits.
const WARM: usize = 1 << 20;

/// One message: its length, whether tagged, where the sender's and receiver's segments end
/// (cut points inside the buffer; none: one segment).
struct Case {
    len: usize,
    tagged: bool,
    send_cuts: &'static [usize],
    recv_cuts: &'static [usize],
}

/// The first message only makes cross-memory attach known to work (copied alone); every
/// later one splits.
const CASES: &[Case] = &[
    Case {
        len: WARM,
        tagged: false,
        send_cuts: &[],
        recv_cuts: &[],
    },
    Case {
        len: 1 << 20,
        tagged: true,
        send_cuts: &[],
        recv_cuts: &[],
    },
    Case {
        len: 4 << 20,
        tagged: false,
        send_cuts: &[],
        recv_cuts: &[],
    },
    Case {
        len: 4 << 20,
        tagged: true,
        send_cuts: &[1 << 20],
        recv_cuts: &[3 << 20],
    },
    Case {
        len: (1 << 20) + 12_345,
        tagged: true,
        send_cuts: &[7, 524_289, 1_000_003],
        recv_cuts: &[4095, 524_288, 524_300],
    },
    Case {
        len: (3 << 20) + 777,
        tagged: false,
        send_cuts: &[1_572_864],
        recv_cuts: &[1, 2_000_000, 3 << 20],
    },
];

/// `buf` cut at `cuts` into segments.
fn segs(buf: &[u8], cuts: &[usize]) -> Vec<RawIov> {
    let mut at = 0;
    let mut v = Vec::new();
    for &c in cuts.iter().chain([buf.len()].iter()) {
        v.push(RawIov::of(&buf[at..c]));
        at = c;
    }
    v
}

fn segs_mut(buf: &mut [u8], cuts: &[usize]) -> Vec<RawIov> {
    let base = buf.as_mut_ptr() as usize;
    segs(buf, cuts)
        .into_iter()
        .map(|s| RawIov {
            addr: base + (s.addr - buf.as_ptr() as usize),
            len: s.len,
        })
        .collect()
}

/// Sender child: sends every case in turn, each waited for (its completion needs the split's
/// half it writes, so waiting drives it).
fn sender() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    for (i, c) in CASES.iter().enumerate() {
        let data = pattern(c.len, i as u64 + 1);
        let iov = segs(&data, c.send_cuts);
        // SAFETY: data outlives the completion waited for below.
        n.retry(|| unsafe {
            if c.tagged {
                n.ep.tsendv(&iov, &[], peer, 100 + i as u64, i as Context)
            } else {
                n.ep.sendv(&iov, &[], peer, i as Context)
            }
        });
        let e = n.wait_one();
        assert_eq!(e.op_context, i as Context);
    }
    say("sent");
    assert_eq!(listen(), "bye");
}

/// Receiver child: posts a receive per case (cut as the case says), checks every byte.
fn receiver() {
    let n = node(CAPS, Progress::Manual);
    let src = connect_parent(&n);
    let mut bufs: Vec<Vec<u8>> = CASES.iter().map(|c| vec![0u8; c.len]).collect();
    for (i, (c, b)) in CASES.iter().zip(bufs.iter_mut()).enumerate() {
        let iov = segs_mut(b, c.recv_cuts);
        // SAFETY: the buffers outlive the completions read below.
        n.retry(|| unsafe {
            if c.tagged {
                n.ep.trecvv(&iov, &[], src, 100 + i as u64, 0, 50 + i as Context)
            } else {
                n.ep.recvv(&iov, &[], src, 50 + i as Context)
            }
        });
    }
    let got = n.wait_n(CASES.len());
    for e in &got {
        let i = e.op_context - 50;
        assert_eq!(e.len, CASES[i].len, "case {i}");
        if CASES[i].tagged {
            assert_eq!(e.tag, 100 + i as u64, "case {i}");
        }
    }
    for (i, b) in bufs.iter().enumerate() {
        assert!(*b == pattern(CASES[i].len, i as u64 + 1), "case {i}: bytes");
    }
    let c = split_counts();
    if c.started == 0 {
        eprintln!("cross-memory attach is refused here: no copy split (bytes checked)");
    } else {
        assert_eq!(c.started as usize, CASES.len() - 1, "splits started: {c:?}");
        // How many the sender claimed in time depends on scheduling; every one ended.
        assert!(c.revoked + c.shared <= c.started, "{c:?}");
        eprintln!("splits: {c:?}");
    }
    say("OK");
    assert_eq!(listen(), "bye");
}

/// Test `t`'s receiver and sender children, each told the other's address.
fn pair(t: &str) -> (Peer, Peer) {
    let mut r = spawn(t, "recv", &[]);
    let mut s = spawn(t, "send", &[]);
    // The receiver's first: some senders say theirs only once they know where to send.
    s.tell(&r.hear());
    r.tell(&s.hear());
    (r, s)
}

#[test]
fn split_copies_land_every_byte() {
    let t = "split_copies_land_every_byte";
    match role().as_deref() {
        Some("recv") => receiver(),
        Some(_) => sender(),
        None => {
            let (mut r, mut s) = pair(t);
            assert_eq!(r.hear(), "OK");
            assert_eq!(s.hear(), "sent");
            r.tell("bye");
            s.tell("bye");
            r.join_leaving_nothing();
            s.join_leaving_nothing();
        }
    }
}

/// Sender child that stops: one message to warm up, waited for; then a 4 MiB one, after
/// which it makes no progress (its transport never sees the split request) until killed.
fn stalled_sender() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let warm = pattern(WARM, 1);
    let big = pattern(4 << 20, 2);
    // SAFETY: both outlive the process, which is killed while the second is pending.
    unsafe {
        n.retry(|| n.ep.tsend(&warm, None, peer, 1, 1));
        n.wait_one();
        n.retry(|| n.ep.tsend(&big, None, peer, 2, 2));
    }
    say("posted");
    listen();
    unreachable!("this child is killed");
}

/// Receiver child: takes the warm-up, then the 4 MiB message from a sender that makes no
/// progress: the split it starts is revoked (never claimed) and the message read alone.
fn receiver_of_stalled() {
    let n = node(CAPS, Progress::Manual);
    let src = connect_parent(&n);
    let mut warm = vec![0u8; WARM];
    let mut big = vec![0u8; 4 << 20];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        n.retry(|| n.ep.trecv(&mut warm, None, src, 1, 0, 1));
        n.wait_one();
        n.retry(|| n.ep.trecv(&mut big, None, src, 2, 0, 2));
    }
    assert_eq!(listen(), "posted");
    let e = n.wait_one();
    assert_eq!(e.op_context, 2);
    assert!(
        warm == pattern(WARM, 1) && big == pattern(4 << 20, 2),
        "bytes"
    );
    let c = split_counts();
    if c.started == 0 {
        eprintln!("cross-memory attach is refused here: no copy split (bytes checked)");
    } else {
        assert_eq!((c.started, c.revoked, c.shared), (1, 1, 0), "{c:?}");
    }
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn a_stalled_sender_does_not_hold_up_a_split_receive() {
    let t = "a_stalled_sender_does_not_hold_up_a_split_receive";
    match role().as_deref() {
        Some("recv") => receiver_of_stalled(),
        Some(_) => stalled_sender(),
        None => {
            let (mut r, mut s) = pair(t);
            assert_eq!(s.hear(), "posted");
            r.tell("posted");
            assert_eq!(r.hear(), "OK");
            r.tell("bye");
            r.join_leaving_nothing();
            let spid = s.pid();
            s.kill();
            reclaim(spid);
        }
    }
}

/// The message whose split the raw sender claims: large, so that the receiver's own part
/// (read before it revokes) gives that sender ample time to claim it.
const BIG: usize = 16 << 20;

/// Raw sender child: offers messages of its memory (tags 1 and 2, the first to make
/// cross-memory attach known to work at the receiver; with `eperm` a third) through `Rts`
/// frames, and claims the split request for the second as a sender's transport would. Then,
/// without `eperm`, says "claimed" and never answers: it is killed with its part claimed;
/// with it, answers `FI_EPERM` (its kernel refusing the write) and stays until told "bye".
fn claiming_sender(eperm: bool) {
    let addr = unhex(&listen());
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    say(&hex(format!("fi_shm://{}", raw.name()).as_bytes()));
    let warm = pattern(WARM, 1);
    let big = pattern(BIG, 2);
    let third = pattern(WARM + 5, 3);
    let offer = |raw: &mut RawPeer, id: u32, tag: u64, data: &[u8]| {
        let iov = IovList::from_segs([RawIov::of(data)]).unwrap();
        let rts = Frame::Rts {
            id,
            tag,
            data: 0,
            len: data.len() as u64,
            flags: wire::flags::TAGGED,
            desc: Desc::of_iov(&iov),
        };
        assert!(raw.send_raw(FRAME, rts.ctrl(0).as_bytes(), 0), "ring full");
    };
    offer(&mut raw, 0, 1, &warm);
    offer(&mut raw, 1, 2, &big);
    let start = Instant::now();
    let (req, claimed) = loop {
        match raw.recv_claiming() {
            Some((SPLIT, b, claimed)) => break (b, claimed),
            Some(_) => {}
            None => std::thread::yield_now(),
        }
        assert!(start.elapsed() < BOUND, "no split request came");
    };
    if !eperm {
        say("claimed");
        // Killed here, or told "bye" once the receiver closed.
        assert_eq!(listen(), "bye");
        return;
    }
    if claimed {
        let mut done = req[..8].to_vec();
        done.extend_from_slice(&FI_EPERM.to_le_bytes());
        assert!(raw.send_raw(SPLIT_DONE, &done, 0), "ring full");
    }
    say(if claimed { "refused" } else { "revoked" });
    assert_eq!(listen(), "third");
    offer(&mut raw, 2, 3, &third);
    assert_eq!(listen(), "bye");
}

/// A receiver's endpoint for `claiming_sender`, which connects to it: its address said
/// first, then the raw sender's address heard and inserted.
fn node_for_raw_sender() -> (Node, FiAddr) {
    let n = node(CAPS, Progress::Manual);
    say(&hex(&n.ep.getname().unwrap()));
    let src = n.add_peer(&unhex(&listen()));
    (n, src)
}

/// Receiver child for the claiming sender: posts both receives, and polls (once a
/// millisecond once the sender is killed) until the second ends.
fn receiver_of_claimed() {
    let (n, src) = node_for_raw_sender();
    let mut warm = vec![0u8; WARM];
    let mut big = vec![0u8; BIG];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        n.retry(|| n.ep.trecv(&mut warm, None, src, 1, 0, 1));
        n.retry(|| n.ep.trecv(&mut big, None, src, 2, 0, 2));
    }
    let e = n.wait_one();
    assert_eq!(e.op_context, 1);
    assert!(warm == pattern(WARM, 1), "warm-up bytes");
    say("ready");
    assert_eq!(listen(), "killed");
    // Either the sender claimed the request before we finished our part (the receive waits
    // for it, and fails once it is found dead) or it did not (revoked: read alone).
    let start = Instant::now();
    let mut cq = [CqTaggedEntry::default(); 1];
    let c = split_counts();
    loop {
        match n.cq.read(&mut cq) {
            Ok(_) => {
                assert_eq!(cq[0].op_context, 2);
                assert!(big == pattern(BIG, 2), "bytes");
                assert_eq!(c.revoked, 1, "completed though claimed: {c:?}");
                eprintln!("the split was revoked before the sender claimed it");
                break;
            }
            Err(Error::Avail) => {
                let err = n.cq.readerr().expect("readerr after Avail");
                assert_eq!((err.op_context, err.err), (2, FI_ECONNRESET), "{err:?}");
                assert_eq!((c.started, c.revoked), (1, 0), "{c:?}");
                break;
            }
            Err(Error::Again(_)) => {}
            r => panic!("after the kill: {r:?}"),
        }
        assert!(
            start.elapsed() < BOUND,
            "the receive split with a dead sender did not end within {BOUND:?}"
        );
        // A slow poller: the sweep must find the sender dead by time, not by polling rate.
        std::thread::sleep(Duration::from_millis(1));
    }
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn a_sender_killed_with_its_part_claimed_fails_the_receive() {
    let t = "a_sender_killed_with_its_part_claimed_fails_the_receive";
    match role().as_deref() {
        Some("recv") => receiver_of_claimed(),
        Some(_) => claiming_sender(false),
        None => {
            let (mut r, mut s) = pair(t);
            assert_eq!(r.hear(), "ready");
            assert_eq!(s.hear(), "claimed");
            let spid = s.pid();
            s.kill();
            r.tell("killed");
            assert_eq!(r.hear(), "OK");
            r.tell("bye");
            r.join_leaving_nothing();
            reclaim(spid);
        }
    }
}

/// Receiver child for the refusing sender: three messages, every byte checked; the second's
/// split either refused (`FI_EPERM`: the receiver read the sender's part too, and splits
/// nothing more from it) or revoked.
fn receiver_of_refused() {
    let (n, src) = node_for_raw_sender();
    let lens = [WARM, BIG, WARM + 5];
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the completions read below.
        n.retry(|| unsafe { n.ep.trecv(b, None, src, i as u64 + 1, 0, i as Context + 1) });
    }
    // The second completes once the sender's answer came (or at once, revoked).
    n.wait_n(2);
    say("two");
    let how = listen();
    n.wait_n(1);
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            *b == pattern(lens[i], i as u64 + 1),
            "message {}: bytes",
            i + 1
        );
    }
    let c = split_counts();
    eprintln!("the sender's part was {how}");
    match how.as_str() {
        // Not split again after the refusal.
        "refused" => assert_eq!((c.started, c.revoked, c.shared), (1, 0, 0), "{c:?}"),
        // The sender claims nothing more: the third is split and revoked too.
        "revoked" => assert_eq!((c.started, c.revoked, c.shared), (2, 2, 0), "{c:?}"),
        other => panic!("{other}"),
    }
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn a_sender_refused_the_write_has_its_part_read_by_the_receiver() {
    let t = "a_sender_refused_the_write_has_its_part_read_by_the_receiver";
    match role().as_deref() {
        Some("recv") => receiver_of_refused(),
        Some(_) => claiming_sender(true),
        None => {
            let (mut r, mut s) = pair(t);
            let how = s.hear();
            assert_eq!(r.hear(), "two");
            s.tell("third");
            r.tell(&how);
            assert_eq!(r.hear(), "OK");
            r.tell("bye");
            s.tell("bye");
            r.join_leaving_nothing();
            s.join_leaving_nothing();
        }
    }
}

/// Receiver child that closes its endpoint while the sender holds its part claimed and never
/// answers: the close waits for the answer (the sender may be writing into the receive's
/// buffer) only a bounded time, and the receive ends canceled.
fn receiver_closing() {
    let (n, src) = node_for_raw_sender();
    let mut warm = vec![0u8; WARM];
    let mut big = vec![0u8; BIG];
    // SAFETY: the buffers outlive the endpoint, closed below.
    unsafe {
        n.retry(|| n.ep.trecv(&mut warm, None, src, 1, 0, 1));
        n.retry(|| n.ep.trecv(&mut big, None, src, 2, 0, 2));
    }
    assert_eq!(n.wait_one().op_context, 1);
    say("ready");
    assert_eq!(listen(), "close");
    let c = split_counts();
    let Node { ep, cq, .. } = n;
    let start = Instant::now();
    ep.close().expect("close");
    assert!(start.elapsed() < BOUND, "close took {:?}", start.elapsed());
    let mut buf = [CqTaggedEntry::default(); 1];
    match cq.read(&mut buf) {
        Err(Error::Avail) => {
            let e = cq.readerr().expect("readerr after Avail");
            assert_eq!((e.op_context, e.err), (2, FI_ECANCELED), "{e:?}");
            assert_eq!((c.started, c.revoked), (1, 0), "{c:?}");
        }
        Ok(_) => {
            // Revoked before the sender claimed it: read alone, done before the close.
            assert_eq!(buf[0].op_context, 2);
            assert!(big == pattern(BIG, 2), "bytes");
            assert_eq!(c.revoked, 1, "{c:?}");
        }
        r => panic!("after the close: {r:?}"),
    }
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn closing_with_a_claimed_split_is_bounded_and_cancels_the_receive() {
    let t = "closing_with_a_claimed_split_is_bounded_and_cancels_the_receive";
    match role().as_deref() {
        Some("recv") => receiver_closing(),
        Some(_) => claiming_sender(false),
        None => {
            let (mut r, mut s) = pair(t);
            assert_eq!(r.hear(), "ready");
            assert_eq!(s.hear(), "claimed");
            r.tell("close");
            assert_eq!(r.hear(), "OK");
            r.tell("bye");
            s.tell("bye");
            r.join_leaving_nothing();
            s.join_leaving_nothing();
        }
    }
}

fn refusals_logged() -> usize {
    warnings::count("refusing a split copy request")
}

/// Drives `n` until `raw` has a message of `kind` from it (bounded); its bytes.
fn await_msg(n: &Node, raw: &mut RawPeer, kind: u8) -> Vec<u8> {
    let start = Instant::now();
    let mut buf = [CqTaggedEntry::default(); 4];
    loop {
        let _ = n.cq.read(&mut buf);
        while let Some((k, b)) = raw.recv_raw() {
            if k == kind {
                return b;
            }
        }
        assert!(start.elapsed() < BOUND, "no message of kind {kind} came");
    }
}

/// A SPLIT asking for bytes `from..to` of offer `offer` into `dest`.
fn split_req(token: u64, offer: u32, from: u64, to: u64, dest: &[RawIov]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&token.to_le_bytes());
    b.extend_from_slice(&offer.to_le_bytes());
    b.extend_from_slice(&(dest.len() as u32).to_le_bytes());
    b.extend_from_slice(&from.to_le_bytes());
    b.extend_from_slice(&to.to_le_bytes());
    // The state word (pending) and a zero word.
    b.extend_from_slice(&[0; 8]);
    for s in dest {
        b.extend_from_slice(&(s.addr as u64).to_le_bytes());
        b.extend_from_slice(&(s.len as u64).to_le_bytes());
    }
    b
}

/// The answer's (token, status).
fn done_of(b: &[u8]) -> (u64, i32) {
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        i32::from_le_bytes(b[8..12].try_into().unwrap()),
    )
}

#[test]
fn hostile_split_requests_are_refused_and_write_nothing() {
    // One of two tests of this binary that run their endpoints in this process (each counts
    // the refusals it causes as "more than before", which the other's cannot undo).
    warnings::capture();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    // The endpoint sends the raw peer a large message: a live offer, named in its Rts.
    let dst = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    let len = 1 << 20;
    let data = pattern(len, 9);
    // SAFETY: data outlives the endpoint (dropped before it, the send canceled).
    n.retry(|| unsafe { n.ep.tsend(&data, None, dst, 3, 3) });
    let rts = await_msg(&n, &mut raw, FRAME);
    // The slot's bytes run past the frame: its prefix says where the control part ends.
    let pre = wire::prefix(&rts).expect("a prefix");
    let ctrl = &rts[wire::PREFIX..wire::PREFIX + pre.ctrl_len as usize];
    let Frame::Rts { id, .. } = wire::decode(&pre, ctrl).expect("an Rts") else {
        panic!("not an Rts");
    };

    let mut dest = vec![0u8; 8192];
    let d = [RawIov::of_mut(&mut dest)];
    let dl = d[0].len as u64;
    // Naming no live offer: canceled (as for an offer whose endpoint closed); a request that
    // does not parse or fit its offer: invalid.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no such offer", split_req(1, id ^ 0x5555, 0, dl, &d)),
        (
            "a range past the offer",
            split_req(2, id, len as u64 - 100, len as u64 + dl - 100, &d),
        ),
        (
            "a range past usize",
            split_req(3, id, u64::MAX - dl + 1, u64::MAX, &d),
        ),
        ("a backwards range", split_req(4, id, dl, 0, &d)),
        (
            "a destination longer than the range",
            split_req(5, id, 0, dl - 1, &d),
        ),
        ("too many segments", {
            let mut b = split_req(6, id, 0, dl, &d);
            b[12..16].copy_from_slice(&5u32.to_le_bytes());
            b
        }),
        ("segments past the message", {
            let mut b = split_req(7, id, 0, dl, &d);
            b[12..16].copy_from_slice(&4u32.to_le_bytes());
            b
        }),
    ];
    for (why, b) in &cases {
        let before = refusals_logged();
        assert!(raw.send_raw(SPLIT, b, 0), "{why}: ring full");
        let (token, status) = done_of(&await_msg(&n, &mut raw, SPLIT_DONE));
        let want = if why.starts_with("no such") {
            FI_ECANCELED
        } else {
            FI_EINVAL
        };
        assert_eq!(status, want, "{why}");
        assert_eq!(
            token,
            u64::from_le_bytes(b[..8].try_into().unwrap()),
            "{why}"
        );
        assert!(dest.iter().all(|&x| x == 0), "{why}: bytes were written");
        assert!(raw.lane_claimed(), "{why}: the lane was dropped");
        assert!(refusals_logged() > before, "{why}: no log line");
    }
    // The live offer, named by another peer than the one it was offered to.
    let mut other = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(other.send_raw(SPLIT, &split_req(9, id, 0, dl, &d), 0));
    let (token, status) = done_of(&await_msg(&n, &mut other, SPLIT_DONE));
    assert_eq!((token, status), (9, FI_ECANCELED), "another peer's offer");
    assert!(
        dest.iter().all(|&x| x == 0),
        "another peer's offer: bytes were written"
    );
    // Answers naming no split are ignored.
    assert!(raw.send_raw(SPLIT_DONE, &[0xff; 12], 0));

    // A request within the offer is served: the check is not refusing everything.
    let from = len as u64 - dl;
    assert!(raw.send_raw(SPLIT, &split_req(8, id, from, len as u64, &d), 0));
    let (token, status) = done_of(&await_msg(&n, &mut raw, SPLIT_DONE));
    if status == FI_EPERM {
        eprintln!("cross-memory attach is refused here: the served request is not checked");
    } else {
        assert_eq!((token, status), (8, 0));
        assert!(dest[..] == data[from as usize..], "the served bytes");
    }
    assert!(raw.lane_claimed());
    // Closed before `data` goes: the send still pending is canceled first.
    drop(n);
}

/// A send armed for an XPU's trigger (docs/xpu-triggers.md, "Armed sends") is announced in an
/// armed slot of the sender's segment, which every peer maps: a hostile peer can read its `Rts`
/// before the trigger fires. A split request naming it then is refused and writes nothing
/// (the sender offers nothing before the firing); once the trigger fired and the release
/// came, the same request is served.
#[test]
fn a_split_request_for_an_armed_send_is_refused_until_it_fires() {
    warnings::capture();
    let n = node(CAPS | FI_TRIGGER | FI_XPU_TRIGGER, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let dst = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    let len = 1 << 20;
    let data = pattern(len, 11);
    let iov = [RawIov::of(&data)];
    let mut var = [TriggerVar::default()];
    let before = armed_counts();
    // SAFETY: data outlives the endpoint (dropped before it, the send canceled).
    let k = unsafe {
        n.ep.tsendmsg_xpu(&tmsg(&iov, dst, 5, 5, 0), 0, Xpu::CPU, &mut var)
    };
    assert_eq!(k.expect("arm"), 1);
    if armed_counts().prearmed == before.prearmed {
        // A send past the eager limit is armed only with an offer by cross-memory attach.
        eprintln!("cross-memory attach is refused here: the send was not armed, nothing to check");
        drop(n);
        return;
    }
    // Its announcement, read by the hostile peer from the sender's armed slots.
    let id = (0..ARMED_SLOTS)
        .filter_map(|s| raw.target_armed(s))
        .find_map(|f| {
            let pre = wire::prefix(&f).ok()?;
            let ctrl = f.get(wire::PREFIX..wire::PREFIX + pre.ctrl_len as usize)?;
            match wire::decode(&pre, ctrl).ok()? {
                Frame::Rts { id, len: l, .. } if l == len as u64 => Some(id),
                _ => None,
            }
        })
        .expect("the armed send's Rts in an armed slot");
    let mut dest = vec![0u8; 8192];
    let d = [RawIov::of_mut(&mut dest)];
    let dl = d[0].len as u64;
    let from = len as u64 - dl;
    let refused = refusals_logged();
    assert!(raw.send_raw(SPLIT, &split_req(1, id, from, len as u64, &d), 0));
    let (token, status) = done_of(&await_msg(&n, &mut raw, SPLIT_DONE));
    assert_eq!(
        (token, status),
        (1, FI_ECANCELED),
        "an armed send's offer before its trigger"
    );
    assert!(
        dest.iter().all(|&x| x == 0),
        "bytes were written before the trigger"
    );
    assert!(refusals_logged() > refused, "no log line");
    assert!(raw.lane_claimed(), "the lane was dropped");

    // The XPU rings: the release names the slot, and the offer is live from then on.
    // SAFETY: a variable the endpoint filled for the CPU XPU, its doorbell alive with it.
    unsafe { xfabric::kernels::cpu::ring(&var) }.expect("ring");
    let _ = await_msg(&n, &mut raw, RELEASE);
    assert!(raw.send_raw(SPLIT, &split_req(2, id, from, len as u64, &d), 0));
    let (token, status) = done_of(&await_msg(&n, &mut raw, SPLIT_DONE));
    if status == FI_EPERM {
        eprintln!("cross-memory attach is refused here: the served request is not checked");
    } else {
        assert_eq!((token, status), (2, 0), "the fired send's offer");
        assert!(dest[..] == data[from as usize..], "the served bytes");
    }
    assert!(raw.lane_claimed());
    // Closed before `data` goes: the send still pending is canceled first.
    drop(n);
}
