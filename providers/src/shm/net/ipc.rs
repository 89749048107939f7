//! CUDA IPC: a large send from CUDA device memory (`EpCore::device_offer_min`, the setting
//! `XFABRIC_SHM_IPC_MIN`) is offered unstaged, described by a CUDA IPC handle
//! (`cuIpcGetMemHandle` through hmem's `ipc_get`), and the receiver opens the handle
//! (`cuIpcOpenMemHandle`) and copies with `cuMemcpyAsync` on its own copy stream: device to
//! device where the receive is device memory (straight into it: `EpCore::direct_landing`,
//! skipping the receive's host bounce), device to host otherwise. The copy's event is polled
//! by progress (`Net::poll_ipc`); nothing here waits on a stream.
//!
//! ```text
//! DESC: 0 TAG:u8 | 1 IpcHandle wire form (112 bytes, its allocation id included) | 113 len:u64
//! ```
//!
//! A receiver opens the handle and copies on the receive's device where it is CUDA memory,
//! else on the device of the sender's ordinal where it has one (else its first); mappings are
//! cached per device too (docs/hmem.md, "Which device").
//!
//! Everything in it is the peer's: the handle must be a CUDA one, its pid the peer's verified
//! one (`Link::pid`), its range inside the allocation, the copy no longer than what it
//! offers; only then is it opened. Opened mappings are cached per peer and allocation (at
//! most `CACHE_MAX`, the least recently used closing first; a lost peer's all close). An
//! allocation is named by its id as well as its address: a cached mapping for the same
//! address with another id (the peer freed the allocation and made another there) is stale,
//! closed and never used. The driver refuses a handle to freed memory itself.
//!
//! A handle that does not open (a driver or container without IPC, a stale handle, a peer
//! whose pid is not verified) is logged and counted (`counts`), and the copy answers
//! `Copied::Refused`: the engine asks the sender for the data through frames and the sender
//! stages it (`hmem_stage::offer_counts().staged`). The engine then asks no more copies of
//! that peer.
//!
//! Virtual-memory-management allocations (`cuMemCreate`, mapped into a reserved range) have
//! no legacy IPC handle. Where `cuIpcGetMemHandle` refuses the memory, the sender exports the
//! allocation as a POSIX file descriptor (hmem's `vmm_export`: the device's and the
//! allocation's handle types checked, then `cuMemExportToShareableHandle`), passes the
//! descriptor to the peer over its descriptor socket (`fdpass`, the peer's identity checked
//! there), and offers the send with a VMM descriptor (`TAG_VMM`, the same layout; the
//! handle's `raw` is `IpcHandle::VMM_RAW`). The receiver takes the descriptor its peer passed
//! for that allocation id (`fdpass::Inbox`: only from the peer's verified pid) and imports and
//! maps it (hmem's `vmm_open`: `cuMemImportFromShareableHandle`, reserve, map, set access),
//! cached per peer and allocation exactly as a legacy handle's mapping, stale ones closed
//! alike. The sender passes an allocation's descriptor to a peer once (`Passed`); a receiver
//! that evicted the mapping since declines the next offer (`Copied::Declined`, answered `Cts`),
//! upon which the sender forgets the allocation and passes its descriptor with the offer
//! after. Memory that cannot be exported that way (the driver lacks the VMM calls or the POSIX descriptor handle
//! type, the allocation was not created with it, the peer's socket is missing or not the
//! peer's) is not offered: the send goes staged, logged and counted (`Counts::unexported`). A
//! VMM descriptor whose descriptor never came is refused like any handle that does not open.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xfabric_core::consts::errno::{FI_ECANCELED, FI_EINVAL, FI_EIO};
use xfabric_core::rdm::{Copied, CopyReq, Desc, Dir, PeerId};
use xfabric_core::{Iface, IovList};
use xfabric_hmem::{AsyncCopy, HmemIface, IpcHandle, IpcMapping};

use super::{fdpass, Net};

/// Each peer's segment name and verified pid, by peer id: what a sender needs to pass a
/// descriptor (`Net` adds each link; the endpoint's `ShmOneSided` reads it when describing).
pub type PeerBook = Arc<std::sync::Mutex<Vec<(String, Option<fdpass::Verified>)>>>;

/// First byte of a CUDA IPC descriptor.
pub const TAG: u8 = 0xC5;
/// First byte of a CUDA VMM descriptor (its allocation's descriptor passed by `fdpass`).
pub const TAG_VMM: u8 = 0xC6;
/// Its length.
pub const DESC_LEN: usize = 1 + IpcHandle::WIRE_LEN + 8;
/// Mappings one endpoint keeps open.
pub const CACHE_MAX: usize = 16;

static COPIES: AtomicU64 = AtomicU64::new(0);
static DIRECT: AtomicU64 = AtomicU64::new(0);
static OPENS: AtomicU64 = AtomicU64::new(0);
static STALE: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static DECLINED: AtomicU64 = AtomicU64::new(0);
static PASSED: AtomicU64 = AtomicU64::new(0);
static NOT_REPASSED: AtomicU64 = AtomicU64::new(0);
static UNEXPORTED: AtomicU64 = AtomicU64::new(0);

/// What the CUDA IPC copies of every endpoint of this process did (tests must know how a
/// message came without timing it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Copies completed from an opened peer allocation.
    pub copies: u64,
    /// Of those, copies straight into device memory (device to device).
    pub direct: u64,
    /// Handles opened (a cached mapping is not opened again).
    pub opens: u64,
    /// Cached mappings found stale (another allocation id at the same address) and closed.
    pub stale: u64,
    /// Descriptors refused (not opened, or not the peer's): the message went staged.
    pub refused: u64,
    /// VMM offers whose descriptor was not here (closed under the per-peer bound, or never
    /// passed): that message went staged, the next is copied again.
    pub declined: u64,
    /// VMM allocations' descriptors passed to peers (sender side).
    pub passed: u64,
    /// VMM offers that passed no descriptor: the peer was given that allocation's already
    /// (sender side).
    pub not_repassed: u64,
    /// Sends from VMM memory not offered (not exportable as a descriptor, or not passed):
    /// they went staged (sender side).
    pub unexported: u64,
    /// Descriptors taken from peers' connections (receiver side).
    pub taken: u64,
    /// Descriptor connections or messages refused: not from a peer's verified pid, or
    /// malformed (receiver side).
    pub fd_refused: u64,
    /// Descriptor connections closed unread: from a peer whose copies were refused, whose
    /// descriptors would never be used (receiver side).
    pub fd_discarded: u64,
}

/// What the CUDA IPC copies of this process did so far.
pub fn counts() -> Counts {
    Counts {
        copies: COPIES.load(Ordering::Relaxed),
        direct: DIRECT.load(Ordering::Relaxed),
        opens: OPENS.load(Ordering::Relaxed),
        stale: STALE.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        declined: DECLINED.load(Ordering::Relaxed),
        passed: PASSED.load(Ordering::Relaxed),
        not_repassed: NOT_REPASSED.load(Ordering::Relaxed),
        unexported: UNEXPORTED.load(Ordering::Relaxed),
        taken: fdpass::TAKEN.load(Ordering::Relaxed),
        fd_refused: fdpass::REFUSED.load(Ordering::Relaxed),
        fd_discarded: fdpass::DISCARDED.load(Ordering::Relaxed),
    }
}

/// The CUDA interface of this process.
fn cuda() -> &'static dyn HmemIface {
    xfabric_hmem::Hmem::global().get(Iface::Cuda)
}

/// The descriptor of `len` bytes from where `h` points.
pub fn desc_of(h: &IpcHandle, len: usize) -> Desc {
    let mut d = Desc::default();
    // 121 bytes: always fits (`MAX_DESC` is 128).
    d.push(&[if h.is_vmm() { TAG_VMM } else { TAG }]);
    d.push(&h.to_bytes());
    d.push(&(len as u64).to_le_bytes());
    d
}

/// Allocations remembered per peer in `Passed`.
pub const PASSED_MAX: usize = 64;

/// The VMM allocations whose descriptors this endpoint passed to each peer (sender side), as
/// (base, length, allocation id), at most `PASSED_MAX` per peer (the oldest forgotten first).
/// An offer from one of them passes nothing: the peer has its mapping cached. Where the peer
/// has neither (it evicted the mapping, or closed the descriptor under its bound), it declines
/// the copy and answers `Cts`; the engine says so (`OneSided::offer_declined`) and the
/// allocation is forgotten here, so its next offer passes the descriptor again.
#[derive(Default)]
pub struct Passed(std::sync::Mutex<Vec<Vec<(u64, u64, u64)>>>);

impl Passed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<(u64, u64, u64)>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has(&self, peer: PeerId, id: u64) -> bool {
        self.lock()
            .get(peer)
            .is_some_and(|v| v.iter().any(|e| e.2 == id))
    }

    fn add(&self, peer: PeerId, h: &IpcHandle) {
        let mut all = self.lock();
        if all.len() <= peer {
            all.resize_with(peer + 1, Vec::new);
        }
        let v = &mut all[peer];
        // An allocation at the same place is another one now (the peer's cached mapping of
        // the old one is stale there, and the new one's descriptor was passed).
        v.retain(|e| e.0 != h.base);
        if v.len() >= PASSED_MAX {
            v.remove(0);
        }
        v.push((h.base, h.alloc_len, h.alloc_id));
    }

    /// The peer declined a copy of memory at `addr`: the allocation holding it passes its
    /// descriptor again at its next offer.
    pub fn forget(&self, peer: PeerId, addr: u64) {
        if let Some(v) = self.lock().get_mut(peer) {
            v.retain(|e| !(e.0 <= addr && addr - e.0 < e.1));
        }
    }
}

/// A CUDA IPC descriptor of `iov`, where it is one segment of CUDA device memory; for a
/// virtual-memory-management allocation, its descriptor is passed to `peer` (segment name and
/// verified pid) first, unless `passed` says it was already. `None`: not CUDA device memory;
/// `Some(None)`: device memory that cannot be offered (it goes staged: no other descriptor of
/// it may be made, as cross-memory attach cannot read device memory).
pub fn describe(
    iov: &IovList,
    to: PeerId,
    passed: &Passed,
    peer: impl FnOnce() -> Option<(String, Option<fdpass::Verified>)>,
) -> Option<Option<Desc>> {
    let cuda = cuda();
    cuda.available().ok()?;
    let device = |a: usize| cuda.owns(a as *const u8).ok().flatten().is_some();
    let s = match iov.segs() {
        [s] if device(s.addr) => s,
        // Several segments: described only where none is device memory.
        segs => return segs.iter().any(|s| device(s.addr)).then_some(None),
    };
    Some(describe_device(cuda, s.addr, s.len, to, passed, peer))
}

/// `describe` of `len` bytes of CUDA device memory at `addr`.
fn describe_device(
    cuda: &dyn HmemIface,
    addr: usize,
    len: usize,
    to: PeerId,
    passed: &Passed,
    peer: impl FnOnce() -> Option<(String, Option<fdpass::Verified>)>,
) -> Option<Desc> {
    let legacy = match cuda.ipc_get(addr as *const u8, len) {
        Ok(h) => return Some(desc_of(&h, len)),
        Err(e) => e,
    };
    let unexported = |why: String| {
        UNEXPORTED.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("shm: a send from CUDA VMM memory is not offered ({why}): it goes staged");
        None
    };
    let (h, fd) = match cuda.vmm_export(addr as *const u8, len) {
        Ok(x) => x,
        Err(xfabric_hmem::HmemError::Inval { .. }) => {
            tracing::info!("shm: no CUDA IPC handle for a device send ({legacy}): it goes staged");
            return None;
        }
        Err(e) => return unexported(e.to_string()),
    };
    if passed.has(to, h.alloc_id) {
        // `fd`, a fresh export, closes unused.
        NOT_REPASSED.fetch_add(1, Ordering::Relaxed);
        return Some(desc_of(&h, len));
    }
    let Some((name, Some(who))) = peer() else {
        return unexported("the peer's pid is not verified".into());
    };
    match fdpass::send(&name, &who, h.alloc_id, fd.as_fd()) {
        Ok(()) => {
            PASSED.fetch_add(1, Ordering::Relaxed);
            passed.add(to, &h);
            Some(desc_of(&h, len))
        }
        Err(why) => unexported(format!("the descriptor was not passed: {why}")),
    }
}

/// What a CUDA IPC descriptor names.
pub struct Named {
    pub handle: IpcHandle,
    pub len: usize,
}

/// `Some` for a CUDA IPC descriptor (`Err`: one that does not parse or names no CUDA
/// memory), `None` for any other.
pub fn decode(d: &Desc) -> Option<Result<Named, String>> {
    let b = d.as_bytes();
    if b.len() != DESC_LEN || (b[0] != TAG && b[0] != TAG_VMM) {
        return None;
    }
    let w = IpcHandle::WIRE_LEN;
    Some((|| {
        let handle = IpcHandle::from_bytes(&b[1..1 + w]).map_err(|e| e.to_string())?;
        if handle.iface != Iface::Cuda {
            return Err(format!("a {} handle in a CUDA descriptor", handle.iface));
        }
        if handle.alloc_id == 0 {
            return Err("a CUDA handle without an allocation id".into());
        }
        if handle.is_vmm() != (b[0] == TAG_VMM) {
            return Err("a VMM handle under the legacy tag, or the other way round".into());
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[1 + w..]);
        let len = usize::try_from(u64::from_le_bytes(n)).map_err(|_| "a length past usize")?;
        handle
            .check_range("CUDA IPC copy", len)
            .map_err(|e| e.to_string())?;
        Ok(Named { handle, len })
    })())
}

/// One opened peer allocation. Shared with the copies reading it: a mapping the cache lets
/// go (a lost peer, eviction) closes only when the last copy from it is done.
struct Entry {
    peer: PeerId,
    /// The handle it was opened from, less its offset.
    key: IpcHandle,
    /// The device (this process's ordinal) it was opened on, whose stream copies from it.
    device: u64,
    map: Arc<IpcMapping>,
    used: u64,
}

/// A copy under way.
struct InFlight {
    token: u64,
    /// The staged receive it lands directly in (0: into `local`, the engine's memory).
    direct: xfabric_core::Context,
    copies: Vec<AsyncCopy>,
    /// A later segment's copy did not start: once the queued ones are done (they write
    /// memory about to be handed back), the copy fails.
    failed: bool,
    /// Keeps the peer's allocation mapped until the copy is done.
    _map: Arc<IpcMapping>,
}

/// The mappings one endpoint keeps, and its copies under way.
#[derive(Default)]
pub struct Cache {
    entries: Vec<Entry>,
    clock: u64,
    flight: Vec<InFlight>,
    /// CUDA devices in this process, counted at the first copy.
    devices: Option<u64>,
}

impl Cache {
    /// Whether the mapping `h` names for `peer` is cached (opens with no descriptor).
    fn has(&self, peer: PeerId, h: &IpcHandle) -> bool {
        let key = IpcHandle {
            offset: 0,
            ..h.clone()
        };
        self.entries.iter().any(|e| e.peer == peer && e.key == key)
    }

    /// The mapping `h` names for `peer` and the device it is opened on: opened now on
    /// `device` if not cached. A mapping cached on another device serves when there is none
    /// on `device` and no descriptor to open one (a VMM handle's was taken by the first open):
    /// its device copies then, as it did before. A cached one of the same address but another
    /// allocation is stale: closed, never used. A VMM handle opens from `fd`, the descriptor
    /// its peer passed (closed here when the mapping is cached).
    fn get(
        &mut self,
        peer: PeerId,
        h: &IpcHandle,
        device: u64,
        fd: Option<fdpass::Foreign>,
    ) -> Result<(Arc<IpcMapping>, u64), String> {
        self.clock += 1;
        let key = IpcHandle {
            offset: 0,
            ..h.clone()
        };
        let same = |e: &Entry| e.peer == peer && e.key == key;
        let hit = self
            .entries
            .iter()
            .position(|e| same(e) && e.device == device)
            .or_else(|| {
                let reopen = !key.is_vmm() || fd.is_some();
                (!reopen)
                    .then(|| self.entries.iter().position(same))
                    .flatten()
            });
        if let Some(i) = hit {
            let e = &mut self.entries[i];
            e.used = self.clock;
            return Ok((e.map.clone(), e.device));
        }
        let before = self.entries.len();
        self.entries.retain(|e| {
            !(e.peer == peer && e.key.base == key.base && e.key.pid == key.pid && e.key != key)
        });
        let stale = (before - self.entries.len()) as u64;
        if stale > 0 {
            STALE.fetch_add(stale, Ordering::Relaxed);
            tracing::debug!("shm: a peer's cached CUDA mapping was stale (a new allocation)");
        }
        let opened = if key.is_vmm() {
            let fd = fd.ok_or("its allocation's descriptor was not passed")?;
            // Only used: closed (off this thread) when `fd` drops.
            cuda().vmm_open(device, &key, fd.as_fd())
        } else {
            cuda().ipc_open(device, &key)
        };
        let map = Arc::new(opened.map_err(|e| e.to_string())?);
        OPENS.fetch_add(1, Ordering::Relaxed);
        if self.entries.len() >= CACHE_MAX {
            if let Some(old) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) {
                self.entries.swap_remove(old);
            }
        }
        self.entries.push(Entry {
            peer,
            key,
            device,
            map: map.clone(),
            used: self.clock,
        });
        Ok((map, device))
    }

    /// `peer` is gone: its mappings close (each once its copies under way are done).
    pub fn drop_peer(&mut self, peer: PeerId) {
        self.entries.retain(|e| e.peer != peer);
    }

    /// Copies under way.
    pub fn busy(&self) -> bool {
        !self.flight.is_empty()
    }
}

impl Net {
    /// Starts copy `c`, whose descriptor is a CUDA IPC one: `None` when it is under way
    /// (reported by `poll_ipc`), else how it ended now.
    pub(super) fn copy_ipc(&mut self, c: &CopyReq, named: Result<Named, String>) -> Option<Copied> {
        let refuse = |why: &str| {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("shm: CUDA IPC refused ({why}); the message goes staged");
            Some(Copied::Refused)
        };
        let m = match named {
            Ok(m) => m,
            Err(why) => return refuse(&why),
        };
        if c.dir != Dir::Read {
            return refuse("only reads of a peer's device memory are done by IPC");
        }
        if c.len > m.len || c.len > c.local.total() {
            return Some(Copied::Failed(FI_EINVAL));
        }
        if m.handle.pid == std::process::id() {
            // hmem's `ipc_open` gives a handle of this process back as the address it names,
            // unchecked: a peer in this process (a loopback endpoint) goes staged instead.
            return refuse("a handle of this very process");
        }
        let pid = self.links.get(c.peer).and_then(|l| l.pid);
        if pid.is_none_or(|p| i64::from(p) != i64::from(m.handle.pid)) {
            return refuse(&format!(
                "handle of pid {}, not the peer's verified {pid:?}",
                m.handle.pid
            ));
        }
        let fd = if m.handle.is_vmm() {
            self.passed_fd(m.handle.pid as i32, m.handle.alloc_id)
        } else {
            None
        };
        if m.handle.is_vmm() && fd.is_none() && !self.ipc.has(c.peer, &m.handle) {
            // Its descriptor is not here: closed under the per-peer bound (a burst of offers
            // from more allocations than it holds), or never passed. This message goes
            // staged; the next is offered a copy again (a refusal would end copies with the
            // peer for good).
            DECLINED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("shm: a VMM offer whose descriptor is not here goes staged");
            return Some(Copied::Declined);
        }
        let direct = self
            .core
            .as_ref()
            .and_then(|core| core.direct_landing(c.ctx, c.len))
            .filter(|seg| seg.owner.iface == Iface::Cuda);
        // Opened and copied on the receive's device where it is CUDA memory, so that the
        // copy needs no peer access between devices; else on the device of the sender's
        // ordinal where this process has one (the same GPU where both see the same ones).
        let cuda = cuda();
        let device = direct.as_ref().map_or_else(
            || {
                let here = *self
                    .ipc
                    .devices
                    .get_or_insert_with(|| cuda.devices().len() as u64);
                if m.handle.device < here {
                    m.handle.device
                } else {
                    0
                }
            },
            |seg| seg.owner.device,
        );
        let (map, device) = match self.ipc.get(c.peer, &m.handle, device, fd) {
            Ok(got) => got,
            Err(why) => return refuse(&format!("the handle does not open: {why}")),
        };
        // In bounds: `check_range` held at decoding, `c.len <= m.len`, and the mapping
        // covers the whole allocation.
        let src = (map.base() as usize).wrapping_add(m.handle.offset as usize);
        let mut copies = Vec::new();
        let started = match direct {
            // SAFETY: the receive's device memory holds `c.len` bytes (`direct_landing`) and
            // is the engine's until `on_copied`; the source lies in the peer's mapped
            // allocation, kept mapped by `_map` until the copy is done.
            Some(seg) => {
                unsafe { cuda.copy_async(device, seg.seg.addr as *mut u8, src as *const u8, c.len) }
                    .map(|a| copies.push(a))
            }
            None => {
                let mut r = Ok(());
                let mut done = 0;
                for s in c.local.segs() {
                    let n = s.len.min(c.len - done);
                    if n == 0 {
                        break;
                    }
                    // SAFETY: as above, `c.local` being the engine's memory of at least
                    // `c.len` bytes (checked above).
                    match unsafe {
                        cuda.copy_async(device, s.addr as *mut u8, (src + done) as *const u8, n)
                    } {
                        Ok(a) => copies.push(a),
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                    done += n;
                }
                r
            }
        };
        let failed = started.is_err();
        if let Err(e) = started {
            tracing::warn!("shm: a CUDA IPC copy did not start: {e}");
            // Copies already queued still run into memory about to be handed back: let them
            // finish before reporting (they are polled like any other).
            if copies.is_empty() {
                return Some(Copied::Failed(FI_EIO));
            }
        }
        let ctx = direct.map_or(0, |_| c.ctx);
        self.ipc.flight.push(InFlight {
            token: c.token,
            direct: ctx,
            copies,
            failed,
            _map: map,
        });
        None
    }

    /// The descriptor peer `pid` passed for allocation `alloc_id`, taking in what is queued on
    /// the endpoint's descriptor socket first (only from peers' verified pids). Never waits.
    fn passed_fd(&mut self, pid: i32, alloc_id: u64) -> Option<fdpass::Foreign> {
        self.drain_fds();
        self.fds.as_mut()?.take(pid, alloc_id)
    }

    /// Takes in what is queued on the endpoint's descriptor socket (only from peers' verified
    /// pids; at most `fdpass::PER_PID_MAX` held per peer). Also done by the sweep, so that
    /// descriptors a peer keeps passing for offers this endpoint no longer copies (it asks no
    /// more copies of a peer after a refusal: `copies_refused`) are closed rather than left
    /// queued, each holding the peer's allocation. Never waits.
    pub(super) fn drain_fds(&mut self) {
        let Some(inbox) = self.fds.as_mut() else {
            return;
        };
        let known: Vec<(i32, bool)> = self
            .links
            .iter()
            .filter(|l| !l.dead)
            .filter_map(|l| Some((l.pid?, l.no_fds)))
            .collect();
        inbox.drain(|p| match known.iter().find(|k| k.0 == p) {
            Some((_, false)) => fdpass::Verdict::Keep,
            Some((_, true)) => fdpass::Verdict::Discard,
            None => fdpass::Verdict::Refuse,
        });
    }

    /// A copy from `p` was refused: the engine asks no more of it (`pull_refused`), so the
    /// descriptors it passed for its VMM offers, and those it will pass, would only be held,
    /// each keeping the peer's allocation alive: they close, and later ones are closed unread.
    pub(super) fn copies_refused(&mut self, p: PeerId) {
        let Some(link) = self.links.get_mut(p) else {
            return;
        };
        link.no_fds = true;
        if let (Some(f), Some(pid)) = (self.fds.as_mut(), link.pid) {
            f.drop_pid(pid);
        }
    }

    /// The endpoint closes with CUDA IPC copies still under way past its bound: each is
    /// reported failed (`FI_ECANCELED`), as the engine needs every copy reported once.
    pub fn abandon_ipc(&mut self, engine: &mut xfabric_core::rdm::Engine) {
        for f in std::mem::take(&mut self.ipc.flight) {
            tracing::warn!("shm: closing with a CUDA IPC copy under way: reported canceled");
            if f.direct != 0 {
                if let Some(core) = &self.core {
                    core.landed_direct(f.direct, false);
                }
            }
            engine.on_copied(f.token, Copied::Failed(FI_ECANCELED));
        }
    }

    /// Reports the CUDA IPC copies whose events completed; never waits. How many did.
    pub(super) fn poll_ipc(&mut self, engine: &mut xfabric_core::rdm::Engine) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.ipc.flight.len() {
            let f = &mut self.ipc.flight[i];
            let mut failed = None;
            let mut all = true;
            for a in &mut f.copies {
                match a.poll() {
                    Ok(true) => {}
                    Ok(false) => all = false,
                    Err(e) => failed = Some(e),
                }
            }
            if !all {
                i += 1;
                continue;
            }
            let f = self.ipc.flight.swap_remove(i);
            let how = match failed {
                None if f.failed => Copied::Failed(FI_EIO),
                None => {
                    COPIES.fetch_add(1, Ordering::Relaxed);
                    Copied::Done
                }
                Some(e) => {
                    tracing::warn!("shm: a CUDA IPC copy failed: {e}");
                    Copied::Failed(FI_EIO)
                }
            };
            if f.direct != 0 {
                if how == Copied::Done {
                    DIRECT.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(core) = &self.core {
                    core.landed_direct(f.direct, how == Copied::Done);
                }
            }
            engine.on_copied(f.token, how);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> IpcHandle {
        IpcHandle {
            iface: Iface::Cuda,
            pid: 77,
            device: 0,
            alloc_id: 5,
            base: 0x7000_0000,
            alloc_len: 1 << 20,
            offset: 4096,
            raw: [3; 64],
        }
    }

    #[test]
    fn a_vmm_handle_whose_descriptor_never_came_is_not_opened() {
        let mut c = Cache::default();
        let h = IpcHandle {
            raw: IpcHandle::VMM_RAW,
            ..handle()
        };
        let Err(e) = c.get(0, &h, 0, None) else {
            panic!("refused")
        };
        assert!(e.contains("descriptor was not passed"), "{e}");
        assert!(c.entries.is_empty());
    }

    #[test]
    fn descriptors_round_trip_and_hostile_ones_are_refused() {
        let h = handle();
        let d = desc_of(&h, 1000);
        assert_eq!(d.as_bytes().len(), DESC_LEN);
        let n = decode(&d).unwrap().unwrap();
        assert_eq!((n.handle, n.len), (h.clone(), 1000));
        assert!(
            d.to_iov().is_none(),
            "nothing cross-memory attach would read"
        );
        // A mapped (host) descriptor is not a CUDA one, nor a plain one.
        assert!(decode(&super::super::mapped::desc_of(&h, 10)).is_none());
        assert!(decode(&Desc::of_iov(&IovList::one(TAG as usize, 10))).is_none());
        // Past the allocation's end, another interface, no allocation id, garbage.
        assert!(decode(&desc_of(&h, (1 << 20) - 4095)).unwrap().is_err());
        let sys = IpcHandle {
            iface: Iface::System,
            ..h.clone()
        };
        assert!(decode(&desc_of(&sys, 10)).unwrap().is_err());
        let anon = IpcHandle {
            alloc_id: 0,
            ..h.clone()
        };
        assert!(decode(&desc_of(&anon, 10)).unwrap().is_err());
        let mut b = d.as_bytes().to_vec();
        b[1] ^= 1;
        assert!(decode(&Desc::new(&b).unwrap()).unwrap().is_err());
        // A VMM handle goes under its own tag; either under the other's is refused.
        let vmm = IpcHandle {
            raw: IpcHandle::VMM_RAW,
            ..h.clone()
        };
        let dv = desc_of(&vmm, 1000);
        assert_eq!(dv.as_bytes()[0], TAG_VMM);
        assert_eq!(decode(&dv).unwrap().unwrap().handle, vmm);
        let mut b = dv.as_bytes().to_vec();
        b[0] = TAG;
        assert!(decode(&Desc::new(&b).unwrap()).unwrap().is_err());
        let mut b = d.as_bytes().to_vec();
        b[0] = TAG_VMM;
        assert!(decode(&Desc::new(&b).unwrap()).unwrap().is_err());
    }
}
