//! Device memory through host bounce buffers, written once for every provider: an endpoint
//! opened with `FI_HMEM` looks up who owns each buffer it is handed, and where a device owns
//! one, the provider is given a host buffer instead.
//!
//! - A send (or RMA write) from device memory: the bytes are copied to a host buffer before the
//!   operation is posted; the buffer lives until the operation completes.
//! - A receive (or RMA read) into device memory: the provider fills a host buffer; when it
//!   reports the completion, the bytes are copied into the device memory *before* the
//!   completion is written (fi_cq(3), heterogeneous memory: a completion for a transfer into
//!   device memory means the data is visible to the device). `HmemOps::copy_from_host` is
//!   synchronous, so once it returns the device sees the data.
//! - At an RMA target, a large write into a region registered as device memory lands in a host
//!   buffer the same way and is copied in before the remote-write completion is reported.
//!
//! The staged operation is posted with a context of its own (the address of its record here);
//! `EpCore`'s completion calls trade it back for the application's context. With nothing staged
//! the lookup is one atomic load, and endpoints without `FI_HMEM` never query owners.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::entry::Context;
use crate::error::{Error, Result};
use crate::hmem_iface::{HmemOps, Owner};
use crate::rxq::{IovList, RawIov};

static OFFERED: AtomicU64 = AtomicU64::new(0);
static OFFER_STAGED: AtomicU64 = AtomicU64::new(0);
static DIRECT: AtomicU64 = AtomicU64::new(0);

/// What device-memory offers did in this process (every endpoint): a send from device memory
/// that the transport's peer may copy itself (CUDA IPC over shm) is posted unstaged and
/// offered; where the peer does not copy it, it is staged when the peer asks for its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfferCounts {
    /// Sends from device memory posted unstaged, offered to the peer.
    pub offered: u64,
    /// Of those, the ones staged after all (the peer refused or could not copy): the
    /// fallback.
    pub staged: u64,
    /// Receives into staged device memory that a transport copied into directly
    /// (`EpCore::direct_landing`), skipping the host bounce.
    pub direct: u64,
}

/// What device-memory offers did so far, in this process.
pub fn offer_counts() -> OfferCounts {
    OfferCounts {
        offered: OFFERED.load(Ordering::Relaxed),
        staged: OFFER_STAGED.load(Ordering::Relaxed),
        direct: DIRECT.load(Ordering::Relaxed),
    }
}

pub(crate) fn count_offered() {
    OFFERED.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_offer_staged() {
    OFFER_STAGED.fetch_add(1, Ordering::Relaxed);
}

/// One segment of the application's memory and who owns it.
#[derive(Clone, Copy, Debug)]
pub struct OwnedSeg {
    /// The application's segment.
    pub seg: RawIov,
    /// Its owner.
    pub owner: Owner,
}

/// Owners of each segment of `iov`, or `None` when all of it is host memory.
pub fn owners(hmem: &dyn HmemOps, iov: &IovList) -> Result<Option<Vec<OwnedSeg>>> {
    let mut out = Vec::with_capacity(iov.segs().len());
    let mut any = false;
    for &seg in iov.segs() {
        let owner = if seg.len == 0 {
            Owner::SYSTEM
        } else {
            hmem.owner(seg.addr)?
        };
        any |= owner.is_device();
        out.push(OwnedSeg { seg, owner });
    }
    Ok(any.then_some(out))
}

/// Copies the application's segments, device or host, into one host buffer.
///
/// # Safety
/// Every segment must be readable memory of its owner for its length.
/// `NoMem` where the buffer cannot be had: a read a peer asks of a large device region must
/// not abort the process in the allocator (the answer says `FI_ENOMEM` instead).
pub unsafe fn gather(hmem: &dyn HmemOps, segs: &[OwnedSeg]) -> Result<Vec<u8>> {
    let total = segs
        .iter()
        .try_fold(0usize, |t, s| t.checked_add(s.seg.len))
        .ok_or_else(|| Error::NoMem("staging a read: its ranges sum past usize".into()))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(total)
        .map_err(|e| Error::NoMem(format!("staging a read of {total} bytes: {e}")))?;
    buf.resize(total, 0);
    let mut off = 0;
    for s in segs {
        let dst = &mut buf[off..off + s.seg.len];
        if s.owner.is_device() {
            // SAFETY: the caller's contract.
            unsafe { hmem.copy_to_host(s.owner, dst, s.seg.addr) }?;
        } else if !dst.is_empty() {
            // SAFETY: the caller's contract: a readable host segment of this length.
            dst.copy_from_slice(unsafe {
                std::slice::from_raw_parts(s.seg.addr as *const u8, s.seg.len)
            });
        }
        off += s.seg.len;
    }
    Ok(buf)
}

/// Copies `src` into the application's segments, in order; device segments through `hmem`
/// (synchronously: visible to the device on return).
///
/// # Safety
/// Every segment must be writable memory of its owner for its length, not otherwise accessed.
pub unsafe fn scatter(hmem: &dyn HmemOps, segs: &[OwnedSeg], src: &[u8]) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { scatter_at(hmem, segs, 0, src) }
}

/// As `scatter`, starting `at` bytes into the segments (a window of a multi-receive buffer).
///
/// # Safety
/// As `scatter`.
pub unsafe fn scatter_at(
    hmem: &dyn HmemOps,
    segs: &[OwnedSeg],
    mut at: usize,
    mut src: &[u8],
) -> Result<()> {
    for s in segs {
        if src.is_empty() {
            break;
        }
        if at >= s.seg.len {
            at -= s.seg.len;
            continue;
        }
        let n = (s.seg.len - at).min(src.len());
        let (part, rest) = src.split_at(n);
        let dst = s.seg.addr + at;
        if s.owner.is_device() {
            // SAFETY: the caller's contract.
            unsafe { hmem.copy_from_host(s.owner, dst, part) }?;
        } else {
            // SAFETY: the caller's contract: a writable host segment with `n` bytes past `at`.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), dst as *mut u8, n) };
        }
        at = 0;
        src = rest;
    }
    Ok(())
}

/// Changes `len` bytes of `owner`'s memory at `addr` through a host copy: copies them to the
/// host, lets `f` change them there, and copies them back if `f` changed any (synchronously:
/// visible to the device on return). `Err` is a failed copy; `f`'s own outcome is the `Ok`.
///
/// This is how a target applies an atomic to device memory, which the host cannot touch
/// directly. It is atomic only with respect to other updates the caller serialises with it
/// (the provider's lock around every atomic it executes), not with respect to device code
/// accessing the same bytes meanwhile: libfabric's shm provider gives the same guarantee.
///
/// # Safety
/// `addr` must be `owner`'s memory, valid for reads and writes of `len` bytes.
pub unsafe fn update<R>(
    hmem: &dyn HmemOps,
    owner: Owner,
    addr: usize,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Result<R> {
    let mut buf = vec![0u8; len];
    // SAFETY: the caller's contract.
    unsafe { hmem.copy_to_host(owner, &mut buf, addr) }?;
    let before = buf.clone();
    let r = f(&mut buf);
    // Unchanged bytes (a read, a compare that failed) are not written back, so as not to undo
    // what the device may have stored meanwhile.
    if buf != before {
        // SAFETY: the caller's contract.
        unsafe { hmem.copy_from_host(owner, addr, &buf) }?;
    }
    Ok(r)
}

/// An operation whose device buffers are staged through `bounce`.
pub(crate) struct Staged {
    /// The context the application posted with.
    pub user_ctx: Context,
    /// The application's memory (reported in receive completions).
    pub user_iov: IovList,
    /// The host buffer the provider was given. Its heap allocation does not move while this
    /// record is alive, which is what the provider's iov points at.
    bounce: Vec<u8>,
    /// Where the bounce's bytes go when the operation completes (receives, reads); empty for
    /// sends and writes.
    land: Vec<OwnedSeg>,
    /// A peer's write into this side's registered memory (no application context).
    remote: bool,
    /// Set once the bytes were landed ahead of the completion (`StagingRegistry::land_early`):
    /// whether that worked. The completion then does not land them again.
    early: Option<bool>,
    /// A multi-receive buffer: each message completes a window of it, landed on its own, and
    /// the record lives until the completion that releases the buffer.
    multi: bool,
    /// Multi-receive windows (offset into the bounce) landed ahead of their completions.
    early_windows: Vec<(usize, bool)>,
}

impl Staged {
    /// A send or write: `bounce` holds the gathered data.
    pub fn outgoing(user_ctx: Context, user_iov: IovList, bounce: Vec<u8>) -> Self {
        Staged {
            user_ctx,
            user_iov,
            bounce,
            land: Vec::new(),
            remote: false,
            early: None,
            multi: false,
            early_windows: Vec::new(),
        }
    }

    /// A receive or read into `land`: a zeroed bounce of the same size.
    pub fn incoming(user_ctx: Context, user_iov: IovList, land: Vec<OwnedSeg>) -> Self {
        let total = land.iter().map(|s| s.seg.len).sum();
        Staged {
            user_ctx,
            user_iov,
            bounce: vec![0u8; total],
            land,
            remote: false,
            early: None,
            multi: false,
            early_windows: Vec::new(),
        }
    }

    /// A multi-receive buffer into `land`: messages fill windows of one bounce.
    pub fn incoming_multi(user_ctx: Context, user_iov: IovList, land: Vec<OwnedSeg>) -> Self {
        Staged {
            multi: true,
            ..Staged::incoming(user_ctx, user_iov, land)
        }
    }

    /// An operation that sends `bounce`'s data and gets its first bytes back into `land` (an
    /// atomic whose fetched values go to device memory).
    pub fn exchange(
        user_ctx: Context,
        user_iov: IovList,
        bounce: Vec<u8>,
        land: Vec<OwnedSeg>,
    ) -> Self {
        Staged {
            land,
            ..Staged::outgoing(user_ctx, user_iov, bounce)
        }
    }

    /// A peer's write into registered memory `land`, at the target.
    pub fn remote(iov: IovList, land: Vec<OwnedSeg>) -> Self {
        Staged {
            remote: true,
            ..Staged::incoming(0, iov, land)
        }
    }

    /// The host buffer as the provider's iov.
    pub fn bounce_iov(&self) -> IovList {
        IovList::one(self.bounce.as_ptr() as usize, self.bounce.len())
    }

    /// Copies the first `len` received bytes to where they belong.
    ///
    /// # Safety
    /// The landing segments must still be the application's, writable, per the posting
    /// call's contract.
    pub unsafe fn land(&self, hmem: &dyn HmemOps, len: usize) -> Result<()> {
        let len = len.min(self.bounce.len());
        // SAFETY: forwarded.
        unsafe { scatter(hmem, &self.land, &self.bounce[..len]) }
    }

    /// Whether the bytes were landed ahead of the completion, and if so whether that worked.
    pub fn landed_early(&self) -> Option<bool> {
        self.early
    }

    /// Where `window` (a provider's view of part of the bounce) starts in it.
    fn window_offset(&self, window: &IovList) -> usize {
        let base = self.bounce.as_ptr() as usize;
        let at = window.first_addr().wrapping_sub(base);
        if window.total() == 0 || at > self.bounce.len() {
            self.bounce.len()
        } else {
            at
        }
    }

    /// Lands `len` received bytes of the window at `at` (a multi-receive message).
    ///
    /// # Safety
    /// As `land`.
    unsafe fn land_window(&self, hmem: &dyn HmemOps, at: usize, len: usize) -> Result<()> {
        let end = at.saturating_add(len).min(self.bounce.len());
        // SAFETY: forwarded.
        unsafe { scatter_at(hmem, &self.land, at, &self.bounce[at..end]) }
    }
}

/// An endpoint's staged operations, keyed by the context the provider was given.
#[derive(Default)]
pub(crate) struct StagingRegistry {
    live: AtomicUsize,
    map: Mutex<HashMap<Context, Box<Staged>>>,
    /// The next key's number: keys are never reused, so a key looked up for one operation
    /// (`key_of`, for a cancel) never names a later one.
    next: AtomicUsize,
    /// Failed landing copies (their operations completed with `FI_EIO`), kept for the
    /// application to read the driver's reason.
    errors: Mutex<Vec<Error>>,
}

impl StagingRegistry {
    pub fn record_error(&self, e: Error) {
        let mut v = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() < 64 {
            v.push(e);
        }
    }

    pub fn last_error(&self) -> Option<Error> {
        let v = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        v.last().cloned()
    }

    pub fn take_errors(&self) -> Vec<Error> {
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Context, Box<Staged>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether anything is staged: one load, all that host-only paths pay.
    #[inline]
    pub fn any(&self) -> bool {
        self.live.load(Ordering::Acquire) != 0
    }

    /// Keeps `s` until its operation ends; returns the context to post it with.
    pub fn insert(&self, s: Staged) -> Context {
        let b = Box::new(s);
        // Told apart from the application's contexts by its top bit; a number, never an
        // address (a freed record's address comes back at once for the next), so that a key
        // names one operation for good; in order, so the lowest is the oldest.
        // The bit below the top one too: never set in an address (deferred work's keys are
        // addresses with the top bit), so the two kinds of key never meet.
        const STAGED: Context = 1 << (usize::BITS - 2);
        let n = self.next.fetch_add(1, Ordering::Relaxed) & (STAGED - 1);
        let key = n | STAGED | crate::entry::INTERNAL_CTX;
        self.lock().insert(key, b);
        self.live.fetch_add(1, Ordering::AcqRel);
        key
    }

    /// The staged operation a completion with context `ctx` belongs to, if it is one. One
    /// load when nothing is staged.
    pub fn claim(&self, ctx: Context) -> Option<Box<Staged>> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let s = self.lock().remove(&ctx);
        if s.is_some() {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        s
    }

    /// Lands the staged incoming operation `ctx` now, ahead of its completion: its `len`
    /// bytes (in `window`, for a multi-receive buffer) are visible to the device when this
    /// returns. `None` when `ctx` is not a staged
    /// incoming operation; otherwise whether the copy worked (a failure is recorded, and the
    /// completion reports it). The completion does not copy again.
    ///
    /// # Safety
    /// As `Staged::land`: the caller holds the operation (it cannot complete meanwhile) and
    /// its bounce holds the received bytes.
    pub unsafe fn land_early(
        &self,
        hmem: &dyn HmemOps,
        ctx: Context,
        window: &IovList,
        len: usize,
    ) -> Option<bool> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut map = self.lock();
        let s = map.get_mut(&ctx).filter(|s| !s.land.is_empty())?;
        if s.multi {
            let at = s.window_offset(window);
            if let Some(&(_, ok)) = s.early_windows.iter().find(|w| w.0 == at) {
                return Some(ok);
            }
            // SAFETY: forwarded.
            let r = unsafe { s.land_window(hmem, at, len) };
            s.early_windows.push((at, r.is_ok()));
            drop(map);
            return Some(match r {
                Ok(()) => true,
                Err(e) => {
                    self.record_error(e);
                    false
                }
            });
        }
        if s.early.is_none() {
            // SAFETY: forwarded.
            let r = unsafe { s.land(hmem, len) };
            s.early = Some(r.is_ok());
            if let Err(e) = r {
                drop(map);
                self.record_error(e);
                return Some(false);
            }
        }
        s.early
    }

    /// Ends one message of the multi-receive buffer staged as `ctx`: lands its `len` bytes
    /// (`None`: it failed, nothing to land) from `window` unless that was done early, and
    /// frees the buffer when `release`. Returns the application's context, its view of the
    /// window, and whether landing worked; `None` when `ctx` is not a staged multi-receive.
    ///
    /// # Safety
    /// As `land_early`.
    pub unsafe fn finish_window(
        &self,
        hmem: Option<&dyn HmemOps>,
        ctx: Context,
        window: &IovList,
        len: Option<usize>,
        release: bool,
    ) -> Option<(Context, IovList, bool)> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut map = self.lock();
        let s = map.get_mut(&ctx).filter(|s| s.multi)?;
        let at = s.window_offset(window);
        let user = s.user_iov.slice(at, window.total());
        let early = s
            .early_windows
            .iter()
            .position(|w| w.0 == at)
            .map(|i| s.early_windows.swap_remove(i).1);
        let landed = match (early, len, hmem) {
            (Some(ok), _, _) => Ok(ok),
            // SAFETY: forwarded.
            (None, Some(n), Some(h)) => unsafe { s.land_window(h, at, n) }.map(|()| true),
            _ => Ok(true),
        };
        let user_ctx = s.user_ctx;
        if release {
            map.remove(&ctx);
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        drop(map);
        let ok = landed.unwrap_or_else(|e| {
            self.record_error(e);
            false
        });
        Some((user_ctx, user, ok))
    }

    /// The device memory a staged incoming operation (not a multi-receive) lands in, when it
    /// is one segment of at least `len` bytes: a transport that copies there itself skips
    /// the bounce, and then calls `landed_direct`.
    pub fn direct_landing(&self, ctx: Context, len: usize) -> Option<OwnedSeg> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let map = self.lock();
        let s = map.get(&ctx).filter(|s| !s.multi && !s.remote)?;
        match s.land.as_slice() {
            [seg] if seg.owner.is_device() && seg.seg.len >= len && s.early.is_none() => Some(*seg),
            _ => None,
        }
    }

    /// The bytes of staged operation `ctx` were copied into its device memory directly
    /// (`ok`), or that copy failed: its completion does not land the bounce.
    pub fn landed_direct(&self, ctx: Context, ok: bool) {
        if let Some(s) = self.lock().get_mut(&ctx) {
            s.early = Some(ok);
            if ok {
                DIRECT.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The provider-side context of the staged operation the application posted as `user`
    /// (what `fi_cancel` of `user` names): its oldest receive or read into device memory, else
    /// its oldest other operation.
    pub fn key_of(&self, user: Context) -> Option<Context> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock()
            .iter()
            .filter(|(_, s)| s.user_ctx == user && !s.remote)
            .min_by_key(|&(&k, s)| (s.land.is_empty(), k))
            .map(|(&k, _)| k)
    }

    /// The application's context of the staged operation posted as `key`.
    pub fn user_of(&self, key: Context) -> Option<Context> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().get(&key).map(|s| s.user_ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hmem_iface::Iface;

    use crate::hmem_fake::FakeHmem as Fake;

    /// A read past what the allocator gives (a peer's read of a region of many GiB) is
    /// `NoMem`, not the process aborted in the allocator; ranges summing past `usize` too.
    #[test]
    fn a_gather_the_allocator_cannot_hold_is_refused_not_aborted() {
        let fake = Fake::default();
        let dev = Owner {
            iface: Iface::Cuda,
            device: 0,
        };
        let huge = |len| OwnedSeg {
            seg: RawIov { addr: 0x1000, len },
            owner: dev,
        };
        // SAFETY: refused before any segment is read.
        let r = unsafe { gather(&fake, &[huge(isize::MAX as usize)]) };
        assert!(matches!(r, Err(Error::NoMem(_))), "{r:?}");
        // SAFETY: as above.
        let r = unsafe { gather(&fake, &[huge(usize::MAX), huge(2)]) };
        assert!(matches!(r, Err(Error::NoMem(_))), "{r:?}");
        assert_eq!(fake.copies(), 0);
    }

    #[test]
    fn gather_and_land_mixed_segments() {
        let fake = Fake::default();
        let mut dev = vec![7u8; 16];
        let mut host = vec![9u8; 8];
        let (dev_addr, host_addr) = (dev.as_mut_ptr() as usize, host.as_mut_ptr() as usize);
        fake.add_range(dev_addr, 16);
        let iov = IovList::from_segs([
            RawIov {
                addr: host_addr,
                len: 8,
            },
            RawIov {
                addr: dev_addr,
                len: 16,
            },
        ])
        .unwrap();
        let segs = owners(&fake, &iov).unwrap().expect("a device segment");
        // SAFETY: the buffers above are live.
        let out = unsafe { gather(&fake, &segs) }.unwrap();
        assert_eq!(&out[..8], &[9; 8]);
        assert_eq!(&out[8..], &[7; 16]);
        assert_eq!(fake.copies(), 1);

        let host_only = IovList::one(host_addr, 8);
        assert!(owners(&fake, &host_only).unwrap().is_none());

        let reg = StagingRegistry::default();
        assert!(reg.claim(5).is_none());
        let s = Staged::incoming(42, iov, segs);
        let b = s.bounce_iov();
        let key = reg.insert(s);
        assert_ne!(
            key & crate::entry::INTERNAL_CTX,
            0,
            "a key looks like a context"
        );
        assert_eq!(reg.key_of(42), Some(key));
        let data: Vec<u8> = (0..20).collect();
        // SAFETY: the bounce is live until claimed.
        unsafe { b.copy_in(0, &data) };
        let s = reg.claim(key).unwrap();
        // SAFETY: the landing buffers are live.
        unsafe { s.land(&fake, 20) }.unwrap();
        assert_eq!(&host[..], &data[..8]);
        assert_eq!(&dev[..12], &data[8..20]);
        assert_eq!(&dev[12..], &[7; 4]);
        assert!(reg.claim(key).is_none());
    }

    #[test]
    fn landing_early_happens_once() {
        let fake = Fake::default();
        let mut dev = vec![0u8; 32];
        let dev_addr = dev.as_mut_ptr() as usize;
        fake.add_range(dev_addr, 32);
        let iov = IovList::one(dev_addr, 32);
        let segs = owners(&fake, &iov).unwrap().unwrap();
        let reg = StagingRegistry::default();
        // SAFETY: nothing is staged under 7.
        assert_eq!(unsafe { reg.land_early(&fake, 7, &iov, 32) }, None);
        let s = Staged::incoming(1, iov, segs);
        let b = s.bounce_iov();
        let key = reg.insert(s);
        // SAFETY: the bounce is live until claimed; the landing buffer is live.
        unsafe { b.copy_in(0, &[5u8; 32]) };
        assert_eq!(unsafe { reg.land_early(&fake, key, &b, 32) }, Some(true));
        assert_eq!(dev, [5u8; 32]);
        assert_eq!(unsafe { reg.land_early(&fake, key, &b, 32) }, Some(true));
        assert_eq!(fake.copies(), 1, "landed once");
        let s = reg.claim(key).unwrap();
        assert_eq!(s.landed_early(), Some(true));
    }

    #[test]
    fn a_direct_landing_skips_the_bounce() {
        let fake = Fake::default();
        let mut dev = vec![0u8; 32];
        let dev_addr = dev.as_mut_ptr() as usize;
        fake.add_range(dev_addr, 32);
        let iov = IovList::one(dev_addr, 32);
        let segs = owners(&fake, &iov).unwrap().unwrap();
        let reg = StagingRegistry::default();
        assert!(reg.direct_landing(5, 32).is_none(), "nothing staged");
        let key = reg.insert(Staged::incoming(1, iov, segs));
        assert!(reg.direct_landing(key, 33).is_none(), "too short");
        let seg = reg.direct_landing(key, 32).expect("one device segment");
        assert_eq!((seg.seg.addr, seg.seg.len), (dev_addr, 32));
        reg.landed_direct(key, true);
        assert!(reg.direct_landing(key, 32).is_none(), "landed already");
        let s = reg.claim(key).unwrap();
        assert_eq!(s.landed_early(), Some(true));
        assert_eq!(fake.copies(), 0, "the bounce was never copied");
        // Host memory, and a multi-receive buffer, are never landed directly.
        let host = IovList::one(dev.as_ptr() as usize + 64, 8);
        let key = reg.insert(Staged::incoming(2, host, Vec::new()));
        assert!(reg.direct_landing(key, 8).is_none());
        let multi = Staged::incoming_multi(3, iov, owners(&fake, &iov).unwrap().unwrap());
        let key = reg.insert(multi);
        assert!(reg.direct_landing(key, 8).is_none());
        drop(dev);
    }

    #[test]
    fn multi_receive_windows_land_one_by_one() {
        let fake = Fake::default();
        let mut dev = vec![0u8; 64];
        let dev_addr = dev.as_mut_ptr() as usize;
        fake.add_range(dev_addr, 64);
        let iov = IovList::one(dev_addr, 64);
        let segs = owners(&fake, &iov).unwrap().unwrap();
        let reg = StagingRegistry::default();
        let s = Staged::incoming_multi(9, iov, segs);
        let b = s.bounce_iov();
        let key = reg.insert(s);
        // Two messages: 10 bytes at 0, 20 at 10; the second is acknowledged early.
        let (w1, w2) = (b.slice(0, 10), b.slice(10, 20));
        // SAFETY: the bounce is live until the buffer is released; so is `dev`.
        unsafe {
            w1.copy_in(0, &[1u8; 10]);
            w2.copy_in(0, &[2u8; 20]);
            assert_eq!(reg.land_early(&fake, key, &w2, 20), Some(true));
        }
        assert_eq!(&dev[10..30], &[2u8; 20]);
        // SAFETY: as above.
        let (ctx, user, ok) = unsafe { reg.finish_window(Some(&fake), key, &w1, Some(10), false) }
            .expect("a staged multi-receive");
        assert_eq!(
            (ctx, user.first_addr(), user.total(), ok),
            (9, dev_addr, 10, true)
        );
        assert_eq!(&dev[..10], &[1u8; 10]);
        assert_eq!(reg.key_of(9), Some(key), "the buffer is still posted");
        // SAFETY: as above.
        let (_, user, _) = unsafe { reg.finish_window(Some(&fake), key, &w2, Some(20), true) }
            .expect("still staged");
        assert_eq!((user.first_addr(), user.total()), (dev_addr + 10, 20));
        assert_eq!(fake.copies(), 2, "each window landed once");
        // Released: gone.
        // SAFETY: nothing is staged any more.
        assert!(unsafe { reg.finish_window(Some(&fake), key, &w1, None, true) }.is_none());
    }

    #[test]
    fn update_copies_back_only_what_changed() {
        let fake = Fake::default();
        let mut dev = 5u64.to_ne_bytes().to_vec();
        let addr = dev.as_mut_ptr() as usize;
        let owner = Owner {
            iface: Iface::Cuda,
            device: 1,
        };
        let add2 = |b: &mut [u8]| {
            let v = u64::from_ne_bytes(b.try_into().unwrap());
            b.copy_from_slice(&(v + 2).to_ne_bytes());
            v
        };
        // SAFETY: `dev` is live and reached only through the fake meanwhile.
        let seen = unsafe { update(&fake, owner, addr, 8, add2) }.unwrap();
        assert_eq!((seen, fake.copies()), (5, 2));
        assert_eq!(dev, 7u64.to_ne_bytes());
        // A look that changes nothing is not copied back.
        // SAFETY: as above.
        let seen = unsafe { update(&fake, owner, addr, 8, |b| b[0]) }.unwrap();
        assert_eq!((seen, fake.copies()), (7, 3));
    }
}
