//! `struct fi_info` and its attribute structures as fabric.h lays them out, allocated with libc
//! so that what an application `strdup`s or `malloc`s into them is freed by `fi_freeinfo` the
//! way libfabric frees it (free() on every pointer member).

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiTxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiRxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiEpAttr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiDomainAttr {
    pub domain: *mut c_void,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiFabricAttr {
    pub fabric: *mut c_void,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiInfo {
    pub next: *mut FiInfo,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut c_void,
    pub tx_attr: *mut FiTxAttr,
    pub rx_attr: *mut FiRxAttr,
    pub ep_attr: *mut FiEpAttr,
    pub domain_attr: *mut FiDomainAttr,
    pub fabric_attr: *mut FiFabricAttr,
    pub nic: *mut c_void,
}

/// A zeroed `T` from calloc (all these structures are valid all-zero), or null.
fn calloc_one<T>() -> *mut T {
    // SAFETY: calloc with a non-zero size; the result is checked by the callers.
    unsafe { libc::calloc(1, size_of::<T>()) }.cast()
}

/// A libc copy of `len` bytes at `src`; null for a null or empty source. `Err` when out of
/// memory.
///
/// # Safety
/// `src`, if not null, must be readable for `len` bytes.
unsafe fn dup_bytes(src: *const c_void, len: usize) -> Result<*mut c_void, ()> {
    if src.is_null() || len == 0 {
        return Ok(null_mut());
    }
    // SAFETY: malloc of a non-zero size.
    let dst = unsafe { libc::malloc(len) };
    if dst.is_null() {
        return Err(());
    }
    // SAFETY: src readable for len (caller), dst freshly allocated for len; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), len) };
    Ok(dst)
}

/// # Safety
/// `s` must be null or a NUL-terminated string.
unsafe fn dup_str(s: *const c_char) -> Result<*mut c_char, ()> {
    if s.is_null() {
        return Ok(null_mut());
    }
    // SAFETY: s is a C string (caller).
    let d = unsafe { libc::strdup(s) };
    if d.is_null() {
        Err(())
    } else {
        Ok(d)
    }
}

/// `fi_allocinfo`: one entry with every attribute structure allocated and zeroed.
pub fn alloc_info() -> *mut FiInfo {
    let info = calloc_one::<FiInfo>();
    if info.is_null() {
        return info;
    }
    // SAFETY: info is a fresh, zeroed, exclusively owned allocation.
    let i = unsafe { &mut *info };
    i.tx_attr = calloc_one();
    i.rx_attr = calloc_one();
    i.ep_attr = calloc_one();
    i.domain_attr = calloc_one();
    i.fabric_attr = calloc_one();
    if i.tx_attr.is_null()
        || i.rx_attr.is_null()
        || i.ep_attr.is_null()
        || i.domain_attr.is_null()
        || i.fabric_attr.is_null()
    {
        // SAFETY: a single entry of ours, members null or calloc'd.
        unsafe { free_one(info) };
        return null_mut();
    }
    info
}

/// Frees one entry (not its `next`) and everything it points to, as libfabric does.
///
/// # Safety
/// `info` must be a valid entry whose pointer members are null or libc allocations.
unsafe fn free_one(info: *mut FiInfo) {
    // SAFETY: per the contract, every pointer freed here is null or from malloc/calloc/strdup.
    unsafe {
        let i = &mut *info;
        libc::free(i.src_addr);
        libc::free(i.dest_addr);
        libc::free(i.tx_attr.cast());
        libc::free(i.rx_attr.cast());
        if let Some(ep) = i.ep_attr.as_mut() {
            libc::free(ep.auth_key.cast());
        }
        libc::free(i.ep_attr.cast());
        if let Some(d) = i.domain_attr.as_mut() {
            libc::free(d.name.cast());
            libc::free(d.auth_key.cast());
        }
        libc::free(i.domain_attr.cast());
        if let Some(f) = i.fabric_attr.as_mut() {
            libc::free(f.name.cast());
            libc::free(f.prov_name.cast());
        }
        libc::free(i.fabric_attr.cast());
        libc::free(info.cast());
    }
}

/// `fi_freeinfo`: frees the whole list.
///
/// # Safety
/// `info` must be null or a list whose pointer members are null or libc allocations.
pub unsafe fn free_info(mut info: *mut FiInfo) {
    while !info.is_null() {
        // SAFETY: info is a valid entry (caller); next is read before the entry is freed.
        let next = unsafe { (*info).next };
        // SAFETY: as above.
        unsafe { free_one(info) };
        info = next;
    }
}

/// `fi_dupinfo`: a deep copy of one entry (`next` is not followed); `fi_allocinfo` for null.
///
/// # Safety
/// `src` must be null or a valid entry whose strings are NUL-terminated and whose address and
/// key pointers are readable for their stated lengths.
pub unsafe fn dup_info(src: *const FiInfo) -> *mut FiInfo {
    let dst = alloc_info();
    if src.is_null() || dst.is_null() {
        return dst;
    }
    // SAFETY: src valid (caller); dst fresh and exclusively ours.
    let ok = unsafe { copy_into(&*src, &mut *dst) };
    if ok.is_err() {
        // SAFETY: dst's members are null or our own allocations.
        unsafe { free_one(dst) };
        return null_mut();
    }
    dst
}

/// # Safety
/// As [`dup_info`]; `d` comes from [`alloc_info`].
unsafe fn copy_into(s: &FiInfo, d: &mut FiInfo) -> Result<(), ()> {
    d.caps = s.caps;
    d.mode = s.mode;
    d.addr_format = s.addr_format;
    d.handle = s.handle;
    // SAFETY (whole block): pointers readable per the caller's contract; d's attribute
    // structures were allocated by alloc_info and are written whole before their owned
    // pointers are replaced by copies, so a failure leaves only null or owned pointers.
    unsafe {
        d.src_addr = dup_bytes(s.src_addr, s.src_addrlen)?;
        d.src_addrlen = if d.src_addr.is_null() {
            0
        } else {
            s.src_addrlen
        };
        d.dest_addr = dup_bytes(s.dest_addr, s.dest_addrlen)?;
        d.dest_addrlen = if d.dest_addr.is_null() {
            0
        } else {
            s.dest_addrlen
        };
        if let Some(t) = s.tx_attr.as_ref() {
            *d.tx_attr = *t;
        }
        if let Some(r) = s.rx_attr.as_ref() {
            *d.rx_attr = *r;
        }
        if let Some(e) = s.ep_attr.as_ref() {
            *d.ep_attr = FiEpAttr {
                auth_key: null_mut(),
                auth_key_size: 0,
                ..*e
            };
            (*d.ep_attr).auth_key = dup_bytes(e.auth_key.cast(), e.auth_key_size)?.cast();
            (*d.ep_attr).auth_key_size = e.auth_key_size;
        }
        if let Some(a) = s.domain_attr.as_ref() {
            *d.domain_attr = FiDomainAttr {
                name: null_mut(),
                auth_key: null_mut(),
                auth_key_size: 0,
                ..*a
            };
            (*d.domain_attr).name = dup_str(a.name)?;
            (*d.domain_attr).auth_key = dup_bytes(a.auth_key.cast(), a.auth_key_size)?.cast();
            (*d.domain_attr).auth_key_size = a.auth_key_size;
        }
        if let Some(f) = s.fabric_attr.as_ref() {
            *d.fabric_attr = FiFabricAttr {
                name: null_mut(),
                prov_name: null_mut(),
                ..*f
            };
            (*d.fabric_attr).name = dup_str(f.name)?;
            (*d.fabric_attr).prov_name = dup_str(f.prov_name)?;
        }
    }
    Ok(())
}
