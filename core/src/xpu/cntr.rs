//! An exported counter: its values mirrored where an XPU reads them, and a descriptor ring
//! through which the XPU adds and sets.
//!
//! Every change of the counter (a completion, the application's add or set, the XPU's own)
//! stores both values into the mirror, under a small lock that reads the values inside it, so
//! the last store is always the newest values. `fi_xpu_cntr_wait` spins on the mirror in the
//! XPU's own memory. `fi_xpu_cntr_add` and friends post a descriptor on the counter's ring,
//! which the watcher drains as it drains endpoints' rings: any endpoint opened with
//! `FI_XPU_TRIGGER` in the process looks at every exported counter's ring when it runs.

use std::mem::size_of;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::abi::{opcode, CntrMirror, FidXpu, FI_CLASS_CNTR, FI_XPU_PROV_XFABRIC};
use super::exports::Exports;
use super::mem::Block;
use super::ring::{DescRing, Taken, RING_DEFAULT_SLOTS};
use crate::cntr::{CntrInner, Counter};
use crate::error::{Error, Result};
use crate::trigger::Xpu;
use crate::trigger::DRAIN_MAX;

/// The host's side of an exported counter.
pub(crate) struct CntrExport {
    /// One `CntrMirror`, where the XPU reads it.
    mirror: Arc<Block>,
    ring: Arc<DescRing>,
    /// The XPU it was exported to (one per counter).
    xpu: Xpu,
    /// Orders mirror stores (see the module's comment).
    lock: Mutex<()>,
    /// One drainer at a time, with what it last logged of refused descriptors.
    drain: Mutex<Refused>,
    cntr: Weak<CntrInner>,
}

/// Every exported counter of the process, for the watchers to drain.
static EXPORTED: Exports<CntrExport> = Exports::new();

impl Drop for CntrExport {
    fn drop(&mut self) {
        EXPORTED.gone();
    }
}

impl CntrExport {
    /// Stores the values `read` returns into the mirror (read under the lock).
    pub(crate) fn mirror(&self, read: impl Fn() -> (u64, u64)) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let (v, e) = read();
        let m = self.shared();
        m.value.store(v, Ordering::Release);
        m.err.store(e, Ordering::Release);
    }

    /// The mirror, through the host's address.
    pub(crate) fn shared(&self) -> &CntrMirror {
        // SAFETY: written in `make`, alive and aligned as long as `self`; its shared words are
        // atomics.
        unsafe { &*self.mirror.host_at(0).cast::<CntrMirror>() }
    }

    /// Whether the XPU's addresses (the mirror's and its ring's) are the host's.
    pub(crate) fn host_reachable(&self) -> bool {
        self.mirror.host_reachable() && self.ring.host_reachable()
    }

    /// The export of `inner` to `xpu`: a mirror and a ring in memory `xpu` reaches.
    fn make(inner: &Arc<CntrInner>, xpu: Xpu) -> Result<CntrExport> {
        let what = "cntr_export_xpu";
        let alloc = inner.xpu_mem.get().cloned();
        let ring = DescRing::new(RING_DEFAULT_SLOTS, xpu, alloc.as_deref())?;
        let mirror = Arc::new(Block::new(
            what,
            xpu,
            alloc.as_deref(),
            size_of::<CntrMirror>(),
        )?);
        // SAFETY: zero-filled, 64 bytes, 64-aligned (Block checks), not shared yet.
        unsafe {
            mirror
                .host_at(0)
                .cast::<CntrMirror>()
                .write(CntrMirror::new(ring.ctx()))
        };
        // Counted from here: its drop uncounts it, also when another export came first.
        EXPORTED.born();
        Ok(CntrExport {
            mirror,
            ring,
            xpu,
            lock: Mutex::new(()),
            drain: Mutex::new(Refused::default()),
            cntr: Arc::downgrade(inner),
        })
    }

    /// Applies what the XPU posted on the counter's ring, at most `DRAIN_MAX` descriptors
    /// a call (an XPU adding as fast as they are taken must not hold the drainer, whose
    /// progress serves every endpoint); returns how many.
    /// The mirror's and the ring's memory, for the counter's domain to keep once the counter
    /// is gone (`Retired`), the ring closed (a late add answers `-FI_ESHUTDOWN`): the export
    /// itself goes, so no watcher looks at it again.
    pub(crate) fn retire(&self) -> [Arc<dyn std::any::Any + Send + Sync>; 2] {
        // The ring's consumer is whoever holds `drain`: one that found the counter gone closes
        // it too.
        let _g = self.drain.lock().unwrap_or_else(|e| e.into_inner());
        self.ring.close_unreported();
        [self.mirror.clone(), self.ring.clone()]
    }

    fn drain(&self) -> usize {
        // Taken before the lock, so that it is dropped after it: where this is the counter's
        // last reference (its handle closed meanwhile), the counter's drop retires this
        // export (`retire`), which takes the lock itself.
        let counter = self.cntr.upgrade();
        let Ok(mut refused) = self.drain.try_lock() else {
            return 0;
        };
        let Some(c) = counter.as_ref() else {
            self.ring.close_unreported();
            return 0;
        };
        let mut n = 0;
        while n < DRAIN_MAX {
            let Some(t) = self.ring.take() else { break };
            n += 1;
            match t {
                Taken::Desc(d) if d.opcode == opcode::CNTR_ADD => c.add_value(d.data),
                Taken::Desc(d) if d.opcode == opcode::CNTR_SET => c.set_value(d.data),
                Taken::Desc(d) if d.opcode == opcode::CNTR_ADDERR => c.add_err_value(d.data),
                Taken::Desc(d) if d.opcode == opcode::CNTR_SETERR => c.set_err_value(d.data),
                // A counter has no completion queue: a descriptor it cannot take counts as an
                // error, which ends any fi_xpu_cntr_wait, and is logged with what it was.
                other => {
                    refused.note(&other);
                    c.add_err_value(1);
                }
            }
        }
        n
    }
}

/// Descriptors an exported counter's ring refused, logged at most once a second (an XPU that
/// posts garbage as fast as it is drained must not fill the log): the first one whole, then
/// how many came since.
#[derive(Default)]
struct Refused {
    last_log: Option<std::time::Instant>,
    since: u64,
}

impl Refused {
    /// Counts `what`; whether it was logged.
    fn note(&mut self, what: &Taken) -> bool {
        self.since += 1;
        let now = std::time::Instant::now();
        if self
            .last_log
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1))
        {
            return false;
        }
        tracing::warn!(
            last = ?what,
            refused = self.since,
            "exported counter: descriptors refused since the last report"
        );
        self.last_log = Some(now);
        self.since = 0;
        true
    }
}

/// Whether any exported counter lives (the watcher then keeps looking).
pub(crate) fn any() -> bool {
    EXPORTED.any()
}

/// Drains every exported counter's ring; returns how many descriptors were applied.
pub(crate) fn drain_all() -> usize {
    if !EXPORTED.any() {
        return 0;
    }
    EXPORTED.alive().iter().map(|x| x.drain()).sum()
}

/// The next slot's publishing words of every exported counter's ring, for a watcher's spin.
pub(crate) fn any_ready() -> bool {
    EXPORTED.any_where(|x| x.ring.ready())
}

/// `struct fid_xpu_cntr` and what keeps its shared memory alive. Its head is `struct fid_xpu`
/// exactly; `prov_ctx` is the address of its `CntrMirror`.
#[repr(C)]
pub struct XpuCntr {
    fid: FidXpu,
    shared: Arc<CntrExport>,
    xpu: Xpu,
}

impl XpuCntr {
    /// One drain of this counter's ring, as a watcher's.
    #[cfg(test)]
    pub(crate) fn drain_once(&self) -> usize {
        self.shared.drain()
    }

    /// The `struct fid_xpu` a device's header reads.
    pub fn fid(&self) -> &FidXpu {
        &self.fid
    }

    /// The XPU it was exported to.
    pub fn xpu(&self) -> Xpu {
        self.xpu
    }

    pub(crate) fn mirror(&self) -> &CntrMirror {
        self.shared.shared()
    }

    pub(crate) fn ring(&self) -> &DescRing {
        &self.shared.ring
    }

    pub(crate) fn host_reachable(&self) -> bool {
        self.shared.host_reachable()
    }
}

impl Counter {
    /// `fi_cntr_export_xpu`: a handle through which `xpu` reads this counter's values from
    /// its own memory (`xpu::device::cntr_read`, `cntr_wait`) and adds or sets them
    /// (`cntr_add`, `cntr_set`...). Exporting again returns another handle on the same mirror.
    /// The CPU XPU's mirror and ring are heap memory; a CUDA or Level Zero XPU's are
    /// device-visible host memory from the domain's doorbell source (`prov_ctx` and the mirror's `ring` are device
    /// addresses). One XPU per counter.
    pub fn export_xpu(&self, xpu: Xpu) -> Result<XpuCntr> {
        let what = "cntr_export_xpu";
        super::mem::exportable(what, xpu)?;
        let inner = self.inner();
        let shared = match inner.xpu.get() {
            Some(x) => x.clone(),
            None => {
                let made = CntrExport::make(inner, xpu)?;
                let mut fresh = None;
                let x = inner
                    .xpu
                    .get_or_init(|| {
                        let x = Arc::new(made);
                        fresh = Some(x.clone());
                        x
                    })
                    .clone();
                if let Some(f) = fresh {
                    EXPORTED.add(Arc::downgrade(&f));
                }
                x
            }
        };
        if shared.xpu != xpu {
            return Err(Error::Inval(format!(
                "{what}: the counter is exported to {:?} already (one XPU per counter)",
                shared.xpu
            )));
        }
        shared.mirror(|| (inner.value(), inner.err_value()));
        Ok(XpuCntr {
            fid: FidXpu {
                fclass: FI_CLASS_CNTR,
                prov_id: FI_XPU_PROV_XFABRIC,
                prov_ctx: shared.mirror.xpu_at(0),
            },
            shared,
            xpu,
        })
    }
}

#[cfg(test)]
mod refused_tests {
    use super::*;

    /// A counter's ring flooded with refused descriptors logs once, not once each; a second
    /// later the next one is logged again, with how many came since.
    #[test]
    fn refused_descriptors_are_logged_at_most_once_a_second() {
        let mut r = Refused::default();
        let bad = Taken::Desc(super::super::abi::XpuDesc::default());
        assert_eq!((0..10_000).filter(|_| r.note(&bad)).count(), 1);
        assert_eq!(r.since, 9_999);
        r.last_log = Some(std::time::Instant::now() - std::time::Duration::from_secs(2));
        assert!(r.note(&bad));
        assert_eq!(r.since, 0);
    }
}
