//! Triggered operations on device memory between two real processes over the provider under test
//! (`XFABRIC_TEST_PROVIDER`: shm, tcp): they are staged through host bounce buffers exactly as
//! immediate ones are. The sender's CUDA buffers are zero when their sends are armed and the data
//! is written to the device only afterwards, before each trigger, so a send that read its data when
//! armed would carry zeros. Four kinds, each at eager (100 B) and rendezvous (100 KB, 1 MiB) sizes,
//! the receiver checking every byte:
//!
//! 1. counter-triggered tagged sends from CUDA memory (`tsendmsg_triggered`);
//! 2. triggered receives into CUDA memory, armed on the receiver's receive counter: at each
//!    completion the data is already on the device;
//! 3. XPU-triggered tagged sends from CUDA memory, rung by a CPU XPU (`Xpu::CPU`);
//! 4. deferred-work sends from CUDA memory, counted on a completion counter.
//!
//! CUDA is the test double (see `common::cuda_double`); the same checks run on a real GPU with
//! `XFABRIC_GPU_TESTS=1` (skipped with a reason otherwise).

#![cfg(feature = "cuda")]

mod common;

use common::cuda_double::*;
use common::*;
use xfabric::hmem::DeviceBuffer;
use xfabric::kernels::cpu::ring;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER | FI_HMEM;
/// Eager, rendezvous, rendezvous split.
const SIZES: [usize; 3] = [100, 100_000, 1 << 20];
/// One tag per kind (the numbering above). The receiver's contexts are `tag * 100 + i`.
const T_THRESHOLD: u64 = 1;
const T_RECV: u64 = 2;
const T_XPU: u64 = 3;
const T_DEFERRED: u64 = 4;

/// The bytes of message `i` of kind `tag`.
fn data_of(tag: u64, i: usize) -> Vec<u8> {
    pattern(SIZES[i], tag * 10 + i as u64)
}

fn ctx_of(tag: u64, i: usize) -> Context {
    tag as usize * 100 + i
}

/// Device buffers, one per size, zeroed.
fn zeroed_device_buffers() -> Vec<DeviceBuffer> {
    SIZES
        .iter()
        .map(|&len| {
            let b = cuda().alloc_device(0, len).expect("device buffer");
            to_device(&b, &vec![0u8; len]);
            b
        })
        .collect()
}

fn zero(bufs: &[DeviceBuffer]) {
    for (b, &len) in bufs.iter().zip(&SIZES) {
        to_device(b, &vec![0u8; len]);
    }
}

fn iov_of(b: &DeviceBuffer, len: usize) -> [RawIov; 1] {
    [RawIov {
        addr: b.as_ptr() as usize,
        len,
    }]
}

/// Checks that `done` are the completions of contexts `tag * 100 + 0..3`, in any order.
fn check_contexts(done: &[CqTaggedEntry], tag: u64) {
    let mut got: Vec<_> = done.iter().map(|e| e.op_context).collect();
    got.sort_unstable();
    let want: Vec<_> = (0..SIZES.len()).map(|i| ctx_of(tag, i)).collect();
    assert_eq!(got, want, "the application's contexts, once each");
}

/// Device-to-host copies so far (the double's count; `None` on a real GPU), plus the sends
/// from device memory offered to the peer by CUDA IPC (over shm, from
/// `XFABRIC_SHM_IPC_MIN`): the peer copies those out of device memory itself.
fn dtoh() -> Option<i32> {
    let offered = xfabric_core::hmem_stage::offer_counts().offered;
    double_counter("cuda_double_dtoh_copies").map(|n| n + offered as i32)
}

/// Checks that the sends of kind `tag` since `before` were gathered out of device memory
/// (the double's device memory is readable host memory: a provider handed it directly would
/// send the right bytes without anyone copying them out).
fn check_gathered(before: Option<i32>, tag: u64) {
    if let (Some(a), Some(b)) = (before, dtoh()) {
        assert!(
            b - a >= SIZES.len() as i32,
            "kind {tag}: {} device-to-host copies for {} sends from device memory",
            b - a,
            SIZES.len()
        );
    }
}

/// The sender: every kind of triggered send from device memory, and host sends for the
/// receiver's triggered device receives.
fn sender(test: &str) {
    let n = node(CAPS, Progress::Manual);
    assert_ne!(n.info.caps & FI_HMEM, 0);
    let mut rx = spawn(test, "receiver", &[]);
    let peer = connect(&mut rx, &n);
    assert_eq!(rx.hear(), "ready");
    let bufs = zeroed_device_buffers();

    // 1: armed first; each message's data reaches the device just before its threshold.
    let go = n.domain.cntr_open(&CntrAttr::default()).unwrap();
    let before = dtoh();
    for (i, b) in bufs.iter().enumerate() {
        let iov = iov_of(b, SIZES[i]);
        let m = tmsg(&iov, peer, ctx_of(T_THRESHOLD, i), T_THRESHOLD, 0);
        let trig = TriggerContext::threshold(&go, i as u64 + 1);
        // SAFETY: `bufs` outlive the sends (their completions are waited for below).
        unsafe { n.ep.tsendmsg_triggered(&m, 0, &trig) }.expect("arm a triggered send");
    }
    for (i, b) in bufs.iter().enumerate() {
        to_device(b, &data_of(T_THRESHOLD, i));
        go.add(1).unwrap();
    }
    check_contexts(&n.wait_n(SIZES.len()), T_THRESHOLD);
    check_gathered(before, T_THRESHOLD);

    // 2: host data for the receiver's triggered receives into its device memory.
    let out: Vec<Vec<u8>> = (0..SIZES.len()).map(|i| data_of(T_RECV, i)).collect();
    for (i, d) in out.iter().enumerate() {
        // SAFETY: `out` outlives the sends (waited for below).
        n.retry(|| unsafe { n.ep.tsend(d, None, peer, T_RECV, ctx_of(T_RECV, i)) });
    }
    check_contexts(&n.wait_n(SIZES.len()), T_RECV);

    // 3: XPU-triggered: armed on zeroed buffers; the CPU XPU writes each buffer, then rings.
    zero(&bufs);
    let before = dtoh();
    let mut vars = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        let iov = iov_of(b, SIZES[i]);
        let m = tmsg(&iov, peer, ctx_of(T_XPU, i), T_XPU, 0);
        let mut v = [TriggerVar::default()];
        // SAFETY: as in 1.
        unsafe { n.ep.tsendmsg_xpu(&m, 0, Xpu::CPU, &mut v) }.expect("arm an XPU send");
        vars.push(v[0]);
    }
    for (i, (b, v)) in bufs.iter().zip(&vars).enumerate() {
        to_device(b, &data_of(T_XPU, i));
        // SAFETY: a variable the endpoint filled for the CPU XPU; its doorbell lives as long
        // as the endpoint.
        unsafe { ring(std::slice::from_ref(v)) }.expect("ring");
    }
    check_contexts(&n.wait_n(SIZES.len()), T_XPU);
    check_gathered(before, T_XPU);

    // 4: deferred work, counted on its completion counter only.
    zero(&bufs);
    let before = dtoh();
    let start = n.domain.cntr_open(&CntrAttr::default()).unwrap();
    let done = n.domain.cntr_open(&CntrAttr::default()).unwrap();
    for (i, b) in bufs.iter().enumerate() {
        let iov = iov_of(b, SIZES[i]);
        let work = DeferredWork {
            threshold: i as u64 + 1,
            triggering_cntr: &start,
            completion_cntr: Some(&done),
            op: WorkOp::TSend(OpMsg {
                ep: &n.ep,
                msg: tmsg(&iov, peer, ctx_of(T_DEFERRED, i), T_DEFERRED, 0),
                flags: 0,
            }),
        };
        // SAFETY: as in 1 (the completion counter is waited for below).
        unsafe { n.domain.queue_work(&work) }.expect("queue work");
    }
    for (i, b) in bufs.iter().enumerate() {
        to_device(b, &data_of(T_DEFERRED, i));
        start.add(1).unwrap();
    }
    done.wait(SIZES.len() as u64, 20_000)
        .expect("the deferred sends complete");
    assert_eq!((done.read(), done.readerr()), (SIZES.len() as u64, 0));
    check_gathered(before, T_DEFERRED);

    assert_eq!(rx.hear(), "ok");
    assert!(n.ep.core().take_staging_errors().is_empty());
    let pid = rx.pid();
    rx.join();
    assert_eq!(segments_of(pid), 0, "the receiver left a segment");
    drop(bufs);
    assert!(cuda().take_drop_errors().is_empty());
}

/// The receiver: host receives for the sends from device memory; triggered receives into
/// device memory, armed on its receive counter reaching the number of messages of kind 1.
fn receiver() {
    let mut cntr = None;
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |_| {},
        4096,
        |d: &Domain, ep: &Endpoint| {
            let c = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&c, FI_RECV).unwrap();
            cntr = Some(c);
        },
    );
    let received = cntr.unwrap();
    let parent = connect_parent(&n);
    let mut host = Vec::new();
    for tag in [T_THRESHOLD, T_XPU, T_DEFERRED] {
        for (i, &len) in SIZES.iter().enumerate() {
            host.push((ctx_of(tag, i), tag, i, vec![0u8; len]));
        }
    }
    for (ctx, tag, _, buf) in host.iter_mut() {
        let iov = [RawIov::of_mut(buf)];
        // SAFETY: `host` outlives the receives (all completed below).
        unsafe { n.ep.trecvmsg(&tmsg(&iov, parent, *ctx, *tag, 0), 0) }.expect("post");
    }
    let dev = zeroed_device_buffers();
    // Each triggered receive lands through host-to-device copies, before its completion.
    let landed = || double_counter("cuda_double_htod_landed");
    let landed_before = landed();
    let mut device_done = 0;
    let after = TriggerContext::threshold(&received, SIZES.len() as u64);
    for (i, b) in dev.iter().enumerate() {
        let iov = iov_of(b, SIZES[i]);
        let m = tmsg(&iov, parent, ctx_of(T_RECV, i), T_RECV, 0);
        // SAFETY: `dev` outlives the receives (completed below) and is not otherwise touched.
        unsafe { n.ep.trecvmsg_triggered(&m, 0, &after) }.expect("arm a triggered receive");
    }
    say("ready");
    for _ in 0..host.len() + dev.len() {
        let c = n.wait_one();
        if (c.op_context / 100) as u64 == T_RECV {
            let i = c.op_context % 100;
            if let Some(pending) = double_counter("cuda_double_htod_pending") {
                assert_eq!(pending, 0, "completion before the data reached the device");
            }
            device_done += 1;
            // At least one copy per receive reported so far (progress may have landed and
            // reported more before this entry was read).
            if let (Some(a), Some(b)) = (landed_before, landed()) {
                assert!(
                    b - a >= device_done,
                    "{device_done} device receives reported, {} copies landed: not staged",
                    b - a
                );
            }
            assert_eq!((c.len, c.buf), (SIZES[i], dev[i].as_ptr() as usize));
            assert!(
                from_device(&dev[i], SIZES[i]) == data_of(T_RECV, i),
                "device receive {i} differs"
            );
            continue;
        }
        let (_, tag, i, buf) = host
            .iter()
            .find(|h| h.0 == c.op_context)
            .unwrap_or_else(|| panic!("unknown context {}", c.op_context));
        assert_eq!(c.len, SIZES[*i]);
        assert!(
            *buf == data_of(*tag, *i),
            "kind {tag} message {i} differs (zeros: read before its trigger)"
        );
    }
    drop(dev);
    assert!(cuda().take_drop_errors().is_empty());
    if let Some(landed) = double_counter("cuda_double_htod_landed") {
        assert!(landed > 0);
    }
    say("ok");
}

fn run_roles(test: &str) -> bool {
    match role().as_deref() {
        Some("sender") => sender(test),
        Some("receiver") => receiver(),
        Some(r) => panic!("unknown role {r}"),
        None => return false,
    }
    say("OK");
    true
}

#[test]
fn cuda_double_triggered_operations_on_device_memory() {
    const NAME: &str = "cuda_double_triggered_operations_on_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "sender", &double_env(), &[]);
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_triggered_operations_on_device_memory() {
    const NAME: &str = "gpu_triggered_operations_on_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "sender", &[], &[]);
}
