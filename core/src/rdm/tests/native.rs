//! Operations the transport's NIC carries out (`transport::Native`): which go there, that
//! they send no frame and complete on the transport's report, that the target reports a
//! NIC's write it is told of, and how they meet fences, framed operations and a lost peer.

use super::*;
use crate::rdm::{Native, NativeKind};

/// Keys the fake NIC takes; anything else goes through frames.
const NIC_KEY: u64 = 0x4e00;

/// A NIC in the same process: takes operations naming `NIC_KEY`.
struct FakeNic;

impl OneSided for FakeNic {
    fn pull_min(&self) -> usize {
        usize::MAX
    }

    fn describe(&self, _peer: PeerId, _iov: &IovList, _dir: Dir) -> Option<Desc> {
        None
    }

    fn native(&self, _peer: PeerId, n: &Native) -> bool {
        n.key == NIC_KEY
    }
}

/// A pair whose A side's transport is `t`.
fn net_with(mut net: Net, t: Box<dyn OneSided>) -> Net {
    net.a.eng = Engine::new(
        net.a.core.clone(),
        Config {
            eager_max: EAGER,
            ..Config::default()
        },
    )
    .with_one_sided(t);
    net
}

/// A pair whose A side has the fake NIC.
fn nic_net() -> Net {
    net_with(Net::new(), Box::new(FakeNic))
}

/// Carries `n` out as the NIC would, at absolute addresses.
fn perform_native(n: &Native) {
    let local = n.local;
    // SAFETY: the tests' buffers, alive, named by their addresses.
    unsafe {
        match n.kind {
            NativeKind::Write { .. } => {
                let dst = std::slice::from_raw_parts_mut(n.addr as *mut u8, n.len);
                local.copy_out(0, dst);
            }
            NativeKind::Read => {
                let src = std::slice::from_raw_parts(n.addr as *const u8, n.len);
                local.copy_in(0, src);
            }
            NativeKind::FetchAdd { add } => {
                let w = n.addr as *mut u64;
                let old = *w;
                *w = old.wrapping_add(add);
                local.copy_in(0, &old.to_ne_bytes());
            }
            NativeKind::CompareSwap { compare, swap } => {
                let w = n.addr as *mut u64;
                let old = *w;
                if old == compare {
                    *w = swap;
                }
                local.copy_in(0, &old.to_ne_bytes());
            }
        }
    }
}

#[test]
fn native_rma_sends_no_frame_and_completes_on_the_report() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 40);
    let mut back = vec![0u8; 16];
    let mut net = nic_net();
    let at = tgt.as_mut_ptr() as u64;
    let w = rma(1, iov(&src), &[seg(at + 8, 16, NIC_KEY)], Some(5), FI_WRITE);
    net.a.rma(w);
    assert_eq!(net.flush(S::A), vec![], "no frame for the NIC's write");
    let n = net.a.eng.poll_native().expect("handed to the NIC");
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(n.kind, NativeKind::Write { data: Some(5) });
    assert_eq!((n.addr, n.len, n.key), (at + 8, 16, NIC_KEY));
    net.a.quiet();
    assert!(net.a.eng.busy());
    perform_native(&n);
    net.a.eng.on_native(n.token, 0);
    // A repeated report changes nothing.
    net.a.eng.on_native(n.token, 0);
    net.report();
    assert_eq!(net.a.one(1).flags, FI_RMA | FI_WRITE);
    assert_eq!(&tgt[8..24], &src[..]);
    // The target, told of the write by its transport, reports it as the engine would.
    net.b.eng.on_native_write(16, Some(5));
    net.report();
    let e = net.b.one(0);
    assert_eq!(e.flags, FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA);
    assert_eq!((e.len, e.data), (16, 5));
    // A read; it fails at the NIC: the errno is the operation's.
    let r = rma(
        2,
        iov_mut(&mut back),
        &[seg(at + 8, 16, NIC_KEY)],
        None,
        FI_READ,
    );
    net.a.rma(r);
    let n = net.a.eng.poll_native().unwrap();
    assert_eq!(n.kind, NativeKind::Read);
    perform_native(&n);
    net.a.eng.on_native(n.token, 0);
    net.report();
    assert_eq!(net.a.one(2).flags, FI_RMA | FI_READ);
    assert_eq!(back, src);
    net.a
        .rma(rma(3, iov(&src), &[seg(at, 16, NIC_KEY)], None, FI_WRITE));
    let n = net.a.eng.poll_native().unwrap();
    net.a.eng.on_native(n.token, FI_EACCES);
    net.report();
    assert_eq!(net.a.one_err(3).err, FI_EACCES);
    assert!(!net.a.eng.busy());
}

#[test]
fn native_only_for_what_the_nic_can() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 41);
    let mut net = nic_net();
    let at = tgt.as_mut_ptr() as u64;
    // Two remote ranges; a commit to persistent memory; an inject: through frames.
    let two = rma(
        1,
        iov(&src),
        &[seg(at, 8, NIC_KEY), seg(at + 8, 8, NIC_KEY)],
        None,
        FI_WRITE,
    );
    let commit = rma(
        2,
        iov(&src),
        &[seg(at, 16, NIC_KEY)],
        None,
        FI_WRITE | FI_COMMIT_COMPLETE,
    );
    let inject = rma(
        3,
        iov(&src),
        &[seg(at, 16, NIC_KEY)],
        None,
        FI_WRITE | FI_INJECT,
    );
    // SAFETY: the buffers outlive the operations.
    unsafe {
        for op in [two, commit, inject] {
            net.a.eng.post_rma(0, &op).unwrap();
        }
    }
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(net.flush(S::A), vec![Kind::Write, Kind::Write, Kind::Write]);
}

#[test]
fn native_waits_behind_framed_operations_and_fences_hold_across_both() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 42);
    let mut net = nic_net();
    net.register(&tgt);
    let at = tgt.as_mut_ptr() as u64;
    let framed = net.raddr(tgt.as_ptr(), 0);
    // A framed write outstanding: the next one, though its key is the NIC's, is framed
    // too, so that it cannot land before the first.
    net.a
        .rma(rma(1, iov(&src), &[seg(framed, 16, KEY)], None, FI_WRITE));
    net.a.rma(rma(
        2,
        iov(&src),
        &[seg(at + 16, 16, NIC_KEY)],
        None,
        FI_WRITE,
    ));
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(net.flush(S::A), vec![Kind::Write, Kind::Write]);
    net.pump();
    // (B's engine knows no region by the NIC's key: the framed one is refused there.)
    let (ok, err) = net.a.cq();
    assert_eq!(ok.len(), 1);
    assert_eq!((err[0].op_context, err[0].err), (2, FI_EACCES));
    net.b.cq();
    // Now a native write outstanding, then a fenced send: held until the NIC reports.
    net.a.rma(rma(
        3,
        iov(&src),
        &[seg(at + 32, 16, NIC_KEY)],
        None,
        FI_WRITE,
    ));
    let n = net.a.eng.poll_native().unwrap();
    net.a.send(send(4, &src, None, None, FI_FENCE));
    assert_eq!(net.flush(S::A), vec![]);
    perform_native(&n);
    net.a.eng.on_native(n.token, 0);
    net.report();
    assert_eq!(net.a.one(3).op_context, 3);
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    // A native write after a framed one that is answered goes to the NIC again; a peer
    // naming it in an answer cannot complete it.
    net.a
        .rma(rma(5, iov(&src), &[seg(at, 16, NIC_KEY)], None, FI_WRITE));
    let n = net.a.eng.poll_native().expect("native again");
    let id = (n.token & 0xffff_ffff) as u32;
    let ack = Frame::Ack { id, status: 0 };
    let ctrl = ack.ctrl(0);
    let _ = arrive(&mut net.a, &ctrl, &[]);
    net.report();
    let (ok, _) = net.a.cq();
    assert!(ok.iter().all(|e| e.op_context != 5), "{ok:?}");
    net.a.eng.on_native(n.token, 0);
    net.report();
    let (ok, _) = net.a.cq();
    assert!(ok.iter().any(|e| e.op_context == 5), "{ok:?}");
}

#[test]
fn native_atomics_are_the_nics_two() {
    let mut word = Box::new(40u64);
    let at = &mut *word as *mut u64 as u64;
    let mut net = nic_net();
    let (two, c42, hundred) = (2u64, 42u64, 100u64);
    let (mut r1, mut r2) = (0u64, 0u64);
    let mut req = fetching(atomic(1, at, AtomicOp::Sum, (&two, None)), &mut r1);
    req.key = NIC_KEY;
    net.a.atomic(req).unwrap();
    let n = net.a.eng.poll_native().unwrap();
    assert_eq!(n.kind, NativeKind::FetchAdd { add: 2 });
    perform_native(&n);
    net.a.eng.on_native(n.token, 0);
    let mut req = fetching(
        atomic(2, at, AtomicOp::Cswap, (&hundred, Some(&c42))),
        &mut r2,
    );
    req.key = NIC_KEY;
    net.a.atomic(req).unwrap();
    let n = net.a.eng.poll_native().unwrap();
    assert_eq!(
        n.kind,
        NativeKind::CompareSwap {
            compare: 42,
            swap: 100
        }
    );
    perform_native(&n);
    net.a.eng.on_native(n.token, 0);
    net.report();
    let (ok, err) = net.a.cq();
    assert!(err.is_empty() && ok.len() == 2, "{ok:?} {err:?}");
    assert_eq!((r1, r2, *word), (40, 42, 100));
    // FI_MIN, or a 32-bit type: not the NIC's.
    let mut req = atomic(3, at, AtomicOp::Min, (&two, None));
    req.key = NIC_KEY;
    net.a.atomic(req).unwrap();
    let mut req = atomic(4, at, AtomicOp::Sum, (&two, None));
    req.key = NIC_KEY;
    req.dt = Datatype::UInt32;
    net.a.atomic(req).unwrap();
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(net.flush(S::A), vec![Kind::Atomic, Kind::Atomic]);
}

#[test]
fn an_atomic_with_commit_complete_is_the_target_engines() {
    let mut word = Box::new(40u64);
    let at = &mut *word as *mut u64 as u64;
    let mut net = nic_net();
    let two = 2u64;
    // One the NIC has, toward a quiet peer, but whose range the target must make durable
    // before it answers.
    let mut req = atomic(1, at, AtomicOp::Sum, (&two, None));
    req.key = NIC_KEY;
    req.flags |= FI_COMMIT_COMPLETE;
    net.a.atomic(req).unwrap();
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(net.flush(S::A), vec![Kind::Atomic]);
}

#[test]
fn native_operations_end_with_a_lost_peer_or_a_close() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 43);
    let mut net = nic_net();
    let at = tgt.as_mut_ptr() as u64;
    net.a
        .rma(rma(1, iov(&src), &[seg(at, 16, NIC_KEY)], None, FI_WRITE));
    net.a
        .rma(rma(2, iov(&src), &[seg(at, 16, NIC_KEY)], None, FI_WRITE));
    let n1 = net.a.eng.poll_native().unwrap();
    // The second was never taken by the transport: it ends too, and is not handed over.
    net.a.eng.on_lost(0, FI_ECONNRESET);
    assert!(net.a.eng.poll_native().is_none());
    net.report();
    let (ok, err) = net.a.cq();
    assert!(ok.is_empty());
    assert_eq!(err.len(), 2);
    assert!(err.iter().all(|e| e.err == FI_ECONNRESET));
    // Its report, after the loss, changes nothing.
    net.a.eng.on_native(n1.token, 0);
    net.report();
    net.a.quiet();
    // After the loss, native again; closing cancels it.
    net.a
        .rma(rma(3, iov(&src), &[seg(at, 16, NIC_KEY)], None, FI_WRITE));
    assert!(net.a.eng.poll_native().is_some());
    net.a.eng.close();
    net.report();
    assert_eq!(net.a.one_err(3).err, FI_ECANCELED);
}

/// Counts the offers a transport is told have ended.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl OneSided for Counting {
    fn pull_min(&self) -> usize {
        PULL_MIN_OFFER
    }

    fn describe(&self, _peer: PeerId, iov: &IovList, _dir: Dir) -> Option<Desc> {
        Some(Desc::of_iov(iov))
    }

    fn offer_ended(&self, _peer: PeerId, _iov: &IovList, _dir: Dir) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

const PULL_MIN_OFFER: usize = 100;

#[test]
fn an_offer_ends_once_with_its_request() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ended = Arc::new(AtomicUsize::new(0));
    let data = pattern(300, 44);
    let mut buf = vec![0u8; 300];
    let counting = Box::new(Counting(ended.clone()));
    let mut net = net_with(Net::sides(World::new(), false, true), counting);
    // Pulled by B, acknowledged: the offer ends when the send completes.
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    assert_eq!(
        ended.load(Ordering::SeqCst),
        0,
        "still offered until the answer"
    );
    net.pump();
    net.a.one(1);
    assert_eq!(ended.load(Ordering::SeqCst), 1);
    // Lost before anyone pulls; canceled by a close: each offer ends once.
    net.a.send(send(2, &data, None, None, 0));
    net.a.eng.on_lost(0, FI_ECONNRESET);
    assert_eq!(ended.load(Ordering::SeqCst), 2);
    net.a.send(send(3, &data, None, None, 0));
    net.a.eng.close();
    assert_eq!(ended.load(Ordering::SeqCst), 3);
    // A message below the transport's threshold offers nothing, and ends nothing.
    let mut net = Net::new();
    net.a.eng = Engine::new(net.a.core.clone(), Config::default())
        .with_one_sided(Box::new(Counting(ended.clone())));
    let small = pattern(PULL_MIN_OFFER - 1, 45);
    net.a.send(send(4, &small, None, None, 0));
    net.pump();
    net.a.one(4);
    assert_eq!(ended.load(Ordering::SeqCst), 3);
}

/// Records the direction of every offer described and ended.
struct Recording(Arc<std::sync::Mutex<Vec<(&'static str, Dir)>>>);

impl OneSided for Recording {
    fn pull_min(&self) -> usize {
        PULL_MIN_OFFER
    }

    fn describe(&self, _peer: PeerId, iov: &IovList, dir: Dir) -> Option<Desc> {
        self.0.lock().unwrap().push(("described", dir));
        Some(Desc::of_iov(iov))
    }

    fn offer_ended(&self, _peer: PeerId, _iov: &IovList, dir: Dir) {
        self.0.lock().unwrap().push(("ended", dir));
    }
}

/// A transport whose NIC enforces access is told which the peer needs: a send's source and
/// an RMA write's are read by the peer, an RMA read's destination written, never the other
/// (a receiver offered a send's memory to read must not be able to write it), and each
/// offer ends with the direction it was described with.
#[test]
fn offers_say_whether_the_peer_reads_or_writes_them() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut net = net_with(
        Net::sides(World::new(), false, true),
        Box::new(Recording(seen.clone())),
    );
    let data = pattern(300, 46);
    let mut into = vec![0u8; 300];
    net.a.send(send(1, &data, None, None, 0));
    net.a
        .rma(rma(2, iov(&data), &[seg(0x1000, 300, 7)], None, FI_WRITE));
    net.a.rma(rma(
        3,
        iov_mut(&mut into),
        &[seg(0x1000, 300, 7)],
        None,
        FI_READ,
    ));
    net.a.eng.close();
    let seen = seen.lock().unwrap().clone();
    let described: Vec<Dir> = seen
        .iter()
        .filter(|(w, _)| *w == "described")
        .map(|&(_, d)| d)
        .collect();
    assert_eq!(described, [Dir::Read, Dir::Read, Dir::Write], "{seen:?}");
    let mut ended: Vec<Dir> = seen
        .iter()
        .filter(|(w, _)| *w == "ended")
        .map(|&(_, d)| d)
        .collect();
    ended.sort_by_key(|d| *d == Dir::Write);
    assert_eq!(ended, [Dir::Read, Dir::Read, Dir::Write], "{seen:?}");
}

#[test]
fn an_atomic_on_a_persistent_memory_endpoint_is_the_target_engines() {
    let mut word = Box::new(40u64);
    let at = &mut *word as *mut u64 as u64;
    let mut net = nic_net();
    // A's endpoint opened with FI_RMA_PMEM: what an atomic changes is recorded for the next
    // commit, which the NIC's atomic would skip.
    let pmem = net
        .world
        .ep_with(crate::trigger::testkit::ALL_CAPS | FI_RMA_PMEM, 1024, &[]);
    net.a.eng = Engine::new(
        pmem.ep.core().clone(),
        Config {
            eager_max: EAGER,
            ..Config::default()
        },
    )
    .with_one_sided(Box::new(FakeNic));
    let two = 2u64;
    let mut req = atomic(1, at, AtomicOp::Sum, (&two, None));
    req.key = NIC_KEY;
    net.a.atomic(req).unwrap();
    assert!(net.a.eng.poll_native().is_none());
    assert_eq!(net.flush(S::A), vec![Kind::Atomic]);
}
