//! An exported completion queue: its entries copied into a ring an XPU reads.
//!
//! The host queue stays what providers write to. Every time an entry is added (and every time
//! a watcher runs, or a CPU XPU's read finds the ring empty) entries move, in their order, into
//! the ring while it has room. The XPU consumes them and writes its `head` back. When the ring
//! is full, entries stay in the host queue, in order, bounded by the queue's own size as
//! always: nothing is lost, and the next pump after the XPU made room moves them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::abi::{CqRingHeader, CqSlot, FidXpu, XpuCqEntry, CQ_KIND_ERR, CQ_KIND_OK, CQ_WORDS};
use super::abi::{FI_CLASS_CQ, FI_XPU_PROV_XFABRIC};
use super::exports::Exports;
use super::mem::{Block, XpuMemAlloc};
use crate::cq::{CompletionQueue, CqInner};
use crate::entry::{CqErrEntry, CqTaggedEntry, FiAddr};
use crate::error::{Error, Result};
use crate::trigger::Xpu;

/// Where the slots start in an exported CQ's block: right after the header.
const SLOTS_AT: usize = std::mem::size_of::<CqRingHeader>();

/// The host's side of an exported CQ's ring: it owns the shared memory (one block: the
/// header, then the slots; the host reads and writes it through its own address only).
pub(crate) struct CqExport {
    mem: Arc<Block>,
    /// The XPU it was exported to (one per queue).
    xpu: Xpu,
    /// The next position the host writes: its own copy (the header's is written from it for
    /// the XPU, never read back). Changed only under the queue's lock.
    tail: AtomicU64,
    /// Slots - 1, the host's own copy (a device may write its header).
    mask: u64,
    /// The queue whose entries move here: a CPU XPU that finds the ring empty moves what
    /// waits there itself (`xpu::device::cq_read`).
    cq: Weak<CqInner>,
}

/// Every exported queue of the process, for the watchers to move what waits in them into
/// their rings once the XPU made room (a queue bound to no endpoint with a watcher has none
/// of its own).
static EXPORTED: Exports<CqInner> = Exports::new();

impl Drop for CqExport {
    fn drop(&mut self) {
        EXPORTED.gone();
    }
}

/// Moves what waits in every exported queue into its ring, as far as each has room; whether
/// some had to stay (the watcher then keeps looking).
pub(crate) fn pump_all() -> bool {
    if !EXPORTED.any() {
        return false;
    }
    EXPORTED
        .alive()
        .iter()
        .filter(|c| c.may_hold_entries())
        .fold(false, |left, c| c.pump_xpu() | left)
}

impl CqExport {
    /// The ring's memory, for its domain to keep once the queue is gone (`Retired`): the
    /// export itself goes, so no watcher looks at it again.
    pub(crate) fn memory(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.mem.clone()
    }
}

impl CqExport {
    /// `slots` is a power of two within 2..=65536 (checked by the caller).
    fn new(
        cq: &Arc<CqInner>,
        slots: usize,
        format: u32,
        xpu: Xpu,
        alloc: Option<&dyn XpuMemAlloc>,
    ) -> Result<Arc<CqExport>> {
        let len = SLOTS_AT + slots * std::mem::size_of::<CqSlot>();
        let mem = Arc::new(Block::new("cq_export_xpu", xpu, alloc, len)?);
        let header = CqRingHeader::new(mem.xpu_at(SLOTS_AT), slots as u64, format);
        // SAFETY: the block is zero-filled, 64-aligned, `len` bytes, not yet shared: the
        // header is written before anyone reads it; zeroed slots are valid atomics.
        unsafe { mem.host_at(0).cast::<CqRingHeader>().write(header) };
        // Counted from here: its drop uncounts it, also when another export came first.
        EXPORTED.born();
        Ok(Arc::new(CqExport {
            mem,
            xpu,
            tail: AtomicU64::new(0),
            mask: slots as u64 - 1,
            cq: Arc::downgrade(cq),
        }))
    }

    /// Moves what waits in the host queue into the ring (`CqInner::pump_xpu`), if the queue
    /// is still open.
    pub(crate) fn pump(&self) {
        if let Some(c) = self.cq.upgrade().filter(|c| c.may_hold_entries()) {
            c.pump_xpu();
        }
    }

    /// The shared header, through the host's address.
    pub(crate) fn header(&self) -> &CqRingHeader {
        // SAFETY: written in `new`, alive and aligned as long as `self`; shared words are
        // atomics.
        unsafe { &*self.mem.host_at(0).cast::<CqRingHeader>() }
    }

    /// Whether the XPU's addresses are the host's (`xpu::device` follows them).
    pub(crate) fn host_reachable(&self) -> bool {
        self.mem.host_reachable()
    }

    pub(crate) fn slot(&self, pos: u64) -> &CqSlot {
        let idx = (pos & self.mask) as usize;
        // SAFETY: slot `idx` <= mask lies inside the block (`new` sized it), aligned; its
        // words are atomics.
        unsafe { &*self.mem.host_at(SLOTS_AT).cast::<CqSlot>().add(idx) }
    }

    /// The header's address as the XPU sees it (what `prov_ctx` names).
    fn ctx(&self) -> u64 {
        self.mem.xpu_at(0)
    }

    /// Free slots. Host only (its `tail`); the XPU's `head` is read with acquire, so a slot
    /// counted free was copied out before it is written again.
    pub(crate) fn room(&self) -> u64 {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.header().head.load(Ordering::Acquire);
        // A head past the tail is an XPU's bug (or hostility): no room, rather than a wrap.
        let used = tail.checked_sub(head).unwrap_or(u64::MAX);
        (self.mask + 1).saturating_sub(used)
    }

    fn put(&self, mut e: XpuCqEntry) {
        let tail = self.tail.load(Ordering::Relaxed);
        e.seq = tail.wrapping_add(1);
        let slot = self.slot(tail);
        let w = e.to_words();
        for (i, v) in w.iter().enumerate().take(CQ_WORDS).skip(1) {
            slot.0[i].store(*v, Ordering::Relaxed);
        }
        slot.0[0].store(e.seq, Ordering::Release);
        self.tail.store(e.seq, Ordering::Relaxed);
        self.header().tail.store(e.seq, Ordering::Release);
    }

    /// The queue overran and every entry from before it was put: an XPU's read that finds
    /// the ring empty answers `-FI_EOVERRUN` from now on.
    pub(crate) fn mark_overrun(&self) {
        let h = &self.header().overrun;
        if h.load(Ordering::Relaxed) == 0 {
            h.store(1, Ordering::Release);
        }
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

    /// `fi_cq_export_xpu` with a ring of `slots` slots (a power of two, 2 to 65536), in
    /// heap memory for the CPU XPU, in device-visible host memory from the domain's doorbell
    /// source for a CUDA or Level Zero XPU (`prov_ctx` is then its device address; a queue
    /// opened outside a domain has no such source: `OpNotSupp`). One XPU per queue. From
    /// then on, entries move to the ring as they come, while it has room; the rest wait here,
    /// in order, and move as the XPU makes room (any `FI_XPU_TRIGGER` endpoint's watcher
    /// looks, or a CPU XPU's read finds the ring empty). Host
    /// reads still work but see only what has not moved: read from one side. Error data is
    /// not carried to the ring. Exporting again returns another handle on the same ring.
    pub fn export_xpu_slots(&self, xpu: Xpu, slots: usize) -> Result<XpuCq> {
        let what = "cq_export_xpu";
        super::mem::exportable(what, xpu)?;
        if !(2..=65536).contains(&slots) || !slots.is_power_of_two() {
            return Err(Error::Inval(format!(
                "cq_export_xpu: {slots} slots; a power of two from 2 to 65536"
            )));
        }
        let inner = self.inner();
        let shared = match inner.xpu.get() {
            Some(x) => x.clone(),
            None => {
                let alloc = inner.xpu_mem.get().cloned();
                let fresh =
                    CqExport::new(inner, slots, self.format() as u32, xpu, alloc.as_deref())?;
                // Another thread's export may have come first: its ring is the one.
                let mut first = false;
                let shared = inner
                    .xpu
                    .get_or_init(|| {
                        first = true;
                        fresh
                    })
                    .clone();
                if first {
                    EXPORTED.add(Arc::downgrade(inner));
                }
                shared
            }
        };
        if shared.xpu != xpu {
            return Err(Error::Inval(format!(
                "{what}: the queue is exported to {:?} already (one XPU per queue)",
                shared.xpu
            )));
        }
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
