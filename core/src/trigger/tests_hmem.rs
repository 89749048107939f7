//! Triggered operations on device memory (`FI_HMEM` endpoints), against the mock provider and
//! a fake device whose memory is host memory: fired operations are staged as immediate ones
//! are, a send's data is gathered when it fires, a receive lands before its completion.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::testkit::*;
use super::{TriggerContext, TriggerVar, Xpu};
use crate::cntr::Counter;
use crate::consts::errno::{FI_ECANCELED, FI_EIO};
use crate::consts::*;
use crate::entry::Context;
use crate::ep::Endpoint;
use crate::rxq::RawIov;
use crate::work::{DeferredWork, OpMsg, WorkOp};

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A world with a fake device; its sends keep their bytes.
fn device_world() -> (World, Arc<FakeHmem>) {
    let fake = Arc::new(FakeHmem::default());
    let w = World::with_hmem(fake.clone());
    w.sh.keep_data.store(true, Ordering::Release);
    (w, fake)
}

const HCAPS: u64 = XPU_CAPS | FI_HMEM;

/// Queues deferred work sending `iov` on `ep` as context `ctx` once `trig` reaches 1,
/// counting on `done`.
///
/// # Safety
/// `iov`'s memory stays valid until the work completes.
unsafe fn queue_deferred_send(
    w: &World,
    ep: &Endpoint,
    trig: &Counter,
    done: &Counter,
    iov: &[RawIov],
    ctx: Context,
) {
    let work = DeferredWork {
        threshold: 1,
        triggering_cntr: trig,
        completion_cntr: Some(done),
        op: WorkOp::Send(OpMsg {
            ep,
            msg: msg(iov, ctx),
            flags: 0,
        }),
    };
    // SAFETY: the caller's contract.
    unsafe { w.domain.queue_work(&work) }.unwrap();
}

/// Stores `var`'s value to its doorbell, as a CPU XPU does.
fn ring(var: &TriggerVar) {
    // SAFETY: the mock's doorbells are live `AtomicU64`s while their endpoint is; a filled
    // variable carries its value in val64.
    unsafe {
        let bell = &*(var.addr as *const std::sync::atomic::AtomicU64);
        bell.store(var.value.val64, Ordering::Release);
    }
}

#[test]
fn triggered_sends_from_device_memory_are_gathered_when_they_fire() {
    let (w, fake) = device_world();
    w.sh.inline.store(true, Ordering::Release);
    let e = w.ep_with(HCAPS, 64, &[]);
    let c = w.cntr();
    let mut dev = vec![0u8; 100];
    fake.add(&dev);
    let iov = [RawIov::of(&dev)];
    // SAFETY: `dev` outlives the endpoint's use of it (everything completes below).
    unsafe {
        e.ep.sendmsg_triggered(&msg(&iov, 7), 0, &TriggerContext::threshold(&c, 1))
    }
    .unwrap();
    assert_eq!(
        fake.to_host.load(Ordering::Acquire),
        0,
        "not read when armed"
    );
    // The device produces the data after the send was armed, before the trigger.
    let want = data(100, 1);
    dev.copy_from_slice(&want);
    c.add(1).unwrap();
    {
        let sent = w.sh.sent.lock().unwrap();
        assert_eq!(sent.len(), 1);
        assert_ne!(sent[0].0, 7, "the provider is handed the staging context");
        assert!(
            sent[0].1 == want,
            "what the device held at the trigger is sent"
        );
    }
    assert_eq!(fake.to_host.load(Ordering::Acquire), 1);
    let ent = e.entries();
    assert_eq!(ent.len(), 1);
    assert_eq!(ent[0].op_context, 7, "the application's context comes back");
    assert!(e.ep.core().staging.key_of(7).is_none(), "bounce released");

    // Refused once (a full ring): retried from the endpoint's progress, gathered again then.
    w.sh.again.store(1, Ordering::Release);
    // SAFETY: as above.
    unsafe {
        e.ep.sendmsg_triggered(&msg(&iov, 8), 0, &TriggerContext::threshold(&c, 2))
    }
    .unwrap();
    c.add(1).unwrap();
    assert_eq!(w.sh.sent.lock().unwrap().len(), 1, "refused");
    assert!(
        e.ep.core().staging.key_of(8).is_none(),
        "nothing held while refused"
    );
    let want = data(100, 2);
    dev.copy_from_slice(&want);
    e.ep.progress();
    assert!(w.sh.sent.lock().unwrap()[1].1 == want);
    assert_eq!(e.entries()[0].op_context, 8);

    // Host memory on the same endpoint goes to the provider as it is.
    let host = data(16, 3);
    let hiov = [RawIov::of(&host)];
    // SAFETY: as above.
    unsafe {
        e.ep.sendmsg_triggered(&msg(&hiov, 9), 0, &TriggerContext::threshold(&c, 3))
    }
    .unwrap();
    c.add(1).unwrap();
    assert_eq!(w.sh.sent.lock().unwrap()[2], (9, host));
    // Sends 7 and 8 (twice: refused, then retried); none for host memory.
    assert_eq!(fake.to_host.load(Ordering::Acquire), 3);
}

#[test]
fn xpu_triggered_and_deferred_sends_from_device_memory_are_staged_too() {
    let (w, fake) = device_world();
    w.sh.inline.store(true, Ordering::Release);
    let e = w.ep_with(HCAPS, 64, &[]);
    let mut dev = vec![0u8; 64];
    fake.add(&dev);
    let iov = [RawIov::of(&dev)];

    let mut vars = [TriggerVar::default()];
    // SAFETY: `dev` outlives the endpoint's use of it.
    unsafe { e.ep.tsendmsg_xpu(&msg(&iov, 21), 0, Xpu::CPU, &mut vars) }.unwrap();
    let want = data(64, 4);
    dev.copy_from_slice(&want);
    e.ep.progress();
    assert!(
        w.sh.sent.lock().unwrap().is_empty(),
        "not before the XPU rings"
    );
    ring(&vars[0]);
    e.ep.progress();
    assert!(w.sh.sent.lock().unwrap()[0].1 == want);
    assert_eq!(e.entries()[0].op_context, 21);

    // Deferred work: staging context, then the work's record, then the application's.
    let trig = w.cntr();
    let done = w.cntr();
    for (ctx, flags) in [(22, 0), (23, FI_COMPLETION)] {
        let work = DeferredWork {
            threshold: 1,
            triggering_cntr: &trig,
            completion_cntr: Some(&done),
            op: WorkOp::Send(OpMsg {
                ep: &e.ep,
                msg: msg(&iov, ctx),
                flags,
            }),
        };
        // SAFETY: as above.
        unsafe { w.domain.queue_work(&work) }.unwrap();
    }
    let want = data(64, 5);
    dev.copy_from_slice(&want);
    trig.add(1).unwrap();
    let sent = w.sh.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 3);
    assert!(sent[1].1 == want && sent[2].1 == want);
    assert_eq!(done.read(), 2, "both counted on the completion counter");
    let ent = e.entries();
    assert_eq!(ent.len(), 1, "only the one with FI_COMPLETION");
    assert_eq!(ent[0].op_context, 23);
    assert_eq!(fake.to_host.load(Ordering::Acquire), 3);
}

#[test]
fn triggered_receives_into_device_memory_land_before_their_completion() {
    let (w, fake) = device_world();
    let rcv = w.cntr();
    let e = w.ep_with(HCAPS, 64, &[(&rcv, FI_RECV)]);
    let watched = rcv.inner().clone();
    fake.watch(move || watched.value());
    let c = w.cntr();
    let mut dev = vec![0u8; 80];
    fake.add(&dev);
    let dev_addr = dev.as_ptr() as usize;
    let iov = [RawIov::of_mut(&mut dev)];
    // SAFETY: `dev` outlives the receive (completed below) and is not touched meanwhile.
    unsafe {
        e.ep.recvmsg_triggered(&msg(&iov, 31), 0, &TriggerContext::threshold(&c, 1))
    }
    .unwrap();
    assert!(w.sh.recvs.lock().unwrap().is_empty(), "not posted yet");
    c.add(1).unwrap();
    {
        let rs = w.sh.recvs.lock().unwrap();
        assert_eq!(rs.len(), 1);
        assert_ne!(rs[0].1.ctx, 31, "posted with the staging context");
        assert_ne!(rs[0].1.iov.first_addr(), dev_addr, "into a bounce buffer");
    }
    let want = data(80, 6);
    w.sh.deliver_data(&want);
    assert_eq!(
        *fake.seen.lock().unwrap(),
        [0],
        "landed while the receive counter still read 0"
    );
    assert_eq!(rcv.read(), 1);
    let ent = e.entries();
    assert_eq!(ent.len(), 1);
    assert_eq!((ent[0].op_context, ent[0].len), (31, 80));
    assert_eq!(ent[0].buf, dev_addr, "the application's buffer is reported");
    assert!(dev == want);

    // A deferred receive into device memory lands before its completion counter counts it.
    let trig = w.cntr();
    let done = w.cntr();
    let watched = done.inner().clone();
    fake.watch(move || watched.value());
    let iov = [RawIov::of_mut(&mut dev)];
    let work = DeferredWork {
        threshold: 1,
        triggering_cntr: &trig,
        completion_cntr: Some(&done),
        op: WorkOp::Recv(OpMsg {
            ep: &e.ep,
            msg: msg(&iov, 32),
            flags: 0,
        }),
    };
    // SAFETY: as above.
    unsafe { w.domain.queue_work(&work) }.unwrap();
    trig.add(1).unwrap();
    let want = data(80, 7);
    w.sh.deliver_data(&want);
    assert_eq!(*fake.seen.lock().unwrap(), [0, 0]);
    assert_eq!(done.read(), 1);
    assert!(e.entries().is_empty(), "no endpoint completion asked for");
    assert!(dev == want);
}

#[test]
fn canceled_triggered_operations_on_device_memory_release_cleanly() {
    let (w, fake) = device_world();
    let e = w.ep_with(HCAPS, 64, &[]);
    let c = w.cntr();
    let mut dev = vec![0u8; 32];
    fake.add(&dev);
    let siov = [RawIov::of(&dev)];
    // Armed, never fired: nothing was staged, nothing is read.
    // SAFETY: `dev` outlives the endpoint's use of it.
    unsafe {
        e.ep.sendmsg_triggered(&msg(&siov, 41), 0, &TriggerContext::threshold(&c, 5))
    }
    .unwrap();
    let mut vars = [TriggerVar::default()];
    // SAFETY: as above.
    unsafe { e.ep.sendmsg_xpu(&msg(&siov, 42), 0, Xpu::CPU, &mut vars) }.unwrap();
    e.ep.cancel(41).unwrap();
    e.ep.cancel(42).unwrap();

    // Fired, staged and posted to the provider: canceled there under its staging context.
    let riov = [RawIov::of_mut(&mut dev)];
    // SAFETY: as above.
    unsafe {
        e.ep.recvmsg_triggered(&msg(&riov, 43), 0, &TriggerContext::threshold(&c, 1))
    }
    .unwrap();
    c.add(1).unwrap();
    assert_eq!(w.sh.recvs.lock().unwrap().len(), 1);
    assert!(e.ep.core().staging.key_of(43).is_some());
    e.ep.cancel(43).unwrap();
    assert!(w.sh.recvs.lock().unwrap().is_empty());
    assert!(e.ep.core().staging.key_of(43).is_none(), "bounce released");

    let mut errs: Vec<_> = e.errors().iter().map(|x| (x.op_context, x.err)).collect();
    errs.sort_unstable();
    assert_eq!(
        errs,
        [(41, FI_ECANCELED), (42, FI_ECANCELED), (43, FI_ECANCELED)]
    );
    assert_eq!(fake.to_host.load(Ordering::Acquire), 0);
    assert_eq!(fake.from_host.load(Ordering::Acquire), 0);
    assert!(w.sh.ctxs().iter().all(|&k| k != 41 && k != 42));
    assert!(e.ep.cancel(43).is_err(), "canceled once only");
}

#[test]
fn a_device_copy_failing_at_the_trigger_fails_that_operation_with_eio() {
    let (w, fake) = device_world();
    let e = w.ep_with(HCAPS, 64, &[]);
    let c = w.cntr();
    let mut dev = vec![0u8; 48];
    fake.add(&dev);
    let siov = [RawIov::of(&dev)];
    fake.fail.store(true, Ordering::Release);
    // SAFETY: `dev` outlives the endpoint's use of it.
    unsafe {
        e.ep.sendmsg_triggered(&msg(&siov, 51), 0, &TriggerContext::threshold(&c, 1))
    }
    .unwrap();
    let done = w.cntr();
    // SAFETY: as above.
    unsafe { queue_deferred_send(&w, &e.ep, &c, &done, &siov, 52) };
    c.add(1).unwrap();
    assert!(w.sh.ctxs().is_empty(), "the provider was given neither");
    let errs: Vec<_> = e.errors().iter().map(|x| (x.op_context, x.err)).collect();
    assert_eq!(
        errs,
        [(51, FI_EIO)],
        "deferred work without FI_COMPLETION: counter only"
    );
    assert_eq!((done.read(), done.readerr()), (0, 1));
    let why = e.ep.core().take_staging_errors();
    assert_eq!(why.len(), 2);
    assert!(
        why[0].to_string().contains("device copy failed"),
        "{}",
        why[0]
    );

    // A fired receive whose landing copy fails completes with FI_EIO, under the user's context.
    fake.fail.store(false, Ordering::Release);
    let riov = [RawIov::of_mut(&mut dev)];
    // SAFETY: as above.
    unsafe {
        e.ep.recvmsg_triggered(&msg(&riov, 53), 0, &TriggerContext::threshold(&c, 2))
    }
    .unwrap();
    c.add(1).unwrap();
    fake.fail.store(true, Ordering::Release);
    w.sh.deliver_data(&data(48, 8));
    let errs: Vec<_> = e.errors().iter().map(|x| (x.op_context, x.err)).collect();
    assert_eq!(errs, [(53, FI_EIO)]);
    assert!(e.ep.core().staging.key_of(53).is_none());
}

#[test]
fn triggered_atomics_on_device_memory_are_staged_when_they_fire() {
    let (w, fake) = device_world();
    w.sh.inline.store(true, Ordering::Release);
    let e = w.ep_with(HCAPS, 64, &[]);
    let c = w.cntr();
    let mut operand = vec![0u8; 8];
    let mut result = vec![0xffu8; 8];
    fake.add(&operand);
    fake.add(&result);
    let m = crate::ep::atomic::MsgAtomic {
        addr: 0,
        rma_addr: 0,
        key: 1,
        datatype: crate::atomic::Datatype::UInt64,
        op: crate::atomic::AtomicOp::Sum,
        context: 11,
    };
    // SAFETY: both buffers outlive the operation (it completes below); the raw views are
    // only handed to the endpoint.
    unsafe {
        let op = std::slice::from_raw_parts(operand.as_ptr(), 8);
        let res = std::slice::from_raw_parts_mut(result.as_mut_ptr(), 8);
        e.ep.fetch_atomicmsg_triggered(&m, op, res, 1, 0, &TriggerContext::threshold(&c, 1))
    }
    .unwrap();
    assert_eq!(
        fake.to_host.load(Ordering::Acquire),
        0,
        "not read when armed"
    );
    // The device writes the operand after arming.
    operand.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    c.add(1).unwrap();
    let sent = w.sh.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_ne!(sent[0].0, 11, "the provider is handed the staging context");
    assert_eq!(
        sent[0].1,
        [1, 2, 3, 4, 5, 6, 7, 8],
        "the operand at the trigger"
    );
    let ent = e.entries();
    assert_eq!(ent.len(), 1);
    assert_eq!(ent[0].op_context, 11);
    assert_eq!(
        result,
        [8, 7, 6, 5, 4, 3, 2, 1],
        "the fetched values landed on the device"
    );
    assert_eq!(fake.from_host.load(Ordering::Acquire), 1);
}

/// With resource management, deferred work without `FI_COMPLETION` whose start fails (its
/// device memory cannot be staged) gives back only its own reservation, which the failed
/// start returned already: a send in flight keeps its room. Before, the failure's report
/// gave back another, and the CQ of two took three posts.
#[test]
fn a_failed_deferred_start_keeps_other_operations_room() {
    let (w, fake) = device_world();
    let e = w.ep_managed_caps(HCAPS, 2);
    let c = w.cntr();
    let host = [0u8; 8];
    let hiov = [RawIov::of(&host)];
    // SAFETY: the mock never reads it.
    unsafe { e.ep.sendmsg(&msg(&hiov, 1), 0) }.unwrap();
    let dev = vec![0u8; 48];
    fake.add(&dev);
    let siov = [RawIov::of(&dev)];
    fake.fail.store(true, Ordering::Release);
    let done = w.cntr();
    // SAFETY: as above.
    unsafe { queue_deferred_send(&w, &e.ep, &c, &done, &siov, 52) };
    c.add(1).unwrap();
    assert_eq!((done.read(), done.readerr()), (0, 1));
    fake.fail.store(false, Ordering::Release);
    // SAFETY: as above.
    let r3 = unsafe { e.ep.sendmsg(&msg(&hiov, 3), 0) };
    // SAFETY: as above.
    let r4 = unsafe { e.ep.sendmsg(&msg(&hiov, 4), 0) };
    assert!(r3.is_ok(), "{r3:?}");
    assert!(
        matches!(r4, Err(crate::error::Error::Again(_))),
        "a post past the CQ's room was taken: {r4:?}"
    );
}

/// A staging key names one operation for good: a receive completed, another posted at once
/// gets a key of its own (a record's address came back for the next, and a cancel that had
/// looked up the first's key canceled the second). And `fi_cancel` of a context several
/// staged operations share picks its receive, not one of its sends.
#[test]
fn staging_keys_are_never_reused_and_a_cancel_picks_the_receive() {
    let (w, fake) = device_world();
    let e = w.ep_with(HCAPS, 64, &[]);
    let dev = vec![0u8; 32];
    fake.add(&dev);
    let iov = [RawIov::of(&dev)];
    // SAFETY: `dev` outlives every operation below (each completes or is canceled).
    unsafe { e.ep.recvmsg(&msg(&iov, 1), 0) }.unwrap();
    let first = e.ep.core().staging.key_of(1).expect("staged");
    w.sh.deliver(4);
    assert_eq!(e.entries().len(), 1);
    // SAFETY: as above.
    unsafe { e.ep.recvmsg(&msg(&iov, 2), 0) }.unwrap();
    let second = e.ep.core().staging.key_of(2).expect("staged");
    assert_ne!(first, second, "a key reused");
    w.sh.deliver(4);
    assert_eq!(e.entries().len(), 1);
    // Sixteen sends and a receive under context 0: the cancel finds the receive.
    for _ in 0..16 {
        // SAFETY: as above; the mock keeps sends in flight (no inline completion).
        unsafe { e.ep.sendmsg(&msg(&iov, 0), 0) }.unwrap();
    }
    // SAFETY: as above.
    unsafe { e.ep.recvmsg(&msg(&iov, 0), 0) }.unwrap();
    e.ep.cancel(0).unwrap();
    let errs: Vec<_> = e
        .errors()
        .iter()
        .map(|x| (x.op_context, x.err, x.flags & FI_RECV))
        .collect();
    assert_eq!(errs, [(0, FI_ECANCELED, FI_RECV)]);
}
