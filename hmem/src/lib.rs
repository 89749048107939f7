//! xfabric-hmem: heterogeneous memory for xfabric, what libfabric's `ofi_hmem` layer does for C.
//!
//! One trait, [`HmemIface`], per memory interface (`enum fi_hmem_iface`): is it usable here and
//! why not, its devices, which interface and device own an address, copies between host and
//! device memory, host-memory registration, device-visible host allocations (where XPU
//! doorbells live) and IPC handles. Implementations:
//!
//! - [`System`]: host memory; always available. Its device-visible allocations are sealed
//!   memfds with IPC handles another process maps read-only.
//! - [`Cuda`]: the CUDA driver API through `cudarc`, loaded at run time. `libcuda` is probed
//!   before any call, so a machine without it reports CUDA unavailable instead of panicking.
//! - [`Ze`]: oneAPI Level Zero through `libze_loader.so.1` opened at run time with a
//!   hand-written FFI of the calls used (no `level-zero-sys` crate exists). The library path
//!   can be overridden with `XFABRIC_ZE_LOADER`.
//! - ROCr, Neuron and SynapseAI are recognised and reported unsupported.
//!
//! CUDA and Level Zero are cargo features, on by default (`cuda`, `ze`). Built without one,
//! the interface still exists (an application naming `FI_HMEM_CUDA` compiles), its native
//! code and dependencies are left out (no cudarc without `cuda`), and every call answers
//! [`HmemError::NotBuilt`]: "built without CUDA support (feature `cuda`)".
//!
//! [`Hmem::detect`] probes every interface once and keeps the answers, for `xfabric info`,
//! `getinfo` (FI_HMEM only where a device interface is available) and memory registration.
//!
//! Native libraries are layered as in cudarc: raw FFI (`cudarc::driver::sys`, `ze::sys`),
//! thin `Result`-returning calls (`cuda::result`, `ze::result`), and the safe types here
//! (the `cuda` and `ze` layers exist in builds with those features).

#![warn(missing_docs)]

mod absent;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "off/cuda.rs"]
pub mod cuda;
pub mod error;
pub mod iface;
pub mod mem;
mod memfd;
pub use memfd::mount_of;
pub mod registry;
pub mod system;
#[cfg(feature = "ze")]
pub mod ze;
#[cfg(not(feature = "ze"))]
#[path = "off/ze.rs"]
pub mod ze;

pub use absent::NotImplemented;
pub use cuda::Cuda;
pub use error::{HmemError, Unavailable};
pub use iface::{DeviceInfo, Iface, Owner};
pub use mem::{AsyncCopy, DeviceBuffer, Dmabuf, HostMapped, IpcHandle, IpcMapping};
pub use registry::{Hmem, IfaceStatus};
pub use system::System;
pub use ze::Ze;

use std::os::fd::OwnedFd;

/// Result alias of this crate.
pub type Result<T, E = HmemError> = std::result::Result<T, E>;

/// One heterogeneous-memory interface. Every method is callable on an unavailable interface
/// and answers `HmemError::Unavailable` (or an empty device list); none panics.
///
/// Device numbers are the interface's own (see [`Owner`]). Addresses are `*const u8`/`*mut u8`
/// whether or not the host can dereference them, as libfabric passes `void *`.
pub trait HmemIface: Send + Sync + std::fmt::Debug {
    /// Which interface this is.
    fn iface(&self) -> Iface;

    /// `Ok` when the interface can be used here; otherwise why not.
    fn available(&self) -> Result<(), Unavailable>;

    /// The devices it drives (empty when unavailable).
    fn devices(&self) -> Vec<DeviceInfo>;

    /// Pointer query: `Some` when `addr` is memory of this interface, with its device. Device
    /// interfaces answer `None` for host memory, even host memory they pinned or allocated;
    /// the system interface claims every address (it is the fallback).
    fn owns(&self, addr: *const u8) -> Result<Option<Owner>>;

    /// Copies `src` (host memory) to `dst`, memory of this interface on `device`. On return
    /// the bytes are in place and visible to the device.
    ///
    /// # Safety
    /// `dst` must be memory of this interface on `device`, valid for `src.len()` bytes, that
    /// nothing else reads or writes during the copy.
    unsafe fn copy_from_host(&self, device: u64, dst: *mut u8, src: &[u8]) -> Result<()>;

    /// Copies `dst.len()` bytes from `src`, memory of this interface on `device`, to `dst`.
    /// On return the bytes are in `dst`.
    ///
    /// # Safety
    /// `src` must be memory of this interface on `device`, valid for `dst.len()` bytes, that
    /// nothing writes during the copy.
    unsafe fn copy_to_host(&self, device: u64, dst: &mut [u8], src: *const u8) -> Result<()>;

    /// Registers (pins) host memory with the driver so devices reach it directly and copies
    /// from it go faster. A no-op where the interface has no such notion.
    ///
    /// # Safety
    /// `addr..addr + len` must be mapped host memory that stays mapped until
    /// [`host_unregister`](Self::host_unregister) is called for `addr`.
    unsafe fn host_register(&self, addr: *mut u8, len: usize) -> Result<()>;

    /// Undoes [`host_register`](Self::host_register).
    ///
    /// # Safety
    /// `addr` must have been registered with this interface and not unregistered since; no
    /// device access to it may be in flight.
    unsafe fn host_unregister(&self, addr: *mut u8) -> Result<()>;

    /// Host memory that `device` can read and write directly (see [`HostMapped`]).
    fn alloc_host_mapped(&self, device: u64, len: usize) -> Result<HostMapped>;

    /// Memory on `device` (see [`DeviceBuffer`]); for staging buffers and tests.
    fn alloc_device(&self, device: u64, len: usize) -> Result<DeviceBuffer>;

    /// Exports the allocation holding `addr..addr + len` for another process to map.
    fn ipc_get(&self, addr: *const u8, len: usize) -> Result<IpcHandle>;

    /// Maps an exported allocation on `device`; the mapping is closed on drop
    /// ([`IpcMapping::close`] reports the driver's answer).
    fn ipc_open(&self, device: u64, handle: &IpcHandle) -> Result<IpcMapping>;

    /// Memory on `device` from the virtual-memory-management calls (CUDA's `cuMemCreate`,
    /// reserved, mapped and made accessible: memory `ipc_get` refuses), of whole granules
    /// (the buffer's length is `len`), exportable as a POSIX descriptor where `shareable`
    /// ([`vmm_export`](Self::vmm_export)). The default: this interface has none.
    fn alloc_device_vmm(&self, device: u64, len: usize, shareable: bool) -> Result<DeviceBuffer> {
        let _ = (device, len, shareable);
        Err(HmemError::unsupported(
            self.iface(),
            "virtual-memory-management allocation",
            "this interface has none",
        ))
    }

    /// Exports the virtual-memory-management allocation holding `addr..addr + len` as a file
    /// descriptor (CUDA: `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`), with a handle
    /// describing it ([`IpcHandle::is_vmm`]); the descriptor is what another process needs,
    /// passed to it by the caller (SCM_RIGHTS), to [`vmm_open`](Self::vmm_open) it.
    /// `Inval`: not such an allocation; `Unsupported`: one that cannot be exported so (the
    /// driver or the allocation lacks the handle type), with the reason. The default: none.
    fn vmm_export(&self, addr: *const u8, len: usize) -> Result<(IpcHandle, OwnedFd)> {
        let _ = (addr, len);
        Err(HmemError::unsupported(
            self.iface(),
            "virtual-memory-management export",
            "this interface has none",
        ))
    }

    /// Imports the allocation another process exported with
    /// [`vmm_export`](Self::vmm_export), given its descriptor (`fd`, only used: the caller
    /// closes it, where it chooses, as closing another's descriptor may wait) and handle, and
    /// maps the whole of it on `device`; the mapping is unmapped on drop. The driver refuses
    /// a descriptor that names no allocation, or one smaller than the handle says.
    fn vmm_open(
        &self,
        device: u64,
        handle: &IpcHandle,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<IpcMapping> {
        let _ = (device, handle, fd);
        Err(HmemError::unsupported(
            self.iface(),
            "virtual-memory-management import",
            "this interface has none",
        ))
    }

    /// Starts copying `len` bytes from `src` to `dst` on `device`'s copy stream and returns
    /// at once: either side may be memory of this interface (an IPC mapping included) or
    /// host memory. [`AsyncCopy::poll`] says when the bytes are in place; nothing here
    /// waits on the device. The default: this interface has no such copies.
    ///
    /// # Safety
    /// `src..src + len` must stay readable and `dst..dst + len` writable, not otherwise
    /// accessed, until the copy is done (`poll` answered `Ok(true)`).
    unsafe fn copy_async(
        &self,
        device: u64,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<AsyncCopy> {
        let _ = (device, dst, src, len);
        Err(HmemError::unsupported(
            self.iface(),
            "asynchronous copy",
            "this interface has none",
        ))
    }

    /// Errors met while freeing allocations or closing mappings in `Drop`, since the last call.
    fn take_drop_errors(&self) -> Vec<HmemError>;

    /// A dma-buf for `addr..addr + len`, memory of this interface, where its driver exports
    /// one (see [`Dmabuf`]); otherwise why not. The default: this interface has none.
    fn dmabuf(&self, addr: *const u8, len: usize) -> Result<Dmabuf> {
        let _ = (addr, len);
        Err(HmemError::unsupported(
            self.iface(),
            "dma-buf export",
            "this interface exports none",
        ))
    }
}

/// `sysconf(_SC_PAGESIZE)`, 4096 if the call fails.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Refuses zero-length requests, which every driver treats differently.
pub(crate) fn check_len(op: &'static str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(HmemError::inval(op, "length is zero"));
    }
    Ok(())
}
