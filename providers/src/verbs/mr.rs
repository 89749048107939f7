//! Memory regions the NIC knows: `fi_mr_reg` in a verbs domain with `FI_MR_PROV_KEY` also
//! registers the range with the device (`ibv_reg_mr`), and the region's key carries the
//! device's remote key, so that a peer's NIC can write, read and add to it one-sidedly
//! (`native`). The region is deregistered when the `fi_mr` closes.
//!
//! A key made here: the tag "XF" in bits 63..48, the region's remote access in bits 41..40
//! (read, write), the rkey in bits 31..0. Core's own keys (random, or the application's own
//! with user-chosen keys) never carry the tag (`xfabric_core::mr::NIC_KEY_TAG`): operations
//! naming them go through the engine. The bits come from a peer and are untrusted: they only choose the
//! path; the NIC checks the rkey, the range and the access itself.
//!
//! CUDA memory is registered by dma-buf where the driver exports one
//! (`cuMemGetHandleForAddressRange`, through hmem) and the device takes it
//! (`ibv_reg_dmabuf_mr`): peers' NICs then read and write it themselves (GPUDirect RDMA).
//! Where either refuses, the region stays core's: its remote accesses are the engine's,
//! staged through host buffers as shm and tcp do, and the refusal is kept
//! (`super::device_memory`). Operations' own local device buffers are staged by the endpoint
//! either way.
//!
//! What else stays core's alone (the engine executes remote accesses to it): other device
//! memory (Level Zero), domains
//! with application-chosen keys (no `FI_MR_PROV_KEY`: the key cannot be the rkey), offset
//! addressing where the library cannot register at a chosen I/O address, and ranges the
//! device refuses.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, RwLock};

use xfabric_core::consts::*;
use xfabric_core::{Iface, MrAttr, ProviderMr};

use super::ib::{Mr, Nic};
use super::sys;

use xfabric_core::mr::{NIC_KEY_TAG as TAG, NIC_KEY_TAG_MASK as TAG_MASK};
const READ_BIT: u64 = 1 << 40;
const WRITE_BIT: u64 = 1 << 41;
/// The key's random bits: 32..40 and 42..48, fourteen drawn from the OS per registration.
/// A NIC's rkey is an index and a few bits (rxe: 8 random, others a counter): guessable. A
/// peer naming a region through the engine (a frame, not its NIC) must name the whole key,
/// and these make that 2^14 times harder; what a peer's NIC reaches is the NIC's to check.
const SALT_MASK: u64 = 0xff << 32 | 0x3f << 42;

/// A key as this provider makes them, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicKey {
    pub rkey: u32,
    /// Random bits (`SALT_MASK`'s), in place.
    pub salt: u64,
    /// The region allows remote reads (`FI_REMOTE_READ`).
    pub read: bool,
    /// The region allows remote writes and atomics (`FI_REMOTE_WRITE`).
    pub write: bool,
}

impl NicKey {
    pub fn encode(&self) -> u64 {
        let mut k = TAG | u64::from(self.rkey) | self.salt & SALT_MASK;
        if self.read {
            k |= READ_BIT;
        }
        if self.write {
            k |= WRITE_BIT;
        }
        k
    }

    /// The key's parts, if it is one of ours (by its tag).
    pub fn decode(key: u64) -> Option<NicKey> {
        // Every other bit is a field's.
        if key & TAG_MASK != TAG {
            return None;
        }
        Some(NicKey {
            rkey: key as u32,
            salt: key & SALT_MASK,
            read: key & READ_BIT != 0,
            write: key & WRITE_BIT != 0,
        })
    }
}

/// The device access a region with libfabric `access` needs. Local write is always asked
/// for (the region may be a read's destination). Remote atomics come only with remote reads
/// and writes both: the NIC's atomics all return the old value, so a region only written
/// remotely would be read through them (a fetch-add of 0).
pub fn ib_access(access: u64) -> i32 {
    let mut a = sys::IBV_ACCESS_LOCAL_WRITE;
    if access & FI_REMOTE_READ != 0 {
        a |= sys::IBV_ACCESS_REMOTE_READ;
    }
    if access & FI_REMOTE_WRITE != 0 {
        a |= sys::IBV_ACCESS_REMOTE_WRITE;
    }
    if access & (FI_REMOTE_READ | FI_REMOTE_WRITE) == FI_REMOTE_READ | FI_REMOTE_WRITE {
        a |= sys::IBV_ACCESS_REMOTE_ATOMIC;
    }
    a
}

/// How a registration in a domain with `mr_mode` would be addressed by peers: the I/O
/// virtual address the NIC is to know the region's start by. `None`: the NIC is not told of
/// it (device memory, application-chosen keys).
pub fn iova_for(attr: &MrAttr, mr_mode: u32) -> Option<u64> {
    if attr.iface != Iface::System {
        return None;
    }
    iova(attr, mr_mode)
}

/// As `iova_for`, whoever owns the memory.
fn iova(attr: &MrAttr, mr_mode: u32) -> Option<u64> {
    if mr_mode & FI_MR_PROV_KEY == 0 || attr.len == 0 {
        return None;
    }
    Some(if mr_mode & FI_MR_VIRT_ADDR != 0 {
        attr.addr as u64
    } else {
        attr.offset
    })
}

/// How device memory registrations went in this process (`super::device_memory`).
pub(super) static DEVICE_MEMORY: Mutex<super::stats::DeviceMemory> =
    Mutex::new(super::stats::DeviceMemory {
        by_dmabuf: 0,
        staged: 0,
        why_staged: None,
    });

fn device_outcome(r: &std::result::Result<Mr, String>) {
    let mut d = DEVICE_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    match r {
        Ok(_) => d.by_dmabuf += 1,
        Err(why) => {
            tracing::info!("verbs: CUDA region staged through host memory: {why}");
            d.staged += 1;
            d.why_staged = Some(why.clone());
        }
    }
}

/// CUDA memory registered by dma-buf, or why not (see the module).
///
/// # Safety
/// The range stays allocated device memory while the returned region lives.
unsafe fn register_dmabuf(nic: &Arc<Nic>, attr: &MrAttr, mr_mode: u32) -> Option<Mr> {
    let r = (|| {
        let Some(iova) = iova(attr, mr_mode) else {
            return Err("the domain's keys are the application's (no FI_MR_PROV_KEY)".into());
        };
        if nic.v.reg_dmabuf_mr.is_none() {
            return Err("libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)".into());
        }
        let cuda = xfabric_hmem::Hmem::global().get(Iface::Cuda);
        let d = cuda
            .dmabuf(attr.addr as *const u8, attr.len)
            .map_err(|e| format!("CUDA exports no dma-buf for it: {e}"))?;
        let access = ib_access(attr.access);
        // SAFETY: the caller keeps the device memory allocated while the region lives.
        let mr = unsafe { Mr::from_dmabuf(nic, d.fd.as_fd(), d.offset, attr.len, iova, access) };
        match mr {
            Some(Ok(mr)) => Ok(mr),
            Some(Err(e)) => Err(format!("{} refused the dma-buf: {e}", nic.name)),
            None => Err("libibverbs has no ibv_reg_dmabuf_mr".into()),
        }
    })();
    device_outcome(&r);
    r.ok()
}

/// A registered range as endpoints look it up for their local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    len: usize,
    lkey: u32,
}

/// The domain's NIC registrations by start address: where an operation's local memory is
/// registered already, the NIC uses it in place (its lkey).
#[derive(Default)]
pub struct Registry {
    map: RwLock<BTreeMap<(usize, u64), Entry>>,
}

/// How many registrations starting at or before an address are looked at for one covering
/// a range (regions nest rarely; past this, the operation bounces or goes by frames).
const LOOK: usize = 16;

impl Registry {
    fn add(&self, addr: usize, key: u64, e: Entry) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((addr, key), e);
    }

    fn remove(&self, addr: usize, key: u64) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(addr, key));
    }

    /// The lkey of a registration covering `len` bytes at `addr`.
    pub fn lkey(&self, addr: usize, len: usize) -> Option<u32> {
        let end = addr.checked_add(len)?;
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        m.range(..=(addr, u64::MAX))
            .rev()
            .take(LOOK)
            .find(|((a, _), e)| a.checked_add(e.len).is_some_and(|x| x >= end))
            .map(|(_, e)| e.lkey)
    }
}

/// A region the NIC knows, deregistered when dropped (after its key left core's map).
pub struct NicMr {
    key: u64,
    addr: usize,
    reg: Arc<Registry>,
    _mr: Mr,
}

impl ProviderMr for NicMr {
    fn key(&self) -> u64 {
        self.key
    }
}

impl Drop for NicMr {
    fn drop(&mut self) {
        self.reg.remove(self.addr, self.key);
    }
}

/// Registers `attr` with `nic` where the domain's `mr_mode` lets its key be the NIC's (see
/// the module); `None` leaves the region to core (and its remote accesses to the engine).
///
/// # Safety
/// The range stays valid memory while the returned region lives.
pub unsafe fn register(
    nic: &Arc<Nic>,
    reg: &Arc<Registry>,
    attr: &MrAttr,
    mr_mode: u32,
) -> Option<NicMr> {
    if attr.iface == Iface::Cuda && attr.len > 0 {
        // SAFETY: the caller keeps the range valid while the region lives.
        let mr = unsafe { register_dmabuf(nic, attr, mr_mode) }?;
        // Not in the registry: operations' local device buffers reach the provider staged.
        return nic_mr(mr, attr, reg);
    }
    let iova = iova_for(attr, mr_mode)?;
    let addr = attr.addr as *mut u8;
    let mut access = ib_access(attr.access);
    let attempt = |access: i32| {
        if iova == attr.addr as u64 {
            // SAFETY: the caller keeps the range mapped.
            Some(unsafe { Mr::new(nic, addr, attr.len, access) })
        } else {
            // SAFETY: as above.
            unsafe { Mr::with_iova(nic, addr, attr.len, iova, access) }
        }
    };
    let mut r = attempt(access)?;
    if r.is_err() && attr.access & FI_REMOTE_WRITE == 0 {
        // Read-only pages refuse local write: a region only read remotely does without.
        access &= !sys::IBV_ACCESS_LOCAL_WRITE;
        r = attempt(access)?;
    }
    let mr = match r {
        Ok(mr) => mr,
        Err(e) => {
            tracing::debug!("verbs: region left to the engine: {e}");
            return None;
        }
    };
    let m = nic_mr(mr, attr, reg)?;
    if access & sys::IBV_ACCESS_LOCAL_WRITE != 0 {
        reg.add(
            attr.addr,
            m.key,
            Entry {
                len: attr.len,
                lkey: m._mr.lkey(),
            },
        );
    }
    Some(m)
}

/// The region of registration `mr` of `attr`, with its key (`None`: the OS gave no random
/// bits for it; the region is left to core).
fn nic_mr(mr: Mr, attr: &MrAttr, reg: &Arc<Registry>) -> Option<NicMr> {
    // A region no peer may reach has no rkey on some NICs (rxe gives them all 0): its key,
    // which only has to be unique in the domain, is then made from its lkey (a peer naming
    // it is refused by the NIC, or by the engine, as for any region it may not reach).
    let remote = attr.access & (FI_REMOTE_READ | FI_REMOTE_WRITE) != 0;
    let key = NicKey {
        rkey: if remote { mr.rkey() } else { mr.lkey() },
        read: attr.access & FI_REMOTE_READ != 0,
        write: attr.access & FI_REMOTE_WRITE != 0,
        salt: getrandom::u64().ok()?,
    }
    .encode();
    Some(NicMr {
        key,
        addr: attr.addr,
        reg: reg.clone(),
        _mr: mr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_core_keys_are_not_ours() {
        let k = NicKey {
            rkey: 0xdead_beef,
            read: true,
            write: false,
            salt: SALT_MASK,
        };
        assert_eq!(NicKey::decode(k.encode()), Some(k));
        let w = NicKey {
            rkey: 1,
            read: false,
            write: true,
            salt: 0,
        };
        assert_eq!(NicKey::decode(w.encode()), Some(w));
        for core_key in [0, 1, 7, 42, u64::MAX, FI_KEY_NOTAVAIL, 0xffff_ffff] {
            assert_eq!(NicKey::decode(core_key), None, "{core_key:#x}");
        }
        // Another tag: not ours.
        assert_eq!(NicKey::decode(w.encode() ^ 1 << 63), None);
        // The random bits are the key's: two registrations of one rkey differ by them.
        let a = NicKey { salt: 1 << 35, ..w };
        assert_ne!(a.encode(), w.encode());
        assert_eq!(NicKey::decode(a.encode()), Some(a));
    }

    #[test]
    fn access_and_addressing_choices() {
        assert_eq!(ib_access(0), sys::IBV_ACCESS_LOCAL_WRITE);
        assert_eq!(
            ib_access(FI_REMOTE_READ),
            sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_READ
        );
        // A region only written remotely must not be readable through the NIC's atomics.
        assert_eq!(
            ib_access(FI_REMOTE_WRITE) & sys::IBV_ACCESS_REMOTE_ATOMIC,
            0
        );
        assert_eq!(
            ib_access(FI_REMOTE_READ | FI_REMOTE_WRITE) & sys::IBV_ACCESS_REMOTE_ATOMIC,
            sys::IBV_ACCESS_REMOTE_ATOMIC
        );
        let attr = MrAttr {
            addr: 0x1000,
            len: 64,
            offset: 40,
            ..Default::default()
        };
        assert_eq!(iova_for(&attr, 0), None, "application keys");
        assert_eq!(iova_for(&attr, FI_MR_PROV_KEY), Some(40));
        assert_eq!(
            iova_for(&attr, FI_MR_PROV_KEY | FI_MR_VIRT_ADDR),
            Some(0x1000)
        );
        let dev = MrAttr {
            iface: Iface::Cuda,
            ..attr.clone()
        };
        assert_eq!(iova_for(&dev, FI_MR_PROV_KEY | FI_MR_VIRT_ADDR), None);
        let empty = MrAttr { len: 0, ..attr };
        assert_eq!(iova_for(&empty, FI_MR_PROV_KEY), None);
    }

    #[test]
    fn registry_finds_covering_regions_only() {
        let r = Registry::default();
        r.add(
            0x1000,
            1,
            Entry {
                len: 0x100,
                lkey: 11,
            },
        );
        r.add(
            0x1080,
            2,
            Entry {
                len: 0x10,
                lkey: 22,
            },
        );
        assert_eq!(r.lkey(0x1000, 0x100), Some(11));
        assert_eq!(r.lkey(0x1080, 0x10), Some(22));
        // Inside the large one, past the small one's end.
        assert_eq!(r.lkey(0x1088, 0x20), Some(11));
        assert_eq!(r.lkey(0x10f0, 0x20), None);
        assert_eq!(r.lkey(0x0ff0, 0x20), None);
        assert_eq!(r.lkey(usize::MAX - 4, 8), None);
        r.remove(0x1000, 1);
        assert_eq!(r.lkey(0x1088, 0x20), None);
    }
}
