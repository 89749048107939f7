//! `FI_HMEM_SYSTEM`: host memory. Always available; registration is a no-op (as libfabric's
//! `ofi_hmem_register_noop`), copies are `memcpy`, and "device-visible" host memory is host
//! pages a CPU XPU (a thread, an FPGA polling host memory) reaches directly.
//!
//! Those device-visible allocations (`alloc_host_mapped`) are sealed memfds (`memfd`), so
//! they have IPC handles as device memory does: `ipc_get` exports the one holding a range, and
//! `ipc_open` maps another process's read-only, for shm to copy a message straight out of the
//! sender's buffer. Other host memory (the heap, `alloc_device`'s staging pages, anonymous
//! pages where the kernel gives no memfds) has none: shm reaches it by cross-memory attach.
//! Being a shared mapping, such an allocation is shared with a child the process forks, not
//! copied on write.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{DropErrors, HmemError, Unavailable};
use crate::mem::{DeviceBuffer, HostMapped, IpcHandle, IpcMapping};
use crate::memfd::{self, Pages, Unmap};
use crate::{check_len, page_size, DeviceInfo, HmemIface, Iface, Owner, Result};

/// The host-memory interface.
#[derive(Debug, Default)]
pub struct System {
    errors: Arc<DropErrors>,
}

impl System {
    /// The interface (no probing needed).
    pub fn new() -> Self {
        Self::default()
    }

    fn check_device(op: &'static str, device: u64) -> Result<()> {
        if device != 0 {
            return Err(HmemError::inval(
                op,
                format!("host memory has only device 0, not {device}"),
            ));
        }
        Ok(())
    }

    /// `len` in whole pages; zero and overflowing lengths refused.
    fn page_len(op: &'static str, len: usize) -> Result<usize> {
        check_len(op, len)?;
        len.checked_next_multiple_of(page_size())
            .ok_or_else(|| HmemError::inval(op, format!("{len} bytes is too large")))
    }

    /// Zero-filled, page-aligned pages another process can map (`ipc_get`): a sealed memfd,
    /// or anonymous pages where this kernel gives none.
    fn shared_pages(op: &'static str, len: usize) -> Result<Pages> {
        match memfd::alloc(op, Self::page_len(op, len)?)? {
            Some(mapped) => Ok(mapped),
            None => Self::map_pages(op, len),
        }
    }

    /// Anonymous, zero-filled, page-aligned pages.
    fn map_pages(op: &'static str, len: usize) -> Result<Pages> {
        let map_len = Self::page_len(op, len)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HmemError::last_os("mmap"));
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| HmemError::inval(op, "mmap gave null"))?;
        Ok((
            ptr,
            Box::new(Unmap {
                addr: ptr.as_ptr() as usize,
                len: map_len,
            }),
        ))
    }

    /// The handle of the shareable allocation holding `addr..addr + len`, or `None` (not
    /// such memory, or a range running past one): `ipc_get` without building an error, for
    /// a caller asking about every large message it sends.
    pub fn export(&self, addr: *const u8, len: usize) -> Option<IpcHandle> {
        if len == 0 {
            return None;
        }
        memfd::find(addr, len)
    }

    /// Whether `export` would give a handle for `addr..addr + len` (cheaper: no handle made).
    pub fn exportable(&self, addr: *const u8, len: usize) -> bool {
        len != 0 && memfd::holds(addr, len)
    }
}

impl HmemIface for System {
    fn iface(&self) -> Iface {
        Iface::System
    }

    fn available(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        vec![DeviceInfo {
            index: 0,
            name: "host memory".into(),
        }]
    }

    fn owns(&self, _addr: *const u8) -> Result<Option<Owner>> {
        Ok(Some(Owner::SYSTEM))
    }

    unsafe fn copy_from_host(&self, device: u64, dst: *mut u8, src: &[u8]) -> Result<()> {
        Self::check_device("copy_from_host", device)?;
        // SAFETY: the caller guarantees `dst` is host memory valid for `src.len()` bytes that
        // nothing else touches meanwhile, so it cannot overlap `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    unsafe fn copy_to_host(&self, device: u64, dst: &mut [u8], src: *const u8) -> Result<()> {
        Self::check_device("copy_to_host", device)?;
        // SAFETY: the caller guarantees `src` is host memory valid for `dst.len()` bytes that
        // nothing writes meanwhile; `dst` is an exclusive borrow, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn host_register(&self, _addr: *mut u8, _len: usize) -> Result<()> {
        Ok(())
    }

    unsafe fn host_unregister(&self, _addr: *mut u8) -> Result<()> {
        Ok(())
    }

    fn alloc_host_mapped(&self, device: u64, len: usize) -> Result<HostMapped> {
        Self::check_device("alloc_host_mapped", device)?;
        let (ptr, release) = Self::shared_pages("alloc_host_mapped", len)?;
        Ok(HostMapped::new(
            ptr,
            ptr.as_ptr() as u64,
            len,
            (Iface::System, 0),
            release,
            self.errors.clone(),
        ))
    }

    fn alloc_device(&self, device: u64, len: usize) -> Result<DeviceBuffer> {
        Self::check_device("alloc_device", device)?;
        let (ptr, release) = Self::map_pages("alloc_device", len)?;
        Ok(DeviceBuffer::new(
            ptr.as_ptr() as u64,
            len,
            (Iface::System, 0),
            release,
            self.errors.clone(),
        ))
    }

    fn ipc_get(&self, addr: *const u8, len: usize) -> Result<IpcHandle> {
        const OP: &str = "ipc_get";
        check_len(OP, len)?;
        if let Some(h) = memfd::find(addr, len) {
            return Ok(h);
        }
        if memfd::overlaps(addr, len) {
            return Err(HmemError::inval(
                OP,
                format!("{len} bytes at {addr:p} run past the allocation they start in"),
            ));
        }
        Err(HmemError::unsupported(
            Iface::System,
            OP,
            format!(
                "{addr:p} is not in an allocation of alloc_host_mapped; other host memory has \
                 no IPC handle"
            ),
        ))
    }

    fn ipc_open(&self, device: u64, handle: &IpcHandle) -> Result<IpcMapping> {
        const OP: &str = "ipc_open";
        Self::check_device(OP, device)?;
        if handle.iface != Iface::System {
            return Err(HmemError::inval(
                OP,
                format!("a {} handle given to host memory", handle.iface),
            ));
        }
        let (ptr, release) = memfd::open(handle)?;
        Ok(IpcMapping::new(
            ptr.as_ptr() as u64,
            handle,
            0,
            Some(release),
            self.errors.clone(),
        ))
    }

    fn take_drop_errors(&self) -> Vec<HmemError> {
        self.errors.take()
    }
}
