//! xfabric-xpu-trigger: where XPU-triggered operations' doorbells live, and how an XPU rings
//! them.
//!
//! An endpoint opened with `FI_TRIGGER | FI_XPU_TRIGGER` arms operations on one 64-bit
//! doorbell per XPU (xfabric-core's `trigger::xpu` watches them and starts what they reach).
//! This crate supplies the doorbells: a page of host memory the named XPU can store to and the
//! host can poll, from xfabric-hmem's device-visible host allocation —
//! `cuMemHostAlloc(DEVICEMAP)` for CUDA, `zeMemAllocHost` for Level Zero, anonymous pages for
//! a CPU thread. The variable handed to the application carries the XPU's address for it
//! (a device pointer for a GPU).
//!
//! [`ring`] is the CPU XPU's side: it stores filled variables in order, as a GPU kernel does
//! with xfabric-kernels' device function.

use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use xfabric_core::{Error, Result};
use xfabric_hmem::{Hmem, HostMapped};

pub use xfabric_core::{
    Doorbell, DoorbellAlloc, Iface, Signal, TriggerValue, TriggerVar, TriggerXpu, Xpu, XpuDevice,
    XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED,
};

/// Bytes allocated per doorbell: a page, the unit every driver maps in.
const BELL_BYTES: usize = 4096;

/// Doorbells from xfabric-hmem's device-visible host memory; what providers hand their
/// domains (`DomainOps::xpu_doorbells`).
#[derive(Debug, Default)]
pub struct HmemDoorbells;

/// The process's doorbell source.
pub fn doorbells() -> Arc<dyn DoorbellAlloc> {
    static ONE: OnceLock<Arc<dyn DoorbellAlloc>> = OnceLock::new();
    ONE.get_or_init(|| Arc::new(HmemDoorbells)).clone()
}

impl DoorbellAlloc for HmemDoorbells {
    fn check(&self, xpu: Xpu) -> Result<()> {
        let what = "XPU trigger";
        if !xpu.iface.is_implemented() {
            return Err(Error::OpNotSupp(format!(
                "{what}: {} XPUs are not supported (system, cuda and ze are)",
                xpu.iface
            )));
        }
        let i = Hmem::global().get(xpu.iface);
        if let Err(why) = i.available() {
            return Err(Error::OpNotSupp(format!(
                "{what}: {} is unavailable here: {why}",
                xpu.iface
            )));
        }
        if !i.devices().iter().any(|d| d.index == xpu.device) {
            return Err(Error::OpNotSupp(format!(
                "{what}: {} has no device {}",
                xpu.iface, xpu.device
            )));
        }
        Ok(())
    }

    fn alloc(&self, xpu: Xpu) -> Result<Box<dyn Doorbell>> {
        let mem = Hmem::global()
            .get(xpu.iface)
            .alloc_host_mapped(xpu.device, BELL_BYTES)?;
        // Zero-filled by contract; the word is the allocation's first.
        mem.atomic_u64(0)
            .ok_or_else(|| Error::NoMem("XPU trigger: doorbell allocation too small".into()))?;
        Ok(Box::new(MappedBell(mem)))
    }
}

/// A doorbell: the first word of a device-visible host page.
struct MappedBell(HostMapped);

impl Doorbell for MappedBell {
    fn word(&self) -> &AtomicU64 {
        self.0.atomic_u64(0).expect("checked at allocation")
    }

    fn xpu_addr(&self) -> usize {
        self.0.device_addr() as usize
    }
}

/// Rings filled trigger variables from a CPU thread (an XPU of iface `System`): stores each
/// variable's value at its address, in order, each store a release store, so everything the
/// thread wrote before is visible to whoever sees the doorbell. An error (nothing stored from
/// that variable on) for a variable that is not a valid trigger.
///
/// # Safety
/// Each variable must be one an endpoint filled for a CPU XPU (its `addr` is a live doorbell
/// of that endpoint), or otherwise point to memory valid for an atomic store of its width; for
/// byte arrays, `value.data` must point to `count` readable bytes.
pub unsafe fn ring(vars: &[TriggerVar]) -> Result<()> {
    for (i, v) in vars.iter().enumerate() {
        // SAFETY: the caller's contract covers `data`.
        let Some(sig) = (unsafe { v.signal() }) else {
            return Err(Error::Inval(format!(
                "ring: variable {i} has datatype {} count {}; not a trigger variable",
                v.datatype, v.count
            )));
        };
        if v.addr.is_null() {
            return Err(Error::Inval(format!("ring: variable {i} has no address")));
        }
        let a = v.addr;
        // SAFETY: the caller's contract: `addr` is valid for an atomic store of this width,
        // and a doorbell is aligned to its width.
        unsafe {
            match sig {
                Signal::U8(x) => (*a.cast::<AtomicU8>()).store(x, Ordering::Release),
                Signal::U16(x) => (*a.cast::<AtomicU16>()).store(x, Ordering::Release),
                Signal::U32(x) => (*a.cast::<AtomicU32>()).store(x, Ordering::Release),
                Signal::U64(x) => (*a.cast::<AtomicU64>()).store(x, Ordering::Release),
                Signal::Bytes(b) => {
                    fence(Ordering::Release);
                    for (k, byte) in b.iter().enumerate() {
                        (*a.cast::<AtomicU8>().add(k)).store(*byte, Ordering::Release);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_doorbells_read_zero_and_are_host_addresses() {
        let d = doorbells();
        d.check(Xpu::CPU).unwrap();
        let b = d.alloc(Xpu::CPU).unwrap();
        assert_eq!(b.word().load(Ordering::Acquire), 0);
        assert_eq!(b.xpu_addr(), b.word() as *const AtomicU64 as usize);
    }

    #[test]
    fn unsupported_xpus_say_why() {
        let d = doorbells();
        let rocr = Xpu {
            iface: Iface::Rocr,
            device: 0,
        };
        let e = d.check(rocr).unwrap_err();
        assert!(matches!(e, Error::OpNotSupp(_)), "{e}");
        assert!(e.to_string().contains("rocr"), "{e}");
        let e = d
            .check(Xpu {
                iface: Iface::System,
                device: 3,
            })
            .unwrap_err();
        assert!(e.to_string().contains("no device 3"), "{e}");
    }

    #[test]
    fn ring_stores_each_width_in_order() {
        let d = doorbells();
        let b = d.alloc(Xpu::CPU).unwrap();
        let base = b.xpu_addr() as *mut u8;
        let bytes = [9u8, 8, 7];
        let mut vars = [TriggerVar::default(); 5];
        let kinds = [(1, 1), (3, 1), (5, 1), (7, 1), (1, 3)];
        for (i, (v, (dt, n))) in vars.iter_mut().zip(kinds).enumerate() {
            v.datatype = dt;
            v.count = n;
            // SAFETY: inside the doorbell's page, each at an 8-byte-aligned offset.
            v.addr = unsafe { base.add(8 * (i + 1)) }.cast();
        }
        vars[0].value.val8 = 0xa1;
        vars[1].value.val16 = 0xb2b2;
        vars[2].value.val32 = 0xc3c3_c3c3;
        vars[3].value.val64 = 0xd4d4_d4d4_d4d4_d4d4;
        vars[4].value.data = bytes.as_ptr().cast_mut();
        // SAFETY: every address is inside the live page; `bytes` outlives the call.
        unsafe { ring(&vars).unwrap() };
        // SAFETY: reads of the page written above.
        unsafe {
            assert_eq!(*base.add(8), 0xa1);
            assert_eq!(*base.add(16).cast::<u16>(), 0xb2b2);
            assert_eq!(*base.add(24).cast::<u32>(), 0xc3c3_c3c3);
            assert_eq!(*base.add(32).cast::<u64>(), 0xd4d4_d4d4_d4d4_d4d4);
            assert_eq!(std::slice::from_raw_parts(base.add(40), 3), &bytes);
        }
        let mut bad = [TriggerVar::default()];
        bad[0].datatype = 9;
        // SAFETY: rejected before any store.
        assert!(matches!(unsafe { ring(&bad) }, Err(Error::Inval(_))));
    }
}
