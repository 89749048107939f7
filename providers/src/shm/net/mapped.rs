//! The mapped copy: a message (or an RMA write's source) in memory the sender allocated with
//! hmem's `alloc_host_mapped` (a sealed memfd) is read by the receiver straight out of a
//! read-only mapping of the sender's allocation: one copy, made by the receiver, with no
//! system call once the mapping is cached. The sender's transport only describes the memory
//! (`describe`), so a send from such memory costs its sender a small `Rts` instead of the
//! copy of an eager body into the ring; that is why the engine offers it below `eager_max`,
//! from `XFABRIC_SHM_MAP_MIN` bytes (`OneSided::offer_min`).
//!
//! ```text
//! DESC: 0 TAG:u8 | 1 IpcHandle wire form (112 bytes) | 113 len:u64      (121 bytes)
//! ```
//!
//! The length tells it from a cross-memory-attach descriptor (`Desc::of_iov`: 16 bytes per
//! segment, at most 64), which reads nothing from it (`to_iov` refuses it). Only one-segment
//! iovs are described so.
//!
//! Everything in it is the peer's: the handle is opened (hmem's `ipc_open`, which checks the file's
//! identity, size and seals) only when its pid is the one this endpoint verified for the peer
//! (`Link::pid`), the range is checked against the allocation, and the mapping is cached per peer
//! and allocation (at most `CACHE_MAX` of them, mapping at most the machine's memory and swap
//! between them, the least recently used going first; a peer's all go when it is lost). The size is
//! the handle's word: a sparse file of terabytes, sealed, opens, and 16 of them per endpoint would
//! take the address space; an allocation larger than the budget holds more than any process could
//! have written, and is read by cross-memory attach. A copy the mapping cannot serve (the handle
//! does not open, names another process, or the copy writes: an RMA read's destination) goes by
//! cross-memory attach to the address the handle names, as a plain descriptor would; where that is
//! refused too, the engine moves the message through frames (`Copied::Refused`).
//!
//! A mapped copy is never split between the processes (`split` reads only plain
//! descriptors): measured with `pingpong -H` against the heap's split cross-memory attach
//! (median of five, one-way), the mapping takes 57 us against 87 at 1 MiB and 114 against 183
//! at 2 MiB, but 962 against 579 at 4 MiB and 2,573 against 1,777 at 8 MiB, where one core's
//! copy is bound by memory and two cores copy faster. Splitting a mapped one by cross-memory
//! attach was slower still (2,034 us at 4 MiB): the kernel's copy uses `rep movsb` too, and
//! page-aligned shared memory into a heap buffer is the alignment it is slow at (`copy_into`).

use std::sync::atomic::{AtomicU64, Ordering};

use xfabric_core::rdm::{Copied, CopyReq, Desc, Dir, PeerId};
use xfabric_core::IovList;
use xfabric_hmem::{HmemIface, IpcHandle, IpcMapping, System};

use super::Net;

/// First byte of a mapped descriptor.
pub const TAG: u8 = 0xA7;
/// Its length.
pub const DESC_LEN: usize = 1 + IpcHandle::WIRE_LEN + 8;
/// Mappings one endpoint keeps open.
pub const CACHE_MAX: usize = 16;

/// Bytes one endpoint keeps mapped at most: the machine's memory and swap (`sysinfo`), what an
/// allocation's written pages can hold between them.
fn machine_budget() -> u64 {
    static BUDGET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        // SAFETY: `sysinfo` fills the zeroed struct it is given.
        let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sysinfo(&mut si) } != 0 {
            // Not known: a budget that still bounds the address space taken.
            return 64 << 30;
        }
        (si.totalram as u64)
            .saturating_add(si.totalswap as u64)
            .saturating_mul(u64::from(si.mem_unit.max(1)))
    })
}

static COPIES: AtomicU64 = AtomicU64::new(0);
static OPENS: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// What the mapped copies of every endpoint of this process did: for tests, which must know
/// how a message came without timing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Copies served from a mapping.
    pub copies: u64,
    /// Mappings opened (a cached one is not opened again).
    pub opens: u64,
    /// Mapped descriptors served otherwise (cross-memory attach, or refused).
    pub fallbacks: u64,
}

/// What the mapped copies of every endpoint of this process did so far.
pub fn counts() -> Counts {
    Counts {
        copies: COPIES.load(Ordering::Relaxed),
        opens: OPENS.load(Ordering::Relaxed),
        fallbacks: FALLBACKS.load(Ordering::Relaxed),
    }
}

/// The mapped descriptor of `len` bytes from where `h` points.
pub fn desc_of(h: &IpcHandle, len: usize) -> Desc {
    let mut d = Desc::default();
    // 121 bytes: always fits (`MAX_DESC` is 128).
    d.push(&[TAG]);
    d.push(&h.to_bytes());
    d.push(&(len as u64).to_le_bytes());
    d
}

/// A mapped descriptor of `iov`, where it is one segment inside an allocation hmem exports.
pub fn describe(sys: &System, iov: &IovList) -> Option<Desc> {
    let [s] = iov.segs() else {
        return None;
    };
    let h = sys.export(s.addr as *const u8, s.len)?;
    Some(desc_of(&h, s.len))
}

/// What a mapped descriptor names: the allocation and how many bytes from its offset.
pub struct Named {
    pub handle: IpcHandle,
    pub len: usize,
}

impl Named {
    /// The bytes at the sender's own addresses, for cross-memory attach; `None` where the
    /// handle's arithmetic wraps.
    fn iov(&self) -> Option<IovList> {
        let addr = self.handle.base.checked_add(self.handle.offset)?;
        let addr = usize::try_from(addr).ok()?;
        addr.checked_add(self.len)?;
        Some(IovList::one(addr, self.len))
    }
}

/// `Some` for a mapped descriptor (`Err`: one that does not parse), `None` for any other.
pub fn decode(d: &Desc) -> Option<Result<Named, String>> {
    let b = d.as_bytes();
    if b.len() != DESC_LEN || b[0] != TAG {
        return None;
    }
    let w = IpcHandle::WIRE_LEN;
    Some((|| {
        let handle = IpcHandle::from_bytes(&b[1..1 + w]).map_err(|e| e.to_string())?;
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[1 + w..]);
        let len = usize::try_from(u64::from_le_bytes(n)).map_err(|_| "a length past usize")?;
        handle
            .check_range("mapped copy", len)
            .map_err(|e| e.to_string())?;
        Ok(Named { handle, len })
    })())
}

/// One open mapping of a peer's allocation.
struct Entry {
    peer: PeerId,
    /// The handle it was opened from, less its offset: what names the same mapping.
    key: IpcHandle,
    map: IpcMapping,
    /// When it was last used (`Cache::clock`).
    used: u64,
}

/// The mappings one endpoint keeps, and the peers whose handles would not open.
#[derive(Default)]
pub struct Cache {
    sys: System,
    entries: Vec<Entry>,
    clock: u64,
    /// Peers a handle failed to open for: their mapped descriptors go by cross-memory attach
    /// without trying again (each try costs opens and a stat).
    refused: Vec<PeerId>,
    /// Bytes mapped at most, where not the machine's (`machine_budget`): for tests.
    budget: Option<u64>,
}

impl Cache {
    fn budget(&self) -> u64 {
        self.budget.unwrap_or_else(machine_budget)
    }

    /// Bytes mapped now.
    fn mapped(&self) -> u64 {
        self.entries.iter().map(|e| e.map.len() as u64).sum()
    }

    /// The mapping `h` names for `peer`, opened now if not cached (`h`'s allocation fits the
    /// budget: the caller checked).
    fn get(&mut self, peer: PeerId, h: &IpcHandle) -> Result<&IpcMapping, String> {
        self.clock += 1;
        let key = IpcHandle {
            offset: 0,
            ..h.clone()
        };
        let found = self
            .entries
            .iter()
            .position(|e| e.peer == peer && e.key == key);
        let i = match found {
            Some(i) => i,
            None => {
                // Room first, so that what is mapped never passes the budget.
                let room = self.budget().saturating_sub(key.alloc_len);
                while self.entries.len() >= CACHE_MAX
                    || (!self.entries.is_empty() && self.mapped() > room)
                {
                    let old = (0..self.entries.len())
                        .min_by_key(|&i| self.entries[i].used)
                        .expect("not empty: the loop's condition");
                    Self::close(self.entries.swap_remove(old));
                }
                let map = self.sys.ipc_open(0, &key).map_err(|e| e.to_string())?;
                OPENS.fetch_add(1, Ordering::Relaxed);
                self.entries.push(Entry {
                    peer,
                    key,
                    map,
                    used: 0,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.used = self.clock;
        Ok(&e.map)
    }

    fn close(e: Entry) {
        if let Err(err) = e.map.close() {
            tracing::warn!("shm: unmapping a peer's allocation: {err}");
        }
    }

    /// `peer` is gone: its mappings go (the pages of an allocation it freed with them).
    pub fn drop_peer(&mut self, peer: PeerId) {
        let (gone, kept) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| e.peer == peer);
        self.entries = kept;
        gone.into_iter().for_each(Self::close);
        self.refused.retain(|&p| p != peer);
    }
}

impl Net {
    /// Serves copy `c`, whose descriptor is a mapped one (`named`, parsed or not), from a
    /// mapping of the peer's allocation; `Err` with the bytes to reach by cross-memory
    /// attach instead (`None`: nothing usable) where the mapping cannot serve it.
    pub(super) fn copy_mapped(
        &mut self,
        c: &CopyReq,
        named: Result<Named, String>,
    ) -> Result<Copied, Option<IovList>> {
        let fallback = |why: &str, to: Option<IovList>| {
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("shm: a mapped descriptor served otherwise: {why}");
            to
        };
        let m = match named {
            Ok(m) => m,
            Err(why) => return Err(fallback(&why, None)),
        };
        if c.dir != Dir::Read {
            return Err(fallback("the copy writes", m.iov()));
        }
        if c.len > m.len || c.len > c.local.total() {
            return Ok(Copied::Failed(xfabric_core::consts::errno::FI_EINVAL));
        }
        let pid = self.links.get(c.peer).and_then(|l| l.pid);
        if pid.is_none_or(|p| i64::from(p) != i64::from(m.handle.pid)) {
            return Err(fallback(
                &format!(
                    "handle of pid {}, not the peer's verified {pid:?}",
                    m.handle.pid
                ),
                m.iov(),
            ));
        }
        if m.handle.alloc_len > self.maps.budget() {
            // Not the peer's fault alone (a large real allocation on a small machine): its
            // other handles still map.
            return Err(fallback(
                &format!(
                    "an allocation of {} bytes, more than the {} this endpoint maps",
                    m.handle.alloc_len,
                    self.maps.budget()
                ),
                m.iov(),
            ));
        }
        if self.maps.refused.contains(&c.peer) {
            return Err(fallback("the peer's handles do not open", m.iov()));
        }
        let map = match self.maps.get(c.peer, &m.handle) {
            Ok(map) => map,
            Err(why) => {
                tracing::warn!(
                    peer = %self.links[c.peer].name,
                    "shm: a peer's memory handle does not open ({why}); its memory is read by \
                     cross-memory attach"
                );
                self.maps.refused.push(c.peer);
                return Err(fallback(&why, m.iov()));
            }
        };
        // `check_range` held at decoding and the mapping covers the handle's whole allocation
        // (it is keyed by everything in the handle but the offset): `offset + len` lies in it.
        let src = (map.base() as usize + m.handle.offset as usize) as *const u8;
        // SAFETY: `src..src + c.len` lies inside a live read-only mapping of a file sealed
        // against shrinking (no access faults); the peer may write those bytes meanwhile, as
        // it may under cross-memory attach (its data, its race). `c.local` is the engine's
        // to write until `on_copied`, at least `c.len` bytes (checked above).
        unsafe { copy_into(&c.local, src, c.len) };
        COPIES.fetch_add(1, Ordering::Relaxed);
        Ok(Copied::Done)
    }
}

/// Copies `len` bytes from `src` into the segments of `dst`, in order (each piece without
/// `rep movsb`'s slow band: `xfabric_core::copy`).
///
/// # Safety
/// `src..src + len` is readable; `dst`'s segments are writable, not overlapping it, and hold
/// at least `len` bytes.
unsafe fn copy_into(dst: &IovList, src: *const u8, len: usize) {
    let mut done = 0;
    for s in dst.segs() {
        let n = s.len.min(len - done);
        if n == 0 {
            break;
        }
        // SAFETY: `done + n <= len` and `n <= s.len`: inside both ranges by the contract.
        unsafe { xfabric_core::copy::copy_bytes(src.wrapping_add(done), s.addr as *mut u8, n) };
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfabric_core::RawIov;
    use xfabric_hmem::Iface;

    /// The mappings a peer's handles open never add up past the budget: the least recently
    /// used go first to make room, the count cap aside.
    #[test]
    fn mappings_stay_within_the_budget() {
        const LEN: usize = 1 << 20;
        let hmem = xfabric_hmem::Hmem::global().get(Iface::System);
        let allocs: Vec<_> = (0..4)
            .map(|_| hmem.alloc_host_mapped(0, LEN).expect("alloc_host_mapped"))
            .collect();
        let handles: Vec<_> = allocs
            .iter()
            .map(|a| hmem.ipc_get(a.as_ptr(), LEN).expect("ipc_get"))
            .collect();
        let mut cache = Cache {
            budget: Some(3 * LEN as u64 - 1),
            ..Cache::default()
        };
        let peer: PeerId = 0;
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(cache.get(peer, h).expect("opens").len(), LEN, "{i}");
            assert!(cache.mapped() < 3 * LEN as u64, "{i}: {}", cache.mapped());
        }
        assert_eq!(cache.entries.len(), 2);
        // The last two stay, the first two went.
        let keys: Vec<u64> = cache.entries.iter().map(|e| e.key.base).collect();
        for h in &handles[2..] {
            assert!(keys.contains(&h.base));
        }
        cache.drop_peer(peer);
        assert_eq!(cache.mapped(), 0);
    }

    #[test]
    fn copies_land_whatever_the_alignment() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for off in [0usize, 1, 8, 16, 31, 64, 4000] {
            let mut a = vec![0u8; 5000 + off];
            let mut b = vec![0u8; 40_000];
            let dst =
                IovList::from_segs([RawIov::of_mut(&mut a[off..]), RawIov::of_mut(&mut b[..])])
                    .unwrap();
            // SAFETY: `src` holds 40,000 bytes; `a` and `b` hold 45,000 between them.
            unsafe { copy_into(&dst, src.as_ptr(), 40_000) };
            assert_eq!(&a[off..], &src[..5000], "offset {off}");
            assert_eq!(&b[..35_000], &src[5000..], "offset {off}");
            assert!(b[35_000..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn descriptors_round_trip_and_others_are_not_mapped_ones() {
        let h = IpcHandle {
            iface: Iface::System,
            pid: 77,
            device: 0,
            alloc_id: 0,
            base: 0x7000_0000,
            alloc_len: 1 << 20,
            offset: 4096,
            raw: [3; 64],
        };
        let d = desc_of(&h, 1000);
        assert_eq!(d.as_bytes().len(), DESC_LEN);
        let n = decode(&d).unwrap().unwrap();
        assert_eq!((n.handle, n.len), (h.clone(), 1000));
        // What cross-memory attach reads from it: nothing.
        assert!(d.to_iov().is_none());
        // A plain descriptor, even one starting with the tag, is not a mapped one.
        let plain = Desc::of_iov(&IovList::one(TAG as usize, 10));
        assert!(decode(&plain).is_none());
        // The tag and length, but a handle that does not parse or a range past the end.
        let mut b = d.as_bytes().to_vec();
        b[1] ^= 1;
        assert!(decode(&Desc::new(&b).unwrap()).unwrap().is_err());
        let past = desc_of(&h, (1 << 20) - 4095);
        assert!(decode(&past).unwrap().is_err());
        let n = decode(&desc_of(&h, 10)).unwrap().unwrap();
        assert_eq!(
            n.iov().map(|l| l.segs()[0]),
            Some(RawIov {
                addr: 0x7000_1000,
                len: 10
            })
        );
    }
}
