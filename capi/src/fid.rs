//! fids: each C object is libfabric's head (`struct fid_X`: the `struct fid`, then the ops
//! table pointers the headers' inline calls follow) with the Rust object after it. A fid handed
//! in is accepted only when its fclass and its `fi_ops` are the ones this library gives that
//! class (anything else is `-FI_EINVAL`); `fi_close` hands the Rust object its close and frees
//! the C side.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;

use xfabric::Error;

use crate::ops::FiOps;
use crate::FI_EINVAL;

// `enum fi_class` values of the objects translated here.
/// `FI_CLASS_FABRIC`: a fabric.
pub const FI_CLASS_FABRIC: usize = 1;
/// `FI_CLASS_DOMAIN`: a domain.
pub const FI_CLASS_DOMAIN: usize = 2;
/// `FI_CLASS_EP`: an endpoint.
pub const FI_CLASS_EP: usize = 3;
/// `FI_CLASS_AV`: an address vector.
pub const FI_CLASS_AV: usize = 11;
/// `FI_CLASS_MR`: a memory region.
pub const FI_CLASS_MR: usize = 12;
/// `FI_CLASS_EQ`: an event queue.
pub const FI_CLASS_EQ: usize = 13;
/// `FI_CLASS_CQ`: a completion queue.
pub const FI_CLASS_CQ: usize = 14;
/// `FI_CLASS_CNTR`: a counter.
pub const FI_CLASS_CNTR: usize = 15;
/// `FI_CLASS_WAIT`: a wait set.
pub const FI_CLASS_WAIT: usize = 16;

/// `struct fid`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *const FiOps,
}

/// A C object: the head C reads (starting with the `struct fid`), then the Rust object, which
/// only `close` takes out.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct Obj<T: Class> {
    pub head: T::Head,
    pub inner: ManuallyDrop<T>,
}

/// A Rust object that C holds through a fid.
pub trait Class: Sized + 'static {
    /// `enum fi_class`.
    const FCLASS: usize;
    /// `struct fid_X`; `#[repr(C)]`, its first field a [`Fid`].
    type Head;
    /// This class's `fi_ops` (one static per class: its address identifies the class).
    fn fi_ops() -> &'static FiOps;
    /// fi_close; an object still in use comes back with the reason.
    fn close(self) -> Result<(), (Self, Error)> {
        Ok(())
    }
}

/// The negative code C gets for `e`.
pub fn code(e: &Error) -> c_int {
    tracing::debug!("C call failed: {e}");
    -e.errno()
}

/// A `struct fid` for class `T` with `context`.
pub fn fid_of<T: Class>(context: *mut c_void) -> Fid {
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
pub unsafe fn get<'a, T: Class>(fid: *const c_void) -> Result<&'a T, c_int> {
    if fid.is_null() {
        return Err(-FI_EINVAL);
    }
    // SAFETY: a readable struct fid (caller).
    let f = unsafe { &*fid.cast::<Fid>() };
    if f.fclass != T::FCLASS || !std::ptr::eq(f.ops, T::fi_ops()) {
        return Err(-FI_EINVAL);
    }
    // SAFETY: fclass and ops say this library made it as an Obj<T> (publish), still open.
    Ok(unsafe { &(*fid.cast::<Obj<T>>()).inner })
}

/// The head of our object behind `fid` (as [`get`]).
///
/// # Safety
/// As [`get`].
pub unsafe fn head<'a, T: Class>(fid: *const c_void) -> Result<&'a T::Head, c_int> {
    // SAFETY: forwarded contract; get checked that it is an Obj<T>.
    unsafe { get::<T>(fid) }?;
    // SAFETY: as above.
    Ok(unsafe { &(*fid.cast::<Obj<T>>()).head })
}

/// Hands `inner` to C behind `head` through `*out`; 0.
///
/// # Safety
/// `out` must be writable (checked non-null by the callers).
pub unsafe fn publish<T: Class>(head: T::Head, inner: T, out: *mut *mut c_void) -> c_int {
    let obj = Box::into_raw(Box::new(Obj {
        head,
        inner: ManuallyDrop::new(inner),
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
pub unsafe extern "C" fn close<T: Class>(fid: *mut c_void) -> c_int {
    crate::guard(-crate::FI_EOTHER, || {
        // SAFETY: forwarded contract.
        if let Err(e) = unsafe { get::<T>(fid) } {
            return e;
        }
        let obj = fid.cast::<Obj<T>>();
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
