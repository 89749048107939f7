//! Thin `Result`-returning Level Zero calls over [`super::sys`]: each checks the `ze_result_t`,
//! names the call in the error, and turns out-parameters into return values. Handles stay raw;
//! ownership is the safe layer's business.

use std::ffi::{c_void, CStr};
use std::ptr;

use super::sys::{self, *};
use crate::{HmemError, Result};

fn check(op: &'static str, r: ze_result_t) -> Result<()> {
    if r == ZE_RESULT_SUCCESS {
        Ok(())
    } else {
        Err(HmemError::Ze {
            op,
            code: r,
            name: sys::result_name(r),
        })
    }
}

/// `zeInit(ZE_INIT_FLAG_GPU_ONLY)`.
pub fn init(api: &ZeApi) -> Result<()> {
    // SAFETY: no pointers involved.
    check("zeInit", unsafe { (api.zeInit)(ZE_INIT_FLAG_GPU_ONLY) })
}

/// `zeDriverGet`, both calls (count, then handles).
pub fn drivers(api: &ZeApi) -> Result<Vec<ze_driver_handle_t>> {
    let mut n = 0u32;
    // SAFETY: a null array with a zero count asks for the count only.
    check("zeDriverGet", unsafe {
        (api.zeDriverGet)(&mut n, ptr::null_mut())
    })?;
    let mut v = vec![ptr::null_mut(); n as usize];
    // SAFETY: `v` has room for `n` handles.
    check("zeDriverGet", unsafe {
        (api.zeDriverGet)(&mut n, v.as_mut_ptr())
    })?;
    v.truncate(n as usize);
    Ok(v)
}

/// `zeDeviceGet`, both calls.
///
/// # Safety
/// `driver` must come from [`drivers`].
pub unsafe fn devices(api: &ZeApi, driver: ze_driver_handle_t) -> Result<Vec<ze_device_handle_t>> {
    let mut n = 0u32;
    // SAFETY: count query; the caller vouches for `driver`.
    check("zeDeviceGet", unsafe {
        (api.zeDeviceGet)(driver, &mut n, ptr::null_mut())
    })?;
    let mut v = vec![ptr::null_mut(); n as usize];
    // SAFETY: `v` has room for `n` handles.
    check("zeDeviceGet", unsafe {
        (api.zeDeviceGet)(driver, &mut n, v.as_mut_ptr())
    })?;
    v.truncate(n as usize);
    Ok(v)
}

/// The device's name from `zeDeviceGetProperties`.
///
/// # Safety
/// `dev` must come from [`devices`].
pub unsafe fn device_name(api: &ZeApi, dev: ze_device_handle_t) -> Result<String> {
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut p: ze_device_properties_t = unsafe { std::mem::zeroed() };
    p.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    // SAFETY: `p` is a properly typed, writable properties struct.
    check("zeDeviceGetProperties", unsafe {
        (api.zeDeviceGetProperties)(dev, &mut p)
    })?;
    let bytes: Vec<u8> = p.name.iter().map(|&c| c as u8).collect();
    Ok(CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned()))
}

/// `zeContextCreate` with default flags.
///
/// # Safety
/// `driver` must come from [`drivers`].
pub unsafe fn context_create(
    api: &ZeApi,
    driver: ze_driver_handle_t,
) -> Result<ze_context_handle_t> {
    let desc = ze_context_desc_t {
        stype: ZE_STRUCTURE_TYPE_CONTEXT_DESC,
        pNext: ptr::null(),
        flags: 0,
    };
    let mut ctx = ptr::null_mut();
    // SAFETY: `desc` and `ctx` are valid for the call.
    check("zeContextCreate", unsafe {
        (api.zeContextCreate)(driver, &desc, &mut ctx)
    })?;
    Ok(ctx)
}

/// `zeContextDestroy`.
///
/// # Safety
/// `ctx` must be live, with nothing allocated from it still in use.
pub unsafe fn context_destroy(api: &ZeApi, ctx: ze_context_handle_t) -> Result<()> {
    // SAFETY: the caller's contract.
    check("zeContextDestroy", unsafe { (api.zeContextDestroy)(ctx) })
}

/// `zeMemAllocHost`: host memory every device of the context can access.
///
/// # Safety
/// `ctx` must be live.
pub unsafe fn mem_alloc_host(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    len: usize,
    align: usize,
) -> Result<*mut c_void> {
    let desc = ze_host_mem_alloc_desc_t {
        stype: ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC,
        pNext: ptr::null(),
        flags: 0,
    };
    let mut p = ptr::null_mut();
    // SAFETY: `desc` and `p` are valid for the call.
    check("zeMemAllocHost", unsafe {
        (api.zeMemAllocHost)(ctx, &desc, len, align, &mut p)
    })?;
    Ok(p)
}

/// `zeMemAllocDevice` on `dev`.
///
/// # Safety
/// `ctx` must be live and `dev` one of its driver's devices.
pub unsafe fn mem_alloc_device(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    dev: ze_device_handle_t,
    len: usize,
    align: usize,
) -> Result<*mut c_void> {
    let desc = ze_device_mem_alloc_desc_t {
        stype: ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        pNext: ptr::null(),
        flags: 0,
        ordinal: 0,
    };
    let mut p = ptr::null_mut();
    // SAFETY: `desc` and `p` are valid for the call.
    check("zeMemAllocDevice", unsafe {
        (api.zeMemAllocDevice)(ctx, &desc, len, align, dev, &mut p)
    })?;
    Ok(p)
}

/// `zeMemFree`.
///
/// # Safety
/// `p` must come from this context's allocations and not be in use.
pub unsafe fn mem_free(api: &ZeApi, ctx: ze_context_handle_t, p: *mut c_void) -> Result<()> {
    // SAFETY: the caller's contract.
    check("zeMemFree", unsafe { (api.zeMemFree)(ctx, p) })
}

/// `zeMemGetAllocProperties`: the memory type (`ZE_MEMORY_TYPE_*`) and owning device (null for
/// host memory). Any address may be asked about.
///
/// # Safety
/// `ctx` must be live.
pub unsafe fn alloc_properties(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    p: *const c_void,
) -> Result<(u32, ze_device_handle_t)> {
    let mut props = ze_memory_allocation_properties_t {
        stype: ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES,
        pNext: ptr::null_mut(),
        type_: ZE_MEMORY_TYPE_UNKNOWN,
        id: 0,
        pageSize: 0,
    };
    let mut dev = ptr::null_mut();
    // SAFETY: `props` and `dev` are valid out-parameters.
    check("zeMemGetAllocProperties", unsafe {
        (api.zeMemGetAllocProperties)(ctx, p, &mut props, &mut dev)
    })?;
    Ok((props.type_, dev))
}

/// `zeMemGetAddressRange`: base and size of the allocation holding `p`.
///
/// # Safety
/// `ctx` must be live.
pub unsafe fn address_range(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    p: *const c_void,
) -> Result<(*mut c_void, usize)> {
    let (mut base, mut size) = (ptr::null_mut(), 0usize);
    // SAFETY: valid out-parameters.
    check("zeMemGetAddressRange", unsafe {
        (api.zeMemGetAddressRange)(ctx, p, &mut base, &mut size)
    })?;
    Ok((base, size))
}

/// `zeMemGetIpcHandle` for the allocation whose base is `base`.
///
/// # Safety
/// `ctx` must be live and `base` a live allocation of it.
pub unsafe fn ipc_get(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    base: *const c_void,
) -> Result<[u8; 64]> {
    let mut h = ze_ipc_mem_handle_t { data: [0; 64] };
    // SAFETY: `h` is a valid out-parameter.
    check("zeMemGetIpcHandle", unsafe {
        (api.zeMemGetIpcHandle)(ctx, base, &mut h)
    })?;
    Ok(h.data.map(|c| c as u8))
}

/// `zeMemOpenIpcHandle` on `dev`.
///
/// # Safety
/// `ctx` must be live and `dev` one of its driver's devices; any file descriptor inside `raw`
/// must be valid in this process.
pub unsafe fn ipc_open(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    dev: ze_device_handle_t,
    raw: &[u8; 64],
) -> Result<*mut c_void> {
    let h = ze_ipc_mem_handle_t {
        data: raw.map(|b| b as std::ffi::c_char),
    };
    let mut p = ptr::null_mut();
    // SAFETY: the handle is passed by value; `p` is a valid out-parameter.
    check("zeMemOpenIpcHandle", unsafe {
        (api.zeMemOpenIpcHandle)(ctx, dev, h, 0, &mut p)
    })?;
    Ok(p)
}

/// `zeMemCloseIpcHandle`.
///
/// # Safety
/// `p` must come from [`ipc_open`] on `ctx` and not be in use.
pub unsafe fn ipc_close(api: &ZeApi, ctx: ze_context_handle_t, p: *const c_void) -> Result<()> {
    // SAFETY: the caller's contract.
    check("zeMemCloseIpcHandle", unsafe {
        (api.zeMemCloseIpcHandle)(ctx, p)
    })
}

/// `zeCommandListCreateImmediate` in synchronous mode on queue group 0, so each append returns
/// when its command has completed.
///
/// # Safety
/// `ctx` must be live and `dev` one of its driver's devices.
pub unsafe fn immediate_list(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    dev: ze_device_handle_t,
) -> Result<ze_command_list_handle_t> {
    let desc = ze_command_queue_desc_t {
        stype: ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
        pNext: ptr::null(),
        ordinal: 0,
        index: 0,
        flags: 0,
        mode: ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
        priority: ZE_COMMAND_QUEUE_PRIORITY_NORMAL,
    };
    let mut list = ptr::null_mut();
    // SAFETY: `desc` and `list` are valid for the call.
    check("zeCommandListCreateImmediate", unsafe {
        (api.zeCommandListCreateImmediate)(ctx, dev, &desc, &mut list)
    })?;
    Ok(list)
}

/// `zeCommandListAppendMemoryCopy` with no events; on a synchronous immediate list it returns
/// once the bytes are copied.
///
/// # Safety
/// `list` must be a live synchronous immediate list used by one thread at a time; `dst` and
/// `src` must be valid for `len` bytes and not overlap.
pub unsafe fn copy(
    api: &ZeApi,
    list: ze_command_list_handle_t,
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check("zeCommandListAppendMemoryCopy", unsafe {
        (api.zeCommandListAppendMemoryCopy)(
            list,
            dst,
            src,
            len,
            ptr::null_mut(),
            0,
            ptr::null_mut(),
        )
    })
}

/// `zeCommandListDestroy`.
///
/// # Safety
/// `list` must be live and idle.
pub unsafe fn list_destroy(api: &ZeApi, list: ze_command_list_handle_t) -> Result<()> {
    // SAFETY: the caller's contract.
    check("zeCommandListDestroy", unsafe {
        (api.zeCommandListDestroy)(list)
    })
}
