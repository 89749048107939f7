//! Event queues, wait sets and poll sets through C: fi_eq_read, fi_eq_sread and fi_eq_write
//! with any event structure (what the application wrote is read back byte for byte, its fid
//! as it was: a C fid stays the C fid), fi_eq_readerr with `struct fi_eq_err_entry`,
//! fi_eq_strerror and fi_cq_strerror (the core's text for the error number), fi_wait, and
//! fi_poll, fi_poll_add and fi_poll_del (a member comes back as its fid's context when
//! added).

use std::ffi::{c_char, c_int, c_void};

use xfabric::{CompletionQueue, Counter, EqEntry, EventQueue, PollSet, Pollable, WaitSet};

use crate::consts::FI_EINVAL;
use crate::ffi::{call, get, guard, int, neg, obj, strerror};
use crate::header::{FiEqEntry, FiEqErrEntry, Fid};

const ENTRY: usize = size_of::<FiEqEntry>();

/// The most bytes one `fi_eq_write` queues: an event structure is tens of bytes; a length
/// past this is a caller's mistake, not an allocation to make.
const WRITE_MAX: usize = 64 << 10;

/// Writes `e` as C reads it, as much of it as `len` bytes hold (fi_eq(3): "limited to the
/// buffer space provided", as libfabric's event queues cut it); the byte count written.
///
/// # Safety
/// `event` writable; `buf` writable for `len` bytes.
unsafe fn deliver(e: EqEntry, event: *mut u32, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: writable (caller), checked non-null by the callers.
    unsafe { *event = e.event };
    let entry = FiEqEntry {
        fid: e.fid as *mut c_void,
        context: e.context as *mut c_void,
        data: e.data,
    };
    let bytes: &[u8] = match &e.bytes {
        Some(b) => b,
        // SAFETY: a plain C struct of three words, read as its bytes.
        None => unsafe {
            std::slice::from_raw_parts((&entry as *const FiEqEntry).cast::<u8>(), ENTRY)
        },
    };
    let n = bytes.len().min(len);
    // SAFETY: `buf` holds `len >= n` bytes (caller), apart from the entry's.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n) };
    n as isize
}

/// # Safety
/// `eq` null or a readable fid; `event` and `buf` as [`deliver`].
unsafe fn read_with(
    eq: *mut c_void,
    event: *mut c_void,
    buf: *mut c_void,
    len: usize,
    read: impl FnOnce(&EventQueue) -> xfabric::Result<EqEntry>,
) -> isize {
    call(|| {
        // A handle of its own for as long as it reads (`sread` may wait): a close from another
        // thread meanwhile ends the wait instead of freeing what it waits on.
        // SAFETY: a fid from the caller, checked.
        let q = unsafe { obj::<EventQueue>(eq) }?.clone();
        if event.is_null() || buf.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        let e = read(&q).map_err(neg)?;
        // SAFETY: event and buf writable (caller), buf for `len` bytes.
        Ok(unsafe { deliver(e, event.cast(), buf, len) })
    })
}

pub(crate) unsafe extern "C" fn eq_read(
    eq: *mut c_void,
    event: *mut c_void,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    // SAFETY: forwarded contract.
    unsafe { read_with(eq, event, buf, len, |q| q.read(flags)) }
}

pub(crate) unsafe extern "C" fn eq_sread(
    eq: *mut c_void,
    event: *mut c_void,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    // SAFETY: forwarded contract.
    unsafe { read_with(eq, event, buf, len, |q| q.sread(flags, timeout)) }
}

pub(crate) unsafe extern "C" fn eq_write(
    eq: *mut c_void,
    event: u32,
    buf: *const c_void,
    len: usize,
    _flags: u64,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let q = unsafe { obj::<EventQueue>(eq) }?;
        if buf.is_null() || len == 0 || len > WRITE_MAX {
            return Err(-(FI_EINVAL as isize));
        }
        // Any event structure (`fi_eq_entry`, `fi_eq_cm_entry` with its data, ...): kept
        // byte for byte and read back whole, as libfabric's event queues do.
        // SAFETY: readable for `len` bytes (caller).
        let bytes: std::sync::Arc<[u8]> =
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.into();
        let mut e = EqEntry {
            event,
            ..Default::default()
        };
        if len >= ENTRY {
            // SAFETY: readable for len >= ENTRY bytes (caller).
            let c = unsafe { buf.cast::<FiEqEntry>().read_unaligned() };
            (e.fid, e.context, e.data) = (c.fid as usize, c.context as usize, c.data);
        }
        e.bytes = Some(bytes);
        q.write(e).map_err(neg)?;
        Ok(len as isize)
    })
}

pub(crate) unsafe extern "C" fn eq_readerr(
    eq: *mut c_void,
    buf: *mut c_void,
    _flags: u64,
) -> isize {
    call(|| {
        // SAFETY: a fid from the caller, checked.
        let q = unsafe { obj::<EventQueue>(eq) }?;
        if buf.is_null() {
            return Err(-(FI_EINVAL as isize));
        }
        let e = q.readerr().map_err(neg)?;
        // The core's EQ errors carry no provider data: err_data is left empty.
        // SAFETY: writable as an fi_eq_err_entry (caller), checked non-null.
        unsafe {
            buf.cast::<FiEqErrEntry>().write_unaligned(FiEqErrEntry {
                fid: e.fid as *mut c_void,
                context: e.context as *mut c_void,
                data: e.data,
                err: e.err,
                prov_errno: e.prov_errno,
                err_data: std::ptr::null_mut(),
                err_data_size: 0,
            })
        };
        Ok(size_of::<FiEqErrEntry>() as isize)
    })
}

/// The text of `prov_errno` for fi_eq_strerror and fi_cq_strerror: copied into `buf` (cut to
/// `len` with its NUL) when the caller gives one, else the library's static text.
///
/// # Safety
/// `buf` null or writable for `len` bytes.
unsafe fn strerror_into(
    text: Option<String>,
    prov_errno: c_int,
    buf: *mut c_void,
    len: usize,
) -> *const c_char {
    let fallback = strerror(prov_errno);
    let (Some(t), false, true) = (text, buf.is_null(), len > 0) else {
        return fallback;
    };
    let n = t.len().min(len - 1);
    // SAFETY: writable for len > n bytes (caller).
    unsafe {
        std::ptr::copy_nonoverlapping(t.as_ptr(), buf.cast::<u8>(), n);
        *buf.cast::<u8>().add(n) = 0;
    }
    buf.cast_const().cast()
}

pub(crate) unsafe extern "C" fn eq_strerror(
    eq: *mut c_void,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_void,
    len: usize,
) -> *const c_char {
    guard(strerror(prov_errno), || {
        // SAFETY: a fid from the caller, checked; a foreign one still gets the static text.
        let text = unsafe { get::<EventQueue>(eq) }
            .ok()
            .map(|_| xfabric::error::strerror(prov_errno));
        // SAFETY: buf as the caller says.
        unsafe { strerror_into(text, prov_errno, buf, len) }
    })
}

pub(crate) unsafe extern "C" fn cq_strerror(
    cq: *mut c_void,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_void,
    len: usize,
) -> *const c_char {
    guard(strerror(prov_errno), || {
        // SAFETY: a fid from the caller, checked; a foreign one still gets the static text.
        let text = unsafe { get::<CompletionQueue>(cq) }
            .ok()
            .map(|q| q.strerror(prov_errno));
        // SAFETY: buf as the caller says.
        unsafe { strerror_into(text, prov_errno, buf, len) }
    })
}

pub(crate) unsafe extern "C" fn wait_wait(waitset: *mut c_void, timeout: c_int) -> c_int {
    int(call(|| {
        // A handle of its own for as long as it waits, as eq_sread.
        // SAFETY: a fid from the caller, checked.
        let w = unsafe { obj::<WaitSet>(waitset) }?.clone();
        w.wait(timeout).map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn poll_poll(
    pollset: *mut c_void,
    context: *mut *mut c_void,
    count: c_int,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let p = unsafe { obj::<PollSet>(pollset) }?;
        if count < 0 || (count > 0 && context.is_null()) {
            return Err(-(FI_EINVAL as isize));
        }
        // No more room than members: the count is the caller's word.
        let mut got = vec![0usize; (count as usize).min(p.len())];
        let n = p.poll(&mut got);
        for (i, c) in got[..n].iter().enumerate() {
            // SAFETY: `context` holds `count > i` writable pointers (caller).
            unsafe { *context.add(i) = *c as *mut c_void };
        }
        Ok(n as isize)
    }))
}

/// The CQ or counter behind `fid`, and the context its fid carries (fi_poll hands it back).
///
/// # Safety
/// `fid` null or a readable fid.
unsafe fn poll_member<'a>(fid: *mut c_void) -> Result<(&'a dyn Pollable, usize), isize> {
    // SAFETY (each): a fid from the caller, its class checked before use.
    let m: &dyn Pollable = if let Ok(cq) = unsafe { obj::<CompletionQueue>(fid) } {
        cq
    } else if let Ok(c) = unsafe { obj::<Counter>(fid) } {
        c
    } else {
        return Err(-(FI_EINVAL as isize));
    };
    // SAFETY: one of ours (checked above), a readable struct fid.
    let ctx = unsafe { (*fid.cast::<Fid>()).context } as usize;
    Ok((m, ctx))
}

pub(crate) unsafe extern "C" fn poll_add(
    pollset: *mut c_void,
    fid: *mut c_void,
    _flags: u64,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let p = unsafe { obj::<PollSet>(pollset) }?;
        // SAFETY: as above.
        let (m, ctx) = unsafe { poll_member(fid) }?;
        p.add(m, ctx).map(|()| 0).map_err(neg)
    }))
}

pub(crate) unsafe extern "C" fn poll_del(
    pollset: *mut c_void,
    fid: *mut c_void,
    _flags: u64,
) -> c_int {
    int(call(|| {
        // SAFETY: a fid from the caller, checked.
        let p = unsafe { obj::<PollSet>(pollset) }?;
        // SAFETY: as above.
        let (m, _) = unsafe { poll_member(fid) }?;
        p.del(m).map(|()| 0).map_err(neg)
    }))
}
