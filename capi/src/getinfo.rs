//! `fi_getinfo`: C hints translated onto `xfabric::getinfo`, its answers back into a libc list.
//! Matching and narrowing stay in core (`Info::fit`); this file only moves fields.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;

use xfabric::tostr::ProviderFilter;
use xfabric::{
    AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, ResourceMgmt, RxAttr,
    Threading, TxAttr, FI_MR_ALLOCATED, FI_MR_BASIC, FI_MR_PROV_KEY, FI_MR_SCALABLE,
    FI_MR_VIRT_ADDR,
};

use crate::consts::{FI_EINVAL, FI_ENODATA, FI_ENOMEM, FI_VERSION_1_5};
use crate::info::{alloc_info, free_info, FiInfo};

/// A bad hint: which field, and why.
type Bad = String;

/// # Safety
/// `s` must be null or a NUL-terminated string.
unsafe fn opt_str(s: *const c_char, what: &str) -> Result<Option<String>, Bad> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: a C string (caller).
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// Longest address or key a hint may carry. Every address format is far shorter (a
/// `sockaddr_storage` is 128 bytes); a length past it is a caller's mistake, refused before
/// it is copied (copying a length of 2^45 aborted the process in the allocator).
const HINT_BYTES_MAX: usize = 4096;

/// # Safety
/// `p`, if not null, must be readable for `len` bytes.
unsafe fn opt_bytes(p: *const c_void, len: usize, what: &str) -> Result<Option<Vec<u8>>, Bad> {
    if p.is_null() || len == 0 {
        return Ok(None);
    }
    if len > HINT_BYTES_MAX {
        return Err(format!(
            "{what} of {len} bytes: longer than any address or key ({HINT_BYTES_MAX} at most)"
        ));
    }
    // SAFETY: readable for len bytes (caller), len bounded above.
    Ok(Some(
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec(),
    ))
}

fn enum_of<T>(raw: c_int, from: fn(i32) -> Option<T>, what: &str) -> Result<T, Bad> {
    from(raw).ok_or_else(|| format!("{what} {raw} is not a value of its enum"))
}

/// The Rust hints for C hints.
///
/// # Safety
/// `h` must be a valid `struct fi_info` (attribute pointers null or valid, strings
/// NUL-terminated, addresses and keys readable for their stated lengths).
pub unsafe fn hints_from_c(h: &FiInfo, version: u32) -> Result<Info, Bad> {
    let mut out = Info {
        caps: h.caps,
        mode: h.mode,
        addr_format: h.addr_format,
        // SAFETY (both): lengths as the caller states them.
        src_addr: unsafe { opt_bytes(h.src_addr, h.src_addrlen, "src_addr") }?,
        dest_addr: unsafe { opt_bytes(h.dest_addr, h.dest_addrlen, "dest_addr") }?,
        ..Default::default()
    };
    // SAFETY: attribute pointers null or valid (caller).
    if let Some(t) = unsafe { h.tx_attr.as_ref() } {
        out.tx_attr = TxAttr {
            caps: t.caps,
            mode: t.mode,
            op_flags: t.op_flags,
            msg_order: t.msg_order,
            comp_order: t.comp_order,
            inject_size: t.inject_size,
            size: t.size,
            iov_limit: t.iov_limit,
            rma_iov_limit: t.rma_iov_limit,
            tclass: t.tclass,
        };
    }
    // SAFETY: as above.
    if let Some(r) = unsafe { h.rx_attr.as_ref() } {
        out.rx_attr = RxAttr {
            caps: r.caps,
            mode: r.mode,
            op_flags: r.op_flags,
            msg_order: r.msg_order,
            comp_order: r.comp_order,
            total_buffered_recv: r.total_buffered_recv,
            size: r.size,
            iov_limit: r.iov_limit,
        };
    }
    // SAFETY: as above.
    if let Some(e) = unsafe { h.ep_attr.as_ref() } {
        out.ep_attr = EpAttr {
            ep_type: enum_of(e.type_, EpType::from_raw, "ep_attr.type")?,
            protocol: e.protocol,
            protocol_version: e.protocol_version,
            max_msg_size: e.max_msg_size,
            msg_prefix_size: e.msg_prefix_size,
            max_order_raw_size: e.max_order_raw_size,
            max_order_war_size: e.max_order_war_size,
            max_order_waw_size: e.max_order_waw_size,
            mem_tag_format: e.mem_tag_format,
            tx_ctx_cnt: e.tx_ctx_cnt,
            rx_ctx_cnt: e.rx_ctx_cnt,
            // Ignored before 1.5 (fi_endpoint(3)). SAFETY: key readable for its stated length
            // (caller).
            auth_key: if version < FI_VERSION_1_5 {
                None
            } else {
                unsafe { opt_bytes(e.auth_key.cast(), e.auth_key_size, "ep_attr auth_key") }?
            },
        };
    }
    // SAFETY: as above.
    if let Some(d) = unsafe { h.domain_attr.as_ref() } {
        // A bit mask held in an int: callers set every bit they accept, the sign bit
        // included (fi_info passes ~(FI_MR_BASIC | FI_MR_SCALABLE)).
        let mr_mode = d.mr_mode as u32;
        // Before 1.5 an unspecified mr_mode meant "either of the old modes", which core reads
        // as FI_MR_SCALABLE's "no requirement allowed"; FI_MR_BASIC core maps itself.
        let mr_mode = if version < FI_VERSION_1_5 && mr_mode == 0 {
            FI_MR_SCALABLE
        } else {
            mr_mode
        };
        // Keys are ignored before 1.5 (fi_domain(3)).
        let (key_ptr, key_size) = if version < FI_VERSION_1_5 {
            (std::ptr::null(), 0)
        } else {
            (d.auth_key.cast_const(), d.auth_key_size)
        };
        out.domain_attr = DomainAttr {
            // SAFETY: a C string or null (caller).
            name: unsafe { opt_str(d.name, "domain_attr.name") }?,
            threading: enum_of(d.threading, Threading::from_raw, "domain_attr.threading")?,
            control_progress: enum_of(
                d.control_progress,
                Progress::from_raw,
                "domain_attr.control_progress",
            )?,
            data_progress: enum_of(
                d.data_progress,
                Progress::from_raw,
                "domain_attr.data_progress",
            )?,
            resource_mgmt: enum_of(
                d.resource_mgmt,
                ResourceMgmt::from_raw,
                "domain_attr.resource_mgmt",
            )?,
            av_type: enum_of(d.av_type, AvType::from_raw, "domain_attr.av_type")?,
            mr_mode,
            mr_key_size: d.mr_key_size,
            cq_data_size: d.cq_data_size,
            cq_cnt: d.cq_cnt,
            ep_cnt: d.ep_cnt,
            tx_ctx_cnt: d.tx_ctx_cnt,
            rx_ctx_cnt: d.rx_ctx_cnt,
            max_ep_tx_ctx: d.max_ep_tx_ctx,
            max_ep_rx_ctx: d.max_ep_rx_ctx,
            max_ep_stx_ctx: d.max_ep_stx_ctx,
            max_ep_srx_ctx: d.max_ep_srx_ctx,
            cntr_cnt: d.cntr_cnt,
            mr_iov_limit: d.mr_iov_limit,
            caps: d.caps,
            mode: d.mode,
            // SAFETY: key readable for its stated length (caller), or none.
            auth_key: unsafe { opt_bytes(key_ptr.cast(), key_size, "domain_attr auth_key") }?,
            auth_key_size: key_size,
            max_err_data: d.max_err_data,
            mr_cnt: d.mr_cnt,
            tclass: d.tclass,
        };
    }
    // SAFETY: as above.
    if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
        out.fabric_attr = FabricAttr {
            // SAFETY (both): C strings or null (caller).
            name: unsafe { opt_str(f.name, "fabric_attr.name") }?,
            prov_name: unsafe { opt_str(f.prov_name, "fabric_attr.prov_name") }?,
            prov_version: f.prov_version,
            api_version: f.api_version,
        };
    }
    Ok(out)
}

/// A libc copy of `s` with its NUL, or null for `None`; `Err` when out of memory or when `s`
/// holds a NUL (which C could not read back).
fn c_string(s: &Option<String>) -> Result<*mut c_char, ()> {
    let Some(s) = s else {
        return Ok(null_mut());
    };
    let c = std::ffi::CString::new(s.as_str()).map_err(|_| ())?;
    // SAFETY: c is a valid C string.
    let d = unsafe { libc::strdup(c.as_ptr()) };
    if d.is_null() {
        Err(())
    } else {
        Ok(d)
    }
}

fn c_bytes(b: &Option<Vec<u8>>) -> Result<(*mut c_void, usize), ()> {
    let Some(b) = b.as_deref().filter(|b| !b.is_empty()) else {
        return Ok((null_mut(), 0));
    };
    // SAFETY: malloc of a non-zero size.
    let p = unsafe { libc::malloc(b.len()) };
    if p.is_null() {
        return Err(());
    }
    // SAFETY: p fresh for b.len() bytes, b readable for as many; no overlap.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p.cast::<u8>(), b.len()) };
    Ok((p, b.len()))
}

/// Fills a fresh entry from [`alloc_info`]; on `Err` its pointers are null or owned, so
/// `free_info` releases it.
fn fill(d: &mut FiInfo, i: &Info, version: u32) -> Result<(), ()> {
    d.caps = i.caps;
    d.mode = i.mode;
    d.addr_format = i.addr_format;
    (d.src_addr, d.src_addrlen) = c_bytes(&i.src_addr)?;
    (d.dest_addr, d.dest_addrlen) = c_bytes(&i.dest_addr)?;
    let (t, r, e, dom, f) = (
        &i.tx_attr,
        &i.rx_attr,
        &i.ep_attr,
        &i.domain_attr,
        &i.fabric_attr,
    );
    // SAFETY (whole block): alloc_info allocated every attribute structure, zeroed; each owned
    // pointer is stored as soon as it exists.
    unsafe {
        let tx = &mut *d.tx_attr;
        tx.caps = t.caps;
        tx.mode = t.mode;
        tx.op_flags = t.op_flags;
        tx.msg_order = t.msg_order;
        tx.comp_order = t.comp_order;
        tx.inject_size = t.inject_size;
        tx.size = t.size;
        tx.iov_limit = t.iov_limit;
        tx.rma_iov_limit = t.rma_iov_limit;
        tx.tclass = t.tclass;
        let rx = &mut *d.rx_attr;
        rx.caps = r.caps;
        rx.mode = r.mode;
        rx.op_flags = r.op_flags;
        rx.msg_order = r.msg_order;
        rx.comp_order = r.comp_order;
        rx.total_buffered_recv = r.total_buffered_recv;
        rx.size = r.size;
        rx.iov_limit = r.iov_limit;
        let ep = &mut *d.ep_attr;
        ep.type_ = e.ep_type as c_int;
        ep.protocol = e.protocol;
        ep.protocol_version = e.protocol_version;
        ep.max_msg_size = e.max_msg_size;
        ep.msg_prefix_size = e.msg_prefix_size;
        ep.max_order_raw_size = e.max_order_raw_size;
        ep.max_order_war_size = e.max_order_war_size;
        ep.max_order_waw_size = e.max_order_waw_size;
        ep.mem_tag_format = e.mem_tag_format;
        ep.tx_ctx_cnt = e.tx_ctx_cnt;
        ep.rx_ctx_cnt = e.rx_ctx_cnt;
        let (k, n) = c_bytes(&e.auth_key)?;
        ep.auth_key = k.cast();
        ep.auth_key_size = n;
        let da = &mut *d.domain_attr;
        da.name = c_string(&dom.name)?;
        da.threading = dom.threading as c_int;
        da.control_progress = dom.control_progress as c_int;
        da.data_progress = dom.data_progress as c_int;
        da.resource_mgmt = dom.resource_mgmt as c_int;
        da.av_type = dom.av_type as c_int;
        da.mr_mode = c_int::try_from(old_mr_mode(dom.mr_mode, version)).map_err(|_| ())?;
        da.mr_key_size = dom.mr_key_size;
        da.cq_data_size = dom.cq_data_size;
        da.cq_cnt = dom.cq_cnt;
        da.ep_cnt = dom.ep_cnt;
        da.tx_ctx_cnt = dom.tx_ctx_cnt;
        da.rx_ctx_cnt = dom.rx_ctx_cnt;
        da.max_ep_tx_ctx = dom.max_ep_tx_ctx;
        da.max_ep_rx_ctx = dom.max_ep_rx_ctx;
        da.max_ep_stx_ctx = dom.max_ep_stx_ctx;
        da.max_ep_srx_ctx = dom.max_ep_srx_ctx;
        da.cntr_cnt = dom.cntr_cnt;
        da.mr_iov_limit = dom.mr_iov_limit;
        da.caps = dom.caps;
        da.mode = dom.mode;
        let (k, n) = c_bytes(&dom.auth_key)?;
        da.auth_key = k.cast();
        // Without a key, the size says whether the provider takes one. Before 1.5 there are
        // no keys (fi_domain(3)): nothing is said.
        da.auth_key_size = if version < FI_VERSION_1_5 {
            0
        } else if k.is_null() {
            dom.auth_key_size
        } else {
            n
        };
        da.max_err_data = dom.max_err_data;
        da.mr_cnt = dom.mr_cnt;
        da.tclass = dom.tclass;
        let fa = &mut *d.fabric_attr;
        fa.name = c_string(&f.name)?;
        fa.prov_name = c_string(&f.prov_name)?;
        fa.prov_version = f.prov_version;
        fa.api_version = f.api_version;
    }
    Ok(())
}

/// Callers before 1.5 read mr_mode as the old enum: FI_MR_BASIC where the provider needs any
/// of the requirements it stands for, FI_MR_SCALABLE otherwise.
fn old_mr_mode(mr_mode: u32, version: u32) -> u32 {
    if version >= FI_VERSION_1_5 || mr_mode == FI_MR_BASIC || mr_mode == FI_MR_SCALABLE {
        mr_mode
    } else if mr_mode & (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED) != 0 {
        FI_MR_BASIC
    } else {
        FI_MR_SCALABLE
    }
}

/// A libc list of `infos`, in order; null for an empty list. `Err` when out of memory (nothing
/// is left allocated).
fn list_to_c(infos: &[Info], version: u32) -> Result<*mut FiInfo, ()> {
    let mut head: *mut FiInfo = null_mut();
    let mut tail: *mut *mut FiInfo = &mut head;
    for i in infos {
        let d = alloc_info();
        if d.is_null() {
            // SAFETY: head is a list of our own entries.
            unsafe { free_info(head) };
            return Err(());
        }
        // SAFETY: tail points at head or at the last entry's `next`, both ours; d is fresh.
        unsafe {
            *tail = d;
            tail = &mut (*d).next;
        }
        // SAFETY: d is a fresh entry, exclusively ours.
        if fill(unsafe { &mut *d }, i, version).is_err() {
            // SAFETY: every entry's pointers are null or owned.
            unsafe { free_info(head) };
            return Err(());
        }
    }
    Ok(head)
}

/// `fi_getinfo`'s body: 0 and a list in `*info`, or a negative error code (after logging why).
///
/// # Safety
/// As `fi_getinfo`: strings NUL-terminated or null, `hints` null or valid, `info` writable.
pub unsafe fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const FiInfo,
    info: *mut *mut FiInfo,
) -> c_int {
    // Before anything can fail, so that why it failed reaches FI_LOG_LEVEL's log.
    xfabric::log::init();
    // A failure hands back no list, as libfabric's: a caller that frees what it holds after
    // a failed call (a list from an earlier call, or nothing) frees nothing twice.
    // SAFETY: info is writable (caller; checked non-null by the export).
    unsafe { *info = std::ptr::null_mut() };
    let fail = |code: c_int, why: &str| {
        tracing::info!("fi_getinfo: {why}");
        -code
    };
    // SAFETY: null or C strings (caller).
    let node = match unsafe { opt_str(node, "node") } {
        Ok(n) => n,
        Err(why) => return fail(FI_EINVAL, &why),
    };
    // SAFETY: as above.
    let service = match unsafe { opt_str(service, "service") } {
        Ok(s) => s,
        Err(why) => return fail(FI_EINVAL, &why),
    };
    // SAFETY: hints null or valid (caller).
    let hints = match unsafe { hints.as_ref() } {
        None => None,
        // SAFETY: as above.
        Some(h) => {
            // Before 1.5 mr_mode is an enumeration (FI_MR_UNSPEC, FI_MR_BASIC,
            // FI_MR_SCALABLE), not bits (fi_mr(3)): anything else matches no provider.
            // SAFETY: null or valid (caller).
            let mr = unsafe { h.domain_attr.as_ref() }.map_or(0, |d| d.mr_mode as u32);
            if version < FI_VERSION_1_5 && ![0, FI_MR_BASIC, FI_MR_SCALABLE].contains(&mr) {
                return fail(
                    FI_ENODATA,
                    &format!(
                        "domain_attr.mr_mode {mr:#x} is not a mode of API 1.{}",
                        version & 0xffff
                    ),
                );
            }
            // SAFETY: as above.
            match unsafe { hints_from_c(h, version) } {
                Ok(h) => Some(h),
                Err(why) => return fail(FI_EINVAL, &format!("hints: {why}")),
            }
        }
    };
    let found = xfabric::getinfo(
        version,
        node.as_deref(),
        service.as_deref(),
        flags,
        hints.as_ref(),
    );
    let mut found = match found {
        Ok(v) => v,
        Err(e) => return fail(e.errno(), &e.to_string()),
    };
    let allowed = ProviderFilter::from_env(xfabric::settings::FI_PROVIDER.text());
    found.retain(|i| allowed.admits(i.provider()));
    if found.is_empty() {
        return fail(
            FI_ENODATA,
            &format!("FI_PROVIDER={} leaves no provider", allowed.text),
        );
    }
    match list_to_c(&found, version) {
        Ok(list) => {
            // SAFETY: info is writable (caller; checked non-null by the export).
            unsafe { *info = list };
            0
        }
        Err(()) => fail(FI_ENOMEM, "out of memory building the answer"),
    }
}
