//! Atomics through C: every member of `struct fi_ops_atomic` and the domain's `query_atomic`,
//! onto the endpoint's atomic, fetch and compare calls and the core's validity tables. The
//! core's atomic request carries one contiguous operand (and compare and result), so the vector
//! and message forms take one `fi_ioc` per vector and one `fi_rma_ioc`; more answer -FI_EINVAL.
//! `FI_TRIGGER` on `fi_atomicmsg` arms a threshold or XPU trigger like the RMA calls.

use std::ffi::{c_int, c_void};

use xfabric::atomic::{compare_valid, count_limit, fetch_valid, valid};
use xfabric::{
    AtomicOp, Datatype, Domain, Endpoint, MsgAtomic, OpAtomic, OpCompareAtomic, OpFetchAtomic,
    RawIov, WorkOp, ATOMIC_MAX, FI_TAGGED, FI_TRIGGER,
};

use crate::consts::{FI_EINVAL, FI_EOPNOTSUPP};
use crate::ffi::{armed, bytes, bytes_mut, call, ep_of, neg, obj, Armed};
use crate::header::{
    FiAtomicAttr, FiIoc, FiMsgAtomic, FiMsgIoc, FiOpAtomic, FiOpCompareAtomic, FiOpFetchAtomic,
};

/// `FI_FETCH_ATOMIC` and `FI_COMPARE_ATOMIC`, query_atomic's flags.
const FI_FETCH_ATOMIC: u64 = 1 << 58;
const FI_COMPARE_ATOMIC: u64 = 1 << 59;

const EINVAL: isize = -(FI_EINVAL as isize);

/// The C enums, -FI_EINVAL for a value neither enum has (a defined pair the call does not take
/// is the core's -FI_EOPNOTSUPP).
fn kinds(dt: c_int, op: c_int) -> Result<(Datatype, AtomicOp), isize> {
    Ok((
        Datatype::from_raw(dt).ok_or(EINVAL)?,
        AtomicOp::from_raw(op).ok_or(EINVAL)?,
    ))
}

/// Bytes of `count` elements, refused before any memory is touched when more than one request
/// can carry (the core would refuse it too, but the slice must not be formed first):
/// `-FI_EMSGSIZE`, as fi_atomic(3) names it.
fn span(count: usize, dt: Datatype) -> Result<usize, isize> {
    count
        .checked_mul(dt.size())
        .filter(|&n| n <= ATOMIC_MAX)
        .ok_or(-(libc::EMSGSIZE as isize))
}

/// The one `fi_ioc` of a vector call.
///
/// # Safety
/// `iov` readable for `n` elements.
unsafe fn one_ioc(iov: *const FiIoc, n: usize) -> Result<FiIoc, isize> {
    if n != 1 || iov.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: readable (caller), checked non-null; read unaligned, as `segments` reads.
    Ok(unsafe { iov.read_unaligned() })
}

/// The request's operand: empty for `FI_ATOMIC_READ`, which has none.
///
/// # Safety
/// `buf` readable for `count` elements of `dt`.
unsafe fn operand<'a>(
    buf: *const c_void,
    count: usize,
    dt: Datatype,
    op: AtomicOp,
) -> Result<&'a [u8], isize> {
    let n = if op == AtomicOp::Read {
        0
    } else {
        span(count, dt)?
    };
    // SAFETY: forwarded contract.
    unsafe { bytes(buf, n) }
}

/// A C message's parts: the endpoint-independent message, its one operand segment.
///
/// # Safety
/// `msg` null or a valid `struct fi_msg_atomic`.
unsafe fn msg_of(msg: *const c_void) -> Result<(MsgAtomic, FiIoc), isize> {
    // SAFETY: null or valid (caller).
    let m = unsafe { msg.cast::<FiMsgAtomic>().as_ref() }.ok_or(EINVAL)?;
    let (dt, op) = kinds(m.datatype, m.op)?;
    // SAFETY: the message's vectors are readable for their counts (caller).
    let (ioc, rma) = unsafe {
        (
            one_ioc(m.msg_iov, m.iov_count)?,
            *(if m.rma_iov_count == 1 && !m.rma_iov.is_null() {
                m.rma_iov
            } else {
                return Err(EINVAL);
            }),
        )
    };
    if rma.count != ioc.count {
        return Err(EINVAL);
    }
    let ma = MsgAtomic::new(m.addr, rma.addr, rma.key, dt, op, m.context as usize);
    Ok((ma, ioc))
}

fn ok(r: xfabric::Result<()>) -> Result<isize, isize> {
    r.map(|()| 0).map_err(neg)
}

/// `fi_atomicmsg`, triggered or not.
///
/// # Safety
/// As `Endpoint::atomicmsg` and `armed`.
unsafe fn atomicmsg(
    e: &Endpoint,
    m: &MsgAtomic,
    buf: &[u8],
    count: usize,
    flags: u64,
) -> xfabric::Result<()> {
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.atomicmsg(m, buf, count, flags),
            Some(Armed::Threshold(t)) => e.atomicmsg_triggered(m, buf, count, f, &t),
            Some(Armed::Xpu(x, v, n)) => e
                .atomicmsg_xpu(m, buf, count, f, x, v)
                .map(|k| *n = k as i32),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_write(
    ep: *mut c_void,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        // SAFETY: fid checked; buf readable for count elements until completion (fi_atomic(3)).
        let (e, b) = unsafe { (ep_of(ep)?, operand(buf, count, dt, op)?) };
        let m = MsgAtomic::new(dest, addr, key, dt, op, ctx as usize);
        // SAFETY: as above.
        ok(unsafe { e.atomicmsg(&m, b, count, 0) })
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_writev(
    ep: *mut c_void,
    iov: *const c_void,
    desc: *mut *mut c_void,
    n: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov readable for n (caller).
    match unsafe { one_ioc(iov.cast(), n) } {
        // SAFETY: forwarded.
        Ok(i) => unsafe {
            atomic_write(
                ep,
                i.addr,
                i.count,
                desc.cast(),
                dest,
                addr,
                key,
                dt,
                op,
                ctx,
            )
        },
        Err(e) => e,
    }
}

pub(crate) unsafe extern "C" fn atomic_writemsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    call(|| {
        // SAFETY: fid checked; the message is valid (caller).
        let (e, (m, ioc)) = unsafe { (ep_of(ep)?, msg_of(msg)?) };
        // SAFETY: the segment is readable until completion (caller).
        let b = unsafe { operand(ioc.addr, ioc.count, m.datatype, m.op) }?;
        // SAFETY: as above; a trigger context is the caller's.
        ok(unsafe { atomicmsg(e, &m, b, ioc.count, flags) })
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_inject(
    ep: *mut c_void,
    buf: *const c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        // SAFETY: fid checked; buf readable for count elements (copied before return).
        let (e, b) = unsafe { (ep_of(ep)?, operand(buf, count, dt, op)?) };
        ok(e.inject_atomic(b, count, dest, addr, key, dt, op))
    })
}

/// The common body of the fetch calls.
///
/// # Safety
/// `buf` readable and `result` writable for `count` elements until completion.
#[allow(clippy::too_many_arguments)]
unsafe fn fetch(
    ep: *mut c_void,
    m: &MsgAtomic,
    buf: *const c_void,
    count: usize,
    result: *mut c_void,
    flags: u64,
) -> Result<isize, isize> {
    // SAFETY: fid checked; the buffers as the caller says.
    let (e, b, r) = unsafe {
        (
            ep_of(ep)?,
            operand(buf, count, m.datatype, m.op)?,
            bytes_mut(result, span(count, m.datatype)?)?,
        )
    };
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): as above, and `armed`'s contract.
    ok(unsafe {
        match armed(m.context, flags) {
            Err(e) => Err(e),
            Ok(None) => e.fetch_atomicmsg(m, b, r, count, flags),
            Ok(Some(Armed::Threshold(t))) => e.fetch_atomicmsg_triggered(m, b, r, count, f, &t),
            Ok(Some(Armed::Xpu(..))) => Err(xpu_fetching("fetch_atomicmsg")),
        }
    })
}

/// A fetching atomic armed on an XPU trigger: not provided by the Rust API either (a kernel
/// that needs one posts it itself: `fi_xpu_fetch_atomic`, `fi_xpu_compare_atomic`).
fn xpu_fetching(what: &str) -> xfabric::Error {
    xfabric::Error::OpNotSupp(format!(
        "{what}: FI_TRIGGER_XPU is not supported for fetching atomics (fi_xpu_fetch_atomic is)"
    ))
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_readwrite(
    ep: *mut c_void,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        let m = MsgAtomic::new(dest, addr, key, dt, op, ctx as usize);
        // SAFETY: the buffers live until completion (fi_atomic(3)).
        unsafe { fetch(ep, &m, buf, count, result, 0) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_readwritev(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    n: usize,
    resultv: *mut c_void,
    _result_desc: *mut *mut c_void,
    result_n: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        // SAFETY: the vectors are readable for their counts (caller).
        let (i, r) = unsafe { (one_ioc(iov.cast(), n)?, one_ioc(resultv.cast(), result_n)?) };
        if i.count != r.count {
            return Err(EINVAL);
        }
        let m = MsgAtomic::new(dest, addr, key, dt, op, ctx as usize);
        // SAFETY: the segments live until completion (fi_atomic(3)).
        unsafe { fetch(ep, &m, i.addr, i.count, r.addr, 0) }
    })
}

pub(crate) unsafe extern "C" fn atomic_readwritemsg(
    ep: *mut c_void,
    msg: *const c_void,
    resultv: *mut c_void,
    _result_desc: *mut *mut c_void,
    result_n: usize,
    flags: u64,
) -> isize {
    call(|| {
        // SAFETY: the message and result vector are valid (caller).
        let ((m, i), r) = unsafe { (msg_of(msg)?, one_ioc(resultv.cast(), result_n)?) };
        if i.count != r.count {
            return Err(EINVAL);
        }
        // SAFETY: the segments live until completion (fi_atomic(3)).
        unsafe { fetch(ep, &m, i.addr, i.count, r.addr, flags) }
    })
}

/// The common body of the compare calls.
///
/// # Safety
/// `buf` and `compare` readable, `result` writable, for `count` elements until completion.
unsafe fn compare(
    ep: *mut c_void,
    m: &MsgAtomic,
    buf: *const c_void,
    compare: *const c_void,
    count: usize,
    result: *mut c_void,
    flags: u64,
) -> Result<isize, isize> {
    let n = span(count, m.datatype)?;
    // SAFETY: fid checked; the buffers as the caller says.
    let (e, b, c, r) = unsafe {
        (
            ep_of(ep)?,
            bytes(buf, n)?,
            bytes(compare, n)?,
            bytes_mut(result, n)?,
        )
    };
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): as above, and `armed`'s contract.
    ok(unsafe {
        match armed(m.context, flags) {
            Err(e) => Err(e),
            Ok(None) => e.compare_atomicmsg(m, b, c, r, count, flags),
            Ok(Some(Armed::Threshold(t))) => {
                e.compare_atomicmsg_triggered(m, b, c, r, count, f, &t)
            }
            Ok(Some(Armed::Xpu(..))) => Err(xpu_fetching("compare_atomicmsg")),
        }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_compwrite(
    ep: *mut c_void,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    cmp: *const c_void,
    _compare_desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        let m = MsgAtomic::new(dest, addr, key, dt, op, ctx as usize);
        // SAFETY: the buffers live until completion (fi_atomic(3)).
        unsafe { compare(ep, &m, buf, cmp, count, result, 0) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_compwritev(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    n: usize,
    comparev: *const c_void,
    _compare_desc: *mut *mut c_void,
    compare_n: usize,
    resultv: *mut c_void,
    _result_desc: *mut *mut c_void,
    result_n: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: c_int,
    op: c_int,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        let (dt, op) = kinds(dt, op)?;
        // SAFETY: the vectors are readable for their counts (caller).
        let (i, c, r) = unsafe {
            (
                one_ioc(iov.cast(), n)?,
                one_ioc(comparev.cast(), compare_n)?,
                one_ioc(resultv.cast(), result_n)?,
            )
        };
        if i.count != c.count || i.count != r.count {
            return Err(EINVAL);
        }
        let m = MsgAtomic::new(dest, addr, key, dt, op, ctx as usize);
        // SAFETY: the segments live until completion (fi_atomic(3)).
        unsafe { compare(ep, &m, i.addr, c.addr, i.count, r.addr, 0) }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn atomic_compwritemsg(
    ep: *mut c_void,
    msg: *const c_void,
    comparev: *const c_void,
    _compare_desc: *mut *mut c_void,
    compare_n: usize,
    resultv: *mut c_void,
    _result_desc: *mut *mut c_void,
    result_n: usize,
    flags: u64,
) -> isize {
    call(|| {
        // SAFETY: the message and vectors are valid (caller).
        let ((m, i), c, r) = unsafe {
            (
                msg_of(msg)?,
                one_ioc(comparev.cast(), compare_n)?,
                one_ioc(resultv.cast(), result_n)?,
            )
        };
        if i.count != c.count || i.count != r.count {
            return Err(EINVAL);
        }
        // SAFETY: the segments live until completion (fi_atomic(3)).
        unsafe { compare(ep, &m, i.addr, c.addr, i.count, r.addr, flags) }
    })
}

/// A valid-query: the count the core answers lands in `*count`.
///
/// # Safety
/// `count` null or writable.
unsafe fn valid_query(
    ep: *mut c_void,
    dt: c_int,
    op: c_int,
    count: *mut c_void,
    q: fn(&Endpoint, Datatype, AtomicOp) -> xfabric::Result<usize>,
) -> c_int {
    let r = call(|| {
        let (dt, op) = kinds(dt, op)?;
        // SAFETY: fid checked.
        let e = unsafe { ep_of(ep) }?;
        let out = count.cast::<usize>();
        if out.is_null() {
            return Err(EINVAL);
        }
        let n = q(e, dt, op).map_err(neg)?;
        // SAFETY: writable (caller), checked non-null.
        unsafe { out.write_unaligned(n) };
        Ok(0)
    });
    c_int::try_from(r).unwrap_or(-(FI_EINVAL))
}

pub(crate) unsafe extern "C" fn atomic_writevalid(
    ep: *mut c_void,
    dt: c_int,
    op: c_int,
    count: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { valid_query(ep, dt, op, count, Endpoint::atomicvalid) }
}

pub(crate) unsafe extern "C" fn atomic_readwritevalid(
    ep: *mut c_void,
    dt: c_int,
    op: c_int,
    count: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { valid_query(ep, dt, op, count, Endpoint::fetch_atomicvalid) }
}

pub(crate) unsafe extern "C" fn atomic_compwritevalid(
    ep: *mut c_void,
    dt: c_int,
    op: c_int,
    count: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { valid_query(ep, dt, op, count, Endpoint::compare_atomicvalid) }
}

/// `fi_query_atomic`: the core's tables for the family `flags` names, with the element size
/// and the most elements one request carries.
pub(crate) unsafe extern "C" fn domain_query_atomic(
    domain: *mut c_void,
    dt: c_int,
    op: c_int,
    attr: *mut c_void,
    flags: u64,
) -> c_int {
    let r = call(|| {
        // SAFETY: fid checked.
        unsafe { obj::<Domain>(domain) }?;
        let (dt, op) = kinds(dt, op)?;
        let attr = attr.cast::<FiAtomicAttr>();
        if attr.is_null() || flags & FI_FETCH_ATOMIC != 0 && flags & FI_COMPARE_ATOMIC != 0 {
            return Err(EINVAL);
        }
        // Atomics into tagged receive buffers (FI_TAGGED) are not offered: the posts refuse
        // the flag.
        let ok = if flags & FI_TAGGED != 0 {
            false
        } else if flags & FI_COMPARE_ATOMIC != 0 {
            compare_valid(op, dt)
        } else if flags & FI_FETCH_ATOMIC != 0 {
            fetch_valid(op, dt)
        } else {
            valid(op, dt)
        };
        if !ok {
            return Err(-(FI_EOPNOTSUPP as isize));
        }
        // SAFETY: writable (caller), checked non-null.
        unsafe {
            attr.write_unaligned(FiAtomicAttr {
                count: count_limit(dt, ATOMIC_MAX),
                size: dt.size(),
            })
        };
        Ok(0)
    });
    c_int::try_from(r).unwrap_or(-(FI_EINVAL))
}

/// `FI_OP_ATOMIC`, `FI_OP_FETCH_ATOMIC`, `FI_OP_COMPARE_ATOMIC` of `enum fi_trigger_op`.
pub(crate) const FI_OP_ATOMIC: c_int = 6;
pub(crate) const FI_OP_FETCH_ATOMIC: c_int = 7;
pub(crate) const FI_OP_COMPARE_ATOMIC: c_int = 8;

/// The queued atomic of a `struct fi_deferred_work` whose `op_type` is one of the three atomic
/// kinds, its buffers as the core's deferred work takes them.
///
/// # Safety
/// `op` null or the structure `op_type` names, its vectors readable for their counts and its
/// buffers valid until the work completes.
pub(crate) unsafe fn deferred<'a>(op_type: c_int, op: *const c_void) -> Result<WorkOp<'a>, isize> {
    if op.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: every kind starts with the endpoint and the message (caller).
    let head = unsafe { &*op.cast::<FiOpAtomic>() };
    // SAFETY: as above.
    let (ep, (msg, ioc)) = unsafe {
        (
            ep_of(head.ep)?,
            msg_of((&head.msg as *const FiMsgAtomic).cast())?,
        )
    };
    let n = span(ioc.count, msg.datatype)?;
    let operand = RawIov {
        addr: ioc.addr as usize,
        len: if msg.op == AtomicOp::Read { 0 } else { n },
    };
    let count = ioc.count;
    // A result or compare vector: one segment of the operand's count.
    let seg = |v: &FiMsgIoc| -> Result<RawIov, isize> {
        // SAFETY: its vector is readable for its count (caller).
        let i = unsafe { one_ioc(v.msg_iov, v.iov_count) }?;
        if i.count != count {
            return Err(EINVAL);
        }
        Ok(RawIov {
            addr: i.addr as usize,
            len: n,
        })
    };
    Ok(match op_type {
        FI_OP_ATOMIC => WorkOp::Atomic(OpAtomic {
            ep,
            msg,
            operand,
            count,
            flags: head.flags,
        }),
        FI_OP_FETCH_ATOMIC => {
            // SAFETY: the structure op_type names (caller).
            let o = unsafe { &*op.cast::<FiOpFetchAtomic>() };
            WorkOp::FetchAtomic(OpFetchAtomic {
                ep,
                msg,
                operand,
                result: seg(&o.fetch)?,
                count,
                flags: o.flags,
            })
        }
        FI_OP_COMPARE_ATOMIC => {
            // SAFETY: the structure op_type names (caller).
            let o = unsafe { &*op.cast::<FiOpCompareAtomic>() };
            WorkOp::CompareAtomic(OpCompareAtomic {
                ep,
                msg,
                operand,
                compare: seg(&o.compare)?,
                result: seg(&o.fetch)?,
                count,
                flags: o.flags,
            })
        }
        _ => return Err(EINVAL),
    })
}
