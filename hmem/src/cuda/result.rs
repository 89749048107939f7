//! Thin `Result`-returning CUDA driver calls, the middle layer: cudarc's `driver::result` where
//! it has the call, and the same style over `cudarc::driver::sys` for the calls it lacks
//! (pointer attributes, host registration, host-pointer mapping, IPC, context push/pop).
//!
//! cudarc's `sys` resolves each symbol on first use and panics if libcuda or the symbol is
//! missing, so [`probe_library`] must succeed before anything else here is called.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::mem::MaybeUninit;

pub use cudarc::driver::result::{ctx, device, free_host, free_sync, init, malloc_host};
pub use cudarc::driver::result::{malloc_sync, memcpy_dtoh_async, memcpy_htod_async};
pub use cudarc::driver::result::{primary_ctx, stream, DriverError};
use cudarc::driver::sys;

/// Every driver symbol xfabric calls, directly or through cudarc's result layer.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemcpyAsync",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
];

/// Checks that libcuda loads and exports every symbol in [`REQUIRED_SYMBOLS`]; otherwise says
/// why. After `Ok`, cudarc's lazy symbol loading cannot panic for those symbols.
pub fn probe_library() -> Result<(), String> {
    // SAFETY: only tries to dlopen cudarc's candidate names for libcuda.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "libcuda could not be loaded (tried libcuda.so, libcuda.so.1 and the other \
                    names cudarc knows): no NVIDIA driver is installed"
                .into(),
        );
    }
    // SAFETY: is_culib_present just loaded it, so culib() finds it instead of panicking.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_SYMBOLS
        .iter()
        .copied()
        // SAFETY: looking a symbol up runs no code; the pointer is not used.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "libcuda lacks {} (a driver older than CUDA 11?)",
            missing.join(", ")
        ));
    }
    Ok(())
}

/// Whether the loaded libcuda exports `name` (a call newer than [`REQUIRED_SYMBOLS`]: cudarc
/// would panic calling it where it is missing). Only after [`probe_library`] succeeded.
pub fn has_symbol(name: &str) -> bool {
    // SAFETY: probe_library loaded the library; looking a symbol up runs no code.
    let lib = unsafe { sys::culib() };
    // SAFETY: as above; the pointer is not used.
    unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok()
}

/// `cuMemGetHandleForAddressRange(DMA_BUF_FD)` (CUDA 11.7 and later, where the device and its
/// kernel driver support dma-buf): a dma-buf for `size` bytes of device memory at `ptr`,
/// both host-page aligned. Only where [`has_symbol`] says the driver has the call.
pub fn dmabuf_fd(ptr: sys::CUdeviceptr, size: usize) -> Result<std::os::fd::OwnedFd, DriverError> {
    use std::os::fd::FromRawFd;
    let mut fd: c_int = -1;
    // SAFETY: writes one int (the descriptor) on success.
    unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut c_int).cast(),
            ptr,
            size,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    }
    .result()?;
    // SAFETY: a new descriptor the driver made for us, owned once here.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
pub fn driver_version() -> Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// `cuDeviceGetName`, without cudarc's panic on a name that fills the buffer.
pub fn device_name(dev: sys::CUdevice) -> Result<String, DriverError> {
    let mut buf = [0u8; 256];
    // SAFETY: the driver writes at most `buf.len()` bytes.
    unsafe { sys::cuDeviceGetName(buf.as_mut_ptr().cast(), buf.len() as c_int, dev) }.result()?;
    let name = CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&buf).into_owned());
    Ok(name)
}

/// `cuCtxPushCurrent` / `cuCtxPopCurrent`.
pub mod ctx_stack {
    use super::*;

    /// Makes `ctx` current on this thread, above the caller's.
    ///
    /// # Safety
    /// `ctx` must be a live context.
    pub unsafe fn push(ctx: sys::CUcontext) -> Result<(), DriverError> {
        // SAFETY: the caller guarantees the context is live.
        unsafe { sys::cuCtxPushCurrent_v2(ctx) }.result()
    }

    /// Restores the context that was current before the matching `push`.
    pub fn pop() -> Result<sys::CUcontext, DriverError> {
        let mut ctx = MaybeUninit::uninit();
        // SAFETY: writes one context handle.
        unsafe { sys::cuCtxPopCurrent_v2(ctx.as_mut_ptr()) }.result()?;
        // SAFETY: initialised on success.
        Ok(unsafe { ctx.assume_init() })
    }
}

/// Pointer queries (`cuPointerGetAttribute`, `cuMemGetAddressRange`).
pub mod pointer {
    use super::*;

    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: a `CUmemorytype` value. Any address may be asked
    /// about; memory CUDA does not know answers `CUDA_ERROR_INVALID_VALUE`.
    pub fn memory_type(ptr: sys::CUdeviceptr) -> Result<u32, DriverError> {
        let mut v: c_uint = 0;
        // SAFETY: MEMORY_TYPE writes one unsigned int.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut v as *mut c_uint).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        }
        .result()?;
        Ok(v)
    }

    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    pub fn device_ordinal(ptr: sys::CUdeviceptr) -> Result<i32, DriverError> {
        let mut v: c_int = 0;
        // SAFETY: DEVICE_ORDINAL writes one int.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut v as *mut c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        }
        .result()?;
        Ok(v)
    }

    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: the allocation's id, unique for the life of the
    /// process (an allocation made later at the same address has another).
    pub fn buffer_id(ptr: sys::CUdeviceptr) -> Result<u64, DriverError> {
        let mut v: u64 = 0;
        // SAFETY: BUFFER_ID writes one unsigned long long.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut v as *mut u64).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                ptr,
            )
        }
        .result()?;
        Ok(v)
    }

    /// Base and size of the allocation holding `ptr`.
    pub fn address_range(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize), DriverError> {
        let (mut base, mut size) = (0, 0);
        // SAFETY: writes a device pointer and a size.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }.result()?;
        Ok((base, size))
    }
}

/// Page-locked host memory (`cuMemHostRegister`, `cuMemHostGetDevicePointer`).
pub mod host {
    use super::*;

    /// Pins `len` bytes at `ptr` for every context, mapped into the device address space.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped host memory that stays mapped until `unregister`.
    pub unsafe fn register(ptr: *mut c_void, len: usize) -> Result<(), DriverError> {
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemHostRegister_v2(ptr, len, flags) }.result()
    }

    /// Unpins memory pinned by `register`.
    ///
    /// # Safety
    /// `ptr` must have been registered; no device access to it may be in flight.
    pub unsafe fn unregister(ptr: *mut c_void) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemHostUnregister(ptr) }.result()
    }

    /// The device address of mapped, page-locked host memory.
    ///
    /// # Safety
    /// `ptr` must come from `cuMemHostAlloc(DEVICEMAP)` or a `DEVICEMAP` registration.
    pub unsafe fn device_pointer(ptr: *mut c_void) -> Result<sys::CUdeviceptr, DriverError> {
        let mut d = 0;
        // SAFETY: the caller's contract; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, ptr, 0) }.result()?;
        Ok(d)
    }
}

/// Legacy CUDA IPC (`cuIpcGetMemHandle` family), which works on `cuMemAlloc` memory.
pub mod ipc {
    use super::*;

    /// A handle to the allocation whose base is `base`.
    ///
    /// # Safety
    /// `base` must be the base of a live `cuMemAlloc` allocation.
    pub unsafe fn get(base: sys::CUdeviceptr) -> Result<[u8; 64], DriverError> {
        let mut h = MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: writes one 64-byte handle.
        unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), base) }.result()?;
        // SAFETY: initialised on success.
        let h = unsafe { h.assume_init() };
        Ok(h.reserved.map(|c| c as u8))
    }

    /// Maps another process's allocation into the current context.
    pub fn open(raw: &[u8; 64]) -> Result<sys::CUdeviceptr, DriverError> {
        let handle = sys::CUipcMemHandle {
            reserved: raw.map(|b| b as std::ffi::c_char),
        };
        let mut d = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        // SAFETY: the handle is passed by value; the driver validates it.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut d, handle, flags) }.result()?;
        Ok(d)
    }

    /// Unmaps what `open` mapped.
    ///
    /// # Safety
    /// `mapped` must come from `open` and not be closed yet; nothing may still use it.
    pub unsafe fn close(mapped: sys::CUdeviceptr) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuIpcCloseMemHandle(mapped) }.result()
    }
}

/// Copies ordered on a stream, and the events that say when they are done.
pub mod async_copy {
    use super::*;

    /// `cuMemcpyAsync`: `n` bytes from `src` to `dst` (either host or device memory, under
    /// unified addressing) on `stream`, returning before they move.
    ///
    /// # Safety
    /// Both ranges must stay valid, and `dst` otherwise untouched, until the copy is done.
    pub unsafe fn memcpy(
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        n: usize,
        stream: sys::CUstream,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemcpyAsync(dst, src, n, stream) }.result()
    }

    /// `cuEventCreate(DISABLE_TIMING)` then `cuEventRecord` on `stream`: an event that
    /// completes once everything queued on `stream` so far has.
    ///
    /// # Safety
    /// `stream` must be live, in the current context.
    pub unsafe fn record(stream: sys::CUstream) -> Result<sys::CUevent, DriverError> {
        let mut ev = MaybeUninit::uninit();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        // SAFETY: writes one event handle.
        unsafe { sys::cuEventCreate(ev.as_mut_ptr(), flags) }.result()?;
        // SAFETY: initialised on success.
        let ev = unsafe { ev.assume_init() };
        // SAFETY: both live; on failure the event is destroyed here, once.
        if let Err(e) = unsafe { sys::cuEventRecord(ev, stream) }.result() {
            let _ = unsafe { sys::cuEventDestroy_v2(ev) };
            return Err(e);
        }
        Ok(ev)
    }

    /// `cuEventQuery`: `Ok(true)` once done, `Ok(false)` while `CUDA_ERROR_NOT_READY`;
    /// never waits.
    ///
    /// # Safety
    /// `ev` must be a live event.
    pub unsafe fn query(ev: sys::CUevent) -> Result<bool, DriverError> {
        // SAFETY: the caller's contract.
        match unsafe { sys::cuEventQuery(ev) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(DriverError(e)),
        }
    }

    /// `cuEventDestroy`.
    ///
    /// # Safety
    /// `ev` must be a live event, destroyed once.
    pub unsafe fn destroy(ev: sys::CUevent) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuEventDestroy_v2(ev) }.result()
    }
}

/// The virtual-memory-management calls (`cuMemCreate` and its family, CUDA 10.2 and later)
/// and the shareable handles of their allocations (`cuMemExportToShareableHandle`, CUDA 11
/// and later for the POSIX descriptor type). Not in [`REQUIRED_SYMBOLS`]: a driver without
/// them still serves everything else, and these answer `Unsupported` there ([`has_vmm`]).
pub mod vmm {
    use super::*;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    /// Every driver symbol the calls below use.
    pub const SYMBOLS: &[&str] = &[
        "cuDeviceGetAttribute",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
        "cuMemGetAllocationGranularity",
        "cuMemRetainAllocationHandle",
        "cuMemGetAllocationPropertiesFromHandle",
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
    ];

    /// The symbols of [`SYMBOLS`] the loaded libcuda lacks (empty: the calls below are safe
    /// to make). Only after [`probe_library`] succeeded.
    pub fn missing() -> Vec<&'static str> {
        SYMBOLS.iter().copied().filter(|s| !has_symbol(s)).collect()
    }

    fn device_prop(device: sys::CUdevice, posix_fd: bool) -> sys::CUmemAllocationProp {
        // SAFETY: plain data (integers and a null pointer); all zeroes is valid.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = device;
        if posix_fd {
            p.requestedHandleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        p
    }

    /// `cuDeviceGetAttribute`.
    pub fn attribute(
        device: sys::CUdevice,
        attr: sys::CUdevice_attribute,
    ) -> Result<i32, DriverError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, device) }.result()?;
        Ok(v)
    }

    /// Whether `device` can export allocations as POSIX file descriptors.
    pub fn posix_fd_supported(device: sys::CUdevice) -> Result<bool, DriverError> {
        let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
        Ok(attribute(device, a)? != 0)
    }

    /// `cuMemGetAllocationGranularity(MINIMUM)` for pinned memory on `device`.
    pub fn granularity(device: sys::CUdevice) -> Result<usize, DriverError> {
        let p = device_prop(device, false);
        let mut g = 0usize;
        let opt = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: reads one property struct, writes one size.
        unsafe { sys::cuMemGetAllocationGranularity(&mut g, &p, opt) }.result()?;
        Ok(g)
    }

    /// `cuMemCreate`: `len` bytes (a multiple of the granularity) of pinned memory on `device`,
    /// exportable as a POSIX descriptor where `posix_fd`.
    pub fn create(
        device: sys::CUdevice,
        len: usize,
        posix_fd: bool,
    ) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
        let p = device_prop(device, posix_fd);
        let mut h = 0;
        // SAFETY: reads one property struct, writes one handle.
        unsafe { sys::cuMemCreate(&mut h, len, &p, 0) }.result()?;
        Ok(h)
    }

    /// `cuMemRelease`.
    ///
    /// # Safety
    /// `h` must be a live handle, released once per reference.
    pub unsafe fn release(h: sys::CUmemGenericAllocationHandle) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemRelease(h) }.result()
    }

    /// `cuMemAddressReserve`: `len` bytes of device address space.
    pub fn reserve(len: usize, align: usize) -> Result<sys::CUdeviceptr, DriverError> {
        let mut p = 0;
        // SAFETY: writes one device pointer.
        unsafe { sys::cuMemAddressReserve(&mut p, len, align, 0, 0) }.result()?;
        Ok(p)
    }

    /// `cuMemAddressFree`.
    ///
    /// # Safety
    /// `p, len` must be a reservation with nothing mapped in it any more.
    pub unsafe fn free_address(p: sys::CUdeviceptr, len: usize) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemAddressFree(p, len) }.result()
    }

    /// `cuMemMap` of the whole of `h` (from its start) at `p`, then `cuMemSetAccess` giving
    /// `device` read and write access. On failure nothing stays mapped.
    ///
    /// # Safety
    /// `p..p + len` must lie in a reservation of this process with nothing mapped there.
    pub unsafe fn map(
        p: sys::CUdeviceptr,
        len: usize,
        h: sys::CUmemGenericAllocationHandle,
        device: sys::CUdevice,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract; the driver checks `len` against the allocation.
        unsafe { sys::cuMemMap(p, len, 0, h, 0) }.result()?;
        // SAFETY: plain data; all zeroes is valid.
        let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = device;
        d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: reads one access descriptor; the range was just mapped.
        if let Err(e) = unsafe { sys::cuMemSetAccess(p, len, &d, 1) }.result() {
            // SAFETY: unmaps what was just mapped, once.
            let _ = unsafe { sys::cuMemUnmap(p, len) };
            return Err(e);
        }
        Ok(())
    }

    /// `cuMemUnmap`.
    ///
    /// # Safety
    /// `p, len` must be a mapping made by [`map`] that nothing uses any more.
    pub unsafe fn unmap(p: sys::CUdeviceptr, len: usize) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemUnmap(p, len) }.result()
    }

    /// `cuMemRetainAllocationHandle`: the allocation mapped at `addr` (an error for memory
    /// that is not a VMM mapping). Release it with [`release`].
    pub fn retain(
        addr: sys::CUdeviceptr,
    ) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
        let mut h = 0;
        // SAFETY: writes one handle; the address is only looked up.
        unsafe { sys::cuMemRetainAllocationHandle(&mut h, addr as usize as *mut c_void) }
            .result()?;
        Ok(h)
    }

    /// Whether allocation `h` was created exportable as a POSIX descriptor
    /// (`cuMemGetAllocationPropertiesFromHandle`).
    ///
    /// # Safety
    /// `h` must be a live handle.
    pub unsafe fn exportable_as_fd(
        h: sys::CUmemGenericAllocationHandle,
    ) -> Result<bool, DriverError> {
        // SAFETY: plain data; all zeroes is valid, overwritten on success.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: writes one property struct.
        unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut p, h) }.result()?;
        let fd = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        Ok(p.requestedHandleTypes.0 & fd.0 != 0)
    }

    /// `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`: a new descriptor for `h`.
    ///
    /// # Safety
    /// `h` must be a live handle.
    pub unsafe fn export_fd(h: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd, DriverError> {
        let mut fd: c_int = -1;
        let t = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: writes one int (the descriptor).
        unsafe { sys::cuMemExportToShareableHandle((&mut fd as *mut c_int).cast(), h, t, 0) }
            .result()?;
        // SAFETY: a new descriptor the driver made for us, owned once here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`: the allocation `fd` names (the
    /// driver refuses a descriptor that names none). `fd` stays the caller's.
    pub fn import_fd(fd: BorrowedFd<'_>) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
        let mut h = 0;
        let t = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // The descriptor travels as the pointer's value, as cuda.h asks.
        let os = fd.as_raw_fd() as isize as *mut c_void;
        // SAFETY: writes one handle; the descriptor is only read by the driver.
        unsafe { sys::cuMemImportFromShareableHandle(&mut h, os, t) }.result()?;
        Ok(h)
    }
}
