//! Where the device API's shared blocks live: memory both the host and an XPU reach.
//!
//! A CPU XPU is a thread of this process: its blocks are ordinary heap memory (`HeapMem`). A
//! GPU's are mapped page-locked host memory, which core cannot make itself (it knows no
//! driver): the domain supplies an allocator (`XpuMemAlloc`, through its doorbell source,
//! `DoorbellAlloc::memory`), as it supplies doorbells; xfabric-xpu-trigger implements it over
//! xfabric-hmem's `alloc_host_mapped`. Each block has two addresses: the host's, which the
//! watcher reads through, and the XPU's, which a handle's `prov_ctx` and every address inside
//! a block that the XPU follows carry.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::hmem_iface::Iface;
use crate::trigger::Xpu;

/// Alignment every shared block has at least (a cache line: the layouts in `abi` ask for it).
pub const XPU_MEM_ALIGN: usize = 64;

/// `Ok` if objects may be exported to `xpu`'s interface: the CPU XPU, CUDA and Level Zero
/// (their blocks in device-visible host memory). The rest answer `OpNotSupp`.
pub(crate) fn exportable(what: &str, xpu: Xpu) -> Result<()> {
    match xpu.iface {
        Iface::System | Iface::Cuda | Iface::Ze => Ok(()),
        other => Err(Error::OpNotSupp(format!(
            "{what}: {other:?}: the device API serves the CPU XPU (FI_HMEM_SYSTEM), CUDA \
             (FI_HMEM_CUDA) and Level Zero (FI_HMEM_ZE)"
        ))),
    }
}

/// One allocation both the host and an XPU reach, zero-filled when made, freed when dropped.
pub trait XpuMem: Send + Sync {
    /// The host's address of the first byte, `XPU_MEM_ALIGN`-aligned, valid for `len` bytes
    /// of reads and writes (racing with the XPU: every shared word is accessed atomically)
    /// while this value lives.
    fn host_ptr(&self) -> NonNull<u8>;
    /// The XPU's address of the same first byte (a device pointer for a GPU; the host address
    /// for a CPU thread).
    fn xpu_addr(&self) -> u64;
    /// Bytes, at least what was asked for.
    fn len(&self) -> usize;
    /// Never: empty allocations are refused.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Blocks kept at which `Retired` says so, once.
const RETIRED_SAID: usize = 1024;

/// The shared blocks of a domain's closed objects (an endpoint's descriptor rings, an exported
/// CQ's ring, an exported counter's mirror), kept until the domain and everything opened in it
/// are gone. fi_xpu(3) asks the XPU to stop using a handle before the host closes its object;
/// a kernel still running when the host tears down does not, and its calls must then reach
/// memory that is still there (a closed ring answers `-FI_ESHUTDOWN`, a CQ's ring holds what it
/// held), never memory given back to the allocator or unmapped. What an application that
/// opens and closes endpoints in one long-lived domain pays: each export's block (192 KiB
/// for an endpoint's default ring) until that domain closes.
#[derive(Default)]
pub struct Retired {
    blocks: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Retired {
    /// Keeps `block` (an `Arc` of what owns the memory) until this domain goes.
    pub(crate) fn keep(&self, block: Arc<dyn Any + Send + Sync>) {
        let mut b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        b.push(block);
        if b.len() == RETIRED_SAID {
            tracing::warn!(
                "xpu: {RETIRED_SAID} shared blocks of closed objects kept until their domain closes (an application opening and closing exported objects in one domain); they go with the domain"
            );
        }
    }
}

/// Makes shared blocks for XPUs other than the CPU one; a domain supplies it
/// (`DoorbellAlloc::memory`).
pub trait XpuMemAlloc: Send + Sync {
    /// `len` zero-filled bytes both the host and `xpu` reach; `OpNotSupp` saying why where
    /// `xpu` has none.
    fn alloc(&self, xpu: Xpu, len: usize) -> Result<Box<dyn XpuMem>>;
}

/// Ordinary heap memory: a CPU XPU's shared blocks.
pub(crate) struct HeapMem {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value and not tied to a thread; shared access goes
// through atomics (the blocks' layouts) only.
unsafe impl Send for HeapMem {}
// SAFETY: as above.
unsafe impl Sync for HeapMem {}

impl HeapMem {
    fn new(what: &str, len: usize) -> Result<HeapMem> {
        let layout = Layout::from_size_align(len.max(1), XPU_MEM_ALIGN)
            .map_err(|e| Error::Inval(format!("{what}: {len} bytes: {e}")))?;
        // SAFETY: the layout's size is non-zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::NoMem(format!("{what}: {len} bytes of shared memory")))?;
        Ok(HeapMem { ptr, layout })
    }
}

impl Drop for HeapMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl XpuMem for HeapMem {
    fn host_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn xpu_addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

/// A shared block: its memory, checked once when made.
pub(crate) struct Block {
    /// Owns the allocation (dropping the block frees it).
    _mem: Box<dyn XpuMem>,
    /// The host address (`mem.host_ptr()`, kept: the allocator is not asked again).
    host: NonNull<u8>,
    /// The XPU's address of the first byte.
    xpu: u64,
    /// Bytes asked for (the allocation may be larger).
    len: usize,
}

// SAFETY: `host` is the address of `mem`'s allocation, which is `Send + Sync` and lives as
// long as the block; every shared access through it is atomic (the layouts in `abi`).
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// `len` zero-filled bytes for `xpu`: heap memory for the CPU XPU, `alloc`'s otherwise
    /// (`OpNotSupp` without one). What the allocator hands back is checked (length,
    /// alignment, an XPU range that does not wrap) before anything is written to it.
    pub(crate) fn new(
        what: &str,
        xpu: Xpu,
        alloc: Option<&dyn XpuMemAlloc>,
        len: usize,
    ) -> Result<Block> {
        if len == 0 {
            return Err(Error::Inval(format!("{what}: empty shared block")));
        }
        let mem: Box<dyn XpuMem> = match (xpu.iface, alloc) {
            (Iface::System, _) => Box::new(HeapMem::new(what, len)?),
            (_, Some(a)) => a.alloc(xpu, len)?,
            (iface, None) => {
                return Err(Error::OpNotSupp(format!(
                    "{what}: {iface:?}: this object's domain supplies no memory for that XPU \
                     (opened outside a domain, or its provider offers no FI_XPU_TRIGGER)"
                )))
            }
        };
        let host = mem.host_ptr();
        let dev = mem.xpu_addr();
        let aligned = (host.as_ptr() as usize).is_multiple_of(XPU_MEM_ALIGN)
            && dev.is_multiple_of(XPU_MEM_ALIGN as u64);
        let fits = mem.len() >= len && dev != 0 && dev.checked_add(len as u64).is_some();
        if !aligned || !fits {
            return Err(Error::Inval(format!(
                "{what}: the allocator for {xpu:?} returned {} bytes at host {:p}, XPU {dev:#x}; \
                 need {len} bytes, {XPU_MEM_ALIGN}-aligned",
                mem.len(),
                host.as_ptr()
            )));
        }
        Ok(Block {
            _mem: mem,
            host,
            xpu: dev,
            len,
        })
    }

    /// The host's address of byte `off` (`off` <= the length asked for; callers pass offsets
    /// of their own layout).
    pub(crate) fn host_at(&self, off: usize) -> *mut u8 {
        assert!(
            off <= self.len,
            "offset {off} past a {}-byte block",
            self.len
        );
        // SAFETY: within the allocation (checked just above).
        unsafe { self.host.as_ptr().add(off) }
    }

    /// The XPU's address of byte `off` (no wrap: checked when made).
    pub(crate) fn xpu_at(&self, off: usize) -> u64 {
        assert!(
            off <= self.len,
            "offset {off} past a {}-byte block",
            self.len
        );
        self.xpu + off as u64
    }

    /// Whether the XPU's addresses are the host's (a CPU XPU; a GPU under unified
    /// addressing): only then may the host follow the addresses a block holds for the XPU.
    pub(crate) fn host_reachable(&self) -> bool {
        self.xpu == self.host.as_ptr() as usize as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocator handing back what it is told to, over one real heap block.
    struct Liar {
        host_off: usize,
        xpu: u64,
        len: usize,
    }

    struct LiarMem(HeapMem, usize, u64, usize);

    impl XpuMem for LiarMem {
        fn host_ptr(&self) -> NonNull<u8> {
            // SAFETY: within the 256-byte heap block (offsets used are < 64).
            unsafe { NonNull::new_unchecked(self.0.ptr.as_ptr().add(self.1)) }
        }
        fn xpu_addr(&self) -> u64 {
            self.2
        }
        fn len(&self) -> usize {
            self.3
        }
    }

    impl XpuMemAlloc for Liar {
        fn alloc(&self, _xpu: Xpu, _len: usize) -> Result<Box<dyn XpuMem>> {
            let h = HeapMem::new("test", 256)?;
            Ok(Box::new(LiarMem(h, self.host_off, self.xpu, self.len)))
        }
    }

    const GPU: Xpu = Xpu {
        iface: Iface::Cuda,
        device: 0,
    };

    #[test]
    fn what_an_allocator_hands_back_is_checked() {
        let ok = Liar {
            host_off: 0,
            xpu: 1 << 40,
            len: 256,
        };
        let b = Block::new("t", GPU, Some(&ok), 256).unwrap();
        assert_eq!(b.xpu_at(64), (1 << 40) + 64);
        assert!(!b.host_reachable());
        for bad in [
            Liar { len: 128, ..ok },
            Liar { host_off: 8, ..ok },
            Liar {
                xpu: (1 << 40) + 8,
                ..ok
            },
            Liar { xpu: 0, ..ok },
            Liar {
                xpu: u64::MAX - 63,
                ..ok
            },
        ] {
            assert!(matches!(
                Block::new("t", GPU, Some(&bad), 256),
                Err(Error::Inval(_))
            ));
        }
        // No allocator: only the CPU XPU; nothing empty.
        assert!(matches!(
            Block::new("t", GPU, None, 64),
            Err(Error::OpNotSupp(_))
        ));
        let cpu = Block::new("t", Xpu::CPU, None, 64).unwrap();
        assert!(cpu.host_reachable());
        assert!(Block::new("t", Xpu::CPU, None, 0).is_err());
    }
}
