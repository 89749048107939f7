//! Triggered operations (`FI_TRIGGER_THRESHOLD`) against the mock provider.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::testkit::*;
use super::TriggerContext;
use crate::consts::errno::FI_ECANCELED;
use crate::consts::*;
use crate::entry::Context;
use crate::ep::rma::{MsgRma, RmaIov};
use crate::ep::Endpoint;
use crate::error::Error;
use crate::rxq::RawIov;

/// Posts a triggered send with context `ctx` waiting for `cntr` to reach `threshold`.
fn tsend(ep: &Endpoint, buf: &[u8], ctx: Context, trig: &TriggerContext) {
    let iov = [RawIov::of(buf)];
    // SAFETY: the tests' buffers outlive their endpoints; the mock provider never reads them.
    unsafe { ep.sendmsg_triggered(&msg(&iov, ctx), 0, trig) }.unwrap();
}

#[test]
fn thresholds_fire_in_order_even_when_the_counter_jumps() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    for (ctx, thr) in [(1, 5), (2, 1), (3, 3), (4, 3), (5, 2), (6, 10), (7, 3)] {
        tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, thr));
    }
    assert!(
        w.sh.ctxs().is_empty(),
        "nothing starts before its threshold"
    );
    c.add(2).unwrap();
    assert_eq!(w.sh.ctxs(), [2, 5]);
    c.add(7).unwrap();
    // 9: thresholds 3, 3, 3 in posting order, then 5; 10 still waits.
    assert_eq!(w.sh.ctxs(), [2, 5, 3, 4, 7, 1]);
    c.inner().inc();
    c.inner().notify_observers();
    assert_eq!(w.sh.ctxs(), [2, 5, 3, 4, 7, 1, 6]);
}

#[test]
fn a_threshold_already_met_starts_at_once_and_errors_do_not_count() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    c.set(4).unwrap();
    let buf = [0u8; 8];
    tsend(&e.ep, &buf, 1, &TriggerContext::threshold(&c, 4));
    assert_eq!(w.sh.ctxs(), [1]);
    tsend(&e.ep, &buf, 2, &TriggerContext::threshold(&c, 5));
    // FI_TRIGGER_THRESHOLD watches the success value only.
    c.adderr(3).unwrap();
    assert_eq!(w.sh.ctxs(), [1]);
    c.set(5).unwrap();
    assert_eq!(w.sh.ctxs(), [1, 2]);
}

#[test]
fn completions_of_triggered_operations_trigger_further_ones() {
    // The send counter of the endpoint triggers the next send: a chain that runs inside the
    // notifications, as a loop, not as recursion.
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let sent = w.cntr();
    let e = w.ep_with(ALL_CAPS, 1 << 16, &[(&sent, FI_SEND)]);
    let start = w.cntr();
    let buf = [0u8; 8];
    const N: u64 = 20_000;
    tsend(&e.ep, &buf, 0, &TriggerContext::threshold(&start, 1));
    for i in 1..N {
        tsend(
            &e.ep,
            &buf,
            i as usize,
            &TriggerContext::threshold(&sent, i),
        );
    }
    start.add(1).unwrap();
    assert_eq!(sent.read(), N);
    assert_eq!(w.sh.ctxs(), (0..N as usize).collect::<Vec<_>>());
    assert_eq!(e.entries().len(), N as usize);
}

#[test]
fn trigger_needs_the_capability_and_a_context() {
    let w = World::new();
    let plain = w.ep_with(ALL_CAPS & !FI_TRIGGER, 16, &[]);
    let c = w.cntr();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let m = msg(&iov, 1);
    let trig = TriggerContext::threshold(&c, 1);
    // SAFETY: nothing is posted (each call fails).
    unsafe {
        let r = plain.ep.sendmsg_triggered(&m, 0, &trig);
        assert!(matches!(r, Err(Error::OpNotSupp(_))), "{r:?}");
        let r = plain.ep.sendmsg(&m, FI_TRIGGER);
        assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
        let e = w.ep();
        let r = e.ep.sendmsg_triggered(&m, FI_INJECT, &trig);
        assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
        let r = e.ep.trecvmsg_triggered(&m, FI_PEEK, &trig);
        assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
        // The untriggered call's own checks apply.
        let five = [RawIov::of(&buf); 5];
        let r = e.ep.sendmsg_triggered(&msg(&five, 1), 0, &trig);
        assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
    }
    assert_eq!(trig.event_type(), TriggerEvent::Threshold);
    assert!(w.sh.ctxs().is_empty());
}

#[test]
fn every_kind_of_transfer_can_be_triggered() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let mut buf = [0u8; 8];
    let mut res = [0u8; 8];
    let t = |n| TriggerContext::threshold(&c, n);
    let m = crate::ep::atomic::MsgAtomic {
        addr: 0,
        rma_addr: 0,
        key: 1,
        datatype: crate::atomic::Datatype::UInt64,
        op: crate::atomic::AtomicOp::Sum,
        context: 6,
    };
    // SAFETY: the buffers outlive the endpoint; the mock provider never touches them.
    unsafe {
        let iov = [RawIov::of_mut(&mut buf)];
        let rma = [RmaIov {
            addr: 0,
            len: 8,
            key: 1,
        }];
        let r = |ctx| MsgRma {
            iov: &iov,
            desc: &[],
            addr: 0,
            rma_iov: &rma,
            context: ctx,
            data: 0,
        };
        e.ep.recvmsg_triggered(&msg(&iov, 1), 0, &t(6)).unwrap();
        e.ep.trecvmsg_triggered(&msg(&iov, 2), 0, &t(5)).unwrap();
        e.ep.tsendmsg_triggered(&msg(&iov, 3), 0, &t(4)).unwrap();
        e.ep.readmsg_triggered(&r(4), 0, &t(3)).unwrap();
        e.ep.writemsg_triggered(&r(5), 0, &t(2)).unwrap();
        let op = [0u8; 8];
        e.ep.atomicmsg_triggered(&m, &op, 1, 0, &t(1)).unwrap();
        let fm = crate::ep::atomic::MsgAtomic { context: 7, ..m };
        e.ep.fetch_atomicmsg_triggered(&fm, &op, &mut res, 1, 0, &t(1))
            .unwrap();
        let cm = crate::ep::atomic::MsgAtomic {
            context: 8,
            op: crate::atomic::AtomicOp::Cswap,
            ..m
        };
        let cmp = [0u8; 8];
        let mut res2 = [0u8; 8];
        e.ep.compare_atomicmsg_triggered(&cm, &op, &cmp, &mut res2, 1, 0, &t(0))
            .unwrap();
        assert_eq!(*w.sh.log.lock().unwrap(), [('a', 8)]);
        c.set(6).unwrap();
    }
    let log = w.sh.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            ('a', 8),
            ('a', 6),
            ('a', 7),
            ('m', 5),
            ('m', 4),
            ('s', 3),
            ('r', 2),
            ('r', 1)
        ]
    );
}

#[test]
fn cancel_and_close_report_canceled_and_nothing_starts() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    for ctx in 1..=3 {
        tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, 1));
    }
    e.ep.cancel(2).unwrap();
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].op_context, errs[0].err), (2, FI_ECANCELED));
    assert!(e.ep.cancel(2).is_err(), "canceled once only");
    c.add(1).unwrap();
    assert_eq!(w.sh.ctxs(), [1, 3]);

    for ctx in 10..13 {
        tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, 100));
    }
    let Ep { ep, cq } = e;
    ep.close().unwrap();
    let mut canceled: Vec<_> = cq_errors(&cq).iter().map(|x| x.op_context).collect();
    canceled.sort();
    assert_eq!(canceled, [10, 11, 12]);
    c.set(1000).unwrap();
    assert_eq!(w.sh.ctxs(), [1, 3]);
    assert!(
        c.close().is_ok(),
        "no operation waits on the counter any more"
    );
}

#[test]
fn refused_operations_wait_for_room_and_keep_their_order() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    for ctx in 1..=4 {
        tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, ctx as u64));
    }
    w.sh.again.store(2, Ordering::Release);
    c.add(2).unwrap();
    // 1 was refused (and so 2 queued behind it); driving the endpoint retries in order.
    assert!(w.sh.ctxs().is_empty());
    e.ep.progress();
    assert!(w.sh.ctxs().is_empty(), "refused a second time");
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2]);
    c.add(2).unwrap();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4]);
}

#[test]
fn a_busy_counter_cannot_close() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    tsend(&e.ep, &buf, 1, &TriggerContext::threshold(&c, 1));
    let c = match c.close() {
        Err((c, Error::Busy(_))) => c,
        other => panic!("{:?}", other.err().map(|e| e.1)),
    };
    c.add(1).unwrap();
    assert!(c.close().is_ok());
}

/// A CQ, counter or AV bound to an endpoint that is not enabled yet cannot close (the
/// binding counts from `fi_ep_bind`, not from `fi_enable`: closed in between, the endpoint
/// would have been enabled writing to objects nobody can read); once the endpoint closes,
/// each closes. The same for one that never gets enabled.
#[test]
fn objects_bound_to_an_endpoint_not_enabled_yet_cannot_close() {
    let w = World::new();
    for enable in [true, false] {
        let mut i = w.domain.info().clone();
        i.caps = ALL_CAPS;
        let ep = w.domain.endpoint(&i).unwrap();
        let cq = w.domain.cq_open(&Default::default()).unwrap();
        let av = w.domain.av_open(&Default::default()).unwrap();
        let c = w.cntr();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cntr(&c, FI_SEND | FI_RECV).unwrap();
        let cq = match cq.close() {
            Err((cq, Error::Busy(_))) => cq,
            other => panic!("cq: {:?}", other.err().map(|e| e.1)),
        };
        let av = match av.close() {
            Err((av, Error::Busy(_))) => av,
            other => panic!("av: {:?}", other.err().map(|e| e.1)),
        };
        let c = match c.close() {
            Err((c, Error::Busy(_))) => c,
            other => panic!("cntr: {:?}", other.err().map(|e| e.1)),
        };
        if enable {
            ep.enable().unwrap();
        }
        ep.close().unwrap();
        assert!(cq.close().is_ok(), "enabled {enable}");
        assert!(av.close().is_ok(), "enabled {enable}");
        assert!(c.close().is_ok(), "enabled {enable}");
    }
}

/// 1,000,000 operations queued on one counter with scattered thresholds start in
/// (threshold, posting) order while the counter climbs in uneven jumps.
#[test]
fn a_million_operations_fire_in_order() {
    const N: usize = 1_000_000;
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let thr: Vec<u64> = (0..N).map(|_| rnd() % (N as u64 / 4)).collect();
    let t0 = Instant::now();
    for (i, &t) in thr.iter().enumerate() {
        let trig = TriggerContext::Threshold {
            cntr: c.clone(),
            threshold: t + 1,
        };
        // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
        unsafe { e.ep.sendmsg_triggered(&msg(&iov, i), 0, &trig) }.unwrap();
    }
    let queued = t0.elapsed();
    let t1 = Instant::now();
    while c.read() < N as u64 / 4 {
        c.add(rnd() % 64 + 1).unwrap();
    }
    let fired = t1.elapsed();
    let log = w.sh.ctxs();
    assert_eq!(log.len(), N);
    let keys: Vec<(u64, usize)> = log.iter().map(|&i| (thr[i], i)).collect();
    assert!(keys.windows(2).all(|k| k[0] < k[1]), "out of order");
    eprintln!(
        "1M triggered sends: queued in {queued:?} ({:.0} ns each), fired in {fired:?} ({:.0} ns each)",
        queued.as_nanos() as f64 / N as f64,
        fired.as_nanos() as f64 / N as f64
    );
}

#[test]
fn concurrent_updates_and_posts_start_everything_once_in_order() {
    const N: u64 = 20_000;
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    // Half posted before the counter moves, half while two threads move it.
    for i in 1..=N / 2 {
        tsend(&e.ep, &buf, i as usize, &TriggerContext::threshold(&c, i));
    }
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..N / 2 {
                    c.add(1).unwrap();
                }
            });
        }
        s.spawn(|| {
            for i in N / 2 + 1..=N {
                tsend(&e.ep, &buf, i as usize, &TriggerContext::threshold(&c, i));
            }
        });
    });
    let log = w.sh.ctxs();
    assert_eq!(log.len(), N as usize, "every operation started once");
    // Those posted up front start in threshold order; a later post whose threshold had
    // already passed starts at once, so overall each one starts once and the first half
    // keeps its order.
    let first: Vec<_> = log
        .iter()
        .filter(|&&i| i as u64 <= N / 2)
        .copied()
        .collect();
    assert_eq!(first, (1..=N as usize / 2).collect::<Vec<_>>());
    let mut all = log.clone();
    all.sort();
    assert_eq!(all, (1..=N as usize).collect::<Vec<_>>());
}

#[test]
fn dropping_a_counter_cancels_what_waits_on_it() {
    let w = World::new();
    let e = w.ep();
    let buf = [0u8; 8];
    {
        let c = w.cntr();
        for ctx in 1..=2 {
            tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, 5));
        }
        // The last handle goes without close(): nothing can raise the counter any more.
    }
    let mut canceled: Vec<_> = e.errors().iter().map(|x| (x.op_context, x.err)).collect();
    canceled.sort();
    assert_eq!(canceled, [(1, FI_ECANCELED), (2, FI_ECANCELED)]);
    assert!(w.sh.ctxs().is_empty(), "nothing started");
}

/// With resource management and a CQ of two entries, three sends armed on one counter at
/// threshold 1, the mock provider completing each as it starts: once the counter is set, two
/// fill the CQ and the third waits for room.
fn three_sends_for_a_cq_of_two(w: &World) -> (Ep, crate::cntr::Counter) {
    w.sh.inline.store(true, Ordering::Release);
    let e = w.ep_managed(2);
    let c = w.cntr();
    let buf = [0u8; 8];
    for ctx in 1..=3 {
        tsend(&e.ep, &buf, ctx, &TriggerContext::threshold(&c, 1));
    }
    (e, c)
}

#[test]
fn with_resource_management_a_fired_operation_waits_for_cq_room() {
    let w = World::new();
    let (e, c) = three_sends_for_a_cq_of_two(&w);
    c.set(1).unwrap();
    // Two entries fill the CQ; the third send waits for room instead of overrunning it.
    assert_eq!(w.sh.ctxs(), [1, 2]);
    let ctxs: Vec<usize> = e.entries().iter().map(|x| x.op_context).collect();
    assert_eq!(ctxs, [1, 2, 3], "every completion, none lost");
    assert_eq!(w.sh.ctxs(), [1, 2, 3]);
}

/// An operation waiting for CQ room that only the application's reads make is retried by
/// time once it has waited a while, not by a spin: the progress thread's next look is then
/// a nap. Before, the look was always "now", and an auto-progress thread spun a core until
/// the application read its CQ, seconds later as likely as not. Room still comes: the
/// completion arrives once the CQ is read.
#[test]
fn an_operation_waiting_for_cq_room_is_retried_by_time_not_by_a_spin() {
    use crate::wait::ProgressSource;
    let w = World::new();
    let (e, c) = three_sends_for_a_cq_of_two(&w);
    let t0 = Instant::now();
    c.set(1).unwrap();
    assert_eq!(w.sh.ctxs(), [1, 2], "the third waits for room");
    let link = e.ep.link().expect("an FI_TRIGGER endpoint's link").clone();
    let first = link.next_look();
    // (Only while the spin can still be running: a thread descheduled past it sees the nap.)
    if t0.elapsed() < super::link::STALL_SPIN {
        assert_eq!(first, Some(Duration::ZERO), "retried at once at first");
    }
    // Past the spin (sleeping longer than it is all this waits for).
    std::thread::sleep(super::link::STALL_SPIN * 3);
    link.progress();
    assert!(
        link.next_look().is_some_and(|d| !d.is_zero()),
        "still spinning: {:?}",
        link.next_look()
    );
    let ctxs: Vec<usize> = e.entries().iter().map(|x| x.op_context).collect();
    assert_eq!(ctxs, [1, 2, 3], "every completion, none lost");
}

/// With resource management, a triggered operation canceled before it started reserved no
/// CQ entry, and its cancel's entry takes no other operation's reservation: a send in flight
/// keeps its room, and with that room and the cancel's entry the CQ of two is full, so the
/// next post is refused. Before, the cancel's entry took the send's reservation, the post was
/// taken, and the CQ of two came to hold three entries.
#[test]
fn with_resource_management_a_canceled_trigger_takes_no_other_operations_room() {
    let w = World::new();
    let e = w.ep_managed(2);
    let c = w.cntr();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    // SAFETY: the mock provider never reads the buffer.
    unsafe { e.ep.sendmsg(&msg(&iov, 1), 0) }.unwrap();
    tsend(&e.ep, &buf, 2, &TriggerContext::threshold(&c, 5));
    e.ep.cancel(2).unwrap();
    // SAFETY: as above.
    let r = unsafe { e.ep.sendmsg(&msg(&iov, 3), 0) };
    assert!(
        matches!(r, Err(Error::Again(_))),
        "a post past the CQ's room was taken: {r:?}"
    );
    let errs: Vec<_> = e.errors().iter().map(|x| (x.op_context, x.err)).collect();
    assert_eq!(errs, [(2, FI_ECANCELED)]);
}

#[test]
fn an_alias_shares_the_endpoint_with_its_own_default_flags() {
    let w = World::new();
    let e = w.ep();
    assert!(matches!(e.ep.alias(FI_COMPLETION), Err(Error::Inval(_))));
    let a =
        e.ep.alias(FI_TRANSMIT | FI_COMPLETION | FI_TRIGGER)
            .unwrap();
    assert_eq!(a.tx_op_flags(), FI_COMPLETION | FI_TRIGGER);
    assert_eq!(a.rx_op_flags(), e.ep.rx_op_flags(), "receive defaults kept");
    let r = e.ep.alias(FI_RECV | FI_MULTI_RECV).unwrap();
    assert_eq!(r.rx_op_flags(), FI_MULTI_RECV);
    assert_eq!(r.tx_op_flags(), e.ep.tx_op_flags());
    // Triggered through the alias (what C's fi_write on an FI_TRIGGER alias does), then a
    // plain send through the endpoint after the alias is gone.
    let c = w.cntr();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    // SAFETY: the mock provider never reads the buffer.
    unsafe { a.sendmsg_triggered(&msg(&iov, 1), 0, &TriggerContext::threshold(&c, 1)) }.unwrap();
    drop(a);
    drop(r);
    c.add(1).unwrap();
    tsend(&e.ep, &buf, 2, &TriggerContext::threshold(&c, 1));
    assert_eq!(
        w.sh.ctxs(),
        [1, 2],
        "the alias's operation ran on the endpoint"
    );
    // Closing the endpoint ends its aliases' use.
    let a = e.ep.alias(FI_TRANSMIT).unwrap();
    e.ep.close().unwrap();
    // SAFETY: refused before anything is posted.
    let r = unsafe { a.sendmsg(&msg(&iov, 3), 0) };
    assert!(matches!(r, Err(Error::OpBadState(_))), "{r:?}");
}

/// A handle whose default flags hold `FI_TRIGGER` (an alias made with it) refuses the calls
/// that name no trigger and take its default flags (send, write, read, atomics alike; receive on a
/// receive alias) with `Inval`: before, they started at once, ahead of what they were meant
/// to wait for. (An inject takes no default flags, on any handle.) The triggered `*msg`
/// calls through the same alias still wait for their trigger.
#[test]
fn an_alias_triggered_by_default_refuses_calls_that_name_no_trigger() {
    let w = World::new();
    let e = w.ep();
    let tx = e.ep.alias(FI_TRANSMIT | FI_TRIGGER).unwrap();
    let rx = e.ep.alias(FI_RECV | FI_TRIGGER).unwrap();
    let buf = [0u8; 8];
    let mut into = [0u8; 8];
    // SAFETY (each): refused before anything is posted.
    let refused = [
        unsafe { tx.send(&buf, None, 0, 1) },
        unsafe { tx.tsend(&buf, None, 0, 5, 1) },
        unsafe { tx.write(&buf, None, 0, 0, 0, 1) },
        unsafe { tx.read(&mut into, None, 0, 0, 0, 1) },
        unsafe { rx.recv(&mut into, None, FI_ADDR_UNSPEC, 1) },
        unsafe { rx.trecv(&mut into, None, FI_ADDR_UNSPEC, 5, 0, 1) },
    ];
    for (i, r) in refused.iter().enumerate() {
        assert!(
            matches!(r, Err(Error::Inval(m)) if m.contains("FI_TRIGGER")),
            "call {i}: {r:?}"
        );
    }
    assert!(w.sh.ctxs().is_empty(), "nothing started");
    // The triggered call through the alias waits for its counter.
    let c = w.cntr();
    let iov = [RawIov::of(&buf)];
    // SAFETY: the mock provider never reads the buffer.
    unsafe { tx.sendmsg_triggered(&msg(&iov, 2), 0, &TriggerContext::threshold(&c, 1)) }.unwrap();
    assert!(w.sh.ctxs().is_empty(), "waits for its trigger");
    c.add(1).unwrap();
    assert_eq!(w.sh.ctxs(), [2]);
}

/// Receive calls accept the flags libfabric's providers ignore on them (MPICH's probe posts
/// `FI_PEEK | FI_COMPLETION | FI_REMOTE_CQ_DATA`; fi_msg(3) names `FI_TRANSMIT_COMPLETE`
/// for `fi_recvmsg`), and still refuse what no receive takes.
#[test]
fn receives_accept_the_flags_libfabric_ignores_on_them() {
    let w = World::new();
    let e = w.ep();
    let mut buf = [0u8; 8];
    let iov = [RawIov::of_mut(&mut buf)];
    // SAFETY: `buf` outlives the endpoint; the mock provider never writes it.
    unsafe {
        e.ep.recvmsg(
            &msg(&iov, 1),
            FI_COMPLETION | FI_REMOTE_CQ_DATA | FI_TRANSMIT_COMPLETE,
        )
        .unwrap();
        e.ep.trecvmsg(&msg(&iov, 2), FI_PEEK | FI_COMPLETION | FI_REMOTE_CQ_DATA)
            .unwrap();
        assert!(matches!(
            e.ep.recvmsg(&msg(&iov, 3), FI_INJECT),
            Err(Error::BadFlags(_))
        ));
    }
}

/// A retry whose start is refused for room after `fi_close` ran meanwhile (the start took
/// long; the close's sweeps found nothing waiting) cancels its job instead of putting it back
/// where nothing looks again: the job completes FI_ECANCELED and holds no endpoint alive.
/// Makes the mock provider's next start wait inside it: the first receiver hears when a start
/// is there, and the start goes on when the sender is sent to.
fn hold_next_start(w: &World) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
    use std::sync::{mpsc, Arc, Mutex};
    let (entered, inside) = mpsc::channel::<()>();
    let (go, wait_go) = mpsc::channel::<()>();
    let (entered, wait_go) = (Mutex::new(entered), Mutex::new(wait_go));
    *w.sh.gate.lock().unwrap() = Some(Arc::new(move || {
        entered.lock().unwrap().send(()).unwrap();
        wait_go.lock().unwrap().recv().unwrap();
    }));
    (inside, go)
}

/// Closes `ep` on a thread of its own while a start is held inside the provider
/// (`hold_next_start`); lets it go on (`go`) after a while, then `join_holder` waits for the
/// thread that made it. Whether the close had returned while the start was held.
fn close_returns_while_held(
    ep: Endpoint,
    go: std::sync::mpsc::Sender<()>,
    join_holder: impl FnOnce(),
) -> bool {
    let (closed, was_closed) = std::sync::mpsc::channel::<()>();
    let closer = std::thread::spawn(move || {
        ep.close().unwrap();
        closed.send(()).unwrap();
    });
    let early = was_closed
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_ok();
    go.send(()).unwrap();
    join_holder();
    closer.join().unwrap();
    early
}

#[test]
fn a_retry_that_the_close_overtakes_cancels_its_job() {
    use std::sync::Arc;
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    tsend(&e.ep, &buf, 7, &TriggerContext::threshold(&c, 1));
    w.sh.again.store(1, Ordering::Release);
    c.add(1).unwrap();
    assert!(w.sh.ctxs().is_empty(), "refused once: waits for room");
    // The retry's start waits inside the provider until the close is done, then is refused.
    let (inside, go) = hold_next_start(&w);
    w.sh.again.store(1, Ordering::Release);
    let alias = e.ep.alias(FI_TRANSMIT).unwrap();
    let link = Arc::downgrade(e.ep.link().unwrap());
    let t = std::thread::spawn(move || {
        alias.progress();
        drop(alias);
    });
    inside.recv().unwrap();
    let Ep { ep, cq } = e;
    // The close waits out the retry's start (what it reports comes before fi_close returns).
    let early = close_returns_while_held(ep, go, || t.join().unwrap());
    assert!(
        !early,
        "fi_close returned while a retry of its job was starting"
    );
    let errs = cq_errors(&cq);
    assert!(
        errs.iter()
            .any(|x| x.op_context == 7 && x.err == FI_ECANCELED),
        "job 7 neither started ({:?}) nor canceled ({:?})",
        w.sh.ctxs(),
        errs.iter()
            .map(|x| (x.op_context, x.err))
            .collect::<Vec<_>>()
    );
    drop(cq);
    drop(w);
    assert!(
        link.upgrade().is_none(),
        "the closed endpoint is still held"
    );
}

#[test]
fn a_close_returns_only_after_the_reports_another_thread_took_before_it() {
    let w = World::new();
    let e = w.ep();
    let core = e.ep.core().clone();
    // As a progress call on another thread does: completions taken under the provider's
    // lock, being reported after it was released.
    let reporting = core.reporting();
    let (tx, rx) = std::sync::mpsc::channel();
    let ep = e.ep;
    let closer = std::thread::spawn(move || {
        ep.close().unwrap();
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(200))
            .is_err(),
        "fi_close returned while a report of its endpoint was under way"
    );
    drop(reporting);
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the close returns once the report ended");
    closer.join().unwrap();
}

#[test]
fn a_close_waits_out_a_triggered_start_another_thread_took_from_its_queue() {
    let w = World::new();
    let e = w.ep();
    let c = w.cntr();
    let buf = [0u8; 8];
    tsend(&e.ep, &buf, 9, &TriggerContext::threshold(&c, 1));
    // The start the counter's bump makes waits inside the provider until told, then
    // completes at once.
    let (inside, go) = hold_next_start(&w);
    w.sh.inline.store(true, Ordering::Release);
    let Ep { ep, cq } = e;
    std::thread::scope(|s| {
        let bump = s.spawn(|| c.add(1).unwrap());
        inside.recv().unwrap();
        let early = close_returns_while_held(ep, go, || bump.join().unwrap());
        assert!(
            !early,
            "fi_close returned while a triggered start of its endpoint was under way"
        );
    });
    let mut got = [crate::entry::CqTaggedEntry::default(); 4];
    let n = cq.read(&mut got).unwrap_or(0);
    assert!(
        got[..n].iter().any(|x| x.op_context == 9),
        "the send's completion, reported before the close returned: {:?}",
        &got[..n]
    );
}

/// With resource management, the error of an inject (which reserved no CQ entry: an inject
/// writes none) takes no other operation's room: a send in flight keeps it, and with the
/// error the CQ of two is full. Before, the error took the send's reservation.
#[test]
fn with_resource_management_an_injects_error_takes_no_other_operations_room() {
    let w = World::new();
    let e = w.ep_managed(2);
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    // SAFETY: the mock provider never reads the buffer.
    unsafe { e.ep.sendmsg(&msg(&iov, 1), 0) }.unwrap();
    // What the engine reports for an inject toward a peer lost before it went.
    e.ep.core().fail_tx(
        0,
        FI_MSG | FI_INJECT | crate::ep::INJECT_CALL,
        crate::consts::errno::FI_EIO,
    );
    // SAFETY: as above.
    let r = unsafe { e.ep.sendmsg(&msg(&iov, 3), 0) };
    assert!(
        matches!(r, Err(Error::Again(_))),
        "a post past the CQ's room was taken: {r:?}"
    );
}
