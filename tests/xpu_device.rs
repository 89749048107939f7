//! The device API (`FI_XPU`, core/src/xpu) across two real processes, with CPU threads as the
//! XPUs: they choose sizes, peers and tags at run time and post through exported endpoints
//! (`xpu::device::send`...), read exported CQs and wait on exported counters, while the
//! host only drives progress. Written once for every provider: shm by default, tcp through
//! `XFABRIC_TEST_PROVIDER=tcp` (scripts/test.sh), verbs in the Soft-RoCE VM
//! (scripts/test-verbs-vm.sh, with `XFABRIC_XPU_TEST_N=8000`: emulated, it is slow).

mod common;
use std::ffi::c_void;
use std::sync::Arc;

use common::*;
use xfabric::xpu::abi::opcode;
use xfabric::xpu::device as dev;
use xfabric::xpu::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_TRIGGER | FI_XPU_TRIGGER;
const W: i32 = FI_XPU_WORK_ITEM;
const EAGAIN: i32 = -(errno::FI_EAGAIN);

fn xnode(progress: Progress) -> Node {
    node_with(CAPS, progress, |i| {
        i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    })
}

/// Registers `buf` with `access` and exports it to the XPU: (region, its XPU descriptor).
fn xreg(n: &Node, buf: &[u8], access: u64) -> (MemoryRegion, u64) {
    // SAFETY: each test keeps its buffers alive past their regions (dropped first).
    let mr = unsafe { n.domain.mr_reg(buf, access, 0, 0) }.expect("mr_reg");
    let desc = mr.get_xpu_desc().expect("get_xpu_desc");
    (mr, desc)
}

/// Posts until the ring takes it (a CPU XPU's retry on `-FI_EAGAIN`), bounded by
/// `completion_bound`.
fn until_taken(mut post: impl FnMut() -> i32) {
    let deadline = std::time::Instant::now() + completion_bound();
    loop {
        match post() {
            0 => return,
            EAGAIN => std::thread::yield_now(),
            e => panic!("device call: {e}"),
        }
        assert!(std::time::Instant::now() < deadline, "the ring stayed full");
    }
}

/// Drives `n` until `t` ends (its XPU thread), then joins it.
fn drive_until<T>(n: &Node, t: std::thread::JoinHandle<T>) -> T {
    let deadline = std::time::Instant::now() + completion_bound();
    while !t.is_finished() {
        n.ep.progress();
        assert!(
            std::time::Instant::now() < deadline,
            "XPU thread still running"
        );
    }
    t.join().expect("XPU thread")
}

/// A thread reading the parent's next line while this process drives progress.
fn listen_in_background() -> std::thread::JoinHandle<String> {
    std::thread::spawn(listen)
}

fn tag_of(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9) ^ 0x55
}

const N: usize = 2000;
const LEN: usize = 64;

/// Receiver of the send test: untagged receives for odd messages in order, tagged ones for
/// even messages posted in reverse (only the tags the XPU chose match them).
fn sends_rx(progress: Progress) {
    let n = xnode(progress);
    let peer = connect_parent(&n);
    let mut bufs: Vec<Vec<u8>> = (0..N).map(|_| vec![0u8; LEN]).collect();
    let ptrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    for i in (0..N).filter(|i| i % 2 == 1) {
        // SAFETY: `bufs` outlives every receive (all complete below).
        let b = unsafe { std::slice::from_raw_parts_mut(ptrs[i] as *mut u8, LEN) };
        n.retry(|| unsafe { n.ep.recv(&mut *b, None, peer, i) });
    }
    for i in (0..N).filter(|i| i % 2 == 0).rev() {
        // SAFETY: as above.
        let b = unsafe { std::slice::from_raw_parts_mut(ptrs[i] as *mut u8, LEN) };
        n.retry(|| unsafe { n.ep.trecv(&mut *b, None, peer, tag_of(i), 0, i) });
    }
    say("ready");
    let got = n.wait_n(N);
    for e in &got {
        let i = e.op_context;
        if i % 2 == 0 {
            assert_eq!(e.tag, tag_of(i), "tag of message {i}");
        }
        assert!(bufs[i] == pattern(LEN, i as u64), "bytes of message {i}");
    }
    say("ok");
}

fn sends(test: &str, progress: Progress) {
    if role().is_some() {
        return sends_rx(progress);
    }
    let mut peer = spawn(test, "rx", &[]);
    let n = xnode(progress);
    let to = connect(&mut peer, &n);
    let x = n.ep.export_xpu(Xpu::CPU).expect("export ep");
    let dest = n.av.get_xpu_addr(to).expect("xpu addr");
    let data = vec![0u8; N * LEN];
    let (mr, desc) = xreg(&n, &data, FI_SEND);
    assert_eq!(peer.hear(), "ready");
    let base = data.as_ptr() as usize;
    let xpu = std::thread::spawn(move || {
        for i in 0..N {
            let slot = base + i * LEN;
            let bytes = pattern(LEN, i as u64);
            // SAFETY: slot i of `data`, alive until every send completed; nothing reads it
            // before the descriptor that names it is published below.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot as *mut u8, LEN) };
            let buf = slot as *const c_void;
            until_taken(|| {
                if i % 2 == 0 {
                    dev::tsend(&x, buf, LEN, desc, 0, dest, tag_of(i), i, 0, W)
                } else {
                    dev::send(&x, buf, LEN, desc, 0, dest, i, 0, W)
                }
            });
            if i % 100 == 99 {
                assert_eq!(dev::tx_flush(&x, 0, W), 0);
            }
        }
    });
    let done = n.wait_n(N);
    xpu.join().unwrap();
    let mut ctxs: Vec<usize> = done.iter().map(|e| e.op_context).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..N).collect::<Vec<_>>(), "each send completed once");
    assert_eq!(peer.hear(), "ok");
    peer.join();
    drop(mr);
}

#[test]
fn xpu_sends_and_tagged_sends_with_tags_chosen_at_run_time() {
    sends(
        "xpu_sends_and_tagged_sends_with_tags_chosen_at_run_time",
        Progress::Manual,
    );
}

#[test]
fn xpu_sends_under_auto_progress() {
    sends("xpu_sends_under_auto_progress", Progress::Auto);
}

const RN: usize = 500;

fn recvs_tx() {
    let n = xnode(Progress::Manual);
    let peer = connect_parent(&n);
    let data: Vec<Vec<u8>> = (0..RN).map(|i| pattern(LEN, 1000 + i as u64)).collect();
    for (i, d) in data.iter().enumerate() {
        // SAFETY: `data` outlives the sends (completions waited for).
        n.retry(|| unsafe { n.ep.tsend(d, None, peer, tag_of(i), i) });
    }
    n.wait_n(RN);
    say("sent");
    assert_eq!(listen(), "bye");
}

/// The XPU posts every receive (tags of its choosing) and reads their completions from the
/// exported CQ, whose ring holds far fewer than arrive: the rest wait in the host CQ.
#[test]
fn xpu_posts_receives_and_reads_them_from_its_cq() {
    if role().is_some() {
        return recvs_tx();
    }
    let mut peer = spawn("xpu_posts_receives_and_reads_them_from_its_cq", "tx", &[]);
    let n = xnode(Progress::Manual);
    let from = connect(&mut peer, &n);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let q = n.cq.export_xpu_slots(Xpu::CPU, 16).unwrap();
    let src = n.av.get_xpu_addr(from).unwrap();
    let inbox = vec![0u8; RN * LEN];
    let (mr, desc) = xreg(&n, &inbox, FI_RECV);
    let base = inbox.as_ptr() as usize;
    let xpu = std::thread::spawn(move || {
        for i in (0..RN).rev() {
            let buf = (base + i * LEN) as *mut c_void;
            until_taken(|| dev::trecv(&x, buf, LEN, desc, src, tag_of(i), 0, i, 0, W));
        }
        let mut seen = vec![false; RN];
        let mut got = 0;
        let mut batch = [CqTaggedEntry::default(); 8];
        let mut srcs = [0u64; 8];
        while got < RN {
            match dev::cq_readfrom(&q, &mut batch, &mut srcs, W) {
                k if k > 0 => {
                    for (e, s) in batch[..k as usize].iter().zip(&srcs) {
                        let i = e.op_context;
                        assert!(!seen[i], "receive {i} completed twice");
                        seen[i] = true;
                        assert_eq!((e.tag, e.len), (tag_of(i), LEN));
                        assert!(e.flags & FI_RECV != 0);
                        assert!(*s == src || *s == FI_ADDR_NOTAVAIL);
                        // SAFETY: the receive completed: its slot of `inbox` is written.
                        let b = unsafe {
                            std::slice::from_raw_parts((base + i * LEN) as *const u8, LEN)
                        };
                        assert!(b == pattern(LEN, 1000 + i as u64), "bytes of {i}");
                    }
                    got += k as usize;
                }
                k if k == -(errno::FI_EAGAIN as isize) => std::thread::yield_now(),
                k => {
                    let mut e = CqErrEntry::default();
                    dev::cq_readerr(&q, &mut e, 0, W);
                    panic!("cq_read {k}: {e:?}");
                }
            }
        }
    });
    drive_until(&n, xpu);
    assert_eq!(peer.hear(), "sent");
    peer.tell("bye");
    peer.join();
    drop(mr);
}

const PN: usize = 1000;
const PW: usize = 48;

/// Target of the put-with-signal test: its XPU waits on the exported remote-write counter,
/// then checks every byte the writes placed; the host reads the remote CQ data.
fn put_target() {
    let mut counter = None;
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |i| i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY,
        4096,
        |d, ep| {
            let c = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&c, FI_REMOTE_WRITE).unwrap();
            counter = Some(c);
        },
    );
    let c = counter.expect("the remote-write counter");
    let peer = connect_parent(&n);
    let region = vec![0u8; PN * PW];
    // SAFETY: `region` outlives the registration.
    let mr = unsafe { n.domain.mr_reg(&region, FI_REMOTE_WRITE, 0, 0) }.unwrap();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    let base = region.as_ptr() as usize;
    let xpu = std::thread::spawn(move || {
        assert_eq!(dev::cntr_wait(&xc, PN as u64, 60_000, W), 0, "the signal");
        for i in 0..PN {
            // SAFETY: every write landed (the counter counts placed writes); `region` lives.
            let b = unsafe { std::slice::from_raw_parts((base + i * PW) as *const u8, PW) };
            assert!(b == pattern(PW, i as u64), "bytes of write {i}");
        }
        dev::cntr_read(&xc, W)
    });
    say(&format!("{} {}", base, mr.key()));
    let got = n.wait_n(PN);
    let mut data: Vec<u64> = got
        .iter()
        .inspect(|e| assert!(e.flags & FI_REMOTE_CQ_DATA != 0))
        .map(|e| e.data)
        .collect();
    data.sort_unstable();
    assert_eq!(data, (0..PN as u64).collect::<Vec<_>>());
    assert_eq!(drive_until(&n, xpu), PN as u64);
    let _ = peer;
    say("ok");
    assert_eq!(listen(), "bye");
}

#[test]
fn xpu_put_with_signal_that_the_peers_xpu_waits_on() {
    if role().is_some() {
        return put_target();
    }
    let mut peer = spawn(
        "xpu_put_with_signal_that_the_peers_xpu_waits_on",
        "target",
        &[],
    );
    let n = xnode(Progress::Manual);
    let to = connect(&mut peer, &n);
    let line = peer.hear();
    let mut it = line.split(' ').map(|v| v.parse::<u64>().unwrap());
    let (rbase, key) = (it.next().unwrap(), it.next().unwrap());
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let dest = n.av.get_xpu_addr(to).unwrap();
    let local = vec![0u8; PN * PW];
    let (mr, desc) = xreg(&n, &local, FI_WRITE);
    let base = local.as_ptr() as usize;
    let xpu = std::thread::spawn(move || {
        for i in 0..PN {
            let slot = base + i * PW;
            let bytes = pattern(PW, i as u64);
            // SAFETY: slot i of `local`, alive until every write completed.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot as *mut u8, PW) };
            let raddr = rbase + (i * PW) as u64;
            until_taken(|| {
                dev::write(
                    &x,
                    slot as *const c_void,
                    PW,
                    desc,
                    i as u64,
                    dest,
                    raddr,
                    key,
                    i,
                    FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE,
                    W,
                )
            });
        }
    });
    let done = n.wait_n(PN);
    xpu.join().unwrap();
    assert!(done
        .iter()
        .all(|e| e.flags & (FI_RMA | FI_WRITE) == FI_RMA | FI_WRITE));
    assert_eq!(peer.hear_progressing(&n), "ok");
    peer.tell("bye");
    peer.join();
    drop(mr);
}

const RD: usize = 64;
const AM: usize = 200;

fn rma_target() {
    let n = xnode(Progress::Manual);
    let _peer = connect_parent(&n);
    let mut region = pattern(RD * 16, 77);
    region.extend_from_slice(&[0u8; 24]);
    // SAFETY: `region` outlives the registration.
    let mr = unsafe {
        n.domain
            .mr_reg(&region, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0)
    }
    .unwrap();
    say(&format!("{} {}", region.as_ptr() as usize, mr.key()));
    let done = listen_in_background();
    while !done.is_finished() {
        n.ep.progress();
    }
    assert_eq!(done.join().unwrap(), "done");
    let word = |k: usize| {
        let at = RD * 16 + k * 8;
        u64::from_le_bytes(region[at..at + 8].try_into().unwrap())
    };
    assert_eq!((word(0), word(1), word(2)), (AM as u64 * 3, AM as u64, 42));
    say("ok");
}

/// Reads, atomics, fetching atomics and a compare-and-swap, all posted by the XPU.
#[test]
fn xpu_reads_and_atomics() {
    if role().is_some() {
        return rma_target();
    }
    let mut peer = spawn("xpu_reads_and_atomics", "target", &[]);
    let n = xnode(Progress::Manual);
    let to = connect(&mut peer, &n);
    let line = peer.hear();
    let mut it = line.split(' ').map(|v| v.parse::<u64>().unwrap());
    let (rbase, key) = (it.next().unwrap(), it.next().unwrap());
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let dest = n.av.get_xpu_addr(to).unwrap();
    let into = vec![0u8; RD * 16];
    let operands: Vec<u8> = [3u64, 1, 0, 42]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let results = vec![0u8; (AM + 1) * 8];
    let (m1, d_into) = xreg(&n, &into, FI_READ);
    let (m2, d_ops) = xreg(&n, &operands, FI_WRITE);
    let (m3, d_res) = xreg(&n, &results, FI_READ);
    let (ib, ob, rb) = (
        into.as_ptr() as usize,
        operands.as_ptr() as usize,
        results.as_ptr() as usize,
    );
    let (u64t, sum, cswap) = (
        Datatype::UInt64 as i32,
        AtomicOp::Sum as i32,
        AtomicOp::Cswap as i32,
    );
    let words = rbase + (RD * 16) as u64;
    let total = 16 + 2 * AM + 1;
    let xpu = std::thread::spawn(move || {
        let mut ctx = 0;
        for k in 0..16 {
            let buf = (ib + k * RD) as *mut c_void;
            let raddr = rbase + (k * RD) as u64;
            until_taken(|| dev::read(&x, buf, RD, d_into, dest, raddr, key, ctx, 0, W));
            ctx += 1;
        }
        for k in 0..AM {
            let op = ob as *const c_void;
            until_taken(|| dev::atomic(&x, op, 1, d_ops, dest, words, key, u64t, sum, ctx, 0, W));
            ctx += 1;
            let one = (ob + 8) as *const c_void;
            let res = (rb + k * 8) as *mut c_void;
            until_taken(|| {
                dev::fetch_atomic(
                    &x,
                    one,
                    1,
                    d_ops,
                    res,
                    d_res,
                    dest,
                    words + 8,
                    key,
                    u64t,
                    sum,
                    ctx,
                    0,
                    W,
                )
            });
            ctx += 1;
        }
        let (cmp, swap) = ((ob + 16) as *const c_void, (ob + 24) as *const c_void);
        let res = (rb + AM * 8) as *mut c_void;
        until_taken(|| {
            dev::compare_atomic(
                &x,
                swap,
                1,
                d_ops,
                cmp,
                d_ops,
                res,
                d_res,
                dest,
                words + 16,
                key,
                u64t,
                cswap,
                ctx,
                0,
                W,
            )
        });
    });
    let done = n.wait_n(total);
    xpu.join().unwrap();
    assert_eq!(done.len(), total);
    assert!(into == pattern(RD * 16, 77), "read bytes");
    let mut fetched: Vec<u64> = (0..AM)
        .map(|k| u64::from_le_bytes(results[k * 8..k * 8 + 8].try_into().unwrap()))
        .collect();
    fetched.sort_unstable();
    assert_eq!(
        fetched,
        (0..AM as u64).collect::<Vec<_>>(),
        "each fetch saw a distinct value"
    );
    assert_eq!(
        u64::from_le_bytes(results[AM * 8..].try_into().unwrap()),
        0,
        "compare found 0"
    );
    peer.tell("done");
    assert_eq!(peer.hear(), "ok");
    peer.join();
    drop((m1, m2, m3));
}

/// Messages each of the four XPU threads sends: `XFABRIC_XPU_TEST_N` in all (100,000 by
/// default, a few seconds in a debug build; the ignored test below runs 1,000,000).
fn total() -> usize {
    std::env::var("XFABRIC_XPU_TEST_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

const THREADS: usize = 4;
/// Receives each tag keeps posted.
const WINDOW: usize = 256;

fn many_rx(per: usize) {
    let n = xnode(Progress::Manual);
    let peer = connect_parent(&n);
    let mut slots = vec![0u8; THREADS * WINDOW * 8];
    let base = slots.as_mut_ptr() as usize;
    let post = |t: usize, k: usize| {
        let at = base + (t * WINDOW + k % WINDOW) * 8;
        // SAFETY: the slot belongs to receive k of tag t alone until it completes.
        let b = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, 8) };
        n.retry(|| unsafe { n.ep.trecv(&mut *b, None, peer, t as u64, 0, (t << 32) | k) });
    };
    for t in 0..THREADS {
        for k in 0..WINDOW.min(per) {
            post(t, k);
        }
    }
    say("ready");
    let mut got = 0;
    let mut buf = [CqTaggedEntry::default(); 64];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while got < THREADS * per {
        match n.cq.read(&mut buf) {
            Ok(k) => {
                for e in &buf[..k] {
                    let (t, k) = (e.op_context >> 32, e.op_context & 0xffff_ffff);
                    assert_eq!(e.tag, t as u64);
                    let at = (t * WINDOW + k % WINDOW) * 8;
                    let i = u64::from_le_bytes(slots[at..at + 8].try_into().unwrap());
                    // Receive k of tag t holds message k of thread t: each thread's order kept.
                    assert_eq!(i, k as u64, "thread {t}'s message order");
                    if k + WINDOW < per {
                        post(t, k + WINDOW);
                    }
                }
                got += k;
            }
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e} {:?}", n.cq.readerr()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{got} of {}",
            THREADS * per
        );
    }
    say("ok");
}

fn many(test: &str, all: usize) {
    let per = all / THREADS;
    if role().is_some() {
        return many_rx(per);
    }
    let env = all.to_string();
    let mut peer = spawn(test, "rx", &[("XFABRIC_XPU_TEST_N", &env)]);
    let n = xnode(Progress::Manual);
    let to = connect(&mut peer, &n);
    let x = Arc::new(n.ep.export_xpu(Xpu::CPU).unwrap());
    let dest = n.av.get_xpu_addr(to).unwrap();
    let data = vec![0u8; THREADS * per * 8];
    let (mr, desc) = xreg(&n, &data, FI_SEND);
    let base = data.as_ptr() as usize;
    assert_eq!(peer.hear(), "ready");
    let xpus: Vec<_> = (0..THREADS)
        .map(|t| {
            let x = x.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    let slot = base + (t * per + i) * 8;
                    // SAFETY: this thread's slot i, read by nothing before its send.
                    unsafe { std::ptr::write(slot as *mut u64, i as u64) };
                    let buf = slot as *const c_void;
                    until_taken(|| {
                        dev::tsend(&x, buf, 8, desc, 0, dest, t as u64, (t << 32) | i, 0, W)
                    });
                }
            })
        })
        .collect();
    let mut got = 0;
    let mut buf = [CqTaggedEntry::default(); 64];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while got < THREADS * per {
        match n.cq.read(&mut buf) {
            Ok(k) => got += k,
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e} {:?}", n.cq.readerr()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{got} of {}",
            THREADS * per
        );
    }
    for t in xpus {
        t.join().unwrap();
    }
    assert_eq!(peer.hear(), "ok");
    peer.join();
    drop(mr);
}

#[test]
fn four_xpu_threads_keep_each_threads_order() {
    many("four_xpu_threads_keep_each_threads_order", total());
}

#[test]
#[ignore = "1,000,000 descriptors: about 35 s in a debug build over shm (cargo test --test xpu_device -- --ignored)"]
fn four_xpu_threads_a_million_descriptors() {
    many("four_xpu_threads_a_million_descriptors", 1_000_000);
}

fn hostile_rx() {
    let n = xnode(Progress::Manual);
    let peer = connect_parent(&n);
    let mut inbox = vec![[0u8; 8]; 9];
    let base = inbox.as_mut_ptr() as usize;
    for i in 0..9 {
        // SAFETY: `inbox` outlives the receives (all complete below).
        let b = unsafe { std::slice::from_raw_parts_mut((base + i * 8) as *mut u8, 8) };
        n.retry(|| unsafe { n.ep.recv(&mut *b, None, peer, i) });
    }
    say("ready");
    let got = n.wait_n(9);
    let mut ctxs: Vec<_> = got.iter().map(|e| e.op_context).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..9).collect::<Vec<_>>());
    for (i, m) in inbox.iter().enumerate().take(8) {
        assert_eq!(m, format!("good{i:04}").as_bytes(), "message {i}");
    }
    // Had a hostile descriptor started, its bytes would have come before this one.
    assert_eq!(&inbox[8], b"goodlast");
    say("ok");
}

/// A full ring answers again, then drains; every kind of hostile descriptor is an error
/// completion naming its fault while nothing of it reaches the peer; an XPU thread that dies
/// mid-descriptor holds back what follows it, and closing reports each canceled.
#[test]
fn hostile_descriptors_full_ring_dead_xpu_and_close() {
    if role().is_some() {
        return hostile_rx();
    }
    let mut peer = spawn(
        "hostile_descriptors_full_ring_dead_xpu_and_close",
        "rx",
        &[],
    );
    let n = xnode(Progress::Manual);
    let to = connect(&mut peer, &n);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 8).unwrap();
    let dest = n.av.get_xpu_addr(to).unwrap();
    let mut good = Vec::new();
    for i in 0..8 {
        good.extend_from_slice(format!("good{i:04}").as_bytes());
    }
    good.extend_from_slice(b"goodlast");
    let evil = b"EVILEVILEVILEVIL".to_vec();
    let (mg, dg) = xreg(&n, &good, FI_SEND);
    let (me, de) = xreg(&n, &evil, FI_SEND);
    // SAFETY: `evil` outlives the region; never exported to the XPU.
    let hidden = unsafe { n.domain.mr_reg(&evil, FI_SEND, 0, 0) }.unwrap();
    assert_eq!(peer.hear(), "ready");
    // Under manual progress nothing drains the ring until this thread drives the endpoint:
    // eight descriptors fill it, the ninth is told again.
    let g = |i: usize| (good.as_ptr() as usize + i * 8) as *const c_void;
    for i in 0..8 {
        assert_eq!(dev::send(&x, g(i), 8, dg, 0, dest, i, 0, W), 0);
    }
    assert_eq!(dev::send(&x, g(8), 8, dg, 0, dest, 8, 0, W), EAGAIN);
    let first = n.wait_n(8);
    assert_eq!(first.len(), 8);
    let e = evil.as_ptr() as u64;
    let base = XpuDesc {
        opcode: opcode::SEND,
        len: 8,
        buf: e,
        desc: de,
        peer: dest,
        ..Default::default()
    };
    let hostile = [
        (
            XpuDesc {
                opcode: 4242,
                context: 101,
                ..base
            },
            XPU_FAULT_OPCODE,
        ),
        (
            XpuDesc {
                peer: dest + 1000,
                context: 102,
                ..base
            },
            XPU_FAULT_ADDR,
        ),
        (
            XpuDesc {
                desc: hidden.key(),
                context: 103,
                ..base
            },
            XPU_FAULT_DESC,
        ),
        (
            XpuDesc {
                len: 17,
                context: 104,
                ..base
            },
            XPU_FAULT_RANGE,
        ),
        (
            XpuDesc {
                flags: FI_INJECT,
                context: 105,
                ..base
            },
            XPU_FAULT_FLAGS,
        ),
        (
            XpuDesc {
                opcode: opcode::ATOMIC,
                datatype: 1234,
                context: 106,
                ..base
            },
            XPU_FAULT_ARGS,
        ),
    ];
    for (d, _) in &hostile {
        assert_eq!(dev::post_raw(&x, d), 0);
    }
    let torn = dev::claim(&x).unwrap();
    torn.write(&XpuDesc {
        context: 107,
        ..base
    });
    torn.store_word(2, u64::MAX);
    torn.publish();
    assert_eq!(dev::send(&x, g(8), 8, dg, 0, dest, 8, 0, W), 0);
    for (d, code) in &hostile {
        match n.next() {
            Completion::Err(err, why) => {
                let why = String::from_utf8_lossy(&why.unwrap_or_default()).into_owned();
                assert_eq!(
                    (err.op_context as u64, err.prov_errno),
                    (d.context, *code),
                    "{why}"
                );
                assert!(!why.is_empty());
            }
            other => panic!("expected the error of {}: {other:?}", d.context),
        }
    }
    match n.next() {
        Completion::Err(err, _) => {
            assert_eq!((err.op_context, err.prov_errno), (0, XPU_FAULT_TORN))
        }
        other => panic!("expected the torn slot's error: {other:?}"),
    }
    match n.next() {
        Completion::Ok(e, _) => assert_eq!(e.op_context, 8),
        other => panic!("expected the last good send: {other:?}"),
    }
    assert_eq!(peer.hear_progressing(&n), "ok");
    // An XPU thread that dies after claiming a slot and writing half of it.
    let dead = std::thread::scope(|s| {
        s.spawn(|| {
            let c = dev::claim(&x).unwrap();
            c.store_word(1, u64::from(opcode::SEND));
            c.position()
        })
        .join()
        .unwrap()
    });
    assert_eq!(dev::send(&x, g(0), 8, dg, 0, dest, 200, 0, W), 0);
    assert_eq!(dev::send(&x, g(1), 8, dg, 0, dest, 201, 0, W), 0);
    for _ in 0..100 {
        n.ep.progress();
    }
    let Node { ep, cq, .. } = n;
    ep.close().unwrap();
    let mut canceled = Vec::new();
    while let Ok((e, why)) = cq.readerr_data() {
        canceled.push((e.op_context, e.err, e.prov_errno));
        if e.prov_errno == XPU_FAULT_UNPUBLISHED {
            let why = String::from_utf8_lossy(&why.unwrap_or_default()).into_owned();
            assert!(why.contains(&format!("position {dead}")), "{why}");
        }
    }
    assert_eq!(
        canceled,
        vec![
            (0, errno::FI_ECANCELED, XPU_FAULT_UNPUBLISHED),
            (200, errno::FI_ECANCELED, errno::FI_ECANCELED),
            (201, errno::FI_ECANCELED, errno::FI_ECANCELED),
        ]
    );
    let mut none = [CqTaggedEntry::default(); 1];
    assert!(
        cq.read(&mut none).is_err(),
        "nothing past the dead slot completed"
    );
    assert_eq!(
        dev::send(&x, g(0), 8, dg, 0, dest, 300, 0, W),
        -(errno::FI_ESHUTDOWN)
    );
    peer.join();
    drop((mg, me, hidden));
}

/// A CPU XPU's `fi_xpu_cntr_add` is announced, as its `tx_flush` is: applied by the time the
/// call returns (by its own thread, or a watcher already looking), not when a watcher next
/// looks by time, which after a quiet is its poll interval later (8 ms). Nothing here drives
/// progress.
#[test]
fn a_cpu_xpus_counter_add_is_applied_without_a_watchers_look() {
    let n = xnode(Progress::Manual);
    let _x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let c = n.domain.cntr_open(&Default::default()).unwrap();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(dev::cntr_add(&xc, 3, W), 0);
    let deadline = std::time::Instant::now() + completion_bound();
    while c.read() != 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the add waited for a watcher"
        );
        std::thread::yield_now();
    }
    assert_eq!(dev::cntr_read(&xc, W), 3);
}

/// A close judges each CQ's room on its own: the sends left in the ring end `FI_ECANCELED`,
/// each under its own context, on the transmit CQ, though the receive CQ's error entries are
/// full (two faulty receives). Before, that full receive CQ folded all of them into one entry
/// without a context, and an application waiting on those contexts waited for good.
#[test]
fn sends_left_at_close_are_canceled_one_by_one_beside_a_full_receive_cq() {
    let (info, domain) = manual_domain(CAPS, |_| {});
    let cq = |size| {
        domain
            .cq_open(&CqAttr {
                format: CqFormat::Tagged,
                size,
                ..Default::default()
            })
            .unwrap()
    };
    let (tx, rx) = (cq(64), cq(2));
    let av = domain.av_open(&AvAttr::default()).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    ep.bind_cq(&tx, FI_TRANSMIT).unwrap();
    ep.bind_cq(&rx, FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    let me = av.insert_one(&ep.getname().unwrap()).unwrap();
    let dest = av.get_xpu_addr(me).unwrap();
    let x = ep.export_xpu_slots(Xpu::CPU, 16).unwrap();
    let good = vec![7u8; 64];
    // SAFETY: `good` and `hidden_buf` outlive their regions (dropped first).
    let mr = unsafe { domain.mr_reg(&good, FI_SEND, 0, 0) }.unwrap();
    let dg = mr.get_xpu_desc().unwrap();
    let mut hidden_buf = vec![0u8; 64];
    let hidden = unsafe { domain.mr_reg(&hidden_buf, FI_RECV, 0, 0) }.unwrap();
    // Two receives naming a region never exported: two faults fill the receive CQ's errors.
    for i in 0..2 {
        let b = hidden_buf[i * 8..].as_mut_ptr().cast();
        assert_eq!(
            dev::recv(&x, b, 8, hidden.key(), FI_ADDR_UNSPEC, 200 + i, 0, W),
            0
        );
    }
    for _ in 0..16 {
        ep.progress();
    }
    // Five good sends: the ring is not drained while a CQ's errors are full.
    for i in 0..5 {
        let b = good[i * 8..].as_ptr().cast();
        assert_eq!(dev::send(&x, b, 8, dg, 0, dest, 300 + i, 0, W), 0);
    }
    for _ in 0..16 {
        ep.progress();
    }
    ep.close().unwrap();
    let mut canceled = Vec::new();
    loop {
        match tx.read(&mut [CqTaggedEntry::default(); 8]) {
            Err(Error::Avail) => {
                let e = tx.readerr().unwrap();
                canceled.push((e.op_context, e.err));
            }
            Ok(k) => panic!("{k} sends completed: none should have started"),
            Err(_) => break,
        }
    }
    let want: Vec<_> = (300..305).map(|c| (c, errno::FI_ECANCELED)).collect();
    assert_eq!(canceled, want, "the transmit CQ's entries after close");
    drop((mr, hidden));
    drop((good, hidden_buf));
}

/// The first info of `test_provider()` for an RDM endpoint with `caps` under manual progress
/// and provider keys with virtual addresses, `adjust`ed, and a domain opened with it.
fn manual_domain(caps: u64, adjust: impl FnOnce(&mut Info)) -> (Info, Domain) {
    let mut hints = Info {
        caps,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(test_provider());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = Progress::Manual;
    hints.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    let mut info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).unwrap()[0].clone();
    adjust(&mut info);
    let domain = xfabric::fabric(&info.fabric_attr)
        .unwrap()
        .domain(&info)
        .unwrap();
    (info, domain)
}

/// An endpoint of receive size `rx` with `caps`, under manual progress, its CQ (1,024
/// entries) and AV, and its own address inserted.
struct Sized {
    info: Info,
    domain: Domain,
    cq: CompletionQueue,
    av: AddressVector,
    ep: Endpoint,
    me: FiAddr,
}

/// A tagged CQ of 1,024 entries.
fn cq1024() -> CqAttr {
    CqAttr {
        format: CqFormat::Tagged,
        size: 1024,
        ..Default::default()
    }
}

fn rx_sized(rx: usize, caps: u64) -> Sized {
    let (info, domain) = manual_domain(caps, |i| i.rx_attr.size = rx);
    let (cq, av, ep) = enabled_ep(&domain, &info, &cq1024());
    let me = av.insert_one(&ep.getname().unwrap()).unwrap();
    Sized {
        info,
        domain,
        cq,
        av,
        ep,
        me,
    }
}

/// An error entry: its context, errno, `prov_errno` and words.
type ErrEntry = (usize, i32, i32, String);

/// Drives `ep` and reads `cq` until `ok` completions and `errs` error entries came: the
/// completions' contexts, sorted, and the errors.
fn completions(
    ep: &Endpoint,
    cq: &CompletionQueue,
    ok: usize,
    errs: usize,
) -> (Vec<usize>, Vec<ErrEntry>) {
    let (mut done, mut faults) = (Vec::new(), Vec::new());
    let mut buf = [CqTaggedEntry::default(); 16];
    let deadline = std::time::Instant::now() + completion_bound();
    while done.len() < ok || faults.len() < errs {
        ep.progress();
        match cq.read(&mut buf) {
            Ok(k) => done.extend(buf[..k].iter().map(|e| e.op_context)),
            Err(Error::Avail) => {
                let (e, why) = cq.readerr_data().unwrap();
                let why = String::from_utf8_lossy(why.as_deref().unwrap_or_default());
                faults.push((e.op_context, e.err, e.prov_errno, why.into_owned()));
            }
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{done:?} completed and {faults:?} failed"
        );
    }
    done.sort_unstable();
    (done, faults)
}

/// Drives `ep` a while, then checks that `cq` holds nothing, neither entry nor error.
fn nothing_more(ep: &Endpoint, cq: &CompletionQueue) {
    for _ in 0..64 {
        ep.progress();
    }
    match cq.read(&mut [CqTaggedEntry::default(); 4]) {
        Err(Error::Again(_)) => {}
        Err(Error::Avail) => panic!("{:?}", cq.readerr_data()),
        other => panic!("{other:?}"),
    }
}

/// Receives XPUs' descriptors post are bounded by the receive context's size (`rx_attr.size`):
/// one found with that many waiting unmatched is answered with an `FI_EAGAIN` error entry
/// under its context (`XPU_FAULT_ROOM`), nothing posted, and the descriptors after it go on
/// (a descriptor held instead would hold back the device's later sends, its "ready" to a
/// peer among them). The application's own receives do not count against it, and room comes
/// back as messages take the device's. Before, the host queued every one: a device posting
/// receives in a loop grew the host's memory for as long as it ran.
#[test]
fn receives_a_device_posts_past_the_receive_size_are_answered_again() {
    const RX: usize = 16;
    const OVER: usize = 3;
    const HOST: usize = 4;
    let Sized {
        domain,
        cq,
        av,
        ep,
        me,
        ..
    } = rx_sized(RX, CAPS);
    let dest = av.get_xpu_addr(me).unwrap();
    let x = ep.export_xpu_slots(Xpu::CPU, 64).unwrap();
    let mut host = vec![0u8; 8 * HOST];
    for (i, b) in host.chunks_mut(8).enumerate() {
        // SAFETY: `host` outlives the endpoint, whose close ends the receives.
        unsafe { ep.recv(b, None, FI_ADDR_UNSPEC, 1000 + i) }.unwrap();
    }
    let rbuf = vec![0u8; 8 * 64];
    let sbuf = vec![7u8; 8];
    // SAFETY: the buffers outlive their regions (dropped first), and the receives end at the
    // close.
    let rmr = unsafe { domain.mr_reg(&rbuf, FI_RECV, 0, 0) }.unwrap();
    let smr = unsafe { domain.mr_reg(&sbuf, FI_SEND, 0, 0) }.unwrap();
    let (rdesc, sdesc) = (rmr.get_xpu_desc().unwrap(), smr.get_xpu_desc().unwrap());
    let post = |ctx: usize| {
        let b = (rbuf.as_ptr() as usize + (ctx % 64) * 8) as *mut c_void;
        assert_eq!(
            dev::recv(&x, b, 8, rdesc, FI_ADDR_UNSPEC, ctx, 0, W),
            0,
            "fi_xpu_recv {ctx}"
        );
    };
    for ctx in 0..RX + OVER {
        post(ctx);
    }
    // After the receives past the bound: a send, which must not wait behind them.
    assert_eq!(
        dev::send(&x, sbuf.as_ptr().cast(), 8, sdesc, 0, dest, 500, 0, W),
        0
    );
    // The send, and the host's first receive it landed in.
    let (done, faults) = completions(&ep, &cq, 2, OVER);
    assert_eq!(done, [500, 1000], "completions");
    let answered: Vec<_> = faults.iter().map(|f| (f.0, f.1, f.2)).collect();
    let want: Vec<_> = (RX..RX + OVER)
        .map(|c| (c, errno::FI_EAGAIN, XPU_FAULT_ROOM))
        .collect();
    assert_eq!(answered, want, "the receives past rx_attr.size: {faults:?}");
    assert!(faults[0].3.contains("rx_attr.size 16"), "{}", faults[0].3);
    // Ten messages past the host's receives take ten of the device's, and as many more go on.
    let inject = |n: usize| {
        for i in 0..n as u64 {
            ep.inject(&i.to_le_bytes(), me).unwrap();
        }
    };
    inject(HOST - 1 + 10);
    let (done, _) = completions(&ep, &cq, HOST - 1 + 10, 0);
    let want: Vec<_> = (0..10).chain(1001..1000 + HOST).collect();
    assert_eq!(done, want, "completions");
    for ctx in 100..110 {
        post(ctx);
    }
    nothing_more(&ep, &cq);
    // Posted behind the six left: messages reach them in order.
    inject(6 + 10);
    let (done, _) = completions(&ep, &cq, 6 + 10, 0);
    let want: Vec<_> = (10..RX).chain(100..110).collect();
    assert_eq!(done, want, "completions");
    ep.close().unwrap();
    drop((rmr, smr));
    drop((rbuf, sbuf, host));
}

/// An XPU ring on an endpoint of receive size 2 and 64 receive slots of 8 bytes, its two
/// receives posted (tag 7): the bound reached.
struct DeviceRx {
    x: XpuEp,
    /// Kept for its drop, before `buf`'s.
    _mr: MemoryRegion,
    buf: Vec<u8>,
    desc: u64,
}

impl DeviceRx {
    fn filled(domain: &Domain, ep: &Endpoint, cq: &CompletionQueue) -> DeviceRx {
        let x = ep.export_xpu_slots(Xpu::CPU, 64).unwrap();
        let buf = vec![0u8; 8 * 64];
        // SAFETY: `buf` outlives its region (`_mr` is dropped first); the receives end at the
        // close, before either.
        let mr = unsafe { domain.mr_reg(&buf, FI_RECV, 0, 0) }.unwrap();
        let desc = mr.get_xpu_desc().unwrap();
        let d = DeviceRx {
            x,
            _mr: mr,
            buf,
            desc,
        };
        d.trecv(FI_ADDR_UNSPEC, 1, 7);
        d.trecv(FI_ADDR_UNSPEC, 2, 7);
        nothing_more(ep, cq);
        d
    }

    /// Posts a tagged receive of 8 bytes from `src` into slot `ctx % 64`; the ring takes it.
    fn trecv(&self, src: u64, ctx: usize, tag: u64) {
        let b = (self.buf.as_ptr() as usize + (ctx % 64) * 8) as *mut c_void;
        assert_eq!(
            dev::trecv(&self.x, b, 8, self.desc, src, tag, 0, ctx, 0, W),
            0,
            "fi_xpu_trecv {ctx}"
        );
    }
}

/// At the bound, a device's receive that takes a message already buffered is posted, not
/// answered "again" (it frees what the host holds; refused, a device that cannot cancel its
/// waiting receives could wait for good on a peer that sends only once that message is
/// taken).
#[test]
fn a_device_receive_at_the_bound_that_takes_a_buffered_message_is_posted() {
    let Sized {
        domain, cq, ep, me, ..
    } = rx_sized(2, CAPS);
    let d = DeviceRx::filled(&domain, &ep, &cq);
    ep.tinject(&9u64.to_le_bytes(), me, 9).unwrap();
    nothing_more(&ep, &cq);
    d.trecv(FI_ADDR_UNSPEC, 3, 9);
    d.trecv(FI_ADDR_UNSPEC, 4, 8);
    let (done, faults) = completions(&ep, &cq, 1, 1);
    assert_eq!(done, [3], "the receive taking the buffered message");
    assert_eq!(
        (faults[0].0, faults[0].1, faults[0].2),
        (4, errno::FI_EAGAIN, XPU_FAULT_ROOM),
        "{faults:?}"
    );
    ep.tinject(&7u64.to_le_bytes(), me, 7).unwrap();
    ep.tinject(&7u64.to_le_bytes(), me, 7).unwrap();
    assert_eq!(completions(&ep, &cq, 2, 0).0, [1, 2]);
    ep.close().unwrap();
    drop(d);
}

/// The same with a directed receive for a message whose sender was not in the AV when it
/// came, inserted since: the message is that sender's (the check learns the AV's new
/// addresses first, as a post does), and the receive takes it.
#[test]
fn a_directed_device_receive_at_the_bound_takes_a_message_from_a_sender_inserted_since() {
    let Sized {
        info,
        domain,
        cq,
        av,
        ep,
        ..
    } = rx_sized(2, CAPS | FI_DIRECTED_RECV);
    // The sender: an endpoint of the same domain that knows the receiver; the receiver's
    // AV does not hold it yet.
    let (_scq, sav, sender) = enabled_ep(&domain, &info, &cq1024());
    let to_rx = sav.insert_one(&ep.getname().unwrap()).unwrap();
    let d = DeviceRx::filled(&domain, &ep, &cq);
    sender.tinject(&9u64.to_le_bytes(), to_rx, 9).unwrap();
    // Taken in and buffered, its source not yet an address of the receiver's.
    for _ in 0..64 {
        sender.progress();
        ep.progress();
    }
    nothing_more(&ep, &cq);
    let from = av.insert_one(&sender.getname().unwrap()).unwrap();
    let src = av.get_xpu_addr(from).unwrap();
    d.trecv(src, 3, 9);
    let (done, _) = completions(&ep, &cq, 1, 0);
    assert_eq!(
        done,
        [3],
        "the directed receive taking the buffered message"
    );
    ep.close().unwrap();
    sender.close().unwrap();
    drop(d);
}

/// A receive size of 0 is the provider's default (1,024), as for transmits: the device
/// keeps that many posted, and no more.
#[test]
fn a_receive_size_of_zero_bounds_device_receives_at_the_default() {
    const DEFAULT: usize = 1024;
    let Sized { domain, cq, ep, .. } = rx_sized(0, CAPS);
    let x = ep.export_xpu_slots(Xpu::CPU, 64).unwrap();
    let rbuf = vec![0u8; 8 * 64];
    // SAFETY: `rbuf` outlives its region (dropped first); the receives end at the close.
    let rmr = unsafe { domain.mr_reg(&rbuf, FI_RECV, 0, 0) }.unwrap();
    let rdesc = rmr.get_xpu_desc().unwrap();
    let base = rbuf.as_ptr() as usize;
    for ctx in 0..DEFAULT + 2 {
        let b = (base + (ctx % 64) * 8) as *mut c_void;
        until_taken(|| {
            ep.progress();
            dev::recv(&x, b, 8, rdesc, FI_ADDR_UNSPEC, ctx, 0, W)
        });
    }
    let (_, faults) = completions(&ep, &cq, 0, 2);
    let answered: Vec<_> = faults.iter().map(|f| (f.0, f.2)).collect();
    assert_eq!(
        answered,
        [(DEFAULT, XPU_FAULT_ROOM), (DEFAULT + 1, XPU_FAULT_ROOM)]
    );
    nothing_more(&ep, &cq);
    ep.close().unwrap();
    drop(x);
    drop(rmr);
    drop(rbuf);
}

/// Under manual progress a thread in `fi_wait` on a wait set is the watcher of what its
/// members drive: a descriptor the XPU stores as a GPU does (waking no one) while the thread
/// sleeps is taken by the wait's next look (it sleeps at most a millisecond at a time), and
/// the wait returns with its completions.
#[test]
fn a_wait_set_under_manual_progress_takes_descriptors_stored_while_it_sleeps() {
    let ws = WaitSet::open(&WaitAttr {
        wait_obj: WaitObj::MutexCond,
        flags: 0,
    })
    .unwrap();
    let (info, domain) = manual_domain(CAPS, |_| {});
    let (cq, av, ep) = enabled_ep(
        &domain,
        &info,
        &CqAttr {
            format: CqFormat::Tagged,
            wait_obj: WaitObj::Set,
            wait_set: Some(ws.clone()),
            ..Default::default()
        },
    );
    let me = av.insert_one(&ep.getname().unwrap()).unwrap();
    let dest = av.get_xpu_addr(me).unwrap();
    let x = ep.export_xpu(Xpu::CPU).unwrap();
    let sbuf = vec![5u8; 8];
    let mut rbuf = vec![0u8; 8];
    // SAFETY: the buffers outlive the region (dropped first) and the receive, which
    // completes before they are dropped.
    let mr = unsafe { domain.mr_reg(&sbuf, FI_SEND, 0, 0) }.unwrap();
    let desc = mr.get_xpu_desc().unwrap();
    unsafe { ep.recv(&mut rbuf, None, FI_ADDR_UNSPEC, 1) }.unwrap();
    // Nothing to take yet: the wait's first look finds the ring empty.
    assert!(matches!(ws.wait(0), Err(Error::TimedOut(_))));
    let base = sbuf.as_ptr() as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    let xpu = std::thread::spawn(move || {
        // Once the host is (most likely) asleep in the wait; sooner passes as well.
        rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: `base` is `sbuf`, alive until the send completed.
        assert_eq!(
            dev::send(&x, base as *const c_void, 8, desc, 0, dest, 2, 0, W),
            0
        );
        x
    });
    tx.send(()).unwrap();
    // Bounded, and far longer than the watcher's plan allows it to sleep.
    let r = ws.wait(completion_bound().as_millis() as i32);
    assert!(r.is_ok(), "fi_wait: {r:?}");
    let x = xpu.join().unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + completion_bound();
    while got.len() < 2 {
        let mut buf = [CqTaggedEntry::default(); 4];
        match cq.read(&mut buf) {
            Ok(k) => got.extend(buf[..k].iter().map(|e| e.op_context)),
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e} {:?}", cq.readerr()),
        }
        assert!(std::time::Instant::now() < deadline, "{got:?}");
    }
    got.sort_unstable();
    assert_eq!(got, [1, 2]);
    assert_eq!(rbuf, [5u8; 8]);
    drop(x);
    ep.close().unwrap();
    drop(mr);
}
