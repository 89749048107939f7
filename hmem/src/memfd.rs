//! Host memory another process can map: the system interface's device-visible allocations are
//! sealed memfds, kept in a process-wide table so that `ipc_get` finds the one holding a range,
//! and `ipc_open` maps a peer's through `/proc/<pid>/fd/<fd>`.
//!
//! The seals (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) are what make a peer's mapping safe
//! to read: the file can never become shorter than what was mapped, so no access through the
//! mapping can raise SIGBUS, whatever the exporter does later, as long as the file lives where
//! our own memfds do (the kernel's internal tmpfs, which has no size limit). A hugetlb memfd
//! can be sealed too, but a hole the exporter punches in it faults a huge page in on our read,
//! and an empty pool makes that a SIGBUS: the opener refuses any other filesystem. The opener
//! checks the seals, and treats everything else in a handle as hostile too: the descriptor is
//! first opened with `O_PATH` (no open of a device or FIFO with its side effects, never
//! blocking) and must be a regular file with the handle's inode and device and at least its
//! length; only then is it reopened read-only and mapped `PROT_READ`.
//!
//! A handle's `raw` bytes (little-endian): `0 fd:i32 | 4 0:u32 | 8 inode:u64 | 16 dev:u64 |
//! 24 zeros`. Opening needs what reading `/proc/<pid>/fd` needs: the ptrace read access that
//! cross-memory attach needs too (same user, Yama permitting).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Mutex;

use xfabric_core::error::OsError;

use crate::error::HmemError;
use crate::mem::{IpcHandle, Release};
use crate::{Iface, Result};

/// Pages mapped here, and what unmaps them.
pub(crate) type Pages = (NonNull<u8>, Box<dyn Release>);

/// The seals every export carries; an opener needs at least `F_SEAL_SHRINK`.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// One shareable allocation of this process.
struct Export {
    /// Bytes mapped (the file's size, whole pages).
    len: usize,
    /// Kept open for peers to find through `/proc/<pid>/fd`.
    fd: OwnedFd,
    ino: u64,
    dev: u64,
}

/// Every shareable allocation of this process, by base address. Invariant: the ranges do not
/// overlap (each is a live mapping of its own), and an entry is removed before its mapping goes.
static EXPORTS: Mutex<BTreeMap<usize, Export>> = Mutex::new(BTreeMap::new());

fn exports() -> std::sync::MutexGuard<'static, BTreeMap<usize, Export>> {
    // A poisoned lock only means a thread panicked while inserting or removing; the map is
    // still a map.
    EXPORTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The file identity a system handle names, as its `raw` bytes hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub fd: RawFd,
    pub ino: u64,
    pub dev: u64,
}

impl FileId {
    pub fn to_raw(self) -> [u8; 64] {
        let mut r = [0u8; 64];
        r[0..4].copy_from_slice(&self.fd.to_le_bytes());
        r[8..16].copy_from_slice(&self.ino.to_le_bytes());
        r[16..24].copy_from_slice(&self.dev.to_le_bytes());
        r
    }

    /// Parses a peer's `raw` bytes: a non-negative descriptor and zeros where zeros belong.
    pub fn from_raw(op: &'static str, r: &[u8; 64]) -> Result<FileId> {
        let word = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&r[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let fd = i32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        if fd < 0 {
            return Err(HmemError::inval(
                op,
                format!("descriptor {fd} in the handle"),
            ));
        }
        if r[4..8] != [0; 4] || r[24..].iter().any(|&b| b != 0) {
            return Err(HmemError::inval(
                op,
                "a system handle's reserved bytes are not zero",
            ));
        }
        Ok(FileId {
            fd,
            ino: word(8),
            dev: word(16),
        })
    }
}

fn os_err(op: &'static str, what: impl std::fmt::Display) -> HmemError {
    let e = std::io::Error::last_os_error();
    HmemError::Os {
        op,
        source: OsError {
            code: e.raw_os_error().unwrap_or(libc::EIO),
            text: format!("{what}: {e}"),
        },
    }
}

fn fstat(op: &'static str, fd: RawFd) -> Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable and sized for fstat; a bad descriptor is an error, not UB.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err(op, "fstat"));
    }
    Ok(st)
}

/// A memfd mapping of `map_len` bytes (a multiple of the page size), sealed and registered; `None`
/// where no sealed memfd can be had (no memfds in this kernel or sandbox, no descriptor left,
/// no sealing): the caller then uses anonymous pages, which only lack an IPC handle.
pub(crate) fn alloc(op: &'static str, map_len: usize) -> Result<Option<Pages>> {
    let Ok(size) = libc::off_t::try_from(map_len) else {
        return Err(HmemError::inval(
            op,
            format!("{map_len} bytes is too large"),
        ));
    };
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            c"xfabric-hmem".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Ok(None);
    }
    // SAFETY: `raw` is a descriptor just created and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain calls on a descriptor we own.
    let sealed = unsafe {
        libc::ftruncate(fd.as_raw_fd(), size) == 0
            && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) == 0
    };
    if !sealed {
        return Ok(None);
    }
    let st = fstat(op, fd.as_raw_fd())?;
    // SAFETY: a shared mapping of the whole file at an address of the kernel's choosing
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err(op, "mmap"));
    }
    let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
        return Err(HmemError::inval(op, "mmap gave null"));
    };
    let base = ptr.as_ptr() as usize;
    exports().insert(
        base,
        Export {
            len: map_len,
            fd,
            ino: st.st_ino,
            dev: st.st_dev,
        },
    );
    Ok(Some((ptr, Box::new(Exported { base, len: map_len }))))
}

/// An allocation from `alloc`: removed from the table, then unmapped (the descriptor closes
/// with its entry; a peer's mapping keeps the pages until it goes too).
struct Exported {
    base: usize,
    len: usize,
}

impl Release for Exported {
    fn release(&mut self) -> Result<()> {
        drop(exports().remove(&self.base));
        // SAFETY: `base..base + len` is the mapping `alloc` made, released once.
        if unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) } != 0 {
            return Err(HmemError::last_os("munmap"));
        }
        Ok(())
    }
}

/// The entry of `map` holding `addr..addr + len`, with its base.
fn holding(map: &BTreeMap<usize, Export>, addr: usize, len: usize) -> Option<(usize, &Export)> {
    let end = addr.checked_add(len)?;
    let (&base, e) = map.range(..=addr).next_back()?;
    (end <= base.checked_add(e.len)?).then_some((base, e))
}

/// Whether a shareable allocation holds `addr..addr + len` (no system call).
pub(crate) fn holds(addr: *const u8, len: usize) -> bool {
    holding(&exports(), addr as usize, len).is_some()
}

/// The handle of the shareable allocation holding `addr..addr + len`, if one does (no
/// allocation, no lock held beyond the lookup: a sender asks this per large message).
pub(crate) fn find(addr: *const u8, len: usize) -> Option<IpcHandle> {
    let a = addr as usize;
    let map = exports();
    let (base, e) = holding(&map, a, len)?;
    Some(IpcHandle {
        iface: Iface::System,
        pid: this_pid(),
        device: 0,
        alloc_id: 0,
        base: base as u64,
        alloc_len: e.len as u64,
        offset: (a - base) as u64,
        raw: FileId {
            fd: e.fd.as_raw_fd(),
            ino: e.ino,
            dev: e.dev,
        }
        .to_raw(),
    })
}

/// Whether some shareable allocation overlaps `addr..addr + len` (for a precise error when
/// `find` says no).
pub(crate) fn overlaps(addr: *const u8, len: usize) -> bool {
    let a = addr as usize;
    let end = a.saturating_add(len);
    exports()
        .range(..end)
        .next_back()
        .is_some_and(|(&base, e)| base.saturating_add(e.len) > a)
}

/// Maps the allocation `h` names, read-only: `(base, bytes mapped)`, unmapped by the release.
pub(crate) fn open(h: &IpcHandle) -> Result<Pages> {
    const OP: &str = "ipc_open";
    let id = FileId::from_raw(OP, &h.raw)?;
    let pid = i32::try_from(h.pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| HmemError::inval(OP, format!("pid {} in the handle", h.pid)))?;
    let len = usize::try_from(h.alloc_len)
        .ok()
        .filter(|&l| l > 0)
        .ok_or_else(|| HmemError::inval(OP, format!("length {} in the handle", h.alloc_len)))?;
    if h.offset > h.alloc_len {
        return Err(HmemError::inval(
            OP,
            format!(
                "offset {} lies past the {}-byte allocation",
                h.offset, h.alloc_len
            ),
        ));
    }
    let path = format!("/proc/{pid}/fd/{}", id.fd);
    // `O_PATH`: the link is followed without opening what it names, so a descriptor that
    // names a FIFO, a socket or a device has no effect and cannot block us.
    let opath = open_path(OP, &path, libc::O_PATH | libc::O_CLOEXEC)?;
    // Before anything asks the file's own filesystem (an `fstat` does): one a peer serves
    // itself (FUSE) could leave the question unanswered, and us waiting in it for good.
    let (mount, memfds) = (mount_of(opath.as_raw_fd()), memfd_mount());
    if mount.is_none() || mount != memfds {
        return Err(HmemError::inval(
            OP,
            format!(
                "{path} is on mount {mount:?}, not the memfds' {memfds:?}; nothing was asked of \
                 its filesystem"
            ),
        ));
    }
    check_file(OP, &path, opath.as_raw_fd(), id, h.alloc_len)?;
    // Now known to be the regular file the handle names; reopened through our own
    // descriptor, so it is the same file whatever the exporter does meanwhile.
    let fd = open_path(
        OP,
        &format!("/proc/self/fd/{}", opath.as_raw_fd()),
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
    )?;
    check_file(OP, &path, fd.as_raw_fd(), id, h.alloc_len)?;
    if Some(id.dev) != memfd_dev() {
        return Err(HmemError::inval(
            OP,
            format!(
                "{path} is on device {:#x}, not the memfds' {:?}: a hole in it (hugetlbfs) could \
                 fault",
                id.dev,
                memfd_dev()
            ),
        ));
    }
    // SAFETY: F_GET_SEALS reads the file's seals; a file without sealing support answers an
    // error.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(HmemError::inval(
            OP,
            format!("{path} is not sealed against shrinking: mapping it could fault"),
        ));
    }
    // SAFETY: a read-only shared mapping of at most the file's (sealed) size, at an address of
    // the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err(OP, format_args!("mmap {path}")));
    }
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| HmemError::inval(OP, "mmap gave null"))?;
    Ok((
        ptr,
        Box::new(Unmap {
            addr: ptr.as_ptr() as usize,
            len,
        }),
    ))
}

fn open_path(op: &'static str, path: &str, flags: libc::c_int) -> Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| HmemError::inval(op, "a path with a NUL"))?;
    // SAFETY: a NUL-terminated path and flags that create nothing; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(os_err(op, format_args!("open {path}")));
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Where our own memfds live, from one made to look: the device of their filesystem and the
/// mount they lie on (each `None` where no memfd can be made, or nothing tells).
fn memfd_home() -> (Option<u64>, Option<u64>) {
    static HOME: std::sync::OnceLock<(Option<u64>, Option<u64>)> = std::sync::OnceLock::new();
    *HOME.get_or_init(|| {
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let raw = unsafe { libc::memfd_create(c"xfabric-probe".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return (None, None);
        }
        // SAFETY: `raw` is a descriptor just created and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let dev = fstat("memfd", fd.as_raw_fd()).ok().map(|st| st.st_dev);
        (dev, mount_of(fd.as_raw_fd()))
    })
}

/// The device of the filesystem our own memfds live on.
fn memfd_dev() -> Option<u64> {
    memfd_home().0
}

/// The mount our own memfds lie on.
fn memfd_mount() -> Option<u64> {
    memfd_home().1
}

/// The mount `fd`'s file lies on (`mnt_id` in `/proc/self/fdinfo`): procfs answers from the
/// descriptor alone, without a call into the file's filesystem (`None` where procfs does not
/// tell). Also the shm provider's check of a path under /dev/shm.
pub fn mount_of(fd: RawFd) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `fd` is a regular file with `id`'s inode and device, at least `len` bytes long.
fn check_file(op: &'static str, path: &str, fd: RawFd, id: FileId, len: u64) -> Result<()> {
    let st = fstat(op, fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(HmemError::inval(
            op,
            format!("{path} is not a regular file"),
        ));
    }
    if (st.st_ino, st.st_dev) != (id.ino, id.dev) {
        return Err(HmemError::inval(
            op,
            format!(
                "{path} is inode {} on device {:#x}, not the handle's {} on {:#x}",
                st.st_ino, st.st_dev, id.ino, id.dev
            ),
        ));
    }
    if u64::try_from(st.st_size).map_or(true, |s| s < len) {
        return Err(HmemError::inval(
            op,
            format!(
                "{path} holds {} bytes, less than the handle's {len}",
                st.st_size
            ),
        ));
    }
    Ok(())
}

/// Pages this crate mapped (anonymous ones, a peer's allocation), unmapped on release.
pub(crate) struct Unmap {
    pub addr: usize,
    pub len: usize,
}

impl Release for Unmap {
    fn release(&mut self) -> Result<()> {
        // SAFETY: `addr..addr + len` is a mapping this crate made for this value alone,
        // released once.
        if unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) } != 0 {
            return Err(HmemError::last_os("munmap"));
        }
        Ok(())
    }
}

/// This process's id without a system call per use (`std::process::id` makes one each time,
/// and a sender asks per large message): read once, and forgotten in a forked child (whose
/// id differs), which reads its own on first use.
pub(crate) fn this_pid() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Once;
    static PID: AtomicU32 = AtomicU32::new(0);
    static AT_FORK: Once = Once::new();
    extern "C" fn forget() {
        PID.store(0, Ordering::Relaxed);
    }
    /// `PID` once the fork handler could not be registered: never cached.
    const UNCACHED: u32 = u32::MAX;
    match PID.load(Ordering::Relaxed) {
        0 => {}
        UNCACHED => return std::process::id(),
        p => return p,
    }
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic, which is
        // async-signal-safe in a forked child.
        if unsafe { libc::pthread_atfork(None, None, Some(forget)) } != 0 {
            PID.store(UNCACHED, Ordering::Relaxed);
        }
    });
    let p = std::process::id();
    let _ = PID.compare_exchange(0, p, Ordering::Relaxed, Ordering::Relaxed);
    p
}

#[cfg(test)]
mod open_tests {
    use super::*;

    /// A handle of this process naming descriptor `fd` with its true inode and device, for
    /// `len` bytes.
    pub(super) fn handle_naming(fd: RawFd, len: u64) -> IpcHandle {
        let st = fstat("test", fd).unwrap();
        IpcHandle {
            iface: Iface::System,
            pid: this_pid(),
            device: 0,
            alloc_id: 0,
            base: 0x1000,
            alloc_len: len,
            offset: 0,
            raw: FileId {
                fd,
                ino: st.st_ino,
                dev: st.st_dev,
            }
            .to_raw(),
        }
    }

    /// A sealed hugetlb memfd is a regular file of the right size and seals, but a hole in it
    /// can fault: refused before it is mapped.
    #[test]
    fn a_hugetlb_memfd_is_not_opened() {
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"xfabric-test-huge".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
            )
        };
        if raw < 0 {
            eprintln!("no hugetlb memfds here: nothing to check");
            return;
        }
        // SAFETY: just created, ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        const LEN: u64 = 2 << 20;
        // SAFETY: plain calls on our own descriptor.
        let ok = unsafe {
            libc::ftruncate(fd.as_raw_fd(), LEN as libc::off_t) == 0
                && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) == 0
        };
        if !ok {
            eprintln!("a hugetlb memfd does not take the seals here: nothing to check");
            return;
        }
        let h = handle_naming(fd.as_raw_fd(), LEN);
        let Err(e) = open(&h) else {
            panic!("a hugetlb memfd opened");
        };
        assert!(e.to_string().contains("not the memfds'"), "{e}");
    }
}

#[cfg(test)]
mod mount_tests {
    use super::open_tests::handle_naming;
    use super::*;

    /// A handle naming a file of the right inode, device and size on another mount (here
    /// tmpfs's /dev/shm, or /tmp) is refused by its mount, before anything asks that file's
    /// filesystem: a peer serving its own (FUSE) could leave such a question unanswered.
    #[test]
    fn a_file_on_another_mount_is_refused_before_its_filesystem_is_asked() {
        let dir = ["/dev/shm", "/tmp"]
            .into_iter()
            .find(|d| std::path::Path::new(d).is_dir())
            .expect("a writable directory");
        let path = format!("{dir}/xfabric-mount-test-{}", std::process::id());
        let file = std::fs::File::create(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        const LEN: u64 = 4096;
        file.set_len(LEN).unwrap();
        let h = handle_naming(file.as_raw_fd(), LEN);
        let Err(e) = open(&h) else {
            panic!("a file on {dir} opened as a memfd");
        };
        assert!(e.to_string().contains("not the memfds' Some("), "{e}");
        assert!(e.to_string().contains("nothing was asked"), "{e}");
    }
}

#[cfg(test)]
mod pid_tests {
    use super::this_pid;

    #[test]
    fn the_cached_pid_is_the_processs_own_in_a_forked_child_too() {
        assert_eq!(this_pid(), std::process::id());
        // SAFETY: the child only calls async-signal-safe functions (getpid, _exit) and reads
        // an atomic.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork");
        if child == 0 {
            let ok = this_pid() == unsafe { libc::getpid() } as u32;
            // SAFETY: ends the child without running the parent's destructors or test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:#x}"
        );
        assert_eq!(this_pid(), std::process::id());
    }
}
