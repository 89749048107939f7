//! The helpers every C entry point is written with, as rustls-ffi keeps its own in one module:
//! the panic boundary ([`guard`], [`call`], [`run`]), errors as libfabric's negative codes
//! ([`neg`], [`code`], [`inval`]) and their text ([`strerror`]), the checks of the pointers C
//! hands in ([`bytes`], [`segments`], [`out_ok`]), fids (a Rust object handed to C behind its
//! head with [`publish`], found again with [`get`], closed with [`close`]) and the trigger an
//! operation posted with `FI_TRIGGER` carries ([`armed`]).
//!
//! Which ops tables a class's head points to is [`Class`]'s to say; the tables module
//! implements it, so that nothing here (or in a translation) names a table.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use xfabric::FI_TRIGGER;
use xfabric::{Counter, Endpoint, Error, RawIov, RmaIov, TriggerContext, TriggerVar, Xpu};

use crate::consts::{FI_EBUSY, FI_EINVAL, FI_EOTHER};
use crate::header::{FiRmaIov, FiTriggeredContext, Fid};
use crate::ops::FiOps;

// ---- the panic boundary and the answer C gets ----

/// Runs one export's body; a panic becomes `on_panic` instead of unwinding into C (undefined
/// behaviour).
#[inline(always)]
pub(crate) fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// A call's body under [`guard`], its error as the negative code (no log: -FI_EAGAIN is the
/// common answer of a polling loop). For the calls whose C return type is `ssize_t`.
#[inline(always)]
pub(crate) fn call(body: impl FnOnce() -> Result<isize, isize>) -> isize {
    guard(-(FI_EOTHER as isize), || body().unwrap_or_else(|e| e))
}

/// As [`call`], for the calls whose C return type is `int`: a panic is `-FI_EOTHER`, an error
/// its negative code.
pub(crate) fn run(body: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    guard(-FI_EOTHER, || body().unwrap_or_else(|e| e))
}

/// [`call`]'s answer as an `int` return (every code fits; anything else is `-FI_EOTHER`).
pub(crate) fn int(r: isize) -> c_int {
    c_int::try_from(r).unwrap_or(-FI_EOTHER)
}

/// The negative code C gets for `e`, as [`call`]'s error.
#[inline]
pub(crate) fn neg(e: Error) -> isize {
    // The polling loop's answer first: `Again` owns nothing, so this arm drops nothing (the
    // general arm calls the enum's out-of-line drop, a call per empty fi_cq_read otherwise).
    match e {
        Error::Again(_) => -(libc::EAGAIN as isize),
        e => -(e.errno() as isize),
    }
}

/// The negative code C gets for `e`, the failure written to the debug log.
pub(crate) fn code(e: &Error) -> c_int {
    tracing::debug!("C call failed: {e}");
    -e.errno()
}

/// `-FI_EINVAL`, saying in the log what was wrong.
pub(crate) fn inval(what: &str) -> c_int {
    tracing::debug!("C call: {what}");
    -FI_EINVAL
}

/// Messages for libfabric's own codes (FI_ERRNO_OFFSET = 256 onwards), in fi_errno.h's order.
const FI_MESSAGES: [&CStr; 14] = [
    c"Unspecified error",
    c"Provided buffer is too small",
    c"Operation not permitted in current state",
    c"Error available",
    c"Flags not supported",
    c"Missing or unavailable event queue",
    c"Invalid resource domain",
    c"Missing or unavailable completion queue",
    c"CRC error",
    c"Truncation error",
    c"Required key not available",
    c"Missing or unavailable address vector",
    c"Queue has been overrun",
    c"Receiver not ready, no receive buffers available",
];

/// The static text of a code, either sign (`fi_strerror(-ret)` and `fi_strerror(ret)` both
/// occur): the system's for an errno value, fi_errno.h's for libfabric's own.
pub(crate) fn strerror(errnum: c_int) -> *const c_char {
    guard(c"Unspecified error".as_ptr(), || {
        let code = errnum.checked_abs().unwrap_or(FI_EOTHER);
        if code < FI_EOTHER {
            // SAFETY: strerror accepts any int and returns a valid C string (possibly
            // "Unknown error N"); its buffer is static or thread-local in glibc.
            return unsafe { libc::strerror(code) }.cast_const();
        }
        let idx = usize::try_from(code - FI_EOTHER).unwrap_or(0);
        FI_MESSAGES
            .get(idx)
            .copied()
            .unwrap_or(c"Unspecified error")
            .as_ptr()
    })
}

// ---- pointers C hands in ----

/// A result pointer the call writes through: `-FI_EINVAL` when null.
pub(crate) fn out_ok<T>(out: *mut T) -> Result<(), c_int> {
    if out.is_null() {
        Err(inval("null result pointer"))
    } else {
        Ok(())
    }
}

/// The value of a C enum member, `-FI_EINVAL` for one the enum does not have.
pub(crate) fn enum_of<T>(raw: c_int, from: fn(i32) -> Option<T>, what: &str) -> Result<T, c_int> {
    from(raw).ok_or_else(|| inval(&format!("{what} {raw} is not a value of its enum")))
}

/// `len` bytes at `buf` (empty for a zero length, whatever the pointer).
///
/// # Safety
/// `buf` readable for `len` bytes when `len > 0`.
pub(crate) unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], isize> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(-(FI_EINVAL as isize));
    }
    span_ok(len)?;
    // SAFETY: readable for len (caller), checked non-null, at most isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast(), len) })
}

/// A buffer length no object can have (past `isize::MAX` bytes, half the address space):
/// `-FI_EMSGSIZE`, before a slice is made of it.
pub(crate) fn span_ok(len: usize) -> Result<(), isize> {
    if isize::try_from(len).is_err() {
        tracing::debug!("C call: a buffer of {len} bytes is longer than any object can be");
        return Err(-(libc::EMSGSIZE as isize));
    }
    Ok(())
}

/// Writes `src` to C memory at `dst` byte by byte, so that an array the caller did not align
/// for `T` is written too.
///
/// # Safety
/// `dst` writable for `size_of_val(src)` bytes, not overlapping `src`.
pub(crate) unsafe fn copy_out<T: Copy>(src: &[T], dst: *mut c_void) {
    // SAFETY: the caller's contract; u8 has no alignment.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr().cast::<u8>(),
            dst.cast::<u8>(),
            std::mem::size_of_val(src),
        )
    };
}

/// # Safety
/// `buf` writable for `len` bytes when `len > 0`, and not otherwise referenced meanwhile.
pub(crate) unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], isize> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(-(FI_EINVAL as isize));
    }
    span_ok(len)?;
    // SAFETY: writable for len (caller), checked non-null, at most isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) })
}

/// More segments than any provider takes: refused before anything is read.
const IOV_MAX: usize = 1 << 10;

/// The segments of a C message (the core checks them against the endpoint's iov_limit).
///
/// # Safety
/// `iov` readable for `count` iovecs.
pub(crate) unsafe fn segments(iov: *const libc::iovec, count: usize) -> Result<Vec<RawIov>, isize> {
    if count > IOV_MAX || (count > 0 && iov.is_null()) {
        return Err(-(FI_EINVAL as isize));
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    // Read one by one, unaligned: a C caller's array need not be aligned (a slice over it
    // would have to be).
    Ok((0..count)
        .map(|i| {
            // SAFETY: entry i of an array readable for count (caller), checked non-null.
            let s = unsafe { iov.add(i).read_unaligned() };
            RawIov {
                addr: s.iov_base as usize,
                len: s.iov_len,
            }
        })
        .collect())
}

/// The target segments of a C RMA message, bounded as the local ones ([`segments`]): nothing
/// is read past the bound.
///
/// # Safety
/// `rma_iov` readable for `count` entries.
pub(crate) unsafe fn rma_segments(
    rma_iov: *const FiRmaIov,
    count: usize,
) -> Result<Vec<RmaIov>, isize> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if rma_iov.is_null() || count > IOV_MAX {
        return Err(-(FI_EINVAL as isize));
    }
    // Read one by one, unaligned, as `segments`.
    Ok((0..count)
        .map(|i| {
            // SAFETY: entry i of an array readable for count (caller), checked non-null.
            let r = unsafe { rma_iov.add(i).read_unaligned() };
            RmaIov {
                addr: r.addr,
                len: r.len,
                key: r.key,
            }
        })
        .collect())
}

// ---- fids ----

/// A C object: the head C reads (starting with the `struct fid`), then the Rust object, which
/// only `close` takes out.
#[repr(C)]
pub(crate) struct Obj<T: Class> {
    pub(crate) head: T::Head,
    pub(crate) inner: ManuallyDrop<T>,
    /// Objects opened from this one (a domain's endpoints, queues, counters, AVs, regions
    /// and poll sets; a fabric's domains, EQs and wait sets) still open: closing it answers
    /// `-FI_EBUSY` meanwhile, as libfabric's objects count their references.
    children: Arc<AtomicUsize>,
    /// The API version of the fabric it was opened under (`fi_fabric`'s): the layouts of the
    /// structures its calls read and write depend on it (`fi_cq_readerr`'s entry).
    api_version: u32,
    /// This object's count on the one it was opened from, given back when it is closed.
    _parent: Option<Held>,
}

/// One open object's count on the object it was opened from (`Obj::children`), and that
/// object's API version, which the new one inherits.
pub(crate) struct Held(Arc<AtomicUsize>, u32);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A count on `parent`, a `P` of ours (checked), for an object about to be opened from it.
///
/// # Safety
/// As [`get`].
pub(crate) unsafe fn held_by<P: Class>(parent: *const c_void) -> Result<Held, c_int> {
    // SAFETY: forwarded contract.
    unsafe { get::<P>(parent) }?;
    // SAFETY: get checked that it is an open Obj<P>.
    let o = unsafe { &*parent.cast::<Obj<P>>() };
    o.children.fetch_add(1, Ordering::AcqRel);
    Ok(Held(o.children.clone(), o.api_version))
}

/// The API version of the fabric our `T` behind `fid` was opened under.
///
/// # Safety
/// As [`get`].
pub(crate) unsafe fn api_version<T: Class>(fid: *const c_void) -> Result<u32, c_int> {
    // SAFETY: forwarded contract.
    unsafe { get::<T>(fid) }?;
    // SAFETY: get checked that it is an open Obj<T>.
    Ok(unsafe { (*fid.cast::<Obj<T>>()).api_version })
}

/// A Rust object that C holds through a fid. Each class's implementation is in the tables
/// module, next to the tables its head points to.
pub(crate) trait Class: Sized + 'static {
    /// `enum fi_class`.
    const FCLASS: usize;
    /// `struct fid_X`; `#[repr(C)]`, its first field a [`Fid`].
    type Head;
    /// This class's `fi_ops` (one static per class: its address identifies the class).
    fn fi_ops() -> &'static FiOps;
    /// The head of a new object of this class with `context`: its fid and its ops tables
    /// (what else the head holds is the open's to fill in).
    fn new_head(context: *mut c_void) -> Self::Head;
    /// Why fi_close would refuse now, if it would: asked through a shared reference first,
    /// so that a refused close never takes the object out of its fid (other threads may be
    /// reading it).
    fn busy(&self) -> Option<Error> {
        None
    }
    /// fi_close; an object still in use comes back with the reason.
    fn close(self) -> Result<(), (Self, Error)> {
        Ok(())
    }
}

/// A `struct fid` for class `T` with `context`.
pub(crate) fn fid_of<T: Class>(context: *mut c_void) -> Fid {
    Fid {
        fclass: T::FCLASS,
        context,
        ops: T::fi_ops(),
    }
}

/// The object behind `fid` if it is a `T` of this library's; `-FI_EINVAL` for null or any
/// other class.
///
/// # Safety
/// `fid` must be null or point at a readable `struct fid`; if it is one of ours it must not
/// be closed while the reference is used.
#[inline(always)]
pub(crate) unsafe fn get<'a, T: Class>(fid: *const c_void) -> Result<&'a T, c_int> {
    // Null, or not where a struct fid can be (every one of ours is aligned): refused before
    // it is read.
    if fid.is_null() || !fid.cast::<Fid>().is_aligned() {
        return Err(-FI_EINVAL);
    }
    // SAFETY: a readable struct fid (caller), aligned.
    let f = unsafe { &*fid.cast::<Fid>() };
    if f.fclass != T::FCLASS || !std::ptr::eq(f.ops, T::fi_ops()) {
        return Err(-FI_EINVAL);
    }
    // SAFETY: fclass and ops say this library made it as an Obj<T> (publish), still open.
    Ok(unsafe { &(*fid.cast::<Obj<T>>()).inner })
}

/// As [`get`], the error as [`call`]'s.
///
/// # Safety
/// `fid` null or a readable fid.
#[inline(always)]
pub(crate) unsafe fn obj<'a, T: Class>(fid: *const c_void) -> Result<&'a T, isize> {
    // SAFETY: forwarded contract.
    unsafe { get::<T>(fid) }.map_err(|e| e as isize)
}

/// The head of our object behind `fid` (as [`get`]).
///
/// # Safety
/// As [`get`].
pub(crate) unsafe fn head<'a, T: Class>(fid: *const c_void) -> Result<&'a T::Head, c_int> {
    // SAFETY: forwarded contract; get checked that it is an Obj<T>.
    unsafe { get::<T>(fid) }?;
    // SAFETY: as above.
    Ok(unsafe { &(*fid.cast::<Obj<T>>()).head })
}

/// Hands `inner` to C behind `head` through `*out`, under its parent's API version (1.17's
/// where it has none); 0.
///
/// # Safety
/// `out` must be writable (checked non-null by the callers).
pub(crate) unsafe fn publish<T: Class>(
    head: T::Head,
    inner: T,
    parent: Option<Held>,
    out: *mut *mut c_void,
) -> c_int {
    let version = parent.as_ref().map_or(crate::FI_VERSION_1_17, |h| h.1);
    // SAFETY: forwarded contract.
    unsafe { publish_at(version, head, inner, parent, out) }
}

/// [`publish`] under API version `api_version` (a fabric's, or an alias's endpoint's).
///
/// # Safety
/// As [`publish`].
pub(crate) unsafe fn publish_at<T: Class>(
    api_version: u32,
    head: T::Head,
    inner: T,
    parent: Option<Held>,
    out: *mut *mut c_void,
) -> c_int {
    let obj = Box::into_raw(Box::new(Obj {
        head,
        inner: ManuallyDrop::new(inner),
        children: Arc::default(),
        api_version,
        _parent: parent,
    }));
    // SAFETY: out writable (caller).
    unsafe { *out = obj.cast() };
    0
}

/// `fi_close` for class `T`: the Rust object's close, then the C side freed; an object still in
/// use stays open and its reason is the answer.
///
/// # Safety
/// `fid` null or readable; no other call on it may be running (as libfabric requires).
pub(crate) unsafe extern "C" fn close<T: Class>(fid: *mut c_void) -> c_int {
    guard(-FI_EOTHER, || {
        // SAFETY: forwarded contract.
        if let Err(e) = unsafe { get::<T>(fid) } {
            return e;
        }
        let obj = fid.cast::<Obj<T>>();
        // SAFETY: checked to be our Obj<T>.
        let open = unsafe { (*obj).children.load(Ordering::Acquire) };
        if open > 0 {
            tracing::debug!("fi_close: {open} object(s) opened from this one are still open");
            return -FI_EBUSY;
        }
        // SAFETY: checked to be our Obj<T>, read through a shared reference.
        if let Some(e) = unsafe { (*obj).inner.busy() } {
            return code(&e);
        }
        // SAFETY: checked to be our Obj<T>; the inner object is taken once, and put back if it
        // refuses to close.
        let inner = unsafe { ManuallyDrop::take(&mut (*obj).inner) };
        match inner.close() {
            Ok(()) => {
                // SAFETY: from Box::into_raw in publish; inner was taken (ManuallyDrop keeps
                // it from being dropped twice).
                drop(unsafe { Box::from_raw(obj) });
                0
            }
            Err((inner, e)) => {
                // SAFETY: as above; the object stays ours.
                unsafe { (*obj).inner = ManuallyDrop::new(inner) };
                code(&e)
            }
        }
    })
}

/// An endpoint as C holds it: with its address format, which decides how its name is written
/// (an `FI_ADDR_STR` name is a C string, NUL included).
pub(crate) struct CEndpoint {
    /// The endpoint.
    pub(crate) ep: Endpoint,
    /// `fi_info.addr_format` it was opened with.
    pub(crate) addr_format: u32,
}

/// The endpoint behind `fid`, if it is one of ours.
///
/// # Safety
/// `fid` null or a readable fid.
pub(crate) unsafe fn ep_of<'a>(fid: *const c_void) -> Result<&'a Endpoint, isize> {
    // SAFETY: forwarded contract.
    unsafe { obj::<CEndpoint>(fid) }.map(|c| &c.ep)
}

// ---- triggers ----

/// `enum fi_trigger_event`.
const FI_TRIGGER_THRESHOLD: c_int = 0;
const FI_TRIGGER_XPU: c_int = 1;

/// What an operation posted with `FI_TRIGGER` waits for.
pub(crate) enum Armed<'a> {
    Threshold(TriggerContext),
    /// The XPU, the caller's variables to fill, and its count to set to how many were.
    Xpu(Xpu, &'a mut [TriggerVar], &'a mut i32),
}

/// The trigger of an operation posted with `flags`: `None` without `FI_TRIGGER`; otherwise
/// read from the operation's context, which must be a `struct fi_triggered_context`.
///
/// # Safety
/// With `FI_TRIGGER`, `context` must be null or point to a readable `struct
/// fi_triggered_context` whose `var` array (for an XPU trigger) is writable for `count`
/// variables and not otherwise referenced during the call.
pub(crate) unsafe fn armed<'a>(context: usize, flags: u64) -> xfabric::Result<Option<Armed<'a>>> {
    if flags & FI_TRIGGER == 0 {
        return Ok(None);
    }
    let ctx = context as *mut FiTriggeredContext;
    if ctx.is_null() {
        return Err(Error::Inval(
            "FI_TRIGGER: the context must be a struct fi_triggered_context, not null".into(),
        ));
    }
    if !ctx.is_aligned() {
        return Err(Error::Inval(
            "FI_TRIGGER: the context is not aligned for a struct fi_triggered_context".into(),
        ));
    }
    // SAFETY: readable (caller), aligned.
    let c = unsafe { &mut *ctx };
    match c.event_type {
        FI_TRIGGER_THRESHOLD => {
            // SAFETY: the member event_type names.
            let t = unsafe { c.trigger.threshold };
            // SAFETY: null or a fid (caller); get checks it is one of our counters.
            let cntr = unsafe { get::<Counter>(t.cntr) }.map_err(|_| {
                Error::Inval("FI_TRIGGER_THRESHOLD: cntr is not a counter of this library".into())
            })?;
            Ok(Some(Armed::Threshold(TriggerContext::threshold(
                cntr,
                t.threshold as u64,
            ))))
        }
        FI_TRIGGER_XPU => {
            // SAFETY: the member event_type names; it lives in the caller's context.
            let x = unsafe { &mut c.trigger.xpu };
            let xpu = x.xpu().ok_or_else(|| {
                Error::Inval(format!(
                    "FI_TRIGGER_XPU: iface {} is not an enum fi_hmem_iface value",
                    x.iface
                ))
            })?;
            if x.count < 0 || (x.count > 0 && (x.var.is_null() || !x.var.is_aligned())) {
                return Err(Error::Inval(format!(
                    "FI_TRIGGER_XPU: count {} with var {:p} (null or not aligned)",
                    x.count, x.var
                )));
            }
            // The count is written back with the number filled (fi_trigger(3)'s output).
            // SAFETY: var writable for count (caller), checked above; the array is not the
            // structure whose count is borrowed beside it.
            let vars = unsafe { xfabric::TriggerXpu::vars_at(x.var, x.count) };
            Ok(Some(Armed::Xpu(xpu, vars, &mut x.count)))
        }
        other => Err(Error::Inval(format!(
            "FI_TRIGGER: event_type {other} is not FI_TRIGGER_THRESHOLD or FI_TRIGGER_XPU"
        ))),
    }
}

/// An operation XPU triggers do not start.
pub(crate) fn no_xpu(what: &str) -> Error {
    Error::OpNotSupp(format!(
        "{what} with FI_TRIGGER_XPU: XPU triggers start sends, tagged sends, RMA writes and \
         atomics"
    ))
}
