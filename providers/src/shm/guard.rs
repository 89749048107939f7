//! Surviving a segment that shrinks under its mappings. A segment is a file in /dev/shm that
//! every peer maps shared; its owner, or any process of the same user, can truncate it at any
//! time, and the next access to a page past its new end raises SIGBUS, whose default action
//! kills this process. A broken or hostile peer must not be able to do that.
//!
//! Every mapping of a segment is registered here, in a fixed table the signal handler reads
//! without locks. When the faulting address lies in a registered mapping, the handler maps
//! anonymous zeroed memory over the whole of it (`MAP_FIXED`, as Wayland compositors do with a
//! client's shared-memory pool), marks it faulted and returns: the access is retried and
//! succeeds, on memory no other process shares. The provider then treats the segment's owner as
//! gone (`Segment::owner_alive` says so, a faulted ring has no room): its operations fail with
//! `FI_ECONNRESET` as a dead peer's do. A message written at the moment of the fault is lost
//! with that peer, as one written just before a peer dies is. A fault anywhere else goes to the
//! handler installed before this one, or to the default action, which kills the process as it
//! would have.
//!
//! Sealing the file against shrinking (a memfd's `F_SEAL_SHRINK`) would prevent the fault
//! instead, but peers find segments by name in /dev/shm, and such files cannot be sealed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings guarded at once: every endpoint's own segment and the peers' it maps (at most
/// `MAX_LINKS` each). Past it a mapping is left unguarded, and said once.
const SLOTS: usize = 16384;

struct Slot {
    /// Start of the mapping; 0 while the slot is free. Written last when a slot is taken,
    /// first when it is given back.
    start: AtomicUsize,
    /// Its length; taking a slot is turning this from 0 to the length.
    len: AtomicUsize,
    faulted: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
    }
}; SLOTS];
/// Slots at or past this one have never been taken: the handler looks below it only.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Faults the handler turned into a faulted mapping.
static FAULTS: AtomicU64 = AtomicU64::new(0);
/// The SIGBUS disposition before ours, for faults outside our mappings.
static PREV: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered mapping; given back by `unguard`, before the mapping goes.
#[derive(Debug)]
pub struct Guard(usize);

impl Guard {
    /// Whether an access to the mapping faulted (it is anonymous memory since).
    pub fn faulted(&self) -> bool {
        TABLE[self.0].faulted.load(Ordering::Acquire)
    }
}

/// Why a mapping is not guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unguarded {
    /// Every slot holds a mapping: the caller must not map one more (a peer that truncated
    /// it would kill the process), and says so.
    Full,
    /// The handler could not be installed (or the mapping is empty): nothing is guarded in
    /// this process, as before the guard existed.
    NoHandler,
}

/// Registers the mapping of `len` bytes at `start`; why not (`Full` said once in the log).
pub fn guard(start: *mut u8, len: usize) -> Result<Guard, Unguarded> {
    if !install() || len == 0 {
        return Err(Unguarded::NoHandler);
    }
    for (i, s) in TABLE.iter().enumerate() {
        if s.start.load(Ordering::Relaxed) == 0
            && s.len
                .compare_exchange(0, len, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            s.faulted.store(false, Ordering::Relaxed);
            HIGH.fetch_max(i + 1, Ordering::AcqRel);
            s.start.store(start as usize, Ordering::Release);
            return Ok(Guard(i));
        }
    }
    static FULL: Once = Once::new();
    FULL.call_once(|| {
        tracing::warn!("shm: {SLOTS} segment mappings guarded already; no more are mapped until some go (one a peer truncated would kill this process)");
    });
    Err(Unguarded::Full)
}

/// Takes every free slot for mappings that are not there (tests: a table full of other
/// endpoints' peers); given back when dropped.
pub struct Filler(Vec<Guard>);

impl Filler {
    /// Fills the table.
    pub fn fill() -> Filler {
        let mut taken = Vec::new();
        // Addresses no mapping has: the handler is never asked about them.
        let mut at = usize::MAX - (1 << 20);
        while let Ok(g) = guard(at as *mut u8, 1) {
            taken.push(g);
            at -= 1;
        }
        Filler(taken)
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        for g in self.0.drain(..) {
            unguard(g);
        }
    }
}

/// Gives `g`'s slot back; call it before the mapping is unmapped.
pub fn unguard(g: Guard) {
    let s = &TABLE[g.0];
    s.start.store(0, Ordering::Release);
    s.faulted.store(false, Ordering::Relaxed);
    s.len.store(0, Ordering::Release);
}

/// Faults turned into faulted mappings in this process so far.
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Acquire)
}

/// Installs the handler once; false if that failed.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction reads and fills plain structures we own; the handler below is
        // async-signal-safe (atomics, mmap, sigaction).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            // Known before ours can run: a fault elsewhere always finds where to go.
            let _ = PREV.set(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) != 0 {
                tracing::warn!("shm: cannot install the SIGBUS handler: a peer truncating its segment would kill this process");
                return false;
            }
        }
        true
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Only a fault the kernel raised for an access (si_code > 0) is looked up: a SIGBUS another
    // process sent (kill, sigqueue: si_code <= 0, with any si_addr it likes) goes on as before.
    let high = if code > 0 {
        HIGH.load(Ordering::Acquire).min(SLOTS)
    } else {
        0
    };
    for s in &TABLE[..high] {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || addr < start {
            continue;
        }
        let len = s.len.load(Ordering::Acquire);
        // Read again: a slot given back and taken meanwhile pairs another start with `len`.
        if addr - start >= len || s.start.load(Ordering::Acquire) != start {
            continue;
        }
        // SAFETY: replaces exactly a mapping we made and still hold (its slot is given back
        // before it is unmapped) with private anonymous memory of the same size.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        s.faulted.store(true, Ordering::Release);
        FAULTS.fetch_add(1, Ordering::AcqRel);
        return;
    }
    // Not ours: what would have happened without us.
    // SAFETY: `PREV` was set before this handler was installed; a previous handler is called
    // as the kernel would have called it.
    unsafe {
        match PREV.get() {
            Some(prev)
                if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN =>
            {
                if prev.sa_flags & libc::SA_RESETHAND as libc::c_int != 0 {
                    // One-shot, as the kernel would have made it.
                    restore_default();
                }
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(prev.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                    f(sig);
                }
            }
            // The default action: put it back. A fault's access is retried on return, faults
            // again, and ends the process as it would have; a signal sent is raised again.
            // (A fault's SIGBUS cannot be ignored; one sent to a process ignoring it was
            // ignored before us, and is now.)
            Some(prev) if prev.sa_sigaction == libc::SIG_IGN && code <= 0 => {}
            _ => {
                restore_default();
                if code <= 0 {
                    libc::raise(sig);
                }
            }
        }
    }
}

/// Puts SIGBUS's default action back (async-signal-safe: sigaction only).
fn restore_default() {
    // SAFETY: sigaction with a zeroed, default-action structure of our own.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file mapped, truncated, then touched: the access survives, reads zeros, and the
    /// mapping says it faulted.
    #[test]
    fn a_truncated_mapping_faults_into_zeros_not_a_crash() {
        let path = std::env::temp_dir().join(format!("xf-guard-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        let len = 4 * 4096;
        f.set_len(len as u64).unwrap();
        // SAFETY: maps the file we just sized; unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        let g = guard(base, len).expect("guarded");
        // SAFETY: within the mapping.
        unsafe { base.add(3 * 4096).write_volatile(7) };
        assert!(!g.faulted());
        let before = faults();
        f.set_len(0).unwrap();
        // SAFETY: within the mapping: past the file's end now, so this faults.
        let v = unsafe {
            base.add(3 * 4096).write_volatile(9);
            base.add(3 * 4096 + 1).read_volatile()
        };
        assert_eq!(v, 0);
        assert!(g.faulted());
        assert!(faults() > before);
        unguard(g);
        // SAFETY: unmaps what was mapped above.
        unsafe { libc::munmap(base.cast(), len) };
    }
}
