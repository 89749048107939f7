//! Waking a process that sleeps on a descriptor rather than on the segment's futex: an
//! application asleep in epoll on an `FI_WAIT_FD` object under manual progress, or a progress
//! thread asleep on several endpoints at once (`ShmBell::join_sleep`). The owner of a segment
//! binds a datagram socket in the abstract namespace named after the segment and sets the
//! segment header's `fd_sleeping` word before it sleeps; a sender that sees the word sends it
//! one empty datagram after writing, which makes the socket readable. The owner's next
//! progress call, or the joint sleep's end, takes its part of the word back, so senders pay
//! the system call only while it sleeps (`ring::OFF_FD_SLEEPING`).
//!
//! The socket's name carries a random number the owner draws when it binds and then writes in
//! its segment's header (`ring::OFF_WAKE_NONCE`), which senders read: a name made from the
//! segment's alone (visible in /dev/shm to everyone) could be bound first by any process of
//! any user in the network namespace, and the owner, unable to bind it, would never be woken.
//! An owner that could not bind one does not let a sleep on descriptors begin (its bell is not
//! `quiet`).
//!
//! Anyone on the host may send to the socket: a datagram carries nothing, and at worst wakes
//! the owner for nothing (it drains the socket before each sleep). Peers must share the
//! network namespace for the abstract name to reach (a peer in another one wakes the owner
//! only through its completions); the futex wake-up stays for every other sleeper. A sender
//! whose datagram finds no socket of the name marks the word (`ring::FD_UNREACHABLE`), after
//! which the owner's progress thread sleeps on several endpoints the old way; a lie (any
//! process may write the header) costs the owner only that.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use xfabric_core::{Error, Result};

/// The socket address for segment `seg` under `nonce`: `\0xfabric-wake/<seg>/<nonce>`, or
/// `None` when the name is too long for one.
fn addr_of(seg: &str, nonce: u64) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("xfabric-wake/{seg}/{nonce:016x}");
    // Byte 0 stays NUL: the abstract namespace, no file on disk.
    if name.len() + 1 > a.sun_path.len() {
        return None;
    }
    for (d, &b) in a.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *d = b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Some((a, len as libc::socklen_t))
}

fn socket() -> Result<OwnedFd> {
    // SAFETY: no pointer arguments; a negative return is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(Error::last_os("shm: wake socket"));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The owner's side: readable after a sender rang it.
#[derive(Debug)]
pub struct WakeSock(OwnedFd);

impl WakeSock {
    /// Binds the socket of segment `seg` under `nonce` (non-zero, drawn by the caller).
    pub fn bind(seg: &str, nonce: u64) -> Result<Self> {
        let (a, len) = addr_of(seg, nonce)
            .ok_or_else(|| Error::Inval(format!("shm: segment name {seg} is too long")))?;
        let fd = socket()?;
        // SAFETY: a valid sockaddr_un of `len` bytes.
        let r = unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
        if r < 0 {
            return Err(Error::last_os(format!("shm: bind wake socket of {seg}")));
        }
        Ok(WakeSock(fd))
    }

    /// The descriptor to sleep on.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Takes every datagram queued, leaving the socket unreadable.
    pub fn drain(&self) {
        let mut b = [0u8; 1];
        loop {
            // SAFETY: reads at most 1 byte into a local from our non-blocking socket.
            let r = unsafe { libc::recv(self.0.as_raw_fd(), b.as_mut_ptr().cast(), 1, 0) };
            if r < 0 {
                return;
            }
        }
    }
}

/// Wake datagrams this process sent that reached a socket (tests: a sleep on the socket
/// happened, and was ended so).
static WAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// See `WAKES`.
pub fn wakes() -> u64 {
    WAKES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The sender's side: rings the socket of segment `seg` under `nonce` (the owner's header's;
/// best effort: a full socket is readable already). False where no socket of that name is
/// bound in this network namespace: the owner is in another one (or gone), and a sleep on
/// its socket alone would not hear us.
pub fn ring(seg: &str, nonce: u64) -> bool {
    static SENDER: OnceLock<Option<OwnedFd>> = OnceLock::new();
    let Some(fd) = SENDER.get_or_init(|| socket().ok()) else {
        return true;
    };
    let Some((a, len)) = addr_of(seg, nonce) else {
        return true;
    };
    // SAFETY: sends nothing (a zero-length datagram) to a valid sockaddr_un of `len` bytes.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            (&a as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if sent == 0 {
        WAKES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return true;
    }
    let e = std::io::Error::last_os_error().raw_os_error();
    !matches!(e, Some(libc::ECONNREFUSED | libc::ENOENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn ring_makes_the_socket_readable_until_drained() {
        let name = format!("fdwake-test-{}", std::process::id());
        let s = WakeSock::bind(&name, 7).unwrap();
        assert!(!readable(s.raw()));
        // Another nonce's socket is not this one.
        ring(&name, 8);
        assert!(!readable(s.raw()));
        ring(&name, 7);
        ring(&name, 7);
        assert!(readable(s.raw()));
        s.drain();
        assert!(!readable(s.raw()));
        // Nobody bound: nothing happens.
        ring("fdwake-test-nobody", 7);
        assert!(addr_of(&"x".repeat(200), 7).is_none());
    }
}
