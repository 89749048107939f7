//! An exported endpoint: one descriptor ring per (endpoint, XPU), watched by the endpoint's
//! XPU watcher (`trigger::XpuWatch`), which drains it here: each descriptor is validated and
//! started as the matching host call would start it, through the endpoint's link (the same
//! `EpCore::start_*` path: CQ entry reserved, provider, release), behind any operation
//! waiting for room, so completions, counters, ordering and fences are the host call's.

use std::sync::Arc;

use super::abi::XpuDesc;
use super::abi::{FidXpu, FI_CLASS_EP, FI_XPU_PROV_XFABRIC};
use super::ring::{DescRing, Left, Took, RING_DEFAULT_SLOTS};
use super::validate::{Checked, Fault, XPU_FAULT_TORN, XPU_FAULT_UNPUBLISHED};
use crate::av::AddressVector;
use crate::consts::errno::{FI_ECANCELED, FI_EINVAL};
use crate::entry::FiAddr;
use crate::ep::Endpoint;
use crate::error::{Error, Result};
use crate::trigger::{Owner, Port, Xpu};

/// `struct fid_xpu_ep` and what keeps its ring alive: the handle device calls take
/// (`xpu::device::send`...). Its head is `struct fid_xpu` exactly; `prov_ctx` is the address
/// of the ring's `RingHeader`.
#[repr(C)]
pub struct XpuEp {
    fid: FidXpu,
    ring: Arc<DescRing>,
    xpu: Xpu,
}

impl XpuEp {
    /// The `struct fid_xpu` a device's header reads.
    pub fn fid(&self) -> &FidXpu {
        &self.fid
    }

    /// The XPU it was exported to.
    pub fn xpu(&self) -> Xpu {
        self.xpu
    }

    pub(crate) fn ring(&self) -> &DescRing {
        &self.ring
    }
}

impl Endpoint {
    /// `fi_ep_export_xpu`: a handle through which `xpu` posts this endpoint's operations from
    /// device code (`xpu::device::send`, `tsend`, `recv`, `write`, ...), with a ring of
    /// `RING_DEFAULT_SLOTS` descriptors. See `export_xpu_slots`.
    pub fn export_xpu(&self, xpu: Xpu) -> Result<XpuEp> {
        self.export_xpu_slots(xpu, RING_DEFAULT_SLOTS)
    }

    /// `fi_ep_export_xpu` with a ring of `slots` descriptors (a power of two). The endpoint
    /// must be enabled and opened with `FI_TRIGGER | FI_XPU_TRIGGER` (its XPU watcher drains
    /// the ring). One ring per (endpoint, XPU): exporting again for the same XPU returns
    /// another handle on the same ring (`slots` is then ignored). The CPU XPU's ring is heap
    /// memory; a CUDA or Level Zero XPU's is device-visible host memory from the domain's
    /// doorbell source (`DoorbellAlloc::memory`), and `prov_ctx` is its device address. Other
    /// XPUs answer `OpNotSupp`.
    pub fn export_xpu_slots(&self, xpu: Xpu, slots: usize) -> Result<XpuEp> {
        let what = "ep_export_xpu";
        self.check_live(what)?;
        super::mem::exportable(what, xpu)?;
        let link = self.link().ok_or_else(|| {
            Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_TRIGGER | FI_XPU_TRIGGER"
            ))
        })?;
        let ring = link.export_ring(what, xpu, slots)?;
        Ok(XpuEp {
            fid: FidXpu {
                fclass: FI_CLASS_EP,
                prov_id: FI_XPU_PROV_XFABRIC,
                prov_ctx: ring.ctx(),
            },
            ring,
            xpu,
        })
    }
}

impl AddressVector {
    /// `fi_av_get_xpu_addr`: the raw address an XPU names `fi_addr` by in the descriptors it
    /// posts. xfabric's is the `fi_addr_t` itself; the watcher checks it against the
    /// endpoint's AV when it drains each descriptor (an entry removed since is refused).
    pub fn get_xpu_addr(&self, fi_addr: FiAddr) -> Result<u64> {
        let inner = self.inner();
        if inner.decode(fi_addr).is_none() || inner.name(fi_addr).is_none() {
            return Err(Error::Inval(format!(
                "av_get_xpu_addr: {fi_addr:#x} is not an address of this AV"
            )));
        }
        Ok(fi_addr)
    }
}

/// Takes and starts what `ring` holds, at most `max` descriptors, stopping while operations
/// wait for room at the endpoint, or while the CQ faults go to holds as many unread errors
/// as its size (the ring then fills and the XPU is answered `-FI_EAGAIN`: the
/// back-pressure). `link` is the endpoint's link, `owner` the same as a trait object.
/// Returns how many descriptors were taken.
// Out of line: one call per look, and callgrind can then attribute the watcher's cost per
// descriptor (inclusive cost of `xpu::ep::drain` against its calls and the descriptors taken).
#[inline(never)]
pub(crate) fn drain(
    ring: &DescRing,
    seen: &mut Checked,
    max: usize,
    owner: &dyn Owner,
    link: &Arc<dyn Owner>,
) -> usize {
    let port = owner.port();
    let mut n = 0;
    let mut d = XpuDesc::default();
    // Checked again after each fault only: nothing else adds errors here.
    let mut faults_full = port.xpu_faults_full();
    while n < max && !owner.closed() && !owner.backlog() && !faults_full {
        let Some(t) = ring.take_into(&mut d) else {
            break;
        };
        n += 1;
        match t {
            Took::Torn => {
                let f = Fault {
                    code: XPU_FAULT_TORN,
                    err: FI_EINVAL,
                    why: format!(
                        "torn descriptor at position {}: check word {:#x} does not match sequence word {:#x}",
                        d.seq.wrapping_sub(1),
                        d.check,
                        d.seq
                    ),
                };
                // Nothing in a torn slot is trusted, its context included.
                port.xpu_fault(0, 0, &f);
                faults_full = port.xpu_faults_full();
            }
            Took::Desc => match port.xpu_action(&d, seen) {
                Ok(action) => owner.submit_action(action, &d, link),
                Err(f) => {
                    port.xpu_fault(d.context as usize, d.opcode, &f);
                    faults_full = port.xpu_faults_full();
                }
            },
        }
    }
    n
}

/// Closes `ring` (its endpoint is closing) and reports what it still held: each published
/// descriptor `FI_ECANCELED` under its context; each run of torn slots as `drain` reports one
/// (no context: nothing in them is trusted); each run of positions claimed but never
/// published one `FI_ECANCELED` entry without context (`XPU_FAULT_UNPUBLISHED`).
pub(crate) fn cancel_all(ring: &DescRing, port: &dyn Port) {
    // Once the queue holds as many error entries as it has room for, the rest are counted
    // and reported in one entry: a ring of 262,144 descriptors closed into a CQ of 16 put
    // every one of them in the CQ's memory.
    let mut over = 0u64;
    for left in ring.close() {
        // Judged by the CQ each goes to: a send's cancellation is not folded into the count
        // because the receive CQ's errors are full (torn and unpublished runs, of no opcode,
        // go where opcode 0 goes).
        let opcode = match &left {
            Left::Published(d) => d.opcode,
            Left::Torn { .. } | Left::Unpublished { .. } => 0,
        };
        if port.xpu_faults_full_for(opcode) {
            over += match left {
                Left::Published(_) => 1,
                Left::Torn { n, .. } | Left::Unpublished { n, .. } => n,
            };
            continue;
        }
        match left {
            Left::Published(d) => port.xpu_fault(
                d.context as usize,
                d.opcode,
                &Fault {
                    code: FI_ECANCELED,
                    err: FI_ECANCELED,
                    why: "endpoint closed before the descriptor was taken".into(),
                },
            ),
            Left::Torn { first, n } => port.xpu_fault(
                0,
                0,
                &Fault {
                    code: XPU_FAULT_TORN,
                    err: FI_EINVAL,
                    why: format!(
                        "endpoint closed; {}: a check word not its position's",
                        positions(first, n, "torn descriptor")
                    ),
                },
            ),
            Left::Unpublished { first, n } => port.xpu_fault(
                0,
                0,
                &Fault {
                    code: XPU_FAULT_UNPUBLISHED,
                    err: FI_ECANCELED,
                    why: format!(
                        "endpoint closed; {}: claimed, never published",
                        positions(first, n, "descriptor")
                    ),
                },
            ),
        }
    }
    if over > 0 {
        port.xpu_fault(
            0,
            0,
            &Fault {
                code: FI_ECANCELED,
                err: FI_ECANCELED,
                why: format!(
                    "endpoint closed; {over} more descriptors or positions canceled, not \
                     reported one by one: the completion queue's error entries were full"
                ),
            },
        );
    }
}

/// "WHAT at position P", or "n WHATs at positions P to Q" for a run.
fn positions(first: u64, n: u64, what: &str) -> String {
    if n == 1 {
        format!("{what} at position {first}")
    } else {
        format!(
            "{n} {what}s at positions {first} to {}",
            first.wrapping_add(n - 1)
        )
    }
}
