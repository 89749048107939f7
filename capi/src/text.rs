//! `fi_tostr` and the parameter calls (`fi_getparams`, `fi_param_get`): libfabric's text forms
//! and settings, answered from the facade's printers (`xfabric::tostr`) and core's settings
//! table, so the C library and the `xfabric` command say the same things.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Mutex;

use xfabric::settings::{Kind, Setting, SETTINGS};
use xfabric::{
    addr_format_str, caps_str, mode_str, mr_mode_str, order_str, protocol_str, AtomicOp, AvType,
    Datatype, EpType, Progress, Threading, WorkOpType,
};

use crate::consts::{FI_EINVAL, FI_ENODATA, FI_ENOMEM, FI_VERSION_1_17};
use crate::getinfo::hints_from_c;
use crate::info::FiInfo;

// `enum fi_type`'s values that have a text form here.
const FI_TYPE_INFO: c_int = 0;
const FI_TYPE_EP_TYPE: c_int = 1;
const FI_TYPE_CAPS: c_int = 2;
const FI_TYPE_OP_FLAGS: c_int = 3;
const FI_TYPE_ADDR_FORMAT: c_int = 4;
const FI_TYPE_THREADING: c_int = 10;
const FI_TYPE_PROGRESS: c_int = 11;
const FI_TYPE_PROTOCOL: c_int = 12;
const FI_TYPE_MSG_ORDER: c_int = 13;
const FI_TYPE_MODE: c_int = 14;
const FI_TYPE_AV_TYPE: c_int = 15;
const FI_TYPE_ATOMIC_TYPE: c_int = 16;
const FI_TYPE_ATOMIC_OP: c_int = 17;
const FI_TYPE_VERSION: c_int = 18;
const FI_TYPE_MR_MODE: c_int = 21;
const FI_TYPE_OP_TYPE: c_int = 22;

/// The text of `*data` as `datatype`; `None` for a type without a text form here or a value
/// that is not one of its enum's.
///
/// # Safety
/// `data` must point at a valid value of the C type `datatype` names.
unsafe fn text_of(data: *const c_void, datatype: c_int) -> Option<String> {
    // SAFETY (every read): data points at the type datatype names (caller).
    let int = || unsafe { *data.cast::<c_int>() };
    let u64v = || unsafe { *data.cast::<u64>() };
    let u32v = || unsafe { *data.cast::<u32>() };
    Some(match datatype {
        FI_TYPE_INFO => {
            // SAFETY: a struct fi_info (caller).
            let info = unsafe { &*data.cast::<FiInfo>() };
            // The answer prints what the entry holds, whatever version wrote it.
            // SAFETY: as above.
            let info = unsafe { hints_from_c(info, FI_VERSION_1_17) }.ok()?;
            let mut out = String::new();
            xfabric::tostr::write_verbose(&mut out, &info);
            out
        }
        FI_TYPE_EP_TYPE => EpType::from_raw(int())?.c_name().into(),
        FI_TYPE_CAPS | FI_TYPE_OP_FLAGS => caps_str(u64v()),
        FI_TYPE_ADDR_FORMAT => addr_format_str(u32v()).into(),
        FI_TYPE_THREADING => Threading::from_raw(int())?.c_name().into(),
        FI_TYPE_PROGRESS => Progress::from_raw(int())?.c_name().into(),
        FI_TYPE_PROTOCOL => protocol_str(u32v()).into(),
        FI_TYPE_MSG_ORDER => order_str(u64v()),
        FI_TYPE_MODE => mode_str(u64v()),
        FI_TYPE_AV_TYPE => AvType::from_raw(int())?.c_name().into(),
        FI_TYPE_VERSION => xfabric::tostr::version_str(u32v()),
        FI_TYPE_MR_MODE => mr_mode_str(u32v()),
        FI_TYPE_ATOMIC_TYPE => Datatype::from_raw(int())?.c_name().into(),
        FI_TYPE_ATOMIC_OP => AtomicOp::from_raw(int())?.c_name().into(),
        FI_TYPE_OP_TYPE => WorkOpType::from_raw(int())?.c_name().into(),
        _ => return None,
    })
}

thread_local! {
    /// fi_tostr's answer stays valid until the thread's next call, as libfabric's does.
    static TOSTR: RefCell<CString> = RefCell::new(CString::default());
}

/// `fi_tostr`: an empty string for what has no text form (libfabric prints nothing either),
/// never null.
///
/// # Safety
/// `data`, if not null, must point at a valid value of the type `datatype` names.
pub unsafe fn tostr(data: *const c_void, datatype: c_int) -> *mut c_char {
    let text = if data.is_null() {
        String::new()
    } else {
        // SAFETY: forwarded contract.
        unsafe { text_of(data, datatype) }.unwrap_or_default()
    };
    let c = CString::new(text.replace('\0', "")).unwrap_or_default();
    TOSTR.with(|t| {
        *t.borrow_mut() = c;
        t.borrow().as_ptr().cast_mut()
    })
}

/// `fi_tostr_r`: the text, truncated to `len - 1` bytes, in `buf`.
///
/// # Safety
/// `buf` writable for `len` bytes; `data` as [`tostr`].
pub unsafe fn tostr_r(
    buf: *mut c_char,
    len: usize,
    data: *const c_void,
    datatype: c_int,
) -> *mut c_char {
    if buf.is_null() || len == 0 {
        return buf;
    }
    let text = if data.is_null() {
        String::new()
    } else {
        // SAFETY: forwarded contract.
        unsafe { text_of(data, datatype) }.unwrap_or_default()
    };
    let n = text.len().min(len - 1);
    // SAFETY: buf writable for len > n bytes (caller); text readable for n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    buf
}

/// `struct fi_param`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiParam {
    pub name: *const c_char,
    pub type_: c_int,
    pub help_string: *const c_char,
    pub value: *const c_char,
}

// `enum fi_param_type`.
const FI_PARAM_STRING: c_int = 0;
const FI_PARAM_BOOL: c_int = 2;
const FI_PARAM_SIZE_T: c_int = 3;

fn param_type(kind: Kind) -> c_int {
    match kind {
        Kind::Size => FI_PARAM_SIZE_T,
        Kind::Bool => FI_PARAM_BOOL,
        Kind::Str => FI_PARAM_STRING,
    }
}

fn strdup(s: &str) -> *const c_char {
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // SAFETY: c is a valid C string; a null result is an allocation failure the caller checks.
    unsafe { libc::strdup(c.as_ptr()) }
}

/// The environment's text for `s`, if set (what fi_info -e shows as the value).
fn env_value(s: &Setting) -> Option<String> {
    std::env::var_os(s.name).map(|v| v.to_string_lossy().into_owned())
}

/// `fi_getparams`: every setting xfabric reads, in a calloc'd array ended by a null name.
///
/// # Safety
/// `params` and `count` must be writable (checked non-null).
pub unsafe fn getparams(params: *mut *mut FiParam, count: *mut c_int) -> c_int {
    if params.is_null() || count.is_null() {
        return -FI_EINVAL;
    }
    let n = SETTINGS.len();
    // SAFETY: calloc of n + 1 entries; all-zero is a valid FiParam (null pointers).
    let list: *mut FiParam = unsafe { libc::calloc(n + 1, size_of::<FiParam>()) }.cast();
    if list.is_null() {
        return -FI_ENOMEM;
    }
    for (i, s) in SETTINGS.iter().enumerate() {
        let help = format!("{} (default: {})", s.meaning, s.default);
        let value = env_value(s);
        // SAFETY: i < n, inside the allocation.
        let p = unsafe { &mut *list.add(i) };
        p.name = strdup(s.name);
        p.type_ = param_type(s.kind);
        p.help_string = strdup(&help);
        p.value = value.as_deref().map_or(std::ptr::null(), strdup);
        if p.name.is_null() || p.help_string.is_null() || (value.is_some() && p.value.is_null()) {
            // SAFETY: the list is ours, ended by the zeroed entries after i.
            unsafe { freeparams(list) };
            return -FI_ENOMEM;
        }
    }
    // SAFETY: both writable (caller), checked non-null.
    unsafe {
        *params = list;
        *count = c_int::try_from(n).unwrap_or(c_int::MAX);
    }
    0
}

/// `fi_freeparams`: frees what [`getparams`] allocated.
///
/// # Safety
/// `params` must be null or a list from [`getparams`].
pub unsafe fn freeparams(params: *mut FiParam) {
    if params.is_null() {
        return;
    }
    let mut p = params;
    // SAFETY: the list ends with an entry whose name is null; each pointer is ours or null.
    unsafe {
        while !(*p).name.is_null() {
            libc::free((*p).name.cast_mut().cast());
            libc::free((*p).help_string.cast_mut().cast());
            libc::free((*p).value.cast_mut().cast());
            p = p.add(1);
        }
        libc::free(params.cast());
    }
}

/// `fi_param_get` with a null provider: the setting named `name` (as the environment spells
/// it, or without its `FI_` prefix as libfabric's core parameters are asked for), when the
/// environment sets it. Strings are handed out for the life of the process, as libfabric
/// hands out the environment's own.
///
/// # Safety
/// `value` must be writable as the setting's type: `char **`, `int *` or `size_t *`.
pub unsafe fn param_get(name: &str, value: *mut c_void) -> c_int {
    let upper = name.to_ascii_uppercase();
    let Some(s) = SETTINGS
        .iter()
        .find(|s| s.name == upper || s.name.strip_prefix("FI_") == Some(upper.as_str()))
    else {
        return -FI_EINVAL;
    };
    if env_value(s).is_none() {
        return -FI_ENODATA;
    }
    match s.kind {
        // SAFETY (each arm): value is writable as the setting's type (caller).
        Kind::Size => unsafe { *value.cast::<usize>() = s.usize() },
        Kind::Bool => unsafe { *value.cast::<c_int>() = c_int::from(s.flag()) },
        Kind::Str => {
            // One copy per setting (its value is read once too): repeated calls allocate
            // nothing more. A CString's buffer does not move when the Vec grows.
            static STRS: Mutex<Vec<(&str, CString)>> = Mutex::new(Vec::new());
            let mut strs = STRS.lock().unwrap_or_else(|e| e.into_inner());
            let ptr = match strs.iter().find(|(n, _)| *n == s.name) {
                Some((_, c)) => c.as_ptr(),
                None => {
                    let c = CString::new(s.text_or_default().replace('\0', "")).unwrap_or_default();
                    let ptr = c.as_ptr();
                    strs.push((s.name, c));
                    ptr
                }
            };
            // SAFETY: as above.
            unsafe { *value.cast::<*const c_char>() = ptr };
        }
    }
    0
}
