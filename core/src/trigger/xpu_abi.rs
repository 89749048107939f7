//! The structures an XPU trigger is described with (`struct fi_trigger_var`, `struct
//! fi_trigger_xpu`, fi_trigger.h of libfabric 1.17), laid out exactly as C lays them out, so a
//! GPU kernel or a C caller can read an array Rust filled.

use std::ffi::c_void;
use std::fmt;

use crate::atomic::Datatype;
use crate::hmem_iface::Iface;

/// `value` of `struct fi_trigger_var`: the value to store, or (for more than 64 bits) where
/// the bytes to store are.
#[repr(C)]
#[derive(Clone, Copy)]
pub union TriggerValue {
    /// `FI_UINT8`, count 1.
    pub val8: u8,
    /// `FI_UINT16`, count 1.
    pub val16: u16,
    /// `FI_UINT32`, count 1.
    pub val32: u32,
    /// `FI_UINT64`, count 1.
    pub val64: u64,
    /// `FI_UINT8` with count > 1: a caller-provided buffer of `count` bytes.
    pub data: *mut u8,
}

/// `struct fi_trigger_var`: one variable the XPU writes to start an operation.
///
/// Before a posting call the caller sets `datatype` and `count` (as `Endpoint::xpu_trigger_vars`
/// reports them) and, for count > 1, `value.data`; the call fills `addr` and the value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TriggerVar {
    /// `enum fi_datatype`: `FI_UINT8`, `FI_UINT16`, `FI_UINT32` or `FI_UINT64` (raw, as C has it).
    pub datatype: i32,
    /// Number of values of `datatype` (1, or the byte count with `FI_UINT8`).
    pub count: i32,
    /// Where the XPU stores, as the XPU addresses it.
    pub addr: *mut c_void,
    /// What it stores.
    pub value: TriggerValue,
}

// SAFETY: a description (an address and a value), not a handle to anything this process owns;
// handing it to the thread or device that rings it is what it is for.
unsafe impl Send for TriggerVar {}
// SAFETY: as above; shared references only read the description.
unsafe impl Sync for TriggerVar {}

impl Default for TriggerVar {
    fn default() -> Self {
        TriggerVar {
            datatype: Datatype::UInt64 as i32,
            count: 1,
            addr: std::ptr::null_mut(),
            value: TriggerValue { val64: 0 },
        }
    }
}

/// What a filled `TriggerVar` says to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal<'a> {
    /// Store this byte.
    U8(u8),
    /// Store this 16-bit value.
    U16(u16),
    /// Store this 32-bit value.
    U32(u32),
    /// Store this 64-bit value.
    U64(u64),
    /// Store these bytes, in order.
    Bytes(&'a [u8]),
}

impl TriggerVar {
    /// The datatype, if it is one of the four a trigger may use.
    pub fn kind(&self) -> Option<Datatype> {
        Datatype::from_raw(self.datatype).filter(|d| {
            matches!(
                d,
                Datatype::UInt8 | Datatype::UInt16 | Datatype::UInt32 | Datatype::UInt64
            )
        })
    }

    /// The value to store, read as `datatype` and `count` say.
    ///
    /// # Safety
    /// For `FI_UINT8` with count > 1, `value.data` must point to `count` readable bytes.
    pub unsafe fn signal(&self) -> Option<Signal<'_>> {
        // SAFETY: every union member is plain data; which one is meant is what datatype and
        // count say, and the bytes' validity is the caller's contract.
        unsafe {
            Some(match (self.kind()?, self.count) {
                (Datatype::UInt8, 1) => Signal::U8(self.value.val8),
                (Datatype::UInt16, 1) => Signal::U16(self.value.val16),
                (Datatype::UInt32, 1) => Signal::U32(self.value.val32),
                (Datatype::UInt64, 1) => Signal::U64(self.value.val64),
                (Datatype::UInt8, n) if n > 1 && !self.value.data.is_null() => {
                    Signal::Bytes(std::slice::from_raw_parts(self.value.data, n as usize))
                }
                _ => return None,
            })
        }
    }
}

impl fmt::Debug for TriggerVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TriggerVar");
        d.field("datatype", &self.datatype)
            .field("count", &self.count)
            .field("addr", &self.addr);
        // SAFETY: reading the widest plain member is defined for any bit pattern.
        d.field("value", &format_args!("{:#x}", unsafe { self.value.val64 }));
        d.finish()
    }
}

/// `device` of `struct fi_trigger_xpu`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union XpuDevice {
    /// The whole field.
    pub reserved: u64,
    /// A CUDA device ordinal.
    pub cuda: i32,
    /// A Level Zero device index.
    pub ze: i32,
}

/// The most variables a trigger fills (xfabric's need one: a 64-bit value).
pub const VARS_MAX: usize = 1;

/// `struct fi_trigger_xpu`, as a C caller passes it: which XPU rings the trigger, and the
/// array the provider fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TriggerXpu {
    /// On input the length of `var`; on output the number of variables filled.
    pub count: i32,
    /// `enum fi_hmem_iface` (raw).
    pub iface: u32,
    /// The device within the interface.
    pub device: XpuDevice,
    /// The caller's array of `count` variables.
    pub var: *mut TriggerVar,
}

impl Default for TriggerXpu {
    fn default() -> Self {
        TriggerXpu {
            count: 0,
            iface: Iface::System as u32,
            device: XpuDevice { reserved: 0 },
            var: std::ptr::null_mut(),
        }
    }
}

/// Which XPU will ring a trigger: an HMEM interface and a device of it (`fi_trigger_xpu`'s
/// `iface` and `device`). `System` is a CPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Xpu {
    /// The interface the XPU writes memory through.
    pub iface: Iface,
    /// The device number within it (0 for a CPU).
    pub device: u64,
}

impl Xpu {
    /// A CPU thread of this process.
    pub const CPU: Xpu = Xpu {
        iface: Iface::System,
        device: 0,
    };

    /// The device number as `fi_trigger_xpu.device` carries it for this interface.
    pub fn raw_device(&self) -> XpuDevice {
        match self.iface {
            Iface::Cuda => XpuDevice {
                cuda: self.device as i32,
            },
            Iface::Ze => XpuDevice {
                ze: self.device as i32,
            },
            _ => XpuDevice {
                reserved: self.device,
            },
        }
    }
}

impl TriggerXpu {
    /// The XPU a C caller named; `None` for an interface value 1.17 does not define.
    pub fn xpu(&self) -> Option<Xpu> {
        let iface = Iface::from_raw(self.iface)?;
        // SAFETY: plain data; the member that is meant depends on the interface.
        let device = unsafe {
            match iface {
                Iface::Cuda => self.device.cuda as u64,
                Iface::Ze => self.device.ze as u64,
                _ => self.device.reserved,
            }
        };
        Some(Xpu { iface, device })
    }

    /// The caller's variables, as many as a trigger fills at most (`VARS_MAX`): the slice
    /// claims no more of the caller's array than is ever written. None (an empty slice) where
    /// `var` is not aligned for a `TriggerVar` (a caller's error the slice would make
    /// undefined behaviour of).
    ///
    /// # Safety
    /// `var` must point to `count` valid, writable `TriggerVar`s (or `count` be 0).
    pub unsafe fn vars_mut(&mut self) -> &mut [TriggerVar] {
        // SAFETY: forwarded.
        unsafe { Self::vars_at(self.var, self.count) }
    }

    /// [`vars_mut`](Self::vars_mut) of the array `var` of `count` variables, borrowing
    /// nothing of the structure that holds them (its `count` may be written meanwhile).
    ///
    /// # Safety
    /// As `vars_mut`; the variables are not otherwise referenced while the slice lives.
    pub unsafe fn vars_at<'a>(var: *mut TriggerVar, count: i32) -> &'a mut [TriggerVar] {
        if count <= 0 || var.is_null() || !var.is_aligned() {
            return &mut [];
        }
        let n = (count as usize).min(VARS_MAX);
        // SAFETY: the caller's contract: `count` >= n variables, aligned (checked).
        unsafe { std::slice::from_raw_parts_mut(var, n) }
    }
}
