//! An exported completion queue: its entries copied into a ring an XPU reads.
//!
//! The host queue stays what providers write to. Every time an entry is added (and every time
//! an exported endpoint's watcher runs) entries move, errors first, into the ring while it has
//! room. The XPU consumes them and writes its `head` back. When the ring is full, entries stay
//! in the host queue, in order, bounded by the queue's own size as always: nothing is lost,
//! and the next pump after the XPU made room moves them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::abi::{CqRingHeader, CqSlot, FidXpu, XpuCqEntry, CQ_KIND_ERR, CQ_KIND_OK, CQ_WORDS};
use super::abi::{FI_CLASS_CQ, FI_XPU_PROV_XFABRIC};
use crate::cq::CompletionQueue;
use crate::entry::{CqErrEntry, CqTaggedEntry, FiAddr};
use crate::error::{Error, Result};
use crate::hmem_iface::Iface;
use crate::trigger::Xpu;

/// The host's side of an exported CQ's ring: it owns the shared memory.
pub(crate) struct CqExport {
    header: Box<CqRingHeader>,
    slots: Box<[CqSlot]>,
    /// The next position the host writes: its own copy (the header's is written from it for
    /// the XPU, never read back). Changed only under the queue's lock.
    tail: AtomicU64,
    /// Slots - 1, the host's own copy (a device may write its header).
    mask: u64,
}

impl CqExport {
    fn new(slots: usize, format: u32) -> Arc<CqExport> {
        let mem: Box<[CqSlot]> = (0..slots)
            .map(|_| CqSlot(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        let header = Box::new(CqRingHeader::new(mem.as_ptr() as u64, slots as u64, format));
        Arc::new(CqExport {
            header,
            slots: mem,
            tail: AtomicU64::new(0),
            mask: slots as u64 - 1,
        })
    }

    pub(crate) fn header(&self) -> &CqRingHeader {
        &self.header
    }

    fn ctx(&self) -> u64 {
        &*self.header as *const CqRingHeader as u64
    }

    /// Free slots. Host only (its `tail`); the XPU's `head` is read with acquire, so a slot
    /// counted free was copied out before it is written again.
    pub(crate) fn room(&self) -> u64 {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.header.head.load(Ordering::Acquire);
        // A head past the tail is an XPU's bug (or hostility): no room, rather than a wrap.
        let used = tail.checked_sub(head).unwrap_or(u64::MAX);
        (self.mask + 1).saturating_sub(used)
    }

    fn put(&self, mut e: XpuCqEntry) {
        let tail = self.tail.load(Ordering::Relaxed);
        e.seq = tail.wrapping_add(1);
        let slot = &self.slots[(tail & self.mask) as usize];
        let w = e.to_words();
        for (i, v) in w.iter().enumerate().take(CQ_WORDS).skip(1) {
            slot.0[i].store(*v, Ordering::Relaxed);
        }
        slot.0[0].store(e.seq, Ordering::Release);
        self.tail.store(e.seq, Ordering::Relaxed);
        self.header.tail.store(e.seq, Ordering::Release);
    }

    /// Appends a success entry (the caller checked `room`, under the queue's lock).
    pub(crate) fn put_ok(&self, e: &CqTaggedEntry, src: FiAddr) {
        self.put(XpuCqEntry {
            kind: CQ_KIND_OK,
            op_context: e.op_context as u64,
            flags: e.flags,
            len: e.len as u64,
            buf: e.buf as u64,
            data: e.data,
            tag: e.tag,
            src,
            ..Default::default()
        });
    }

    /// Appends an error entry (the caller checked `room`, under the queue's lock).
    pub(crate) fn put_err(&self, e: &CqErrEntry) {
        self.put(XpuCqEntry {
            kind: CQ_KIND_ERR,
            err: e.err,
            op_context: e.op_context as u64,
            flags: e.flags,
            len: e.len as u64,
            buf: e.buf as u64,
            data: e.data,
            tag: e.tag,
            src: crate::consts::FI_ADDR_NOTAVAIL,
            olen: e.olen as u64,
            prov_errno: e.prov_errno,
            ..Default::default()
        });
    }
}

/// `struct fid_xpu_cq` and what keeps its shared memory alive: the handle device calls take
/// (`xpu::device::cq_read`...). Its head is `struct fid_xpu` exactly.
#[repr(C)]
pub struct XpuCq {
    fid: FidXpu,
    shared: Arc<CqExport>,
    xpu: Xpu,
}

impl XpuCq {
    /// The `struct fid_xpu` a device's header reads.
    pub fn fid(&self) -> &FidXpu {
        &self.fid
    }

    /// The XPU it was exported to.
    pub fn xpu(&self) -> Xpu {
        self.xpu
    }

    pub(crate) fn shared(&self) -> &CqExport {
        &self.shared
    }
}

impl CompletionQueue {
    /// `fi_cq_export_xpu`: a handle through which `xpu` reads this queue's entries
    /// (`xpu::device::cq_read`, `cq_readfrom`, `cq_readerr`), with a ring of as many slots as
    /// the queue has entries (rounded up to a power of two, at most 4096). See
    /// `export_xpu_slots`.
    pub fn export_xpu(&self, xpu: Xpu) -> Result<XpuCq> {
        let slots = self.inner().cap().clamp(2, 4096).next_power_of_two();
        self.export_xpu_slots(xpu, slots)
    }

    /// `fi_cq_export_xpu` with a ring of `slots` slots (a power of two, 2 to 65536). From
    /// then on, entries move to the ring as they come, while it has room; the rest wait here,
    /// in order, and move as the XPU makes room (an exported endpoint's watcher looks). Host
    /// reads still work but see only what has not moved: read from one side. Error data is
    /// not carried to the ring. Exporting again returns another handle on the same ring.
    pub fn export_xpu_slots(&self, xpu: Xpu, slots: usize) -> Result<XpuCq> {
        if xpu.iface != Iface::System {
            return Err(Error::OpNotSupp(format!(
                "cq_export_xpu: {:?}: only the CPU XPU (FI_HMEM_SYSTEM) has a device API so far",
                xpu.iface
            )));
        }
        if !(2..=65536).contains(&slots) || !slots.is_power_of_two() {
            return Err(Error::Inval(format!(
                "cq_export_xpu: {slots} slots; a power of two from 2 to 65536"
            )));
        }
        let inner = self.inner();
        let shared = inner
            .xpu
            .get_or_init(|| CqExport::new(slots, self.format() as u32))
            .clone();
        // What is queued already moves now.
        inner.pump_xpu();
        Ok(XpuCq {
            fid: FidXpu {
                fclass: FI_CLASS_CQ,
                prov_id: FI_XPU_PROV_XFABRIC,
                prov_ctx: shared.ctx(),
            },
            shared,
            xpu,
        })
    }
}
