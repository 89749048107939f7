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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::entry::Context;
use crate::error::{Error, Result};
use crate::hmem_iface::{HmemOps, Owner};
use crate::rxq::{IovList, RawIov};

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
pub unsafe fn gather(hmem: &dyn HmemOps, segs: &[OwnedSeg]) -> Result<Vec<u8>> {
    let total = segs.iter().map(|s| s.seg.len).sum();
    let mut buf = vec![0u8; total];
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

/// Copies the first `len` bytes of `src` into the application's segments, in order; device
/// segments through `hmem` (synchronously: visible to the device on return).
///
/// # Safety
/// Every segment must be writable memory of its owner for its length, not otherwise accessed.
pub unsafe fn scatter(hmem: &dyn HmemOps, segs: &[OwnedSeg], src: &[u8]) -> Result<()> {
    let mut off = 0;
    for s in segs {
        if off >= src.len() {
            break;
        }
        let n = s.seg.len.min(src.len() - off);
        let part = &src[off..off + n];
        if s.owner.is_device() {
            // SAFETY: the caller's contract.
            unsafe { hmem.copy_from_host(s.owner, s.seg.addr, part) }?;
        } else if n > 0 {
            // SAFETY: the caller's contract: a writable host segment of at least `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), s.seg.addr as *mut u8, n) };
        }
        off += n;
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
}

/// An endpoint's staged operations, keyed by the context the provider was given.
#[derive(Default)]
pub(crate) struct StagingRegistry {
    live: AtomicUsize,
    map: Mutex<HashMap<Context, Box<Staged>>>,
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

    /// Keeps `s` until its operation ends; returns the context to post it with.
    pub fn insert(&self, s: Staged) -> Context {
        let b = Box::new(s);
        let key = &*b as *const Staged as Context;
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

    /// The provider-side context of the staged operation the application posted as `user`.
    pub fn key_of(&self, user: Context) -> Option<Context> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock()
            .iter()
            .find(|(_, s)| s.user_ctx == user && !s.remote)
            .map(|(&k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hmem_iface::Iface;

    /// "Device" memory that is host memory, with copies counted.
    #[derive(Default)]
    struct Fake {
        dev: std::sync::Mutex<Vec<(usize, usize)>>,
        copies: AtomicUsize,
    }

    impl HmemOps for Fake {
        fn check_iface(&self, _iface: Iface) -> Result<()> {
            Ok(())
        }
        fn owner(&self, addr: usize) -> Result<Owner> {
            let d = self.dev.lock().unwrap();
            Ok(if d.iter().any(|&(a, l)| addr >= a && addr < a + l) {
                Owner {
                    iface: Iface::Cuda,
                    device: 1,
                }
            } else {
                Owner::SYSTEM
            })
        }
        unsafe fn copy_to_host(&self, _o: Owner, dst: &mut [u8], src: usize) -> Result<()> {
            self.copies.fetch_add(1, Ordering::Relaxed);
            // SAFETY: test memory.
            dst.copy_from_slice(unsafe { std::slice::from_raw_parts(src as *const u8, dst.len()) });
            Ok(())
        }
        unsafe fn copy_from_host(&self, _o: Owner, dst: usize, src: &[u8]) -> Result<()> {
            self.copies.fetch_add(1, Ordering::Relaxed);
            // SAFETY: test memory.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
            Ok(())
        }
    }

    #[test]
    fn gather_and_land_mixed_segments() {
        let fake = Fake::default();
        let mut dev = vec![7u8; 16];
        let mut host = vec![9u8; 8];
        let (dev_addr, host_addr) = (dev.as_mut_ptr() as usize, host.as_mut_ptr() as usize);
        fake.dev.lock().unwrap().push((dev_addr, 16));
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
        assert_eq!(fake.copies.load(Ordering::Relaxed), 1);

        let host_only = IovList::one(host_addr, 8);
        assert!(owners(&fake, &host_only).unwrap().is_none());

        let reg = StagingRegistry::default();
        assert!(reg.claim(5).is_none());
        let s = Staged::incoming(42, iov, segs);
        let b = s.bounce_iov();
        let key = reg.insert(s);
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
        assert_eq!((seen, fake.copies.load(Ordering::Relaxed)), (5, 2));
        assert_eq!(dev, 7u64.to_ne_bytes());
        // A look that changes nothing is not copied back.
        // SAFETY: as above.
        let seen = unsafe { update(&fake, owner, addr, 8, |b| b[0]) }.unwrap();
        assert_eq!((seen, fake.copies.load(Ordering::Relaxed)), (7, 3));
    }
}
