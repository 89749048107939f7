//! XPU-triggered operations across two real processes, with a CPU thread as the XPU: the
//! sender arms thousands of sends (or RMA writes with remote CQ data) up front; its XPU thread
//! fills each message's buffer and only then rings its trigger; the receiver checks every
//! byte, the order, and that nothing was lost or doubled. The buffers are zero until the XPU
//! fills them, so an operation that started before its trigger would carry zeros.

mod common;
use common::*;
use xfabric::kernels::cpu::ring;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_TRIGGER | FI_XPU_TRIGGER;
const N: usize = 3000;
const LEN: usize = 48;
/// Every `BIG_EVERY`-th message is large (through the rendezvous path).
const BIG_EVERY: usize = 500;
const BIG: usize = 100_000;

fn len_of(i: usize) -> usize {
    if i % BIG_EVERY == BIG_EVERY - 1 {
        BIG
    } else {
        LEN
    }
}

fn msg(iov: &[RawIov], addr: FiAddr, ctx: Context, tag: u64) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr,
        context: ctx,
        data: 0,
        tag,
        ignore: 0,
    }
}

/// The XPU's side: fills each buffer, then rings its variable, in posting order.
fn xpu_thread(bufs: Vec<(usize, usize)>, vars: Vec<TriggerVar>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for (i, ((addr, len), v)) in bufs.into_iter().zip(vars).enumerate() {
            let data = pattern(len, i as u64);
            // SAFETY: the buffer is the sender's, alive until every send completed, and
            // nothing reads it before this thread rings its trigger.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, len) };
            // SAFETY: a variable the endpoint filled for the CPU XPU; its doorbell lives as
            // long as the endpoint, which outlives this thread (joined first).
            unsafe { ring(&[v]) }.expect("ring");
        }
    })
}

/// Receiver of the message test: posts every receive, checks order and bytes, then one last
/// message proves nothing came twice.
fn receiver(progress: Progress) {
    let n = node(CAPS, progress);
    let peer = connect_parent(&n);
    let mut bufs: Vec<Vec<u8>> = (0..=N).map(|i| vec![0u8; len_of(i).max(8)]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let iov = [RawIov::of_mut(b)];
        // SAFETY: `bufs` outlives the receives (all completed below).
        n.retry(|| unsafe { n.ep.trecvmsg(&msg(&iov, peer, i, 0), 0) });
    }
    say("ready");
    // Every message has tag 0: receive i gets message i only if they were sent, and matched,
    // in posting order. (Completions may be reported out of order: a large message completes
    // when its data has landed, after smaller ones behind it.)
    let mut got = n.wait_n(N + 1);
    got.sort_by_key(|e| e.op_context);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.op_context, i, "each receive completed once");
        if i < N {
            assert_eq!(e.len, len_of(i));
            assert!(
                bufs[i] == pattern(len_of(i), i as u64),
                "bytes of message {i}"
            );
        } else {
            assert_eq!(
                &bufs[N][..8],
                b"the end!",
                "the last message is the plain one"
            );
        }
    }
    say("ok");
}

fn sends(test: &str, progress: Progress) {
    if role().is_some() {
        return receiver(progress);
    }
    let mut peer = spawn(test, "rx", &[]);
    let n = node(CAPS, progress);
    let to = connect(&mut peer, &n);
    assert_eq!(n.ep.xpu_trigger_vars(Xpu::CPU, &mut []).unwrap(), 1);
    let bufs: Vec<Vec<u8>> = (0..N).map(|i| vec![0u8; len_of(i)]).collect();
    let mut vars = Vec::with_capacity(N);
    for (i, b) in bufs.iter().enumerate() {
        let iov = [RawIov::of(b)];
        let mut v = [TriggerVar::default()];
        // SAFETY: `bufs` outlives the sends (their completions are waited for below).
        let k =
            unsafe { n.ep.tsendmsg_xpu(&msg(&iov, to, i, 0), 0, Xpu::CPU, &mut v) }.expect("arm");
        assert_eq!(k, 1);
        assert_eq!(unsafe { v[0].value.val64 }, i as u64 + 1);
        vars.push(v[0]);
    }
    assert_eq!(peer.hear(), "ready");
    let spans = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    let xpu = xpu_thread(spans, vars);
    let done = n.wait_n(N);
    xpu.join().unwrap();
    let mut ctxs: Vec<_> = done.iter().map(|e| e.op_context).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..N).collect::<Vec<_>>(), "each send completed once");
    let end = *b"the end!";
    // SAFETY: `end` outlives the send (waited for).
    n.retry(|| unsafe { n.ep.tsend(&end, None, to, 0, N) });
    n.wait_one();
    assert_eq!(peer.hear(), "ok");
    peer.join();
}

#[test]
fn xpu_triggered_sends_across_two_processes() {
    sends("xpu_triggered_sends_across_two_processes", Progress::Manual);
}

#[test]
fn xpu_triggered_sends_under_auto_progress() {
    sends("xpu_triggered_sends_under_auto_progress", Progress::Auto);
}

const W: usize = 64;

/// Target of the write test: exposes a region, counts the remote CQ data in order, then
/// checks every byte.
fn target(progress: Progress) {
    let n = node_with(CAPS, progress, |i| {
        i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    });
    let peer = connect_parent(&n);
    let region = vec![0u8; N * W];
    // SAFETY: `region` outlives the registration.
    let mr = unsafe { n.domain.mr_reg(&region, FI_REMOTE_WRITE, 0, 0) }.unwrap();
    // The initiator sends "the end!" once every write of its has completed: until then this
    // process keeps driving progress, so the acknowledgement of the last write is not lost
    // with it (exiting at the N-th landing failed that write with ECONNRESET now and then).
    let mut end = [0u8; 8];
    // SAFETY: `end` outlives the receive (completed below).
    n.retry(|| unsafe { n.ep.recv(&mut end, None, peer, N) });
    say(&format!("{} {}", region.as_ptr() as usize, mr.key()));
    let mut got = n.wait_n(N + 1);
    let last = got.pop().expect("N + 1 entries");
    assert!(
        last.flags & FI_RECV != 0 && last.op_context == N,
        "the end comes last"
    );
    assert_eq!(&end, b"the end!");
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.data, i as u64, "remote CQ data in posting order");
        assert!(e.flags & FI_REMOTE_WRITE != 0);
    }
    for i in 0..N {
        assert!(
            region[i * W..(i + 1) * W] == pattern(W, i as u64)[..],
            "bytes of write {i}"
        );
    }
    say("ok");
}

fn writes(test: &str, progress: Progress) {
    if role().is_some() {
        return target(progress);
    }
    let mut peer = spawn(test, "target", &[]);
    let n = node_with(CAPS, progress, |i| {
        i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    });
    let to = connect(&mut peer, &n);
    let line = peer.hear();
    let mut it = line.split(' ').map(|x| x.parse::<u64>().unwrap());
    let (base, key) = (it.next().unwrap(), it.next().unwrap());
    let local = vec![0u8; N * W];
    let mut vars = Vec::with_capacity(N);
    for i in 0..N {
        let iov = [RawIov {
            addr: local.as_ptr() as usize + i * W,
            len: W,
        }];
        let rma = [RmaIov {
            addr: base + (i * W) as u64,
            len: W,
            key,
        }];
        let m = MsgRma {
            iov: &iov,
            desc: &[],
            addr: to,
            rma_iov: &rma,
            context: i,
            data: i as u64,
        };
        let mut v = [TriggerVar::default()];
        // SAFETY: `local` outlives the writes (completions waited for below).
        unsafe { n.ep.writemsg_xpu(&m, FI_REMOTE_CQ_DATA, Xpu::CPU, &mut v) }.expect("arm");
        vars.push(v[0]);
    }
    let spans = (0..N)
        .map(|i| (local.as_ptr() as usize + i * W, W))
        .collect();
    let xpu = xpu_thread(spans, vars);
    let done = n.wait_n(N);
    xpu.join().unwrap();
    let mut ctxs: Vec<_> = done.iter().map(|e| e.op_context).collect();
    ctxs.sort_unstable();
    assert_eq!(
        ctxs,
        (0..N).collect::<Vec<_>>(),
        "each write completed once"
    );
    let end = *b"the end!";
    // SAFETY: `end` outlives the send (waited for).
    n.retry(|| unsafe { n.ep.send(&end, None, to, N) });
    n.wait_one();
    assert_eq!(peer.hear(), "ok");
    peer.join();
}

#[test]
fn xpu_triggered_rma_writes_across_two_processes() {
    writes(
        "xpu_triggered_rma_writes_across_two_processes",
        Progress::Manual,
    );
}

#[test]
fn xpu_triggered_rma_writes_under_auto_progress() {
    writes(
        "xpu_triggered_rma_writes_under_auto_progress",
        Progress::Auto,
    );
}

/// An XPU that stores to its trigger variable after the endpoint closed (a kernel still
/// running, a CPU thread behind) finds memory that is still there: the doorbell is kept until
/// the domain closes, as descriptor rings are, and the store starts nothing. (Unmapped with
/// the endpoint, the store was a segmentation fault.)
#[test]
fn a_store_to_a_trigger_variable_after_the_endpoint_closed_is_harmless() {
    if role().is_some() {
        return;
    }
    let n = node(CAPS, Progress::Manual);
    let me = n.add_peer(&n.ep.getname().expect("getname"));
    let buf = [7u8; 8];
    let iov = [RawIov::of(&buf)];
    let mut v = [TriggerVar::default()];
    // SAFETY: `buf` outlives the endpoint, whose close cancels the send.
    unsafe { n.ep.tsendmsg_xpu(&msg(&iov, me, 1, 0), 0, Xpu::CPU, &mut v) }.expect("arm");
    let Node {
        fabric: _fabric,
        domain,
        cq,
        av: _av,
        ep,
        info: _info,
    } = n;
    ep.close().expect("close the endpoint");
    let e = cq.readerr().expect("the armed send ends canceled");
    assert_eq!((e.op_context, e.err), (1, xfabric::errno::FI_ECANCELED));
    // SAFETY: the variable's doorbell is kept until `domain` closes, below.
    unsafe { xfabric::kernels::cpu::store(&v) }.expect("store");
    // SAFETY: as above.
    unsafe { ring(&v) }.expect("ring");
    let mut buf = [CqTaggedEntry::default(); 1];
    assert!(
        matches!(cq.read(&mut buf), Err(Error::Again(_))),
        "nothing started"
    );
    drop(cq);
    drop(domain);
}
