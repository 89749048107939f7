//! Tagged matching between two real processes: ignore bits, tags arriving out of posting
//! order, unexpected messages of both protocols, remote CQ data, and FI_PEEK / FI_CLAIM /
//! FI_DISCARD.
//!
//! Written once for every provider: shm by default, tcp through `XFABRIC_TEST_PROVIDER` in
//! scripts/test.sh, verbs in the Soft-RoCE VM (scripts/test-verbs-vm.sh).

mod common;
use common::*;
use xfabric::errno::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;

/// Posts a tagged receive for `buf`.
fn post(n: &Node, buf: &mut [u8], src: FiAddr, tag: u64, ignore: u64, ctx: Context) {
    // SAFETY: every buffer passed here outlives the completion the caller waits for.
    unsafe { n.ep.trecv(buf, None, src, tag, ignore, ctx) }.unwrap();
}

/// Child that sends, when told "go", each (tag, len) of `plan` with payload `pattern(len, tag)`,
/// waits for its send completions and then for "bye".
fn tagged_sender(plan: &[(u64, usize)]) {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    assert_eq!(listen(), "go");
    let bufs: Vec<Vec<u8>> = plan.iter().map(|&(t, l)| pattern(l, t)).collect();
    for (i, (&(tag, _), b)) in plan.iter().zip(&bufs).enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        n.retry(|| unsafe { n.ep.tsend(b, None, parent, tag, 1000 + i) });
    }
    n.wait_n(plan.len());
    say("sent");
    assert_eq!(listen(), "bye");
}

const WILDCARD_PLAN: [(u64, usize); 6] = [
    (0x7, 64),
    (0xab00_0000_0000_0042, 3000),
    (0x1234, 10),
    (0x5, 20_000),
    (0x1234, 11),
    (0x12ff, 0),
];

#[test]
fn wildcards_and_out_of_order_tags() {
    if role().is_some() {
        return tagged_sender(&WILDCARD_PLAN);
    }
    let mut peer = spawn("wildcards_and_out_of_order_tags", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; 32 * 1024]).collect();
    // (tag, ignore) per receive, in posting order. The first two both accept 0x1234: the one
    // posted first takes the first such message.
    let recvs: [(u64, u64); 6] = [
        (0x1200, 0x00ff),
        (0x1234, 0),
        (0x5, 0),
        (0x7, 0),
        (0xab00_0000_0000_0000, 0x00ff_ffff_ffff_ffff),
        (0x1000, 0x0fff),
    ];
    for (i, (&(tag, ignore), b)) in recvs.iter().zip(bufs.iter_mut()).enumerate() {
        post(&n, b, src, tag, ignore, i);
    }
    peer.tell("go");
    let got = n.wait_n(6);
    // Which receive each message of the plan must land in.
    let expect_ctx = [3usize, 4, 0, 2, 1, 5];
    for (k, &(tag, len)) in WILDCARD_PLAN.iter().enumerate() {
        let ctx = expect_ctx[k];
        let c = got
            .iter()
            .find(|c| c.op_context == ctx)
            .unwrap_or_else(|| panic!("no completion for receive {ctx}: {got:?}"));
        assert_eq!(
            c.tag, tag,
            "receive {ctx} reports the sent tag, not the posted one"
        );
        assert_eq!(c.len, len, "receive {ctx}");
        assert_eq!(c.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
        assert_eq!(c.flags & FI_REMOTE_CQ_DATA, 0);
        assert_eq!(c.buf, bufs[ctx].as_ptr() as usize);
        assert!(
            bufs[ctx][..len] == pattern(len, tag),
            "data of receive {ctx}"
        );
    }
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

/// Unexpected messages: small and large, sent before any receive is posted.
const UNEXPECTED_PLAN: [(u64, usize); 5] =
    [(1, 100), (2, 16384), (3, 16385), (4, 1 << 20), (5, 300_000)];

/// Sender: posts every send, says "sent" once all are posted (eager ones are in the peer's
/// ring; rendezvous ones wait for the receiver), then waits for them all to complete.
fn unexpected_send(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    let bufs: Vec<Vec<u8>> = UNEXPECTED_PLAN
        .iter()
        .map(|&(t, l)| pattern(l, t))
        .collect();
    for (i, (&(tag, _), b)) in UNEXPECTED_PLAN.iter().zip(&bufs).enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        n.retry(|| unsafe { n.ep.tsend(b, None, peer, tag, 2000 + i) });
    }
    ctl.tell("sent");
    let done = n.wait_n(UNEXPECTED_PLAN.len());
    for c in done {
        assert_eq!(c.flags, FI_SEND | FI_TAGGED, "{c:?}");
    }
    ctl.tell("completed");
}

/// Receiver: posts nothing until the sender says every message is sent, then receives them in
/// reverse tag order, so each receive searches the unexpected queue.
fn unexpected_recv(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    ctl.expect("sent");
    for &(tag, len) in UNEXPECTED_PLAN.iter().rev() {
        let mut buf = vec![0u8; len + 16];
        post(n, &mut buf, peer, tag, 0, tag as usize);
        let c = n.wait_one();
        assert_eq!((c.op_context, c.tag, c.len), (tag as usize, tag, len));
        assert!(
            buf[..len] == pattern(len, tag),
            "data of tag {tag} ({len} bytes)"
        );
        assert!(buf[len..].iter().all(|&b| b == 0), "wrote past {len} bytes");
    }
    ctl.expect("completed");
}

#[test]
fn unexpected_eager_and_rendezvous() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        unexpected_send(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn("unexpected_eager_and_rendezvous", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    unexpected_recv(&n, src, &mut Ctl::Parent(&mut peer));
    peer.join();
}

#[test]
fn unexpected_rendezvous_pipelined_without_cma() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        unexpected_recv(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn(
        "unexpected_rendezvous_pipelined_without_cma",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    unexpected_send(&n, dst, &mut Ctl::Parent(&mut peer));
    peer.join();
}

#[test]
fn remote_cq_data_in_receive_entries() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        assert_eq!(listen(), "go");
        let small = pattern(100, 1);
        let large = pattern(100_000, 2);
        let msg = pattern(50, 3);
        let plain = pattern(10, 4);
        // SAFETY: the buffers outlive the completions waited for below.
        unsafe {
            n.ep.tsenddata(&small, None, 0xdead_beef_0000_0001, parent, 11, 1)
                .unwrap();
            n.ep.tsenddata(&large, None, u64::MAX, parent, 12, 2)
                .unwrap();
            n.ep.senddata(&msg, None, 3, parent, 3).unwrap();
            n.ep.tsend(&plain, None, parent, 14, 4).unwrap();
        }
        n.ep.tinjectdata(&pattern(8, 5), 0x55, parent, 15).unwrap();
        n.wait_n(4);
        say("sent");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("remote_cq_data_in_receive_entries", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    let mut bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; 100_000]).collect();
    let [b11, b12, bm, b14, b15] = &mut bufs[..] else {
        unreachable!()
    };
    post(&n, b11, src, 11, 0, 11);
    post(&n, b12, src, 12, 0, 12);
    // SAFETY: bm outlives its completion.
    unsafe { n.ep.recv(bm, None, src, 13) }.unwrap();
    post(&n, b14, src, 14, 0, 14);
    post(&n, b15, src, 15, 0, 15);
    peer.tell("go");
    let got = n.wait_n(5);
    let find = |ctx: usize| *got.iter().find(|c| c.op_context == ctx).unwrap();
    let (c11, c12, c13, c14, c15) = (find(11), find(12), find(13), find(14), find(15));
    assert_eq!(c11.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((c11.data, c11.len), (0xdead_beef_0000_0001, 100));
    assert_eq!(c12.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((c12.data, c12.len), (u64::MAX, 100_000));
    assert_eq!(c13.flags, FI_RECV | FI_MSG | FI_REMOTE_CQ_DATA);
    assert_eq!((c13.data, c13.len), (3, 50));
    assert_eq!(
        c14.flags,
        FI_RECV | FI_TAGGED,
        "no data was sent with tag 14"
    );
    assert_eq!(c14.data, 0);
    assert_eq!(c15.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((c15.data, c15.len), (0x55, 8));
    assert!(bufs[1] == pattern(100_000, 2));
    assert!(bufs[2][..50] == pattern(50, 3));
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

/// Peeks (bounded) until a message matching `tag`/`ignore` is reported; returns the entry.
fn peek_until_found(n: &Node, tag: u64, ignore: u64, ctx: Context, flags: u64) -> CqTaggedEntry {
    let deadline = std::time::Instant::now() + completion_bound();
    loop {
        let m = tmsg(&[], FI_ADDR_UNSPEC, ctx, tag, ignore);
        // SAFETY: a peek moves no data.
        unsafe { n.ep.trecvmsg(&m, flags) }.unwrap();
        match n.next() {
            Completion::Ok(e, _) => return e,
            Completion::Err(e, _) => assert_eq!(e.err, FI_ENOMSG, "peek miss: {e:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tag {tag:#x} never arrived"
        );
    }
}

/// Asserts that a peek for `tag` finds nothing (a claimed or discarded message is gone).
fn assert_peek_misses(n: &Node, tag: u64, ctx: Context) {
    let m = tmsg(&[], FI_ADDR_UNSPEC, ctx, tag, 0);
    // SAFETY: a peek moves no data.
    unsafe { n.ep.trecvmsg(&m, FI_PEEK) }.unwrap();
    let e = n.wait_err();
    assert_eq!((e.err, e.op_context), (FI_ENOMSG, ctx), "{e:?}");
    assert_eq!(e.flags & FI_RECV, FI_RECV);
}

#[test]
fn peek_claim_and_discard() {
    const PLAN: [(u64, usize); 4] = [(0x50, 300), (0x51, 200_000), (0x52, 64), (0x53, 100_000)];
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        assert_eq!(listen(), "go");
        let bufs: Vec<Vec<u8>> = PLAN.iter().map(|&(t, l)| pattern(l, t)).collect();
        for (&(tag, _), b) in PLAN.iter().zip(&bufs) {
            // SAFETY: bufs outlive the completions waited for below.
            unsafe { n.ep.tsend(b, None, parent, tag, tag as usize) }.unwrap();
        }
        say("sent");
        // The claimed and the discarded rendezvous sends must complete too.
        let done = n.wait_n(PLAN.len());
        assert!(done.iter().all(|c| c.flags == FI_SEND | FI_TAGGED));
        say("completed");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("peek_claim_and_discard", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    connect(&mut peer, &n);

    // Nothing sent yet: a peek misses with FI_ENOMSG.
    assert_peek_misses(&n, 0x50, 100);
    peer.tell("go");
    assert_eq!(peer.hear(), "sent");

    // A peek reports length and tag and leaves the message queued.
    let e = peek_until_found(&n, 0x50, 0, 101, FI_PEEK);
    assert_eq!((e.op_context, e.len, e.tag), (101, 300, 0x50));
    assert_eq!(e.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
    let e = peek_until_found(&n, 0x5f, 0x0f, 102, FI_PEEK);
    assert_eq!(
        (e.len, e.tag),
        (300, 0x50),
        "a wildcard peek finds the oldest match"
    );

    // Peek + claim: the message is reserved for the claiming context...
    let e = peek_until_found(&n, 0x51, 0, 103, FI_PEEK | FI_CLAIM);
    assert_eq!((e.op_context, e.len, e.tag), (103, 200_000, 0x51));
    assert_peek_misses(&n, 0x51, 104);
    // ...and a claim receive with that context gets its data.
    let mut big = vec![0u8; 200_000];
    let iov = [RawIov::of_mut(&mut big)];
    // SAFETY: big outlives the completion below.
    unsafe {
        n.ep.trecvmsg(&tmsg(&iov, FI_ADDR_UNSPEC, 103, 0x51, 0), FI_CLAIM)
    }
    .unwrap();
    let c = n.wait_one();
    assert_eq!((c.op_context, c.len, c.tag), (103, 200_000, 0x51));
    assert!(big == pattern(200_000, 0x51), "claimed data");

    // Peek + discard drops an eager message.
    let e = peek_until_found(&n, 0x52, 0, 105, FI_PEEK | FI_DISCARD);
    assert_eq!((e.op_context, e.len, e.tag), (105, 64, 0x52));
    assert_peek_misses(&n, 0x52, 106);

    // Claim, then discard a rendezvous message: no data moves, and its sender is released.
    let e = peek_until_found(&n, 0x53, 0, 107, FI_PEEK | FI_CLAIM);
    assert_eq!(e.len, 100_000);
    // SAFETY: a discard moves no data.
    unsafe {
        n.ep.trecvmsg(
            &tmsg(&[], FI_ADDR_UNSPEC, 107, 0x53, 0),
            FI_CLAIM | FI_DISCARD,
        )
    }
    .unwrap();
    let c = n.wait_one();
    assert_eq!((c.op_context, c.tag), (107, 0x53));
    assert_peek_misses(&n, 0x53, 108);

    // The merely peeked message is still there for an ordinary receive.
    let mut small = vec![0u8; 300];
    post(&n, &mut small, FI_ADDR_UNSPEC, 0x50, 0, 109);
    let c = n.wait_one();
    assert_eq!((c.op_context, c.len), (109, 300));
    assert!(small == pattern(300, 0x50));

    // The sender's four sends complete: the claimed and the discarded rendezvous ones were
    // acknowledged above.
    assert_eq!(peer.hear(), "completed");
    peer.tell("bye");
    peer.join();
}

/// Messages with one tag, large then small: they match posted receives in send order
/// (FI_ORDER_SAS), whatever order their data finishes moving in.
const SAME_TAG: [usize; 3] = [1 << 20, 100, 8192];

fn same_tag_recv(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    let mut bufs: Vec<Vec<u8>> = SAME_TAG.iter().map(|_| vec![0u8; 2 << 20]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        post(n, b, peer, 9, 0, i);
    }
    ctl.tell("posted");
    let got = n.wait_n(SAME_TAG.len());
    for (i, &len) in SAME_TAG.iter().enumerate() {
        let c = got.iter().find(|c| c.op_context == i).unwrap();
        assert_eq!(c.len, len, "receive {i} took the {i}th message");
        assert!(
            bufs[i][..len] == pattern(len, i as u64),
            "data of receive {i}"
        );
    }
    ctl.expect("sent");
}

fn same_tag_send(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    ctl.expect("posted");
    let bufs: Vec<Vec<u8>> = SAME_TAG
        .iter()
        .enumerate()
        .map(|(i, &l)| pattern(l, i as u64))
        .collect();
    for (i, b) in bufs.iter().enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        unsafe { n.ep.tsend(b, None, peer, 9, i) }.unwrap();
    }
    n.wait_n(bufs.len());
    ctl.tell("sent");
}

#[test]
fn same_tag_matches_in_send_order() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        same_tag_send(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn("same_tag_matches_in_send_order", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    same_tag_recv(&n, src, &mut Ctl::Parent(&mut peer));
    peer.join();
}

#[test]
fn same_tag_matches_in_send_order_pipelined() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        same_tag_recv(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn(
        "same_tag_matches_in_send_order_pipelined",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    same_tag_send(&n, dst, &mut Ctl::Parent(&mut peer));
    peer.join();
}
