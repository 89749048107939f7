//! Memory regions: fi_mr(3). The domain keeps a map from key to region so that providers can
//! check an incoming remote access (key, address range, access rights) in one place.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::consts::*;
use crate::entry::Context;
use crate::error::{Error, Result};
use crate::hmem_iface::{Iface, Owner};

/// Access bits a registration may carry.
pub const MR_ACCESS_BITS: u64 =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_COLLECTIVE;

/// `struct fi_mr_attr`: a range, its access, and which memory interface and device own it
/// (host memory unless told otherwise).
#[derive(Clone, Debug, Default)]
pub struct MrAttr {
    /// Start address of the registered range.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// `FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE`.
    pub access: u64,
    /// Offset that remote addresses are relative to when `FI_MR_VIRT_ADDR` is off.
    pub offset: u64,
    /// The key the application asks for (ignored with `FI_MR_PROV_KEY`).
    pub requested_key: u64,
    /// Returned in events about this region.
    pub context: Context,
    /// `enum fi_hmem_iface` of the memory (`FI_HMEM_SYSTEM` for host memory).
    pub iface: Iface,
    /// The device of `iface` the memory belongs to (0 for host memory).
    pub device: u64,
}

impl MrAttr {
    /// The interface and device the registration names.
    pub fn owner(&self) -> Owner {
        Owner {
            iface: self.iface,
            device: self.device,
        }
    }
}

/// A registered range as the key map sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MrEntry {
    /// Registered start address.
    pub addr: usize,
    /// Registered length.
    pub len: usize,
    /// Access bits.
    pub access: u64,
    /// Offset base for offset addressing.
    pub offset: u64,
    /// Who owns the memory: a target writes device memory through hmem, never directly.
    pub owner: Owner,
}

/// A local memory descriptor (`fi_mr_desc`): a copyable handle passed with data transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MrDesc(pub u64);

/// Bits 63..48 of every key a provider's NIC makes (`ProviderMr::key`: verbs' keys carry
/// "XF" there, and a peer sends an operation naming such a key to its NIC, not to the engine).
/// The keys the core draws, or takes from the application, never carry them: one of them
/// would be sent to a NIC that does not know it, and its refusal breaks the connection.
pub const NIC_KEY_TAG: u64 = 0x5846 << 48;
/// The bits `NIC_KEY_TAG` occupies.
pub const NIC_KEY_TAG_MASK: u64 = 0xffff << 48;

/// Whether `key` lies in the space of NIC keys (`NIC_KEY_TAG`).
pub fn is_nic_key(key: u64) -> bool {
    key & NIC_KEY_TAG_MASK == NIC_KEY_TAG
}

/// A provider's own registration of a region (a NIC's memory registration), made when the
/// `fi_mr` is registered (`DomainOps::mr_register`) and dropped when it closes, after the key
/// left the domain's map. Its key becomes the region's key.
pub trait ProviderMr: Send + Sync {
    /// The key peers name the region by (for a NIC, one that carries its remote key).
    fn key(&self) -> u64;
}

/// An endpoint that may hold a region's memory between its progress calls (a peer's write
/// arriving into it, the answer to a peer's read sent from it): told when a region of its
/// domain closes, before the close returns, so that it lets go of that memory
/// (`Engine::cut_region`). Registered with `MrMap::watch_closes`.
pub trait RegionCut: Send + Sync {
    /// The region with key `key`, `addr..addr + len`, closed: from the return on, nothing
    /// of this endpoint writes or reads it. May wait for a copy under way into it (a progress
    /// call's), never for a peer.
    fn cut(&self, key: u64, addr: usize, len: usize);
}

/// The domain's key → region map.
pub struct MrMap {
    mode: u32,
    /// The domain's provider makes NIC keys (`NIC_KEY_TAG`): that space is never drawn from,
    /// nor taken from the application.
    nic_keys: bool,
    map: RwLock<HashMap<u64, MrEntry>>,
    /// Keys of regions whose descriptor was handed to an XPU (`get_xpu_desc`): the only ones a
    /// descriptor an XPU posts may name as its local memory.
    xpu: RwLock<HashSet<u64>>,
    /// Bumped after every removal: what a watcher found of an exported region
    /// (`XpuRegion`) holds while it has not moved.
    generation: AtomicU64,
    /// Endpoints told of each close (`watch_closes`), weakly: a closed one is dropped from
    /// the list at the next registration.
    cutters: Mutex<Vec<Weak<dyn RegionCut>>>,
}

impl MrMap {
    /// A map for a domain whose registrations follow `mr_mode`.
    pub fn new(mode: u32) -> Self {
        MrMap {
            mode,
            nic_keys: false,
            map: RwLock::new(HashMap::new()),
            xpu: RwLock::new(HashSet::new()),
            generation: AtomicU64::new(0),
            cutters: Mutex::new(Vec::new()),
        }
    }

    /// The map of a domain whose provider makes NIC keys (`DomainOps::nic_keys`), if `yes`.
    pub fn nic_keys(mut self, yes: bool) -> Self {
        self.nic_keys = yes;
        self
    }

    /// Tells `ep` of every region of this domain that closes from now on (`RegionCut`).
    pub fn watch_closes(&self, ep: Weak<dyn RegionCut>) {
        let mut v = self.cutters.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(ep);
    }

    /// The domain's mr_mode.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Adds `attr` under `key`, or under a key of the map's choosing (`None`).
    fn insert(&self, attr: &MrAttr, key: Option<u64>) -> Result<u64> {
        if attr.access & !MR_ACCESS_BITS != 0 {
            return Err(Error::Inval(format!(
                "mr_reg: access {:#x} has bits that are not access flags",
                attr.access
            )));
        }
        if attr.len > 0 && attr.addr.checked_add(attr.len).is_none() {
            return Err(Error::Inval("mr_reg: address range wraps".into()));
        }
        // Host memory at address 0 is never a caller's: registered, a peer's write with its
        // key would land in the first page and take the process down.
        if attr.len > 0 && attr.addr == 0 && attr.iface == Iface::System {
            return Err(Error::Inval(format!(
                "mr_reg: a null address with a length of {} bytes",
                attr.len
            )));
        }
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        let key = if let Some(k) = key {
            if k == FI_KEY_NOTAVAIL || m.contains_key(&k) {
                return Err(Error::NoKey(format!(
                    "mr_reg: the provider's key {k:#x} is already registered in this domain"
                )));
            }
            k
        } else if self.mode & FI_MR_PROV_KEY != 0 {
            // A key is what a remote peer must present to reach the region: drawn from the
            // OS's CSPRNG, so that nobody can guess one (a counter made the first region of
            // every domain key 1). 0, FI_KEY_NOTAVAIL and NIC keys are never handed out.
            loop {
                let k = getrandom::u64()
                    .map_err(|e| Error::NoKey(format!("mr_reg: no random key from the OS: {e}")))?;
                let nic = self.nic_keys && is_nic_key(k);
                if k != 0 && k != FI_KEY_NOTAVAIL && !nic && !m.contains_key(&k) {
                    break k;
                }
            }
        } else {
            if attr.requested_key == FI_KEY_NOTAVAIL {
                return Err(Error::Inval("mr_reg: requested_key FI_KEY_NOTAVAIL".into()));
            }
            if self.nic_keys && is_nic_key(attr.requested_key) {
                return Err(Error::NoKey(format!(
                    "mr_reg: key {:#x} lies in the NIC keys' space (bits 63..48 {:#x})",
                    attr.requested_key,
                    NIC_KEY_TAG >> 48
                )));
            }
            if m.contains_key(&attr.requested_key) {
                return Err(Error::NoKey(format!(
                    "mr_reg: key {} is already registered in this domain",
                    attr.requested_key
                )));
            }
            attr.requested_key
        };
        m.insert(
            key,
            MrEntry {
                addr: attr.addr,
                len: attr.len,
                access: attr.access,
                offset: attr.offset,
                owner: attr.owner(),
            },
        );
        Ok(key)
    }

    fn remove(&self, key: u64) {
        self.xpu
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        let gone = self
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        // After the removal: a check that still sees the old generation ran before it ended.
        self.generation.fetch_add(1, Ordering::Release);
        // No request resolves the key any more; those that did let go of its memory before
        // the close returns. The list is copied out: an endpoint's cut takes its own lock.
        if let Some(e) = gone.filter(|e| e.len > 0) {
            let eps: Vec<Arc<dyn RegionCut>> = self
                .cutters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for ep in eps {
                ep.cut(key, e.addr, e.len);
            }
        }
    }

    /// Checks a remote access and returns the local address it lands at. `addr` is a virtual
    /// address with `FI_MR_VIRT_ADDR`, else an offset from the registration's `offset`.
    pub fn check(&self, key: u64, addr: u64, len: usize, access: u64) -> Result<usize> {
        self.check_owned(key, addr, len, access).map(|(a, _)| a)
    }

    /// As `check`, also saying who owns the region's memory (a device's memory cannot be
    /// written or read by the host directly: see `HmemOps`).
    pub fn check_owned(
        &self,
        key: u64,
        addr: u64,
        len: usize,
        access: u64,
    ) -> Result<(usize, Owner)> {
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        let e = m
            .get(&key)
            .ok_or_else(|| Error::Access(format!("no memory region with key {key:#x}")))?;
        if e.access & access != access {
            return Err(Error::Access(format!(
                "key {key:#x} was registered with access {:#x}, not {:#x}",
                e.access, access
            )));
        }
        let start = if self.mode & FI_MR_VIRT_ADDR != 0 {
            (addr as usize).wrapping_sub(e.addr)
        } else {
            addr.wrapping_sub(e.offset) as usize
        };
        if start > e.len || len > e.len - start {
            return Err(Error::Access(format!(
                "range {addr:#x}+{len} is outside key {key:#x}'s {} bytes",
                e.len
            )));
        }
        Ok((e.addr + start, e.owner))
    }
}

/// Why local memory an XPU named was refused (`MrMap::check_xpu_local`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XpuMrFault {
    /// The descriptor names no region exported to an XPU (never exported, or closed since).
    NotExported(String),
    /// The range lies outside the region, wraps, or the region lacks the access.
    Range(String),
}

impl MrMap {
    /// Marks the region with key `key` as one an XPU may name (`MemoryRegion::get_xpu_desc`).
    fn export_xpu(&self, key: u64) {
        self.xpu
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
    }

    /// Checks local memory an XPU's descriptor names: `desc` must be a region exported with
    /// `get_xpu_desc`, and `addr..addr + len` (virtual addresses) must lie inside it with
    /// `access` (`FI_SEND`, `FI_RECV`, `FI_READ`, `FI_WRITE`; a region registered with none of
    /// them allows them all, as fi_mr(3) says).
    pub fn check_xpu_local(
        &self,
        desc: u64,
        addr: u64,
        len: u64,
        access: u64,
    ) -> std::result::Result<(), XpuMrFault> {
        self.xpu_region(desc)?.check(addr, len, access)
    }

    /// As `check_xpu_local`, through `cache`, what the same caller found last: its region is
    /// looked up again only when `desc` differs or a region was closed since (the map's
    /// generation moved). The range and access are checked every time.
    #[inline]
    pub fn check_xpu_local_cached(
        &self,
        cache: &mut Option<XpuRegion>,
        desc: u64,
        addr: u64,
        len: u64,
        access: u64,
    ) -> std::result::Result<(), XpuMrFault> {
        let gen = self.generation.load(Ordering::Acquire);
        match cache {
            Some(r) if r.desc == desc && r.generation == gen => r.check(addr, len, access),
            _ => self.check_xpu_local_lookup(cache, gen, desc, addr, len, access),
        }
    }

    /// `check_xpu_local_cached` where the cache does not hold `desc` for generation `gen`.
    #[inline(never)]
    fn check_xpu_local_lookup(
        &self,
        cache: &mut Option<XpuRegion>,
        gen: u64,
        desc: u64,
        addr: u64,
        len: u64,
        access: u64,
    ) -> std::result::Result<(), XpuMrFault> {
        // The generation is read before the lookup: a removal after it moves it.
        let r = self.xpu_region(desc)?;
        *cache = Some(XpuRegion {
            generation: gen,
            ..r
        });
        r.check(addr, len, access)
    }

    /// The region exported to an XPU under `desc`, as registered now.
    fn xpu_region(&self, desc: u64) -> std::result::Result<XpuRegion, XpuMrFault> {
        if !self
            .xpu
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&desc)
        {
            return Err(XpuMrFault::NotExported(format!(
                "descriptor {desc:#x} names no memory region exported to an XPU (get_xpu_desc)"
            )));
        }
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        let Some(e) = m.get(&desc) else {
            return Err(XpuMrFault::NotExported(format!(
                "descriptor {desc:#x}: its memory region is closed"
            )));
        };
        Ok(XpuRegion {
            desc,
            generation: 0,
            addr: e.addr as u64,
            len: e.len as u64,
            access: e.access,
            device: e.owner.is_device(),
        })
    }
}

/// A region exported to an XPU as a watcher found it (`MrMap::check_xpu_local_cached`).
#[derive(Clone, Copy, Debug)]
pub struct XpuRegion {
    desc: u64,
    /// The map's generation when it was found.
    generation: u64,
    addr: u64,
    len: u64,
    access: u64,
    /// Device memory (CUDA, Level Zero, ...), which only an `FI_HMEM` endpoint may name.
    device: bool,
}

impl XpuRegion {
    /// Whether the region is a device's memory.
    pub(crate) fn is_device(&self) -> bool {
        self.device
    }

    /// `addr..addr + len` inside the region, with `access`. The checks alone, so that they
    /// inline into the watcher's loop; what went wrong is worded out of line.
    #[inline]
    fn check(&self, addr: u64, len: u64, access: u64) -> std::result::Result<(), XpuMrFault> {
        const LOCAL: u64 = FI_SEND | FI_RECV | FI_READ | FI_WRITE;
        let access_ok = self.access & LOCAL == 0 || self.access & access == access;
        let inside = match (addr.checked_sub(self.addr), addr.checked_add(len)) {
            (Some(_), Some(end)) => self.addr.checked_add(self.len).is_some_and(|r| end <= r),
            _ => false,
        };
        if access_ok && inside {
            Ok(())
        } else {
            Err(self.refusal(addr, len, access, access_ok))
        }
    }

    #[cold]
    #[inline(never)]
    fn refusal(&self, addr: u64, len: u64, access: u64, access_ok: bool) -> XpuMrFault {
        let desc = self.desc;
        if !access_ok {
            return XpuMrFault::Range(format!(
                "descriptor {desc:#x}: region registered with access {:#x}, not {}",
                self.access,
                caps_str(access)
            ));
        }
        XpuMrFault::Range(format!(
            "range {addr:#x}+{len} is outside descriptor {desc:#x}'s region {:#x}+{}",
            self.addr, self.len
        ))
    }
}

/// `fid_mr`: a registration, removed from the domain's map when dropped (and then the
/// provider's own registration, if it made one).
pub struct MemoryRegion {
    key: u64,
    attr: MrAttr,
    map: Weak<MrMap>,
    prov: Option<Box<dyn ProviderMr>>,
}

impl MemoryRegion {
    /// Registers `attr` in `map`.
    pub fn register(map: &Arc<MrMap>, attr: &MrAttr) -> Result<Self> {
        Self::register_with(map, attr, None)
    }

    /// Registers `attr` in `map`; with `prov`, under the provider registration's key, which
    /// lives as long as the region.
    pub fn register_with(
        map: &Arc<MrMap>,
        attr: &MrAttr,
        prov: Option<Box<dyn ProviderMr>>,
    ) -> Result<Self> {
        let key = map.insert(attr, prov.as_ref().map(|p| p.key()))?;
        Ok(MemoryRegion {
            key,
            attr: attr.clone(),
            map: Arc::downgrade(map),
            prov,
        })
    }

    /// Whether the provider registered the region itself (its key is the provider's).
    pub fn provider_registered(&self) -> bool {
        self.prov.is_some()
    }

    /// `fi_mr_key`.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// `fi_mr_desc`.
    pub fn desc(&self) -> MrDesc {
        MrDesc(self.key)
    }

    /// `fi_mr_get_xpu_desc`: the raw descriptor an XPU names this region by in the descriptors
    /// it posts (its local memory). From this call on, the watcher accepts the region as
    /// local memory of XPU-posted operations (range and access checked at each use), until
    /// the region closes. The region's registration contract covers the memory.
    pub fn get_xpu_desc(&self) -> Result<u64> {
        let map = self.map.upgrade().ok_or_else(|| {
            Error::OpBadState("mr_get_xpu_desc: the region's domain is closed".into())
        })?;
        map.export_xpu(self.key);
        Ok(self.key)
    }

    /// The registered range and access.
    pub fn attr(&self) -> &MrAttr {
        &self.attr
    }

    /// `fi_mr_attr.iface`: the memory interface the region was registered with.
    pub fn iface(&self) -> Iface {
        self.attr.iface
    }

    /// `fi_mr_attr.device`: the device of `iface` the region's memory belongs to.
    pub fn device(&self) -> u64 {
        self.attr.device
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Some(m) = self.map.upgrade() {
            m.remove(self.key);
        }
        // The key is gone from the map first: no engine-path access starts after the
        // provider's registration ends.
        self.prov.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn provider_keys_are_random_unique_and_never_reserved() {
        let map = MrMap::new(FI_MR_VIRT_ADDR | FI_MR_PROV_KEY).nic_keys(true);
        let buf = [0u8; 64];
        let attr = MrAttr {
            addr: buf.as_ptr() as usize,
            len: 64,
            access: FI_REMOTE_WRITE,
            ..Default::default()
        };
        let keys: Vec<u64> = (0..1000)
            .map(|_| map.insert(&attr, None).unwrap())
            .collect();
        let unique: std::collections::HashSet<u64> = keys.iter().copied().collect();
        assert_eq!(unique.len(), keys.len());
        assert!(keys
            .iter()
            .all(|&k| k != 0 && k != FI_KEY_NOTAVAIL && !is_nic_key(k)));
        // Another domain's first key is not this one's: nothing to learn from a domain.
        let other = MrMap::new(FI_MR_VIRT_ADDR | FI_MR_PROV_KEY);
        assert_ne!(other.insert(&attr, None).unwrap(), keys[0]);
        // Guesses land nothing: the first 4,096 keys a counter would give, and as many
        // random ones, at the region's own address.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let guesses = (1..=4096u64).chain((0..4096).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }));
        for g in guesses.filter(|g| !unique.contains(g)) {
            assert!(matches!(
                map.check(g, buf.as_ptr() as u64, 8, FI_REMOTE_WRITE),
                Err(Error::Access(_))
            ));
        }
    }

    #[test]
    fn user_keys_are_unique_and_access_is_checked() {
        let map = Arc::new(MrMap::new(FI_MR_VIRT_ADDR).nic_keys(true));
        let buf = [0u8; 64];
        let attr = MrAttr {
            addr: buf.as_ptr() as usize,
            len: 64,
            access: FI_REMOTE_READ,
            requested_key: 42,
            ..Default::default()
        };
        let mr = MemoryRegion::register(&map, &attr).unwrap();
        assert_eq!(mr.key(), 42);
        assert!(matches!(
            MemoryRegion::register(&map, &attr),
            Err(Error::NoKey(_))
        ));
        let base = buf.as_ptr() as u64;
        assert_eq!(
            map.check(42, base + 8, 8, FI_REMOTE_READ),
            Ok(buf.as_ptr() as usize + 8)
        );
        assert!(matches!(
            map.check(42, base, 8, FI_REMOTE_WRITE),
            Err(Error::Access(_))
        ));
        assert!(matches!(
            map.check(42, base + 60, 8, FI_REMOTE_READ),
            Err(Error::Access(_))
        ));
        assert!(matches!(
            map.check(7, base, 8, FI_REMOTE_READ),
            Err(Error::Access(_))
        ));
        drop(mr);
        assert!(map.check(42, base, 8, FI_REMOTE_READ).is_err());
        // A key in the NIC keys' space, in a domain whose provider makes them: a verbs peer
        // would send it to its NIC, which does not know it. Elsewhere it is a key like any.
        let nic = MrAttr {
            requested_key: NIC_KEY_TAG | 1,
            ..attr
        };
        assert!(matches!(
            MemoryRegion::register(&map, &nic),
            Err(Error::NoKey(_))
        ));
        let plain = Arc::new(MrMap::new(FI_MR_VIRT_ADDR));
        assert!(MemoryRegion::register(&plain, &nic).is_ok());
    }

    #[test]
    fn provider_keys_and_offsets() {
        let map = Arc::new(MrMap::new(FI_MR_PROV_KEY));
        let a = MemoryRegion::register(
            &map,
            &MrAttr {
                addr: 0x1000,
                len: 16,
                access: FI_REMOTE_WRITE,
                offset: 100,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(map.check(a.key(), 104, 4, FI_REMOTE_WRITE), Ok(0x1004));
    }

    struct Nic(u64, Arc<AtomicU64>);
    impl ProviderMr for Nic {
        fn key(&self) -> u64 {
            self.0
        }
    }
    impl Drop for Nic {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_provider_registration_gives_the_key_and_ends_with_the_region() {
        let map = Arc::new(MrMap::new(FI_MR_PROV_KEY | FI_MR_VIRT_ADDR));
        let dropped = Arc::new(AtomicU64::new(0));
        let attr = MrAttr {
            addr: 0x2000,
            len: 64,
            access: FI_REMOTE_READ,
            ..Default::default()
        };
        let nic = |k| Some(Box::new(Nic(k, dropped.clone())) as Box<dyn ProviderMr>);
        let a = MemoryRegion::register_with(&map, &attr, nic(0xabcd_0000_0001)).unwrap();
        assert_eq!(a.key(), 0xabcd_0000_0001);
        assert!(a.provider_registered());
        assert_eq!(map.check(a.key(), 0x2008, 8, FI_REMOTE_READ), Ok(0x2008));
        // The same provider key twice is refused; the refused registration is dropped.
        assert!(matches!(
            MemoryRegion::register_with(&map, &attr, nic(0xabcd_0000_0001)),
            Err(Error::NoKey(_))
        ));
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        drop(a);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
        assert!(map
            .check(0xabcd_0000_0001, 0x2008, 8, FI_REMOTE_READ)
            .is_err());
    }
}
