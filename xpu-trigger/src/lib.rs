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
//! Ringing is the XPU's side: xfabric-kernels has the device function GPU kernels include and
//! the CPU-XPU equivalent (`xfabric_kernels::cpu::ring`).

#![warn(missing_docs)]

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use xfabric_core::xpu::{XpuMem, XpuMemAlloc, XPU_MEM_ALIGN};
use xfabric_core::{Error, Result};
use xfabric_hmem::{Hmem, HostMapped};

pub use xfabric_core::{
    notify_xpu_ring, Doorbell, DoorbellAlloc, Iface, Signal, TriggerValue, TriggerVar, TriggerXpu,
    Xpu, XpuDevice, XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED,
};

/// Bytes allocated per device doorbell: a page, the unit every driver maps in.
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
        if xpu.iface == Iface::System {
            return Ok(Box::new(HeapBell(AtomicU64::new(0))));
        }
        let mem = Hmem::global()
            .get(xpu.iface)
            .alloc_host_mapped(xpu.device, BELL_BYTES)?;
        // Zero-filled by contract; the word is the allocation's first.
        mem.atomic_u64(0)
            .ok_or_else(|| Error::NoMem("XPU trigger: doorbell allocation too small".into()))?;
        Ok(Box::new(MappedBell(mem)))
    }

    fn memory(&self) -> Option<Arc<dyn XpuMemAlloc>> {
        static ONE: OnceLock<Arc<dyn XpuMemAlloc>> = OnceLock::new();
        Some(ONE.get_or_init(|| Arc::new(HmemXpuMem)).clone())
    }
}

/// The device API's shared blocks (descriptor rings, exported CQs' rings, counter mirrors)
/// for GPU XPUs: xfabric-hmem's device-visible host memory, as for doorbells. The host reads
/// through the host address; handles carry the device address.
#[derive(Debug, Default)]
pub struct HmemXpuMem;

impl XpuMemAlloc for HmemXpuMem {
    fn alloc(&self, xpu: Xpu, len: usize) -> Result<Box<dyn XpuMem>> {
        HmemDoorbells.check(xpu)?;
        let mem = Hmem::global()
            .get(xpu.iface)
            .alloc_host_mapped(xpu.device, len)?;
        let host = NonNull::new(mem.as_ptr())
            .ok_or_else(|| Error::NoMem("XPU shared block: null allocation".into()))?;
        // Page-aligned by contract; checked, since the layouts need it.
        if !(host.as_ptr() as usize).is_multiple_of(XPU_MEM_ALIGN) || mem.len() < len {
            return Err(Error::NoMem(format!(
                "XPU shared block: {} bytes at {:p}, wanted {len} aligned to {XPU_MEM_ALIGN}",
                mem.len(),
                host.as_ptr()
            )));
        }
        Ok(Box::new(MappedBlock { mem, host }))
    }
}

/// A shared block in device-visible host memory.
struct MappedBlock {
    mem: HostMapped,
    host: NonNull<u8>,
}

// SAFETY: `host` is `mem`'s own address (HostMapped is Send + Sync), valid while `mem` lives.
unsafe impl Send for MappedBlock {}
// SAFETY: as above.
unsafe impl Sync for MappedBlock {}

impl XpuMem for MappedBlock {
    fn host_ptr(&self) -> NonNull<u8> {
        self.host
    }
    fn xpu_addr(&self) -> u64 {
        self.mem.device_addr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
}

/// A doorbell: the first word of a device-visible host page.
/// A CPU XPU's doorbell: a word of this process's heap on a cache line of its own, which the
/// XPU's thread stores to directly. Nothing else maps it: a memfd per doorbell (what
/// `alloc_host_mapped` gives host memory) kept a descriptor and a mapping per closed endpoint
/// until its domain closed (`Retired`), and a domain that opened and closed endpoints ran out
/// of descriptors after about a thousand.
#[repr(align(64))]
struct HeapBell(AtomicU64);

impl Doorbell for HeapBell {
    fn word(&self) -> &AtomicU64 {
        &self.0
    }

    fn xpu_addr(&self) -> usize {
        &self.0 as *const AtomicU64 as usize
    }
}

struct MappedBell(HostMapped);

impl Doorbell for MappedBell {
    fn word(&self) -> &AtomicU64 {
        self.0.atomic_u64(0).expect("checked at allocation")
    }

    fn xpu_addr(&self) -> usize {
        self.0.device_addr() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn cpu_doorbells_read_zero_and_are_host_addresses() {
        let d = doorbells();
        d.check(Xpu::CPU).unwrap();
        let b = d.alloc(Xpu::CPU).unwrap();
        assert_eq!(b.word().load(Ordering::Acquire), 0);
        assert_eq!(b.xpu_addr(), b.word() as *const AtomicU64 as usize);
    }

    /// A CPU XPU's doorbells hold no descriptor: a domain keeps every closed endpoint's until
    /// it closes (an XPU may store to one late), and a memfd each ran a long-lived domain out
    /// of descriptors.
    #[test]
    fn cpu_doorbells_hold_no_file_descriptors() {
        let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let d = doorbells();
        let before = fds();
        let kept: Vec<_> = (0..500).map(|_| d.alloc(Xpu::CPU).unwrap()).collect();
        let after = fds();
        // Other tests' threads may open a few meanwhile; 500 would not fit this margin.
        assert!(after < before + 50, "{before} descriptors, then {after}");
        for b in &kept {
            assert_eq!(b.xpu_addr() % 64, 0, "a cache line each");
        }
    }

    #[test]
    fn memory_for_an_unsupported_xpu_says_why() {
        // The CPU XPU's blocks are core's heap memory; the allocator serves GPUs, and says
        // why where none is.
        let m = doorbells().memory().expect("hmem doorbells supply memory");
        let rocr = Xpu {
            iface: Iface::Rocr,
            device: 0,
        };
        let e = m.alloc(rocr, 4096).err().expect("no ROCr here");
        assert!(matches!(e, Error::OpNotSupp(_)), "{e}");
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
}
