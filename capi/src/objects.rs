//! The control objects through C: fabric, domain, address vector, completion queue, counter,
//! event queue, wait set, memory region and endpoint opened and closed, each C attribute
//! structure translated onto the core's, and the wait objects of the ones that have one
//! (`fi_control(FI_GETWAIT)`, `fi_trywait`). A new object's head, with its ops tables, is its
//! class's (`ffi::Class::new_head`).

use std::ffi::{c_char, c_int, c_void};

use xfabric::{
    AddressVector, AvAttr, AvType, CntrAttr, CntrEvents, CompletionQueue, Counter, CqAttr,
    CqFormat, CqWaitCond, Domain, EqAttr, EventQueue, Fabric, FabricAttr, Iface, MemoryRegion,
    MrAttr, PollAttr, PollSet, WaitAttr, WaitObj, WaitSet,
};

use crate::consts::{FI_ENOSYS, FI_VERSION_1_10, FI_VERSION_1_17};
use crate::ffi::{
    api_version, code, enum_of, get, head, held_by, inval, out_ok, publish, publish_at, run,
};
use crate::ffi::{CEndpoint, Class, Obj};
use crate::getinfo::hints_from_c;
use crate::header::{
    FabricHead, FiAvAttr, FiCntrAttr, FiCqAttr, FiEqAttr, FiMrAttr, FiPollAttr, FiWaitAttr, MrHead,
};
use crate::info::{FiFabricAttr, FiInfo};

/// `fi_control` command: the object's wait object (an `int` fd for `FI_WAIT_FD`).
const FI_GETWAIT: c_int = 5;
/// `fi_control` command: the kind of the object's wait object (`enum fi_wait_obj`).
const FI_GETWAITOBJ: c_int = 16;

/// `FI_GETWAIT`'s answer, the descriptor (`fd`), or `FI_GETWAITOBJ`'s, the kind (`kind`),
/// written to `*arg`.
///
/// # Safety
/// `arg` null or writable as an `int` (fi_control's contract for both commands: an fd, an
/// `enum fi_wait_obj`).
unsafe fn getwait(
    command: c_int,
    arg: *mut c_void,
    fd: impl FnOnce() -> xfabric::Result<i32>,
    kind: impl FnOnce() -> WaitObj,
) -> Result<c_int, c_int> {
    let v = match command {
        FI_GETWAIT => fd().map_err(|e| code(&e))?,
        FI_GETWAITOBJ => kind() as c_int,
        _ => return Err(-FI_ENOSYS),
    };
    if arg.is_null() {
        return Err(inval("fi_control(FI_GETWAIT/FI_GETWAITOBJ): null argument"));
    }
    // SAFETY: checked non-null, writable (caller).
    unsafe { *arg.cast::<c_int>() = v };
    Ok(0)
}

pub(crate) unsafe extern "C" fn cq_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    run(|| {
        // SAFETY: a fid from the caller, checked; arg per the command (caller).
        unsafe {
            let q = get::<CompletionQueue>(fid)?;
            getwait(command, arg, || q.wait_fd(), || q.wait_obj())
        }
    })
}

pub(crate) unsafe extern "C" fn cntr_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe {
            let c = get::<Counter>(fid)?;
            getwait(command, arg, || c.wait_fd(), || c.wait_obj())
        }
    })
}

pub(crate) unsafe extern "C" fn eq_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe {
            let q = get::<EventQueue>(fid)?;
            getwait(command, arg, || q.wait_fd(), || q.wait_obj())
        }
    })
}

pub(crate) unsafe extern "C" fn wait_control(
    fid: *mut c_void,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe {
            let w = get::<WaitSet>(fid)?;
            getwait(command, arg, || w.wait_fd(), || w.wait_obj())
        }
    })
}

/// `fi_trywait`: 0 when the caller may block on every object's wait object, -FI_EAGAIN when
/// one of them has something to read first.
pub(crate) unsafe extern "C" fn fabric_trywait(
    fabric: *mut c_void,
    fids: *mut *mut c_void,
    count: c_int,
) -> c_int {
    run(|| {
        // SAFETY: a fid from the caller, checked.
        unsafe { get::<Fabric>(fabric) }?;
        if count < 0 || (count > 0 && fids.is_null()) {
            return Err(inval("fi_trywait: fids"));
        }
        for i in 0..count as usize {
            // SAFETY: fids holds count readable pointers (caller).
            let fid = unsafe { *fids.add(i) };
            // SAFETY (each get): a fid from the caller, its class checked before use.
            let r = unsafe {
                if let Ok(cq) = get::<CompletionQueue>(fid) {
                    cq.trywait()
                } else if let Ok(c) = get::<Counter>(fid) {
                    c.trywait()
                } else if let Ok(eq) = get::<EventQueue>(fid) {
                    eq.trywait()
                } else if let Ok(w) = get::<WaitSet>(fid) {
                    w.trywait()
                } else {
                    return Err(inval(
                        "fi_trywait: not a CQ, counter, EQ or wait set of this library",
                    ));
                }
            };
            r.map_err(|e| code(&e))?;
        }
        Ok(0)
    })
}

/// The wait set a C attribute names, if any.
///
/// # Safety
/// `w` null or a readable fid.
unsafe fn wait_set(wait_obj: WaitObj, w: *mut c_void) -> Result<Option<WaitSet>, c_int> {
    // "Ignored if wait_obj is not FI_WAIT_SET" (fi_cq(3), fi_cntr(3)): an attribute reused
    // from an earlier open may still hold a set closed since.
    if wait_obj != WaitObj::Set || w.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    Ok(Some(unsafe { get::<WaitSet>(w) }?.clone()))
}

/// `fi_fabric`.
///
/// # Safety
/// `attr` null or a valid `struct fi_fabric_attr`; `fabric` writable.
pub unsafe fn fabric_open(
    attr: *const FiFabricAttr,
    fabric: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(fabric)?;
        // SAFETY: null or valid (caller).
        let a = unsafe { attr.as_ref() }.ok_or_else(|| inval("fi_fabric: null attr"))?;
        let str_of = |p: *const c_char| {
            // SAFETY: the attribute's strings are null or NUL-terminated (caller).
            (!p.is_null()).then(|| {
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        // As libfabric: the provider is named (getinfo's answer does), and one this library
        // does not have is -FI_ENODEV.
        if a.prov_name.is_null() {
            return Err(inval("fi_fabric: no provider named (prov_name is NULL)"));
        }
        let attr = FabricAttr {
            name: str_of(a.name),
            prov_name: str_of(a.prov_name),
            prov_version: a.prov_version,
            api_version: a.api_version,
        };
        let f = xfabric::fabric(&attr).map_err(|e| match e {
            xfabric::Error::NoData(_) => -(xfabric::consts::errno::FI_ENODEV),
            e => code(&e),
        })?;
        let version = if a.api_version == 0 {
            FI_VERSION_1_17
        } else {
            a.api_version
        };
        let head = FabricHead {
            api_version: version,
            ..Fabric::new_head(context)
        };
        // SAFETY: fabric checked non-null, writable (caller).
        Ok(unsafe { publish_at(version, head, f, None, fabric) })
    })
}

pub(crate) unsafe extern "C" fn fabric_domain(
    fabric: *mut c_void,
    info: *mut c_void,
    domain: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(domain)?;
        // SAFETY: a fid from the caller, checked.
        let f = unsafe { get::<Fabric>(fabric) }?;
        // SAFETY: as above.
        let version = unsafe { head::<Fabric>(fabric) }?.api_version;
        // SAFETY: null or a valid fi_info (caller).
        let info = unsafe { info.cast::<FiInfo>().as_ref() }
            .ok_or_else(|| inval("fi_domain: null info"))?;
        // SAFETY: as above.
        let info = unsafe { hints_from_c(info, version) }.map_err(|w| inval(&w))?;
        let d = f.domain(&info).map_err(|e| code(&e))?;
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Fabric>(fabric) }?;
        // SAFETY: domain checked non-null.
        Ok(unsafe { publish(Domain::new_head(context), d, Some(held), domain) })
    })
}

pub(crate) unsafe extern "C" fn fabric_eq_open(
    fabric: *mut c_void,
    attr: *mut c_void,
    eq: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(eq)?;
        // SAFETY: a fid from the caller, checked.
        let f = unsafe { get::<Fabric>(fabric) }?;
        // SAFETY: null or a valid fi_eq_attr (caller).
        let a = unsafe { attr.cast::<FiEqAttr>().as_ref() }
            .ok_or_else(|| inval("fi_eq_open: null attr"))?;
        let wait_obj = enum_of(a.wait_obj, WaitObj::from_raw, "eq wait_obj")?;
        // The set field is looked at only with FI_WAIT_SET (fi_eq(3)), which an EQ here
        // does not take.
        if wait_obj == WaitObj::Set {
            return Err(-FI_ENOSYS);
        }
        let attr = EqAttr {
            size: a.size,
            flags: a.flags,
            wait_obj,
        };
        let q = f.eq_open(&attr).map_err(|e| code(&e))?;
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Fabric>(fabric) }?;
        // SAFETY: eq checked non-null.
        Ok(unsafe { publish(EventQueue::new_head(context), q, Some(held), eq) })
    })
}

pub(crate) unsafe extern "C" fn fabric_wait_open(
    fabric: *mut c_void,
    attr: *mut c_void,
    waitset: *mut *mut c_void,
) -> c_int {
    run(|| {
        out_ok(waitset)?;
        // SAFETY: a fid from the caller, checked.
        let f = unsafe { get::<Fabric>(fabric) }?;
        // SAFETY: null or a valid fi_wait_attr (caller).
        let a = unsafe { attr.cast::<FiWaitAttr>().as_ref() }
            .ok_or_else(|| inval("fi_wait_open: null attr"))?;
        let attr = WaitAttr {
            wait_obj: enum_of(a.wait_obj, WaitObj::from_raw, "wait_obj")?,
            flags: a.flags,
        };
        let w = f.wait_open(&attr).map_err(|e| code(&e))?;
        let head = WaitSet::new_head(std::ptr::null_mut());
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Fabric>(fabric) }?;
        // SAFETY: waitset checked non-null.
        Ok(unsafe { publish(head, w, Some(held), waitset) })
    })
}

pub(crate) unsafe extern "C" fn domain_poll_open(
    domain: *mut c_void,
    attr: *mut c_void,
    pollset: *mut *mut c_void,
) -> c_int {
    run(|| {
        out_ok(pollset)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(domain) }?;
        // SAFETY: null or a valid fi_poll_attr (caller).
        let a = unsafe { attr.cast::<FiPollAttr>().as_ref() }
            .ok_or_else(|| inval("fi_poll_open: null attr"))?;
        let p = d
            .poll_open(&PollAttr { flags: a.flags })
            .map_err(|e| code(&e))?;
        let head = PollSet::new_head(std::ptr::null_mut());
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Domain>(domain) }?;
        // SAFETY: pollset checked non-null.
        Ok(unsafe { publish(head, p, Some(held), pollset) })
    })
}

pub(crate) unsafe extern "C" fn domain_av_open(
    domain: *mut c_void,
    attr: *mut c_void,
    av: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(av)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(domain) }?;
        // SAFETY: null or a valid fi_av_attr (caller).
        let a = unsafe { attr.cast::<FiAvAttr>().as_ref() }
            .ok_or_else(|| inval("fi_av_open: null attr"))?;
        let name = if a.name.is_null() {
            None
        } else {
            // SAFETY: a C string (caller).
            Some(
                unsafe { std::ffi::CStr::from_ptr(a.name) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let attr = AvAttr {
            av_type: enum_of(a.type_, AvType::from_raw, "av type")?,
            rx_ctx_bits: a.rx_ctx_bits,
            count: a.count,
            ep_per_node: a.ep_per_node,
            name,
            flags: a.flags,
        };
        let v = d.av_open(&attr).map_err(|e| code(&e))?;
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Domain>(domain) }?;
        // SAFETY: av checked non-null.
        Ok(unsafe { publish(AddressVector::new_head(context), v, Some(held), av) })
    })
}

pub(crate) unsafe extern "C" fn domain_cq_open(
    domain: *mut c_void,
    attr: *mut c_void,
    cq: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(cq)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(domain) }?;
        // SAFETY: null or a valid fi_cq_attr (caller).
        let a = unsafe { attr.cast::<FiCqAttr>().as_ref() }
            .ok_or_else(|| inval("fi_cq_open: null attr"))?;
        let wait_obj = enum_of(a.wait_obj, WaitObj::from_raw, "cq wait_obj")?;
        let attr = CqAttr {
            size: a.size,
            flags: a.flags,
            format: enum_of(a.format, CqFormat::from_raw, "cq format")?,
            wait_obj,
            signaling_vector: a.signaling_vector,
            wait_cond: enum_of(a.wait_cond, CqWaitCond::from_raw, "cq wait_cond")?,
            // SAFETY: null or a fid (caller) where FI_WAIT_SET asks for one.
            wait_set: unsafe { wait_set(wait_obj, a.wait_set) }?,
        };
        let q = d.cq_open(&attr).map_err(|e| code(&e))?;
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Domain>(domain) }?;
        // SAFETY: cq checked non-null.
        Ok(unsafe { publish(CompletionQueue::new_head(context), q, Some(held), cq) })
    })
}

pub(crate) unsafe extern "C" fn domain_cntr_open(
    domain: *mut c_void,
    attr: *mut c_void,
    cntr: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(cntr)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(domain) }?;
        // SAFETY: null or a valid fi_cntr_attr (caller).
        let a = unsafe { attr.cast::<FiCntrAttr>().as_ref() }
            .ok_or_else(|| inval("fi_cntr_open: null attr"))?;
        let wait_obj = enum_of(a.wait_obj, WaitObj::from_raw, "cntr wait_obj")?;
        let attr = CntrAttr {
            events: enum_of(a.events, CntrEvents::from_raw, "cntr events")?,
            wait_obj,
            // SAFETY: null or a fid (caller) where FI_WAIT_SET asks for one.
            wait_set: unsafe { wait_set(wait_obj, a.wait_set) }?,
            flags: a.flags,
        };
        let c = d.cntr_open(&attr).map_err(|e| code(&e))?;
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Domain>(domain) }?;
        // SAFETY: cntr checked non-null.
        Ok(unsafe { publish(Counter::new_head(context), c, Some(held), cntr) })
    })
}

pub(crate) unsafe extern "C" fn domain_endpoint(
    domain: *mut c_void,
    info: *mut c_void,
    ep: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    run(|| {
        out_ok(ep)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(domain) }?;
        // SAFETY: null or a valid fi_info (caller).
        let info = unsafe { info.cast::<FiInfo>().as_ref() }
            .ok_or_else(|| inval("fi_endpoint: null info"))?;
        // SAFETY: as above.
        let info = unsafe { hints_from_c(info, FI_VERSION_1_17) }.map_err(|w| inval(&w))?;
        let e = CEndpoint {
            ep: d.endpoint(&info).map_err(|e| code(&e))?,
            addr_format: info.addr_format,
        };
        // SAFETY: checked above to be one of ours; counted until this object closes.
        let held = unsafe { held_by::<Domain>(domain) }?;
        // SAFETY: ep checked non-null.
        Ok(unsafe { publish(CEndpoint::new_head(context), e, Some(held), ep) })
    })
}

/// Registers `attr` on the domain behind `fid` and hands the region to C.
///
/// # Safety
/// `fid` a readable fid; `out` writable; the memory stays valid while registered (the
/// caller's promise under fi_mr(3)).
unsafe fn register(fid: *mut c_void, attr: &MrAttr, flags: u64, out: *mut *mut c_void) -> c_int {
    run(|| {
        out_ok(out)?;
        // SAFETY: a fid from the caller, checked.
        let d = unsafe { get::<Domain>(fid) }?;
        // SAFETY: the caller keeps the memory valid while registered (fi_mr(3)).
        let mr = unsafe { d.mr_regattr(attr, flags) }.map_err(|e| code(&e))?;
        let head = MrHead {
            key: mr.key(),
            ..MemoryRegion::new_head(attr.context as *mut c_void)
        };
        // SAFETY: out checked non-null.
        // SAFETY: checked above to be one of ours; counted until this region closes.
        let held = unsafe { held_by::<Domain>(fid) }?;
        // SAFETY: out checked non-null.
        unsafe { publish(head, mr, Some(held), out) };
        // SAFETY: publish stored our new Obj there; its descriptor is itself.
        unsafe {
            let obj = (*out).cast::<Obj<MemoryRegion>>();
            (*obj).head.mem_desc = obj.cast();
        }
        Ok(0)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn mr_reg(
    fid: *mut c_void,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    let attr = MrAttr {
        addr: buf as usize,
        len,
        access,
        offset,
        requested_key,
        context: context as usize,
        ..Default::default()
    };
    // SAFETY: forwarded contract.
    unsafe { register(fid, &attr, flags, mr) }
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn mr_regv(
    fid: *mut c_void,
    iov: *const c_void,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    if count != 1 || iov.is_null() {
        // The domain's mr_iov_limit is 1.
        return inval("fi_mr_regv: one iovec is supported");
    }
    // SAFETY: one readable iovec (caller).
    let v = unsafe { *iov.cast::<libc::iovec>() };
    // SAFETY: forwarded contract.
    unsafe {
        mr_reg(
            fid,
            v.iov_base,
            v.iov_len,
            access,
            offset,
            requested_key,
            flags,
            mr,
            context,
        )
    }
}

pub(crate) unsafe extern "C" fn mr_regattr(
    fid: *mut c_void,
    attr: *const c_void,
    flags: u64,
    mr: *mut *mut c_void,
) -> c_int {
    // Read member by member through the pointer, never as a whole: a caller of an API before
    // 1.10 hands in the shorter structure of its headers, without iface and device.
    let a = attr.cast::<FiMrAttr>();
    if a.is_null() {
        return inval("fi_mr_regattr: null attr");
    }
    // SAFETY: a readable fi_mr_attr of the caller's API version (caller); these members are
    // in every version's.
    let (mr_iov, iov_count) = unsafe { ((*a).mr_iov, (*a).iov_count) };
    if iov_count != 1 || mr_iov.is_null() {
        return inval("fi_mr_regattr: one iovec is supported");
    }
    // SAFETY: a fid from the caller, checked.
    let version = match unsafe { api_version::<Domain>(fid) } {
        Ok(v) => v,
        Err(e) => return e,
    };
    // SAFETY: as above.
    let (access, offset, requested_key, context) =
        unsafe { ((*a).access, (*a).offset, (*a).requested_key, (*a).context) };
    // iface and device exist from API 1.10 on: before it, host memory, nothing read.
    let (raw_iface, raw_device) = if version < FI_VERSION_1_10 {
        (0, 0)
    } else {
        // SAFETY: a 1.10-or-later fi_mr_attr has them (caller).
        unsafe { ((*a).iface, (*a).device) }
    };
    // libfabric reads iface and device only in a domain with FI_HMEM (and a caller without
    // it may leave them unset): there, a value no interface has is host memory; a real
    // device interface is still refused below.
    // SAFETY: a fid from the caller, checked.
    let hmem = unsafe { get::<Domain>(fid) }.is_ok_and(|d| d.info().caps & xfabric::FI_HMEM != 0);
    let iface = match u32::try_from(raw_iface).ok().and_then(Iface::from_raw) {
        Some(i) => i,
        None if !hmem => Iface::System,
        None => return inval("fi_mr_regattr: unknown iface"),
    };
    // SAFETY: one readable iovec (caller).
    let v = unsafe { *mr_iov };
    let attr = MrAttr {
        addr: v.iov_base as usize,
        len: v.iov_len,
        access,
        offset,
        requested_key,
        context: context as usize,
        iface,
        // The union's members are ints except `reserved`; a device index is the int (host
        // memory has none).
        device: if iface == Iface::System {
            0
        } else {
            u64::from(raw_device as u32)
        },
    };
    // SAFETY: forwarded contract.
    unsafe { register(fid, &attr, flags, mr) }
}

/// The memory region whose descriptor (`fi_mr_desc`) is `desc`, if it is one of ours.
///
/// # Safety
/// `desc` null or a readable fid.
pub unsafe fn mr_of_desc<'a>(desc: *const c_void) -> Option<&'a MemoryRegion> {
    if desc.is_null() {
        return None;
    }
    // SAFETY: forwarded contract.
    unsafe { get::<MemoryRegion>(desc) }.ok()
}
