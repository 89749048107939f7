//! RMA through C: fi_read, fi_write, fi_inject_write, fi_writedata, fi_inject_writedata,
//! fi_readv, fi_writev, fi_readmsg and fi_writemsg onto the endpoint's RMA calls. Keys, address
//! checks, ordering and the segment limit are the core's.

use std::ffi::c_void;

use xfabric::{Endpoint, MsgRma, RawIov, RmaIov, FI_TRIGGER};

use crate::consts::FI_EINVAL;
use crate::ffi::{
    armed, bytes, bytes_mut, call, ep_of, neg, no_xpu, rma_segments, segments, Armed,
};
use crate::header::FiMsgRma;

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn rma_read(
    ep: *mut c_void,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf writable for len and left alone until completion.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes_mut(buf, len)?) };
        // SAFETY: as above.
        unsafe { ep.read(b, None, src, addr, key, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn rma_write(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf readable for len and kept until completion.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // An alias whose default flags hold FI_TRIGGER (fi_ep_alias): its context is a
        // triggered context, as writemsg with those flags reads it.
        let defaults = ep.tx_op_flags();
        if defaults & FI_TRIGGER != 0 {
            let (iov, rma) = ([RawIov::of(b)], [RmaIov { addr, len, key }]);
            let m = MsgRma {
                iov: &iov,
                desc: &[],
                addr: dest,
                rma_iov: &rma,
                context: ctx as usize,
                data: 0,
            };
            // SAFETY: as above; with FI_TRIGGER the context is a fi_triggered_context.
            return unsafe { writemsg(ep, &m, defaults) }
                .map(|()| 0)
                .map_err(neg);
        }
        // SAFETY: as above.
        unsafe { ep.write(b, None, dest, addr, key, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn rma_writedata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: as rma_write.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // SAFETY: as rma_write.
        unsafe { ep.writedata(b, None, data, dest, addr, key, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn rma_inject(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf readable for len (copied before return).
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.inject_write(b, dest, addr, key).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn rma_injectdata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    call(|| {
        // SAFETY: as rma_inject.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.inject_writedata(b, data, dest, addr, key)
            .map(|()| 0)
            .map_err(neg)
    })
}

/// Posts a C RMA message through `post` (the core's readmsg or writemsg).
///
/// # Safety
/// `ep` null or a readable fid; `msg` null or a valid `struct fi_msg_rma` whose segments stay
/// valid as the core call requires.
unsafe fn post_rma(
    ep: *mut c_void,
    msg: *const c_void,
    post: impl FnOnce(&Endpoint, &MsgRma<'_>) -> xfabric::Result<()>,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { ep_of(ep) }?;
        // SAFETY: null or a valid message (caller).
        let m = unsafe { msg.cast::<FiMsgRma>().as_ref() }.ok_or(-(FI_EINVAL as isize))?;
        // SAFETY: the message's local segments are readable (caller).
        let iov = unsafe { segments(m.msg_iov, m.iov_count) }?;
        // SAFETY: the message's target segments are readable (caller).
        let rma = unsafe { rma_segments(m.rma_iov, m.rma_iov_count) }?;
        let msg = MsgRma {
            iov: &iov,
            desc: &[],
            addr: m.addr,
            rma_iov: &rma,
            context: m.context as usize,
            data: m.data,
        };
        post(ep, &msg).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn rma_readmsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: forwarded; segments valid until completion (fi_rma(3)).
    unsafe { post_rma(ep, msg, |e, m| readmsg(e, m, flags)) }
}

pub(crate) unsafe extern "C" fn rma_writemsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: as rma_readmsg.
    unsafe { post_rma(ep, msg, |e, m| writemsg(e, m, flags)) }
}

/// The post of `fi_readmsg` ([`rma_readmsg`]), triggered or not.
///
/// # Safety
/// As `Endpoint::readmsg` and [`armed`].
unsafe fn readmsg(e: &Endpoint, m: &MsgRma<'_>, flags: u64) -> xfabric::Result<()> {
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.readmsg(m, flags),
            Some(Armed::Threshold(t)) => e.readmsg_triggered(m, flags & !FI_TRIGGER, &t),
            Some(Armed::Xpu(..)) => Err(no_xpu("fi_readmsg")),
        }
    }
}

/// The post of `fi_writemsg` ([`rma_writemsg`], and [`rma_write`] on an alias whose default
/// flags hold `FI_TRIGGER`), triggered or not.
///
/// # Safety
/// As `Endpoint::writemsg` and [`armed`].
unsafe fn writemsg(e: &Endpoint, m: &MsgRma<'_>, flags: u64) -> xfabric::Result<()> {
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.writemsg(m, flags),
            Some(Armed::Threshold(t)) => e.writemsg_triggered(m, f, &t),
            Some(Armed::Xpu(x, v, n)) => e.writemsg_xpu(m, f, x, v).map(|k| *n = k as i32),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn rma_readv(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov readable for count; the segments writable until completion (fi_rma(3)).
    unsafe {
        post_v(ep, iov, count, |e, v| {
            e.readv(v, &[], src, addr, key, ctx as usize)
        })
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn rma_writev(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov readable for count; the segments readable until completion (fi_rma(3)).
    unsafe {
        post_v(ep, iov, count, |e, v| {
            e.writev(v, &[], dest, addr, key, ctx as usize)
        })
    }
}

/// Posts a vector RMA call through `post` (the core's readv or writev).
///
/// # Safety
/// `ep` null or a readable fid; `iov` readable for `count` iovecs whose segments stay valid as
/// the core call requires.
unsafe fn post_v(
    ep: *mut c_void,
    iov: *const c_void,
    count: usize,
    post: impl FnOnce(&Endpoint, &[RawIov]) -> xfabric::Result<()>,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked; iov as the caller says.
        let (e, v) = unsafe { (ep_of(ep)?, segments(iov.cast(), count)?) };
        post(e, &v).map(|()| 0).map_err(neg)
    })
}
