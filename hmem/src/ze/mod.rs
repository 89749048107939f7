//! `FI_HMEM_ZE`: oneAPI Level Zero, through the loader library opened at run time.
//!
//! The library is `libze_loader.so.1`, or the path in `XFABRIC_ZE_LOADER` (tests point it at a
//! double). Probe order: load and resolve every entry point, `zeInit(GPU_ONLY)`, the first
//! driver with at least one device, one context for it. Any failure leaves the interface
//! unavailable with that reason.
//!
//! Copies go through one synchronous immediate command list per device (created on first use,
//! used under a lock), so a copy has completed when it returns. Level Zero's core API has no
//! host-memory registration; `host_register` is a no-op, as in libfabric.
//!
//! IPC handles carry a file descriptor of the exporting process in their first four bytes (the
//! dma-buf fd Intel's driver puts there, which UMF and MPICH also rely on). Opening a handle
//! from another process first duplicates that descriptor with `pidfd_getfd`, which needs the
//! same ptrace permission as cross-memory attach.

pub mod result;
pub mod sys;

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{DropErrors, HmemError, Unavailable};
use crate::mem::{DeviceBuffer, HostMapped, IpcHandle, IpcMapping, Release};
use crate::{check_len, page_size, DeviceInfo, HmemIface, Iface, Owner, Result};
use sys::{ze_command_list_handle_t, ze_context_handle_t, ze_device_handle_t, ZeApi};

/// Environment variable that names the loader (core's `settings::ZE_LOADER`, which holds the
/// default soname).
pub const LOADER_ENV: &str = "XFABRIC_ZE_LOADER";

/// The Level Zero interface.
#[derive(Debug)]
pub struct Ze {
    loader: String,
    state: Result<Arc<ZeState>, Unavailable>,
}

/// The loaded library, one context, the devices; every resource made from them holds an
/// `Arc`, so the context is destroyed only after the last allocation is freed.
struct ZeState {
    api: ZeApi,
    ctx: ze_context_handle_t,
    devices: Vec<ZeDevice>,
    errors: Arc<DropErrors>,
}

struct ZeDevice {
    handle: ze_device_handle_t,
    info: DeviceInfo,
    /// The copy list, created on first use. Command lists are not thread-safe: the lock is
    /// held for the whole append.
    list: Mutex<Option<ze_command_list_handle_t>>,
}

// SAFETY: Level Zero handles are usable from any thread; the one non-thread-safe object (the
// command list) is only touched under its mutex.
unsafe impl Send for ZeState {}
// SAFETY: as above.
unsafe impl Sync for ZeState {}

impl std::fmt::Debug for ZeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeState")
            .field(
                "devices",
                &self.devices.iter().map(|d| &d.info).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ZeState {
    fn probe(path: &str) -> Result<ZeState, String> {
        // SAFETY: the path names a Level Zero loader, or a double with its ABI (tests).
        let api = unsafe { ZeApi::load(path) }?;
        result::init(&api).map_err(|e| format!("{e} (no Level Zero GPU driver is usable)"))?;
        let drivers = result::drivers(&api).map_err(|e| e.to_string())?;
        let mut found = None;
        for driver in drivers {
            // SAFETY: `driver` came from zeDriverGet.
            let devs = unsafe { result::devices(&api, driver) }.map_err(|e| e.to_string())?;
            if !devs.is_empty() {
                found = Some((driver, devs));
                break;
            }
        }
        let Some((driver, devs)) = found else {
            return Err("no Level Zero driver reports a device".into());
        };
        let mut devices = Vec::with_capacity(devs.len());
        for (i, handle) in devs.into_iter().enumerate() {
            // SAFETY: `handle` came from zeDeviceGet.
            let name = unsafe { result::device_name(&api, handle) }
                .unwrap_or_else(|e| format!("unnamed ({e})"));
            devices.push(ZeDevice {
                handle,
                info: DeviceInfo {
                    index: i as u64,
                    name,
                },
                list: Mutex::new(None),
            });
        }
        // SAFETY: `driver` came from zeDriverGet.
        let ctx = unsafe { result::context_create(&api, driver) }.map_err(|e| e.to_string())?;
        Ok(ZeState {
            api,
            ctx,
            devices,
            errors: Arc::default(),
        })
    }

    fn device(&self, op: &'static str, device: u64) -> Result<&ZeDevice> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                HmemError::inval(
                    op,
                    format!(
                        "no Level Zero device {device} ({} present)",
                        self.devices.len()
                    ),
                )
            })
    }

    /// Copies `len` bytes with `device`'s command list.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `len` bytes, not overlap, and not be touched by
    /// anything else during the copy.
    unsafe fn copy(
        &self,
        op: &'static str,
        device: u64,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
    ) -> Result<()> {
        let d = self.device(op, device)?;
        let mut slot = d.list.lock().unwrap_or_else(|p| p.into_inner());
        let list = match *slot {
            Some(l) => l,
            None => {
                // SAFETY: context and device are live.
                let l = unsafe { result::immediate_list(&self.api, self.ctx, d.handle) }?;
                *slot = Some(l);
                l
            }
        };
        // SAFETY: the list is ours alone under the lock; the caller vouches for the ranges.
        unsafe { result::copy(&self.api, list, dst, src, len) }
    }

    fn index_of(&self, dev: ze_device_handle_t) -> Option<u64> {
        self.devices
            .iter()
            .position(|d| d.handle == dev)
            .map(|i| i as u64)
    }
}

impl Drop for ZeState {
    fn drop(&mut self) {
        for d in &mut self.devices {
            if let Some(list) = d.list.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
                // SAFETY: idle (no copy runs without a borrow of this state).
                let _ = unsafe { result::list_destroy(&self.api, list) };
            }
        }
        // SAFETY: every allocation and mapping held an Arc of this state and is gone.
        let _ = unsafe { result::context_destroy(&self.api, self.ctx) };
    }
}

impl Default for Ze {
    fn default() -> Self {
        Self::new()
    }
}

impl Ze {
    /// Probes the loader named by `XFABRIC_ZE_LOADER`, or `libze_loader.so.1`.
    pub fn new() -> Self {
        Self::with_loader(xfabric_core::settings::ZE_LOADER.text_or_default())
    }

    /// Probes the loader at `path`. Never panics: a missing library, a missing entry point, a
    /// failed `zeInit` or no device leaves the interface unavailable with that reason.
    pub fn with_loader(path: &str) -> Self {
        Ze {
            loader: path.to_string(),
            state: ZeState::probe(path)
                .map(Arc::new)
                .map_err(|reason| Unavailable {
                    iface: Iface::Ze,
                    reason,
                }),
        }
    }

    /// The library this interface loaded (or tried to).
    pub fn loader(&self) -> &str {
        &self.loader
    }

    fn state(&self) -> Result<&Arc<ZeState>> {
        self.state.as_ref().map_err(|u| u.clone().into())
    }
}

/// Memory from `zeMemAllocHost` / `zeMemAllocDevice`.
struct ZeAlloc {
    state: Arc<ZeState>,
    ptr: usize,
}

impl Release for ZeAlloc {
    fn release(&mut self) -> Result<()> {
        // SAFETY: `ptr` came from this context's allocations and is freed once.
        unsafe { result::mem_free(&self.state.api, self.state.ctx, self.ptr as *mut c_void) }
    }
}

/// A mapping from `zeMemOpenIpcHandle`.
struct ZeIpcOpened {
    state: Arc<ZeState>,
    ptr: usize,
}

impl Release for ZeIpcOpened {
    fn release(&mut self) -> Result<()> {
        // SAFETY: `ptr` came from zeMemOpenIpcHandle on this context and is closed once.
        unsafe { result::ipc_close(&self.state.api, self.state.ctx, self.ptr as *const c_void) }
    }
}

/// Duplicates file descriptor `fd` of process `pid` into this process (`pidfd_getfd`).
fn import_fd(pid: u32, fd: i32) -> Result<i32> {
    // SAFETY: plain syscalls; the descriptors are closed below or handed to the caller.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return Err(HmemError::last_os("pidfd_open"));
        }
        let local = libc::syscall(libc::SYS_pidfd_getfd, pidfd as i32, fd, 0);
        let err = (local < 0).then(|| HmemError::last_os("pidfd_getfd"));
        libc::close(pidfd as i32);
        match err {
            Some(e) => Err(e),
            None => Ok(local as i32),
        }
    }
}

impl HmemIface for Ze {
    fn iface(&self) -> Iface {
        Iface::Ze
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
        let s = self.state()?;
        // SAFETY: the context is live; any address may be queried.
        let (ty, dev) = unsafe { result::alloc_properties(&s.api, s.ctx, addr.cast()) }?;
        match ty {
            sys::ZE_MEMORY_TYPE_DEVICE | sys::ZE_MEMORY_TYPE_SHARED => match s.index_of(dev) {
                Some(device) => Ok(Some(Owner {
                    iface: Iface::Ze,
                    device,
                })),
                None => Err(HmemError::inval(
                    "owns",
                    format!("{addr:p} belongs to a Level Zero device outside this driver's list"),
                )),
            },
            _ => Ok(None),
        }
    }

    unsafe fn copy_from_host(&self, device: u64, dst: *mut u8, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's contract covers `dst`; `src` is a live borrow.
        unsafe {
            self.state()?.copy(
                "copy_from_host",
                device,
                dst.cast(),
                src.as_ptr().cast(),
                src.len(),
            )
        }
    }

    unsafe fn copy_to_host(&self, device: u64, dst: &mut [u8], src: *const u8) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's contract covers `src`; `dst` is an exclusive borrow.
        unsafe {
            self.state()?.copy(
                "copy_to_host",
                device,
                dst.as_mut_ptr().cast(),
                src.cast(),
                dst.len(),
            )
        }
    }

    unsafe fn host_register(&self, _addr: *mut u8, len: usize) -> Result<()> {
        self.state()?;
        check_len("host_register", len)
    }

    unsafe fn host_unregister(&self, _addr: *mut u8) -> Result<()> {
        self.state().map(|_| ())
    }

    fn alloc_host_mapped(&self, device: u64, len: usize) -> Result<HostMapped> {
        check_len("alloc_host_mapped", len)?;
        let s = self.state()?;
        // Host allocations belong to the context, so every device reaches them; the device is
        // checked only to keep the contract the same as CUDA's.
        s.device("alloc_host_mapped", device)?;
        // SAFETY: the context is live.
        let p = unsafe { result::mem_alloc_host(&s.api, s.ctx, len, page_size()) }?;
        let release = Box::new(ZeAlloc {
            state: s.clone(),
            ptr: p as usize,
        });
        let Some(host) = NonNull::new(p.cast::<u8>()) else {
            return Err(HmemError::inval(
                "alloc_host_mapped",
                "zeMemAllocHost returned null",
            ));
        };
        // SAFETY: `len` bytes of host memory were just allocated and are ours alone.
        unsafe { host.as_ptr().write_bytes(0, len) };
        Ok(HostMapped::new(
            host,
            p as u64,
            len,
            (Iface::Ze, device),
            release,
            s.errors.clone(),
        ))
    }

    fn alloc_device(&self, device: u64, len: usize) -> Result<DeviceBuffer> {
        check_len("alloc_device", len)?;
        let s = self.state()?;
        let d = s.device("alloc_device", device)?;
        // SAFETY: context and device are live.
        let p = unsafe { result::mem_alloc_device(&s.api, s.ctx, d.handle, len, page_size()) }?;
        let release = Box::new(ZeAlloc {
            state: s.clone(),
            ptr: p as usize,
        });
        Ok(DeviceBuffer::new(
            p as u64,
            len,
            (Iface::Ze, device),
            release,
            s.errors.clone(),
        ))
    }

    fn ipc_get(&self, addr: *const u8, len: usize) -> Result<IpcHandle> {
        const OP: &str = "ipc_get";
        let s = self.state()?;
        let Some(owner) = self.owns(addr)? else {
            return Err(HmemError::inval(
                OP,
                format!("{addr:p} is not Level Zero device memory"),
            ));
        };
        // SAFETY: the context is live and `addr` is one of its allocations.
        let (base, size) = unsafe { result::address_range(&s.api, s.ctx, addr.cast()) }?;
        // SAFETY: `base` is the base of that live allocation.
        let raw = unsafe { result::ipc_get(&s.api, s.ctx, base) }?;
        let handle = IpcHandle {
            iface: Iface::Ze,
            pid: crate::memfd::this_pid(),
            device: owner.device,
            alloc_id: 0,
            base: base as u64,
            alloc_len: size as u64,
            offset: (addr as u64).saturating_sub(base as u64),
            raw,
        };
        handle.check_range(OP, len)?;
        Ok(handle)
    }

    fn ipc_open(&self, device: u64, handle: &IpcHandle) -> Result<IpcMapping> {
        const OP: &str = "ipc_open";
        let s = self.state()?;
        if handle.iface != Iface::Ze {
            return Err(HmemError::inval(
                OP,
                format!("a {} handle given to Level Zero", handle.iface),
            ));
        }
        let d = s.device(OP, device)?;
        let mut raw = handle.raw;
        let mut imported = None;
        if handle.pid != std::process::id() {
            let remote = i32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let local = import_fd(handle.pid, remote)?;
            raw[..4].copy_from_slice(&local.to_ne_bytes());
            imported = Some(local);
        }
        // SAFETY: context and device are live; the descriptor in `raw` is valid here.
        let opened = unsafe { result::ipc_open(&s.api, s.ctx, d.handle, &raw) };
        if let Some(fd) = imported {
            // The driver has imported the buffer (or failed); our duplicate is not needed.
            // SAFETY: `fd` was created by import_fd and is closed once.
            unsafe { libc::close(fd) };
        }
        let p = opened?;
        let release = Box::new(ZeIpcOpened {
            state: s.clone(),
            ptr: p as usize,
        });
        Ok(IpcMapping::new(
            p as u64,
            handle,
            device,
            Some(release),
            s.errors.clone(),
        ))
    }

    fn take_drop_errors(&self) -> Vec<HmemError> {
        match &self.state {
            Ok(s) => s.errors.take(),
            Err(_) => Vec::new(),
        }
    }
}
