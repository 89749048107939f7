//! Completion machinery fed by real peers: CQ overrun, send and receive counters, and
//! automatic progress.
//!
//! Written once for every provider: shm by default, tcp through `XFABRIC_TEST_PROVIDER` in
//! scripts/test.sh, verbs in the Soft-RoCE VM (scripts/test-verbs-vm.sh).

mod common;
use std::time::{Duration, Instant};

use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;

#[test]
fn cq_overrun_keeps_valid_entries_then_reports_overrun() {
    const N: usize = 6;
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        assert_eq!(listen(), "go");
        let bufs: Vec<Vec<u8>> = (0..N).map(|i| pattern(64, i as u64)).collect();
        for (i, b) in bufs.iter().enumerate() {
            // SAFETY: bufs outlive the completions waited for below.
            unsafe { n.ep.tsend(b, None, parent, i as u64, i) }.unwrap();
        }
        n.wait_n(N);
        say("sent");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn(
        "cq_overrun_keeps_valid_entries_then_reports_overrun",
        "send",
        &[],
    );
    // Overrun is what FI_RM_DISABLED allows; with resource management the posts below
    // would be refused instead (see posts_wait_for_room_in_a_managed_cq).
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |h| h.domain_attr.resource_mgmt = ResourceMgmt::Disabled,
        4,
        |_, _| {},
    );
    assert_eq!(n.info.domain_attr.resource_mgmt, ResourceMgmt::Disabled);
    let src = connect(&mut peer, &n);
    let mut bufs: Vec<Vec<u8>> = (0..N).map(|_| vec![0u8; 64]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: bufs outlive this test's reads.
        unsafe { n.ep.trecv(b, None, src, i as u64, 0, i) }.unwrap();
    }
    peer.tell("go");
    // Every message is in our ring once the sender says so (eager sends complete on write);
    // over tcp the sender's connection needs our progress first.
    assert_eq!(peer.hear_progressing(&n), "sent");
    let mut got = Vec::new();
    let mut buf = [CqTaggedEntry::default(); 8];
    let deadline = Instant::now() + completion_bound();
    loop {
        match n.cq.read(&mut buf) {
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(Error::Overrun) => break,
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e}"),
        }
        assert!(Instant::now() < deadline, "no overrun; read {got:?}");
    }
    let ctxs: Vec<usize> = got.iter().map(|c| c.op_context).collect();
    assert_eq!(ctxs, [0, 1, 2, 3], "the entries that fit, in order");
    for c in &got {
        assert_eq!(c.len, 64);
        assert!(bufs[c.op_context] == pattern(64, c.op_context as u64));
    }
    assert_eq!(
        n.cq.read(&mut buf),
        Err(Error::Overrun),
        "overrun is sticky"
    );
    peer.tell("bye");
    peer.join();
}

/// Reads every entry there is into `got`; anything but entries or `Again` (an overrun, an
/// error entry) fails the test.
fn drain(n: &Node, got: &mut Vec<CqTaggedEntry>) {
    let mut buf = [CqTaggedEntry::default(); 4];
    match n.cq.read(&mut buf) {
        Ok(k) => got.extend_from_slice(&buf[..k]),
        Err(Error::Again(_)) => {}
        Err(e) => panic!("cq read after {} entries: {e}", got.len()),
    }
}

/// Posts `post(i)` for i in 0..n on a CQ of 4 entries, retrying on `Again` while reading the
/// CQ, then reads until all n completed. Returns the entries.
fn post_all(
    n: &Node,
    count: usize,
    mut post: impl FnMut(usize) -> Result<()>,
) -> Vec<CqTaggedEntry> {
    let deadline = Instant::now() + completion_bound();
    let mut got = Vec::new();
    let mut refused = 0usize;
    for i in 0..count {
        loop {
            match post(i) {
                Ok(()) => break,
                Err(Error::Again(_)) => refused += 1,
                Err(e) => panic!("post {i}: {e}"),
            }
            drain(n, &mut got);
            assert!(Instant::now() < deadline, "post {i} still refused");
        }
    }
    while got.len() < count {
        drain(n, &mut got);
        assert!(
            Instant::now() < deadline,
            "{} of {count} completed",
            got.len()
        );
    }
    assert!(
        refused > 0,
        "a 4-entry CQ took {count} posts without ever saying Again"
    );
    got
}

/// fi_domain(3), FI_RM_ENABLED (what shm advertises by default): a full CQ makes posting
/// return Again, and the CQ is never overrun. 100 sends and 100 receives through CQs of 4
/// entries all complete, each once.
#[test]
fn posts_wait_for_room_in_a_managed_cq() {
    const N: usize = 100;
    let managed = |h: &mut Info| h.domain_attr.resource_mgmt = ResourceMgmt::Unspec;
    if role().is_some() {
        let n = node_custom(CAPS, Progress::Manual, managed, 4, |_, _| {});
        let parent = connect_parent(&n);
        assert_eq!(listen(), "go");
        let bufs: Vec<Vec<u8>> = (0..N).map(|i| pattern(64, i as u64)).collect();
        // SAFETY: bufs outlive the completions post_all waits for.
        let got = post_all(&n, N, |i| unsafe {
            n.ep.tsend(&bufs[i], None, parent, i as u64, i)
        });
        let mut ctxs: Vec<usize> = got.iter().map(|c| c.op_context).collect();
        ctxs.sort_unstable();
        assert_eq!(ctxs, (0..N).collect::<Vec<_>>());
        say("sent");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("posts_wait_for_room_in_a_managed_cq", "send", &[]);
    let n = node_custom(CAPS, Progress::Manual, managed, 4, |_, _| {});
    assert_eq!(n.info.domain_attr.resource_mgmt, ResourceMgmt::Enabled);
    let src = connect(&mut peer, &n);
    let mut bufs: Vec<Vec<u8>> = (0..N).map(|_| vec![0u8; 64]).collect();
    let ptrs: Vec<*mut Vec<u8>> = bufs.iter_mut().map(|b| b as *mut _).collect();
    peer.tell("go");
    // SAFETY: each buffer is posted once and outlives its completion, which post_all waits
    // for; nothing else touches bufs until then.
    let got = post_all(&n, N, |i| {
        let p = ptrs[i];
        unsafe { n.ep.trecv(&mut *p, None, src, i as u64, 0, i) }
    });
    let mut ctxs: Vec<usize> = got.iter().map(|c| c.op_context).collect();
    ctxs.sort_unstable();
    assert_eq!(
        ctxs,
        (0..N).collect::<Vec<_>>(),
        "each receive completed once"
    );
    for (i, b) in bufs.iter().enumerate() {
        assert!(*b == pattern(64, i as u64), "receive {i}");
    }
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

/// Opens a node with a send and a receive counter bound.
fn counted_node() -> (Node, Counter, Counter) {
    let mut cntrs = None;
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |_| {},
        4096,
        |d, ep| {
            let tx = d.cntr_open(&CntrAttr::default()).unwrap();
            let rx = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&tx, FI_SEND).unwrap();
            ep.bind_cntr(&rx, FI_RECV).unwrap();
            cntrs = Some((tx, rx));
        },
    );
    let (tx, rx) = cntrs.unwrap();
    (n, tx, rx)
}

#[test]
fn send_and_recv_counters_count_completions() {
    // 19 eager messages and one rendezvous one.
    const N: usize = 20;
    let len_of = |i: usize| if i == N - 1 { 200_000 } else { 1000 };
    if role().is_some() {
        let (n, tx, rx) = counted_node();
        let parent = connect_parent(&n);
        let mut bufs: Vec<Vec<u8>> = (0..N).map(|i| vec![0u8; len_of(i)]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            // SAFETY: bufs outlive the completions counted below.
            unsafe { n.ep.trecv(b, None, parent, i as u64, 0, i) }.unwrap();
        }
        say("posted");
        assert_eq!(rx.wait(N as u64, completion_ms()), Ok(()));
        assert_eq!((rx.read(), rx.readerr(), tx.read()), (N as u64, 0, 0));
        for (i, b) in bufs.iter().enumerate() {
            assert!(*b == pattern(len_of(i), i as u64), "message {i}");
        }
        // A truncated receive counts as an error, and wakes a waiter with Avail.
        let mut small = [0u8; 10];
        // SAFETY: small outlives its completion.
        unsafe { n.ep.trecv(&mut small, None, parent, 99, 0, 99) }.unwrap();
        say("posted small");
        assert_eq!(rx.wait(N as u64 + 1, completion_ms()), Err(Error::Avail));
        assert_eq!((rx.read(), rx.readerr()), (N as u64, 1));
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn("send_and_recv_counters_count_completions", "recv", &[]);
    let (n, tx, rx) = counted_node();
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "posted");
    let bufs: Vec<Vec<u8>> = (0..N).map(|i| pattern(len_of(i), i as u64)).collect();
    for (i, b) in bufs.iter().enumerate() {
        // SAFETY: bufs outlive the completions counted below.
        n.retry(|| unsafe { n.ep.tsend(b, None, dst, i as u64, i) });
    }
    assert_eq!(tx.wait(N as u64, completion_ms()), Ok(()));
    assert_eq!((tx.read(), tx.readerr(), rx.read()), (N as u64, 0, 0));
    // Nothing more is coming: a higher threshold times out, in about the time asked.
    let t = Instant::now();
    assert_eq!(tx.wait(N as u64 + 1, 50), Err(Error::TimedOut("cntr wait")));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(50) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(peer.hear(), "posted small");
    let long = pattern(100, 99);
    // SAFETY: long outlives its completion.
    unsafe { n.ep.tsend(&long, None, dst, 99, 99) }.unwrap();
    assert_eq!(tx.wait(N as u64 + 1, completion_ms()), Ok(()));
    assert_eq!(tx.readerr(), 0, "truncation is the receiver's error");
    peer.tell("bye");
    peer.join();
}

/// Sender for the auto-progress receiver: eager and rendezvous messages on "go".
fn plain_sender() {
    let n = node(CAPS, Progress::Manual);
    let parent = connect_parent(&n);
    assert_eq!(listen(), "go");
    let small = pattern(100, 1);
    let large = pattern(1 << 20, 2);
    // SAFETY: both buffers outlive the completions waited for below.
    unsafe {
        n.ep.tsend(&small, None, parent, 1, 1).unwrap();
        n.ep.tsend(&large, None, parent, 2, 2).unwrap();
    }
    n.wait_n(2);
    say("sent");
    assert_eq!(listen(), "bye");
}

#[test]
fn auto_progress_receiver_blocks_in_sread() {
    if role().is_some() {
        return plain_sender();
    }
    let mut peer = spawn("auto_progress_receiver_blocks_in_sread", "send", &[]);
    let n = node(CAPS, Progress::Auto);
    let src = connect(&mut peer, &n);
    let mut small = vec![0u8; 100];
    let mut large = vec![0u8; 1 << 20];
    // SAFETY: both buffers outlive the completions read below.
    unsafe {
        n.ep.trecv(&mut small, None, src, 1, 0, 1).unwrap();
        n.ep.trecv(&mut large, None, src, 2, 0, 2).unwrap();
    }
    let mut buf = [CqTaggedEntry::default(); 2];
    assert_eq!(
        n.cq.sread(&mut buf, 1, 20),
        Err(Error::Again("cq sread")),
        "nothing was sent yet"
    );
    peer.tell("go");
    let mut got = Vec::new();
    while got.len() < 2 {
        let k =
            n.cq.sread(&mut buf, 1, completion_ms())
                .expect("sread within the bound");
        got.extend_from_slice(&buf[..k]);
    }
    got.sort_by_key(|c| c.op_context);
    assert_eq!((got[0].len, got[1].len), (100, 1 << 20));
    assert!(small == pattern(100, 1) && large == pattern(1 << 20, 2));
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
}

#[test]
fn auto_progress_streams_while_application_waits_elsewhere() {
    const LEN: usize = 1 << 20;
    if role().is_some() {
        // Without cross-memory attach the data is streamed through the ring by the sender's
        // progress, which only the sender's auto-progress thread can provide here.
        let n = node(CAPS, Progress::Manual);
        let parent = connect_parent(&n);
        let mut buf = vec![0u8; LEN];
        // SAFETY: buf outlives its completion.
        unsafe { n.ep.trecv(&mut buf, None, parent, 5, 0, 5) }.unwrap();
        say("posted");
        let c = n.wait_one();
        assert_eq!(c.len, LEN);
        assert!(buf == pattern(LEN, 5));
        say("received");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn(
        "auto_progress_streams_while_application_waits_elsewhere",
        "recv",
        &[("XFABRIC_SHM_CMA", "0")],
    );
    let n = node(CAPS, Progress::Auto);
    let dst = connect(&mut peer, &n);
    assert_eq!(peer.hear(), "posted");
    let data = pattern(LEN, 5);
    // SAFETY: data outlives the completion read below.
    unsafe { n.ep.tsend(&data, None, dst, 5, 55) }.unwrap();
    // This thread makes no libfabric call until the receiver has everything.
    assert_eq!(peer.hear(), "received");
    let mut buf = [CqTaggedEntry::default(); 1];
    assert_eq!(n.cq.sread(&mut buf, 1, completion_ms()), Ok(1));
    assert_eq!((buf[0].op_context, buf[0].flags), (55, FI_SEND | FI_TAGGED));
    peer.tell("bye");
    peer.join();
}

/// Under FI_RM_ENABLED, entries no posted operation reserved (remote CQ data written by a
/// peer's writedata) are kept even past the CQ's size: shm cannot ask the writer to retry a
/// write already placed, and losing the entry is what RM forbids. Posts that would write an
/// entry are refused until the CQ has room again.
#[test]
fn unsolicited_entries_are_kept_beyond_a_managed_cq() {
    const N: u64 = 10;
    const RMA_CAPS: u64 = FI_MSG | FI_RMA;
    if role().is_some() {
        let n = node_custom(RMA_CAPS, Progress::Manual, |_| {}, 4, |_, _| {});
        let _parent = connect_parent(&n);
        let window = vec![0u8; 64];
        // SAFETY: window outlives the registration (dropped after it, below).
        let mr = unsafe { n.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 31) }.unwrap();
        let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
        let base = if virt { window.as_ptr() as u64 } else { 0 };
        say(&format!("{} {base}", mr.key()));
        let deadline = Instant::now() + completion_bound();
        while n.cq.len() < N as usize {
            n.ep.progress();
            assert!(Instant::now() < deadline, "{} of {N} entries", n.cq.len());
        }
        let mut spare = [0u8; 8];
        // SAFETY: not posted (refused), or canceled when the endpoint closes.
        let r = unsafe { n.ep.recv(&mut spare, None, FI_ADDR_UNSPEC, 99) };
        assert_eq!(
            r,
            Err(Error::Again(
                "post: the completion queue is full (FI_RM_ENABLED)"
            ))
        );
        let mut got = Vec::new();
        let mut buf = [CqTaggedEntry::default(); 3];
        while got.len() < N as usize {
            let k = n.cq.read(&mut buf).expect("entries, no overrun");
            got.extend(buf[..k].iter().map(|e| e.data));
        }
        got.sort_unstable();
        assert_eq!(got, (0..N).collect::<Vec<_>>());
        assert_eq!(n.cq.read(&mut buf), Err(Error::Again("cq read")));
        // SAFETY: as above.
        unsafe { n.ep.recv(&mut spare, None, FI_ADDR_UNSPEC, 99) }.expect("room again");
        say("ok");
        drop(mr);
        drop(window);
        return;
    }
    let mut peer = spawn(
        "unsolicited_entries_are_kept_beyond_a_managed_cq",
        "target",
        &[],
    );
    let n = node(RMA_CAPS, Progress::Manual);
    let dst = connect(&mut peer, &n);
    let f: Vec<u64> = peer.hear().split(' ').map(|x| x.parse().unwrap()).collect();
    let (key, base) = (f[0], f[1]);
    let src = [7u8; 8];
    for i in 0..N {
        // SAFETY: src outlives the completion awaited right after.
        n.retry(|| unsafe { n.ep.writedata(&src, None, i, dst, base, key, i as usize) });
        n.wait_one();
    }
    assert_eq!(peer.hear(), "ok");
    peer.join();
}
