//! The device API's host calls through C (fi_xpu(3)): `fi_ep_export_xpu`, `fi_cq_export_xpu`,
//! `fi_cntr_export_xpu`, `fi_av_get_xpu_addr` and `fi_mr_get_xpu_desc`, with upstream's
//! signatures, and xfabric's `xf_*_export_xpu`, which also take the XPU (`struct xf_xpu_attr`).
//!
//! libfabric 1.17 has no ops-table slot for any of them, so they are real symbols (node
//! `XFABRIC_1.0` of `fabric.map`), declared in xfabric's installed header `xfabric/fi_xpu.h`.
//! Upstream names the XPU when the object is created (`fi_xpu_attr` in the endpoint, CQ and
//! counter attributes, which 1.17's structures lack); xfabric names it at export: upstream's
//! names export to the CPU XPU (`FI_HMEM_SYSTEM`, a thread of this process) with the default
//! ring size, `xf_*_export_xpu` to the XPU and ring size the attribute gives.
//!
//! The caller owns the `struct fid_xpu_*` and the call fills it (upstream's contract). What its
//! `prov_ctx` points at belongs to the exported object, not to the handle, and exporting again
//! returns the same `prov_ctx`. So an export needs no release of its own; the XPU should stop
//! using a handle before the host closes its object, and a late call still reaches memory that
//! is there: the blocks are kept until the domain closes (`xfabric::xpu::Retired`), their rings
//! closed.

use std::ffi::{c_int, c_void};

use xfabric::xpu::{FidXpu, RING_DEFAULT_SLOTS};
use xfabric::{AddressVector, CompletionQueue, Counter, Iface, MemoryRegion, Xpu};

use crate::consts::{FI_EBADFLAGS, FI_ETOOSMALL};
use crate::ffi::{code, ep_of, get, inval, out_ok, run};

/// `struct xf_xpu_attr` of `xfabric/fi_xpu.h`: the XPU an export is for and its ring's size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XfXpuAttr {
    /// `enum fi_hmem_iface` of the XPU (`FI_HMEM_SYSTEM`: a CPU thread).
    pub iface: c_int,
    /// Zero.
    pub reserved: u32,
    /// The device within `iface` (0 for a CPU).
    pub device: u64,
    /// Descriptor slots of an endpoint's ring, CQ entries of a CQ's ring (a power of two); 0
    /// for the default. A counter's ring has the default size whatever this says.
    pub slots: u64,
}

/// Bytes of the raw values `fi_av_get_xpu_addr` and `fi_mr_get_xpu_desc` write: xfabric's
/// `xpu_key_size`.
pub const XPU_KEY_SIZE: usize = 8;

/// The XPU and ring size `attr` names (null: the CPU XPU, the default size).
///
/// # Safety
/// `attr` null or readable.
unsafe fn xpu_of(attr: *const XfXpuAttr) -> Result<(Xpu, Option<usize>), c_int> {
    if attr.is_null() {
        return Ok((Xpu::CPU, None));
    }
    // SAFETY: readable (caller), checked non-null; a plain-data copy.
    let a = unsafe { attr.read_unaligned() };
    let iface = u32::try_from(a.iface)
        .ok()
        .and_then(Iface::from_raw)
        .ok_or_else(|| inval(&format!("xf_xpu_attr: iface {} is not a value", a.iface)))?;
    if a.reserved != 0 {
        return Err(inval("xf_xpu_attr: reserved is not 0"));
    }
    // One CPU XPU (as FI_OPT_XPU_TRIGGER's getopt says): a device number for it would make a
    // second ring, a second export of the same CPU.
    if iface == Iface::System && a.device != 0 {
        return Err(inval(&format!(
            "xf_xpu_attr: device {} of FI_HMEM_SYSTEM; the CPU XPU is device 0",
            a.device
        )));
    }
    let slots = match a.slots {
        0 => None,
        n => Some(usize::try_from(n).map_err(|_| inval("xf_xpu_attr: slots too large"))?),
    };
    Ok((
        Xpu {
            iface,
            device: a.device,
        },
        slots,
    ))
}

/// Writes `fid` into the caller's handle.
///
/// # Safety
/// `out` writable for a `struct fid_xpu` (checked non-null by the caller).
unsafe fn fill(out: *mut FidXpu, fid: &FidXpu) {
    // SAFETY: writable (caller); unaligned in case the caller's struct is packed.
    unsafe { out.write_unaligned(*fid) };
}

fn no_flags(what: &str, flags: u64) -> Result<(), c_int> {
    if flags != 0 {
        tracing::debug!("{what}: flags {flags:#x}: none is defined");
        return Err(-FI_EBADFLAGS);
    }
    Ok(())
}

/// `fi_ep_export_xpu`: exports an enabled endpoint opened with `FI_TRIGGER | FI_XPU_TRIGGER`
/// to the CPU XPU (see [`ep_export_attr`]). 0, `-FI_EINVAL` for a null or foreign fid or a
/// null handle, `-FI_EBADFLAGS` for any flag, `-FI_EOPNOTSUPP` for an endpoint without the
/// capabilities, `-FI_EOPBADSTATE` for one not enabled or closing.
///
/// # Safety
/// `ep` null or a readable fid; `xpu_ep` null or writable for a `struct fid_xpu_ep`.
pub unsafe fn ep_export(ep: *mut c_void, flags: u64, xpu_ep: *mut FidXpu) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { ep_export_attr(ep, std::ptr::null(), flags, xpu_ep) }
}

/// xfabric's `fi_ep_export_xpu` for the XPU `attr` names (null: the CPU XPU), with a ring of
/// `attr->slots` descriptors (2 to 262144, a power of two; 0 for 1024). One ring per
/// (endpoint, XPU): exporting again fills the same handle. The CPU XPU is device 0 of
/// `FI_HMEM_SYSTEM` (another device number is `-FI_EINVAL`); a CUDA or Level Zero XPU where
/// the domain has one, `-FI_EOPNOTSUPP` where it has none.
///
/// # Safety
/// `ep` null or a readable fid; `attr` null or readable; `xpu_ep` null or writable.
pub unsafe fn ep_export_attr(
    ep: *mut c_void,
    attr: *const XfXpuAttr,
    flags: u64,
    xpu_ep: *mut FidXpu,
) -> c_int {
    run(|| {
        out_ok(xpu_ep)?;
        // SAFETY: a fid from the caller, checked (before the flags: a null fid is EINVAL).
        let ep = unsafe { ep_of(ep) }.map_err(|e| e as c_int)?;
        no_flags("fi_ep_export_xpu", flags)?;
        // SAFETY: forwarded contract.
        let (xpu, slots) = unsafe { xpu_of(attr) }?;
        let x = ep
            .export_xpu_slots(xpu, slots.unwrap_or(RING_DEFAULT_SLOTS))
            .map_err(|e| code(&e))?;
        // SAFETY: checked non-null, writable (caller).
        unsafe { fill(xpu_ep, x.fid()) };
        // The ring stays with the endpoint's watcher until the endpoint closes.
        Ok(0)
    })
}

/// `fi_cq_export_xpu`: exports a completion queue to the CPU XPU (see [`cq_export_attr`]).
///
/// # Safety
/// `cq` null or a readable fid; `xpu_cq` null or writable for a `struct fid_xpu_cq`.
pub unsafe fn cq_export(cq: *mut c_void, flags: u64, xpu_cq: *mut FidXpu) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { cq_export_attr(cq, std::ptr::null(), flags, xpu_cq) }
}

/// xfabric's `fi_cq_export_xpu` for the XPU `attr` names, with a ring of `attr->slots` entries
/// (2 to 65536, a power of two; 0: the queue's size rounded up, at most 4096). The ring takes
/// the queue's entries from then on; the device reads them in the queue's format.
///
/// # Safety
/// `cq` null or a readable fid; `attr` null or readable; `xpu_cq` null or writable.
pub unsafe fn cq_export_attr(
    cq: *mut c_void,
    attr: *const XfXpuAttr,
    flags: u64,
    xpu_cq: *mut FidXpu,
) -> c_int {
    run(|| {
        out_ok(xpu_cq)?;
        // SAFETY: a fid from the caller, checked (before the flags: a null fid is EINVAL).
        let cq = unsafe { get::<CompletionQueue>(cq) }?;
        no_flags("fi_cq_export_xpu", flags)?;
        // SAFETY: forwarded contract.
        let (xpu, slots) = unsafe { xpu_of(attr) }?;
        let x = match slots {
            Some(n) => cq.export_xpu_slots(xpu, n),
            None => cq.export_xpu(xpu),
        }
        .map_err(|e| code(&e))?;
        // SAFETY: checked non-null, writable (caller).
        unsafe { fill(xpu_cq, x.fid()) };
        Ok(0)
    })
}

/// `fi_cntr_export_xpu`: exports a counter to the CPU XPU (see [`cntr_export_attr`]).
///
/// # Safety
/// `cntr` null or a readable fid; `xpu_cntr` null or writable for a `struct fid_xpu_cntr`.
pub unsafe fn cntr_export(cntr: *mut c_void, flags: u64, xpu_cntr: *mut FidXpu) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { cntr_export_attr(cntr, std::ptr::null(), flags, xpu_cntr) }
}

/// xfabric's `fi_cntr_export_xpu` for the XPU `attr` names (`slots` must be 0: a counter's
/// ring has the default size). The counter's values are mirrored for the device from then on.
///
/// # Safety
/// `cntr` null or a readable fid; `attr` null or readable; `xpu_cntr` null or writable.
pub unsafe fn cntr_export_attr(
    cntr: *mut c_void,
    attr: *const XfXpuAttr,
    flags: u64,
    xpu_cntr: *mut FidXpu,
) -> c_int {
    run(|| {
        out_ok(xpu_cntr)?;
        // SAFETY: a fid from the caller, checked (before the flags: a null fid is EINVAL).
        let cntr = unsafe { get::<Counter>(cntr) }?;
        no_flags("fi_cntr_export_xpu", flags)?;
        // SAFETY: forwarded contract.
        let (xpu, slots) = unsafe { xpu_of(attr) }?;
        if slots.is_some() {
            return Err(inval("fi_cntr_export_xpu: a counter's ring size is fixed"));
        }
        let x = cntr.export_xpu(xpu).map_err(|e| code(&e))?;
        // SAFETY: checked non-null, writable (caller).
        unsafe { fill(xpu_cntr, x.fid()) };
        Ok(0)
    })
}

/// Writes an 8-byte raw value into the caller's buffer (`*len` in: its size; out: the bytes
/// written, or needed with `-FI_ETOOSMALL`).
///
/// # Safety
/// `len` readable and writable (checked non-null by the caller); `buf` null or writable for
/// `*len` bytes.
unsafe fn put_key(what: &str, buf: *mut c_void, len: *mut usize, v: u64) -> Result<c_int, c_int> {
    // SAFETY: readable (caller).
    let room = unsafe { len.read_unaligned() };
    if room < XPU_KEY_SIZE {
        // SAFETY: writable (caller): the size needed.
        unsafe { len.write_unaligned(XPU_KEY_SIZE) };
        tracing::debug!("{what}: {room} bytes, {XPU_KEY_SIZE} needed");
        return Err(-FI_ETOOSMALL);
    }
    if buf.is_null() {
        return Err(inval(&format!("{what}: null buffer")));
    }
    // SAFETY: writable for at least XPU_KEY_SIZE bytes (caller, checked above).
    unsafe { buf.cast::<u64>().write_unaligned(v) };
    // SAFETY: writable (caller): the bytes written. A call that fails otherwise leaves it.
    unsafe { len.write_unaligned(XPU_KEY_SIZE) };
    Ok(0)
}

/// `fi_av_get_xpu_addr`: the raw address (8 bytes, xfabric's `xpu_key_size`) an XPU names
/// `fi_addr` by. `-FI_ETOOSMALL` with `*len` set to 8 when the buffer is smaller;
/// `-FI_EINVAL` for an address not in the AV.
///
/// # Safety
/// `av` null or a readable fid; `len` null or readable and writable; `buf` null or writable
/// for `*len` bytes.
pub unsafe fn av_get_xpu_addr(
    av: *mut c_void,
    fi_addr: u64,
    buf: *mut c_void,
    len: *mut usize,
) -> c_int {
    run(|| {
        out_ok(len)?;
        // SAFETY: a fid from the caller, checked.
        let av = unsafe { get::<AddressVector>(av) }?;
        let raw = av.get_xpu_addr(fi_addr).map_err(|e| code(&e))?;
        // SAFETY: forwarded contract; len checked non-null.
        unsafe { put_key("fi_av_get_xpu_addr", buf, len, raw) }
    })
}

/// `fi_mr_get_xpu_desc`: the raw descriptor (8 bytes) an XPU names the region by; from then on
/// the region is local memory XPU-posted operations may use (range and access checked at each
/// use). Buffer sizes as [`av_get_xpu_addr`].
///
/// # Safety
/// `mr` null or a readable fid; `len` null or readable and writable; `buf` null or writable
/// for `*len` bytes.
pub unsafe fn mr_get_xpu_desc(mr: *mut c_void, buf: *mut c_void, len: *mut usize) -> c_int {
    run(|| {
        out_ok(len)?;
        // SAFETY: a fid from the caller, checked.
        let mr = unsafe { get::<MemoryRegion>(mr) }?;
        // Sized before the region is exported: a call that cannot write exports nothing.
        // SAFETY: readable (caller), checked non-null.
        if unsafe { len.read_unaligned() } < XPU_KEY_SIZE || buf.is_null() {
            // SAFETY: forwarded contract; reports the size needed.
            return unsafe { put_key("fi_mr_get_xpu_desc", buf, len, 0) };
        }
        let raw = mr.get_xpu_desc().map_err(|e| code(&e))?;
        // SAFETY: forwarded contract; len checked non-null.
        unsafe { put_key("fi_mr_get_xpu_desc", buf, len, raw) }
    })
}
