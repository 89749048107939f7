//! Shared-memory segments: one per endpoint, a file in /dev/shm mapped by its owner and by every
//! peer that sends to it. The owner holds an exclusive `flock` on it for its whole life; the
//! kernel drops that lock when the owner exits, however it exits, so "can I take the lock?"
//! answers "is the owner dead?" without racing pid reuse or zombies. Stale segments are found
//! and unlinked the same way. The owner takes the lock before it gives the file a size, so a
//! sized file whose lock is free belongs to a dead process, with no grace period to guess.
//!
//! /dev/shm is world-writable: anything under our prefix may have been planted by another
//! user (a FIFO that blocks an open forever, a symlink, a directory, a short file that would
//! SIGBUS a mapping). Every open here is non-blocking and does not follow symlinks, and what it
//! opened must be a regular file of ours, of the size we map, before anything else happens.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use xfabric_core::{Error, Result};

use super::guard::{self, Guard};

/// Directory the segments live in.
pub const SHM_DIR: &str = "/dev/shm";
/// File-name prefix of every xfabric segment.
pub const PREFIX: &str = "xfabric-shm-";

/// A mapped segment file.
pub struct Segment {
    name: String,
    file: File,
    base: *mut u8,
    len: usize,
    owner: bool,
    /// A second mapping of our own segment (`reopen`): its descriptor shares the owner's
    /// open file description, and with it the owner's lock.
    reopened: bool,
    /// The mapping's registration against a truncated file's SIGBUS (`super::guard`).
    guard: Option<Guard>,
}

// SAFETY: the mapping is process-wide memory; all shared fields are accessed through atomics
// or under the protocol's single-writer rules.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn path_of(name: &str) -> PathBuf {
    PathBuf::from(SHM_DIR).join(name)
}

impl Segment {
    /// Creates, sizes, locks and maps a new segment named `name`.
    pub fn create(name: &str, len: usize) -> Result<Self> {
        let path = path_of(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| Error::from_io(format!("shm: create {}", path.display()), e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = Error::last_os(format!("shm: lock {}", path.display()));
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        if let Err(e) = file.set_len(len as u64) {
            let _ = std::fs::remove_file(&path);
            return Err(Error::from_io(
                format!("shm: size {} to {len} bytes", path.display()),
                e,
            ));
        }
        match Self::map(name, file, len, true) {
            Ok(s) => Ok(s),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps the first `len` bytes of an existing segment (a peer's). `Inval` if the name is
    /// something other than a regular file of ours (a symlink, FIFO, directory, another user's
    /// file) or a file shorter than `len`; `PeerLost` if it is missing or still empty.
    pub fn open(name: &str, len: usize) -> Result<Self> {
        let path = path_of(name);
        let file = open_regular(&path, true).map_err(|e| match e {
            // Out of descriptors or memory: no word on the peer (`Os` keeps the errno).
            Refused::Io(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
                ) =>
            {
                Error::from_io(format!("cannot open peer segment {}", path.display()), e)
            }
            Refused::Io(e) => {
                Error::PeerLost(format!("cannot open peer segment {}: {e}", path.display()))
            }
            Refused::Not(why) => Error::Inval(format!(
                "shm: {} is not a peer segment: {why}",
                path.display()
            )),
        })?;
        let size = file
            .metadata()
            .map_err(|e| Error::from_io(format!("shm: stat {}", path.display()), e))?
            .len();
        if size == 0 {
            // Its owner locks, then sizes: empty is a segment being created (or abandoned).
            return Self::map(name, file, 0, false);
        }
        if size < len as u64 {
            // Mapping past the end of a file and touching it is a SIGBUS.
            return Err(Error::Inval(format!(
                "shm: {} is not a peer segment: {size} bytes, a segment has {len}",
                path.display()
            )));
        }
        Self::map(name, file, len, false)
    }

    /// Another mapping of this very file (not of whatever has its name now: the name is in a
    /// world-writable directory), never the owner's (dropping it unlinks nothing).
    pub fn reopen(&self) -> Result<Self> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::from_io(format!("shm: dup {}", self.name), e))?;
        let mut s = Self::map(&self.name, file, self.len, false)?;
        s.reopened = true;
        Ok(s)
    }

    fn map(name: &str, file: File, len: usize, owner: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::PeerLost(format!(
                "segment {name} is empty (its owner is still creating it or died)"
            )));
        }
        // SAFETY: maps `len` bytes of a regular file we hold open; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::last_os(format!("shm: mmap {name}")));
        }
        let guard = match guard::guard(base.cast(), len) {
            Ok(g) => Some(g),
            Err(guard::Unguarded::NoHandler) => None,
            Err(guard::Unguarded::Full) => {
                // SAFETY: unmaps exactly what was mapped above, which nothing else holds.
                unsafe { libc::munmap(base, len) };
                if owner {
                    let _ = std::fs::remove_file(path_of(name));
                }
                return Err(Error::Again(
                    "shm: every guarded mapping slot is in use (too many segments mapped)",
                ));
            }
        };
        Ok(Segment {
            name: name.to_string(),
            file,
            base: base.cast(),
            len,
            owner,
            reopened: false,
            guard,
        })
    }

    /// The segment's name (its file name in /dev/shm).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device and inode of the file this mapping is of (`None` if fstat fails).
    pub fn file_id(&self) -> Option<(u64, u64)> {
        self.file.metadata().ok().map(|m| (m.dev(), m.ino()))
    }

    /// The descriptor the segment's file is open on here (the owner's holds its lock).
    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Start of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Maps in, now, the pages of `len` bytes from `off` (clamped to the mapping), for
    /// writing or for reading, so that the traffic which goes through them first does not
    /// take a page fault every 4 KiB: a lane's first lap did, on each side (3-14 us each on
    /// this VM), and for the first 128 KiB of every lane that was a fault every 64 small
    /// messages. Best effort: a kernel without `MADV_POPULATE_*` (before 5.14), or a file
    /// its owner truncated (the fault handler of `guard` covers the accesses themselves),
    /// leaves them to fault as before.
    pub fn populate(&self, off: usize, len: usize, write: bool) {
        let end = off.saturating_add(len).min(self.len);
        let start = off & !(xfabric_hmem::page_size() - 1);
        if start >= end {
            return;
        }
        let advice = if write {
            libc::MADV_POPULATE_WRITE
        } else {
            libc::MADV_POPULATE_READ
        };
        // SAFETY: a range inside our own mapping (page-aligned start, end within `len`);
        // populating changes no contents, and an error only leaves pages unmapped.
        unsafe {
            libc::madvise(self.base.add(start).cast(), end - start, advice);
        }
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length mapping (never: `map` refuses those).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An atomic `u64` at byte `off`.
    ///
    /// # Safety
    /// `off` must be 8-aligned and within the mapping, and the field shared only through atomics.
    pub unsafe fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: per the contract; the mapping outlives &self.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// An atomic `u32` at byte `off`.
    ///
    /// # Safety
    /// As `u64_at`, 4-aligned.
    pub unsafe fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: per the contract.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// Whether an access faulted because the file was truncated under the mapping (which is
    /// anonymous memory since, shared with no one: `super::guard`).
    pub fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(Guard::faulted)
    }

    /// Whether the segment's owner is still alive (holds its lock) and its file still backs
    /// the mapping. Always true for our own.
    pub fn owner_alive(&self) -> bool {
        // A lock taken through a reopened mapping's descriptor would be the owner's own,
        // changed: our owner is alive.
        if self.owner || self.reopened {
            return true;
        }
        !self.faulted() && owner_alive(&self.file)
    }
}

impl Segment {
    /// Lets go of the owner's lock while the mapping stays (for tests' raw peers: a process
    /// whose lock is free counts as gone, whatever it still writes).
    pub(super) fn unlock(&self) {
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            guard::unguard(g);
        }
        // SAFETY: unmaps exactly what map() mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
        if self.owner {
            let _ = std::fs::remove_file(path_of(&self.name));
        }
    }
}

fn owner_alive(file: &File) -> bool {
    let fd = file.as_raw_fd();
    // SAFETY: flock on a descriptor we own. Our open file description differs from the owner's,
    // so a held exclusive lock makes this fail with EWOULDBLOCK.
    let r = unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) };
    if r == 0 {
        // SAFETY: releases the lock just taken.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        return false;
    }
    true
}

/// Why `open_regular` refused a path.
enum Refused {
    /// The open or stat failed (missing, no permission, ...).
    Io(std::io::Error),
    /// It opened, or is a symlink, but is not a regular file of ours.
    Not(String),
}

/// The mount /dev/shm's own files lie on (`None` where procfs does not tell).
fn shm_mount() -> Option<u64> {
    static HOME: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *HOME.get_or_init(|| {
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(SHM_DIR)
            .ok()?;
        xfabric_hmem::mount_of(dir.as_raw_fd())
    })
}

/// Opens `path` without following a symlink or blocking (on a FIFO, say), and checks that it
/// is a regular file owned by our effective user, on /dev/shm's own mount. A name there may
/// be a mount point (a FUSE file mounted over a planted one, which an ordinary user can make
/// with fusermount3): an open, even a stat, would then call into a file system that may never
/// answer. So the name is first taken without opening what it names (`O_PATH` calls into no
/// file system), its mount compared with /dev/shm's, and only then is the file looked at and
/// opened, through that descriptor.
fn open_regular(path: &Path, write: bool) -> std::result::Result<File, Refused> {
    let at = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)
        .map_err(Refused::Io)?;
    let home = shm_mount();
    if let (Some(m), Some(home)) = (xfabric_hmem::mount_of(at.as_raw_fd()), home) {
        if m != home {
            return Err(Refused::Not(format!(
                "it lies on mount {m}, not /dev/shm's {home} (a file system mounted over it)"
            )));
        }
    }
    // Now known to be a file of /dev/shm's own file system: looked at through the descriptor.
    let meta = at.metadata().map_err(Refused::Io)?;
    check_regular(&meta)?;
    // Through the descriptor where procfs has it; else by its name again, not following a
    // symlink swapped in meanwhile (checked to be the same file below). Without procfs the
    // mount cannot be told, and a file system mounted over the name is not seen.
    let (via, nofollow) = if home.is_some() {
        (
            PathBuf::from(format!("/proc/self/fd/{}", at.as_raw_fd())),
            0,
        )
    } else {
        (path.to_path_buf(), libc::O_NOFOLLOW)
    };
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | nofollow)
        .open(via)
        .map_err(Refused::Io)?;
    let now = file.metadata().map_err(Refused::Io)?;
    if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) {
        return Err(Refused::Not("it was replaced while being opened".into()));
    }
    check_regular(&now)?;
    Ok(file)
}

fn check_regular(meta: &std::fs::Metadata) -> std::result::Result<(), Refused> {
    let ft = meta.file_type();
    if !ft.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if ft.is_dir() {
            "a directory"
        } else if ft.is_symlink() {
            "a symbolic link"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(Refused::Not(format!("it is {what}, not a regular file")));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(Refused::Not(format!(
            "it belongs to user {}, not to us ({me})",
            meta.uid()
        )));
    }
    Ok(())
}

/// A fresh segment name for this process.
pub fn fresh_name() -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{PREFIX}{}-{n}-{nanos:08x}", std::process::id())
}

/// Unlinks segments whose owners are gone (killed before they could clean up). A segment is
/// left alone while its owner holds its lock, and while it is still empty (being created).
/// Returns the names removed.
pub fn reclaim_stale() -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return removed;
    };
    for ent in dir.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if !name.starts_with(PREFIX) {
            continue;
        }
        let path = ent.path();
        // Nothing planted is opened: `open_regular` looks at the name before it opens the
        // file, and opens only a regular file of ours on /dev/shm's own mount.
        let Ok(f) = open_regular(&path, false) else {
            continue;
        };
        let Ok(meta) = f.metadata() else { continue };
        // An empty file is being created (its owner locks before sizing) unless it is old: then
        // its creator died in between.
        let abandoned = meta.len() > 0
            || meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(10));
        if abandoned && !owner_alive(&f) && std::fs::remove_file(&path).is_ok() {
            removed.push(name);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_open_liveness_and_unlink() {
        let name = fresh_name();
        let own = Segment::create(&name, 8192).unwrap();
        // SAFETY: offset 64 is aligned and inside the mapping.
        unsafe { own.u64_at(64) }.store(42, Ordering::Release);
        let peer = Segment::open(&name, 8192).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { peer.u64_at(64) }.load(Ordering::Acquire), 42);
        assert!(peer.owner_alive());
        drop(own);
        assert!(!peer.owner_alive());
        assert!(!path_of(&name).exists());
    }

    /// A second mapping of an endpoint's own segment is of the file it holds, whatever was
    /// put under its name since; and dropping it unlinks nothing.
    #[test]
    fn reopen_maps_the_file_held_not_the_name() {
        let name = fresh_name();
        let own = Segment::create(&name, 8192).unwrap();
        // SAFETY: offset 64 is aligned and inside the mapping.
        unsafe { own.u64_at(64) }.store(42, Ordering::Release);
        // Someone swaps the file under the name (locked, as a live owner's: the sweep of
        // another test must not take it).
        std::fs::remove_file(path_of(&name)).unwrap();
        std::fs::write(path_of(&name), [7u8; 8192]).unwrap();
        let planted = File::open(path_of(&name)).unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(
            unsafe { libc::flock(planted.as_raw_fd(), libc::LOCK_EX) },
            0
        );
        let again = own.reopen().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { again.u64_at(64) }.load(Ordering::Acquire), 42);
        drop(again);
        assert!(
            path_of(&name).exists(),
            "a second mapping unlinked the name"
        );
        std::fs::remove_file(path_of(&name)).unwrap();
    }

    #[test]
    fn reclaim_takes_unlocked_sized_files_only() {
        let live = Segment::create(&fresh_name(), 4096).unwrap();
        // A sized segment nobody holds the lock of: what a killed owner leaves behind.
        let dead = fresh_name();
        std::fs::write(path_of(&dead), [0u8; 64]).unwrap();
        // An empty one is still being created.
        let young = fresh_name();
        std::fs::write(path_of(&young), []).unwrap();
        let removed = reclaim_stale();
        assert!(removed.contains(&dead), "{removed:?}");
        assert!(!path_of(&dead).exists());
        assert!(path_of(live.name()).exists());
        assert!(path_of(&young).exists());
        std::fs::remove_file(path_of(&young)).unwrap();
    }

    #[test]
    fn open_refuses_symlinks_and_short_files_without_mapping_them() {
        let target = fresh_name();
        let link = fresh_name();
        let short = fresh_name();
        std::fs::write(path_of(&target), [0u8; 8192]).unwrap();
        std::os::unix::fs::symlink(path_of(&target), path_of(&link)).unwrap();
        std::fs::write(path_of(&short), [0u8; 64]).unwrap();
        // Held locks make them look alive to a reclaim running beside this test.
        let _held: Vec<File> = [&target, &short]
            .map(|n| {
                let f = File::open(path_of(n)).unwrap();
                // SAFETY: flock on a descriptor we own.
                assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
                f
            })
            .into();
        let r = Segment::open(&link, 8192).map(|_| ());
        assert!(
            matches!(&r, Err(Error::Inval(m)) if m.contains(&link) && m.contains("symbolic link")),
            "{r:?}"
        );
        let r = Segment::open(&short, 8192).map(|_| ());
        assert!(
            matches!(&r, Err(Error::Inval(m)) if m.contains(&short) && m.contains("64 bytes")),
            "{r:?}"
        );
        assert!(Segment::open(&target, 8192).is_ok());
        for n in [&target, &link, &short] {
            std::fs::remove_file(path_of(n)).unwrap();
        }
    }
}
