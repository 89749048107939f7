//! XPU-triggered operations (`FI_TRIGGER_XPU`) against the mock provider, with a test thread
//! (or the test itself) as the CPU XPU.

use std::sync::atomic::{AtomicU64, Ordering};

use super::testkit::*;
use super::{TriggerVar, Xpu, XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED};
use crate::atomic::Datatype;
use crate::consts::errno::{FI_ECANCELED, FI_EINVAL};
use crate::consts::*;
use crate::entry::Context;
use crate::ep::rma::{MsgRma, RmaIov};
use crate::ep::Endpoint;
use crate::error::Error;
use crate::hmem_iface::Iface;
use crate::rxq::RawIov;

/// Arms a send with context `ctx` on the CPU XPU; returns its variable.
fn xsend_on(ep: &Endpoint, xpu: Xpu, ctx: Context) -> TriggerVar {
    static BUF: [u8; 8] = [0; 8];
    let iov = [RawIov::of(&BUF)];
    let mut vars = [TriggerVar::default()];
    // SAFETY: a static buffer; the mock provider never reads it anyway.
    let n = unsafe { ep.sendmsg_xpu(&msg(&iov, ctx), 0, xpu, &mut vars) }.unwrap();
    assert_eq!(n, 1);
    vars[0]
}

fn xsend(ep: &Endpoint, ctx: Context) -> TriggerVar {
    xsend_on(ep, Xpu::CPU, ctx)
}

/// Stores `value` to the doorbell `var` names, as a CPU XPU does.
fn ring_to(var: &TriggerVar, value: u64) {
    // SAFETY: the mock's doorbells are live `AtomicU64`s while their endpoint is.
    unsafe { &*(var.addr as *const AtomicU64) }.store(value, Ordering::Release);
}

fn ring(var: &TriggerVar) {
    // SAFETY: a filled variable carries its value in val64 (FI_UINT64, count 1).
    ring_to(var, unsafe { var.value.val64 });
}

#[test]
fn getopt_reports_one_u64_and_refuses_xpus_it_cannot_serve() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    assert_eq!(e.ep.xpu_trigger_vars(Xpu::CPU, &mut []).unwrap(), 1);
    let mut vars = [TriggerVar {
        datatype: 0,
        count: 0,
        ..Default::default()
    }; 3];
    assert_eq!(e.ep.xpu_trigger_vars(Xpu::CPU, &mut vars).unwrap(), 1);
    assert_eq!(
        (vars[0].datatype, vars[0].count),
        (Datatype::UInt64 as i32, 1)
    );
    assert_eq!(
        (vars[1].datatype, vars[1].count),
        (0, 0),
        "only what is needed"
    );
    let gpu = Xpu {
        iface: Iface::Cuda,
        device: 0,
    };
    let err = e.ep.xpu_trigger_vars(gpu, &mut vars).unwrap_err();
    assert!(matches!(err, Error::OpNotSupp(_)), "{err}");

    // The C form writes the count back.
    let mut t = super::TriggerXpu {
        count: 0,
        iface: Iface::System as u32,
        device: super::XpuDevice { reserved: 0 },
        var: std::ptr::null_mut(),
    };
    // SAFETY: count 0: the array is not touched.
    unsafe { e.ep.getopt_xpu_trigger(&mut t) }.unwrap();
    assert_eq!(t.count, 1);

    let plain = w.ep_with(ALL_CAPS, 64, &[]);
    let err = plain.ep.xpu_trigger_vars(Xpu::CPU, &mut []).unwrap_err();
    assert!(err.to_string().contains("FI_XPU_TRIGGER"), "{err}");
}

#[test]
fn each_value_starts_what_it_reaches_in_posting_order_exactly_once() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let vars: Vec<_> = (1..=5).map(|ctx| xsend(&e.ep, ctx)).collect();
    for (k, v) in vars.iter().enumerate() {
        assert_eq!(v.addr, vars[0].addr, "one doorbell per (endpoint, XPU)");
        assert_eq!(unsafe { v.value.val64 }, k as u64 + 1);
    }
    e.ep.progress();
    assert!(w.sh.ctxs().is_empty(), "nothing starts before its doorbell");
    ring(&vars[1]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2]);
    e.ep.progress();
    ring(&vars[1]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2], "the same value again starts nothing");
    ring(&vars[4]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4, 5]);
    assert!(e.errors().is_empty());

    // A second XPU has its own doorbell and its own count.
    let other = Xpu {
        iface: Iface::System,
        device: 1,
    };
    let v = xsend_on(&e.ep, other, 6);
    assert_ne!(v.addr, vars[0].addr);
    assert_eq!(unsafe { v.value.val64 }, 1);
    ring(&v);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_value_past_what_was_armed_is_an_error_and_starts_nothing_unknown() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let vars: Vec<_> = (1..=3).map(|ctx| xsend(&e.ep, ctx)).collect();
    ring_to(&vars[0], 7);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3], "what was armed starts");
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    let x = &errs[0];
    assert_eq!(
        (x.op_context, x.err, x.prov_errno),
        (0, FI_EINVAL, XPU_ERR_PAST_ARMED)
    );
    assert_eq!((x.flags, x.data), (FI_TRIGGER, 7));
    // Later operations get values above the stray one, so it does not start them.
    let v = xsend(&e.ep, 4);
    assert_eq!(unsafe { v.value.val64 }, 8);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3]);
    ring(&v);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4]);
    assert!(e.errors().is_empty());
}

#[test]
fn a_value_going_backwards_is_an_error_and_restarts_nothing() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let vars: Vec<_> = (1..=4).map(|ctx| xsend(&e.ep, ctx)).collect();
    ring(&vars[2]);
    e.ep.progress();
    ring(&vars[0]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3]);
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].prov_errno, errs[0].data), (XPU_ERR_BACKWARDS, 1));
    ring(&vars[3]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4]);
}

/// An XPU that stores stray values without end (past what was armed, then backwards, over and
/// over) queues at most 8 misuse reports while they stay unread: the CQ keeps room for real
/// completions, an operation armed and rung afterwards completes, and a report is queued
/// again once the application has read the others.
#[test]
fn misuse_reports_are_bounded_while_unread() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let v = xsend(&e.ep, 1);
    for i in 0..1000u64 {
        ring_to(&v, if i % 2 == 0 { 100 + i } else { 3 });
        e.ep.progress();
    }
    assert_eq!(w.sh.ctxs(), [1], "only what was armed started");
    let errs = e.errors();
    assert_eq!(errs.len(), 8, "reports kept while unread");
    assert!(errs
        .iter()
        .all(|x| [XPU_ERR_PAST_ARMED, XPU_ERR_BACKWARDS].contains(&x.prov_errno)));
    // Read: the next misuse is reported again, and a real send still completes.
    let v = xsend(&e.ep, 2);
    ring_to(&v, 5000);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2]);
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!(
        (errs[0].prov_errno, errs[0].data),
        (XPU_ERR_PAST_ARMED, 5000)
    );
}

#[test]
fn cancel_and_close_release_armed_operations_with_canceled() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let vars: Vec<_> = (1..=3).map(|ctx| xsend(&e.ep, ctx)).collect();
    e.ep.cancel(2).unwrap();
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].op_context, errs[0].err), (2, FI_ECANCELED));
    assert!(e.ep.cancel(2).is_err(), "canceled once only");
    ring(&vars[2]);
    e.ep.progress();
    assert_eq!(
        w.sh.ctxs(),
        [1, 3],
        "a canceled value is skipped, not an error"
    );
    assert!(e.errors().is_empty());

    for ctx in 10..14 {
        xsend(&e.ep, ctx);
    }
    let Ep { ep, cq } = e;
    ep.close().unwrap();
    let mut canceled: Vec<_> = cq_errors(&cq).iter().map(|x| x.op_context).collect();
    canceled.sort();
    assert_eq!(canceled, [10, 11, 12, 13]);
    assert_eq!(w.sh.ctxs(), [1, 3]);
}

#[test]
fn at_most_xpu_armed_max_wait_then_again() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let mut last = TriggerVar::default();
    for ctx in 1..=XPU_ARMED_MAX {
        last = xsend(&e.ep, ctx);
    }
    let iov = [RawIov::of(&[0u8; 8])];
    let mut vars = [TriggerVar::default()];
    let r = unsafe { e.ep.sendmsg_xpu(&msg(&iov, 0), 0, Xpu::CPU, &mut vars) };
    assert!(matches!(r, Err(Error::Again(_))), "{r:?}");
    ring(&last);
    e.ep.progress();
    assert_eq!(w.sh.ctxs().len(), XPU_ARMED_MAX);
    assert!(
        w.sh.ctxs().windows(2).all(|p| p[0] < p[1]),
        "in posting order"
    );
    xsend(&e.ep, 0);
}

#[test]
fn refused_starts_wait_for_room_in_order() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let vars: Vec<_> = (1..=3).map(|ctx| xsend(&e.ep, ctx)).collect();
    w.sh.again.store(2, Ordering::Release);
    ring(&vars[2]);
    e.ep.progress();
    e.ep.progress();
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3]);
}

#[test]
fn misuse_and_bad_arguments_are_typed_errors() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let iov = [RawIov::of(&[0u8; 8])];
    let m = msg(&iov, 1);
    // SAFETY (all calls): rejected before anything is armed.
    let r = unsafe { e.ep.sendmsg_xpu(&m, 0, Xpu::CPU, &mut []) };
    assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
    let mut vars = [TriggerVar {
        datatype: Datatype::UInt32 as i32,
        ..Default::default()
    }];
    let r = unsafe { e.ep.sendmsg_xpu(&m, 0, Xpu::CPU, &mut vars) };
    assert!(matches!(r, Err(Error::Inval(_))), "{r:?}");
    let mut vars = [TriggerVar::default()];
    let r = unsafe { e.ep.sendmsg_xpu(&m, FI_INJECT, Xpu::CPU, &mut vars) };
    assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
    let gpu = Xpu {
        iface: Iface::Ze,
        device: 0,
    };
    let r = unsafe { e.ep.sendmsg_xpu(&m, 0, gpu, &mut vars) };
    assert!(matches!(r, Err(Error::OpNotSupp(_))), "{r:?}");
    assert!(vars[0].addr.is_null(), "nothing filled on error");

    // Writes and atomics arm the same way.
    let rma = [RmaIov {
        addr: 0,
        len: 8,
        key: 0,
    }];
    let wm = MsgRma {
        iov: &iov,
        desc: &[],
        addr: FI_ADDR_UNSPEC,
        rma_iov: &rma,
        context: 7,
        data: 0,
    };
    let v = unsafe { e.ep.writemsg_xpu(&wm, 0, Xpu::CPU, &mut vars) }.map(|_| vars[0]);
    let v = v.unwrap();
    ring(&v);
    e.ep.progress();
    assert_eq!(w.sh.log.lock().unwrap().last().copied(), Some(('m', 7)));

    let plain = w.ep_with(ALL_CAPS, 64, &[]);
    let r = unsafe { plain.ep.sendmsg_xpu(&m, 0, Xpu::CPU, &mut vars) };
    assert!(matches!(r, Err(Error::OpNotSupp(_))), "{r:?}");
}

#[test]
fn a_thread_rings_thousands_in_order() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let n = 5000;
    let vars: Vec<_> = (1..=n).map(|ctx| xsend(&e.ep, ctx)).collect();
    let t = std::thread::spawn(move || {
        for v in &vars {
            ring(v);
        }
    });
    while w.sh.ctxs().len() < n {
        e.ep.progress();
    }
    t.join().unwrap();
    assert_eq!(w.sh.ctxs(), (1..=n).collect::<Vec<_>>());
    assert!(e.errors().is_empty());
}

#[test]
fn a_stray_value_stored_while_nothing_is_armed_is_reported_and_starts_nothing_later() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let v = xsend(&e.ep, 1);
    ring(&v);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1]);
    // Nothing is armed now; the XPU stores past anything handed out.
    ring_to(&v, 51);
    e.ep.progress();
    let errs = e.errors();
    assert_eq!(errs.len(), 1, "reported when the watcher next runs");
    assert_eq!((errs[0].prov_errno, errs[0].data), (XPU_ERR_PAST_ARMED, 51));
    let later: Vec<_> = (2..=6).map(|ctx| xsend(&e.ep, ctx)).collect();
    e.ep.progress();
    assert_eq!(
        w.sh.ctxs(),
        [1],
        "the stray value starts nothing armed after it"
    );
    assert_eq!(unsafe { later[0].value.val64 }, 52);
    ring(&later[4]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4, 5, 6]);
    assert!(e.errors().is_empty());
}

#[test]
fn arming_judges_a_stray_value_no_watcher_has_seen_yet() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let v = xsend(&e.ep, 1);
    ring(&v);
    e.ep.progress();
    ring_to(&v, 51);
    // No progress between the store and the next arm.
    let later: Vec<_> = (2..=6).map(|ctx| xsend(&e.ep, ctx)).collect();
    let errs = e.errors();
    assert_eq!(errs.len(), 1, "reported before anything is armed after it");
    assert_eq!((errs[0].prov_errno, errs[0].data), (XPU_ERR_PAST_ARMED, 51));
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1]);
    ring(&later[4]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn a_doorbell_at_u64_max_saturates_and_refuses_further_arming() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let v = xsend(&e.ep, 1);
    ring_to(&v, u64::MAX);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1], "what was armed starts");
    let errs = e.errors();
    assert_eq!(errs.len(), 1);
    assert_eq!(
        (errs[0].prov_errno, errs[0].data),
        (XPU_ERR_PAST_ARMED, u64::MAX)
    );
    // No value is left above the stray one: arming says so instead of wrapping to 0.
    let iov = [RawIov::of(&[0u8; 8])];
    let mut vars = [TriggerVar::default()];
    // SAFETY: refused before anything is armed.
    let r = unsafe { e.ep.sendmsg_xpu(&msg(&iov, 2), 0, Xpu::CPU, &mut vars) };
    assert!(matches!(r, Err(Error::OpBadState(_))), "{r:?}");
    assert!(vars[0].addr.is_null(), "nothing filled on error");
    e.ep.progress();
    assert!(
        e.errors().is_empty(),
        "the value stays where it is: no BACKWARDS"
    );
    // Another XPU of the endpoint is unaffected.
    let other = Xpu {
        iface: Iface::System,
        device: 1,
    };
    let o = xsend_on(&e.ep, other, 3);
    ring(&o);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [1, 3]);
}

#[test]
fn a_cpu_ring_starts_what_it_rang_in_the_ringing_thread() {
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 64, &[]);
    let v = xsend(&e.ep, 41);
    // The XPU's store and the ring's notification, as kernels::cpu::ring does them: the send
    // starts before the call returns, with no progress call and no watcher awake.
    ring(&v);
    super::notify_xpu_ring();
    assert_eq!(w.sh.ctxs(), [41]);
    e.ep.progress();
    assert_eq!(w.sh.ctxs(), [41], "started once");
}

/// An XPU-trigger endpoint whose CQ can be waited on (`sread` drives the endpoint and sleeps
/// as its watcher decides).
fn waiting_ep(w: &World) -> Ep {
    waiting_ep_on(w, crate::consts::WaitObj::Unspec)
}

fn waiting_ep_on(w: &World, wait_obj: crate::consts::WaitObj) -> Ep {
    let ep = w.domain.endpoint(w.domain.info()).unwrap();
    let cq = w
        .domain
        .cq_open(&crate::cq::CqAttr {
            format: crate::consts::CqFormat::Tagged,
            size: 64,
            wait_obj,
            ..Default::default()
        })
        .unwrap();
    let av = w.domain.av_open(&crate::av::AvAttr::default()).unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    Ep { ep, cq }
}

/// Reads `cq` (the watcher, under manual progress) until `n` send completions came, each
/// read waiting at most 10 s; returns their contexts in the order read.
fn read_sends(cq: &crate::cq::CompletionQueue, n: usize) -> Vec<Context> {
    let mut got = Vec::new();
    let mut buf = [crate::entry::CqTaggedEntry::default(); 8];
    while got.len() < n {
        match cq.sread(&mut buf, 1, 10_000) {
            Ok(k) => got.extend(buf[..k].iter().map(|e| e.op_context)),
            Err(e) => panic!("after {} of {n} completions: {e}", got.len()),
        }
    }
    got
}

#[test]
fn a_device_like_ring_past_the_spin_window_is_started_once_and_in_order() {
    // A device's ring: a store and nothing else (no notify_xpu_ring), after the spin window
    // that follows each arm has passed, one ring at a time and then several armed at once.
    // The watcher (this thread's blocking CQ reads: it sleeps and spins as the predictor
    // says) finds every one, starts each exactly once, in order, and nothing before its ring.
    for wait_obj in [
        crate::consts::WaitObj::Unspec,
        crate::consts::WaitObj::MutexCond,
    ] {
        device_like_rings(wait_obj);
    }
}

fn device_like_rings(wait_obj: crate::consts::WaitObj) {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let e = waiting_ep_on(&w, wait_obj);
    let sh = w.sh.clone();
    let rounds = 6;
    for ctx in 1..=rounds {
        let v = xsend(&e.ep, ctx);
        let sh = sh.clone();
        let xpu = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(3));
            assert_eq!(sh.ctxs().len(), ctx - 1, "nothing starts before its ring");
            ring(&v);
        });
        assert_eq!(read_sends(&e.cq, 1), [ctx]);
        xpu.join().unwrap();
    }
    let vars: Vec<_> = (rounds + 1..=rounds + 4)
        .map(|ctx| xsend(&e.ep, ctx))
        .collect();
    let xpu = std::thread::spawn(move || {
        for (i, v) in vars.iter().enumerate() {
            std::thread::sleep(std::time::Duration::from_millis(2));
            // What was rung may not have started yet (the watcher's pace is not asserted);
            // nothing beyond it has.
            let started = sh.ctxs().len();
            assert!(
                started <= rounds + i,
                "nothing starts before its ring: {started}"
            );
            ring(v);
        }
    });
    assert_eq!(
        read_sends(&e.cq, 4),
        (rounds + 1..=rounds + 4).collect::<Vec<_>>()
    );
    xpu.join().unwrap();
    assert_eq!(
        w.sh.ctxs(),
        (1..=rounds + 4).collect::<Vec<_>>(),
        "each once"
    );
    assert!(e.errors().is_empty());
}

#[test]
fn a_silent_endpoint_beside_does_not_hide_another_endpoints_ring() {
    // Two endpoints on one CQ, each with a send armed; only the second's XPU rings, as a
    // device does. The CQ's reads drive both and find it.
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let a = waiting_ep(&w);
    let b = w.domain.endpoint(w.domain.info()).unwrap();
    let av = w.domain.av_open(&crate::av::AvAttr::default()).unwrap();
    b.bind_cq(&a.cq, FI_TRANSMIT | FI_RECV).unwrap();
    b.bind_av(&av).unwrap();
    b.enable().unwrap();
    xsend(&a.ep, 1);
    for ctx in 2..=4 {
        let v = xsend(&b, ctx);
        let xpu = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(2));
            ring(&v);
        });
        assert_eq!(read_sends(&a.cq, 1), [ctx]);
        xpu.join().unwrap();
    }
    assert_eq!(w.sh.ctxs(), [2, 3, 4]);
    b.close().unwrap();
}

/// An endpoint that can watch XPUs but has no doorbell and no ring of its own, in a process
/// where a counter is exported: its watcher looks at the counters' rings and may then sleep
/// (it returned from every sleep at once, and a progress thread spun a core).
#[test]
fn a_watcher_with_only_exported_counters_to_watch_sleeps() {
    use crate::wait::ProgressSource;
    let w = World::new();
    let e = w.ep_with(XPU_CAPS, 1024, &[]);
    let c = w.cntr();
    let _x = c.export_xpu(Xpu::CPU).unwrap();
    let link = e.ep.link().expect("an FI_TRIGGER endpoint's link").clone();
    link.progress();
    // It must look again by time (the counters' rings)...
    assert!(
        link.next_look().is_some_and(|d| !d.is_zero()),
        "{:?}",
        link.next_look()
    );
    // ... and its look is recorded, which is what lets the sleep until then happen (a sleep
    // with no look recorded returns at once, lest it sleep through a ring nobody saw).
    assert!(
        super::xpu_wake::looked(),
        "the progress call recorded no look"
    );
}
