//! Receive-side features between real processes: FI_MULTI_RECV buffers, directed receive,
//! FI_SOURCE / FI_SOURCE_ERR, truncation and cancel.

mod common;
use common::*;
use xfabric::errno::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;

/// Child that, for each batch the parent names ("send A B ..." with lengths), sends untagged
/// messages whose payload is `pattern(len, len)` and says "posted" once they are in the ring
/// (rendezvous ones complete only as the parent receives them). At "bye" it waits for every
/// send to complete.
fn batch_sender(caps: u64) {
    let n = node(caps, Progress::Manual);
    let parent = connect_parent(&n);
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    loop {
        let line = listen();
        if line == "bye" {
            break;
        }
        let lens = line.strip_prefix("send ").expect("a send line").split(' ');
        for len in lens.map(|s| s.parse::<usize>().unwrap()) {
            bufs.push(pattern(len, len as u64));
            let b = bufs.last().unwrap();
            // SAFETY: a Vec's heap buffer does not move when `bufs` grows, and bufs lives
            // until every completion is read below.
            n.retry(|| unsafe { n.ep.send(b, None, parent, len) });
        }
        say("posted");
    }
    n.wait_n(bufs.len());
}

#[test]
fn multi_recv_fills_one_buffer_at_successive_offsets() {
    let caps = CAPS | FI_MULTI_RECV;
    if role().is_some() {
        return batch_sender(caps);
    }
    let mut peer = spawn(
        "multi_recv_fills_one_buffer_at_successive_offsets",
        "send",
        &[],
    );
    let n = node(caps, Progress::Manual);
    let src = connect(&mut peer, &n);
    n.ep.setopt(FI_OPT_MIN_MULTI_RECV, 1000).unwrap();

    // Two messages arrive before the buffer is posted (unexpected), the rest after;
    // rendezvous-sized ones land in the buffer too. 64 KiB: after 300+900+20000+1200+40000
    // bytes, 3136 remain (>= 1000, kept); the 2500-byte message leaves 636 and releases it.
    let lens = [300usize, 900, 20_000, 1200, 40_000, 2500];
    peer.tell("send 300 900");
    assert_eq!(peer.hear(), "posted");
    let mut buf = vec![0u8; 64 * 1024];
    let iov = [RawIov::of_mut(&mut buf)];
    let base = iov[0].addr;
    let m = Msg {
        iov: &iov,
        desc: &[],
        addr: src,
        context: 77,
        data: 0,
        tag: 0,
        ignore: 0,
    };
    // SAFETY: buf outlives every completion read below.
    unsafe { n.ep.recvmsg(&m, FI_MULTI_RECV) }.unwrap();
    peer.tell("send 20000 1200 40000 2500");
    assert_eq!(peer.hear(), "posted");
    // A seventh message goes to the next receive: the buffer was released.
    let mut next = vec![0u8; 100];
    // SAFETY: next outlives its completion.
    unsafe { n.ep.recv(&mut next, None, src, 78) }.unwrap();
    peer.tell("send 7");
    assert_eq!(peer.hear(), "posted");

    let mut got = n.wait_n(lens.len() + 1);
    // The buffer's release (FI_MULTI_RECV) is on the last of its completions, whichever
    // message that is (the rendezvous one finishes after the eager one behind it).
    let releasing = got.iter().rfind(|c| c.op_context == 77).map(|c| c.buf);
    got.sort_by_key(|c| (c.op_context, c.buf));
    let (last, multi) = got.split_last().unwrap();
    assert_eq!((last.op_context, last.len), (78, 7));
    assert!(next[..7] == pattern(7, 7));
    let mut off = 0;
    for (c, &len) in multi.iter().zip(&lens) {
        assert_eq!(c.op_context, 77);
        assert_eq!(c.buf, base + off, "message of {len} bytes");
        assert_eq!(c.len, len);
        assert!(
            buf[off..off + len] == pattern(len, len as u64),
            "data at {off}"
        );
        let releases = Some(c.buf) == releasing;
        assert_eq!(
            c.flags,
            FI_RECV | FI_MSG | if releases { FI_MULTI_RECV } else { 0 },
            "message of {len} bytes"
        );
        off += len;
    }
    peer.tell("bye");
    peer.join();
}

/// Receiver: one multi-receive buffer takes a rendezvous message and then an eager one that
/// releases it. The entry carrying FI_MULTI_RECV must be the buffer's last: after it the
/// application owns the buffer again, so no data may still be on its way into it.
fn multi_release_recv(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    n.ep.setopt(FI_OPT_MIN_MULTI_RECV, 1000).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let iov = [RawIov::of_mut(&mut buf)];
    let base = iov[0].addr;
    let m = Msg {
        iov: &iov,
        desc: &[],
        addr: peer,
        context: 7,
        data: 0,
        tag: 0,
        ignore: 0,
    };
    // SAFETY: buf outlives every completion read below.
    unsafe { n.ep.recvmsg(&m, FI_MULTI_RECV) }.unwrap();
    ctl.tell("posted");
    let got = n.wait_n(2);
    let offs: Vec<(usize, usize)> = got.iter().map(|c| (c.buf - base, c.len)).collect();
    assert!(
        offs.contains(&(0, 60_000)) && offs.contains(&(60_000, 5000)),
        "{offs:?}"
    );
    assert_eq!(
        got[0].flags & FI_MULTI_RECV,
        0,
        "released before its last message: {got:?}"
    );
    assert_eq!(got[1].flags & FI_MULTI_RECV, FI_MULTI_RECV, "{got:?}");
    assert!(buf[..60_000] == pattern(60_000, 1) && buf[60_000..65_000] == pattern(5000, 2));
    ctl.expect("sent");
}

/// Sender half of `multi_release_recv`.
fn multi_release_send(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    ctl.expect("posted");
    let big = pattern(60_000, 1);
    let small = pattern(5000, 2);
    // SAFETY: both buffers outlive the completions waited for below.
    unsafe {
        n.ep.send(&big, None, peer, 1).unwrap();
        n.ep.send(&small, None, peer, 2).unwrap();
    }
    n.wait_n(2);
    ctl.tell("sent");
}

#[test]
fn multi_recv_release_is_the_last_completion() {
    let caps = CAPS | FI_MULTI_RECV;
    if role().is_some() {
        let n = node(caps, Progress::Manual);
        let parent = connect_parent(&n);
        multi_release_send(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn("multi_recv_release_is_the_last_completion", "send", &[]);
    let n = node(caps, Progress::Manual);
    let src = connect(&mut peer, &n);
    multi_release_recv(&n, src, &mut Ctl::Parent(&mut peer));
    peer.join();
}

#[test]
fn multi_recv_release_is_the_last_completion_pipelined() {
    let caps = CAPS | FI_MULTI_RECV;
    if role().is_some() {
        let n = node(caps, Progress::Manual);
        let parent = connect_parent(&n);
        multi_release_recv(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn(
        "multi_recv_release_is_the_last_completion_pipelined",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(caps, Progress::Manual);
    let dst = connect(&mut peer, &n);
    multi_release_send(&n, dst, &mut Ctl::Parent(&mut peer));
    peer.join();
}

/// Sender for the directed-receive tests: on "go" sends tag 7 with its own pattern, then the
/// sentinel tag 99, and waits for both; "bye" instead of "go" ends it without sending.
fn directed_sender(seed: u64) {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    match listen().as_str() {
        "go" => {}
        "bye" => return,
        l => panic!("unexpected line {l:?}"),
    }
    let data = pattern(2000, seed);
    let sentinel = [0u8; 4];
    // SAFETY: both buffers outlive the completions waited for below.
    unsafe {
        n.ep.tsend(&data, None, parent, 7, 1).unwrap();
        n.ep.tsend(&sentinel, None, parent, 99, 2).unwrap();
    }
    n.wait_n(2);
    say("sent");
    assert_eq!(listen(), "bye");
}

#[test]
fn directed_receive_takes_only_its_source() {
    match role().as_deref() {
        Some("a") => return directed_sender(0xa),
        Some("b") => return directed_sender(0xb),
        _ => {}
    }
    let name = "directed_receive_takes_only_its_source";
    let mut pa = spawn(name, "a", &[]);
    let mut pb = spawn(name, "b", &[]);
    let n = node(CAPS | FI_DIRECTED_RECV | FI_SOURCE, Progress::Manual);
    let a = connect(&mut pa, &n);
    let b = connect(&mut pb, &n);
    assert_ne!(a, b);
    let mut from_b = vec![0u8; 2000];
    let mut sent_a = [0u8; 4];
    let mut sent_b = [0u8; 4];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        n.ep.trecv(&mut from_b, None, b, 7, 0, 1).unwrap();
        n.ep.trecv(&mut sent_a, None, a, 99, 0, 2).unwrap();
        n.ep.trecv(&mut sent_b, None, b, 99, 0, 3).unwrap();
    }
    pa.tell("go");
    // A's tag-7 message precedes its sentinel on the same ring, so once the sentinel is
    // delivered, tag 7 from A has been seen and was not taken by the receive for B.
    let (c, s) = n.wait_from(1)[0];
    assert_eq!((c.op_context, s), (2, a), "A's sentinel, from A");
    pb.tell("go");
    let got = n.wait_from(2);
    let (c1, s1) = *got.iter().find(|(c, _)| c.op_context == 1).unwrap();
    assert_eq!((c1.tag, c1.len, s1), (7, 2000, b));
    assert!(
        from_b == pattern(2000, 0xb),
        "the directed receive holds B's data"
    );
    assert!(got.iter().any(|(c, s)| c.op_context == 3 && *s == b));
    // A's message waited as unexpected; a receive from any source takes it now.
    let mut from_a = vec![0u8; 2000];
    // SAFETY: from_a outlives its completion.
    unsafe { n.ep.trecv(&mut from_a, None, FI_ADDR_UNSPEC, 7, 0, 4) }.unwrap();
    let (c, s) = n.wait_from(1)[0];
    assert_eq!((c.op_context, c.len, s), (4, 2000, a));
    assert!(from_a == pattern(2000, 0xa));
    for p in [&mut pa, &mut pb] {
        assert_eq!(p.hear(), "sent");
        p.tell("bye");
    }
    pa.join();
    pb.join();
}

#[test]
fn source_filter_is_ignored_without_directed_recv() {
    match role().as_deref() {
        Some("a") => return directed_sender(0xa),
        Some("b") => return directed_sender(0xb),
        _ => {}
    }
    let name = "source_filter_is_ignored_without_directed_recv";
    let mut pa = spawn(name, "a", &[]);
    let mut pb = spawn(name, "b", &[]);
    let n = node(CAPS | FI_SOURCE, Progress::Manual);
    assert_eq!(n.info.caps & FI_DIRECTED_RECV, 0);
    let a = connect(&mut pa, &n);
    let b = connect(&mut pb, &n);
    let mut for_a = vec![0u8; 2000];
    let mut sentinel = [0u8; 4];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        n.ep.trecv(&mut for_a, None, a, 7, 0, 1).unwrap();
        n.ep.trecv(&mut sentinel, None, a, 99, 0, 2).unwrap();
    }
    // Only B sends: without FI_DIRECTED_RECV the receives' source is not a filter.
    pb.tell("go");
    let got = n.wait_from(2);
    let (c, s) = *got.iter().find(|(c, _)| c.op_context == 1).unwrap();
    assert_eq!((c.len, s), (2000, b));
    assert!(for_a == pattern(2000, 0xb));
    assert_eq!(pb.hear(), "sent");
    pb.tell("bye");
    pa.tell("bye");
    pa.join();
    pb.join();
}

/// Sender for the FI_SOURCE_ERR tests: for each "go", an eager message with remote CQ data
/// (tag 5) and a rendezvous one (tag 6), seeded by the round number.
fn source_sender() {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    let mut round = 0u64;
    while listen() == "go" {
        let small = pattern(500, round);
        let large = pattern(50_000, round + 10);
        // SAFETY: both buffers outlive the completions waited for below.
        unsafe {
            n.ep.tsenddata(&small, None, 42, parent, 5, 1).unwrap();
            n.ep.tsend(&large, None, parent, 6, 2).unwrap();
        }
        n.wait_n(2);
        say("sent");
        round += 1;
    }
}

/// Receiver half of one round from a sender that is not in our AV: both completions are
/// error entries FI_EADDRNOTAVAIL carrying the sender's raw address, with the data delivered.
fn expect_unknown_source_round(n: &Node, peer: &mut Peer, raw: &[u8]) {
    let mut small = vec![0u8; 500];
    let mut large = vec![0u8; 50_000];
    // SAFETY: both buffers outlive the completions read below.
    unsafe {
        n.ep.trecv(&mut small, None, FI_ADDR_UNSPEC, 5, 0, 1)
            .unwrap();
        n.ep.trecv(&mut large, None, FI_ADDR_UNSPEC, 6, 0, 2)
            .unwrap();
    }
    peer.tell("go");
    for _ in 0..2 {
        let mut buf = [CqTaggedEntry::default(); 1];
        let mut src = [0u64; 1];
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            match n.cq.readfrom(&mut buf, &mut src) {
                Err(Error::Avail) => break,
                Err(Error::Again(_)) => {}
                r => panic!("expected Avail for an unknown source, got {r:?} {buf:?}"),
            }
            assert!(std::time::Instant::now() < deadline);
        }
        let (e, data) = n.cq.readerr_data().unwrap();
        assert_eq!(e.err, libc::EADDRNOTAVAIL, "{e:?}");
        // The sender's address as the AV takes it back (fi_cq(3)): a string (shm's) with the
        // NUL that ends a C string, so that a C caller may hand it to fi_av_insert as is; a
        // sockaddr (tcp's, verbs') as it is.
        let mut want = raw.to_vec();
        if !n.av.sockaddr() {
            want.push(0);
        }
        assert_eq!(
            data.as_deref(),
            Some(&want[..]),
            "error data is the source address as the AV takes it"
        );
        assert_eq!(e.err_data_size, want.len());
        assert!(n.av.insert_one(&want).is_ok(), "insertable as it is");
        n.av.remove(&[n.av.insert_one(&want).unwrap()]).unwrap();
        // The message itself was delivered.
        match e.op_context {
            1 => {
                assert_eq!((e.len, e.tag, e.data), (500, 5, 42));
                assert_eq!(e.flags & FI_REMOTE_CQ_DATA, FI_REMOTE_CQ_DATA);
                assert!(small == pattern(500, 0));
            }
            2 => {
                assert_eq!((e.len, e.tag), (50_000, 6));
                assert!(large == pattern(50_000, 10));
            }
            c => panic!("unexpected context {c}"),
        }
    }
    assert_eq!(peer.hear(), "sent");
}

/// Opens the FI_SOURCE_ERR receiver and hands its address to the child without inserting the
/// child's; returns the child's raw address.
fn source_err_setup(peer: &mut Peer) -> (Node, Vec<u8>) {
    let n = node(CAPS | FI_SOURCE | FI_SOURCE_ERR, Progress::Manual);
    let raw = unhex(&peer.hear());
    peer.tell(&hex(&n.ep.getname().unwrap()));
    (n, raw)
}

#[test]
fn source_err_reports_unknown_sender_with_its_address() {
    if role().is_some() {
        return source_sender();
    }
    let mut peer = spawn(
        "source_err_reports_unknown_sender_with_its_address",
        "send",
        &[],
    );
    let (n, raw) = source_err_setup(&mut peer);
    expect_unknown_source_round(&n, &mut peer, &raw);
    peer.tell("bye");
    peer.join();
}

#[test]
fn source_resolves_once_sender_is_inserted() {
    if role().is_some() {
        return source_sender();
    }
    let mut peer = spawn("source_resolves_once_sender_is_inserted", "send", &[]);
    let (n, raw) = source_err_setup(&mut peer);
    expect_unknown_source_round(&n, &mut peer, &raw);

    // Once inserted, the same sender resolves: readfrom gives its fi_addr.
    let addr = n.add_peer(&raw);
    let mut small = vec![0u8; 500];
    let mut large = vec![0u8; 50_000];
    // SAFETY: both buffers outlive the completions read below.
    unsafe {
        n.ep.trecv(&mut small, None, FI_ADDR_UNSPEC, 5, 0, 3)
            .unwrap();
        n.ep.trecv(&mut large, None, FI_ADDR_UNSPEC, 6, 0, 4)
            .unwrap();
    }
    peer.tell("go");
    let got = n.wait_from(2);
    for (c, s) in &got {
        assert_eq!(*s, addr, "source of {c:?}");
    }
    assert!(small == pattern(500, 1) && large == pattern(50_000, 11));
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

const TRUNC_PLAN: [(u64, usize, usize); 4] = [
    // (tag, message length, receive buffer length)
    (1, 1000, 600),
    (2, 100_000, 60_000),
    (3, 8192, 1),
    (4, 300_000, 0),
];

/// Sender: on "go" sends every message of `TRUNC_PLAN`; all must complete successfully
/// (truncation is the receiver's error).
fn trunc_send(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    ctl.expect("go");
    let bufs: Vec<Vec<u8>> = TRUNC_PLAN.iter().map(|&(t, l, _)| pattern(l, t)).collect();
    for (&(tag, _, _), b) in TRUNC_PLAN.iter().zip(&bufs) {
        // SAFETY: bufs outlive the completions waited for below.
        unsafe { n.ep.tsend(b, None, peer, tag, tag as usize) }.unwrap();
    }
    n.wait_n(TRUNC_PLAN.len());
    ctl.tell("sent");
}

/// Receiver: posts the first two receives before the sends and the last two after them, so
/// both posted and unexpected messages are truncated.
fn trunc_recv(n: &Node, peer: FiAddr, ctl: &mut Ctl) {
    let mut bufs: Vec<Vec<u8>> = TRUNC_PLAN.iter().map(|&(_, _, c)| vec![0u8; c]).collect();
    for (i, &(tag, _, _)) in TRUNC_PLAN.iter().enumerate().take(2) {
        // SAFETY: bufs outlive the completions read below.
        unsafe { n.ep.trecv(&mut bufs[i], None, peer, tag, 0, tag as usize) }.unwrap();
    }
    ctl.tell("go");
    let mut errs: Vec<CqErrEntry> = (0..2).map(|_| n.wait_err()).collect();
    for (i, &(tag, _, _)) in TRUNC_PLAN.iter().enumerate().skip(2) {
        // SAFETY: as above.
        unsafe { n.ep.trecv(&mut bufs[i], None, peer, tag, 0, tag as usize) }.unwrap();
        errs.push(n.wait_err());
    }
    for (i, &(tag, len, cap)) in TRUNC_PLAN.iter().enumerate() {
        let e = errs
            .iter()
            .find(|e| e.op_context == tag as usize)
            .unwrap_or_else(|| panic!("no error entry for tag {tag}: {errs:?}"));
        assert_eq!(e.err, FI_ETRUNC, "{e:?}");
        assert_eq!((e.len, e.olen, e.tag), (cap, len - cap, tag), "{e:?}");
        assert_eq!(e.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
        assert!(
            bufs[i][..] == pattern(len, tag)[..cap],
            "kept prefix of tag {tag}"
        );
    }
    ctl.expect("sent");
}

#[test]
fn truncation_reports_overflow_length() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        trunc_send(&n, parent, &mut Ctl::Child);
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("truncation_reports_overflow_length", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    trunc_recv(&n, src, &mut Ctl::Parent(&mut peer));
    peer.tell("bye");
    peer.join();
}

#[test]
fn truncation_pipelined_without_cma() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        trunc_recv(&n, parent, &mut Ctl::Child);
        return;
    }
    let mut peer = spawn(
        "truncation_pipelined_without_cma",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    trunc_send(&n, dst, &mut Ctl::Parent(&mut peer));
    peer.join();
}

#[test]
fn cancel_posted_receive() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        assert_eq!(listen(), "go");
        let data = pattern(100, 3);
        // SAFETY: data outlives the completion waited for below.
        unsafe { n.ep.tsend(&data, None, parent, 3, 1) }.unwrap();
        n.wait_one();
        say("sent");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("cancel_posted_receive", "send", &[]);
    let n = node(CAPS, Progress::Manual);
    let src = connect(&mut peer, &n);
    let mut canceled = vec![0u8; 100];
    let mut untagged = vec![0u8; 4096];
    // SAFETY: the buffers outlive the endpoint's use of them (cancel or completion).
    unsafe { n.ep.trecv(&mut canceled, None, src, 3, 0, 77) }.unwrap();
    n.ep.cancel(77).unwrap();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (77, FI_ECANCELED), "{e:?}");
    assert_eq!(e.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
    assert!(
        matches!(n.ep.cancel(77), Err(Error::NoEntry(_))),
        "canceled twice"
    );
    assert!(
        matches!(n.ep.cancel(12345), Err(Error::NoEntry(_))),
        "never posted"
    );
    // An untagged receive cancels the same way.
    // SAFETY: as above.
    unsafe { n.ep.recv(&mut untagged, None, src, 79) }.unwrap();
    n.ep.cancel(79).unwrap();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (79, FI_ECANCELED), "{e:?}");
    assert_eq!(e.flags & (FI_RECV | FI_MSG), FI_RECV | FI_MSG);

    // The canceled buffer is no longer the endpoint's: the message goes to the next receive.
    let mut fresh = vec![0u8; 100];
    // SAFETY: fresh outlives its completion.
    unsafe { n.ep.trecv(&mut fresh, None, src, 3, 0, 78) }.unwrap();
    peer.tell("go");
    let c = n.wait_one();
    assert_eq!((c.op_context, c.len), (78, 100));
    assert!(fresh == pattern(100, 3));
    assert!(
        canceled.iter().all(|&b| b == 0),
        "a canceled buffer was written"
    );
    // A completed receive cannot be canceled.
    assert!(matches!(n.ep.cancel(78), Err(Error::NoEntry(_))));
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

/// Sender for the test below: on "go", one eager message (tag 5), then "sent" once it
/// completed (it is in the receiver's ring by then).
fn one_message_sender() {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    assert_eq!(listen(), "go");
    let small = pattern(500, 3);
    // SAFETY: `small` outlives the completion waited for below.
    unsafe { n.ep.tsend(&small, None, parent, 5, 1) }.unwrap();
    n.wait_n(1);
    say("sent");
    assert_eq!(listen(), "bye");
}

/// A message that arrived from a sender the AV did not hold, buffered, is taken by a receive
/// directed at that sender once the application inserts it (the server's way with
/// `FI_SOURCE_ERR`: insert the stranger, then receive from it), and reports its source.
/// Before, the message kept the source the AV gave on its arrival (none), and the directed
/// receive never matched it.
#[test]
fn source_of_a_message_buffered_before_its_sender_was_inserted_is_looked_up_again() {
    const T: &str =
        "source_of_a_message_buffered_before_its_sender_was_inserted_is_looked_up_again";
    if role().is_some() {
        return one_message_sender();
    }
    let mut peer = spawn(T, "send", &[]);
    let n = node(
        CAPS | FI_SOURCE | FI_SOURCE_ERR | FI_DIRECTED_RECV,
        Progress::Manual,
    );
    let raw = unhex(&peer.hear());
    peer.tell(&hex(&n.ep.getname().unwrap()));
    peer.tell("go");
    // Taken in meanwhile (over tcp the sender's connection needs this side's progress), with
    // no receive posted: buffered, its sender unknown.
    assert_eq!(peer.hear_progressing(&n), "sent");
    n.ep.progress();
    let b = n.add_peer(&raw);
    let mut buf = vec![0u8; 500];
    // SAFETY: `buf` outlives the completion read below.
    unsafe { n.ep.trecv(&mut buf, None, b, 5, 0, 9) }.unwrap();
    let got = n.wait_from(1);
    assert_eq!((got[0].0.op_context, got[0].1), (9, b), "{got:?}");
    assert!(buf == pattern(500, 3));
    peer.tell("bye");
    peer.join();
}
