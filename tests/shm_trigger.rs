//! Triggered operations across three real processes: A sends N messages to B; B's receive
//! counter reaching N triggers B's send of everything it received to C; C's receive counter
//! reaching 1 triggers C's send of it back to A, which checks the bytes. After posting, B and C
//! only make progress (or, under auto progress, do nothing at all): the data moves on
//! triggers. The buffers B and C forward are zero until the receives land, so a send that
//! started early would carry zeros.
//!
//! Run with `FI_TRIGGER_THRESHOLD` operations (`*_triggered`) and with deferred work
//! (`Domain::queue_work`, completion counters instead of endpoint completions).

mod common;
use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TRIGGER;
const N: usize = 16;
const K: usize = 4096;

/// A node with a receive and a send counter bound, for the chain's links.
struct Link {
    n: Node,
    rx: Counter,
    tx: Counter,
}

fn link(progress: Progress) -> Link {
    let mut cntrs = None;
    let n = node_custom(
        CAPS,
        progress,
        |_| {},
        4096,
        |d: &Domain, ep: &Endpoint| {
            let rx = d.cntr_open(&CntrAttr::default()).unwrap();
            let tx = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&rx, FI_RECV).unwrap();
            ep.bind_cntr(&tx, FI_SEND).unwrap();
            cntrs = Some((rx, tx));
        },
    );
    let (rx, tx) = cntrs.unwrap();
    Link { n, rx, tx }
}

fn msg(iov: &[RawIov], addr: FiAddr, ctx: Context) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr,
        context: ctx,
        data: 0,
        tag: 0,
        ignore: 0,
    }
}

/// Arms the forward: once `after` receives have landed in `buf`, all of it goes to `to`.
/// Deferred work adds one to `done` when the send completes; a triggered send bumps the
/// endpoint's send counter as any send does.
fn arm_forward(l: &Link, deferred: bool, buf: &[u8], to: FiAddr, after: u64, done: &Counter) {
    let iov = [RawIov::of(buf)];
    let m = msg(&iov, to, 0xf0);
    // SAFETY: `buf` stays alive and untouched by this process until the send completes
    // (the caller waits for that before dropping it).
    unsafe {
        if deferred {
            let work = DeferredWork {
                threshold: after,
                triggering_cntr: &l.rx,
                completion_cntr: Some(done),
                op: WorkOp::Send(OpMsg {
                    ep: &l.n.ep,
                    msg: m,
                    flags: 0,
                }),
            };
            l.n.domain.queue_work(&work).unwrap();
        } else {
            let trig = TriggerContext::threshold(&l.rx, after);
            l.n.ep.sendmsg_triggered(&m, 0, &trig).unwrap();
        }
    }
}

/// B (`receives` = N) or C (1): posts its receives, arms the forward, then waits to be told
/// the chain is done.
fn relay(deferred: bool, progress: Progress, receives: usize) {
    let l = link(progress);
    say(&hex(&l.n.ep.getname().unwrap()));
    let to = l.n.add_peer(&unhex(&listen()));
    let buf = vec![0u8; N * K];
    let piece = buf.len() / receives;
    for i in 0..receives {
        let iov = [RawIov {
            addr: buf.as_ptr() as usize + i * piece,
            len: piece,
        }];
        // SAFETY: `buf` outlives every receive (this function waits for the forward, which
        // follows them all).
        unsafe { l.n.ep.recvmsg(&msg(&iov, FI_ADDR_UNSPEC, i), 0) }.unwrap();
    }
    let done = l.n.domain.cntr_open(&CntrAttr::default()).unwrap();
    arm_forward(&l, deferred, &buf, to, receives as u64, &done);
    say("ready");
    // Nothing more to do but let the triggers run: under manual progress this thread drives
    // the endpoint by waiting on the counter the forward bumps (a deferred transfer's
    // completion counter drives its endpoint as a bound one does); under auto progress the
    // domain's thread does everything.
    let forwarded = if deferred { &done } else { &l.tx };
    if progress == Progress::Manual {
        forwarded.wait(1, 20_000).expect("the forward completes");
    }
    assert_eq!(listen(), "done");
    forwarded.wait(1, 20_000).expect("the forward completes");
    assert_eq!(l.rx.read(), receives as u64);
    // The receives' completions are in the CQ; the forward's only if it was a plain triggered
    // send (deferred work writes no endpoint completion unless asked to).
    let entries = l.n.wait_n(receives + usize::from(!deferred));
    assert!(entries
        .iter()
        .all(|e| e.flags & FI_RECV != 0 || e.op_context == 0xf0));
    assert_eq!(l.tx.read(), u64::from(!deferred));
    say("ok");
}

fn chain(test: &str, deferred: bool, progress: Progress) {
    match role().as_deref() {
        Some("b") => return relay(deferred, progress, N),
        Some("c") => return relay(deferred, progress, 1),
        Some(r) => panic!("unknown role {r}"),
        None => {}
    }
    let mut b = spawn(test, "b", &[]);
    let mut c = spawn(test, "c", &[]);
    let a = link(Progress::Manual);
    let b_addr = a.n.add_peer(&unhex(&b.hear()));
    let c_raw = c.hear();
    b.tell(&c_raw);
    c.tell(&hex(&a.n.ep.getname().unwrap()));
    let back = vec![0u8; N * K];
    let iov = [RawIov::of(&back)];
    // SAFETY: `back` outlives the receive (waited for below).
    unsafe { a.n.ep.recvmsg(&msg(&iov, FI_ADDR_UNSPEC, 7), 0) }.unwrap();
    assert_eq!(b.hear(), "ready");
    assert_eq!(c.hear(), "ready");
    let data = pattern(N * K, 42);
    for (i, chunk) in data.chunks(K).enumerate() {
        // SAFETY: `data` outlives the sends (their completions are waited for below).
        a.n.retry(|| unsafe { a.n.ep.send(chunk, None, b_addr, 100 + i) });
    }
    a.rx.wait(1, 20_000)
        .expect("the data comes back through B and C");
    assert!(
        back == data,
        "A got back what it sent, through two triggered hops"
    );
    a.tx.wait(N as u64, 20_000).unwrap();
    for p in [&mut b, &mut c] {
        p.tell("done");
        assert_eq!(p.hear(), "ok");
    }
    b.join();
    c.join();
}

#[test]
fn triggered_chain_across_three_processes() {
    chain(
        "triggered_chain_across_three_processes",
        false,
        Progress::Manual,
    );
}

#[test]
fn triggered_chain_under_auto_progress() {
    chain("triggered_chain_under_auto_progress", false, Progress::Auto);
}

#[test]
fn deferred_work_chain_across_three_processes() {
    chain(
        "deferred_work_chain_across_three_processes",
        true,
        Progress::Manual,
    );
}
