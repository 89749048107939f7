//! The conformance suite: one set of two-process tests, written against the public API only,
//! run for whichever provider `XFABRIC_TEST_PROVIDER` names ("shm" when unset; the child
//! inherits the variable). Nothing here knows a provider: addresses travel only as
//! `getname` bytes inserted into an AV, memory-region addresses follow the domain's
//! `FI_MR_VIRT_ADDR`, and every wait is bounded (common's `BOUND`, `Peer::join`).
//!
//! Each test names a parent half, run here, and a child half, run in the test binary
//! re-executed (`common::spawn`); `two` connects them, with a control channel for handshakes.

mod common;
use std::time::{Duration, Instant};

use common::*;
use xfabric::errno::*;
use xfabric::kernels::cpu::ring;
use xfabric::*;

// ---- Helpers --------------------------------------------------------------------------------

/// One side of a test: a node with a send and a receive counter bound.
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
        |d, ep| {
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

/// One half of a test: its endpoint (auto progress), the other's address, the control channel.
type Half = fn(&End, FiAddr, &mut Ctl);

/// Runs `parent` here and `child` in a child process. Each half returns once its own operations
/// completed; the closing handshake keeps both processes up until both have.
fn two(test: &str, caps: u64, parent: Half, child: Half) {
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

// The posting helpers: every caller keeps the buffer alive and untouched until it has read the
// operation's completion (or, for the killed peer, its error).

fn send(n: &Node, b: &[u8], to: FiAddr, ctx: Context) {
    // SAFETY: see above.
    n.retry(|| unsafe { n.ep.send(b, None, to, ctx) });
}

fn tsend(n: &Node, b: &[u8], to: FiAddr, tag: u64, ctx: Context) {
    // SAFETY: see above.
    n.retry(|| unsafe { n.ep.tsend(b, None, to, tag, ctx) });
}

fn recv(n: &Node, b: &mut [u8], from: FiAddr, ctx: Context) {
    // SAFETY: see above.
    unsafe { n.ep.recv(b, None, from, ctx) }.unwrap();
}

fn trecv(n: &Node, b: &mut [u8], from: FiAddr, tag: u64, ctx: Context) {
    // SAFETY: see above.
    unsafe { n.ep.trecv(b, None, from, tag, 0, ctx) }.unwrap();
}

/// Waits for `k` successful completions and returns their contexts, sorted.
fn ctxs(n: &Node, k: usize) -> Vec<Context> {
    let mut v: Vec<Context> = n.wait_n(k).iter().map(|c| c.op_context).collect();
    v.sort_unstable();
    v
}

/// Waits for `k` successful send completions, each with `flags`; returns their contexts, sorted.
fn sent(n: &Node, k: usize, flags: u64) -> Vec<Context> {
    let done = n.wait_n(k);
    assert!(done.iter().all(|c| c.flags == flags), "{done:?}");
    let mut v: Vec<Context> = done.iter().map(|c| c.op_context).collect();
    v.sort_unstable();
    v
}

/// Asserts `buf` starts with `pattern(len, seed)`, naming the first byte that differs.
#[track_caller]
fn holds(buf: &[u8], len: usize, seed: u64) {
    let bad = buf[..len]
        .iter()
        .zip(pattern(len, seed))
        .position(|(a, b)| *a != b);
    assert_eq!(bad, None, "{len} bytes of pattern {seed}: first difference");
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

/// The tag of the marker a sender injects after a batch: once a peek finds it (and discards
/// it), everything sent before it has arrived.
const MARK: u64 = 0x3a7c_0000_0000_0001;

fn send_marker(n: &Node, peer: FiAddr) {
    n.ep.tinject(b"marker!!", peer, MARK).unwrap();
}

fn await_marker(n: &Node) {
    let e = peek(n, MARK, 0xa4, FI_PEEK | FI_DISCARD);
    assert_eq!((e.tag, e.len), (MARK, 8));
}

/// Registers `buf` as a target window and tells the peer "key base".
fn window(n: &Node, buf: &[u8], ctl: &mut Ctl) -> MemoryRegion {
    let access = FI_REMOTE_READ | FI_REMOTE_WRITE;
    // SAFETY: every caller keeps `buf` alive (and unmoved) past the region's drop.
    let mr = unsafe { n.domain.mr_reg(buf, access, 0, 7) }.unwrap();
    let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = if virt { buf.as_ptr() as u64 } else { 0 };
    ctl.tell(&format!("{} {base}", mr.key()));
    mr
}

/// The peer's "key base" line.
fn remote(ctl: &mut Ctl) -> (u64, u64) {
    let l = ctl.hear();
    let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// Reads memory the peer changed remotely (under a shared borrow).
fn snapshot(buf: &[u8]) -> Vec<u8> {
    // SAFETY: in bounds of `buf`; volatile because a remote write changed it.
    let at = |i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(i)) };
    (0..buf.len()).map(at).collect()
}

fn rma_msg<'a>(iov: &'a [RawIov], to: FiAddr, rma: &'a [RmaIov], ctx: Context) -> MsgRma<'a> {
    let (desc, data) = (&[][..], 0);
    MsgRma {
        iov,
        desc,
        addr: to,
        rma_iov: rma,
        context: ctx,
        data,
    }
}

/// An RMA write (or, with `data`, writedata) of `b`, waited for.
fn write(n: &Node, b: &[u8], data: Option<u64>, p: FiAddr, addr: u64, key: u64) {
    // SAFETY: the completion is awaited before returning.
    unsafe {
        match data {
            Some(d) => n.ep.writedata(b, None, d, p, addr, key, 1),
            None => n.ep.write(b, None, p, addr, key, 1),
        }
    }
    .unwrap();
    let c = n.wait_one();
    assert_eq!((c.op_context, c.flags), (1, FI_RMA | FI_WRITE));
}

/// An RMA read of `len` bytes, waited for.
fn read(n: &Node, len: usize, p: FiAddr, addr: u64, key: u64) -> Vec<u8> {
    let mut b = vec![0u8; len];
    // SAFETY: the completion is awaited before returning.
    unsafe { n.ep.read(&mut b, None, p, addr, key, 2) }.unwrap();
    let c = n.wait_one();
    assert_eq!((c.op_context, c.flags), (2, FI_RMA | FI_READ));
    b
}

/// A fetching atomic on one u64 (compare-swap when `op` is Cswap), waited for: the old value.
fn amo(n: &Node, op: AtomicOp, x: u64, cmp: u64, p: FiAddr, addr: u64, key: u64) -> u64 {
    let (x, cmp, mut old) = (x.to_ne_bytes(), cmp.to_ne_bytes(), [0u8; 8]);
    let u = Datatype::UInt64;
    // SAFETY: the completion is awaited before returning.
    n.retry(|| unsafe {
        if op == AtomicOp::Cswap {
            n.ep.compare_atomic(&x, 1, &cmp, &mut old, p, addr, key, u, op, 3)
        } else {
            n.ep.fetch_atomic(&x, 1, &mut old, p, addr, key, u, op, 3)
        }
    });
    let c = n.wait_one();
    assert_eq!((c.op_context, c.flags), (3, FI_ATOMIC | FI_READ));
    u64::from_ne_bytes(old)
}

// ---- 1. Messages ----------------------------------------------------------------------------

const SIZES: [usize; 8] = [0, 1, 8, 4096, 65536, 65537, 1 << 20, 4 << 20];
const PAD: usize = 64;

/// Sends every size twice: into receives the peer posted first, then unexpected (and a
/// marker after them).
fn send_sizes(e: &End, peer: FiAddr, ctl: &mut Ctl) {
    for round in 0..2 {
        let seed = |i: usize| round * 100 + i as u64;
        let bufs: Vec<Vec<u8>> = (0..8).map(|i| pattern(SIZES[i], seed(i))).collect();
        if round == 0 {
            ctl.expect("posted");
        }
        for (i, b) in bufs.iter().enumerate() {
            send(e, b, peer, 10 + i);
        }
        if round == 1 {
            send_marker(e, peer);
            ctl.tell("sent");
        }
        let got = sent(e, SIZES.len(), FI_SEND | FI_MSG);
        assert_eq!(got, (10..18).collect::<Vec<_>>());
        ctl.expect("checked");
    }
}

fn recv_sizes(e: &End, peer: FiAddr, ctl: &mut Ctl) {
    for round in 0..2 {
        let mut bufs: Vec<Vec<u8>> = SIZES.iter().map(|&l| vec![0xee; l + PAD]).collect();
        if round == 1 {
            ctl.expect("sent");
            await_marker(e);
        }
        for (i, b) in bufs.iter_mut().enumerate() {
            recv(e, b, FI_ADDR_UNSPEC, i);
        }
        if round == 0 {
            ctl.tell("posted");
        }
        let got = e.wait_from(SIZES.len());
        for (i, &len) in SIZES.iter().enumerate() {
            let (c, src) = *got.iter().find(|(c, _)| c.op_context == i).unwrap();
            let what = format!("round {round}, {len} bytes");
            let want = (len, FI_RECV | FI_MSG, peer, bufs[i].as_ptr() as usize);
            assert_eq!((c.len, c.flags, src, c.buf), want, "{what}");
            holds(&bufs[i], len, round * 100 + i as u64);
            assert!(bufs[i][len..].iter().all(|&b| b == 0xee), "{what}: overrun");
        }
        // The counter may be bumped just after the CQ entry is written (by the progress
        // thread): wait for it, bounded, rather than read it once.
        let want = (round + 1) * SIZES.len() as u64;
        assert_eq!(e.rx.wait(want, completion_ms()), Ok(()));
        assert_eq!(e.rx.read(), want);
        ctl.tell("checked");
    }
}

/// (message length, receive buffer length): the first two posted before, the rest after.
const TRUNC: [(usize, usize); 4] = [(1000, 600), (65537, 4096), (1 << 20, 1000), (4096, 0)];

fn trunc_receiver(e: &End, _: FiAddr, ctl: &mut Ctl) {
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
        holds(&bufs[i], cap, i as u64);
        assert!(bufs[i][cap..].iter().all(|&b| b == 0xee), "overrun {i}");
    }
    ctl.expect("completed");
}

fn trunc_sender(e: &End, p: FiAddr, ctl: &mut Ctl) {
    ctl.expect("posted");
    let bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(TRUNC[i].0, i as u64)).collect();
    for (i, b) in bufs.iter().enumerate() {
        send(e, b, p, i);
    }
    send_marker(e, p);
    ctl.tell("sent");
    // Truncation is the receiver's error: every send succeeds.
    e.wait_n(TRUNC.len());
    ctl.tell("completed");
}

// ---- 2. Tagged ------------------------------------------------------------------------------

/// Sends each (tag, len) with payload `pattern(len, tag)` and a marker, tells `posted` (large
/// sends complete only once received), then waits for them all.
fn tsend_all(e: &End, peer: FiAddr, plan: &[(u64, usize)], ctl: &mut Ctl, posted: &str) {
    let bufs: Vec<Vec<u8>> = plan.iter().map(|&(t, l)| pattern(l, t)).collect();
    for (i, (&(tag, _), b)) in plan.iter().zip(&bufs).enumerate() {
        tsend(e, b, peer, tag, 1000 + i);
    }
    send_marker(e, peer);
    ctl.tell(posted);
    sent(e, plan.len(), FI_SEND | FI_TAGGED);
}

const WILD: [(u64, usize); 6] = [
    (0x7, 64),
    (0xab00_0000_0000_0042, 3000),
    (0x1234, 10),
    (0x5, 1 << 20),
    (0x1234, 11),
    (0x12ff, 0),
];
/// (tag, ignore) of the receives posted before `WILD` is sent, and which message each takes.
const WILD_RECVS: [(u64, u64, usize); 6] = [
    (0x1200, 0x00ff, 2),
    (0x1234, 0, 4),
    (0x5, 0, 3),
    (0x7, 0, 0),
    (0xab00_0000_0000_0000, 0x00ff_ffff_ffff_ffff, 1),
    (0x1000, 0x0fff, 5),
];
const LATE: [(u64, usize); 4] = [(1, 100), (2, 1 << 20), (3, 8), (4, 65537)];

fn tag_receiver(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; 1 << 20]).collect();
    for (i, (&(tag, ign, _), b)) in WILD_RECVS.iter().zip(bufs.iter_mut()).enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        unsafe { e.ep.trecv(b, None, p, tag, ign, i) }.unwrap();
    }
    ctl.tell("posted");
    let got = e.wait_from(6);
    for (ctx, &(_, _, k)) in WILD_RECVS.iter().enumerate() {
        let (tag, len) = WILD[k];
        let (c, src) = *got.iter().find(|(c, _)| c.op_context == ctx).unwrap();
        assert_eq!((c.tag, c.len, src), (tag, len, p), "receive {ctx}");
        assert_eq!(c.flags, FI_RECV | FI_TAGGED, "receive {ctx}");
        holds(&bufs[ctx], len, tag);
    }
    // Unexpected: all arrived, then received in reverse tag order.
    ctl.expect("wild sent");
    ctl.expect("late sent");
    await_marker(e);
    for &(tag, len) in LATE.iter().rev() {
        let mut b = vec![0u8; len];
        trecv(e, &mut b, p, tag, tag as usize);
        let c = e.wait_one();
        assert_eq!((c.op_context, c.tag, c.len), (tag as usize, tag, len));
        holds(&b, len, tag);
    }
}

const M: usize = 1 << 20;
/// Small and large pairs (tags 0x50 + i): peeked then received, claimed, discarded, claimed
/// then discarded.
fn peeks() -> Vec<(u64, usize)> {
    (0..8)
        .map(|i| (0x50 + i, [64, M][i as usize % 2]))
        .collect()
}

fn peek_receiver(e: &End, _: FiAddr, ctl: &mut Ctl) {
    peek_misses(e, 0x50, 1);
    ctl.tell("go");
    ctl.expect("sent");
    await_marker(e);
    for (i, (tag, len)) in peeks().into_iter().enumerate() {
        let (ctx, any) = (100 + i, FI_ADDR_UNSPEC);
        let flags = FI_PEEK | [0, FI_CLAIM, FI_DISCARD, FI_CLAIM][i / 2];
        let c = peek(e, tag, ctx, flags);
        assert_eq!((c.op_context, c.len, c.tag), (ctx, len, tag));
        assert_eq!(c.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
        if flags & (FI_CLAIM | FI_DISCARD) != 0 {
            peek_misses(e, tag, 900 + i);
        }
        let mut b = vec![0u8; len];
        let iov = [RawIov::of_mut(&mut b)];
        // SAFETY: b outlives the completion awaited next.
        match i / 2 {
            0 => trecv(e, &mut b, any, tag, ctx),
            1 => unsafe { e.ep.trecvmsg(&tmsg(&iov, any, ctx, tag, 0), FI_CLAIM) }.unwrap(),
            2 => continue,
            _ => unsafe {
                e.ep.trecvmsg(&tmsg(&[], any, ctx, tag, 0), FI_CLAIM | FI_DISCARD)
            }
            .unwrap(),
        }
        let c = e.wait_one();
        assert_eq!((c.op_context, c.tag), (ctx, tag));
        if i / 2 < 2 {
            assert_eq!(c.len, len);
            holds(&b, len, tag);
        }
        peek_misses(e, tag, 950 + i);
    }
    // The sender's sends all completed, the discarded large ones too.
    ctl.expect("completed");
}

const DIRECTED: u64 = FI_MSG | FI_TAGGED | FI_SOURCE | FI_DIRECTED_RECV;

/// The receiver; the child has two endpoints, A (connected by `two`) and B.
fn directed_receiver(e: &End, a: FiAddr, ctl: &mut Ctl) {
    let b = e.add_peer(&unhex(&ctl.hear()));
    ctl.tell(&hex(&e.ep.getname().unwrap()));
    assert_ne!(a, b);
    let (mut from_b, mut sentinel) = (vec![0u8; 2000], [0u8; 4]);
    trecv(e, &mut from_b, b, 7, 1);
    trecv(e, &mut sentinel, a, 99, 2);
    ctl.tell("go a");
    // A's tag-7 message came before its sentinel, and the receive for B did not take it.
    let (c, s) = e.wait_from(1)[0];
    assert_eq!((c.op_context, c.len, s), (2, 4, a));
    assert_quiet(e, Duration::from_millis(50));
    ctl.tell("go b");
    let (c, s) = e.wait_from(1)[0];
    assert_eq!((c.op_context, c.tag, c.len, s), (1, 7, 2000, b));
    holds(&from_b, 2000, 0xb);
    // A's message waited unexpected; a receive from any source takes it now.
    let mut from_a = vec![0u8; M];
    trecv(e, &mut from_a, FI_ADDR_UNSPEC, 7, 3);
    let (c, s) = e.wait_from(1)[0];
    assert_eq!((c.op_context, c.len, s), (3, M, a));
    holds(&from_a, M, 0xa);
    ctl.expect("sent");
}

fn directed_senders(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let b = end(DIRECTED, Progress::Auto);
    ctl.tell(&hex(&b.ep.getname().unwrap()));
    let pb = b.add_peer(&unhex(&ctl.hear()));
    let (big, small) = (pattern(M, 0xa), pattern(2000, 0xb));
    ctl.expect("go a");
    tsend(e, &big, p, 7, 1);
    tsend(e, b"sent", p, 99, 2);
    ctl.expect("go b");
    tsend(&b, &small, pb, 7, 3);
    assert_eq!(b.wait_one().op_context, 3);
    e.wait_n(2);
    ctl.tell("sent");
}

const MULTI: [usize; 5] = [1000, 20_000, 30_000, 12_000, 500];

fn multi_receiver(e: &End, p: FiAddr, ctl: &mut Ctl) {
    // 64 KiB, kept while at least 4000 bytes are left: the fourth message releases it and
    // the fifth goes to the next receive.
    e.ep.setopt(FI_OPT_MIN_MULTI_RECV, 4000).unwrap();
    let (mut buf, mut next) = (vec![0u8; 64 * 1024], vec![0u8; 600]);
    let iov = [RawIov::of_mut(&mut buf)];
    let base = iov[0].addr;
    // SAFETY: buf outlives every completion read below.
    unsafe { e.ep.recvmsg(&tmsg(&iov, p, 77, 0, 0), FI_MULTI_RECV) }.unwrap();
    recv(e, &mut next, p, 78);
    ctl.tell("posted");
    let got = e.wait_n(MULTI.len());
    let multi: Vec<&CqTaggedEntry> = got.iter().filter(|c| c.op_context == 77).collect();
    assert_eq!(multi.len(), 4, "{got:?}");
    let last = multi.last().unwrap().flags;
    assert_eq!(last, FI_RECV | FI_MSG | FI_MULTI_RECV, "{got:?}");
    let mut off = 0;
    for (i, &len) in MULTI[..4].iter().enumerate() {
        let c = multi.iter().find(|c| c.buf == base + off).unwrap();
        let flag = if i == 3 { FI_MULTI_RECV } else { 0 };
        let want = (len, FI_RECV | FI_MSG | flag);
        assert_eq!((c.len, c.flags), want, "message {i}");
        holds(&buf[off..], len, i as u64);
        off += len;
    }
    let c = got.iter().find(|c| c.op_context == 78).unwrap();
    assert_eq!(c.len, 500);
    holds(&next, 500, 4);
}

fn multi_sender(e: &End, p: FiAddr, ctl: &mut Ctl) {
    ctl.expect("posted");
    let bufs: Vec<Vec<u8>> = (0..5).map(|i| pattern(MULTI[i], i as u64)).collect();
    for (i, b) in bufs.iter().enumerate() {
        send(e, b, p, i);
    }
    e.wait_n(bufs.len());
}

// ---- 3. RMA ---------------------------------------------------------------------------------

const WIN: usize = 2 << 20;
/// Where the fenced write and read go: clear of the window's last 64 bytes.
const FENCE_AT: usize = WIN / 2 - 8192;

fn rma_initiator(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let (key, base) = remote(ctl);
    for (i, len) in [8usize, 4096, M].into_iter().enumerate() {
        let addr = base + 4096 * (i as u64 + 1);
        let out = pattern(len, i as u64);
        write(e, &out, None, p, addr, key);
        assert!(read(e, len, p, addr, key) == out, "{len} B");
        let out = pattern(len, 10 + i as u64);
        write(e, &out, Some(0x1000 + i as u64), p, addr, key);
        assert!(read(e, len, p, addr, key) == out, "{len} B, data");
    }
    // A bad key and a range past the end: FI_EACCES, target untouched.
    let (junk, mut tmp) = ([0xffu8; 64], [0u8; 64]);
    let end_at = base + WIN as u64 - 32;
    for (k, a) in [(key ^ 0x5555, base), (key, end_at)] {
        // SAFETY: junk and tmp outlive the completions.
        unsafe { e.ep.write(&junk, None, p, a, k, 9) }.unwrap();
        let x = e.wait_err();
        let want = (9, FI_EACCES, FI_RMA | FI_WRITE);
        assert_eq!((x.op_context, x.err, x.flags), want, "{k:#x} {a:#x}");
        // SAFETY: as above.
        unsafe { e.ep.read(&mut tmp, None, p, a, k, 10) }.unwrap();
        let x = e.wait_err();
        let want = (10, FI_EACCES, FI_RMA | FI_READ);
        assert_eq!((x.op_context, x.err, x.flags), want, "{k:#x} {a:#x}");
    }
    for a in [base, base + WIN as u64 - 64] {
        assert_eq!(read(e, 64, p, a, key), [0u8; 64], "untouched");
    }
    // A fenced read after a large write sees the write.
    let big = pattern(M, 77);
    let mut seen = vec![0u8; M];
    let at = base + FENCE_AT as u64;
    let iov = [RawIov::of_mut(&mut seen)];
    let rma = [RmaIov {
        addr: at,
        len: M,
        key,
    }];
    // SAFETY: both buffers outlive the two completions.
    unsafe {
        e.ep.write(&big, None, p, at, key, 12).unwrap();
        e.ep.readmsg(&rma_msg(&iov, p, &rma, 13), FI_FENCE).unwrap();
    }
    assert_eq!(ctxs(e, 2), [12, 13]);
    assert!(seen == big, "the fenced read saw the write");
    ctl.tell("done");
    // The target's events (`RMA_EVENTS`): 7 writes (3 with data, in order) and 9 reads.
    assert_eq!(ctl.hear(), "writes 7 reads 9 data [4096, 4097, 4098]");
}

/// The events `rma_initiator`'s accesses leave at the target: 7 writes and 9 reads.
const RMA_EVENTS: usize = 16;

fn rma_target(e: &End, _: FiAddr, ctl: &mut Ctl) {
    let win = vec![0u8; WIN];
    let mr = window(e, &win, ctl);
    ctl.expect("done");
    // The initiator's completions do not mean every event is in this CQ yet: the engine
    // sends its answer to a write or read before it reports the event, which the progress
    // thread does once it has let go of the endpoint, so a read of the CQ meanwhile finds
    // nothing (it happened over verbs in the VM). Wait for them all, then for nothing more.
    let (mut seen, mut b) = (Vec::new(), [CqTaggedEntry::default(); 16]);
    let deadline = Instant::now() + completion_bound();
    while seen.len() < RMA_EVENTS {
        match e.cq.read(&mut b) {
            Ok(k) => seen.extend_from_slice(&b[..k]),
            Err(Error::Again(_)) => {}
            Err(x) => panic!("cq read after {} events: {x} {seen:?}", seen.len()),
        }
        assert!(Instant::now() < deadline, "{} events: {seen:?}", seen.len());
    }
    assert_quiet(e, Duration::from_millis(20));
    assert!(seen.iter().all(|c| c.flags & FI_RMA != 0), "{seen:?}");
    let with = |f: u64| seen.iter().filter(move |c| c.flags & f == f);
    let data: Vec<u64> = with(FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA)
        .map(|c| c.data)
        .collect();
    let (w, r) = (with(FI_REMOTE_WRITE).count(), with(FI_REMOTE_READ).count());
    ctl.tell(&format!("writes {w} reads {r} data {data:?}"));
    let now = snapshot(&win);
    assert!(now[FENCE_AT..FENCE_AT + M] == pattern(M, 77));
    assert!(now[WIN - 64..] == [0u8; 64]);
    drop(mr);
}

// ---- 4. Atomics -----------------------------------------------------------------------------

const ADDS: u64 = 200;

/// Both sides at once: fetch-adds `inc` to the peer's first word (while serving the peer's adds
/// to its own), then compare-swaps the peer's second word and reads both atomically.
fn atomics_side(e: &End, p: FiAddr, ctl: &mut Ctl, inc: u64, peer_inc: u64) {
    let win = vec![0u8; 16];
    let mr = window(e, &win, ctl);
    let (key, base) = remote(ctl);
    for k in 0..ADDS {
        let old = amo(e, AtomicOp::Sum, inc, 0, p, base, key);
        assert_eq!(old, k * inc, "fetched values in order");
    }
    ctl.tell("added");
    ctl.expect("added");
    let word = |i: usize| u64::from_ne_bytes(snapshot(&win)[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(word(0), ADDS * peer_inc, "the peer's adds summed");
    // Compare-swap: success (0 -> inc), then failure (compare 0 again).
    assert_eq!(amo(e, AtomicOp::Cswap, inc, 0, p, base + 8, key), 0);
    assert_eq!(amo(e, AtomicOp::Cswap, 0xdead, 0, p, base + 8, key), inc);
    assert_eq!(amo(e, AtomicOp::Read, 0, 0, p, base, key), ADDS * inc);
    assert_eq!(amo(e, AtomicOp::Read, 0, 0, p, base + 8, key), inc);
    ctl.tell("swapped");
    ctl.expect("swapped");
    assert_eq!(word(1), peer_inc, "the failed compare-swap changed nothing");
    drop(mr);
}

// ---- 5. Completion levels -------------------------------------------------------------------

fn levels_receiver(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let (mut a, mut b) = (vec![0u8; 64], vec![0u8; M]);
    recv(e, &mut a, p, 1);
    recv(e, &mut b, p, 2);
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
    trecv(e, &mut c, p, 5, 3);
    trecv(e, &mut d, p, 6, 4);
    e.wait_n(2);
    assert!(c == pattern(100, 3) && d == pattern(M, 4));
}

fn levels_sender(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let lens = [64, M, 100, M];
    let bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(lens[i], i as u64 + 1)).collect();
    let iovs: Vec<[RawIov; 1]> = bufs.iter().map(|b| [RawIov::of(b)]).collect();
    ctl.expect("posted");
    // Delivery complete (messages 1 and 2, to posted receives), then match complete (3 and 4,
    // tags 5 and 6, unexpected).
    for (i, iov) in iovs.iter().enumerate().take(2) {
        let m = tmsg(iov, p, 1 + i, 0, 0);
        // SAFETY: bufs outlive the completions.
        unsafe { e.ep.sendmsg(&m, FI_DELIVERY_COMPLETE) }.unwrap();
    }
    assert_eq!(sent(e, 2, FI_SEND | FI_MSG), [1, 2]);
    for (i, iov) in iovs.iter().enumerate().skip(2) {
        let m = tmsg(iov, p, 1 + i, 3 + i as u64, 0);
        // SAFETY: as above.
        unsafe { e.ep.tsendmsg(&m, FI_MATCH_COMPLETE) }.unwrap();
    }
    ctl.tell("sent");
    ctl.expect("buffered");
    assert_quiet(e, Duration::from_millis(100));
    ctl.tell("quiet");
    assert_eq!(sent(e, 2, FI_SEND | FI_TAGGED), [3, 4]);
}

// ---- 6. Triggered operations ----------------------------------------------------------------

/// Message 3 of the chain is large.
fn chain_len(i: usize) -> usize {
    [4096, M][usize::from(i == 3)]
}

fn chain_sender(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let bufs: Vec<Vec<u8>> = (0..8).map(|i| pattern(chain_len(i), i as u64)).collect();
    let iovs: Vec<[RawIov; 1]> = bufs.iter().map(|b| [RawIov::of(b)]).collect();
    ctl.expect("posted");
    // Send i starts when the send counter reaches i: after send i - 1 completed.
    for (i, iov) in iovs.iter().enumerate().skip(1) {
        let trig = TriggerContext::threshold(&e.tx, i as u64);
        let m = tmsg(iov, p, 100 + i, 0, 0);
        // SAFETY: bufs outlive the completions waited for below.
        unsafe { e.ep.sendmsg_triggered(&m, 0, &trig) }.unwrap();
    }
    assert_quiet(e, Duration::from_millis(50));
    assert_eq!(e.tx.read(), 0);
    ctl.tell("armed");
    ctl.expect("nothing yet");
    send(e, &bufs[0], p, 100);
    e.tx.wait(8, 10_000).expect("the chain ran");
    assert_eq!(ctxs(e, 8), (100..108).collect::<Vec<_>>());
}

fn chain_receiver(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; M]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        recv(e, b, p, i);
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
        holds(b, c.len, i as u64);
    }
}

fn deferred_initiator(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let (key, base) = remote(ctl);
    let d = &e.domain;
    let cntr = || d.cntr_open(&CntrAttr::default()).unwrap();
    let (trig, added, done) = (cntr(), cntr(), cntr());
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
    let msg = rma_msg(&iov, p, &rma, 0x77);
    let write = DeferredWork {
        threshold: 3,
        triggering_cntr: &trig,
        completion_cntr: Some(&done),
        op: WorkOp::Write(OpRma {
            ep: &e.ep,
            msg,
            flags: 0,
        }),
    };
    // SAFETY: `data` outlives the write (its completion counter is waited for).
    unsafe {
        d.queue_work(&add).unwrap();
        d.queue_work(&write).unwrap();
    }
    let zeros = vec![0u8; 4096];
    trig.add(1).unwrap();
    assert_quiet(e, Duration::from_millis(50));
    assert_eq!((added.read(), done.read()), (0, 0), "nothing at 1");
    assert!(read(e, 4096, p, base, key) == zeros);
    trig.add(1).unwrap();
    added.wait(5, 10_000).expect("the counter add at 2");
    assert_quiet(e, Duration::from_millis(50));
    assert_eq!((added.read(), done.read()), (5, 0), "only the add at 2");
    assert!(read(e, 4096, p, base, key) == zeros, "no write before 3");
    trig.add(1).unwrap();
    done.wait(1, 10_000).expect("the write at 3");
    assert_eq!(added.read(), 5);
    assert!(read(e, 4096, p, base, key) == data, "the deferred write");
    ctl.tell("written");
}

fn deferred_target(e: &End, _: FiAddr, ctl: &mut Ctl) {
    let win = vec![0u8; 4096];
    let mr = window(e, &win, ctl);
    ctl.expect("written");
    assert!(snapshot(&win) == pattern(4096, 3));
    drop(mr);
}

// ---- 7. XPU-triggered send ------------------------------------------------------------------

fn xpu_sender(e: &End, p: FiAddr, ctl: &mut Ctl) {
    assert_eq!(e.ep.xpu_trigger_vars(Xpu::CPU, &mut []).unwrap(), 1);
    let buf = vec![0u8; 4096];
    let iov = [RawIov::of(&buf)];
    let mut v = [TriggerVar::default()];
    ctl.expect("posted");
    let m = tmsg(&iov, p, 5, 0, 0);
    // SAFETY: buf outlives the send (its completion is waited for below).
    let k = unsafe { e.ep.tsendmsg_xpu(&m, 0, Xpu::CPU, &mut v) };
    assert_eq!(k.expect("arm"), 1);
    ctl.tell("armed");
    ctl.expect("nothing yet");
    assert_quiet(e, Duration::from_millis(20));
    let (addr, var) = (buf.as_ptr() as usize, v[0]);
    // The XPU: a thread that stores the data, then rings.
    let xpu = std::thread::spawn(move || {
        let data = pattern(4096, 1);
        // SAFETY: the sender's buffer, alive until the send completes, read by nothing before
        // the ring.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, 4096) };
        // SAFETY: a variable the endpoint filled; its doorbell outlives this thread.
        unsafe { ring(&[var]) }.expect("ring");
    });
    xpu.join().unwrap();
    let c = e.wait_one();
    assert_eq!((c.op_context, c.flags), (5, FI_SEND | FI_TAGGED));
    tsend(e, b"the end!", p, 0, 6);
    assert_eq!(e.wait_one().op_context, 6);
    ctl.expect("once");
}

fn xpu_receiver(e: &End, p: FiAddr, ctl: &mut Ctl) {
    let (mut a, mut b) = (vec![0u8; 4096], [0u8; 8]);
    trecv(e, &mut a, p, 0, 1);
    trecv(e, &mut b, p, 0, 2);
    ctl.tell("posted");
    ctl.expect("armed");
    assert_quiet(e, Duration::from_millis(100));
    ctl.tell("nothing yet");
    let got = e.wait_n(2);
    assert_eq!((got[0].op_context, got[0].len), (1, 4096));
    holds(&a, 4096, 1); // the bytes the XPU stored before ringing
                        // The ring sent once: the next message is the plain one.
    assert_eq!((got[1].op_context, &b), (2, b"the end!"));
    ctl.tell("once");
}

// ---- 7b. Inject atomics, and progress across a domain's endpoints --------------------------

/// What an OpenSHMEM library does (Sandia OpenSHMEM over libfabric, manual progress, basic MR
/// mode): each process has a target endpoint whose CQ it reads while it waits, and initiator
/// endpoints in the same domain that it never reads while waiting. Here the parent's initiator
/// injects FI_SUMs (no completion) to the child, then the parent only reads its target
/// endpoint's CQ until the child's acknowledging atomic lands there: reading one endpoint's CQ
/// must progress the others of the domain (over tcp the initiator's connection finishes its
/// handshake only so), as libfabric's providers do. Then the fetching and compare kinds with
/// FI_INJECT, which covers their operand and compare buffers only.
#[test]
fn inject_atomics_progressed_by_another_endpoint_of_the_domain() {
    let basic = |i: &mut Info| {
        i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
    };
    let caps = FI_MSG | FI_ATOMIC;
    let i64s = |b: &[u8]| -> Vec<i64> {
        b.chunks(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    let dt = Datatype::Int64;
    if role().is_some() {
        let n = node_with(caps, Progress::Manual, basic);
        say(&hex(&n.ep.getname().unwrap()));
        let t = n.add_peer(&unhex(&listen()));
        let win = vec![0u8; 24];
        let _mr = window(&n, &win, &mut Ctl::Child);
        let (key, base) = remote(&mut Ctl::Child);
        let settle = |want: &[i64]| {
            let deadline = Instant::now() + BOUND;
            while i64s(&snapshot(&win)) != want {
                let mut e = [CqTaggedEntry::default(); 1];
                assert!(matches!(n.cq.read(&mut e), Err(Error::Again(_))));
                assert!(
                    Instant::now() < deadline,
                    "the child's words are {:?}, not {want:?}",
                    i64s(&snapshot(&win))
                );
            }
        };
        settle(&[7 + 35, 0, 0]);
        // The acknowledgement, into the parent's target endpoint.
        assert_eq!(amo(&n, AtomicOp::Sum, 1, 0, t, base, key), 0);
        settle(&[7 + 35, 1, 9]);
        say("landed");
        assert_eq!(listen(), "bye");
        return;
    }
    let test = "inject_atomics_progressed_by_another_endpoint_of_the_domain";
    let mut child = spawn(test, "target", &[]);
    // The target endpoint: a node of its own; the initiator: a second endpoint of its domain.
    let tn = node_with(caps, Progress::Manual, basic);
    let cq = tn
        .domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            ..Default::default()
        })
        .unwrap();
    let ep = tn.domain.endpoint(&tn.info).unwrap();
    let put = tn.domain.cntr_open(&CntrAttr::default()).unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&tn.av).unwrap();
    ep.bind_cntr(&put, FI_WRITE | FI_READ).unwrap();
    ep.enable().unwrap();
    let p = tn.add_peer(&unhex(&child.hear()));
    child.tell(&hex(&tn.ep.getname().unwrap()));
    let (key, base) = remote(&mut Ctl::Parent(&mut child));
    let win = vec![0u8; 8];
    let _mr = window(&tn, &win, &mut Ctl::Parent(&mut child));
    let again = |f: &mut dyn FnMut() -> Result<()>| loop {
        match f() {
            Err(Error::Again(_)) => {
                ep.progress();
            }
            r => break r.unwrap(),
        }
    };
    for x in [7i64, 35] {
        let x = x.to_ne_bytes();
        again(&mut || ep.inject_atomic(&x, 1, p, base, key, dt, AtomicOp::Sum));
    }
    let deadline = Instant::now() + BOUND;
    while i64s(&snapshot(&win)) != [1] {
        let mut e = [CqTaggedEntry::default(); 1];
        assert!(matches!(tn.cq.read(&mut e), Err(Error::Again(_))));
        assert!(
            Instant::now() < deadline,
            "no acknowledgement: the injects never reached the child"
        );
    }
    let mut old = [[0xffu8; 8]; 2];
    let m = MsgAtomic::new(p, base + 8, key, dt, AtomicOp::Sum, 1);
    {
        let operand = 1i64.to_ne_bytes();
        // SAFETY: the result outlives the completion awaited below; the operand only the call.
        again(&mut || unsafe { ep.fetch_atomicmsg(&m, &operand, &mut old[0], 1, FI_INJECT) });
    }
    let m = MsgAtomic::new(p, base + 16, key, dt, AtomicOp::Cswap, 2);
    {
        let (operand, compare) = (9i64.to_ne_bytes(), 0i64.to_ne_bytes());
        // SAFETY: as above.
        again(&mut || unsafe {
            ep.compare_atomicmsg(&m, &operand, &compare, &mut old[1], 1, FI_INJECT)
        });
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + BOUND;
    while got.len() < 2 {
        let mut e = [CqTaggedEntry::default(); 2];
        match cq.read(&mut e) {
            Ok(k) => got.extend(e[..k].iter().map(|c| (c.op_context, c.flags))),
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e}"),
        }
        assert!(Instant::now() < deadline, "completions: {got:?}");
    }
    assert_eq!(got, [(1, FI_ATOMIC | FI_READ), (2, FI_ATOMIC | FI_READ)]);
    assert_eq!(old, [0i64.to_ne_bytes(); 2], "the fetched originals");
    assert_eq!(
        put.read(),
        4,
        "two injects and two fetching atomics counted"
    );
    assert_eq!(child.hear(), "landed");
    child.tell("bye");
    child.join();
    drop(ep);
}

// ---- 8. Peer killed mid-transfer ------------------------------------------------------------

#[test]
fn peer_killed_mid_transfer_fails_every_operation() {
    let caps = FI_MSG | FI_TAGGED | FI_RMA | FI_DIRECTED_RECV;
    if role().is_some() {
        // Never progresses: the parent's sends and reads stay outstanding until the kill.
        let e = end(caps, Progress::Manual);
        connect_parent(&e);
        let win = vec![0u8; M];
        let _mr = window(&e, &win, &mut Ctl::Child);
        listen();
        unreachable!("this child is killed");
    }
    let t = "peer_killed_mid_transfer_fails_every_operation";
    let mut child = spawn(t, "idle", &[]);
    let e = end(caps, Progress::Manual);
    let p = connect(&mut child, &e);
    let (key, base) = remote(&mut Ctl::Parent(&mut child));
    let data = pattern(M, 1);
    let mut reads = vec![vec![0u8; M]; 2];
    let mut rbuf = vec![0u8; 64];
    for i in 0..4 {
        send(&e, &data, p, 100 + i);
    }
    for (i, r) in reads.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the error completions read below.
        unsafe { e.ep.read(r, None, p, base, key, 200 + i) }.unwrap();
    }
    trecv(&e, &mut rbuf, p, 9, 300);
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

// ---- The suite ------------------------------------------------------------------------------

/// One test per line: name, capabilities asked for at both ends, parent half, child half.
macro_rules! suite {
    ($($name:ident: $caps:expr, $parent:expr, $child:expr;)*) => {$(
        #[test]
        fn $name() {
            two(stringify!($name), $caps, $parent, $child);
        }
    )*};
}

suite! {
    messages_every_size_both_directions: FI_MSG | FI_TAGGED | FI_SOURCE,
        |e, p, ctl| { send_sizes(e, p, ctl); recv_sizes(e, p, ctl) },
        |e, p, ctl| { recv_sizes(e, p, ctl); send_sizes(e, p, ctl) };
    message_truncation_reports_overflow: FI_MSG | FI_TAGGED, trunc_receiver, trunc_sender;
    tagged_out_of_order_and_ignore_bits: FI_MSG | FI_TAGGED | FI_SOURCE, tag_receiver,
        |e, p, ctl| {
            ctl.expect("posted");
            tsend_all(e, p, &WILD, ctl, "wild sent");
            tsend_all(e, p, &LATE, ctl, "late sent")
        };
    tagged_peek_claim_discard_small_and_large: FI_MSG | FI_TAGGED, peek_receiver,
        |e, p, ctl| {
            ctl.expect("go");
            tsend_all(e, p, &peeks(), ctl, "sent");
            ctl.tell("completed")
        };
    tagged_directed_receive_takes_only_its_source:
        DIRECTED, directed_receiver, directed_senders;
    multi_recv_buffer_takes_several_messages: FI_MSG | FI_MULTI_RECV, multi_receiver, multi_sender;
    rma_write_read_writedata_access_and_fence:
        FI_MSG | FI_RMA | FI_RMA_EVENT, rma_initiator, rma_target;
    atomics_fetch_add_compare_swap_and_read: FI_MSG | FI_ATOMIC,
        |e, p, ctl| atomics_side(e, p, ctl, 1, 1000),
        |e, p, ctl| atomics_side(e, p, ctl, 1000, 1);
    delivery_and_match_complete: FI_MSG | FI_TAGGED, levels_receiver, levels_sender;
    triggered_sends_chained_by_the_send_counter: FI_MSG | FI_TRIGGER, chain_sender, chain_receiver;
    deferred_work_counter_add_and_rma_write:
        FI_MSG | FI_RMA | FI_TRIGGER, deferred_initiator, deferred_target;
    xpu_triggered_send_with_a_cpu_xpu:
        FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER, xpu_sender, xpu_receiver;
}
