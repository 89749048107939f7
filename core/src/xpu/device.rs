//! The device side of the device API for the CPU XPU: what a thread calls, mirroring
//! fi_xpu_device.h's `fi_xpu_*` calls argument for argument (minus the handle's C type). Each
//! call reads and writes only the shared blocks its handle's `prov_ctx` names, exactly what
//! the CUDA header of a later step will do from a kernel, so these are also its reference.
//!
//! Return values are libfabric's: 0 or a count on success, a negative `FI_E*` otherwise
//! (`-FI_EAGAIN`: the ring is full, or nothing to read; call again). No call blocks, except
//! `cntr_wait`, which spins on the counter's mirror until its threshold or its timeout.
//!
//! Buffers are addresses the XPU reaches; nothing here reads or writes them. The host checks
//! each against the memory regions exported with `get_xpu_desc` before anything starts, so a
//! wrong address is an error completion, never a stray access.
//!
//! `scope` (`FI_XPU_WORK_ITEM`, `FI_XPU_SUBGROUP`, `FI_XPU_WORK_GROUP`, `FI_XPU_DEVICE`):
//! on a GPU every thread of the scope makes the call, one lane posts, and all return its
//! result. A CPU thread is a group of one: it posts. A value outside the four is `-FI_EINVAL`.
//!
//! A handle exported to a GPU may be driven by a host thread through these calls (under unified
//! addressing its blocks' device addresses are the host's: the tests play a GPU so), but never
//! while a kernel drives the same handle: a GPU's system-scope atomics on mapped page-locked
//! memory are not atomic with the host's over PCIe (the CUDA programming guide, mapped memory),
//! so a host thread and a kernel claiming ring positions, counter ring slots or CQ entries at
//! once could each take the same one. One driver per handle at a time: a GPU's kernels, or
//! host threads.
//!
//! A CPU XPU may announce what it posted (`tx_flush`, which wakes a sleeping watcher and lets
//! this thread start what it posted at once); it need not: a watcher that is not told finds
//! the descriptors by looking, as it finds a GPU's.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::abi::{opcode, XpuCqEntry, XpuDesc, CQ_KIND_ERR, CQ_WORDS};
use super::abi::{FI_XPU_DEVICE, FI_XPU_WORK_ITEM};
use super::cntr::XpuCntr;
use super::cq::{CqExport, XpuCq};
use super::ep::XpuEp;
use super::ring::{Claim, DescRing};
use crate::consts::errno::{
    FI_EAGAIN, FI_EAVAIL, FI_EINVAL, FI_EOPNOTSUPP, FI_EOVERRUN, FI_ESHUTDOWN, FI_ETIMEDOUT,
};
use crate::entry::{CqErrEntry, CqFormatEntry, CqTaggedEntry, FiAddr};

fn scope_ok(scope: i32) -> bool {
    (FI_XPU_WORK_ITEM..=FI_XPU_DEVICE).contains(&scope)
}

/// The ring, if this thread may stand for its XPU (always for a CPU XPU; for a GPU's ring only
/// under unified addressing, where its device addresses are the host's): `-FI_EOPNOTSUPP`
/// otherwise. Its slots are reached through the ring's own view (`DescRing::claim`), never
/// the header's words.
fn ring_of(ep: &XpuEp) -> Result<&DescRing, i32> {
    if ep.ring().host_reachable() {
        Ok(ep.ring())
    } else {
        Err(-FI_EOPNOTSUPP)
    }
}

fn post(r: Result<&DescRing, i32>, d: &XpuDesc, scope: i32) -> i32 {
    if !scope_ok(scope) {
        return -FI_EINVAL;
    }
    match r {
        Ok(r) => r.post(d),
        Err(e) => e,
    }
}

fn addr(p: *const c_void) -> u64 {
    p as usize as u64
}

/// `fi_xpu_send`.
#[allow(clippy::too_many_arguments)]
pub fn send(
    ep: &XpuEp,
    buf: *const c_void,
    len: usize,
    desc: u64,
    data: u64,
    dest_addr: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::SEND,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        data,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_tsend`.
#[allow(clippy::too_many_arguments)]
pub fn tsend(
    ep: &XpuEp,
    buf: *const c_void,
    len: usize,
    desc: u64,
    data: u64,
    dest_addr: u64,
    tag: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::TSEND,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        data,
        tag,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_recv`. `src_addr` `FI_ADDR_UNSPEC` receives from anyone.
#[allow(clippy::too_many_arguments)]
pub fn recv(
    ep: &XpuEp,
    buf: *mut c_void,
    len: usize,
    desc: u64,
    src_addr: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::RECV,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: src_addr,
        context: context as u64,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_trecv`.
#[allow(clippy::too_many_arguments)]
pub fn trecv(
    ep: &XpuEp,
    buf: *mut c_void,
    len: usize,
    desc: u64,
    src_addr: u64,
    tag: u64,
    ignore: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::TRECV,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: src_addr,
        context: context as u64,
        tag,
        ignore,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_write`; with `FI_REMOTE_CQ_DATA` in `flags` the target's CQ gets `data`.
#[allow(clippy::too_many_arguments)]
pub fn write(
    ep: &XpuEp,
    buf: *const c_void,
    len: usize,
    desc: u64,
    data: u64,
    dest_addr: u64,
    raddr: u64,
    key: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::WRITE,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        data,
        raddr,
        rkey: key,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_read`.
#[allow(clippy::too_many_arguments)]
pub fn read(
    ep: &XpuEp,
    buf: *mut c_void,
    len: usize,
    desc: u64,
    src_addr: u64,
    raddr: u64,
    key: u64,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::READ,
        flags,
        len: len as u64,
        buf: addr(buf),
        desc,
        peer: src_addr,
        context: context as u64,
        raddr,
        rkey: key,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_atomic`: `count` elements of `datatype` (`enum fi_datatype`), `op` an `enum fi_op`.
#[allow(clippy::too_many_arguments)]
pub fn atomic(
    ep: &XpuEp,
    buf: *const c_void,
    count: usize,
    desc: u64,
    dest_addr: u64,
    raddr: u64,
    key: u64,
    datatype: i32,
    op: i32,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::ATOMIC,
        op,
        datatype,
        flags,
        len: count as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        raddr,
        rkey: key,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_fetch_atomic`: the target's original values land in `result`.
#[allow(clippy::too_many_arguments)]
pub fn fetch_atomic(
    ep: &XpuEp,
    buf: *const c_void,
    count: usize,
    desc: u64,
    result: *mut c_void,
    result_desc: u64,
    dest_addr: u64,
    raddr: u64,
    key: u64,
    datatype: i32,
    op: i32,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::FETCH_ATOMIC,
        op,
        datatype,
        flags,
        len: count as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        raddr,
        rkey: key,
        result: addr(result),
        result_desc,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_compare_atomic`.
#[allow(clippy::too_many_arguments)]
pub fn compare_atomic(
    ep: &XpuEp,
    buf: *const c_void,
    count: usize,
    desc: u64,
    compare: *const c_void,
    compare_desc: u64,
    result: *mut c_void,
    result_desc: u64,
    dest_addr: u64,
    raddr: u64,
    key: u64,
    datatype: i32,
    op: i32,
    context: usize,
    flags: u64,
    scope: i32,
) -> i32 {
    let d = XpuDesc {
        opcode: opcode::COMPARE_ATOMIC,
        op,
        datatype,
        flags,
        len: count as u64,
        buf: addr(buf),
        desc,
        peer: dest_addr,
        context: context as u64,
        raddr,
        rkey: key,
        compare: addr(compare),
        compare_desc,
        result: addr(result),
        result_desc,
        ..Default::default()
    };
    post(ring_of(ep), &d, scope)
}

/// `fi_xpu_tx_flush`: every descriptor this XPU published is visible to the watcher already
/// (each publish is a release store); a CPU XPU's flush also announces them, so a sleeping
/// watcher wakes and this thread starts what it can at once (`notify_xpu_ring`). `flags`
/// must be 0.
pub fn tx_flush(ep: &XpuEp, flags: u64, scope: i32) -> i32 {
    if flags != 0 || !scope_ok(scope) {
        return -FI_EINVAL;
    }
    if ep.xpu().iface == crate::hmem_iface::Iface::System {
        crate::trigger::notify_xpu_ring();
    }
    0
}

/// Posts a descriptor exactly as given, but for its `seq` and `check` (which the ring sets):
/// what any XPU can write into its ring, for tests of what the host does with hostile ones.
pub fn post_raw(ep: &XpuEp, d: &XpuDesc) -> i32 {
    post(ring_of(ep), d, FI_XPU_WORK_ITEM)
}

/// Claims a slot without writing or publishing it (`Claim`): what an XPU that dies while
/// writing a descriptor leaves behind, or one that writes a torn descriptor
/// (`Claim::store_word` then `publish`). `Err` holds `-FI_EAGAIN` or `-FI_ESHUTDOWN`.
pub fn claim(ep: &XpuEp) -> Result<Claim<'_>, i32> {
    ring_of(ep)?.claim()
}

/// `fi_xpu_cntr_read`: the success value as last mirrored.
pub fn cntr_read(cntr: &XpuCntr, _scope: i32) -> u64 {
    cntr.mirror().value.load(Ordering::Acquire)
}

/// `fi_xpu_cntr_readerr`: the error value as last mirrored.
pub fn cntr_readerr(cntr: &XpuCntr, _scope: i32) -> u64 {
    cntr.mirror().err.load(Ordering::Acquire)
}

/// `fi_xpu_cntr_wait`: spins on the mirror until the success value reaches `threshold`
/// (0), the error value changes from what it was at the call (`-FI_EAVAIL`), the counter
/// closes (`-FI_ESHUTDOWN`: its values change no more), or `timeout` ms pass
/// (`-FI_ETIMEDOUT`; a negative `timeout` waits without limit). Upstream's call returns
/// nothing; this one says which ended it.
pub fn cntr_wait(cntr: &XpuCntr, threshold: u64, timeout: i32, scope: i32) -> i32 {
    if !scope_ok(scope) {
        return -FI_EINVAL;
    }
    let m = cntr.mirror();
    let err0 = m.err.load(Ordering::Acquire);
    let until = u64::try_from(timeout)
        .ok()
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    // The counter's ring, closed when the counter goes: its values stop changing then.
    let state = &cntr.ring().header().state;
    let mut spins = 0u32;
    loop {
        if m.value.load(Ordering::Acquire) >= threshold {
            return 0;
        }
        if m.err.load(Ordering::Acquire) != err0 {
            return -FI_EAVAIL;
        }
        if state.load(Ordering::Acquire) != super::abi::RING_OPEN {
            // The last change may have come just before the close.
            if m.value.load(Ordering::Acquire) >= threshold {
                return 0;
            }
            if m.err.load(Ordering::Acquire) != err0 {
                return -FI_EAVAIL;
            }
            return -FI_ESHUTDOWN;
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return -FI_ETIMEDOUT;
        }
        spins = spins.wrapping_add(1);
        // A CPU XPU shares cores with the watcher that changes the counter: give it the core
        // now and then.
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn cntr_op(cntr: &XpuCntr, op: u32, value: u64, scope: i32) -> i32 {
    let d = XpuDesc {
        opcode: op,
        data: value,
        ..Default::default()
    };
    let r = if cntr.host_reachable() {
        Ok(cntr.ring())
    } else {
        Err(-FI_EOPNOTSUPP)
    };
    let rc = post(r, &d, scope);
    // A CPU XPU announces it, as `tx_flush` does: this thread applies it at once (and a
    // sleeping watcher wakes), where a watcher looking by time would see it up to its poll
    // interval later (8 ms after a quiet).
    if rc == 0 && cntr.xpu().iface == crate::hmem_iface::Iface::System {
        crate::trigger::notify_xpu_ring();
    }
    rc
}

/// `fi_xpu_cntr_add`: posted on the counter's ring; the watcher adds it.
pub fn cntr_add(cntr: &XpuCntr, value: u64, scope: i32) -> i32 {
    cntr_op(cntr, opcode::CNTR_ADD, value, scope)
}

/// `fi_xpu_cntr_set`.
pub fn cntr_set(cntr: &XpuCntr, value: u64, scope: i32) -> i32 {
    cntr_op(cntr, opcode::CNTR_SET, value, scope)
}

/// `fi_xpu_cntr_adderr`.
pub fn cntr_adderr(cntr: &XpuCntr, value: u64, scope: i32) -> i32 {
    cntr_op(cntr, opcode::CNTR_ADDERR, value, scope)
}

/// `fi_xpu_cntr_seterr`.
pub fn cntr_seterr(cntr: &XpuCntr, value: u64, scope: i32) -> i32 {
    cntr_op(cntr, opcode::CNTR_SETERR, value, scope)
}

/// Copies published entries from the head, success entries only (`want_err`: exactly one
/// error entry), then claims them by advancing the head; retried when another thread claimed
/// first. Returns how many.
fn cq_take(
    cq: &CqExport,
    max: usize,
    want_err: bool,
    mut put: impl FnMut(usize, &XpuCqEntry),
) -> isize {
    if max == 0 {
        return -(FI_EINVAL as isize);
    }
    // The slots are reached through the host's own view of the block (`CqExport::slot`),
    // never the header's `slots` and `mask`, which an XPU can write.
    if !cq.host_reachable() {
        return -(FI_EOPNOTSUPP as isize);
    }
    let h = cq.header();
    let mut pumped = false;
    loop {
        // Read before the slots: set, it was written after every entry from before the
        // overrun, so finding no entry then means none of those is left.
        let overrun = h.overrun.load(Ordering::Acquire) != 0;
        let head = h.head.load(Ordering::Acquire);
        let mut n = 0usize;
        while n < max {
            let pos = head.wrapping_add(n as u64);
            let slot = cq.slot(pos);
            if slot.0[0].load(Ordering::Acquire) != pos.wrapping_add(1) {
                break;
            }
            let words: [u64; CQ_WORDS] = std::array::from_fn(|i| slot.0[i].load(Ordering::Relaxed));
            let e = XpuCqEntry::from_words(words);
            let is_err = e.kind == CQ_KIND_ERR;
            if is_err != want_err {
                if n == 0 && !want_err {
                    return -(FI_EAVAIL as isize);
                }
                break;
            }
            put(n, &e);
            n += 1;
            if want_err {
                break;
            }
        }
        if n == 0 {
            // Nothing in the ring: what waits in the host queue (it did not fit when it
            // came) is moved now, once, by this thread, a host thread like any CPU XPU, so
            // that it does not wait for a watcher or for the next completion.
            if !std::mem::replace(&mut pumped, true) {
                cq.pump();
                continue;
            }
            if overrun && !want_err {
                // Only if no other reader moved the head meanwhile: a slot found not yet
                // written may then be one of a later lap, with entries before it unread.
                if h.head.load(Ordering::Acquire) != head {
                    continue;
                }
                return -(FI_EOVERRUN as isize);
            }
            return -(FI_EAGAIN as isize);
        }
        // Claimed only if no other thread moved the head meanwhile (then the host may have
        // rewritten what was copied: copy again).
        if h.head
            .compare_exchange(
                head,
                head.wrapping_add(n as u64),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return n as isize;
        }
    }
}

fn tagged(e: &XpuCqEntry) -> CqTaggedEntry {
    CqTaggedEntry {
        op_context: e.op_context as usize,
        flags: e.flags,
        len: e.len as usize,
        buf: e.buf as usize,
        data: e.data,
        tag: e.tag,
    }
}

/// `fi_xpu_cq_read`: up to `buf.len()` success entries, in the CQ's format `E`; `-FI_EAGAIN`
/// when none is there, `-FI_EAVAIL` when an error entry is next (`cq_readerr` takes it),
/// `-FI_EOVERRUN` when none is there and the queue overran (under `FI_RM_DISABLED`,
/// completions past its size and the ring's were dropped; every entry from before it was
/// read).
pub fn cq_read<E: CqFormatEntry>(cq: &XpuCq, buf: &mut [E], scope: i32) -> isize {
    if !scope_ok(scope) {
        return -(FI_EINVAL as isize);
    }
    cq_take(cq.shared(), buf.len(), false, |i, e| {
        buf[i] = E::from_tagged(&tagged(e))
    })
}

/// `fi_xpu_cq_readfrom`: as `cq_read`, with each entry's source address in `src_addr`
/// (`FI_ADDR_NOTAVAIL` when unknown); at most `src_addr.len()` entries.
pub fn cq_readfrom<E: CqFormatEntry>(
    cq: &XpuCq,
    buf: &mut [E],
    src_addr: &mut [FiAddr],
    scope: i32,
) -> isize {
    if !scope_ok(scope) {
        return -(FI_EINVAL as isize);
    }
    let max = buf.len().min(src_addr.len());
    cq_take(cq.shared(), max, false, |i, e| {
        buf[i] = E::from_tagged(&tagged(e));
        src_addr[i] = e.src;
    })
}

/// `fi_xpu_cq_readerr`: the next entry if it is an error (1), `-FI_EAGAIN` otherwise. Error
/// data is not carried to an XPU: `err_data` is 0. `flags` must be 0.
pub fn cq_readerr(cq: &XpuCq, buf: &mut CqErrEntry, flags: u64, scope: i32) -> isize {
    if flags != 0 || !scope_ok(scope) {
        return -(FI_EINVAL as isize);
    }
    cq_take(cq.shared(), 1, true, |_, e| {
        *buf = CqErrEntry {
            op_context: e.op_context as usize,
            flags: e.flags,
            len: e.len as usize,
            buf: e.buf as usize,
            data: e.data,
            tag: e.tag,
            olen: e.olen as usize,
            err: e.err,
            prov_errno: e.prov_errno,
            err_data: 0,
            err_data_size: 0,
        };
    })
}
