//! The deferred work queue against the mock provider.

use std::sync::atomic::Ordering;

use super::testkit::*;
use super::*;
use crate::cntr::Counter;
use crate::consts::errno::FI_ECANCELED;
use crate::consts::*;
use crate::entry::{Context, FiAddr};
use crate::ep::Msg;
use crate::error::Error;
use crate::rxq::RawIov;
use crate::work::*;

fn msg(iov: &[RawIov], ctx: Context) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr: FiAddr::MAX,
        context: ctx,
        data: 0,
        tag: 0,
        ignore: 0,
    }
}

fn add<'a>(trig: &'a Counter, threshold: u64, cntr: &'a Counter, value: u64) -> DeferredWork<'a> {
    DeferredWork {
        threshold,
        triggering_cntr: trig,
        completion_cntr: None,
        op: WorkOp::CntrAdd(OpCntr { cntr, value }),
    }
}

/// A deferred send of `iov` (context 5, `flags`) on `ep`, started when `trig` reaches
/// `threshold`, counted on `done`.
fn send_at<'a>(
    ep: &'a crate::ep::Endpoint,
    iov: &'a [RawIov],
    flags: u64,
    trig: &'a Counter,
    threshold: u64,
    done: Option<&'a Counter>,
) -> DeferredWork<'a> {
    DeferredWork {
        threshold,
        triggering_cntr: trig,
        completion_cntr: done,
        op: WorkOp::Send(OpMsg {
            ep,
            msg: msg(iov, 5),
            flags,
        }),
    }
}

#[test]
fn counter_operations_watch_success_plus_errors_and_touch_only_their_counter() {
    let w = World::new();
    let (a, b) = (w.cntr(), w.cntr());
    // SAFETY: counter operations name no buffers.
    unsafe {
        w.domain.queue_work(&add(&a, 2, &b, 5)).unwrap();
        let set = DeferredWork {
            op: WorkOp::CntrSet(OpCntr {
                cntr: &b,
                value: 100,
            }),
            ..add(&a, 3, &b, 0)
        };
        w.domain.queue_work(&set).unwrap();
    }
    a.add(1).unwrap();
    assert_eq!(b.read(), 0);
    a.adderr(1).unwrap();
    assert_eq!(b.read(), 5, "success plus error reached 2");
    a.add(7).unwrap();
    assert_eq!(b.read(), 100);
    assert_eq!((a.read(), a.readerr(), b.readerr()), (8, 1, 0));

    // A completion counter makes no sense for a counter operation.
    let bad = DeferredWork {
        completion_cntr: Some(&a),
        ..add(&a, 1, &b, 1)
    };
    // SAFETY: rejected before anything is queued.
    let r = unsafe { w.domain.queue_work(&bad) };
    assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
}

#[test]
fn a_long_chain_of_counters_runs_without_recursion() {
    let w = World::new();
    let c: Vec<Counter> = (0..10_000).map(|_| w.cntr()).collect();
    for i in 0..c.len() - 1 {
        // SAFETY: counter operations name no buffers.
        unsafe { w.domain.queue_work(&add(&c[i], 1, &c[i + 1], 1)) }.unwrap();
    }
    c[0].add(1).unwrap();
    assert_eq!(c[c.len() - 1].read(), 1);
}

#[test]
fn transfers_bump_their_completion_counter_and_the_endpoint_only_when_asked() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let (sent, trig, done) = (w.cntr(), w.cntr(), w.cntr());
    let e = w.ep_with(ALL_CAPS, 64, &[(&sent, FI_SEND | FI_RECV)]);
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    for (ctx, flags) in [(1, 0), (2, FI_COMPLETION)] {
        let work = DeferredWork {
            threshold: ctx as u64,
            triggering_cntr: &trig,
            completion_cntr: Some(&done),
            op: WorkOp::Send(OpMsg {
                ep: &e.ep,
                msg: msg(&iov, ctx),
                flags,
            }),
        };
        // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
        unsafe { w.domain.queue_work(&work) }.unwrap();
    }
    trig.add(1).unwrap();
    assert_eq!(done.read(), 1);
    assert!(e.entries().is_empty(), "no endpoint completion by default");
    assert_eq!(sent.read(), 0, "nor the endpoint's counter");
    trig.add(1).unwrap();
    assert_eq!(done.read(), 2);
    let ent = e.entries();
    assert_eq!(ent.len(), 1);
    assert_eq!(ent[0].op_context, 2, "the application's context comes back");
    assert_eq!(sent.read(), 1);

    // A deferred receive: its completion counter counts the message's arrival.
    let mut rbuf = [0u8; 8];
    let riov = [RawIov::of_mut(&mut rbuf)];
    let work = DeferredWork {
        threshold: 3,
        triggering_cntr: &trig,
        completion_cntr: Some(&done),
        op: WorkOp::Recv(OpMsg {
            ep: &e.ep,
            msg: msg(&riov, 9),
            flags: 0,
        }),
    };
    // SAFETY: `rbuf` outlives the endpoint; the mock provider never writes it.
    unsafe { w.domain.queue_work(&work) }.unwrap();
    assert!(w.sh.recvs.lock().unwrap().is_empty(), "not posted yet");
    trig.adderr(1).unwrap();
    assert_eq!(w.sh.recvs.lock().unwrap().len(), 1);
    w.sh.deliver(8);
    assert_eq!(done.read(), 3);
    assert!(e.entries().is_empty());
}

#[test]
fn requests_are_checked_when_queued() {
    let w = World::new();
    let other = World::new();
    let e = w.ep();
    let foreign = other.ep();
    let plain = w.ep_with(ALL_CAPS & !FI_TRIGGER, 16, &[]);
    let c = w.cntr();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let five = [RawIov::of(&buf); 5];
    let send = |ep, iov, flags| DeferredWork {
        threshold: 1,
        triggering_cntr: &c,
        completion_cntr: None,
        op: WorkOp::Send(OpMsg {
            ep,
            msg: msg(iov, 1),
            flags,
        }),
    };
    // SAFETY: every request is rejected before anything is queued.
    unsafe {
        let r = w.domain.queue_work(&send(&foreign.ep, &iov, 0));
        assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
        let r = w.domain.queue_work(&send(&plain.ep, &iov, 0));
        assert!(matches!(r, Err(Error::OpNotSupp(_))), "{r:?}");
        let r = w.domain.queue_work(&send(&e.ep, &iov, FI_INJECT));
        assert!(matches!(r, Err(Error::NoSys(_))), "{r:?}");
        let r = w.domain.queue_work(&send(&e.ep, &five, 0));
        assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
        let r = w.domain.queue_work(&send(&e.ep, &iov, FI_PEEK));
        assert!(matches!(r, Err(Error::NoSys(_))), "{r:?}");
        let m = crate::ep::atomic::MsgAtomic {
            addr: 0,
            rma_addr: 0,
            key: 0,
            datatype: crate::atomic::Datatype::UInt64,
            op: crate::atomic::AtomicOp::Sum,
            context: 0,
        };
        let atomic = |count| DeferredWork {
            threshold: 1,
            triggering_cntr: &c,
            completion_cntr: None,
            op: WorkOp::Atomic(OpAtomic {
                ep: &e.ep,
                msg: m,
                operand: RawIov::of(&buf),
                count,
                flags: 0,
            }),
        };
        let r = w.domain.queue_work(&atomic(2));
        assert!(
            matches!(r, Err(Error::Inval(_))),
            "operand too short: {r:?}"
        );
        // A null buffer, which the firing would have followed: refused when queued, for each
        // of an atomic's buffers.
        let null = RawIov { addr: 0, len: 8 };
        let r = w.domain.queue_work(&DeferredWork {
            op: WorkOp::Atomic(OpAtomic {
                ep: &e.ep,
                msg: m,
                operand: null,
                count: 1,
                flags: 0,
            }),
            ..atomic(1)
        });
        assert!(matches!(r, Err(Error::Inval(_))), "null operand: {r:?}");
        let r = w.domain.queue_work(&DeferredWork {
            op: WorkOp::FetchAtomic(crate::work::OpFetchAtomic {
                ep: &e.ep,
                msg: m,
                operand: RawIov::of(&buf),
                result: null,
                count: 1,
                flags: 0,
            }),
            ..atomic(1)
        });
        assert!(matches!(r, Err(Error::Inval(_))), "null result: {r:?}");
        let cas = crate::ep::atomic::MsgAtomic {
            op: crate::atomic::AtomicOp::Cswap,
            ..m
        };
        let r = w.domain.queue_work(&DeferredWork {
            op: WorkOp::CompareAtomic(crate::work::OpCompareAtomic {
                ep: &e.ep,
                msg: cas,
                operand: RawIov::of(&buf),
                compare: null,
                result: RawIov::of(&buf),
                count: 1,
                flags: 0,
            }),
            ..atomic(1)
        });
        assert!(matches!(r, Err(Error::Inval(_))), "null compare: {r:?}");
        w.domain.queue_work(&atomic(1)).unwrap();
    }
    assert_eq!(w.domain.flush_work(None).unwrap(), 1);
}

#[test]
fn cancel_and_flush_release_work_and_report_only_what_asked() {
    let w = World::new();
    let e = w.ep();
    let (c1, c2, x) = (w.cntr(), w.cntr(), w.cntr());
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let send = |trig, ctx, flags| DeferredWork {
        threshold: 1,
        triggering_cntr: trig,
        completion_cntr: Some(&x),
        op: WorkOp::Send(OpMsg {
            ep: &e.ep,
            msg: msg(&iov, ctx),
            flags,
        }),
    };
    // SAFETY: `buf` outlives the endpoint; nothing below starts.
    let ids: Vec<WorkId> = unsafe {
        [
            w.domain.queue_work(&send(&c1, 1, FI_COMPLETION)).unwrap(),
            w.domain.queue_work(&send(&c1, 2, 0)).unwrap(),
            w.domain.queue_work(&send(&c2, 3, FI_COMPLETION)).unwrap(),
            w.domain.queue_work(&send(&c2, 4, 0)).unwrap(),
            w.domain.queue_work(&add(&c2, 1, &x, 1)).unwrap(),
        ]
        .into()
    };
    w.domain.cancel_work(&ids[0]).unwrap();
    let r = w.domain.cancel_work(&ids[0]);
    assert!(matches!(r, Err(Error::NoEntry(_))), "{r:?}");
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].op_context, errs[0].err), (1, FI_ECANCELED));

    assert_eq!(w.domain.flush_work(Some(&c1)).unwrap(), 1);
    assert!(e.errors().is_empty(), "work 2 did not ask for completions");
    assert_eq!(w.domain.flush_work(None).unwrap(), 3);
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].op_context, 3);

    c1.add(5).unwrap();
    c2.add(5).unwrap();
    assert!(w.sh.ctxs().is_empty());
    assert_eq!((x.read(), x.readerr()), (0, 0));
    assert!(c1.close().is_ok() && c2.close().is_ok());
}

/// A deferred send's completion counter is the application's to close once its work is done,
/// its endpoint still open (a collective library opens and closes one per operation).
#[test]
fn a_completion_counter_closes_once_its_work_is_done() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let e = w.ep();
    let (t, d) = (w.cntr(), w.cntr());
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let work = DeferredWork {
        threshold: 1,
        triggering_cntr: &t,
        completion_cntr: Some(&d),
        op: WorkOp::Send(OpMsg {
            ep: &e.ep,
            msg: msg(&iov, 1),
            flags: 0,
        }),
    };
    // SAFETY: `buf` outlives the send (completed below).
    unsafe { w.domain.queue_work(&work) }.unwrap();
    t.add(1).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while d.read() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the work never completed"
        );
    }
    assert_eq!(w.sh.ctxs().len(), 1, "the send started once");
    let r = d.close();
    assert!(r.is_ok(), "{:?}", r.err().map(|e| e.1));
    assert!(t.close().is_ok());
    // The endpoint goes on, and closes.
    e.ep.progress();
}

/// Closing the endpoint a deferred transfer waits to start on ends it with an error counted
/// on its completion counter, as a failed transfer's is: a wait on that counter ends instead
/// of waiting forever. A request the application cancels counts nothing (it knows).
#[test]
fn an_endpoint_closed_under_deferred_work_counts_an_error_on_its_completion_counter() {
    let w = World::new();
    let e = w.ep();
    let (t, d) = (w.cntr(), w.cntr());
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let send = |ctx| DeferredWork {
        threshold: 5,
        triggering_cntr: &t,
        completion_cntr: Some(&d),
        op: WorkOp::Send(OpMsg {
            ep: &e.ep,
            msg: msg(&iov, ctx),
            flags: 0,
        }),
    };
    // SAFETY: `buf` outlives the endpoint; neither request starts.
    let (kept, canceled) = unsafe {
        (
            w.domain.queue_work(&send(1)).unwrap(),
            w.domain.queue_work(&send(2)).unwrap(),
        )
    };
    w.domain.cancel_work(&canceled).unwrap();
    assert_eq!((d.read(), d.readerr()), (0, 0), "canceled: nothing counted");
    let Ep { ep, cq: _cq } = e;
    ep.close().unwrap();
    assert!(kept.ended());
    assert_eq!((d.read(), d.readerr()), (0, 1));
    t.add(5).unwrap();
    assert!(w.sh.ctxs().is_empty(), "nothing started");
}

/// A request's handle says when it no longer waits: once it started, once it was canceled
/// (what lets the C ABI forget the handles it keeps for `FI_CANCEL_WORK`).
#[test]
fn a_work_handle_tells_when_its_request_ended() {
    let w = World::new();
    let (a, b) = (w.cntr(), w.cntr());
    // SAFETY: counter operations name no buffers.
    let (fired, canceled) = unsafe {
        (
            w.domain.queue_work(&add(&a, 1, &b, 1)).unwrap(),
            w.domain.queue_work(&add(&a, 5, &b, 1)).unwrap(),
        )
    };
    assert!(!fired.ended() && !canceled.ended());
    a.add(1).unwrap();
    assert_eq!(b.read(), 1);
    assert!(fired.ended(), "started");
    assert!(!canceled.ended(), "still waits");
    w.domain.cancel_work(&canceled).unwrap();
    assert!(canceled.ended());
}

#[test]
fn closing_the_domain_releases_its_work() {
    let w = World::new();
    let (a, b) = (w.cntr(), w.cntr());
    // SAFETY: counter operations name no buffers.
    unsafe { w.domain.queue_work(&add(&a, 1, &b, 1)) }.unwrap();
    let World { sh: _, domain } = w;
    drop(domain);
    a.add(1).unwrap();
    assert_eq!(b.read(), 0);
    assert!(a.close().is_ok());
}

#[test]
fn op_types_have_the_c_values() {
    let c = Counter::open(&Default::default()).unwrap();
    let op = WorkOp::CntrAdd(OpCntr { cntr: &c, value: 1 });
    assert_eq!(op.op_type() as i32, 10);
    assert_eq!(op.op_type().c_name(), "FI_OP_CNTR_ADD");
}

#[test]
fn a_completion_counter_bound_to_the_endpoint_counts_once() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let (sent, trig) = (w.cntr(), w.cntr());
    let e = w.ep_with(ALL_CAPS, 64, &[(&sent, FI_SEND)]);
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    // The completion counter is also the endpoint's send counter, and the work asks for
    // endpoint completions: fi_trigger(3) counts it there once, not twice.
    let work = send_at(&e.ep, &iov, FI_COMPLETION, &trig, 1, Some(&sent));
    // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
    unsafe { w.domain.queue_work(&work) }.unwrap();
    trig.add(1).unwrap();
    assert_eq!(sent.read(), 1);
    assert_eq!(e.entries().len(), 1);
}

/// A flush takes the domain's work out of every queue before it cancels any: canceling a send
/// that asked for endpoint completions counts an error on the endpoint's send counter, and work
/// waiting on that counter must not start from it (it is being flushed too).
#[test]
fn a_flush_starts_none_of_the_work_it_flushes() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let (sent, trig, x) = (w.cntr(), w.cntr(), w.cntr());
    let e = w.ep_with(ALL_CAPS, 64, &[(&sent, FI_SEND)]);
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let send = send_at(&e.ep, &iov, FI_COMPLETION, &trig, 100, None);
    // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
    unsafe { w.domain.queue_work(&send) }.unwrap();
    // SAFETY: a counter operation names no memory.
    unsafe { w.domain.queue_work(&add(&sent, 1, &x, 1)) }.unwrap();
    assert_eq!(w.domain.flush_work(None).unwrap(), 2);
    assert_eq!(x.read(), 0, "the flushed counter add never ran");
    assert_eq!(sent.readerr(), 1, "the canceled send counted once");
    assert!(w.sh.ctxs().is_empty());
}

/// Closing an endpoint ends its work once on a completion counter that is also the endpoint's
/// own send counter (the cancel's report counts it there; counting it again made two errors).
#[test]
fn a_closed_endpoints_work_counts_one_error_on_its_own_counter() {
    let w = World::new();
    let (sent, trig) = (w.cntr(), w.cntr());
    let e = w.ep_with(ALL_CAPS, 64, &[(&sent, FI_SEND)]);
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let work = send_at(&e.ep, &iov, FI_COMPLETION, &trig, 5, Some(&sent));
    // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
    unsafe { w.domain.queue_work(&work) }.unwrap();
    let Ep { ep, cq: _cq } = e;
    ep.close().unwrap();
    assert_eq!(sent.readerr(), 1);
}

/// Closing the domain ends the work queued on it as closing an endpoint does: its completion
/// counter counts an error, so a wait on it ends (the application asked for no cancel).
#[test]
fn a_closed_domains_work_counts_an_error_on_its_completion_counter() {
    let w = World::new();
    let (trig, done) = (w.cntr(), w.cntr());
    let e = w.ep();
    let buf = [0u8; 8];
    let iov = [RawIov::of(&buf)];
    let work = send_at(&e.ep, &iov, 0, &trig, 5, Some(&done));
    // SAFETY: `buf` outlives the endpoint; the mock provider never reads it.
    unsafe { w.domain.queue_work(&work) }.unwrap();
    drop(w);
    assert_eq!((done.read(), done.readerr()), (0, 1));
    assert!(
        e.entries().is_empty(),
        "no endpoint completion was asked for"
    );
}
