//! Cross-memory attach: the receiver copies a large message straight out of the sender's
//! address space with `process_vm_readv`. Containers often forbid it (seccomp, Yama's
//! ptrace_scope); the first refusal switches the endpoint to pipelining through the ring.

use std::sync::atomic::{AtomicU8, Ordering};

use xfabric_core::rxq::IOV_LIMIT;
use xfabric_core::{IovList, RawIov};

/// What is known about cross-memory attach on this endpoint.
#[derive(Debug)]
pub struct CmaState(AtomicU8);

const UNKNOWN: u8 = 0;
const WORKS: u8 = 1;
const REFUSED: u8 = 2;

impl CmaState {
    /// Unknown until tried, unless `XFABRIC_SHM_CMA=0` turns it off.
    pub fn new() -> Self {
        let off = !xfabric_core::settings::SHM_CMA.flag();
        CmaState(AtomicU8::new(if off { REFUSED } else { UNKNOWN }))
    }

    /// Whether it is worth trying.
    pub fn usable(&self) -> bool {
        self.0.load(Ordering::Relaxed) != REFUSED
    }

    /// Whether it has worked on this endpoint (a split copy relies on it).
    pub fn known_working(&self) -> bool {
        self.0.load(Ordering::Relaxed) == WORKS
    }

    /// It worked outside `read`/`write` (a peer's pid checked by reading its memory).
    pub fn seen_working(&self) {
        let _ = self
            .0
            .compare_exchange(UNKNOWN, WORKS, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn set(&self, v: u8) {
        self.0.store(v, Ordering::Relaxed);
    }
}

impl Default for CmaState {
    fn default() -> Self {
        Self::new()
    }
}

/// Outcome of a cross-memory copy.
#[derive(Debug, PartialEq, Eq)]
pub enum CmaResult {
    /// All bytes copied.
    Done,
    /// The kernel refuses cross-memory attach here: use the ring instead.
    Refused,
    /// The sender process is gone.
    PeerGone,
    /// Another failure (errno).
    Failed(i32),
}

/// Copies `len` bytes from `remote` (in process `pid`) into `local`.
pub fn read(
    state: &CmaState,
    pid: i32,
    local: &IovList,
    remote: &[RawIov],
    len: usize,
) -> CmaResult {
    copy(state, pid, local, remote, len, false)
}

/// Copies `len` bytes from `local` into `remote` (in process `pid`).
pub fn write(
    state: &CmaState,
    pid: i32,
    local: &IovList,
    remote: &[RawIov],
    len: usize,
) -> CmaResult {
    copy(state, pid, local, remote, len, true)
}

fn iovecs(l: &IovList) -> ([libc::iovec; IOV_LIMIT], usize) {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; IOV_LIMIT];
    for (d, s) in v.iter_mut().zip(l.segs()) {
        d.iov_base = s.addr as *mut libc::c_void;
        d.iov_len = s.len;
    }
    (v, l.segs().len())
}

fn copy(
    state: &CmaState,
    pid: i32,
    local: &IovList,
    remote: &[RawIov],
    len: usize,
    to_remote: bool,
) -> CmaResult {
    let Some(remote) = IovList::from_segs(remote.iter().copied()) else {
        return CmaResult::Failed(libc::EINVAL);
    };
    let mut done = 0usize;
    while done < len {
        let (l, ln) = iovecs(&local.slice(done, len - done));
        let (r, rn) = iovecs(&remote.slice(done, len - done));
        // SAFETY: the local iovecs describe memory the caller owns (a matched receive buffer to
        // write, or a pending send's buffer to read); the remote ones are only dereferenced by
        // the kernel, in `pid`.
        let n = unsafe {
            if to_remote {
                libc::process_vm_writev(
                    pid,
                    l.as_ptr(),
                    ln as libc::c_ulong,
                    r.as_ptr(),
                    rn as libc::c_ulong,
                    0,
                )
            } else {
                libc::process_vm_readv(
                    pid,
                    l.as_ptr(),
                    ln as libc::c_ulong,
                    r.as_ptr(),
                    rn as libc::c_ulong,
                    0,
                )
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            return match e {
                libc::EPERM | libc::ENOSYS | libc::EACCES => {
                    refused(state, pid, e);
                    CmaResult::Refused
                }
                libc::ESRCH => CmaResult::PeerGone,
                libc::EINTR => continue,
                e => CmaResult::Failed(e),
            };
        }
        if n == 0 {
            return CmaResult::Failed(libc::EFAULT);
        }
        state.set(WORKS);
        done += n as usize;
    }
    CmaResult::Done
}

/// A copy with `pid` refused with `errno`. Only a missing system call (`ENOSYS`: a kernel or
/// seccomp filter without it) says nothing will work: the endpoint stops trying. A refusal of
/// that one process (`EPERM`, `EACCES`: it made itself undumpable, or Yama's scope leaves it
/// out) is that peer's alone, which the caller's refusal ends (the engine asks that peer for
/// no more copies): one peer must not turn cross-memory attach off for every other.
fn refused(state: &CmaState, pid: i32, errno: i32) {
    if errno == libc::ENOSYS {
        if state.usable() {
            tracing::warn!(
                "shm: the kernel has no cross-memory attach (ENOSYS); large messages on this \
                 endpoint go through the ring from now on"
            );
        }
        state.set(REFUSED);
    } else {
        tracing::info!(
            errno,
            "shm: the kernel refuses cross-memory attach to pid {pid}; large messages with \
             that peer go through the ring"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peers_refusal_leaves_the_endpoint_copying() {
        let st = CmaState(AtomicU8::new(UNKNOWN));
        refused(&st, 1, libc::EPERM);
        refused(&st, 1, libc::EACCES);
        assert!(st.usable(), "a refusal of one process is that peer's");
        refused(&st, 1, libc::ENOSYS);
        assert!(!st.usable(), "no system call: nothing will copy");
    }

    #[test]
    fn reads_own_memory_across_segments() {
        let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut a = vec![0u8; 3000];
        let mut b = vec![0u8; 7000];
        let local = IovList::from_segs([RawIov::of_mut(&mut a), RawIov::of_mut(&mut b)]).unwrap();
        let st = CmaState(AtomicU8::new(UNKNOWN));
        let r = read(
            &st,
            std::process::id() as i32,
            &local,
            &[RawIov::of(&src)],
            10_000,
        );
        if r == CmaResult::Refused {
            eprintln!("skipped: process_vm_readv is refused on this machine");
            return;
        }
        assert_eq!(r, CmaResult::Done);
        assert_eq!(&a[..], &src[..3000]);
        assert_eq!(&b[..], &src[3000..]);
    }
}
