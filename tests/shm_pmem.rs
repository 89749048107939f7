//! Persistent-memory RMA (FI_RMA_PMEM): a write with FI_COMMIT_COMPLETE completes only once
//! the target range is flushed to its file; a zero-length FI_COMMIT_COMPLETE | FI_FENCE write
//! commits every earlier write. The target is killed with SIGKILL right after the initiator's
//! completion and the file, reopened, holds the data. Atomics take the same flag: what they
//! change is flushed before they complete.

mod common;
use std::os::fd::AsRawFd;

use common::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_RMA | FI_ATOMIC | FI_RMA_PMEM;
const LEN: usize = 1 << 20;

/// The target: maps `path` shared, registers it, serves until killed.
fn target(path: &str) {
    let n = node(CAPS, Progress::Manual);
    connect_parent(&n);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: maps LEN bytes of a file we hold open; checked for failure below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping stays for the life of this process (it is never unmapped).
    let window = unsafe { std::slice::from_raw_parts(p as *const u8, LEN) };
    // SAFETY: as above: the mapping outlives the registration.
    let mr = unsafe {
        n.domain
            .mr_reg(window, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 5)
    }
    .unwrap();
    say(&format!("{}", mr.key()));
    loop {
        n.ep.progress();
    }
}

fn file_in_tmp(name: &str) -> String {
    let dir = std::env::var("CARGO_TARGET_TMPDIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let path = format!("{dir}/{name}-{}", std::process::id());
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(LEN as u64).unwrap();
    path
}

fn write_msg(n: &Node, buf: &[u8], peer: FiAddr, addr: u64, key: u64, ctx: usize, flags: u64) {
    let iov = [RawIov::of(buf)];
    let rma = [RmaIov {
        addr,
        len: buf.len(),
        key,
    }];
    let m = MsgRma {
        iov: &iov,
        desc: &[],
        addr: peer,
        rma_iov: &rma,
        context: ctx,
        data: 0,
    };
    // SAFETY: buf outlives the completion the caller waits for.
    unsafe { n.ep.writemsg(&m, flags) }.unwrap();
}

#[test]
fn commit_complete_survives_kill() {
    if let Some(r) = role() {
        return target(r.strip_prefix("target:").unwrap());
    }
    let path = file_in_tmp("pmem-commit");
    let mut child = spawn(
        "commit_complete_survives_kill",
        &format!("target:{path}"),
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let peer = connect(&mut child, &n);
    let key: u64 = child.hear().parse().unwrap();
    let small = pattern(100, 1);
    let large = pattern(300_000, 2);
    write_msg(&n, &small, peer, 10, key, 1, FI_COMMIT_COMPLETE);
    write_msg(&n, &large, peer, 4096, key, 2, FI_COMMIT_COMPLETE);
    // Plain writes, then a zero-length commit that must flush them too.
    let later = pattern(5000, 3);
    write_msg(&n, &later, peer, 600_000, key, 3, 0);
    write_msg(&n, &[], peer, 0, key, 4, FI_COMMIT_COMPLETE | FI_FENCE);
    let done = n.wait_n(4);
    assert_eq!(
        done.iter().map(|c| c.op_context).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    child.kill();
    let back = std::fs::read(&path).unwrap();
    assert!(back[10..110] == small[..]);
    assert!(back[4096..4096 + 300_000] == large[..]);
    assert!(back[600_000..605_000] == later[..]);
    std::fs::remove_file(&path).unwrap();
    xfabric::providers::shm::segment::reclaim_stale();
}

#[test]
fn commit_needs_rma_pmem() {
    let n = node(FI_MSG | FI_RMA, Progress::Manual);
    let me = n.ep.getname().unwrap();
    let peer = n.add_peer(&me);
    let iov = [RawIov::of(&[1u8])];
    let rma = [RmaIov {
        addr: 0,
        len: 1,
        key: 1,
    }];
    let m = MsgRma {
        iov: &iov,
        desc: &[],
        addr: peer,
        rma_iov: &rma,
        context: 1,
        data: 0,
    };
    // SAFETY: the call fails before touching memory.
    let r = unsafe { n.ep.writemsg(&m, FI_COMMIT_COMPLETE) };
    assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
}

fn atomic_to(peer: FiAddr, addr: u64, key: u64, op: AtomicOp, ctx: usize) -> MsgAtomic {
    MsgAtomic {
        addr: peer,
        rma_addr: addr,
        key,
        datatype: Datatype::UInt64,
        op,
        context: ctx,
    }
}

#[test]
fn atomics_with_commit_complete_survive_kill() {
    if let Some(r) = role() {
        return target(r.strip_prefix("target:").unwrap());
    }
    let path = file_in_tmp("pmem-atomic");
    let mut child = spawn(
        "atomics_with_commit_complete_survive_kill",
        &format!("target:{path}"),
        &[],
    );
    let n = node(CAPS, Progress::Manual);
    let peer = connect(&mut child, &n);
    let key: u64 = child.hear().parse().unwrap();
    let (add, swap, zero) = (5u64.to_ne_bytes(), 77u64.to_ne_bytes(), 0u64.to_ne_bytes());
    let mut old = [0u8; 8];
    // SAFETY: the operands are copied during the calls; `old` outlives the wait below.
    unsafe {
        let m = atomic_to(peer, 8192, key, AtomicOp::Sum, 1);
        n.ep.atomicmsg(&m, &add, 1, FI_COMMIT_COMPLETE).unwrap();
        let m = atomic_to(peer, 16384, key, AtomicOp::Cswap, 2);
        n.ep.compare_atomicmsg(&m, &swap, &zero, &mut old, 1, FI_COMMIT_COMPLETE)
            .unwrap();
    }
    let done = n.wait_n(2);
    let mut ctxs: Vec<_> = done.iter().map(|c| c.op_context).collect();
    ctxs.sort();
    assert_eq!(ctxs, vec![1, 2]);
    assert_eq!(u64::from_ne_bytes(old), 0);
    child.kill();
    let back = std::fs::read(&path).unwrap();
    let word = |at: usize| u64::from_ne_bytes(back[at..at + 8].try_into().unwrap());
    assert_eq!((word(8192), word(16384)), (5, 77));
    std::fs::remove_file(&path).unwrap();
    xfabric::providers::shm::segment::reclaim_stale();
}

#[test]
fn atomics_take_every_completion_level_and_commit_needs_rma_pmem() {
    let n = node(FI_MSG | FI_ATOMIC, Progress::Manual);
    let me = n.ep.getname().unwrap();
    let peer = n.add_peer(&me);
    let word = [0u8; 8];
    // SAFETY: the region is `word`, which outlives the endpoint's use of it below.
    let mr = unsafe { n.domain.mr_reg(&word, FI_REMOTE_WRITE, 0, 9) }.unwrap();
    // Offsets into the region: this domain's keys are not of virtual addresses.
    let at = 0;
    let one = 1u64.to_ne_bytes();
    let m = atomic_to(peer, at, mr.key(), AtomicOp::Sum, 1);
    // SAFETY: the operand is copied during the call.
    let r = unsafe { n.ep.atomicmsg(&m, &one, 1, FI_COMMIT_COMPLETE) };
    assert!(matches!(r, Err(Error::BadFlags(_))), "{r:?}");
    for (ctx, level) in [
        FI_INJECT_COMPLETE,
        FI_TRANSMIT_COMPLETE,
        FI_DELIVERY_COMPLETE,
    ]
    .into_iter()
    .enumerate()
    {
        let m = atomic_to(peer, at, mr.key(), AtomicOp::Sum, ctx + 10);
        // SAFETY: as above.
        unsafe { n.ep.atomicmsg(&m, &one, 1, level) }.unwrap();
    }
    assert_eq!(n.wait_n(3).len(), 3);
    // SAFETY: every atomic on it completed; nothing writes it any more.
    let now = unsafe { std::ptr::read_volatile(&word) };
    assert_eq!(u64::from_ne_bytes(now), 3);
}
