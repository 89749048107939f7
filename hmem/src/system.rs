//! `FI_HMEM_SYSTEM`: host memory. Always available; registration is a no-op (as libfabric's
//! `ofi_hmem_register_noop`), copies are `memcpy`, and "device-visible" host memory is plain
//! anonymous pages, which a CPU XPU (a thread, an FPGA polling host memory) reaches directly.
//! Host memory has no IPC handles: shm shares host buffers through its own segments and
//! cross-memory attach.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{DropErrors, HmemError, Unavailable};
use crate::mem::{DeviceBuffer, HostMapped, IpcHandle, IpcMapping, Release};
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

    /// Anonymous, zero-filled, page-aligned pages.
    fn map_pages(op: &'static str, len: usize) -> Result<(NonNull<u8>, Box<dyn Release>)> {
        check_len(op, len)?;
        let page = page_size();
        let Some(map_len) = len.checked_next_multiple_of(page) else {
            return Err(HmemError::inval(op, format!("{len} bytes is too large")));
        };
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
            Box::new(Pages {
                addr: ptr.as_ptr() as usize,
                len: map_len,
            }),
        ))
    }
}

/// Pages from `map_pages`, unmapped on release.
struct Pages {
    addr: usize,
    len: usize,
}

impl Release for Pages {
    fn release(&mut self) -> Result<()> {
        // SAFETY: `addr..addr + len` is the mapping `map_pages` made, released once.
        if unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) } != 0 {
            return Err(HmemError::last_os("munmap"));
        }
        Ok(())
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
        let (ptr, release) = Self::map_pages("alloc_host_mapped", len)?;
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

    fn ipc_get(&self, _addr: *const u8, _len: usize) -> Result<IpcHandle> {
        Err(HmemError::unsupported(
            Iface::System,
            "ipc_get",
            "host memory has no IPC handles; shm shares it through its own segments",
        ))
    }

    fn ipc_open(&self, _device: u64, _handle: &IpcHandle) -> Result<IpcMapping> {
        Err(HmemError::unsupported(
            Iface::System,
            "ipc_open",
            "host memory has no IPC handles; shm shares it through its own segments",
        ))
    }

    fn take_drop_errors(&self) -> Vec<HmemError> {
        self.errors.take()
    }
}
