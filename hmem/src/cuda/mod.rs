//! `FI_HMEM_CUDA` through the CUDA driver API (`cudarc`, loaded at run time).
//!
//! Probe order: libcuda present and complete ([`result::probe_library`]), `cuInit`, at least one
//! device. Any failure leaves the interface unavailable with that reason; nothing panics.
//!
//! Each device's primary context is retained on first use, with one non-blocking stream for
//! copies. Calls push that context and pop it again, so the caller's current context is left
//! as it was. Copies run on the non-blocking stream and wait for it: a copy never waits behind
//! work on the legacy default stream (a persistent kernel polling a doorbell, say), and when
//! it returns the bytes are in device memory.

pub mod result;

use std::ffi::c_void;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use crate::error::{DropErrors, HmemError, Unavailable};
use crate::mem::Release;
use crate::mem::{AsyncCopy, DeviceBuffer, Dmabuf, HostMapped, IpcHandle, IpcMapping, Pending};
use crate::{check_len, DeviceInfo, HmemIface, Iface, Owner, Result};
use result::DriverError;

/// `CU_MEMORYTYPE_DEVICE` (cuda.h).
const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// The `page`-aligned span around `addr..addr + len`: its start and length, and where
/// `addr` lies in it (`None`: the range wraps).
fn page_span(addr: u64, len: usize, page: u64) -> Option<(u64, u64, u64)> {
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len as u64)?
        .checked_next_multiple_of(page)?;
    Some((start, end - start, addr - start))
}

/// Wraps a driver error with the call that returned it.
fn cuda_err(op: &'static str) -> impl FnOnce(DriverError) -> HmemError {
    move |e| HmemError::Cuda {
        op,
        code: e.0 as u32,
        // The enum's name, not cuGetErrorName: it needs no call into the driver.
        name: format!("{:?}", e.0),
    }
}

/// The CUDA interface.
#[derive(Debug)]
pub struct Cuda {
    state: Result<Arc<CudaState>, Unavailable>,
}

/// Probe results and per-device contexts; every resource made from them holds an `Arc`, so
/// contexts are released only after the last allocation is freed.
#[derive(Debug)]
struct CudaState {
    driver_version: i32,
    devices: Vec<CudaDevice>,
    errors: Arc<DropErrors>,
    /// `Err(why)` where the driver lacks the virtual-memory-management calls.
    vmm: OnceLock<Result<(), String>>,
}

#[derive(Debug)]
struct CudaDevice {
    dev: sys::CUdevice,
    info: DeviceInfo,
    ctx: OnceLock<Result<DeviceCtx>>,
}

/// A retained primary context and its copy stream.
#[derive(Debug)]
struct DeviceCtx {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
}

// SAFETY: CUDA contexts and streams are driver handles usable from any thread; the driver
// serialises access to them internally.
unsafe impl Send for DeviceCtx {}
// SAFETY: as above.
unsafe impl Sync for DeviceCtx {}

impl DeviceCtx {
    fn open(dev: sys::CUdevice) -> Result<DeviceCtx> {
        // SAFETY: `dev` came from cuDeviceGet.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(cuda_err("cuDevicePrimaryCtxRetain"))?;
        let stream = (|| {
            // SAFETY: `ctx` was just retained.
            unsafe { result::ctx_stack::push(ctx) }.map_err(cuda_err("cuCtxPushCurrent"))?;
            let s = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(cuda_err("cuStreamCreate"));
            let popped = result::ctx_stack::pop().map_err(cuda_err("cuCtxPopCurrent"));
            let s = s?;
            popped?;
            Ok(s)
        })();
        match stream {
            Ok(stream) => Ok(DeviceCtx { ctx, stream }),
            Err(e) => {
                // SAFETY: releases the reference retained above.
                let _ = unsafe { result::primary_ctx::release(dev) };
                Err(e)
            }
        }
    }
}

impl CudaState {
    fn probe() -> Result<CudaState, String> {
        result::probe_library()?;
        result::init().map_err(|e| format!("cuInit failed: {:?}", e.0))?;
        let driver_version = result::driver_version()
            .map_err(|e| format!("cuDriverGetVersion failed: {:?}", e.0))?;
        let count = result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {:?}", e.0))?;
        if count <= 0 {
            return Err("the driver reports no CUDA devices".into());
        }
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let dev = result::device::get(ordinal)
                .map_err(|e| format!("cuDeviceGet({ordinal}) failed: {:?}", e.0))?;
            let name = result::device_name(dev).unwrap_or_else(|e| format!("unnamed ({:?})", e.0));
            devices.push(CudaDevice {
                dev,
                info: DeviceInfo {
                    index: ordinal as u64,
                    name,
                },
                ctx: OnceLock::new(),
            });
        }
        Ok(CudaState {
            driver_version,
            devices,
            errors: Arc::default(),
            vmm: OnceLock::new(),
        })
    }

    fn device(&self, op: &'static str, device: u64) -> Result<&CudaDevice> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                HmemError::inval(
                    op,
                    format!("no CUDA device {device} ({} present)", self.devices.len()),
                )
            })
    }

    /// `Unsupported` (saying which calls are missing) where the driver lacks the
    /// virtual-memory-management calls.
    fn check_vmm(&self, op: &'static str) -> Result<()> {
        self.vmm
            .get_or_init(|| {
                let missing = result::vmm::missing();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "the driver lacks {} (older than CUDA 11?)",
                        missing.join(", ")
                    ))
                }
            })
            .clone()
            .map_err(|why| HmemError::unsupported(Iface::Cuda, op, why))
    }

    /// Runs `f` with `device`'s primary context current, then restores the caller's.
    fn with_ctx<T>(
        &self,
        op: &'static str,
        device: u64,
        f: impl FnOnce(&DeviceCtx) -> Result<T>,
    ) -> Result<T> {
        let d = self.device(op, device)?;
        let dc = d
            .ctx
            .get_or_init(|| DeviceCtx::open(d.dev))
            .as_ref()
            .map_err(Clone::clone)?;
        // SAFETY: the context stays retained while `self` lives.
        unsafe { result::ctx_stack::push(dc.ctx) }.map_err(cuda_err("cuCtxPushCurrent"))?;
        let r = f(dc);
        let popped = result::ctx_stack::pop().map_err(cuda_err("cuCtxPopCurrent"));
        let v = r?;
        popped?;
        Ok(v)
    }
}

impl Drop for CudaState {
    fn drop(&mut self) {
        for d in &self.devices {
            if let Some(Ok(dc)) = d.ctx.get() {
                // SAFETY: the stream belongs to this context; nothing made from this state is
                // alive any more (each held an Arc of it).
                unsafe {
                    if result::ctx_stack::push(dc.ctx).is_ok() {
                        let _ = result::stream::destroy(dc.stream);
                        let _ = result::ctx_stack::pop();
                    }
                    let _ = result::primary_ctx::release(d.dev);
                }
            }
        }
    }
}

impl Default for Cuda {
    fn default() -> Self {
        Self::new()
    }
}

impl Cuda {
    /// Probes libcuda and the devices. Never panics: without a driver or a device the
    /// interface is unavailable and says why.
    pub fn new() -> Self {
        Cuda {
            state: CudaState::probe()
                .map(Arc::new)
                .map_err(|reason| Unavailable {
                    iface: Iface::Cuda,
                    reason,
                }),
        }
    }

    fn state(&self) -> Result<&Arc<CudaState>> {
        self.state.as_ref().map_err(|u| u.clone().into())
    }

    /// `cuDriverGetVersion` (e.g. 13000), when available.
    pub fn driver_version(&self) -> Option<i32> {
        self.state.as_ref().ok().map(|s| s.driver_version)
    }
}

/// Mapped page-locked host memory from `cuMemHostAlloc`.
struct HostAlloc {
    state: Arc<CudaState>,
    device: u64,
    ptr: usize,
}

impl Release for HostAlloc {
    fn release(&mut self) -> Result<()> {
        self.state.with_ctx("cuMemFreeHost", self.device, |_| {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
            unsafe { result::free_host(self.ptr as *mut c_void) }.map_err(cuda_err("cuMemFreeHost"))
        })
    }
}

/// Device memory from `cuMemAlloc`.
struct DeviceAlloc {
    state: Arc<CudaState>,
    device: u64,
    dptr: sys::CUdeviceptr,
}

impl Release for DeviceAlloc {
    fn release(&mut self) -> Result<()> {
        self.state.with_ctx("cuMemFree", self.device, |_| {
            // SAFETY: `dptr` came from cuMemAlloc and is freed once.
            unsafe { result::free_sync(self.dptr) }.map_err(cuda_err("cuMemFree"))
        })
    }
}

/// A mapping from `cuIpcOpenMemHandle`.
struct IpcOpened {
    state: Arc<CudaState>,
    device: u64,
    dptr: sys::CUdeviceptr,
}

impl Release for IpcOpened {
    fn release(&mut self) -> Result<()> {
        self.state
            .with_ctx("cuIpcCloseMemHandle", self.device, |_| {
                // SAFETY: `dptr` came from cuIpcOpenMemHandle and is closed once.
                unsafe { result::ipc::close(self.dptr) }.map_err(cuda_err("cuIpcCloseMemHandle"))
            })
    }
}

/// A virtual-memory-management mapping: `len` bytes of a reservation at `ptr`, mapped and
/// accessible; unmapped, then the reservation freed. The allocation handle was released once
/// mapped (the mapping holds the allocation), so it goes with the mapping.
struct VmmMapped {
    state: Arc<CudaState>,
    device: u64,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl Release for VmmMapped {
    fn release(&mut self) -> Result<()> {
        self.state.with_ctx("cuMemUnmap", self.device, |_| {
            // SAFETY: mapped by `vmm_map` and unmapped once, here; nothing uses it now.
            unsafe { result::vmm::unmap(self.ptr, self.len) }.map_err(cuda_err("cuMemUnmap"))?;
            // SAFETY: the reservation `vmm_map` made, with nothing mapped in it now.
            unsafe { result::vmm::free_address(self.ptr, self.len) }
                .map_err(cuda_err("cuMemAddressFree"))
        })
    }
}

/// Reserves `len` bytes (a multiple of the granularity), maps allocation `h` there and gives
/// `device` access; releases `h` in every case (the mapping holds the allocation). In
/// `device`'s context.
fn vmm_map(
    state: &Arc<CudaState>,
    device: u64,
    dev: sys::CUdevice,
    h: sys::CUmemGenericAllocationHandle,
    len: usize,
    gran: usize,
) -> Result<VmmMapped> {
    let mapped = (|| {
        let ptr = result::vmm::reserve(len, gran).map_err(cuda_err("cuMemAddressReserve"))?;
        // SAFETY: `ptr..ptr + len` was just reserved, nothing is mapped there.
        if let Err(e) = unsafe { result::vmm::map(ptr, len, h, dev) } {
            // SAFETY: the reservation just made, empty.
            let _ = unsafe { result::vmm::free_address(ptr, len) };
            return Err(cuda_err("cuMemMap/cuMemSetAccess")(e));
        }
        Ok(ptr)
    })();
    // SAFETY: our reference to `h`, released once; a mapping keeps its own.
    let released = unsafe { result::vmm::release(h) }.map_err(cuda_err("cuMemRelease"));
    let ptr = mapped?;
    let mut m = VmmMapped {
        state: state.clone(),
        device,
        ptr,
        len,
    };
    if let Err(e) = released {
        // Not handed out, so nobody else would unmap it: undone here (its own error, if any,
        // says less than the release's).
        let _ = m.release();
        return Err(e);
    }
    Ok(m)
}

/// A copy's completion event (`cuEventRecord` after `cuMemcpyAsync`), destroyed on drop.
struct CopyEvent {
    state: Arc<CudaState>,
    ev: sys::CUevent,
}

// SAFETY: an event handle is usable from any thread; the driver serialises access to it.
unsafe impl Send for CopyEvent {}

impl Pending for CopyEvent {
    fn query(&mut self) -> Result<bool> {
        // SAFETY: the event lives until this value drops.
        unsafe { result::async_copy::query(self.ev) }.map_err(cuda_err("cuEventQuery"))
    }
}

impl Drop for CopyEvent {
    fn drop(&mut self) {
        // SAFETY: created by `record`, destroyed once here; destroying an event whose work
        // is still queued is allowed (its resources go once the work is done).
        if let Err(e) = unsafe { result::async_copy::destroy(self.ev) } {
            self.state.errors.record(cuda_err("cuEventDestroy")(e));
        }
    }
}

impl HmemIface for Cuda {
    fn iface(&self) -> Iface {
        Iface::Cuda
    }

    fn available(&self) -> Result<(), Unavailable> {
        self.state.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        match &self.state {
            Ok(s) => s.devices.iter().map(|d| d.info.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn owns(&self, addr: *const u8) -> Result<Option<Owner>> {
        self.state()?;
        let ptr = addr as u64;
        match result::pointer::memory_type(ptr) {
            Ok(CU_MEMORYTYPE_DEVICE) => {
                let ordinal = result::pointer::device_ordinal(ptr)
                    .map_err(cuda_err("cuPointerGetAttribute(DEVICE_ORDINAL)"))?;
                Ok(Some(Owner {
                    iface: Iface::Cuda,
                    device: ordinal as u64,
                }))
            }
            // Page-locked or mapped host memory is still host memory.
            Ok(_) => Ok(None),
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => Ok(None),
            Err(e) => Err(cuda_err("cuPointerGetAttribute(MEMORY_TYPE)")(e)),
        }
    }

    unsafe fn copy_from_host(&self, device: u64, dst: *mut u8, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.state()?.with_ctx("copy_from_host", device, |dc| {
            // SAFETY: the caller guarantees `dst` is device memory valid for `src.len()`
            // bytes; `src` outlives the copy because we wait for the stream below.
            unsafe { result::memcpy_htod_async(dst as u64, src, dc.stream) }
                .map_err(cuda_err("cuMemcpyHtoDAsync"))?;
            // SAFETY: the stream was created in this context and is live.
            unsafe { result::stream::synchronize(dc.stream) }
                .map_err(cuda_err("cuStreamSynchronize"))
        })
    }

    unsafe fn copy_to_host(&self, device: u64, dst: &mut [u8], src: *const u8) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.state()?.with_ctx("copy_to_host", device, |dc| {
            // SAFETY: the caller guarantees `src` is device memory valid for `dst.len()` bytes;
            // `dst` stays borrowed until the stream is drained below.
            unsafe { result::memcpy_dtoh_async(dst, src as u64, dc.stream) }
                .map_err(cuda_err("cuMemcpyDtoHAsync"))?;
            // SAFETY: as above.
            unsafe { result::stream::synchronize(dc.stream) }
                .map_err(cuda_err("cuStreamSynchronize"))
        })
    }

    unsafe fn host_register(&self, addr: *mut u8, len: usize) -> Result<()> {
        check_len("host_register", len)?;
        // Registrations are PORTABLE: any context will do, so use device 0's.
        self.state()?.with_ctx("host_register", 0, |_| {
            // SAFETY: the caller keeps `addr..addr + len` mapped until unregistering.
            unsafe { result::host::register(addr.cast(), len) }
                .map_err(cuda_err("cuMemHostRegister"))
        })
    }

    unsafe fn host_unregister(&self, addr: *mut u8) -> Result<()> {
        self.state()?.with_ctx("host_unregister", 0, |_| {
            // SAFETY: the caller's contract.
            unsafe { result::host::unregister(addr.cast()) }
                .map_err(cuda_err("cuMemHostUnregister"))
        })
    }

    fn alloc_host_mapped(&self, device: u64, len: usize) -> Result<HostMapped> {
        check_len("alloc_host_mapped", len)?;
        let state = self.state()?;
        let (host, dptr) = state.with_ctx("alloc_host_mapped", device, |_| {
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: plain allocation; the memory is zeroed below before anyone reads it.
            let host =
                unsafe { result::malloc_host(len, flags) }.map_err(cuda_err("cuMemHostAlloc"))?;
            // SAFETY: `host` came from cuMemHostAlloc(DEVICEMAP).
            match unsafe { result::host::device_pointer(host) } {
                Ok(d) => Ok((host, d)),
                Err(e) => {
                    // SAFETY: frees what was just allocated.
                    let _ = unsafe { result::free_host(host) };
                    Err(cuda_err("cuMemHostGetDevicePointer")(e))
                }
            }
        })?;
        let Some(host) = NonNull::new(host.cast::<u8>()) else {
            return Err(HmemError::inval(
                "alloc_host_mapped",
                "cuMemHostAlloc returned null",
            ));
        };
        // SAFETY: `len` bytes were just allocated and nothing else knows of them yet.
        unsafe { host.as_ptr().write_bytes(0, len) };
        let release = HostAlloc {
            state: state.clone(),
            device,
            ptr: host.as_ptr() as usize,
        };
        Ok(HostMapped::new(
            host,
            dptr,
            len,
            (Iface::Cuda, device),
            Box::new(release),
            state.errors.clone(),
        ))
    }

    fn alloc_device(&self, device: u64, len: usize) -> Result<DeviceBuffer> {
        check_len("alloc_device", len)?;
        let state = self.state()?;
        let dptr = state.with_ctx("alloc_device", device, |_| {
            // SAFETY: plain allocation; its contents are undefined until written.
            unsafe { result::malloc_sync(len) }.map_err(cuda_err("cuMemAlloc"))
        })?;
        let release = DeviceAlloc {
            state: state.clone(),
            device,
            dptr,
        };
        Ok(DeviceBuffer::new(
            dptr,
            len,
            (Iface::Cuda, device),
            Box::new(release),
            state.errors.clone(),
        ))
    }

    fn ipc_get(&self, addr: *const u8, len: usize) -> Result<IpcHandle> {
        const OP: &str = "ipc_get";
        let state = self.state()?;
        let Some(owner) = self.owns(addr)? else {
            return Err(HmemError::inval(
                OP,
                format!("{addr:p} is not CUDA device memory"),
            ));
        };
        let (base, raw, alloc_id) = state.with_ctx(OP, owner.device, |_| {
            let (base, size) = result::pointer::address_range(addr as u64)
                .map_err(cuda_err("cuMemGetAddressRange"))?;
            let id = result::pointer::buffer_id(base)
                .map_err(cuda_err("cuPointerGetAttribute(BUFFER_ID)"))?;
            // SAFETY: `base` is the base of the live allocation holding `addr`.
            let raw = unsafe { result::ipc::get(base) }.map_err(cuda_err("cuIpcGetMemHandle"))?;
            Ok(((base, size), raw, id))
        })?;
        let handle = IpcHandle {
            iface: Iface::Cuda,
            pid: crate::memfd::this_pid(),
            device: owner.device,
            alloc_id,
            base: base.0,
            alloc_len: base.1 as u64,
            offset: (addr as u64).saturating_sub(base.0),
            raw,
        };
        handle.check_range(OP, len)?;
        Ok(handle)
    }

    fn ipc_open(&self, device: u64, handle: &IpcHandle) -> Result<IpcMapping> {
        const OP: &str = "ipc_open";
        let state = self.state()?;
        if handle.iface != Iface::Cuda {
            return Err(HmemError::inval(
                OP,
                format!("a {} handle given to CUDA", handle.iface),
            ));
        }
        if handle.is_vmm() {
            return Err(HmemError::inval(
                OP,
                "a virtual-memory-management handle opens with vmm_open and its descriptor",
            ));
        }
        state.device(OP, device)?;
        if handle.pid == std::process::id() {
            // CUDA refuses to open a handle in the process that exported it; the allocation is
            // already mapped here, at the address the handle records.
            return Ok(IpcMapping::new(
                handle.base,
                handle,
                device,
                None,
                state.errors.clone(),
            ));
        }
        let dptr = state.with_ctx(OP, device, |_| {
            let dptr = result::ipc::open(&handle.raw).map_err(cuda_err("cuIpcOpenMemHandle"))?;
            // The handle's length is the peer's word, and copies are bounded by it: the
            // allocation the driver opened must hold that much (a copy past its mapping would
            // fault on the device, the context's error sticky).
            let holds = result::pointer::address_range(dptr)
                .map_err(cuda_err("cuMemGetAddressRange"))
                .and_then(|(base, size)| {
                    if base == dptr && size as u64 >= handle.alloc_len {
                        Ok(())
                    } else {
                        Err(HmemError::inval(
                            OP,
                            format!(
                                "the allocation opened holds {size} bytes from {base:#x}, \
                                 not the {} the handle claims from {dptr:#x}",
                                handle.alloc_len
                            ),
                        ))
                    }
                });
            if let Err(e) = holds {
                // SAFETY: just opened, never handed out, closed once.
                let _ = unsafe { result::ipc::close(dptr) };
                return Err(e);
            }
            Ok(dptr)
        })?;
        let release = IpcOpened {
            state: state.clone(),
            device,
            dptr,
        };
        Ok(IpcMapping::new(
            dptr,
            handle,
            device,
            Some(Box::new(release)),
            state.errors.clone(),
        ))
    }

    fn alloc_device_vmm(&self, device: u64, len: usize, shareable: bool) -> Result<DeviceBuffer> {
        const OP: &str = "alloc_device_vmm";
        check_len(OP, len)?;
        let state = self.state()?;
        state.check_vmm(OP)?;
        let dev = state.device(OP, device)?.dev;
        let mapped = state.with_ctx(OP, device, |_| {
            let gran =
                result::vmm::granularity(dev).map_err(cuda_err("cuMemGetAllocationGranularity"))?;
            let size = len
                .checked_next_multiple_of(gran.max(1))
                .ok_or_else(|| HmemError::inval(OP, "too long"))?;
            let h = result::vmm::create(dev, size, shareable).map_err(cuda_err("cuMemCreate"))?;
            vmm_map(state, device, dev, h, size, gran)
        })?;
        let ptr = mapped.ptr;
        Ok(DeviceBuffer::new(
            ptr,
            len,
            (Iface::Cuda, device),
            Box::new(mapped),
            state.errors.clone(),
        ))
    }

    fn vmm_export(&self, addr: *const u8, len: usize) -> Result<(IpcHandle, OwnedFd)> {
        const OP: &str = "vmm_export";
        let state = self.state()?;
        let Some(owner) = self.owns(addr)? else {
            return Err(HmemError::inval(
                OP,
                format!("{addr:p} is not CUDA device memory"),
            ));
        };
        state.check_vmm(OP)?;
        let dev = state.device(OP, owner.device)?.dev;
        let (fd, (base, size), alloc_id) = state.with_ctx(OP, owner.device, |_| {
            let h = result::vmm::retain(addr as u64).map_err(|e| {
                HmemError::inval(
                    OP,
                    format!("not a virtual-memory-management allocation ({:?})", e.0),
                )
            })?;
            let fd = (|| {
                let supported = result::vmm::posix_fd_supported(dev).map_err(cuda_err(
                    "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)",
                ))?;
                if !supported {
                    return Err(HmemError::unsupported(
                        Iface::Cuda,
                        OP,
                        "the device has no POSIX file descriptor handles \
                         (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)",
                    ));
                }
                // SAFETY: `h` was retained above and is released below.
                let exportable = unsafe { result::vmm::exportable_as_fd(h) }
                    .map_err(cuda_err("cuMemGetAllocationPropertiesFromHandle"))?;
                if !exportable {
                    return Err(HmemError::unsupported(
                        Iface::Cuda,
                        OP,
                        "the allocation was not created with \
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its handle types",
                    ));
                }
                // SAFETY: as above.
                unsafe { result::vmm::export_fd(h) }
                    .map_err(cuda_err("cuMemExportToShareableHandle"))
            })();
            // SAFETY: the reference retained above, released once.
            let released = unsafe { result::vmm::release(h) }.map_err(cuda_err("cuMemRelease"));
            let fd = fd?;
            released?;
            let range = result::pointer::address_range(addr as u64)
                .map_err(cuda_err("cuMemGetAddressRange"))?;
            let id = result::pointer::buffer_id(range.0)
                .map_err(cuda_err("cuPointerGetAttribute(BUFFER_ID)"))?;
            Ok((fd, range, id))
        })?;
        let handle = IpcHandle {
            iface: Iface::Cuda,
            pid: crate::memfd::this_pid(),
            device: owner.device,
            alloc_id,
            base,
            alloc_len: size as u64,
            offset: (addr as u64).saturating_sub(base),
            raw: IpcHandle::VMM_RAW,
        };
        handle.check_range(OP, len)?;
        Ok((handle, fd))
    }

    fn vmm_open(&self, device: u64, handle: &IpcHandle, fd: BorrowedFd<'_>) -> Result<IpcMapping> {
        const OP: &str = "vmm_open";
        let state = self.state()?;
        if handle.iface != Iface::Cuda || !handle.is_vmm() {
            return Err(HmemError::inval(
                OP,
                "not a CUDA virtual-memory-management handle",
            ));
        }
        state.check_vmm(OP)?;
        let dev = state.device(OP, device)?.dev;
        let mapped = state.with_ctx(OP, device, |_| {
            let gran =
                result::vmm::granularity(dev).map_err(cuda_err("cuMemGetAllocationGranularity"))?;
            // The peer's word: the driver maps no more than the allocation holds.
            let size = usize::try_from(handle.alloc_len)
                .ok()
                .filter(|&n| n > 0)
                .and_then(|n| n.checked_next_multiple_of(gran.max(1)))
                .ok_or_else(|| {
                    HmemError::inval(OP, format!("an allocation of {} bytes", handle.alloc_len))
                })?;
            let h =
                result::vmm::import_fd(fd).map_err(cuda_err("cuMemImportFromShareableHandle"))?;
            vmm_map(state, device, dev, h, size, gran)
        })?;
        let ptr = mapped.ptr;
        Ok(IpcMapping::new(
            ptr,
            handle,
            device,
            Some(Box::new(mapped)),
            state.errors.clone(),
        ))
    }

    unsafe fn copy_async(
        &self,
        device: u64,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<AsyncCopy> {
        if len == 0 {
            return Ok(AsyncCopy::done());
        }
        let state = self.state()?;
        let ev = state.with_ctx("copy_async", device, |dc| {
            // SAFETY: the caller keeps both ranges valid until the event says the copy is
            // done; the stream belongs to this context.
            unsafe { result::async_copy::memcpy(dst as u64, src as u64, len, dc.stream) }
                .map_err(cuda_err("cuMemcpyAsync"))?;
            // SAFETY: as above.
            unsafe { result::async_copy::record(dc.stream) }.map_err(cuda_err("cuEventRecord"))
        })?;
        Ok(AsyncCopy::pending(Box::new(CopyEvent {
            state: state.clone(),
            ev,
        })))
    }

    fn dmabuf(&self, addr: *const u8, len: usize) -> Result<Dmabuf> {
        const OP: &str = "cuMemGetHandleForAddressRange";
        check_len(OP, len)?;
        let state = self.state()?;
        let Some(owner) = self.owns(addr)? else {
            return Err(HmemError::inval(OP, "not CUDA device memory"));
        };
        if !result::has_symbol(OP) {
            return Err(HmemError::unsupported(
                Iface::Cuda,
                OP,
                "the driver has no cuMemGetHandleForAddressRange (older than CUDA 11.7)",
            ));
        }
        let (start, span, offset) = page_span(addr as u64, len, crate::page_size() as u64)
            .ok_or_else(|| HmemError::inval(OP, "the range wraps"))?;
        let span = usize::try_from(span).map_err(|_| HmemError::inval(OP, "too long"))?;
        state.with_ctx(OP, owner.device, |_| {
            let fd = result::dmabuf_fd(start, span).map_err(cuda_err(OP))?;
            Ok(Dmabuf { fd, offset })
        })
    }

    fn take_drop_errors(&self) -> Vec<HmemError> {
        match &self.state {
            Ok(s) => s.errors.take(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::page_span;

    #[test]
    fn dmabuf_spans_cover_whole_pages() {
        assert_eq!(page_span(0x10000, 4096, 4096), Some((0x10000, 4096, 0)));
        assert_eq!(page_span(0x10010, 4096, 4096), Some((0x10000, 8192, 0x10)));
        assert_eq!(page_span(0x10fff, 1, 4096), Some((0x10000, 4096, 0xfff)));
        assert_eq!(page_span(u64::MAX - 8, 16, 4096), None);
    }
}
