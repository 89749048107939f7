//! The conformance suite: one set of two-process tests, written against the public API only,
//! run for whichever provider `XFABRIC_TEST_PROVIDER` names ("shm" when unset; the child
//! inherits the variable). Nothing here knows a provider: addresses travel only as
//! `getname` bytes inserted into an AV, memory-region addresses follow the domain's
//! `FI_MR_VIRT_ADDR`, and every wait is bounded (common's `BOUND`, `Peer::join`).
//!
//! Each test is one function; `two` runs its parent half here and its child half in the test
//! binary re-executed (`common::spawn`), with a control channel (`Ctl`) for handshakes.

mod common;
use std::time::{Duration, Instant};

use common::*;
use xfabric::errno::*;
use xfabric::kernels::cpu::ring;
use xfabric::*;

// ---- Helpers --------------------------------------------------------------------------------

/// One side of a test: a node (auto progress unless asked) with a send and a receive counter.
struct End {
    n: Node,
    tx: Counter,
    rx: Counter,
}

impl std::ops::Deref for End {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.n
    }
}

fn end(caps: u64, progress: Progress) -> End {
    let mut cntrs = None;
    let n = node_custom(
        caps,
        progress,
        |_| {},
        4096,
        |d: &Domain, ep: &Endpoint| {
            let tx = d.cntr_open(&CntrAttr::default()).unwrap();
            let rx = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&tx, FI_SEND).unwrap();
            ep.bind_cntr(&rx, FI_RECV).unwrap();
            cntrs = Some((tx, rx));
        },
    );
    let (tx, rx) = cntrs.unwrap();
    End { n, tx, rx }
}

/// Runs a two-process test: `parent` here, `child` in the re-executed binary, each with its
/// endpoint, the other's address and the control channel. Both halves return only once their
/// own operations completed; the closing handshake keeps both alive until then.
fn two(
    test: &str,
    caps: u64,
    parent: impl FnOnce(&End, FiAddr, &mut Ctl),
    child: impl FnOnce(&End, FiAddr, &mut Ctl),
) {
    if role().is_some() {
        let e = end(caps, Progress::Auto);
        let p = connect_parent(&e);
        child(&e, p, &mut Ctl::Child);
        say("done");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut peer = spawn(test, "child", &[]);
    let e = end(caps, Progress::Auto);
    let c = connect(&mut peer, &e);
    parent(&e, c, &mut Ctl::Parent(&mut peer));
    assert_eq!(peer.hear(), "done");
    peer.tell("bye");
    peer.join();
}

/// Asserts that `n`'s CQ stays empty for `d`.
fn assert_quiet(n: &Node, d: Duration) {
    let t = Instant::now();
    let mut b = [CqTaggedEntry::default(); 4];
    while t.elapsed() < d {
        match n.cq.read(&mut b) {
            Err(Error::Again(_)) => {}
            Err(Error::Avail) => panic!("expected no completion, got {:?}", n.cq.readerr()),
            other => panic!("expected no completion, got {other:?} {b:?}"),
        }
    }
}

/// Peeks (with `flags`, FI_PEEK among them) until a message tagged `tag` is buffered.
fn peek(n: &Node, tag: u64, ctx: Context, flags: u64) -> CqTaggedEntry {
    let deadline = Instant::now() + BOUND;
    loop {
        // SAFETY: a peek moves no data.
        unsafe {
            n.ep.trecvmsg(&tmsg(&[], FI_ADDR_UNSPEC, ctx, tag, 0), flags)
        }
        .unwrap();
        match n.next() {
            Completion::Ok(e, _) => return e,
            Completion::Err(e, _) => assert_eq!(e.err, FI_ENOMSG, "peek miss: {e:?}"),
        }
        assert!(Instant::now() < deadline, "tag {tag:#x} never arrived");
    }
}

/// Asserts a peek for `tag` finds nothing.
fn peek_misses(n: &Node, tag: u64, ctx: Context) {
    // SAFETY: a peek moves no data.
    unsafe {
        n.ep.trecvmsg(&tmsg(&[], FI_ADDR_UNSPEC, ctx, tag, 0), FI_PEEK)
    }
    .unwrap();
    let e = n.wait_err();
    assert_eq!((e.err, e.op_context), (FI_ENOMSG, ctx), "{e:?}");
}

/// The tag of the marker a sender sends after a batch, so the receiver knows (by peeking it,
/// then discarding it) that everything sent before it has arrived.
const MARK: u64 = 0x3a7c_0000_0000_0001;

fn send_marker(n: &Node, peer: FiAddr) {
    n.ep.tinject(b"marker!!", peer, MARK).unwrap();
}

fn await_marker(n: &Node) {
    let e = peek(n, MARK, 0xa4, FI_PEEK | FI_DISCARD);
    assert_eq!((e.tag, e.len), (MARK, 8));
}

/// A target window: registered for remote read and write; says "key base" to the peer.
fn window(n: &Node, buf: &[u8], access: u64, ctl: &mut Ctl) -> MemoryRegion {
    // SAFETY: every caller keeps `buf` alive (and unmoved) past the region's drop.
    let mr = unsafe { n.domain.mr_reg(buf, access, 0, 7) }.unwrap();
    let base = if n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0 {
        buf.as_ptr() as u64
    } else {
        0
    };
    ctl.tell(&format!("{} {base}", mr.key()));
    mr
}

/// The peer's "key base" line.
fn remote(ctl: &mut Ctl) -> (u64, u64) {
    let l = ctl.hear();
    let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// Reads memory the peer writes remotely (it changed under a shared borrow).
fn snapshot(buf: &[u8]) -> Vec<u8> {
    (0..buf.len())
        // SAFETY: in bounds of `buf`; volatile because a remote write changed it.
        .map(|i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(i)) })
        .collect()
}

fn rma_msg<'a>(iov: &'a [RawIov], to: FiAddr, rma: &'a [RmaIov], ctx: Context) -> MsgRma<'a> {
    MsgRma {
        iov,
        desc: &[],
        addr: to,
        rma_iov: rma,
        context: ctx,
        data: 0,
    }
}

// ---- 1. Messages ----------------------------------------------------------------------------

const SIZES: [usize; 8] = [0, 1, 8, 4096, 65536, 65537, 1 << 20, 4 << 20];
const PAD: usize = 64;

/// Sends every size twice: into receives the peer posted first, then as unexpected messages
/// followed by a marker.
fn send_sizes(e: &End, peer: FiAddr, ctl: &mut Ctl) {
    for round in 0..2u64 {
        if round == 0 {
            ctl.expect("posted");
        }
        let bufs: Vec<Vec<u8>> = (0..SIZES.len())
            .map(|i| pattern(SIZES[i], round * 100 + i as u64))
            .collect();
        for (i, b) in bufs.iter().enumerate() {
            // SAFETY: bufs outlive the completions waited for below.
            e.retry(|| unsafe { e.ep.send(b, None, peer, 10 + i) });
        }
        if round == 1 {
            send_marker(e, peer);
            ctl.tell("sent");
        }
        let mut done: Vec<Context> = e
            .wait_n(SIZES.len())
            .iter()
            .map(|c| {
                assert_eq!(c.flags, FI_SEND | FI_MSG, "{c:?}");
                c.op_context
            })
            .collect();
        done.sort_unstable();
        assert_eq!(done, (10..10 + SIZES.len()).collect::<Vec<_>>());
        ctl.expect("checked");
    }
}

fn recv_sizes(e: &End, peer: FiAddr, ctl: &mut Ctl) {
    for round in 0..2u64 {
        let mut bufs: Vec<Vec<u8>> = SIZES.iter().map(|&l| vec![0xee; l + PAD]).collect();
        if round == 1 {
            ctl.expect("sent");
            await_marker(e);
        }
        for (i, b) in bufs.iter_mut().enumerate() {
            // SAFETY: bufs outlive the completions waited for below.
            unsafe { e.ep.recv(b, None, FI_ADDR_UNSPEC, i) }.unwrap();
        }
        if round == 0 {
            ctl.tell("posted");
        }
        let got = e.wait_from(SIZES.len());
        for (i, &len) in SIZES.iter().enumerate() {
            let (c, src) = *got.iter().find(|(c, _)| c.op_context == i).unwrap();
            let what = format!("round {round}, {len} bytes");
            assert_eq!(
                (c.len, c.flags, src),
                (len, FI_RECV | FI_MSG, peer),
                "{what}"
            );
            assert_eq!(c.buf, bufs[i].as_ptr() as usize, "{what}");
            assert!(
                bufs[i][..len] == pattern(len, round * 100 + i as u64),
                "{what}"
            );
            assert!(bufs[i][len..].iter().all(|&b| b == 0xee), "{what}: overrun");
        }
        assert_eq!(e.rx.read(), (round + 1) * SIZES.len() as u64);
        ctl.tell("checked");
    }
}

#[test]
fn messages_every_size_both_directions() {
    two(
        "messages_every_size_both_directions",
        FI_MSG | FI_TAGGED | FI_SOURCE,
        |e, p, ctl| {
            send_sizes(e, p, ctl);
            recv_sizes(e, p, ctl);
        },
        |e, p, ctl| {
            recv_sizes(e, p, ctl);
            send_sizes(e, p, ctl);
        },
    );
}

/// (message length, receive buffer length): the first two posted before, the rest after.
const TRUNC: [(usize, usize); 4] = [(1000, 600), (65537, 4096), (1 << 20, 1000), (4096, 0)];

#[test]
fn message_truncation_reports_overflow() {
    two(
        "message_truncation_reports_overflow",
        FI_MSG | FI_TAGGED,
        |e, _, ctl| {
            let mut bufs: Vec<Vec<u8>> = TRUNC.iter().map(|&(_, c)| vec![0xee; c + PAD]).collect();
            let mut post = |i: usize| {
                let iov = [RawIov {
                    addr: bufs[i].as_mut_ptr() as usize,
                    len: TRUNC[i].1,
                }];
                // SAFETY: bufs outlive the completions read below.
                unsafe { e.ep.recvv(&iov, &[], FI_ADDR_UNSPEC, i) }.unwrap();
            };
            post(0);
            post(1);
            ctl.tell("posted");
            let mut errs = vec![e.wait_err(), e.wait_err()];
            ctl.expect("sent");
            await_marker(e);
            post(2);
            post(3);
            errs.extend([e.wait_err(), e.wait_err()]);
            for (i, &(len, cap)) in TRUNC.iter().enumerate() {
                let x = errs.iter().find(|x| x.op_context == i).expect("an entry");
                assert_eq!((x.err, x.len, x.olen), (FI_ETRUNC, cap, len - cap), "{x:?}");
                assert_eq!(x.flags & (FI_RECV | FI_MSG), FI_RECV | FI_MSG, "{x:?}");
                assert!(
                    bufs[i][..cap] == pattern(len, i as u64)[..cap],
                    "prefix {i}"
                );
                assert!(bufs[i][cap..].iter().all(|&b| b == 0xee), "overrun {i}");
            }
            ctl.expect("completed");
        },
        |e, p, ctl| {
            ctl.expect("posted");
            let bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(TRUNC[i].0, i as u64)).collect();
            for (i, b) in bufs.iter().enumerate() {
                // SAFETY: bufs outlive the completions waited for below.
                e.retry(|| unsafe { e.ep.send(b, None, p, i) });
            }
            send_marker(e, p);
            ctl.tell("sent");
            // Truncation is the receiver's error: every send succeeds.
            e.wait_n(TRUNC.len());
            ctl.tell("completed");
        },
    );
}

// ---- 2. Tagged ------------------------------------------------------------------------------

/// Sends each (tag, len) with payload `pattern(len, tag)`, then a marker; tells `posted` (large
/// sends complete only once received); waits for them all.
fn tsend_all(e: &End, peer: FiAddr, plan: &[(u64, usize)], ctl: &mut Ctl, posted: &str) {
    let bufs: Vec<Vec<u8>> = plan.iter().map(|&(t, l)| pattern(l, t)).collect();
    for (i, (&(tag, _), b)) in plan.iter().zip(&bufs).enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        e.retry(|| unsafe { e.ep.tsend(b, None, peer, tag, 1000 + i) });
    }
    send_marker(e, peer);
    ctl.tell(posted);
    let done = e.wait_n(plan.len());
    assert!(
        done.iter().all(|c| c.flags == FI_SEND | FI_TAGGED),
        "{done:?}"
    );
}

const WILD: [(u64, usize); 6] = [
    (0x7, 64),
    (0xab00_0000_0000_0042, 3000),
    (0x1234, 10),
    (0x5, 1 << 20),
    (0x1234, 11),
    (0x12ff, 0),
];
const LATE: [(u64, usize); 4] = [(1, 100), (2, 1 << 20), (3, 8), (4, 65537)];

#[test]
fn tagged_out_of_order_and_ignore_bits() {
    two(
        "tagged_out_of_order_and_ignore_bits",
        FI_MSG | FI_TAGGED | FI_SOURCE,
        |e, p, ctl| {
            // Posted first, matched in arrival order against (tag, ignore).
            let recvs: [(u64, u64); 6] = [
                (0x1200, 0x00ff),
                (0x1234, 0),
                (0x5, 0),
                (0x7, 0),
                (0xab00_0000_0000_0000, 0x00ff_ffff_ffff_ffff),
                (0x1000, 0x0fff),
            ];
            let mut bufs: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; 1 << 20]).collect();
            for (i, (&(tag, ign), b)) in recvs.iter().zip(bufs.iter_mut()).enumerate() {
                // SAFETY: bufs outlive the completions waited for below.
                unsafe { e.ep.trecv(b, None, p, tag, ign, i) }.unwrap();
            }
            ctl.tell("posted");
            let got = e.wait_from(6);
            for (k, &ctx) in [3usize, 4, 0, 2, 1, 5].iter().enumerate() {
                let (tag, len) = WILD[k];
                let (c, src) = *got.iter().find(|(c, _)| c.op_context == ctx).unwrap();
                assert_eq!((c.tag, c.len, src), (tag, len, p), "receive {ctx}");
                assert_eq!(c.flags, FI_RECV | FI_TAGGED, "receive {ctx}");
                assert!(
                    bufs[ctx][..len] == pattern(len, tag),
                    "data of receive {ctx}"
                );
            }
            // Unexpected: all arrived, then received in reverse tag order.
            ctl.expect("wild sent");
            ctl.expect("late sent");
            await_marker(e);
            for &(tag, len) in LATE.iter().rev() {
                let mut b = vec![0u8; len];
                // SAFETY: b outlives the completion awaited next.
                unsafe { e.ep.trecv(&mut b, None, p, tag, 0, tag as usize) }.unwrap();
                let c = e.wait_one();
                assert_eq!((c.op_context, c.tag, c.len), (tag as usize, tag, len));
                assert!(b == pattern(len, tag), "late tag {tag}");
            }
        },
        |e, p, ctl| {
            ctl.expect("posted");
            tsend_all(e, p, &WILD, ctl, "wild sent");
            tsend_all(e, p, &LATE, ctl, "late sent");
        },
    );
}

#[test]
fn tagged_peek_claim_discard_small_and_large() {
    const M: usize = 1 << 20;
    const PLAN: [(u64, usize); 8] = [
        (0x50, 64),
        (0x51, M),
        (0x52, 64),
        (0x53, M),
        (0x54, 64),
        (0x55, M),
        (0x56, 64),
        (0x57, M),
    ];
    two(
        "tagged_peek_claim_discard_small_and_large",
        FI_MSG | FI_TAGGED,
        |e, _, ctl| {
            peek_misses(e, 0x50, 1);
            ctl.tell("go");
            ctl.expect("sent");
            await_marker(e);
            for (i, &(tag, len)) in PLAN.iter().enumerate() {
                let ctx = 100 + i;
                match i / 2 {
                    // Peek leaves it queued; an ordinary receive takes it.
                    0 => {
                        let c = peek(e, tag, ctx, FI_PEEK);
                        assert_eq!((c.op_context, c.len, c.tag), (ctx, len, tag));
                        assert_eq!(c.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
                        let mut b = vec![0u8; len];
                        // SAFETY: b outlives the completion.
                        unsafe { e.ep.trecv(&mut b, None, FI_ADDR_UNSPEC, tag, 0, ctx) }.unwrap();
                        assert_eq!(
                            (e.wait_one().op_context, b == pattern(len, tag)),
                            (ctx, true)
                        );
                    }
                    // Peek + claim reserves it; a claim receive gets the data.
                    1 => {
                        let c = peek(e, tag, ctx, FI_PEEK | FI_CLAIM);
                        assert_eq!((c.op_context, c.len, c.tag), (ctx, len, tag));
                        peek_misses(e, tag, 900 + i);
                        let mut b = vec![0u8; len];
                        let iov = [RawIov::of_mut(&mut b)];
                        // SAFETY: b outlives the completion.
                        unsafe {
                            e.ep.trecvmsg(&tmsg(&iov, FI_ADDR_UNSPEC, ctx, tag, 0), FI_CLAIM)
                        }
                        .unwrap();
                        let c = e.wait_one();
                        assert_eq!((c.op_context, c.len, c.tag), (ctx, len, tag));
                        assert!(b == pattern(len, tag), "claimed data of {tag:#x}");
                    }
                    // Peek + discard drops it.
                    2 => {
                        let c = peek(e, tag, ctx, FI_PEEK | FI_DISCARD);
                        assert_eq!((c.op_context, c.len, c.tag), (ctx, len, tag));
                        peek_misses(e, tag, 900 + i);
                    }
                    // Peek + claim, then claim + discard drops it.
                    _ => {
                        assert_eq!(peek(e, tag, ctx, FI_PEEK | FI_CLAIM).len, len);
                        let m = tmsg(&[], FI_ADDR_UNSPEC, ctx, tag, 0);
                        // SAFETY: a discard moves no data.
                        unsafe { e.ep.trecvmsg(&m, FI_CLAIM | FI_DISCARD) }.unwrap();
                        let c = e.wait_one();
                        assert_eq!((c.op_context, c.tag), (ctx, tag));
                        peek_misses(e, tag, 900 + i);
                    }
                }
            }
            // The sender's sends all completed, the discarded large ones too.
            ctl.expect("completed");
        },
        |e, p, ctl| {
            ctl.expect("go");
            let bufs: Vec<Vec<u8>> = PLAN.iter().map(|&(t, l)| pattern(l, t)).collect();
            for (&(tag, _), b) in PLAN.iter().zip(&bufs) {
                // SAFETY: bufs outlive the completions waited for below.
                e.retry(|| unsafe { e.ep.tsend(b, None, p, tag, tag as usize) });
            }
            send_marker(e, p);
            ctl.tell("sent");
            let done = e.wait_n(PLAN.len());
            assert!(
                done.iter().all(|c| c.flags == FI_SEND | FI_TAGGED),
                "{done:?}"
            );
            ctl.tell("completed");
        },
    );
}

#[test]
fn tagged_directed_receive_takes_only_its_source() {
    let caps = FI_MSG | FI_TAGGED | FI_SOURCE | FI_DIRECTED_RECV;
    two(
        "tagged_directed_receive_takes_only_its_source",
        caps,
        |e, a, ctl| {
            // The child's second endpoint, B.
            let b = e.add_peer(&unhex(&ctl.hear()));
            ctl.tell(&hex(&e.ep.getname().unwrap()));
            assert_ne!(a, b);
            let mut from_b = vec![0u8; 2000];
            let mut sentinel = [0u8; 4];
            // SAFETY: the buffers outlive the completions read below.
            unsafe {
                e.ep.trecv(&mut from_b, None, b, 7, 0, 1).unwrap();
                e.ep.trecv(&mut sentinel, None, a, 99, 0, 2).unwrap();
            }
            ctl.tell("go a");
            // A's tag-7 message came before its sentinel, and the receive for B did not take it.
            let (c, s) = e.wait_from(1)[0];
            assert_eq!((c.op_context, c.len, s), (2, 4, a));
            assert_quiet(e, Duration::from_millis(50));
            ctl.tell("go b");
            let (c, s) = e.wait_from(1)[0];
            assert_eq!((c.op_context, c.tag, c.len, s), (1, 7, 2000, b));
            assert!(from_b == pattern(2000, 0xb));
            // A's message waited unexpected; a receive from any source takes it now.
            let mut from_a = vec![0u8; 1 << 20];
            // SAFETY: from_a outlives its completion.
            unsafe { e.ep.trecv(&mut from_a, None, FI_ADDR_UNSPEC, 7, 0, 3) }.unwrap();
            let (c, s) = e.wait_from(1)[0];
            assert_eq!((c.op_context, c.len, s), (3, 1 << 20, a));
            assert!(from_a == pattern(1 << 20, 0xa));
            ctl.expect("sent");
        },
        |e, p, ctl| {
            let b = end(caps, Progress::Auto);
            ctl.tell(&hex(&b.ep.getname().unwrap()));
            let pb = b.add_peer(&unhex(&ctl.hear()));
            let big = pattern(1 << 20, 0xa);
            let small = pattern(2000, 0xb);
            ctl.expect("go a");
            // SAFETY: the buffers outlive the completions waited for below.
            unsafe {
                e.ep.tsend(&big, None, p, 7, 1).unwrap();
                e.ep.tsend(b"sent", None, p, 99, 2).unwrap();
            }
            ctl.expect("go b");
            // SAFETY: as above.
            unsafe { b.ep.tsend(&small, None, pb, 7, 3) }.unwrap();
            assert_eq!(b.wait_one().op_context, 3);
            e.wait_n(2);
            ctl.tell("sent");
        },
    );
}

#[test]
fn multi_recv_buffer_takes_several_messages() {
    const LENS: [usize; 4] = [1000, 20_000, 30_000, 12_000];
    two(
        "multi_recv_buffer_takes_several_messages",
        FI_MSG | FI_MULTI_RECV,
        |e, p, ctl| {
            // 64 KiB, at least 4000 left to stay posted: the fourth message releases it.
            e.ep.setopt(FI_OPT_MIN_MULTI_RECV, 4000).unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let mut next = vec![0u8; 600];
            let iov = [RawIov::of_mut(&mut buf)];
            let base = iov[0].addr;
            let m = tmsg(&iov, p, 77, 0, 0);
            // SAFETY: buf and next outlive every completion read below.
            unsafe {
                e.ep.recvmsg(&m, FI_MULTI_RECV).unwrap();
                e.ep.recv(&mut next, None, p, 78).unwrap();
            }
            ctl.tell("posted");
            let got = e.wait_n(LENS.len() + 1);
            let multi: Vec<&CqTaggedEntry> = got.iter().filter(|c| c.op_context == 77).collect();
            assert_eq!(multi.len(), LENS.len(), "{got:?}");
            let last = multi.last().unwrap();
            assert_eq!(
                last.flags,
                FI_RECV | FI_MSG | FI_MULTI_RECV,
                "released last: {got:?}"
            );
            let mut off = 0;
            for (i, &len) in LENS.iter().enumerate() {
                let c = multi
                    .iter()
                    .find(|c| c.buf == base + off)
                    .expect("successive offsets");
                assert_eq!(c.len, len);
                let flag = if i == LENS.len() - 1 {
                    FI_MULTI_RECV
                } else {
                    0
                };
                assert_eq!(c.flags, FI_RECV | FI_MSG | flag, "message {i}");
                assert!(buf[off..off + len] == pattern(len, i as u64), "message {i}");
                off += len;
            }
            let c = got.iter().find(|c| c.op_context == 78).unwrap();
            assert_eq!(c.len, 500);
            assert!(next[..500] == pattern(500, 9));
        },
        |e, p, ctl| {
            ctl.expect("posted");
            let mut bufs: Vec<Vec<u8>> = LENS
                .iter()
                .enumerate()
                .map(|(i, &l)| pattern(l, i as u64))
                .collect();
            bufs.push(pattern(500, 9));
            for (i, b) in bufs.iter().enumerate() {
                // SAFETY: bufs outlive the completions waited for below.
                e.retry(|| unsafe { e.ep.send(b, None, p, i) });
            }
            e.wait_n(bufs.len());
        },
    );
}

// ---- 3. RMA ---------------------------------------------------------------------------------

const WIN: usize = 2 << 20;
/// Where the fenced write and read go: clear of the window's last 64 bytes.
const FENCE_AT: usize = WIN / 2 - 8192;

#[test]
fn rma_write_read_writedata_access_and_fence() {
    two(
        "rma_write_read_writedata_access_and_fence",
        FI_MSG | FI_RMA | FI_RMA_EVENT,
        |e, p, ctl| {
            let (key, base) = remote(ctl);
            let sizes = [8usize, 4096, 1 << 20];
            for (i, &len) in sizes.iter().enumerate() {
                let addr = base + 4096 * (i as u64 + 1);
                let out = pattern(len, i as u64);
                let mut back = vec![0u8; len];
                // SAFETY: every buffer outlives the completion awaited right after.
                unsafe { e.ep.write(&out, None, p, addr, key, 1) }.unwrap();
                let c = e.wait_one();
                assert_eq!((c.op_context, c.flags), (1, FI_RMA | FI_WRITE));
                unsafe { e.ep.read(&mut back, None, p, addr, key, 2) }.unwrap();
                let c = e.wait_one();
                assert_eq!((c.op_context, c.flags), (2, FI_RMA | FI_READ));
                assert!(back == out, "write then read of {len} bytes");
                let out = pattern(len, 10 + i as u64);
                unsafe {
                    e.ep.writedata(&out, None, 0x1000 + i as u64, p, addr, key, 3)
                }
                .unwrap();
                assert_eq!(e.wait_one().op_context, 3);
                unsafe { e.ep.read(&mut back, None, p, addr, key, 4) }.unwrap();
                e.wait_one();
                assert!(back == out, "writedata of {len} bytes");
            }
            // A bad key and a range past the end: FI_EACCES, target untouched.
            let junk = [0xffu8; 64];
            let mut tmp = [0u8; 64];
            let end_at = base + WIN as u64 - 32;
            for (k, a, why) in [
                (key ^ 0x5555, base, "bad key"),
                (key, end_at, "past the end"),
            ] {
                // SAFETY: junk and tmp outlive the completions.
                unsafe { e.ep.write(&junk, None, p, a, k, 9) }.unwrap();
                let x = e.wait_err();
                assert_eq!(
                    (x.op_context, x.err, x.flags),
                    (9, FI_EACCES, FI_RMA | FI_WRITE),
                    "{why}"
                );
                unsafe { e.ep.read(&mut tmp, None, p, a, k, 10) }.unwrap();
                let x = e.wait_err();
                assert_eq!(
                    (x.op_context, x.err, x.flags),
                    (10, FI_EACCES, FI_RMA | FI_READ),
                    "{why}"
                );
            }
            for a in [base, base + WIN as u64 - 64] {
                // SAFETY: tmp outlives the completion.
                unsafe { e.ep.read(&mut tmp, None, p, a, key, 11) }.unwrap();
                e.wait_one();
                assert_eq!(tmp, [0u8; 64], "refused writes left the target untouched");
            }
            // A fenced read after a large write sees the write.
            let big = pattern(1 << 20, 77);
            let mut seen = vec![0u8; 1 << 20];
            let at = base + FENCE_AT as u64;
            let iov = [RawIov::of_mut(&mut seen)];
            let rma = [RmaIov {
                addr: at,
                len: 1 << 20,
                key,
            }];
            // SAFETY: both buffers outlive the two completions.
            unsafe {
                e.ep.write(&big, None, p, at, key, 12).unwrap();
                e.ep.readmsg(&rma_msg(&iov, p, &rma, 13), FI_FENCE).unwrap();
            }
            let mut ctxs: Vec<Context> = e.wait_n(2).iter().map(|c| c.op_context).collect();
            ctxs.sort_unstable();
            assert_eq!(ctxs, [12, 13]);
            assert!(seen == big, "the fenced read saw the write");
            ctl.tell("done");
            // The target's events: 7 writes (3 with data, in order) and 9 reads.
            assert_eq!(ctl.hear(), "writes 7 reads 9 data [4096, 4097, 4098]");
        },
        |e, _, ctl| {
            let win = vec![0u8; WIN];
            let mr = window(e, &win, FI_REMOTE_READ | FI_REMOTE_WRITE, ctl);
            ctl.expect("done");
            let (mut w, mut r, mut data) = (0, 0, Vec::new());
            let mut b = [CqTaggedEntry::default(); 16];
            loop {
                match e.cq.read(&mut b) {
                    Ok(k) => {
                        for c in &b[..k] {
                            assert_eq!(c.flags & FI_RMA, FI_RMA, "{c:?}");
                            if c.flags & FI_REMOTE_WRITE != 0 {
                                w += 1;
                            }
                            if c.flags & FI_REMOTE_READ != 0 {
                                r += 1;
                            }
                            if c.flags & FI_REMOTE_CQ_DATA != 0 {
                                assert_ne!(c.flags & FI_REMOTE_WRITE, 0);
                                data.push(c.data);
                            }
                        }
                    }
                    Err(Error::Again(_)) => break,
                    Err(x) => panic!("target cq: {x} {:?}", e.cq.readerr()),
                }
            }
            ctl.tell(&format!("writes {w} reads {r} data {data:?}"));
            let now = snapshot(&win);
            assert!(now[FENCE_AT..FENCE_AT + (1 << 20)] == pattern(1 << 20, 77));
            assert!(now[WIN - 64..] == [0u8; 64]);
            drop(mr);
        },
    );
}

// ---- 4. Atomics -----------------------------------------------------------------------------

const ADDS: u64 = 200;

/// Both sides at once: fetch-adds `inc` to the peer's word (and serves the peer's adds to its
/// own), then compare-swaps and atomically reads the peer's second word.
fn atomics_side(e: &End, p: FiAddr, ctl: &mut Ctl, inc: u64, peer_inc: u64) {
    let win = vec![0u8; 16];
    let mr = window(e, &win, FI_REMOTE_READ | FI_REMOTE_WRITE, ctl);
    let (key, base) = remote(ctl);
    let u = Datatype::UInt64;
    for k in 0..ADDS {
        let mut old = [0u8; 8];
        // SAFETY: both buffers outlive the completion awaited next.
        e.retry(|| unsafe {
            e.ep.fetch_atomic(
                &inc.to_ne_bytes(),
                1,
                &mut old,
                p,
                base,
                key,
                u,
                AtomicOp::Sum,
                5,
            )
        });
        let c = e.wait_one();
        assert_eq!((c.op_context, c.flags), (5, FI_ATOMIC | FI_READ));
        assert_eq!(u64::from_ne_bytes(old), k * inc, "fetched values in order");
    }
    ctl.tell("added");
    ctl.expect("added");
    let word = |i: usize| u64::from_ne_bytes(snapshot(&win)[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(word(0), ADDS * peer_inc, "the peer's adds summed");
    // Compare-swap: success (0 -> inc), then failure (compare 0 again).
    for (cmp, swap, want_old) in [(0u64, inc, 0u64), (0, 0xdead, inc)] {
        let mut old = [0u8; 8];
        // SAFETY: the buffers outlive the completion awaited next.
        unsafe {
            e.ep.compare_atomic(
                &swap.to_ne_bytes(),
                1,
                &cmp.to_ne_bytes(),
                &mut old,
                p,
                base + 8,
                key,
                u,
                AtomicOp::Cswap,
                6,
            )
        }
        .unwrap();
        let c = e.wait_one();
        assert_eq!((c.op_context, c.flags), (6, FI_ATOMIC | FI_READ));
        assert_eq!(u64::from_ne_bytes(old), want_old);
    }
    // Atomic reads of both words.
    for (off, want) in [(0u64, ADDS * inc), (8, inc)] {
        let mut got = [0u8; 8];
        // SAFETY: the buffers outlive the completion awaited next.
        unsafe {
            e.ep.fetch_atomic(
                &[0u8; 8],
                1,
                &mut got,
                p,
                base + off,
                key,
                u,
                AtomicOp::Read,
                7,
            )
        }
        .unwrap();
        assert_eq!(e.wait_one().op_context, 7);
        assert_eq!(u64::from_ne_bytes(got), want, "atomic read at {off}");
    }
    ctl.tell("swapped");
    ctl.expect("swapped");
    assert_eq!(word(1), peer_inc, "the failed compare-swap changed nothing");
    drop(mr);
}

#[test]
fn atomics_fetch_add_compare_swap_and_read() {
    two(
        "atomics_fetch_add_compare_swap_and_read",
        FI_MSG | FI_ATOMIC,
        |e, p, ctl| atomics_side(e, p, ctl, 1, 1000),
        |e, p, ctl| atomics_side(e, p, ctl, 1000, 1),
    );
}

// ---- 5. Completion levels -------------------------------------------------------------------

#[test]
fn delivery_and_match_complete() {
    const M: usize = 1 << 20;
    two(
        "delivery_and_match_complete",
        FI_MSG | FI_TAGGED,
        |e, p, ctl| {
            let (mut a, mut b) = (vec![0u8; 64], vec![0u8; M]);
            // SAFETY: the buffers outlive the completions.
            unsafe {
                e.ep.recv(&mut a, None, p, 1).unwrap();
                e.ep.recv(&mut b, None, p, 2).unwrap();
            }
            ctl.tell("posted");
            e.wait_n(2);
            assert!(a == pattern(64, 1) && b == pattern(M, 2));
            // Match complete to unexpected messages: buffered here, matched by nothing yet.
            ctl.expect("sent");
            assert_eq!(peek(e, 5, 10, FI_PEEK).len, 100);
            assert_eq!(peek(e, 6, 11, FI_PEEK).len, M);
            ctl.tell("buffered");
            ctl.expect("quiet");
            let (mut c, mut d) = (vec![0u8; 100], vec![0u8; M]);
            // SAFETY: as above.
            unsafe {
                e.ep.trecv(&mut c, None, p, 5, 0, 3).unwrap();
                e.ep.trecv(&mut d, None, p, 6, 0, 4).unwrap();
            }
            e.wait_n(2);
            assert!(c == pattern(100, 3) && d == pattern(M, 4));
        },
        |e, p, ctl| {
            let bufs: Vec<Vec<u8>> = [64, M, 100, M]
                .iter()
                .enumerate()
                .map(|(i, &l)| pattern(l, i as u64 + 1))
                .collect();
            ctl.expect("posted");
            for (i, b) in bufs[..2].iter().enumerate() {
                let iov = [RawIov::of(b)];
                // SAFETY: bufs outlive the completions.
                unsafe {
                    e.ep.sendmsg(&tmsg(&iov, p, 1 + i, 0, 0), FI_DELIVERY_COMPLETE)
                }
                .unwrap();
            }
            let done = e.wait_n(2);
            assert!(done.iter().all(|c| c.flags == FI_SEND | FI_MSG), "{done:?}");
            for (i, b) in bufs[2..].iter().enumerate() {
                let iov = [RawIov::of(b)];
                // SAFETY: as above.
                unsafe {
                    e.ep.tsendmsg(&tmsg(&iov, p, 3 + i, 5 + i as u64, 0), FI_MATCH_COMPLETE)
                }
                .unwrap();
            }
            ctl.tell("sent");
            ctl.expect("buffered");
            assert_quiet(e, Duration::from_millis(100));
            ctl.tell("quiet");
            let mut ctxs: Vec<Context> = e
                .wait_n(2)
                .iter()
                .map(|c| {
                    assert_eq!(c.flags, FI_SEND | FI_TAGGED);
                    c.op_context
                })
                .collect();
            ctxs.sort_unstable();
            assert_eq!(ctxs, [3, 4]);
        },
    );
}

// ---- 6. Triggered operations ----------------------------------------------------------------

fn chain_len(i: usize) -> usize {
    if i == 3 {
        1 << 20
    } else {
        4096
    }
}

#[test]
fn triggered_sends_chained_by_the_send_counter() {
    two(
        "triggered_sends_chained_by_the_send_counter",
        FI_MSG | FI_TRIGGER,
        |e, p, ctl| {
            let bufs: Vec<Vec<u8>> = (0..8).map(|i| pattern(chain_len(i), i as u64)).collect();
            let iovs: Vec<[RawIov; 1]> = bufs.iter().map(|b| [RawIov::of(b)]).collect();
            ctl.expect("posted");
            // Send i starts when the send counter reaches i: after send i - 1 completed.
            for (i, iov) in iovs.iter().enumerate().skip(1) {
                let trig = TriggerContext::threshold(&e.tx, i as u64);
                // SAFETY: bufs outlive the completions waited for below.
                unsafe {
                    e.ep.sendmsg_triggered(&tmsg(iov, p, 100 + i, 0, 0), 0, &trig)
                }
                .unwrap();
            }
            assert_quiet(e, Duration::from_millis(50));
            assert_eq!(e.tx.read(), 0);
            ctl.tell("armed");
            ctl.expect("nothing yet");
            // SAFETY: as above.
            unsafe { e.ep.send(&bufs[0], None, p, 100) }.unwrap();
            e.tx.wait(8, 10_000).expect("the chain ran");
            let mut ctxs: Vec<Context> = e.wait_n(8).iter().map(|c| c.op_context).collect();
            ctxs.sort_unstable();
            assert_eq!(ctxs, (100..108).collect::<Vec<_>>());
        },
        |e, p, ctl| {
            let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 1 << 20]).collect();
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive the completions waited for below.
                unsafe { e.ep.recv(b, None, p, i) }.unwrap();
            }
            ctl.tell("posted");
            ctl.expect("armed");
            assert_quiet(e, Duration::from_millis(50));
            ctl.tell("nothing yet");
            let got = e.wait_n(8);
            // Receive i took message i: they arrived in order.
            for (i, b) in bufs.iter().enumerate() {
                let c = got.iter().find(|c| c.op_context == i).unwrap();
                assert_eq!(c.len, chain_len(i), "receive {i}");
                assert!(b[..c.len] == pattern(c.len, i as u64), "receive {i}");
            }
        },
    );
}

#[test]
fn deferred_work_counter_add_and_rma_write() {
    two(
        "deferred_work_counter_add_and_rma_write",
        FI_MSG | FI_RMA | FI_TRIGGER,
        |e, p, ctl| {
            let (key, base) = remote(ctl);
            let d = &e.domain;
            let (trig, added, done) = (
                d.cntr_open(&CntrAttr::default()).unwrap(),
                d.cntr_open(&CntrAttr::default()).unwrap(),
                d.cntr_open(&CntrAttr::default()).unwrap(),
            );
            let data = pattern(4096, 3);
            let iov = [RawIov::of(&data)];
            let rma = [RmaIov {
                addr: base,
                len: 4096,
                key,
            }];
            let add = DeferredWork {
                threshold: 2,
                triggering_cntr: &trig,
                completion_cntr: None,
                op: WorkOp::CntrAdd(OpCntr {
                    cntr: &added,
                    value: 5,
                }),
            };
            let write = DeferredWork {
                threshold: 3,
                triggering_cntr: &trig,
                completion_cntr: Some(&done),
                op: WorkOp::Write(OpRma {
                    ep: &e.ep,
                    msg: rma_msg(&iov, p, &rma, 0x77),
                    flags: 0,
                }),
            };
            // SAFETY: `data` outlives the write (its completion counter is waited for).
            unsafe {
                d.queue_work(&add).unwrap();
                d.queue_work(&write).unwrap();
            }
            let peek_window = |want: &[u8]| {
                let mut back = vec![0u8; 4096];
                // SAFETY: back outlives the completion.
                unsafe { e.ep.read(&mut back, None, p, base, key, 9) }.unwrap();
                assert_eq!(e.wait_one().op_context, 9);
                assert!(
                    back == want,
                    "the window before or after the deferred write"
                );
            };
            trig.add(1).unwrap();
            assert_quiet(e, Duration::from_millis(50));
            assert_eq!((added.read(), done.read()), (0, 0), "nothing at 1");
            peek_window(&[0u8; 4096]);
            trig.add(1).unwrap();
            added.wait(5, 10_000).expect("the counter add at 2");
            assert_quiet(e, Duration::from_millis(50));
            assert_eq!((added.read(), done.read()), (5, 0), "only the add at 2");
            peek_window(&[0u8; 4096]);
            trig.add(1).unwrap();
            done.wait(1, 10_000).expect("the write at 3");
            assert_eq!(added.read(), 5);
            peek_window(&data);
            ctl.tell("written");
        },
        |e, _, ctl| {
            let win = vec![0u8; 4096];
            let mr = window(e, &win, FI_REMOTE_READ | FI_REMOTE_WRITE, ctl);
            ctl.expect("written");
            assert!(snapshot(&win) == pattern(4096, 3));
            drop(mr);
        },
    );
}

// ---- 7. XPU-triggered send ------------------------------------------------------------------

#[test]
fn xpu_triggered_send_with_a_cpu_xpu() {
    two(
        "xpu_triggered_send_with_a_cpu_xpu",
        FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER,
        |e, p, ctl| {
            assert_eq!(e.ep.xpu_trigger_vars(Xpu::CPU, &mut []).unwrap(), 1);
            let buf = vec![0u8; 4096];
            let iov = [RawIov::of(&buf)];
            let mut v = [TriggerVar::default()];
            ctl.expect("posted");
            // SAFETY: buf outlives the send (its completion is waited for below).
            let k = unsafe {
                e.ep.tsendmsg_xpu(&tmsg(&iov, p, 5, 0, 0), 0, Xpu::CPU, &mut v)
            };
            assert_eq!(k.expect("arm"), 1);
            ctl.tell("armed");
            ctl.expect("nothing yet");
            assert_quiet(e, Duration::from_millis(20));
            let (addr, var) = (buf.as_ptr() as usize, v[0]);
            std::thread::spawn(move || {
                let data = pattern(4096, 1);
                // SAFETY: the sender's buffer, alive until the send completes, read by nothing
                // before the ring.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, 4096) };
                // SAFETY: a variable the endpoint filled; its doorbell outlives this thread.
                unsafe { ring(&[var]) }.expect("ring");
            })
            .join()
            .unwrap();
            let c = e.wait_one();
            assert_eq!((c.op_context, c.flags), (5, FI_SEND | FI_TAGGED));
            // SAFETY: the end outlives its completion.
            unsafe { e.ep.tsend(b"the end!", None, p, 0, 6) }.unwrap();
            assert_eq!(e.wait_one().op_context, 6);
            ctl.expect("once");
        },
        |e, p, ctl| {
            let (mut a, mut b) = (vec![0u8; 4096], [0u8; 8]);
            // SAFETY: the buffers outlive the completions.
            unsafe {
                e.ep.trecv(&mut a, None, p, 0, 0, 1).unwrap();
                e.ep.trecv(&mut b, None, p, 0, 0, 2).unwrap();
            }
            ctl.tell("posted");
            ctl.expect("armed");
            assert_quiet(e, Duration::from_millis(100));
            ctl.tell("nothing yet");
            let got = e.wait_n(2);
            assert_eq!((got[0].op_context, got[0].len), (1, 4096));
            assert!(
                a == pattern(4096, 1),
                "the bytes the XPU stored before ringing"
            );
            assert_eq!(
                (got[1].op_context, &b),
                (2, b"the end!"),
                "the ring sent once"
            );
            ctl.tell("once");
        },
    );
}

// ---- 8. Peer killed mid-transfer ------------------------------------------------------------

#[test]
fn peer_killed_mid_transfer_fails_every_operation() {
    const M: usize = 1 << 20;
    let caps = FI_MSG | FI_TAGGED | FI_RMA | FI_DIRECTED_RECV;
    if role().is_some() {
        // Never progresses: the parent's sends and reads stay outstanding until the kill.
        let e = end(caps, Progress::Manual);
        connect_parent(&e);
        let win = vec![0u8; M];
        let _mr = window(&e, &win, FI_REMOTE_READ, &mut Ctl::Child);
        listen();
        unreachable!("this child is killed");
    }
    let mut child = spawn(
        "peer_killed_mid_transfer_fails_every_operation",
        "idle",
        &[],
    );
    let e = end(caps, Progress::Manual);
    let p = connect(&mut child, &e);
    let (key, base) = remote(&mut Ctl::Parent(&mut child));
    let data = pattern(M, 1);
    let mut reads = vec![vec![0u8; M]; 2];
    let mut rbuf = vec![0u8; 64];
    // SAFETY: every buffer outlives the (error) completions read below.
    unsafe {
        for i in 0..4 {
            e.ep.send(&data, None, p, 100 + i).unwrap();
        }
        for (i, r) in reads.iter_mut().enumerate() {
            e.ep.read(r, None, p, base, key, 200 + i).unwrap();
        }
        e.ep.trecv(&mut rbuf, None, p, 9, 0, 300).unwrap();
    }
    assert_quiet(&e, Duration::from_millis(20));
    child.kill();
    let mut ended = Vec::new();
    for _ in 0..7 {
        match e.next() {
            Completion::Err(x, _) => {
                assert_eq!(x.err, FI_ECONNRESET, "{x:?}");
                ended.push(x.op_context);
            }
            Completion::Ok(c, _) => panic!("an operation toward a dead peer succeeded: {c:?}"),
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, [100, 101, 102, 103, 200, 201, 300]);
}
