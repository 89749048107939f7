//! RMA and atomics executed at the target, for every transport: the key and range check
//! against the domain's registered memory (`MrMap::check_owned`), device memory through the
//! hmem layer, atomics under one process-wide lock, persistent-memory commit. A failure is an
//! errno for the initiator's completion; the target's memory is untouched by a refused
//! request.

use crate::atomic::{apply, AtomicOp, Datatype};
use crate::consts::errno::*;
use crate::consts::*;
use crate::ep::atomic::ATOMIC_MAX;
use crate::ep::rma::RmaIovList;
use crate::ep::EpCore;
use crate::hmem_stage::{self, OwnedSeg};
use crate::rxq::{IovList, RawIov};

/// Checked local ranges, and their owners when some are device memory.
pub type Resolved = (IovList, Option<Vec<OwnedSeg>>);

/// Every atomic this process executes as a target runs under this lock, so that requests from
/// several peers (arriving on several endpoints, through any provider) to the same memory
/// never interleave.
pub static ATOMIC_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The local ranges a request's remote ranges name, if every one passes the key check
/// (`FI_EACCES` otherwise), with their owners when some are device memory.
pub fn resolve(core: &EpCore, rma: &RmaIovList, access: u64) -> Result<Resolved, i32> {
    let mut any_device = false;
    let segs = rma
        .segs()
        .iter()
        .map(|s| {
            core.mr
                .check_owned(s.key, s.addr, s.len, access)
                .map(|(addr, owner)| {
                    any_device |= owner.is_device();
                    OwnedSeg {
                        seg: RawIov { addr, len: s.len },
                        owner,
                    }
                })
                .map_err(|_| FI_EACCES)
        })
        .collect::<Result<Vec<_>, i32>>()?;
    let iov = IovList::from_segs(segs.iter().map(|s| s.seg)).ok_or(FI_EINVAL)?;
    Ok((iov, any_device.then_some(segs)))
}

/// Flushes a file-backed range to its file (a no-op for anonymous memory): 0 or an errno.
pub fn commit(iov: &IovList) -> i32 {
    const PAGE: usize = 4096;
    for s in iov.segs() {
        if s.len == 0 {
            continue;
        }
        let start = s.addr & !(PAGE - 1);
        let end = s.addr + s.len;
        // SAFETY: msync only flushes pages of a mapping the range lies in; it reads nothing
        // through the pointer from user space.
        let r = unsafe { libc::msync(start as *mut libc::c_void, end - start, libc::MS_SYNC) };
        if r != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            // Anonymous memory is not file-backed: nothing to make durable.
            if e != libc::ENOMEM {
                return e;
            }
        }
    }
    0
}

/// One atomic request as the target received it; every field is the peer's and unchecked.
#[derive(Clone, Copy, Debug)]
pub struct AtomicAt<'a> {
    /// `enum fi_op`, raw.
    pub op: i32,
    /// `enum fi_datatype`, raw.
    pub datatype: i32,
    /// Elements.
    pub count: usize,
    /// Target address (or offset) and key.
    pub addr: u64,
    /// The region's key.
    pub key: u64,
    /// Whether the original values go back.
    pub fetch: bool,
    /// The operand values, then the compare values for compare ops.
    pub args: &'a [u8],
}

/// What an executed atomic did: its kind for the target's completion and the original
/// values (empty unless fetching).
#[derive(Debug)]
pub struct AtomicDone {
    /// Where the target's range is in this process (`len` bytes).
    pub at: usize,
    /// `FI_READ` or `FI_WRITE`: how the target's memory was accessed.
    pub dir: u64,
    /// Bytes of the target touched.
    pub len: usize,
    /// The original values for a fetch.
    pub result: Vec<u8>,
}

/// Checks and executes an atomic at this target: `Err(errno)` leaves memory untouched.
pub fn atomic(core: &EpCore, req: &AtomicAt<'_>) -> Result<AtomicDone, i32> {
    let (Some(op), Some(dt)) = (AtomicOp::from_raw(req.op), Datatype::from_raw(req.datatype))
    else {
        return Err(FI_EINVAL);
    };
    let n = req.count.saturating_mul(dt.size());
    if n == 0 || n > ATOMIC_MAX {
        return Err(FI_EINVAL);
    }
    let want = n * (usize::from(op != AtomicOp::Read) + usize::from(op.is_compare()));
    if req.args.len() != want {
        return Err(FI_EINVAL);
    }
    let (operand, compare) = match op {
        AtomicOp::Read => (None, None),
        _ if op.is_compare() => (Some(&req.args[..n]), Some(&req.args[n..])),
        _ => (Some(req.args), None),
    };
    let access = match (op, req.fetch) {
        (AtomicOp::Read, _) => FI_REMOTE_READ,
        (_, true) => FI_REMOTE_READ | FI_REMOTE_WRITE,
        _ => FI_REMOTE_WRITE,
    };
    let (target, owner) = core
        .mr
        .check_owned(req.key, req.addr, n, access)
        .map_err(|_| FI_EACCES)?;
    let device = match (owner.is_device(), core.hmem()) {
        (false, _) => None,
        (true, Some(hm)) => Some(hm),
        (true, None) => return Err(FI_EOPNOTSUPP),
    };
    let mut result = vec![0u8; if req.fetch { n } else { 0 }];
    let result_ptr = if req.fetch {
        result.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    // SAFETY (of the closure's call): `target` is `n` bytes that only this lock's holder
    // touches from the host; operand/compare are `n` bytes of the request; result is `n`
    // bytes or unused.
    let run = |target: *mut u8| unsafe {
        apply(
            op,
            dt,
            target,
            operand.map_or(std::ptr::null(), |b| b.as_ptr()),
            compare.map_or(std::ptr::null(), |b| b.as_ptr()),
            result_ptr,
            req.count,
        )
    };
    {
        let _g = ATOMIC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        match device {
            // SAFETY: the range passed the key check: registered memory with this access.
            None => run(target as *mut u8).map_err(|e| e.errno())?,
            // Device memory, as libfabric's shm provider does it: copied to the host, updated
            // there, and copied back (synchronously: the device sees the new values before
            // the reply) under the lock. Atomic with respect to other fabric atomics at this
            // process, not to device kernels touching the memory meanwhile.
            // SAFETY: the range passed the key check: registered memory of `owner`.
            Some(hm) => {
                match unsafe { hmem_stage::update(hm, owner, target, n, |b| run(b.as_mut_ptr())) } {
                    Ok(r) => r.map_err(|e| e.errno())?,
                    Err(_) => return Err(FI_EIO),
                }
            }
        }
    }
    Ok(AtomicDone {
        at: target,
        dir: if op == AtomicOp::Read {
            FI_READ
        } else {
            FI_WRITE
        },
        len: n,
        result,
    })
}
