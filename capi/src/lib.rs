//! `libfabric.so.1`: the libfabric 1.17 C ABI over xfabric.
//!
//! The library's identity is Debian's (file name, soname, the exported symbols and their
//! version nodes, see `fabric.map`), and every export follows one discipline: no panic crosses
//! the C boundary (`ffi::guard` turns one into `-FI_EOTHER`), and null required pointers are
//! `-FI_EINVAL`. The device API's host calls (`xpu`: fi_ep_export_xpu and the others of
//! fi_xpu(3)) are xfabric's own symbols, in node `XFABRIC_1.0` of `fabric.map`. fi_getinfo, fi_tostr and the parameter calls are translated onto the facade
//! (`getinfo`, `text`); fabric, domain and the objects opened from them are fids whose ops
//! tables (`tables`, laid out as `ops`) answer `-FI_ENOSYS` except where a translation
//! (`objects`, `data`, `eq`, `rma`, `atomic`, `trigger`) takes the call. fi_open answers
//! `-FI_ENOSYS`.
//!
//! The modules import downwards only, each from those below it: `consts`, `info` and `ops`;
//! `header` (the C layouts); `ffi` (the helpers every entry point uses); `getinfo` and
//! `text`; the translations; `tables`, which names the translations' entry points; and this
//! file, which exports the calls C reaches by name. `scripts/import-cycles.py capi/src`
//! checks it.

#![warn(missing_docs)]

use std::ffi::{c_char, c_int, c_void, CStr};

pub mod atomic;
pub mod consts;
pub mod data;
pub mod eq;
mod ffi;
pub mod getinfo;
pub mod header;
pub mod info;
pub mod objects;
#[allow(missing_docs)] // generated from the headers: every member is the header's
pub mod ops;
pub mod rma;
mod tables;
pub mod text;
pub mod trigger;
pub mod xpu;

pub use consts::{FI_EINVAL, FI_ENODATA, FI_ENOMEM, FI_ENOSYS, FI_EOTHER, FI_VERSION_1_17};
use ffi::guard;
use info::FiInfo;
use text::FiParam;
use xfabric::xpu::FidXpu;

/// `fi_version`: the API version this library implements, 1.17.
pub extern "C" fn fi_version() -> u32 {
    FI_VERSION_1_17
}

/// Callers pass either sign (`fi_strerror(-ret)` and `fi_strerror(ret)` both occur). The text
/// is static: the system's for an errno value, fi_errno.h's for libfabric's own codes.
pub extern "C" fn fi_strerror(errnum: c_int) -> *const c_char {
    ffi::strerror(errnum)
}

/// Text for the types fi_info prints (`FI_TYPE_INFO` for `-v`); an empty string, never null,
/// for the others. Valid until the thread's next call.
///
/// # Safety
/// `data`, if not null, must point at a valid value of the type `datatype` names.
pub unsafe extern "C" fn fi_tostr(data: *const c_void, datatype: c_int) -> *mut c_char {
    static EMPTY: [u8; 1] = [0];
    // SAFETY: forwarded contract.
    guard(EMPTY.as_ptr().cast_mut().cast(), || unsafe {
        text::tostr(data, datatype)
    })
}

/// As [`fi_tostr`], into the caller's buffer (truncated to fit, always NUL-terminated).
///
/// # Safety
/// `buf`, if not null, must be writable for `len` bytes; `data` as [`fi_tostr`].
pub unsafe extern "C" fn fi_tostr_r(
    buf: *mut c_char,
    len: usize,
    data: *const c_void,
    datatype: c_int,
) -> *mut c_char {
    // SAFETY: forwarded contract.
    guard(buf, || unsafe { text::tostr_r(buf, len, data, datatype) })
}

/// `fi_log_enabled`: whether xfabric's log (the one `FI_LOG_LEVEL` or `RUST_LOG` turns on, see
/// `xfabric::log`) takes messages of `level` (`enum fi_log_level`: FI_LOG_WARN, FI_LOG_TRACE,
/// FI_LOG_INFO, FI_LOG_DEBUG); 0 for any other value.
pub extern "C" fn fi_log_enabled(_prov: *const c_void, level: c_int, _subsys: c_int) -> c_int {
    guard(0, || {
        xfabric::log::init();
        let on = match level {
            0 => tracing::enabled!(tracing::Level::WARN),
            1 => tracing::enabled!(tracing::Level::TRACE),
            2 => tracing::enabled!(tracing::Level::INFO),
            3 => tracing::enabled!(tracing::Level::DEBUG),
            _ => false,
        };
        c_int::from(on)
    })
}

/// `fi_log_ready`: providers loaded by libfabric call it; xfabric has none, so it does nothing.
pub extern "C" fn fi_log_ready(
    _prov: *const c_void,
    _level: c_int,
    _subsys: c_int,
    _showtime: *mut u64,
) -> c_int {
    0
}

/// Variadic in C; stable Rust cannot define a variadic function, and on the x86-64 System V
/// ABI a callee that reads only the fixed arguments is compatible with a variadic call.
pub extern "C" fn fi_log(
    _prov: *const c_void,
    _level: c_int,
    _subsys: c_int,
    _func: *const c_char,
    _line: c_int,
    _fmt: *const c_char,
) {
}

/// Variadic in C (see [`fi_log`]). Parameters are not kept yet: accepted, never found.
pub extern "C" fn fi_param_define(
    _prov: *const c_void,
    name: *const c_char,
    _ptype: c_int,
    _help_fmt: *const c_char,
) -> c_int {
    if name.is_null() {
        return -FI_EINVAL;
    }
    0
}

/// xfabric's own settings (a null `prov`); providers' parameters are not kept.
///
/// # Safety
/// `name` a C string; `value` writable as the parameter's type (`char **`, `int *`,
/// `size_t *`).
pub unsafe extern "C" fn fi_param_get(
    prov: *mut c_void,
    name: *const c_char,
    value: *mut c_void,
) -> c_int {
    if name.is_null() || value.is_null() {
        return -FI_EINVAL;
    }
    if !prov.is_null() {
        return -FI_ENODATA;
    }
    guard(-FI_EOTHER, || {
        // SAFETY: a C string (caller), checked non-null.
        let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
            return -FI_EINVAL;
        };
        // SAFETY: forwarded contract.
        unsafe { text::param_get(name, value) }
    })
}

/// Every setting xfabric reads (core's settings table), with the environment's value.
///
/// # Safety
/// `params` and `count`, if not null, must be writable.
pub unsafe extern "C" fn fi_getparams(params: *mut *mut FiParam, count: *mut c_int) -> c_int {
    // SAFETY: forwarded contract.
    guard(-FI_EOTHER, || unsafe { text::getparams(params, count) })
}

/// # Safety
/// `params` must be null or come from [`fi_getparams`].
pub unsafe extern "C" fn fi_freeparams(params: *mut FiParam) {
    // SAFETY: forwarded contract.
    guard((), || unsafe { text::freeparams(params) })
}

/// # Safety
/// `node` and `service` null or C strings; `hints` null or a valid `struct fi_info`; `info`
/// writable.
pub unsafe extern "C" fn fi_getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const FiInfo,
    info: *mut *mut FiInfo,
) -> c_int {
    if info.is_null() {
        return -FI_EINVAL;
    }
    // SAFETY: forwarded contract.
    guard(-FI_EOTHER, || unsafe {
        getinfo::getinfo(version, node, service, flags, hints, info)
    })
}
/// # Safety
/// `info` must be null or a list from [`fi_dupinfo`] / [`fi_getinfo`], whose pointer members the
/// application replaced, if at all, only with libc allocations.
pub unsafe extern "C" fn fi_freeinfo(info: *mut FiInfo) {
    // SAFETY: forwarded contract.
    guard((), || unsafe { info::free_info(info) })
}

/// A deep copy of one entry; `fi_dupinfo(NULL)` is `fi_allocinfo()`. Null when out of memory.
///
/// # Safety
/// `info` must be null or a valid entry (strings NUL-terminated, addresses and keys readable for
/// their stated lengths).
pub unsafe extern "C" fn fi_dupinfo(info: *const FiInfo) -> *mut FiInfo {
    // SAFETY: forwarded contract.
    guard(std::ptr::null_mut(), || unsafe { info::dup_info(info) })
}

/// # Safety
/// `attr` null or a valid `struct fi_fabric_attr`; `fabric` writable.
pub unsafe extern "C" fn fi_fabric(
    attr: *mut info::FiFabricAttr,
    fabric: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { objects::fabric_open(attr, fabric, context) }
}

/// `fi_open`: named objects (such as Open MPI's "mr_cache") are not offered: -FI_ENOSYS.
pub extern "C" fn fi_open(
    _version: u32,
    name: *const c_char,
    _attr: *mut c_void,
    _attr_len: usize,
    _flags: u64,
    fid: *mut *mut c_void,
    _context: *mut c_void,
) -> c_int {
    if name.is_null() || fid.is_null() {
        return -FI_EINVAL;
    }
    -FI_ENOSYS
}

/// Gives each export its C name as a plain global alias of the Rust function. rustc links a
/// cdylib with its own version script that binds every `#[no_mangle]` symbol to the base
/// version, which would override `fabric.map`; symbols that rustc does not export itself are
/// bound by `fabric.map` alone, to Debian's version nodes.
macro_rules! export_c {
    ($($name:ident),* $(,)?) => {
        $(
            core::arch::global_asm!(
                concat!(".globl ", stringify!($name)),
                concat!(".type ", stringify!($name), ", @function"),
                concat!(".set ", stringify!($name), ", {}"),
                sym $name,
            );
        )*
    };
}

export_c!(
    fi_version,
    fi_strerror,
    fi_tostr,
    fi_log_enabled,
    fi_log,
    fi_param_define,
    fi_param_get,
    fi_getparams,
    fi_freeparams,
    fi_fabric,
    fi_getinfo,
    fi_freeinfo,
    fi_dupinfo,
    fi_tostr_r,
    fi_open,
    fi_log_ready,
);

// ---- the device API's host calls (fi_xpu(3); `xpu`), xfabric's own symbols ----

/// `fi_ep_export_xpu` (fi_xpu(3)): fills the caller's `struct fid_xpu_ep` for the CPU XPU.
///
/// # Safety
/// `ep` null or a readable fid; `xpu_ep` null or writable for a `struct fid_xpu_ep`.
pub unsafe extern "C" fn fi_ep_export_xpu(
    ep: *mut c_void,
    flags: u64,
    xpu_ep: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::ep_export(ep, flags, xpu_ep) }
}

/// `fi_cq_export_xpu` (fi_xpu(3)): fills the caller's `struct fid_xpu_cq` for the CPU XPU.
///
/// # Safety
/// `cq` null or a readable fid; `xpu_cq` null or writable for a `struct fid_xpu_cq`.
pub unsafe extern "C" fn fi_cq_export_xpu(
    cq: *mut c_void,
    flags: u64,
    xpu_cq: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::cq_export(cq, flags, xpu_cq) }
}

/// `fi_cntr_export_xpu` (fi_xpu(3)): fills the caller's `struct fid_xpu_cntr` for the CPU XPU.
///
/// # Safety
/// `cntr` null or a readable fid; `xpu_cntr` null or writable for a `struct fid_xpu_cntr`.
pub unsafe extern "C" fn fi_cntr_export_xpu(
    cntr: *mut c_void,
    flags: u64,
    xpu_cntr: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::cntr_export(cntr, flags, xpu_cntr) }
}

/// `fi_av_get_xpu_addr` (fi_xpu(3)): the 8-byte raw address an XPU names `fi_addr` by.
///
/// # Safety
/// `av` null or a readable fid; `len` null or readable and writable; `buf` null or writable
/// for `*len` bytes.
pub unsafe extern "C" fn fi_av_get_xpu_addr(
    av: *mut c_void,
    fi_addr: u64,
    buf: *mut c_void,
    len: *mut usize,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::av_get_xpu_addr(av, fi_addr, buf, len) }
}

/// `fi_mr_get_xpu_desc` (fi_xpu(3)): the 8-byte raw descriptor an XPU names the region by.
///
/// # Safety
/// `mr` null or a readable fid; `len` null or readable and writable; `buf` null or writable
/// for `*len` bytes.
pub unsafe extern "C" fn fi_mr_get_xpu_desc(
    mr: *mut c_void,
    buf: *mut c_void,
    len: *mut usize,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::mr_get_xpu_desc(mr, buf, len) }
}

/// xfabric's `fi_ep_export_xpu` for the XPU and ring size `attr` names (null: as
/// [`fi_ep_export_xpu`]).
///
/// # Safety
/// As [`fi_ep_export_xpu`]; `attr` null or readable.
pub unsafe extern "C" fn xf_ep_export_xpu(
    ep: *mut c_void,
    attr: *const xpu::XfXpuAttr,
    flags: u64,
    xpu_ep: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::ep_export_attr(ep, attr, flags, xpu_ep) }
}

/// xfabric's `fi_cq_export_xpu` for the XPU and ring size `attr` names.
///
/// # Safety
/// As [`fi_cq_export_xpu`]; `attr` null or readable.
pub unsafe extern "C" fn xf_cq_export_xpu(
    cq: *mut c_void,
    attr: *const xpu::XfXpuAttr,
    flags: u64,
    xpu_cq: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::cq_export_attr(cq, attr, flags, xpu_cq) }
}

/// xfabric's `fi_cntr_export_xpu` for the XPU `attr` names.
///
/// # Safety
/// As [`fi_cntr_export_xpu`]; `attr` null or readable.
pub unsafe extern "C" fn xf_cntr_export_xpu(
    cntr: *mut c_void,
    attr: *const xpu::XfXpuAttr,
    flags: u64,
    xpu_cntr: *mut FidXpu,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { xpu::cntr_export_attr(cntr, attr, flags, xpu_cntr) }
}

/// `xf_xpu_notify`: a CPU thread announces the descriptors (or doorbell stores) it has just
/// published: it starts what it can itself, at once, and wakes a watcher asleep. The device
/// header's `fi_xpu_tx_flush` and counter calls make it on a CPU thread, as the Rust device
/// calls do; without it, what a C thread posted waited for the watcher's next look.
pub extern "C" fn xf_xpu_notify() {
    guard((), xfabric::notify_xpu_ring)
}

export_c!(
    xf_xpu_notify,
    fi_ep_export_xpu,
    fi_cq_export_xpu,
    fi_cntr_export_xpu,
    fi_av_get_xpu_addr,
    fi_mr_get_xpu_desc,
    xf_ep_export_xpu,
    xf_cq_export_xpu,
    xf_cntr_export_xpu,
);
