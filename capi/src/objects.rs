//! The control objects through C: fabric, domain, address vector, completion queue, counter,
//! event queue, wait set, memory region and endpoint opened and closed, each C attribute
//! structure translated onto the core's. Every ops table is [`crate::ops`]'s all-ENOSYS one
//! with the members xfabric translates filled in.

use std::ffi::{c_char, c_int, c_void};

use xfabric::{
    AddressVector, AvAttr, AvType, CntrAttr, CntrEvents, CompletionQueue, Counter, CqAttr,
    CqFormat, CqWaitCond, Domain, Endpoint, EqAttr, Error, EventQueue, Fabric, FabricAttr, Iface,
    MemoryRegion, MrAttr, WaitAttr, WaitObj, WaitSet,
};

use crate::fid::*;
use crate::getinfo::hints_from_c;
use crate::info::{FiFabricAttr, FiInfo};
use crate::ops::*;
use crate::{guard, FI_EINVAL, FI_ENOSYS, FI_EOTHER, FI_VERSION_1_17};

/// `struct fid_fabric`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FabricHead {
    pub fid: Fid,
    pub ops: *const FiOpsFabric,
    pub api_version: u32,
}

/// `struct fid_domain`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct DomainHead {
    pub fid: Fid,
    pub ops: *const FiOpsDomain,
    pub mr: *const FiOpsMr,
}

/// `struct fid_ep`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct EpHead {
    pub fid: Fid,
    pub ops: *const FiOpsEp,
    pub cm: *const FiOpsCm,
    pub msg: *const FiOpsMsg,
    pub rma: *const FiOpsRma,
    pub tagged: *const FiOpsTagged,
    pub atomic: *const FiOpsAtomic,
    /// Collectives are not part of xfabric: null, which fi_collective.h's calls check for.
    pub collective: *const c_void,
}

/// `struct fid_av`, `fid_cq`, `fid_cntr`, `fid_eq`, `fid_wait`: the fid and one ops table.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct OpsHead<O: 'static> {
    pub fid: Fid,
    pub ops: *const O,
}

/// `struct fid_mr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct MrHead {
    pub fid: Fid,
    /// What `fi_mr_desc` hands out and data calls give back: the region's own fid.
    pub mem_desc: *mut c_void,
    pub key: u64,
}

/// `struct fi_cq_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiCqAttr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

/// `struct fi_cntr_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiCntrAttr {
    pub events: c_int,
    pub wait_obj: c_int,
    pub wait_set: *mut c_void,
    pub flags: u64,
}

/// `struct fi_av_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiAvAttr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

/// `struct fi_eq_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiEqAttr {
    pub size: usize,
    pub flags: u64,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_set: *mut c_void,
}

/// `struct fi_wait_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiWaitAttr {
    pub wait_obj: c_int,
    pub flags: u64,
}

/// `struct fi_mr_attr` (the device union read as its widest member).
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMrAttr {
    pub mr_iov: *const libc::iovec,
    pub iov_count: usize,
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub context: *mut c_void,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
    pub iface: c_int,
    pub device: u64,
}

macro_rules! class {
    ($t:ty, $class:expr, $head:ty, $fi_ops:ident $(, close = $close:expr)? $(, bind = $bind:expr)? $(, control = $control:expr)?) => {
        static $fi_ops: FiOps = FiOps {
            close: close::<$t>,
            $(bind: $bind,)?
            $(control: $control,)?
            ..FiOps::ENOSYS
        };
        impl Class for $t {
            const FCLASS: usize = $class;
            type Head = $head;
            fn fi_ops() -> &'static FiOps {
                &$fi_ops
            }
            $(fn close(self) -> Result<(), (Self, Error)> {
                ($close)(self)
            })?
        }
    };
}

class!(Fabric, FI_CLASS_FABRIC, FabricHead, FABRIC_FI_OPS);
class!(
    Domain,
    FI_CLASS_DOMAIN,
    DomainHead,
    DOMAIN_FI_OPS,
    control = crate::trigger::domain_control
);
class!(
    AddressVector,
    FI_CLASS_AV,
    OpsHead<FiOpsAv>,
    AV_FI_OPS,
    close = AddressVector::close,
    bind = crate::data::av_bind
);
class!(
    CompletionQueue,
    FI_CLASS_CQ,
    OpsHead<FiOpsCq>,
    CQ_FI_OPS,
    close = CompletionQueue::close,
    control = cq_control
);
class!(
    Counter,
    FI_CLASS_CNTR,
    OpsHead<FiOpsCntr>,
    CNTR_FI_OPS,
    close = Counter::close,
    control = cntr_control
);
class!(
    EventQueue,
    FI_CLASS_EQ,
    OpsHead<FiOpsEq>,
    EQ_FI_OPS,
    control = eq_control
);

/// `fi_control` command: the object's wait object (an `int` fd for `FI_WAIT_FD`).
const FI_GETWAIT: c_int = 5;

/// `FI_GETWAIT`'s answer: the descriptor written to `*arg`.
///
/// # Safety
/// `arg` null or writable as an `int` (fi_control(FI_GETWAIT)'s contract for FI_WAIT_FD).
unsafe fn getwait(
    command: c_int,
    arg: *mut c_void,
    fd: xfabric::Result<i32>,
) -> Result<c_int, c_int> {
    if command != FI_GETWAIT {
        return Err(-FI_ENOSYS);
    }
    if arg.is_null() {
        return Err(inval("fi_control(FI_GETWAIT): null argument"));
    }
    let fd = fd.map_err(|e| code(&e))?;
    // SAFETY: checked non-null, writable (caller).
    unsafe { *arg.cast::<c_int>() = fd };
    Ok(0)
}

unsafe extern "C" fn cq_control(fid: *mut c_void, command: c_int, arg: *mut c_void) -> c_int {
    run(|| {
        // SAFETY: a fid from the caller, checked; arg per the command (caller).
        unsafe { getwait(command, arg, get::<CompletionQueue>(fid)?.wait_fd()) }
    })
}

unsafe extern "C" fn cntr_control(fid: *mut c_void, command: c_int, arg: *mut c_void) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe { getwait(command, arg, get::<Counter>(fid)?.wait_fd()) }
    })
}

unsafe extern "C" fn eq_control(fid: *mut c_void, command: c_int, arg: *mut c_void) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe { getwait(command, arg, get::<EventQueue>(fid)?.wait_fd()) }
    })
}

unsafe extern "C" fn wait_control(fid: *mut c_void, command: c_int, arg: *mut c_void) -> c_int {
    run(|| {
        // SAFETY: as cq_control.
        unsafe { getwait(command, arg, get::<WaitSet>(fid)?.wait_fd()) }
    })
}

/// `fi_trywait`: 0 when the caller may block on every object's wait object, -FI_EAGAIN when
/// one of them has something to read first.
unsafe extern "C" fn fabric_trywait(
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
class!(
    WaitSet,
    FI_CLASS_WAIT,
    OpsHead<FiOpsWait>,
    WAIT_FI_OPS,
    control = wait_control
);
class!(MemoryRegion, FI_CLASS_MR, MrHead, MR_FI_OPS);
/// An endpoint as C holds it: with its address format, which decides how its name is written
/// (an `FI_ADDR_STR` name is a C string, NUL included).
pub struct CEndpoint {
    /// The endpoint.
    pub ep: Endpoint,
    /// `fi_info.addr_format` it was opened with.
    pub addr_format: u32,
}

impl Class for CEndpoint {
    const FCLASS: usize = FI_CLASS_EP;
    type Head = EpHead;
    fn fi_ops() -> &'static FiOps {
        &crate::data::EP_FID_OPS
    }
    // An endpoint's close always finishes (it shuts the endpoint down first).
    fn close(self) -> Result<(), (Self, Error)> {
        if let Err(e) = self.ep.close() {
            tracing::warn!("fi_close(ep): {e}");
        }
        Ok(())
    }
}

static FABRIC_OPS: FiOpsFabric = FiOpsFabric {
    domain: fabric_domain,
    eq_open: fabric_eq_open,
    wait_open: fabric_wait_open,
    trywait: fabric_trywait,
    ..FiOpsFabric::ENOSYS
};
static DOMAIN_OPS: FiOpsDomain = FiOpsDomain {
    av_open: domain_av_open,
    cq_open: domain_cq_open,
    endpoint: domain_endpoint,
    cntr_open: domain_cntr_open,
    query_atomic: crate::atomic::domain_query_atomic,
    ..FiOpsDomain::ENOSYS
};
static MR_OPS: FiOpsMr = FiOpsMr {
    reg: mr_reg,
    regv: mr_regv,
    regattr: mr_regattr,
    ..FiOpsMr::ENOSYS
};

/// Runs a C entry point's body: a panic is `-FI_EOTHER`, an error its negative code.
fn run(body: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    guard(-FI_EOTHER, || body().unwrap_or_else(|e| e))
}

fn inval(what: &str) -> c_int {
    tracing::debug!("C call: {what}");
    -FI_EINVAL
}

fn out_ok<T>(out: *mut T) -> Result<(), c_int> {
    if out.is_null() {
        Err(inval("null result pointer"))
    } else {
        Ok(())
    }
}

fn enum_of<T>(raw: c_int, from: fn(i32) -> Option<T>, what: &str) -> Result<T, c_int> {
    from(raw).ok_or_else(|| inval(&format!("{what} {raw} is not a value of its enum")))
}

/// The wait set a C attribute names, if any.
///
/// # Safety
/// `w` null or a readable fid.
unsafe fn wait_set(w: *mut c_void) -> Result<Option<WaitSet>, c_int> {
    if w.is_null() {
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
        let attr = FabricAttr {
            name: str_of(a.name),
            prov_name: str_of(a.prov_name),
            prov_version: a.prov_version,
            api_version: a.api_version,
        };
        let f = xfabric::fabric(&attr).map_err(|e| code(&e))?;
        let head = FabricHead {
            fid: fid_of::<Fabric>(context),
            ops: &FABRIC_OPS,
            api_version: if a.api_version == 0 {
                FI_VERSION_1_17
            } else {
                a.api_version
            },
        };
        // SAFETY: fabric checked non-null, writable (caller).
        Ok(unsafe { publish(head, f, fabric) })
    })
}

unsafe extern "C" fn fabric_domain(
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
        let head = DomainHead {
            fid: fid_of::<Domain>(context),
            ops: &DOMAIN_OPS,
            mr: &MR_OPS,
        };
        // SAFETY: domain checked non-null.
        Ok(unsafe { publish(head, d, domain) })
    })
}

unsafe extern "C" fn fabric_eq_open(
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
        if !a.wait_set.is_null() {
            return Err(-FI_ENOSYS);
        }
        let attr = EqAttr {
            size: a.size,
            flags: a.flags,
            wait_obj: enum_of(a.wait_obj, WaitObj::from_raw, "eq wait_obj")?,
        };
        let q = f.eq_open(&attr).map_err(|e| code(&e))?;
        let head = OpsHead {
            fid: fid_of::<EventQueue>(context),
            ops: &crate::eq::EQ_OPS,
        };
        // SAFETY: eq checked non-null.
        Ok(unsafe { publish(head, q, eq) })
    })
}

unsafe extern "C" fn fabric_wait_open(
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
        let head = OpsHead {
            fid: fid_of::<WaitSet>(std::ptr::null_mut()),
            ops: &crate::eq::WAIT_OPS,
        };
        // SAFETY: waitset checked non-null.
        Ok(unsafe { publish(head, w, waitset) })
    })
}

unsafe extern "C" fn domain_av_open(
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
        let head = OpsHead {
            fid: fid_of::<AddressVector>(context),
            ops: &crate::data::AV_OPS,
        };
        // SAFETY: av checked non-null.
        Ok(unsafe { publish(head, v, av) })
    })
}

unsafe extern "C" fn domain_cq_open(
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
        let attr = CqAttr {
            size: a.size,
            flags: a.flags,
            format: enum_of(a.format, CqFormat::from_raw, "cq format")?,
            wait_obj: enum_of(a.wait_obj, WaitObj::from_raw, "cq wait_obj")?,
            signaling_vector: a.signaling_vector,
            wait_cond: enum_of(a.wait_cond, CqWaitCond::from_raw, "cq wait_cond")?,
            // SAFETY: null or a fid (caller).
            wait_set: unsafe { wait_set(a.wait_set) }?,
        };
        let q = d.cq_open(&attr).map_err(|e| code(&e))?;
        let head = OpsHead {
            fid: fid_of::<CompletionQueue>(context),
            ops: &crate::data::CQ_OPS,
        };
        // SAFETY: cq checked non-null.
        Ok(unsafe { publish(head, q, cq) })
    })
}

unsafe extern "C" fn domain_cntr_open(
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
        let attr = CntrAttr {
            events: enum_of(a.events, CntrEvents::from_raw, "cntr events")?,
            wait_obj: enum_of(a.wait_obj, WaitObj::from_raw, "cntr wait_obj")?,
            // SAFETY: null or a fid (caller).
            wait_set: unsafe { wait_set(a.wait_set) }?,
            flags: a.flags,
        };
        let c = d.cntr_open(&attr).map_err(|e| code(&e))?;
        let head = OpsHead {
            fid: fid_of::<Counter>(context),
            ops: &crate::data::CNTR_OPS,
        };
        // SAFETY: cntr checked non-null.
        Ok(unsafe { publish(head, c, cntr) })
    })
}

unsafe extern "C" fn domain_endpoint(
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
        let head = crate::data::ep_head(context);
        // SAFETY: ep checked non-null.
        Ok(unsafe { publish(head, e, ep) })
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
            fid: fid_of::<MemoryRegion>(attr.context as *mut c_void),
            mem_desc: std::ptr::null_mut(),
            key: mr.key(),
        };
        // SAFETY: out checked non-null.
        unsafe { publish(head, mr, out) };
        // SAFETY: publish stored our new Obj there; its descriptor is itself.
        unsafe {
            let obj = (*out).cast::<Obj<MemoryRegion>>();
            (*obj).head.mem_desc = obj.cast();
        }
        Ok(0)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn mr_reg(
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
unsafe extern "C" fn mr_regv(
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

unsafe extern "C" fn mr_regattr(
    fid: *mut c_void,
    attr: *const c_void,
    flags: u64,
    mr: *mut *mut c_void,
) -> c_int {
    // SAFETY: null or a valid fi_mr_attr (caller).
    let Some(a) = (unsafe { attr.cast::<FiMrAttr>().as_ref() }) else {
        return inval("fi_mr_regattr: null attr");
    };
    if a.iov_count != 1 || a.mr_iov.is_null() {
        return inval("fi_mr_regattr: one iovec is supported");
    }
    let Some(iface) = u32::try_from(a.iface).ok().and_then(Iface::from_raw) else {
        return inval("fi_mr_regattr: unknown iface");
    };
    // SAFETY: one readable iovec (caller).
    let v = unsafe { *a.mr_iov };
    let attr = MrAttr {
        addr: v.iov_base as usize,
        len: v.iov_len,
        access: a.access,
        offset: a.offset,
        requested_key: a.requested_key,
        context: a.context as usize,
        iface,
        // The union's members are ints except `reserved`; a device index is the int.
        device: u64::from(a.device as u32),
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
