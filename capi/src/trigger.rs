//! Triggered operations through C (fi_trigger(3)) other than the posts themselves:
//! `fi_getopt(FI_OPT_XPU_TRIGGER)` (with `fi_setopt`, the endpoint's options), and the domain's
//! deferred work queue (`fi_control` with `FI_QUEUE_WORK`, `FI_CANCEL_WORK`, `FI_FLUSH_WORK`
//! and `struct fi_deferred_work`). An operation posted with `FI_TRIGGER` is its entry point's
//! (data, rma, atomic), its `struct fi_triggered_context` read by `ffi::armed`. Each is a
//! translation onto the core's triggered calls; the queues, thresholds and doorbells are the
//! core's.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use xfabric::{
    Counter, DeferredWork, Domain, Msg, MsgRma, OpCntr, OpMsg, OpRma, TriggerXpu, WorkId, WorkOp,
};

use crate::atomic::{self, FI_OP_ATOMIC, FI_OP_COMPARE_ATOMIC};
use crate::consts::{FI_EINVAL, FI_ENOSYS, FI_ETOOSMALL};
use crate::ffi::{call, ep_of, int, neg, obj, rma_segments, segments};
use crate::header::{FiDeferredWork, FiMsg, FiMsgTagged, FiOpCntr, FiOpMsg, FiOpRma};

/// `enum fi_op_type`.
const FI_OP_RECV: c_int = 0;
const FI_OP_SEND: c_int = 1;
const FI_OP_TRECV: c_int = 2;
const FI_OP_TSEND: c_int = 3;
const FI_OP_READ: c_int = 4;
const FI_OP_WRITE: c_int = 5;
const FI_OP_CNTR_SET: c_int = 9;
const FI_OP_CNTR_ADD: c_int = 10;

/// `fi_control` commands of a domain (fabric.h's control enum).
const FI_QUEUE_WORK: c_int = 11;
const FI_CANCEL_WORK: c_int = 12;
const FI_FLUSH_WORK: c_int = 13;

/// `FI_OPT_ENDPOINT` and its option names used here.
const FI_OPT_ENDPOINT: c_int = 0;
const FI_OPT_MIN_MULTI_RECV: c_int = 0;
const FI_OPT_XPU_TRIGGER: c_int = 9;

/// `fi_getopt` of an endpoint: `FI_OPT_XPU_TRIGGER` (`struct fi_trigger_xpu`); other options
/// answer -FI_ENOPROTOOPT.
pub(crate) unsafe extern "C" fn ep_getopt(
    fid: *mut c_void,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut c_void,
) -> c_int {
    let optlen = optlen.cast::<usize>();
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { ep_of(fid) }?;
        if optval.is_null() || optlen.is_null() || !optlen.is_aligned() {
            return Err(-(FI_EINVAL as isize));
        }
        if level != FI_OPT_ENDPOINT {
            return Err(-(libc::ENOPROTOOPT as isize));
        }
        match optname {
            FI_OPT_XPU_TRIGGER => {
                // SAFETY: readable (checked non-null); the caller passes a struct fi_trigger_xpu.
                if unsafe { *optlen } < std::mem::size_of::<TriggerXpu>() {
                    // The size it takes, as fi_getopt(3) asks of a value that does not fit.
                    // SAFETY: writable (checked non-null).
                    unsafe { *optlen = std::mem::size_of::<TriggerXpu>() };
                    return Err(-(FI_ETOOSMALL as isize));
                }
                if !optval.cast::<TriggerXpu>().is_aligned() {
                    return Err(-(FI_EINVAL as isize));
                }
                // SAFETY: a struct fi_trigger_xpu whose var holds count variables (caller),
                // aligned.
                let t = unsafe { &mut *optval.cast::<TriggerXpu>() };
                // SAFETY: as above.
                unsafe { ep.getopt_xpu_trigger(t) }.map_err(neg)?;
                // SAFETY: writable (checked non-null).
                unsafe { *optlen = std::mem::size_of::<TriggerXpu>() };
                Ok(0)
            }
            FI_OPT_MIN_MULTI_RECV => {
                const LEN: usize = std::mem::size_of::<usize>();
                // SAFETY: readable and writable (checked non-null, aligned).
                if unsafe { *optlen } < LEN {
                    // SAFETY: as above.
                    unsafe { *optlen = LEN };
                    return Err(-(FI_ETOOSMALL as isize));
                }
                let v = ep.getopt(FI_OPT_MIN_MULTI_RECV).map_err(neg)?;
                // SAFETY: a size_t's room (checked); written unaligned, as it was read in
                // `ep_setopt`.
                unsafe {
                    optval.cast::<usize>().write_unaligned(v);
                    *optlen = LEN;
                }
                Ok(0)
            }
            _ => Err(-(libc::ENOPROTOOPT as isize)),
        }
    }))
}

/// `fi_setopt` of an endpoint: `FI_OPT_MIN_MULTI_RECV`; other options answer
/// -FI_ENOPROTOOPT.
pub(crate) unsafe extern "C" fn ep_setopt(
    fid: *mut c_void,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { ep_of(fid) }?;
        if level != FI_OPT_ENDPOINT || optname != FI_OPT_MIN_MULTI_RECV {
            return Err(-(libc::ENOPROTOOPT as isize));
        }
        if optval.is_null() || optlen < std::mem::size_of::<usize>() {
            return Err(-(FI_EINVAL as isize));
        }
        // SAFETY: a readable size_t (caller), checked length.
        let v = unsafe { optval.cast::<usize>().read_unaligned() };
        ep.setopt(FI_OPT_MIN_MULTI_RECV, v).map(|()| 0).map_err(neg)
    }))
}

// ---- deferred work ----

/// The requests C queued, by (domain, `struct fi_deferred_work` address): what
/// `FI_CANCEL_WORK` names. Those that no longer wait (started, canceled, flushed, their
/// domain closed) are forgotten as the table grows: it holds about as many as wait, however
/// many an application queues over its life.
struct Queued {
    by_key: std::collections::HashMap<(usize, usize), WorkId>,
    /// Size at which the ended are swept out next: twice what was left after the last
    /// sweep, so that each queueing pays a bounded share of it.
    sweep_at: usize,
}

static QUEUED: std::sync::LazyLock<Mutex<Queued>> = std::sync::LazyLock::new(|| {
    Mutex::new(Queued {
        by_key: Default::default(),
        sweep_at: SWEEP_MIN,
    })
});

/// The smallest `Queued::sweep_at`.
const SWEEP_MIN: usize = 64;

fn queued<T>(f: impl FnOnce(&mut Queued) -> T) -> T {
    f(&mut QUEUED.lock().unwrap_or_else(|e| e.into_inner()))
}

/// `fi_control(domain, FI_QUEUE_WORK)`.
///
/// # Safety
/// `w` readable, its `op` pointing to the structure `op_type` names, whose buffers stay
/// valid as the transfer requires.
unsafe fn queue(d: &Domain, dom: usize, w: *const FiDeferredWork) -> Result<isize, isize> {
    // Misaligned pointers are refused, as misaligned fids are (`get`): what they point to is
    // read in place below.
    if !w.is_aligned() {
        return Err(-(FI_EINVAL as isize));
    }
    // SAFETY: null or readable (caller), aligned.
    let w = unsafe { w.as_ref() }.ok_or(-(FI_EINVAL as isize))?;
    // SAFETY: fids from the caller, checked by get.
    let trig = unsafe { obj::<Counter>(w.triggering_cntr) }?;
    let done = if w.completion_cntr.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { obj::<Counter>(w.completion_cntr) }?)
    };
    // Every op structure starts with a pointer (its endpoint or counter).
    if w.op.is_null() || !w.op.cast::<usize>().is_aligned() {
        return Err(-(FI_EINVAL as isize));
    }
    // The structures `op` points to, read per op_type; `iov` and `rma` own the segments for
    // the call.
    let (iov, rma);
    let op = match w.op_type {
        FI_OP_SEND | FI_OP_RECV => {
            // SAFETY: op is a struct fi_op_msg for these (caller).
            let o = unsafe { &*w.op.cast::<FiOpMsg<FiMsg>>() };
            // SAFETY: as above.
            let ep = unsafe { ep_of(o.ep) }?;
            // SAFETY: segments readable (caller).
            iov = unsafe { segments(o.msg.msg_iov, o.msg.iov_count) }?;
            let msg = Msg {
                iov: &iov,
                desc: &[],
                addr: o.msg.addr,
                context: o.msg.context as usize,
                data: o.msg.data,
                tag: 0,
                ignore: 0,
            };
            let om = OpMsg {
                ep,
                msg,
                flags: o.flags,
            };
            if w.op_type == FI_OP_SEND {
                WorkOp::Send(om)
            } else {
                WorkOp::Recv(om)
            }
        }
        FI_OP_TSEND | FI_OP_TRECV => {
            // SAFETY: op is a struct fi_op_tagged for these (caller).
            let o = unsafe { &*w.op.cast::<FiOpMsg<FiMsgTagged>>() };
            // SAFETY: as above.
            let ep = unsafe { ep_of(o.ep) }?;
            // SAFETY: segments readable (caller).
            iov = unsafe { segments(o.msg.msg_iov, o.msg.iov_count) }?;
            let msg = Msg {
                iov: &iov,
                desc: &[],
                addr: o.msg.addr,
                context: o.msg.context as usize,
                data: o.msg.data,
                tag: o.msg.tag,
                ignore: o.msg.ignore,
            };
            let om = OpMsg {
                ep,
                msg,
                flags: o.flags,
            };
            if w.op_type == FI_OP_TSEND {
                WorkOp::TSend(om)
            } else {
                WorkOp::TRecv(om)
            }
        }
        FI_OP_READ | FI_OP_WRITE => {
            // SAFETY: op is a struct fi_op_rma for these (caller).
            let o = unsafe { &*w.op.cast::<FiOpRma>() };
            // SAFETY: as above.
            let ep = unsafe { ep_of(o.ep) }?;
            // SAFETY: segments readable (caller).
            iov = unsafe { segments(o.msg.msg_iov, o.msg.iov_count) }?;
            // SAFETY: as above.
            rma = unsafe { rma_segments(o.msg.rma_iov, o.msg.rma_iov_count) }?;
            let msg = MsgRma {
                iov: &iov,
                desc: &[],
                addr: o.msg.addr,
                rma_iov: &rma,
                context: o.msg.context as usize,
                data: o.msg.data,
            };
            let or = OpRma {
                ep,
                msg,
                flags: o.flags,
            };
            if w.op_type == FI_OP_WRITE {
                WorkOp::Write(or)
            } else {
                WorkOp::Read(or)
            }
        }
        FI_OP_CNTR_SET | FI_OP_CNTR_ADD => {
            // SAFETY: op is a struct fi_op_cntr for these (caller).
            let o = unsafe { &*w.op.cast::<FiOpCntr>() };
            // SAFETY: a fid from the caller, checked.
            let cntr = unsafe { obj::<Counter>(o.cntr) }?;
            let oc = OpCntr {
                cntr,
                value: o.value,
            };
            if w.op_type == FI_OP_CNTR_SET {
                WorkOp::CntrSet(oc)
            } else {
                WorkOp::CntrAdd(oc)
            }
        }
        FI_OP_ATOMIC..=FI_OP_COMPARE_ATOMIC => {
            // SAFETY: op is the structure op_type names (caller).
            unsafe { atomic::deferred(w.op_type, w.op.cast()) }?
        }
        _ => return Err(-(FI_EINVAL as isize)),
    };
    let work = DeferredWork {
        threshold: w.threshold,
        triggering_cntr: trig,
        completion_cntr: done,
        op,
    };
    // SAFETY: the buffers stay valid as the transfer requires (caller).
    let id = unsafe { d.queue_work(&work) }.map_err(neg)?;
    let at = w as *const FiDeferredWork as usize;
    queued(|q| {
        if q.by_key.len() >= q.sweep_at {
            q.by_key.retain(|_, id| !id.ended());
            q.sweep_at = (2 * q.by_key.len()).max(SWEEP_MIN);
        }
        q.by_key.insert((dom, at), id);
    });
    Ok(0)
}

/// `fi_control` of a domain: the deferred work queue.
pub(crate) unsafe extern "C" fn domain_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { obj::<Domain>(fid) }?;
        let dom = fid as usize;
        match command {
            // SAFETY: a struct fi_deferred_work as fi_trigger(3) describes (caller).
            FI_QUEUE_WORK => unsafe { queue(d, dom, arg.cast()) },
            FI_CANCEL_WORK => {
                let at = arg as usize;
                let id = queued(|q| q.by_key.remove(&(dom, at))).ok_or(-(libc::ENOENT as isize))?;
                d.cancel_work(&id).map(|()| 0).map_err(neg)
            }
            FI_FLUSH_WORK => {
                queued(|q| q.by_key.retain(|(dd, _), _| *dd != dom));
                d.flush_work(None).map(|_| 0).map_err(neg)
            }
            _ => Err(-(FI_ENOSYS as isize)),
        }
    }))
}
