//! Owned device-side resources, the same types for every interface: a device-visible host
//! allocation, a device buffer, an IPC handle and an opened IPC mapping. Each owns a
//! `Release` from its interface, which frees it on drop; an error from that is recorded
//! with the interface (`HmemIface::take_drop_errors`) rather than panicking.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::error::{DropErrors, HmemError};
use crate::Iface;

/// Frees an allocation or closes a mapping. Implemented by each interface; it holds an `Arc` of
/// the interface's state, so the driver context outlives everything made from it.
pub(crate) trait Release: Send + Sync {
    /// Gives the resource back. Called at most once.
    fn release(&mut self) -> Result<(), HmemError>;
}

/// A copy under way on a device's stream: asked whether it is done, it never waits.
pub(crate) trait Pending: Send {
    /// `Ok(true)` once every byte is in place; `Ok(false)` while it is still moving.
    fn query(&mut self) -> Result<bool, HmemError>;
}

/// A copy started by `HmemIface::copy_async`: [`poll`](AsyncCopy::poll) says when it is
/// done, without blocking (a progress loop polls it with everything else). Dropping it
/// before then does not stop the copy; the memory it reads and writes must stay valid until
/// `poll` answered `Ok(true)` (or the interface's stream was drained).
pub struct AsyncCopy {
    pending: Option<Box<dyn Pending>>,
}

impl std::fmt::Debug for AsyncCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.pending.is_some() {
            "AsyncCopy(moving)"
        } else {
            "AsyncCopy(done)"
        })
    }
}

impl AsyncCopy {
    /// A copy that was finished before it was handed out (a synchronous interface's).
    pub fn done() -> Self {
        AsyncCopy { pending: None }
    }

    // Only the CUDA interface makes pending copies so far.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pending(p: Box<dyn Pending>) -> Self {
        AsyncCopy { pending: Some(p) }
    }

    /// `Ok(true)` once the copy is done (and every later call); `Ok(false)` while not yet;
    /// `Err`: the device reported a failure (the bytes are not to be trusted).
    pub fn poll(&mut self) -> Result<bool, HmemError> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(true);
        };
        if p.query()? {
            self.pending = None;
            return Ok(true);
        }
        Ok(false)
    }
}

/// The release half shared by every resource type: runs once, by `close` or by `Drop`.
struct Releaser {
    release: Option<Box<dyn Release>>,
    errors: Arc<DropErrors>,
}

impl Releaser {
    fn new(release: Option<Box<dyn Release>>, errors: Arc<DropErrors>) -> Self {
        Releaser { release, errors }
    }

    fn close(&mut self) -> Result<(), HmemError> {
        match self.release.take() {
            Some(mut r) => r.release(),
            None => Ok(()),
        }
    }
}

impl Drop for Releaser {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            self.errors.record(e);
        }
    }
}

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.release.is_some() {
            "live"
        } else {
            "released"
        })
    }
}

/// Host memory a device can read and write directly, page-aligned and zero-filled: where XPU
/// doorbells live. CUDA: `cuMemHostAlloc(PORTABLE | DEVICEMAP)`; Level Zero: `zeMemAllocHost`;
/// system: a sealed memfd another process can map (`ipc_get`), or anonymous pages where the
/// kernel gives no memfds. Freed on drop.
#[derive(Debug)]
pub struct HostMapped {
    // Invariant: `host` points to `len` bytes that stay mapped until `releaser` runs.
    host: NonNull<u8>,
    device_addr: u64,
    len: usize,
    iface: Iface,
    device: u64,
    releaser: Releaser,
}

// SAFETY: the allocation is plain memory owned by this value; the pointer is not tied to the
// creating thread, and every access through it is either atomic or the caller's `unsafe`.
unsafe impl Send for HostMapped {}
// SAFETY: as above; `&HostMapped` only hands out raw pointers and atomics.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    pub(crate) fn new(
        host: NonNull<u8>,
        device_addr: u64,
        len: usize,
        owner: (Iface, u64),
        release: Box<dyn Release>,
        errors: Arc<DropErrors>,
    ) -> Self {
        HostMapped {
            host,
            device_addr,
            len,
            iface: owner.0,
            device: owner.1,
            releaser: Releaser::new(Some(release), errors),
        }
    }

    /// The host address. Reads and writes through it race with the device unless ordered by
    /// the caller (atomics, fences, a completed kernel).
    pub fn as_ptr(&self) -> *mut u8 {
        self.host.as_ptr()
    }

    /// The address device code uses for the same bytes (equal to the host address under
    /// unified addressing, but always ask).
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: zero-length allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The interface that allocated it.
    pub fn iface(&self) -> Iface {
        self.iface
    }

    /// The device it was allocated for.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// The `index`-th 64-bit word as an atomic, for doorbells a device stores to and the host
    /// polls; `None` past the end.
    pub fn atomic_u64(&self, index: usize) -> Option<&AtomicU64> {
        let end = index.checked_add(1)?.checked_mul(8)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `index * 8 < len`, so the word starts inside the allocation.
        let word = unsafe { self.host.as_ptr().add(index * 8) };
        if !(word as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: the word is 8-byte aligned (checked; every allocator here returns page- or
        // better-aligned memory) and lies inside the allocation, which lives as long as
        // `&self`. The other writer (the device) stores whole aligned words, as AtomicU64
        // expects.
        Some(unsafe { AtomicU64::from_ptr(word.cast()) })
    }

    /// Frees now and reports the driver's answer (dropping does the same, recording errors).
    pub fn free(mut self) -> Result<(), HmemError> {
        self.releaser.close()
    }
}

/// Memory on a device (for the system interface, ordinary host pages), for staging and tests.
/// It may not be dereferenceable from the host: move bytes with the interface's copies.
#[derive(Debug)]
pub struct DeviceBuffer {
    addr: u64,
    len: usize,
    iface: Iface,
    device: u64,
    releaser: Releaser,
}

impl DeviceBuffer {
    pub(crate) fn new(
        addr: u64,
        len: usize,
        owner: (Iface, u64),
        release: Box<dyn Release>,
        errors: Arc<DropErrors>,
    ) -> Self {
        DeviceBuffer {
            addr,
            len,
            iface: owner.0,
            device: owner.1,
            releaser: Releaser::new(Some(release), errors),
        }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The device address as a pointer, the form copies and registrations take.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as usize as *mut u8
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: zero-length allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The interface that allocated it.
    pub fn iface(&self) -> Iface {
        self.iface
    }

    /// The device it lives on.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// Frees now and reports the driver's answer.
    pub fn free(mut self) -> Result<(), HmemError> {
        self.releaser.close()
    }
}

/// A dma-buf file descriptor exported for device memory (`cuMemGetHandleForAddressRange`),
/// for a NIC to register (`ibv_reg_dmabuf_mr`): the NIC then reaches the device memory
/// itself. The descriptor covers whole host pages around the range asked for; `offset` is
/// where the range's first byte lies in it. Closed on drop (a registration made from it
/// holds its own reference).
#[derive(Debug)]
pub struct Dmabuf {
    /// The dma-buf.
    pub fd: std::os::fd::OwnedFd,
    /// Where the exported range starts in it.
    pub offset: u64,
}

/// A handle another process (or another context) opens to map a device allocation. It names
/// the whole allocation the address belongs to, plus the offset of that address in it, so the
/// opener can find the same byte. `to_bytes`/`from_bytes` give a fixed wire form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcHandle {
    /// The interface that made it.
    pub iface: Iface,
    /// The exporting process (Level Zero handles carry a file descriptor of that process).
    pub pid: u32,
    /// The device the allocation lives on.
    pub device: u64,
    /// Which allocation this is, as the exporting process's driver numbers them
    /// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`: never reused within a process, so an allocation freed
    /// and another made at the same address differ here); 0 where the interface has none.
    /// An opener keys what it caches by it and never uses a mapping made for another id.
    pub alloc_id: u64,
    /// The allocation's base address in the exporting process.
    pub base: u64,
    /// The allocation's length.
    pub alloc_len: u64,
    /// Offset of the exported address from `base`.
    pub offset: u64,
    /// The driver's opaque handle (`CUipcMemHandle`, `ze_ipc_mem_handle_t`: 64 bytes each;
    /// for host memory, the memfd's descriptor in the exporter and its inode and device).
    pub raw: [u8; 64],
}

impl IpcHandle {
    /// Length of the wire form.
    pub const WIRE_LEN: usize = 112;
    const MAGIC: u32 = u32::from_le_bytes(*b"XFIH");

    /// The wire form: little-endian `magic:u32, iface:u32, pid:u32, device:u32, alloc_id,
    /// base, alloc_len, offset`, then the 64 raw bytes. A device number past `u32` (none
    /// exists) is written as `u32::MAX`, which no interface has.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..4].copy_from_slice(&Self::MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.iface.as_raw().to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        let device = u32::try_from(self.device).unwrap_or(u32::MAX);
        b[12..16].copy_from_slice(&device.to_le_bytes());
        b[16..24].copy_from_slice(&self.alloc_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.alloc_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..112].copy_from_slice(&self.raw);
        b
    }

    /// Parses the wire form; `Inval` naming what is wrong if it is not one.
    pub fn from_bytes(b: &[u8]) -> Result<Self, HmemError> {
        const OP: &str = "IpcHandle::from_bytes";
        if b.len() != Self::WIRE_LEN {
            return Err(HmemError::inval(
                OP,
                format!("{} bytes, expected {}", b.len(), Self::WIRE_LEN),
            ));
        }
        // In bounds: the length was checked above.
        let u32_at = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&b[i..i + 4]);
            u32::from_le_bytes(w)
        };
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if u32_at(0) != Self::MAGIC {
            return Err(HmemError::inval(
                OP,
                "not an xfabric IPC handle (bad magic)",
            ));
        }
        let iface = Iface::from_raw(u32_at(4))
            .ok_or_else(|| HmemError::inval(OP, format!("unknown iface {}", u32_at(4))))?;
        let (alloc_len, offset) = (u64_at(32), u64_at(40));
        if offset > alloc_len {
            return Err(HmemError::inval(
                OP,
                format!("offset {offset} lies past the {alloc_len}-byte allocation"),
            ));
        }
        let mut raw = [0u8; 64];
        raw.copy_from_slice(&b[48..112]);
        Ok(IpcHandle {
            iface,
            pid: u32_at(8),
            device: u64::from(u32_at(12)),
            alloc_id: u64_at(16),
            base: u64_at(24),
            alloc_len,
            offset,
            raw,
        })
    }

    /// `raw` of a handle that [`HmemIface::vmm_export`](crate::HmemIface::vmm_export) made:
    /// it names a virtual-memory-management allocation, opened from a file descriptor passed
    /// beside it, not by the driver's IPC handle.
    pub const VMM_RAW: [u8; 64] = {
        let mut r = [0u8; 64];
        let tag = *b"XFVMMFD1";
        let mut i = 0;
        while i < tag.len() {
            r[i] = tag[i];
            i += 1;
        }
        r
    };

    /// Whether this handle names a virtual-memory-management allocation ([`Self::VMM_RAW`]).
    pub fn is_vmm(&self) -> bool {
        self.raw == Self::VMM_RAW
    }

    /// Checks that `offset..offset + len` lies inside the allocation.
    pub fn check_range(&self, op: &'static str, len: usize) -> Result<(), HmemError> {
        let end = self.offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.alloc_len => Ok(()),
            _ => Err(HmemError::inval(
                op,
                format!(
                    "{len} bytes at offset {} run past the {}-byte allocation",
                    self.offset, self.alloc_len
                ),
            )),
        }
    }
}

/// An opened IPC handle: the exporter's allocation mapped into this process. Closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    base: u64,
    offset: u64,
    alloc_len: u64,
    iface: Iface,
    device: u64,
    releaser: Releaser,
}

impl IpcMapping {
    /// `release` is `None` where nothing was mapped (a CUDA handle opened by the process that
    /// exported it refers to its own allocation).
    pub(crate) fn new(
        base: u64,
        handle: &IpcHandle,
        device: u64,
        release: Option<Box<dyn Release>>,
        errors: Arc<DropErrors>,
    ) -> Self {
        IpcMapping {
            base,
            offset: handle.offset,
            alloc_len: handle.alloc_len,
            iface: handle.iface,
            device,
            releaser: Releaser::new(release, errors),
        }
    }

    /// The device address of the exported byte (mapping base plus the handle's offset).
    pub fn addr(&self) -> u64 {
        self.base.wrapping_add(self.offset)
    }

    /// `addr` as a pointer, the form copies take.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr() as usize as *mut u8
    }

    /// Where the whole allocation is mapped.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes from `addr` to the end of the allocation.
    pub fn len(&self) -> usize {
        self.alloc_len.saturating_sub(self.offset) as usize
    }

    /// True when the handle pointed at the allocation's end.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The interface.
    pub fn iface(&self) -> Iface {
        self.iface
    }

    /// The device it was opened on.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// `ipc_close`: unmaps now and reports the driver's answer.
    pub fn close(mut self) -> Result<(), HmemError> {
        self.releaser.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_handle_wire_form_round_trips() {
        let mut raw = [0u8; 64];
        raw.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let h = IpcHandle {
            iface: Iface::Ze,
            pid: 4242,
            device: 1,
            alloc_id: 99,
            base: 0x7f00_0000_0000,
            alloc_len: 1 << 20,
            offset: 4096,
            raw,
        };
        let b = h.to_bytes();
        assert_eq!(IpcHandle::from_bytes(&b).unwrap(), h);
        assert!(IpcHandle::from_bytes(&b[1..]).is_err());
        let mut bad = b;
        bad[0] ^= 1;
        assert!(IpcHandle::from_bytes(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bad = b;
        bad[4] = 9;
        assert!(IpcHandle::from_bytes(&bad)
            .unwrap_err()
            .to_string()
            .contains("iface 9"));
        let mut bad = h.clone();
        bad.offset = bad.alloc_len + 1;
        assert!(IpcHandle::from_bytes(&bad.to_bytes())
            .unwrap_err()
            .to_string()
            .contains("lies past"));
        assert!(h.check_range("t", (1 << 20) - 4096).is_ok());
        assert!(h.check_range("t", (1 << 20) - 4095).is_err());
    }
}
