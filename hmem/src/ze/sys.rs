//! Raw Level Zero FFI: exactly the types and calls xfabric uses, written by hand from the public
//! `ze_api.h` (Level Zero 1.x; no `level-zero-sys` crate exists) and resolved from the loader
//! library at run time. Results stay plain `u32` rather than a Rust enum, so a code this table
//! does not list is still a valid value.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_void};

use libloading::Library;

/// `ze_result_t`.
pub type ze_result_t = u32;
/// `ze_driver_handle_t` and the other opaque handles.
pub type ze_driver_handle_t = *mut c_void;
/// Device handle.
pub type ze_device_handle_t = *mut c_void;
/// Context handle.
pub type ze_context_handle_t = *mut c_void;
/// Command list handle.
pub type ze_command_list_handle_t = *mut c_void;
/// Event handle (only ever null here).
pub type ze_event_handle_t = *mut c_void;

/// `ZE_RESULT_SUCCESS`; every other code is a failure.
pub const ZE_RESULT_SUCCESS: ze_result_t = 0;
/// `ZE_INIT_FLAG_GPU_ONLY`.
pub const ZE_INIT_FLAG_GPU_ONLY: u32 = 1;

/// `ze_structure_type_t` values of the structures below: `ze_device_properties_t`.
pub const ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES: u32 = 0x3;
/// `stype` of `ze_context_desc_t`.
pub const ZE_STRUCTURE_TYPE_CONTEXT_DESC: u32 = 0xd;
/// `stype` of `ze_command_queue_desc_t`.
pub const ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC: u32 = 0xe;
/// `stype` of `ze_device_mem_alloc_desc_t`.
pub const ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC: u32 = 0x15;
/// `stype` of `ze_host_mem_alloc_desc_t`.
pub const ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC: u32 = 0x16;
/// `stype` of `ze_memory_allocation_properties_t`.
pub const ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES: u32 = 0x17;

/// `ze_memory_type_t`: not memory Level Zero allocated.
pub const ZE_MEMORY_TYPE_UNKNOWN: u32 = 0;
/// Host memory allocated by `zeMemAllocHost`.
pub const ZE_MEMORY_TYPE_HOST: u32 = 1;
/// Device memory allocated by `zeMemAllocDevice`.
pub const ZE_MEMORY_TYPE_DEVICE: u32 = 2;
/// Shared memory allocated by `zeMemAllocShared`.
pub const ZE_MEMORY_TYPE_SHARED: u32 = 3;

/// `ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS`: an immediate command list's appends block until done.
pub const ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS: u32 = 1;
/// `ZE_COMMAND_QUEUE_PRIORITY_NORMAL`.
pub const ZE_COMMAND_QUEUE_PRIORITY_NORMAL: u32 = 0;

/// `ZE_MAX_DEVICE_NAME`: bytes of `ze_device_properties_t::name`.
pub const ZE_MAX_DEVICE_NAME: usize = 256;
/// `ZE_MAX_DEVICE_UUID_SIZE`: bytes of a device UUID.
pub const ZE_MAX_DEVICE_UUID_SIZE: usize = 16;
/// `ZE_MAX_IPC_HANDLE_SIZE`: bytes of an IPC memory handle.
pub const ZE_MAX_IPC_HANDLE_SIZE: usize = 64;

/// `ze_context_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_context_desc_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *const c_void,
    /// `ze_context_flags_t`; 0.
    pub flags: u32,
}

/// `ze_host_mem_alloc_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_host_mem_alloc_desc_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *const c_void,
    /// `ze_host_mem_alloc_flags_t` (caching hints); 0.
    pub flags: u32,
}

/// `ze_device_mem_alloc_desc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_mem_alloc_desc_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *const c_void,
    /// `ze_device_mem_alloc_flags_t` (caching hints); 0.
    pub flags: u32,
    /// Which of the device's memories to allocate from (`zeDeviceGetMemoryProperties` order).
    pub ordinal: u32,
}

/// `ze_memory_allocation_properties_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_memory_allocation_properties_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *mut c_void,
    /// `ze_memory_type_t`: a `ZE_MEMORY_TYPE_*` value.
    pub type_: u32,
    /// The allocation's identifier.
    pub id: u64,
    /// The allocation's page size, in bytes.
    pub pageSize: u64,
}

/// `ze_command_queue_desc_t` (the `altdesc` of `zeCommandListCreateImmediate`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_command_queue_desc_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *const c_void,
    /// Command queue group ordinal.
    pub ordinal: u32,
    /// Queue index within the group.
    pub index: u32,
    /// `ze_command_queue_flags_t`; 0.
    pub flags: u32,
    /// `ze_command_queue_mode_t`: a `ZE_COMMAND_QUEUE_MODE_*` value.
    pub mode: u32,
    /// `ze_command_queue_priority_t`: a `ZE_COMMAND_QUEUE_PRIORITY_*` value.
    pub priority: u32,
}

/// `ze_device_properties_t` (only `name` is read).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_device_properties_t {
    /// The `ZE_STRUCTURE_TYPE_*` value naming this structure.
    pub stype: u32,
    /// Extension chain; null here.
    pub pNext: *mut c_void,
    /// `ze_device_type_t` (GPU, CPU, FPGA, ...).
    pub type_: u32,
    /// PCI vendor id.
    pub vendorId: u32,
    /// PCI device id.
    pub deviceId: u32,
    /// `ze_device_property_flags_t` (integrated, sub-device, ECC, on-demand paging).
    pub flags: u32,
    /// Sub-device id; meaningful only for a sub-device.
    pub subdeviceId: u32,
    /// Core clock, in MHz.
    pub coreClockRate: u32,
    /// Largest single allocation, in bytes.
    pub maxMemAllocSize: u64,
    /// Most hardware contexts.
    pub maxHardwareContexts: u32,
    /// Highest command queue priority.
    pub maxCommandQueuePriority: u32,
    /// Hardware threads per execution unit.
    pub numThreadsPerEU: u32,
    /// Physical SIMD width of an execution unit.
    pub physicalEUSimdWidth: u32,
    /// Execution units per sub-slice.
    pub numEUsPerSubslice: u32,
    /// Sub-slices per slice.
    pub numSubslicesPerSlice: u32,
    /// Slices.
    pub numSlices: u32,
    /// Resolution of the device timer (its unit depends on the API version the driver was given).
    pub timerResolution: u64,
    /// Valid bits of a global timestamp.
    pub timestampValidBits: u32,
    /// Valid bits of a kernel timestamp.
    pub kernelTimestampValidBits: u32,
    /// The device's UUID.
    pub uuid: [u8; ZE_MAX_DEVICE_UUID_SIZE],
    /// The device's name, NUL-terminated.
    pub name: [c_char; ZE_MAX_DEVICE_NAME],
}

/// `ze_ipc_mem_handle_t`, passed by value to `zeMemOpenIpcHandle`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ze_ipc_mem_handle_t {
    /// The handle's bytes, opaque, as the exporting process got them.
    pub data: [c_char; ZE_MAX_IPC_HANDLE_SIZE],
}

macro_rules! ze_api {
    ($( $name:ident : fn($($arg:ty),*); )*) => {
        /// The loader library and the entry points resolved from it. The function pointers are
        /// valid while `_lib` is loaded, which is as long as this value lives.
        pub struct ZeApi {
            $(
                #[doc = concat!("`", stringify!($name), "`, resolved from the loader.")]
                pub $name: unsafe extern "C" fn($($arg),*) -> ze_result_t, )*
            _lib: Library,
        }

        impl ZeApi {
            /// Opens `path` and resolves every entry point; the error names the library or the
            /// missing symbol.
            ///
            /// # Safety
            /// Loading runs the library's initialisers: `path` must be a Level Zero loader (or
            /// a library with the same ABI for these calls).
            pub unsafe fn load(path: &str) -> Result<ZeApi, String> {
                // SAFETY: the caller vouches for the library.
                let lib = unsafe { Library::new(path) }
                    .map_err(|e| format!("cannot load {path}: {}", chain(&e)))?;
                $(
                    // SAFETY: the type is the entry point's signature in ze_api.h.
                    let $name = *unsafe {
                        lib.get::<unsafe extern "C" fn($($arg),*) -> ze_result_t>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                    }
                    .map_err(|e| format!("{path} lacks {}: {}", stringify!($name), chain(&e)))?;
                )*
                Ok(ZeApi { $( $name, )* _lib: lib })
            }
        }
    };
}

ze_api! {
    zeInit: fn(u32);
    zeDriverGet: fn(*mut u32, *mut ze_driver_handle_t);
    zeDeviceGet: fn(ze_driver_handle_t, *mut u32, *mut ze_device_handle_t);
    zeDeviceGetProperties: fn(ze_device_handle_t, *mut ze_device_properties_t);
    zeContextCreate: fn(ze_driver_handle_t, *const ze_context_desc_t, *mut ze_context_handle_t);
    zeContextDestroy: fn(ze_context_handle_t);
    zeMemAllocHost: fn(
        ze_context_handle_t, *const ze_host_mem_alloc_desc_t, usize, usize, *mut *mut c_void);
    zeMemAllocDevice: fn(
        ze_context_handle_t, *const ze_device_mem_alloc_desc_t, usize, usize,
        ze_device_handle_t, *mut *mut c_void);
    zeMemFree: fn(ze_context_handle_t, *mut c_void);
    zeMemGetAllocProperties: fn(
        ze_context_handle_t, *const c_void, *mut ze_memory_allocation_properties_t,
        *mut ze_device_handle_t);
    zeMemGetAddressRange: fn(ze_context_handle_t, *const c_void, *mut *mut c_void, *mut usize);
    zeMemGetIpcHandle: fn(ze_context_handle_t, *const c_void, *mut ze_ipc_mem_handle_t);
    zeMemOpenIpcHandle: fn(
        ze_context_handle_t, ze_device_handle_t, ze_ipc_mem_handle_t, u32, *mut *mut c_void);
    zeMemCloseIpcHandle: fn(ze_context_handle_t, *const c_void);
    zeCommandListCreateImmediate: fn(
        ze_context_handle_t, ze_device_handle_t, *const ze_command_queue_desc_t,
        *mut ze_command_list_handle_t);
    zeCommandListAppendMemoryCopy: fn(
        ze_command_list_handle_t, *mut c_void, *const c_void, usize, ze_event_handle_t, u32,
        *mut ze_event_handle_t);
    zeCommandListDestroy: fn(ze_command_list_handle_t);
}

/// An error with its sources (libloading puts dlerror's text in the source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}

impl std::fmt::Debug for ZeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZeApi")
    }
}

/// The name of a `ze_result_t`, for error messages.
pub fn result_name(r: ze_result_t) -> &'static str {
    match r {
        0 => "ZE_RESULT_SUCCESS",
        1 => "ZE_RESULT_NOT_READY",
        0x7000_0001 => "ZE_RESULT_ERROR_DEVICE_LOST",
        0x7000_0002 => "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
        0x7000_0003 => "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
        0x7001_0000 => "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
        0x7001_0001 => "ZE_RESULT_ERROR_NOT_AVAILABLE",
        0x7002_0000 => "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE",
        0x7800_0001 => "ZE_RESULT_ERROR_UNINITIALIZED",
        0x7800_0002 => "ZE_RESULT_ERROR_UNSUPPORTED_VERSION",
        0x7800_0003 => "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
        0x7800_0004 => "ZE_RESULT_ERROR_INVALID_ARGUMENT",
        0x7800_0005 => "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
        0x7800_0006 => "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE",
        0x7800_0007 => "ZE_RESULT_ERROR_INVALID_NULL_POINTER",
        0x7800_0008 => "ZE_RESULT_ERROR_INVALID_SIZE",
        0x7800_0009 => "ZE_RESULT_ERROR_UNSUPPORTED_SIZE",
        0x7800_000a => "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT",
        0x7800_000c => "ZE_RESULT_ERROR_INVALID_ENUMERATION",
        0x7800_000d => "ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION",
        0x7800_001a => "ZE_RESULT_ERROR_OVERLAPPING_REGIONS",
        0x7fff_fffe => "ZE_RESULT_ERROR_UNKNOWN",
        _ => "an unlisted ze_result_t",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets worked out from ze_api.h's declarations for LP64.
    #[test]
    fn layouts_match_ze_api_h() {
        assert_eq!(size_of::<ze_context_desc_t>(), 24);
        assert_eq!(size_of::<ze_host_mem_alloc_desc_t>(), 24);
        assert_eq!(size_of::<ze_device_mem_alloc_desc_t>(), 24);
        assert_eq!(offset_of!(ze_device_mem_alloc_desc_t, ordinal), 20);
        assert_eq!(size_of::<ze_memory_allocation_properties_t>(), 40);
        assert_eq!(offset_of!(ze_memory_allocation_properties_t, id), 24);
        assert_eq!(size_of::<ze_command_queue_desc_t>(), 40);
        assert_eq!(offset_of!(ze_command_queue_desc_t, priority), 32);
        assert_eq!(offset_of!(ze_device_properties_t, maxMemAllocSize), 40);
        assert_eq!(offset_of!(ze_device_properties_t, timerResolution), 80);
        assert_eq!(offset_of!(ze_device_properties_t, uuid), 96);
        assert_eq!(offset_of!(ze_device_properties_t, name), 112);
        assert_eq!(size_of::<ze_device_properties_t>(), 368);
        assert_eq!(size_of::<ze_ipc_mem_handle_t>(), 64);
    }
}
