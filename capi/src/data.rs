//! The data path through C: endpoint bind/enable/getname, message and tagged sends and
//! receives (the `*msg` calls with `FI_TRIGGER` armed from their context), address vector
//! inserts, completion queue reads in every format, counters. Each call checks its fid and
//! hands the core call its arguments; matching, queues and progress are the core's.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

use xfabric::{
    AddressVector, CompletionQueue, Counter, CqDataEntry, CqEntry, CqFormat, CqFormatEntry,
    CqMsgEntry, CqTaggedEntry, Endpoint, EventQueue, Msg, RawIov, FI_ADDR_STR, FI_ADDR_UNSPEC,
    FI_TRIGGER,
};

use crate::consts::*;
use crate::ffi::{
    api_version, armed, bytes, bytes_mut, call, code, ep_of, guard, int, neg, no_xpu, obj,
    publish_at, segments, Armed, CEndpoint, Class,
};
use crate::header::{FiAlias, FiMsg, FiMsgTagged, Fid};

/// Bytes of `struct fi_cq_err_entry` before API 1.5 (`fi_cq_err_entry_1_0`: it ends at
/// `err_data`).
const CQ_ERR_ENTRY_1_0: usize = 72;

/// `FI_ALIAS` and `FI_ENABLE`, fi_control's commands.
const FI_ALIAS: c_int = 4;
const FI_ENABLE: c_int = 6;

pub(crate) unsafe extern "C" fn ep_bind(fid: *mut c_void, bfid: *mut c_void, flags: u64) -> c_int {
    int(call(|| {
        // SAFETY: fids from the caller, checked.
        let ep = unsafe { ep_of(fid) }?;
        if bfid.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        // SAFETY: a readable struct fid (caller); its class picks the bind.
        let class = unsafe { (*bfid.cast::<Fid>()).fclass };
        // SAFETY (each arm): get checks the class and that the object is ours.
        let r = match class {
            FI_CLASS_CQ => ep.bind_cq(unsafe { obj::<CompletionQueue>(bfid) }?, flags),
            FI_CLASS_CNTR => ep.bind_cntr(unsafe { obj::<Counter>(bfid) }?, flags),
            FI_CLASS_AV => ep.bind_av(unsafe { obj::<AddressVector>(bfid) }?),
            FI_CLASS_EQ => ep.bind_eq(unsafe { obj::<EventQueue>(bfid) }?),
            _ => return Err(-(FI_EINVAL as isize)),
        };
        r.map(|()| 0).map_err(|e| code(&e) as isize)
    }))
}

pub(crate) unsafe extern "C" fn ep_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let c = unsafe { obj::<CEndpoint>(fid) }?;
        match command {
            FI_ENABLE => c.ep.enable().map(|()| 0).map_err(|e| code(&e) as isize),
            FI_ALIAS => {
                // SAFETY: null or a struct fi_alias (fi_alias's argument).
                let a = unsafe { arg.cast::<FiAlias>().as_ref() }.ok_or(-(FI_EINVAL as isize))?;
                if a.fid.is_null() {
                    return Err(-(FI_EINVAL as isize));
                }
                let alias = CEndpoint {
                    ep: c.ep.alias(a.flags).map_err(neg)?,
                    addr_format: c.addr_format,
                };
                // The alias answers to the endpoint's context, as libfabric's do.
                // SAFETY: fid is one of our endpoints (checked above), a struct fid first.
                let context = unsafe { (*fid.cast::<Fid>()).context };
                // SAFETY: fid is one of ours (checked above).
                let version = unsafe { api_version::<CEndpoint>(fid) }.map_err(|e| e as isize)?;
                // SAFETY: a.fid checked non-null, writable (fi_alias's contract).
                Ok(
                    unsafe { publish_at(version, CEndpoint::new_head(context), alias, None, a.fid) }
                        as isize,
                )
            }
            _ => Err(-(FI_ENOSYS as isize)),
        }
    }))
}

pub(crate) unsafe extern "C" fn ep_cancel(fid: *mut c_void, context: *mut c_void) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { ep_of(fid) }?;
        ep.cancel(context as usize).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_getname(
    fid: *mut c_void,
    addr: *mut c_void,
    addrlen: *mut c_void,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { obj::<CEndpoint>(fid) }?;
        let addrlen = addrlen.cast::<usize>();
        if addrlen.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        let mut name = ep.ep.getname().map_err(neg)?;
        // C reads an FI_ADDR_STR address as a C string (fi_av_insert takes it so): the NUL
        // is part of the name C gets.
        if ep.addr_format == FI_ADDR_STR && name.last() != Some(&0) {
            name.push(0);
        }
        // SAFETY: addrlen writable (caller), checked non-null.
        let room = unsafe { *addrlen };
        // SAFETY: as above.
        unsafe { *addrlen = name.len() };
        if room < name.len() || addr.is_null() {
            return Err(-(FI_ETOOSMALL as isize));
        }
        // SAFETY: addr writable for room >= name.len() bytes (caller).
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), addr.cast(), name.len()) };
        Ok(0)
    }))
}

pub(crate) unsafe extern "C" fn ep_send(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf readable for len and kept until completion (fi_msg(3)).
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // SAFETY: as above.
        unsafe { ep.send(b, None, dest, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_senddata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: as ep_send.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // SAFETY: as ep_send.
        unsafe { ep.senddata(b, None, data, dest, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_inject(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    dest: u64,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf readable for len (copied before return).
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.inject(b, dest).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_injectdata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
) -> isize {
    call(|| {
        // SAFETY: as ep_inject.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.injectdata(b, data, dest).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_recv(
    ep: *mut c_void,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: fid checked; buf writable for len and left alone until completion.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes_mut(buf, len)?) };
        // SAFETY: as above.
        unsafe { ep.recv(b, None, src, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_tsend(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: as ep_send.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // SAFETY: as ep_send.
        unsafe { ep.tsend(b, None, dest, tag, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn ep_tsenddata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: as ep_send.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        // SAFETY: as ep_send.
        unsafe { ep.tsenddata(b, None, data, dest, tag, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_tinject(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: u64,
) -> isize {
    call(|| {
        // SAFETY: as ep_inject.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.tinject(b, dest, tag).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_tinjectdata(
    ep: *mut c_void,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    call(|| {
        // SAFETY: as ep_inject.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes(buf, len)?) };
        ep.tinjectdata(b, data, dest, tag).map(|()| 0).map_err(neg)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn ep_trecv(
    ep: *mut c_void,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    call(|| {
        // SAFETY: as ep_recv.
        let (ep, b) = unsafe { (ep_of(ep)?, bytes_mut(buf, len)?) };
        // SAFETY: as ep_recv.
        unsafe { ep.trecv(b, None, src, tag, ignore, ctx as usize) }
            .map(|()| 0)
            .map_err(neg)
    })
}

/// The address a C caller passes at `p`: a sockaddr of the length its family says, or a
/// NUL-terminated string (without the NUL), as the AV's provider writes them. A sockaddr of a
/// family no provider writes is taken as `stride` bytes (the previous address's length, as
/// libfabric strides a whole insert by one length), for the AV to refuse on its own.
///
/// # Safety
/// `p` points to an address of that layout, readable in full (`stride` bytes for a sockaddr
/// whose family is unknown).
unsafe fn c_addr<'a>(av: &AddressVector, p: *const u8, stride: usize) -> &'a [u8] {
    if av.sockaddr() {
        // SAFETY: a sockaddr starts with its two family bytes (caller).
        let head = unsafe { [*p, *p.add(1)] };
        let len = xfabric::av::sockaddr_len(head).unwrap_or(stride);
        // SAFETY: a sockaddr of that family is `len` bytes (caller).
        unsafe { std::slice::from_raw_parts(p, len) }
    } else {
        // SAFETY: a NUL-terminated string (caller).
        unsafe { std::ffi::CStr::from_ptr(p.cast::<c_char>()) }.to_bytes()
    }
}

/// fi_av_insert's flags (fi_domain.h).
const FI_MORE: u64 = 1 << 18;
const FI_SYNC_ERR: u64 = 1 << 58;
/// `sizeof(struct sockaddr_in)`: the stride of an insert whose first address has a family
/// that says no length.
const SOCKADDR_IN_LEN: usize = 16;

pub(crate) unsafe extern "C" fn av_insert(
    av: *mut c_void,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut c_void,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let av = unsafe { obj::<AddressVector>(av) }?;
        if flags & !(FI_MORE | FI_SYNC_ERR) != 0 {
            return Err(-(FI_EBADFLAGS as isize));
        }
        let sync_err = flags & FI_SYNC_ERR != 0;
        if sync_err && context.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        // Back to back, as fi_getname wrote them: FI_ADDR_STR strings (NUL-terminated), or
        // sockaddrs whose family says their length.
        let mut addrs: Vec<&[u8]> = Vec::with_capacity(count.min(1024));
        let mut p = addr.cast::<u8>();
        if p.is_null() && count > 0 {
            return Err(-(FI_EINVAL as isize));
        }
        let mut stride = SOCKADDR_IN_LEN;
        for _ in 0..count {
            // SAFETY: count addresses of the AV's format follow one another at addr (caller).
            let a = unsafe { c_addr(av, p, stride) };
            stride = a.len();
            addrs.push(a);
            // SAFETY: past this address: the next one, or just past the last.
            p = unsafe { p.add(a.len() + usize::from(!av.sockaddr())) };
        }
        // Straight into the caller's array where it is one (aligned): with FI_EVENT, the
        // completion event goes on the EQ inside the insert, and a thread waiting on it must
        // find the addresses already written. A misaligned array is filled after.
        let mut tmp = Vec::new();
        // Not where it overlaps the addresses being inserted (read during the insert).
        let (addr_lo, addr_hi) = (addr as usize, p as usize);
        let out_lo = fi_addr as usize;
        let out_hi = out_lo.saturating_add(count.saturating_mul(8));
        let apart = out_hi <= addr_lo || addr_hi <= out_lo;
        let direct = !fi_addr.is_null() && fi_addr.cast::<u64>().is_aligned() && apart;
        let out: &mut [u64] = if direct {
            let bytes = count.checked_mul(8).ok_or(-(FI_EINVAL as isize))?;
            crate::ffi::span_ok(bytes)?;
            // SAFETY: fi_addr writable for count entries (caller), aligned, within isize.
            unsafe { std::slice::from_raw_parts_mut(fi_addr.cast::<u64>(), count) }
        } else {
            tmp.resize(count, 0);
            &mut tmp
        };
        out.fill(FI_ADDR_UNSPEC);
        let n = if sync_err {
            let mut errs = vec![0i32; count];
            let n = av.insert_sync_err(&addrs, out, &mut errs).map_err(neg)?;
            // SAFETY: with FI_SYNC_ERR, context is an int array of count entries (caller).
            unsafe { crate::ffi::copy_out(&errs, context) };
            n
        } else {
            av.insert(&addrs, out, context as usize).map_err(neg)?
        };
        if !fi_addr.is_null() && !direct {
            // SAFETY: fi_addr writable for count entries (caller).
            unsafe { crate::ffi::copy_out(&tmp, fi_addr) };
        }
        Ok(isize::try_from(n).unwrap_or(isize::MAX))
    }))
}

/// `fi_av_bind(av, eq, flags)`: an AV opened with `FI_EVENT` completes its inserts through
/// the EQ, whose entries name the AV by its fid.
pub(crate) unsafe extern "C" fn av_bind(fid: *mut c_void, bfid: *mut c_void, flags: u64) -> c_int {
    int(call(|| {
        // SAFETY: fids from the caller, checked.
        let (av, eq) = unsafe { (obj::<AddressVector>(fid)?, obj::<EventQueue>(bfid)?) };
        if flags != 0 {
            return Err(-(FI_EINVAL as isize));
        }
        av.bind_eq(eq, fid as usize).map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn av_remove(
    av: *mut c_void,
    fi_addr: *mut c_void,
    count: usize,
    _flags: u64,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let av = unsafe { obj::<AddressVector>(av) }?;
        let total = count.checked_mul(8).ok_or(-(FI_EINVAL as isize))?;
        // SAFETY: count fi_addr_t readable (caller).
        let raw = unsafe { bytes(fi_addr, total) }?;
        let addrs: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0xff; 8])))
            .collect();
        av.remove(&addrs).map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn av_lookup(
    av: *mut c_void,
    fi_addr: u64,
    addr: *mut c_void,
    addrlen: *mut c_void,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let av = unsafe { obj::<AddressVector>(av) }?;
        let addrlen = addrlen.cast::<usize>();
        if addrlen.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        let mut name = av.lookup(fi_addr).map_err(neg)?;
        // A string comes back as fi_getname gave it and fi_av_insert took it: a C string
        // (a provider that keeps sockaddrs prints it).
        if !av.sockaddr() {
            if av.binary() {
                name = av.straddr(&name).into_bytes();
            }
            if name.last() != Some(&0) {
                name.push(0);
            }
        }
        // SAFETY: addrlen writable (caller).
        let room = unsafe { *addrlen };
        let n = room.min(name.len());
        if n > 0 && !addr.is_null() {
            // SAFETY: addr writable for room >= n bytes (caller).
            unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), addr.cast(), n) };
        }
        // SAFETY: as above.
        unsafe { *addrlen = name.len() };
        Ok(0)
    }))
}

pub(crate) unsafe extern "C" fn av_straddr(
    av: *mut c_void,
    addr: *const c_void,
    buf: *mut c_void,
    len: *mut c_void,
) -> *const c_char {
    guard(std::ptr::null(), || {
        // SAFETY: a fid from the caller, checked.
        let Ok(av) = (unsafe { obj::<AddressVector>(av) }) else {
            return std::ptr::null();
        };
        let len = len.cast::<usize>();
        if buf.is_null() || len.is_null() || addr.is_null() {
            return std::ptr::null();
        }
        // SAFETY: an address of the AV's format (caller); one of an unknown family is
        // printed as invalid.
        let a = unsafe { c_addr(av, addr.cast::<u8>(), SOCKADDR_IN_LEN) };
        let text = av.straddr(a);
        // SAFETY: len writable, buf writable for *len bytes (caller).
        unsafe {
            let room = *len;
            let n = text.len().min(room.saturating_sub(1));
            if room > 0 {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.cast::<u8>().add(n) = 0;
            }
            *len = text.len() + 1;
        }
        buf.cast_const().cast()
    })
}

/// Reads up to `count` entries of the CQ's format into `buf` (and sources into `src`).
///
/// # Safety
/// `buf` writable for `count` entries of the CQ's format; `src` null or writable for `count`.
unsafe fn read_into(
    cq: &CompletionQueue,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    wait: Option<(usize, c_int)>,
) -> Result<isize, isize> {
    /// # Safety
    /// As read_into, with E the CQ's format.
    unsafe fn typed<E: CqFormatEntry>(
        cq: &CompletionQueue,
        buf: *mut c_void,
        count: usize,
        src: *mut u64,
        wait: Option<(usize, c_int)>,
    ) -> Result<usize, xfabric::Error> {
        let count = entries_max::<E>(count);
        // SAFETY: writable for count entries of E (caller); E is repr(C) as fi_eq.h's.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<E>(), count) };
        if src.is_null() {
            match wait {
                None => cq.read(b),
                Some((threshold, ms)) => cq.sread(b, threshold, ms),
            }
        } else {
            // SAFETY: src writable for count (caller).
            let s = unsafe { std::slice::from_raw_parts_mut(src, count) };
            match wait {
                None => cq.readfrom(b, s),
                Some((threshold, ms)) => cq.sreadfrom(b, s, threshold, ms),
            }
        }
    }
    if count == 0 {
        // No entries, but progress all the same, as libfabric's providers make it (a
        // manual-progress caller that leaves the entries to an XPU reading the exported ring
        // moves them there this way), and their answer: 0 where entries wait, -FI_EAGAIN
        // where none does, -FI_EAVAIL for an error entry.
        return cq.read_none().map(|_| 0).map_err(neg);
    }
    if buf.is_null() {
        return Err(-(FI_EINVAL as isize));
    }
    // SAFETY (each arm): forwarded contract, E chosen by the CQ's own format.
    let n = match cq.format() {
        CqFormat::Unspec | CqFormat::Context => unsafe {
            typed::<CqEntry>(cq, buf, count, src, wait)
        },
        CqFormat::Msg => unsafe { typed::<CqMsgEntry>(cq, buf, count, src, wait) },
        CqFormat::Data => unsafe { typed::<CqDataEntry>(cq, buf, count, src, wait) },
        CqFormat::Tagged => unsafe { typed::<CqTaggedEntry>(cq, buf, count, src, wait) },
    }
    .map_err(neg)?;
    Ok(isize::try_from(n).unwrap_or(isize::MAX))
}

/// A read's `count`, bounded to what one slice of `E` may span (`isize::MAX` bytes): `count`
/// is only the most entries the caller takes, so a larger one (`(size_t)-1`, say) reads as
/// many as there are, never a slice past the address space.
fn entries_max<E>(count: usize) -> usize {
    count.min(isize::MAX as usize / std::mem::size_of::<E>().max(1))
}

/// fi_cq_sread's `cond`: under FI_CQ_COND_THRESHOLD the threshold itself, a size_t passed in
/// the pointer's place (fi_cq(3): "the cond field is interpreted as a size_t threshold
/// value"; libfabric's providers read `(uintptr_t)cond`), never read through. The CQ knows its
/// wait_cond and ignores the value under FI_CQ_COND_NONE; NULL (0) means 1.
fn threshold(cond: *const c_void) -> usize {
    (cond as usize).max(1)
}

/// fi_cq_read, the call a polling loop makes (most often to hear -FI_EAGAIN): its own short
/// path, each format's read inlined here rather than through [`read_into`]'s choices of source
/// and wait.
pub(crate) unsafe extern "C" fn cq_read(cq: *mut c_void, buf: *mut c_void, count: usize) -> isize {
    /// # Safety
    /// `buf` writable for `count` (> 0) entries of E, E the CQ's format.
    #[inline(always)]
    unsafe fn typed<E: CqFormatEntry>(
        cq: &CompletionQueue,
        buf: *mut c_void,
        count: usize,
    ) -> Result<isize, isize> {
        let count = entries_max::<E>(count);
        // SAFETY: writable for count entries of E (caller); E is repr(C) as fi_eq.h's.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<E>(), count) };
        match cq.read(b) {
            // n <= count, which C gave as a size_t that fits an ssize_t return.
            Ok(n) => Ok(n as isize),
            // The empty queue, the polling loop's usual answer: `Again` owns nothing (a static
            // str), so forgetting it skips the call to the enum's drop that `neg` would make.
            Err(e @ xfabric::Error::Again(_)) => {
                std::mem::forget(e);
                Err(-(libc::EAGAIN as isize))
            }
            Err(e) => Err(neg(e)),
        }
    }
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let cq = unsafe { obj::<CompletionQueue>(cq) }?;
        if count == 0 || buf.is_null() {
            // SAFETY: nothing is written for count 0; a null buf is refused there.
            return unsafe { read_into(cq, buf, count, null_mut(), None) };
        }
        // SAFETY (each arm): buf writable for count entries of the CQ's own format (caller).
        unsafe {
            match cq.format() {
                CqFormat::Unspec | CqFormat::Context => typed::<CqEntry>(cq, buf, count),
                CqFormat::Msg => typed::<CqMsgEntry>(cq, buf, count),
                CqFormat::Data => typed::<CqDataEntry>(cq, buf, count),
                CqFormat::Tagged => typed::<CqTaggedEntry>(cq, buf, count),
            }
        }
    })
}

pub(crate) unsafe extern "C" fn cq_readfrom(
    cq: *mut c_void,
    buf: *mut c_void,
    count: usize,
    src: *mut c_void,
) -> isize {
    call(|| {
        // A null src_addr reads as fi_cq_read does (libfabric's readfrom fills sources only
        // where it is given one).
        // SAFETY: as cq_read; src null or writable for count.
        unsafe { read_into(obj::<CompletionQueue>(cq)?, buf, count, src.cast(), None) }
    })
}

pub(crate) unsafe extern "C" fn cq_sread(
    cq: *mut c_void,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    call(|| {
        let wait = Some((threshold(cond), timeout));
        // A handle of its own for as long as it waits: a close from another thread meanwhile
        // ends the wait (`CompletionQueue::close`) instead of freeing what it waits on.
        // SAFETY: a fid from the caller, checked.
        let cq = unsafe { obj::<CompletionQueue>(cq) }?.clone();
        // SAFETY: as cq_read.
        unsafe { read_into(&cq, buf, count, null_mut(), wait) }
    })
}

pub(crate) unsafe extern "C" fn cq_sreadfrom(
    cq: *mut c_void,
    buf: *mut c_void,
    count: usize,
    src: *mut c_void,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    call(|| {
        let wait = Some((threshold(cond), timeout));
        // A handle of its own, as cq_sread; a null src_addr as cq_readfrom's.
        // SAFETY: a fid from the caller, checked.
        let cq = unsafe { obj::<CompletionQueue>(cq) }?.clone();
        // SAFETY: as cq_readfrom.
        unsafe { read_into(&cq, buf, count, src.cast(), wait) }
    })
}

/// `struct fi_cq_err_entry`: the core's entry (same layout) as C fills it.
pub(crate) unsafe extern "C" fn cq_readerr(
    cq_fid: *mut c_void,
    buf: *mut c_void,
    _flags: u64,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let cq = unsafe { obj::<CompletionQueue>(cq_fid) }?;
        let out = buf.cast::<xfabric::CqErrEntry>();
        if out.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        // SAFETY: cq is one of ours (checked above).
        let version = unsafe { api_version::<CompletionQueue>(cq_fid) }.map_err(|e| e as isize)?;
        if version < FI_VERSION_1_5 {
            // Before 1.5 the entry ends at err_data, an output only (the queue's copy of the
            // data, or null): nothing of the caller's is read, and no byte past that
            // layout's end is written.
            let (e, _) = cq.readerr_data().map_err(neg)?;
            // SAFETY: buf writable as a 1.0 fi_cq_err_entry (caller), a prefix of the entry.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&e as *const xfabric::CqErrEntry).cast::<u8>(),
                    buf.cast::<u8>(),
                    CQ_ERR_ENTRY_1_0,
                )
            };
            return Ok(1);
        }
        // The caller's err_data buffer, if it gave one (fi_cq(3), API 1.5 on).
        // SAFETY: buf is a readable fi_cq_err_entry (caller).
        let (user, room) = unsafe { ((*out).err_data, (*out).err_data_size) };
        let (mut e, data) = cq.readerr_data().map_err(neg)?;
        match data {
            Some(d) if user != 0 && room > 0 => {
                let n = d.len().min(room);
                // SAFETY: the caller's err_data is writable for err_data_size bytes.
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), user as *mut u8, n) };
                e.err_data = user;
                e.err_data_size = n;
            }
            // No room given (err_data_size 0): the queue's own copy, which `readerr_data` left
            // in the entry and keeps until the next read (fi_cq(3)'s compatibility rule).
            Some(_) => {}
            // No data: the caller's buffer stays its own (libfabric keeps the pointer), with
            // nothing in it.
            None => {
                e.err_data = user;
                e.err_data_size = 0;
            }
        }
        // SAFETY: buf writable as an fi_cq_err_entry (caller).
        unsafe { *out = e };
        Ok(1)
    })
}

pub(crate) unsafe extern "C" fn cq_signal(cq: *mut c_void) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let cq = unsafe { obj::<CompletionQueue>(cq) }?;
        cq.signal().map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn cntr_read(cntr: *mut c_void) -> u64 {
    // A counter's read has no error return: a bad fid reads 0.
    // SAFETY: a fid from the caller, checked.
    guard(0, || {
        unsafe { obj::<Counter>(cntr) }.map_or(0, |c| c.read())
    })
}

pub(crate) unsafe extern "C" fn cntr_readerr(cntr: *mut c_void) -> u64 {
    // SAFETY: as cntr_read.
    guard(0, || {
        unsafe { obj::<Counter>(cntr) }.map_or(0, |c| c.readerr())
    })
}

/// Runs one of the counter's updates.
///
/// # Safety
/// `cntr` null or a readable fid.
unsafe fn cntr_op(cntr: *mut c_void, op: impl FnOnce(&Counter) -> xfabric::Result<()>) -> c_int {
    int(call(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { obj::<Counter>(cntr) }?;
        op(c).map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn cntr_add(cntr: *mut c_void, v: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { cntr_op(cntr, |c| c.add(v)) }
}

pub(crate) unsafe extern "C" fn cntr_set(cntr: *mut c_void, v: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { cntr_op(cntr, |c| c.set(v)) }
}

pub(crate) unsafe extern "C" fn cntr_adderr(cntr: *mut c_void, v: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { cntr_op(cntr, |c| c.adderr(v)) }
}

pub(crate) unsafe extern "C" fn cntr_seterr(cntr: *mut c_void, v: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { cntr_op(cntr, |c| c.seterr(v)) }
}

pub(crate) unsafe extern "C" fn cntr_wait(
    cntr: *mut c_void,
    threshold: u64,
    timeout: c_int,
) -> c_int {
    // A handle of its own for as long as it waits, as cq_sread.
    // SAFETY: forwarded.
    unsafe { cntr_op(cntr, |c| c.clone().wait(threshold, timeout)) }
}

/// Posts a C message through `post` (one of the core's *msg calls).
///
/// # Safety
/// `ep` null or a readable fid; `msg` null or a valid message of kind `M`; the segments stay
/// valid as the core call requires.
unsafe fn post_msg<M>(
    ep: *mut c_void,
    msg: *const M,
    fields: impl FnOnce(&M) -> (*const libc::iovec, usize, u64, *mut c_void, u64, u64, u64),
    post: impl FnOnce(&Endpoint, &Msg<'_>) -> xfabric::Result<()>,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let ep = unsafe { ep_of(ep) }?;
        // SAFETY: null or a valid message (caller).
        let m = unsafe { msg.as_ref() }.ok_or(-(FI_EINVAL as isize))?;
        let (iov, count, addr, context, data, tag, ignore) = fields(m);
        // SAFETY: the message's segments are readable (caller).
        let iov = unsafe { segments(iov, count) }?;
        let msg = Msg {
            iov: &iov,
            // Descriptors are not needed: every registration is looked up by address.
            desc: &[],
            addr,
            context: context as usize,
            data,
            tag,
            ignore,
        };
        post(ep, &msg).map(|()| 0).map_err(neg)
    })
}

/// The post of `fi_sendmsg` ([`ep_sendmsg`]), triggered or not.
///
/// # Safety
/// As `Endpoint::sendmsg` and [`armed`].
unsafe fn sendmsg(e: &Endpoint, m: &Msg<'_>, flags: u64) -> xfabric::Result<()> {
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.sendmsg(m, flags),
            Some(Armed::Threshold(t)) => e.sendmsg_triggered(m, f, &t),
            Some(Armed::Xpu(x, v, n)) => e.sendmsg_xpu(m, f, x, v).map(|k| *n = k as i32),
        }
    }
}

/// The post of `fi_tsendmsg` ([`ep_tsendmsg`]), triggered or not.
///
/// # Safety
/// As `Endpoint::tsendmsg` and [`armed`].
unsafe fn tsendmsg(e: &Endpoint, m: &Msg<'_>, flags: u64) -> xfabric::Result<()> {
    let f = flags & !FI_TRIGGER;
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.tsendmsg(m, flags),
            Some(Armed::Threshold(t)) => e.tsendmsg_triggered(m, f, &t),
            Some(Armed::Xpu(x, v, n)) => e.tsendmsg_xpu(m, f, x, v).map(|k| *n = k as i32),
        }
    }
}

/// The post of `fi_recvmsg` ([`ep_recvmsg`]), triggered or not.
///
/// # Safety
/// As `Endpoint::recvmsg` and [`armed`].
unsafe fn recvmsg(e: &Endpoint, m: &Msg<'_>, flags: u64) -> xfabric::Result<()> {
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.recvmsg(m, flags),
            Some(Armed::Threshold(t)) => e.recvmsg_triggered(m, flags & !FI_TRIGGER, &t),
            Some(Armed::Xpu(..)) => Err(no_xpu("fi_recvmsg")),
        }
    }
}

/// The post of `fi_trecvmsg` ([`ep_trecvmsg`]), triggered or not.
///
/// # Safety
/// As `Endpoint::trecvmsg` and [`armed`].
unsafe fn trecvmsg(e: &Endpoint, m: &Msg<'_>, flags: u64) -> xfabric::Result<()> {
    // SAFETY (each arm): the caller's contract.
    unsafe {
        match armed(m.context, flags)? {
            None => e.trecvmsg(m, flags),
            Some(Armed::Threshold(t)) => e.trecvmsg_triggered(m, flags & !FI_TRIGGER, &t),
            Some(Armed::Xpu(..)) => Err(no_xpu("fi_trecvmsg")),
        }
    }
}

pub(crate) unsafe extern "C" fn ep_sendmsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: forwarded; the segments stay valid until completion (fi_msg(3)).
    unsafe {
        post_msg(
            ep,
            msg.cast::<FiMsg>(),
            |m| (m.msg_iov, m.iov_count, m.addr, m.context, m.data, 0, 0),
            // A triggered context stays the caller's until completion (fi_trigger(3)).
            |e, m| sendmsg(e, m, flags),
        )
    }
}

pub(crate) unsafe extern "C" fn ep_recvmsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: as ep_sendmsg.
    unsafe {
        post_msg(
            ep,
            msg.cast::<FiMsg>(),
            |m| (m.msg_iov, m.iov_count, m.addr, m.context, m.data, 0, 0),
            |e, m| recvmsg(e, m, flags),
        )
    }
}

pub(crate) unsafe extern "C" fn ep_tsendmsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: as ep_sendmsg.
    unsafe {
        post_msg(
            ep,
            msg.cast::<FiMsgTagged>(),
            |m| {
                (
                    m.msg_iov,
                    m.iov_count,
                    m.addr,
                    m.context,
                    m.data,
                    m.tag,
                    m.ignore,
                )
            },
            |e, m| tsendmsg(e, m, flags),
        )
    }
}

pub(crate) unsafe extern "C" fn ep_trecvmsg(
    ep: *mut c_void,
    msg: *const c_void,
    flags: u64,
) -> isize {
    // SAFETY: as ep_sendmsg.
    unsafe {
        post_msg(
            ep,
            msg.cast::<FiMsgTagged>(),
            |m| {
                (
                    m.msg_iov,
                    m.iov_count,
                    m.addr,
                    m.context,
                    m.data,
                    m.tag,
                    m.ignore,
                )
            },
            |e, m| trecvmsg(e, m, flags),
        )
    }
}

/// Posts `count` C segments at `iov` through `post` (one of the core's vector calls).
///
/// # Safety
/// `ep` null or a readable fid; `iov` readable for `count`; the segments stay valid as the
/// core call requires.
unsafe fn post_iov(
    ep: *mut c_void,
    iov: *const c_void,
    count: usize,
    post: impl FnOnce(&Endpoint, &[RawIov]) -> xfabric::Result<()>,
) -> isize {
    call(|| {
        // SAFETY: forwarded contract.
        let (ep, segs) = unsafe { (ep_of(ep)?, segments(iov.cast(), count)?) };
        post(ep, &segs).map(|()| 0).map_err(neg)
    })
}

pub(crate) unsafe extern "C" fn ep_sendv(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: forwarded; segments valid until completion (fi_msg(3)).
    unsafe { post_iov(ep, iov, count, |e, s| e.sendv(s, &[], dest, ctx as usize)) }
}

pub(crate) unsafe extern "C" fn ep_recvv(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as ep_sendv.
    unsafe { post_iov(ep, iov, count, |e, s| e.recvv(s, &[], src, ctx as usize)) }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn ep_tsendv(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as ep_sendv.
    unsafe {
        post_iov(ep, iov, count, |e, s| {
            e.tsendv(s, &[], dest, tag, ctx as usize)
        })
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn ep_trecvv(
    ep: *mut c_void,
    iov: *const c_void,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: as ep_sendv.
    unsafe {
        post_iov(ep, iov, count, |e, s| {
            e.trecvv(s, &[], src, tag, ignore, ctx as usize)
        })
    }
}
